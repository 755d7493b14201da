// Pinned payload hashes of the CPU codecs whose hot loops have fast paths (AVX2 Philox, movmskps sign words, vector
// lane sums, prefetching, batched random-k indices): a speed-up must leave every byte as it was, and the GPU kernels
// are checked against these same host payloads (tests/cuda), so a changed byte here would also split CPU from GPU.
// Sizes straddle the 64-element group (0, 1, 63, 64, 65) and reach past the buckets and the prefetch distance.
//
// The pins were taken from the plugins as they were before the fast paths (commit c379932). To re-derive them from
// another build, set TERSE_TEST_PIN_PLUGIN_DIR to its plugin directory: the test then prints what it computes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xCBF29CE484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

// Deterministic input with both signs, exact zeros, -0 and a wide range, from an LCG (no library distribution, whose
// output may change between standard libraries).
std::vector<float> pinInput(size_t n) {
  std::vector<float> x(n);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const auto v = static_cast<int32_t>(s >> 32);
    x[i] = static_cast<float>(v) * 0x1p-31f * static_cast<float>(1 + (s >> 20) % 1000);
    if (i % 97 == 5) x[i] = 0.0f;
    if (i % 89 == 7) x[i] = -0.0f;
  }
  return x;
}

struct PayloadPinCase {
  const char* name;
  Instance::ParamList params;
};

TEST(PayloadPins, CompressorsKeepTheirBytes) {
  const char* dir = std::getenv("TERSE_TEST_PIN_PLUGIN_DIR");
  const PayloadPinCase cases[] = {
      {"qsgd", {}},
      {"qsgd", {{"levels", "5"}, {"bucket_size", "100"}}},
      {"terngrad", {}},
      {"onebit", {}},
      {"onebit", {{"scale", "mean_abs"}, {"bucket_size", "0"}}},
      {"signsgd", {}},
      {"randomk", {{"ratio", "0.3"}}},
  };
  // Per case: the hash over every size's payload and decode, in order.
  const std::map<std::string, uint64_t> pins = {
      {"qsgd", 0x94d30fff85b37323ull},
      {"qsgd levels=5,bucket_size=100", 0x2dbfecae097d15f6ull},
      {"terngrad", 0x9f73feb0879f586bull},
      {"onebit", 0xa6e14754e8be7eb1ull},
      {"onebit scale=mean_abs,bucket_size=0", 0x56bd5c66968c3dddull},
      {"signsgd", 0x342609b0840a86a8ull},
      {"randomk ratio=0.3", 0x34c43e5b3842d6d0ull},
  };
  for (const PayloadPinCase& c : cases) {
    std::string label = c.name;
    for (size_t k = 0; k < c.params.size(); ++k) {
      label += (k == 0 ? " " : ",") + c.params[k].first + "=" + c.params[k].second;
    }
    Plugin plugin(c.name, dir != nullptr ? std::string(dir) : std::string(TERSE_TEST_BUILD_PLUGIN_DIR));
    Instance codec(plugin, c.params);
    uint64_t h = fnv1a(label.data(), label.size());
    for (const size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{100003}}) {
      const auto info = tensorInfo(n, {.step = 3, .seed = 9});
      const std::vector<float> x = pinInput(n);
      const Bytes payload = codec.compress(info, x);
      const std::vector<float> decoded = codec.decode(info, payload);
      h = fnv1a(payload.data(), payload.size(), h);
      h = fnv1a(decoded.data(), decoded.size() * sizeof(float), h);
    }
    if (dir != nullptr) {
      std::printf("      {\"%s\", 0x%016llxull},\n", label.c_str(), static_cast<unsigned long long>(h));
      continue;
    }
    ASSERT_TRUE(pins.count(label)) << label;
    EXPECT_EQ(h, pins.at(label)) << label << ": the payload or its decode changed";
  }
}

}  // namespace
}  // namespace terse::testing

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
#include <initializer_list>
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

// The name a case's pin is stored under: the plugin, then its parameters ("qsgd levels=5,bucket_size=100").
std::string pinLabel(const PayloadPinCase& c) {
  std::string label = c.name;
  for (size_t k = 0; k < c.params.size(); ++k)
    label += (k == 0 ? " " : ",") + c.params[k].first + "=" + c.params[k].second;
  return label;
}

// Checks hash `h` against its pin; with TERSE_TEST_PIN_PLUGIN_DIR set (`dir`: pins taken from another build's
// plugins) prints the pin's line for the table instead.
void checkPin(const char* dir, const std::map<std::string, uint64_t>& pins, const std::string& label, uint64_t h,
              const char* what) {
  if (dir != nullptr) {
    std::printf("      {\"%s\", 0x%016llxull},\n", label.c_str(), static_cast<unsigned long long>(h));
    return;
  }
  ASSERT_TRUE(pins.count(label)) << label;
  EXPECT_EQ(h, pins.at(label)) << label << ": " << what;
}

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
      {"natural", {}},
      {"natural", {{"rounding_bits", "8"}}},
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
      {"natural", 0x8f1deed4bcaa39b6ull},
      {"natural rounding_bits=8", 0x0b54831b27f4f721ull},
  };
  for (const PayloadPinCase& c : cases) {
    const std::string label = pinLabel(c);
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
    checkPin(dir, pins, label, h, "the payload or its decode changed");
  }
}

// Decodes of 16 MiB tensors (past the L2, thousands of buckets), with the output 64-byte aligned and 16 bytes off (the
// ABI's least alignment), plain and accumulated, pinned from the plugins before this round of speed work (1d64a51).
TEST(PayloadPins, LargeDecodesKeepTheirValues) {
  const char* dir = std::getenv("TERSE_TEST_PIN_PLUGIN_DIR");
  const PayloadPinCase cases[] = {{"qsgd", {}},     {"qsgd", {{"levels", "5"}, {"bucket_size", "100"}}},
                                  {"terngrad", {}}, {"onebit", {}},
                                  {"signsgd", {}},  {"fp16", {}},
                                  {"bf16", {}},     {"none", {}}};
  const std::map<std::string, uint64_t> pins = {
      {"qsgd", 0xc122805fe3579a33ull},     {"qsgd levels=5,bucket_size=100", 0x0d7a330b742e14e0ull},
      {"terngrad", 0x2536bc0fc66a724bull}, {"onebit", 0xd3be51df1f300429ull},
      {"signsgd", 0x141db033dbca5e0cull},  {"fp16", 0xc1ca204daa95ded2ull},
      {"bf16", 0x54a9952541fbe0c2ull},     {"none", 0x728a399bf0a02031ull},
  };
  const size_t n = (size_t{1} << 22) + 65;
  const std::vector<float> x = pinInput(n);
  for (const PayloadPinCase& c : cases) {
    const std::string label = pinLabel(c);
    Plugin plugin(c.name, dir != nullptr ? std::string(dir) : std::string(TERSE_TEST_BUILD_PLUGIN_DIR));
    Instance codec(plugin, c.params);
    const auto info = tensorInfo(n, {.step = 3, .seed = 9});
    const Bytes payload = codec.compress(info, x);
    std::vector<float, AlignedAllocator<float>> aligned(n + 16);
    ASSERT_EQ(codec.decompress(info, payload, std::span<float>(aligned.data(), n)), TERSE_OK) << codec.lastError();
    std::vector<float, AlignedAllocator<float>> offset(n + 16);
    ASSERT_EQ(codec.decompress(info, payload, std::span<float>(offset.data() + 4, n)), TERSE_OK) << codec.lastError();
    ASSERT_EQ(std::memcmp(aligned.data(), offset.data() + 4, n * sizeof(float)), 0) << label << ": offset output";
    std::vector<float> acc(x.begin(), x.end());
    ASSERT_EQ(codec.decompress(info, payload, acc, true), TERSE_OK) << codec.lastError();
    uint64_t h = fnv1a(label.data(), label.size());
    h = fnv1a(payload.data(), payload.size(), h);
    h = fnv1a(aligned.data(), n * sizeof(float), h);
    h = fnv1a(acc.data(), n * sizeof(float), h);
    checkPin(dir, pins, label, h, "the payload or its decode changed");
  }
}

// The casts' payloads of 8M+65 elements (16 MiB of 16-bit values), on one thread and on two, pinned from the plugins
// before this round of speed work (1d64a51).
TEST(PayloadPins, LargeCastPayloadsKeepTheirBytes) {
  const char* dir = std::getenv("TERSE_TEST_PIN_PLUGIN_DIR");
  const std::map<std::string, uint64_t> pins = {{"fp16", 0xa0e5c2e1fe29bab3ull}, {"bf16", 0xfc4c68e380c388efull}};
  const size_t n = (size_t{1} << 23) + 65;
  const std::vector<float> x = pinInput(n);
  const auto info = tensorInfo(n, {.step = 3, .seed = 9});
  for (const char* name : {"fp16", "bf16"}) {
    Plugin plugin(name, dir != nullptr ? std::string(dir) : std::string(TERSE_TEST_BUILD_PLUGIN_DIR));
    Instance one(plugin), two(plugin, {{"threads", "2"}});
    const Bytes payload = one.compress(info, x);
    ASSERT_EQ(two.compress(info, x), payload) << name << ": two threads";
    const uint64_t h = fnv1a(payload.data(), payload.size(), fnv1a(name, std::strlen(name)));
    checkPin(dir, pins, name, h, "the payload changed");
  }
}

// PowerSGD, two ranks over three steps (the warm start carries Q from step to step): both rounds' payloads, their
// sums, every decode (a rank's own payload as error feedback decodes it, plain and accumulated, and the aggregate,
// which also stores next step's Q) and the state, at the quickstart MLP's shapes (issue 22's step), at shapes whose
// sides are not multiples of the loops' blocks (4 rows; 8 and 64 columns), and at a 16 MiB one. The host
// decode must equal the device's productEntry bit for bit, so its bytes are pinned like the others'. Pins from the
// plugin before its fast paths (commit 1d64a51); TERSE_TEST_PIN_PLUGIN_DIR prints them from another build.
TEST(PayloadPins, PowerSgdKeepsItsBytes) {
  const char* dir = std::getenv("TERSE_TEST_PIN_PLUGIN_DIR");
  struct Shape {
    uint64_t n, m, r;
  };
  const Shape shapes[] = {{256, 784, 2}, {128, 256, 2}, {10, 128, 2}, {37, 23, 3}, {67, 131, 4},   {5, 1000, 1},
                          {130, 65, 5},  {3, 200, 1},   {9, 70, 6},   {1, 300, 1}, {2049, 2051, 2}};
  const std::map<std::string, uint64_t> pins = {
      {"256x784 r2", 0x3a44676576da8633ull},   {"128x256 r2", 0x53dde5b96065c6feull},
      {"10x128 r2", 0x3a74beb207263d88ull},    {"37x23 r3", 0x700d8ac1d7781f91ull},
      {"67x131 r4", 0x14ef99801a56ee82ull},    {"5x1000 r1", 0x473440d4999ceebdull},
      {"130x65 r5", 0xe8c7f9a5cc8d3139ull},    {"3x200 r1", 0xedea009293b99495ull},
      {"9x70 r6", 0xfc6ea6d0aa8a6232ull},      {"1x300 r1", 0x64b9f782ae25f5d0ull},
      {"2049x2051 r2", 0x27812a4bad790f34ull},
  };
  Plugin plugin("powersgd", dir != nullptr ? std::string(dir) : std::string(TERSE_TEST_BUILD_PLUGIN_DIR));
  for (const Shape& sh : shapes) {
    const std::string label = std::to_string(sh.n) + "x" + std::to_string(sh.m) + " r" + std::to_string(sh.r);
    Instance codec(plugin, {{"rank", std::to_string(sh.r)}});
    const auto info = [&](int rank, int round, uint64_t step) {
      terse_tensor_info_v1 i = tensorInfo(
          sh.n * sh.m, {.rank = rank, .world_size = 2, .step = step, .seed = 9, .tensor_id = 3, .round = round});
      i.ndim = 2;
      i.shape[0] = static_cast<int64_t>(sh.n);
      i.shape[1] = static_cast<int64_t>(sh.m);
      return i;
    };
    Scratch scratch[2] = {Scratch(codec.sizes(info(0, 0, 0))), Scratch(codec.sizes(info(0, 0, 0)))};
    uint64_t h = fnv1a(label.data(), label.size());
    const auto hashFloats = [&h](const std::vector<float>& v) { h = fnv1a(v.data(), v.size() * sizeof(float), h); };
    // One step of the large shape, three of the others.
    const uint64_t steps = sh.n * sh.m > (uint64_t{1} << 20) ? 1 : 3;
    for (uint64_t step = 0; step < steps; ++step) {
      std::vector<float> grad[2];
      for (int w = 0; w < 2; ++w) {
        grad[w] = pinInput(sh.n * sh.m + 7 * step + static_cast<size_t>(w));
        grad[w].resize(sh.n * sh.m);
      }
      std::vector<Bytes> p, q;
      for (int w = 0; w < 2; ++w) p.push_back(codec.compress(info(w, 0, step), grad[w], &scratch[w]));
      const Bytes p_sum = sumPayloads(p, 16, TERSE_DTYPE_F32);
      for (int w = 0; w < 2; ++w) {
        q.push_back(codec.compress(info(w, 1, step), grad[w], &scratch[w], p_sum));
        std::vector<float> own(sh.n * sh.m, 0.0f);
        ASSERT_EQ(codec.decompress(info(w, 1, step), q.back(), own, false, &scratch[w]), TERSE_OK) << codec.lastError();
        hashFloats(own);
        std::vector<float> acc = grad[w];
        ASSERT_EQ(codec.decompress(info(w, 1, step), q.back(), acc, true, &scratch[w]), TERSE_OK) << codec.lastError();
        hashFloats(acc);
      }
      const Bytes q_sum = sumPayloads(q, 16, TERSE_DTYPE_F32);
      for (const Bytes* b : std::initializer_list<const Bytes*>{&p[0], &p[1], &p_sum, &q[0], &q[1], &q_sum})
        h = fnv1a(b->data(), b->size(), h);
      for (int w = 0; w < 2; ++w) {
        std::vector<float> dec(sh.n * sh.m, 0.0f);
        ASSERT_EQ(codec.decompress(aggregateInfo(info(w, 1, step)), q_sum, dec, false, &scratch[w]), TERSE_OK)
            << codec.lastError();
        hashFloats(dec);
        h = fnv1a(scratch[w].state().data(), scratch[w].state().size(), h);
      }
    }
    checkPin(dir, pins, label, h, "a payload, a decode or the state changed");
  }
}

}  // namespace
}  // namespace terse::testing

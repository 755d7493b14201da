// The `threads` parameter (multi-threaded host compress of one tensor, terse/sdk/parallel.hpp): every thread count
// gives the bytes of one thread, for tensors large enough to be cut (more than 64K elements per thread, 2M for the
// casts) at sizes that leave a partial bucket and a partial 64-code group at the end, for bucket sizes that divide 64,
// that do not, and that cover the whole tensor; a non-finite input in a later range is refused naming the bucket one
// thread names.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "terse/sdk/parallel.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

std::vector<float> threadsInput(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(0.001f * static_cast<float>(i)) * static_cast<float>(1 + i % 7);
  return x;
}

struct ThreadsCase {
  const char* name;
  Instance::ParamList params;
};

const ThreadsCase kThreadsCases[] = {
    {"fp16", {}},
    {"bf16", {}},
    {"qsgd", {}},                                         // 512-element buckets
    {"qsgd", {{"levels", "5"}, {"bucket_size", "100"}}},  // buckets across groups: ranges of lcm(100, 64)
    {"qsgd", {{"bucket_size", "100000000"}}},             // one norm for the tensor: cannot be cut
    {"terngrad", {}},
    {"terngrad", {{"bucket_size", "0"}}},  // the paper's one scaler per tensor
    {"terngrad", {{"bucket_size", "7"}}},
    {"natural", {}},
};

Instance::ParamList withThreads(Instance::ParamList params, const std::string& threads) {
  params.emplace_back("threads", threads);
  return params;
}

TEST(CompressThreads, EveryThreadCountGivesTheBytesOfOne) {
  const size_t n = 3 * (size_t{1} << 16) + 12345;  // three ranges of more than 64K elements, ending mid-group
  const auto x = threadsInput(n);
  const auto info = tensorInfo(n, {.rank = 1, .world_size = 4, .step = 9});
  for (const auto& c : kThreadsCases) {
    Plugin plugin(c.name);
    Instance one(plugin, withThreads(c.params, "1"));
    const Bytes expected = one.compress(info, x);
    for (const char* threads : {"2", "3", "4", "64"}) {
      Instance many(plugin, withThreads(c.params, threads));
      ASSERT_EQ(many.initStatus(), TERSE_OK) << c.name << " threads=" << threads;
      EXPECT_TRUE(many.compress(info, x) == expected) << c.name << " threads=" << threads;
    }
  }
}

TEST(CompressThreads, ANonFiniteInputInALaterRangeIsRefusedAsByOneThread) {
  const size_t n = 4 * (size_t{1} << 16);
  auto x = threadsInput(n);
  x[n - 700] = INFINITY;  // in the last range at 4 threads
  x[n / 2 + 3] = NAN;     // in the third: the first bad bucket is this one
  const auto info = tensorInfo(n, {.rank = 0, .world_size = 2, .step = 1});
  for (const char* name : {"qsgd", "terngrad"}) {
    Plugin plugin(name);
    Instance one(plugin, {{"threads", "1"}});
    Instance four(plugin, {{"threads", "4"}});
    Bytes out;
    EXPECT_EQ(one.tryCompress(info, x, &out), TERSE_ERR_INVALID_ARGUMENT) << name;
    EXPECT_EQ(four.tryCompress(info, x, &out), TERSE_ERR_INVALID_ARGUMENT) << name;
    EXPECT_EQ(four.lastError(), one.lastError()) << name;
    EXPECT_NE(one.lastError().find("starting at element " + std::to_string(n / 2 / 512 * 512)), std::string::npos)
        << one.lastError();
  }
  // natural refuses the element itself, not a bucket.
  Plugin natural("natural");
  Instance one(natural, {{"threads", "1"}});
  Instance four(natural, {{"threads", "4"}});
  Bytes out;
  EXPECT_EQ(four.tryCompress(info, x, &out), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(one.tryCompress(info, x, &out), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(four.lastError(), one.lastError());
  EXPECT_NE(one.lastError().find("gradient element " + std::to_string(n / 2 + 3) + " is "), std::string::npos)
      << one.lastError();
}

TEST(CompressThreads, TheParameterIsBounded) {
  for (const char* name : {"fp16", "bf16", "qsgd", "terngrad", "natural"}) {
    Plugin plugin(name);
    for (const char* bad : {"0", "65", "two"}) {
      Instance c(plugin, {{"threads", bad}});
      EXPECT_EQ(c.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << name << " threads=" << bad;
      EXPECT_NE(c.lastError().find("'threads'"), std::string::npos) << c.lastError();
    }
  }
}

// The casts split only from sdk::kMinCastElementsPerThread elements a thread (8 MiB of f32): a tensor that three
// threads cut, ending mid-line, for every thread count.
TEST(CompressThreads, CastsCutAboveTheirMinimumGiveTheBytesOfOne) {
  const size_t n = 3 * sdk::kMinCastElementsPerThread + 12345;
  const auto x = threadsInput(n);
  const auto info = tensorInfo(n, {.rank = 0, .world_size = 2, .step = 1});
  for (const char* name : {"fp16", "bf16"}) {
    Plugin plugin(name);
    const Bytes expected = Instance(plugin, {{"threads", "1"}}).compress(info, x);
    for (const char* threads : {"2", "3", "8"}) {
      EXPECT_TRUE(Instance(plugin, {{"threads", threads}}).compress(info, x) == expected)
          << name << " threads=" << threads;
    }
  }
}

TEST(ForEachRange, FewerRangesBelowTheMinimumPerThread) {
  const uint64_t min = 1000;
  for (const auto& [n, want] : {std::pair<uint64_t, size_t>{1999, 1}, {2000, 2}, {3 * min + 1, 3}, {100 * min, 8}}) {
    std::mutex m;
    size_t ranges = 0;
    sdk::forEachRange(
        n, 1, 8,
        [&](uint64_t, uint64_t) {
          std::lock_guard lock(m);
          ++ranges;
        },
        min);
    EXPECT_EQ(ranges, want) << "n=" << n;
  }
}

TEST(ForEachRange, CoversTheRangeInWholeUnitsAndRethrows) {
  const uint64_t n = 5 * sdk::kMinElementsPerThread + 3;
  std::vector<int> hits(n, 0);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::mutex m;
  sdk::forEachRange(n, 100, 4, [&](uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) ++hits[i];
    std::lock_guard lock(m);
    ranges.emplace_back(b, e);
  });
  EXPECT_EQ(ranges.size(), 4u);
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b % 100, 0u);
    EXPECT_TRUE(e == n || e % 100 == 0);
    EXPECT_LT(b, e);
  }
  EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), static_cast<std::ptrdiff_t>(n));

  int calls = 0;
  sdk::forEachRange(0, 1, 8, [&](uint64_t, uint64_t) { ++calls; });
  sdk::forEachRange(1000, 1, 8, [&](uint64_t b, uint64_t e) { calls += (b == 0 && e == 1000) ? 10 : 100; });
  EXPECT_EQ(calls, 10);  // nothing for an empty range; one range below kMinElementsPerThread per thread

  EXPECT_THROW(sdk::forEachRange(n, 1, 3,
                                 [&](uint64_t b, uint64_t) {
                                   if (b > 0) throw std::runtime_error("range failed");
                                 }),
               std::runtime_error);

  // Every range but the first fails at its second element: the answer is the second range's, as one thread finds.
  std::vector<uint64_t> starts;
  for (const auto& r : ranges) starts.push_back(r.first);
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(sdk::firstFailure(n, 100, 4, [](uint64_t b, uint64_t e) { return b > 0 ? b + 1 : e; }), starts[1] + 1);
  EXPECT_EQ(sdk::firstFailure(n, 100, 4, [](uint64_t, uint64_t e) { return e; }), n);
}

}  // namespace
}  // namespace terse::testing

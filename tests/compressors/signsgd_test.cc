// signsgd: raw and reduced wire sizes per world size, one rank's decode, majority vote over 5 ranks with reduce
// folded in different association orders (identical bytes), ties, the decode-to-SUM contract, and reduce/decompress
// refusing malformed or impossible inputs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "terse/kit/sign_bits.hpp"
#include "terse/sdk/bitpack.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

// onebit and signsgd pack a full group's signs with kit::signBits64 (movmskps on x86): it must give packGroup<1>'s
// word of the IEEE sign bits, for -0, NaNs of either sign, infinities and subnormals too, at every position.
TEST(SignBits64, IsPackGroupOfTheSignBits) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float special[] = {0.0f, -0.0f, nan, -nan, inf, -inf, 1e-45f, -1e-45f, 1.0f, -1.0f};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    float x[sdk::bitpack::kGroup];
    uint32_t codes[sdk::bitpack::kGroup];
    for (unsigned j = 0; j < sdk::bitpack::kGroup; ++j) {
      x[j] = special[rng() % std::size(special)];
      codes[j] = sdk::floatBits(x[j]) >> 31;
    }
    uint64_t want;
    sdk::bitpack::packGroup<1>(codes, &want);
    ASSERT_EQ(kit::signBits64(x), want) << "trial " << trial;
  }
}

uint64_t signsgdRawBytes(uint64_t n) {
  return 32 + 8 * ((n + 63) / 64);
}
uint64_t signsgdReducedBytes(uint64_t n, uint64_t count_bytes) {
  return 32 + (n * count_bytes + 7) / 8 * 8;
}

TEST(SignSgd, ParametersCapsAndSizes) {
  Plugin plugin("signsgd");
  for (const char* bad : {"0", "-1", "1e39"}) {
    Instance i(plugin, {{"scale", bad}});
    EXPECT_EQ(i.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad;
  }
  Instance zero(plugin, {{"scale", "0"}});
  EXPECT_NE(zero.lastError().find("signsgd: 'scale' must be > 0, got 0"), std::string::npos) << zero.lastError();

  Instance c(plugin);
  ASSERT_NE(c.api().reduce, nullptr);
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_CUSTOM);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  // 2^20 elements: 131072 bytes of signs; counts of int8 / int16 / int32 by world size.
  const uint64_t n = uint64_t{1} << 20;
  struct Case {
    int32_t world;
    uint64_t count_bytes;
  };
  for (const Case& k : {Case{1, 1}, Case{5, 1}, Case{127, 1}, Case{128, 2}, Case{32767, 2}, Case{32768, 4}}) {
    const auto s = c.sizes(tensorInfo(n, {.world_size = k.world}));
    EXPECT_EQ(s.max_output_bytes, 32u + 131072u);
    EXPECT_EQ(s.max_reduced_bytes, signsgdReducedBytes(n, k.count_bytes)) << k.world;
  }
  for (uint64_t m : {0ull, 1ull, 63ull, 64ull, 65ull, 1001ull}) {
    const auto info = tensorInfo(m, {.world_size = 3});
    EXPECT_EQ(c.sizes(info).max_output_bytes, signsgdRawBytes(m));
    EXPECT_GE(c.sizes(info).max_reduced_bytes, c.sizes(info).max_output_bytes);
    EXPECT_EQ(c.compress(info, gaussian(m, 1)).size(), signsgdRawBytes(m));
  }
}

TEST(SignSgd, OneRanksPayloadDecodesToItsScaledSigns) {
  Plugin plugin("signsgd");
  Instance c(plugin, {{"scale", "0.25"}});
  const std::vector<float> g = {3, -2, 0, -0.0f, 1e-30f, -std::numeric_limits<float>::infinity(), 7};
  const auto info = tensorInfo(g.size(), {.rank = 2, .world_size = 4});
  const Bytes p = c.compress(info, g);
  ASSERT_EQ(p.size(), 40u);
  EXPECT_EQ(readAt<uint32_t>(p, 16), 1u) << "raw";
  EXPECT_EQ(readAt<uint32_t>(p, 20), 1u) << "one voter";
  EXPECT_EQ(readAt<uint32_t>(p, 24), 0u);
  EXPECT_EQ(readAt<float>(p, 28), 0.25f);
  EXPECT_EQ(readAt<uint64_t>(p, 32), 0b0101010u) << "bit i is g_i's sign bit (-0 votes -1)";
  EXPECT_EQ(c.decode(info, p), (std::vector<float>{0.25f, -0.25f, 0.25f, -0.25f, 0.25f, -0.25f, 0.25f}));
  std::vector<float> out(g.size(), 1.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  EXPECT_EQ(out, (std::vector<float>{1.25f, 0.75f, 1.25f, 0.75f, 1.25f, 0.75f, 1.25f}));
}

struct SignsgdFiveRanks {
  static constexpr int kWorld = 5;
  uint64_t n;
  std::vector<std::vector<float>> grads;
  std::vector<Bytes> payloads;
  std::vector<int> votes;  // sum of signs per element
};

SignsgdFiveRanks signsgdFiveRanks(Instance& c, uint64_t n) {
  SignsgdFiveRanks f{n, {}, {}, std::vector<int>(n, 0)};
  for (int r = 0; r < SignsgdFiveRanks::kWorld; ++r) {
    f.grads.push_back(gaussian(n, 50 + static_cast<uint32_t>(r)));
    for (uint64_t i = 0; i < n; ++i) f.votes[i] += f.grads[r][i] < 0 ? -1 : 1;
    f.payloads.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = SignsgdFiveRanks::kWorld}), f.grads[r]));
  }
  return f;
}

TEST(SignSgd, MajorityVoteIsTheSameInEveryAssociationOrder) {
  Plugin plugin("signsgd");
  Instance c(plugin, {{"scale", "0.5"}});
  for (uint64_t n : {1ull, 64ull, 1001ull}) {
    SignsgdFiveRanks f = signsgdFiveRanks(c, n);
    const auto agg = aggregateInfo(tensorInfo(n, {.world_size = 5}));
    auto r = [&](const Bytes& a, const Bytes& b) { return c.reduce(agg, a, b); };
    const auto& p = f.payloads;
    const Bytes in_order = foldPayloads(c, agg, p);
    const std::vector<Bytes> orders = {
        r(r(r(r(p[0], p[1]), p[2]), p[3]), p[4]),  // the core's rank order
        r(p[0], r(p[1], r(p[2], r(p[3], p[4])))),  // right fold
        r(r(p[0], p[1]), r(r(p[2], p[3]), p[4])),  // tree
        r(r(p[4], p[3]), r(p[2], r(p[1], p[0]))),  // reversed (commutative too)
        r(r(p[2], r(p[0], p[4])), r(p[3], p[1])),  // shuffled
    };
    for (size_t k = 0; k < orders.size(); ++k) ASSERT_EQ(orders[k], in_order) << "order " << k << " n " << n;
    ASSERT_EQ(in_order.size(), signsgdReducedBytes(n, 1));
    EXPECT_EQ(readAt<uint32_t>(in_order, 16), 2u) << "reduced";
    EXPECT_EQ(readAt<uint32_t>(in_order, 20), 5u) << "voters";
    EXPECT_EQ(readAt<uint32_t>(in_order, 24), 1u) << "int8 counts";
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(readAt<int8_t>(in_order, 32 + i), f.votes[i]) << i;
    // The aggregate decodes to the SUM of contributions the majority implies: 5 * scale * sign(votes); after the
    // core's division by world_size, scale * sign(votes).
    const auto out = c.decode(agg, in_order);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.5f * static_cast<float>(f.votes[i] > 0 ? 1 : -1)) << i;
  }
}

TEST(SignSgd, TiesDecodeToZero) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  const int world = 4;
  const std::vector<std::vector<float>> g = {{1, 1, 1, -1}, {1, -1, 1, -1}, {-1, -1, 1, -1}, {-1, 1, 1, -1}};
  std::vector<Bytes> payloads;
  for (int r = 0; r < world; ++r) payloads.push_back(c.compress(tensorInfo(4, {.rank = r, .world_size = world}), g[r]));
  const auto agg = aggregateInfo(tensorInfo(4, {.world_size = world}));
  const Bytes sum = foldPayloads(c, agg, payloads);
  EXPECT_EQ(c.decode(agg, sum), (std::vector<float>{0, 0, 4, -4}));
}

TEST(SignSgd, WiderCountsForLargerWorlds) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  const uint64_t n = 70;
  for (int32_t world : {200, 40000}) {
    // Fold 200 raw payloads (all ranks) for the int16 case; for int32, reduce a few and check the layout.
    const int folded = world == 200 ? 200 : 3;
    std::vector<Bytes> p;
    std::vector<int> votes(n, 0);
    for (int r = 0; r < folded; ++r) {
      const auto g = gaussian(n, static_cast<uint32_t>(r));
      for (uint64_t i = 0; i < n; ++i) votes[i] += g[i] < 0 ? -1 : 1;
      p.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = world}), g));
    }
    const auto agg = aggregateInfo(tensorInfo(n, {.world_size = world}));
    const Bytes sum = foldPayloads(c, agg, p);
    const uint64_t width = world == 200 ? 2 : 4;
    ASSERT_EQ(sum.size(), signsgdReducedBytes(n, width));
    EXPECT_EQ(readAt<uint32_t>(sum, 24), width);
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t got = width == 2 ? readAt<int16_t>(sum, 32 + 2 * i) : readAt<int32_t>(sum, 32 + 4 * i);
      ASSERT_EQ(got, votes[i]) << i;
    }
    if (world == 200) {
      const auto out = c.decode(agg, sum);
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], 200.0f * static_cast<float>((votes[i] > 0) - (votes[i] < 0))) << i;
      }
    } else {
      EXPECT_EQ(decodeOutcome(c, agg, sum).status, TERSE_ERR_INVALID_PAYLOAD) << "3 of 40000 voters is no aggregate";
    }
  }
}

TEST(SignSgd, OneRankWorldDecodesItsRawPayloadAsTheAggregate) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  const std::vector<float> g = {1, -2, 3};
  const Bytes p = c.compress(tensorInfo(3), g);
  EXPECT_EQ(c.decode(aggregateInfo(tensorInfo(3)), p), (std::vector<float>{1, -1, 1}));
}

TEST(SignSgd, RefusesNaNGradients) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  std::vector<float> g(100, 1.0f);
  g[70] = std::numeric_limits<float>::quiet_NaN();
  Bytes out;
  EXPECT_EQ(c.tryCompress(tensorInfo(100), g, &out), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(c.lastError().find("element 70 is NaN"), std::string::npos) << c.lastError();
}

TEST(SignSgd, DecompressRefusesMalformedAndMisplacedPayloads) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  const uint64_t n = 100;
  SignsgdFiveRanks f = signsgdFiveRanks(c, n);
  const auto one = tensorInfo(n, {.rank = 1, .world_size = 5});
  const auto agg = aggregateInfo(tensorInfo(n, {.world_size = 5}));
  expectRejectsStructuralDamage(c, one, f.payloads[1]);
  const Bytes sum = foldPayloads(c, agg, f.payloads);
  expectRejectsStructuralDamage(c, agg, sum);

  auto expectBad = [&](const terse_tensor_info_v1& info, const Bytes& q, const char* what, const char* message) {
    const DecodeOutcome o = decodeOutcome(c, info, q, /*accumulate=*/true);
    EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD) << what;
    EXPECT_TRUE(o.untouched) << what;
    EXPECT_NE(c.lastError().find(message), std::string::npos) << what << ": " << c.lastError();
  };
  expectBad(agg, f.payloads[0], "a raw payload as the aggregate of 5", "raw payload carries 1 vote");
  expectBad(one, sum, "the aggregate as one rank's payload", "is not one rank's payload");
  const Bytes partial = c.reduce(agg, f.payloads[0], f.payloads[1]);
  expectBad(agg, partial, "2 of 5 voters as the aggregate", "holds 2 voters, but world_size is 5");
  expectBad(one, patched<uint32_t>(f.payloads[1], 16, 3), "unknown kind", "unknown payload kind 3");
  expectBad(one, patched<uint32_t>(f.payloads[1], 20, 2), "raw with 2 voters", "must say 1 voter");
  expectBad(one, patched<float>(f.payloads[1], 28, 2.0f), "scale changed", "made with scale 2");
  expectBad(one, patched<uint64_t>(f.payloads[1], 40, readAt<uint64_t>(f.payloads[1], 40) | (uint64_t{1} << 63)),
            "padding bit", "padding");
  expectBad(agg, patched<int8_t>(sum, 32 + 7, 6), "count above voters", "vote count 6 of element 7");
  expectBad(agg, patched<int8_t>(sum, 32 + 8, -6), "count below -voters", "vote count -6 of element 8");
  expectBad(agg, patched<int8_t>(sum, 32 + 9, 2), "count of the wrong parity", "vote count 2 of element 9");
  expectBad(agg, patched<uint32_t>(sum, 24, 2), "count width changed", "vote counts of 2 bytes");
  expectBad(agg, patched<uint32_t>(sum, 20, 7), "voters above world_size", "reduced payload of 7 voters");
  expectBad(agg, patched<uint32_t>(sum, 20, 1), "reduced with 1 voter", "reduced payload of 1 voters");
  expectBad(agg, patched<uint8_t>(sum, sum.size() - 1, 1), "count padding", "after the vote counts: nonzero padding");
}

TEST(SignSgd, ReduceRefusesMalformedOrImpossibleInputs) {
  Plugin plugin("signsgd");
  Instance c(plugin);
  const uint64_t n = 100;
  SignsgdFiveRanks f = signsgdFiveRanks(c, n);
  const auto agg = aggregateInfo(tensorInfo(n, {.world_size = 5}));
  const Bytes four = foldPayloads(c, agg, {f.payloads[0], f.payloads[1], f.payloads[2], f.payloads[3]});
  const Bytes all = c.reduce(agg, four, f.payloads[4]);
  ASSERT_FALSE(all.empty());
  auto expectBad = [&](const Bytes& a, const Bytes& b, const char* what, const char* message) {
    Bytes out;
    EXPECT_EQ(c.tryReduce(agg, a, b, &out), TERSE_ERR_INVALID_PAYLOAD) << what;
    EXPECT_NE(c.lastError().find(message), std::string::npos) << what << ": " << c.lastError();
  };
  expectBad(all, f.payloads[0], "a sixth voter in a world of 5", "more than world_size 5");
  expectBad(four, four, "8 voters", "more than world_size 5");
  expectBad(truncated(f.payloads[0], 1), f.payloads[1], "truncated a", "reduce input a");
  expectBad(f.payloads[0], truncated(four, 8), "truncated b", "truncated");
  expectBad(f.payloads[0], patched<int8_t>(four, 32 + 3, 5), "count above voters", "vote count 5 of element 3");
  expectBad(patched<int8_t>(four, 32 + 99, 3), f.payloads[0], "count of the wrong parity", "vote count 3");
  expectBad(f.payloads[0], patched<uint32_t>(f.payloads[1], 0, 0), "wrong magic", "magic");
  expectBad(f.payloads[0], Bytes{}, "empty b", "too short");
  const auto other_numel = tensorInfo(n + 1, {.world_size = 5});
  Bytes out;
  EXPECT_EQ(c.tryReduce(aggregateInfo(other_numel), f.payloads[0], f.payloads[1], &out), TERSE_ERR_INVALID_PAYLOAD);
}

}  // namespace
}  // namespace terse::testing

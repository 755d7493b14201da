// sdk/philox.hpp: Random123's Philox4x32-10 against its published known-answer vectors, the documented keying of
// PhiloxStream (key = seed, counter = (element block, mix(step, tensor))), determinism, independence of how a range is
// split, and the uniform conversion.
#include "terse/sdk/philox.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace terse::sdk {
namespace {

using Rng = r123::Philox4x32;

Rng::ctr_type philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  Rng::ctr_type ctr = {{c0, c1, c2, c3}};
  Rng::key_type key = {{k0, k1}};
  return Rng()(ctr, key);
}

// Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter[4], key[2] -> result[4]).
TEST(Philox, KnownAnswerVectors) {
  const auto zero = philox(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);

  const auto ones = philox(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);

  const auto pi = philox(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, Mix64IsSplitMix64) {
  // splitmix64 seeded with 0 outputs 0xe220a8397b1dcdaf first: the same gamma step and finalizer.
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafull);
  // A bijection cannot map two of a sample to one value.
  std::set<uint64_t> seen;
  for (uint64_t x = 0; x < 4096; ++x) seen.insert(mix64(x));
  EXPECT_EQ(seen.size(), 4096u);
}

TEST(Philox, StreamIsKeyedAsDocumented) {
  const uint64_t seed = 0x0123456789abcdefull, step = 17, tensor = 42;
  const PhiloxStream s(seed, step, tensor);
  const uint64_t h = mix64(step ^ mix64(tensor));
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, (uint64_t{1} << 32) + 5}) {
    const auto want =
        philox(static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(h),
               static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const auto got = s.block(b);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(got.v[k], want.v[k]) << "block " << b << " word " << k;
  }
}

TEST(Philox, ElementBitsAreWordIOfBlockIDiv4) {
  const PhiloxStream s(7, 3, 9);
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(s.bits(i), s.block(i / 4).v[i % 4]) << i;
  EXPECT_EQ(s.uniform(5), uniform01(s.bits(5)));
}

// Shorter draws (qsgd's and terngrad's rounding_bits): element e's b-bit draw is the e-th little-endian b-bit unit of
// the stream of words bits(0), bits(1), ..., placed at the top of drawAt's word; at 24 bits the whole word. Written out
// here from bytes, the way a little-endian SIMD load sees them.
uint32_t philoxDrawFromBytes(const PhiloxStream& s, uint64_t e, unsigned b) {
  if (b == 24) return s.bits(e);
  const unsigned bytes = b / 8;
  const uint64_t first = e * bytes;  // the draw's first byte in the stream
  uint32_t r = 0;
  for (unsigned k = 0; k < bytes; ++k) {
    const uint64_t at = first + k;
    r |= ((s.bits(at / 4) >> (8 * (at % 4))) & 0xFFu) << (8 * k);
  }
  return r << (32 - b);
}

TEST(Philox, DrawBitsAreTheStreamsLittleEndianUnits) {
  const PhiloxStream s(7, 3, 9);
  for (const unsigned b : {8u, 16u, 24u}) {
    EXPECT_TRUE(validDrawBits(b));
    for (uint64_t e = 0; e < 200; ++e) {
      const uint32_t want = philoxDrawFromBytes(s, e, b);
      ASSERT_EQ(s.drawBits(e, b), want) << "b " << b << " element " << e;
      // uniform01 of it is exactly r 2^-b.
      EXPECT_EQ(uniform01(want), static_cast<float>(want >> (32 - b)) * std::ldexp(1.0f, -static_cast<int>(b)));
    }
  }
  EXPECT_FALSE(validDrawBits(0));
  EXPECT_FALSE(validDrawBits(12));
  EXPECT_FALSE(validDrawBits(32));
  // One block serves 4, 8, 16 elements: the first 8 16-bit draws are the halves of block 0's words, low half first.
  const auto block0 = s.block(0);
  for (unsigned j = 0; j < 8; ++j) {
    EXPECT_EQ(s.drawBits(j, 16) >> 16, (block0.v[j / 2] >> (16 * (j % 2))) & 0xFFFFu) << j;
  }
}

// drawGroups: for any first group g and count, the returned words hold elements 64g .. 64(g + count) - 1's draws at
// drawAt's indices 0 .., and the buffer of 64 (count / k + 2) words (k draws a word) is enough.
TEST(Philox, DrawGroupsServeAnyRangeOfGroups) {
  const PhiloxStream s(11, 5, 2);
  for (const unsigned b : {8u, 16u, 24u}) {
    const uint64_t k = drawsPerWord(b);
    for (uint64_t g :
         {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{5}, uint64_t{17}, uint64_t{1} << 30}) {
      for (uint64_t count : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{8}, uint64_t{16}}) {
        std::vector<uint32_t> buf(64 * (count / k + 2) + 64, 0xDEADBEEFu);
        const uint32_t* words = s.drawGroups(b, g, count, buf.data());
        ASSERT_GE(words, buf.data());
        ASSERT_LE(words + 64 * count / k, buf.data() + 64 * (count / k + 2)) << "b " << b << " g " << g;
        ASSERT_EQ(buf[64 * (count / k + 2)], 0xDEADBEEFu) << "wrote past 64 (count / k + 2) words";
        for (uint64_t j = 0; j < 64 * count; ++j) {
          ASSERT_EQ(drawAt(b, words, j), philoxDrawFromBytes(s, 64 * g + j, b))
              << "b " << b << " g " << g << " count " << count << " element " << j;
        }
      }
    }
  }
}

// group64 (vectorized on an AVX2 host) gives bits(64g + j) exactly, counters past 2^32 blocks and all-ones keys
// included.
TEST(Philox, Group64IsSixteenBlocksInOrder) {
  for (const PhiloxStream& s : {PhiloxStream(7, 3, 9), PhiloxStream(~0ull, ~0ull, ~0ull), PhiloxStream(0, 0, 0)}) {
    for (uint64_t g : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, (uint64_t{1} << 28) - 1, uint64_t{1} << 28,
                       (uint64_t{1} << 40) + 3}) {
      uint32_t bits[64];
      s.group64(g, bits);
      for (uint64_t j = 0; j < 64; ++j) ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "group " << g << " element " << j;
    }
  }
}

// Each vector path on its own (group64 runs only the widest the host has): the same bits as block by block.
TEST(Philox, Group64VectorPathsAgree) {
#if TERSE_PHILOX_AVX2
  int ran = 0;
  for (const uint64_t seed : {uint64_t{7}, ~uint64_t{0}, uint64_t{0}}) {
    const uint64_t step = seed ^ 3, tensor = seed + 9;
    const PhiloxStream s(seed, step, tensor);
    const uint64_t h = mix64(step ^ mix64(tensor));
    const auto k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    const auto h0 = static_cast<uint32_t>(h), h1 = static_cast<uint32_t>(h >> 32);
    for (uint64_t g : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, (uint64_t{1} << 28) - 1, uint64_t{1} << 28,
                       (uint64_t{1} << 40) + 3}) {
      uint32_t bits[64];
      if (detail::haveAvx2()) {
        detail::philoxGroup64Avx2(k0, k1, h0, h1, g, bits);
        for (uint64_t j = 0; j < 64; ++j) ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "AVX2, group " << g << ", " << j;
        ++ran;
      }
      if (detail::haveAvx512()) {
        detail::philoxGroup64Avx512(k0, k1, h0, h1, g, bits);
        for (uint64_t j = 0; j < 64; ++j) ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "AVX-512, group " << g << ", " << j;
        ++ran;
      }
      if (detail::haveAvx512Ifma()) {
        detail::philoxGroup64Ifma(k0, k1, h0, h1, g, bits);
        for (uint64_t j = 0; j < 64; ++j) ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "IFMA, group " << g << ", " << j;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "this host has neither AVX2 nor AVX-512F";
#else
  GTEST_SKIP() << "no vector Philox on this host";
#endif
}

// groups(g, count) is count calls of group64 whatever the count (pairs and an odd last group on AVX-512), and the
// AVX-512 kernel called directly agrees with the block-at-a-time definition.
TEST(Philox, GroupsMatchGroup64) {
  for (const uint64_t seed : {uint64_t{11}, ~uint64_t{0}}) {
    const PhiloxStream s(seed, seed + 1, seed ^ 5);
    for (const uint64_t g : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 28) - 2, (uint64_t{1} << 40) + 1}) {
      for (const uint64_t count : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{5}, uint64_t{16}}) {
        std::vector<uint32_t> bits(64 * count + 1, 0xDEADBEEFu);
        s.groups(g, count, bits.data());
        for (uint64_t j = 0; j < 64 * count; ++j) {
          ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "groups(" << g << ", " << count << "), word " << j;
        }
        EXPECT_EQ(bits[64 * count], 0xDEADBEEFu) << "wrote past the last group";
#if TERSE_PHILOX_AVX2
        if (detail::haveAvx512()) {
          const uint64_t h = mix64((seed + 1) ^ mix64(seed ^ 5));
          std::fill(bits.begin(), bits.end(), 0u);
          detail::philoxGroupsAvx512(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                                     static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), g, count, bits.data());
          for (uint64_t j = 0; j < 64 * count; ++j) {
            ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "AVX-512 groups(" << g << ", " << count << "), word " << j;
          }
        }
        if (detail::haveAvx512Ifma()) {
          const uint64_t h = mix64((seed + 1) ^ mix64(seed ^ 5));
          std::fill(bits.begin(), bits.end(), 0u);
          detail::philoxGroupsIfma(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                                   static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), g, count, bits.data());
          for (uint64_t j = 0; j < 64 * count; ++j) {
            ASSERT_EQ(bits[j], s.bits(64 * g + j)) << "IFMA groups(" << g << ", " << count << "), word " << j;
          }
        }
#endif
      }
    }
  }
}

TEST(Philox, DeterministicForTheSameKeyAndDistinctOtherwise) {
  const PhiloxStream a(1, 2, 3), b(1, 2, 3);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(a.bits(i), b.bits(i));
  // Changing any one of seed (either half), step or tensor id changes the stream.
  const PhiloxStream others[] = {PhiloxStream(2, 2, 3), PhiloxStream(1 + (uint64_t{1} << 32), 2, 3),
                                 PhiloxStream(1, 3, 3), PhiloxStream(1, 2, 4)};
  for (const PhiloxStream& o : others) {
    int same = 0;
    for (uint64_t i = 0; i < 1000; ++i) same += a.bits(i) == o.bits(i);
    EXPECT_LE(same, 2);
  }
  // step and tensor id are not interchangeable.
  const PhiloxStream swapped(1, 3, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a.bits(i) == swapped.bits(i);
  EXPECT_LE(same, 2);
}

// What a multi-threaded CPU loop or a CUDA grid does: each worker takes a chunk (any size, any order) and draws its
// elements' numbers. The result must not depend on the split.
TEST(Philox, IndependentOfHowTheRangeIsSplit) {
  const PhiloxStream s(99, 5, 11);
  const uint64_t n = 10007;
  std::vector<uint32_t> sequential(n);
  for (uint64_t i = 0; i < n; ++i) sequential[i] = s.bits(i);

  std::mt19937 g(1);
  for (int trial = 0; trial < 5; ++trial) {
    // Random chunk boundaries, processed in a random order, each chunk drawing whole blocks where it can.
    std::vector<uint64_t> cuts = {0, n};
    for (int k = 0; k < 20; ++k) cuts.push_back(std::uniform_int_distribution<uint64_t>(0, n)(g));
    std::sort(cuts.begin(), cuts.end());
    std::vector<size_t> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), g);
    std::vector<uint32_t> split(n, 0);
    for (size_t c : order) {
      for (uint64_t i = cuts[c]; i < cuts[c + 1];) {
        if (i % 4 == 0 && i + 4 <= cuts[c + 1]) {
          const auto r = s.block(i / 4);
          for (int k = 0; k < 4; ++k) split[i + k] = r.v[k];
          i += 4;
        } else {
          split[i] = s.bits(i);
          ++i;
        }
      }
    }
    ASSERT_EQ(split, sequential) << "trial " << trial;
  }
}

TEST(Philox, UniformIsInUnitIntervalWith24Bits) {
  EXPECT_EQ(uniform01(0), 0.0f);
  EXPECT_LT(uniform01(0xFFFFFFFFu), 1.0f);
  EXPECT_EQ(uniform01(0xFFFFFFFFu), 1.0f - 0x1p-24f);
  EXPECT_EQ(uniform01(0x80000000u), 0.5f);
  EXPECT_EQ(uniform01(0x000000FFu), 0.0f) << "the low 8 bits are dropped";
}

TEST(Philox, UniformsLookUniform) {
  // Mean, variance and a 16-bin chi-square over 2^18 draws, bounds at about 5 sigma so a correct generator fails
  // with negligible probability (and the stream is fixed anyway).
  const PhiloxStream s(2024, 0, 1);
  const uint64_t n = uint64_t{1} << 18;
  double sum = 0, sum_sq = 0;
  uint64_t bins[16] = {};
  for (uint64_t i = 0; i < n; ++i) {
    const double u = s.uniform(i);
    sum += u;
    sum_sq += u * u;
    ++bins[static_cast<int>(u * 16)];
  }
  const double mean = sum / static_cast<double>(n);
  const double var = sum_sq / static_cast<double>(n) - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / static_cast<double>(n)));
  EXPECT_NEAR(var, 1.0 / 12, 0.002);
  double chi2 = 0;
  const double expect = static_cast<double>(n) / 16;
  for (uint64_t b : bins) chi2 += (static_cast<double>(b) - expect) * (static_cast<double>(b) - expect) / expect;
  EXPECT_LT(chi2, 45.0) << "15 degrees of freedom: P(chi2 > 45) < 1e-4";
}

}  // namespace
}  // namespace terse::sdk

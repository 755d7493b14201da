// sdk/bitpack.hpp: every width 1..32 against a bit-by-bit reference packer (the documented layout: code i at stream
// bits [iW, (i+1)W), stream bit b in word b / 64 at bit b % 64), round trips for odd counts, exact word counts, zero
// padding, and that a short last group writes no word past its end.
#include "terse/sdk/bitpack.hpp"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace terse::sdk::bitpack {
namespace {

// The layout written out one bit at a time, independently of the implementation's word arithmetic.
std::vector<uint64_t> referencePack(const std::vector<uint32_t>& codes, unsigned width) {
  std::vector<uint64_t> words((codes.size() * width + 63) / 64, 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    for (unsigned k = 0; k < width; ++k) {
      const uint64_t bit = i * width + k;
      if ((codes[i] >> k) & 1u) words[bit / 64] |= uint64_t{1} << (bit % 64);
    }
  }
  return words;
}

std::vector<uint32_t> randomCodes(size_t count, unsigned width, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> codes(count);
  for (uint32_t& c : codes) c = static_cast<uint32_t>(g()) & lowMask(width);
  // Make sure the extremes appear.
  if (count > 0) codes[0] = lowMask(width);
  if (count > 1) codes[count - 1] = lowMask(width);
  if (count > 2) codes[1] = 0;
  return codes;
}

const size_t kCounts[] = {0, 1, 2, 3, 31, 63, 64, 65, 127, 128, 129, 1000, 1001, 4099};

TEST(Bitpack, WordCountIsBitsRoundedUpToWords) {
  for (unsigned w = 1; w <= kMaxWidth; ++w) {
    for (uint64_t n : {0ull, 1ull, 63ull, 64ull, 65ull, 1000ull, 1ull << 20, (1ull << 40) + 3}) {
      EXPECT_EQ(wordCount(n, w), (n * w + 63) / 64) << "count " << n << " width " << w;
    }
  }
}

TEST(Bitpack, BitsFor) {
  EXPECT_EQ(bitsFor(0), 1u);
  EXPECT_EQ(bitsFor(1), 1u);
  EXPECT_EQ(bitsFor(2), 2u);
  EXPECT_EQ(bitsFor(3), 2u);
  EXPECT_EQ(bitsFor(127), 7u);
  EXPECT_EQ(bitsFor(128), 8u);
  EXPECT_EQ(bitsFor(255), 8u);
  EXPECT_EQ(bitsFor((1u << 24) - 1), 24u);
  EXPECT_EQ(bitsFor(0xFFFFFFFFu), 32u);
  EXPECT_EQ(lowMask(1), 1u);
  EXPECT_EQ(lowMask(7), 127u);
  EXPECT_EQ(lowMask(32), 0xFFFFFFFFu);
}

TEST(Bitpack, EveryWidthMatchesTheReferenceLayoutAndRoundTrips) {
  for (unsigned w = 1; w <= kMaxWidth; ++w) {
    for (size_t n : kCounts) {
      const std::vector<uint32_t> codes = randomCodes(n, w, 1000 * w + static_cast<uint32_t>(n));
      const std::vector<uint64_t> want = referencePack(codes, w);
      ASSERT_EQ(wordCount(n, w), want.size());
      // One canary word past the end: pack must not touch it.
      std::vector<uint64_t> words(want.size() + 1, 0xDEADBEEFCAFEF00Dull);
      pack(w, codes.data(), n, words.data());
      EXPECT_EQ(words.back(), 0xDEADBEEFCAFEF00Dull) << "wrote past the end, width " << w << " count " << n;
      words.pop_back();
      ASSERT_EQ(words, want) << "width " << w << " count " << n;
      EXPECT_TRUE(paddingIsZero(words.data(), n, w));

      std::vector<uint32_t> back(n + 1, 0xA5A5A5A5u);
      unpack(w, words.data(), n, back.data());
      EXPECT_EQ(back.back(), 0xA5A5A5A5u) << "unpack wrote past the end";
      back.pop_back();
      ASSERT_EQ(back, codes) << "width " << w << " count " << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(get(words.data(), i, w), codes[i]) << "width " << w << " code " << i;
    }
  }
}

TEST(Bitpack, TemplateAndRuntimeWidthsAgree) {
  const std::vector<uint32_t> codes = randomCodes(64, 13, 5);
  uint64_t a[13], b[13];
  packGroup<13>(codes.data(), a);
  packGroup(13, codes.data(), b);
  for (int k = 0; k < 13; ++k) EXPECT_EQ(a[k], b[k]);
  uint32_t back[64];
  unpackGroup<13>(a, back);
  for (int j = 0; j < 64; ++j) EXPECT_EQ(back[j], codes[j]);
  // The dispatch macro hands the width over as a constant.
  unsigned seen = 0;
  for (unsigned w = 1; w <= kMaxWidth; ++w) {
    TERSE_BITPACK_DISPATCH(w, seen += kW);
  }
  EXPECT_EQ(seen, 32u * 33u / 2u);
  unsigned none = 0;
  TERSE_BITPACK_DISPATCH(33u, none = kW);
  TERSE_BITPACK_DISPATCH(0u, none = kW);
  EXPECT_EQ(none, 0u) << "widths outside 1..32 run nothing";
}

TEST(Bitpack, HighBitsOfCodesDoNotBleedIntoNeighbours) {
  for (unsigned w = 1; w < kMaxWidth; ++w) {
    std::vector<uint32_t> codes(70, 0xFFFFFFFFu);  // every bit set, above the width too
    std::vector<uint32_t> masked(70, lowMask(w));
    std::vector<uint64_t> a(wordCount(70, w)), b(wordCount(70, w));
    pack(w, codes.data(), 70, a.data());
    pack(w, masked.data(), 70, b.data());
    EXPECT_EQ(a, b) << "width " << w;
    EXPECT_TRUE(paddingIsZero(a.data(), 70, w)) << "width " << w;
  }
}

TEST(Bitpack, PaddingIsZeroSeesAnyStrayBit) {
  for (unsigned w = 1; w <= kMaxWidth; ++w) {
    for (size_t n : {1u, 3u, 65u, 1001u}) {
      const std::vector<uint32_t> codes = randomCodes(n, w, 7);
      std::vector<uint64_t> words(wordCount(n, w));
      pack(w, codes.data(), n, words.data());
      const unsigned used = static_cast<unsigned>(n * w % 64);
      if (used == 0) {
        EXPECT_TRUE(paddingIsZero(words.data(), n, w));  // no padding to spoil
        continue;
      }
      for (unsigned bit = used; bit < 64; bit += 7) {
        std::vector<uint64_t> bad = words;
        bad.back() |= uint64_t{1} << bit;
        EXPECT_FALSE(paddingIsZero(bad.data(), n, w)) << "width " << w << " count " << n << " bit " << bit;
      }
    }
  }
  EXPECT_TRUE(paddingIsZero(nullptr, 0, 5)) << "no words at all";
}

TEST(Bitpack, OneBitLayoutIsLsbFirst) {
  // Width 1 is the sign-bit layout of onebit and signsgd: element i is bit i % 64 of word i / 64, which on a
  // little-endian machine is bit i % 8 of byte i / 8.
  std::vector<uint32_t> codes(70, 0);
  codes[0] = codes[5] = codes[64] = codes[69] = 1;
  uint64_t words[2];
  pack(1, codes.data(), 70, words);
  EXPECT_EQ(words[0], (uint64_t{1} << 0) | (uint64_t{1} << 5));
  EXPECT_EQ(words[1], (uint64_t{1} << 0) | (uint64_t{1} << 5));
}

}  // namespace
}  // namespace terse::sdk::bitpack

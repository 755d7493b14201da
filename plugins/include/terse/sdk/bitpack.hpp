// terse plugin SDK: bit-packed codes of any width 1..32 (DESIGN.md section 4: "bits are packed").
//
// Layout: code i occupies bits [i*W, (i+1)*W) of one little-endian bit stream, stored in 64-bit words (bit b of the
// stream is bit b % 64 of word b / 64), so a payload of `count` W-bit codes is wordCount(count, W) words: the bits
// rounded up to whole 64-bit words, at most 7 bytes more than ceil(count*W/8). Codes straddle word boundaries when W
// does not divide 64. Bits past the last code are zero (paddingIsZero checks that, so a validating decoder can insist
// on one canonical encoding).
//
// The unit of work is a group of 64 codes, which fills exactly W words whatever W is: a CPU loop packs group after
// group, a CUDA thread packs one group, and both call the same functions. With W a template argument every shift and
// word index is a constant; widths dividing 8 are assembled byte by byte and 16 and 32 as plain lanes, which the
// compiler vectorizes (the words' bytes are the stream's bytes on a little-endian machine, which the SDK requires).
// packGroup(width, ...) dispatches a runtime width to the templates. A short last group goes through packTail /
// unpackTail.
//
// All functions are TERSE_HD and allocate nothing.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "terse/hd.h"

namespace terse::sdk::bitpack {

static_assert(std::endian::native == std::endian::little, "bitpack assembles words from bytes: little-endian only");

inline constexpr unsigned kGroup = 64;     // codes per group; a group of W-bit codes is exactly W words
inline constexpr unsigned kMaxWidth = 32;  // codes are uint32_t

// The W low bits set.
TERSE_HD constexpr uint32_t lowMask(unsigned width) {
  return width >= 32 ? 0xFFFFFFFFu : (1u << width) - 1u;
}

// Bits needed to write every value in 0..max_value (at least 1): bitsFor(1) = 1, bitsFor(127) = 7, bitsFor(128) = 8.
TERSE_HD constexpr unsigned bitsFor(uint64_t max_value) {
  unsigned bits = 1;
  while (bits < 64 && (max_value >> bits) != 0) ++bits;
  return bits;
}

// 64-bit words holding `count` codes of `width` bits. Exact without overflow for count < 2^58 (callers bound numel).
TERSE_HD constexpr uint64_t wordCount(uint64_t count, unsigned width) {
  return (count / kGroup) * width + ((count % kGroup) * width + 63u) / 64u;
}

// Packs 64 codes (only their low W bits are used) into W words, overwriting them.
template <unsigned W>
TERSE_HD void packGroup(const uint32_t* codes, uint64_t* words) {
  static_assert(W >= 1 && W <= kMaxWidth, "bitpack: width must be in 1..32");
  constexpr uint32_t kMask = W == 32 ? 0xFFFFFFFFu : (1u << W) - 1u;
  if constexpr (8 % W == 0) {
    // Codes fill whole bytes (8/W per byte); byte k is bits [8k, 8k+8) of the little-endian stream. Assembling bytes
    // with constant shifts vectorizes; an OR into a 64-bit word with a shift per code does not (2x slower for W = 1).
    constexpr unsigned kPer = 8 / W;
    uint8_t bytes[8 * W];
    for (unsigned k = 0; k < 8 * W; ++k) {
      uint32_t b = 0;
      for (unsigned j = 0; j < kPer; ++j) b |= (codes[k * kPer + j] & kMask) << (j * W);
      bytes[k] = static_cast<uint8_t>(b);
    }
    std::memcpy(words, bytes, sizeof bytes);
  } else if constexpr (W == 16) {
    uint16_t lanes[64];
    for (unsigned j = 0; j < 64; ++j) lanes[j] = static_cast<uint16_t>(codes[j]);
    std::memcpy(words, lanes, sizeof lanes);
  } else if constexpr (W == 32) {
    std::memcpy(words, codes, 64 * sizeof(uint32_t));
  } else {
    uint64_t acc = 0;   // bits not yet stored
    unsigned fill = 0;  // how many of them
    unsigned k = 0;
    for (unsigned j = 0; j < kGroup; ++j) {
      const uint64_t c = uint64_t{codes[j] & kMask};
      acc |= c << fill;
      fill += W;
      if (fill >= 64) {
        words[k++] = acc;
        fill -= 64;
        // The high `fill` bits of c did not fit; shifting by W - fill (< W <= 32) keeps the shift defined.
        acc = fill == 0 ? 0 : c >> (W - fill);
      }
    }
  }
}

// Unpacks W words into 64 codes.
template <unsigned W>
TERSE_HD void unpackGroup(const uint64_t* words, uint32_t* codes) {
  static_assert(W >= 1 && W <= kMaxWidth, "bitpack: width must be in 1..32");
  constexpr uint32_t kMask = W == 32 ? 0xFFFFFFFFu : (1u << W) - 1u;
  if constexpr (8 % W == 0) {
    constexpr unsigned kPer = 8 / W;
    uint8_t bytes[8 * W];
    std::memcpy(bytes, words, sizeof bytes);
    for (unsigned k = 0; k < 8 * W; ++k) {
      for (unsigned j = 0; j < kPer; ++j) codes[k * kPer + j] = (uint32_t{bytes[k]} >> (j * W)) & kMask;
    }
  } else if constexpr (W == 16) {
    uint16_t lanes[64];
    std::memcpy(lanes, words, sizeof lanes);
    for (unsigned j = 0; j < 64; ++j) codes[j] = lanes[j];
  } else if constexpr (W == 32) {
    std::memcpy(codes, words, 64 * sizeof(uint32_t));
  } else {
    for (unsigned j = 0; j < kGroup; ++j) {
      const unsigned bit = j * W;
      const unsigned k = bit / 64, shift = bit % 64;
      uint64_t c = words[k] >> shift;
      if (shift + W > 64) c |= words[k + 1] << (64 - shift);
      codes[j] = static_cast<uint32_t>(c) & kMask;
    }
  }
}

// TERSE_BITPACK_DISPATCH(width, statement): runs `statement` with `kW` a constexpr unsigned equal to the runtime
// width (1..32; any other width runs nothing). Dispatch once, outside a hot loop, and call the W templates inside:
//   TERSE_BITPACK_DISPATCH(width, packGroups<kW>(codes, words, n));
// A macro rather than a generic lambda so that device code needs no extended-lambda support.
#define TERSE_BITPACK_CASE_(N, ...) \
  case N: {                         \
    constexpr unsigned kW = N;      \
    __VA_ARGS__;                    \
    break;                          \
  }
#define TERSE_BITPACK_DISPATCH(width, ...) \
  switch (width) {                         \
    TERSE_BITPACK_CASE_(1, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(2, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(3, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(4, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(5, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(6, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(7, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(8, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(9, __VA_ARGS__)    \
    TERSE_BITPACK_CASE_(10, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(11, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(12, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(13, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(14, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(15, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(16, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(17, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(18, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(19, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(20, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(21, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(22, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(23, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(24, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(25, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(26, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(27, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(28, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(29, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(30, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(31, __VA_ARGS__)   \
    TERSE_BITPACK_CASE_(32, __VA_ARGS__)   \
    default:                               \
      break;                               \
  }

// Runtime-width versions of the above (width in 1..32; any other width does nothing). Inside a hot loop prefer
// dispatching once outside it and calling packGroup<W> directly.
TERSE_HD void packGroup(unsigned width, const uint32_t* codes, uint64_t* words) {
  TERSE_BITPACK_DISPATCH(width, packGroup<kW>(codes, words));
}
TERSE_HD void unpackGroup(unsigned width, const uint64_t* words, uint32_t* codes) {
  TERSE_BITPACK_DISPATCH(width, unpackGroup<kW>(words, codes));
}

// The last, short group: packs n < 64 codes into exactly wordCount(n, W) words, the bits past the last code zero.
template <unsigned W>
TERSE_HD void packTail(const uint32_t* codes, unsigned n, uint64_t* words) {
  uint32_t full[kGroup];
  for (unsigned j = 0; j < kGroup; ++j) full[j] = j < n ? codes[j] : 0u;
  uint64_t packed[W];
  packGroup<W>(full, packed);
  const unsigned used = static_cast<unsigned>(wordCount(n, W));
  for (unsigned k = 0; k < used; ++k) words[k] = packed[k];
}

// Reads n < 64 codes from the wordCount(n, W) words of a short last group (never reads past them).
template <unsigned W>
TERSE_HD void unpackTail(const uint64_t* words, unsigned n, uint32_t* codes) {
  uint64_t full[W];
  const unsigned used = static_cast<unsigned>(wordCount(n, W));
  for (unsigned k = 0; k < W; ++k) full[k] = k < used ? words[k] : 0u;
  uint32_t all[kGroup];
  unpackGroup<W>(full, all);
  for (unsigned j = 0; j < n; ++j) codes[j] = all[j];
}

// Whole streams: `count` codes to wordCount(count, W) words and back.
template <unsigned W>
TERSE_HD void pack(const uint32_t* codes, uint64_t count, uint64_t* words) {
  const uint64_t groups = count / kGroup;
  for (uint64_t g = 0; g < groups; ++g) packGroup<W>(codes + g * kGroup, words + g * W);
  const unsigned rest = static_cast<unsigned>(count % kGroup);
  if (rest != 0) packTail<W>(codes + groups * kGroup, rest, words + groups * W);
}
template <unsigned W>
TERSE_HD void unpack(const uint64_t* words, uint64_t count, uint32_t* codes) {
  const uint64_t groups = count / kGroup;
  for (uint64_t g = 0; g < groups; ++g) unpackGroup<W>(words + g * W, codes + g * kGroup);
  const unsigned rest = static_cast<unsigned>(count % kGroup);
  if (rest != 0) unpackTail<W>(words + groups * W, rest, codes + groups * kGroup);
}
TERSE_HD void pack(unsigned width, const uint32_t* codes, uint64_t count, uint64_t* words) {
  TERSE_BITPACK_DISPATCH(width, pack<kW>(codes, count, words));
}
TERSE_HD void unpack(unsigned width, const uint64_t* words, uint64_t count, uint32_t* codes) {
  TERSE_BITPACK_DISPATCH(width, unpack<kW>(words, count, codes));
}

// Code i alone (random access; a loop over consecutive codes should unpack whole groups instead).
TERSE_HD uint32_t get(const uint64_t* words, uint64_t i, unsigned width) {
  const uint64_t bit = i * width;
  const uint64_t k = bit / 64;
  const unsigned shift = static_cast<unsigned>(bit % 64);
  uint64_t c = words[k] >> shift;
  if (shift + width > 64) c |= words[k + 1] << (64 - shift);
  return static_cast<uint32_t>(c) & lowMask(width);
}

// Whether the bits after the last of `count` codes in the last of wordCount(count, width) words are all zero, as
// pack writes them. A decoder of untrusted payloads checks this so every code stream has exactly one encoding.
TERSE_HD bool paddingIsZero(const uint64_t* words, uint64_t count, unsigned width) {
  const uint64_t n = wordCount(count, width);
  const unsigned used = static_cast<unsigned>((count % kGroup) * width % 64);  // bits used in the last word
  if (n == 0 || used == 0) return true;
  return (words[n - 1] >> used) == 0;
}

}  // namespace terse::sdk::bitpack

// signsgd: the elementwise math of signSGD with majority vote (see signsgd.cc for the paper and the payloads), as
// small TERSE_HD functions called by the CPU loops and by the CUDA kernels (signsgd.cu).
//
// A rank sends bit_i = g_i's IEEE sign bit (+0 votes +1, -0 votes -1: one bit has no room for 0; the sign bit rather
// than g_i < 0 keeps the loop free of compares). Reduction adds votes +1 / -1 into signed
// counts c_i = #positive - #negative over the voters folded so far; integer addition, so any association order gives
// the same counts. The aggregate of V voters decodes to V * scale * sign(c_i) (0 on a tie), which the core's division
// by world_size (= V) turns into the majority vote scale * sign(c_i).
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/half.hpp"

namespace terse::compressors::signsgd {

TERSE_HD uint32_t signBit(float g) {
  return sdk::floatBits(g) >> 31;
}

// 1 for a NaN (which has no sign to vote with), from the bits alone so the check vectorizes.
TERSE_HD uint32_t isNan(float g) {
  return (sdk::floatBits(g) & 0x7FFFFFFFu) > 0x7F800000u ? 1u : 0u;
}

// The vote a sign bit casts: +1 or -1.
TERSE_HD int32_t vote(uint32_t bit) {
  return 1 - 2 * static_cast<int32_t>(bit & 1u);
}

// One rank's contribution: scale * sign, the sign bit set from the bit (no branch: signs are random).
TERSE_HD float decodeSign(uint32_t bit, float scale) {
  return sdk::bitsFloat(sdk::floatBits(scale) | ((bit & 1u) << 31));
}

// The aggregate of `voters` ranks: voters * scale * sign(count), 0 on a tie. magnitude = voters * scale.
TERSE_HD float decodeCount(int32_t count, float magnitude) {
  const int32_t s = (count > 0 ? 1 : 0) - (count < 0 ? 1 : 0);
  return static_cast<float>(s) * magnitude;
}

// Whether V voters of +1 / -1 can sum to `count`: |count| <= V and count has V's parity.
TERSE_HD bool countIsValid(int32_t count, int32_t voters) {
  const int64_t c = count;
  return c <= voters && -c <= voters && ((c + voters) & 1) == 0;
}

// Bytes per vote count so that any count of world_size voters fits: int8 up to 127 ranks, int16 up to 32767, else
// int32.
TERSE_HD uint32_t countBytes(int32_t world_size) {
  return world_size <= 127 ? 1u : world_size <= 32767 ? 2u : 4u;
}

}  // namespace terse::compressors::signsgd

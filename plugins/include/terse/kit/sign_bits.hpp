// The sign bits of 64 consecutive floats as one 64-bit word, bit j = sign of x[j]: a full group of 1-bit codes
// exactly as sdk::bitpack::packGroup<1> lays them out (onebit's and signsgd's payloads), for host loops.
//
// Why not packGroup<1> on the host: it assembles the word from eight byte stores, and reading the word back right
// after them cannot be forwarded from the store buffer, so every group waited on a store-forwarding stall (12% of
// onebit's compress). On x86, SSE2's movmskps yields four sign bits per instruction in a register; SSE2 is in the
// x86-64 baseline, so every sdk::cpu::clones level can inline it. Other hosts use packGroup<1>.
#pragma once

#include <cstdint>

#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/half.hpp"

#if defined(__x86_64__) && !defined(__CUDACC__)
#include <emmintrin.h>
#define TERSE_KIT_SIGN_BITS_SSE2 1
#else
#define TERSE_KIT_SIGN_BITS_SSE2 0
#endif

namespace terse::kit {

inline uint64_t signBits64(const float* x) {
#if TERSE_KIT_SIGN_BITS_SSE2
  uint64_t word = 0;
  for (unsigned q = 0; q < 16; ++q) {
    word |= static_cast<uint64_t>(_mm_movemask_ps(_mm_loadu_ps(x + 4 * q))) << (4 * q);
  }
  return word;
#else
  uint32_t codes[sdk::bitpack::kGroup];
  for (unsigned j = 0; j < sdk::bitpack::kGroup; ++j) codes[j] = sdk::floatBits(x[j]) >> 31;
  uint64_t word;
  sdk::bitpack::packGroup<1>(codes, &word);
  return word;
#endif
}

}  // namespace terse::kit

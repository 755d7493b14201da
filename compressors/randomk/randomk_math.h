// The index choice of random-k, shared by the CPU plugin and the later CUDA kernels (DESIGN.md section 5).
//
// Every rank must pick the same k distinct indices of [0, n) for a (seed, step, tensor), with no memory to spare (the
// decompress side may not write the workspace, and a parameter server decodes without having compressed). So the
// j-th index is computed, not drawn and remembered: index(j) = pi(j) for j < k, where pi is a pseudorandom permutation
// of [0, n) keyed from Philox. Distinct j give distinct indices (pi is a bijection), which is sampling k of n without
// replacement; each j is independent of the others, so a GPU thread per j computes its index alone.
//
// pi: a 4-round Feistel network (Luby and Rackoff 1988) on b-bit words, 2^(b-1) < n <= 2^b, split into halves of
// floor(b/2) and ceil(b/2) bits (an unbalanced network swaps the half widths every round and is still a bijection),
// restricted to [0, n) by cycle walking (Black and Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002):
// apply the b-bit permutation until the result falls below n. Since 2^b < 2n, the expected number of applications is
// below 2. Round function F_r(x) = splitmix64(x ^ K_r) with round keys K_0..K_3 = the first 8 Philox words of the
// (seed, step, tensor) stream, so all randomness comes from sdk::PhiloxStream and the arithmetic is integer-only: the
// CPU and GPU paths compute the same indices bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::randomk {

inline constexpr int kFeistelRounds = 4;

struct Permutation {
  uint64_t n = 0;  // domain [0, n)
  uint64_t key[kFeistelRounds] = {0, 0, 0, 0};
  uint32_t left_bits = 0;  // width of the high half on entry; the low half has total_bits - left_bits
  uint32_t total_bits = 0;
};

TERSE_HD uint64_t lowMask(uint32_t bits) {
  return bits >= 64 ? ~0ull : (1ull << bits) - 1ull;
}

// The permutation of [0, n) for (seed, step, tensor_id), n >= 1.
TERSE_HD Permutation makePermutation(uint64_t seed, uint64_t step, uint64_t tensor_id, uint64_t n) {
  Permutation p;
  p.n = n;
  uint32_t bits = 1;
  while (bits < 64 && (1ull << bits) < n) ++bits;
  p.total_bits = bits;
  p.left_bits = bits / 2;
  const sdk::PhiloxStream stream(seed, step, tensor_id);
  for (int r = 0; r < kFeistelRounds; r += 2) {
    const auto w = stream.block(static_cast<uint64_t>(r / 2));  // elements 4(r/2) .. 4(r/2)+3 of the stream
    p.key[r] = static_cast<uint64_t>(w.v[0]) | static_cast<uint64_t>(w.v[1]) << 32;
    p.key[r + 1] = static_cast<uint64_t>(w.v[2]) | static_cast<uint64_t>(w.v[3]) << 32;
  }
  return p;
}

// One application of the Feistel network on [0, 2^total_bits).
TERSE_HD uint64_t feistel(const Permutation& p, uint64_t x) {
  uint32_t lw = p.left_bits;
  uint32_t rw = p.total_bits - p.left_bits;
  uint64_t l = x >> rw;
  uint64_t r = x & lowMask(rw);
  for (int round = 0; round < kFeistelRounds; ++round) {
    // (L, R) -> (R, L ^ F(R)): the new right half has the old left's width, so the widths swap.
    const uint64_t f = sdk::mix64(r ^ p.key[round]) & lowMask(lw);
    const uint64_t next_r = l ^ f;
    l = r;
    r = next_r;
    const uint32_t t = lw;
    lw = rw;
    rw = t;
  }
  return (l << rw) | r;
}

// The j-th selected index, j < n: cycle walking keeps pi a bijection of [0, n). It terminates because the orbit of
// j < n under the b-bit permutation returns to j itself.
TERSE_HD uint64_t selectedIndex(const Permutation& p, uint64_t j) {
  uint64_t x = feistel(p, j);
  while (x >= p.n) x = feistel(p, x);
  return x;
}

// The unbiased scale n / k: each index is selected with probability k / n, so E[scale * g_i * 1{i selected}] = g_i.
TERSE_HD float unbiasedScale(uint64_t n, uint64_t k) {
  return k == 0 ? 1.0f : static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
}

// Number of coordinates sent: k = min(numel, max(1, round(ratio * numel))) for numel > 0, 0 for numel = 0 (the rule
// of topk; repeated here so that randomk stays buildable on its own).
TERSE_HD uint64_t targetCount(double ratio, uint64_t numel) {
  if (numel == 0) return 0;
  const double want = std::floor(ratio * static_cast<double>(numel) + 0.5);
  if (!(want >= 1.0)) return 1;
  if (want >= static_cast<double>(numel)) return numel;
  return static_cast<uint64_t>(want);
}

}  // namespace terse::compressors::randomk

// The info.seed a codec hands its plugin, derived from the experiment's run seed (compressor_v1.h, info.seed).
//
// With TERSE_CAP_SHARED_SEED every rank must see the same value (random-k picks the same indices everywhere, so the
// payloads can be summed). Without it each rank gets its own value, so that stochastic rounding or sampling noise is
// independent across ranks and averages out in the aggregate instead of adding up coherently (QSGD's variance bound,
// Alistarh et al. 2017, assumes independent quantizers per worker).
//
//   codecSeed(s, shared, r) = splitmix64(splitmix64(s) ^ splitmix64(stream ^ kCodecSeedDomain)),
//   stream = shared ? kSharedSeedStream : r
//
// splitmix64 (Steele, Lea and Flood 2014, "Fast Splittable Pseudorandom Number Generators") is a bijection on 64-bit
// words with full avalanche, so for a fixed run seed distinct ranks are guaranteed distinct seeds (no birthday
// collisions), and the shared stream (all ones, never a valid rank) differs from every rank's. The value does not
// depend on the tensor: the plugin mixes in (step, tensor_id, element index) itself, as the ABI says.
#pragma once

#include <cstdint>

#include "terse/hd.h"

namespace terse {

// One step of splitmix64: the golden-ratio increment followed by the variant-13 finalizer (Stafford's Mix13).
TERSE_HD constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Separates codec seeds from any other use of splitmix64 on the run seed (data shuffling, model init).
inline constexpr uint64_t kCodecSeedDomain = 0x7465727365636f64ull;  // "tersecod"
inline constexpr uint64_t kSharedSeedStream = ~0ull;

TERSE_HD constexpr uint64_t codecSeed(uint64_t run_seed, bool shared, int rank) {
  const uint64_t stream = shared ? kSharedSeedStream : static_cast<uint64_t>(static_cast<uint32_t>(rank));
  return splitmix64(splitmix64(run_seed) ^ splitmix64(stream ^ kCodecSeedDomain));
}

}  // namespace terse

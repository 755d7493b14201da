// The data the conformance suite feeds a plugin and the measures it takes of what comes back: byte and float vectors,
// seeded standard-normal inputs, norms in double, and the first bit or byte where two results part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace terse::conformance {

using Bytes = std::vector<std::byte>;
using Floats = std::vector<float>;

std::span<const std::byte> asBytes(const Floats& x);

// ---- Inputs.

uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b = 0);
Floats normalInput(uint64_t numel, uint64_t seed);

// ---- Vector arithmetic, in double.

double norm(std::span<const float> x);
double diffNorm(std::span<const float> a, std::span<const float> b);
bool allFinite(std::span<const float> x);

// Index of the first element whose bits differ, or -1.
int64_t firstBitDifference(std::span<const float> a, std::span<const float> b);
// Index of the first byte that differs, the shorter length when one is a prefix of the other, or -1.
int64_t firstByteDifference(std::span<const std::byte> a, std::span<const std::byte> b);

}  // namespace terse::conformance

// FNV-1a 64 (Fowler, Noll, Vo): the run's cheap fingerprints of bytes that several ranks or runs must agree on
// (parameter checksums, data partitions, cache keys). Not a cryptographic hash: it detects accidents, not attacks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace terse {

inline constexpr uint64_t kFnv1aBasis = 1469598103934665603ull;  // FNV-1a 64 offset basis

// `h` extended by `n` bytes at `data` (start from kFnv1aBasis).
inline uint64_t fnv1a(uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;  // FNV prime
  }
  return h;
}

}  // namespace terse

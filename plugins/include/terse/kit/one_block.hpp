// Where the sparsifiers' device code (topk, dgc, threshold) switches from one block to the whole GPU. Plain C++: the
// plugins' .cc files read the cut, their .cu files launch by it.
//
// A small tensor costs launches and synchronizations, not bytes: most of a ResNet's tensors are batch-norm vectors of
// 64 to 2,048 elements. So a tensor of at most the cut's elements is selected (topk's whole selection, dgc's exact one)
// by one block in one launch (topk_one_block.cuh), and decoded by one block in one launch that validates before it
// writes (sparse_kernels.cuh's validateAndScatterOneBlockKernel); larger ones take the grid-wide kernels. The payload
// and the decode are the same either way, so the cut is a matter of speed alone. 2^16 is a guess until a GPU has timed
// both ways (terse-bench-topk-cuda's small-tensor table); kOneBlockEnv moves it for a run.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "terse/sdk.hpp"

namespace terse::kit {

inline constexpr uint64_t kOneBlockMaxNumel = uint64_t{1} << 16;
inline constexpr const char* kOneBlockEnv = "TERSE_SPARSE_ONE_BLOCK_MAX";

// The cut in force: kOneBlockEnv's value, a decimal number of elements below 2^32 (0: never one block), or
// kOneBlockMaxNumel when it is unset or empty. Throws InvalidArgument naming the variable and its value for anything
// else. A plugin instance reads it once, when it is made, so that its sizes and its calls agree.
inline uint64_t oneBlockMaxNumel() {
  const char* text = std::getenv(kOneBlockEnv);
  if (text == nullptr || *text == '\0') return kOneBlockMaxNumel;
  const std::string value(text);
  uint64_t n = 0;
  bool ok = value.size() <= 10;  // 2^32 - 1 has 10 digits; more would overflow the sum below
  for (char ch : value) {
    ok = ok && ch >= '0' && ch <= '9';
    if (ok) n = n * 10 + static_cast<uint64_t>(ch - '0');
  }
  if (!ok || n >= (uint64_t{1} << 32)) {
    throw sdk::InvalidArgument(std::string(kOneBlockEnv) + "='" + value +
                               "' is not a number of elements below 2^32 (the largest tensor a sparsifier selects or "
                               "decodes in one block on CUDA; 0: none)");
  }
  return n;
}

}  // namespace terse::kit

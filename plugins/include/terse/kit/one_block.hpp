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

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <system_error>

#include "terse/sdk.hpp"

namespace terse::kit {

inline constexpr uint64_t kOneBlockMaxNumel = uint64_t{1} << 16;
inline constexpr const char* kOneBlockEnv = "TERSE_SPARSE_ONE_BLOCK_MAX";

// The cut in force: kOneBlockEnv's value, a decimal number of elements below 2^32 (0: never one block), or
// kOneBlockMaxNumel when it is unset or empty. Throws InvalidArgument naming the variable and its value for anything
// else.
inline uint64_t oneBlockMaxNumel() {
  const char* text = std::getenv(kOneBlockEnv);
  if (text == nullptr || *text == '\0') return kOneBlockMaxNumel;
  const std::string value(text);
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n, 10);
  if (ec != std::errc() || end != value.data() + value.size() || n >= (uint64_t{1} << 32)) {
    throw sdk::InvalidArgument(std::string(kOneBlockEnv) + "='" + value +
                               "' is not a number of elements below 2^32 (the largest tensor a sparsifier selects or "
                               "decodes in one block on CUDA; 0: none)");
  }
  return n;
}

// A plugin instance's cut, read once when the instance is made, so that its sizes and its calls agree.
class OneBlockCut {
 public:
  // Whether a tensor of numel elements runs in one block (an empty one never does: it has nothing to launch for).
  bool covers(uint64_t numel) const noexcept { return numel > 0 && numel <= max_; }

 private:
  uint64_t max_ = oneBlockMaxNumel();
};

}  // namespace terse::kit

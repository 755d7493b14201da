// core/common/cuda.h for builds without CUDA (TERSE_CUDA=OFF or no nvcc found).
#include "core/common/cuda.h"

namespace terse::cuda {

bool builtWithCuda() noexcept {
  return false;
}

DeviceSummary deviceSummary() noexcept {
  DeviceSummary s;
  s.reason = "this build has no CUDA (configured with TERSE_CUDA=OFF or without nvcc)";
  return s;
}

}  // namespace terse::cuda

// The CUDA side of core/common/cuda.h. This translation unit is compiled by nvcc whenever CUDA is on, so CI proves
// the CUDA toolchain, architectures and flags work even on a machine without a GPU.
#include <cuda_runtime_api.h>

#include <sstream>

#include "core/common/cuda.h"

namespace terse::cuda {

bool builtWithCuda() noexcept {
  return true;
}

DeviceSummary deviceSummary() noexcept {
  DeviceSummary s;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::ostringstream rt;
  rt << "CUDA runtime " << runtime / 1000 << "." << (runtime % 1000) / 10;
  if (driver > 0)
    rt << ", driver " << driver / 1000 << "." << (driver % 1000) / 10;
  else
    rt << ", no driver";
  s.runtime = rt.str();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // No driver or no device is the normal state of a CPU-only machine; report it and clear the sticky error.
    s.reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();
    return s;
  }
  s.count = count;
  if (count == 0) {
    s.reason = "no CUDA device";
    return s;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::ostringstream name;
    name << prop.name << " (sm_" << prop.major << prop.minor << ")";
    s.first_name = name.str();
  }
  return s;
}

}  // namespace terse::cuda

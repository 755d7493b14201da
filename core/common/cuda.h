// CUDA support that exists whether or not this build has CUDA: callers ask cudaAvailable() instead of #ifdef-ing.
// Every CUDA call in terse goes through TERSE_CUDA_CHECK, which names the call and cudaGetErrorString (NCCL's
// CUDACHECK habit), and every NCCL call through TERSE_NCCL_CHECK (the call and ncclGetErrorString), so a failure on a
// cluster node says what failed without a debugger.
#pragma once

#include <string>

namespace terse::cuda {

// True when this build compiled CUDA code (TERSE_CUDA=AUTO found nvcc, or ON).
bool builtWithCuda() noexcept;

struct DeviceSummary {
  int count = 0;           // usable devices; 0 when none or when the build has no CUDA
  std::string reason;      // why count is 0 (no CUDA in this build, no driver, no device), empty otherwise
  std::string runtime;     // "CUDA runtime 13.0, driver 13.0" or empty
  std::string first_name;  // name and compute capability of device 0, e.g. "NVIDIA H100 80GB HBM3 (sm_90)"
};

// Asks the runtime once; never throws (a machine without a driver is a normal answer here, not an error).
DeviceSummary deviceSummary() noexcept;

}  // namespace terse::cuda

#if defined(__CUDACC__) || defined(TERSE_WITH_CUDA_RUNTIME)
#include <cuda_runtime_api.h>

#include "core/common/error.h"

// TERSE_CUDA_CHECK(cudaMemcpyAsync(...)): throws terse::DeviceError "cudaMemcpyAsync(...) failed: <error string>".
// The failure is reported by the exception, so the runtime's per-thread last error is cleared first: left set, it
// would make the next cudaGetLastError() after an unrelated kernel launch (here or in a plugin, which share the
// runtime) report this old failure as its own. A sticky error (a crashed kernel) stays: every later call reports it.
#define TERSE_CUDA_CHECK(call)                                                                            \
  do {                                                                                                    \
    cudaError_t terse_cuda_err_ = (call);                                                                 \
    if (terse_cuda_err_ != cudaSuccess) {                                                                 \
      (void)cudaGetLastError();                                                                           \
      TERSE_THROW(::terse::DeviceError, #call << " failed: " << cudaGetErrorName(terse_cuda_err_) << ": " \
                                              << cudaGetErrorString(terse_cuda_err_));                    \
    }                                                                                                     \
  } while (0)

// TERSE_NCCL_CHECK(ncclCommInitRank(...)): the same for an NCCL call in a file that includes nccl.h (TERSE_HAVE_NCCL
// builds): throws terse::DeviceError "ncclCommInitRank(...) failed: <ncclGetErrorString>". ncclInProgress is a
// failure here: callers of a non-blocking communicator handle it before checking (nccl_communicator.cc).
#define TERSE_NCCL_CHECK(call)                                                                              \
  do {                                                                                                      \
    ncclResult_t terse_nccl_res_ = (call);                                                                  \
    if (terse_nccl_res_ != ncclSuccess) {                                                                   \
      TERSE_THROW(::terse::DeviceError, #call << " failed: " << ncclGetErrorString(terse_nccl_res_) << " (" \
                                              << static_cast<int>(terse_nccl_res_) << ")");                 \
    }                                                                                                       \
  } while (0)
#endif

// terse plugin SDK for CUDA plugins: check every CUDA runtime call (NCCL's CUDACHECK habit). A failure throws
// sdk::DeviceError naming the call and the runtime's error, which the export macro turns into TERSE_ERR_DEVICE with
// that message logged through the core:
//
//   TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
//   myKernel<<<grid, block, 0, stream>>>(...);
//   TERSE_SDK_CUDA_CHECK(cudaGetLastError());  // a launch reports its configuration errors only here
//
// A failure clears the runtime's per-thread last error (the exception reports it), so that the launch check after an
// unrelated later kernel does not report it again. Include it only from translation units built with CUDA (it needs
// <cuda_runtime_api.h>).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "terse/sdk/error.hpp"

#define TERSE_SDK_CUDA_CHECK(call)                                                                               \
  do {                                                                                                           \
    const cudaError_t terse_sdk_cuda_err_ = (call);                                                              \
    if (terse_sdk_cuda_err_ != cudaSuccess) {                                                                    \
      (void)cudaGetLastError(); /* reported by the throw: the next launch check must not see it */               \
      throw ::terse::sdk::DeviceError(std::string(#call) + " failed: " + cudaGetErrorName(terse_sdk_cuda_err_) + \
                                      ": " + cudaGetErrorString(terse_sdk_cuda_err_));                           \
    }                                                                                                            \
  } while (0)

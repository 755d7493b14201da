// terse plugin SDK for plugins that call cuBLAS: check every cuBLAS call as cuda.hpp checks the runtime's. A failure
// throws sdk::DeviceError naming the call and cuBLAS's status, which the export macro turns into TERSE_ERR_DEVICE with
// that message logged through the core:
//
//   TERSE_SDK_CUBLAS_CHECK(cublasSetStream(handle, stream));
//
// A separate header from cuda.hpp so that plugins without cuBLAS need neither its headers nor its library. Include it
// only from translation units built with CUDA, and link CUDA::cublas.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "terse/sdk/error.hpp"

#define TERSE_SDK_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                     \
    const cublasStatus_t terse_sdk_cublas_status_ = (call);                                                \
    if (terse_sdk_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                               \
      throw ::terse::sdk::DeviceError(std::string(#call) +                                                 \
                                      " failed: " + cublasGetStatusName(terse_sdk_cublas_status_) + ": " + \
                                      cublasGetStatusString(terse_sdk_cublas_status_));                    \
    }                                                                                                      \
  } while (0)

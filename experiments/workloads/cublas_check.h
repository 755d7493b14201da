// TERSE_CUBLAS_CHECK: the cuBLAS twin of TERSE_CUDA_CHECK (core/common/cuda.h) for the CUDA workloads, so a failed
// GEMM on a cluster node names the call and cuBLAS's own status (NCCL's CUDACHECK habit, docs/STYLE.md 4). Included
// only by CUDA builds (TERSE_HAVE_CUDA).
#pragma once

#include <cublas_v2.h>

#include "core/common/error.h"

// TERSE_CUBLAS_CHECK(cublasSgemm(...)): throws terse::DeviceError "cublasSgemm(...) failed: CUBLAS_STATUS_...: <text>".
#define TERSE_CUBLAS_CHECK(call)                                                                                  \
  do {                                                                                                            \
    cublasStatus_t terse_cublas_status_ = (call);                                                                 \
    if (terse_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      TERSE_THROW(::terse::DeviceError, #call << " failed: " << cublasGetStatusName(terse_cublas_status_) << ": " \
                                              << cublasGetStatusString(terse_cublas_status_));                    \
    }                                                                                                             \
  } while (0)

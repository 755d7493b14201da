// core/compress/device_kernels.h for CUDA builds. One thread per element with a grid-stride loop: these kernels are
// bandwidth-bound streams over a few arrays, and the per-element bodies are the host's (TERSE_HD), so the only thing
// a fancier launch could change is speed, never the bits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/compress/device_kernels.h"
#include "core/compress/ef21_math.h"
#include "core/compress/error_feedback_math.h"
#include "core/compress/momentum_correction_math.h"
#include "terse/sdk/half.hpp"

namespace terse::device_kernels {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest.
constexpr std::size_t kMaxBlocks = 4096;

unsigned blocksFor(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

cudaStream_t asStream(void* s) {
  return static_cast<cudaStream_t>(s);
}

#define TERSE_GRID_LOOP(i, n)                                                                    \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// Whether a deferred verdict's gate is raised (engine.h, "Payload checks"): one thread a block reads the device word
// and shares it, so the answer is block-uniform. Every thread calls it before any returns; a null gate is never raised.
__device__ bool gateRaised(const uint32_t* gate) {
  if (gate == nullptr) return false;  // a kernel argument: uniform, so the barrier is reached by all or none
  __shared__ uint32_t raised;
  if (threadIdx.x == 0) raised = *reinterpret_cast<const volatile uint32_t*>(gate);
  __syncthreads();
  return raised != 0;
}

__global__ void efCorrectKernel(const float* __restrict__ g, const float* __restrict__ e, float* __restrict__ p,
                                std::size_t n) {
  TERSE_GRID_LOOP(i, n) {
    p[i] = ::terse::efCorrect(g[i], e[i]);
  }
}

__global__ void efResidualKernel(const float* __restrict__ p, const float* __restrict__ t, float* __restrict__ e,
                                 std::size_t n, const uint32_t* gate) {
  if (gateRaised(gate)) return;  // the own decode was refused: the residual stays as it was
  TERSE_GRID_LOOP(i, n) {
    e[i] = ::terse::efResidual(p[i], t[i]);
  }
}

__global__ void dgcStageKernel(const float* __restrict__ u, const float* __restrict__ g, float m, bool nesterov,
                               float* __restrict__ u_t, float* __restrict__ input, std::size_t n) {
  TERSE_GRID_LOOP(i, n) {
    if (nesterov) {
      u_t[i] = dgcNesterovMomentum(u[i], g[i], m);
      input[i] = dgcNesterovInput(u_t[i], g[i]);
    } else {
      u_t[i] = dgcMomentum(u[i], g[i], m);
    }
  }
}

__global__ void dgcCommitKernel(const float* __restrict__ u_t, const float* __restrict__ t, bool masked,
                                float* __restrict__ u, std::size_t n, const uint32_t* gate) {
  if (gateRaised(gate)) return;  // as efResidualKernel: the momentum stays as it was
  TERSE_GRID_LOOP(i, n) {
    u[i] = masked ? dgcMask(u_t[i], t[i]) : u_t[i];
  }
}

// Whether any of `count` verdict words, or `own`, is raised, block-uniform as gateRaised's answer (the pointers and
// the count are kernel arguments).
__device__ bool anyGateRaised(const uint32_t* gates, std::size_t count, const uint32_t* own) {
  if ((gates == nullptr || count == 0) && own == nullptr) return false;
  __shared__ uint32_t raised;
  if (threadIdx.x == 0) {
    uint32_t any = own != nullptr ? *reinterpret_cast<const volatile uint32_t*>(own) : 0u;
    for (std::size_t k = 0; gates != nullptr && k < count; ++k)
      any |= reinterpret_cast<const volatile uint32_t*>(gates)[k];
    raised = any;
  }
  __syncthreads();
  return raised != 0;
}

__global__ void ef21StageKernel(const float* __restrict__ g, const float* __restrict__ v, const float* __restrict__ h,
                                float eta, const uint32_t* primed, float* __restrict__ v_t, float* __restrict__ input,
                                std::size_t n) {
  // v_1 = g_1: before the first commit the momentum is the gradient itself (eta 1 weighs v by nothing).
  const float e = v != nullptr && *primed != 0 ? eta : 1.0f;
  TERSE_GRID_LOOP(i, n) {
    if (v != nullptr) {
      const float m = ::terse::ef21Momentum(v[i], g[i], e);
      v_t[i] = m;
      input[i] = ::terse::ef21Difference(m, h[i]);
    } else {
      input[i] = ::terse::ef21Difference(g[i], h[i]);
    }
  }
}

__global__ void ef21StageNextKernel(const float* __restrict__ h, const float* __restrict__ t, float* __restrict__ next,
                                    std::size_t n) {
  TERSE_GRID_LOOP(i, n) {
    next[i] = ::terse::ef21Advance(h[i], t[i]);
  }
}

__global__ void ef21CommitKernel(float* __restrict__ out, float* __restrict__ sum, const float* __restrict__ next,
                                 float* __restrict__ h, const float* __restrict__ v_t, float* __restrict__ v,
                                 uint32_t* primed, std::size_t n, const uint32_t* gates, std::size_t count,
                                 const uint32_t* own) {
  if (anyGateRaised(gates, count, own)) return;  // a refused payload: the step fails, and nothing of it moves
  TERSE_GRID_LOOP(i, n) {
    h[i] = next[i];
    if (v != nullptr) v[i] = v_t[i];
    const float s = ::terse::ef21Advance(sum[i], out[i]);
    out[i] = s;
    sum[i] = s;
  }
  // Read by the next step's staging kernel, later on the stream.
  if (primed != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *primed = 1u;
}

template <class T>
__global__ void divideKernel(T* p, std::size_t n, T w) {
  TERSE_GRID_LOOP(i, n) {
    p[i] /= w;
  }
}

__global__ void divideHalfKernel(uint16_t* p, std::size_t n, float w) {
  TERSE_GRID_LOOP(i, n) {
    p[i] = sdk::floatToHalf(sdk::halfToFloat(p[i]) / w);
  }
}

__global__ void divideBf16Kernel(uint16_t* p, std::size_t n, float w) {
  TERSE_GRID_LOOP(i, n) {
    p[i] = sdk::floatToBf16(sdk::bf16ToFloat(p[i]) / w);
  }
}

// A batch of copies, by value: a kernel parameter is copied at launch, so the caller's list may change right after.
struct CopyBatch {
  CopySegment segment[kCopySegmentsPerLaunch];
  unsigned count;
};

template <class T>
__device__ void copyUnits(const CopySegment& s) {
  const auto* __restrict__ src = static_cast<const T*>(s.src);
  auto* __restrict__ dst = static_cast<T*>(s.dst);
  const std::size_t n = s.bytes / sizeof(T);
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Block b copies segment b, in the widest unit that divides its two addresses and its length.
__global__ void copySegmentsKernel(CopyBatch batch) {
  if (blockIdx.x >= batch.count) return;
  const CopySegment& s = batch.segment[blockIdx.x];
  const auto bits = reinterpret_cast<std::uintptr_t>(s.src) | reinterpret_cast<std::uintptr_t>(s.dst) | s.bytes;
  if (bits % 16 == 0) {
    copyUnits<uint4>(s);
  } else if (bits % 4 == 0) {
    copyUnits<uint32_t>(s);
  } else if (bits % 2 == 0) {
    copyUnits<uint16_t>(s);
  } else {
    copyUnits<unsigned char>(s);
  }
}

__global__ void copyWordsKernel(const uint32_t* src, uint32_t* dst, std::size_t n) {
  TERSE_GRID_LOOP(i, n) {
    dst[i] = src[i];
  }
}

#undef TERSE_GRID_LOOP

// A launch error (bad configuration, a dead context) surfaces here rather than at the next unrelated check.
void checkLaunch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  TERSE_CHECK(err == cudaSuccess, DeviceError,
              kernel << " launch failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
}

}  // namespace

void efCorrect(const float* g, const float* e, float* p, std::size_t n, void* stream) {
  if (n == 0) return;
  efCorrectKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(g, e, p, n);
  checkLaunch("efCorrectKernel");
}

void efResidual(const float* p, const float* transmitted, float* e, std::size_t n, void* stream, const uint32_t* gate) {
  if (n == 0) return;
  efResidualKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(p, transmitted, e, n, gate);
  checkLaunch("efResidualKernel");
}

void dgcStage(const float* u, const float* g, float m, bool nesterov, float* u_t, float* input, std::size_t n,
              void* stream) {
  if (n == 0) return;
  dgcStageKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(u, g, m, nesterov, u_t, input, n);
  checkLaunch("dgcStageKernel");
}

void dgcCommit(const float* u_t, const float* transmitted, bool masked, float* u, std::size_t n, void* stream,
               const uint32_t* gate) {
  if (n == 0) return;
  dgcCommitKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(u_t, transmitted, masked, u, n, gate);
  checkLaunch("dgcCommitKernel");
}

void ef21Stage(const float* g, const float* v, const float* h, float eta, const uint32_t* primed, float* v_t,
               float* input, std::size_t n, void* stream) {
  if (n == 0) return;
  ef21StageKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(g, v, h, eta, primed, v_t, input, n);
  checkLaunch("ef21StageKernel");
}

void ef21StageNext(const float* h, const float* transmitted, float* next, std::size_t n, void* stream) {
  if (n == 0) return;
  ef21StageNextKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(h, transmitted, next, n);
  checkLaunch("ef21StageNextKernel");
}

void ef21Commit(float* out, float* sum, const float* next, float* h, const float* v_t, float* v, uint32_t* primed,
                std::size_t n, void* stream, const uint32_t* gates, std::size_t count, const uint32_t* own) {
  // An empty tensor still commits its primed word, so that its momentum's next step weighs as a non-empty one's.
  ef21CommitKernel<<<blocksFor(n == 0 ? 1 : n), kThreads, 0, asStream(stream)>>>(out, sum, next, h, v_t, v, primed, n,
                                                                                 gates, count, own);
  checkLaunch("ef21CommitKernel");
}

void copySegments(std::span<const CopySegment> segments, void* stream) {
  for (std::size_t first = 0; first < segments.size(); first += kCopySegmentsPerLaunch) {
    CopyBatch batch{};
    batch.count = static_cast<unsigned>(std::min(kCopySegmentsPerLaunch, segments.size() - first));
    for (unsigned i = 0; i < batch.count; ++i) batch.segment[i] = segments[first + i];
    copySegmentsKernel<<<batch.count, kThreads, 0, asStream(stream)>>>(batch);
    checkLaunch("copySegmentsKernel");
  }
}

void copyWords(const uint32_t* src, uint32_t* dst, std::size_t n, void* stream) {
  if (n == 0) return;
  copyWordsKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(src, dst, n);
  checkLaunch("copyWordsKernel");
}

void divide(void* data, std::size_t n, DType dtype, int world, void* stream) {
  if (n == 0) return;
  const cudaStream_t s = asStream(stream);
  switch (dtype) {
    case DType::kF32:
      divideKernel<float><<<blocksFor(n), kThreads, 0, s>>>(static_cast<float*>(data), n, static_cast<float>(world));
      break;
    case DType::kF64:
      divideKernel<double><<<blocksFor(n), kThreads, 0, s>>>(static_cast<double*>(data), n, static_cast<double>(world));
      break;
    case DType::kF16:
      divideHalfKernel<<<blocksFor(n), kThreads, 0, s>>>(static_cast<uint16_t*>(data), n, static_cast<float>(world));
      break;
    case DType::kBF16:
      divideBf16Kernel<<<blocksFor(n), kThreads, 0, s>>>(static_cast<uint16_t*>(data), n, static_cast<float>(world));
      break;
    default:
      TERSE_THROW(Unsupported, "cannot average " << dtypeName(dtype) << " gradients on the device");
  }
  checkLaunch("divideKernel");
}

}  // namespace terse::device_kernels

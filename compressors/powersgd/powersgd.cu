// powersgd's kernels and cuBLAS calls (see powersgd.cc for the algorithm and the payloads, powersgd_cuda.h for the
// launchers):
//   prepareQ       one block per column of Q: the host's zero-column test and philoxNormal draws, then one thread
//                  writes the state header and the workspace tag.
//   GEMMs          P = M Q and Q' = M^T P^ on cuBLAS in f32 (cublasSgemm_64, so no dimension is limited to
//                  2^31 - 1), where the host sums in double: the one difference from the host's arithmetic and the
//                  reason the device matches it to a tolerance (powersgd.cc), not bit for bit. The math mode is pinned
//                  to CUBLAS_DEFAULT_MATH (never TF32, whose 10-bit mantissa would break that tolerance) and atomics
//                  are off, so a GEMM gives the same bits on every run on one GPU model.
//   decode         P^ Q'^T is not a GEMM in cost: its inner dimension is r, so it is memory-bound. Each thread
//                  keeps one column of Q' in registers for a tile of rows and forms the host's productEntry sums
//                  (double P^, double sums, the same order). That keeps decompress off cuBLAS, whose scratch lives in
//                  the workspace that the ABI forbids decompress to write, and makes the decode of a given P^ and Q'
//                  the host's bit for bit. terse-bench-compressors-cuda times cuBLAS's f32 GEMM on the same shapes
//                  beside it (gemm/powersgd_decode_reference), the evidence for keeping it off cuBLAS.
//   orthogonalize  one block of kOrthoThreads: the host's Gram-Schmidt column by column (twice-projected, the same
//                  collapse test and basis-vector rule), each dot product summed by the block in a fixed order (warp
//                  shuffles, then the warps' totals).
//                  The rank is small, so one block holds everything; a very tall P (millions of rows) makes this one
//                  block the step's slow part, about (r^2 + 3 r) passes over n doubles.
//   validate       one thread per prefix byte and per value, raising the status word on anything the host refuses.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "powersgd_cuda.h"
#include "powersgd_math.h"
#include "terse/kit/device.cuh"
#include "terse/sdk/cublas.hpp"
#include "terse/sdk/cuda.hpp"

namespace terse::compressors::powersgd::cuda {

// ---- cuBLAS handles.

struct Blas::Pool {
  struct Entry {
    int device;
    cublasHandle_t handle;
  };

  ~Pool() {
    // finalize runs after every call has returned. Statuses are dropped: a destructor cannot throw, and at process exit
    // the runtime may already be gone. cublasDestroy works on the handle's own device, made current for it.
    int current = -1;
    const bool know_current = cudaGetDevice(&current) == cudaSuccess;
    for (const Entry& e : all) {
      if (cudaSetDevice(e.device) == cudaSuccess) (void)cublasDestroy(e.handle);
    }
    if (know_current) (void)cudaSetDevice(current);
    (void)cudaGetLastError();
  }

  // A handle of the current device, leased until the Lease dies.
  class Lease {
   public:
    Lease(Pool& pool, Entry entry) : pool_(pool), entry_(entry) {}
    ~Lease() {
      std::lock_guard<std::mutex> lock(pool_.mutex);
      pool_.idle.push_back(entry_);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // Binds the handle to this call's stream and scratch. cublasSetStream resets the workspace to cuBLAS's own pool
    // (one per handle, which calls on different streams would share), so the workspace is set after it, every call.
    cublasHandle_t bind(void* stream, const BlasScratch& scratch) const {
      TERSE_SDK_CUBLAS_CHECK(cublasSetStream(entry_.handle, device::streamOf(stream)));
      const auto base = reinterpret_cast<uintptr_t>(scratch.base);
      const uintptr_t aligned = (base + kBlasAlign - 1) / kBlasAlign * kBlasAlign;
      const uint64_t slack = aligned - base;
      if (scratch.base == nullptr || scratch.bytes < slack + kMinBlasBytes) {
        throw sdk::Error(TERSE_ERR_INTERNAL, "powersgd: cuBLAS scratch of " + std::to_string(scratch.bytes) +
                                                 " bytes is smaller than the " + std::to_string(kMinBlasBytes) +
                                                 " bytes cuBLAS needs after alignment");
      }
      TERSE_SDK_CUBLAS_CHECK(
          cublasSetWorkspace(entry_.handle, reinterpret_cast<void*>(aligned), scratch.bytes - slack));
      return entry_.handle;
    }

   private:
    Pool& pool_;
    Entry entry_;
  };

  Lease acquire() {
    int device = 0;
    TERSE_SDK_CUDA_CHECK(cudaGetDevice(&device));
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (size_t i = 0; i < idle.size(); ++i) {
        if (idle[i].device == device) {
          const Entry e = idle[i];
          idle.erase(idle.begin() + static_cast<std::ptrdiff_t>(i));
          return Lease(*this, e);
        }
      }
    }
    // Created outside the lock: cublasCreate takes a while and may fail; the new handle joins `all` only when set up.
    cublasHandle_t h = nullptr;
    TERSE_SDK_CUBLAS_CHECK(cublasCreate(&h));
    try {
      TERSE_SDK_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
      TERSE_SDK_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
      TERSE_SDK_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
    } catch (...) {
      (void)cublasDestroy(h);
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex);
    all.push_back(Entry{device, h});
    return Lease(*this, all.back());
  }

  std::mutex mutex;
  std::vector<Entry> idle;  // not leased
  std::vector<Entry> all;
};

Blas::Blas() : pool_(std::make_unique<Pool>()) {}
Blas::~Blas() = default;

namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

int64_t ld(uint64_t rows) {
  return static_cast<int64_t>(rows < 1 ? 1 : rows);
}

// ---- Round 0: Q.

__global__ void prepareQKernel(const StateHeader* __restrict__ header, float* __restrict__ q, Dims d,
                               sdk::PhiloxStream rng) {
  const StateKind kind = stateKind(*header, d.n, d.m, d.r);  // nobody writes the header in this kernel
  if (kind != StateKind::kFresh && kind != StateKind::kReady) return;
  const bool fresh = kind == StateKind::kFresh;
  for (uint64_t c = blockIdx.x; c < d.r; c += gridDim.x) {  // block-uniform: __syncthreads_or below is safe
    float* col = q + c * d.m;
    bool draw = fresh;
    if (!fresh) {
      int nonzero = 0;
      for (uint64_t j = threadIdx.x; j < d.m; j += blockDim.x) nonzero |= col[j] != 0.0f;
      draw = __syncthreads_or(nonzero) == 0;
    }
    if (draw) {
      for (uint64_t j = threadIdx.x; j < d.m; j += blockDim.x) {
        col[j] = static_cast<float>(philoxNormal(rng, c * d.m + j));
      }
    }
  }
}

__global__ void finishRound0Kernel(StateHeader* header, WorkspaceTag* tag, Dims d, uint64_t step) {
  const StateKind kind = stateKind(*header, d.n, d.m, d.r);
  if (kind != StateKind::kFresh && kind != StateKind::kReady) {
    *tag = makeTag(kStageBadState, step, d.n, d.m, d.r);
    return;
  }
  *header = StateHeader{kStateMagic, static_cast<uint32_t>(d.r), d.n, d.m, {0, 0, 0, 0, 0}};
  *tag = makeTag(1, step, d.n, d.m, d.r);
}

__global__ void writeTagKernel(WorkspaceTag tag, WorkspaceTag* dst) {
  *dst = tag;
}

// ---- Validation.

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, uint64_t count,
                               uint32_t* status, const WorkspaceTag* tag, WorkspaceTag want, bool raise_when_equal,
                               uint32_t* tag_status) {
  const float* v = reinterpret_cast<const float*>(payload + expected.size);
  const uint64_t items = count > expected.size ? count : (expected.size > 0 ? expected.size : 1);
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t < count && !(fabsf(v[t]) <= FLT_MAX)) device::raiseStatus(status);  // inf or NaN
    if (t == 0 && tag != nullptr && sameTag(*tag, want) == raise_when_equal) device::raiseStatus(tag_status);
  }
}

// ---- Round 1: orthogonalization.

constexpr unsigned kOrthoThreads = 1024;  // a power of two: the reductions below halve it

// The sum of a warp's `v`, in a fixed order (a shuffle-down tree), in lane 0.
__device__ __forceinline__ double warpSum(double v) {
  for (unsigned offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

constexpr unsigned kWarps = kOrthoThreads / 32;
constexpr unsigned kSumSlots = kWarps + 1;  // blockSum's shared memory: the warps' totals, then the block's

// The sum of every thread's `v`, in a fixed order, returned to every thread of the block: each warp sums its lanes by
// shuffles, then warp 0 sums the warps' totals the same way. Two block barriers a sum, where a shared-memory tree
// over the 1024 threads took eleven; the orthogonalization makes (r^2 + 3 r) of these sums in a row, one after
// another, so its time is their latency. The order is fixed, so every run on every rank gives the same bits. No
// barrier is needed after the total is read: the next call writes the warps' slots, never the total's, before its
// first barrier, and rewrites the total only after it, which every thread reaches after reading this one.
__device__ double blockSum(double v, double* shm) {
  static_assert(kOrthoThreads % 32 == 0 && kWarps <= 32, "warp 0 sums one total per warp");
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  v = warpSum(v);
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warpSum(lane < kWarps ? shm[lane] : 0.0);
    if (lane == 0) shm[kWarps] = v;
  }
  __syncthreads();
  return shm[kWarps];
}

// ||v||, as the host's norm(): sqrt of the sum of squares.
__device__ double blockNorm(const double* v, uint64_t n, double* shm) {
  double s = 0;
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i] * v[i];
  return sqrt(blockSum(s, shm));
}

// v -= sum_q <phat_q, v> phat_q over the first c columns, twice: the host's project(). Each thread updates only the
// entries it sums, so the syncs inside blockSum are all the ordering needed.
__device__ void blockProject(const double* phat, uint64_t c, double* v, uint64_t n, double* shm) {
  for (int sweep = 0; sweep < 2; ++sweep) {
    for (uint64_t q = 0; q < c; ++q) {
      const double* u = phat + q * n;
      double part = 0;
      for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) part += u[i] * v[i];
      const double dot = blockSum(part, shm);
      for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] -= dot * u[i];
    }
  }
}

__global__ void __launch_bounds__(kOrthoThreads)
    orthogonalizeKernel(const float* __restrict__ P, uint64_t n, uint64_t r, double* __restrict__ phat,
                        float* __restrict__ phat32) {
  __shared__ double shm[kSumSlots];
  __shared__ double best_rest[kOrthoThreads];
  __shared__ uint64_t best_index[kOrthoThreads];
  const unsigned t = threadIdx.x;
  for (uint64_t c = 0; c < r; ++c) {
    double* v = phat + c * n;
    for (uint64_t i = t; i < n; i += blockDim.x) v[i] = static_cast<double>(P[c * n + i]);
    const double before = blockNorm(v, n, shm);
    blockProject(phat, c, v, n, shm);
    double after = blockNorm(v, n, shm);
    if (!(after > kCollapse * before) || after == 0.0) {  // the same values on every thread: a uniform branch
      // e_k with the largest component outside span(phat[0..c)), the lowest k on ties, as the host picks it: each
      // thread scans its k in ascending order keeping the first maximum, then the block keeps the larger rest, or the
      // lower index on equal rests.
      double rest = -1.0;
      uint64_t index = ~uint64_t{0};
      for (uint64_t k = t; k < n; k += blockDim.x) {
        double in_span = 0;
        for (uint64_t q = 0; q < c; ++q) in_span += phat[q * n + k] * phat[q * n + k];
        if (1.0 - in_span > rest) {
          rest = 1.0 - in_span;
          index = k;
        }
      }
      best_rest[t] = rest;
      best_index[t] = index;
      __syncthreads();
      for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
          const double other = best_rest[t + s];
          if (other > best_rest[t] || (other == best_rest[t] && best_index[t + s] < best_index[t])) {
            best_rest[t] = other;
            best_index[t] = best_index[t + s];
          }
        }
        __syncthreads();
      }
      const uint64_t best = best_index[0];
      __syncthreads();
      for (uint64_t i = t; i < n; i += blockDim.x) v[i] = i == best ? 1.0 : 0.0;
      blockProject(phat, c, v, n, shm);
      after = blockNorm(v, n, shm);
    }
    for (uint64_t i = t; i < n; i += blockDim.x) {
      v[i] /= after;
      phat32[c * n + i] = static_cast<float>(v[i]);
    }
    __syncthreads();  // column c is complete before column c + 1 projects on it
  }
}

// ---- Decompress.

constexpr uint64_t kMaxGridY = 65535;  // a grid's y extent
constexpr unsigned kDecodeRows = 8;    // rows of out per thread: each Q entry read serves this many outputs
constexpr unsigned kDecodeChunk = 8;   // Q entries (columns c of one row j) a thread holds in registers at once

// out[i, j] = (or +=) sum_c P^[c*n + i] Q[c*m + j] for a tile of kDecodeRows rows i and one column j per thread: the
// host's productEntry, the same double products added in the same order (c ascending from 0), so the same bits as
// one thread per entry; what changes is the traffic. An entry per thread read its r Q values (16 B at rank 4, from
// L2: Q is 256 KiB at the benchmark's shape) for 8 B of DRAM traffic, so the cached reads, twice the DRAM bytes, set
// the time (the H200's decode ran at 0.33x its bound). Held in registers for kDecodeRows rows they cost 4 r / 8 B an
// entry (2 B at rank 4); the P^ entries a tile reads are the same for the whole warp (one broadcast each). Columns run
// over x (a warp writes a contiguous run of a row), tiles over y; the prior values of an accumulated tile are loaded
// first, so that their DRAM reads are in flight while the sums are formed.
//
// kOneChunk (r <= kDecodeChunk, every rank PowerSGD is normally run at) finishes each row's sum before the next row's,
// so only one sum is live; otherwise the tile's kDecodeRows sums are carried across the chunks of Q. Two kernels, not
// one with a branch, because registers are allocated for a kernel's worst path. The common one is held to 64 registers
// (4 blocks of 256 an SM, half its threads, for the loads in flight a memory-bound kernel needs), which ptxas meets
// for sm_90 without spilling; the general one's 84-92 would allow 2 or 3 blocks.
template <bool kAccumulate, bool kOneChunk>
__global__ void __launch_bounds__(device::kThreads, kOneChunk ? 4 : 1)
    decodeKernel(const double* __restrict__ phat, const float* __restrict__ Q, Dims d, float* __restrict__ out) {
  const uint64_t tiles = (d.n + kDecodeRows - 1) / kDecodeRows;
  for (uint64_t tile = uint64_t{blockIdx.y} * blockDim.y + threadIdx.y; tile < tiles;
       tile += uint64_t{gridDim.y} * blockDim.y) {
    const uint64_t i0 = tile * kDecodeRows;
    const unsigned rows = static_cast<unsigned>(d.n - i0 < kDecodeRows ? d.n - i0 : kDecodeRows);
    for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < d.m; j += uint64_t{gridDim.x} * blockDim.x) {
      float* o = out + i0 * d.m + j;
      float prior[kDecodeRows];
#pragma unroll
      for (unsigned row = 0; row < kDecodeRows; ++row) prior[row] = kAccumulate && row < rows ? o[row * d.m] : 0.0f;
      double s[kOneChunk ? 1 : kDecodeRows];
      for (uint64_t c0 = 0; c0 < d.r; c0 += kDecodeChunk) {
        const unsigned chunk = static_cast<unsigned>(d.r - c0 < kDecodeChunk ? d.r - c0 : kDecodeChunk);
        float q[kDecodeChunk];
#pragma unroll
        for (unsigned k = 0; k < kDecodeChunk; ++k) q[k] = k < chunk ? Q[(c0 + k) * d.m + j] : 0.0f;
        const double* p = phat + c0 * d.n + i0;
#pragma unroll
        for (unsigned row = 0; row < kDecodeRows; ++row) {
          if (row >= rows) continue;
          double& sum = s[kOneChunk ? 0 : row];
          if (kOneChunk || c0 == 0) sum = 0;
#pragma unroll
          for (unsigned k = 0; k < kDecodeChunk; ++k) {
            if (k < chunk) sum += p[k * d.n + row] * static_cast<double>(q[k]);
          }
          if (kOneChunk) {
            const auto v = static_cast<float>(sum);
            o[row * d.m] = kAccumulate ? prior[row] + v : v;
          }
        }
      }
      if (!kOneChunk) {
#pragma unroll
        for (unsigned row = 0; row < kDecodeRows; ++row) {
          if (row >= rows) continue;
          const auto v = static_cast<float>(s[row]);
          o[row * d.m] = kAccumulate ? prior[row] + v : v;
        }
      }
    }
  }
}

// ---- Decompress of a passthrough payload.

__global__ void copyValuesKernel(const float* __restrict__ v, uint64_t count, float* __restrict__ out,
                                 bool accumulate) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = accumulate ? out[i] + v[i] : v[i];
  }
}

}  // namespace

void prepareQ(const Dims& d, const sdk::PhiloxStream& rng, std::byte* state, WorkspaceTag* tag, uint64_t step,
              void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  auto* header = reinterpret_cast<StateHeader*>(state);
  float* q = reinterpret_cast<float*>(state + sizeof(StateHeader));
  const unsigned blocks = static_cast<unsigned>(d.r < device::kMaxBlocks ? d.r : device::kMaxBlocks);
  prepareQKernel<<<blocks, device::kThreads, 0, st>>>(header, q, d, rng);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  finishRound0Kernel<<<1, 1, 0, st>>>(header, tag, d, step);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// M is row-major n x m, which cuBLAS (column-major) sees as M^T: an m x n matrix with leading dimension m. So
//   P = M Q        is  (M^T)^T Q:  op(A) = T, A = M (m x n, ld m), B = Q (m x r, ld m), C = P (n x r, ld n)
//   Q' = M^T P^    is  M^T P^:     op(A) = N, A = M,                B = P^ (n x r, ld n), C = Q' (m x r, ld m)
void multiplyMQ(Blas& blas, const BlasScratch& scratch, const Dims& d, const float* M, const float* Q, float* P,
                void* stream) {
  const auto lease = blas.pool().acquire();
  const cublasHandle_t h = lease.bind(stream, scratch);
  TERSE_SDK_CUBLAS_CHECK(cublasSgemm_64(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int64_t>(d.n),
                                        static_cast<int64_t>(d.r), static_cast<int64_t>(d.m), &kOne, M, ld(d.m), Q,
                                        ld(d.m), &kZero, P, ld(d.n)));
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint32_t* status,
              const WorkspaceTag* tag, const WorkspaceTag& want, bool raise_when_equal, uint32_t* tag_status,
              void* stream) {
  const uint64_t items = count > expected.size ? count : (expected.size > 0 ? expected.size : 1);
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, count, status, tag, want, raise_when_equal, tag_status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void orthogonalize(const float* P, uint64_t n, uint64_t r, double* phat, float* phat32, void* stream) {
  orthogonalizeKernel<<<1, kOrthoThreads, 0, device::streamOf(stream)>>>(P, n, r, phat, phat32);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void multiplyMtP(Blas& blas, const BlasScratch& scratch, const Dims& d, const float* M, const float* phat32, float* Q,
                 void* stream) {
  const auto lease = blas.pool().acquire();
  const cublasHandle_t h = lease.bind(stream, scratch);
  TERSE_SDK_CUBLAS_CHECK(cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int64_t>(d.m),
                                        static_cast<int64_t>(d.r), static_cast<int64_t>(d.n), &kOne, M, ld(d.m), phat32,
                                        ld(d.n), &kZero, Q, ld(d.m)));
}

void writeTag(const WorkspaceTag& tag, WorkspaceTag* dst, void* stream) {
  writeTagKernel<<<1, 1, 0, device::streamOf(stream)>>>(tag, dst);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Dims& d, const double* phat, const float* Q, float* out, bool accumulate, void* stream) {
  if (d.n == 0 || d.m == 0) return;
  // A block is 256 threads: as many columns as the matrix has, in whole warps up to 256, and the rest of the block on
  // further row tiles, so that a narrow matrix (m of 31, say) does not leave most of each block idle.
  const uint64_t warps = (d.m + 31) / 32;
  const unsigned cols = static_cast<unsigned>(32 * (warps < device::kThreads / 32 ? warps : device::kThreads / 32));
  const dim3 block(cols, device::kThreads / cols);
  const uint64_t tiles = (d.n + kDecodeRows - 1) / kDecodeRows;
  const uint64_t tile_blocks = (tiles + block.y - 1) / block.y;
  const dim3 grid(device::gridFor(d.m, cols), static_cast<unsigned>(tile_blocks < kMaxGridY ? tile_blocks : kMaxGridY));
  const cudaStream_t st = device::streamOf(stream);
  const bool one_chunk = d.r <= kDecodeChunk;
  if (accumulate && one_chunk) {
    decodeKernel<true, true><<<grid, block, 0, st>>>(phat, Q, d, out);
  } else if (accumulate) {
    decodeKernel<true, false><<<grid, block, 0, st>>>(phat, Q, d, out);
  } else if (one_chunk) {
    decodeKernel<false, true><<<grid, block, 0, st>>>(phat, Q, d, out);
  } else {
    decodeKernel<false, false><<<grid, block, 0, st>>>(phat, Q, d, out);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void copyValues(const float* v, uint64_t count, float* out, bool accumulate, void* stream) {
  if (count == 0) return;
  const cudaStream_t st = device::streamOf(stream);
  if (!accumulate) {
    TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(out, v, count * sizeof(float), cudaMemcpyDeviceToDevice, st));
    return;
  }
  copyValuesKernel<<<device::gridFor(count, device::kThreads), device::kThreads, 0, st>>>(v, count, out, accumulate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::powersgd::cuda

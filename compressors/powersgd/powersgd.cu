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
//   orthogonalize  the host's Gram-Schmidt column by column (twice-projected, the same collapse test and basis-vector
//                  rule), each dot product summed in a fixed order (warp shuffles, then the warps' totals), about
//                  (r^2 + 3 r) sums one after another. Up to 32,768 rows (every layer of a ResNet; n is the tensor's
//                  first dimension) P is one block of kOrthoThreads's. A taller P (a large vocabulary's embedding) is
//                  cut into slices of rows fixed by n, one block each in a cooperative launch that meets at a
//                  grid-wide barrier per sum, where one block would make every sum a pass over all n rows alone.
//   validate       one thread per prefix byte and per value, raising the status word on anything the host refuses.
#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
      if (scratch.base == nullptr || scratch.bytes < kBlasAlign + kMinBlasBytes) {
        throw sdk::Error(TERSE_ERR_INTERNAL, "powersgd: cuBLAS scratch of " + std::to_string(scratch.bytes) +
                                                 " bytes is smaller than the " + std::to_string(kMinBlasBytes) +
                                                 " bytes cuBLAS needs after alignment");
      }
      // Always the same size, whatever the address's alignment (blasScratchBytes reserves kBlasAlign for it): cuBLAS
      // picks its algorithm partly by the workspace's size, and two tensors of one shape, or two runs, must get the
      // same one, so that they sum in the same order.
      TERSE_SDK_CUBLAS_CHECK(
          cublasSetWorkspace(entry_.handle, reinterpret_cast<void*>(aligned), scratch.bytes - kBlasAlign));
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

__global__ void writeTagKernel(WorkspaceTag tag, WorkspaceTag* dst, const uint32_t* gate) {
  if (device::gateRaised(gate)) return;
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

// How the rows of P are shared out: `slices` (orthoSlices(n), from n alone) ranges of `rows` rows each (the last may
// be shorter), each summed by one block in blockSum's order, the slices' totals then added in slice order. The bits
// depend on the slices, never on how many blocks run them: block b takes slices b, b + gridDim.x, ... So a GPU that
// can hold every slice's block at once and one that runs them all in one block give the same P^, as every rank must
// (ranks decode with their own P^ the Q' they summed). One slice is the one-block kernel exactly, sums and all.
struct Ortho {
  uint64_t n, slices, rows;
  double* totals;    // 2 * slices: one sum's slice totals; consecutive sums use alternate halves
  OrthoPick* picks;  // gridDim.x: each block's candidate basis vector, when a column collapses
};

// Every block, past this point, sees what every block wrote before it: a grid-wide barrier when the kernel runs as
// several blocks (a cooperative launch), the block's own barrier otherwise.
__device__ void syncBlocks() {
  if (gridDim.x > 1) {
    cooperative_groups::this_grid().sync();
  } else {
    __syncthreads();
  }
}

// f(i) for each row i of this thread, in ascending order: thread t of a block takes rows t, t + blockDim.x, ... of
// each of the block's slices. Every per-row step below (the load of P, the projections' updates, the normalization)
// touches only these rows, the ones the thread sums, so the sums' barriers are the only ordering the kernel needs.
template <class F>
__device__ void forOwnRows(const Ortho& o, F f) {
  for (uint64_t s = blockIdx.x; s < o.slices; s += gridDim.x) {
    const uint64_t end = (s + 1) * o.rows < o.n ? (s + 1) * o.rows : o.n;
    for (uint64_t i = s * o.rows + threadIdx.x; i < end; i += blockDim.x) f(i);
  }
}

// sum_i term(i) over all n rows, returned to every thread of every block. One slice: blockSum of the threads' partial
// sums. Several: each block writes its slices' totals, all blocks meet (syncBlocks), and each adds the totals in slice
// order, reading them from L2 (__ldcg: another block wrote them, and L1 is not coherent). The halves alternate so
// that a sum never overwrites totals that a slower block may still be reading: a block writes a half again only two
// sums later, after a barrier that every block passes only once it has read them.
template <class Term>
__device__ double gridSum(const Ortho& o, unsigned& half, double* shm, Term term) {
  if (o.slices == 1) {
    double part = 0;
    forOwnRows(o, [&](uint64_t i) { part += term(i); });
    return blockSum(part, shm);
  }
  double* totals = o.totals + half * o.slices;
  half ^= 1u;
  for (uint64_t s = blockIdx.x; s < o.slices; s += gridDim.x) {
    double part = 0;
    const uint64_t end = (s + 1) * o.rows < o.n ? (s + 1) * o.rows : o.n;
    for (uint64_t i = s * o.rows + threadIdx.x; i < end; i += blockDim.x) part += term(i);
    const double total = blockSum(part, shm);
    if (threadIdx.x == 0) totals[s] = total;
  }
  syncBlocks();
  double sum = __ldcg(totals);
  for (uint64_t s = 1; s < o.slices; ++s) sum += __ldcg(totals + s);
  return sum;
}

// ||v||, as the host's norm(): sqrt of the sum of squares.
__device__ double gridNorm(const Ortho& o, unsigned& half, const double* v, double* shm) {
  return sqrt(gridSum(o, half, shm, [&](uint64_t i) { return v[i] * v[i]; }));
}

// v -= sum_q <phat_q, v> phat_q over the first c columns, twice: the host's project().
__device__ void gridProject(const Ortho& o, unsigned& half, const double* phat, uint64_t c, double* v, double* shm) {
  for (int sweep = 0; sweep < 2; ++sweep) {
    for (uint64_t q = 0; q < c; ++q) {
      const double* u = phat + q * o.n;
      const double dot = gridSum(o, half, shm, [&](uint64_t i) { return u[i] * v[i]; });
      forOwnRows(o, [&](uint64_t i) { v[i] -= dot * u[i]; });
    }
  }
}

// The host's replacement for a collapsed column c: e_k with the largest component outside span(phat[0..c)), the
// lowest k on ties. Each thread scans its rows in ascending order keeping the first maximum; the block keeps the larger
// rest, or the lower index on equal rests; across blocks the same rule over each block's pick. The rule is a total
// order, so the pick does not depend on how the rows were shared out.
__device__ uint64_t gridPick(const Ortho& o, const double* phat, uint64_t c, double* best_rest, uint64_t* best_index) {
  const unsigned t = threadIdx.x;
  double rest = -1.0;
  uint64_t index = ~uint64_t{0};
  forOwnRows(o, [&](uint64_t k) {
    double in_span = 0;
    for (uint64_t q = 0; q < c; ++q) in_span += phat[q * o.n + k] * phat[q * o.n + k];
    if (1.0 - in_span > rest) {
      rest = 1.0 - in_span;
      index = k;
    }
  });
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
  uint64_t best = best_index[0];
  if (gridDim.x > 1) {
    if (t == 0) o.picks[blockIdx.x] = OrthoPick{best_rest[0], best};
    syncBlocks();
    double top = -1.0;
    best = ~uint64_t{0};
    for (unsigned b = 0; b < gridDim.x; ++b) {
      const double r = __ldcg(&o.picks[b].rest);
      const auto k = static_cast<uint64_t>(__ldcg(reinterpret_cast<const unsigned long long*>(&o.picks[b].index)));
      if (r > top || (r == top && k < best)) {
        top = r;
        best = k;
      }
    }
  }
  __syncthreads();  // best_rest and best_index are read before the next pick writes them
  return best;
}

// The host's Gram-Schmidt (powersgd.cc's orthogonalize), column by column: twice-projected, the same collapse test and
// basis-vector rule. Launched as one block, or cooperatively as one block a slice (orthogonalize below).
__global__ void __launch_bounds__(kOrthoThreads)
    orthogonalizeKernel(const float* __restrict__ P, Ortho o, uint64_t r, double* __restrict__ phat,
                        float* __restrict__ phat32) {
  __shared__ double shm[kSumSlots];
  __shared__ double best_rest[kOrthoThreads];
  __shared__ uint64_t best_index[kOrthoThreads];
  const uint64_t n = o.n;
  unsigned half = 0;
  for (uint64_t c = 0; c < r; ++c) {
    double* v = phat + c * n;
    forOwnRows(o, [&](uint64_t i) { v[i] = static_cast<double>(P[c * n + i]); });
    const double before = gridNorm(o, half, v, shm);
    gridProject(o, half, phat, c, v, shm);
    double after = gridNorm(o, half, v, shm);
    if (!(after > kCollapse * before) || after == 0.0) {  // the same values on every thread: a uniform branch
      const uint64_t best = gridPick(o, phat, c, best_rest, best_index);
      forOwnRows(o, [&](uint64_t i) { v[i] = i == best ? 1.0 : 0.0; });
      gridProject(o, half, phat, c, v, shm);
      after = gridNorm(o, half, v, shm);
    }
    forOwnRows(o, [&](uint64_t i) {
      v[i] /= after;
      phat32[c * n + i] = static_cast<float>(v[i]);
    });
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
    decodeKernel(const double* __restrict__ phat, const float* __restrict__ Q, Dims d, float* __restrict__ out,
                 const uint32_t* gate) {
  if (device::gateRaised(gate)) return;  // a deferred verdict refused the payload (terse/kit/device.hpp)
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

__global__ void copyValuesKernel(const float* __restrict__ v, uint64_t count, float* __restrict__ out, bool accumulate,
                                 const uint32_t* gate) {
  if (device::gateRaised(gate)) return;
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

void orthogonalize(const float* P, uint64_t n, uint64_t r, double* phat, float* phat32, std::byte* scratch,
                   void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  const uint64_t slices = orthoSlices(n);
  Ortho o{n, slices, (n + slices - 1) / slices, nullptr, nullptr};
  const auto oneBlock = [&] {
    orthogonalizeKernel<<<1, kOrthoThreads, 0, st>>>(P, o, r, phat, phat32);
    TERSE_COMPRESSOR_CHECK_LAUNCH();
  };
  if (slices == 1) return oneBlock();  // no totals: blockSum's sums are the whole sums
  o.totals = reinterpret_cast<double*>(scratch);
  o.picks = reinterpret_cast<OrthoPick*>(scratch + 2 * sizeof(double) * slices);
  // kOneBlockEnv=1 asks for the one-block launch, as a device that cannot hold every slice's block gets: the device
  // test of the two launches' bits sets it. =0 forbids that fallback, so that the same test knows its other launch
  // was the cooperative one.
  const char* one_block = std::getenv(kOneBlockEnv);
  if (one_block != nullptr && std::strcmp(one_block, "1") == 0) return oneBlock();
  const bool must_cooperate = one_block != nullptr && std::strcmp(one_block, "0") == 0;
  const auto fallBack = [&](const char* why) {
    if (must_cooperate) {
      throw sdk::Error(TERSE_ERR_UNSUPPORTED, std::string("powersgd: ") + kOneBlockEnv +
                                                  "=0 asks for the orthogonalization over several blocks, but " + why);
    }
    oneBlock();
  };
  // As many blocks as there are slices, if the device can hold them all at once (a cooperative launch's condition);
  // otherwise one block takes every slice, for the same bits, slower. A few microseconds of queries, made only for a
  // P tall enough to be split, whose orthogonalization takes far longer.
  int dev = 0, cooperative = 0, sms = 0, per_sm = 0;
  TERSE_SDK_CUDA_CHECK(cudaGetDevice(&dev));
  TERSE_SDK_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev));
  TERSE_SDK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TERSE_SDK_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, orthogonalizeKernel, static_cast<int>(kOrthoThreads), 0));
  const uint64_t resident = static_cast<uint64_t>(sms) * static_cast<uint64_t>(per_sm);
  if (cooperative == 0) return fallBack("this device cannot launch cooperatively");
  if (resident < slices) {
    return fallBack(
        ("it holds " + std::to_string(resident) + " of the " + std::to_string(slices) + " blocks at once").c_str());
  }
  void* args[] = {&P, &o, &r, &phat, &phat32};
  const cudaError_t launched =
      cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(orthogonalizeKernel),
                                  dim3(static_cast<unsigned>(slices)), dim3(kOrthoThreads), args, 0, st);
  if (launched == cudaErrorCooperativeLaunchTooLarge) {
    // The SM count overstated what this context may use (a partitioned device, MPS): the same bits from one block.
    (void)cudaGetLastError();
    return fallBack("the cooperative launch was too large for this context");
  }
  TERSE_SDK_CUDA_CHECK(launched);
}

void multiplyMtP(Blas& blas, const BlasScratch& scratch, const Dims& d, const float* M, const float* phat32, float* Q,
                 void* stream) {
  const auto lease = blas.pool().acquire();
  const cublasHandle_t h = lease.bind(stream, scratch);
  TERSE_SDK_CUBLAS_CHECK(cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int64_t>(d.m),
                                        static_cast<int64_t>(d.r), static_cast<int64_t>(d.n), &kOne, M, ld(d.m), phat32,
                                        ld(d.n), &kZero, Q, ld(d.m)));
}

void writeTag(const WorkspaceTag& tag, WorkspaceTag* dst, void* stream, const uint32_t* gate) {
  writeTagKernel<<<1, 1, 0, device::streamOf(stream)>>>(tag, dst, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Dims& d, const double* phat, const float* Q, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  if (d.n == 0 || d.m == 0) return;
  // Up to 256 threads a block: as many columns as the matrix has, in whole warps up to 256, and as many further row
  // tiles as fit in 256 threads, so that a narrow matrix (m of 31, say) does not leave most of each block idle.
  const uint64_t warps = (d.m + 31) / 32;
  const unsigned cols = static_cast<unsigned>(32 * (warps < device::kThreads / 32 ? warps : device::kThreads / 32));
  const dim3 block(cols, device::kThreads / cols);
  const uint64_t tiles = (d.n + kDecodeRows - 1) / kDecodeRows;
  const uint64_t tile_blocks = (tiles + block.y - 1) / block.y;
  const dim3 grid(device::gridFor(d.m, cols), static_cast<unsigned>(tile_blocks < kMaxGridY ? tile_blocks : kMaxGridY));
  const cudaStream_t st = device::streamOf(stream);
  const bool one_chunk = d.r <= kDecodeChunk;
  if (accumulate && one_chunk) {
    decodeKernel<true, true><<<grid, block, 0, st>>>(phat, Q, d, out, gate);
  } else if (accumulate) {
    decodeKernel<true, false><<<grid, block, 0, st>>>(phat, Q, d, out, gate);
  } else if (one_chunk) {
    decodeKernel<false, true><<<grid, block, 0, st>>>(phat, Q, d, out, gate);
  } else {
    decodeKernel<false, false><<<grid, block, 0, st>>>(phat, Q, d, out, gate);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void copyValues(const float* v, uint64_t count, float* out, bool accumulate, void* stream, const uint32_t* gate) {
  if (count == 0) return;
  const cudaStream_t st = device::streamOf(stream);
  if (!accumulate && gate == nullptr) {  // a copy cannot wait for a gate: a gated write takes the kernel
    TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(out, v, count * sizeof(float), cudaMemcpyDeviceToDevice, st));
    return;
  }
  copyValuesKernel<<<device::gridFor(count, device::kThreads), device::kThreads, 0, st>>>(v, count, out, accumulate,
                                                                                          gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::powersgd::cuda

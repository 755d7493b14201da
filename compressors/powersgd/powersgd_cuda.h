// powersgd's CUDA launchers (powersgd.cu), called by powersgd.cc for device tensors. Plain C++ (no CUDA header), so
// powersgd.cc builds the same with and without CUDA. Each function queues work on `stream` (a cudaStream_t) and returns
// without waiting for it; pointers are device memory.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs powersgd (rank r = 4, M of
// n x m = 4096 x 16384, world 1; compress is both rounds of a step, decompress the aggregate's decode accumulated onto
// the output, with the warm start). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a device
// copy's 4 read + 4 written) over the call's bytes, is the fastest it can run as a fraction of a device copy. M (256
// MiB) does not fit in the 50 MB L2; the factors do (P 64 KiB, Q 256 KiB, P^ 128 KiB in double), and each touch of
// one costs 0.001 to 0.004 B per element, left out of the passes below:
//   compress     round 0: prepareQKernel reads Q (its zero-column test); multiplyMQ, P = M Q on cuBLAS: M read, 4 B,
//                P written into the payload. Round 1: validateKernel on prev (P; one synchronization);
//                orthogonalizeKernel, a few tens of sweeps over n doubles (32 KiB each) in L2;
//                multiplyMtP, Q' = M^T P^: M read, 4 B, Q' written into the payload. Total 8.0 B (8.02 B with the
//                factors; cuBLAS's split-K partial sums stay in its 4 MiB scratch, in L2); bound 1.00x. Two reads of
//                M are the least a step can do: Q' needs P^, which needs all of P = M Q (summed over the ranks). This
//                assumes cuBLAS reads M once per GEMM (the output has r = 4 columns, narrower than a GEMM tile;
//                unmeasured). The orthogonalization costs time (serial block reductions), not traffic.
//   decompress   validateKernel on Q' (one synchronization); decodeKernel: out read 4 + written 4 = 8 B; copyValues
//                of Q' into the state (the warm start). Total 8.0 B (8.02 B with the factors); bound 1.00x. Beside
//                the DRAM bytes, cached reads: each thread holds its column's r floats of Q' for 8 rows, 4 r / 8 B an
//                entry (2 B at rank 4) from L2, and reads r doubles of P^ a row, the same for the whole warp. An entry
//                per thread read 16 B of Q' from L2 an entry, twice the DRAM bytes, and ran at 0.33x of its bound on
//                the H200 (results/reference/gpu/README.md); the tiles are not yet measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "powersgd_math.h"
#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::powersgd::cuda {

namespace device = kit::device;

// The matrix view of a compressed tensor: M is n x m (row-major, the tensor as it is), the factors have r columns.
struct Dims {
  uint64_t n, m, r;
};

// cuBLAS handles for the GEMMs, created on first need and kept for the plugin instance's life. A handle is bound to the
// call's stream (cublasSetStream) and to the tensor's scratch for cuBLAS (cublasSetWorkspace) on every call, so one
// handle cannot serve two calls at once: calls lease one, and the pool grows only when every handle of that device is
// leased, i.e. to the number of threads that ever run PowerSGD at once on a device. The steady state creates nothing.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  struct Pool;  // powersgd.cu
  Pool& pool() { return *pool_; }

 private:
  std::unique_ptr<Pool> pool_;
};

// The scratch cuBLAS gets from the tensor's workspace (cublasSetWorkspace): `bytes` from `base`, which need not be
// aligned (the launchers round it up to cuBLAS's 256 bytes, so `bytes` includes that slack).
struct BlasScratch {
  std::byte* base;
  uint64_t bytes;
};

// cuBLAS wants its workspace aligned to 256 bytes, and at least 16 KiB of it so that no routine fails for want of
// scratch; more lets it split the long sums of the skinny GEMMs (K = m or n, only r output columns) across blocks.
inline constexpr uint64_t kBlasAlign = 256;
inline constexpr uint64_t kMinBlasBytes = uint64_t{16} << 10;
inline constexpr uint64_t kMaxBlasBytes = uint64_t{4} << 20;  // cuBLAS's recommendation before Hopper (32 MiB there)

// The cuBLAS scratch a tensor gets: room for 32 partial sums of the larger factor (32 * 4 max(n, m) r bytes), within
// [16 KiB, 4 MiB], plus the alignment slack. Per tensor, so it is proportional to the factors rather than a fixed
// 32 MiB: a 4096 x 4096 matrix at rank 4 gets 2 MiB, 3% of its own 64 MiB; a 33 x 31 one 16 KiB. A guess until it is
// measured on a GPU (tests/bench/compressors_device_bench.cc); any size is correct, since cuBLAS picks an algorithm
// that fits.
inline uint64_t blasScratchBytes(const Dims& d) {
  const uint64_t larger = d.n > d.m ? d.n : d.m;
  uint64_t bytes = 32 * sizeof(float) * larger * d.r;
  bytes = bytes < kMinBlasBytes ? kMinBlasBytes : bytes > kMaxBlasBytes ? kMaxBlasBytes : bytes;
  return bytes + kBlasAlign;
}

// Round 0. Makes Q (m x r, column-major, after the state's 64-byte header) ready, as powersgd.cc's prepareQ does:
// drawn from philoxNormal when the state is zero-filled, zero columns redrawn otherwise; then marks the state
// initialised and writes the workspace tag of stage 1. A state that is neither zero-filled nor this tensor's is left
// alone and the tag says kStageBadState instead (round 1 reports it: finding out here would mean waiting).
void prepareQ(const Dims& d, const sdk::PhiloxStream& rng, std::byte* state, WorkspaceTag* tag, uint64_t step,
              void* stream);
// P (n x r, column-major) = M Q, f32 on cuBLAS.
void multiplyMQ(Blas& blas, const BlasScratch& scratch, const Dims& d, const float* M, const float* Q, float* P,
                void* stream);

// Raises `status` unless `payload` starts with `expected` and the `count` f32 values after it are finite; when `tag` is
// not null, raises `tag_status` when *tag equals `want` in sameTag's fields (raise_when_equal) or differs from it
// (otherwise). What powersgd.cc's host parser checks of a factor, and the workspace tag beside it.
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint32_t* status,
              const WorkspaceTag* tag, const WorkspaceTag& want, bool raise_when_equal, uint32_t* tag_status,
              void* stream);

// The orthogonalization's rows per block: P up to this tall is one block's (1024 threads, 32 rows each); a taller one
// is cut into orthoSlices(n) slices of ceil(n / slices) rows, at most this many up to kMaxOrthoSlices slices, one
// block each. A guess until measured: below it, a grid-wide barrier per sum would cost more than the sums it shares
// out.
inline constexpr uint64_t kOrthoSliceRows = uint64_t{1} << 15;
inline constexpr uint64_t kMaxOrthoSlices = 64;

// The slices of an n-row P: from n alone, so that every GPU (and every rank) sums in the same order.
inline uint64_t orthoSlices(uint64_t n) {
  const uint64_t s = (n + kOrthoSliceRows - 1) / kOrthoSliceRows;
  return s < 1 ? 1 : s > kMaxOrthoSlices ? kMaxOrthoSlices : s;
}

// One block's candidate basis vector for a collapsed column (its largest component outside the span so far).
struct OrthoPick {
  double rest;
  uint64_t index;
};

// The orthogonalization's scratch in the workspace: two halves of per-slice totals and a pick per block; nothing for
// one slice.
inline uint64_t orthoScratchBytes(uint64_t n) {
  const uint64_t s = orthoSlices(n);
  return s == 1 ? 0 : s * (2 * sizeof(double) + sizeof(OrthoPick));
}

// Round 1. P^ = ORTHOGONALIZE(P) into phat (n x r double), with its f32 rounding in phat32 for the GEMMs: the host's
// Gram-Schmidt (powersgd.cc), one thread block a slice of P's rows; `scratch` holds orthoScratchBytes(n), 8-byte
// aligned.
void orthogonalize(const float* P, uint64_t n, uint64_t r, double* phat, float* phat32, std::byte* scratch,
                   void* stream);
// Set to "1", a tall P's slices run in one block instead of one block each (the same bits, slower): for the device
// test that both launches agree, and for comparing the two on a GPU. Set to "0", a tall P that cannot run one block a
// slice (no cooperative launch, too few SMs) fails the call (Unsupported) instead of running in one block: for the same
// test, so that its "many blocks" side is known to be that.
inline constexpr const char* kOneBlockEnv = "TERSE_POWERSGD_ORTHO_ONE_BLOCK";
// Q (m x r, column-major) = M^T P^, f32 on cuBLAS.
void multiplyMtP(Blas& blas, const BlasScratch& scratch, const Dims& d, const float* M, const float* phat32, float* Q,
                 void* stream);
// *dst = tag, unless `gate` (a deferred verdict word) is raised.
void writeTag(const WorkspaceTag& tag, WorkspaceTag* dst, void* stream, const uint32_t* gate = nullptr);

// Decompress. out (n x m, row-major) = (or +=) P^ Q^T, each entry productEntry (double, as on the host). With a `gate`
// (a deferred verdict, terse/kit/device.hpp) queued behind validate, nothing is written when it is raised.
void decode(const Dims& d, const double* phat, const float* Q, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);
// out[i] = (or +=) v[i] for i < count: the passthrough payload's decode, and the warm start's copy into the state;
// `gate` as decode's.
void copyValues(const float* v, uint64_t count, float* out, bool accumulate, void* stream,
                const uint32_t* gate = nullptr);

}  // namespace terse::compressors::powersgd::cuda

// The compression path's own elementwise work on a CUDA device: error feedback, EF21, DGC momentum correction and the
// pipeline's averaging, each a kernel over the same TERSE_HD bodies the host loops call (error_feedback_math.h,
// ef21_math.h, momentum_correction_math.h, terse/sdk/half.hpp), built with --fmad=false as the host is with
// -ffp-contract=off, so a device tensor's residual, momentum and average equal the host's bit for bit. Every function
// enqueues on `stream` (a cudaStream_t) and returns without waiting; pointers are device memory of n elements. In a
// build without CUDA they throw Unsupported (device_kernels_none.cc) -- only a CUDA tensor reaches them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/common/dtype.h"

namespace terse::device_kernels {

// p = efCorrect(g, e) and e = efResidual(p, t), elementwise. With a `gate` (a device word: the deferred verdict of
// the own decode that wrote t, engine.h "Payload checks"), e is left as it was when the gate is raised.
void efCorrect(const float* g, const float* e, float* p, std::size_t n, void* stream);
void efResidual(const float* p, const float* transmitted, float* e, std::size_t n, void* stream,
                const uint32_t* gate = nullptr);

// DGC staging: u_t = dgcMomentum(u, g, m), or with nesterov u_t = dgcNesterovMomentum(u, g, m) and
// input = dgcNesterovInput(u_t, g) (input unused otherwise).
void dgcStage(const float* u, const float* g, float m, bool nesterov, float* u_t, float* input, std::size_t n,
              void* stream);
// u = masked ? dgcMask(u_t, transmitted) : u_t; u is left as it was when `gate` is raised (as efResidual's).
void dgcCommit(const float* u_t, const float* transmitted, bool masked, float* u, std::size_t n, void* stream,
               const uint32_t* gate = nullptr);

// EF21 (ef21.h) staging: with v (EF21-SGDM), v_t = ef21Momentum(v, g, e) with e = eta once the device word `primed`
// is nonzero and 1 before (v_1 = g_1), and input = ef21Difference(v_t, h); without (v, primed and v_t null),
// input = ef21Difference(g, h).
void ef21Stage(const float* g, const float* v, const float* h, float eta, const uint32_t* primed, float* v_t,
               float* input, std::size_t n, void* stream);
// next = ef21Advance(h, transmitted): the estimate the step commits.
void ef21StageNext(const float* h, const float* transmitted, float* next, std::size_t n, void* stream);
// The step's commit, unless `own` or any of the `count` words at `gates` (the step's decode verdicts) is raised:
// h = next, v = v_t and *primed = 1 where v is given, out = ef21Advance(sum, out) and sum = out.
void ef21Commit(float* out, float* sum, const float* next, float* h, const float* v_t, float* v, uint32_t* primed,
                std::size_t n, void* stream, const uint32_t* gates, std::size_t count, const uint32_t* own);

// data[i] /= world for f32 / f64, and through f32 with round-to-nearest for f16 / bf16 (the host's arithmetic).
// Throws Unsupported for another dtype.
void divide(void* data, std::size_t n, DType dtype, int world, void* stream);

// One copy of a batch: `bytes` bytes from src to dst, device memory of one device.
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};
// Segments one launch of copySegments carries by value (its kernel parameter, about 1.5 KiB).
inline constexpr std::size_t kCopySegmentsPerLaunch = 64;
// Copies every segment, one launch per kCopySegmentsPerLaunch of them, each segment by one block in the widest unit its
// addresses and length allow (16, 4, 2 or 1 bytes). The segments must not overlap. For many small copies (the engine's
// concatenation of a DDP bucket's small tensors: engine.cc, copyBodies), where a cudaMemcpyAsync each would cost more
// in API calls than in bytes; a large copy is better left to cudaMemcpyAsync.
void copySegments(std::span<const CopySegment> segments, void* stream);

// dst[i] = src[i] for n 32-bit words, from device memory into memory the device can store to (the engine's deferred
// verdicts, engine.cc: from their device words into mapped host memory, so that reading them is a kernel's stores and
// a synchronization, with no device-to-host copy queued).
void copyWords(const uint32_t* src, uint32_t* dst, std::size_t n, void* stream);

}  // namespace terse::device_kernels

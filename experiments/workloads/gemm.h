// The kernels behind the host workloads' matrix product (nn_ops.h's gemm, which every CPU model calls for every matrix
// product it computes), chosen once per process by an environment variable:
//
//   TERSE_GEMM=fixed     terse's own kernel (the default, also when the variable is unset or empty): one summation
//                        order, defined below, so a run's numbers are the same bits on every x86-64 CPU
//   TERSE_GEMM=openblas  OpenBLAS's cblas_sgemm: faster, but Debian's OpenBLAS is built with DYNAMIC_ARCH and picks
//                        its kernel, and with it the order of the sums, from the CPU (or OPENBLAS_CORETYPE), so two
//                        CPUs give accuracies that differ in the third or fourth digit (issue 44: 0.8907 on a Xeon,
//                        0.8879 on a Zen 5, for the same commit, config and wire bytes)
//
// An unknown value throws InvalidArgument naming the variable, the value and the accepted ones (makeWorkload asks
// first, so the error comes before any training). provenance.json records the kernel (gemmDescription) and
// `terse compare` warns when one study mixes kernels.
//
// The fixed order ("terse-fixed-order-v1"; a kernel that changes it must change the name). For C[m x n] =
// alpha op(A) op(B) + beta C, every element is
//
//   s = +0.0f
//   for p = 0, 1, ..., k-1 (increasing, one p at a time):  s = s + op(A)[i][p] * op(B)[p][j]
//   C[i][j] = alpha * s                       when beta == 0 (C is not read, as in BLAS: it may hold NaN)
//   C[i][j] = (alpha * s) + (beta * C[i][j])  otherwise
//
// in IEEE single precision, every product and sum rounded to nearest-even on its own (never fused: terse builds with
// -ffp-contract=off). alpha * s is always computed, also for alpha == 1 (where it is exact) and alpha == 0 (where BLAS
// would skip A and B: an infinity or NaN there gives NaN here). Each element has its own accumulator, so how the
// kernel tiles C, how wide its vectors are and how it copies A and B never change a bit (of a NaN, x86 keeps one
// operand's payload, so which one may differ: NaN is NaN); it never splits the k loop into partial sums. The kernel is
// compiled for x86-64-v4 (AVX-512), v3 (AVX2) and baseline x86-64 (SSE2) through sdk::cpu::clones and runs the widest
// TERSE_CPU_ISA allows, with the same result at each. Single-threaded: the runner trains one model per worker thread
// (WorkloadOptions::blas_threads is OpenBLAS's alone).
#pragma once

#include <cstdint>
#include <string>

namespace terse::workloads {

enum class GemmKernel { kFixed, kOpenBlas };

inline constexpr const char* kGemmVariable = "TERSE_GEMM";
inline constexpr const char* kGemmAccepted = "fixed, openblas";
inline constexpr const char* kFixedOrderName = "terse-fixed-order-v1";

// TERSE_GEMM's value as a kernel (read once per process); throws InvalidArgument for an unknown value.
GemmKernel gemmKernel();
// A value of TERSE_GEMM as a kernel: nullptr, "" and "fixed" are kFixed, "openblas" kOpenBlas; anything else throws
// InvalidArgument naming kGemmVariable, the value and kGemmAccepted.
GemmKernel parseGemmKernel(const char* value);

// What provenance.json's "gemm" says for the process's kernel: kFixedOrderName, or "openblas <core> (<config>)" from
// openblas_get_corename() and openblas_get_config() (the core is what decides the summation order).
std::string gemmDescription();
// The OpenBLAS part of that, whichever kernel the process uses: "openblas <core> (<config>)".
std::string openBlasDescription();

// The two kernels, with nn_ops.h's gemm's contract (row-major, densely packed; op(A) m x k, op(B) k x n). gemm()
// calls the one gemmKernel() names; these are for tests and benchmarks that compare them.
void gemmFixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
               float beta, float* c);
void gemmOpenBlas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  const float* b, float beta, float* c);

// The fixed kernel's build for one x86-64 level, whatever TERSE_CPU_ISA says: 4 (x86-64-v4), 3 (x86-64-v3) or 0
// (baseline). For the tests that check the levels agree bit for bit; the caller makes sure the CPU has the level
// (sdk::cpu::hostHas). Throws InvalidArgument for another level, or for 3 and 4 where the build has only the baseline
// (sdk::cpu's TERSE_CPU_CLONE_LEVELS: GCC on x86-64 Linux).
void gemmFixedAtLevel(int level, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, const float* b, float beta, float* c);
// Whether this build has the x86-64-v3 and v4 clones (gemmFixedAtLevel accepts 3 and 4).
bool gemmHasCloneLevels();

}  // namespace terse::workloads

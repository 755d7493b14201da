// The per-element math of PowerSGD, shared by the CPU plugin and the later CUDA kernels (DESIGN.md section 5): each
// function computes one entry of a factor or of the product, which is what one GPU thread computes; the CPU plugin
// calls them in plain loops. Products accumulate in double: r is small, so the cost is the memory traffic anyway.
//
// Layouts (all dense, no padding): the gradient M is n x m row-major (M[i*m + j], the tensor as it is); the factors
// are column-major, column c contiguous: P (n x r) at P[c*n + i], Q (m x r) at Q[c*m + j]. Column-major keeps each
// column of P contiguous for Gram-Schmidt and each column of Q contiguous for the row updates of Q = M^T P.
#pragma once

#include <cmath>
#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/bytes.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::powersgd {

// ---- The per-tensor memory, shared by the CPU plugin and the CUDA kernels (which read and write it on the device).

inline constexpr uint32_t kStateMagic = sdk::fourcc("PSGQ");  // the state's "initialised" mark (zero-filled at first)
inline constexpr uint32_t kWorkspaceMagic = sdk::fourcc("PSGW");  // the workspace tag's

// 64 bytes at the front of the state, then Q (m x r f32, column-major).
struct StateHeader {
  uint32_t magic;
  uint32_t rank;
  uint64_t rows;
  uint64_t cols;
  uint64_t reserved[5];
};
static_assert(sizeof(StateHeader) == 64);

// What a state header says about the tensor (n x m at rank r) about to use it.
enum class StateKind : uint32_t {
  kFresh = 0,     // zero-filled: Q is drawn
  kReady = 1,     // Q of this tensor from an earlier step
  kMismatch = 2,  // Q of another shape or rank
  kForeign = 3,   // neither zero nor PowerSGD's
};

TERSE_HD StateKind stateKind(const StateHeader& h, uint64_t n, uint64_t m, uint64_t r) {
  if (h.magic == kStateMagic) {
    return h.rank == r && h.rows == n && h.cols == m ? StateKind::kReady : StateKind::kMismatch;
  }
  return h.magic == 0 ? StateKind::kFresh : StateKind::kForeign;
}

// 64 bytes at the front of the workspace, then the factors (powersgd.cc's layout). `stage` says which compress of step
// `step` wrote it last: 1 after round 0, 2 after round 1 (P^ valid); on a device, kStageBadState after a round 0 that
// found a state it cannot use (reported by round 1, see powersgd.cc).
struct WorkspaceTag {
  uint32_t magic;
  uint32_t stage;
  uint64_t step;
  uint64_t rows;
  uint64_t cols;
  uint64_t rank;
  uint64_t reserved[3];
};
static_assert(sizeof(WorkspaceTag) == 64);

inline constexpr uint32_t kStageBadState = 0xBAD;

TERSE_HD WorkspaceTag makeTag(uint32_t stage, uint64_t step, uint64_t n, uint64_t m, uint64_t r) {
  return WorkspaceTag{kWorkspaceMagic, stage, step, n, m, r, {0, 0, 0}};
}

// The fields a tag is checked by (not the reserved words).
TERSE_HD bool sameTag(const WorkspaceTag& a, const WorkspaceTag& b) {
  return a.magic == b.magic && a.stage == b.stage && a.step == b.step && a.rows == b.rows && a.cols == b.cols &&
         a.rank == b.rank;
}

// ORTHOGONALIZE's collapse threshold (powersgd.cc): a column whose norm after projection is not above this fraction
// of its norm before is replaced by a standard basis vector.
inline constexpr double kCollapse = 1e-6;

// ---- Per-element math.

// Whether a tensor is compressed at rank r: a matrix (ndim >= 2; rows n = shape[0], cols m = numel / n) whose factors
// are smaller than it (r (n + m) < n m; otherwise the "compression" sends more than the matrix), and at least
// min_numel elements. Everything else passes through uncompressed.
TERSE_HD bool compresses(int32_t ndim, uint64_t n, uint64_t m, uint64_t r, uint64_t min_numel) {
  if (ndim < 2 || n == 0 || m == 0) return false;
  const double nm = static_cast<double>(n) * static_cast<double>(m);
  if (nm < static_cast<double>(min_numel)) return false;
  return static_cast<double>(r) * (static_cast<double>(n) + static_cast<double>(m)) < nm;
}

// A standard normal for entry e of the initial Q: Box-Muller on stream elements 2e and 2e + 1 (1 - u lies in (0, 1],
// so the log is finite).
TERSE_HD double philoxNormal(const sdk::PhiloxStream& stream, uint64_t e) {
  const double u1 = 1.0 - static_cast<double>(stream.uniform(2 * e));
  const double u2 = static_cast<double>(stream.uniform(2 * e + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// P[c*n + i] = sum_j M[i, j] Q[j, c]: row i of M against column c of Q.
TERSE_HD double pEntry(const float* M, uint64_t m, const float* Q, uint64_t i, uint64_t c) {
  const float* row = M + i * m;
  const float* col = Q + c * m;
  double s = 0;
  for (uint64_t j = 0; j < m; ++j) s += static_cast<double>(row[j]) * static_cast<double>(col[j]);
  return s;
}

// The update of column c of Q = M^T P by row i of M (Q[c*m + j] += M[i, j] P[c*n + i] for every j): the CPU walks M
// row by row this way, contiguously; a kernel computes an entry as a column dot instead.
TERSE_HD void qRowUpdate(double* Qc, const float* row, uint64_t m, double p_ic) {
  for (uint64_t j = 0; j < m; ++j) Qc[j] += static_cast<double>(row[j]) * p_ic;
}

// (P Q^T)[i, j] = sum_c P[c*n + i] Q[c*m + j]: one entry of the decoded matrix.
TERSE_HD double productEntry(const double* P, uint64_t n, const float* Q, uint64_t m, uint64_t r, uint64_t i,
                             uint64_t j) {
  double s = 0;
  for (uint64_t c = 0; c < r; ++c) s += P[c * n + i] * static_cast<double>(Q[c * m + j]);
  return s;
}

}  // namespace terse::compressors::powersgd

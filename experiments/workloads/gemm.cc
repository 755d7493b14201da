#include "experiments/workloads/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string_view>

#include "core/common/error.h"
#include "terse/sdk/cpu.hpp"

namespace terse::workloads {
namespace {

// ---- The fixed-order kernel (gemm.h defines the order).
//
// The kernel computes D = X Y, where D is C or, when that needs less copying, C's transpose (D = C^T = op(B)^T op(A)^T:
// the same products and the same k order for every element, a*b being b*a). D is cut into tiles of MR rows by up to
// NR = NV * L columns (L floats a vector); a tile's MR x NV vector accumulators stay in registers while p runs from 0
// to k-1, each step one multiply and one add per accumulator: acc = acc + X[r][p] * Y[p][j .. j+L), which for every
// lane is the definition's step. X is read in place (a broadcast per row and step, along its rows or its columns); Y
// must have each row's columns contiguous: read in place when it is stored so (op(B) = B, op(A)^T = A stored k x m),
// otherwise transposed once into a k x N buffer. Of C and C^T the kernel takes the one whose Y needs no copy (NN, TN:
// C; TT: C^T), and for NT, where both would, the smaller copy (min(m, n) x k: in the workloads' forward passes the
// batch's activations rather than the weights). k is never cut: a cut would be a partial sum, another order. Rows of X
// go in blocks of about 256 KiB (MC rows), which stay in L2 while each Y strip of k x NR floats passes their tiles.
//
// Per level, the tile fills the vector registers without spilling: x86-64-v4 has 32 of 512 bits (8 x 2 accumulators
// of 16 floats, 2 of Y, 1 broadcast), v3 and the SSE2 baseline 16 (6 x 2 accumulators of 8 or 4 floats). GCC's
// vector extensions say "this many floats, element-wise", so one source compiles to each width, and every lane
// computes its element exactly as the scalar definition does.

typedef float Vec4 __attribute__((vector_size(16)));
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec16 __attribute__((vector_size(64)));

struct TilesV4 {
  using V = Vec16;
  static constexpr int kLanes = 16, kRows = 8, kVecs = 2;
};
struct TilesV3 {
  using V = Vec8;
  static constexpr int kLanes = 8, kRows = 6, kVecs = 2;
};
struct TilesBase {
  using V = Vec4;
  static constexpr int kLanes = 4, kRows = 6, kVecs = 2;
};

// Floats of X in one block of rows (256 KiB).
constexpr int64_t kBlockFloats = int64_t{1} << 16;

// D[M x N] = alpha X[M x k] Y[k x N] + beta D, with strides.
struct Problem {
  int64_t rows = 0, cols = 0, k = 0;  // M, N, k
  float alpha = 1, beta = 0;
  const float* x = nullptr;  // X[r][p] at x[r * x_rs + p * x_ps]
  int64_t x_rs = 0, x_ps = 0;
  const float* y = nullptr;  // Y[p][j] at y[p * y_ps + j]
  int64_t y_ps = 0;
  float* d = nullptr;  // D[r][j] at d[r * d_rs + j * d_cs]
  int64_t d_rs = 0, d_cs = 0;
  int level = 0;               // which Tiles: 4, 3 or 0
  int64_t block_rows = 0;      // MC, a multiple of the tile's MR
  float* tail_pack = nullptr;  // k x NR floats: a strip of Y that is not whole vectors, zero-padded
};

template <class T>
constexpr int64_t tileCols() {
  return int64_t{T::kLanes} * T::kVecs;
}

// One tile: R rows of D from x, NV vectors of columns from y, of which `cols` are D's (the strip's other lanes are
// computed and dropped). X's element [r][p] is at x[r * x_rs + p * x_ps], one pointer per row and a running offset.
template <class T, int R, int NV>
inline void tile(const Problem& pr, const float* __restrict x, const float* __restrict y, int64_t y_ps,
                 float* __restrict d, int64_t cols) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const int64_t k = pr.k, x_ps = pr.x_ps;
  V acc[R][NV];
  const float* xr[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    xr[r] = x + r * pr.x_rs;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  }
  for (int64_t p = 0, q = 0; p < k; ++p, q += x_ps) {
    V yv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) std::memcpy(&yv[v], y + p * y_ps + v * L, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float a = xr[r][q];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = acc[r][v] + a * yv[v];  // the product rounded, then the sum
    }
  }
  // D = alpha s (+ beta D), lane by lane: whole vectors of a row-major D at once, the rest (a strip's last columns,
  // every element of a transposed D) one by one through memory, with the same two products and sum.
  const float alpha = pr.alpha, beta = pr.beta;
  const int64_t d_rs = pr.d_rs, d_cs = pr.d_cs;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const int64_t j0 = int64_t{v} * L;
      if (d_cs == 1 && j0 + L <= cols) {
        float* dst = d + r * d_rs + j0;
        V out = alpha * acc[r][v];
        if (beta != 0.0f) {
          V old;
          std::memcpy(&old, dst, sizeof(V));
          out = out + beta * old;
        }
        std::memcpy(dst, &out, sizeof(V));
      } else {
        float s[L];
        std::memcpy(s, &acc[r][v], sizeof(V));
        const int64_t j1 = std::min<int64_t>(cols, j0 + L);
        for (int64_t j = j0; j < j1; ++j) {
          float* dst = d + r * d_rs + j * d_cs;
          const float scaled = alpha * s[j - j0];
          *dst = beta != 0.0f ? scaled + beta * *dst : scaled;
        }
      }
    }
  }
}

// Tiles of MR, 4, 2 and 1 rows (a panel's last rows take the widest that fit, then the next) and of NV or one vector:
// few enough shapes that the three clones of three levels stay quick to compile. Direct calls all the way down (no
// table of pointers), so sdk::cpu::clones' flatten wrappers inline every tile into the clone of their level.
template <class T, int R>
inline void tileRows(int nv, const Problem& pr, const float* x, const float* y, int64_t y_ps, float* d, int64_t cols) {
  if (nv == T::kVecs) {
    tile<T, R, T::kVecs>(pr, x, y, y_ps, d, cols);
  } else {
    tile<T, R, 1>(pr, x, y, y_ps, d, cols);
  }
}

template <class T>
inline void tilesOfPanel(int64_t rows, int nv, const Problem& pr, const float* x, const float* y, int64_t y_ps,
                         float* d, int64_t cols) {
  static_assert(T::kVecs == 1 || T::kVecs == 2, "a strip is one or two vectors");
  if (rows == T::kRows) {
    tileRows<T, T::kRows>(nv, pr, x, y, y_ps, d, cols);
    return;
  }
  for (int64_t r = 0; r < rows;) {
    const float* xs = x + r * pr.x_rs;
    float* ds = d + r * pr.d_rs;
    if (rows - r >= 4) {
      tileRows<T, 4>(nv, pr, xs, y, y_ps, ds, cols);
      r += 4;
    } else if (rows - r >= 2) {
      tileRows<T, 2>(nv, pr, xs, y, y_ps, ds, cols);
      r += 2;
    } else {
      tileRows<T, 1>(nv, pr, xs, y, y_ps, ds, cols);
      r += 1;
    }
  }
}

template <class T>
inline void runTiles(const Problem& pr) {
  constexpr int64_t MR = T::kRows, NR = tileCols<T>(), L = T::kLanes;
  const int64_t M = pr.rows, N = pr.cols, k = pr.k;
  for (int64_t ic = 0; ic < M; ic += pr.block_rows) {
    const int64_t mc = std::min(pr.block_rows, M - ic);
    for (int64_t j0 = 0; j0 < N; j0 += NR) {
      const int64_t cols = std::min(NR, N - j0);
      const int64_t width = (cols + L - 1) / L * L;
      const float* y = pr.y + j0;
      int64_t y_ps = pr.y_ps;
      if (width != cols) {
        // Whole vectors would read past Y's rows (past the array, on the last row): the strip, zero-padded.
        for (int64_t p = 0; p < k; ++p) {
          float* row = pr.tail_pack + p * NR;
          for (int64_t j = 0; j < cols; ++j) row[j] = y[p * y_ps + j];
          for (int64_t j = cols; j < width; ++j) row[j] = 0.0f;
        }
        y = pr.tail_pack;
        y_ps = NR;
      }
      const int nv = static_cast<int>(width / L);
      for (int64_t i0 = ic; i0 < ic + mc; i0 += MR)
        tilesOfPanel<T>(std::min(MR, ic + mc - i0), nv, pr, pr.x + i0 * pr.x_rs, y, y_ps,
                        pr.d + i0 * pr.d_rs + j0 * pr.d_cs, cols);
    }
  }
}

// The body every clone compiles (sdk::cpu::clones: x86-64-v4, v3, baseline). Each clone holds all three tile shapes
// but runs the one its level names: a v4 tile compiled for the baseline would be correct (GCC splits its vectors) but
// slow, and the baseline tile in the v4 clone would leave half the registers unused.
void fixedBody(const Problem* pr) {
  switch (pr->level) {
    case 4:
      runTiles<TilesV4>(*pr);
      return;
    case 3:
      runTiles<TilesV3>(*pr);
      return;
    default:
      runTiles<TilesBase>(*pr);
      return;
  }
}

// The copy buffer, one per thread (workers compute concurrently), 64-byte aligned, kept between calls. A simulated
// run's actors may share a thread, but a call never yields, so no two calls use it at once.
struct Scratch {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buf;
  std::size_t capacity = 0;  // floats

  float* get(std::size_t floats) {
    if (floats > capacity) {
      const std::size_t bytes = (std::max<std::size_t>(floats, 1) * sizeof(float) + 63) / 64 * 64;
      buf.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!buf) throw std::bad_alloc();
      capacity = bytes / sizeof(float);
    }
    return buf.get();
  }
};

// dst[p * ld + j] = src[j * k + p] for j < n, p < k: a row-major n x k matrix transposed, in 16 x 16 blocks so both
// sides use whole cache lines.
void transposeInto(const float* __restrict src, int64_t n, int64_t k, float* __restrict dst, int64_t ld) {
  constexpr int64_t kB = 16;
  for (int64_t j0 = 0; j0 < n; j0 += kB) {
    const int64_t j1 = std::min(n, j0 + kB);
    for (int64_t p0 = 0; p0 < k; p0 += kB) {
      const int64_t p1 = std::min(k, p0 + kB);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t p = p0; p < p1; ++p) dst[p * ld + j] = src[j * k + p];
    }
  }
}

int64_t tileRowsAt(int level) {
  return level == 4 ? TilesV4::kRows : level == 3 ? TilesV3::kRows : TilesBase::kRows;
}
int64_t tileColsAt(int level) {
  return level == 4 ? tileCols<TilesV4>() : level == 3 ? tileCols<TilesV3>() : tileCols<TilesBase>();
}

// C = alpha op(A) op(B) + beta C as D = X Y for pr.level's tiles (see the kernel's comment): C or C^T, whichever needs
// the smaller copy, made here. False when nothing is left to compute (m, n or k is 0).
bool prepare(Problem& pr, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
             const float* b, float beta, float* c) {
  TERSE_CHECK(m >= 0 && n >= 0 && k >= 0, InvalidArgument,
              "gemm dimensions must be >= 0, got m " << m << ", n " << n << ", k " << k);
  if (m == 0 || n == 0) return false;
  if (k == 0) {  // every sum is the empty one, +0: nothing to read from A or B (which may be null)
    for (int64_t i = 0; i < m * n; ++i) {
      const float scaled = alpha * 0.0f;
      c[i] = beta != 0.0f ? scaled + beta * c[i] : scaled;
    }
    return false;
  }
  pr.k = k;
  pr.alpha = alpha;
  pr.beta = beta;
  pr.d = c;
  // The rows to transpose each way: D = C copies op(B) when trans_b (B is n x k), D = C^T op(A) when !trans_a (A is
  // m x k); ties go to C, whose tiles store whole vectors.
  const int64_t copy_c = trans_b ? n : 0, copy_ct = trans_a ? 0 : m;
  const bool transposed = copy_ct < copy_c;
  const int64_t copy_rows = transposed ? copy_ct : copy_c;
  const int64_t copy_ld = (copy_rows + 15) / 16 * 16;  // rows of the copy start on a cache line
  const int64_t nr = tileColsAt(pr.level), mr = tileRowsAt(pr.level);
  const auto copy_floats = static_cast<std::size_t>(copy_ld * k), tail_floats = static_cast<std::size_t>(nr * k);
  thread_local Scratch scratch;
  float* buf = scratch.get(copy_floats + tail_floats);
  pr.tail_pack = buf + copy_floats;
  if (!transposed) {  // D = C [m x n], X = op(A), Y = op(B)
    pr.rows = m;
    pr.cols = n;
    pr.x = a;
    pr.x_rs = trans_a ? 1 : k;
    pr.x_ps = trans_a ? m : 1;
    pr.d_rs = n;
    pr.d_cs = 1;
    pr.y = b;
    pr.y_ps = n;
    if (trans_b) {
      transposeInto(b, n, k, buf, copy_ld);
      pr.y = buf;
      pr.y_ps = copy_ld;
    }
  } else {  // D = C^T [n x m], X = op(B)^T, Y = op(A)^T
    pr.rows = n;
    pr.cols = m;
    pr.x = b;
    pr.x_rs = trans_b ? k : 1;
    pr.x_ps = trans_b ? 1 : n;
    pr.d_rs = 1;
    pr.d_cs = n;
    pr.y = a;
    pr.y_ps = m;
    if (!trans_a) {
      transposeInto(a, m, k, buf, copy_ld);
      pr.y = buf;
      pr.y_ps = copy_ld;
    }
  }
  pr.block_rows = std::max<int64_t>(1, kBlockFloats / (std::max<int64_t>(k, 1) * mr)) * mr;
  return true;
}

int blasInt(int64_t v) {
  TERSE_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), InvalidArgument,
              "matrix dimension " << v << " does not fit BLAS's int");
  return static_cast<int>(v);
}

}  // namespace

GemmKernel parseGemmKernel(const char* value) {
  if (value == nullptr) return GemmKernel::kFixed;
  const std::string_view v(value);
  if (v.empty() || v == "fixed") return GemmKernel::kFixed;
  if (v == "openblas") return GemmKernel::kOpenBlas;
  TERSE_THROW(InvalidArgument, kGemmVariable << "='" << v << "' is not a GEMM kernel; accepted: " << kGemmAccepted);
}

GemmKernel gemmKernel() {
  // A bad value throws on every call (a throwing static initializer runs again next time), so no product is ever
  // computed by a kernel nobody asked for.
  static const GemmKernel kernel = parseGemmKernel(std::getenv(kGemmVariable));
  return kernel;
}

std::string gemmDescription() {
  return gemmKernel() == GemmKernel::kFixed ? std::string(kFixedOrderName) : openBlasDescription();
}

std::string openBlasDescription() {
  std::string config = openblas_get_config();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  return std::string("openblas ") + openblas_get_corename() + " (" + config + ")";
}

void gemmFixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
               float beta, float* c) {
  Problem pr;
  pr.level = sdk::cpu::cloneLevel();  // the level clones<> picks below: both ask sdk::cpu::has
  if (!prepare(pr, trans_a, trans_b, m, n, k, alpha, a, b, beta, c)) return;
  const Problem* p = &pr;
  sdk::cpu::clones<fixedBody>(p);
}

void gemmFixedAtLevel(int level, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, const float* b, float beta, float* c) {
  TERSE_CHECK(level == 0 || ((level == 3 || level == 4) && gemmHasCloneLevels()), InvalidArgument,
              "gemm: no x86-64 level " << level << " in this build");
  Problem pr;
  pr.level = level;
  if (!prepare(pr, trans_a, trans_b, m, n, k, alpha, a, b, beta, c)) return;
  const Problem* p = &pr;
#if TERSE_CPU_CLONE_LEVELS
  if (level == 4) return sdk::cpu::detail::cloneV4<fixedBody>(p);
  if (level == 3) return sdk::cpu::detail::cloneV3<fixedBody>(p);
#endif
  sdk::cpu::detail::cloneBase<fixedBody>(p);
}

bool gemmHasCloneLevels() {
  return TERSE_CPU_CLONE_LEVELS != 0;
}

void gemmOpenBlas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  const float* b, float beta, float* c) {
  // BLAS wants leading dimensions >= 1 even for an empty matrix (it reports and skips the call otherwise).
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blasInt(m),
              blasInt(n), blasInt(k), alpha, a, blasInt(std::max<int64_t>(1, trans_a ? m : k)), b,
              blasInt(std::max<int64_t>(1, trans_b ? k : n)), beta, c, blasInt(std::max<int64_t>(1, n)));
}

}  // namespace terse::workloads

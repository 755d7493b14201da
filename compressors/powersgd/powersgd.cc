// powersgd: rank-r gradient compression by one step of subspace (power) iteration with warm start.
//
// Paper: Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
// Optimization", NeurIPS 2019, Algorithm 1. For the gradient as an n x m matrix M_w on worker w (rows n = shape[0],
// cols m = numel / n) and Q (m x r) kept from the previous step:
//     P_w = M_w Q                      round 0: payload P_w; the core sums:       P = sum_w P_w
//     P^ = ORTHOGONALIZE(P)            round 1: every rank computes the same P^ from the same P
//     Q_w = M_w^T P^                   round 1: payload Q_w; the core sums:       Q' = sum_w Q_w
//     decompress(aggregate) = P^ Q'^T  = sum_w P^ P^^T M_w  (the core divides by world_size);  Q <- Q' (warm start)
// Error feedback (Algorithm 2's memory e) is the core's decorator: it decodes this rank's own round-1 payload, which
// gives P^ Q_w^T, this rank's contribution (the sum over ranks of those is the aggregate's decode).
//
// Warm start: Q is kept in the state across steps (TERSE_CAP_STATEFUL), as in Algorithm 1 ("Q <- Q' ... reuse"). It
// is stored as the summed Q' without rescaling, as the reference implementation (epfml/powersgd) keeps its Q buffer:
// P^ = ORTHOGONALIZE(M Q) does not depend on the scale of Q's columns, and Q' is M^T P^ with P^ orthonormal, so its
// scale is that of the gradients and cannot drift from step to step. The state starts zero-filled; the first compress
// sees no "initialised" mark and draws Q from standard normals keyed by Philox(seed, step, tensor_id): the seed is
// shared (TERSE_CAP_SHARED_SEED), so every rank draws the same Q, and every later Q is the same sum Q' on every rank.
// A column of Q that is exactly zero (a zero gradient sums to Q' = 0) is redrawn the same way at the next round 0,
// so the iteration never gets stuck in a smaller subspace.
//
// ORTHOGONALIZE: Gram-Schmidt in double with a second re-orthogonalization sweep ("twice is enough", Giraud et al.
// 2005), column by column. A column whose norm collapses below 1e-6 of its norm before projection (zero, or
// dependent on the earlier columns to within f32 noise) is replaced by the standard basis vector e_t with the largest
// component outside the span so far (lowest t on ties), orthogonalized the same way: deterministic on every rank, and
// P^ always has r orthonormal columns. P^ stays in the workspace (doubles) from round 1's compress to the step's
// last decompress.
//
// Payloads, SUM over f32 (sum_header_bytes = 16, the header identical on every rank), fixed size, 2 rounds:
//   compressed   round 0: header "PSG0" | f32 P[n*r]  column-major (column c at c*n)   16 + 4 n r bytes
//                round 1: header "PSG1" | f32 Q[m*r]  column-major (column c at c*m)   16 + 4 m r bytes
//   passthrough  round 0: header "PSP0" (no body)                                         16 bytes
//                round 1: header "PSP1" | f32 g[numel] (the raw gradient, summed)          16 + 4 numel bytes
// A tensor passes through when it is not a matrix (ndim < 2), is empty, has fewer than min_compression_numel elements,
// or would not shrink (r (n + m) >= n m): the raw values go in the LAST round, so that decoding one rank's own last
// payload gives its own gradient (error feedback then keeps a zero residual) without keeping anything in the
// workspace; round 0 sends just the header. Which tensors pass through depends only on shape and parameters, so all
// ranks agree, and the distinct magics catch a disagreement anyway. Factors on the wire must be finite (decompress and
// round 1 check it: a non-finite Q' would poison the warm start for good); a non-finite gradient fails compress with
// InvalidArgument. Passthrough values are not checked, as with any dense f32 sum.
//
// Parameters: rank >= 1 (default 4, at most 1024), min_compression_numel >= 0 (default 0: only the shape rule).
// Workspace (compressed): 64 B tag + 8 n r (P^) + 8 m r (Q accumulator); state: 64 B + 4 m r (Q). f32 gradients in
// host memory. All matrix math is plain loops over powersgd_math.h; no BLAS.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "compressors/powersgd/powersgd_math.h"
#include "terse/sdk.hpp"
#include "terse/sdk/philox.hpp"

namespace {

namespace sdk = terse::sdk;
namespace ps = terse::compressors::powersgd;

constexpr const char* kName = "powersgd";
constexpr sdk::PayloadFormat kRoundP{kName, sdk::fourcc("PSG0"), 1};
constexpr sdk::PayloadFormat kRoundQ{kName, sdk::fourcc("PSG1"), 1};
constexpr sdk::PayloadFormat kPassRound0{kName, sdk::fourcc("PSP0"), 1};
constexpr sdk::PayloadFormat kPassRound1{kName, sdk::fourcc("PSP1"), 1};

constexpr uint32_t kStateMagic = sdk::fourcc("PSGQ");      // the state's "initialised" mark (zero-filled at first)
constexpr uint32_t kWorkspaceMagic = sdk::fourcc("PSGW");  // the workspace tag's
constexpr double kCollapse = 1e-6;

// 64 bytes at the front of the state, then Q (m x r f32, column-major).
struct StateHeader {
  uint32_t magic;
  uint32_t rank;
  uint64_t rows;
  uint64_t cols;
  uint64_t reserved[5];
};
static_assert(sizeof(StateHeader) == 64);

// 64 bytes at the front of the workspace, then P^ (n x r double) and the Q accumulator (m x r double). `stage` says
// which compress of step `step` wrote it last: 1 after round 0, 2 after round 1 (P^ valid).
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

// The matrix view of a tensor and whether it is compressed.
struct Shape {
  uint64_t n = 0, m = 0, r = 0;
  bool compressed = false;
};

class PowerSgd final : public sdk::Compressor {
 public:
  PowerSgd(sdk::Params& params, sdk::Host& /*host*/)
      : rank_(static_cast<uint64_t>(params.getInt("rank", 4, sdk::Range::closed(1, 1024)))),
        min_numel_(params.getUint("min_compression_numel", 0)) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_SUM;
    caps.wire_dtype = TERSE_DTYPE_F32;
    caps.flags = TERSE_CAP_FIXED_SIZE | TERSE_CAP_STATEFUL | TERSE_CAP_SHARED_SEED;
    caps.num_rounds = 2;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    const int round = roundOf(info);
    const Shape s = shapeOf(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;
    if (s.compressed) {
      sizes.max_output_bytes = sdk::kPayloadHeaderBytes + sizeof(float) * (round == 0 ? s.n : s.m) * s.r;
      sizes.workspace_bytes = sizeof(WorkspaceTag) + sizeof(double) * (s.n + s.m) * s.r;
      sizes.state_bytes = sizeof(StateHeader) + sizeof(float) * s.m * s.r;
    } else {
      sizes.max_output_bytes = sdk::kPayloadHeaderBytes + (round == 0 ? 0 : sizeof(float) * info.numel);
    }
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
    const int round = roundOf(args.info);
    const Shape s = shapeOf(args.info);
    const std::span<const float> g = args.input<float>();
    sdk::ByteWriter w(args.output);
    if (!s.compressed) {
      if (round == 0) {
        sdk::writeHeader(w, kPassRound0, args.info);
      } else {
        readPrev(args, kPassRound0, 0);
        sdk::writeHeader(w, kPassRound1, args.info);
        const std::span<float> out = w.putArray<float>(g.size());
        std::copy(g.begin(), g.end(), out.begin());
      }
      return w.offset();
    }

    Scratch sc = scratchOf(args.workspace, args.state, s);
    if (round == 0) {
      float* Q = prepareQ(sc, s, args.info);
      sdk::writeHeader(w, kRoundP, args.info);
      const std::span<float> P = w.putArray<float>(static_cast<size_t>(s.n * s.r));
      for (uint64_t c = 0; c < s.r; ++c) {
        for (uint64_t i = 0; i < s.n; ++i) P[c * s.n + i] = static_cast<float>(ps::pEntry(g.data(), s.m, Q, i, c));
      }
      requireFiniteInput(P);
      setTag(sc, args.info.step, 1, s);
    } else {
      const std::span<const float> P = readPrev(args, kRoundP, s.n * s.r);
      orthogonalize(P, sc.phat, s.n, s.r);
      std::fill(sc.qacc, sc.qacc + s.m * s.r, 0.0);
      for (uint64_t i = 0; i < s.n; ++i) {
        const float* row = g.data() + i * s.m;
        for (uint64_t c = 0; c < s.r; ++c) ps::qRowUpdate(sc.qacc + c * s.m, row, s.m, sc.phat[c * s.n + i]);
      }
      sdk::writeHeader(w, kRoundQ, args.info);
      const std::span<float> Q = w.putArray<float>(static_cast<size_t>(s.m * s.r));
      for (size_t e = 0; e < Q.size(); ++e) Q[e] = static_cast<float>(sc.qacc[e]);
      requireFiniteInput(Q);
      setTag(sc, args.info.step, 2, s);
    }
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
    if (args.info.round != 1) {
      throw sdk::InvalidArgument("decompress is for the last round (1), got round " + std::to_string(args.info.round));
    }
    const Shape s = shapeOf(args.info);
    const std::span<float> out = args.output<float>();
    sdk::ByteReader r(args.payload);
    if (!s.compressed) {
      sdk::readHeader(r, kPassRound1, args.info);
      const std::span<const float> v = r.getArray<float>(static_cast<size_t>(args.info.numel), "values");
      r.expectEnd();
      for (size_t i = 0; i < out.size(); ++i) out[i] = args.accumulate ? out[i] + v[i] : v[i];
      return;
    }
    sdk::readHeader(r, kRoundQ, args.info);
    const std::span<const float> Q = r.getArray<float>(static_cast<size_t>(s.m * s.r), "Q");
    r.expectEnd();
    requireFinitePayload(Q, "Q");
    // Only reads the workspace (P^), as the ABI requires; writes the state only for the aggregate, below.
    const Scratch sc = scratchOf(args.workspace, args.state, s);
    expectTag(sc, args.info.step, 2, s, "decompress");
    for (uint64_t i = 0; i < s.n; ++i) {
      float* row = out.data() + i * s.m;
      for (uint64_t j = 0; j < s.m; ++j) {
        const auto v = static_cast<float>(ps::productEntry(sc.phat, s.n, Q.data(), s.m, s.r, i, j));
        row[j] = args.accumulate ? row[j] + v : v;
      }
    }
    if (args.info.source_rank == -1) {  // the aggregate Q' becomes next step's Q (warm start)
      std::memcpy(sc.q, Q.data(), Q.size_bytes());
    }
  }

 private:
  // The typed views of one tensor's workspace and state.
  struct Scratch {
    WorkspaceTag* tag;
    double* phat;  // n x r, column-major
    double* qacc;  // m x r, column-major
    StateHeader* state;
    float* q;  // m x r, column-major
  };

  static Scratch scratchOf(std::span<std::byte> workspace, std::span<std::byte> state, const Shape& s) {
    const uint64_t ws_need = sizeof(WorkspaceTag) + sizeof(double) * (s.n + s.m) * s.r;
    const uint64_t st_need = sizeof(StateHeader) + sizeof(float) * s.m * s.r;
    if (workspace.size() < ws_need || state.size() < st_need) {
      throw sdk::InvalidArgument("workspace/state of " + std::to_string(workspace.size()) + "/" +
                                 std::to_string(state.size()) + " bytes, sizes() asked for " + std::to_string(ws_need) +
                                 "/" + std::to_string(st_need));
    }
    std::byte* ws = workspace.data();
    std::byte* st = state.data();
    return Scratch{reinterpret_cast<WorkspaceTag*>(ws), reinterpret_cast<double*>(ws + sizeof(WorkspaceTag)),
                   reinterpret_cast<double*>(ws + sizeof(WorkspaceTag)) + s.n * s.r, reinterpret_cast<StateHeader*>(st),
                   reinterpret_cast<float*>(st + sizeof(StateHeader))};
  }

  // Q for this step's round 0: initialised on first use, zero columns redrawn (see the file comment).
  static float* prepareQ(const Scratch& sc, const Shape& s, const terse_tensor_info_v1& info) {
    StateHeader& h = *sc.state;
    if (h.magic == kStateMagic) {
      if (h.rank != s.r || h.rows != s.n || h.cols != s.m) {
        throw sdk::InvalidArgument("state holds Q for a " + std::to_string(h.rows) + " x " + std::to_string(h.cols) +
                                   " matrix at rank " + std::to_string(h.rank) + ", this tensor is " +
                                   std::to_string(s.n) + " x " + std::to_string(s.m) + " at rank " +
                                   std::to_string(s.r));
      }
    } else if (h.magic != 0) {
      throw sdk::InvalidArgument("state was not zero-filled and is not PowerSGD's (the core must zero it once)");
    }
    const bool fresh = h.magic != kStateMagic;
    const sdk::PhiloxStream stream(info.seed, info.step, info.tensor_id);
    for (uint64_t c = 0; c < s.r; ++c) {
      float* col = sc.q + c * s.m;
      bool zero = true;
      for (uint64_t j = 0; j < s.m; ++j) zero = zero && col[j] == 0.0f;
      if (!fresh && !zero) continue;
      for (uint64_t j = 0; j < s.m; ++j) col[j] = static_cast<float>(ps::philoxNormal(stream, c * s.m + j));
    }
    h = StateHeader{kStateMagic, static_cast<uint32_t>(s.r), s.n, s.m, {0, 0, 0, 0, 0}};
    return sc.q;
  }

  // Gram-Schmidt of the r columns of P (n x r, f32) into phat (double), with the degenerate-column rule of the file
  // comment.
  static void orthogonalize(std::span<const float> P, double* phat, uint64_t n, uint64_t r) {
    for (uint64_t c = 0; c < r; ++c) {
      double* v = phat + c * n;
      for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<double>(P[c * n + i]);
      const double before = norm(v, n);
      project(phat, c, v, n);
      double after = norm(v, n);
      if (!(after > kCollapse * before) || after == 0.0) {
        // e_t with the largest component outside span(phat[0..c)): |e_t - proj|^2 = 1 - sum_q phat[q][t]^2.
        uint64_t best = 0;
        double best_rest = -1.0;
        for (uint64_t t = 0; t < n; ++t) {
          double in_span = 0;
          for (uint64_t q = 0; q < c; ++q) in_span += phat[q * n + t] * phat[q * n + t];
          if (1.0 - in_span > best_rest) {
            best_rest = 1.0 - in_span;
            best = t;
          }
        }
        std::fill(v, v + n, 0.0);
        v[best] = 1.0;
        project(phat, c, v, n);
        after = norm(v, n);
      }
      for (uint64_t i = 0; i < n; ++i) v[i] /= after;
    }
  }

  // v -= sum_q <phat_q, v> phat_q over the first c columns, twice.
  static void project(const double* phat, uint64_t c, double* v, uint64_t n) {
    for (int sweep = 0; sweep < 2; ++sweep) {
      for (uint64_t q = 0; q < c; ++q) {
        const double* u = phat + q * n;
        double d = 0;
        for (uint64_t i = 0; i < n; ++i) d += u[i] * v[i];
        for (uint64_t i = 0; i < n; ++i) v[i] -= d * u[i];
      }
    }
  }

  static double norm(const double* v, uint64_t n) {
    double s = 0;
    for (uint64_t i = 0; i < n; ++i) s += v[i] * v[i];
    return std::sqrt(s);
  }

  // prev of round 1: the summed round-0 payload, untrusted like any payload.
  static std::span<const float> readPrev(const sdk::CompressArgs& args, const sdk::PayloadFormat& format,
                                         uint64_t values) {
    if (args.prev.empty()) throw sdk::InvalidArgument("round 1 needs the aggregate of round 0 (prev is empty)");
    sdk::ByteReader r(args.prev);
    sdk::readHeader(r, format, args.info);
    const std::span<const float> v = r.getArray<float>(static_cast<size_t>(values), "P");
    r.expectEnd();
    requireFinitePayload(v, "P");
    return v;
  }

  static void requireFinitePayload(std::span<const float> v, const char* what) {
    bool finite = true;
    for (float x : v) finite = finite && std::isfinite(x);
    if (!finite) throw sdk::InvalidPayload(std::string(kName) + ": factor " + what + " holds a non-finite value");
  }

  static void requireFiniteInput(std::span<const float> v) {
    bool finite = true;
    for (float x : v) finite = finite && std::isfinite(x);
    if (!finite) throw sdk::InvalidArgument("the gradient holds a non-finite value (inf or NaN), or overflows f32");
  }

  static void setTag(const Scratch& sc, uint64_t step, uint32_t stage, const Shape& s) {
    *sc.tag = WorkspaceTag{kWorkspaceMagic, stage, step, s.n, s.m, s.r, {0, 0, 0}};
  }

  static void expectTag(const Scratch& sc, uint64_t step, uint32_t stage, const Shape& s, const char* who) {
    const WorkspaceTag& t = *sc.tag;
    if (t.magic != kWorkspaceMagic || t.stage != stage || t.step != step || t.rows != s.n || t.cols != s.m ||
        t.rank != s.r) {
      throw sdk::InvalidArgument(std::string(who) + " of step " + std::to_string(step) +
                                 " found no P^ from round 1 of that step in the workspace (the core must keep the "
                                 "workspace from round 0's compress to the step's last decompress)");
    }
  }

  Shape shapeOf(const terse_tensor_info_v1& info) const {
    Shape s;
    s.r = rank_;
    if (info.ndim >= 2 && info.shape[0] > 0) {
      s.n = static_cast<uint64_t>(info.shape[0]);
      s.m = info.numel / s.n;
      if (s.n * s.m != info.numel) {
        throw sdk::InvalidArgument("numel " + std::to_string(info.numel) +
                                   " is not a multiple of shape[0] = " + std::to_string(s.n));
      }
    }
    s.compressed = ps::compresses(info.ndim, s.n, s.m, s.r, min_numel_);
    return s;
  }

  static int roundOf(const terse_tensor_info_v1& info) {
    if (info.round != 0 && info.round != 1) {
      throw sdk::InvalidArgument("round must be 0 or 1, got " + std::to_string(info.round));
    }
    return info.round;
  }

  static void requireF32(terse_dtype_v1 dtype) {
    if (dtype != TERSE_DTYPE_F32) {
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
    }
  }

  static void check(const terse_tensor_info_v1& info) {
    requireF32(info.dtype);
    if (info.device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory is supported");
  }

  uint64_t rank_;
  uint64_t min_numel_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(PowerSgd, "powersgd",
                        "PowerSGD rank-r (rank, min_compression_numel) with warm start, 2 rounds summed as f32",
                        "1.0.0");

#include "core/plugin/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/common/error.h"
#include "core/compress/seed.h"
#include "core/plugin/conformance_memory.h"
#include "terse/sdk/half.hpp"

namespace terse {
namespace {

using Bytes = std::vector<std::byte>;
using Floats = std::vector<float>;
using conformance::ConformanceMemory;
using conformance::ConstRegion;
using conformance::GuardedRegion;
using conformance::Violation;

// ---- Check names, in run order.
constexpr std::string_view kInstantiate = "instantiate";
constexpr std::string_view kSizes = "sizes";
constexpr std::string_view kShapes = "shapes";
constexpr std::string_view kRoundTrip = "round_trip";
constexpr std::string_view kOutputSize = "output_size";
constexpr std::string_view kDeterministic = "deterministic";
constexpr std::string_view kSharedSeed = "shared_seed";
constexpr std::string_view kAccumulate = "accumulate";
constexpr std::string_view kPurity = "decompress_purity";
constexpr std::string_view kSumAggregation = "sum_aggregation";
constexpr std::string_view kCustomReduce = "custom_reduce";
constexpr std::string_view kAllgatherAggregation = "allgather_aggregation";
constexpr std::string_view kMultiRound = "multi_round";
constexpr std::string_view kUnbiased = "unbiased";
constexpr std::string_view kWrongLength = "wrong_length_payloads";
constexpr std::string_view kWrongHeader = "wrong_header_payloads";
constexpr std::string_view kByteFlips = "byte_flip_payloads";
constexpr std::string_view kRandomPayloads = "random_payloads";

// Shapes up to this size are used by the checks that compress many times or on several ranks; the larger defaults
// (2^20 + 3) run once per rank in `shapes`, `round_trip` and `output_size`, which is where their size matters.
constexpr uint64_t kModerateNumel = uint64_t{1} << 17;
// Bytes the suite offers compress and reduce beyond the bound the plugin declared; they lie in the trailing guard, so
// a plugin that writes there (past max_output_bytes, which the core sizes its wire buffers by) is caught.
constexpr std::size_t kOutputSlack = 64;
// Payloads up to this size get every byte flipped; larger ones a fixed sample of positions.
constexpr std::size_t kExhaustiveFlipBytes = 512;

static_assert(conformance::kGuardBytes >= kOutputSlack, "the slack offered must lie inside the trailing guard");

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream o;
  o << std::setprecision(3);
  (o << ... << parts);
  return o.str();
}

std::string plural(std::size_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

std::string statusText(terse_status_v1 s) {
  switch (s) {
    case TERSE_OK:
      return "ok";
    case TERSE_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case TERSE_ERR_INVALID_PAYLOAD:
      return "invalid payload";
    case TERSE_ERR_UNSUPPORTED:
      return "unsupported";
    case TERSE_ERR_OUT_OF_MEMORY:
      return "out of memory";
    case TERSE_ERR_DEVICE:
      return "device";
    case TERSE_ERR_INTERNAL:
      return "internal";
    default:
      return "status " + std::to_string(s);
  }
}

// ---- Memory the plugin writes into, fenced by guard zones, and the payloads it reads: conformance_memory.h, on the
// host or on a device. Every call below goes through one ConformanceMemory.

std::span<const std::byte> asBytes(const Floats& x) {
  return {reinterpret_cast<const std::byte*>(x.data()), x.size() * sizeof(float)};
}

// ---- Inputs.

uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return splitmix64(splitmix64(seed ^ splitmix64(a)) ^ b);
}

Floats normalInput(uint64_t numel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Floats x(numel);
  for (auto& v : x) v = normal(rng);
  return x;
}

// Inputs that stress size and range handling: the fixed-size promise must hold for all of them.
std::vector<std::pair<std::string, Floats>> varietyInputs(uint64_t numel, uint64_t seed) {
  std::vector<std::pair<std::string, Floats>> out;
  out.emplace_back("normal", normalInput(numel, seed));
  out.emplace_back("zeros", Floats(numel, 0.0f));
  out.emplace_back("ones", Floats(numel, 1.0f));
  Floats spike(numel, 0.0f);
  for (uint64_t i = 0; i < numel; i += 97) spike[i] = (i / 97) % 2 ? -1000.0f : 1000.0f;
  out.emplace_back("sparse spikes", std::move(spike));
  Floats wide = normalInput(numel, seed + 1);
  for (uint64_t i = 0; i < numel; ++i) wide[i] *= i % 3 == 0 ? 1e20f : (i % 3 == 1 ? 1e-20f : 1.0f);
  out.emplace_back("dynamic range 1e-20..1e20", std::move(wide));
  Floats tiny = normalInput(numel, seed + 2);
  for (auto& v : tiny) v *= 1e-30f;
  out.emplace_back("tiny (1e-30)", std::move(tiny));
  return out;
}

// ---- Vector arithmetic, in double.

double norm(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

double diffNorm(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

bool allFinite(std::span<const float> x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

// Index of the first element whose bits differ, or -1.
int64_t firstBitDifference(std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t firstByteDifference(std::span<const std::byte> a, std::span<const std::byte> b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

// ---- Wire sums, exactly as the SUM collective performs them (compressor_v1.h, TERSE_AGG_SUM): the payload bytes
// after sum_header_bytes are elements of the wire dtype; 16-bit elements are summed pairwise in f32 and rounded back.

void addWire(std::byte* acc, const std::byte* x, std::size_t bytes, DType wire) {
  if (wire == DType::kF32) {
    for (std::size_t i = 0; i + 4 <= bytes; i += 4) {
      float a, b;
      std::memcpy(&a, acc + i, 4);
      std::memcpy(&b, x + i, 4);
      a += b;
      std::memcpy(acc + i, &a, 4);
    }
    return;
  }
  for (std::size_t i = 0; i + 2 <= bytes; i += 2) {
    uint16_t a, b;
    std::memcpy(&a, acc + i, 2);
    std::memcpy(&b, x + i, 2);
    const uint16_t s = wire == DType::kF16 ? sdk::floatToHalf(sdk::halfToFloat(a) + sdk::halfToFloat(b))
                                           : sdk::floatToBf16(sdk::bf16ToFloat(a) + sdk::bf16ToFloat(b));
    std::memcpy(acc + i, &s, 2);
  }
}

// ---- The simulated ranks of one tensor.

TensorInfo tensorInfo(const ConformanceShape& shape, uint64_t tensor_id, int world, const ConformanceMemory& memory) {
  TensorInfo t;
  t.dtype = DType::kF32;
  t.numel = shape.numel;
  t.ndim = shape.ndim;
  t.shape = shape.shape;
  t.device = memory.device();
  t.device_index = memory.deviceIndex();
  t.tensor_id = tensor_id;
  t.world_size = world;
  return t;
}

// How messages name a tensor: "numel 1001", "shape 300x257".
std::string tag(const ConformanceShape& s) {
  return (s.ndim == 0 ? "numel " : "shape ") + s.label();
}

// Everything one step produced, per round and rank.
struct Step {
  std::vector<std::vector<Bytes>> payloads;  // [round][rank]
  std::vector<Bytes> aggregates;             // [round], SUM or CUSTOM: what every rank receives
  std::vector<Floats> own;                   // [rank]: the rank's last payload decoded by itself (source_rank = rank)
  std::vector<Floats> result;                // [rank]: the aggregate as that rank decodes it
};

// W ranks of one tensor in one process, with per-rank workspace and state allocated the way the core's plugin codec
// allocates them (max over rounds, state zero-filled once and kept across steps), each between guard zones. Every
// buffer a call writes is checked after the call. Contract breaches that are not memory damage (ranks disagreeing,
// a decompress changing its workspace) are recorded in issues() for the check that looks for them.
//
// Every buffer comes from `memory` and every call runs on its stream; what the checks compare (payloads, decodes,
// workspace snapshots) is host data read back through it, so no check knows whether the plugin ran on the host or on
// a device.
class Simulation {
 public:
  Simulation(std::shared_ptr<const Compressor> compressor, std::shared_ptr<ConformanceMemory> memory,
             const ConformanceShape& shape, int world, uint64_t run_seed, uint64_t tensor_id)
      : compressor_(std::move(compressor)), memory_(std::move(memory)), shape_(shape), world_(world) {
    caps_ = compressor_->caps(DType::kF32);
    base_ = tensorInfo(shape, tensor_id, world, *memory_);
    for (int r = 0; r < caps_.num_rounds; ++r) {
      TensorInfo t = base_;
      t.round = r;
      sizes_.push_back(compressor_->sizes(t));
    }
    uint64_t workspace = 0, state = 0;
    for (const auto& s : sizes_) {
      workspace = std::max(workspace, s.workspace_bytes);
      state = std::max(state, s.state_bytes);
    }
    for (int k = 0; k < world_; ++k) {
      ranks_.push_back(std::make_unique<Rank>(*memory_, static_cast<std::size_t>(workspace),
                                              static_cast<std::size_t>(state),
                                              codecSeed(run_seed, caps_.shared_seed, k)));
    }
  }

  const CompressorCaps& caps() const { return caps_; }
  const CompressorSizes& sizes(int round) const { return sizes_.at(static_cast<std::size_t>(round)); }
  int rounds() const { return caps_.num_rounds; }
  int lastRound() const { return caps_.num_rounds - 1; }
  int world() const { return world_; }
  uint64_t numel() const { return base_.numel; }
  const ConformanceShape& shape() const { return shape_; }
  bool aggregated() const { return caps_.aggregation != Aggregation::kAllgather; }
  const std::vector<std::string>& issues() const { return issues_; }
  void watchPurity(bool on) { watch_purity_ = on; }
  std::size_t decompressCalls() const { return decompress_calls_; }
  std::size_t sourceRankDecompressCalls() const { return source_rank_calls_; }

  TensorInfo info(int rank, uint64_t step, int round, int source) const {
    TensorInfo t = base_;
    t.rank = rank;
    t.step = step;
    t.round = round;
    t.source_rank = source;
    t.seed = ranks_.at(static_cast<std::size_t>(rank))->seed;
    return t;
  }

  Bytes compress(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev) {
    Rank& rk = *ranks_.at(static_cast<std::size_t>(rank));
    const auto out = memory_->guarded(static_cast<std::size_t>(sizes(round).max_output_bytes));
    const auto in = memory_->input(asBytes(input));
    const auto prev_copy = memory_->copy(prev);
    const uint64_t n =
        compressor_->compress(info(rank, step, round, rank), input.empty() ? nullptr : in->span().data(),
                              round == 0 && prev.empty() ? std::span<const std::byte>() : prev_copy->span(),
                              rk.scratch(), out->spanWithSlack(kOutputSlack), memory_->stream());
    memory_->finish();
    out->check(cat("compress output (round ", round, ", max_output_bytes ", out->size(), ")"));
    rk.checkGuards("compress");
    Bytes payload(static_cast<std::size_t>(n));
    out->read(payload);
    return payload;
  }

  // out = decoded payload (out += with accumulate); out must hold numel() floats.
  void decompress(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out,
                  bool accumulate) {
    Rank& rk = *ranks_.at(static_cast<std::size_t>(rank));
    const auto buffer = memory_->guarded(out.size() * sizeof(float));
    buffer->write(asBytes(out));
    const auto copy = memory_->copy(payload);
    Bytes workspace_before, state_before;
    if (watch_purity_) {
      workspace_before = rk.workspaceBytes();
      state_before = rk.stateBytes();
    }
    ++decompress_calls_;
    if (source >= 0) ++source_rank_calls_;
    compressor_->decompress(info(rank, step, lastRound(), source), copy->span(), rk.scratch(), buffer->data(),
                            accumulate, memory_->stream());
    memory_->finish();
    buffer->check(cat("decompress output (", numel(), " f32)"));
    rk.checkGuards("decompress");
    buffer->read({reinterpret_cast<std::byte*>(out.data()), out.size() * sizeof(float)});
    if (watch_purity_) {
      if (int64_t at = firstByteDifference(workspace_before, rk.workspaceBytes()); at >= 0) {
        issue(cat("decompress (source_rank ", source, ") changed byte ", at, " of the workspace of rank ", rank,
                  "; the ABI says decompress never modifies the workspace"));
      }
      if (int64_t at = firstByteDifference(state_before, rk.stateBytes()); source >= 0 && at >= 0) {
        issue(cat("decompress of rank ", source, "'s own payload changed byte ", at, " of the state of rank ", rank,
                  "; only the aggregate (source_rank -1) may modify the state"));
      }
    }
  }

  Bytes reduce(int rank, uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b) {
    Rank& rk = *ranks_.at(static_cast<std::size_t>(rank));
    const auto out = memory_->guarded(static_cast<std::size_t>(sizes(round).max_reduced_bytes));
    const auto ca = memory_->copy(a), cb = memory_->copy(b);
    const uint64_t n = compressor_->reduce(info(rank, step, round, -1), ca->span(), cb->span(), rk.scratch(),
                                           out->spanWithSlack(kOutputSlack), memory_->stream());
    memory_->finish();
    out->check(cat("reduce output (round ", round, ", max_reduced_bytes ", out->size(), ")"));
    rk.checkGuards("reduce");
    Bytes reduced(static_cast<std::size_t>(n));
    out->read(reduced);
    return reduced;
  }

  // What every rank receives for one round: the wire sum (SUM) or the fold in rank order (CUSTOM, done on every rank
  // as the core does; ranks that fold to different bytes are an issue).
  Bytes aggregate(uint64_t step, int round, const std::vector<Bytes>& payloads) {
    if (caps_.aggregation == Aggregation::kSum) {
      const uint64_t header = sizes(round).sum_header_bytes;
      Bytes sum = payloads.at(0);
      for (std::size_t k = 1; k < payloads.size(); ++k) {
        if (payloads[k].size() != sum.size()) {
          throw Violation(cat("round ", round, ": rank ", k, " sent ", payloads[k].size(), " bytes, rank 0 sent ",
                              sum.size(), "; a SUM payload must have one size on every rank"));
        }
        const std::size_t h = static_cast<std::size_t>(std::min<uint64_t>(header, sum.size()));
        if (int64_t at = firstByteDifference({payloads[0].data(), h}, {payloads[k].data(), h}); at >= 0) {
          issue(cat("round ", round, ": the first ", header,
                    " bytes (sum_header_bytes) differ between rank 0 and rank ", k, " at byte ", at,
                    "; the ABI says they are identical on every rank"));
        }
        addWire(sum.data() + h, payloads[k].data() + h, sum.size() - h, caps_.wire_dtype);
      }
      return sum;
    }
    if (caps_.aggregation == Aggregation::kCustom) {
      Bytes first;
      for (int k = 0; k < world_; ++k) {
        Bytes acc = payloads.at(0);
        for (std::size_t j = 1; j < payloads.size(); ++j) acc = reduce(k, step, round, acc, payloads[j]);
        if (k == 0) {
          first = std::move(acc);
        } else if (int64_t at = firstByteDifference(first, acc); at >= 0) {
          issue(
              cat("round ", round, ": rank ", k, " folds the payloads to different bytes than rank 0 (byte ", at, ")"));
        }
      }
      return first;
    }
    throw InternalError("aggregate() called for allgather");
  }

  // One step: every round compressed on every rank with prev = the previous round's aggregate, then what the core
  // decodes: each rank's own last payload (error feedback does that), and the aggregate on every rank.
  Step run(uint64_t step, const std::vector<const Floats*>& inputs) {
    Step s;
    s.payloads.resize(static_cast<std::size_t>(rounds()));
    for (int r = 0; r < rounds(); ++r) {
      const std::span<const std::byte> prev =
          r == 0 ? std::span<const std::byte>() : std::span<const std::byte>(s.aggregates.back());
      for (int k = 0; k < world_; ++k) {
        s.payloads[static_cast<std::size_t>(r)].push_back(
            compress(k, step, r, *inputs.at(static_cast<std::size_t>(k)), prev));
      }
      if (aggregated()) s.aggregates.push_back(aggregate(step, r, s.payloads[static_cast<std::size_t>(r)]));
    }
    const auto& last = s.payloads.back();
    for (int k = 0; k < world_; ++k) {
      Floats own(numel(), 0.0f);
      decompress(k, step, last[static_cast<std::size_t>(k)], k, own, false);
      s.own.push_back(std::move(own));
    }
    for (int k = 0; k < world_; ++k) {
      Floats result(numel(), 0.0f);
      if (aggregated()) {
        decompress(k, step, s.aggregates.back(), -1, result, false);
      } else {
        for (int j = 0; j < world_; ++j) decompress(k, step, last[static_cast<std::size_t>(j)], j, result, true);
      }
      if (k > 0) {
        if (int64_t at = firstBitDifference(s.result[0], result); at >= 0) {
          issue(cat("step ", step, ": rank ", k, " decodes the aggregate differently from rank 0 at element ", at, " (",
                    result[static_cast<std::size_t>(at)], " vs ", s.result[0][static_cast<std::size_t>(at)],
                    "); replicas would drift apart"));
        }
      }
      s.result.push_back(std::move(result));
    }
    return s;
  }

  // One rank, the same input on every rank of a one-rank world.
  Step runOne(uint64_t step, const Floats& input) { return run(step, std::vector<const Floats*>(world_, &input)); }

 private:
  struct Rank {
    Rank(ConformanceMemory& memory, std::size_t workspace_bytes, std::size_t state_bytes, uint64_t s)
        : workspace(memory.guarded(workspace_bytes)), state(memory.guarded(state_bytes)), seed(s) {}
    Scratch scratch() { return Scratch{workspace->span(), state->span()}; }
    void checkGuards(const char* call) const {
      workspace->check(cat("workspace (in ", call, ")"));
      state->check(cat("state (in ", call, ")"));
    }
    Bytes workspaceBytes() const { return contents(*workspace); }
    Bytes stateBytes() const { return contents(*state); }
    static Bytes contents(const GuardedRegion& r) {
      Bytes b(r.size());
      r.read(b);
      return b;
    }
    std::unique_ptr<GuardedRegion> workspace;  // zero-filled when made, as the core's are
    std::unique_ptr<GuardedRegion> state;
    uint64_t seed;
  };

  void issue(std::string text) {
    if (issues_.size() < 20) issues_.push_back(std::move(text));
  }

  std::shared_ptr<const Compressor> compressor_;
  std::shared_ptr<ConformanceMemory> memory_;
  ConformanceShape shape_;
  int world_;
  CompressorCaps caps_;
  TensorInfo base_;
  std::vector<CompressorSizes> sizes_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::string> issues_;
  bool watch_purity_ = false;
  std::size_t decompress_calls_ = 0;
  std::size_t source_rank_calls_ = 0;
};

// ---- The checks.

struct Outcome {
  CheckStatus status;
  std::string message;
};
Outcome pass(std::string m) {
  return {CheckStatus::kPass, std::move(m)};
}
Outcome fail(std::string m) {
  return {CheckStatus::kFail, std::move(m)};
}
Outcome skip(std::string m) {
  return {CheckStatus::kSkip, std::move(m)};
}

std::string devicesName(uint32_t devices) {
  std::string out;
  if (devices & TERSE_DEVICE_HOST) out += "host";
  if (devices & TERSE_DEVICE_CUDA) out += out.empty() ? "cuda" : ",cuda";
  return out.empty() ? "none" : out;
}

std::string aggregationText(const CompressorCaps& c) {
  std::string s(aggregationName(c.aggregation));
  if (c.aggregation == Aggregation::kSum) s += " (wire " + std::string(dtypeName(c.wire_dtype)) + ")";
  return s;
}

struct Context {
  const CompressorPlugin& plugin;
  const Params& params;
  const ConformanceOptions& options;
  std::shared_ptr<ConformanceMemory> memory;  // where every buffer of every check lives
  std::shared_ptr<Compressor> instance;
  CompressorCaps caps;
  std::vector<ConformanceShape> shapes;  // those get_sizes accepted
  std::map<std::string, double> round_trip_error;
  uint64_t next_tensor_id = 1;

  uint64_t tensorId() { return next_tensor_id++; }
  Simulation sim(const ConformanceShape& s, int world) {
    return Simulation(instance, memory, s, world, options.seed, tensorId());
  }
  uint64_t inputSeed(const ConformanceShape& s, uint64_t purpose, int rank = 0) const {
    return mixSeed(options.seed, purpose * 1000003u + s.numel, static_cast<uint64_t>(rank) + 17u * s.shape[0]);
  }

  std::vector<ConformanceShape> moderate() const {
    std::vector<ConformanceShape> out;
    for (const auto& s : shapes)
      if (s.numel <= kModerateNumel) out.push_back(s);
    return out;
  }
  // The shape the statistical and fuzzing checks use: at least kRoundTripMinNumel elements if possible, moderate, flat
  // before shaped.
  std::optional<ConformanceShape> representative() const {
    std::optional<ConformanceShape> best;
    auto better = [](const ConformanceShape& a, const ConformanceShape& b) {
      const bool a_big = a.numel >= kRoundTripMinNumel, b_big = b.numel >= kRoundTripMinNumel;
      if (a_big != b_big) return a_big;
      if ((a.ndim == 0) != (b.ndim == 0)) return a.ndim == 0;
      return a_big ? a.numel < b.numel : a.numel > b.numel;
    };
    for (const auto& s : moderate())
      if (s.numel > 0 && (!best || better(s, *best))) best = s;
    return best;
  }
  // The representative shape and every moderate matrix: a low-rank compressor runs its real algorithm only on
  // matrices (a flat tensor may pass through), so checks of behaviour look at both.
  std::vector<ConformanceShape> probes() const {
    std::vector<ConformanceShape> out;
    auto rep = representative();
    if (rep) out.push_back(*rep);
    for (const auto& s : moderate())
      if (s.ndim > 0 && s.numel > 0 && (!rep || s.label() != rep->label())) out.push_back(s);
    return out;
  }
  // The smallest nonempty shape: small payloads get every byte flipped.
  std::optional<ConformanceShape> smallest() const {
    std::optional<ConformanceShape> best;
    for (const auto& s : shapes)
      if (s.numel > 0 && (!best || s.numel < best->numel)) best = s;
    return best;
  }
};

Outcome checkInstantiate(Context& c) {
  c.instance = c.plugin.instantiate(c.params);
  try {
    c.caps = c.instance->caps(DType::kF32);
  } catch (const Unsupported& e) {
    c.instance.reset();
    return fail(cat("the plugin does not handle f32 gradients, which every check drives: ", e.what()));
  }
  const bool on_device = c.memory->device() != TERSE_DEVICE_HOST;
  if (!on_device && (c.caps.devices & TERSE_DEVICE_HOST) == 0) {
    c.instance.reset();
    return skip("the plugin runs on CUDA only and the suite drives host memory: nothing else can be checked");
  }
  // SKIP, not FAIL: CUDA support is optional in the ABI (a plugin answers what it runs on, and the core asks before a
  // run, never assumes), so a host-only plugin breaks no rule by not running there. Asked to check it on a device, the
  // suite says why it checked nothing; the host mode is where such a plugin is judged.
  if (on_device && (c.caps.devices & c.memory->device()) == 0) {
    c.instance.reset();
    return skip(cat("the plugin does not advertise CUDA (f32 caps.devices: ", devicesName(c.caps.devices),
                    ") and the suite was asked to drive ", c.memory->describe(), ": nothing else can be checked"));
  }
  return pass(cat("f32 caps: aggregation ", aggregationText(c.caps), ", ", c.caps.fixed_size ? "fixed" : "variable",
                  " size, ", plural(static_cast<std::size_t>(c.caps.num_rounds), "round", "rounds"), ", ",
                  c.caps.stateful ? "stateful" : "stateless", ", ", c.caps.shared_seed ? "shared" : "per-rank", " seed",
                  on_device ? "; buffers on " + c.memory->describe() : std::string()));
}

Outcome checkSizes(Context& c) {
  std::vector<std::string> notes, problems;
  for (const auto& shape : c.options.shapes) {
    const uint64_t id = c.tensorId();
    try {
      std::string entry = tag(shape) + ":";
      for (int r = 0; r < c.caps.num_rounds; ++r) {
        TensorInfo t = tensorInfo(shape, id, c.options.world_size, *c.memory);
        t.round = r;
        const CompressorSizes s0 = c.instance->sizes(t);
        if (c.caps.aggregation == Aggregation::kSum) {
          // Every rank's payload must have the same length and header split, or the wire sum is meaningless.
          t.rank = c.options.world_size - 1;
          const CompressorSizes s1 = c.instance->sizes(t);
          if (s1.max_output_bytes != s0.max_output_bytes || s1.sum_header_bytes != s0.sum_header_bytes) {
            problems.push_back(cat(tag(shape), " round ", r, ": rank ", t.rank, " gets max_output_bytes ",
                                   s1.max_output_bytes, " / sum_header_bytes ", s1.sum_header_bytes, ", rank 0 gets ",
                                   s0.max_output_bytes, " / ", s0.sum_header_bytes));
          }
        }
        entry += cat(" ", s0.max_output_bytes, " B");
      }
      notes.push_back(entry);
      c.shapes.push_back(shape);
    } catch (const Unsupported& e) {
      if (shape.numel == 0) {
        problems.push_back(
            cat("the empty tensor is unsupported (the ABI: numel 0 is valid and must work): ", e.what()));
      } else {
        notes.push_back(tag(shape) + ": unsupported");
      }
    }
  }
  if (!problems.empty()) return fail(problems.front());
  if (c.shapes.empty()) return fail("get_sizes refused every shape");
  return pass("max_output_bytes per round: " + [&] {
    std::string s;
    for (const auto& n : notes) s += (s.empty() ? "" : "; ") + n;
    return s;
  }());
}

// One rank, a normal input, every round; returns the relative error and checks the decode is finite.
double roundTrip(Context& c, const ConformanceShape& shape) {
  if (auto it = c.round_trip_error.find(shape.label()); it != c.round_trip_error.end()) return it->second;
  Simulation sim = c.sim(shape, 1);
  const Floats x = normalInput(shape.numel, c.inputSeed(shape, 1));
  const Step s = sim.runOne(0, x);
  if (!allFinite(s.result[0])) {
    throw Violation(cat(tag(shape), ": decoding a standard-normal input gave a non-finite value"));
  }
  const double nx = norm(x);
  const double e = nx == 0 ? 0 : diffNorm(s.result[0], x) / nx;
  c.round_trip_error[shape.label()] = e;
  return e;
}

Outcome checkShapes(Context& c) {
  std::string sizes;
  for (const auto& shape : c.shapes) {
    Simulation sim = c.sim(shape, 1);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 1));
    const Step s = sim.runOne(0, x);
    if (!allFinite(s.result[0]) || !allFinite(s.own[0])) {
      return fail(cat(tag(shape), ": decoding a standard-normal input gave a non-finite value"));
    }
    const double nx = norm(x);
    c.round_trip_error[shape.label()] = nx == 0 ? 0 : diffNorm(s.result[0], x) / nx;
    sizes += cat(sizes.empty() ? "" : ", ", tag(shape), " -> ");
    for (int r = 0; r < sim.rounds(); ++r)
      sizes += cat(r ? "+" : "", s.payloads[static_cast<std::size_t>(r)][0].size());
    sizes += " B";
  }
  return pass(cat("compressed and decoded every accepted shape, guard zones intact: ", sizes));
}

Outcome checkRoundTrip(Context& c) {
  std::string text;
  double worst = 0;
  bool any = false;
  for (const auto& shape : c.shapes) {
    if (shape.numel == 0) continue;
    const double e = roundTrip(c, shape);
    text += cat(text.empty() ? "" : ", ", tag(shape), ": ", e);
    if (shape.numel >= kRoundTripMinNumel) {
      worst = std::max(worst, e);
      any = true;
    }
  }
  if (text.empty()) return skip("no nonempty shape");
  const std::string what = "relative error ||D(C(x)) - x|| / ||x|| on N(0, 1) inputs, one rank: " + text;
  if (!c.options.max_rel_error) return pass(what + " (no bound given: reported only)");
  if (!any) return skip(what + cat(" (no shape of at least ", kRoundTripMinNumel, " elements to hold to the bound)"));
  if (worst > *c.options.max_rel_error) {
    return fail(what + cat("; ", worst, " exceeds the bound ", *c.options.max_rel_error));
  }
  return pass(what + cat(" <= bound ", *c.options.max_rel_error));
}

Outcome checkOutputSize(Context& c) {
  uint64_t runs = 0, smallest = std::numeric_limits<uint64_t>::max(), largest = 0;
  bool varied = false;
  for (const auto& shape : c.shapes) {
    Simulation sim = c.sim(shape, 1);
    auto inputs = varietyInputs(shape.numel, c.inputSeed(shape, 2));
    if (shape.numel > kModerateNumel) inputs.resize(2);  // normal and zeros: the large shape is slow to repeat
    std::vector<uint64_t> first_sizes;
    for (uint64_t i = 0; i < inputs.size(); ++i) {
      Step s;
      try {
        s = sim.runOne(i, inputs[i].second);
      } catch (const std::exception& e) {
        throw Violation(cat(tag(shape), ", input '", inputs[i].first, "': ", e.what()));
      }
      for (int r = 0; r < sim.rounds(); ++r) {
        const uint64_t n = s.payloads[static_cast<std::size_t>(r)][0].size();
        ++runs;
        smallest = std::min(smallest, n);
        largest = std::max(largest, n);
        if (first_sizes.size() <= static_cast<std::size_t>(r)) first_sizes.push_back(n);
        varied = varied || n != first_sizes[static_cast<std::size_t>(r)];
      }
    }
  }
  // The core's checked compress already refuses a payload above max_output_bytes and, for fixed-size caps, one of any
  // other length; reaching here means every payload kept the promise.
  if (c.caps.fixed_size) {
    return pass(cat("fixed size: all ", runs,
                    " payloads (6 inputs per shape incl. zeros, spikes, 1e-20..1e20) were "
                    "exactly max_output_bytes, nothing written past it"));
  }
  return pass(cat("variable size: ", runs, " payloads of ", smallest, "..", largest,
                  " B, never above max_output_bytes, nothing written past it",
                  varied ? "" : " (all inputs gave one size)"));
}

Outcome checkDeterministic(Context& c) {
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  bool stochastic = false;
  for (const auto& shape : shapes) {
    // Two instances, as two processes would have: nothing may depend on addresses, clocks or call counts.
    const uint64_t id = c.tensorId();
    Simulation a(c.plugin.instantiate(c.params), c.memory, shape, 1, c.options.seed, id);
    Simulation b(c.plugin.instantiate(c.params), c.memory, shape, 1, c.options.seed, id);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 3));
    Bytes step0;
    for (uint64_t step : {0, 1, 2}) {
      const Step sa = a.runOne(step, x), sb = b.runOne(step, x);
      for (int r = 0; r < a.rounds(); ++r) {
        const Bytes& pa = sa.payloads[static_cast<std::size_t>(r)][0];
        const Bytes& pb = sb.payloads[static_cast<std::size_t>(r)][0];
        if (int64_t at = firstByteDifference(pa, pb); at >= 0) {
          return fail(cat(tag(shape), ", step ", step, ", round ", r,
                          ": two compressions of one input with the same (seed, step, tensor id) differ at byte ", at,
                          " (", pa.size(), " and ", pb.size(), " bytes)"));
        }
      }
      if (int64_t at = firstBitDifference(sa.result[0], sb.result[0]); at >= 0) {
        return fail(cat(tag(shape), ", step ", step, ": equal payloads decoded to different values at element ", at));
      }
      if (step == 0) step0 = sa.payloads.back()[0];
      if (step == 1 && step0 != sa.payloads.back()[0]) stochastic = true;
    }
  }
  return pass(
      cat("two instances gave byte-identical payloads and decodes for steps 0-2 on ", shapes.size(), " shape(s); ",
          stochastic ? "the payload changes with the step (stochastic)" : "the step does not change the payload"));
}

Outcome checkSharedSeed(Context& c) {
  if (!c.caps.shared_seed) return skip("caps do not ask for a shared seed");
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 4));
    for (uint64_t step : {0, 1}) {
      const Step s = sim.runOne(step, x);
      for (int r = 0; r < sim.rounds(); ++r) {
        const auto& p = s.payloads[static_cast<std::size_t>(r)];
        for (int k = 1; k < w; ++k) {
          if (int64_t at = firstByteDifference(p[0], p[static_cast<std::size_t>(k)]); at >= 0) {
            return fail(cat(tag(shape), ", step ", step, ", round ", r, ": ranks 0 and ", k,
                            " share the seed and the input but their payloads differ at byte ", at,
                            " (the random choices must depend on (seed, step, tensor id) only)"));
          }
        }
      }
    }
  }
  return pass(cat(w,
                  " ranks with the shared seed and one input sent byte-identical payloads in every round, steps 0-1, ",
                  shapes.size(), " shape(s)"));
}

Outcome checkAccumulate(Context& c) {
  std::size_t cases = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, 1);
    const Floats x = normalInput(shape.numel, c.inputSeed(shape, 5));
    const Step s = sim.runOne(0, x);
    struct Source {
      int rank;
      const Bytes* payload;
      const Floats* reference;
    };
    std::vector<Source> sources{{0, &s.payloads.back()[0], &s.own[0]}};
    if (sim.aggregated()) sources.push_back({-1, &s.aggregates.back(), &s.result[0]});
    for (const auto& src : sources) {
      ++cases;
      // accumulate = 0 overwrites whatever the buffer held: a NaN left anywhere means an element was not written.
      Floats over(shape.numel, std::numeric_limits<float>::quiet_NaN());
      sim.decompress(0, 0, *src.payload, src.rank, over, false);
      if (int64_t at = firstBitDifference(over, *src.reference); at >= 0) {
        return fail(cat(tag(shape), ", source_rank ", src.rank, ": with accumulate = 0 onto a buffer of NaN, element ",
                        at, " is ", over[static_cast<std::size_t>(at)], " instead of ",
                        (*src.reference)[static_cast<std::size_t>(at)], " (the output must be overwritten)"));
      }
      Floats acc(shape.numel);
      for (uint64_t i = 0; i < shape.numel; ++i)
        acc[i] = 0.75f + 0.25f * static_cast<float>(i % 13) - (i % 2 ? 2.0f : 0.0f);
      const Floats before = acc;
      sim.decompress(0, 0, *src.payload, src.rank, acc, true);
      for (uint64_t i = 0; i < shape.numel; ++i) {
        const float want = before[i] + (*src.reference)[i];
        // A few ulps: the plugin may fuse the add into its decode (an FMA rounds once where we round twice).
        const float tol =
            4 * std::numeric_limits<float>::epsilon() * (std::abs(before[i]) + std::abs((*src.reference)[i]));
        if (!(std::abs(acc[i] - want) <= tol) && !(std::isnan(want) && std::isnan(acc[i]))) {
          return fail(cat(tag(shape), ", source_rank ", src.rank, ": with accumulate = 1, element ", i, " is ", acc[i],
                          ", expected previous ", before[i], " + decoded ", (*src.reference)[i], " = ", want));
        }
      }
    }
  }
  return pass(cat("accumulate = 1 adds the decode to a nonzero buffer and accumulate = 0 overwrites a NaN buffer (",
                  cases, " shape/source cases)"));
}

Outcome checkPurity(Context& c) {
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  std::size_t calls = 0, source_calls = 0;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    sim.watchPurity(true);
    std::vector<Floats> x;
    for (int k = 0; k < w; ++k) x.push_back(normalInput(shape.numel, c.inputSeed(shape, 6, k)));
    std::vector<const Floats*> inputs;
    for (const auto& v : x) inputs.push_back(&v);
    for (uint64_t step : {0, 1}) sim.run(step, inputs);
    for (const auto& i : sim.issues())
      if (i.find("decompress") != std::string::npos) return fail(tag(shape) + ": " + i);
    calls += sim.decompressCalls();
    source_calls += sim.sourceRankDecompressCalls();
  }
  return pass(cat("workspace unchanged by all ", calls, " decompress calls, state unchanged by the ", source_calls,
                  " that decode one rank's payload (", w, " ranks, 2 steps, ", shapes.size(), " shape(s))"));
}

// The ranks' inputs for an aggregation check: independent normals.
struct RankInputs {
  std::vector<Floats> values;
  std::vector<const Floats*> pointers;
};
RankInputs rankInputs(const Context& c, const ConformanceShape& shape, uint64_t purpose, int world) {
  RankInputs in;
  for (int k = 0; k < world; ++k) in.values.push_back(normalInput(shape.numel, c.inputSeed(shape, purpose, k)));
  for (const auto& v : in.values) in.pointers.push_back(&v);
  return in;
}

// ||aggregate decode - sum of per-rank decodes|| / sum of ||per-rank decode||: the normwise gap between the two sides
// of the ABI's invariant, scaled so rounding in the sum shows as about one ulp of the wire dtype.
double sumGap(const Step& s) {
  const std::size_t n = s.result[0].size();
  std::vector<double> sum(n, 0.0);
  double scale = 0;
  for (const auto& o : s.own) {
    for (std::size_t i = 0; i < n; ++i) sum[i] += o[i];
    scale += norm(o);
  }
  double d = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = s.result[0][i] - sum[i];
    d += e * e;
  }
  if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
  return scale == 0 ? std::sqrt(d) : std::sqrt(d) / scale;
}

Outcome checkSumAggregation(Context& c) {
  if (c.caps.aggregation != Aggregation::kSum) return skip("aggregation is " + aggregationText(c.caps));
  const int w = c.options.world_size;
  // The wire sum rounds W - 1 times to the wire dtype (unit roundoff u: 2^-24 f32, 2^-11 f16, 2^-8 bf16), each time by
  // at most u of the running sum, so the gap is at most 2 (W - 1) u of the terms' total; twice that, plus room for the
  // decode's own f32 arithmetic. A payload that is not summable (scales summed with the values they scale, codes
  // summed as floats) misses by tens of percent.
  const double u = c.caps.wire_dtype == DType::kF32 ? 0x1p-24 : (c.caps.wire_dtype == DType::kF16 ? 0x1p-11 : 0x1p-8);
  const double tolerance = 4.0 * (w - 1) * u + 8.0 * w * 0x1p-24;
  double worst = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 7, w);
    for (uint64_t step : {0, 1}) {
      const Step s = sim.run(step, in.pointers);
      if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
      const double gap = sumGap(s);
      worst = std::max(worst, gap);
      if (!(gap <= tolerance)) {
        return fail(cat(tag(shape), ", step ", step, ": decompress(sum of ", w, " payloads summed as ",
                        dtypeName(c.caps.wire_dtype), ") differs from the sum of the ranks' own decodes by ", gap,
                        " (normwise, relative; tolerance ", tolerance,
                        "): the payload is not summable as its caps claim"));
      }
    }
  }
  return pass(cat(w, " ranks, steps 0-1: decompress(wire sum) equals the sum of per-rank decodes within ", worst,
                  " (tolerance ", tolerance, "); sum headers identical; every rank decodes the aggregate identically"));
}

Outcome checkCustomReduce(Context& c) {
  if (c.caps.aggregation != Aggregation::kCustom) return skip("aggregation is " + aggregationText(c.caps));
  const int w = std::max(3, c.options.world_size);
  double worst_assoc = 0, worst_sum = 0;
  bool bytes_equal = true;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 8, w);
    const Step s = sim.run(0, in.pointers);
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    const int last = sim.lastRound();
    const auto& p = s.payloads.back();
    const Bytes left = sim.reduce(0, 0, last, sim.reduce(0, 0, last, p[0], p[1]), p[2]);
    const Bytes right = sim.reduce(0, 0, last, p[0], sim.reduce(0, 0, last, p[1], p[2]));
    bytes_equal = bytes_equal && left == right;
    Floats dl(shape.numel, 0.0f), dr(shape.numel, 0.0f);
    sim.decompress(0, 0, left, -1, dl, false);
    sim.decompress(0, 0, right, -1, dr, false);
    const double scale = std::max(norm(dl), norm(dr));
    const double assoc = scale == 0 ? diffNorm(dl, dr) : diffNorm(dl, dr) / scale;
    worst_assoc = std::max(worst_assoc, assoc);
    if (!(assoc <= 1e-6)) {
      return fail(cat(tag(shape), ": (a + b) + c and a + (b + c) decode differently (normwise relative ", assoc,
                      "): reduce is not associative"));
    }
    // A CUSTOM reduction need not be a sum (signSGD's majority vote is not), so the gap to the sum of per-rank decodes
    // is reported, not required: the ABI asks only that each rank's own payload decodes to its contribution, which
    // the shapes and multi_round checks cover.
    if (w == 3) worst_sum = std::max(worst_sum, sumGap(s));
  }
  return pass(cat("(a + b) + c and a + (b + c) decode equal within ", worst_assoc,
                  bytes_equal ? " (byte-identical)" : "",
                  "; gap between the decoded aggregate and the sum of per-rank decodes (informational): ", worst_sum,
                  "; every rank folds and decodes identically"));
}

Outcome checkAllgatherAggregation(Context& c) {
  if (c.caps.aggregation != Aggregation::kAllgather) return skip("aggregation is " + aggregationText(c.caps));
  const int w = c.options.world_size;
  double worst = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 9, w);
    const Step s = sim.run(0, in.pointers);
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    // Every rank decodes every other rank's payload with its own scratch: the payload must carry all it needs.
    for (int k = 0; k < w; ++k) {
      for (int j = 0; j < w; ++j) {
        Floats d(shape.numel, 0.0f);
        sim.decompress(k, 0, s.payloads.back()[static_cast<std::size_t>(j)], j, d, false);
        if (int64_t at = firstBitDifference(d, s.own[static_cast<std::size_t>(j)]); at >= 0) {
          return fail(cat(tag(shape), ": rank ", k, " decodes rank ", j, "'s payload differently from rank ", j,
                          " itself at element ", at, ": the payload is not self-describing"));
        }
      }
    }
    worst = std::max(worst, sumGap(s));
    if (!(sumGap(s) <= 1e-5)) {
      return fail(cat(tag(shape), ": accumulating the ", w, " decodes differs from their sum by ", sumGap(s)));
    }
  }
  return pass(cat(w,
                  " ranks: every rank decodes every payload as its sender does, and the accumulated aggregate is "
                  "identical on every rank (within ",
                  worst, " of the sum)"));
}

Outcome checkMultiRound(Context& c) {
  if (c.caps.num_rounds == 1) return skip("one round");
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  std::string text;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 10, w);
    std::vector<double> truth(shape.numel, 0.0);
    for (const auto& v : in.values)
      for (uint64_t i = 0; i < shape.numel; ++i) truth[i] += v[i];
    Step s;
    for (uint64_t step : {0, 1, 2}) s = sim.run(step, in.pointers);  // the state (a warm start) carries across steps
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    double num = 0, den = 0;
    for (uint64_t i = 0; i < shape.numel; ++i) {
      num += (s.result[0][i] - truth[i]) * (s.result[0][i] - truth[i]);
      den += truth[i] * truth[i];
    }
    text += cat(text.empty() ? "" : "; ", tag(shape), ": ");
    for (int r = 0; r < sim.rounds(); ++r)
      text += cat(r ? " + " : "", s.payloads[static_cast<std::size_t>(r)][0].size());
    text += cat(" B, aggregate vs sum of inputs rel error ", den == 0 ? 0 : std::sqrt(num / den));
  }
  return pass(cat("drove ", c.caps.num_rounds, " rounds x 3 steps x ", w,
                  " ranks, each round's prev the aggregate of the one before: ", text));
}

Outcome checkUnbiased(Context& c) {
  auto rep = c.representative();
  if (!rep) return skip("no nonempty moderate shape");
  const int steps = std::max(2, c.options.unbiased_steps);
  Simulation sim = c.sim(*rep, 1);
  const Floats x = normalInput(rep->numel, c.inputSeed(*rep, 11));
  const std::size_t n = x.size();
  // Welford's running mean and squared deviations per element: exact zeros for a deterministic decode, where the
  // textbook sum-of-squares formula would leave cancellation noise that reads as randomness.
  std::vector<double> mean(n, 0.0), m2(n, 0.0);
  for (int t = 0; t < steps; ++t) {
    const Step s = sim.runOne(static_cast<uint64_t>(t), x);
    for (std::size_t i = 0; i < n; ++i) {
      const double v = s.result[0][i];
      const double delta = v - mean[i];
      mean[i] += delta / (t + 1);
      m2[i] += delta * (v - mean[i]);
    }
  }
  // Under E[D(C(x))] = x the squared distance of the mean from x is, in expectation, the mean's own variance:
  //   bias2 = sum_i (m_i - x_i)^2  ~  noise = sum_i s_i^2 / T.
  // A ratio of sums concentrates even when single elements are far from normal (a rarely kept random-k element); its
  // spread is about sqrt(2 / n_eff) with n_eff = (sum s_i^2)^2 / sum s_i^4, and the limit is 8 of those spreads above
  // 1: a false alarm is then out of reach while a bias of a few percent of the per-step error still fails. Decoding to
  // a float adds rounding: a floor of 1e-6 of the input's rms per element keeps an exact deterministic decode from
  // reading as infinitely biased.
  const double rms = norm(x) / std::sqrt(static_cast<double>(n));
  double bias2 = 0, noise = 0, var2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double var = m2[i] / (steps - 1);
    bias2 += (mean[i] - x[i]) * (mean[i] - x[i]);
    noise += var / steps;
    var2 += var * var;
  }
  const bool stochastic = noise > 0;
  const double floor = static_cast<double>(n) * (1e-6 * rms) * (1e-6 * rms);
  const double ratio = bias2 / (noise + floor);
  const double n_eff = var2 > 0 ? (steps * noise) * (steps * noise) / var2 : static_cast<double>(n);
  const double limit = 1.0 + 8.0 * std::sqrt(2.0 / std::max(1.0, n_eff));
  const double rel_bias = std::sqrt(bias2) / (rms * std::sqrt(static_cast<double>(n)));
  const std::string measured = stochastic
                                   ? cat("mean of ", steps, " stochastic decodes of one ", tag(*rep),
                                         " input: relative bias ||mean - x|| / ||x|| = ", rel_bias, ", ", ratio,
                                         "x the sampling noise of the mean")
                                   : cat("deterministic (", steps, " decodes of one ", tag(*rep),
                                         " input all equal): relative bias ||D(C(x)) - x|| / ||x|| = ", rel_bias);
  if (!c.options.claims_unbiased) return skip("unbiasedness not claimed; measured " + measured);
  const std::string against = stochastic ? cat("limit ", limit, "x")
                                         : std::string("the float rounding allowance (1e-6 of the rms per element)");
  if (!(ratio <= limit)) return fail(cat("claimed unbiased, but ", measured, ", above ", against));
  return pass(cat(measured, ", within ", against));
}

// ---- Malformed payloads.

// One valid payload and how to decode it.
struct Specimen {
  std::shared_ptr<Simulation> sim;
  uint64_t step;
  Bytes payload;
  int source;
  std::string label;  // "1001, rank 0's payload"
};

// Valid payloads to corrupt: for the smallest and the representative shape, a rank's own payload (decoded with its
// source rank, as error feedback and allgather do) and, for SUM and CUSTOM, the aggregate of three ranks (source -1).
std::vector<Specimen> specimens(Context& c) {
  std::vector<ConformanceShape> shapes;
  if (auto s = c.smallest()) shapes.push_back(*s);
  if (auto r = c.representative(); r && (shapes.empty() || r->label() != shapes[0].label())) shapes.push_back(*r);
  // And the smallest matrix: a low-rank compressor sends its real format only for matrices (flat tensors may pass
  // through), and that format must be fuzzed too.
  std::optional<ConformanceShape> matrix;
  for (const auto& s : c.moderate())
    if (s.ndim >= 2 && s.numel > 0 && (!matrix || s.numel < matrix->numel)) matrix = s;
  if (matrix) shapes.push_back(*matrix);
  std::vector<Specimen> out;
  for (const auto& shape : shapes) {
    const int w = c.options.world_size;
    auto sim = std::make_shared<Simulation>(c.sim(shape, w));
    const RankInputs in = rankInputs(c, shape, 12, w);
    const Step s = sim->run(0, in.pointers);
    out.push_back({sim, 0, s.payloads.back()[0], 0, tag(shape) + ", rank 0's payload"});
    if (sim->aggregated()) out.push_back({sim, 0, s.aggregates.back(), -1, tag(shape) + ", aggregate"});
  }
  return out;
}

// Tallies decodes of corrupted payloads. Rejections must carry TERSE_ERR_INVALID_PAYLOAD; memory damage (a
// Violation from the guard zones) ends the check with the mutation named.
class Attempts {
 public:
  enum class Result { kAccepted, kRejected };

  Result decode(Specimen& sp, std::span<const std::byte> payload, const std::string& mutation) {
    return run(sp.label, mutation, [&] {
      Floats out(sp.sim->numel(), 0.0f);
      sp.sim->decompress(0, sp.step, payload, sp.source, out, false);
    });
  }

  template <class Fn>
  Result run(const std::string& where, const std::string& mutation, Fn&& fn,
             std::initializer_list<terse_status_v1> allowed = {TERSE_ERR_INVALID_PAYLOAD}) {
    ++total_;
    try {
      fn();
      ++accepted_;
      return Result::kAccepted;
    } catch (const Violation& v) {
      throw Violation(cat(where, ", ", mutation, ": ", v.what()));
    } catch (const Error& e) {
      ++rejected_;
      if (std::find(allowed.begin(), allowed.end(), e.status()) == allowed.end() && wrong_status_.empty()) {
        wrong_status_ = cat(where, ", ", mutation, ": rejected with '", statusText(e.status()),
                            "' instead of 'invalid payload': ", e.what());
      }
      return Result::kRejected;
    }
  }

  std::size_t total() const { return total_; }
  std::size_t accepted() const { return accepted_; }
  std::size_t rejected() const { return rejected_; }
  const std::string& wrongStatus() const { return wrong_status_; }

 private:
  std::size_t total_ = 0, accepted_ = 0, rejected_ = 0;
  std::string wrong_status_;
};

// Every mutation here makes the payload invalid, so each must be rejected.
class MustReject {
 public:
  void expect(Attempts& a, Specimen& sp, const Bytes& payload, const std::string& mutation) {
    ++count_;
    if (a.decode(sp, payload, mutation) == Attempts::Result::kAccepted) {
      ++accepted_;
      if (example_.empty()) example_ = sp.label + ", " + mutation;
    }
  }
  std::size_t count() const { return count_; }
  std::size_t accepted() const { return accepted_; }
  const std::string& example() const { return example_; }

 private:
  std::size_t count_ = 0, accepted_ = 0;
  std::string example_;
};

Outcome checkWrongLength(Context& c) {
  Attempts attempts;
  MustReject must;
  auto sps = specimens(c);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::set<std::size_t> cuts;
    for (std::size_t k = 0; k < std::min<std::size_t>(len, 65); ++k) cuts.insert(k);
    for (std::size_t k :
         {len / 2, len / 3 * 2, len - std::min<std::size_t>(len, 16), len - std::min<std::size_t>(len, 4)})
      if (k < len) cuts.insert(k);
    if (len > 0) cuts.insert(len - 1);
    for (std::size_t k : cuts) {
      must.expect(attempts, sp, Bytes(sp.payload.begin(), sp.payload.begin() + static_cast<std::ptrdiff_t>(k)),
                  cat("truncated to ", k, " of ", len, " bytes"));
    }
    for (std::size_t extra : {1, 16}) {
      Bytes longer = sp.payload;
      longer.resize(len + extra, std::byte{0});
      must.expect(attempts, sp, longer, cat("extended by ", extra, " zero bytes to ", len + extra));
    }
  }
  if (must.accepted() > 0) {
    return fail(cat("accepted ", must.accepted(), " of ", must.count(),
                    " payloads of the wrong length (a truncated payload must be rejected, never decoded from what is "
                    "there), e.g. ",
                    must.example()));
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat("rejected all ", must.count(), " truncated or extended copies of ", sps.size(),
                  " valid payloads with 'invalid payload'"));
}

Outcome checkWrongHeader(Context& c) {
  Attempts attempts;
  MustReject must;
  std::size_t magic = 0, field = 0;
  auto sps = specimens(c);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    // Magic: any change in the first four bytes.
    for (std::size_t i = 0; i < std::min<std::size_t>(len, 4); ++i) {
      Bytes p = sp.payload;
      p[i] ^= std::byte{0xFF};
      must.expect(attempts, sp, p, cat("byte ", i, " (magic) flipped"));
      ++magic;
    }
    // The SDK's PayloadHeader keeps numel at bytes 8..15; when that is what this payload holds, lie there.
    uint64_t header_numel = 0;
    if (len >= 16) std::memcpy(&header_numel, sp.payload.data() + 8, 8);
    if (len >= 16 && header_numel == sp.sim->numel()) {
      const uint64_t n = sp.sim->numel();
      for (uint64_t lie : {n + 1, n - 1, n + (uint64_t{1} << 32), uint64_t{1} << 63, ~uint64_t{0}}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + 8, &lie, 8);
        must.expect(attempts, sp, p, cat("header numel set to ", lie));
        ++field;
      }
    }
  }
  // A payload for n elements decoded as a tensor of n + 1 or n - 1 (flat shapes). The simulation for the other size
  // runs a valid step first, so a multi-round plugin has its workspace prepared and only the payload is wrong.
  MustReject mismatch;
  for (auto& sp : sps) {
    if (sp.source != 0 || sp.sim->shape().ndim != 0) continue;
    const uint64_t n = sp.sim->numel();
    for (uint64_t other : {n + 1, n - 1}) {
      if (other == n) continue;
      const ConformanceShape shape = ConformanceShape::flat(other);
      std::shared_ptr<Simulation> sim;
      try {
        sim = std::make_shared<Simulation>(c.sim(shape, 1));
      } catch (const Unsupported&) {
        continue;  // a size the plugin does not take cannot test this
      }
      sim->runOne(sp.step, normalInput(other, c.inputSeed(shape, 13)));
      Specimen as_other{sim, sp.step, sp.payload, 0, sp.label};
      mismatch.expect(attempts, as_other, sp.payload, cat("decoded as a tensor of ", other, " elements"));
    }
  }
  const std::size_t total = magic + field + mismatch.count();
  const std::size_t accepted = must.accepted() + mismatch.accepted();
  if (accepted > 0) {
    return fail(cat("accepted ", accepted, " of ", total,
                    " payloads with a wrong header or for another tensor size, e.g. ",
                    mismatch.accepted() ? mismatch.example() : must.example()));
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat("rejected ", magic, " magic corruptions, ", mismatch.count(), " numel mismatches",
                  field ? cat(" and ", field, " lies in the header's numel field") : std::string(),
                  " with 'invalid payload'"));
}

Outcome checkByteFlips(Context& c) {
  Attempts attempts;
  auto sps = specimens(c);
  std::mt19937_64 rng(mixSeed(c.options.seed, 14));
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::vector<std::size_t> positions;
    if (len <= kExhaustiveFlipBytes) {
      for (std::size_t i = 0; i < len; ++i) positions.push_back(i);
    } else {
      for (std::size_t i = 0; i < 64; ++i) positions.push_back(i);
      std::uniform_int_distribution<std::size_t> pick(64, len - 1);
      for (std::size_t i = 64; i < kExhaustiveFlipBytes; ++i) positions.push_back(pick(rng));
    }
    for (std::size_t i : positions) {
      for (uint8_t v : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}, uint8_t(~uint8_t(sp.payload[i]))}) {
        if (std::byte{v} == sp.payload[i]) continue;
        Bytes p = sp.payload;
        p[i] = std::byte{v};
        attempts.decode(sp, p, cat("byte ", i, " set to ", int{v}));
      }
    }
    // Counts and lengths as huge words at every aligned offset of small payloads.
    for (std::size_t i = 0; i + 4 <= len && i < 4 * kExhaustiveFlipBytes; i += 4) {
      for (uint32_t v : {0xFFFFFFFFu, 0x7FFFFFFFu, 0x80000000u}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + i, &v, 4);
        attempts.decode(sp, p, cat("u32 at ", i, " set to ", v));
      }
    }
    for (std::size_t i = 0; i + 8 <= len && i < 8 * kExhaustiveFlipBytes; i += 8) {
      for (uint64_t v : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 40}) {
        Bytes p = sp.payload;
        std::memcpy(p.data() + i, &v, 8);
        attempts.decode(sp, p, cat("u64 at ", i, " set to ", v));
      }
    }
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat(attempts.total(), " single-field corruptions of ", sps.size(), " payloads: ", attempts.rejected(),
                  " rejected with 'invalid payload', ", attempts.accepted(),
                  " still valid and decoded without writing outside the output"));
}

Outcome checkRandomPayloads(Context& c) {
  Attempts attempts;
  auto sps = specimens(c);
  std::mt19937_64 rng(mixSeed(c.options.seed, 15));
  auto randomBytes = [&](std::size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xFF);
    return b;
  };
  const int count = std::max(1, c.options.fuzz_payloads);
  for (auto& sp : sps) {
    const std::size_t len = sp.payload.size();
    std::uniform_int_distribution<std::size_t> length(0, 2 * len + 64);
    for (int i = 0; i < count; ++i) {
      // A third pure noise; a third behind a valid header, so that parsing gets past the magic; a third of exactly
      // the valid length behind a valid header, so that it gets past the length checks too.
      const int kind = i % 3;
      Bytes p = randomBytes(kind == 2 ? len : length(rng));
      if (kind > 0) std::copy_n(sp.payload.begin(), std::min({p.size(), len, std::size_t{16}}), p.begin());
      attempts.decode(sp, p, cat("random ", p.size(), " bytes (", kind == 0 ? "noise" : "valid header", ")"));
    }
  }
  std::string extra;
  // CUSTOM: reduce sees untrusted payloads too (validate both, says the ABI).
  if (c.caps.aggregation == Aggregation::kCustom) {
    std::size_t n = 0;
    for (auto& sp : sps) {
      if (sp.source != 0) continue;
      const int round = sp.sim->lastRound();
      for (int i = 0; i < count / 2; ++i) {
        Bytes junk = randomBytes(std::uniform_int_distribution<std::size_t>(0, 2 * sp.payload.size() + 64)(rng));
        if (i % 2)
          std::copy_n(sp.payload.begin(), std::min({junk.size(), sp.payload.size(), std::size_t{16}}), junk.begin());
        const bool left = i % 4 < 2;
        attempts.run(sp.label,
                     cat("reduce with a random ", junk.size(), "-byte ", left ? "first" : "second", " operand"),
                     [&] { sp.sim->reduce(0, sp.step, round, left ? junk : sp.payload, left ? sp.payload : junk); });
        ++n;
      }
    }
    extra += cat(", ", n, " reduces with a random operand");
  }
  // Multi-round: the last round's compress reads prev, an aggregate that came over the network.
  if (c.caps.num_rounds > 1) {
    std::size_t n = 0;
    for (auto& sp : sps) {
      if (sp.source != 0) continue;
      const int round = sp.sim->lastRound();
      const Floats x = normalInput(sp.sim->numel(), c.inputSeed(sp.sim->shape(), 16));
      for (int i = 0; i < count / 2; ++i) {
        const std::size_t prev_len = sp.sim->sizes(round - 1).max_output_bytes;
        Bytes prev = randomBytes(i % 2 ? prev_len : std::uniform_int_distribution<std::size_t>(0, 2 * prev_len)(rng));
        attempts.run(sp.label, cat("compress round ", round, " with a random ", prev.size(), "-byte prev"),
                     [&] { sp.sim->compress(0, sp.step, round, x, prev); },
                     {TERSE_ERR_INVALID_PAYLOAD, TERSE_ERR_INVALID_ARGUMENT});
        ++n;
      }
    }
    extra += cat(", ", n, " compresses with a random prev");
  }
  if (!attempts.wrongStatus().empty()) return fail(attempts.wrongStatus());
  return pass(cat(attempts.total(), " random byte strings (", count, " per payload", extra, "): ", attempts.rejected(),
                  " rejected, ", attempts.accepted(), " accepted without writing outside the output"));
}

using CheckFn = Outcome (*)(Context&);
struct CheckEntry {
  std::string_view name;
  CheckFn fn;
};
constexpr CheckEntry kChecks[] = {
    {kInstantiate, &checkInstantiate},
    {kSizes, &checkSizes},
    {kShapes, &checkShapes},
    {kRoundTrip, &checkRoundTrip},
    {kOutputSize, &checkOutputSize},
    {kDeterministic, &checkDeterministic},
    {kSharedSeed, &checkSharedSeed},
    {kAccumulate, &checkAccumulate},
    {kPurity, &checkPurity},
    {kSumAggregation, &checkSumAggregation},
    {kCustomReduce, &checkCustomReduce},
    {kAllgatherAggregation, &checkAllgatherAggregation},
    {kMultiRound, &checkMultiRound},
    {kUnbiased, &checkUnbiased},
    {kWrongLength, &checkWrongLength},
    {kWrongHeader, &checkWrongHeader},
    {kByteFlips, &checkByteFlips},
    {kRandomPayloads, &checkRandomPayloads},
};

}  // namespace

std::string_view checkStatusName(CheckStatus status) noexcept {
  switch (status) {
    case CheckStatus::kPass:
      return "PASS";
    case CheckStatus::kFail:
      return "FAIL";
    case CheckStatus::kSkip:
      return "SKIP";
  }
  return "?";
}

ConformanceShape ConformanceShape::flat(uint64_t numel) {
  ConformanceShape s;
  s.numel = numel;
  return s;
}

ConformanceShape ConformanceShape::matrix(int64_t rows, int64_t cols) {
  ConformanceShape s;
  s.numel = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  s.ndim = 2;
  s.shape = {rows, cols, 0, 0};
  return s;
}

std::string ConformanceShape::label() const {
  if (ndim == 0) return std::to_string(numel);
  std::string s;
  for (int d = 0; d < ndim; ++d) s += (d ? "x" : "") + std::to_string(shape[static_cast<std::size_t>(d)]);
  return s;
}

std::vector<ConformanceShape> defaultConformanceShapes() {
  return {ConformanceShape::flat(0),        ConformanceShape::flat(1),
          ConformanceShape::flat(1001),     ConformanceShape::flat((uint64_t{1} << 20) + 3),
          ConformanceShape::matrix(33, 31), ConformanceShape::matrix(300, 257)};
}

bool ConformanceReport::passed() const noexcept {
  return count(CheckStatus::kFail) == 0;
}

std::size_t ConformanceReport::count(CheckStatus status) const noexcept {
  return static_cast<std::size_t>(
      std::count_if(checks.begin(), checks.end(), [&](const CheckResult& r) { return r.status == status; }));
}

const CheckResult* ConformanceReport::find(std::string_view name) const noexcept {
  for (const auto& r : checks)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string_view> conformanceCheckNames() {
  std::vector<std::string_view> out;
  for (const auto& c : kChecks) out.push_back(c.name);
  return out;
}

ConformanceReport checkCompressor(const CompressorPlugin& plugin, const Params& params,
                                  const ConformanceOptions& options) {
  TERSE_CHECK(options.world_size >= 2, InvalidArgument,
              "conformance: world_size must be at least 2, got " << options.world_size);
  for (const auto& name : options.only) {
    const auto names = conformanceCheckNames();
    TERSE_CHECK(std::find(names.begin(), names.end(), name) != names.end(), InvalidArgument,
                "conformance: no check named '" << name << "'");
  }
  TERSE_CHECK(options.device == TERSE_DEVICE_HOST || options.device == TERSE_DEVICE_CUDA, InvalidArgument,
              "conformance: device must be host (0x1) or cuda (0x2), got " << options.device);
  TERSE_CHECK(options.device == TERSE_DEVICE_HOST || options.device_index >= 0, InvalidArgument,
              "conformance: a CUDA device index is 0 or more, got " << options.device_index);
  // Before any check runs: a machine that cannot run the device mode is the caller's problem to report (an error, not
  // a report of 18 SKIPs that a CI job would count as green).
  std::shared_ptr<ConformanceMemory> memory =
      options.device == TERSE_DEVICE_HOST ? conformance::hostMemory() : conformance::cudaMemory(options.device_index);
  ConformanceReport report;
  report.plugin = plugin.info().name;
  report.path = plugin.info().path.string();
  report.device = memory->describe();
  Context ctx{plugin, params, options, memory, nullptr, {}, {}, {}, 1};
  std::string blocked;  // why the remaining checks cannot run
  for (const auto& entry : kChecks) {
    const bool prerequisite = entry.name == kInstantiate || entry.name == kSizes;
    if (!prerequisite && !options.only.empty() &&
        std::find(options.only.begin(), options.only.end(), entry.name) == options.only.end()) {
      continue;
    }
    if (options.on_check_start) options.on_check_start(entry.name);
    CheckResult result;
    result.name = std::string(entry.name);
    if (!blocked.empty()) {
      result.status = CheckStatus::kSkip;
      result.message = blocked;
    } else {
      try {
        Outcome o = entry.fn(ctx);
        result.status = o.status;
        result.message = std::move(o.message);
      } catch (const Violation& v) {
        result.status = CheckStatus::kFail;
        result.message = v.what();
      } catch (const Error& e) {
        result.status = CheckStatus::kFail;
        result.message = e.what();
      } catch (const std::exception& e) {
        result.status = CheckStatus::kFail;
        result.message = cat("unexpected exception: ", e.what());
      } catch (...) {
        result.status = CheckStatus::kFail;
        result.message = "unexpected exception of unknown type";
      }
      if (entry.name == kInstantiate && !ctx.instance) {
        blocked = "not run: no usable instance (see instantiate)";
      } else if (entry.name == kSizes && ctx.shapes.empty()) {
        blocked = "not run: get_sizes accepted no shape (see sizes)";
      }
    }
    if (options.on_check_done) options.on_check_done(result);
    report.checks.push_back(std::move(result));
  }
  return report;
}

std::string conformanceDeviceProblem(uint32_t device, int device_index) {
  if (device == TERSE_DEVICE_HOST) return {};
  if (device != TERSE_DEVICE_CUDA) return cat("device must be host (0x1) or cuda (0x2), got ", device);
  return conformance::cudaMemoryProblem(device_index);
}

PayloadSizes measurePayloadSizes(const CompressorPlugin& plugin, const Params& params, const ConformanceShape& shape,
                                 uint64_t seed) {
  auto instance = plugin.instantiate(params);
  PayloadSizes out;
  out.caps = instance->caps(DType::kF32);
  TERSE_CHECK((out.caps.devices & TERSE_DEVICE_HOST) != 0, Unsupported,
              plugin.info().name << " runs on CUDA only; payload sizes are measured on the host");
  Simulation sim(instance, conformance::hostMemory(), shape, 1, seed, 1);
  const Step s = sim.runOne(0, normalInput(shape.numel, mixSeed(seed, 99)));
  for (int r = 0; r < sim.rounds(); ++r) {
    out.rounds.push_back({r, sim.sizes(r).max_output_bytes, s.payloads[static_cast<std::size_t>(r)][0].size()});
  }
  return out;
}

}  // namespace terse

// The multi-rank simulator (simulation.h): per-rank scratch between guard zones, every plugin call through the
// suite's memory, and the payload exchange of one step as the core's SUM, CUSTOM and ALLGATHER paths perform it.
#include "core/conformance/simulation.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/common/error.h"
#include "core/compress/seed.h"
#include "core/conformance/message.h"
#include "terse/sdk/half.hpp"

namespace terse::conformance {
namespace {

// Bytes the suite offers compress and reduce beyond the bound the plugin declared; they lie in the trailing guard, so
// a plugin that writes there (past max_output_bytes, which the core sizes its wire buffers by) is caught.
constexpr std::size_t kOutputSlack = 64;

static_assert(kGuardBytes >= kOutputSlack, "the slack offered must lie inside the trailing guard");

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

}  // namespace

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

Simulation::Simulation(std::shared_ptr<const Compressor> compressor, std::shared_ptr<ConformanceMemory> memory,
                       const ConformanceShape& shape, int world, uint64_t run_seed, uint64_t tensor_id)
    : compressor_(std::move(compressor)), memory_(std::move(memory)), shape_(shape), world_(world) {
  caps_ = &compressor_->caps(DType::kF32);
  base_ = tensorInfo(shape, tensor_id, world, *memory_);
  for (int r = 0; r < caps_->num_rounds; ++r) {
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
                                            codecSeed(run_seed, caps_->shared_seed, k)));
  }
}

TensorInfo Simulation::info(int rank, uint64_t step, int round, int source) const {
  TensorInfo t = base_;
  t.rank = rank;
  t.step = step;
  t.round = round;
  t.source_rank = source;
  t.seed = ranks_.at(static_cast<std::size_t>(rank))->seed;
  return t;
}

Bytes Simulation::compress(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev) {
  return encodeCall(rank, step, round, input, prev, nullptr);
}

Bytes Simulation::compressDeferred(int rank, uint64_t step, int round, const Floats& input,
                                   std::span<const std::byte> prev, bool* raised) {
  const auto word = memory_->guarded(sizeof(uint32_t));
  word->write(Bytes(sizeof(uint32_t), std::byte{0}));
  Bytes payload = encodeCall(rank, step, round, input, prev, word.get());
  word->check("deferred compress verdict word (4 bytes)");
  uint32_t w = 0;
  word->read({reinterpret_cast<std::byte*>(&w), sizeof w});
  *raised = w != 0;
  return payload;
}

Bytes Simulation::encodeCall(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev,
                             GuardedRegion* word) {
  Rank& rk = *ranks_.at(static_cast<std::size_t>(rank));
  const auto out = memory_->guarded(static_cast<std::size_t>(sizes(round).max_output_bytes));
  if (output_fill_) out->write(Bytes(out->size(), *output_fill_));
  const auto in = memory_->input(asBytes(input));
  const auto prev_copy = memory_->copy(prev);
  const TensorInfo call = info(rank, step, round, rank);
  const void* const raw = input.empty() ? nullptr : in->span().data();
  const std::span<const std::byte> p = round == 0 && prev.empty() ? std::span<const std::byte>() : prev_copy->span();
  const uint64_t n =
      word != nullptr
          ? compressor_->compressDeferred(call, sizes(round), raw, p, rk.scratch(), out->spanWithSlack(kOutputSlack),
                                          reinterpret_cast<uint32_t*>(word->data()), memory_->stream())
          : compressor_->compress(call, raw, p, rk.scratch(), out->spanWithSlack(kOutputSlack), memory_->stream());
  memory_->finish();
  // memory.cc adds the size: "... of the compress output of round 0, sized max_output_bytes (24 bytes): ...".
  out->check(cat("compress output of round ", round, ", sized max_output_bytes"));
  rk.checkGuards("compress");
  Bytes payload(static_cast<std::size_t>(n));
  out->read(payload);
  return payload;
}

void Simulation::decompress(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out,
                            bool accumulate, uint32_t call_flags) {
  decodeCall(rank, step, payload, source, out, accumulate, call_flags, nullptr);
}

bool Simulation::decompressDeferred(int rank, uint64_t step, std::span<const std::byte> payload, int source,
                                    Floats& out, bool accumulate) {
  const auto word = memory_->guarded(sizeof(uint32_t));
  word->write(Bytes(sizeof(uint32_t), std::byte{0}));
  decodeCall(rank, step, payload, source, out, accumulate, 0, word.get());
  word->check("deferred decompress verdict word (4 bytes)");
  uint32_t raised = 0;
  word->read({reinterpret_cast<std::byte*>(&raised), sizeof raised});
  return raised != 0;
}

void Simulation::decodeCall(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out,
                            bool accumulate, uint32_t call_flags, GuardedRegion* word) {
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
  const int round = lastRound();
  TensorInfo call = info(rank, step, round, source);
  call.call_flags = call_flags;
  const char* const name = word != nullptr ? "decompress_deferred" : "decompress";
  if (word != nullptr) {
    compressor_->decompressDeferred(call, sizes(round), copy->span(), rk.scratch(), buffer->data(), accumulate,
                                    reinterpret_cast<uint32_t*>(word->data()), memory_->stream());
  } else {
    compressor_->decompress(call, copy->span(), rk.scratch(), buffer->data(), accumulate, memory_->stream());
  }
  memory_->finish();
  buffer->check(cat(word != nullptr ? "deferred " : "", "decompress output (", numel(), " f32)"));
  rk.checkGuards(name);
  buffer->read({reinterpret_cast<std::byte*>(out.data()), out.size() * sizeof(float)});
  if (watch_purity_) {
    if (int64_t at = firstByteDifference(workspace_before, rk.workspaceBytes()); at >= 0) {
      issue(cat(name, " (source_rank ", source, ") changed byte ", at, " of the workspace of rank ", rank,
                "; the ABI says decompress never modifies the workspace"));
    }
    if (int64_t at = firstByteDifference(state_before, rk.stateBytes()); source >= 0 && at >= 0) {
      issue(cat(name, " of rank ", source, "'s own payload changed byte ", at, " of the state of rank ", rank,
                "; only the aggregate (source_rank -1) may modify the state"));
    }
  }
}

Bytes Simulation::reduce(int rank, uint64_t step, int round, std::span<const std::byte> a,
                         std::span<const std::byte> b) {
  Rank& rk = *ranks_.at(static_cast<std::size_t>(rank));
  const auto out = memory_->guarded(static_cast<std::size_t>(sizes(round).max_reduced_bytes));
  if (output_fill_) out->write(Bytes(out->size(), *output_fill_));
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

Bytes Simulation::aggregate(uint64_t step, int round, const std::vector<Bytes>& payloads) {
  if (caps_->aggregation == Aggregation::kSum) {
    const uint64_t header = sizes(round).sum_header_bytes;
    Bytes sum = payloads.at(0);
    for (std::size_t k = 1; k < payloads.size(); ++k) {
      if (payloads[k].size() != sum.size()) {
        throw Violation(cat("round ", round, ": rank ", k, " sent ", payloads[k].size(), " bytes, rank 0 sent ",
                            sum.size(), "; a SUM payload must have one size on every rank"));
      }
      const std::size_t h = static_cast<std::size_t>(std::min<uint64_t>(header, sum.size()));
      if (int64_t at = firstByteDifference({payloads[0].data(), h}, {payloads[k].data(), h}); at >= 0) {
        issue(cat("round ", round, ": the first ", header, " bytes (sum_header_bytes) differ between rank 0 and rank ",
                  k, " at byte ", at, "; the ABI says they are identical on every rank"));
      }
      addWire(sum.data() + h, payloads[k].data() + h, sum.size() - h, caps_->wire_dtype);
    }
    return sum;
  }
  if (caps_->aggregation == Aggregation::kCustom) {
    Bytes first;
    for (int k = 0; k < world_; ++k) {
      Bytes acc = payloads.at(0);
      for (std::size_t j = 1; j < payloads.size(); ++j) acc = reduce(k, step, round, acc, payloads[j]);
      if (k == 0) {
        first = std::move(acc);
      } else if (int64_t at = firstByteDifference(first, acc); at >= 0) {
        issue(cat("round ", round, ": rank ", k, " folds the payloads to different bytes than rank 0 (byte ", at, ")"));
      }
    }
    return first;
  }
  throw InternalError("aggregate() called for allgather");
}

Step Simulation::run(uint64_t step, const std::vector<const Floats*>& inputs) {
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

Simulation::Rank::Rank(ConformanceMemory& memory, std::size_t workspace_bytes, std::size_t state_bytes, uint64_t s)
    : workspace(memory.guarded(workspace_bytes)), state(memory.guarded(state_bytes)), seed(s) {}

void Simulation::Rank::checkGuards(const char* call) const {
  workspace->check(cat("workspace (in ", call, ")"));
  state->check(cat("state (in ", call, ")"));
}

Bytes Simulation::Rank::contents(const GuardedRegion& r) {
  Bytes b(r.size());
  r.read(b);
  return b;
}

void Simulation::issue(std::string text) {
  if (issues_.size() < 20) issues_.push_back(std::move(text));
}

}  // namespace terse::conformance

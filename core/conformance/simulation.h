// The multi-rank simulator of the conformance suite: W ranks of one tensor in one process, exchanging their payloads
// the way the core's collectives would (wire sum, CUSTOM fold, allgather), so the checks can hold a plugin to the
// aggregation contract without a transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/conformance/conformance.h"
#include "core/conformance/memory.h"
#include "core/conformance/vectors.h"
#include "core/plugin/compressor.h"

namespace terse::conformance {

TensorInfo tensorInfo(const ConformanceShape& shape, uint64_t tensor_id, int world, const ConformanceMemory& memory);

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
             const ConformanceShape& shape, int world, uint64_t run_seed, uint64_t tensor_id);

  const CompressorCaps& caps() const { return *caps_; }
  const CompressorSizes& sizes(int round) const { return sizes_.at(static_cast<std::size_t>(round)); }
  int rounds() const { return caps_->num_rounds; }
  int lastRound() const { return caps_->num_rounds - 1; }
  int world() const { return world_; }
  uint64_t numel() const { return base_.numel; }
  const ConformanceShape& shape() const { return shape_; }
  bool aggregated() const { return caps_->aggregation != Aggregation::kAllgather; }
  const std::vector<std::string>& issues() const { return issues_; }
  void watchPurity(bool on) { watch_purity_ = on; }
  // Fills every compress and reduce output buffer with `fill` before the call (the default leaves them zeroed, as
  // made): a byte the plugin does not write then reads back as the fill.
  void fillOutputs(std::byte fill) { output_fill_ = fill; }
  std::size_t decompressCalls() const { return decompress_calls_; }
  std::size_t sourceRankDecompressCalls() const { return source_rank_calls_; }

  TensorInfo info(int rank, uint64_t step, int round, int source) const;

  Bytes compress(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev);
  // compress through the deferred entry point (terse/device_verdict_v1.h, compress_deferred) with a zeroed word in the
  // suite's memory: the payload, and in *raised whether the word came back raised. What the plugin refuses at once is
  // thrown, as from compress.
  Bytes compressDeferred(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev,
                         bool* raised);
  // Whether the instance exports the deferred compress.
  bool defersPrevVerdicts() const { return compressor_->defersPrevVerdicts(); }
  // out = decoded payload (out += with accumulate); out must hold numel() floats. `call_flags` go to the plugin in
  // info.reserved0 (TERSE_CALL_*).
  void decompress(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out, bool accumulate,
                  uint32_t call_flags = 0);
  // decompress through the deferred entry point (terse/device_verdict_v1.h) with a zeroed word in the suite's memory:
  // returns whether the word came back raised. What the plugin refuses at once is thrown, as from decompress.
  bool decompressDeferred(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out,
                          bool accumulate);
  // Whether the instance exports the deferred entry point.
  bool defersVerdicts() const { return compressor_->defersVerdicts(); }
  Bytes reduce(int rank, uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b);

  // What every rank receives for one round: the wire sum (SUM) or the fold in rank order (CUSTOM, done on every rank
  // as the core does; ranks that fold to different bytes are an issue).
  Bytes aggregate(uint64_t step, int round, const std::vector<Bytes>& payloads);

  // One step: every round compressed on every rank with prev = the previous round's aggregate, then what the core
  // decodes: each rank's own last payload (error feedback does that), and the aggregate on every rank.
  Step run(uint64_t step, const std::vector<const Floats*>& inputs);
  // One rank, the same input on every rank of a one-rank world.
  Step runOne(uint64_t step, const Floats& input) { return run(step, std::vector<const Floats*>(world_, &input)); }

 private:
  struct Rank {
    Rank(ConformanceMemory& memory, std::size_t workspace_bytes, std::size_t state_bytes, uint64_t s);
    Scratch scratch() { return Scratch{workspace->span(), state->span()}; }
    void checkGuards(const char* call) const;
    Bytes workspaceBytes() const { return contents(*workspace); }
    Bytes stateBytes() const { return contents(*state); }
    static Bytes contents(const GuardedRegion& r);
    std::unique_ptr<GuardedRegion> workspace;  // zero-filled when made, as the core's are
    std::unique_ptr<GuardedRegion> state;
    uint64_t seed;
  };

  void issue(std::string text);
  // decompress and decompressDeferred in one body: a `word` (4 zeroed bytes of the suite's memory) makes it the
  // deferred call.
  void decodeCall(int rank, uint64_t step, std::span<const std::byte> payload, int source, Floats& out, bool accumulate,
                  uint32_t call_flags, GuardedRegion* word);
  // compress and compressDeferred in one body, as decodeCall.
  Bytes encodeCall(int rank, uint64_t step, int round, const Floats& input, std::span<const std::byte> prev,
                   GuardedRegion* word);

  std::shared_ptr<const Compressor> compressor_;
  std::shared_ptr<ConformanceMemory> memory_;
  ConformanceShape shape_;
  int world_;
  const CompressorCaps* caps_ = nullptr;  // the instance's own (Compressor::caps), which compressor_ keeps
  TensorInfo base_;
  std::vector<CompressorSizes> sizes_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::string> issues_;
  bool watch_purity_ = false;
  std::optional<std::byte> output_fill_;
  std::size_t decompress_calls_ = 0;
  std::size_t source_rank_calls_ = 0;
};

}  // namespace terse::conformance

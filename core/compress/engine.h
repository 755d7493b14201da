// The aggregation engine: the only code that moves gradients through the communicator (DESIGN.md section 2). The
// trainer hands it groups of chunks -- a scheduler's group (scheduler_v1.h: "The group is fused into one
// collective"), a lone tensor being a group of one -- and it runs each member's pipeline (pipeline.h) along the path
// its caps name:
//
//   SUM, one round, same wire dtype (fused):  each member encodes its chunk; the summable bodies (payload bytes after
//       the compressor's sum_header_bytes) are concatenated into one buffer and summed by ONE allreduce -- the sum of a
//       concatenation is the concatenation of the sums -- and decoded per member. Headers are identical on every rank
//       by the SUM contract, so they need not travel. On the host each member is decoded where its body was summed,
//       its header written in front of the body over what the members before it (decoded already) no longer need,
//       when that payload starts at the ABI's 16-byte alignment; otherwise (and on the device) the body is copied
//       back behind the member's own header first. A group of one sums in place behind its header: no copy.
//   SUM, several rounds (PowerSGD):  for r in 0..R-1: payload_r = encode(grad, prev = aggregate_{r-1}), allreduce it
//       -> aggregate_r; then decode(aggregate_{R-1}). Members with the same rounds and wire dtype are fused round by
//       round as above (one allreduce a round for the run; a lone member sums in place).
//   ALLGATHER (one round by the caps contract; fused):  each rank's block is its members' payloads concatenated,
//       preceded by a table of their byte sizes when the compressor's size varies and the group has several members;
//       ONE allgatherv moves every rank's block (after one 8-byte size exchange when sizes vary), and each member
//       decodes its segment of every rank's block, in rank order (out = 0; out += decode(payload_i) for every rank i).
//       A group of one gathers its payload buffer directly: no table, no copy.
//   CUSTOM (never fused):  per round, allgatherv the raw payloads and fold codec.reduce over them in rank order on
//       every rank -> aggregate_r (the next round's prev); then decode(aggregate_{R-1}).
//   every path: out /= world_size (the decoded aggregate is the SUM of the ranks' contributions).
//
// Members are taken in the group's order; a run of consecutive members of one fusion class (SUM with a given wire
// dtype and number of rounds, or ALLGATHER) forms one collective a round. Every rank fuses the same way because every
// rank gets the same group from its scheduler and the same caps from its compressor. Fusion is tensor fusion at the
// wire level as DDP buckets and Horovod's fusion buffer do it (Li et al. 2020, "PyTorch Distributed"; Sergeev and Del
// Balso 2018, "Horovod"), with compression kept per chunk so the math does not change.
//
// Device tensors (a communicator on device memory, pipelines on its stream): the same steps, with the concatenation
// copies stream-ordered on that stream (those of at most 16 KiB batched into one launch a concatenation) and the
// variable-size table built on the host, copied into the block, and read back from every rank's block after the gather
// (one small copy and one synchronization per fused gather).
//
// Payload checks (terse/device_verdict_v1.h): a decode of a payload from the network is checked by its plugin, and a
// plugin whose check runs in a device kernel would synchronize the stream once a call to learn its verdict. Where the
// plugin defers its verdict (CompressionPipeline::defersVerdicts), each decode of a run -- the members of one
// collective -- leaves it in a word of its own, and the engine reads them all after the run's last decode: on a device
// with one synchronization a run (a DDP bucket's) instead of one a tensor. There the words are device memory, which
// the decode kernels read as their gate, and one kernel stores them into mapped host memory before the
// synchronization, so no device-to-host copy is queued. On the host the words are read after the run's decodes too,
// but a fused SUM's, whose payloads the next member's header overwrites, right after each call. A raised
// word is explained by decoding that payload again the ordinary way, which throws the plugin's message
// (CompressionPipeline::explainRefusal); the outputs of a run that fails so are undefined, as those of any failed step
// are. On a device, error feedback's decode of the rank's own payload (TensorCodec::encodeDeferred) leaves its check
// in a word of the run too, and its residual update is skipped on the device when the word is raised: such a refusal
// fails the step with the residual as it was (CompressionPipeline::explainOwnRefusal). So does a multi-round plugin's
// check of the last round's prev (compress_deferred: PowerSGD's summed P), whose word is read first, since a refused
// prev makes the step's decodes of that tensor refuse too (CompressionPipeline::explainPrevRefusal).
//
// Bit-identity across groupings: ALLGATHER decoding is per rank in rank order whatever the grouping, so it is exactly
// the unfused result. A SUM through the ring allreduce sums each element in an order that depends on where it falls
// in the message (allreduce_ring.h: chunk c is summed starting at rank c), so at 3 or more ranks a different cut can
// change the last bit of a sum; with 1 or 2 ranks (a + b == b + a) or the recursive-doubling allreduce (every element
// summed in the same tree) the result is bit-identical for any grouping.
//
// Memory: the engine's concatenation and gather buffers grow to the largest group seen and are reused, so a run's
// steady state allocates nothing; they are shared by all the tensors of a rank, not kept per tensor.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/device_memory.h"
#include "core/compress/device_kernels.h"
#include "core/compress/pipeline.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

struct GroupMember {
  CompressionPipeline* pipeline = nullptr;
  const void* grad = nullptr;  // the chunk's gradient (pipeline's numel elements)
  void* out = nullptr;         // the averaged result; may equal grad
};

// One collective a phase ran, for a step trace (core/train/step_trace.h): what a replay needs to run it again.
struct PhaseCollective {
  const char* op = "";         // "allreduce", "allgatherv", "allgather_sizes" (the 8-byte size exchange before one)
  std::string_view algorithm;  // as the communicator ran it (Communicator::allreduceAlgorithmRun, ...): auto resolved
  DType dtype = DType::kU8;    // allreduce: the summed type; the gathers move bytes
  uint64_t bytes = 0;          // this rank's: the summed buffer (headers that stay home excluded) or its block
  std::span<const uint64_t> rank_bytes;  // allgatherv: every rank's block, rank order; valid during the callback
  std::chrono::steady_clock::time_point start, end;
};

// Phases of a group for a timeline: "compress", "allreduce", "allgatherv", "decompress"; `members` is how many members
// the phase covers, from `first_member`. `collectives`: the collectives a communication phase ran, in order (an
// allgatherv phase may hold the size exchange before the gather); empty for the codec phases.
using GroupPhaseFn = std::function<void(const char* phase, std::chrono::steady_clock::time_point start,
                                        std::chrono::steady_clock::time_point end, std::size_t first_member,
                                        std::size_t members, std::span<const PhaseCollective> collectives)>;

// The verdict words of deferred decodes (see "Payload checks" above): one run's, or a SplitSum's.
class VerdictWords {
 public:
  // Zeroed words for `n` calls in `where`'s memory, or none (word() null) when no member defers its verdicts. On a
  // device they are zeroed on the stream, after whatever an earlier run queued there. Words from `first_read` on are
  // the first a read looks at (see firstRaised).
  void begin(std::size_t n, bool any_defer, const Placement& where, std::size_t first_read = 0);
  uint32_t* word(std::size_t i) const noexcept { return words_ == nullptr ? nullptr : words_ + i; }
  // Word i for an own decode (error feedback's, CompressionPipeline::encode): on a device only, where it saves a
  // synchronization; a host decode refuses at once.
  uint32_t* ownWord(std::size_t i) const noexcept { return host_ ? nullptr : word(i); }
  // Word i for a check of prev (the last round's encode, CompressionPipeline::encode): on a device only, as ownWord.
  uint32_t* prevWord(std::size_t i) const noexcept { return host_ ? nullptr : word(i); }
  // Host: whether call i's word is raised, read now. A device's words are read by settle().
  bool raisedNow(std::size_t i) const noexcept { return host_ && words_ != nullptr && words_[i] != 0; }
  // After the last decode: on a device, synchronizes the stream once; returns the first raised word's call, or npos
  // (on the host too, where a caller that explained raisedNow's words at once finds none left raised). "First": in
  // [first_read, n), else in [0, first_read) -- a refused prev raises its own word and makes the step's decodes of
  // the tensor refuse too, and its word is the one that names the cause. The words are read once: settle() again
  // returns npos until the next begin().
  std::size_t settle();
  // settle() in two halves, so that the words of several runs on one stream cost one synchronization: queueRead()
  // queues the device words' store into mapped host memory (nothing on the host); after the stream is synchronized,
  // firstRaised() returns what settle() would.
  void queueRead();
  std::size_t firstRaised();
  // Whether words were begun and not yet read (settle, firstRaised, discard).
  bool pending() const noexcept { return n_ != 0; }
  // Leaves the words unread: their run failed otherwise.
  void discard() noexcept { n_ = 0; }
  bool host() const noexcept { return host_; }
  void* stream() const noexcept { return stream_; }
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  std::vector<uint32_t> host_words_;
  cuda::DeviceArray device_words_;  // grown to the largest run, reused
  cuda::MappedWords mapped_;        // where settle() reads device_words_, the same size
  uint32_t* words_ = nullptr;       // the run's: into host_words_ or device_words_
  std::size_t n_ = 0;
  std::size_t first_read_ = 0;
  bool host_ = true;
  void* stream_ = nullptr;
};

// A group of SUM members run in pieces around its collectives (AggregationEngine::beginSum), for a caller that issues
// the collectives itself without blocking: the DDP hook chains them on torch's asynchronous collectives
// (terse/torch.py). After beginSum, and after every finishSum that returns true, each entry of `sums` must be summed
// across the ranks in place, `wire` elements, every rank issuing the same list in the same order; the finishSum of the
// last round decodes into the members' outputs. Round by round (PowerSGD's P, then Q), the same encode, concatenation
// and decode as run() of the group, so the same bits. A SplitSum owns its concatenations, so several can be in flight
// at once (one per DDP bucket); its members' pipelines and outputs must not be used elsewhere until it is done.
class SplitSum {
 public:
  struct Sum {
    std::span<std::byte> data;  // summed in place: in the members' memory (host, or their device)
    DType wire = DType::kF32;
    uint64_t tensor = 0;  // the run's lead tensor, for the communicator's accounting
  };
  std::vector<Sum> sums;

  // Whether the split's verdict words are begun and not yet read: from beginSum (when a member defers its checks) until
  // the last finishSum reads them (Settle::kNow), settleSums does (Settle::kLater), or a call of the split fails.
  bool verdictsPending() const noexcept { return verdicts_.pending(); }
  // Gives the pending verdicts up unread: for a caller whose step failed otherwise (its error is the step's).
  void discardVerdicts() noexcept { verdicts_.discard(); }

 private:
  friend class AggregationEngine;
  struct Run {
    std::size_t first = 0, count = 0;
    TensorBuffer concat;               // a fused run's concatenation (kept across calls; unused alone)
    std::byte* decode_from = nullptr;  // host: where the fused bodies are decoded (engine.cc, decodeSummed)
  };
  uint64_t step_ = 0;
  int round_ = 0;   // the round whose sums are laid out
  int rounds_ = 1;  // every member's
  std::vector<GroupMember> members_;
  std::vector<std::span<std::byte>> local_;  // each member's payload
  std::vector<Run> runs_;                    // one per sum
  // Words [0, k): the members' last decodes; [k, 2k): their own decodes (error feedback's, on a device); [2k, 3k) with
  // several rounds: their last rounds' checks of prev (on a device). The split's own, so that splits in flight at
  // once, or decoded and not yet settled, do not share them.
  VerdictWords verdicts_;
  bool prev_words_ = false;  // whether [2k, 3k) exist
};

class AggregationEngine {
 public:
  // The communicator must outlive the engine; every pipeline run through it must have been validated against it
  // (CompressionPipeline's constructor does that). Reads TERSE_DEFER_VERDICTS (deferVerdicts); a value other than 0
  // or 1 is an InvalidArgument naming it.
  explicit AggregationEngine(comm::Communicator& comm);

  // Runs one group as described above. Every rank calls it with the same groups in the same order. Throws
  // InvalidArgument for a member without a pipeline or a null output (before any collective), what the pipelines and
  // the communicator throw, and InvalidPayload for a peer's size or table that does not fit.
  void run(uint64_t step, std::span<const GroupMember> members, const GroupPhaseFn& phase = {});
  // One tensor alone: a group of one.
  void run(uint64_t step, CompressionPipeline& pipeline, const void* grad, void* out) {
    const GroupMember m{&pipeline, grad, out};
    run(step, std::span<const GroupMember>(&m, 1));
  }

  // run() in pieces for a group whose every member is SUM with the same number of rounds (SplitSum above): beginSum
  // encodes round 0 and lays out `split.sums` (InvalidArgument, before any encode, for a member of another kind or
  // another number of rounds); finishSum takes each sum's wire bytes as the caller's collective moved them, and either
  // encodes the next round and lays out its sums (returns true) or, after the last round, decodes (returns false). The
  // fusion is run()'s, so is the count of collectives (one per sum, counted at finishSum).
  //
  // Payload checks: with Settle::kNow (the default) the last round's finishSum reads its checks' verdicts, as run()
  // does: on a device one synchronization a split. With Settle::kLater they stay in the split's words, its decodes
  // queued and nothing waited for, until settleSums reads them -- but for a host's fused decodes from the
  // concatenation, read as they return (the next member's header overwrites their payload). A caller that issues its
  // collectives without waiting (the DDP hook chained on NCCL, whose callbacks run at once on backward's thread)
  // settles a step's splits together at its end, so that backward waits for the device once a step, not once a bucket.
  enum class Settle { kNow, kLater };
  void beginSum(uint64_t step, std::span<const GroupMember> members, SplitSum& split);
  bool finishSum(SplitSum& split, std::span<const comm::WireBytes> wires, Settle settle = Settle::kNow);
  // Reads the verdicts every split in `splits` left pending (finishSum with Settle::kLater): the device words of all
  // of them are stored into mapped host memory and each stream they are on is synchronized once. A raised word is
  // explained as run() explains it (CompressionPipeline::explainRefusal: the plugin's message, or PluginError), for
  // the first such split in `splits`' order; every split's verdicts are read either way. The splits' members' payloads
  // must be as their decodes left them: settle before their pipelines encode again (a DDP bucket's next step).
  void settleSums(std::span<SplitSum* const> splits);

  // Communicator calls issued so far (allreduces, allgathervs and size exchanges), for tests and traces.
  uint64_t collectives() const noexcept { return collectives_; }
  // Bytes of fused SUM bodies copied so far, into the concatenation and back behind a header, for tests.
  uint64_t copiedBodyBytes() const noexcept { return copied_; }

  // SUM members whose summed body (round 0's payload less its header) is `bytes` or more leave their fusion run and
  // are summed alone, in place behind their header: one collective more each, and none of the concatenation's two
  // copies of the body. 0 (the default) fuses every member, as above. A caller that keeps its memory traffic low
  // (the DDP hook, whose gradients are already one bucket) sets it; the trainer does not, so its collectives, and
  // with them its simulated times, stay as they are. The sums are bit-identical to the fused ones at 1 and 2 ranks
  // (see "Bit-identity across groupings").
  void sumInPlaceFrom(uint64_t bytes) noexcept { sum_in_place_from_ = bytes; }

  // Whether decodes leave their payload checks' verdicts in words, read once a run (see "Payload checks" above): on by
  // default; TERSE_DEFER_VERDICTS=0 in the environment turns it off when the engine is made, so that both ways can be
  // compared in one run (experiments/pytorch/bench_ddp_gpu.py's "-sync" rows). Off, every decode is the ordinary
  // call, which on a device synchronizes once a tensor for its verdict.
  void deferVerdicts(bool on) noexcept { defer_ = on; }
  bool defersVerdicts() const noexcept { return defer_; }

 private:
  void checkMembers(std::span<const GroupMember> members) const;
  // Encodes split's current round and lays out its sums.
  void layOutRound(SplitSum& split);
  // finishSum's work, which finishSum wraps so that a failure leaves no words to settle.
  bool finishRound(SplitSum& split, std::span<const comm::WireBytes> wires, Settle settle);
  // The end (exclusive) of the run of members from i that share one collective a round.
  std::size_t nextRun(std::span<const GroupMember> members, std::size_t i) const noexcept;
  void runSum(uint64_t step, std::span<const GroupMember> members, std::size_t first, const GroupPhaseFn& phase);
  // The last round's decode of a SUM run: from each member's payload, or (host, fused) from the concatenation at
  // decode_from, each member's header written in front of its summed body.
  // Decode i's check goes to words.word(first + i). A word raised on the host is explained at once when `read_now`,
  // and always for a decode from the concatenation (decode_from), whose payload the next member's header overwrites;
  // the rest are read by the caller (VerdictWords::settle, settleSums).
  void decodeSummed(uint64_t step, std::span<const GroupMember> members, std::span<const std::span<std::byte>> local,
                    int last, std::byte* decode_from, VerdictWords& words, std::size_t first, bool read_now);
  void runGather(uint64_t step, std::span<const GroupMember> members, std::size_t first, const GroupPhaseFn& phase);
  void runCustom(uint64_t step, const GroupMember& member, std::size_t first, const GroupPhaseFn& phase);
  // Gathers `block` from every rank into recv_, each rank's block in [min_bytes, max_bytes] (exactly max_bytes when
  // `fixed`: no size exchange); sizes_ holds every rank's size afterwards. Returns the wire bytes.
  comm::WireBytes gather(std::span<const std::byte> block, bool fixed, uint64_t min_bytes, uint64_t max_bytes,
                         uint64_t tensor, const Placement& where, bool record);
  // blocks_[0..world) = every rank's block in recv_ after gather().
  void splitByRank();

  // Whether member m sums alone (sumInPlaceFrom).
  bool sumsAlone(const GroupMember& m) const noexcept;
  // Grows send_ for a fused SUM of body_bytes and returns where the concatenation starts: on the host past a headroom
  // that lets the first member's header sit in front of its body (runSum decodes there).
  std::byte* send_start(std::size_t body_bytes, const Placement& where);

  comm::Communicator& comm_;
  VerdictWords verdicts_;
  std::vector<device_kernels::CopySegment> copies_;  // a device run's small copies, batched (engine.cc, addCopy)
  uint64_t collectives_ = 0;
  uint64_t copied_ = 0;
  uint64_t sum_in_place_from_ = 0;
  bool defer_ = true;
  // Whether any member of a run defers its verdicts, with deferral on.
  bool anyDefers(std::span<const GroupMember> members) const noexcept;
  // Whether any member defers its check of the last round's prev, with deferral on (a run of one class: all or none).
  bool anyDefersPrev(std::span<const GroupMember> members) const noexcept;
  // The words a SUM run of k members needs: its decodes', its own decodes', and with checks of prev deferred theirs.
  std::size_t sumWords(std::span<const GroupMember> members) const noexcept {
    return (anyDefersPrev(members) ? 3 : 2) * members.size();
  }
  TensorBuffer send_;            // a fused group's concatenation
  TensorBuffer recv_;            // every rank's gathered block
  std::vector<uint64_t> table_;  // a variable-size fused gather's size table, on the host (device blocks: its staging)
  std::vector<std::span<std::byte>> local_;
  std::vector<uint64_t> sizes_;
  std::vector<std::span<const std::byte>> blocks_;    // per rank, into recv_
  std::vector<std::span<const std::byte>> segments_;  // a fused gather's members' payloads, member-major
  std::vector<PhaseCollective> ran_;                  // the current phase's collectives, when a caller records phases
};

}  // namespace terse

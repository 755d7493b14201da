#include "core/compress/engine.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/common/runtime.h"
#include "core/compress/device_kernels.h"

namespace terse {
namespace {

// The runtime's clock: phases are simulated time in a simulation (core/common/runtime.h).
using Clock = rt::Clock;

// Members of one fusion class share one collective (a round of SUM members: one per round); CUSTOM members and
// multi-round ALLGATHER ones (which the caps contract rules out) run alone.
enum class FusionClass { kAlone, kSum, kGather };

FusionClass fusionClass(const CompressionPipeline& p) {
  if (p.aggregation() == Aggregation::kCustom) return FusionClass::kAlone;
  if (p.aggregation() == Aggregation::kSum) return FusionClass::kSum;
  return p.rounds() == 1 ? FusionClass::kGather : FusionClass::kAlone;
}

// SUM members fuse when each round of theirs can share one allreduce: the same wire dtype and the same number of
// rounds (PowerSGD's tensors of a bucket: its P round and its Q round, each one allreduce for them all, as torch's
// PowerSGD hook batches a bucket's matrices).
bool sameClass(const CompressionPipeline& a, const CompressionPipeline& b) {
  const FusionClass ca = fusionClass(a);
  if (ca == FusionClass::kAlone || ca != fusionClass(b)) return false;
  return ca != FusionClass::kSum || (a.wireDtype() == b.wireDtype() && a.rounds() == b.rounds());
}

// Grows a concatenation buffer in the group's memory (the first member's placement; a group never mixes them). A
// buffer of the other memory is replaced whatever its size (an engine serves one communicator, so in practice the
// placement never changes after the first group).
void grow(TensorBuffer& a, std::size_t bytes, const Placement& where) {
  if (a.size() < bytes || a.onDevice() != where.device) a = TensorBuffer(bytes, where);
}

// A host concatenation starts this far into its buffer, so that the first member's header fits in front of its body
// when it is decoded where it was summed (runSum). A multiple of the buffer's own 64-byte alignment.
constexpr std::size_t kSendHeadroom = 64;
// What the plugin ABI promises of every buffer passed in (terse/compressor_v1.h).
constexpr std::uintptr_t kPayloadAlignment = 16;

}  // namespace

AggregationEngine::AggregationEngine(comm::Communicator& comm) : comm_(comm) {
  if (const char* v = std::getenv("TERSE_DEFER_VERDICTS"); v != nullptr) {
    const std::string value = v;
    TERSE_CHECK(value == "0" || value == "1", InvalidArgument,
                "TERSE_DEFER_VERDICTS must be 0 (every decode waits for its own payload check) or 1 (the default: a "
                "run's checks are read at once), got '"
                    << value << "'");
    defer_ = value == "1";
  }
}

void AggregationEngine::checkMembers(std::span<const GroupMember> members) const {
  // Refused before any collective, so a caller's mistake cannot leave the peers inside one.
  for (std::size_t i = 0; i < members.size(); ++i) {
    const GroupMember& m = members[i];
    TERSE_CHECK(m.pipeline != nullptr, InvalidArgument, "aggregation: member " << i << " has no pipeline");
    TERSE_CHECK((m.out != nullptr && m.grad != nullptr) || m.pipeline->codec().info().numel == 0, InvalidArgument,
                "aggregation: tensor " << m.pipeline->tensorId() << " has a null gradient or output");
  }
}

void AggregationEngine::run(uint64_t step, std::span<const GroupMember> members, const GroupPhaseFn& phase) {
  checkMembers(members);
  std::size_t i = 0;
  while (i < members.size()) {
    const std::size_t j = nextRun(members, i);
    const auto run = members.subspan(i, j - i);
    // runSum loops the rounds of its run (one allreduce a round for all its members); CUSTOM is always alone.
    switch (members[i].pipeline->aggregation()) {
      case Aggregation::kSum:
        runSum(step, run, i, phase);
        break;
      case Aggregation::kAllgather:
        runGather(step, run, i, phase);
        break;
      case Aggregation::kCustom:
        runCustom(step, members[i], i, phase);
        break;
    }
    i = j;
  }
}

bool AggregationEngine::sumsAlone(const GroupMember& m) const noexcept {
  const CompressionPipeline& p = *m.pipeline;
  return sum_in_place_from_ > 0 && p.aggregation() == Aggregation::kSum &&
         p.maxPayloadBytes(0) - p.sumHeaderBytes(0) >= sum_in_place_from_;
}

namespace {

// Round r of every member: local[m] = member m's payload; returns the bytes of their summable bodies (past each
// member's SUM header).
// Member m's own decode (error feedback's) leaves its check in words.ownWord(own_first + m), and its last round's check
// of prev in words.prevWord(prev_first + m) (the pipeline takes it in the last round only): a device's words, or none.
std::size_t encodeRound(uint64_t step, int r, std::span<const GroupMember> members,
                        std::span<std::span<std::byte>> local, const VerdictWords& words, std::size_t own_first,
                        std::size_t prev_first) {
  std::size_t body_bytes = 0;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const bool has_prev = prev_first != VerdictWords::npos && r > 0;
    local[m] = members[m].pipeline->encode(
        step, r, members[m].grad, r == 0 ? std::span<const std::byte>{} : local[m],
        {.own = words.ownWord(own_first + m), .prev = has_prev ? words.prevWord(prev_first + m) : nullptr});
    body_bytes += local[m].size() - static_cast<std::size_t>(members[m].pipeline->sumHeaderBytes(r));
  }
  return body_bytes;
}

// Explains the raised word `bad` (npos: none) of words laid out as [0, k) the members' decodes of `local`, [k, 2k)
// their own decodes (error feedback's), [2k, 3k) their last rounds' checks of prev.
void explainRaised(uint64_t step, std::size_t bad, std::span<const GroupMember> members,
                   std::span<const std::span<std::byte>> local) {
  if (bad == VerdictWords::npos) return;
  const std::size_t k = members.size();
  if (bad < k) members[bad].pipeline->explainRefusal(step, local[bad], -1);
  if (bad < 2 * k) members[bad - k].pipeline->explainOwnRefusal(step);
  members[bad - 2 * k].pipeline->explainPrevRefusal(step);
}

// On a device, copies of at most this many bytes are batched into one launch (device_kernels::copySegments): most of a
// DDP bucket's tensors are small (107 of ResNet-50's 161 hold at most 2,048 elements), and a cudaMemcpyAsync each way
// per tensor cost more in API calls than in bytes. Larger copies keep cudaMemcpyAsync, which moves them at full speed
// (the batch gives a segment one block, so a large one would hold the launch up).
constexpr std::size_t kBatchedCopyBytes = std::size_t{16} << 10;

// Copies between buffers of one placement: on the host at once (memcpy); on a device a small one is added to `batch`,
// which flushCopies() queues, and a large one is queued at once. All stream-ordered before what is queued after the
// flush.
void addCopy(std::vector<device_kernels::CopySegment>& batch, void* dst, const void* src, std::size_t bytes,
             const Placement& where) {
  if (bytes == 0) return;
  if (where.device && bytes <= kBatchedCopyBytes) {
    batch.push_back(device_kernels::CopySegment{src, dst, bytes});
    return;
  }
  copyBytes(dst, src, bytes, where);
}

// Queues the batch and empties it, also when the launch fails, so that no later flush can launch a stale segment.
void flushCopies(std::vector<device_kernels::CopySegment>& batch, const Placement& where) {
  if (batch.empty()) return;
  struct Clear {
    std::vector<device_kernels::CopySegment>& b;
    ~Clear() { b.clear(); }
  } clear{batch};
  device_kernels::copySegments(batch, where.stream);
}

// Each member's round-r body in turn, into the concatenation (to_send) or back behind its header; on a device the small
// ones in one launch. Returns the bytes copied.
uint64_t copyBodies(std::span<const GroupMember> members, std::span<const std::span<std::byte>> local, int r,
                    std::byte* concat, bool to_send, const Placement& where,
                    std::vector<device_kernels::CopySegment>& batch) {
  batch.clear();  // whatever a call that threw before its flush left
  std::size_t off = 0;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const auto header = static_cast<std::size_t>(members[m].pipeline->sumHeaderBytes(r));
    std::byte* body = local[m].data() + header;
    const std::size_t n = local[m].size() - header;
    addCopy(batch, to_send ? concat + off : body, to_send ? body : concat + off, n, where);
    off += n;
  }
  flushCopies(batch, where);
  return off;
}

}  // namespace

void AggregationEngine::runSum(uint64_t step, std::span<const GroupMember> members, std::size_t first,
                               const GroupPhaseFn& phase) {
  CompressionPipeline& lead = *members[0].pipeline;
  const DType wire = lead.wireDtype();
  const Placement& where = lead.placement();
  const std::size_t k = members.size();
  // Every member has the lead's rounds (sameClass); round r's aggregate is round r + 1's prev, member by member.
  const int rounds = lead.rounds();
  comm::WireBytes wire_bytes;
  // Where the fused bodies were summed, when the last round's are decoded there (host); null otherwise.
  std::byte* decode_from = nullptr;
  local_.assign(k, {});
  // Words [0, k): the members' decodes; [k, 2k): their own decodes (error feedback's, on a device); [2k, 3k): their
  // last rounds' checks of prev (on a device), read first.
  const std::size_t n_words = sumWords(members);
  verdicts_.begin(n_words, anyDefers(members) || anyDefersPrev(members), where, 2 * k);
  for (int r = 0; r < rounds; ++r) {
    auto t0 = rt::now();
    const std::size_t body_bytes =
        encodeRound(step, r, members, local_, verdicts_, k, n_words > 2 * k ? 2 * k : VerdictWords::npos);
    if (phase) phase("compress", t0, rt::now(), first, k, {});

    t0 = rt::now();
    ran_.clear();
    const uint64_t summed = k == 1 ? local_[0].size() - static_cast<std::size_t>(lead.sumHeaderBytes(r)) : body_bytes;
    if (k == 1) {
      // Nothing to concatenate: sum in place behind the header.
      wire_bytes +=
          comm_.allreducePayload(local_[0], static_cast<std::size_t>(lead.sumHeaderBytes(r)), wire, lead.tensorId());
    } else {
      std::byte* const concat = send_start(body_bytes, where);
      copied_ += copyBodies(members, local_, r, concat, true, where, copies_);
      wire_bytes += comm_.allreducePayload(std::span<std::byte>(concat, body_bytes), 0, wire, lead.tensorId());
      // The last round's sums are decoded where they lie (below) on the host; an earlier round's are the next round's
      // prev, behind their headers.
      if (r + 1 < rounds || where.device) {
        copied_ += copyBodies(members, local_, r, concat, false, where, copies_);
      } else {
        decode_from = concat;
      }
    }
    ++collectives_;
    if (phase) {
      const auto t1 = rt::now();
      ran_.push_back(PhaseCollective{"allreduce", comm_.allreduceAlgorithmRun(summed), wire, summed, {}, t0, t1});
      phase("allreduce", t0, t1, first, k, ran_);
    }
  }
  lead.addWire(wire_bytes);

  const auto t0 = rt::now();
  decodeSummed(step, members, local_, rounds - 1, decode_from, verdicts_, 0, true);
  // The device's words (and error feedback's own ones) are read here, once for the run; the host's were read as their
  // decodes returned.
  explainRaised(step, verdicts_.settle(), members, local_);
  if (phase) phase("decompress", t0, rt::now(), first, k, {});
}

void VerdictWords::begin(std::size_t n, bool any_defer, const Placement& where, std::size_t first_read) {
  host_ = !where.device;
  stream_ = where.stream;
  first_read_ = first_read;
  // Pending only once the words exist and are zeroed: a failed allocation leaves nothing to read.
  n_ = 0;
  words_ = nullptr;
  if (!any_defer || n == 0) return;
  if (host_) {
    host_words_.assign(n, 0);
    words_ = host_words_.data();
    n_ = n;
    return;
  }
  // Grown to the largest run seen, so the steady state allocates nothing. Zeroed on the stream: after any kernel an
  // earlier run (one that threw before its settle) still has queued there.
  const std::size_t words = std::min(device_words_.size() / sizeof(uint32_t), mapped_.size());
  if (words < n) {
    // Both made before either is replaced, so that a failed allocation leaves the pair as it was, of one size.
    const std::size_t grown = std::max(n, 2 * words);
    cuda::DeviceArray device(grown * sizeof(uint32_t), stream_);
    cuda::MappedWords mapped(grown);
    device_words_ = std::move(device);
    mapped_ = std::move(mapped);
  }
  words_ = reinterpret_cast<uint32_t*>(device_words_.data());
  cuda::zeroAsync(words_, n * sizeof(uint32_t), stream_);
  n_ = n;
}

void VerdictWords::queueRead() {
  if (n_ != 0 && !host_) device_kernels::copyWords(words_, mapped_.device(), n_, stream_);
}

std::size_t VerdictWords::firstRaised() {
  const std::size_t n = std::exchange(n_, 0);  // read once (see the header)
  const uint32_t* words = host_ ? words_ : mapped_.host();
  const std::size_t from = std::min(first_read_, n);
  for (std::size_t i = from; i < n; ++i) {
    if (words[i] != 0) return i;
  }
  for (std::size_t i = 0; i < from; ++i) {
    if (words[i] != 0) return i;
  }
  return npos;
}

std::size_t VerdictWords::settle() {
  if (n_ == 0) return npos;
  queueRead();
  if (!host_) cuda::synchronize(stream_);
  return firstRaised();
}

bool AggregationEngine::anyDefers(std::span<const GroupMember> members) const noexcept {
  if (!defer_) return false;
  for (const GroupMember& m : members) {
    if (m.pipeline->defersVerdicts()) return true;
  }
  return false;
}

bool AggregationEngine::anyDefersPrev(std::span<const GroupMember> members) const noexcept {
  if (!defer_) return false;
  for (const GroupMember& m : members) {
    if (m.pipeline->defersPrevVerdicts()) return true;
  }
  return false;
}

void AggregationEngine::decodeSummed(uint64_t step, std::span<const GroupMember> members,
                                     std::span<const std::span<std::byte>> local, int last, std::byte* decode_from,
                                     VerdictWords& words, std::size_t first, bool read_now) {
  const std::size_t k = members.size();
  if (decode_from == nullptr) {
    for (std::size_t m = 0; m < k; ++m) {
      members[m].pipeline->finishAggregate(step, local[m], members[m].out, words.word(first + m));
      if (read_now && words.raisedNow(first + m)) members[m].pipeline->explainRefusal(step, local[m], -1);
    }
    return;
  }
  // Decoded from the concatenation, in member order: member m's header (identical on every rank, so its own copy in
  // its payload buffer is the aggregate's) is written in front of its summed body, over the tail of members before
  // it that are decoded already, so each payload reads [header | summed body] without the body's copy back. A member
  // whose payload would not start at the ABI's 16-byte alignment there, or whose header does not fit in front of
  // the concatenation, has its body copied back behind its header as before. Plugins read payloads and never write
  // them (terse/compressor_v1.h), so nothing else moves.
  std::size_t off = 0;
  for (std::size_t m = 0; m < k; ++m) {
    const auto header = static_cast<std::size_t>(members[m].pipeline->sumHeaderBytes(last));
    const std::size_t n = local[m].size() - header;
    std::byte* const at = header <= off + kSendHeadroom ? decode_from + off - header : nullptr;
    std::span<const std::byte> payload = local[m];
    if (at != nullptr && reinterpret_cast<std::uintptr_t>(at) % kPayloadAlignment == 0) {
      std::memcpy(at, local[m].data(), header);
      payload = std::span<const std::byte>(at, header + n);
    } else {
      std::memcpy(local[m].data() + header, decode_from + off, n);
      copied_ += n;
    }
    members[m].pipeline->finishAggregate(step, payload, members[m].out, words.word(first + m));
    // Read now, on the host (decode_from is host memory): the next member's header goes over this payload's tail.
    if (words.raisedNow(first + m)) members[m].pipeline->explainRefusal(step, payload, -1);
    off += n;
  }
  // Every word of these decodes was read above, and own decodes leave none on the host: a word raised since could not
  // be explained (its payload is overwritten), so it is a fault of the engine's, not a refusal.
  for (std::size_t m = 0; m < k; ++m) {
    TERSE_CHECK(!words.raisedNow(first + m), InternalError,
                "aggregation: a payload check's word was raised after the host's in-place decode had read it");
  }
}

std::size_t AggregationEngine::nextRun(std::span<const GroupMember> members, std::size_t i) const noexcept {
  std::size_t j = i + 1;
  if (!sumsAlone(members[i])) {
    while (j < members.size() && sameClass(*members[i].pipeline, *members[j].pipeline) && !sumsAlone(members[j])) ++j;
  }
  return j;
}

void AggregationEngine::beginSum(uint64_t step, std::span<const GroupMember> members, SplitSum& split) {
  checkMembers(members);
  split.sums.clear();
  split.step_ = step;
  split.round_ = 0;
  split.rounds_ = members.empty() ? 1 : members[0].pipeline->rounds();
  split.members_.assign(members.begin(), members.end());
  split.local_.assign(members.size(), {});
  // Every member is checked before any is encoded: a refusal leaves no pipeline half-run.
  for (const GroupMember& m : members) {
    TERSE_CHECK(m.pipeline->aggregation() == Aggregation::kSum, InvalidArgument,
                "aggregation: tensor " << m.pipeline->tensorId() << " (" << aggregationName(m.pipeline->aggregation())
                                       << ") cannot be split around its collectives: only SUM can");
    TERSE_CHECK(m.pipeline->rounds() == split.rounds_, InvalidArgument,
                "aggregation: tensor " << m.pipeline->tensorId() << " has " << m.pipeline->rounds()
                                       << " rounds and the group's first " << split.rounds_
                                       << ": a split group advances all its members round by round together");
  }
  std::size_t i = 0, q = 0;
  while (i < members.size()) {
    const std::size_t j = nextRun(members, i);
    if (q == split.runs_.size()) split.runs_.emplace_back();
    SplitSum::Run& r = split.runs_[q++];
    r.first = i;
    r.count = j - i;
    i = j;
  }
  split.runs_.resize(q);
  // Words [0, k) for the last round's decodes, [k, 2k) for the own decodes of every round's encodes (a device's),
  // [2k, 3k) for the last round's checks of prev (a device's), read first.
  const std::size_t k = members.size();
  split.prev_words_ = anyDefersPrev(members);
  split.verdicts_.begin(sumWords(members), anyDefers(members) || split.prev_words_,
                        members.empty() ? Placement{} : members[0].pipeline->placement(), 2 * k);
  try {
    layOutRound(split);
  } catch (...) {
    split.verdicts_.discard();  // nothing was decoded: nothing to settle
    throw;
  }
}

void AggregationEngine::layOutRound(SplitSum& split) {
  const int round = split.round_;
  split.sums.clear();
  for (SplitSum::Run& r : split.runs_) {
    const auto run = std::span<const GroupMember>(split.members_).subspan(r.first, r.count);
    auto local = std::span<std::span<std::byte>>(split.local_).subspan(r.first, r.count);
    CompressionPipeline& lead = *run[0].pipeline;
    const Placement& where = lead.placement();
    // Round r + 1's prev is round r's aggregate, in each member's payload buffer (runSum's order).
    const std::size_t k = split.members_.size();
    const std::size_t body_bytes = encodeRound(split.step_, round, run, local, split.verdicts_, k + r.first,
                                               split.prev_words_ ? 2 * k + r.first : VerdictWords::npos);
    r.decode_from = nullptr;
    if (run.size() == 1) {
      split.sums.push_back(SplitSum::Sum{local[0].subspan(static_cast<std::size_t>(lead.sumHeaderBytes(round))),
                                         lead.wireDtype(), lead.tensorId()});
    } else {
      // A concatenation of the split's own, so that splits in flight at once do not share one; kept for its next
      // call (a DDP bucket's next step), so that the steady state allocates nothing.
      const std::size_t room = where.device ? 0 : kSendHeadroom;
      grow(r.concat, room + body_bytes, where);
      std::byte* const concat = r.concat.data() + room;
      copied_ += copyBodies(run, local, round, concat, true, where, copies_);
      // The last round's sums are decoded where they lie on the host (decodeSummed); an earlier round's go back
      // behind their headers as the next round's prev.
      if (round + 1 == split.rounds_ && !where.device) r.decode_from = concat;
      split.sums.push_back(SplitSum::Sum{std::span<std::byte>(concat, body_bytes), lead.wireDtype(), lead.tensorId()});
    }
  }
}

bool AggregationEngine::finishSum(SplitSum& split, std::span<const comm::WireBytes> wires, Settle settle) {
  TERSE_CHECK(wires.size() == split.sums.size(), InvalidArgument,
              "aggregation: " << wires.size() << " collectives' bytes for a split sum of " << split.sums.size());
  try {
    return finishRound(split, wires, settle);
  } catch (...) {
    split.verdicts_.discard();  // the split failed here: nothing of it is left to settle
    throw;
  }
}

bool AggregationEngine::finishRound(SplitSum& split, std::span<const comm::WireBytes> wires, Settle settle) {
  const int round = split.round_;
  const bool last = round + 1 == split.rounds_;
  for (std::size_t s = 0; s < split.sums.size(); ++s) {
    SplitSum::Run& r = split.runs_[s];
    const auto run = std::span<const GroupMember>(split.members_).subspan(r.first, r.count);
    const auto local = std::span<const std::span<std::byte>>(split.local_).subspan(r.first, r.count);
    run[0].pipeline->addWire(wires[s]);
    ++collectives_;
    // Each summed body back behind its header: an earlier round's (the next one's prev) and, on the device, the last.
    if (r.count > 1 && r.decode_from == nullptr)
      copied_ += copyBodies(run, local, round, split.sums[s].data.data(), false, run[0].pipeline->placement(), copies_);
    if (last) {
      decodeSummed(split.step_, run, local, round, r.decode_from, split.verdicts_, r.first, settle == Settle::kNow);
    }
  }
  if (last) {
    split.sums.clear();
    if (settle == Settle::kNow) explainRaised(split.step_, split.verdicts_.settle(), split.members_, split.local_);
    return false;
  }
  ++split.round_;
  layOutRound(split);
  return true;
}

void AggregationEngine::settleSums(std::span<SplitSum* const> splits) {
  std::vector<void*> streams;
  try {
    for (SplitSum* split : splits) {
      if (!split->verdicts_.pending()) continue;
      split->verdicts_.queueRead();
      if (!split->verdicts_.host() &&
          std::find(streams.begin(), streams.end(), split->verdicts_.stream()) == streams.end())
        streams.push_back(split->verdicts_.stream());
    }
    for (void* stream : streams) cuda::synchronize(stream);
  } catch (...) {
    // The device failed under them (a launch, a synchronization): their words cannot be read, and are given up with
    // the step this error fails.
    for (SplitSum* split : splits) split->verdicts_.discard();
    throw;
  }
  // Every split's words are read before the first raised one is explained (which throws).
  SplitSum* bad_split = nullptr;
  std::size_t bad = VerdictWords::npos;
  for (SplitSum* split : splits) {
    if (!split->verdicts_.pending()) continue;
    const std::size_t raised = split->verdicts_.firstRaised();
    if (bad_split == nullptr && raised != VerdictWords::npos) {
      bad_split = split;
      bad = raised;
    }
  }
  if (bad_split != nullptr) explainRaised(bad_split->step_, bad, bad_split->members_, bad_split->local_);
}

std::byte* AggregationEngine::send_start(std::size_t body_bytes, const Placement& where) {
  const std::size_t room = where.device ? 0 : kSendHeadroom;
  grow(send_, room + body_bytes, where);
  return send_.data() + room;
}

comm::WireBytes AggregationEngine::gather(std::span<const std::byte> block, bool fixed, uint64_t min_bytes,
                                          uint64_t max_bytes, uint64_t tensor, const Placement& where, bool record) {
  const int world = comm_.size();
  comm::WireBytes wire_bytes;
  sizes_.assign(static_cast<std::size_t>(world), max_bytes);
  ran_.clear();
  auto t0 = record ? rt::now() : Clock::time_point{};
  // A fixed-size block is exactly max_bytes on every rank, so no size exchange is needed: each member's payload was
  // held to its max_output_bytes by the compressor's bound call (core/plugin/compressor_plugin.cc), checked there once.
  if (!fixed) {
    wire_bytes += comm_.allgatherSizes(block.size(), sizes_, tensor);
    ++collectives_;
    if (record) {
      const auto t1 = rt::now();
      const uint64_t words = 8 * static_cast<uint64_t>(world);
      ran_.push_back(PhaseCollective{"allgather_sizes", comm_.allgatherAlgorithmRun(words), DType::kU8, 8, {}, t0, t1});
      t0 = t1;
    }
    for (int r = 0; r < world; ++r) {
      // A peer's size is untrusted: it must fit the slot every rank reserved for it.
      const uint64_t s = sizes_[static_cast<std::size_t>(r)];
      TERSE_CHECK(s >= min_bytes && s <= max_bytes, InvalidPayload,
                  "aggregation, tensor " << tensor << " (allgather): rank " << r << " announced " << s
                                         << " bytes, outside [" << min_bytes << ", " << max_bytes << "]");
    }
  }
  uint64_t total = 0;
  for (uint64_t s : sizes_) total += s;
  grow(recv_, static_cast<std::size_t>(total), where);
  wire_bytes += comm_.allgatherv(block, recv_.span().first(static_cast<std::size_t>(total)), sizes_, tensor);
  ++collectives_;
  if (record)
    ran_.push_back(PhaseCollective{"allgatherv", comm_.allgatherAlgorithmRun(total), DType::kU8, block.size(), sizes_,
                                   t0, rt::now()});
  return wire_bytes;
}

void AggregationEngine::splitByRank() {
  blocks_.clear();
  std::size_t off = 0;
  for (uint64_t s : sizes_) {
    blocks_.emplace_back(recv_.data() + off, static_cast<std::size_t>(s));
    off += static_cast<std::size_t>(s);
  }
}

void AggregationEngine::runCustom(uint64_t step, const GroupMember& member, std::size_t first,
                                  const GroupPhaseFn& phase) {
  CompressionPipeline& p = *member.pipeline;
  std::span<const std::byte> aggregate;
  comm::WireBytes wire_bytes;
  // Word 0: the aggregate's decode; word 1: the own decode (error feedback's, on a device).
  verdicts_.begin(2, defer_ && p.defersVerdicts(), p.placement());
  for (int r = 0; r < p.rounds(); ++r) {
    auto t0 = rt::now();
    const std::span<const std::byte> local = p.encode(step, r, member.grad, aggregate, {.own = verdicts_.ownWord(1)});
    if (phase) phase("compress", t0, rt::now(), first, 1, {});
    t0 = rt::now();
    wire_bytes += gather(local, p.fixedSize(), 0, p.maxPayloadBytes(r), p.tensorId(), p.placement(), bool(phase));
    if (phase) phase("allgatherv", t0, rt::now(), first, 1, ran_);
    t0 = rt::now();
    splitByRank();
    aggregate = p.fold(step, r, blocks_);
    if (phase) phase("decompress", t0, rt::now(), first, 1, {});
  }
  p.addWire(wire_bytes);
  const auto t0 = rt::now();
  p.finishAggregate(step, aggregate, member.out, verdicts_.word(0));
  const std::size_t bad = verdicts_.settle();
  if (bad == 0) p.explainRefusal(step, aggregate, -1);
  if (bad == 1) p.explainOwnRefusal(step);
  if (phase) phase("decompress", t0, rt::now(), first, 1, {});
}

void AggregationEngine::runGather(uint64_t step, std::span<const GroupMember> members, std::size_t first,
                                  const GroupPhaseFn& phase) {
  const int world = comm_.size();
  const std::size_t k = members.size();
  CompressionPipeline& lead = *members[0].pipeline;
  const Placement& where = lead.placement();
  bool fixed = true;
  std::size_t max_block = 0;
  for (const GroupMember& m : members) {
    fixed = fixed && m.pipeline->fixedSize();
    max_block += static_cast<std::size_t>(m.pipeline->maxPayloadBytes(0));
  }
  // Several variable-size members need their sizes on the receiving side: a table of k 64-bit sizes leads the block.
  // A member alone needs none: its block is its payload.
  const std::size_t table = fixed || k == 1 ? 0 : k * sizeof(uint64_t);
  max_block += table;

  // Words [0, k * world): member i's decode of rank r's payload at i * world + r; [k * world, k * world + k): the
  // members' own decodes (error feedback's, on a device).
  const auto w = static_cast<std::size_t>(world);
  verdicts_.begin(k * w + k, anyDefers(members), where);
  auto t0 = rt::now();
  std::span<const std::byte> block;
  if (k == 1) {
    block = lead.encode(step, 0, members[0].grad, {}, {.own = verdicts_.ownWord(w)});
  } else {
    grow(send_, max_block, where);
    table_.assign(table / sizeof(uint64_t), 0);
    copies_.clear();  // whatever a call that threw before its flush left: an encode below may throw too
    std::size_t at = table;
    for (std::size_t i = 0; i < k; ++i) {
      const auto payload =
          members[i].pipeline->encode(step, 0, members[i].grad, {}, {.own = verdicts_.ownWord(k * w + i)});
      if (table > 0) table_[i] = payload.size();
      // Each member's own payload buffer keeps its bytes until its next encode, so the small copies may wait for the
      // batch (engine.cc, addCopy).
      addCopy(copies_, send_.data() + at, payload.data(), payload.size(), where);
      at += payload.size();
    }
    flushCopies(copies_, where);
    // From pageable host memory a stream-ordered copy returns once the driver has staged the source, so table_ may be
    // reused right after.
    copyBytes(send_.data(), table_.data(), table, where);
    block = send_.span().first(at);
  }
  if (phase) phase("compress", t0, rt::now(), first, k, {});

  t0 = rt::now();
  lead.addWire(gather(block, fixed, table, max_block, lead.tensorId(), where, bool(phase)));
  if (phase) phase("allgatherv", t0, rt::now(), first, k, ran_);

  t0 = rt::now();
  splitByRank();
  if (k == 1) {
    lead.finishGathered(step, blocks_, members[0].out, verdicts_.word(0));
    const std::size_t bad = verdicts_.settle();
    if (bad != VerdictWords::npos && bad < w) lead.explainRefusal(step, blocks_[bad], static_cast<int>(bad));
    if (bad != VerdictWords::npos) lead.explainOwnRefusal(step);
    if (phase) phase("decompress", t0, rt::now(), first, k, {});
    return;
  }
  if (table > 0) {
    // Every rank's size table, read where the host can see it: on the device, one copy per rank, then one wait.
    table_.assign(k * static_cast<std::size_t>(world), 0);
    for (int r = 0; r < world; ++r)
      copyBytes(table_.data() + static_cast<std::size_t>(r) * k, blocks_[static_cast<std::size_t>(r)].data(), table,
                where);
    if (where.device) cuda::synchronize(where.stream);
  }
  // members' payloads: segments_[i * world + r] = rank r's payload of member i.
  std::vector<std::span<const std::byte>>& segments = segments_;
  segments.assign(k * static_cast<std::size_t>(world), {});
  for (int r = 0; r < world; ++r) {
    const std::span<const std::byte> rank_block = blocks_[static_cast<std::size_t>(r)];
    std::size_t off = table;
    for (std::size_t i = 0; i < k; ++i) {
      const uint64_t bound = members[i].pipeline->maxPayloadBytes(0);
      const uint64_t n = table > 0 ? table_[static_cast<std::size_t>(r) * k + i] : bound;
      TERSE_CHECK(n <= bound && n <= rank_block.size() - off, InvalidPayload,
                  "fused allgather: rank " << r << "'s table gives member " << i << " " << n
                                           << " bytes, beyond its bound or its block of " << rank_block.size());
      segments[i * static_cast<std::size_t>(world) + static_cast<std::size_t>(r)] =
          rank_block.subspan(off, static_cast<std::size_t>(n));
      off += static_cast<std::size_t>(n);
    }
    TERSE_CHECK(off == rank_block.size(), InvalidPayload,
                "fused allgather: rank " << r << "'s block has " << rank_block.size()
                                         << " bytes, its table accounts for " << off);
  }
  for (std::size_t i = 0; i < k; ++i) {
    members[i].pipeline->finishGathered(step, std::span<const std::span<const std::byte>>(segments).subspan(i * w, w),
                                        members[i].out, verdicts_.word(i * w));
  }
  const std::size_t bad = verdicts_.settle();
  if (bad != VerdictWords::npos && bad < k * w) {
    members[bad / w].pipeline->explainRefusal(step, segments[bad], static_cast<int>(bad % w));
  }
  if (bad != VerdictWords::npos) members[bad - k * w].pipeline->explainOwnRefusal(step);
  if (phase) phase("decompress", t0, rt::now(), first, k, {});
}

}  // namespace terse

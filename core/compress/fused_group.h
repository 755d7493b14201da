// One scheduler group (scheduler_v1.h: "The group is fused into one collective") run over the communicator: tensor
// fusion at the wire level as DDP buckets and Horovod's fusion buffer do it (Li et al. 2020, "PyTorch Distributed";
// Sergeev and Del Balso 2018, "Horovod"), with compression kept per chunk so the math does not change:
//
//   SUM (single round, same wire dtype):  each member encodes its chunk; the summable bodies (payload bytes after the
//       compressor's sum_header_bytes) are concatenated into one buffer and summed by ONE allreduce -- the sum of a
//       concatenation is the concatenation of the sums -- then copied back behind each member's own header and decoded
//       per member. Headers are identical on every rank by the SUM contract, so they need not travel.
//   ALLGATHER (single round):  each rank's block is its members' payloads concatenated, preceded by a table of their
//       byte sizes when the compressor's size varies; ONE allgatherv moves every rank's block (after one size exchange
//       when sizes vary), and each member decodes its segment of every rank's block, in rank order, exactly as the
//       unfused pipeline does.
//   anything else (CUSTOM reduce, multi-round compressors such as PowerSGD):  the member runs alone through
//       CompressionPipeline::step -- their aggregate is not a plain concatenation.
//
// Members are taken in the group's order; a run of consecutive members of one fusion class (SUM with a given wire
// dtype, or ALLGATHER) forms one collective. Every rank fuses the same way because every rank gets the same group from
// its scheduler and the same caps from its compressor.
//
// Device tensors (a communicator on device memory, pipelines on its stream): the same steps, with the concatenation
// copies stream-ordered on that stream and the variable-size table built on the host, copied into the block, and read
// back from every rank's block after the gather (one small copy and one synchronization per fused gather).
//
// Bit-identity across groupings: ALLGATHER decoding is per rank in rank order whatever the grouping, so it is exactly
// the unfused result. A SUM through the ring allreduce sums each element in an order that depends on where it falls
// in the message (allreduce_ring.h: chunk c is summed starting at rank c), so at 3 or more ranks a different cut can
// change the last bit of a sum; with 1 or 2 ranks (a + b == b + a) or the recursive-doubling allreduce (every element
// summed in the same tree) the result is bit-identical for any grouping.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compress/pipeline.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

struct FusedMember {
  CompressionPipeline* pipeline = nullptr;
  const void* grad = nullptr;  // the chunk's gradient (pipeline's numel elements)
  void* out = nullptr;         // the averaged result; may equal grad
};

// Phases of a group for a timeline: "compress", "allreduce", "allgatherv", "decompress", "pipeline" (an unfused
// member's whole step); `members` is how many members the phase covers.
using GroupPhaseFn =
    std::function<void(const char* phase, std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end, std::size_t first_member, std::size_t members)>;

class FusedGroupRunner {
 public:
  explicit FusedGroupRunner(comm::Communicator& comm) : comm_(comm) {}

  // Runs one group as described above. Throws what the pipelines and the communicator throw, and InvalidPayload for a
  // peer's size table that does not add up. Buffers grow to the largest group seen, then are reused.
  void run(uint64_t step, std::span<const FusedMember> members, const GroupPhaseFn& phase = {});

  // Collectives issued so far (one per fused run, plus the size exchanges), for tests and traces.
  uint64_t collectives() const noexcept { return collectives_; }

 private:
  void runSum(uint64_t step, std::span<const FusedMember> members, std::size_t first, const GroupPhaseFn& phase);
  void runGather(uint64_t step, std::span<const FusedMember> members, std::size_t first, const GroupPhaseFn& phase);
  // Grows a concatenation buffer in the group's memory (the first member's placement; a group never mixes them).
  void grow(TensorBuffer& a, std::size_t bytes, const Placement& where);

  comm::Communicator& comm_;
  uint64_t collectives_ = 0;
  TensorBuffer send_;
  TensorBuffer recv_;
  std::vector<uint64_t> table_;  // a variable-size gather's size table, on the host (device blocks: its staging)
  std::vector<std::span<std::byte>> local_;
  std::vector<uint64_t> sizes_;
  std::vector<std::span<const std::byte>> blocks_;
};

}  // namespace terse

#include "core/compress/fused_group.h"

#include <cstring>
#include <string>

#include "core/common/device_memory.h"
#include "core/common/error.h"

namespace terse {
namespace {

using Clock = std::chrono::steady_clock;

// Members of one fusion class share one collective.
enum class FusionClass { kAlone, kSum, kGather };

FusionClass fusionClass(const CompressionPipeline& p) {
  if (!p.fusible()) return FusionClass::kAlone;
  return p.aggregation() == Aggregation::kSum ? FusionClass::kSum : FusionClass::kGather;
}

bool sameClass(const CompressionPipeline& a, const CompressionPipeline& b) {
  const FusionClass ca = fusionClass(a);
  if (ca == FusionClass::kAlone || ca != fusionClass(b)) return false;
  if (ca == FusionClass::kSum) return a.codec().caps().wire_dtype == b.codec().caps().wire_dtype;
  return true;
}

}  // namespace

void FusedGroupRunner::grow(TensorBuffer& a, std::size_t bytes, const Placement& where) {
  // A buffer of the other memory is replaced whatever its size (a runner serves one communicator, so in practice the
  // placement never changes after the first group).
  if (a.size() < bytes || a.onDevice() != where.device) a = TensorBuffer(bytes, where);
}

void FusedGroupRunner::run(uint64_t step, std::span<const FusedMember> members, const GroupPhaseFn& phase) {
  std::size_t i = 0;
  while (i < members.size()) {
    TERSE_CHECK(members[i].pipeline != nullptr, InvalidArgument, "fused group: member " << i << " has no pipeline");
    std::size_t j = i + 1;
    while (j < members.size() && members[j].pipeline != nullptr &&
           sameClass(*members[i].pipeline, *members[j].pipeline))
      ++j;
    const auto run = members.subspan(i, j - i);
    switch (fusionClass(*members[i].pipeline)) {
      case FusionClass::kAlone: {
        const auto t0 = Clock::now();
        members[i].pipeline->step(step, members[i].grad, members[i].out);
        ++collectives_;
        if (phase) phase("pipeline", t0, Clock::now(), i, 1);
        j = i + 1;
        break;
      }
      case FusionClass::kSum:
        runSum(step, run, i, phase);
        break;
      case FusionClass::kGather:
        runGather(step, run, i, phase);
        break;
    }
    i = j;
  }
}

void FusedGroupRunner::runSum(uint64_t step, std::span<const FusedMember> members, std::size_t first,
                              const GroupPhaseFn& phase) {
  const DType wire = members[0].pipeline->codec().caps().wire_dtype;
  const Placement& where = members[0].pipeline->placement();
  auto t0 = Clock::now();
  local_.clear();
  std::size_t body_bytes = 0;
  for (const FusedMember& m : members) {
    local_.push_back(m.pipeline->encodeForFusion(step, m.grad));
    body_bytes += local_.back().size() - static_cast<std::size_t>(m.pipeline->codec().sizes(0).sum_header_bytes);
  }
  if (phase) phase("compress", t0, Clock::now(), first, members.size());

  t0 = Clock::now();
  comm::WireBytes wire_bytes;
  if (members.size() == 1) {
    // Nothing to concatenate: sum in place behind the header, exactly as the unfused pipeline does.
    const auto header = static_cast<std::size_t>(members[0].pipeline->codec().sizes(0).sum_header_bytes);
    wire_bytes = comm_.allreducePayload(local_[0], header, wire, members[0].pipeline->codec().info().tensor_id);
  } else {
    grow(send_, body_bytes, where);
    std::size_t off = 0;
    for (std::size_t k = 0; k < members.size(); ++k) {
      const auto header = static_cast<std::size_t>(members[k].pipeline->codec().sizes(0).sum_header_bytes);
      const std::size_t n = local_[k].size() - header;
      copyBytes(send_.data() + off, local_[k].data() + header, n, where);
      off += n;
    }
    wire_bytes =
        comm_.allreducePayload(send_.span().first(body_bytes), 0, wire, members[0].pipeline->codec().info().tensor_id);
    off = 0;
    for (std::size_t k = 0; k < members.size(); ++k) {
      const auto header = static_cast<std::size_t>(members[k].pipeline->codec().sizes(0).sum_header_bytes);
      const std::size_t n = local_[k].size() - header;
      copyBytes(local_[k].data() + header, send_.data() + off, n, where);
      off += n;
    }
  }
  ++collectives_;
  members[0].pipeline->addWire(wire_bytes);
  if (phase) phase("allreduce", t0, Clock::now(), first, members.size());

  t0 = Clock::now();
  for (const FusedMember& m : members) m.pipeline->finishSum(step, m.out);
  if (phase) phase("decompress", t0, Clock::now(), first, members.size());
}

void FusedGroupRunner::runGather(uint64_t step, std::span<const FusedMember> members, std::size_t first,
                                 const GroupPhaseFn& phase) {
  const int world = comm_.size();
  const std::size_t k = members.size();
  const Placement& where = members[0].pipeline->placement();
  bool fixed = true;
  std::size_t max_block = 0;
  for (const FusedMember& m : members) {
    fixed = fixed && m.pipeline->codec().caps().fixed_size;
    max_block += static_cast<std::size_t>(m.pipeline->codec().sizes(0).max_output_bytes);
  }
  // A variable-size member needs the per-member sizes on the receiving side: a table of k 64-bit sizes leads the block.
  const std::size_t table = fixed ? 0 : k * sizeof(uint64_t);
  max_block += table;

  auto t0 = Clock::now();
  local_.clear();
  grow(send_, max_block, where);
  table_.assign(fixed ? 0 : k, 0);
  std::size_t block = table;
  for (std::size_t i = 0; i < k; ++i) {
    const auto payload = members[i].pipeline->encodeForFusion(step, members[i].grad);
    if (!fixed) table_[i] = payload.size();
    copyBytes(send_.data() + block, payload.data(), payload.size(), where);
    block += payload.size();
  }
  // From pageable host memory a stream-ordered copy returns once the driver has staged the source, so table_ may be
  // reused right after.
  copyBytes(send_.data(), table_.data(), table, where);
  if (phase) phase("compress", t0, Clock::now(), first, k);

  t0 = Clock::now();
  const uint64_t tensor = members[0].pipeline->codec().info().tensor_id;
  comm::WireBytes wire_bytes;
  sizes_.assign(static_cast<std::size_t>(world), max_block);
  if (!fixed) {
    wire_bytes += comm_.allgatherSizes(block, sizes_, tensor);
    ++collectives_;
    for (int r = 0; r < world; ++r) {
      // A peer's size is untrusted: it must fit the slot every rank reserved for it.
      TERSE_CHECK(sizes_[static_cast<std::size_t>(r)] >= table && sizes_[static_cast<std::size_t>(r)] <= max_block,
                  InvalidPayload,
                  "fused allgather: rank " << r << " announced a block of " << sizes_[static_cast<std::size_t>(r)]
                                           << " bytes, outside [" << table << ", " << max_block << "]");
    }
  } else {
    TERSE_CHECK(block == max_block, InternalError,
                "fused allgather: fixed-size block of " << block << " != " << max_block);
  }
  uint64_t total = 0;
  for (uint64_t s : sizes_) total += s;
  grow(recv_, static_cast<std::size_t>(total), where);
  wire_bytes +=
      comm_.allgatherv(send_.span().first(block), recv_.span().first(static_cast<std::size_t>(total)), sizes_, tensor);
  ++collectives_;
  members[0].pipeline->addWire(wire_bytes);
  if (phase) phase("allgatherv", t0, Clock::now(), first, k);

  t0 = Clock::now();
  // blocks_[i * world + r] = rank r's payload of member i.
  blocks_.assign(k * static_cast<std::size_t>(world), {});
  if (!fixed) {
    // Every rank's size table, read where the host can see it: on the device, one copy per rank, then one wait.
    table_.assign(k * static_cast<std::size_t>(world), 0);
    std::size_t at = 0;
    for (int r = 0; r < world; ++r) {
      copyBytes(table_.data() + static_cast<std::size_t>(r) * k, recv_.data() + at, table, where);
      at += static_cast<std::size_t>(sizes_[static_cast<std::size_t>(r)]);
    }
    if (where.device) cuda::synchronize(where.stream);
  }
  std::size_t rank_off = 0;
  for (int r = 0; r < world; ++r) {
    const std::size_t rank_bytes = static_cast<std::size_t>(sizes_[static_cast<std::size_t>(r)]);
    const std::byte* base = recv_.data() + rank_off;
    std::size_t off = table;
    for (std::size_t i = 0; i < k; ++i) {
      uint64_t n = members[i].pipeline->codec().sizes(0).max_output_bytes;
      if (!fixed) n = table_[static_cast<std::size_t>(r) * k + i];
      TERSE_CHECK(n <= members[i].pipeline->codec().sizes(0).max_output_bytes && n <= rank_bytes - off, InvalidPayload,
                  "fused allgather: rank " << r << "'s table gives member " << i << " " << n
                                           << " bytes, beyond its bound or its block of " << rank_bytes);
      blocks_[i * static_cast<std::size_t>(world) + static_cast<std::size_t>(r)] =
          std::span<const std::byte>(base + off, static_cast<std::size_t>(n));
      off += static_cast<std::size_t>(n);
    }
    TERSE_CHECK(
        off == rank_bytes, InvalidPayload,
        "fused allgather: rank " << r << "'s block has " << rank_bytes << " bytes, its table accounts for " << off);
    rank_off += rank_bytes;
  }
  for (std::size_t i = 0; i < k; ++i) {
    members[i].pipeline->finishGathered(step,
                                        std::span<const std::span<const std::byte>>(blocks_).subspan(
                                            i * static_cast<std::size_t>(world), static_cast<std::size_t>(world)),
                                        members[i].out);
  }
  if (phase) phase("decompress", t0, Clock::now(), first, k);
}

}  // namespace terse

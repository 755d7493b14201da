#include "core/comm/host_communicator.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "core/comm/allgather_auto.h"
#include "core/comm/allgather_bruck.h"
#include "core/comm/allgatherv_hierarchical.h"
#include "core/comm/allgatherv_ring.h"
#include "core/comm/allreduce_auto.h"
#include "core/comm/allreduce_halving_doubling.h"
#include "core/comm/allreduce_hierarchical.h"
#include "core/comm/allreduce_recursive_doubling.h"
#include "core/comm/allreduce_reduce_broadcast.h"
#include "core/comm/allreduce_ring.h"
#include "core/comm/allreduce_tree.h"
#include "core/comm/barrier_dissemination.h"
#include "core/comm/broadcast_binomial.h"
#include "core/comm/reduce.h"
#include "core/common/error.h"

namespace terse::comm {

std::string_view allreduceAlgorithmName(AllreduceAlgorithm a) noexcept {
  switch (a) {
    case AllreduceAlgorithm::kAuto:
      return "auto";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kRecursiveDoubling:
      return "rd";
    case AllreduceAlgorithm::kHierarchical:
      return "hierarchical";
    case AllreduceAlgorithm::kTree:
      return "tree";
    case AllreduceAlgorithm::kHalvingDoubling:
      return "hd";
    case AllreduceAlgorithm::kReduceBroadcast:
      return "reduce_broadcast";
  }
  return "?";
}

std::string_view allreduceAlgorithmChoices() noexcept {
  return "ring, rd, hd, tree, reduce_broadcast, hierarchical or auto";
}

std::optional<AllreduceAlgorithm> parseAllreduceAlgorithm(std::string_view name) noexcept {
  if (name == "auto") return AllreduceAlgorithm::kAuto;
  if (name == "ring") return AllreduceAlgorithm::kRing;
  if (name == "rd" || name == "recursive_doubling") return AllreduceAlgorithm::kRecursiveDoubling;
  if (name == "hierarchical") return AllreduceAlgorithm::kHierarchical;
  if (name == "tree") return AllreduceAlgorithm::kTree;
  if (name == "hd" || name == "halving_doubling" || name == "rabenseifner") return AllreduceAlgorithm::kHalvingDoubling;
  if (name == "reduce_broadcast") return AllreduceAlgorithm::kReduceBroadcast;
  return std::nullopt;
}

std::string_view allgatherAlgorithmName(AllgatherAlgorithm a) noexcept {
  switch (a) {
    case AllgatherAlgorithm::kAuto:
      return "auto";
    case AllgatherAlgorithm::kRing:
      return "ring";
    case AllgatherAlgorithm::kBruck:
      return "bruck";
    case AllgatherAlgorithm::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

std::string_view allgatherAlgorithmChoices() noexcept {
  return "ring, bruck, hierarchical or auto";
}

std::optional<AllgatherAlgorithm> parseAllgatherAlgorithm(std::string_view name) noexcept {
  for (AllgatherAlgorithm a : {AllgatherAlgorithm::kAuto, AllgatherAlgorithm::kRing, AllgatherAlgorithm::kBruck,
                               AllgatherAlgorithm::kHierarchical})
    if (name == allgatherAlgorithmName(a)) return a;
  return std::nullopt;
}

HostCommunicator::HostCommunicator(std::unique_ptr<Transport> transport, const HostCommOptions& options)
    : transport_(std::move(transport)), options_(options) {
  TERSE_CHECK(transport_ != nullptr, InvalidArgument, "communicator: transport is null");
  TERSE_CHECK(options_.segment_bytes > 0, InvalidArgument, "communicator: segment_bytes must be > 0");
  TERSE_CHECK(options_.ranks_per_node >= 1, InvalidArgument,
              "communicator: ranks_per_node must be >= 1, got " << options_.ranks_per_node);
}

HostCommunicator::~HostCommunicator() {
  std::size_t pending = 0;
  {
    std::lock_guard lock(worker_mutex_);
    pending = queue_.size() + (worker_busy_ ? 1 : 0);
    stop_ = true;
  }
  // Waiting for them could hang (their peers may be gone); failing them is what the destructor can promise.
  if (pending != 0)
    transport_->abort("communicator destroyed with " + std::to_string(pending) + " operation(s) still pending");
  worker_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

bool HostCommunicator::supportsSum(DType dtype) const noexcept {
  return isSummable(dtype);
}

AllreduceAlgorithm HostCommunicator::algorithmFor(uint64_t bytes) const noexcept {
  if (options_.algorithm != AllreduceAlgorithm::kAuto) return options_.algorithm;
  return autoAllreduceChoice(size(), options_.ranks_per_node, bytes, options_.small_allreduce_bytes);
}

AllgatherAlgorithm HostCommunicator::allgatherAlgorithmFor(uint64_t total_bytes) const noexcept {
  if (options_.allgather != AllgatherAlgorithm::kAuto) return options_.allgather;
  return allgatherChoice(size(), options_.ranks_per_node, total_bytes);
}

void HostCommunicator::checkSum(DType dtype, ReduceOp op) const {
  TERSE_CHECK(op == ReduceOp::kSum, Unsupported, "allreduce: only the sum is implemented");
  TERSE_CHECK(supportsSum(dtype), Unsupported,
              "allreduce: " << backend() << " cannot sum " << dtypeName(dtype) << " (f32, f16, bf16)");
}

HostCommunicator::Op HostCommunicator::makeOp(OpKind kind, uint64_t tensor, uint64_t bytes, Body body) {
  return Op{kind, 0, tensor, bytes, std::move(body)};
}

Tag HostCommunicator::nextTag() {
  // The sequence is the only thing that makes tags agree across ranks: it relies on the same issue order everywhere.
  return kCollectiveTagBit | next_seq_.fetch_add(1);
}

WireBytes HostCommunicator::runHere(Op op) {
  op.tag = nextTag();
  return run(op, caller_scratch_);
}

WireBytes HostCommunicator::run(Op& op, std::vector<std::byte>& scratch, CommStats* also) {
  CollectiveContext ctx{
      *transport_, FrameMeta{op.kind, op.tag, op.tensor}, options_.segment_bytes, &scratch, {}, {}, {}, -1};
  const auto start = rt::now();
  try {
    op.body(ctx);
  } catch (const std::exception& e) {
    // First the job, so every peer stops waiting on this rank; then this rank's own requests, so no peer is still
    // copying from or into buffers the caller may free once the error reaches it.
    transport_->abort(std::string(opKindName(op.kind)) + " failed: " + e.what());
    for (auto& r : ctx.inflight) {
      try {
        r.wait();
      } catch (...) {
      }
    }
    throw;
  }
  const double seconds = rt::seconds(start, rt::now());
  std::lock_guard lock(stats_mutex_);
  for (CommStats* stats : {&stats_, also}) {
    if (stats == nullptr) continue;
    OpStats& s = stats->by_kind[static_cast<std::size_t>(op.kind)];
    ++s.ops;
    s.bytes += op.bytes;
    s.seconds += seconds;
  }
  return ctx.wire;
}

CommRequest HostCommunicator::submit(Op op) {
  op.tag = nextTag();
  auto state = std::make_shared<CommRequest::State>();
  {
    std::lock_guard lock(worker_mutex_);
    TERSE_CHECK(!stop_, InternalError, "communicator: submit after shutdown");
    if (!worker_.joinable())
      worker_ = rt::Thread(
          "comm worker " + std::to_string(rank()), [this] { workerLoop(); }, rank());
    queue_.emplace_back(std::move(op), state);
  }
  worker_cv_.notify_one();
  return CommRequest(state);
}

void HostCommunicator::workerLoop() {
  std::unique_lock lock(worker_mutex_);
  for (;;) {
    worker_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    auto [op, state] = std::move(queue_.front());
    queue_.pop_front();
    worker_busy_ = true;
    lock.unlock();
    try {
      state->wire = run(op, worker_scratch_);
      state->done.complete();
    } catch (...) {
      state->done.complete(std::current_exception());
    }
    lock.lock();
    worker_busy_ = false;
  }
}

HostCommunicator::Op HostCommunicator::allreduceOp(std::span<std::byte> data, DType dtype, uint64_t tensor) {
  const AllreduceAlgorithm algo = algorithmFor(data.size());
  const int per_node = options_.ranks_per_node;
  return makeOp(OpKind::kAllreduce, tensor, data.size(), [data, dtype, algo, per_node](CollectiveContext& ctx) {
    switch (algo) {
      case AllreduceAlgorithm::kRecursiveDoubling:
        return allreduceRecursiveDoubling(ctx, data, dtype);
      case AllreduceAlgorithm::kHierarchical:
        return allreduceHierarchical(ctx, data, dtype, per_node);
      case AllreduceAlgorithm::kTree:
        return allreduceTree(ctx, data, dtype);
      case AllreduceAlgorithm::kHalvingDoubling:
        return allreduceHalvingDoubling(ctx, data, dtype);
      case AllreduceAlgorithm::kReduceBroadcast:
        return allreduceReduceBroadcast(ctx, data, dtype);
      case AllreduceAlgorithm::kAuto:
      case AllreduceAlgorithm::kRing:
        return allreduceRing(ctx, data, dtype);
    }
  });
}

namespace {

// One allgatherv with its algorithm (never kAuto); the leaders of a hierarchical one follow the flat rule.
void runAllgatherv(CollectiveContext& ctx, AllgatherAlgorithm algo, int ranks_per_node, std::span<const std::byte> send,
                   std::span<std::byte> recv, std::span<const uint64_t> sizes, uint64_t total) {
  switch (algo) {
    case AllgatherAlgorithm::kBruck:
      return allgathervBruck(ctx, send, recv, sizes);
    case AllgatherAlgorithm::kHierarchical: {
      const int per = std::min(ranks_per_node, ctx.size());
      const int nodes = (ctx.size() + per - 1) / per;
      return allgathervHierarchical(ctx, send, recv, sizes, ranks_per_node, flatAllgatherChoice(nodes, total));
    }
    case AllgatherAlgorithm::kAuto:
    case AllgatherAlgorithm::kRing:
      return allgathervRing(ctx, send, recv, sizes);
  }
}

}  // namespace

HostCommunicator::Op HostCommunicator::allgathervOp(std::span<const std::byte> send, std::span<std::byte> recv,
                                                    std::vector<uint64_t> sizes, uint64_t tensor) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  const AllgatherAlgorithm algo = allgatherAlgorithmFor(total);
  const int per_node = options_.ranks_per_node;
  return makeOp(OpKind::kAllgather, tensor, total,
                [send, recv, sizes = std::move(sizes), algo, per_node, total](CollectiveContext& ctx) {
                  runAllgatherv(ctx, algo, per_node, send, recv, sizes, total);
                });
}

HostCommunicator::Op HostCommunicator::broadcastOp(std::span<std::byte> data, int root, uint64_t tensor) {
  TERSE_CHECK(root >= 0 && root < size(), InvalidArgument,
              "broadcast: root must be in [0, " << size() << "), got " << root);
  return makeOp(OpKind::kBroadcast, tensor, data.size(),
                [data, root](CollectiveContext& ctx) { broadcastBinomial(ctx, data, root); });
}

HostCommunicator::Op HostCommunicator::barrierOp() {
  return makeOp(OpKind::kBarrier, kNoTensor, 0, [](CollectiveContext& ctx) { barrierDissemination(ctx); });
}

HostCommunicator::Op HostCommunicator::sizesOp(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  // The size exchange is an allgatherv of one 8-byte word per rank, by the same rule as the payloads'.
  const uint64_t total = 8 * all.size();
  const AllgatherAlgorithm algo = allgatherAlgorithmFor(total);
  const int per_node = options_.ranks_per_node;
  return makeOp(OpKind::kAllgather, tensor, total, [mine, all, algo, per_node, total](CollectiveContext& ctx) {
    const std::vector<uint64_t> sizes(static_cast<std::size_t>(ctx.size()), 8);
    exchangeWords(ctx, mine, all, [&](std::span<const std::byte> send, std::span<std::byte> recv) {
      runAllgatherv(ctx, algo, per_node, send, recv, sizes, total);
    });
  });
}

HostCommunicator::Op HostCommunicator::controlOp(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  return makeOp(OpKind::kAllgather, tensor, 8 * all.size(),
                [mine, all](CollectiveContext& ctx) { exchangeWordsBruck(ctx, mine, all); });
}

namespace {

std::span<std::byte> elements(void* data, std::size_t count, DType dtype) {
  TERSE_CHECK(data != nullptr || count == 0, InvalidArgument, "allreduce: data is null for " << count << " elements");
  return std::span<std::byte>(static_cast<std::byte*>(data), count * dtypeSize(dtype));
}

std::span<std::byte> summedPart(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire) {
  TERSE_CHECK(prefix_bytes <= payload.size(), InvalidArgument,
              "allreduce payload: prefix of " << prefix_bytes << " bytes in a payload of " << payload.size());
  const std::size_t summed = payload.size() - prefix_bytes;
  TERSE_CHECK(summed % dtypeSize(wire) == 0, InvalidArgument,
              "allreduce payload: " << summed << " bytes after the prefix are not a whole number of " << dtypeName(wire)
                                    << " elements");
  return payload.subspan(prefix_bytes);
}

}  // namespace

WireBytes HostCommunicator::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) {
  checkSum(dtype, op);
  return runHere(allreduceOp(elements(data, count, dtype), dtype, tensor));
}

WireBytes HostCommunicator::allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                             uint64_t tensor) {
  checkSum(wire, ReduceOp::kSum);
  return runHere(allreduceOp(summedPart(payload, prefix_bytes, wire), wire, tensor));
}

WireBytes HostCommunicator::allgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                       std::span<const uint64_t> sizes, uint64_t tensor) {
  return runHere(allgathervOp(send, recv, std::vector<uint64_t>(sizes.begin(), sizes.end()), tensor));
}

WireBytes HostCommunicator::allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  return runHere(sizesOp(mine, all, tensor));
}

WireBytes HostCommunicator::allgatherControl(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  return runHere(controlOp(mine, all, tensor));
}

WireBytes HostCommunicator::broadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  return runHere(broadcastOp(data, root, tensor));
}

WireBytes HostCommunicator::barrier() {
  return runHere(barrierOp());
}

CommRequest HostCommunicator::iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) {
  checkSum(dtype, op);
  return submit(allreduceOp(elements(data, count, dtype), dtype, tensor));
}

CommRequest HostCommunicator::iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                                uint64_t tensor) {
  checkSum(wire, ReduceOp::kSum);
  return submit(allreduceOp(summedPart(payload, prefix_bytes, wire), wire, tensor));
}

CommRequest HostCommunicator::iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                          std::span<const uint64_t> sizes, uint64_t tensor) {
  return submit(allgathervOp(send, recv, std::vector<uint64_t>(sizes.begin(), sizes.end()), tensor));
}

CommRequest HostCommunicator::ibroadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  return submit(broadcastOp(data, root, tensor));
}

CommRequest HostCommunicator::ibarrier() {
  return submit(barrierOp());
}

namespace {

// A channel's tag: the collective bit, the channel bit (the parent's sequence never reaches it), the selected id,
// then the operation's number within it. 2^20 operations per id is far above what one group runs (a size exchange,
// a gather or an allreduce per fusion class and round); 2^42 ids outlast any run.
constexpr Tag kChannelTagBit = Tag{1} << 62;
constexpr int kChannelSeqBits = 20;
constexpr uint64_t kChannelIds = uint64_t{1} << (62 - kChannelSeqBits);

CommRequest completedRequest(WireBytes wire) {
  auto state = std::make_shared<CommRequest::State>();
  state->wire = wire;
  state->done.complete();
  return CommRequest(state);
}

}  // namespace

class HostCommunicator::Channel final : public CommChannel {
 public:
  explicit Channel(HostCommunicator& parent) : parent_(parent) {}

  void select(uint64_t id) override {
    TERSE_CHECK(id < kChannelIds, InvalidArgument,
                "communicator channel: id " << id << " is not below " << kChannelIds);
    id_ = id;
    seq_ = 0;
  }

  std::string_view backend() const noexcept override { return parent_.backend(); }
  int rank() const noexcept override { return parent_.rank(); }
  int size() const noexcept override { return parent_.size(); }
  bool supportsSum(DType dtype) const noexcept override { return parent_.supportsSum(dtype); }
  std::string_view allreduceAlgorithmRun(uint64_t bytes) const noexcept override {
    return parent_.allreduceAlgorithmRun(bytes);
  }
  std::string_view allgatherAlgorithmRun(uint64_t total_bytes) const noexcept override {
    return parent_.allgatherAlgorithmRun(total_bytes);
  }
  std::string_view controlAlgorithmRun() const noexcept override { return parent_.controlAlgorithmRun(); }

  WireBytes allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) override {
    parent_.checkSum(dtype, op);
    return run(parent_.allreduceOp(elements(data, count, dtype), dtype, tensor));
  }
  WireBytes allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                             uint64_t tensor) override {
    parent_.checkSum(wire, ReduceOp::kSum);
    return run(parent_.allreduceOp(summedPart(payload, prefix_bytes, wire), wire, tensor));
  }
  WireBytes allgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                       uint64_t tensor) override {
    return run(parent_.allgathervOp(send, recv, std::vector<uint64_t>(sizes.begin(), sizes.end()), tensor));
  }
  WireBytes allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) override {
    return run(parent_.sizesOp(mine, all, tensor));
  }
  WireBytes allgatherControl(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) override {
    return run(parent_.controlOp(mine, all, tensor));
  }
  WireBytes broadcast(std::span<std::byte> data, int root, uint64_t tensor) override {
    return run(parent_.broadcastOp(data, root, tensor));
  }
  WireBytes barrier() override { return run(parent_.barrierOp()); }

  CommRequest iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) override {
    return completedRequest(allreduce(data, count, dtype, op, tensor));
  }
  CommRequest iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                uint64_t tensor) override {
    return completedRequest(allreducePayload(payload, prefix_bytes, wire, tensor));
  }
  CommRequest iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                          uint64_t tensor) override {
    return completedRequest(allgatherv(send, recv, sizes, tensor));
  }
  CommRequest ibroadcast(std::span<std::byte> data, int root, uint64_t tensor) override {
    return completedRequest(broadcast(data, root, tensor));
  }
  CommRequest ibarrier() override { return completedRequest(barrier()); }

  void abort(const std::string& reason) override { parent_.abort(reason); }
  RankTraffic traffic() const override { return parent_.traffic(); }
  void resetTraffic() override { parent_.resetTraffic(); }
  CommStats stats() const override {
    std::lock_guard lock(parent_.stats_mutex_);
    return stats_;
  }

 private:
  WireBytes run(Op op) {
    TERSE_CHECK(seq_ < (uint64_t{1} << kChannelSeqBits), InternalError,
                "communicator channel " << id_ << ": more than " << (uint64_t{1} << kChannelSeqBits)
                                        << " operations under one id");
    op.tag = kCollectiveTagBit | kChannelTagBit | (id_ << kChannelSeqBits) | seq_++;
    return parent_.run(op, scratch_, &stats_);
  }

  HostCommunicator& parent_;
  uint64_t id_ = 0;
  uint64_t seq_ = 0;
  std::vector<std::byte> scratch_;
  CommStats stats_;  // guarded by the parent's stats_mutex_
};

std::unique_ptr<CommChannel> HostCommunicator::openChannel() {
  return std::make_unique<Channel>(*this);
}

CommStats HostCommunicator::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

}  // namespace terse::comm

// The host communicator: the collectives of this folder over any Transport (inproc_transport.h, tcp/transport.h).
//
// Blocking calls run on the calling thread. Non-blocking calls go to one worker thread per communicator, which runs
// them in issue order, so a rank overlaps communication with its own compute while the order stays the same on every
// rank; a blocking call issued meanwhile runs at once on its own thread under its own tag, independently of the queued
// ones. Each thread that runs collectives has its own grow-only scratch, so a steady state allocates nothing large.
//
// Allreduce picks its algorithm per call: with kAuto, the measured table of allreduce_auto.h by world size and message
// size (or, when small_allreduce_bytes is set, recursive doubling below it and the ring from there on), and the
// hierarchical allreduce (allreduce_hierarchical.h) instead of the ring when ranks_per_node > 1 describes more than
// one node; the same size gives the same choice on every rank, as it must. Allgatherv (and the size exchange before a
// variable-size one) likewise picks the ring, Bruck's or the hierarchical one by allgather_auto.h's rule with kAuto.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/transport.h"
#include "core/common/runtime.h"

namespace terse::comm {

struct HostCommOptions {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  // kAuto: 0 = the measured table (allreduce_auto.h); otherwise messages below this many bytes use recursive
  // doubling, larger ones the ring.
  uint64_t small_allreduce_bytes = 0;
  // Frames carry at most this many payload bytes (CollectiveContext::segment_bytes). 256 KiB keeps a frame's copy or
  // sum within L2 while its neighbour is in flight, and makes per-frame costs (a header, a match) negligible.
  uint64_t segment_bytes = 256 * 1024;
  // kAuto: allgather_auto.h's rule by world, ranks_per_node and gathered bytes.
  AllgatherAlgorithm allgather = AllgatherAlgorithm::kAuto;
  // Workers per node for the hierarchical allreduce and allgatherv (blocks of consecutive ranks); 1 = a flat cluster.
  int ranks_per_node = 1;
};

class HostCommunicator : public Communicator {
 public:
  // Throws InvalidArgument for a null transport or a zero segment size.
  explicit HostCommunicator(std::unique_ptr<Transport> transport, const HostCommOptions& options = {});
  // Operations still queued are failed (the job is aborted), never waited for: their peers may be gone.
  ~HostCommunicator() override;

  std::string_view backend() const noexcept override { return transport_->name(); }
  int rank() const noexcept override { return transport_->rank(); }
  int size() const noexcept override { return transport_->size(); }
  bool supportsSum(DType dtype) const noexcept override;
  Transport& transport() noexcept { return *transport_; }
  const HostCommOptions& options() const noexcept { return options_; }
  // The algorithm an allreduce of `bytes` bytes runs.
  AllreduceAlgorithm algorithmFor(uint64_t bytes) const noexcept;
  // The algorithm an allgatherv (or the size exchange) of `total_bytes` gathered bytes runs; never kAuto.
  AllgatherAlgorithm allgatherAlgorithmFor(uint64_t total_bytes) const noexcept;
  std::string_view allreduceAlgorithmRun(uint64_t bytes) const noexcept override {
    return allreduceAlgorithmName(algorithmFor(bytes));
  }
  std::string_view allgatherAlgorithmRun(uint64_t total_bytes) const noexcept override {
    return allgatherAlgorithmName(allgatherAlgorithmFor(total_bytes));
  }
  std::string_view controlAlgorithmRun() const noexcept override {
    return allgatherAlgorithmName(AllgatherAlgorithm::kBruck);  // controlOp's exchangeWordsBruck
  }

  WireBytes allreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                      uint64_t tensor = kNoTensor) override;
  WireBytes allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                             uint64_t tensor = kNoTensor) override;
  WireBytes allgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                       uint64_t tensor = kNoTensor) override;
  WireBytes allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = kNoTensor) override;
  WireBytes allgatherControl(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = kNoTensor) override;
  WireBytes broadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) override;
  WireBytes barrier() override;

  CommRequest iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                         uint64_t tensor = kNoTensor) override;
  CommRequest iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                uint64_t tensor = kNoTensor) override;
  CommRequest iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                          uint64_t tensor = kNoTensor) override;
  CommRequest ibroadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) override;
  CommRequest ibarrier() override;

  void abort(const std::string& reason) override { transport_->abort(reason); }
  RankTraffic traffic() const override { return transport_->traffic(); }
  void resetTraffic() override { transport_->resetTraffic(); }
  CommStats stats() const override;
  // A channel (communicator.h) whose operations run on the calling thread with tags of their own namespace.
  std::unique_ptr<CommChannel> openChannel() override;

 private:
  class Channel;
  // One collective ready to run on some thread: the algorithm with its arguments bound.
  using Body = std::function<void(CollectiveContext&)>;
  struct Op {
    OpKind kind;
    Tag tag;
    uint64_t tensor;
    uint64_t bytes;
    Body body;
  };

  // The op with its tag left 0: the caller gives it one (nextTag for the parent's sequence, a channel its own).
  Op makeOp(OpKind kind, uint64_t tensor, uint64_t bytes, Body body);
  Tag nextTag();
  // Runs op on this thread with `scratch`; on failure aborts the job, waits out the op's requests, rethrows. Its
  // time counts in stats_ and, when given, in `also` (a channel's own).
  WireBytes run(Op& op, std::vector<std::byte>& scratch, CommStats* also = nullptr);
  // A blocking call of the parent: the next tag of the sequence, the caller's scratch.
  WireBytes runHere(Op op);
  CommRequest submit(Op op);
  void workerLoop();

  Op allreduceOp(std::span<std::byte> data, DType dtype, uint64_t tensor);
  Op allgathervOp(std::span<const std::byte> send, std::span<std::byte> recv, std::vector<uint64_t> sizes,
                  uint64_t tensor);
  Op broadcastOp(std::span<std::byte> data, int root, uint64_t tensor);
  Op barrierOp();
  Op sizesOp(uint64_t mine, std::span<uint64_t> all, uint64_t tensor);
  Op controlOp(uint64_t mine, std::span<uint64_t> all, uint64_t tensor);
  void checkSum(DType dtype, ReduceOp op) const;

  std::unique_ptr<Transport> transport_;
  HostCommOptions options_;
  std::atomic<uint64_t> next_seq_{0};
  std::vector<std::byte> caller_scratch_;  // blocking calls (one calling thread at a time)

  rt::Mutex worker_mutex_;  // the runtime's: the worker blocks in simulated time in a simulation
  rt::CondVar worker_cv_;
  std::deque<std::pair<Op, std::shared_ptr<CommRequest::State>>> queue_;  // guarded by worker_mutex_
  bool stop_ = false;                                                     // guarded by worker_mutex_
  bool worker_busy_ = false;                                              // guarded by worker_mutex_
  rt::Thread worker_;                                                     // started by the first submit
  std::vector<std::byte> worker_scratch_;                                 // the worker's own

  mutable std::mutex stats_mutex_;
  CommStats stats_;  // guarded by stats_mutex_
};

}  // namespace terse::comm

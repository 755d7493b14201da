// The synchronous trainer's communication side (sync_trainer.h): one rank's communication thread, which admits the
// ready gradients the trainer feeds it, negotiates with the other ranks what every scheduler may see, asks the
// scheduler (core/plugin/scheduler.h) for groups and runs them through the aggregation engine -- itself or on lanes --
// and hands every tensor whose chunks are all aggregated to a GradientSink (the trainer's optimizer). The trainer waits
// on it: a layer's gate for that layer's updates, a drain for all of them. The protocol (negotiation, groups in
// flight, row-sparse tensors, device streams, errors) is described at the top of sync_trainer.h; this file is the
// unit that runs it, usable without a trainer (tests/train/group_scheduler_test.cc feeds one by hand).
//
// Hand-overs, one queue each:
//   worker -> communication thread: ready_ (under mutex_), tensors fed and not yet admitted to the scheduler. The
//     thread reads how many there are at each wake-up (the negotiation's news) and takes the agreed ones off the front.
//   communication thread -> lanes: the LanePool's queue (lane_pool.h, under its own lock), groups handed out and not
//     yet taken by a lane (max_groups_in_flight > 1).
//   lanes -> communication thread: lane_done_ (under mutex_), groups a lane has run, waiting for their updates and
//     completions.
// What the scheduler holds between admission and hand-out is its own queue (the plugin's, not ours).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/runtime.h"
#include "core/compress/engine.h"
#include "core/compress/pipeline.h"
#include "core/plugin/scheduler.h"
#include "core/train/lane_pool.h"
#include "core/train/pipeline_set.h"
#include "core/train/row_sparse_tensors.h"
#include "core/train/step_books.h"
#include "core/train/step_trace.h"
#include "core/train/trace.h"
#include "core/train/update_gates.h"
#include "core/train/workload.h"

namespace terse::train {

// The byte-accounting label (comm::traffic.h, per tensor) of the negotiation rounds' frames: control traffic, kept
// apart so results can report gradient bytes, which do not depend on how the ranks' paces interleaved.
inline constexpr uint64_t kNegotiationTensor = ~uint64_t{0} - 1;

// The scheduler negotiation's completed rounds and the bytes this rank sent for them (frames, headers included).
struct Negotiation {
  uint64_t rounds = 0;
  uint64_t bytes = 0;
};

// What the communication thread has spent so far, summed over every group and round: a step's share is the
// difference of two readings.
struct CommCounters {
  double comm_s = 0;    // the communicator's collectives (negotiation rounds included)
  double encode_s = 0;  // the pipelines' encode
  double decode_s = 0;  // the pipelines' decode
  Negotiation negotiation;
};

// Where aggregated gradients go: called on the communication thread, in the same order on every rank, with no lock
// held. The group scheduler marks a tensor's update of the step applied (opening gates and drains) once the call
// returns it.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Tensors of `step` whose every chunk is aggregated (their gradients hold the average, on the device for a device
  // workload). Returns the tensors whose update is now in: those, or none and later more (a global clip waits for the
  // step's last tensor).
  virtual std::vector<std::size_t> aggregated(int64_t step, double lr, std::vector<std::size_t> tensors) = 0;
  // A row-sparse tensor (GroupSchedulerOptions::sparse_rows) aggregated: its gradient holds the average on `rows`
  // (the union of every rank's rows) and zeros elsewhere. Its update is in once the call returns.
  virtual void aggregatedRows(int64_t step, double lr, std::size_t tensor, std::span<const int64_t> rows) = 0;
};

struct GroupSchedulerOptions {
  // SyncTrainerOptions' fields of the same names.
  int max_groups_in_flight = 1;
  bool sparse_rows = false;
  TraceRecorder* trace = nullptr;
  StepTraceRecorder* step_trace = nullptr;
  // SyncTrainerOptions' dense warm-up: steps before compression_start_step take `dense`'s pipelines.
  int64_t compression_start_step = 0;
  PipelineFactory dense;
};

class GroupScheduler {
 public:
  // Builds one pipeline per parameter tensor through `pipelines` (tensor id i for params()[i]), a row-sparse
  // aggregator per row-sparse tensor (sparse_rows) and the lanes. Throws InvalidArgument for a null scheduler or
  // factory (or options.dense with a compression_start_step > 0), a factory that returns a pipeline of the wrong
  // tensor, size or rank, a row-sparse tensor of a device workload, max_groups_in_flight < 1 or > 1 on a communicator
  // without channels; what the factory throws. start() starts the threads: the owner finishes its own checks first.
  // `sink` must outlive this.
  GroupScheduler(Workload& workload, comm::Communicator& comm, PipelineFactory pipelines,
                 std::unique_ptr<Scheduler> scheduler, const GroupSchedulerOptions& options, GradientSink& sink);
  // Stops and joins the threads (groups not started are dropped: awaitApplied() first to finish them).
  ~GroupScheduler();
  GroupScheduler(const GroupScheduler&) = delete;
  GroupScheduler& operator=(const GroupScheduler&) = delete;

  void start();

  // ---- The worker's side.
  // Hands over tensors of `step` whose gradients are final (backward's order, the same on every rank), to be updated
  // with `lr`. A step's tensors all come before the next step's, and a step's first only once every update of the
  // step before is applied (a gate or a wait saw it).
  void feed(int64_t step, std::span<const std::size_t> tensors, double lr);
  // Waits until every tensor's update of `step` is applied; rethrows the first error. Returns the seconds waited.
  double awaitApplied(int64_t step);
  // Waits until every tensor of `layer` has its update of `step` applied; rethrows the first error. Returns when the
  // wait began and ended. InvalidArgument for a layer the workload does not have.
  std::pair<rt::Clock::time_point, rt::Clock::time_point> awaitLayer(int layer, int64_t step);
  // Records a failure outside the communication thread (the worker's forwardBackward) as the first error unless one is
  // already in, and then aborts the communicator with `reason` (the peers' collectives fail, nothing hangs).
  void failFrom(std::exception_ptr failure, const std::string& reason);
  bool failed() const;
  void throwIfFailed() const;
  // Backward's progress, for overlapped(): tensors whose communication started between these two calls.
  void backwardStarts();
  void backwardEnds();
  int overlapped() const noexcept { return overlapped_.load(std::memory_order_relaxed); }
  CommCounters counters() const;

  // ---- Read after awaitApplied() (the communication thread is idle between steps then).
  // Tensor ids in the order their first chunk started in the last step, and its groups in issue order.
  const std::vector<std::size_t>& issueOrder() const noexcept { return books_.issueOrder(); }
  const std::vector<IssuedGroup>& groups() const noexcept { return books_.groups(); }
  // Compressor output this rank sent, all tensors, chunks and row-sparse tensors (SyncTrainer::payloadBytes).
  uint64_t payloadBytes() const;
  const CompressionPipeline& pipeline(std::size_t tensor) const { return pipelines_.tensor(tensor); }
  const Scheduler& scheduler() const noexcept { return *scheduler_; }
  bool anyRowSparse() const;

 private:
  struct Ready {
    uint64_t step;
    std::size_t tensor;
    double lr;
  };
  // A group on its way: what the communication thread bound when it handed the group out, and what running it cost.
  struct GroupJob {
    uint64_t seq = 0;  // run-wide number, issue order: a lane's channel id, the same on every rank
    uint64_t step = 0;
    std::vector<Chunk> chunks;
    std::vector<GroupMember> members;
    uint64_t wire_bytes = 0;
    std::string where;  // for an error: "a group of N chunks (first: tensor T 'name')"
    double encode_s = 0, decode_s = 0, comm_s = 0;
    // Step trace: the group's number among everything the communication thread issued (row-sparse tensors included;
    // the same on every rank) and when the scheduler handed it out.
    uint64_t trace_seq = 0;
    rt::Clock::time_point issued;
  };
  void commLoop();
  // A lane's thread: runs the job on the lane's channel and engine and hands it back through lane_done_.
  void runOnLane(std::unique_ptr<GroupJob> job, Lane& lane, std::size_t k);
  // Communication thread: a tensor the negotiation agreed on goes to the scheduler (or, row-sparse, is aggregated).
  void admit(const Ready& r);
  // Communication thread: binds the chunks' pipelines and gradients, books issue order and the IssuedGroup.
  std::unique_ptr<GroupJob> prepareGroup(const std::vector<Chunk>& group, std::size_t in_flight);
  // The thread running the group: compression, collectives, decompression through `engine`; codec time and the time
  // of `timed`'s collectives into the job; trace phases on trace thread `tid`.
  void executeGroup(GroupJob& job, AggregationEngine& engine, const comm::Communicator& timed, int tid);
  // Communication thread: the sink's updates of the tensors the job finished, and its times into the counters.
  void finishGroup(const GroupJob& job);
  // A row-sparse tensor's aggregation (sparse_), its group in the step trace, and its update.
  void runSparse(std::size_t tensor);
  // Communication thread: books the tensor as started (issue order, overlap) the first time one of its chunks goes.
  void markStarted(std::size_t tensor);
  // Communication thread: one negotiation round (group_scheduler.cc). `received_total` tensors received over the run,
  // `admitted_total` of them admitted, `finished` groups finished here and not yet told to the scheduler; returns the
  // tensors every rank has received (run-wide) and the groups every rank has finished. `counts` is its buffer.
  std::pair<uint64_t, std::size_t> negotiate(uint64_t received_total, uint64_t admitted_total, std::size_t finished,
                                             int64_t received_step, std::vector<uint64_t>& counts);
  // The first error wins (gates_), then every rank's collectives are failed; waiters and the loops wake.
  void fail(std::exception_ptr failure, const std::string& where, int64_t step);
  void abortComm(const std::string& reason);

  Workload& workload_;
  comm::Communicator& comm_;
  GradientSink& sink_;
  const GroupSchedulerOptions options_;
  const bool device_;  // the workload computes on a CUDA device: gradients and pipelines live there
  std::unique_ptr<Scheduler> scheduler_;
  PipelineSet pipelines_;
  // The dense warm-up's (options_.compression_start_step > 0), dropped at the first step past it (its buffers are a
  // model's worth), its payload kept in dense_payload_bytes_.
  std::optional<PipelineSet> dense_;
  uint64_t dense_payload_bytes_ = 0;
  // The pipelines of `step`'s gradients: the dense warm-up's before compression_start_step, else the compressor's.
  PipelineSet& pipelinesAt(int64_t step) {
    return dense_ && step < options_.compression_start_step ? *dense_ : pipelines_;
  }
  RowSparseTensors sparse_;   // the tensors aggregated as rows, outside the groups
  AggregationEngine engine_;  // groups run on the communication thread
  LanePool<GroupJob> lanes_;  // empty with max_groups_in_flight 1

  // ---- Communication thread only (no lock): the step being scheduled and its books (step_books.h says how the trainer
  // reads their issue order and groups), and the run-wide group numbers.
  StepBooks books_;
  uint64_t group_seq_ = 0;  // groups handed to lanes so far
  uint64_t trace_seq_ = 0;  // groups and row-sparse aggregations issued so far (step trace)

  // ---- Shared. The updates applied and the first failure, under their own lock (update_gates.h; mutex_ may be held
  // while it is taken, never the other way round).
  UpdateGates gates_;
  // mutex_ guards everything below down to counters_. The runtime's (core/common/runtime.h): in a simulation the
  // threads are actors and wait in simulated time.
  mutable rt::Mutex mutex_;
  rt::CondVar work_cv_;  // the communication thread waits here for ready tensors and finished lanes
  std::deque<Ready> ready_;
  std::deque<std::unique_ptr<GroupJob>> lane_done_;
  bool stop_ = false;
  CommCounters counters_;
  std::atomic<bool> backward_done_{false};
  std::atomic<int> overlapped_{0};
  rt::Thread comm_thread_;
};

}  // namespace terse::train

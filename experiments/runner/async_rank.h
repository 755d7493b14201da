// One rank of a parameter-server job (modes ASYNC and SSP), whatever made it: a process of a tcp job
// (distributed_async.cc) or a thread, or an actor of a simulation, of an in-process one (async_runner.cc). Ranks
// 0 .. S-1 are the shards, S .. S+W-1 the workers; rank 0 also writes the records.
//
// Rank 0 learns the rest over a control transport of its own (not counted in the records): every worker sends a
// WorkerReport (async_report.proto) after each step -- its cumulative times and bytes and that step's loss -- and each
// other shard sends a ShardReport with its snapshot at every evaluation point (ServerOptions::snapshot_steps) and a
// final one when it stops. Rank 0 evaluates a point once its own snapshot and every other shard's are in, so a record
// holds the parameters at that global step. Reports are cumulative, so rank 0 only keeps the latest of each worker.
//
// Rank 0 blocks for what it needs, in an order every report arrives in, and never polls: its own shard's snapshot
// (which comes, or its shard stops without it), then each other shard's next report (a shard sends its points in order,
// then its final one), then whatever worker reports are in; at the end each worker's last report. A blocking read
// fails at once when the job is aborted or the peer's process is lost, so nothing waits on a rank that is gone. Why:
// a poll that slept 1 ms whenever no report had come cost a wake-up every millisecond, delayed each record by up to a
// millisecond, and has no meaning in simulated time, where a timed sleep moves the clock. Everything here is the
// runtime's (core/common/runtime.h): the shard's thread, its waits and its clock, so that a simulation runs the same
// code as a process.
//
// The end: workers leave with a goodbye, shards stop once every worker left or was dropped, shards 1.. send their
// final reports, rank 0 writes the last record and releases every rank still connected (a message, not a barrier: a
// lost worker cannot join a barrier).
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/common/runtime.h"
#include "core/plugin/compressor.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "core/train/workload.h"
#include "experiments/config/config.h"
#include "experiments/runner/async_rank_driver.h"
#include "experiments/runner/async_report.pb.h"
#include "experiments/runner/world.h"

namespace terse::runner::detail {

// Sends serialized messages to rank 0 one at a time (the previous send must finish before its buffer is reused).
class ReportSender {
 public:
  explicit ReportSender(comm::Transport& t) : t_(t) {}
  ~ReportSender();
  void send(comm::Tag tag, const google::protobuf::MessageLite& m);
  void flush();

 private:
  comm::Transport& t_;
  std::string buffer_;
  std::optional<comm::Request> pending_;
};

// One rank of a parameter-server job: its replica (shards take their initial range from it; rank 0 evaluates on it)
// and its endpoints. Ranks 0 .. S-1 serve a shard, the others are workers; rank 0 also writes the records.
class AsyncRank final : public AsyncView {
 public:
  // `data` carries the pushes and pulls (what the records count), `control` the reports (not counted); `instance` is
  // this rank's compressor (unused with raw pushes), `pull_instance` its pull compressor (null: pulls carry the
  // parameters).
  // `partition`: data.partition DIRICHLET's shards (runner_detail.h dataPartition), drawn once per process; null
  // for IID.
  AsyncRank(const experiments::Experiment& e, int rank, train::Workload& model, comm::HostCommunicator& data,
            comm::HostCommunicator& control, std::shared_ptr<Compressor> instance,
            std::shared_ptr<Compressor> pull_instance, std::shared_ptr<const train::Partition> partition);
  ~AsyncRank() { joinShard(); }
  const train::Partition* partition() const { return partition_.get(); }

  const train::StepPlan& steps() const { return steps_; }

  // Every replica must start from the same parameters (same seed, same build).
  void checkInitialReplicas();

  // The rank's loop; `report` is rank 0's (records), null on the others. Returns after rank 0's last record.
  void run(std::optional<AsyncReport> report, const World& world, const std::string& host);

  // A failed rank: its shard stops serving (the World already aborted the endpoints).
  void stop() {
    if (shard_) shard_->stop();
    joinShard();
  }

 private:
  void worker(const World& world);
  void startShard(const std::string& host);
  void shard();
  void primary(AsyncRecorder& recorder);
  // Throws the shard's failure, or the job's first one once an endpoint was aborted.
  void check();
  void joinShard() {
    if (shard_thread_.joinable()) shard_thread_.join();
  }
  // Waits for rank r's next report (a worker's, or a shard's: its next point or its final report) and files it. A
  // worker whose process is lost (the read fails, and the job was not aborted) is filed as stopped at its last report.
  // Throws InvalidPayload naming the rank for a report that does not parse or has the wrong shape, CommError when the
  // job failed.
  void receive(int r);
  void file(int r, std::size_t bytes);
  bool workerStopped(int w) const;
  // Rank 0's view of the others, from their reports.
  std::optional<AsyncPoint> collect(int64_t point) override;
  AsyncPoint collectFinal() override;
  std::span<const float> params() const override { return flat_; }
  AsyncTallies tallies() override;
  std::pair<double, int64_t> losses(int worker, int64_t from, int64_t to) override;
  // The global model and the shards' tallies: `own` and `own_stats` are shard 0's range and counters, `others` shard
  // k's report (k = 1 .. S-1).
  void assemble(std::span<const float> own, const train::ServerStats& own_stats,
                const std::function<const ShardReport&(int k)>& others);

  const experiments::Experiment& e_;
  const int rank_, S_, W_;
  train::Workload& model_;
  comm::HostCommunicator& data_comm_;
  comm::Transport& data_;
  comm::HostCommunicator& control_;
  comm::Transport& ctl_;
  std::shared_ptr<Compressor> instance_;               // null: raw pushes
  std::shared_ptr<Compressor> pull_instance_;          // null: pulls carry the parameters
  std::shared_ptr<const train::Partition> partition_;  // the workers' fixed shards; null: IID
  const train::PsPlan plan_;
  std::vector<float> flat_;
  const train::StepPlan steps_;
  const train::LrScheduleOptions lr_;
  const std::vector<int64_t> points_;
  rt::Clock::time_point start_;
  ReportSender sender_;

  std::unique_ptr<train::ParamServerShard> shard_;
  rt::Thread shard_thread_;  // the runtime's: an actor on this rank's host in a simulation
  std::exception_ptr shard_error_;

  // Rank 0's view of the others.
  struct Inbox {
    std::vector<std::byte> buffer;
    comm::Request recv;
    bool posted = false;
  };
  std::vector<Inbox> inbox_;
  std::vector<WorkerReport> latest_;
  std::vector<std::vector<double>> losses_;
  std::vector<double> left_s_;                    // when rank 0 learned a worker stopped dead
  std::vector<bool> lost_;                        // its process died: no more reports
  std::vector<std::optional<ShardReport>> next_;  // per shard, the report of a point not yet asked for
  std::vector<std::optional<ShardReport>> finals_;
  std::vector<ShardTally> shard_tallies_;  // of the record being written
};

}  // namespace terse::runner::detail

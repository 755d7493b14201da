// The rank as the unit of the runner (issue 41): a World makes a run's ranks and owns their failure; a rank driver
// (rank_driver.h: sync runs; async_rank.h: a parameter server's shards and workers) runs one rank's loop and knows
// nothing of how the rank was made: an in-process job's ranks are a ThreadWorld's, a process of a tcp job is a
// ProcessWorld, and both run the same rank code. Three Worlds:
//
//   - ThreadWorld: the ranks as threads of this process (transport INPROC, clock REAL_TIME).
//   - SimulatedWorld: the same threads as actors of a SimGrid simulation (clock SIMULATED). Everything the simulation
//     needs of a rank lives here: each rank's straggler factor (setSlowdown) and the bookkeeping it must not charge
//     (aside(): rt::uncounted). The drivers never ask whether time is simulated.
//   - ProcessWorld: the one rank this process is of a multi-process job (transports TCP and NCCL).
//
// Failure. Each rank registers the actions that abort its communicators (onAbort). The first rank to throw aborts
// them, so every other rank's pending and later collectives fail at once instead of hanging; the root cause is the
// first error that is not a comm::CommError (a transport failing is usually the consequence of another rank's
// error), and it is what the run reports, naming the rank. A plugin call past plugin_timeout aborts every rank too
// (abortOnOverrun, runner_detail.h). A World is declared after the communicators its abort actions touch, so that it
// goes first.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/transport.h"
#include "core/common/watchdog.h"

namespace terse::runner::detail {

class World {
 public:
  explicit World(int size);
  virtual ~World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // The job's ranks, and those this World runs here: all of them in-process, one in a process of a job.
  int size() const noexcept { return size_; }
  virtual std::vector<int> localRanks() const = 0;
  // Runs body(rank) for every local rank and returns once all have ended. When one throws, every rank is aborted and,
  // once all have ended, the root cause is rethrown (ThreadWorld: as "rank R: what").
  virtual void run(const std::function<void(int rank)>& body) = 0;
  // Bookkeeping, not training (evaluation, records, progress): a simulation does not charge its computation.
  virtual void aside(const std::function<void()>& fn) const { fn(); }
  // What a trainer of a straggler with this compute factor sleeps by (SyncTrainerOptions::slowdown): in real time it
  // sleeps; in a simulation its actor computes slower instead (SimulatedWorld), so its trainer sleeps by 1.
  virtual double trainerSlowdown(double factor) const { return factor; }
  // What rank's communicators do to fail every pending and later collective; called with the reason.
  void onAbort(std::function<void(const std::string& reason)> abort);
  // Runs every abort action (idempotent per action: a communicator keeps the first reason).
  void abortAll(const std::string& reason);

 protected:
  // Put before an overrun's reason ("rank 2 (node3) failed: "): a process names itself to the job's other processes.
  std::string overrun_prefix_;

 private:
  int size_;
  std::mutex mutex_;
  std::vector<std::function<void(const std::string&)>> aborts_;
  // A plugin call past plugin_timeout aborts every rank; the process then ends (runner_detail.h PluginWatch).
  watchdog::Registration overrun_;
};

// The ranks as threads of this process (rt::Thread: OS threads, or actors in a simulation).
class ThreadWorld : public World {
 public:
  // `label`: what an error and an abort call rank r ("rank 2"; a parameter server's "worker 1 (rank 3)").
  explicit ThreadWorld(int size, std::function<std::string(int rank)> label = {});
  std::vector<int> localRanks() const override;
  void run(const std::function<void(int rank)>& body) override {
    run(body, [] {});
  }
  // As run(body), with `monitor` on the calling thread while the ranks run (HOGWILD's evaluation, which reads the
  // shared parameters in place). A monitor that throws aborts every rank; its error wins over theirs.
  void run(const std::function<void(int rank)>& body, const std::function<void()>& monitor);

 protected:
  // On the rank's own thread, before its body.
  virtual void enterRank(int /*rank*/) {}

 private:
  // Keeps the root cause and aborts every rank's communicators (the in-process job is one fabric).
  void fail(int rank, std::exception_ptr err);

  std::function<std::string(int rank)> label_;
  std::mutex error_mutex_;
  std::exception_ptr error_;
  int error_rank_ = -1;
};

// The ranks as actors of a simulation (clock SIMULATED): each runs at its straggler factor and bookkeeping is free.
class SimulatedWorld final : public ThreadWorld {
 public:
  // slowdowns[r]: rank r's compute factor (experiment worker_settings).
  explicit SimulatedWorld(std::vector<double> slowdowns, std::function<std::string(int rank)> label = {});
  void aside(const std::function<void()>& fn) const override;
  double trainerSlowdown(double /*factor*/) const override { return 1.0; }

 private:
  void enterRank(int rank) override;
  std::vector<double> slowdowns_;
};

// This process is rank `rank` of a job of `size` processes. run() calls the body on this thread; a failure before or
// during it goes through failed(), which tells every other rank at once.
class ProcessWorld final : public World {
 public:
  ProcessWorld(int rank, int size, std::string host);
  std::vector<int> localRanks() const override { return {rank_}; }
  void run(const std::function<void(int rank)>& body) override { body(rank_); }
  // The trainer's communicator and its transport (null for NCCL): failed() asks them for the job's first reason.
  void attach(comm::Communicator* data, comm::Transport* data_link);
  // After this rank failed with x: the job-wide first reason when the trainer's transport holds one, else x's; every
  // rank is told ("rank R (host) failed: ..."). Returns the reason.
  std::string failed(const std::exception& x);
  // "rank R (host)"
  std::string label() const;

 private:
  int rank_;
  std::string host_;
  comm::Communicator* data_ = nullptr;
  comm::Transport* data_link_ = nullptr;
};

}  // namespace terse::runner::detail

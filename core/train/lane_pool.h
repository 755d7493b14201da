// A group scheduler's lanes (group_scheduler.h, max_groups_in_flight > 1): threads that each run one group at a time
// on a communication channel and an aggregation engine of their own, so that several groups are in flight at once.
//
// Hand-over in: submit() queues a job and the first free lane takes the oldest (the pool's own mutex guards that queue
// and nothing else). What a lane does with a job -- and how it hands it back -- is the owner's, the function given to
// start(): the group scheduler runs the group and queues it for its communication thread, under its own lock. The
// channels are opened on the communicator the pool is given, one per lane; a lane's collectives run on its channel,
// selected by the job (CommChannel::select), so that every rank's lane k talks to the others' on the same ids.
//
// The lanes are runtime threads (core/common/runtime.h): in a simulation they are actors on the rank's host.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/runtime.h"
#include "core/compress/engine.h"

namespace terse::train {

// One lane's collectives: its channel and the engine that runs groups on it.
struct Lane {
  std::unique_ptr<comm::CommChannel> channel;
  std::unique_ptr<AggregationEngine> engine;
};

// `count` lanes on `comm`, none when count <= 1 (one group at a time runs on the caller's thread). Throws
// InvalidArgument, naming the communicator, when it cannot run collectives side by side (no channels).
std::vector<Lane> openLanes(comm::Communicator& comm, int count);

template <class Job>
class LanePool {
 public:
  // Runs `job` on `lane` (index `k`); called on lane k's thread, with no lock held. It must not throw.
  using Run = std::function<void(std::unique_ptr<Job> job, Lane& lane, std::size_t k)>;

  LanePool(comm::Communicator& comm, int count) : lanes_(openLanes(comm, count)) {}
  ~LanePool() { stop(); }
  LanePool(const LanePool&) = delete;
  LanePool& operator=(const LanePool&) = delete;

  bool empty() const noexcept { return lanes_.empty(); }
  std::size_t size() const noexcept { return lanes_.size(); }

  // Starts the lanes' threads, named "lane <rank>.<k>" and placed on `rank`'s machine.
  void start(Run run, int rank) {
    run_ = std::move(run);
    for (std::size_t k = 0; k < lanes_.size(); ++k)
      threads_.emplace_back(
          "lane " + std::to_string(rank) + "." + std::to_string(k), [this, k] { loop(k); }, rank);
  }

  void submit(std::unique_ptr<Job> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // The lanes run the jobs already submitted, then return; joins them. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (rt::Thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop(std::size_t k) {
    for (;;) {
      std::unique_ptr<Job> job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      run_(std::move(job), lanes_[k], k);
    }
  }

  std::vector<Lane> lanes_;
  Run run_;
  std::vector<rt::Thread> threads_;
  rt::Mutex mutex_;  // guards jobs_ and stop_
  rt::CondVar cv_;   // lanes wait here for jobs
  std::deque<std::unique_ptr<Job>> jobs_;
  bool stop_ = false;
};

}  // namespace terse::train

#include "experiments/runner/world.h"

#include <stdexcept>
#include <utility>

#include "core/common/runtime.h"
#include "experiments/runner/runner_detail.h"

namespace terse::runner::detail {

World::World(int size) : size_(size) {
  overrun_ = abortOnOverrun([this](const std::string& reason) { abortAll(overrun_prefix_ + reason); });
}

void World::onAbort(std::function<void(const std::string& reason)> abort) {
  std::lock_guard lock(mutex_);
  aborts_.push_back(std::move(abort));
}

void World::abortAll(const std::string& reason) {
  std::vector<std::function<void(const std::string&)>> aborts;
  {
    std::lock_guard lock(mutex_);
    aborts = aborts_;
  }
  for (const auto& a : aborts) a(reason);
}

ThreadWorld::ThreadWorld(int size, std::function<std::string(int rank)> label) : World(size), label_(std::move(label)) {
  if (!label_) label_ = [](int rank) { return "rank " + std::to_string(rank); };
}

std::vector<int> ThreadWorld::localRanks() const {
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) ranks.push_back(r);
  return ranks;
}

void ThreadWorld::fail(int rank, std::exception_ptr err) {
  {
    std::lock_guard lock(error_mutex_);
    if (!error_ || (isCommError(error_) && !isCommError(err))) {
      error_ = err;
      error_rank_ = rank;
    }
  }
  abortAll(label_(rank) + " failed: " + shortWhat(err));
}

void ThreadWorld::run(const std::function<void(int rank)>& body, const std::function<void()>& monitor) {
  std::exception_ptr monitor_error;
  {
    std::vector<rt::Thread> threads;
    try {
      for (int r = 0; r < size(); ++r) {
        threads.emplace_back(
            "worker " + std::to_string(r),
            [this, &body, r] {
              try {
                enterRank(r);
                body(r);
              } catch (...) {
                fail(r, std::current_exception());
              }
            },
            r);
      }
    } catch (const std::exception& x) {
      // The ranks started so far would wait for the others forever: abort them before their threads are joined.
      abortAll(std::string("starting the ranks' threads failed: ") + x.what());
      throw;
    }
    try {
      monitor();
    } catch (...) {
      monitor_error = std::current_exception();
      abortAll("the run failed: " + shortWhat(monitor_error));  // the ranks must not wait for it forever
    }
    for (auto& t : threads) t.join();
  }
  if (monitor_error) std::rethrow_exception(monitor_error);
  std::lock_guard lock(error_mutex_);
  if (error_) throw std::runtime_error(label_(error_rank_) + ": " + shortWhat(error_));
}

SimulatedWorld::SimulatedWorld(std::vector<double> slowdowns, std::function<std::string(int rank)> label)
    : ThreadWorld(static_cast<int>(slowdowns.size()), std::move(label)), slowdowns_(std::move(slowdowns)) {}

void SimulatedWorld::enterRank(int rank) {
  rt::backend().setSlowdown(slowdowns_[static_cast<std::size_t>(rank)]);
}

void SimulatedWorld::aside(const std::function<void()>& fn) const {
  rt::uncounted(fn);
}

ProcessWorld::ProcessWorld(int rank, int size, std::string host) : World(size), rank_(rank), host_(std::move(host)) {
  overrun_prefix_ = label() + " failed: ";
}

std::string ProcessWorld::label() const {
  return "rank " + std::to_string(rank_) + " (" + host_ + ")";
}

void ProcessWorld::attach(comm::Communicator* data, comm::Transport* data_link) {
  data_ = data;
  data_link_ = data_link;
}

std::string ProcessWorld::failed(const std::exception& x) {
  std::string what = x.what();
  // A dead rank fails both transports, and which one this rank notices first is a race: the control channel may only
  // see the next rank hang up, while the trainer's transport holds the job-wide first reason (the abort notices travel
  // there). Report that one when there is one.
  if (data_link_ != nullptr && data_link_->aborted() && data_ != nullptr) {
    try {
      data_->barrier();  // on an aborted communicator: throws at once, naming the first failure (communicator.h)
    } catch (const std::exception& first) {
      what = first.what();
    }
  }
  // Tell every other rank at once (the first reason wins job-wide) instead of letting them find out by timeout.
  abortAll(label() + " failed: " + what);
  return what;
}

}  // namespace terse::runner::detail

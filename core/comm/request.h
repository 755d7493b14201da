// A handle on an operation in flight (a transport send or receive, or a whole collective on a communicator's worker):
// test() polls, wait() blocks; both rethrow the operation's error. Handles are shared: copies refer to the same
// operation. The buffers an operation was given must stay valid, and unmodified for a send, until it completed
// (test() returned true or wait() returned) — exactly MPI's rule for isend/irecv. Dropping the last handle of an
// unfinished transport request is safe: a receive is cancelled, a send still delivers its data (inproc_transport.h).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "core/common/runtime.h"

namespace terse::comm {

class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // True once complete; may do a bounded piece of the operation's work (e.g. the copy of a matched frame).
  virtual bool test() = 0;
  virtual void wait() = 0;
  // Payload bytes moved: a receive's frame length, a send's length. 0 for collectives.
  virtual uint64_t bytes() const { return 0; }
};

class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}

  bool valid() const noexcept { return impl_ != nullptr; }
  // An empty handle is complete.
  bool test() { return impl_ == nullptr || impl_->test(); }
  void wait() {
    if (impl_) impl_->wait();
  }
  uint64_t bytes() const { return impl_ ? impl_->bytes() : 0; }
  // No other handle shares this request's operation (an empty handle is alone too).
  bool alone() const noexcept { return impl_.use_count() <= 1; }

 private:
  std::shared_ptr<RequestImpl> impl_;
};

// A completion another thread signals once: used by work run on a worker thread.
class Completion final : public RequestImpl {
 public:
  void complete(std::exception_ptr error = nullptr) {
    {
      std::lock_guard lock(mutex_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }
  bool test() override {
    std::lock_guard lock(mutex_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  rt::Mutex mutex_;  // the runtime's: waits block in simulated time in a simulation
  rt::CondVar cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace terse::comm

// The pacer of the tcp transport under link emulation (link_emulation.h): the rank's NIC, one thread per transport,
// which releases each outgoing link's frames to its writer slice by slice at the emulated rate; internal to
// core/comm/tcp/.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/link_emulation.h"
#include "core/comm/tcp/link.h"

namespace terse::comm::tcp {

// Reserves the slices of the frames queued on the outgoing links on the link's and the egress port's token buckets,
// and hands each slice to the link's writer when it has left them, so the bytes reach the peer at the emulated rate.
// A frame has been sent when its last slice left: the pacer then sets its SendOp's sent_at. The links' emulation
// fields (Link::spec ... Link::release) and the egress port are guarded by the pacer's mutex.
class Pacer {
 public:
  explicit Pacer(const EmulationConfig& emulation);
  ~Pacer() { stop(); }
  Pacer(const Pacer&) = delete;
  Pacer& operator=(const Pacer&) = delete;

  // Queues a data frame on its link's NIC. Called under the link's mutex, so the pacer releases each link's frames in
  // the order they were sent; wake() the pacer once that mutex is released.
  void enqueue(Link& l, const std::shared_ptr<SendOp>& op);
  void wake() { cv_.notify_all(); }
  // Forgets what is queued and reserved on a lost link, or on every link (an abort): those frames never go out, and
  // their requests fail through the link's `broken`.
  void drop(Link& l);
  void dropAll(const std::vector<std::shared_ptr<Link>>& links);

  // Starts the thread; the pacer walks every link, so it starts once they all exist. `released(l)` runs on the pacer
  // thread, without its mutex, after slices were appended to l.writes: the link's writer must run.
  void start(const std::vector<std::shared_ptr<Link>>& links, std::function<void(Link&)> released);
  void stop();

 private:
  void loop();

  const uint64_t slice_;
  const std::vector<std::shared_ptr<Link>>* links_ = nullptr;
  std::function<void(Link&)> released_;

  std::mutex mutex_;
  std::condition_variable cv_;
  PacedResource egress_;  // the rank's egress port
  std::size_t next_ = 0;  // round robin among links whose slices could start at the same time
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace terse::comm::tcp

// The tcp transport's pacer (pacer.h): the emulated NIC's thread, which reserves slices on the token buckets and
// releases them to the links' writers when they have left.
#include "core/comm/tcp/pacer.h"

#include <sys/prctl.h>

#include <algorithm>

namespace terse::comm::tcp {

Pacer::Pacer(const EmulationConfig& emulation) : slice_(emulation.slice_bytes), egress_(emulation.nic_egress_bps) {}

void Pacer::enqueue(Link& l, const std::shared_ptr<SendOp>& op) {
  std::lock_guard lock(mutex_);
  l.nic_queue.push_back(op);
}

void Pacer::drop(Link& l) {
  {
    std::lock_guard lock(mutex_);
    l.nic_queue.clear();
    l.release.clear();
    l.head_reserved = 0;
  }
  cv_.notify_all();
}

void Pacer::dropAll(const std::vector<std::shared_ptr<Link>>& links) {
  {
    std::lock_guard lock(mutex_);
    for (auto& lp : links) {
      if (!lp) continue;
      lp->nic_queue.clear();
      lp->release.clear();
      lp->head_reserved = 0;
    }
  }
  cv_.notify_all();
}

void Pacer::start(const std::vector<std::shared_ptr<Link>>& links, std::function<void(Link&)> released) {
  links_ = &links;
  released_ = std::move(released);
  thread_ = std::thread([this] { loop(); });
}

void Pacer::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Pacer::loop() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  const std::vector<std::shared_ptr<Link>>& links = *links_;
  const std::size_t n = links.size();
  std::unique_lock lock(mutex_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    // Release the slices that have left.
    for (auto& lp : links) {
      Link& l = *lp;
      if (l.release.empty()) continue;
      std::vector<WriteItem> ready;
      while (!l.release.empty() && l.release.front().first <= now) {
        ready.push_back(std::move(l.release.front().second));
        l.release.pop_front();
      }
      if (!l.release.empty()) wake = std::min(wake, l.release.front().first);
      if (ready.empty()) continue;
      lock.unlock();
      {
        std::lock_guard link_lock(l.mutex);
        if (l.broken.empty())
          for (auto& w : ready) l.writes.push_back(std::move(w));
      }
      released_(l);
      lock.lock();
    }
    // Pick the link whose next slice can start first (round robin among equals).
    Link* best = nullptr;
    Clock::time_point best_start{};
    for (std::size_t k = 0; k < n; ++k) {
      Link& l = *links[(next_ + k) % n];
      if (l.nic_queue.empty()) continue;
      Clock::time_point start = std::max(l.nic_queue.front()->queued_at, l.wire.busyUntil());
      if (egress_.limited()) start = std::max(start, egress_.busyUntil());
      if (best == nullptr || start < best_start) {
        best = &l;
        best_start = start;
      }
    }
    if (best == nullptr || best_start > now) {
      if (best != nullptr) wake = std::min(wake, best_start);
      if (wake == Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, wake);
      }
      continue;
    }
    Link& l = *best;
    std::shared_ptr<SendOp> head = l.nic_queue.front();
    const uint64_t b = std::min(slice_, head->wire_bytes - l.head_reserved);
    Clock::time_point end = l.wire.occupy(best_start, b);
    end = std::max(end, egress_.occupy(best_start, b));
    l.release.emplace_back(end, WriteItem{head, l.head_reserved, l.head_reserved + b});
    l.head_reserved += b;
    l.head_end = std::max(l.head_end, end);
    next_ = (static_cast<std::size_t>(l.peer) + 1) % n;
    if (l.head_reserved == head->wire_bytes) {
      const Clock::time_point sent_at = l.head_end;
      l.nic_queue.pop_front();
      l.head_reserved = 0;
      l.head_end = Clock::time_point{};
      lock.unlock();
      {
        std::lock_guard link_lock(l.mutex);
        head->sent_at = sent_at;
        head->scheduled = true;
      }
      l.notifyWaiters();
      lock.lock();
    }
  }
}

}  // namespace terse::comm::tcp

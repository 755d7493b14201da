#include "core/comm/inproc_transport.h"

#include <sys/prctl.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <boost/intrusive/list.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/comm/reduce.h"
#include "core/comm/spin_wait.h"
#include "core/common/error.h"
#include "core/common/runtime.h"

namespace terse::comm {
namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  FrameHeader header;
  const std::byte* data = nullptr;  // the sender's buffer (rendezvous) or owned.data() (eager)
  std::vector<std::byte> owned;
  bool eager = false;
  // Guarded by the link's mutex.
  enum class Copy : uint8_t { kPending, kCopying, kDone };
  Copy copy = Copy::kPending;
  bool matched = false;
  std::byte* dst = nullptr;  // the matched receive's buffer
  bool reduce = false;       // add into dst as reduce_dtype instead of copying (irecvReduce)
  DType reduce_dtype = DType::kF32;
  bool scheduled = false;         // emulation: sent_at and deliver_at are known (always true without emulation)
  Clock::time_point queued_at{};  // when the sender handed it to the transport (emulation's arrival time)
  Clock::time_point sent_at{};
  Clock::time_point deliver_at{};
  std::shared_ptr<FrameNetwork::Transfer> transfer;  // simulated time: the frame's transfer on the network
};

// On its link's posted list (Link::posted) through the hook, from irecv until matched or dropped. Safe-link mode: the
// hook knows whether it is on the list, which a dropped receive asks.
struct PostedRecv : boost::intrusive::list_base_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>> {
  FrameMeta expect;
  std::span<std::byte> buffer;
  bool reduce = false;
  DType reduce_dtype = DType::kF32;
  // Guarded by the link's mutex.
  std::shared_ptr<Frame> frame;  // set when matched (and the frame fits), until the sender delivered it
  std::string error;             // a matched frame was rejected (kind or length), InvalidPayload
  uint64_t length = 0;
  // The sender moved its frame into the buffer and let go of it (Fabric::deliverToPosted): the receive is complete.
  // Set under the mutex, with release, after `length` and the bytes; the receiver's wait reads it first without the
  // lock, so a receive completed before its wait costs no lock hand-over at all.
  std::atomic<bool> delivered{false};
};

struct Link {
  int from = 0;
  int to = 0;
  std::string where;  // "link 0 -> 1"
  // The runtime's, not std's: in a simulation the requests of a link block in simulated time (runtime.h).
  rt::Mutex mutex;
  rt::CondVar cv;
  // Set when the link is made, read on every request: kept off the lines below, which the two threads write.
  Clock::duration spin{};         // a blocking wait's spin budget; zero: it parks at once
  bool skip_idle_notify = false;  // real time: no notify when nobody is parked (a simulation keeps every call)
  // A backed-off waiter holds its CPU for a short spin before it parks (await): set where the spin is on and the
  // fabric's ranks do not outnumber the CPUs the process may use, so that a rank that holds its CPU keeps none waiting.
  bool hold_when_backed_off = false;
  // Real time without emulation: an eager frame's send is complete when isend returns (its bytes are the frame's own,
  // and nothing times it), and its receive copies it without the lock (copyEagerAlone).
  bool eager_sends_complete = false;
  // Waiting (inproc_transport.h, "Waiting"). Every change a waiter may wait for -- made under `mutex` -- is followed by
  // notifyWaiters(), never by cv.notify_all() alone: it bumps `events`, which a spinning waiter watches, and notifies
  // only when a waiter is parked on cv (`sleepers`, changed under `mutex`). The counter has a cache line of its own:
  // the spinner reads it in a loop, and a neighbour written under the lock would pull the line from under it at every
  // change; the constants above, read by both threads on every request, would miss at every bump of it beside them.
  alignas(64) std::atomic<uint64_t> events{0};
  alignas(64) std::atomic<int> sleepers{0};
  // The CPU the sender (isend) and the receiver (irecv) last posted from, -1 before: a spinning waiter checks whether
  // it shares its CPU with the thread it waits for (spin_wait.h, CpuSharing). Written only when it changed.
  std::atomic<int> sender_cpu{-1};
  std::atomic<int> receiver_cpu{-1};
  static void noteCpu(std::atomic<int>& slot) {
    const int cpu = currentCpu();
    if (slot.load(std::memory_order_relaxed) != cpu) slot.store(cpu, std::memory_order_relaxed);
  }
  void notifyWaiters() {
    events.fetch_add(1, std::memory_order_release);
    // A waiter that found its condition missing did so under `mutex` and counted itself before cv.wait released it;
    // the change was made under `mutex` after that, so this load sees the count (or the waiter saw the change).
    if (!skip_idle_notify || sleepers.load(std::memory_order_relaxed) > 0) cv.notify_all();
  }
  // Sleeps on cv until notified (or spuriously); the caller re-checks its conditions.
  void park(std::unique_lock<rt::Mutex>& lock) {
    sleepers.fetch_add(1, std::memory_order_relaxed);
    cv.wait(lock);
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
  template <class Pred>
  void parkUntil(std::unique_lock<rt::Mutex>& lock, Pred pred) {
    while (!pred()) park(lock);
  }
  // A blocking request's wait for the link's next change: while `budget` runs, spin (spin_wait.h) until `events` moves,
  // then hand the lock back for the caller to re-check; after it, park. `receiving`: the waiter is the link's receiver
  // (the change it waits for is the sender's), else its sender.
  void await(std::unique_lock<rt::Mutex>& lock, SpinBudget& budget, bool receiving);
  // Guarded by mutex.
  std::deque<std::shared_ptr<Frame>> unmatched;
  // Owned by their RecvRequests, which take them off this list when dropped unmatched, oldest first. Intrusive: a
  // sender finds the receive and takes it off in the receive's own line and this one, where a deque's header, its
  // node and a shared count in the receive's line were each a line the two threads passed back and forth.
  boost::intrusive::list<PostedRecv, boost::intrusive::constant_time_size<false>> posted;
  // Bumped (under the mutex) at every receive put on `posted`: a sender that found none watches it for a moment
  // without the lock (Fabric::isend).
  std::atomic<uint32_t> posts{0};
  std::string broken;              // nonempty: every request on the link fails with this reason
  bool broken_by_payload = false;  // InvalidPayload (a malformed header) rather than an abort (CommError)

  // Emulation, guarded by the sending rank's NIC mutex.
  LinkSpec spec;
  PacedResource wire;
  std::deque<std::shared_ptr<Frame>> nic_queue;
  uint64_t head_reserved = 0;  // wire bytes of the head frame already reserved
  Clock::time_point head_end{};
};

// Whether this thread shares its CPU with the threads it waits for (spin_wait.h, CpuSharing). When its waits stop
// spinning for a while is threadSpinStalls(), shared with the tcp transport.
thread_local CpuSharing t_sharing;

// How long a backed-off waiter holds its CPU before it parks (Link::await), within the wait's own budget. Beside two
// CPU-bound processes on 2 vCPUs, 20 us took a 4 KiB allreduce of 2 ranks from 5.2 us (parking) to 3.3, vader 7.1
// (docs/performance.md). A spin that never yields lost whole time slices whenever the peer was descheduled (131 us
// against vader's 43 in one window), so only a backed-off wait holds, and briefly.
constexpr Clock::duration kHeldSpin = std::chrono::microseconds(20);

void Link::await(std::unique_lock<rt::Mutex>& lock, SpinBudget& budget, bool receiving) {
  SpinStalls& stalls = threadSpinStalls();
  // One clock read per spin step, which times the step, runs the budget and dates a CPU move alike: three reads a step
  // were a tenth of a microsecond in a guest, in which a change that came meanwhile went unseen.
  Clock::time_point before = Clock::now();
  if (spin <= Clock::duration::zero() || !budget.running(before)) {
    park(lock);
    return;
  }
  if (!stalls.maySpin(before)) {
    // Backed off (SpinStalls): another process takes this CPU at every yield. Where every rank has a CPU of its own
    // the peer is most likely running and answers within microseconds, so hold the CPU for a short spin without
    // yielding, as a busy-polling MPI does, before parking; a yield would hand the CPU over for a time slice and a
    // park costs a wake-up, which that other process then delays. Not when the peer last ran on this very CPU: it
    // cannot answer while this thread holds it. Measured beside two CPU-bound processes (2 ranks, 4 KiB allreduce,
    // docs/performance.md).
    const int own = currentCpu();
    const int peer_cpu = (receiving ? sender_cpu : receiver_cpu).load(std::memory_order_relaxed);
    if (hold_when_backed_off && peer_cpu != own && budget.within(kHeldSpin, before)) {
      const uint64_t seen = events.load(std::memory_order_acquire);
      lock.unlock();
      const auto changed = [&] { return events.load(std::memory_order_acquire) != seen; };
      while (!holdStepUntil(changed) && budget.within(kHeldSpin, Clock::now())) {
      }
      stalls.heldSpin();
      lock.lock();
      return;
    }
    park(lock);
    return;
  }
  {
    // Read under the lock: a change the caller just found missing is made under it and bumps the counter after.
    const uint64_t seen = events.load(std::memory_order_acquire);
    lock.unlock();
    const auto changed = [&] { return events.load(std::memory_order_acquire) != seen; };
    for (;;) {
      const bool moved = spinStepUntil(changed);
      const Clock::time_point after = Clock::now();
      if (stalls.step(after - before, spin, after)) break;
      if (moved) {
        stalls.progressed();
        const int own = currentCpu();
        const int peer_cpu = (receiving ? sender_cpu : receiver_cpu).load(std::memory_order_relaxed);
        if (t_sharing.spinEnded(receiving ? to : from, receiving ? from : to, peer_cpu, own, after))
          moveToAnotherCpu(own);
        break;
      }
      if (!budget.running(after)) break;
      before = after;
    }
    lock.lock();
  }
}

[[noreturn]] void throwBroken(const Link& l) {
  if (l.broken_by_payload) throw InvalidPayload(l.broken);
  throw CommError(l.broken);
}

// Large receive copies use non-temporal stores, as glibc's memcpy does for large copies: a frame of this size is
// part of a message that does not stay in cache anyway, and writing around the cache saves the read-for-ownership of
// every destination line, a third of the copy's memory traffic (the ring allreduce's allgather is such a copy).
constexpr std::size_t kStreamingCopyBytes = 128 * 1024;

// The pause hints a sender of a small frame watches for its receive to be posted before it stages the frame (about
// 0.4 us on the EPYC measured; Fabric::isend).
constexpr int kAwaitPostPauses = 16;

void copyPayload(std::byte* dst, const std::byte* src, std::size_t len) {
#if defined(__SSE2__)
  if (len >= kStreamingCopyBytes) {
    std::size_t i = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;  // align the stores to a cache line
    std::memcpy(dst, src, i);
    for (; i + 64 <= len; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    _mm_sfence();  // the streamed stores are visible before the copy is marked done
    std::memcpy(dst + i, src + i, len - i);
    return;
  }
#endif
  if (len != 0) std::memcpy(dst, src, len);
}

// Moves a matched frame's bytes into its receive's buffer: a copy, or irecvReduce's sum. Called without the lock.
void moveBytes(Frame& f) {
  const auto len = static_cast<std::size_t>(f.header.length);
  if (f.reduce) {
    // Simulated time: each piece is added once it has arrived (inproc_transport.h), so the sum of all but the last
    // piece runs while the rest is in flight, as the tcp transport's reads do. Elementwise, so the pieces give the
    // whole frame's bits.
    FrameNetwork::Transfer* transfer = f.transfer.get();
    const std::size_t elem = dtypeSize(f.reduce_dtype);
    std::size_t step = len;
    if (transfer != nullptr && transfer->pieceBytes() != 0 && transfer->pieceBytes() < len)
      step = std::max<std::size_t>(static_cast<std::size_t>(transfer->pieceBytes()) / elem * elem, elem);
    for (std::size_t off = 0; off < len; off += step) {
      const std::size_t bytes = std::min(step, len - off);
      if (transfer != nullptr) transfer->waitBytes(kFrameHeaderBytes + off + bytes);
      sumInto(f.dst + off, f.data + off, bytes / elem, f.reduce_dtype);  // a kSum kernel region (reduce.h)
    }
  } else {
    // A real NIC's DMA lands the bytes: the copy is not the rank's computation (the network times the transfer). The
    // sum above is: a real rank adds what it received.
    rt::uncounted([&] { copyPayload(f.dst, f.data, len); });
  }
}

// The single copy of a matched frame, done outside the lock; kCopying keeps both owners of the buffers from leaving
// (or the abort path from declaring the request failed) while it runs.
void copyFrame(std::unique_lock<rt::Mutex>& lock, Link& l, Frame& f) {
  f.copy = Frame::Copy::kCopying;
  lock.unlock();
  moveBytes(f);
  lock.lock();
  f.copy = Frame::Copy::kDone;
  l.notifyWaiters();
}

// The receive's copy of an eager frame on a link whose eager sends complete at once (Link::eager_sends_complete):
// nobody else waits for it -- the send is done, the sender's bytes are the frame's own -- so it is marked done before
// the lock is let go, and neither the lock taken again nor the waiters told after: two of the four lock hand-overs a
// small message cost, and the ones its sender and receiver fought over (a futex wake-up each in a profile of 4 KiB
// allreduces).
// Returns with the lock released.
void copyEagerAlone(std::unique_lock<rt::Mutex>& lock, Frame& f) {
  f.copy = Frame::Copy::kDone;
  lock.unlock();
  moveBytes(f);
}

// A non-blocking request's check before it adds a frame (irecvReduce) in simulated time: the bytes are added once
// they have arrived (copyFrame), so until then the request is not done rather than waiting for them. The lock is let
// go around the transfer's test (a runtime call); the caller re-checks the frame's state.
bool readyToAdd(std::unique_lock<rt::Mutex>& lock, const Frame& f) {
  if (!f.reduce || !f.transfer) return true;
  const std::shared_ptr<FrameNetwork::Transfer> transfer = f.transfer;
  lock.unlock();
  const bool arrived = transfer->test();
  lock.lock();
  return arrived;
}

// The time side of a request whose frame is matched and copied: the emulated instant `t` (real time), or the frame's
// transfer on a simulated network. Blocks when `block`; otherwise says whether that time has come.
bool arrived(Clock::time_point t, FrameNetwork::Transfer* transfer, bool block) {
  if (transfer != nullptr) {
    if (!block) return transfer->test();
    transfer->wait();
    return true;
  }
  if (!block) return Clock::now() >= t;
  sleepUntilPrecise(t);
  return true;
}

struct Nic {
  std::mutex mutex;
  std::condition_variable cv;
  // Guarded by mutex.
  PacedResource egress;
  std::size_t next = 0;  // round-robin start among outgoing links
  bool stop = false;
  std::thread thread;
};

struct Ingress {
  std::mutex mutex;
  PacedResource port;  // guarded by mutex
};

// A rank's doorbell (Transport::activityBell), in simulated time only.
struct Bell final : ActivityBell {
  rt::Mutex mutex;
  rt::CondVar cv;
  uint64_t count = 0;  // guarded by mutex

  uint64_t rings() override {
    std::lock_guard lock(mutex);
    return count;
  }
  void ring() {
    {
      std::lock_guard lock(mutex);
      ++count;
    }
    cv.notify_all();
  }
  void waitUntil(uint64_t seen, Clock::time_point deadline) override {
    std::unique_lock lock(mutex);
    if (deadline == Clock::time_point::max()) {
      cv.wait(lock, [&] { return count != seen; });
    } else {
      cv.waitUntil(lock, deadline, [&] { return count != seen; });
    }
  }
};

// A frame's bytes copied into its own storage: the sender's buffer is free from then on (an eager send, or a dropped
// send whose frame no receive has matched yet).
void stage(Frame& f) {
  f.owned.assign(f.data, f.data + f.header.length);
  f.data = f.owned.data();
}

class Fabric;

class SendRequest final : public RequestImpl {
 public:
  // `done`: complete already (an eager frame where Link::eager_sends_complete).
  // A send complete at once keeps nothing of its frame but the length: the frame is the receiver's from then on (or
  // was never on the heap: Fabric::isend), and a count shared with it was one more line the two threads pulled back and
  // forth.
  SendRequest(std::shared_ptr<const void> keep, Link* link, std::shared_ptr<Frame> frame, bool done)
      : keep_(std::move(keep)), link_(link), bytes_(frame->header.length), done_(done) {
    if (!done_) frame_ = std::move(frame);
  }
  SendRequest(std::shared_ptr<const void> keep, Link* link, uint64_t bytes)
      : keep_(std::move(keep)), link_(link), bytes_(bytes), done_(true) {}
  // A send dropped before completing must not leave the link pointing into a buffer its owner may free next: a matched
  // frame is copied now, an unmatched one is staged into its own storage (and still delivered).
  ~SendRequest() override {
    if (done_) return;
    Link& l = *link_;
    Frame& f = *frame_;
    std::unique_lock lock(l.mutex);
    l.parkUntil(lock, [&] { return f.copy != Frame::Copy::kCopying; });
    if (f.eager || f.copy != Frame::Copy::kPending) return;
    if (f.matched) {
      copyFrame(lock, l, f);
    } else {
      stage(f);
      f.eager = true;
    }
  }
  bool test() override { return progress(false); }
  void wait() override { progress(true); }
  uint64_t bytes() const override { return bytes_; }

 private:
  bool progress(bool block) {
    if (done_) return true;
    Link& l = *link_;
    Frame& f = *frame_;
    SpinBudget spin(l.spin);
    std::unique_lock lock(l.mutex);
    for (;;) {
      if (f.copy == Frame::Copy::kCopying) {
        if (!block) return false;
        l.await(lock, spin, false);
        continue;
      }
      if ((f.eager || f.copy == Frame::Copy::kDone) && f.scheduled) break;
      if (!l.broken.empty()) throwBroken(l);
      if (!f.eager && f.matched && f.copy == Frame::Copy::kPending) {
        if (!block && !readyToAdd(lock, f)) return false;
        if (f.copy == Frame::Copy::kPending) copyFrame(lock, l, f);
        continue;
      }
      if (!block) return false;
      l.await(lock, spin, false);
    }
    const Clock::time_point t = f.sent_at;
    const std::shared_ptr<FrameNetwork::Transfer> transfer = f.transfer;
    lock.unlock();
    if (!arrived(t, transfer.get(), block)) return false;
    done_ = true;
    return true;
  }

  std::shared_ptr<const void> keep_;  // keeps the link alive (Endpoint::keep_)
  Link* link_;
  uint64_t bytes_;
  std::shared_ptr<Frame> frame_;  // null when done at once
  bool done_ = false;
};

class RecvRequest final : public RequestImpl {
 public:
  RecvRequest(std::shared_ptr<const void> keep, Link* link, const FrameMeta& expect, std::span<std::byte> buffer,
              bool reduce, DType dtype)
      : keep_(std::move(keep)), link_(link) {
    recv_.expect = expect;
    recv_.buffer = buffer;
    recv_.reduce = reduce;
    recv_.reduce_dtype = dtype;
  }
  PostedRecv& posted() noexcept { return recv_; }
  // A receive dropped before completing is cancelled: it leaves the posted list, or its matched frame is consumed
  // without touching the buffer, which its owner may free next.
  ~RecvRequest() override {
    if (done_) return;
    Link& l = *link_;
    std::unique_lock lock(l.mutex);
    if (!recv_.frame) {
      if (recv_.is_linked()) l.posted.erase(l.posted.iterator_to(recv_));
      return;
    }
    Frame& f = *recv_.frame;
    l.parkUntil(lock, [&] { return f.copy != Frame::Copy::kCopying; });
    if (f.copy == Frame::Copy::kPending) {
      f.copy = Frame::Copy::kDone;
      l.notifyWaiters();
    }
  }
  bool test() override { return progress(false); }
  void wait() override { progress(true); }
  uint64_t bytes() const override { return length_; }

 private:
  bool progress(bool block) {
    if (done_) return true;
    Link& l = *link_;
    PostedRecv& r = recv_;
    if (r.delivered.load(std::memory_order_acquire)) return complete(r.length);
    SpinBudget spin(l.spin);
    std::unique_lock lock(l.mutex);
    for (;;) {
      if (r.delivered.load(std::memory_order_relaxed)) return complete(r.length);
      if (!r.error.empty()) throw InvalidPayload(r.error);
      if (r.frame) {
        Frame& f = *r.frame;
        if (f.copy == Frame::Copy::kCopying) {
          if (!block) return false;
          l.await(lock, spin, true);
          continue;
        }
        if (f.copy == Frame::Copy::kDone && f.scheduled) break;
        if (!l.broken.empty()) throwBroken(l);
        if (f.copy == Frame::Copy::kPending) {
          if (!block && !readyToAdd(lock, f)) return false;
          if (f.copy == Frame::Copy::kPending && f.eager && l.eager_sends_complete) {
            const uint64_t length = r.length;
            copyEagerAlone(lock, f);
            length_ = length;
            done_ = true;
            return true;
          }
          if (f.copy == Frame::Copy::kPending) copyFrame(lock, l, f);
          continue;
        }
      } else if (!l.broken.empty()) {
        throwBroken(l);
      }
      if (!block) return false;
      l.await(lock, spin, true);
    }
    const Clock::time_point t = r.frame->deliver_at;
    const std::shared_ptr<FrameNetwork::Transfer> transfer = r.frame->transfer;
    const uint64_t length = r.length;
    lock.unlock();
    if (!arrived(t, transfer.get(), block)) return false;
    return complete(length);
  }
  bool complete(uint64_t length) {
    length_ = length;
    done_ = true;
    return true;
  }

  std::shared_ptr<const void> keep_;  // keeps the link alive (Endpoint::keep_)
  Link* link_;
  PostedRecv recv_;  // on the link's posted list until matched (or this request is dropped)
  uint64_t length_ = 0;
  bool done_ = false;
};

class Fabric final : public InprocFabric, public std::enable_shared_from_this<Fabric> {
 public:
  Fabric(int n, const InprocOptions& options, int spin_us)
      : n_(n),
        options_(options),
        network_(options.network),
        emulated_(!network_ && options.emulation.enabled()),
        spin_us_(spin_us),
        skip_idle_notify_(!network_ && !rt::simulated()),
        hold_when_backed_off_(spin_us > 0 && n <= allowedCpus()) {
    // Links are made on first use: a ring or a tree touches O(1) peers per rank, and a link (a runtime mutex and
    // condition variable, queues) made for every pair took 2.9 GB at 1,024 simulated ranks. The table itself is one
    // pointer per pair (8 MB at 1,024).
    links_ = std::make_unique<std::atomic<Link*>[]>(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) counters_.push_back(std::make_unique<TrafficCounter>(r));
    if (network_) {
      bells_.resize(static_cast<std::size_t>(n));
      armed_ = std::make_unique<std::atomic<Bell*>[]>(static_cast<std::size_t>(n));
    }
    if (emulated_) {
      for (int r = 0; r < n; ++r) {
        auto nic = std::make_unique<Nic>();
        nic->egress = PacedResource(options.emulation.nic_egress_bps);
        nics_.push_back(std::move(nic));
        auto in = std::make_unique<Ingress>();
        in->port = PacedResource(options.emulation.nic_ingress_bps);
        ingress_.push_back(std::move(in));
      }
      for (int r = 0; r < n; ++r) nics_[static_cast<std::size_t>(r)]->thread = std::thread([this, r] { nicLoop(r); });
    }
  }

  ~Fabric() override {
    for (std::size_t i = 0; i < static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_); ++i)
      delete links_[i].load();
    for (auto& nic : nics_) {
      {
        std::lock_guard lock(nic->mutex);
        nic->stop = true;
      }
      nic->cv.notify_all();
    }
    for (auto& nic : nics_) nic->thread.join();
  }

  int size() const noexcept override { return n_; }
  const InprocOptions& options() const noexcept override { return options_; }
  int spinMicroseconds() const noexcept override { return spin_us_; }
  bool holdsWhenBackedOff() const noexcept override { return hold_when_backed_off_; }
  std::unique_ptr<Transport> endpoint(int rank) override;

  std::vector<RankTraffic> traffic() const override {
    std::vector<RankTraffic> out;
    for (const auto& c : counters_) out.push_back(c->snapshot());
    return out;
  }
  void resetTraffic() override {
    for (auto& c : counters_) c->reset();
  }
  RankTraffic rankTraffic(int rank) const { return counters_[static_cast<std::size_t>(rank)]->snapshot(); }
  void resetRankTraffic(int rank) { counters_[static_cast<std::size_t>(rank)]->reset(); }

  void abort(const std::string& reason) override {
    std::string message;
    {
      std::lock_guard lock(abort_mutex_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
      message = "communication aborted: " + reason;
    }
    // A link made from here on sees aborted_ (link()), so it is born broken.
    for (std::size_t i = 0; i < static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_); ++i)
      if (Link* l = links_[i].load()) breakLink(*l, message);
    for (auto& nic : nics_) nic->cv.notify_all();
    for (int r = 0; r < static_cast<int>(bells_.size()); ++r)
      if (Bell* b = armed_[static_cast<std::size_t>(r)].load()) b->ring();
  }

  // Simulated time only (the class comment in inproc_transport.h); made on the first call.
  ActivityBell* bell(int rank) {
    if (!network_) return nullptr;
    if (Bell* b = armed_[static_cast<std::size_t>(rank)].load()) return b;
    // Made before the lock is taken: its runtime objects are SimGrid's, whose creation may let other actors run.
    auto made = std::make_unique<Bell>();
    std::lock_guard lock(bells_mutex_);
    auto& b = bells_[static_cast<std::size_t>(rank)];
    if (!b) {
      b = std::move(made);
      armed_[static_cast<std::size_t>(rank)].store(b.get());
    }
    return b.get();
  }
  bool aborted() const noexcept override { return aborted_.load(); }

  void injectRawFrame(int from, int to, std::span<const std::byte> header,
                      std::span<const std::byte> payload) override {
    checkRank(from, "injectRawFrame: from");
    checkRank(to, "injectRawFrame: to");
    auto f = std::make_shared<Frame>();
    f->eager = true;
    f->owned.assign(payload.begin(), payload.end());
    f->data = f->owned.data();
    f->scheduled = true;
    Link& l = link(from, to);
    {
      std::lock_guard lock(l.mutex);
      arrive(l, f, header);
    }
    l.notifyWaiters();
    if (Bell* b = network_ ? armed_[static_cast<std::size_t>(to)].load() : nullptr) b->ring();
  }

  // `keep`: the calling endpoint's hold on the fabric, which its requests share (Endpoint::keep_).
  Request isend(const std::shared_ptr<const void>& keep, int rank, int peer, const FrameMeta& meta,
                std::span<const std::byte> data) {
    checkRank(peer, "isend: peer");
    TERSE_CHECK(data.size() <= options_.max_frame_bytes, InvalidArgument,
                "isend to rank " << peer << ": frame of " << data.size() << " bytes exceeds the maximum of "
                                 << options_.max_frame_bytes);
    TERSE_CHECK(data.data() != nullptr || data.empty(), InvalidArgument, "isend: null data");
    FrameHeader header;
    header.meta = meta;
    header.length = data.size();
    // As the wire would carry it: encoded here, decoded and validated on arrival.
    const EncodedHeader raw = encodeFrameHeader(header);
    Link& l = link(rank, peer);
    const bool eager = data.size() <= options_.eager_bytes;
    // Where nothing times the link, a frame whose receive is posted is moved by the sender (deliverToPosted), and one
    // staged otherwise; elsewhere -- emulated links, simulated time -- an eager frame is staged at once, as always.
    const bool direct = eager && l.eager_sends_complete;
    if (l.spin > Clock::duration::zero()) Link::noteCpu(l.sender_cpu);
    if (direct) {
      // Delivered here and now, the frame never leaves this call: it lives on the stack, and the request keeps only
      // its length.
      Frame local;
      local.header = header;
      local.eager = true;
      local.data = data.data();
      local.scheduled = true;
      std::unique_lock lock(l.mutex);
      if (!l.broken.empty()) throwBroken(l);
      bool delivered = deliverToPosted(l, local, raw, rank, peer, meta, data.size());
      if (!delivered && l.spin > Clock::duration::zero()) {
        // No receive posted yet: where waiting ranks spin, the peer is most likely about to post it (two ranks
        // trading frames post their receives a moment apart), so watch for it a few pause hints before staging the
        // frame, which costs a buffer and a second copy. Which rank of such a pair finds its peer's receive posted
        // set the speed of a whole run: 4 KiB allreduces of 2 ranks came out at 0.9, 1.1 or 1.5 us, 64 KiB at 6 or
        // 14 us; with this watch, 9 alternating rounds gave 1.08 -> 1.04 us (the slowest 1.52 -> 1.29) and 15.0 ->
        // 11.1 us, 4 ranks the same (7.6 and 46 us).
        const uint32_t seen = l.posts.load(std::memory_order_relaxed);
        lock.unlock();
        int i = 0;
        for (; i < kAwaitPostPauses && l.posts.load(std::memory_order_acquire) == seen; ++i) cpuRelax();
        lock.lock();
        if (!l.broken.empty()) throwBroken(l);
        if (i < kAwaitPostPauses) delivered = deliverToPosted(l, local, raw, rank, peer, meta, data.size());
      }
      if (delivered) return sentAtOnce(keep, lock, l, data.size());
    }
    auto f = std::make_shared<Frame>();
    f->header = header;
    f->eager = eager;
    f->data = data.data();
    f->scheduled = !emulated_;
    if (emulated_) f->queued_at = Clock::now();
    // Sent now in simulated time: the frame's transfer runs while the receiver has not matched it yet, as bytes on a
    // wire do (a rank's frames to itself never touch the network).
    if (network_ && peer != rank) f->transfer = network_->start(rank, peer, frameWireBytes(data.size()));
    // Staged outside the lock (up to eager_bytes), which the receiver may want meanwhile.
    if (f->eager) stage(*f);
    {
      std::unique_lock lock(l.mutex);
      if (!l.broken.empty()) throwBroken(l);
      // A receive posted since the look above: the sender moves the bytes still (from its staged copy).
      if (direct && deliverToPosted(l, *f, raw, rank, peer, meta, data.size()))
        return sentAtOnce(keep, lock, l, data.size());
      countFrame(rank, peer, meta, data.size());
      arrive(l, f, raw);
      if (emulated_) {
        // Under the link lock, so the NIC paces the link's frames in the order the receiver matches them.
        Nic& nic = *nics_[static_cast<std::size_t>(rank)];
        std::lock_guard nic_lock(nic.mutex);
        l.nic_queue.push_back(f);
      }
    }
    l.notifyWaiters();
    if (emulated_) nics_[static_cast<std::size_t>(rank)]->cv.notify_all();
    if (Bell* b = network_ ? armed_[static_cast<std::size_t>(peer)].load() : nullptr) {
      // The receiver's request completes when the transfer arrives: that is when its doorbell rings (the fabric, and
      // with it the bell, stays alive until then).
      if (f->transfer) {
        network_->whenArrived(f->transfer, peer, [b, keep = shared_from_this()] { b->ring(); });
      } else {
        b->ring();
      }
    }
    const bool done = f->eager && l.eager_sends_complete;
    return Request(std::make_shared<SendRequest>(keep, &l, std::move(f), done));
  }

  Request irecv(const std::shared_ptr<const void>& keep, int rank, int peer, const FrameMeta& expect,
                std::span<std::byte> buffer, bool reduce = false, DType dtype = DType::kF32) {
    checkRank(peer, "irecv: peer");
    TERSE_CHECK(buffer.data() != nullptr || buffer.empty(), InvalidArgument, "irecv: null buffer");
    TERSE_CHECK(!reduce || isSummable(dtype), Unsupported, "irecvReduce: cannot sum " << dtypeName(dtype));
    Link& l = link(peer, rank);
    auto request = std::make_shared<RecvRequest>(keep, &l, expect, buffer, reduce, dtype);
    PostedRecv& r = request->posted();
    if (l.spin > Clock::duration::zero()) Link::noteCpu(l.receiver_cpu);
    bool matched_queued = false;
    {
      std::lock_guard lock(l.mutex);
      if (!l.broken.empty()) throwBroken(l);
      auto it = std::find_if(l.unmatched.begin(), l.unmatched.end(),
                             [&](const std::shared_ptr<Frame>& f) { return f->header.meta.tag == expect.tag; });
      if (it != l.unmatched.end()) {
        std::shared_ptr<Frame> f = std::move(*it);
        l.unmatched.erase(it);
        if (match(l, r, *f)) r.frame = std::move(f);
        matched_queued = true;
      } else {
        l.posted.push_back(r);
        l.posts.store(l.posts.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      }
    }
    // The frame's sender may be blocked in wait() until its frame is matched (to copy it) or consumed (refused): wake
    // it, or a sender of a large frame would wait forever for a receive that has already come and gone.
    if (matched_queued) l.notifyWaiters();
    return Request(std::move(request));
  }

 private:
  std::atomic<Link*>& slot(int from, int to) {
    return links_[static_cast<std::size_t>(from) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(to)];
  }
  Link& link(int from, int to) {
    std::atomic<Link*>& slot = this->slot(from, to);
    if (Link* l = slot.load()) return *l;
    auto made = std::make_unique<Link>();
    made->from = from;
    made->to = to;
    made->where = "frame on link " + std::to_string(from) + " -> " + std::to_string(to);
    made->spec = options_.emulation.linkSpec(from, to);
    made->wire = PacedResource(made->spec.bandwidth_bps);
    made->spin = std::chrono::microseconds(spin_us_);
    made->skip_idle_notify = skip_idle_notify_;
    made->hold_when_backed_off = hold_when_backed_off_;
    made->eager_sends_complete = skip_idle_notify_ && !emulated_;
    Link* expected = nullptr;
    if (!slot.compare_exchange_strong(expected, made.get())) return *expected;  // another thread made it first
    Link& l = *made.release();
    // abort() stores aborted_ before it scans the table and this reads it after publishing the link (both sequentially
    // consistent), so one of the two sees the other: the link cannot miss an abort.
    if (aborted_.load()) {
      std::string reason;
      {
        std::lock_guard lock(abort_mutex_);
        reason = abort_reason_;
      }
      breakLink(l, "communication aborted: " + reason);
    }
    return l;
  }
  // Idempotent: the first reason stays.
  static void breakLink(Link& l, const std::string& message) {
    {
      std::lock_guard lock(l.mutex);
      if (l.broken.empty()) {
        l.broken = message;
        l.broken_by_payload = false;
      }
    }
    l.notifyWaiters();
  }
  void checkRank(int r, const char* what) const {
    TERSE_CHECK(r >= 0 && r < n_, InvalidArgument, what << " must be in [0, " << n_ << "), got " << r);
  }

  // A frame reaches the receiving end of l: its header is validated as an untrusted one would be, then it is matched
  // with the oldest posted receive of its tag or queued. A malformed header breaks the link: the stream has lost its
  // framing, so nothing after it could be trusted either. Called under l.mutex.
  void arrive(Link& l, const std::shared_ptr<Frame>& f, std::span<const std::byte> raw) {
    if (!decodeArriving(l, *f, raw)) return;
    PostedRecv* r = takePosted(l, f->header.meta.tag);
    if (r == nullptr) {
      l.unmatched.push_back(f);
      return;
    }
    if (match(l, *r, *f)) r->frame = f;
  }
  // The header as the receiving end reads it off the wire, into f.header; false (the link broken) when malformed.
  bool decodeArriving(Link& l, Frame& f, std::span<const std::byte> raw) {
    try {
      f.header = decodeFrameHeader(raw, options_.max_frame_bytes, l.where);
      return true;
    } catch (const InvalidPayload& e) {
      if (l.broken.empty()) {
        l.broken = e.what();
        l.broken_by_payload = true;
      }
      return false;
    }
  }
  // The oldest posted receive of `tag`, or posted.end().
  static auto findPosted(Link& l, Tag tag) {
    return std::find_if(l.posted.begin(), l.posted.end(), [&](const PostedRecv& r) { return r.expect.tag == tag; });
  }
  // The same, taken off the list; null when there is none.
  static PostedRecv* takePosted(Link& l, Tag tag) {
    auto it = findPosted(l, tag);
    if (it == l.posted.end()) return nullptr;
    PostedRecv& r = *it;
    l.posted.erase(it);
    return &r;
  }

  // A frame isend delivered to its posted receive (deliverToPosted, which counted it): the lock let go, the waiters
  // told, and a request complete already.
  Request sentAtOnce(const std::shared_ptr<const void>& keep, std::unique_lock<rt::Mutex>& lock, Link& l,
                     uint64_t bytes) {
    lock.unlock();
    l.notifyWaiters();
    return Request(std::make_shared<SendRequest>(keep, &l, bytes));
  }

  // Called under l.mutex.
  void countFrame(int rank, int peer, const FrameMeta& meta, uint64_t bytes) {
    counters_[static_cast<std::size_t>(rank)]->recordSent(meta, bytes);
    counters_[static_cast<std::size_t>(peer)]->recordReceived(meta, bytes);
  }

  // A small frame whose receive is already posted, on a link whose eager sends complete at once (real time, nothing
  // pacing or timing frames): the sender moves its bytes into the receive's buffer (copies or adds them) itself, under
  // the lock, instead of staging them for the receiver to copy again. One pass over the bytes and no allocation of
  // them, where staging cost two passes and a buffer (header comment, "Copies"). Returns false, changing nothing, when
  // no receive of the frame's tag is posted. The receive keeps nothing of the frame (PostedRecv::delivered), so `f`
  // may be the sender's own (Fabric::isend). Called under l.mutex, with f's data the sender's buffer or its staged
  // copy.
  bool deliverToPosted(Link& l, Frame& f, std::span<const std::byte> raw, int rank, int peer, const FrameMeta& meta,
                       uint64_t bytes) {
    auto it = findPosted(l, f.header.meta.tag);
    if (it == l.posted.end()) return false;
    // Counted before the receive can see its bytes: a receiver that returns and reads its traffic at once must find
    // the frame there (param_server_test's PsPull read one reply of two, one run in a few thousand, when the count
    // followed the delivery).
    countFrame(rank, peer, meta, bytes);
    // Validated as a received header (which leaves the tag as it was), then matched with the oldest receive of its
    // tag, as arrive() does.
    if (!decodeArriving(l, f, raw)) return true;  // the link broke: the frame is consumed
    PostedRecv& r = *it;
    l.posted.erase(it);
    if (match(l, r, f)) {
      if (f.copy == Frame::Copy::kPending) moveBytes(f);
      r.delivered.store(true, std::memory_order_release);
    }
    f.copy = Frame::Copy::kDone;  // moved, or refused by the receive (match() says why)
    return true;
  }

  // Called under l.mutex. A frame the receive cannot take is consumed (its sender completes, as a wire's would) and
  // the receive fails. Returns whether the receive takes it; the caller then links the two (PostedRecv::frame) or
  // delivers it (deliverToPosted).
  bool match(Link& l, PostedRecv& r, Frame& f) {
    const FrameHeader& h = f.header;
    r.length = h.length;
    if (h.meta.kind != r.expect.kind) {
      std::ostringstream m;
      m << detail::where(__FILE__, __LINE__) << l.where << " (tag 0x" << std::hex << h.meta.tag << std::dec
        << ") belongs to a " << opKindName(h.meta.kind) << " operation, the receive expected "
        << opKindName(r.expect.kind) << " (two operations share a tag)";
      r.error = m.str();
      f.copy = Frame::Copy::kDone;
    } else if (r.reduce && h.length % dtypeSize(r.reduce_dtype) != 0) {
      std::ostringstream m;
      m << detail::where(__FILE__, __LINE__) << l.where << " (" << opKindName(h.meta.kind) << ") carries " << h.length
        << " bytes, not a whole number of " << dtypeName(r.reduce_dtype) << " elements to add";
      r.error = m.str();
      f.copy = Frame::Copy::kDone;
    } else if (h.length > r.buffer.size()) {
      std::ostringstream m;
      m << detail::where(__FILE__, __LINE__) << l.where << " (" << opKindName(h.meta.kind) << ", tag 0x" << std::hex
        << h.meta.tag << std::dec << ") carries " << h.length << " bytes, the receive buffer holds " << r.buffer.size();
      r.error = m.str();
      f.copy = Frame::Copy::kDone;
    } else {
      f.matched = true;
      f.dst = r.buffer.data();
      f.reduce = r.reduce;
      f.reduce_dtype = r.reduce_dtype;
      if (h.length == 0) f.copy = Frame::Copy::kDone;
      return true;
    }
    return false;
  }

  // The rank's NIC: paces the frames queued on its outgoing links, one slice at a time (link_emulation.h).
  void nicLoop(int rank) {
    // Wake-ups are deadlines of a few microseconds at high emulated rates; the default 50 us timer slack would add
    // that much to every one of them.
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    Nic& nic = *nics_[static_cast<std::size_t>(rank)];
    const uint64_t slice = options_.emulation.slice_bytes;
    std::unique_lock lock(nic.mutex);
    while (!nic.stop) {
      if (aborted_.load()) {
        for (int to = 0; to < n_; ++to)
          if (Link* l = slot(rank, to).load()) l->nic_queue.clear();
        nic.cv.wait(lock);
        continue;
      }
      const Clock::time_point now = Clock::now();
      Link* best = nullptr;
      Clock::time_point best_start{};
      for (int k = 0; k < n_; ++k) {
        const int to = static_cast<int>((nic.next + static_cast<std::size_t>(k)) % static_cast<std::size_t>(n_));
        Link* made = slot(rank, to).load();
        if (made == nullptr || made->nic_queue.empty()) continue;
        Link& l = *made;
        // GCRA: a slice starts when its frame was queued and every resource it crosses is free, in virtual time.
        // That start may lie in the past when the pacer woke late; keeping it (instead of "now") lets the following
        // slices catch up, so wake-up latency never accumulates into the emulated rate.
        Clock::time_point start = std::max(l.nic_queue.front()->queued_at, l.wire.busyUntil());
        if (nic.egress.limited()) start = std::max(start, nic.egress.busyUntil());
        start = std::max(start, ingressStart(to));
        if (best == nullptr || start < best_start) {
          best = &l;
          best_start = start;
        }
      }
      if (best == nullptr) {
        nic.cv.wait(lock);
        continue;
      }
      if (best_start > now) {
        nic.cv.wait_until(lock, best_start);
        continue;
      }
      Link& l = *best;
      const std::shared_ptr<Frame>& head = l.nic_queue.front();
      const uint64_t total = frameWireBytes(head->header.length);
      const uint64_t b = std::min(slice, total - l.head_reserved);
      Clock::time_point start = best_start;
      Clock::time_point end = start;
      if (Ingress* in = ingressOf(l.to)) {
        std::lock_guard in_lock(in->mutex);
        // Another rank's pacer may have taken the port since ingressStart looked.
        start = std::max(start, in->port.busyUntil());
        end = std::max(end, in->port.occupy(start, b));
      }
      end = std::max(end, l.wire.occupy(start, b));
      end = std::max(end, nic.egress.occupy(start, b));
      l.head_reserved += b;
      l.head_end = std::max(l.head_end, end);
      std::shared_ptr<Frame> finished;
      Clock::time_point sent_at{};
      if (l.head_reserved == total) {
        finished = head;
        sent_at = l.head_end;
        l.nic_queue.pop_front();
        l.head_reserved = 0;
        l.head_end = Clock::time_point{};
      }
      nic.next = (static_cast<std::size_t>(l.to) + 1) % static_cast<std::size_t>(n_);
      if (finished) {
        lock.unlock();
        {
          std::lock_guard link_lock(l.mutex);
          finished->sent_at = sent_at;
          finished->deliver_at =
              sent_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(l.spec.latency_s));
          finished->scheduled = true;
        }
        l.notifyWaiters();
        lock.lock();
      }
    }
  }

  Ingress* ingressOf(int rank) {
    Ingress* in = ingress_[static_cast<std::size_t>(rank)].get();
    return in->port.limited() ? in : nullptr;
  }
  Clock::time_point ingressStart(int rank) {
    Ingress* in = ingressOf(rank);
    if (in == nullptr) return Clock::time_point::min();
    std::lock_guard lock(in->mutex);
    return in->port.busyUntil();
  }

  int n_;
  InprocOptions options_;
  std::shared_ptr<FrameNetwork> network_;
  bool emulated_;
  int spin_us_;                                  // resolveInprocSpinUs
  bool skip_idle_notify_;                        // Link::skip_idle_notify
  bool hold_when_backed_off_;                    // Link::hold_when_backed_off
  std::unique_ptr<std::atomic<Link*>[]> links_;  // from * n + to, made by link(), owned here (~Fabric)
  std::vector<std::unique_ptr<TrafficCounter>> counters_;
  std::vector<std::unique_ptr<Nic>> nics_;  // emulation only
  std::vector<std::unique_ptr<Ingress>> ingress_;
  std::mutex bells_mutex_;                       // guards bells_ (made on first use)
  std::vector<std::unique_ptr<Bell>> bells_;     // simulated time: per rank, null until armed
  std::unique_ptr<std::atomic<Bell*>[]> armed_;  // bells_[r].get() once armed, read without the lock
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_
};

class Endpoint final : public Transport {
 public:
  Endpoint(std::shared_ptr<Fabric> fabric, int rank)
      : fabric_(std::move(fabric)), keep_(std::make_shared<std::shared_ptr<Fabric>>(fabric_)), rank_(rank) {}
  std::string_view name() const noexcept override { return "inproc"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return fabric_->size(); }
  uint64_t maxFrameBytes() const noexcept override { return fabric_->options().max_frame_bytes; }
  Request isend(int peer, const FrameMeta& meta, std::span<const std::byte> data) override {
    return fabric_->isend(keep_, rank_, peer, meta, data);
  }
  Request irecv(int peer, const FrameMeta& expect, std::span<std::byte> buffer) override {
    return fabric_->irecv(keep_, rank_, peer, expect, buffer);
  }
  Request irecvReduce(int peer, const FrameMeta& expect, std::span<std::byte> accumulate, DType dtype) override {
    return fabric_->irecv(keep_, rank_, peer, expect, accumulate, true, dtype);
  }
  RankTraffic traffic() const override { return fabric_->rankTraffic(rank_); }
  void resetTraffic() override { fabric_->resetRankTraffic(rank_); }
  void abort(const std::string& reason) override { fabric_->abort("rank " + std::to_string(rank_) + ": " + reason); }
  bool aborted() const noexcept override { return fabric_->aborted(); }
  ActivityBell* activityBell() override { return fabric_->bell(rank_); }

 private:
  std::shared_ptr<Fabric> fabric_;
  // The fabric again, behind a counter of this endpoint's own, which its requests share: they must keep the links
  // alive past the endpoint, and sharing the fabric's own counter made every request an atomic add and subtract on
  // a cache line all the ranks' threads write (a miss each, about a tenth of a 4 KiB allreduce of 2 ranks' cycles).
  std::shared_ptr<const void> keep_;
  int rank_;
};

std::unique_ptr<Transport> Fabric::endpoint(int rank) {
  checkRank(rank, "endpoint: rank");
  return std::make_unique<Endpoint>(shared_from_this(), rank);
}

}  // namespace

int resolveInprocSpinUs(const InprocOptions& options, const EnvLookup& env) {
  const int us =
      resolveSpinMicroseconds(options.spin_us, "inproc transport", "spin_us", "TERSE_INPROC_SPIN_US", env,
                              kDefaultInprocSpinUs, "microseconds a waiting in-process rank spins before it sleeps");
  // Checked first, so that a bad value is reported in these cases too. Simulated time: the actors share one thread, so
  // nothing changes while one spins. Emulated links: the pacer threads set the times and need the CPU.
  if (options.network || rt::simulated() || options.emulation.enabled()) return 0;
  return us;
}

std::shared_ptr<InprocFabric> InprocFabric::create(int world_size, const InprocOptions& options) {
  TERSE_CHECK(world_size >= 1, InvalidArgument, "inproc fabric: world size must be >= 1, got " << world_size);
  options.emulation.validate(world_size);
  const int spin_us = resolveInprocSpinUs(options, processEnv());
  return std::make_shared<Fabric>(world_size, options, spin_us);
}

std::vector<std::unique_ptr<Transport>> makeInprocTransports(int world_size, const InprocOptions& options) {
  auto fabric = InprocFabric::create(world_size, options);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(fabric->endpoint(r));
  return out;
}

}  // namespace terse::comm

#include "core/common/watchdog.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/common/log.h"

namespace terse::watchdog {

// One thread's mark. Every field is an atomic so that the watchdog thread and a signal handler read whole values;
// the fields of one call are not read as one snapshot, which is fine: a call that overruns stops writing them.
struct Slot {
  std::atomic<pid_t> tid{0};      // 0: free
  std::atomic<bool> busy{false};  // inside a call now
  std::atomic<uint64_t> seq{0};   // counts the thread's calls: the watchdog times a call by its number
  std::atomic<const char*> plugin{nullptr};
  std::atomic<const char*> call{nullptr};
  std::atomic<uint64_t> tensor{kNoTensor};
  std::atomic<int> rank{-1};
  std::atomic<int> round{-1};  // read only by callOfThread: the conformance suite names the round of a call that hung
};

namespace {

// Enough for every thread of a 1,024-rank in-process run (a rank's trainer, communication and lane threads); a thread
// that finds no free slot runs its calls unwatched, and the watchdog says so once.
constexpr std::size_t kSlots = 8192;

struct State {
  std::array<Slot, kSlots> slots;
  std::atomic<std::size_t> high_water{0};  // slots [0, high_water) have been handed out at some point
  std::atomic<int64_t> timeout_ns{0};
  std::atomic<bool> running{false};  // the watchdog thread exists in this process (not true after fork in the child)
  std::atomic<bool> full_warned{false};

  std::mutex mutex;  // guards what follows
  std::condition_variable wake;
  std::vector<std::pair<uint64_t, Handler>> handlers;
  uint64_t next_id = 1;
  uint64_t running_handler = 0;  // the id of the handler running now, 0 when none
  std::condition_variable handler_done;
  std::string first_overrun;
  std::thread::id watch_thread;
  std::deque<std::string> interned;  // a deque never moves its elements: c_str() stays valid
  std::unordered_set<std::string_view> interned_index;
};

State& state() {
  static State* s = new State;  // never destroyed: threads and signal handlers may read it during exit
  return *s;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

pid_t currentTid() noexcept {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// The calling thread's slot, claimed on its first call and freed when the thread exits.
struct SlotOwner {
  Slot* slot = nullptr;
  ~SlotOwner() {
    if (slot != nullptr) {
      slot->busy.store(false, std::memory_order_relaxed);
      slot->tid.store(0, std::memory_order_release);
    }
  }
};
thread_local SlotOwner t_owner;

Slot* claimSlot() {
  State& s = state();
  const pid_t tid = currentTid();
  for (std::size_t i = 0; i < kSlots; ++i) {
    pid_t expected = 0;
    if (s.slots[i].tid.compare_exchange_strong(expected, tid, std::memory_order_acq_rel)) {
      std::size_t hw = s.high_water.load(std::memory_order_relaxed);
      while (hw < i + 1 && !s.high_water.compare_exchange_weak(hw, i + 1, std::memory_order_acq_rel)) {
      }
      return &s.slots[i];
    }
  }
  if (!s.full_warned.exchange(true))
    TERSE_LOG(LogLevel::kWarn,
              "plugin watchdog: more than " << kSlots << " threads call plugins; the rest run unwatched");
  return nullptr;
}

void watchLoop();

// The watchdog thread: started when a deadline is first set, and again in a forked child (a thread does not survive
// fork), lazily on the child's first watched call.
void ensureThread() {
  State& s = state();
  if (s.running.load(std::memory_order_acquire) || s.timeout_ns.load(std::memory_order_relaxed) <= 0) return;
  std::lock_guard lock(s.mutex);
  if (s.running.load(std::memory_order_relaxed)) return;
  s.running.store(true, std::memory_order_release);
  std::thread(watchLoop).detach();  // lives as long as the process; it owns nothing that needs an orderly end
}

void afterForkInChild() {
  // The child has one thread, the one that forked: every other slot names a thread that does not exist here, and a
  // slot "in a call" would fire a false overrun. The forking thread's own slot keeps its history under its new tid.
  State& s = state();
  for (auto& slot : s.slots) {
    if (&slot == t_owner.slot) continue;
    slot.busy.store(false, std::memory_order_relaxed);
    slot.tid.store(0, std::memory_order_relaxed);
  }
  if (t_owner.slot != nullptr) t_owner.slot->tid.store(currentTid(), std::memory_order_relaxed);
  s.running.store(false, std::memory_order_release);
  // The mutex may have been held by a thread that no longer exists in the child.
  new (&s.mutex) std::mutex;
  new (&s.wake) std::condition_variable;
  new (&s.handler_done) std::condition_variable;
  // Handlers belong to the parent's objects; the child registers its own.
  s.handlers.clear();
  s.running_handler = 0;
}

[[maybe_unused]] const bool g_atfork = [] {
  ::pthread_atfork(nullptr, nullptr, &afterForkInChild);
  return true;
}();

void watchLoop() {
  State& s = state();
  // Per slot: the call the watchdog last saw there (its seq + 1, 0 = none), when it first saw it, and whether it was
  // reported. A call is timed from the watchdog's first look at it, not by its caller, so that a plugin call costs no
  // clock read (terse-bench-compressors' watchdog/mark: 38 ns a call with one, against 1.4 us for fp16's compress of
  // 64 KiB); an overrun is then reported at most one look (1/40 of the deadline) late.
  struct Seen {
    uint64_t call = 0;
    int64_t since_ns = 0;
    bool reported = false;
  };
  std::vector<Seen> seen(kSlots);
  std::unique_lock lock(s.mutex);
  s.watch_thread = std::this_thread::get_id();
  while (true) {
    const int64_t timeout = s.timeout_ns.load(std::memory_order_relaxed);
    // A few dozen looks per deadline: an overrun is seen at most 1/40 of the deadline late (5 ms at the least).
    const auto period = std::chrono::nanoseconds(std::clamp<int64_t>(timeout / 40, 5'000'000, 500'000'000));
    s.wake.wait_for(lock, timeout > 0 ? period : std::chrono::nanoseconds(500'000'000));
    if (timeout <= 0) continue;
    std::vector<Overrun> found;
    const int64_t now = nowNs();
    const std::size_t hw = s.high_water.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < hw; ++i) {
      Slot& slot = s.slots[i];
      Seen& mine = seen[i];
      if (!slot.busy.load(std::memory_order_acquire) || slot.tid.load(std::memory_order_relaxed) == 0) {
        mine.call = 0;
        continue;
      }
      const uint64_t call_id = slot.seq.load(std::memory_order_relaxed) + 1;
      if (mine.call != call_id) {
        mine = Seen{call_id, now, false};  // a call not seen before: its clock starts now
        continue;
      }
      if (mine.reported || now - mine.since_ns <= timeout) continue;
      mine.reported = true;
      Overrun o;
      const char* plugin = slot.plugin.load(std::memory_order_relaxed);
      const char* call = slot.call.load(std::memory_order_relaxed);
      o.plugin = plugin ? plugin : "a plugin";
      o.call = call ? call : "a call";
      o.tensor = slot.tensor.load(std::memory_order_relaxed);
      o.rank = slot.rank.load(std::memory_order_relaxed);
      o.seconds = static_cast<double>(now - mine.since_ns) * 1e-9;
      o.timeout_s = static_cast<double>(timeout) * 1e-9;
      o.thread = slot.tid.load(std::memory_order_relaxed);
      found.push_back(std::move(o));
    }
    if (found.empty()) continue;
    for (const Overrun& o : found) {
      if (s.first_overrun.empty()) s.first_overrun = o.message();
      TERSE_LOG(LogLevel::kError, "plugin watchdog: " << o.message());
      // One handler at a time, each looked up again under the lock: a Registration destroyed meanwhile is skipped,
      // and its destructor waits while its handler runs (it must not outlive what the handler touches).
      std::vector<uint64_t> ids;
      for (const auto& h : s.handlers) ids.push_back(h.first);
      for (const uint64_t id : ids) {
        auto it = std::find_if(s.handlers.begin(), s.handlers.end(), [id](const auto& h) { return h.first == id; });
        if (it == s.handlers.end()) continue;
        const Handler handler = it->second;
        s.running_handler = id;
        lock.unlock();
        try {
          handler(o);
        } catch (const std::exception& x) {
          TERSE_LOG(LogLevel::kError, "plugin watchdog: a handler failed: " << x.what());
        } catch (...) {
          TERSE_LOG(LogLevel::kError, "plugin watchdog: a handler failed");
        }
        lock.lock();
        s.running_handler = 0;
        s.handler_done.notify_all();
      }
    }
  }
}

std::string formatSeconds(double s) {
  std::ostringstream o;
  o.precision(s < 10 ? 2 : 3);
  o << s;
  return o.str();
}

}  // namespace

std::string Overrun::message() const {
  std::ostringstream o;
  if (rank >= 0) o << "rank " << rank << ": ";
  o << plugin << ": " << call;
  if (tensor != kNoTensor) o << " of tensor " << tensor;
  std::ostringstream run;
  run.setf(std::ios::fixed);
  run.precision(2);
  run << seconds;
  o << " has not returned after " << run.str() << " s (plugin_timeout " << formatSeconds(timeout_s) << " s)";
  return o.str();
}

void setTimeout(std::chrono::nanoseconds t) {
  state().timeout_ns.store(t.count() > 0 ? t.count() : 0, std::memory_order_relaxed);
  ensureThread();
  state().wake.notify_all();  // a shorter deadline takes effect now, not after the old period
}

std::chrono::nanoseconds timeout() {
  return std::chrono::nanoseconds(state().timeout_ns.load(std::memory_order_relaxed));
}

const char* intern(std::string_view label) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (auto it = s.interned_index.find(label); it != s.interned_index.end()) return it->data();
  const std::string& kept = s.interned.emplace_back(label);
  s.interned_index.insert(kept);
  return kept.c_str();
}

WatchedCall::WatchedCall(const char* plugin, const char* call, uint64_t tensor, int rank, int round) noexcept {
  if (t_owner.slot == nullptr) t_owner.slot = claimSlot();
  slot_ = t_owner.slot;
  if (slot_ == nullptr) return;
  if (!state().running.load(std::memory_order_relaxed)) ensureThread();
  slot_->plugin.store(plugin, std::memory_order_relaxed);
  slot_->call.store(call, std::memory_order_relaxed);
  slot_->tensor.store(tensor, std::memory_order_relaxed);
  slot_->rank.store(rank, std::memory_order_relaxed);
  slot_->round.store(round, std::memory_order_relaxed);
  // One writer per slot: a load and a store, not an atomic read-modify-write.
  slot_->seq.store(slot_->seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  slot_->busy.store(true, std::memory_order_release);
}

WatchedCall::~WatchedCall() {
  if (slot_ != nullptr) slot_->busy.store(false, std::memory_order_release);
}

Registration::Registration(Handler handler) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  id_ = s.next_id++;
  s.handlers.emplace_back(id_, std::move(handler));
}

Registration::~Registration() {
  if (id_ == 0) return;
  State& s = state();
  std::unique_lock lock(s.mutex);
  std::erase_if(s.handlers, [this](const auto& h) { return h.first == id_; });
  // A handler that removes its own registration would wait for itself: only another thread waits here.
  if (std::this_thread::get_id() != s.watch_thread) s.handler_done.wait(lock, [&] { return s.running_handler != id_; });
}

Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Registration old(std::move(*this));
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

std::string firstOverrun() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.first_overrun;
}

std::string lastPluginOfThisThread() {
  const char* plugin = t_owner.slot != nullptr ? t_owner.slot->plugin.load(std::memory_order_relaxed) : nullptr;
  return plugin != nullptr ? plugin : "";
}

CallView callOfThread(pid_t tid) noexcept {
  State& s = state();
  CallView v;
  const std::size_t hw = s.high_water.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < hw; ++i) {
    Slot& slot = s.slots[i];
    if (slot.tid.load(std::memory_order_relaxed) != tid) continue;
    v.plugin = slot.plugin.load(std::memory_order_relaxed);
    v.call = slot.call.load(std::memory_order_relaxed);
    v.tensor = slot.tensor.load(std::memory_order_relaxed);
    v.rank = slot.rank.load(std::memory_order_relaxed);
    v.round = slot.round.load(std::memory_order_relaxed);
    v.in_call = slot.busy.load(std::memory_order_relaxed);
    break;
  }
  return v;
}

}  // namespace terse::watchdog

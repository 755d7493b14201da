// The plugin-call watchdog (DESIGN.md section 3, "A plugin that hangs or crashes"): every call into a plugin runs
// under a deadline, and a call past it fails its rank with a message naming the plugin, the call and the tensor.
//
// A hung call cannot be interrupted: the plugin's code owns the thread, and a thread cannot be cancelled safely. So
// the watchdog does not try. A call marks its thread busy (WatchedCall: a few relaxed stores, no clock read), one
// watchdog thread per process looks at the busy marks a few dozen times per deadline, timing each call from its first
// look at it, and when a call has run past it hands an Overrun to the handlers registered by whoever owns the rank:
// the runner aborts the rank's communicators (so its peers fail at once, naming it) and ends the process with a
// failed status; the PyTorch hook fails the bucket's Future, which raises in backward. The hung thread is left where
// it is.
//
// The marks live in a fixed table, not in thread_local storage, so that the fatal-signal handler (crash.h) can read
// which plugin call the crashing thread was in, or returned from last, without allocating or locking.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace terse::watchdog {

// What the handlers learn about a call that ran past the deadline.
struct Overrun {
  std::string plugin;    // the plugin's label: "compressor 'topk' (/path/terse_compressor_topk.so)"
  std::string call;      // "decompress"
  uint64_t tensor = 0;   // the tensor id the call was for (kNoTensor for calls that have none)
  int rank = -1;         // the calling rank, -1 when unknown
  double seconds = 0;    // how long the call had run when the watchdog saw it
  double timeout_s = 0;  // the deadline it ran past
  pid_t thread = 0;      // the calling thread (gettid(): Python's threading.get_native_id())

  // "rank 1: compressor 'x' (path): decompress of tensor 3 has not returned after 2.02 s (plugin_timeout 2 s)"
  std::string message() const;
};

inline constexpr uint64_t kNoTensor = ~uint64_t{0};

// The process-wide deadline of a plugin call; zero or negative turns the watchdog off (the default, so that code that
// never configures it -- a unit test, a tool -- behaves as before). The runner sets the study's plugin_timeout.
void setTimeout(std::chrono::nanoseconds timeout);
std::chrono::nanoseconds timeout();

// A plugin's label as a string that lives as long as the process: the table keeps naming the last call of a thread
// after that plugin is unloaded, and the signal handler may read it at any time. Interned once per plugin instance,
// so the table holds one string per distinct plugin, never one per call.
const char* intern(std::string_view label);

// Marks the calling thread as inside a plugin call for its lifetime. `plugin` comes from intern(); `call` is a string
// literal; `round` is the tensor call's round (TensorInfo::round), -1 for a call that has none.
class WatchedCall {
 public:
  WatchedCall(const char* plugin, const char* call, uint64_t tensor, int rank, int round = -1) noexcept;
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  struct Slot* slot_;
};

// Handlers run on the watchdog thread, once per overrunning call, in registration order; they must not block for
// long (the next overrun waits). A Registration removes its handler when destroyed.
using Handler = std::function<void(const Overrun&)>;
class Registration {
 public:
  Registration() = default;
  explicit Registration(Handler handler);
  ~Registration();
  Registration(Registration&& other) noexcept : id_(std::exchange(other.id_, 0)) {}
  Registration& operator=(Registration&& other) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  uint64_t id_ = 0;
};

// The overrun seen so far by this process, if any (its message); the PyTorch hook and tests poll it.
std::string firstOverrun();

// The plugin label of the calling thread's current or last plugin call ("" when it made none): names the plugin in a
// check made right after its call returned (core/compress/pipeline.cc's guard bytes).
std::string lastPluginOfThisThread();

// ---- For the fatal-signal handler (crash.h): async-signal-safe, no allocation, no lock.
struct CallView {
  const char* plugin = nullptr;  // null: this thread has made no plugin call
  const char* call = nullptr;
  uint64_t tensor = kNoTensor;
  int rank = -1;
  int round = -1;        // -1: a call without a round (init, get_caps, a scheduler's)
  bool in_call = false;  // true: inside the call now; false: the last call on this thread, already returned
};
// The plugin call of thread `tid` (gettid()), current or last. Reads the table without synchronisation beyond the
// atomics, which is what a signal handler on that same thread needs.
CallView callOfThread(pid_t tid) noexcept;

}  // namespace terse::watchdog

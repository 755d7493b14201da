// The tcp transport's state of one connection (one peer) and of the operations in flight on it, shared by the
// transport's io thread, the requests of the caller's threads and the pacer; internal to core/comm/tcp/. Which lock
// guards which field is part of each field's declaration.
#pragma once

// Before Asio, in its own block: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/comm/frame.h"
#include "core/comm/link_emulation.h"
#include "core/comm/spin_wait.h"
#include "core/common/dtype.h"

namespace terse::comm::tcp {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

// A frame read before any receive was posted for it: the only frames the transport copies.
struct Staged {
  FrameHeader header;
  std::unique_ptr<std::byte[]> data;  // header.length bytes
  // Guarded by the link's mutex.
  bool complete = false;
  Clock::time_point deliver_at{};
};

struct RecvOp {
  FrameMeta expect;
  std::span<std::byte> buffer;
  bool reduce = false;
  DType dtype = DType::kF32;
  enum class State : uint8_t { kPosted, kStaged, kDirect, kFailed };
  // Guarded by the link's mutex.
  State state = State::kPosted;
  std::shared_ptr<Staged> staged;  // kStaged: the frame, possibly still arriving
  bool io_active = false;          // kDirect: the io thread is writing into `buffer`, which must stay alive
  bool arrived = false;            // kDirect: the whole payload is in
  bool cancelled = false;          // the request was dropped: the io thread drains the rest of the frame
  bool error_comm = false;         // kFailed: CommError (the peer left) rather than InvalidPayload
  uint64_t length = 0;
  Clock::time_point deliver_at{};
  std::string error;
};

struct SendOp {
  EncodedHeader header{};
  std::span<const std::byte> data;
  std::vector<std::byte> owned;  // control payloads, and the data of a send dropped before it was written
  uint64_t wire_bytes = 0;
  Tag control_tag = 0;  // kControl frames: which one
  // Guarded by the link's mutex.
  bool io_active = false;  // the io thread is reading from `data`
  bool done = false;       // every byte written to the socket
  bool scheduled = true;   // emulation: sent_at is known
  Clock::time_point queued_at{};
  Clock::time_point sent_at{};
};

// A byte range of one frame's wire bytes (header then payload): a whole frame, or an emulated slice of one.
struct WriteItem {
  std::shared_ptr<SendOp> op;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Link {
  int peer = 0;
  std::string who;                                // "rank 2 (host a)"
  std::unique_ptr<asio::ip::tcp::socket> socket;  // null for the link to this rank itself

  // Bumped with every wake-up of the link's waiters (notifyWaiters): a busy-polling request (requests.cc) watches it
  // instead of sleeping on cv, and re-checks its conditions under the mutex when it moves. A cache line of its own:
  // the spinner reads it in a loop, and a neighbour written under the lock would pull the line from under it at every
  // change (and the writer would wait for the spinner's copy).
  alignas(64) std::atomic<uint64_t> events{0};
  alignas(64) std::mutex mutex;
  std::condition_variable cv;
  // Every change a waiter may be waiting for -- made under `mutex` -- is followed by this, never by cv.notify_all()
  // alone, so that no busy-polling waiter misses it, nor a caller that reads the connection and sleeps in poll().
  void notifyWaiters() {
    events.fetch_add(1, std::memory_order_release);
    cv.notify_all();
    if (caller_polling.load()) kickReader();
  }
  // Wakes a caller sleeping in poll() on the socket (caller_read.cc) through `wake_fd`.
  void kickReader() const;

  // Caller reads (transport.h, "Data path"): who reads the connection's next bytes. kIo: the io thread, inside a
  // frame or holding a parked one; kCaller: a caller's thread waiting for a receive; kNone: nobody, at a frame
  // boundary -- the io thread reads when its readiness wait (`read_armed`) fires, a caller may claim it first.
  enum class Reader : uint8_t { kIo, kNone, kCaller };
  // Guarded by mutex.
  Reader reader = Reader::kIo;
  bool read_armed = false;    // the io thread waits for the socket to become readable
  bool watch_asked = false;   // a waiting request asked the io thread to watch the socket (watchSoon)
  uint64_t claims = 0;        // how often callers claimed the connection
  int claim_waiters = 0;      // callers asleep on cv whose receive they would read if the connection were free
  uint64_t claims_armed = 0;  // `claims` when the io thread's readiness wait was armed
  // Set once the link reads (not emulated); cleared when it closes or the transport ends.
  bool callers_may_read = false;
  std::atomic<bool> caller_polling{false};  // a caller sleeps in poll() on the socket and `wake_fd`
  int wake_fd = -1;                         // an eventfd, for the reading caller's poll(); closed by ~Link
  std::atomic<Clock::rep> caller_heard{0};  // when a reading caller last received bytes (the liveness tick reads it)
  ~Link();
  // Guarded by mutex.
  std::deque<std::shared_ptr<RecvOp>> posted;
  std::deque<std::shared_ptr<Staged>> unmatched;
  std::string broken;                            // nonempty: every request on the link fails with this reason
  bool broken_by_payload = false;                // InvalidPayload (a malformed frame) rather than CommError
  bool peer_left = false;                        // the peer's goodbye arrived: no frame follows it
  std::deque<WriteItem> writes;                  // data frames (or released slices) in stream order
  std::deque<std::shared_ptr<SendOp>> controls;  // written between data frames, never inside one
  bool mid_frame = false;                        // the last write ended inside a frame (emulated slices)
  bool pump_posted = false;                      // a pump of this link is queued on the io thread
  // Someone writes on the socket: the io thread's async write, or a caller's direct write (requests.cc) while the link
  // was idle. Whoever holds it is the only writer, so frames keep their order.
  bool writing = false;
  bool direct = false;  // the writer is a caller's thread, using `fd`: the io thread must not close it meanwhile
  int fd = -1;          // the socket's descriptor while it is open (closeLink clears it), for direct writes
  bool parked = false;  // the io thread holds a frame's header and waits for a receive before reading its payload

  // io thread only.
  // Caller reads: a connection that callers read is taken out of the io_context's epoll set (Asio's edge-triggered
  // registration would wake the io thread for every packet, with or without a wait pending) and put back before the
  // io thread waits on it, writes on it or closes it (reader.cc, watch / unwatch).
  bool unwatched = false;
  int raw_fd = -1;                               // the descriptor, kept while the socket object has let go of it
  asio::ip::tcp protocol = asio::ip::tcp::v4();  // for putting it back
  bool io_writing = false;                       // an async_write of the io thread is in flight
  bool write_shut = false;                       // our goodbye went out and the sending side is shut down
  bool bye_queued = false;
  bool notice_sent = false;   // our abort notice went out
  bool write_failed = false;  // a write failed: nothing more is written, the link is read on (liveness.cc, writeFailed)
  bool reading = false;
  bool read_closed = false;  // the peer's end of file, or the connection failed
  bool closed = false;
  Clock::time_point last_heard{};
  Clock::time_point last_sent{};
  std::atomic<Clock::rep> direct_sent{0};  // when a caller's direct write last finished (the heartbeat reads both)
  // The reader's (Reader says who), from here to `scratch`.
  EncodedHeader in_header{};
  std::size_t header_got = 0;  // bytes of in_header read so far
  bool in_frame = false;       // a header was taken: its payload is being read (or parked), not the next header
  FrameHeader cur;
  Clock::time_point cur_started{};
  std::byte* target = nullptr;
  uint64_t got = 0;
  std::shared_ptr<RecvOp> cur_recv;
  std::shared_ptr<Staged> cur_staged;
  bool discarding = false;
  // A reduce receive's payload is read into `fuse` piece by piece and each piece added into the receive's buffer at
  // once (reader.cc): the bytes are added while they are in cache, rather than landing in memory and being read back.
  std::vector<std::byte> fuse;
  std::size_t fuse_have = 0;       // bytes in `fuse`: a piece being read, or the tail of an element split across reads
  uint64_t summed = 0;             // payload bytes already added into the receive's buffer
  std::vector<std::byte> scratch;  // control payloads and drained frames

  // Emulation, guarded by the pacer's mutex (pacer.h).
  LinkSpec spec;
  PacedResource wire;
  std::deque<std::shared_ptr<SendOp>> nic_queue;
  uint64_t head_reserved = 0;
  Clock::time_point head_end{};
  std::deque<std::pair<Clock::time_point, WriteItem>> release;  // slices reserved, handed to the writer at their end
};

// The largest frame a caller reads itself (caller_read.cc), and the largest receive it reads for, when it sleeps in
// poll() at once (TcpOptions::caller_spin_us = 0) / when it spins first (the default). Larger frames are the io
// thread's, which reads them as they arrive while the caller sleeps. Measured on 2 vCPUs (processes, loopback, medians
// of 5 alternations): without the spin, a caller reading 256 KiB frames itself made a 4-rank 1 MiB ring allreduce 1.2x
// slower; with it, 256 KiB frames made that allreduce 1.34x faster (821 -> 612 us) and a 2-rank 256 KiB one 1.5x
// (123 -> 83 us), while 1 MiB frames made a 2-rank 4 MiB one 1.1-1.2x slower (a spinning caller drains the socket in
// more, smaller reads than the io thread woken by epoll).
constexpr uint64_t kCallerFrameBytes = 64 * 1024;
constexpr uint64_t kSpinningCallerFrameBytes = 256 * 1024;

// One non-blocking recv(): n > 0 bytes read, n == 0 the peer's end of file, else would_block or an error.
struct IoResult {
  long n = -1;
  bool would_block = false;
  boost::system::error_code error;
};
IoResult recvSome(int fd, void* data, std::size_t size);

[[noreturn]] void throwBroken(const Link& l);

// Checks a frame against the receive it is matched with; "" when it fits. Called under the link's mutex.
std::string mismatch(const Link& l, const FrameHeader& h, const RecvOp& r);

// "1.5 s", for the messages about silent peers and setup timeouts.
std::string secondsText(Clock::duration d);

}  // namespace terse::comm::tcp

// The tcp transport's object (transport.h), which ties the folder's parts together: the state of one rank's transport,
// and its member functions spread over one file per job -- requests.cc (posting sends and receives, and completing
// them), writer.cc and reader.cc (the two halves of every link: writes on the io thread and the bulk writer's thread,
// reads on the io thread), liveness.cc (heartbeats, silent and crashed peers, goodbyes), abort.cc (a failure made
// job-wide) and transport.cc (setup and teardown). Apart from it:
// link.h (the state of one connection), connect.h (connection setup) and pacer.h (link emulation's NIC). Internal to
// core/comm/tcp/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/tcp/connect.h"
#include "core/comm/tcp/link.h"
#include "core/comm/tcp/pacer.h"
#include "core/comm/tcp/transport.h"
#include "core/comm/traffic.h"

namespace terse::comm::tcp {

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TcpOptions& options, const JobToken& token);
  ~TcpTransport() override { shutdown(); }

  // ---- Transport ------------------------------------------------------------------------------------------------
  std::string_view name() const noexcept override { return "tcp"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return n_; }
  uint64_t maxFrameBytes() const noexcept override { return options_.max_frame_bytes; }

  Request isend(int peer, const FrameMeta& meta, std::span<const std::byte> data) override;
  Request irecv(int peer, const FrameMeta& expect, std::span<std::byte> buffer) override {
    return post(peer, expect, buffer, false, DType::kF32);
  }
  Request irecvReduce(int peer, const FrameMeta& expect, std::span<std::byte> accumulate, DType dtype) override {
    return post(peer, expect, accumulate, true, dtype);
  }

  RankTraffic traffic() const override { return counter_.snapshot(); }
  void resetTraffic() override { counter_.reset(); }

  void abort(const std::string& reason) override { abortJob(who_ + ": " + reason); }
  bool aborted() const noexcept override { return aborted_.load(); }

  // ---- setup (transport.cc) ---------------------------------------------------------------------------------------
  void connect(Store& store);

  // The busy-poll budget in use (transport.h, "Busy polling"); zero: off.
  Clock::duration busyPoll() const noexcept { return busy_poll_; }

 private:
  // ---- requests (requests.cc) -------------------------------------------------------------------------------------
  void checkPeer(int r, const char* what) const;
  Request post(int peer, const FrameMeta& expect, std::span<std::byte> buffer, bool reduce, DType dtype);
  Request sendToSelf(Link& l, const FrameMeta& meta, std::span<const std::byte> data);

  // ---- io thread: writing (writer.cc) -----------------------------------------------------------------------------
  void queueControl(Link& l, Tag tag, std::string_view payload);
  void pump(Link& l);
  // A caller's thread writes a frame on a link that was idle (isend claimed it); what the socket does not take at once
  // is handed to the io thread.
  void writeDirect(Link& l, const std::shared_ptr<SendOp>& op);
  void postPump(Link& l);
  void onWritten(Link& l, const WriteItem& item, const boost::system::error_code& ec);
  // The bulk writer (writer.cc): a thread that finishes the frames a caller's direct write could not, so that the io
  // thread only reads (and adds) while a link's backlog drains.
  void startBulkWriter();
  void stopBulkWriter();
  void bulkWriterLoop();
  // Writes what the socket takes now; false once the link went back to the io thread or became idle.
  bool bulkWrite(Link& l);

  // ---- io thread: reading (reader.cc) -----------------------------------------------------------------------------
  // At a frame boundary: hands the connection to whoever reads first, the io thread (armRead) or a waiting caller.
  void readHeader(Link& l);
  void armRead(Link& l);
  void onReadable(Link& l, const boost::system::error_code& ec);
  void onHeader(Link& l, const boost::system::error_code& ec);
  void route(Link& l, bool force_stage);
  void unpark(Link& l, bool force_stage);
  void readPayload(Link& l);
  void frameDone(Link& l);
  // ---- the reader's steps, on the io thread or a reading caller's (reader.cc) --------------------------------------
  // Takes in_header as the current frame (throws InvalidPayload for a malformed one) and counts it.
  void decodeHeader(Link& l);
  // Matches the current data frame with a posted receive or stages it; false when it is parked instead.
  bool routeFrame(Link& l, bool force_stage);
  asio::mutable_buffer payloadBuffer(Link& l);
  void payloadRead(Link& l, std::size_t n);
  void finishDataFrame(Link& l);

  // ---- caller reads (caller_read.cc) ------------------------------------------------------------------------------
 public:
  // Whether callers may read connections themselves (transport.h, "Data path").
  bool callerReads() const noexcept { return caller_reads_; }
  // Frames read whole by callers' threads so far (for tests).
  uint64_t framesReadByCallers() const noexcept { return caller_frames_.load(); }
  // Times a reading caller slept in poll() so far, after its spin budget, if any (for tests).
  uint64_t callerSleeps() const noexcept { return caller_sleeps_.load(); }
  // The largest frame (and receive) a caller reads itself: link.h, kCallerFrameBytes / kSpinningCallerFrameBytes.
  uint64_t callerFrameBytes() const noexcept { return caller_frame_bytes_; }
  // A caller's thread, which claimed `l` (Link::reader == kCaller) to complete `mine`: reads frames until `mine` is
  // complete or failed, or it must stop (the link breaks or closes, the transport ends, a frame for the io thread:
  // control, large, malformed, an end of file), then gives the connection back. `block`: wait in poll() for bytes;
  // else only what is there.
  void callerRead(Link& l, const RecvOp& mine, bool block);
  // Any thread, under the link's lock while callers may read the link (so the transport is alive): when nobody reads or
  // watches it now, asks the io thread to watch it (once until it does).
  void watchSoon(Link& l);

 private:
  // Gives the connection back to the io thread in the state a reading caller left it.
  void handBack(Link& l, const boost::system::error_code& ec);
  // io thread: starts the caller-read tick if it is not running (transport.h, "Data path").
  void callerTick();
  // io thread: every link at a frame boundary that nobody reads is watched again.
  void watchIdleLinks();
  // io thread: the same for one link (whose socket is set).
  void watchIfIdle(Link& l);
  // io thread: `l` is read on, by the io thread unless a caller reads it now: a parked frame is staged, an unwatched
  // socket watched again.
  void readOn(Link& l);
  // io thread: puts a link's socket back into the io_context's epoll set (false: it failed, and so did the link) /
  // takes it out, when no operation of the io thread is pending on it.
  bool watch(Link& l);
  void unwatch(Link& l);

  // ---- liveness (liveness.cc) -------------------------------------------------------------------------------------
  // Sets the liveness timer for `at` (io thread): its handler checks silence, sends heartbeats, and sets it again.
  void armHeartbeat(Clock::time_point at);
  void handleControl(Link& l);
  void readFailed(Link& l, const boost::system::error_code& ec);
  void linkFailed(Link& l, const std::string& what);
  // A write on `l` failed with `what`: the link is read on for a short grace before it fails (liveness.cc).
  void writeFailed(Link& l, const std::string& what);
  void failLateWrites();
  void markReadClosed(Link& l);
  void closeLink(Link& l);

  // ---- abort (abort.cc) -------------------------------------------------------------------------------------------
  void abortJob(const std::string& reason, Link* bad_link = nullptr, const std::string& bad_message = {});
  void sendAbortNotices();
  void protocolError(Link& l, const std::string& what);

  // ---- setup and teardown (transport.cc) --------------------------------------------------------------------------
  void startLinks();
  void shutdown();
  // The io thread's loop: io_.run(), or with busy polling, blocking for the next handler and then polling for
  // busy_poll_ after the last one that ran.
  void runIo();

  TcpOptions options_;
  JobToken token_;
  int n_;
  int rank_;
  std::string label_;
  std::string who_;
  bool emulated_;
  Clock::duration busy_poll_;    // zero: the io thread blocks and requests sleep at once
  bool caller_reads_;            // callers may read connections (caller_read.cc): on unless emulated or turned off
  Clock::duration caller_spin_;  // how long a reading caller retries, yielding, before it sleeps in poll()
  uint64_t caller_frame_bytes_;  // follows caller_spin_ (link.h)
  std::atomic<uint64_t> caller_frames_{0};
  std::atomic<uint64_t> caller_sleeps_{0};
  TrafficCounter counter_;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread io_thread_;
  bool io_started_ = false;

  // Set once by connect() before the transport is handed out; the links themselves are shared with requests.
  std::vector<std::shared_ptr<Link>> links_;
  Connector connector_;

  asio::steady_timer heartbeat_;  // fires every liveness_tick_, or sooner when a link's silence reaches the timeout
  asio::steady_timer abort_grace_;
  // Links whose write failed, each failed at its deadline unless its reader got there first (io thread only).
  asio::steady_timer write_grace_;
  struct FailedWrite {
    Link* link;
    std::string what;
    Clock::time_point deadline;
  };
  std::deque<FailedWrite> failed_writes_;
  // Watches the connections that callers read and left at a frame boundary (io thread only).
  asio::steady_timer caller_tick_;
  bool caller_tick_running_ = false;
  Clock::duration heartbeat_period_;  // an idle connection sends a heartbeat this often (timeout / 4)
  // The liveness timer fires at least this often (heartbeats are due at this granularity), and in between at the
  // moment a link's silence would reach `timeout` (transport.h, "Liveness"). A tick only reads clocks.
  static constexpr int kLivenessTicksPerTimeout = 20;
  Clock::duration liveness_tick_;

  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_

  std::atomic<bool> stopping_{false};
  bool notices_queued_ = false;  // io thread only: sendAbortNotices ran
  std::mutex life_mutex_;        // guards Link::read_closed for the destructor's wait
  std::condition_variable life_cv_;

  // The bulk writer's thread (not with emulation, whose frames the pacer releases to the io thread), the eventfd that
  // wakes it, and the links handed to it (guarded by bulk_mutex_).
  std::thread bulk_thread_;
  int bulk_wake_fd_ = -1;
  std::mutex bulk_mutex_;
  std::vector<Link*> bulk_incoming_;
  bool bulk_stop_ = false;

  // Emulation: the ingress port (io thread only), and the pacer (the rank's egress port and its thread).
  PacedResource ingress_;
  Pacer pacer_;
};

}  // namespace terse::comm::tcp

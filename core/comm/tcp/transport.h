// The tcp transport (DESIGN.md section 6): the ranks of a job are processes on one or many hosts, connected by a full
// mesh of TCP connections (Boost.Asio). It implements Transport exactly as the inproc transport does (matching by
// (peer, tag), non-overtaking per tag, byte accounting, link emulation, abort), so collectives, the compression
// pipeline and trainers run unchanged across processes. Its implementation lies in this folder, one job per file
// (transport_detail.h maps them); wire.h holds its own wire messages.
//
// Setup (connectTcpTransport). Each rank listens on bind_address:port and publishes "host:port" under
// `<store_prefix>tcp/addr/<rank>` (and its host label under `<store_prefix>tcp/host/<rank>`, for messages). Every rank
// connects to each lower rank and accepts from each higher one. A connection first runs the job-token handshake
// (auth.h, AuthService::kTransport), then a hello naming the connecting rank, the world size and its host label, which
// the accepting rank validates (in range, higher than itself, not yet connected) and answers with its own. Each step
// has a deadline; an accepted connection must have proven the token within kUnauthenticatedDeadline (2 s), and until it
// has, it holds a slot of a bounded table from which newer connections evict the oldest (handshake_slots.h), so idle
// or flooding strangers cannot keep the real peers out. During setup a connection that fails any of this (wrong token,
// garbage, a silent peer, a duplicate) is logged (at most 20 lines per 10 s, the rest counted) and dropped, and the
// rank goes on waiting for the real peer until `timeout`; then connectTcpTransport throws CommError saying, for every
// rank it is still missing, what it knows: never published its address, published but not reachable (the last
// error), or never connected here -- and whether the rendezvous store itself is gone.
//
// Threads. One io thread per transport runs an io_context: it reads every connection's frames, writes the control
// frames (heartbeats, abort notices, goodbyes), and runs the heartbeat timer. One bulk writer thread per transport
// finishes the frames that a caller's direct write left in a full socket, and the frames queued behind them (see "Data
// path"). With link emulation, one pacer thread per transport (the rank's NIC) releases frames slice by slice to the
// io thread, which writes them all (link_emulation.h), and there is no bulk writer.
//
// Data path. isend on an idle connection (nothing queued, no write running) writes the frame's header and the caller's
// span from the calling thread, with one non-blocking scatter-gather write (no copy of the payload, and no hand-off to
// the io thread, whose wake-up would be most of a small message's latency); what the socket does not take at once, and
// every frame sent while that write is unfinished, goes to the bulk writer when the frame is 1 MiB or more (a large
// message's pipeline segments; smaller ones go to the io thread, as handing them over made a 1 MiB allreduce slower:
// writer.cc, kBulkMinFrameBytes); the bulk writer owns the connection until its queue is empty: it waits (poll) on all
// the connections it owns at once, writes whatever each socket takes, the same way, and hands the connection back to
// the io thread for a goodbye, an abort notice or an error. So the io thread, which reads and adds every incoming byte,
// no longer also writes the backlog that a ring step's burst of segments leaves in the socket (most of an allreduce's
// bytes when the peer reads slower than this rank writes). The io thread reads each frame's 32-byte header, validates
// it (decodeFrameHeader), and when a matching receive is posted reads the payload straight into that receive's buffer;
// only a frame that no receive has been posted for yet is staged in memory, and copied out when the receive comes --
// except a large one (> 64 KiB) on a connection where no receive is posted at all: the io thread leaves its payload in
// the socket until a receive is posted (TCP flow control holds the sender), so it too lands in place (a faster peer's
// next ring step arrives before this rank posted its receives all the time). A parked connection's silence does not
// count against the peer's liveness (it is this rank's). irecvReduce's payload is read in pieces of 256 KiB, each added
// into place (reduce.h) by the io thread right after it is read, while it is still in cache. Frames of one connection
// are written and read in order, so frames of one (peer, tag) stay in order.
//
// Caller reads (caller_read.cc; TcpOptions::caller_reads, TERSE_TCP_CALLER_READS=0|1, on by default, off with link
// emulation). At a frame boundary a connection belongs to whoever reads first: the io thread waits for it to become
// readable (a readiness wait, which reads nothing), and a caller waiting for a receive of up to 256 KiB on it (64 KiB
// with the spin below off) whose frame has not begun claims it and reads on its own thread, sleeping in poll() on the
// socket and an eventfd that every notify kicks (larger receives leave their frames to the io thread: the sizes are
// measured, link.h). It takes data frames up to that size (routed, staged or added in place by the io
// thread's own steps, reader.cc) until its receive is in, and gives anything else to the io thread where it stands: a
// control frame, a larger frame (after its header), a malformed header, an end of file or an error, a frame that test()
// or a failure leaves half read. A small message then costs one wake-up per hop, the receiving thread's, instead of two
// (epoll waking the io thread, whose notify wakes the caller). The io thread, when its wait finds a caller holding the
// connection, or nothing left to read after a caller claimed it, stops watching that connection: it takes the socket
// out of the io_context's epoll set (Asio registers it edge-triggered for good, which wakes the io thread for every
// packet whether or not it waits for one; measured, that left 4 ranks on 2 vCPUs no faster), and looks at every such
// connection every 2 ms (the caller-read tick), so a frame nobody waits for (a heartbeat, an abort notice, a goodbye,
// an end of file) may sit up to 2 ms longer in the socket. The socket goes back into the set before the io thread waits
// on it, writes on it or closes it; an abort, the transport's end and any request that waits on a connection nobody
// reads (a large receive; a send, as both ranks' sends may wait for the other's reads) watch it again at once.
// A reading caller that finds its socket empty does not sleep at once: it tries again, calling sched_yield() between
// tries, for up to TcpOptions::caller_spin_us (TERSE_TCP_CALLER_SPIN_US; 50 us by default, 0 = sleep at once), counted
// from the first empty try and again after any bytes, re-checking at every try whether it must let go. Sleeping costs
// a wake-up, and in a virtual machine the halt of an idle vCPU and the interrupt that ends it; yielding, unlike the
// pause loop of busy polling below, hands the CPU to whatever else is runnable there (on a machine with more ranks than
// CPUs, often the peer it waits for) and traps nothing in the hypervisor. Measured on 2 vCPUs (processes, loopback,
// medians of 4 alternations, `TERSE_TCP_CALLER_SPIN_US=0` against 50): a 4 KiB allreduce 19 -> 8 us at 2 ranks and
// 68 -> 51 us at 4, 64 KiB 29 -> 20 us and 100 -> 75 us; 20 and 100 us budgets were within the noise of 50. With the
// spin a caller also reads frames up to 256 KiB itself (64 KiB without: link.h has both measurements). A yield that
// hands the CPU to a busy process costs its whole time slice: beside two CPU-bound processes the spin made a 4 KiB
// allreduce of 2 ranks take 1,004 us (32 without), so a try whose yield took longer than the budget ends the spin, and
// once such stalls add up to 2 ms the thread sleeps at once for a while (spin_wait.h, SpinStalls, as the inproc
// transport's waits do).
//
// Requests. A send completes when the socket has taken all of its bytes, a receive when its payload is in place. A send
// dropped unfinished (request.h) copies what is not yet written, but first waits for a write already running, which
// reads from the caller's buffer. The caller's and the bulk writer's writes are non-blocking bursts, so that wait is
// short; the io thread's (frames under 1 MiB, emulated links, after an error) lasts until the socket took the frame:
// when that frame is parked at the peer (no receive posted there) and larger than the socket buffers, the drop waits
// until the peer posts the receive (or the link fails). Collectives wait on all of their sends, so this only concerns
// point-to-point code that drops large unfinished sends.
//
// Liveness. Every connection sends a heartbeat (a header-only kControl frame) when it has written nothing for
// timeout/4, and a connection that has received nothing for `timeout` is declared dead. The liveness timer ticks every
// timeout/20 (heartbeats are due at that granularity) and, in between, fires at the moment the first link's silence
// would pass `timeout`, so a silent peer is caught at the timeout itself: a fixed tick alone caught it up to timeout/20
// late, which used the whole 5% margin before the abort had travelled or a rank had exited (survivors of a stopped
// rank exited as much as 8% past a 5 s timeout). A peer whose connection ends without the goodbye its transport sends
// when destroyed (it crashed or was killed) fails this rank at once; one that stays silent (SIGSTOP, a hang, a cable)
// at `timeout` after its last frame. The failure is a CommError naming the peer's rank and host, and the abort
// propagates to every other rank (one more frame's latency): every rank fails within tcp.timeout + 5%, which leaves
// the margin to the abort notice and the scheduler (measured with a 2 s timeout: a `terse run` rank fails 2.00-2.02 s
// after its peer is stopped, and exits, its teardown done, 2.09-2.14 s after).
//
// Busy polling (TcpOptions::busy_poll_us). A message the io thread reads (caller reads off, or a frame larger than a
// caller takes) pays two wake-ups per hop: epoll wakes the io thread, whose notify wakes the waiting caller. With a
// budget of B microseconds, a request's wait() spins (with a pause instruction) on its link's event counter for up to B
// before it sleeps on the link's condition variable, re-checking exactly the conditions a wake-up would (so failures,
// broken links and cancellation behave the same), and the io thread, after each handler it runs, keeps polling the
// io_context without blocking until B has passed with nothing to do, then blocks in epoll again (timers -- heartbeats,
// the liveness tick -- fire from either). It is off unless asked for: on the only many-core machine measured (a 16-vCPU
// KVM guest, loopback, `scripts/bench-vs-peers --allreduce --terse-env off:TERSE_TCP_BUSY_POLL_US=0`, 3 rounds) a
// 50 us budget made the 4 KiB allreduce 2.3x slower at 2 ranks (76 against 33 us) and 4.4x at 4 (485 against 110 us),
// and 1 MiB no faster, although every spinning thread had a CPU of its own -- a pause loop in a guest can make the
// hypervisor deschedule the spinning vCPU (pause-loop exiting); a bare-metal host may differ, which is what the knob
// is for. With link emulation it is always off: the pacer sets the times there. A receive that reads its own
// connection (caller reads, above) does not spin this way: it retries its socket for the caller-spin budget instead,
// and then sleeps in poll(). TERSE_TCP_BUSY_POLL_US (0..1000000) sets it where the options leave it unset (-1); a bad
// value is InvalidArgument naming the variable and the value.
//
// Errors. abort(reason) fails every pending and future request of this rank with CommError and sends an abort notice
// (kControl, carrying the reason) to every peer, which aborts with the same reason, so the first reason wins job-wide.
// A peer that aborted and then closed resets a connection this rank is still writing on, after its notice is in this
// rank's socket: a failed write therefore reads the connection on for up to 100 ms before it blames the peer, so the
// notice's reason wins there too (liveness.cc, writeFailed).
// A malformed frame header from an authenticated peer on an established connection is a protocol error: the stream
// has lost its framing, so that connection's receives fail with InvalidPayload and the job is aborted with a message
// naming the peer's rank and host. Control and heartbeat frames are counted under OpKind::kControl.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/auth.h"
#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/spin_wait.h"
#include "core/comm/store.h"
#include "core/comm/transport.h"

namespace terse::comm {

struct TcpOptions {
  int rank = 0;
  int world_size = 1;
  std::string bind_address = "127.0.0.1";    // loopback unless told otherwise
  std::string advertise_address;             // "" = bind_address (when bind is 0.0.0.0/::, the host name's address)
  uint16_t port = 0;                         // 0 = ephemeral
  std::chrono::milliseconds timeout{30000};  // connection setup, and a dead or silent peer
  int socket_buffer_bytes = 0;               // SO_SNDBUF/SO_RCVBUF; 0 = the OS default
  EmulationConfig emulation;                 // link_emulation.h, applied exactly as inproc applies it
  uint64_t max_frame_bytes = kDefaultMaxFrameBytes;
  std::string store_prefix;  // namespaces the keys, so several jobs (variants) can share one store
  std::string host_label;    // this rank's host for messages; "" = hostName()
  // Peers whose loss -- a connection that fails or goes silent past `timeout` -- fails only the operations with them
  // (CommError naming the peer) instead of aborting the job: the workers of a parameter server, which the shards drop
  // and train on without (elastic workers, core/train/param_server.h). Any other lost peer aborts the job.
  std::vector<int> expendable_ranks;
  // Busy polling (header comment): -1 = unset (TERSE_TCP_BUSY_POLL_US when set, else off), 0 = off, N = spin up to N
  // microseconds (at most kMaxBusyPollUs) before sleeping.
  int busy_poll_us = -1;
  // Caller reads (header comment, "Data path"): -1 = unset (TERSE_TCP_CALLER_READS, 0 or 1, when set, else on), 0 =
  // the io thread reads every frame, 1 = on. Always off with link emulation.
  int caller_reads = -1;
  // Caller spin (header comment, "Data path"): -1 = unset (TERSE_TCP_CALLER_SPIN_US when set, else
  // kDefaultCallerSpinUs), 0 = a reading caller sleeps in poll() at once, N = it retries for up to N microseconds (at
  // most kMaxBusyPollUs), yielding its CPU between tries, before it sleeps.
  int caller_spin_us = -1;
};

// The largest busy-poll or caller-spin budget accepted, in microseconds.
inline constexpr int kMaxBusyPollUs = kMaxSpinUs;

// A reading caller's spin budget when neither the options nor TERSE_TCP_CALLER_SPIN_US set one (transport.h, "Data
// path": measured).
inline constexpr int kDefaultCallerSpinUs = 50;

// The budget (microseconds, 0 = off) a transport with these options uses: off with link emulation; else the option
// when it is >= 0; else TERSE_TCP_BUSY_POLL_US from `env` when set; else off. Throws InvalidArgument naming the
// variable and the value for a bad TERSE_TCP_BUSY_POLL_US (checked with emulation too), or naming the field for a bad
// option.
int resolveBusyPollUs(const TcpOptions& options, const EnvLookup& env);

// Whether a transport with these options lets callers read their connections: off with link emulation; else the
// option when it is 0 or 1; else TERSE_TCP_CALLER_READS from `env` when set; else on. Throws InvalidArgument naming the
// variable and the value for a bad TERSE_TCP_CALLER_READS, or naming the field for a bad option.
bool resolveCallerReads(const TcpOptions& options, const EnvLookup& env);

// The spin budget (microseconds, 0 = off) of a caller reading its connection: 0 with link emulation (no caller
// reads); else the option when it is >= 0; else TERSE_TCP_CALLER_SPIN_US from `env` when set; else
// kDefaultCallerSpinUs. Throws InvalidArgument naming the variable and the value for a bad TERSE_TCP_CALLER_SPIN_US,
// or naming the field for a bad option.
int resolveCallerSpinUs(const TcpOptions& options, const EnvLookup& env);

// Collective: every rank of the job calls it with the same world_size and store; returns once the full mesh is
// connected and authenticated. Throws CommError naming the missing ranks/hosts on timeout, InvalidArgument for bad
// options.
std::unique_ptr<Transport> connectTcpTransport(const TcpOptions& options, const JobToken& token, Store& store);

}  // namespace terse::comm

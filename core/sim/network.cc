// Frames as byte streams of SimGrid communications, their arrivals from SimGrid's network signal (network.h).
#include "core/sim/network.h"

#include <simgrid/kernel/resource/Action.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/Mutex.hpp>
#include <simgrid/s4u/Semaphore.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/common/error.h"
#include "core/sim/runtime.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;
namespace res = simgrid::kernel::resource;

namespace {

struct Stream;

// A piece of a stream in flight: one SimGrid communication carrying the stream's bytes up to `end`.
struct Piece {
  Stream* stream = nullptr;
  sg4::CommPtr comm;
  uint64_t end = 0;
  uint64_t bytes = 0;
  bool finished = false;  // its communication has ended (it is delivered once every piece before it has too)
  double started_at = 0;  // simulated seconds
  double seen_at = -1;    // the last look at its progress (projectedEnd), and the bytes it then had left
  double seen_left = 0;
  int looks = 0;  // projections made for the piece after it: a bound on the timer's re-arms (network.h, "Streams")
};

// The frames from one rank to another, one byte stream as a TCP connection's (network.h, "Streams").
struct Stream {
  sg4::Host* from = nullptr;
  sg4::Host* to = nullptr;
  uint64_t piece = 0;               // bytes per piece (pieceBytesFor)
  double latency = 0;               // the route's, seconds
  double bandwidth = 0;             // its slowest link's, bytes per second
  uint64_t queued = 0;              // the end of the last frame handed to the network
  uint64_t started = 0;             // bytes in pieces started
  uint64_t delivered = 0;           // bytes arrived in order
  std::deque<uint64_t> frame_ends;  // where the frames not yet wholly started end: a piece never crosses one
  std::deque<Piece> pieces;  // started and not yet delivered, in stream order (references stay valid: push_back and
                             // pop_front only)
  Piece* last = nullptr;     // the last piece started, while it has not finished: the next one follows it
  std::multimap<double, Stream*>::iterator timer;  // into Arrivals::timers_, when `timed`
  bool timed = false;
  std::multimap<uint64_t, std::function<void()>> notices;  // whenArrived: by the end of their frame
  sg4::MutexPtr mutex;                                     // with cv: made for the stream's first waiter
  sg4::ConditionVariablePtr cv;                            // notified whenever `delivered` moves
  bool pump_posted = false;                                // a pump of this stream is queued for the courier
};

}  // namespace

// The streams, their pieces in flight by SimGrid communication, and the notices not yet run. Touched by actors and by
// the maestro (the signal), never at once: SimGrid runs all of them on one OS thread.
class Arrivals {
 public:
  Arrivals();
  ~Arrivals();
  Stream& stream(sg4::Host* from, sg4::Host* to, int from_rank, int to_rank, std::size_t ranks);
  // Appends a frame of `bytes` to the stream and starts what its timing allows (from an actor); returns where the
  // frame begins in the stream.
  uint64_t queue(Stream& s, uint64_t bytes);
  // Starts the pieces the stream's timing allows, or arms its timer for the next (from an actor: SimGrid's calls are
  // not the maestro's to make).
  void pump(Stream& s);
  // Queues fn for the courier and wakes it: from an actor, or from the maestro (a semaphore's release is then run in
  // place; it blocks nobody).
  void post(std::function<void()> fn);
  // Starts the courier on its first call, from an actor.
  void startCourier(SimRuntime& runtime, sg4::Host* host);
  // Lets go of the communications of the pieces delivered so far, from an actor (ended_). Every frame's start does, as
  // the courier does before each notice: where no notice was ever posted (a ring of frames smaller than a piece rings
  // no bell and pumps every piece at once), nothing else did, and every piece's communication stayed to the end of the
  // run, its memory growing with the frames (results/reference/simulation/cost_curve.md).
  void releaseEnded() { ended_.clear(); }
  std::size_t held() const { return watched_.size() + ended_.size(); }

 private:
  void finished(const void* comm);
  void arm(Stream& s, double at);

  std::unordered_map<uint64_t, std::unique_ptr<Stream>> streams_;  // by from * ranks + to, made on a pair's first frame
  std::unordered_map<const void*, Piece*> watched_;
  std::vector<sg4::CommPtr> ended_;  // communications of delivered pieces, released by the courier (not the maestro,
                                     // inside whose model update a communication's last reference must not go)
  std::deque<std::function<void()>> notices_;
  sg4::SemaphorePtr ready_ = sg4::Semaphore::create(0);  // counts notices_
  std::multimap<double, Stream*> timers_;  // streams whose next piece is due at a simulated instant, for the courier
  double waking_at_ = HUGE_VAL;  // the timer the courier sleeps until (HUGE_VAL: none; -HUGE_VAL: it is running)
  bool courier_ = false;
};

namespace {

// SimGrid's signals cannot be disconnected through its public API (3.32): the one handler, connected once per process,
// forwards to the network of the simulation running (one at a time: SimGrid has one engine per process).
Arrivals*& current() {
  static Arrivals* arrivals = nullptr;
  return arrivals;
}

// Simulated instants closer than this are one (a timer that fired at its time, give or take the clock's rounding).
constexpr double kInstant = 1e-12;

// A route's latency (summed) and bandwidth (its slowest link's, bytes per second; HUGE_VAL for a route of no links).
struct Route {
  double latency = 0;
  double bandwidth = HUGE_VAL;
  bool links = false;
};

Route routeOf(sg4::Host* from, sg4::Host* to) {
  std::vector<sg4::Link*> links;
  Route r;
  from->route_to(to, links, &r.latency);
  for (const sg4::Link* l : links) r.bandwidth = std::min(r.bandwidth, l->get_bandwidth());
  r.links = !links.empty();
  return r;
}

// The piece size of a route (network.h, "Streams"): kStreamPieceBytes, or 4 x bandwidth x latency when that is more,
// so that a long route is not cut into more pieces than its latency needs.
uint64_t pieceBytesFor(const Route& r) {
  const double bdp4 = r.links ? 4 * r.bandwidth * r.latency : 0.0;
  // Above a gigabyte a frame is never split (an unlimited link, 1e15 bytes/s, times any latency).
  return bdp4 > static_cast<double>(kStreamPieceBytes) ? static_cast<uint64_t>(std::min(bdp4, 1e9)) : kStreamPieceBytes;
}

// When piece p will have sent its last byte (network.h, "Streams"), as far as can be told now: its latency first, then
// its bytes left at the rate it has been getting since the last look (the route's bandwidth before that). A rate that
// falls after the look makes the estimate early: the stream looks again when it comes.
double projectedEnd(Piece& p, double now) {
  const double bandwidth = p.stream->bandwidth;
  const double left = std::max(p.comm->get_remaining(), 0.0);
  double rate = bandwidth;
  // Only a look taken after its latency measures a rate: one taken during it would count the latency as slowness.
  if (p.seen_at >= p.started_at + p.stream->latency && now > p.seen_at && p.seen_left > left)
    rate = std::min(bandwidth, (p.seen_left - left) / (now - p.seen_at));
  p.seen_at = now;
  p.seen_left = left;
  return std::max(now, p.started_at + p.stream->latency) + left / rate;
}

class StreamTransfer final : public comm::FrameNetwork::Transfer {
 public:
  StreamTransfer(Stream& stream, uint64_t begin, uint64_t end, std::shared_ptr<Arrivals> arrivals, SimRuntime& runtime)
      : stream_(stream), begin_(begin), end_(end), arrivals_(std::move(arrivals)), runtime_(runtime) {}
  // Nobody waits through SimGrid: every end of a frame waits for `delivered` to pass its bytes, moved by the network
  // signal (network.h). The caller's computation is still settled first, so the simulated instants are those of a wait
  // that returns at once when the bytes are there.
  void wait() override { waitBytes(end_ - begin_); }
  void waitBytes(uint64_t bytes) override {
    if (done_) return;
    const uint64_t target = begin_ + std::min(bytes, end_ - begin_);
    runtime_.settle();
    if (stream_.delivered < target) {
      if (!stream_.cv) {
        stream_.mutex = sg4::Mutex::create();
        stream_.cv = sg4::ConditionVariable::create();
      }
      std::unique_lock<sg4::Mutex> lock(*stream_.mutex);
      while (stream_.delivered < target) stream_.cv->wait(lock);
    }
    done_ = stream_.delivered >= end_;
    runtime_.resume();
  }
  bool test() override {
    if (done_) return true;
    runtime_.settle();
    done_ = stream_.delivered >= end_;
    runtime_.resume();
    return done_;
  }
  uint64_t pieceBytes() const override { return stream_.piece; }
  void whenArrived(std::function<void()> fn) {
    if (stream_.delivered >= end_) {
      arrivals_->post(std::move(fn));
    } else {
      stream_.notices.emplace(end_, std::move(fn));
    }
  }

 private:
  Stream& stream_;  // owned by arrivals_
  uint64_t begin_;  // the frame's bytes in its stream
  uint64_t end_;
  std::shared_ptr<Arrivals> arrivals_;
  SimRuntime& runtime_;
  bool done_ = false;  // both ends of a frame may wait on it; the first one to see it done remembers
};

}  // namespace

Arrivals::Arrivals() {
  static const bool connected = [] {
    sg4::Link::on_communication_state_change_cb([](res::NetworkAction& action, res::Action::State) {
      // 3.32 installs no header defining NetworkAction; it is `class NetworkAction : public Action` (single,
      // non-virtual inheritance: the Action is at its start).
      const auto& a = reinterpret_cast<const res::Action&>(action);
      if (current() != nullptr && a.get_state() == res::Action::State::FINISHED && a.get_activity() != nullptr)
        current()->finished(a.get_activity());
    });
    return true;
  }();
  (void)connected;
  TERSE_CHECK(current() == nullptr, InternalError, "simulated network: a second network in one simulation");
  current() = this;
}

Arrivals::~Arrivals() {
  if (current() == this) current() = nullptr;
}

Stream& Arrivals::stream(sg4::Host* from, sg4::Host* to, int from_rank, int to_rank, std::size_t ranks) {
  auto& s = streams_[static_cast<uint64_t>(from_rank) * ranks + static_cast<uint64_t>(to_rank)];
  if (!s) {
    s = std::make_unique<Stream>();
    s->from = from;
    s->to = to;
    const Route r = routeOf(from, to);
    s->piece = pieceBytesFor(r);
    s->latency = r.latency;
    s->bandwidth = std::isfinite(r.bandwidth) ? r.bandwidth : 1e15;
  }
  return *s;
}

uint64_t Arrivals::queue(Stream& s, uint64_t bytes) {
  const uint64_t begin = s.queued;
  s.queued += bytes;
  s.frame_ends.push_back(s.queued);
  // A stream waiting for its timer starts the frame then, behind those queued before it.
  if (!s.timed) pump(s);
  return begin;
}

void Arrivals::pump(Stream& s) {
  s.pump_posted = false;
  const double now = sg4::Engine::get_clock();
  while (s.started < s.queued) {
    while (s.frame_ends.front() <= s.started) s.frame_ends.pop_front();
    if (s.last != nullptr) {
      // The next piece starts a latency before the last one sends its last byte: its first byte then follows that
      // one's last on the wire, as a TCP connection's next bytes do, where two pieces sending at once shared the wire
      // and the first came in late. The projection looks a few times at most (a piece slowed by other flows is looked
      // at again when it was due), then the piece goes.
      const double due = projectedEnd(*s.last, now) - s.latency;
      if (due > now + kInstant && s.last->looks++ < 8) {
        arm(s, due);
        return;
      }
    }
    // A piece ends with its frame, so a frame arrives with its own last byte, not with the next frame's first piece.
    const uint64_t bytes = std::min(s.frame_ends.front() - s.started, s.piece);
    s.pieces.push_back(Piece{&s, sg4::Comm::sendto_async(s.from, s.to, bytes), s.started + bytes, bytes, false, now});
    Piece& p = s.pieces.back();
    // Watched before this actor's next SimGrid call: the communication cannot end before the clock moves.
    watched_.emplace(p.comm->get_impl(), &p);
    s.started += bytes;
    s.last = &p;
  }
}

void Arrivals::arm(Stream& s, double at) {
  if (s.timed) timers_.erase(s.timer);
  s.timer = timers_.emplace(at, &s);
  s.timed = true;
  // The courier sleeps until its earliest timer or the next notice: an earlier timer wakes it to sleep less.
  if (at < waking_at_) post([] {});
}

void Arrivals::finished(const void* comm) {
  auto it = watched_.find(comm);
  if (it == watched_.end()) return;
  Piece& p = *it->second;
  watched_.erase(it);
  Stream& s = *p.stream;
  p.finished = true;
  // Delivered pieces leave the deque below: the stream forgets a finished one first (nothing follows it any more).
  if (s.last == &p) s.last = nullptr;
  const uint64_t before = s.delivered;
  // In order, as a stream delivers: a piece that overtook one before it waits for it.
  while (!s.pieces.empty() && s.pieces.front().finished) {
    s.delivered = s.pieces.front().end;
    ended_.push_back(std::move(s.pieces.front().comm));
    s.pieces.pop_front();
  }
  if (s.delivered != before) {
    if (s.cv) s.cv->notify_all();
    while (!s.notices.empty() && s.notices.begin()->first <= s.delivered) {
      post(std::move(s.notices.begin()->second));
      s.notices.erase(s.notices.begin());
    }
  }
  // The wire is free: what waited for this piece (a timer that came too early, or none) goes now.
  if (s.last == nullptr && s.started < s.queued && !s.pump_posted) {
    if (s.timed) {
      timers_.erase(s.timer);
      s.timed = false;
    }
    s.pump_posted = true;
    post([this, &s] { pump(s); });
  }
}

void Arrivals::post(std::function<void()> fn) {
  notices_.push_back(std::move(fn));
  ready_->release();
}

void Arrivals::startCourier(SimRuntime& runtime, sg4::Host* host) {
  if (courier_) return;
  courier_ = true;
  // A daemon: SimGrid ends it when the last of the run's own actors ends, blocked on an empty queue.
  runtime.spawnDaemon("arrivals", host, [this] {
    for (;;) {
      ended_.clear();
      // The streams whose next piece is due (pump), then the notices; with a timer set, the wait ends at the earliest.
      const double now = sg4::Engine::get_clock();
      while (!timers_.empty() && timers_.begin()->first <= now + kInstant) {
        Stream& s = *timers_.begin()->second;
        timers_.erase(timers_.begin());
        s.timed = false;
        pump(s);
      }
      if (timers_.empty()) {
        waking_at_ = HUGE_VAL;
        ready_->acquire();
      } else {
        waking_at_ = timers_.begin()->first;
        const bool timed_out = ready_->acquire_timeout(waking_at_ - now);
        // Awake: a timer armed now is seen before the next sleep, without a notice to wake for.
        waking_at_ = -HUGE_VAL;
        if (timed_out) continue;
      }
      waking_at_ = -HUGE_VAL;
      std::function<void()> fn = std::move(notices_.front());
      notices_.pop_front();
      fn();
    }
  });
}

SimNetwork::SimNetwork(std::vector<sg4::Host*> hosts, SimRuntime& runtime)
    : hosts_(std::move(hosts)), runtime_(runtime), arrivals_(std::make_shared<Arrivals>()) {}

SimNetwork::~SimNetwork() = default;

std::shared_ptr<comm::FrameNetwork::Transfer> SimNetwork::start(int from, int to, uint64_t wire_bytes) {
  TERSE_CHECK(from >= 0 && to >= 0 && static_cast<std::size_t>(from) < hosts_.size() &&
                  static_cast<std::size_t>(to) < hosts_.size(),
              InvalidArgument,
              "simulated network: no route " << from << " -> " << to << " among " << hosts_.size() << " hosts");
  TERSE_CHECK(wire_bytes > 0, InvalidArgument,
              "simulated network: an empty frame " << from << " -> " << to << " (a frame carries its header)");
  runtime_.settle();
  sg4::Host* src = hosts_[static_cast<std::size_t>(from)];
  arrivals_->startCourier(runtime_, src);
  arrivals_->releaseEnded();
  Stream& s = arrivals_->stream(src, hosts_[static_cast<std::size_t>(to)], from, to, hosts_.size());
  const uint64_t begin = arrivals_->queue(s, wire_bytes);
  auto t = std::make_shared<StreamTransfer>(s, begin, s.queued, arrivals_, runtime_);
  runtime_.resume();
  return t;
}

void SimNetwork::whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) {
  TERSE_CHECK(to >= 0 && static_cast<std::size_t>(to) < hosts_.size(), InvalidArgument,
              "simulated network: no host " << to << " among " << hosts_.size());
  auto* t = dynamic_cast<StreamTransfer*>(transfer.get());
  TERSE_CHECK(t != nullptr, InvalidArgument, "simulated network: whenArrived on a transfer it did not start");
  runtime_.settle();
  t->whenArrived(std::move(fn));
  runtime_.resume();
}

std::size_t SimNetwork::heldCommunications() const {
  return arrivals_->held();
}

}  // namespace terse::sim

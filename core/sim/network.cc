// Frames as byte streams of SimGrid communications, their arrivals from SimGrid's network signal (network.h).
#include "core/sim/network.h"

#include <simgrid/kernel/resource/Action.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/ConditionVariable.hpp>
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
};

// The frames from one rank to another, one byte stream as a TCP connection's (network.h, "Streams").
struct Stream {
  sg4::Host* from = nullptr;
  sg4::Host* to = nullptr;
  uint64_t piece = 0;               // bytes per piece (pieceBytesFor)
  uint64_t queued = 0;              // the end of the last frame handed to the network
  uint64_t started = 0;             // bytes in pieces started
  uint64_t delivered = 0;           // bytes arrived in order
  uint64_t in_flight = 0;           // bytes of pieces started and not finished
  int flying = 0;                   // pieces started and not finished
  std::deque<uint64_t> frame_ends;  // where the frames not yet wholly started end: a piece never crosses one
  std::deque<Piece> pieces;  // started and not yet delivered, in stream order (references stay valid: push_back and
                             // pop_front only)
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
  // Starts the pieces the stream's window allows (from an actor: SimGrid's calls are not the maestro's to make).
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

  std::unordered_map<uint64_t, std::unique_ptr<Stream>> streams_;  // by from * ranks + to, made on a pair's first frame
  std::unordered_map<const void*, Piece*> watched_;
  std::vector<sg4::CommPtr> ended_;  // communications of delivered pieces, released by the courier (not the maestro,
                                     // inside whose model update a communication's last reference must not go)
  std::deque<std::function<void()>> notices_;
  sg4::SemaphorePtr ready_ = sg4::Semaphore::create(0);  // counts notices_
  bool courier_ = false;
};

namespace {

// SimGrid's signals cannot be disconnected through its public API (3.32): the one handler, connected once per process,
// forwards to the network of the simulation running (one at a time: SimGrid has one engine per process).
Arrivals*& current() {
  static Arrivals* arrivals = nullptr;
  return arrivals;
}

// The piece size of a route (network.h, "Streams"): kStreamPieceBytes, or 4 x bandwidth x latency when that is more,
// so that a piece's latency is always paid while the piece before it still flows.
uint64_t pieceBytesFor(sg4::Host* from, sg4::Host* to) {
  std::vector<sg4::Link*> links;
  double latency = 0;
  from->route_to(to, links, &latency);
  double bandwidth = HUGE_VAL;  // bytes per second
  for (const sg4::Link* l : links) bandwidth = std::min(bandwidth, l->get_bandwidth());
  const double bdp4 = links.empty() ? 0.0 : 4 * bandwidth * latency;
  // Above a gigabyte a frame is never split (an unlimited link, 1e15 bytes/s, times any latency).
  return bdp4 > static_cast<double>(kStreamPieceBytes) ? static_cast<uint64_t>(std::min(bdp4, 1e9)) : kStreamPieceBytes;
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
    s->piece = pieceBytesFor(from, to);
  }
  return *s;
}

void Arrivals::pump(Stream& s) {
  s.pump_posted = false;
  while (s.started < s.queued) {
    while (s.frame_ends.front() <= s.started) s.frame_ends.pop_front();
    // At most two pieces in flight, but for small ones: a burst of small frames goes out together, as on a stream.
    if (s.flying >= 2 && s.in_flight >= s.piece) break;
    // A piece ends with its frame, so a frame arrives with its own last byte, not with the next frame's first piece.
    const uint64_t frame_left = s.frame_ends.front() - s.started;
    uint64_t bytes = 0;
    if (s.flying == 0) {
      // An idle stream's first piece is half a piece: the next one then ends half a piece after it.
      bytes = std::min(frame_left, std::max<uint64_t>(s.piece / 2, 1));
    } else {
      // Half a piece more than the longest one still in flight has left, and at least a piece: when that one ends,
      // this one still has half a piece to go, which covers the next one's latency (network.h).
      double left = 0;
      for (const Piece& p : s.pieces)
        if (!p.finished) left = std::max(left, p.comm->get_remaining());
      bytes = std::min(frame_left, std::max(s.piece, static_cast<uint64_t>(left) + s.piece / 2));
    }
    s.pieces.push_back(Piece{&s, sg4::Comm::sendto_async(s.from, s.to, bytes), s.started + bytes, bytes, false});
    Piece& p = s.pieces.back();
    // Watched before this actor's next SimGrid call: the communication cannot end before the clock moves.
    watched_.emplace(p.comm->get_impl(), &p);
    s.started += bytes;
    s.in_flight += bytes;
    ++s.flying;
  }
}

void Arrivals::finished(const void* comm) {
  auto it = watched_.find(comm);
  if (it == watched_.end()) return;
  Piece& p = *it->second;
  watched_.erase(it);
  Stream& s = *p.stream;
  p.finished = true;
  s.in_flight -= p.bytes;
  --s.flying;
  const uint64_t before = s.delivered;
  // In order, as a stream delivers: a piece that overtook one before it (a small one behind a large one) waits for it.
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
  if (s.started < s.queued && !s.pump_posted) {
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
      ready_->acquire();
      ended_.clear();
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
  const uint64_t begin = s.queued;
  s.queued += wire_bytes;
  s.frame_ends.push_back(s.queued);
  arrivals_->pump(s);
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

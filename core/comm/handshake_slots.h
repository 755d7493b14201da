// Admission of connections that have not yet authenticated, at the listeners of a job (the tcp transport's ports and
// the rendezvous store's): a bounded table of connections in their job-token handshake (auth.h), built so that
// connections which cannot authenticate -- idle, slow, or a flood of them -- cannot keep a real peer out.
//
// - A new connection is always admitted. When its source address already holds max_per_source slots, one of that
//   source's connections is evicted; otherwise, when the table is full, one of all. The victim is the oldest
//   connection that has sent nothing valid yet, or if every one has sent a valid hello, the oldest of all. A real
//   peer sends its hello with its first packet, and completes the handshake one round trip later, when it leaves the
//   table: idle connections, however many and however often renewed, evict only each other. To push a real peer out
//   an intruder must send max_per_source well-formed hellos from its host within that round trip -- a flood, which
//   costs it as much as it costs the listener, and the peer retries with backoff.
// - The per-source bound keeps one host from evicting the peers of every other host. (On one host every connection
//   comes from the same address; then the eviction order alone protects the real peers.)
// - The owner gives every admitted connection a deadline, kUnauthenticatedDeadline at most, to finish authenticating.
//   (The listener's own proof is only sent once the peer proved the token (auth.h), so a slot holds nothing an
//   intruder could use.)
// Not thread-safe: each listener's io thread owns its table.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

namespace terse::comm {

// How long an unauthenticated connection may take to prove the token: a handshake is two round trips and two HMACs,
// milliseconds even between continents, so 2 s is generous for a real peer and short next to any setup timeout
// (30 s by default), which an intruder's idle connections must therefore never outlast.
inline constexpr std::chrono::milliseconds kUnauthenticatedDeadline{2000};
// The tables' bounds, per listener: far above the peers that connect at once (a rank accepts at most world_size - 1;
// a store is joined by every rank within the launch), and each slot is one descriptor and a few hundred bytes.
inline constexpr std::size_t kMaxUnauthenticated = 128;
inline constexpr std::size_t kMaxUnauthenticatedPerSource = 32;

class HandshakeSlots {
 public:
  using Ticket = uint64_t;
  // Called when a connection is evicted: it must close the connection (whose handlers then release its ticket, which
  // is then a no-op). It must not call admit.
  using Evict = std::function<void()>;

  HandshakeSlots(std::size_t max_total = kMaxUnauthenticated,
                 std::size_t max_per_source = kMaxUnauthenticatedPerSource);

  // Admits a connection from `source` (its address without the port); evicts one connection first if a bound is
  // reached (see above). Returns the new connection's ticket.
  Ticket admit(const std::string& source, Evict evict);
  // The connection sent a well-formed hello: from now on it is evicted only after every silent one.
  void progressed(Ticket ticket);
  // The connection left its handshake (authenticated, refused, timed out, closed). Unknown tickets are ignored.
  void release(Ticket ticket);

  std::size_t size() const noexcept { return entries_.size(); }
  uint64_t evictions() const noexcept { return evictions_; }

 private:
  struct Entry {
    std::string source;
    Evict evict;
    bool progressed = false;
  };
  // The victim among the entries of `source` (all entries when null): the oldest silent one, else the oldest.
  std::map<Ticket, Entry>::iterator victim(const std::string* source);
  void evict(std::map<Ticket, Entry>::iterator it);

  std::size_t max_total_;
  std::size_t max_per_source_;
  Ticket next_ = 1;
  std::map<Ticket, Entry> entries_;  // in admission order: the first is the oldest
  std::unordered_map<std::string, std::size_t> per_source_;
  uint64_t evictions_ = 0;
};

}  // namespace terse::comm

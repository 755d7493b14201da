// The table of unauthenticated connections (handshake_slots.h): admission with eviction per source and overall, silent
// connections first. Linear scans: the table holds at most a few hundred entries.
#include "core/comm/handshake_slots.h"

#include <utility>

#include "core/common/error.h"

namespace terse::comm {

HandshakeSlots::HandshakeSlots(std::size_t max_total, std::size_t max_per_source)
    : max_total_(max_total), max_per_source_(max_per_source) {
  TERSE_CHECK(max_total > 0 && max_per_source > 0 && max_per_source <= max_total, InvalidArgument,
              "handshake slots: need 0 < max_per_source (" << max_per_source << ") <= max_total (" << max_total << ")");
}

void HandshakeSlots::evict(std::map<Ticket, Entry>::iterator it) {
  Evict callback = std::move(it->second.evict);
  release(it->first);
  ++evictions_;
  if (callback) callback();
}

std::map<HandshakeSlots::Ticket, HandshakeSlots::Entry>::iterator HandshakeSlots::victim(const std::string* source) {
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (source != nullptr && it->second.source != *source) continue;
    if (!it->second.progressed) return it;
    if (oldest == entries_.end()) oldest = it;
  }
  return oldest;
}

HandshakeSlots::Ticket HandshakeSlots::admit(const std::string& source, Evict evict_fn) {
  if (auto count = per_source_.find(source); count != per_source_.end() && count->second >= max_per_source_) {
    evict(victim(&source));
  } else if (entries_.size() >= max_total_) {
    evict(victim(nullptr));
  }
  const Ticket t = next_++;
  entries_.emplace(t, Entry{source, std::move(evict_fn), false});
  ++per_source_[source];
  return t;
}

void HandshakeSlots::progressed(Ticket ticket) {
  if (auto it = entries_.find(ticket); it != entries_.end()) it->second.progressed = true;
}

void HandshakeSlots::release(Ticket ticket) {
  auto it = entries_.find(ticket);
  if (it == entries_.end()) return;
  auto count = per_source_.find(it->second.source);
  if (--count->second == 0) per_source_.erase(count);
  entries_.erase(it);
}

}  // namespace terse::comm

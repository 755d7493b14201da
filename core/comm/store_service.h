// The rendezvous store's request semantics (tcp_store.h), apart from sockets and timers: how a request's bytes are
// parsed, what a request does to the key/value table, and what it answers. tcp_store.cc serves it over TCP; the fuzz
// target (tests/fuzz) drives it with arbitrary bytes, as a hostile but authenticated client would.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "core/comm/store.pb.h"

namespace terse::comm {

// The server never waits longer than this for one get, whatever a client asks: a day is beyond any rendezvous, and
// the bound keeps timer arithmetic far from overflow.
inline constexpr std::chrono::milliseconds kMaxGetWait = std::chrono::hours(24);

// Why `key` cannot be a store key (empty, over kStoreMaxKeyBytes, or a byte that is not printable ASCII: keys end up
// in error messages and logs on other hosts), or "" when it can.
std::string storeKeyProblem(std::string_view key);

// A request body (the frame's payload). Throws InvalidPayload when it is not a store request or has no operation.
storepb::Request parseStoreRequest(std::span<const char> body);

struct StoreOutcome {
  storepb::Response response;  // the answer, unless `wait`
  std::string changed;         // the key a set or add wrote: its waiting gets can be answered now
  bool wait = false;           // a get of a missing key: answer when it appears or after wait_for
  std::string wait_key;
  std::chrono::milliseconds wait_for{0};  // <= kMaxGetWait
};

// The key/value table. Bad keys, oversized values and overflowing adds are answered with an error; nothing a request
// holds can make apply throw.
class StoreTable {
 public:
  StoreOutcome apply(const storepb::Request& request);
  // The value of `key`, or null.
  const std::string* find(std::string_view key) const;
  std::size_t size() const noexcept { return values_.size(); }

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

}  // namespace terse::comm

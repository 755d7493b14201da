// The TCP rendezvous store (DESIGN.md section 6): the Store interface (store.h) served over TCP so the ranks of a job
// -- processes on one or many hosts -- can meet before they can reach each other. Rank 0 hosts the server (or a
// standalone `terse store` does); every rank, rank 0 included, talks to it through a TcpStore client. Same role as
// torch.distributed's TCPStore.
//
// Protocol. A connection first authenticates with the job token (auth.h, AuthService::kStore): a peer that does not
// know the token never gets a byte of the store. Then the client sends requests and the server answers each in order.
// Every message is a frame (frame.h: kind kControl, tag = the request's sequence number, length <= kStoreMaxMessage
// Bytes) carrying a protobuf message (store.proto). Both ends validate the header before trusting the length and parse
// the body with protobuf, so a malformed, truncated or oversized message is refused: the server logs it (log.h) and
// drops that connection, and goes on serving every other client.
//
// Blocking get. A get for a missing key waits on the server, not by polling: the server answers when a set or add
// creates the key, or with a timeout error when the client's timeout passes. The client bounds its own wait by that
// timeout plus a grace period, so a server that died or hangs is an error, never a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/comm/auth.h"
#include "core/comm/handshake_slots.h"
#include "core/comm/store.h"

namespace terse::comm {

// Limits on what a store carries; the server refuses anything larger. Store values are addresses, ids and small
// per-rank records, so 1 MiB leaves ample room while bounding what an unauthenticated-looking or buggy peer can make
// the server allocate.
inline constexpr std::size_t kStoreMaxKeyBytes = 4096;
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t{1} << 20;
inline constexpr std::size_t kStoreMaxMessageBytes = kStoreMaxValueBytes + kStoreMaxKeyBytes + 64;
// At most this many connections at once; further ones are accepted and closed at once, so a connection flood cannot
// exhaust the server's descriptors. Of them, at most kMaxUnauthenticated (handshake_slots.h) are still in their
// handshake: a newer stranger evicts the oldest, so strangers cannot keep the ranks out.
inline constexpr std::size_t kStoreMaxConnections = 4096;

struct TcpStoreServerOptions {
  // Loopback unless told otherwise: a store reachable from the network is an explicit choice (DESIGN.md section 6).
  // A numeric address or a host name; "0.0.0.0" or "::" for every interface.
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;  // 0: the OS picks one; port() says which
  // How long a new connection may take to complete the authentication handshake before it is dropped (a silent or
  // slow peer must not hold a connection slot; handshake_slots.h).
  std::chrono::milliseconds handshake_timeout{kUnauthenticatedDeadline};
};

// Serves the store on its own thread (Boost.Asio, one io_context; every connection is a small state machine on it, so
// the key/value map needs no lock). Throws CommError naming the address and port when it cannot bind, InvalidArgument
// for an address that does not resolve.
class TcpStoreServer {
 public:
  TcpStoreServer(const JobToken& token, TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port it listens on (the OS's choice when options.port was 0).
  uint16_t port() const;
  // Closes the listener and every connection (pending gets fail on their clients as "store unreachable") and joins the
  // server thread. Idempotent; the destructor calls it.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A client. Connects on construction, retrying (with backoff) until `timeout` passes, because rank 0 may start its
// server after the other ranks start; a refused handshake (wrong token, not a terse store) is not retried. Throws
// CommError naming host:port and the last reason when no connection authenticates in time, AuthError when the server
// does not know the token.
//
// Calls are serialized on the one connection (a blocking get holds it until it returns). Operations other than get
// are bounded by `timeout` too. A broken connection is a CommError naming the store's address; operations are not
// retried (add is not idempotent).
class TcpStore final : public Store {
 public:
  TcpStore(std::string host, uint16_t port, const JobToken& token, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // Throws InvalidArgument for a key that is empty or over kStoreMaxKeyBytes, or a value over kStoreMaxValueBytes.
  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

  const std::string& host() const noexcept { return host_; }
  uint16_t port() const noexcept { return port_; }

 private:
  struct Reply;
  Reply roundTrip(const std::string& request_bytes, std::chrono::milliseconds wait, std::string_view what);
  void closeSocket() noexcept;

  std::string host_;
  uint16_t port_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // serializes requests on fd_ and guards next_tag_
  int fd_ = -1;
  uint64_t next_tag_ = 1;
};

}  // namespace terse::comm

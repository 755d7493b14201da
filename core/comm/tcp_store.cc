#include "core/comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it
//
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/comm/frame.h"
#include "core/comm/handshake_slots.h"
#include "core/comm/store.pb.h"
#include "core/comm/store_service.h"
#include "core/comm/transport.h"
#include "core/common/log.h"

namespace terse::comm {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// A client gives the server this long beyond a get's own timeout to send the timeout answer before it calls the store
// unresponsive.
constexpr std::chrono::milliseconds kClientGrace{5000};

void checkKey(std::string_view key) {
  if (auto problem = storeKeyProblem(key); !problem.empty()) {
    TERSE_THROW(InvalidArgument, "store: " << problem
                                           << (key.size() <= 64 && problem.find("printable") == std::string::npos
                                                   ? " ('" + std::string(key) + "')"
                                                   : std::string()));
  }
}

std::string frameMessage(uint64_t tag, const std::string& body) {
  FrameHeader header;
  header.meta.kind = OpKind::kControl;
  header.meta.tag = tag;
  header.length = body.size();
  const EncodedHeader encoded = encodeFrameHeader(header);
  std::string out(reinterpret_cast<const char*>(encoded.data()), encoded.size());
  out += body;
  return out;
}

// ------------------------------------------------------------------------------------------------------------------
// Client socket helpers: plain POSIX sockets with poll() so every read and write has a deadline.

std::string errnoText(int err) {
  return std::strerror(err);
}

int remainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Waits until fd is ready for `events`; throws CommError("timed out") when the deadline passes.
void waitFd(int fd, short events, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = remainingMs(deadline);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return;
    if (rc == 0) TERSE_THROW(CommError, what << " timed out");
    if (errno != EINTR) TERSE_THROW(CommError, what << ": poll: " << errnoText(errno));
  }
}

void writeAll(int fd, const char* data, std::size_t n, Clock::time_point deadline, std::string_view what) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<std::size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      waitFd(fd, POLLOUT, deadline, what);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      TERSE_THROW(CommError, what << ": " << (w == 0 ? std::string("connection closed") : errnoText(errno)));
    }
  }
}

void readAll(int fd, char* data, std::size_t n, Clock::time_point deadline, std::string_view what) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r > 0) {
      data += r;
      n -= static_cast<std::size_t>(r);
    } else if (r == 0) {
      TERSE_THROW(CommError, what << ": the store closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      waitFd(fd, POLLIN, deadline, what);
    } else if (errno != EINTR) {
      TERSE_THROW(CommError, what << ": " << errnoText(errno));
    }
  }
}

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// One connection attempt to every address the host resolves to; returns a connected non-blocking socket or throws
// CommError with the reason.
int connectOnce(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    TERSE_THROW(CommError, "cannot resolve '" << host << "': " << ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  std::string last = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    FdGuard s{::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol)};
    if (s.fd < 0) {
      last = "socket: " + errnoText(errno);
      continue;
    }
    if (::connect(s.fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = errnoText(errno);
        continue;
      }
      pollfd p{s.fd, POLLOUT, 0};
      const int rc = ::poll(&p, 1, remainingMs(deadline));
      if (rc <= 0) {
        last = rc == 0 ? "connect timed out" : "poll: " + errnoText(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = errnoText(err);
        continue;
      }
    }
    const int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // requests are small and latency-bound
    return s.release();
  }
  TERSE_THROW(CommError, last);
}

// The client side of the job-token handshake (auth.h) on a connected socket.
void authenticate(int fd, const JobToken& token, Clock::time_point deadline, const std::string& where) {
  AuthClient auth(token, AuthService::kStore);
  const AuthHello hello = auth.hello();
  writeAll(fd, reinterpret_cast<const char*>(hello.data()), hello.size(), deadline, where + ": handshake");
  AuthChallenge challenge{};
  readAll(fd, reinterpret_cast<char*>(challenge.data()), challenge.size(), deadline, where + ": handshake");
  const AuthProof proof = auth.prove(challenge);
  writeAll(fd, reinterpret_cast<const char*>(proof.data()), proof.size(), deadline, where + ": handshake");
  AuthProof confirm{};
  readAll(fd, reinterpret_cast<char*>(confirm.data()), confirm.size(), deadline, where + ": handshake");
  auth.confirm(confirm);  // AuthError: the server refused our proof, or does not know our token
}

}  // namespace

// ==================================================================================================================
// Server

namespace {
class Connection;
}

struct TcpStoreServer::Impl {
  Impl(const JobToken& t, TcpStoreServerOptions o)
      : token(t), options(std::move(o)), acceptor(io), refusals(kRefusalLogBurst, kRefusalLogWindow) {}

  void accept();
  void remove(Connection* c);
  void notifyWaiters(const std::string& key);

  JobToken token;
  TcpStoreServerOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::thread thread;
  uint16_t port = 0;
  bool stopped = false;
  std::mutex stop_mutex;  // guards stopped and the join
  // Everything below is touched only on the io thread, so it needs no lock.
  StoreTable table;
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  std::multimap<std::string, std::shared_ptr<Connection>, std::less<>> waiters;  // key -> connections in a get
  // The connections that have not authenticated yet (handshake_slots.h): an intruder's idle or flooding connections
  // cannot keep the ranks out.
  HandshakeSlots slots;
  // Refused connections are an intruder's to multiply: at most this many lines per window, the rest counted.
  static constexpr std::size_t kRefusalLogBurst = 20;
  static constexpr std::chrono::seconds kRefusalLogWindow{10};
  LogLimiter refusals;
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(TcpStoreServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server.io), auth_(server.token, AuthService::kStore) {
    boost::system::error_code ec;
    const auto remote = socket_.remote_endpoint(ec);
    source_ = ec ? std::string("?") : remote.address().to_string();
    peer_ = ec ? std::string("an unknown peer") : source_ + ":" + std::to_string(remote.port());
  }

  void start() {
    // A slot among the unauthenticated, at the expense of the oldest stranger when the table is full.
    std::weak_ptr<Connection> weak = shared_from_this();
    ticket_ = server_.slots.admit(source_, [weak] {
      if (auto c = weak.lock()) c->drop("evicted to make room for newer connections before it authenticated");
    });
    // The handshake deadline: a peer that connects and stays silent (or trickles bytes) loses its slot.
    auto self = shared_from_this();
    timer_.expires_after(server_.options.handshake_timeout);
    timer_.async_wait([this, self](const boost::system::error_code& ec) {
      if (!ec && !authenticated_) drop("did not authenticate within " + msText(server_.options.handshake_timeout));
    });
    buffer_.resize(kAuthHelloBytes);
    asio::async_read(socket_, asio::buffer(buffer_), [this, self](const boost::system::error_code& ec, std::size_t) {
      guarded("handshake", ec, [&] { onHello(); });
    });
  }

  // Answers a waiting get (the key now exists) or times it out.
  void finishGet(const std::string* value) {
    if (!waiting_) return;
    waiting_ = false;
    timer_.cancel();
    storepb::Response response;
    if (value != nullptr) {
      response.set_value(*value);
    } else {
      auto* error = response.mutable_error();
      error->set_code(storepb::Error::TIMEOUT);
      error->set_message("store: key '" + waiting_key_ + "' did not appear within " + msText(waiting_for_));
    }
    reply(response);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (waiting_) eraseWaiter();
    waiting_ = false;
    if (!authenticated_) server_.slots.release(ticket_);
    server_.remove(this);
  }

 private:
  static std::string msText(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

  // Runs a step of the state machine; any failure drops this connection only (logged), never the server.
  template <class F>
  void guarded(std::string_view stage, const boost::system::error_code& ec, F&& step) {
    if (closed_) return;
    if (ec) {
      if (!authenticated_) {
        drop("closed during the handshake (" + ec.message() + ")");
        return;
      }
      // A peer that hangs up between requests is normal; mid-message it is worth a debug line.
      if (ec != asio::error::eof || stage != "request header")
        TERSE_LOG(LogLevel::kDebug,
                  "store: connection from " << peer_ << " ended during " << stage << ": " << ec.message());
      close();
      return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      drop(std::string(stage) + ": " + e.what());
    }
  }

  void drop(const std::string& reason) {
    if (closed_) return;
    server_.refusals.log(LogLevel::kWarn, "store: dropping the connection from " + peer_ + ": " + reason);
    close();
  }

  void onHello() {
    const AuthChallenge challenge =
        auth_.challenge(std::as_bytes(std::span<const char>(buffer_)));  // AuthError on a malformed hello
    server_.slots.progressed(ticket_);
    buffer_.assign(reinterpret_cast<const char*>(challenge.data()),
                   reinterpret_cast<const char*>(challenge.data()) + challenge.size());
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(buffer_), [this, self](const boost::system::error_code& ec, std::size_t) {
      guarded("handshake", ec, [&] {
        buffer_.resize(kAuthProofBytes);
        asio::async_read(socket_, asio::buffer(buffer_),
                         [this, self](const boost::system::error_code& ec2, std::size_t) {
                           guarded("handshake", ec2, [&] { onProof(); });
                         });
      });
    });
  }

  void onProof() {
    AuthProof confirm{};
    std::string refused;
    try {
      confirm = auth_.verify(std::as_bytes(std::span<const char>(buffer_)));
    } catch (const AuthError& e) {
      // Tell a client of another job to stop retrying, then hang up (auth.h: the refusal holds nothing to guess from).
      confirm = AuthServer::refusal();
      refused = e.what();
    }
    if (refused.empty()) {
      authenticated_ = true;
      server_.slots.release(ticket_);
      timer_.cancel();
    }
    buffer_.assign(reinterpret_cast<const char*>(confirm.data()),
                   reinterpret_cast<const char*>(confirm.data()) + confirm.size());
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(buffer_),
                      [this, self, refused](const boost::system::error_code& ec, std::size_t) {
                        if (!refused.empty()) return drop("handshake: " + refused);
                        guarded("handshake", ec, [&] { readHeader(); });
                      });
  }

  void readHeader() {
    auto self = shared_from_this();
    buffer_.resize(kFrameHeaderBytes);
    asio::async_read(socket_, asio::buffer(buffer_), [this, self](const boost::system::error_code& ec, std::size_t) {
      guarded("request header", ec, [&] {
        const FrameHeader h = decodeFrameHeader(std::as_bytes(std::span<const char>(buffer_)), kStoreMaxMessageBytes,
                                                "store request from " + peer_);
        TERSE_CHECK(
            h.meta.kind == OpKind::kControl, InvalidPayload,
            "store request from " << peer_ << ": frame kind " << opKindName(h.meta.kind) << ", expected control");
        tag_ = h.meta.tag;
        buffer_.resize(static_cast<std::size_t>(h.length));
        asio::async_read(socket_, asio::buffer(buffer_),
                         [this, self](const boost::system::error_code& ec2, std::size_t) {
                           guarded("request body", ec2, [&] { onRequest(); });
                         });
      });
    });
  }

  void onRequest() {
    StoreOutcome out = server_.table.apply(parseStoreRequest(buffer_));  // InvalidPayload: not a store request
    if (!out.wait) {
      reply(out.response);
      if (!out.changed.empty()) server_.notifyWaiters(out.changed);
      return;
    }
    // Wait server-side: the answer goes out when a set or add creates the key, or when the timer fires.
    waiting_ = true;
    waiting_key_ = std::move(out.wait_key);
    waiting_for_ = out.wait_for;
    server_.waiters.emplace(waiting_key_, shared_from_this());
    auto self = shared_from_this();
    timer_.expires_after(waiting_for_);
    // The generation tells this wait's expiry from a stale one that had already fired when a set answered it.
    timer_.async_wait([this, self, gen = ++wait_generation_](const boost::system::error_code& ec) {
      if (ec || !waiting_ || gen != wait_generation_) return;
      eraseWaiter();
      finishGet(nullptr);
    });
  }

  void eraseWaiter() {
    auto [first, last] = server_.waiters.equal_range(waiting_key_);
    for (auto it = first; it != last; ++it) {
      if (it->second.get() == this) {
        server_.waiters.erase(it);
        return;
      }
    }
  }

  void reply(const storepb::Response& response) {
    out_ = frameMessage(tag_, response.SerializeAsString());
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [this, self](const boost::system::error_code& ec, std::size_t) {
      guarded("response", ec, [&] { readHeader(); });
    });
  }

  TcpStoreServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // the handshake deadline, then a waiting get's deadline
  AuthServer auth_;
  std::string source_;  // the peer's address, without the port
  std::string peer_;
  HandshakeSlots::Ticket ticket_ = 0;  // its slot while unauthenticated
  std::vector<char> buffer_;           // the message being read
  std::string out_;                    // the response being written
  uint64_t tag_ = 0;
  bool authenticated_ = false;
  bool closed_ = false;
  bool waiting_ = false;
  uint64_t wait_generation_ = 0;
  std::string waiting_key_;
  std::chrono::milliseconds waiting_for_{0};
};

}  // namespace

void TcpStoreServer::Impl::accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // EMFILE and friends: log, back off briefly so a descriptor shortage does not spin, keep serving.
      refusals.log(LogLevel::kWarn, "store: accept failed: " + ec.message());
      auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(50));
      timer->async_wait([this, timer](const boost::system::error_code&) { accept(); });
      return;
    }
    if (connections.size() >= kStoreMaxConnections) {
      refusals.log(LogLevel::kWarn,
                   "store: refusing a connection: already " + std::to_string(connections.size()) + " open");
      boost::system::error_code ignored;
      socket.close(ignored);
    } else {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto c = std::make_shared<Connection>(*this, std::move(socket));
      connections.emplace(c.get(), c);
      c->start();
    }
    accept();
  });
}

void TcpStoreServer::Impl::remove(Connection* c) {
  // Deferred: the caller may be a member of *c, which must outlive the call (handlers also hold it).
  if (auto it = connections.find(c); it != connections.end()) {
    auto keep = it->second;
    connections.erase(it);
    asio::post(io, [keep] {});
  }
}

void TcpStoreServer::Impl::notifyWaiters(const std::string& key) {
  auto [first, last] = waiters.equal_range(key);
  std::vector<std::shared_ptr<Connection>> ready;
  for (auto it = first; it != last; ++it) ready.push_back(it->second);
  waiters.erase(first, last);
  const std::string& value = *table.find(key);
  for (auto& c : ready) c->finishGet(&value);
}

TcpStoreServer::TcpStoreServer(const JobToken& token, TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(token, std::move(options))) {
  Impl& s = *impl_;
  TERSE_CHECK(s.options.handshake_timeout.count() > 0, InvalidArgument,
              "store server: handshake_timeout must be positive, got " << s.options.handshake_timeout.count() << " ms");
  const std::string where = s.options.bind_address + ":" + std::to_string(s.options.port);
  tcp::endpoint endpoint;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(s.options.bind_address, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, s.options.port);
  } else {
    tcp::resolver resolver(s.io);
    auto results = resolver.resolve(s.options.bind_address, std::to_string(s.options.port), ec);
    TERSE_CHECK(!ec && !results.empty(), InvalidArgument,
                "store server: cannot resolve the bind address '" << s.options.bind_address << "': " << ec.message());
    endpoint = results.begin()->endpoint();
  }
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  TERSE_CHECK(!ec, CommError, "store server: cannot listen on " << where << ": " << ec.message());
  s.port = s.acceptor.local_endpoint().port();
  s.accept();
  s.thread = std::thread([&s] {
    // Handlers catch their own errors; this is the last line of defence so a bug cannot take the process down.
    for (;;) {
      try {
        s.io.run();
        return;
      } catch (const std::exception& e) {
        TERSE_LOG(LogLevel::kError, "store server: unexpected error: " << e.what());
      }
    }
  });
  TERSE_LOG(LogLevel::kInfo, "store: serving on " << endpoint.address().to_string() << ":" << s.port);
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

uint16_t TcpStoreServer::port() const {
  return impl_->port;
}

void TcpStoreServer::stop() {
  std::lock_guard lock(impl_->stop_mutex);
  if (impl_->stopped) return;
  impl_->stopped = true;
  Impl& s = *impl_;
  asio::post(s.io, [&s] {
    boost::system::error_code ignored;
    s.acceptor.close(ignored);
    std::vector<std::shared_ptr<Connection>> open;
    for (auto& [_, c] : s.connections) open.push_back(c);
    for (auto& c : open) c->close();
    s.waiters.clear();
    s.io.stop();
  });
  if (s.thread.joinable()) s.thread.join();
}

// ==================================================================================================================
// Client

struct TcpStore::Reply {
  storepb::Response response;
};

TcpStore::TcpStore(std::string host, uint16_t port, const JobToken& token, std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  TERSE_CHECK(timeout.count() > 0, InvalidArgument, "store: the timeout must be positive, got " << timeout.count());
  const std::string where = "store at " + host_ + ":" + std::to_string(port_);
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(20);
  std::string last;
  int attempts = 0;
  for (;;) {
    ++attempts;
    try {
      FdGuard s{connectOnce(host_, port_, deadline)};
      authenticate(s.fd, token, deadline, where);
      fd_ = s.release();
      return;
    } catch (const AuthError& e) {
      // A server that does not know our token will never learn it: retrying only delays the error.
      TERSE_THROW(AuthError, where << ": authentication failed: " << e.what()
                                   << " (do all ranks share one job token? see TERSE_JOB_TOKEN)");
    } catch (const CommError& e) {
      last = e.what();
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  TERSE_THROW(CommError, "cannot reach the " << where << " within " << timeout.count() << " ms (" << attempts
                                             << " attempts; last: " << last
                                             << "); is rank 0 (or `terse store`) running there?");
}

TcpStore::~TcpStore() {
  closeSocket();
}

void TcpStore::closeSocket() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TcpStore::Reply TcpStore::roundTrip(const std::string& request_bytes, std::chrono::milliseconds wait,
                                    std::string_view what) {
  const std::string where = "store at " + host_ + ":" + std::to_string(port_);
  TERSE_CHECK(fd_ >= 0, CommError, where << ": " << what << ": the connection broke earlier");
  const uint64_t tag = next_tag_++;
  const auto deadline = Clock::now() + wait;
  try {
    const std::string framed = frameMessage(tag, request_bytes);
    writeAll(fd_, framed.data(), framed.size(), deadline, where + ": " + std::string(what));
    EncodedHeader raw{};
    readAll(fd_, reinterpret_cast<char*>(raw.data()), raw.size(), deadline, where + ": " + std::string(what));
    const FrameHeader h = decodeFrameHeader(raw, kStoreMaxMessageBytes, "response from the " + where);
    TERSE_CHECK(h.meta.kind == OpKind::kControl && h.meta.tag == tag, InvalidPayload,
                "response from the " << where << ": kind " << opKindName(h.meta.kind) << " tag " << h.meta.tag
                                     << ", expected control tag " << tag);
    std::string body(static_cast<std::size_t>(h.length), '\0');
    readAll(fd_, body.data(), body.size(), deadline, where + ": " + std::string(what));
    Reply reply;
    TERSE_CHECK(reply.response.ParseFromString(body), InvalidPayload,
                "response from the " << where << ": " << body.size() << " bytes that are not a store message");
    return reply;
  } catch (const InvalidPayload& e) {
    closeSocket();  // the stream lost its framing: nothing after this can be trusted
    TERSE_THROW(CommError, e.what());
  } catch (const CommError&) {
    closeSocket();
    throw;
  }
}

namespace {
void throwIfError(const storepb::Response& r, std::string_view expect_what, bool has_expected) {
  if (r.has_error()) {
    if (r.error().code() == storepb::Error::INVALID_ARGUMENT) throw InvalidArgument(r.error().message());
    throw CommError(r.error().message());
  }
  TERSE_CHECK(has_expected, CommError, "store: the server answered without " << expect_what);
}
}  // namespace

void TcpStore::set(const std::string& key, std::string_view value) {
  checkKey(key);
  TERSE_CHECK(value.size() <= kStoreMaxValueBytes, InvalidArgument,
              "store: the value for key '" << key << "' is " << value.size() << " bytes, over the limit of "
                                           << kStoreMaxValueBytes);
  storepb::Request request;
  request.mutable_set()->set_key(key);
  request.mutable_set()->set_value(std::string(value));
  std::lock_guard lock(mutex_);
  const Reply reply = roundTrip(request.SerializeAsString(), timeout_, "set '" + key + "'");
  throwIfError(reply.response, "an acknowledgement", reply.response.has_ok());
}

std::string TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  checkKey(key);
  const auto wait = std::clamp(timeout, std::chrono::milliseconds(0), kMaxGetWait);
  storepb::Request request;
  request.mutable_get()->set_key(key);
  request.mutable_get()->set_timeout_ms(static_cast<uint64_t>(wait.count()));
  std::lock_guard lock(mutex_);
  try {
    const Reply reply = roundTrip(request.SerializeAsString(), wait + kClientGrace, "get '" + key + "'");
    throwIfError(reply.response, "a value", reply.response.result_case() == storepb::Response::kValue);
    return reply.response.value();
  } catch (const CommError& e) {
    // Name the key whatever went wrong, so a rendezvous that stalls says what it waited for.
    if (std::string_view(e.what()).find("'" + key + "'") != std::string_view::npos) throw;
    TERSE_THROW(CommError, "store: get of key '" << key << "' failed: " << e.what());
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  checkKey(key);
  storepb::Request request;
  request.mutable_add()->set_key(key);
  request.mutable_add()->set_delta(delta);
  std::lock_guard lock(mutex_);
  const Reply reply = roundTrip(request.SerializeAsString(), timeout_, "add '" + key + "'");
  throwIfError(reply.response, "a counter", reply.response.result_case() == storepb::Response::kCounter);
  return reply.response.counter();
}

bool TcpStore::check(const std::string& key) {
  checkKey(key);
  storepb::Request request;
  request.mutable_check()->set_key(key);
  std::lock_guard lock(mutex_);
  const Reply reply = roundTrip(request.SerializeAsString(), timeout_, "check '" + key + "'");
  throwIfError(reply.response, "an answer", reply.response.result_case() == storepb::Response::kExists);
  return reply.response.exists();
}

}  // namespace terse::comm

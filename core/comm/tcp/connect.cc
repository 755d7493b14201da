// The tcp transport's connection setup (connect.h): listening and advertising, the handshakes of accepted connections,
// connection attempts with backoff, and the message that names every rank setup is still missing.
#include "core/comm/tcp/connect.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "core/comm/tcp/wire.h"
#include "core/common/error.h"
#include "core/common/log.h"

namespace terse::comm::tcp {

using asio::ip::tcp;

// One connection in its handshake: the job-token exchange (auth.h), then the hellos. Every step has a deadline; any
// failure drops the connection (accepting side) or retries it (connecting side).
struct Connector::Handshake {
  explicit Handshake(asio::io_context& io) : socket(std::make_unique<tcp::socket>(io)), timer(io) {}
  // Closes the socket when `timeout` passes before the next arm() or the end: a silent peer cannot hold the
  // connection longer than that.
  static void arm(const std::shared_ptr<Handshake>& h, Clock::duration timeout) {
    h->timer.expires_after(timeout);
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (ec || !h->socket) return;
      h->timed_out = true;
      boost::system::error_code ignored;
      h->socket->close(ignored);
    });
  }
  std::string why(const char* step, const boost::system::error_code& ec) const {
    if (evicted) return std::string(step) + ": evicted to make room for newer connections (handshake_slots.h)";
    if (timed_out) return std::string(step) + ": no answer within the deadline";
    return std::string(step) + ": " + ec.message();
  }

  std::unique_ptr<tcp::socket> socket;
  asio::steady_timer timer;
  std::string remote;                 // "127.0.0.1:40000", for messages
  HandshakeSlots::Ticket ticket = 0;  // accepting side: its slot while unauthenticated
  AuthHello auth_hello{};
  AuthChallenge auth_challenge{};
  AuthProof auth_proof{};
  AuthProof auth_confirm{};
  tcp_wire::HelloBytes hello_out{};
  std::string label_out;
  tcp_wire::HelloBytes hello_in{};
  std::string label_in;
  tcp_wire::Hello peer_hello;
  bool timed_out = false;
  bool evicted = false;
};

Connector::Connector(asio::io_context& io, const TcpOptions& options, const JobToken& token, const std::string& label,
                     const std::string& who, std::vector<std::shared_ptr<Link>>& links)
    : io_(io),
      options_(options),
      token_(token),
      label_(label),
      who_(who),
      n_(options.world_size),
      rank_(options.rank),
      links_(links),
      acceptor_(io),
      handshake_timeout_(std::min<Clock::duration>(options.timeout, std::chrono::seconds(10))),
      auth_deadline_(std::min<Clock::duration>(handshake_timeout_, kUnauthenticatedDeadline)),
      refusals_(kRefusalLogBurst, kRefusalLogWindow) {
  last_error_.resize(static_cast<std::size_t>(n_));
  known_addr_.resize(static_cast<std::size_t>(n_));
}

void Connector::noteError(int peer, const std::string& what) {
  std::lock_guard lock(setup_mutex_);
  last_error_[static_cast<std::size_t>(peer)] = what;
}

SocketBuffers wantedSocketBuffers(const EmulationConfig& emulation, int world_size) {
  SocketBuffers b{kDirectSendBufferBytes, 0};
  if (!emulation.enabled()) return b;
  double bdp = 0;
  for (int from = 0; from < world_size; ++from)
    for (int to = 0; to < world_size; ++to) {
      if (from == to) continue;
      const LinkSpec l = emulation.linkSpec(from, to);
      bdp = std::max(bdp, l.bandwidth_bps / 8 * 2 * l.latency_s);
    }
  b.receive = static_cast<uint64_t>(std::ceil(bdp));
  b.send = std::max(b.send, b.receive);
  return b;
}

void Connector::setSocketOptions(tcp::socket& s) {
  boost::system::error_code ignored;
  // Every frame's header is its own small write at times (heartbeats, control frames, a 4 KiB message): Nagle's
  // algorithm would hold it for the peer's acknowledgement, a delayed-ack timeout on an idle link.
  s.set_option(tcp::no_delay(true), ignored);
  if (options_.socket_buffer_bytes > 0) {
    s.set_option(asio::socket_base::send_buffer_size(options_.socket_buffer_bytes), ignored);
    s.set_option(asio::socket_base::receive_buffer_size(options_.socket_buffer_bytes), ignored);
    return;
  }
  // Only ever raised: setting a buffer turns the kernel's autotuning off for it, which may grow it further (the
  // kernel reports, and caps at net.core.[rw]mem_max, twice what was asked).
  const SocketBuffers want = wantedSocketBuffers(options_.emulation, n_);
  auto raise = [&](auto option, uint64_t bytes) {
    s.get_option(option, ignored);
    if (bytes == 0 || static_cast<uint64_t>(std::max(option.value(), 0)) >= bytes) return;
    s.set_option(decltype(option)(static_cast<int>(std::min<uint64_t>(bytes, INT32_MAX))), ignored);
  };
  raise(asio::socket_base::send_buffer_size(), want.send);
  raise(asio::socket_base::receive_buffer_size(), want.receive);
}

void Connector::startAccept() {
  auto h = std::make_shared<Handshake>(io_);
  acceptor_.async_accept(*h->socket, [this, h](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;  // setup is over
    {
      std::lock_guard lock(setup_mutex_);
      if (setup_done_) return;
    }
    if (ec) {
      // EMFILE and friends: back off briefly so a descriptor shortage does not spin, keep accepting.
      refusals_.log(LogLevel::kWarn, who_ + ": accepting a connection failed: " + ec.message());
      auto t = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
      t->async_wait([this, t](const boost::system::error_code&) { startAccept(); });
      return;
    }
    boost::system::error_code rec;
    const auto ep = h->socket->remote_endpoint(rec);
    const std::string source = rec ? "?" : ep.address().to_string();
    h->remote = rec ? "?" : source + ":" + std::to_string(ep.port());
    // Every connection gets a slot, at the expense of the oldest unauthenticated one (handshake_slots.h).
    h->ticket = slots_.admit(source, [h] {
      h->evicted = true;
      boost::system::error_code ignored;
      if (h->socket) h->socket->close(ignored);
    });
    startHandshake(h);
    startAccept();
  });
}

void Connector::startHandshake(std::shared_ptr<Handshake> h) {
  setSocketOptions(*h->socket);
  auto server = std::make_shared<AuthServer>(token_, AuthService::kTransport);
  auto done = std::make_shared<bool>(false);
  // Ends the handshake: the connection is dropped (and logged, rate-limited) unless `failure` is empty.
  auto finish = [this, h, done](const std::string& failure) {
    if (*done) return;
    *done = true;
    slots_.release(h->ticket);
    h->timer.cancel();
    if (!failure.empty()) {
      refusals_.log(LogLevel::kWarn, who_ + ": dropped a connection from " + h->remote + " during setup: " + failure);
      boost::system::error_code ignored;
      if (h->socket) h->socket->close(ignored);
    }
  };
  auto fail = [h, finish](const char* step, const boost::system::error_code& ec) { finish(h->why(step, ec)); };
  // One deadline for the whole unauthenticated part, not one per message, so a peer that trickles bytes gains nothing.
  Handshake::arm(h, auth_deadline_);
  asio::async_read(
      *h->socket, asio::buffer(h->auth_hello), [=, this](const boost::system::error_code& ec, std::size_t) {
        if (ec) return fail("reading the authentication hello", ec);
        try {
          h->auth_challenge = server->challenge(h->auth_hello);
        } catch (const AuthError& e) {
          return finish(std::string("authentication failed: ") + e.what());
        }
        slots_.progressed(h->ticket);
        asio::async_write(
            *h->socket, asio::buffer(h->auth_challenge), [=, this](const boost::system::error_code& ec2, std::size_t) {
              if (ec2) return fail("writing the authentication challenge", ec2);
              asio::async_read(
                  *h->socket, asio::buffer(h->auth_proof),
                  [=, this](const boost::system::error_code& ec3, std::size_t) {
                    if (ec3) return fail("reading the authentication proof", ec3);
                    try {
                      h->auth_confirm = server->verify(h->auth_proof);
                    } catch (const AuthError& e) {
                      // Tell a rank of another job to stop retrying, then hang up (auth.h: nothing to guess from).
                      h->auth_confirm = AuthServer::refusal();
                      const std::string why = std::string("authentication failed (wrong job token?): ") + e.what();
                      asio::async_write(*h->socket, asio::buffer(h->auth_confirm),
                                        [finish, why](const boost::system::error_code&, std::size_t) { finish(why); });
                      return;
                    }
                    // Authenticated: the peer leaves the table of strangers and gets the per-message deadlines.
                    slots_.release(h->ticket);
                    Handshake::arm(h, handshake_timeout_);
                    asio::async_write(*h->socket, asio::buffer(h->auth_confirm),
                                      [=, this](const boost::system::error_code& ec4, std::size_t) {
                                        if (ec4) return fail("writing the authentication confirmation", ec4);
                                        readHello(h, finish, fail);
                                      });
                  });
            });
      });
}

void Connector::readPeerHello(const std::shared_ptr<Handshake>& h, uint32_t magic, const char* what,
                              const Finish& refuse, const Fail& fail, std::function<void()> then) {
  asio::async_read(*h->socket, asio::buffer(h->hello_in), [=, this](const boost::system::error_code& ec, std::size_t) {
    if (ec) return fail(what, ec);
    try {
      h->peer_hello = tcp_wire::decodeHello(h->hello_in, magic);
    } catch (const InvalidPayload& e) {
      return refuse(e.what());
    }
    h->label_in.resize(h->peer_hello.label_bytes);
    asio::async_read(*h->socket, asio::buffer(h->label_in), [=](const boost::system::error_code& ec2, std::size_t) {
      if (ec2) return fail("reading the host label", ec2);
      then();
    });
  });
}

void Connector::readHello(const std::shared_ptr<Handshake>& h, const Finish& finish, const Fail& fail) {
  readPeerHello(h, tcp_wire::kHelloMagic, "reading the hello", finish, fail, [=, this] {
    const int peer = static_cast<int>(h->peer_hello.rank);
    std::string problem;
    if (h->peer_hello.world_size != static_cast<uint32_t>(n_)) {
      problem = "hello from a job of " + std::to_string(h->peer_hello.world_size) + " ranks, this job has " +
                std::to_string(n_);
    } else if (peer <= rank_ || peer >= n_) {
      problem = "hello from rank " + std::to_string(h->peer_hello.rank) +
                ", but only ranks above this one connect here (" + std::to_string(rank_ + 1) + ".." +
                std::to_string(n_ - 1) + ")";
    } else if (links_[static_cast<std::size_t>(peer)]) {
      problem = "hello from rank " + std::to_string(peer) + ", which is already connected";
    }
    if (!problem.empty()) return finish(problem);
    h->hello_out =
        tcp_wire::encodeHello(tcp_wire::kAckMagic, static_cast<uint32_t>(rank_), static_cast<uint32_t>(n_), label_);
    h->label_out = label_.substr(0, tcp_wire::kMaxLabelBytes);
    // The acknowledgement is written before the link is registered: nothing else may write on the socket while it is
    // in flight.
    std::array<asio::const_buffer, 2> ack{asio::buffer(h->hello_out), asio::buffer(h->label_out)};
    asio::async_write(*h->socket, ack, [=, this](const boost::system::error_code& ec, std::size_t) {
      if (ec) return fail("writing the acknowledgement", ec);
      if (!registerLink(peer, std::move(h->socket), tcp_wire::printable(h->label_in)))
        return finish("rank " + std::to_string(peer) + " connected twice, or after setup ended");
      finish("");
    });
  });
}

void Connector::connectAttempt(int peer, tcp::resolver::results_type endpoints, Clock::time_point deadline,
                               Clock::duration backoff) {
  {
    std::lock_guard lock(setup_mutex_);
    if (setup_done_) return;
  }
  auto h = std::make_shared<Handshake>(io_);
  auto client = std::make_shared<AuthClient>(token_, AuthService::kTransport);
  auto done = std::make_shared<bool>(false);
  // Retries with exponential backoff until the setup deadline; connectTcpTransport reports the last failure.
  auto retry = [this, h, done, peer, endpoints, deadline, backoff](const std::string& failure) {
    if (*done) return;
    *done = true;
    h->timer.cancel();
    boost::system::error_code ignored;
    if (h->socket) h->socket->close(ignored);
    noteError(peer, failure);
    TERSE_LOG(LogLevel::kDebug, who_ << ": connecting to rank " << peer << ": " << failure);
    if (Clock::now() + backoff >= deadline) return;
    auto t = std::make_shared<asio::steady_timer>(io_, backoff);
    t->async_wait([this, t, peer, endpoints, deadline, backoff](const boost::system::error_code& ec) {
      if (ec) return;
      connectAttempt(peer, endpoints, deadline, std::min<Clock::duration>(backoff * 2, std::chrono::seconds(1)));
    });
  };
  auto arm = [this, h]() { Handshake::arm(h, handshake_timeout_); };
  auto fail = [h, retry](const char* step, const boost::system::error_code& ec) { retry(h->why(step, ec)); };
  arm();
  asio::async_connect(*h->socket, endpoints, [=, this](const boost::system::error_code& ec, const tcp::endpoint& ep) {
    if (ec) return fail("connecting", ec);
    h->remote = ep.address().to_string() + ":" + std::to_string(ep.port());
    setSocketOptions(*h->socket);
    h->auth_hello = client->hello();
    arm();
    asio::async_write(
        *h->socket, asio::buffer(h->auth_hello), [=, this](const boost::system::error_code& ec2, std::size_t) {
          if (ec2) return fail("writing the authentication hello", ec2);
          asio::async_read(
              *h->socket, asio::buffer(h->auth_challenge),
              [=, this](const boost::system::error_code& ec3, std::size_t) {
                if (ec3) return fail("reading the authentication challenge", ec3);
                try {
                  h->auth_proof = client->prove(h->auth_challenge);
                } catch (const AuthError& e) {
                  return retry(std::string("authentication failed: ") + e.what());
                }
                arm();
                asio::async_write(
                    *h->socket, asio::buffer(h->auth_proof),
                    [=, this](const boost::system::error_code& ec4, std::size_t) {
                      if (ec4) return fail("writing the authentication proof", ec4);
                      asio::async_read(
                          *h->socket, asio::buffer(h->auth_confirm),
                          [=, this](const boost::system::error_code& ec5, std::size_t) {
                            if (ec5)
                              return fail(
                                  "reading the authentication confirmation (a wrong job token is refused this way)",
                                  ec5);
                            try {
                              client->confirm(h->auth_confirm);
                            } catch (const AuthError& e) {
                              return retry(std::string("authentication failed: ") + e.what());
                            }
                            h->hello_out = tcp_wire::encodeHello(tcp_wire::kHelloMagic, static_cast<uint32_t>(rank_),
                                                                 static_cast<uint32_t>(n_), label_);
                            h->label_out = label_.substr(0, tcp_wire::kMaxLabelBytes);
                            std::array<asio::const_buffer, 2> out{asio::buffer(h->hello_out),
                                                                  asio::buffer(h->label_out)};
                            arm();
                            asio::async_write(*h->socket, out,
                                              [=, this](const boost::system::error_code& ec6, std::size_t) {
                                                if (ec6) return fail("writing the hello", ec6);
                                                readAck(h, peer, done, retry, fail);
                                              });
                          });
                    });
              });
        });
  });
}

void Connector::readAck(const std::shared_ptr<Handshake>& h, int peer, const std::shared_ptr<bool>& done,
                        const Finish& retry, const Fail& fail) {
  readPeerHello(h, tcp_wire::kAckMagic, "reading the acknowledgement (refused by the peer?)", retry, fail, [=, this] {
    if (h->peer_hello.rank != static_cast<uint32_t>(peer) || h->peer_hello.world_size != static_cast<uint32_t>(n_))
      return retry("the listener at " + h->remote + " is rank " + std::to_string(h->peer_hello.rank) + " of " +
                   std::to_string(h->peer_hello.world_size) + ", expected rank " + std::to_string(peer) + " of " +
                   std::to_string(n_));
    if (*done) return;
    *done = true;
    h->timer.cancel();
    if (!registerLink(peer, std::move(h->socket), tcp_wire::printable(h->label_in)))
      noteError(peer, "connected after setup ended");
  });
}

bool Connector::registerLink(int peer, std::unique_ptr<tcp::socket> socket, const std::string& label) {
  {
    std::lock_guard lock(setup_mutex_);
    if (setup_done_ || links_[static_cast<std::size_t>(peer)]) {
      boost::system::error_code ignored;
      if (socket) socket->close(ignored);
      return false;
    }
  }
  auto l = std::make_shared<Link>();
  l->peer = peer;
  l->who = "rank " + std::to_string(peer) + " (host " + label + ")";
  l->socket = std::move(socket);
  l->spec = options_.emulation.linkSpec(rank_, peer);
  l->wire = PacedResource(l->spec.bandwidth_bps);
  links_[static_cast<std::size_t>(peer)] = std::move(l);
  {
    std::lock_guard lock(setup_mutex_);
    ++connected_;
  }
  setup_cv_.notify_all();
  return true;
}

void Connector::closeListener() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

std::string Connector::failure(Store& store, const std::vector<int>& missing, Clock::duration waited) {
  std::ostringstream m;
  m << who_ << ": tcp transport setup timed out after " << secondsText(waited) << ": not connected to ";
  // What the store says now, unless it is gone (its host exited or hangs): then only what this rank learned before.
  std::string store_gone;
  bool first = true;
  for (int r : missing) {
    m << (first ? "" : "; ") << "rank " << r;
    first = false;
    std::string host, addr;
    bool published = false;
    if (store_gone.empty()) {
      try {
        published = store.check(key("addr", r));
        if (published) addr = tcp_wire::printable(store.get(key("addr", r), std::chrono::seconds(1)));
        if (store.check(key("host", r))) host = tcp_wire::printable(store.get(key("host", r), std::chrono::seconds(1)));
      } catch (const std::exception& e) {
        store_gone = tcp_wire::printable(e.what());
      }
    }
    std::string last;
    {
      std::lock_guard lock(setup_mutex_);
      if (addr.empty()) addr = known_addr_[static_cast<std::size_t>(r)];
      last = last_error_[static_cast<std::size_t>(r)];
    }
    if (addr.empty()) {
      if (store_gone.empty())
        m << " (never published its address under '" << key("addr", r)
          << "': not started, stuck before setup, or using a different store/prefix)";
      else
        m << " (its address is unknown here: the store went away before this rank learned it)";
    } else if (r < rank_) {
      m << " (host " << (host.empty() ? "?" : host) << ", published " << addr << " but not reachable from here"
        << (last.empty() ? std::string() : "; last error: " + last) << ")";
    } else {
      m << " (host " << (host.empty() ? "?" : host) << ", published " << addr
        << ", but never completed a connection to this rank: higher ranks connect to lower ones; see its own error)";
    }
  }
  if (!store_gone.empty())
    m << ". The rendezvous store is unreachable (its host -- rank 0 or `terse store` -- exited or hangs): "
      << store_gone;
  return m.str();
}

std::string Connector::listen() {
  tcp::endpoint bind_ep;
  try {
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(options_.bind_address, std::to_string(options_.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service);
    TERSE_CHECK(!results.empty(), InvalidArgument,
                "tcp transport: bind address '" << options_.bind_address << "' does not resolve");
    bind_ep = results.begin()->endpoint();
  } catch (const boost::system::system_error& e) {
    TERSE_THROW(InvalidArgument,
                "tcp transport: bind address '" << options_.bind_address << "' does not resolve: " << e.what());
  }
  try {
    acceptor_.open(bind_ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    if (options_.socket_buffer_bytes > 0)  // accepted sockets inherit it, before the window is negotiated
      acceptor_.set_option(asio::socket_base::receive_buffer_size(options_.socket_buffer_bytes));
    acceptor_.bind(bind_ep);
    acceptor_.listen();
  } catch (const boost::system::system_error& e) {
    TERSE_THROW(CommError, who_ << ": tcp transport cannot listen on " << options_.bind_address << ":" << options_.port
                                << ": " << e.what());
  }
  const uint16_t port = acceptor_.local_endpoint().port();
  std::string advertise = options_.advertise_address;
  if (advertise.empty()) {
    advertise = options_.bind_address;
    if (bind_ep.address().is_unspecified()) {
      // Bound to every interface: advertise the address the host name resolves to (what peers on other hosts use).
      try {
        tcp::resolver resolver(io_);
        // Debian maps the host name to 127.0.1.1 in /etc/hosts: prefer an address other hosts can reach.
        advertise = asio::ip::host_name();
        bool found_remote = false;
        for (const auto& e : resolver.resolve(asio::ip::host_name(), "0")) {
          if (found_remote) break;
          const auto addr = e.endpoint().address();
          if (!addr.is_loopback() && !(addr.is_v4() && (addr.to_v4().to_uint() >> 24) == 127)) {
            advertise = addr.to_string();
            found_remote = true;
          }
        }
      } catch (const boost::system::system_error&) {
        advertise = asio::ip::host_name();
      }
    }
  }
  return (advertise.find(':') != std::string::npos ? "[" + advertise + "]" : advertise) + ":" + std::to_string(port);
}

void Connector::meet(Store& store, const std::string& published, Clock::time_point deadline) {
  if (rank_ < n_ - 1) asio::post(io_, [this] { startAccept(); });

  // The host first, so whoever sees the address can name the host too.
  store.set(key("host", rank_), label_);
  store.set(key("addr", rank_), published);
  TERSE_LOG(LogLevel::kDebug, who_ << ": tcp transport listening at " << published);

  for (int peer = 0; peer < rank_; ++peer) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    std::string addr;
    try {
      addr = store.get(key("addr", peer), std::chrono::duration_cast<std::chrono::milliseconds>(left));
    } catch (const CommError& e) {
      noteError(peer, e.what());
      continue;
    }
    {
      std::lock_guard lock(setup_mutex_);
      known_addr_[static_cast<std::size_t>(peer)] = tcp_wire::printable(addr);
    }
    const auto colon = addr.rfind(':');
    std::string host = colon == std::string::npos ? addr : addr.substr(0, colon);
    const std::string service = colon == std::string::npos ? "" : addr.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    try {
      tcp::resolver resolver(io_);
      auto endpoints = resolver.resolve(host, service, tcp::resolver::numeric_service);
      asio::post(io_, [this, peer, endpoints, deadline] {
        connectAttempt(peer, endpoints, deadline, std::chrono::milliseconds(20));
      });
    } catch (const boost::system::system_error& e) {
      noteError(peer, "address '" + tcp_wire::printable(addr) + "' does not resolve: " + e.what());
    }
  }

  std::unique_lock lock(setup_mutex_);
  setup_cv_.wait_until(lock, deadline, [&] { return connected_ == n_ - 1; });
  // From here on the io thread registers no more links (a late handshake sees setup_done_).
  setup_done_ = true;
}

}  // namespace terse::comm::tcp

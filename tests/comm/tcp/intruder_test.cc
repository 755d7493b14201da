// Intruders at a job's ports, as any local user (or anyone who reaches a non-loopback bind address) can be: idle
// connections holding handshake slots -- as many as the tables allow and more, renewed as soon as they are evicted --
// on every rank's port and on the store's while the job sets up, which must still complete; what an unauthenticated
// peer receives, which must not let it test a guess of the token offline; and the log of refused connections, which
// an intruder must not be able to flood.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <numeric>

#include "core/comm/handshake_slots.h"
#include "core/common/log.h"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::RawClient;

// Holds up to `per_port` idle connections on each target port from its own thread: it never sends a byte, and
// reopens every connection the listener closes (evicted, timed out) at once, so the listener always sees a full
// table of strangers and a stream of new ones. Ports can be added while it runs (a rank's port is known only once
// the rank published it).
class IdleFlood {
 public:
  explicit IdleFlood(std::size_t per_port) : per_port_(per_port), thread_([this] { run(); }) {}
  ~IdleFlood() {
    stop_ = true;
    thread_.join();
  }
  void addPort(uint16_t port) {
    std::lock_guard lock(mutex_);
    new_ports_.push_back(port);
  }
  // Connections opened that the listener accepted and later closed: the evictions and deadlines the flood caused.
  uint64_t closedByListener() const { return closed_.load(); }
  uint64_t opened() const { return opened_.load(); }
  // The most connections held open at once on one port.
  std::size_t peakHeld() const { return peak_.load(); }

 private:
  struct Target {
    uint16_t port;
    std::vector<int> fds;
    std::vector<bool> established;
  };

  void run() {
    std::vector<Target> targets;
    while (!stop_) {
      {
        std::lock_guard lock(mutex_);
        for (uint16_t p : new_ports_) targets.push_back(Target{p, {}, {}});
        new_ports_.clear();
      }
      std::vector<pollfd> polls;
      for (auto& t : targets) {
        while (t.fds.size() < per_port_) {
          const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (fd < 0) break;  // out of descriptors: hold what we have
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = htons(t.port);
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
            ::close(fd);
            break;  // not listening (yet): try again next round
          }
          t.fds.push_back(fd);
          t.established.push_back(false);
          ++opened_;
        }
        std::size_t held = 0;
        for (bool e : t.established) held += e ? 1 : 0;
        peak_.store(std::max(peak_.load(), held));
        for (int fd : t.fds) polls.push_back(pollfd{fd, POLLIN | POLLOUT, 0});
      }
      ::poll(polls.data(), polls.size(), 5);
      std::size_t k = 0;
      for (auto& t : targets) {
        std::vector<int> keep;
        std::vector<bool> keep_est;
        for (std::size_t i = 0; i < t.fds.size(); ++i, ++k) {
          const short ev = polls[k].revents;
          bool closed = (ev & (POLLERR | POLLHUP)) != 0;
          if (!closed && (ev & POLLIN)) {  // a nonce (ignored: the flood never answers), or the end
            std::byte b[256];
            const ssize_t got = ::recv(t.fds[i], b, sizeof b, MSG_DONTWAIT);
            closed = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
          }
          if (closed) {
            if (t.established[i]) ++closed_;
            ::close(t.fds[i]);
            continue;
          }
          keep.push_back(t.fds[i]);
          keep_est.push_back(t.established[i] || (ev & POLLOUT) != 0);
        }
        t.fds = std::move(keep);
        t.established = std::move(keep_est);
      }
    }
    for (auto& t : targets)
      for (int fd : t.fds) ::close(fd);
  }

  const std::size_t per_port_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<uint16_t> new_ports_;  // guarded by mutex_
  std::atomic<uint64_t> closed_{0};
  std::atomic<uint64_t> opened_{0};
  std::atomic<std::size_t> peak_{0};
  std::thread thread_;
};

uint16_t portOf(const std::string& addr) {
  return static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
}

// Three forked ranks meet through the parent's store while the flood holds twice the table's size of idle
// connections on the store's port and on every rank's port (each rank starts 300 ms after the one below it, so each
// listener is flooded before anyone connects to it). The job must set up and run. Before the tables had eviction, 64
// idle connections per port failed every rank with the setup timeout.
TEST(TcpIntruders, IdleConnectionsOnEveryPortDoNotStopTheJob) {
  const int n = 3;
  std::size_t per_port = 2 * kMaxUnauthenticated;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  setrlimit(RLIMIT_NOFILE, &lim);
  // Room for the flood on n + 1 ports, the store's own slots, and what the test process already holds.
  per_port = std::min<std::size_t>(per_port, (lim.rlim_cur - 2 * kMaxUnauthenticated - 64) / (n + 1));
  ASSERT_GT(per_port, kMaxUnauthenticatedPerSource) << "too few descriptors (ulimit -n) to outnumber the table";

  const JobToken token = JobToken::generate();
  std::unique_ptr<IdleFlood> flood;
  std::thread watcher;
  const auto results = testing::forkRanks(
      n, token,
      [&](int r, Store& store, std::string& out) {
        std::this_thread::sleep_for(r * 300ms);
        const auto t0 = Clock::now();
        HostCommunicator comm(connectTcpTransport(testing::tcpOptions(r, n, 20s), token, store), {});
        const double setup_s = std::chrono::duration<double>(Clock::now() - t0).count();
        std::vector<float> v(1000, static_cast<float>(r + 1));
        comm.allreduce(v.data(), v.size(), DType::kF32);
        if (v[0] != 6.0f) throw std::runtime_error("allreduce wrong: " + std::to_string(v[0]));
        comm.barrier();
        out = "ok " + std::to_string(setup_s);
      },
      60s,
      [&](uint16_t store_port) {
        flood = std::make_unique<IdleFlood>(per_port);
        flood->addPort(store_port);
        // The flood holds the store's table before any rank connects.
        for (auto until = Clock::now() + 3s; Clock::now() < until && flood->peakHeld() < per_port / 2;)
          std::this_thread::sleep_for(5ms);
        // The test learns the ranks' ephemeral ports from the store (an intruder would scan for them).
        watcher = std::thread([&, store_port] {
          try {
            TcpStore reader("127.0.0.1", store_port, token, 20s);
            for (int r = 0; r < n; ++r) flood->addPort(portOf(reader.get("tcp/addr/" + std::to_string(r), 20s)));
          } catch (const std::exception& e) {
            ADD_FAILURE() << "the test's own store reader: " << e.what();
          }
        });
      });
  watcher.join();
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    EXPECT_TRUE(res.exited_ok()) << "rank " << r << ": " << res.text;
    EXPECT_EQ(res.text.rfind("ok ", 0), 0u) << "rank " << r << ": " << res.text;
    std::printf("rank %d: %s s of setup under the flood\n", r, res.text.c_str() + 3);
  }
  // The attack was real: the flood held more than a source's share of the table, and the listeners kept evicting.
  EXPECT_GE(flood->peakHeld(), kMaxUnauthenticatedPerSource);
  EXPECT_GT(flood->closedByListener(), 0u);
  std::printf("flood: %zu connections per port, %llu opened, %llu closed by the listeners, peak %zu held\n", per_port,
              static_cast<unsigned long long>(flood->opened()),
              static_cast<unsigned long long>(flood->closedByListener()), flood->peakHeld());
  flood.reset();
}

// The labels and layout of auth.h's proofs: what an attacker who guessed the token would compute to check the guess.
std::vector<Sha256Digest> proofsOfTheRightToken(const JobToken& token, AuthService service,
                                                std::span<const std::byte> client_nonce,
                                                std::span<const std::byte> server_nonce) {
  std::vector<Sha256Digest> out;
  const std::array<std::byte, 2> svc{static_cast<std::byte>(static_cast<uint16_t>(service)), std::byte{0}};
  for (std::string_view label :
       {"terse-auth-v1 server", "terse-auth-v1 client", "terse-auth-v2 server", "terse-auth-v2 client"}) {
    for (bool swap : {false, true}) {
      const std::array<std::span<const std::byte>, 4> parts{std::as_bytes(std::span(label.data(), label.size())), svc,
                                                            swap ? server_nonce : client_nonce,
                                                            swap ? client_nonce : server_nonce};
      out.push_back(hmacSha256(token.secret(), parts));
    }
  }
  return out;
}

// Everything an unauthenticated peer can receive from a listener -- it sends a valid hello, then a wrong proof, and
// reads until the listener hangs up -- is the 32-byte nonce and the constant refusal. Even the right token's proofs
// over those nonces appear nowhere in it, so the bytes cannot tell a right guess from a wrong one. (Version 1 sent
// HMAC(token, "terse-auth-v1 server" | ...) right after the hello; a 16-byte human token fell to 151 guesses.)
void expectNothingToGuessAgainst(const std::string& addr, const JobToken& token, AuthService service) {
  RawClient peer(addr);
  AuthClient guesser(JobToken::generate(), service);  // a token the listener does not hold
  const AuthHello hello = guesser.hello();
  ASSERT_TRUE(peer.write(hello));
  ASSERT_TRUE(peer.write(std::vector<std::byte>(kAuthProofBytes, std::byte{0x5a})));
  const std::vector<std::byte> got = peer.drain();
  ASSERT_EQ(got.size(), kAuthChallengeBytes + kAuthProofBytes) << "the listener sent more than a nonce and a refusal";
  const auto refusal = AuthServer::refusal();
  EXPECT_TRUE(std::equal(refusal.begin(), refusal.end(), got.begin() + kAuthChallengeBytes));
  const auto nonce = std::span(got).first(kAuthNonceBytes);
  for (const Sha256Digest& mac :
       proofsOfTheRightToken(token, service, std::span(hello).subspan(8, kAuthNonceBytes), nonce)) {
    for (std::size_t at = 0; at + 8 <= got.size(); ++at)
      EXPECT_NE(std::memcmp(got.data() + at, mac.data(), 8), 0) << "a proof of the token at byte " << at;
  }
}

TEST(TcpIntruders, AnUnauthenticatedPeerReceivesNothingThatVerifiesAGuess) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  std::vector<std::unique_ptr<Transport>> t(2);
  std::thread rank0([&] { t[0] = connectTcpTransport(testing::tcpOptions(0, 2), token, store); });
  const std::string addr = store.get("tcp/addr/0", 10s);
  expectNothingToGuessAgainst(addr, token, AuthService::kTransport);
  {
    // A silent peer receives nothing at all, and loses its slot within the deadline for strangers.
    RawClient silent(addr);
    const auto t0 = Clock::now();
    EXPECT_TRUE(silent.drain().empty());
    EXPECT_LT(Clock::now() - t0, kUnauthenticatedDeadline + 1s);
  }
  t[1] = connectTcpTransport(testing::tcpOptions(1, 2), token, store);
  rank0.join();
  ASSERT_TRUE(t[0] && t[1]);

  TcpStoreServer server(token, {});
  expectNothingToGuessAgainst("127.0.0.1:" + std::to_string(server.port()), token, AuthService::kStore);
}

// Refused connections are logged at most 20 lines per 10 s, and the count of the rest is reported.
TEST(TcpIntruders, RefusedConnectionsAreLoggedAtABoundedRate) {
  std::mutex mutex;
  std::vector<std::string> lines;
  const LogLevel old_level = logLevel();
  setLogLevel(LogLevel::kWarn);
  const LogSink old_sink = setLogSink([&](LogLevel, std::string_view m) {
    std::lock_guard lock(mutex);
    lines.emplace_back(m);
  });
  {
    MemoryStore store;
    const JobToken token = JobToken::generate();
    std::vector<std::unique_ptr<Transport>> t(2);
    std::thread rank0([&] { t[0] = connectTcpTransport(testing::tcpOptions(0, 2), token, store); });
    const std::string addr = store.get("tcp/addr/0", 10s);
    for (int i = 0; i < 200; ++i) {
      RawClient garbage(addr);
      garbage.write(std::vector<std::byte>(kAuthHelloBytes, std::byte{0x47}));
      garbage.closedByPeer();
    }
    t[1] = connectTcpTransport(testing::tcpOptions(1, 2), token, store);
    rank0.join();
    t.clear();  // the transports go, and with them the limiter, which reports what it held back
  }
  setLogSink(old_sink);
  setLogLevel(old_level);
  std::size_t refused = 0;
  bool counted = false;
  for (const auto& l : lines) {
    refused += l.find("wrong magic") != std::string::npos ? 1 : 0;
    counted = counted || l.find("180 similar lines suppressed") != std::string::npos;
  }
  EXPECT_EQ(refused, 20u);
  EXPECT_TRUE(counted) << "no line reports the suppressed count";
}

}  // namespace
}  // namespace terse::comm

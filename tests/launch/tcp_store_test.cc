// The TCP rendezvous store (core/comm/tcp_store.h): Store semantics across processes, server-side blocking get with
// timeouts that name the key, and a server that refuses wrong tokens, garbage, oversized and silent peers -- logging
// each -- while it goes on serving everyone else.
#include "core/comm/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/frame.h"
#include "core/comm/transport.h"
#include "core/common/log.h"

namespace terse::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

JobToken testToken() {
  return JobToken::fromString("terse-v1-47712a4a20d1d7ebea195145df017ecc74783003fe485822bfef87ed6d63dc36-10620a2d");
}

// A port nobody listens on right now (bound then released); good enough for a test that starts a server later.
uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Collects warnings the server logs, so a test can check that a refused peer was reported.
class LogCapture {
 public:
  LogCapture() {
    old_level_ = logLevel();
    setLogLevel(LogLevel::kWarn);
    old_ = setLogSink([this](LogLevel, std::string_view m) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(m);
    });
  }
  ~LogCapture() {
    setLogSink(old_);
    setLogLevel(old_level_);
  }
  // Waits a little for a line containing `needle`: the server logs on its own thread.
  bool saw(std::string_view needle) {
    for (auto until = Clock::now() + 2s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
      std::lock_guard lock(mutex_);
      for (const auto& l : lines_)
        if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  std::string all() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
  LogSink old_;
  LogLevel old_level_;
};

// A raw socket to the server, optionally through the real handshake, for sending what no TcpStore would send.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  }
  ~RawPeer() { ::close(fd_); }
  void send(const void* data, std::size_t n) { (void)::send(fd_, data, n, MSG_NOSIGNAL); }
  bool recvAll(void* data, std::size_t n) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = ::recv(fd_, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  void authenticate(const JobToken& token) {
    AuthClient auth(token, AuthService::kStore);
    const auto hello = auth.hello();
    send(hello.data(), hello.size());
    AuthChallenge challenge{};
    ASSERT_TRUE(recvAll(challenge.data(), challenge.size()));
    const auto proof = auth.prove(challenge);
    send(proof.data(), proof.size());
    AuthProof confirm{};
    ASSERT_TRUE(recvAll(confirm.data(), confirm.size()));
    auth.confirm(confirm);
  }
  void sendHeader(OpKind kind, uint64_t length) {
    FrameHeader h;
    h.meta.kind = kind;
    h.meta.tag = 1;
    h.length = length;
    const EncodedHeader e = encodeFrameHeader(h);
    send(e.data(), e.size());
  }
  // True when the server closed the connection within `within` (EOF or reset), false when it is still open.
  bool closedByServer(std::chrono::milliseconds within = 3000ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, MSG_DONTWAIT) <= 0;
  }

 private:
  int fd_ = -1;
};

// Store semantics shared with MemoryStore, over a real socket and from several processes. The children are forked
// before the server exists (no threads yet), so they also prove a client waits for a store that starts later.
TEST(TcpStore, SetGetAddCheckAcrossProcesses) {
  const uint16_t port = freePort();
  constexpr int kChildren = 3;
  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        TcpStore store("127.0.0.1", port, testToken(), 10s);
        store.set("addr/" + std::to_string(i), std::string("host-") + char('a' + i) + std::string("\0x", 2));
        store.add("arrived", 1);
        const std::string go = store.get("go", 10s);  // blocks server-side until the parent sets it
        if (go != "now") rc = 10;
        for (int j = 0; j < kChildren; ++j) {
          if (store.get("addr/" + std::to_string(j), 1s) !=
              std::string("host-") + char('a' + j) + std::string("\0x", 2))
            rc = 11;
        }
        if (!store.check("go") || store.check("never-set")) rc = 12;
        if (store.add("done", 1) < 1) rc = 13;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        rc = 20;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    children.push_back(pid);
  }
  std::this_thread::sleep_for(200ms);  // the children are retrying by now
  TcpStoreServer server(testToken(), {.port = port});
  ASSERT_EQ(server.port(), port);
  TcpStore store("127.0.0.1", port, testToken(), 5s);
  for (int i = 0; i < kChildren; ++i) store.get("addr/" + std::to_string(i), 10s);
  // Every child published its address and counted itself exactly once.
  for (auto until = Clock::now() + 10s; store.add("arrived", 0) < kChildren && Clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(store.add("arrived", 0), kChildren);
  store.set("go", "now");
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed its checks (see stderr)";
  }
  EXPECT_EQ(store.get("done", 1s), std::to_string(kChildren));
}

TEST(TcpStore, GetTimesOutServerSideNamingTheKey) {
  TcpStoreServer server(testToken(), {});
  TcpStore store("127.0.0.1", server.port(), testToken(), 5s);
  const auto t0 = Clock::now();
  try {
    store.get("nccl/unique_id", 150ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'nccl/unique_id'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("150 ms"), std::string::npos) << e.what();
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 3s);
  // The connection is still good after a timeout.
  store.set("k", "v");
  EXPECT_EQ(store.get("k", 1s), "v");
}

TEST(TcpStore, BlockingGetIsWokenBySetFromAnotherClient) {
  TcpStoreServer server(testToken(), {});
  TcpStore waiter("127.0.0.1", server.port(), testToken(), 5s);
  TcpStore setter("127.0.0.1", server.port(), testToken(), 5s);
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    setter.add("counter", 41);
    setter.add("counter", 1);
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(waiter.get("counter", 5s), "41");  // woken by the first add, not by polling
  EXPECT_LT(Clock::now() - t0, 2s);
  t.join();
  EXPECT_EQ(waiter.get("counter", 1s), "42");
}

TEST(TcpStore, AddErrorsAndLimitsAreInvalidArgument) {
  TcpStoreServer server(testToken(), {});
  TcpStore store("127.0.0.1", server.port(), testToken(), 5s);
  store.set("addr/0", "host:1");
  try {
    store.add("addr/0", 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'addr/0'"), std::string::npos) << e.what();
  }
  store.add("big", std::numeric_limits<int64_t>::max());
  EXPECT_THROW(store.add("big", 1), InvalidArgument);
  EXPECT_THROW(store.set("huge", std::string(kStoreMaxValueBytes + 1, 'x')), InvalidArgument);
  EXPECT_THROW(store.set("", "x"), InvalidArgument);
  EXPECT_THROW(store.set("bad\nkey", "x"), InvalidArgument);
  // The largest value allowed goes through whole.
  const std::string max_value(kStoreMaxValueBytes, 'y');
  store.set("max", max_value);
  EXPECT_EQ(store.get("max", 1s), max_value);
  EXPECT_EQ(store.add("addr/1", -5), -5);
}

TEST(TcpStore, WrongTokenIsRefusedAndTheServerKeepsServing) {
  LogCapture log;
  TcpStoreServer server(testToken(), {});
  TcpStore good("127.0.0.1", server.port(), testToken(), 5s);
  good.set("x", "1");
  try {
    TcpStore bad("127.0.0.1", server.port(), JobToken::generate(), 5s);
    FAIL() << "a client with the wrong token connected";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("job token"), std::string::npos) << e.what();
  }
  // A peer that sends a wrong proof gets the refusal, is dropped and logged.
  {
    RawPeer raw(server.port());
    AuthClient liar(JobToken::generate(), AuthService::kStore);
    const auto hello = liar.hello();
    raw.send(hello.data(), hello.size());
    AuthChallenge challenge{};
    ASSERT_TRUE(raw.recvAll(challenge.data(), challenge.size()));
    const AuthProof wrong{};
    raw.send(wrong.data(), wrong.size());
    AuthProof refusal{};
    ASSERT_TRUE(raw.recvAll(refusal.data(), refusal.size()));
    EXPECT_EQ(refusal, AuthServer::refusal());
    EXPECT_TRUE(raw.closedByServer());
  }
  EXPECT_TRUE(log.saw("wrong proof")) << log.all();
  EXPECT_EQ(good.get("x", 1s), "1");
  TcpStore again("127.0.0.1", server.port(), testToken(), 5s);
  EXPECT_EQ(again.get("x", 1s), "1");
}

TEST(TcpStore, GarbageOversizedAndSilentPeersAreDroppedWithoutHurtingOthers) {
  LogCapture log;
  TcpStoreServer server(testToken(), {.handshake_timeout = 200ms});
  TcpStore good("127.0.0.1", server.port(), testToken(), 5s);
  good.set("x", "1");
  {  // not a terse peer at all
    RawPeer http(server.port());
    const std::string req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(40, ' ');
    http.send(req.data(), req.size());
    EXPECT_TRUE(http.closedByServer());
  }
  EXPECT_TRUE(log.saw("wrong magic")) << log.all();
  {  // authenticated, then a frame header claiming 1 GiB
    RawPeer big(server.port());
    big.authenticate(testToken());
    big.sendHeader(OpKind::kControl, uint64_t{1} << 30);
    EXPECT_TRUE(big.closedByServer());
  }
  EXPECT_TRUE(log.saw("exceeds the limit")) << log.all();
  {  // authenticated, a valid header, then bytes that are not a protobuf message
    RawPeer junk(server.port());
    junk.authenticate(testToken());
    const std::string body(16, '\xff');
    junk.sendHeader(OpKind::kControl, body.size());
    junk.send(body.data(), body.size());
    EXPECT_TRUE(junk.closedByServer());
  }
  EXPECT_TRUE(log.saw("not a store message")) << log.all();
  {  // a header of another kind
    RawPeer kind(server.port());
    kind.authenticate(testToken());
    kind.sendHeader(OpKind::kAllreduce, 0);
    EXPECT_TRUE(kind.closedByServer());
  }
  {  // silent: connects and says nothing
    RawPeer silent(server.port());
    const auto t0 = Clock::now();
    EXPECT_TRUE(silent.closedByServer(3s));
    EXPECT_LT(Clock::now() - t0, 2s);
  }
  EXPECT_TRUE(log.saw("did not authenticate within 200 ms")) << log.all();
  // The long-lived client never noticed.
  EXPECT_EQ(good.get("x", 1s), "1");
  EXPECT_EQ(good.add("n", 2), 2);
}

TEST(TcpStore, ConnectGivesUpAfterTheTimeoutNamingTheAddress) {
  const uint16_t port = freePort();
  const auto t0 = Clock::now();
  try {
    TcpStore store("127.0.0.1", port, testToken(), 300ms);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(TcpStore, AStoppedServerFailsAWaitingGetInsteadOfHanging) {
  auto server = std::make_unique<TcpStoreServer>(testToken(), TcpStoreServerOptions{});
  TcpStore store("127.0.0.1", server->port(), testToken(), 5s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server->stop();
  });
  const auto t0 = Clock::now();
  try {
    store.get("rank/1/addr", 30s);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'rank/1/addr'"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 3s);
  stopper.join();
  EXPECT_THROW(store.set("k", "v"), CommError);  // the connection is gone for good
}

TEST(TcpStoreServer, BadBindAddressIsAClearError) {
  EXPECT_THROW(TcpStoreServer(testToken(), {.bind_address = "no-such-host.invalid"}), InvalidArgument);
  TcpStoreServer first(testToken(), {});
  try {
    TcpStoreServer second(testToken(), {.port = first.port()});
    FAIL() << "two servers bound one port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace terse::comm

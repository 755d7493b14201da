// Helpers of the tcp transport tests: a world of n ranks over real loopback sockets in one process (one thread per
// rank, each with its own TcpTransport, met through a MemoryStore), and n ranks as forked processes (met through a
// TcpStoreServer in the parent).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/store.h"
#include "core/comm/tcp/transport.h"
#include "core/comm/tcp/wire.h"
#include "core/comm/tcp_store.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm::testing {

inline TcpOptions tcpOptions(int rank, int n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  TcpOptions o;
  o.rank = rank;
  o.world_size = n;
  o.timeout = timeout;
  o.host_label = "h" + std::to_string(rank);
  return o;
}

// Connects n transports concurrently (connectTcpTransport is collective), each on its own thread.
inline std::vector<std::unique_ptr<Transport>> connectTcpWorld(int n, Store& store, const JobToken& token,
                                                               const std::function<void(TcpOptions&)>& tweak = {}) {
  std::vector<std::unique_ptr<Transport>> out(static_cast<std::size_t>(n));
  const SpawnResult res = spawnRanks(
      n,
      [&](int r) {
        TcpOptions o = tcpOptions(r, n);
        if (tweak) tweak(o);
        out[static_cast<std::size_t>(r)] = connectTcpTransport(o, token, store);
      },
      nullptr, std::chrono::seconds(60));
  expectNoErrors(res);
  if (res.anyError()) throw std::runtime_error("tcp world setup failed: " + res.message(0));
  return out;
}

// n ranks over tcp, one HostCommunicator each; a hang is turned into an abort of every rank by the watchdog.
struct TcpWorld {
  MemoryStore store;
  JobToken token = JobToken::generate();
  std::vector<std::unique_ptr<HostCommunicator>> comms;

  explicit TcpWorld(int n, const HostCommOptions& comm_options = {},
                    const std::function<void(TcpOptions&)>& tweak = {}) {
    for (auto& t : connectTcpWorld(n, store, token, tweak))
      comms.push_back(std::make_unique<HostCommunicator>(std::move(t), comm_options));
  }
  int size() const { return static_cast<int>(comms.size()); }
  SpawnResult run(const std::function<void(int, HostCommunicator&)>& fn,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    SpawnResult res;
    res.errors.resize(comms.size());
    std::vector<std::thread> threads;
    std::mutex mutex;
    std::condition_variable cv;
    int finished = 0;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(r, *comms[static_cast<std::size_t>(r)]);
        } catch (...) {
          res.errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
        std::lock_guard lock(mutex);
        ++finished;
        cv.notify_all();
      });
    }
    {
      std::unique_lock lock(mutex);
      if (!cv.wait_for(lock, timeout, [&] { return finished == size(); })) {
        res.watchdog_fired = true;
        for (auto& c : comms) c->abort("test watchdog: ranks still running after the timeout");
      }
    }
    for (auto& t : threads) t.join();
    return res;
  }
  void runOk(const std::function<void(int, HostCommunicator&)>& fn) { expectNoErrors(run(fn)); }
};

// A blocking client socket for the tests that play a hostile or broken peer.
class RawClient {
 public:
  explicit RawClient(const std::string& addr) {
    const auto colon = addr.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
    inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};  // a test must not hang on a read
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) throw std::runtime_error("connect failed");
  }
  ~RawClient() { close(fd_); }
  bool write(std::span<const std::byte> b) {
    return ::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size());
  }
  // Reads exactly n bytes; false on end of file or error.
  bool read(std::span<std::byte> b) {
    std::size_t off = 0;
    while (off < b.size()) {
      const ssize_t got = ::recv(fd_, b.data() + off, b.size() - off, 0);
      if (got <= 0) return false;
      off += static_cast<std::size_t>(got);
    }
    return true;
  }
  // Ends this side's writing (the peer reads end of file), keeping the socket open for reading.
  void shutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  // Everything received until the server closes the connection (end of file or reset) or the receive timeout passes.
  std::vector<std::byte> drain() {
    std::vector<std::byte> all;
    std::byte b[256];
    for (;;) {
      const ssize_t got = ::recv(fd_, b, sizeof b, 0);
      if (got <= 0) return all;
      all.insert(all.end(), b, b + got);
    }
  }
  // True when the server closed the connection (end of file or reset) within the receive timeout.
  bool closedByPeer() {
    std::byte b[256];
    for (;;) {
      const ssize_t got = ::recv(fd_, b, sizeof b, 0);
      if (got == 0) return true;
      if (got < 0) return errno == ECONNRESET;
    }
  }
  // The client's half of the job-token handshake and the hello; returns the acknowledgement's rank, or -1.
  int join(const JobToken& token, uint32_t rank, uint32_t world, const std::string& label) {
    AuthClient client(token, AuthService::kTransport);
    const auto hello = client.hello();
    if (!write(hello)) return -1;
    AuthChallenge challenge{};
    if (!read(challenge)) return -1;
    if (!write(client.prove(challenge))) return -1;
    AuthProof confirm{};
    if (!read(confirm)) return -1;
    client.confirm(confirm);  // AuthError: refused, or the listener does not know the token
    const auto h = tcp_wire::encodeHello(tcp_wire::kHelloMagic, rank, world, label);
    if (!write(h) || !write(std::as_bytes(std::span(label)))) return -1;
    tcp_wire::HelloBytes ack{};
    if (!read(ack)) return -1;
    const auto a = tcp_wire::decodeHello(ack, tcp_wire::kAckMagic);
    std::string peer_label(a.label_bytes, '\0');
    if (!read(std::as_writable_bytes(std::span(peer_label)))) return -1;
    return static_cast<int>(a.rank);
  }

 private:
  int fd_ = -1;
};

// What a forked rank reported: its exit status and the text it wrote (an error message, or what the test asked for).
struct ProcessResult {
  int status = -1;  // waitpid status
  std::string text;
  bool stopped = false;  // it stopped itself (SIGSTOP) and was killed once every other rank had exited
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Forks n children; child r runs fn(r, store, out) with a TcpStore client of a TcpStoreServer the parent starts after
// the fork (so no thread exists while forking), and exits 0, or 1 with the exception's message written back. `out`
// is text the child reports. The parent kills every child still running after `timeout`. `before_ranks`, when given,
// runs in the parent once the server listens (its port is the argument) and before the children learn that port.
inline std::vector<ProcessResult> forkRanks(int n, const JobToken& token,
                                            const std::function<void(int, Store&, std::string&)>& fn,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                            const std::function<void(uint16_t)>& before_ranks = {}) {
  std::vector<pid_t> pids;
  std::vector<int> to_child, from_child;
  for (int r = 0; r < n; ++r) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      uint16_t port = 0;
      std::string out;
      int rc = 0;
      if (read(down[0], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) _exit(3);
      try {
        TcpStore store("127.0.0.1", port, token, std::chrono::seconds(20));
        fn(r, store, out);
      } catch (const std::exception& e) {
        out = e.what();
        rc = 1;
      }
      std::size_t off = 0;
      while (off < out.size()) {
        const ssize_t w = write(up[1], out.data() + off, out.size() - off);
        if (w <= 0) break;
        off += static_cast<std::size_t>(w);
      }
      _exit(rc);
    }
    close(down[0]);
    close(up[1]);
    pids.push_back(pid);
    to_child.push_back(down[1]);
    from_child.push_back(up[0]);
  }
  std::vector<ProcessResult> results(static_cast<std::size_t>(n));
  std::vector<bool> reaped(static_cast<std::size_t>(n), false);
  {
    TcpStoreServer server(token, TcpStoreServerOptions{"127.0.0.1", 0});
    const uint16_t port = server.port();
    if (before_ranks) before_ranks(port);
    for (int fd : to_child) {
      if (write(fd, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) ADD_FAILURE() << "cannot reach a child";
      close(fd);
    }
    // Read every child's report until its end of file (the child exited), or until the deadline.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<bool> open(static_cast<std::size_t>(n), true);
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<int> idx;
      for (int r = 0; r < n; ++r) {
        if (!open[static_cast<std::size_t>(r)]) continue;
        fds.push_back(pollfd{from_child[static_cast<std::size_t>(r)], POLLIN, 0});
        idx.push_back(r);
      }
      if (fds.empty()) break;
      // A child that stopped itself cannot close its pipe: once it is the only one left, it is killed.
      for (int r = 0; r < n; ++r) {
        auto& res = results[static_cast<std::size_t>(r)];
        int st = 0;
        if (res.stopped || reaped[static_cast<std::size_t>(r)]) continue;
        if (waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG | WUNTRACED) > 0) {
          if (WIFSTOPPED(st)) {
            res.stopped = true;
          } else {
            res.status = st;  // it exited (reaped here)
            reaped[static_cast<std::size_t>(r)] = true;
          }
        }
      }
      bool only_stopped = true;
      for (int r : idx) only_stopped = only_stopped && results[static_cast<std::size_t>(r)].stopped;
      if (only_stopped) {
        for (int r : idx) kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        for (int r : idx) open[static_cast<std::size_t>(r)] = false;
        break;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      if (poll(fds.data(), fds.size(), static_cast<int>(std::min<long>(left, 100))) < 0 && errno != EINTR) break;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        char buf[4096];
        const ssize_t got = read(fds[i].fd, buf, sizeof buf);
        const auto r = static_cast<std::size_t>(idx[i]);
        if (got <= 0) {
          open[r] = false;
        } else {
          results[r].text.append(buf, static_cast<std::size_t>(got));
        }
      }
    }
    for (int r = 0; r < n; ++r) {
      if (open[static_cast<std::size_t>(r)]) {
        ADD_FAILURE() << "rank " << r << " still running after the timeout: killed";
        kill(pids[static_cast<std::size_t>(r)], SIGKILL);
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    // A child that stopped itself (SIGSTOP) is killed by the test that stopped it; here every child has exited or
    // been killed.
    if (!reaped[static_cast<std::size_t>(r)])
      waitpid(pids[static_cast<std::size_t>(r)], &results[static_cast<std::size_t>(r)].status, 0);
    close(from_child[static_cast<std::size_t>(r)]);
  }
  return results;
}

// A receive of rank 0's, waiting for a frame that never comes in whatever way `tweak` makes it wait (spinning, reading
// its connection), fails soon after its rank aborts, and after rank 1's transport is destroyed (its goodbye): within
// `limit`, with the abort's reason or rank 1's name in the message. The failure, not a budget or a timeout, must end
// the wait.
inline void expectWaitEndsOnAbortAndOnADepartedPeer(const std::function<void(TcpOptions&)>& tweak,
                                                    std::chrono::steady_clock::duration limit) {
  for (bool abort_it : {true, false}) {
    MemoryStore store;
    const JobToken token = JobToken::generate();
    auto t = connectTcpWorld(2, store, token, tweak);
    std::vector<std::byte> in(64);
    Request rr = t[0]->irecv(1, FrameMeta{OpKind::kP2P, 7, kNoTensor}, in);
    std::thread other([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      if (abort_it) {
        t[0]->abort("the test aborts a waiting receive");
      } else {
        t[1].reset();  // its goodbye: rank 1 has left
      }
    });
    const auto begin = std::chrono::steady_clock::now();
    std::string message;
    try {
      rr.wait();
    } catch (const CommError& e) {
      message = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - begin;
    other.join();
    EXPECT_NE(message, "") << "the wait did not fail (abort " << abort_it << ")";
    const std::string why = abort_it ? "the test aborts a waiting receive" : "rank 1 (host h1)";
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_LT(took, limit) << message;
  }
}

// A TcpOptions resolver (resolveBusyPollUs, resolveCallerReads, resolveCallerSpinUs) rejects every value in `bad` of
// the environment variable `name` with InvalidArgument quoting `name='value'`, and every option value in `bad_options`
// (set into a default TcpOptions by `set`) with a message containing `field`.
template <class Resolve, class Set>
void expectBadValuesNamed(Resolve resolve, const std::string& name, std::initializer_list<const char*> bad, Set set,
                          const std::string& field, std::initializer_list<int> bad_options) {
  for (const char* value : bad) {
    try {
      (void)resolve(TcpOptions{}, envOf({{name, value}}));
      ADD_FAILURE() << "accepted " << name << "='" << value << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name + "='" + value + "'"), std::string::npos) << e.what();
    }
  }
  for (int value : bad_options) {
    TcpOptions o;
    set(o, value);
    try {
      (void)resolve(o, envOf({}));
      ADD_FAILURE() << "accepted " << field << " = " << value;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

}  // namespace terse::comm::testing

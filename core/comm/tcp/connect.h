// Connection setup of the tcp transport (transport.h, "Setup"): the listener, the job-token handshake and hello of
// every connection, the attempts to connect to the lower ranks, and the links they register; internal to
// core/comm/tcp/.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm/auth.h"
#include "core/comm/handshake_slots.h"
#include "core/comm/store.h"
#include "core/comm/tcp/link.h"
#include "core/comm/tcp/transport.h"
#include "core/common/log.h"

namespace terse::comm::tcp {

// Every rank connects to each lower rank and accepts from each higher one. During setup a connection that fails any
// step (wrong token, garbage, a silent peer, a duplicate) is logged (rate-limited) and dropped, or retried by the
// connecting side, and the rank goes on waiting for the real peer until the setup deadline. Accepted connections that
// have not authenticated yet hold a slot of a HandshakeSlots table for at most kUnauthenticatedDeadline, and are
// evicted oldest first by newer ones, so idle or slow strangers cannot keep the real peers out. The handshakes run on
// the transport's io thread; a link registered here is final once meet() returned.
// The socket buffers a connection asks for when TcpOptions::socket_buffer_bytes leaves them to the transport (0 = keep
// the OS's, and its autotuning). Sending: at least kDirectSendBufferBytes, so a caller writing a ring segment on an
// idle link (writer.cc) hands all of it to the kernel in one non-blocking call instead of leaving the rest to the io
// thread. Receiving, and sending at least as much: with an emulated link rate, the largest link's bandwidth-delay
// product (bandwidth x round trip), which a window must cover to keep such a link busy.
inline constexpr uint64_t kDirectSendBufferBytes = 4 << 20;
struct SocketBuffers {
  uint64_t send = 0;
  uint64_t receive = 0;
};
SocketBuffers wantedSocketBuffers(const EmulationConfig& emulation, int world_size);

class Connector {
 public:
  // `links` is the transport's table (one slot per rank, this rank's own filled): registered links land in it.
  Connector(asio::io_context& io, const TcpOptions& options, const JobToken& token, const std::string& label,
            const std::string& who, std::vector<std::shared_ptr<Link>>& links);

  // Opens the listener on bind_address:port; returns the "host:port" the other ranks connect to. Throws
  // InvalidArgument for an address that does not resolve, CommError when it cannot listen.
  std::string listen();
  // Once the io thread runs: accepts from the higher ranks, publishes this rank's host and address in the store,
  // connects to each lower rank, and waits until every link is up or `deadline` passed. From its return on no link
  // registers any more.
  void meet(Store& store, const std::string& published, Clock::time_point deadline);
  // The setup timeout's message: for every missing rank what this rank knows -- never published its address, published
  // it but not reachable (the last error), or published it but never connected here -- and whether the store itself
  // is gone.
  std::string failure(Store& store, const std::vector<int>& missing, Clock::duration waited);
  // io thread: setup is over, accept no more connections.
  void closeListener();

 private:
  struct Handshake;
  std::string key(const char* what, int r) const {
    return options_.store_prefix + "tcp/" + what + "/" + std::to_string(r);
  }
  void startAccept();
  using Finish = std::function<void(const std::string&)>;
  using Fail = std::function<void(const char*, const boost::system::error_code&)>;
  void startHandshake(std::shared_ptr<Handshake> h);
  // Reads a hello of `magic` and its host label into h, then runs `then`; a read error goes to `fail` (`what` names
  // the step), a malformed hello to `refuse`.
  void readPeerHello(const std::shared_ptr<Handshake>& h, uint32_t magic, const char* what, const Finish& refuse,
                     const Fail& fail, std::function<void()> then);
  void readHello(const std::shared_ptr<Handshake>& h, const Finish& finish, const Fail& fail);
  void connectAttempt(int peer, asio::ip::tcp::resolver::results_type endpoints, Clock::time_point deadline,
                      Clock::duration backoff);
  void readAck(const std::shared_ptr<Handshake>& h, int peer, const std::shared_ptr<bool>& done, const Finish& retry,
               const Fail& fail);
  bool registerLink(int peer, std::unique_ptr<asio::ip::tcp::socket> socket, const std::string& label);
  void setSocketOptions(asio::ip::tcp::socket& s);
  void noteError(int peer, const std::string& what);

  asio::io_context& io_;
  const TcpOptions& options_;
  const JobToken& token_;
  const std::string& label_;
  const std::string& who_;
  const int n_;
  const int rank_;
  std::vector<std::shared_ptr<Link>>& links_;  // written on the io thread until meet() returned
  asio::ip::tcp::acceptor acceptor_;
  const Clock::duration handshake_timeout_;  // per message, once the peer proved the token
  const Clock::duration auth_deadline_;      // for the whole unauthenticated part of an accepted connection
  // Refused connections are an intruder's to multiply: at most this many lines per window, the rest counted.
  static constexpr std::size_t kRefusalLogBurst = 20;
  static constexpr Clock::duration kRefusalLogWindow = std::chrono::seconds(10);
  LogLimiter refusals_;
  HandshakeSlots slots_;  // io thread only

  std::mutex setup_mutex_;
  std::condition_variable setup_cv_;
  int connected_ = 0;                    // guarded by setup_mutex_
  bool setup_done_ = false;              // guarded by setup_mutex_
  std::vector<std::string> last_error_;  // guarded by setup_mutex_: why the link to each rank is not up yet
  std::vector<std::string> known_addr_;  // guarded by setup_mutex_: the lower ranks' addresses, as the store gave them
};

}  // namespace terse::comm::tcp

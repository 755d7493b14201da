// Fuzz target: both sides of the job-token handshake (core/comm/auth.h) and the tcp transport's hello
// (core/comm/tcp/wire.h), against a peer whose every byte is the fuzzer's. A peer without the token must never be
// accepted: a proof the fuzzer made up that verifies is a forgery (HMAC-SHA256 makes that a 2^-256 event).
#include <string>

#include "core/comm/auth.h"
#include "core/comm/tcp/wire.h"
#include "core/common/error.h"
#include "tests/fuzz/fuzz_util.h"

using namespace terse;
using namespace terse::comm;

namespace {
const JobToken& token() {
  static const JobToken t = JobToken::generate();
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const AuthService service = (mode & 1) != 0 ? AuthService::kStore : AuthService::kTransport;
  // The listener: a hello, then a proof, from the fuzzer.
  {
    AuthServer server(token(), service);
    const auto hello = in.take((mode & 2) != 0 ? kAuthHelloBytes : in.byte() % (kAuthHelloBytes + 8));
    try {
      const AuthChallenge challenge = server.challenge(hello);
      TERSE_FUZZ_CHECK(hello.size() == kAuthHelloBytes, "a hello of the wrong size was accepted");
      (void)challenge;
      try {
        server.verify(in.take(kAuthProofBytes));
        TERSE_FUZZ_CHECK(false, "the listener accepted a proof made up without the token");
      } catch (const AuthError&) {
      }
    } catch (const AuthError&) {
    }
  }
  // The connecting side: a challenge, then the listener's proof, from the fuzzer.
  {
    AuthClient client(token(), service);
    (void)client.hello();
    try {
      (void)client.prove(in.take((mode & 4) != 0 ? kAuthChallengeBytes : in.byte() % (kAuthChallengeBytes + 8)));
      try {
        client.confirm(in.take(kAuthProofBytes));
        TERSE_FUZZ_CHECK(false, "the client accepted a listener's proof made up without the token");
      } catch (const AuthError&) {
      }
    } catch (const AuthError&) {
    }
  }
  // The transport's hello and acknowledgement: an accepted one re-encodes to its bytes.
  const auto hello = in.take(tcp_wire::kHelloBytes);
  for (uint32_t magic : {tcp_wire::kHelloMagic, tcp_wire::kAckMagic}) {
    try {
      const tcp_wire::Hello h = tcp_wire::decodeHello(hello, magic);
      TERSE_FUZZ_CHECK(h.label_bytes <= tcp_wire::kMaxLabelBytes, "an oversized label was accepted");
      const auto again = tcp_wire::encodeHello(magic, h.rank, h.world_size, std::string(h.label_bytes, 'x'));
      TERSE_FUZZ_CHECK(std::equal(again.begin(), again.end(), hello.begin()), "an accepted hello does not re-encode");
    } catch (const InvalidPayload&) {
    }
  }
  const auto text = in.rest();
  const std::string shown =
      tcp_wire::printable(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  for (char c : shown) TERSE_FUZZ_CHECK(c >= 0x20 && c < 0x7f, "printable() let a control byte through");
  return 0;
}

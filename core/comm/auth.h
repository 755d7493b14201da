// Job-token authentication (DESIGN.md section 6): every TCP connection of a job -- transport links between ranks and
// connections to the rendezvous store -- proves, before anything else is read from it, that both ends know the job's
// secret token. The token never crosses the wire: each side answers the other's fresh random challenge with an
// HMAC-SHA256 over it (mutual challenge-response, as in RFC 2104 / the CHAP pattern), so a recorded handshake cannot be
// replayed and a peer without the token learns nothing it could reuse.
//
// The handshake is three fixed-size messages, I/O-agnostic so a blocking socket and an Asio state machine use the same
// code:
//
//   client -> server   hello      magic "TRSA", version u16, service u16, client nonce (32 B)          = 40 B
//   server -> client   challenge  server nonce (32 B), server proof (32 B)                             = 64 B
//   client -> server   proof      client proof (32 B)                                                  = 32 B
//
//   server proof = HMAC(token, "terse-auth-v1 server" | service | client nonce | server nonce)
//   client proof = HMAC(token, "terse-auth-v1 client" | service | server nonce | client nonce)
//
// The role string and the nonce order differ between the two proofs, so a server's proof can never be reflected back
// as a client's. `service` keeps a store connection from being accepted by a transport port and vice versa. Proofs
// are compared in constant time. A server must bound how long it waits for each message (a silent peer) and drop the
// connection on any AuthError; the messages say what failed but never echo secret material.
//
// Tokens come, in order, from the launcher (which generates one and passes it to its children in TERSE_JOB_TOKEN),
// the environment (TERSE_JOB_TOKEN), or a file (TERSE_JOB_TOKEN_FILE) that must be a regular file owned by the user
// and not readable or writable by group or others -- like ssh's private keys, a world-readable secret is refused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/common/error.h"

namespace terse::comm {

// A connection failed to authenticate: wrong token, malformed or truncated handshake, wrong service. The connection
// must be dropped; the job goes on.
class AuthError : public Error {
 public:
  explicit AuthError(const std::string& m) : Error(TERSE_ERR_INVALID_PAYLOAD, m) {}
};

inline constexpr const char* kJobTokenEnv = "TERSE_JOB_TOKEN";
inline constexpr const char* kJobTokenFileEnv = "TERSE_JOB_TOKEN_FILE";

class JobToken {
 public:
  // Shorter secrets are refused: below 128 bits a token can be guessed offline from one recorded handshake.
  static constexpr std::size_t kMinSecretBytes = 16;

  // 32 random bytes from the OS (OpenSSL RAND_bytes), hex-encoded (64 characters) so it passes through environment
  // variables and files unchanged.
  static JobToken generate();
  // Throws InvalidArgument when `secret` is shorter than kMinSecretBytes (the message names `source` and the length,
  // never the secret).
  static JobToken fromString(std::string secret, std::string_view source = "token");
  // Reads the file (trailing whitespace stripped). Throws InvalidArgument naming the file when it cannot be read, is
  // not a regular file, is not owned by the current user, or is accessible by group or others (the mode is named).
  static JobToken fromFile(const std::filesystem::path& path);
  // TERSE_JOB_TOKEN, else TERSE_JOB_TOKEN_FILE, else nullopt. Errors as fromString/fromFile.
  static std::optional<JobToken> fromEnvironment();

  const std::string& secret() const noexcept { return secret_; }

 private:
  explicit JobToken(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
};

// Which listener a connection is meant for.
enum class AuthService : uint16_t {
  kStore = 1,      // the rendezvous store
  kTransport = 2,  // a tcp transport link between two ranks
};

inline constexpr std::size_t kAuthNonceBytes = 32;
inline constexpr std::size_t kAuthProofBytes = 32;
inline constexpr std::size_t kAuthHelloBytes = 8 + kAuthNonceBytes;
inline constexpr std::size_t kAuthChallengeBytes = kAuthNonceBytes + kAuthProofBytes;
inline constexpr std::size_t kAuthResponseBytes = kAuthProofBytes;

using AuthHello = std::array<std::byte, kAuthHelloBytes>;
using AuthChallenge = std::array<std::byte, kAuthChallengeBytes>;
using AuthResponse = std::array<std::byte, kAuthResponseBytes>;
using Sha256Digest = std::array<std::byte, 32>;

// HMAC-SHA256 (OpenSSL) of the concatenation of `parts`.
Sha256Digest hmacSha256(std::string_view key, std::span<const std::span<const std::byte>> parts);
// Equal without a data-dependent early exit (CRYPTO_memcmp).
bool constantTimeEqual(std::span<const std::byte> a, std::span<const std::byte> b) noexcept;

// The connecting side. One instance per connection attempt: hello() once, then answer() once.
class AuthClient {
 public:
  AuthClient(const JobToken& token, AuthService service);
  // The first message (draws the client nonce).
  AuthHello hello();
  // Verifies the server's proof and returns the client's. Throws AuthError when the server does not know the token.
  AuthResponse answer(std::span<const std::byte> challenge);

 private:
  std::string key_;
  AuthService service_;
  std::array<std::byte, kAuthNonceBytes> client_nonce_{};
  bool said_hello_ = false;
};

// The accepting side. One instance per accepted connection: challenge() once, then verify() once.
class AuthServer {
 public:
  AuthServer(const JobToken& token, AuthService service);
  // Validates the hello (magic, version, service) and returns the challenge. Throws AuthError on a malformed hello.
  AuthChallenge challenge(std::span<const std::byte> hello);
  // Throws AuthError when the client's proof is wrong: the peer does not know the token.
  void verify(std::span<const std::byte> response);

 private:
  std::string key_;
  AuthService service_;
  std::array<std::byte, kAuthNonceBytes> client_nonce_{};
  std::array<std::byte, kAuthNonceBytes> server_nonce_{};
  bool challenged_ = false;
};

}  // namespace terse::comm

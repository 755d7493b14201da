// Job-token authentication (DESIGN.md section 6): every TCP connection of a job -- transport links between ranks and
// connections to the rendezvous store -- proves, before anything else is read from it, that both ends know the job's
// secret token. The token never crosses the wire: each side proves knowledge of it with an HMAC-SHA256 (RFC 2104)
// over both sides' fresh random nonces, so a recorded handshake cannot be replayed.
//
// The connecting side proves first, and the listener answers with its own proof only once that proof checked out.
// So a party that has not yet proven the token -- anyone can connect to a listening port -- receives nothing but a
// random nonce: nothing it could test guesses of the token against offline. (An earlier version sent the listener's
// proof first, which handed every unauthenticated connection a proof to brute-force a weak token with.) The client's
// proof goes only to an address the job itself named (the store's from the launcher, the ranks' from the
// authenticated store), so to collect one a guesser must first own a port the job listens on.
//
// The handshake is four fixed-size messages, I/O-agnostic so a blocking socket and an Asio state machine use the same
// code:
//
//   client -> server   hello      magic "TRSA", version u16 (2), service u16, client nonce (32 B)      = 40 B
//   server -> client   challenge  server nonce (32 B)                                                  = 32 B
//   client -> server   proof      client proof (32 B)                                                  = 32 B
//   server -> client   confirm    server proof (32 B) when the client's proof is right, else the refusal
//                                 (the fixed text "terse-auth-v2: proof refused", zero-padded)        = 32 B
//
//   client proof = HMAC(token, "terse-auth-v2 client" | service | client nonce | server nonce)
//   server proof = HMAC(token, "terse-auth-v2 server" | service | client nonce | server nonce)
//
// The refusal tells a client with another job's token to stop retrying; it carries nothing about the token (the client
// learns only what the hang-up would have told it), and it equals an HMAC output with probability 2^-256. The role
// strings differ, so a client's proof can never be reflected back as a server's. `service` keeps a store
// connection from being accepted by a transport port and vice versa. Proofs are compared in constant time. A server
// must bound how long an unauthenticated peer may take (see handshake_slots.h) and drop the connection on any
// AuthError; the messages say what failed but never echo secret material.
//
// Tokens come, in order, from the launcher (which generates one and passes it to its children in TERSE_JOB_TOKEN),
// the environment (TERSE_JOB_TOKEN), or a file (TERSE_JOB_TOKEN_FILE) that must be a regular file owned by the user
// and not readable or writable by group or others -- like ssh's private keys, a world-readable secret is refused.
//
// A token must be one that `terse token` or `terse launch` generated (JobToken::generate):
//
//   terse-v1-<64 lowercase hex digits: 256 bits from RAND_bytes>-<8 hex digits: checksum>
//   checksum = the first 8 hex digits of SHA-256("terse-token-v1:" | the 64 digits)
//
// Why nothing else: the connecting side proves first, so whoever gets a rank to connect to it -- by listening on the
// store's port before the store does, which on SLURM is predictable (20000 + job id % 10000) -- receives an HMAC of the
// token over nonces it knows, and can test guesses against it offline at any speed. Against 256 random bits that is
// hopeless; against a token a person made up it is not: a 23k-entry guess list found `deadbeefcafebabe...`,
// `0123456789abcdef` repeated, zeros ending in 12345 and `abcdef` repeated in seconds, and the earlier rule (32 hex
// digits, 6 distinct) accepted all four. No rule about what a string looks like tells chosen from drawn reliably, and
// a PAKE (SPAKE2, CPace), which would leave nothing to test guesses against, has no C library among the packages terse
// builds against (OpenSSL 3.0 and libsodium 1.0.18 have none). So terse accepts only its own format: the checksum makes
// every string a person types or another tool prints -- `openssl rand -hex 32` included -- fail before it is used, and
// the random part must not be a pattern (fewer than 10 distinct digits, or a repetition), which 256 random bits are
// with probability below 1e-11, so a hand-made string given a recomputed checksum fails too. The checksum is public:
// it proves nothing to a peer, it only makes "made by terse" the one way to get a token that works.
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
  // The format above: "terse-v1-" + 64 hex digits + "-" + 8 hex digits.
  static constexpr std::string_view kPrefix = "terse-v1-";
  static constexpr std::size_t kRandomHexDigits = 64;  // 256 bits
  static constexpr std::size_t kChecksumHexDigits = 8;
  static constexpr std::size_t kLength = kPrefix.size() + kRandomHexDigits + 1 + kChecksumHexDigits;  // 82
  // A random part with fewer distinct digits than this is a pattern: 64 random digits have fewer than 10 distinct ones
  // with probability about 1e-12.
  static constexpr std::size_t kMinDistinctDigits = 10;
  // How a user makes a token; every refusal says it.
  static constexpr std::string_view kHowToMakeOne = "(umask 077; terse token > ~/.terse_token)";

  // 32 random bytes from the OS (OpenSSL RAND_bytes) in the format above, which passes through environment variables
  // and files unchanged.
  static JobToken generate();
  // Throws InvalidArgument when `secret` is not a token in the format above (the message names `source`, says what
  // is wrong and how to make a token, never shows the secret or any part of it).
  static JobToken fromString(std::string secret, std::string_view source = "token");
  // Reads the file (trailing whitespace stripped). Throws InvalidArgument naming the file when it cannot be read, is
  // not a regular file, is not owned by the current user, or is accessible by group or others (the mode is named).
  static JobToken fromFile(const std::filesystem::path& path);
  // TERSE_JOB_TOKEN, else TERSE_JOB_TOKEN_FILE, else nullopt. Errors as fromString/fromFile.
  static std::optional<JobToken> fromEnvironment();
  // The checksum of a random part (8 lowercase hex digits). Public so that tests can build tokens in the format (a
  // shell does it with sha256sum, scripts/netns-cluster); knowing it grants nothing, since the checksum is no secret.
  static std::string checksum(std::string_view random_hex);

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
inline constexpr std::size_t kAuthChallengeBytes = kAuthNonceBytes;

using AuthHello = std::array<std::byte, kAuthHelloBytes>;
using AuthChallenge = std::array<std::byte, kAuthChallengeBytes>;
using AuthProof = std::array<std::byte, kAuthProofBytes>;
using Sha256Digest = std::array<std::byte, 32>;

// HMAC-SHA256 (OpenSSL) of the concatenation of `parts`.
Sha256Digest hmacSha256(std::string_view key, std::span<const std::span<const std::byte>> parts);
// Equal without a data-dependent early exit (CRYPTO_memcmp).
bool constantTimeEqual(std::span<const std::byte> a, std::span<const std::byte> b) noexcept;

// The connecting side. One instance per connection attempt: hello(), prove(), confirm(), once each, in that order.
class AuthClient {
 public:
  AuthClient(const JobToken& token, AuthService service);
  // The first message (draws the client nonce).
  AuthHello hello();
  // The client's proof over both nonces, for the server's challenge. Throws AuthError for a challenge of the wrong
  // size.
  AuthProof prove(std::span<const std::byte> challenge);
  // Checks the server's proof. Throws AuthError when the server refused this side's proof, or does not know the
  // token itself.
  void confirm(std::span<const std::byte> server_proof);

 private:
  std::string key_;
  AuthService service_;
  std::array<std::byte, kAuthNonceBytes> client_nonce_{};
  std::array<std::byte, kAuthNonceBytes> server_nonce_{};
  int step_ = 0;
};

// The accepting side. One instance per accepted connection: challenge(), then verify(), once each.
class AuthServer {
 public:
  AuthServer(const JobToken& token, AuthService service);
  // Validates the hello (magic, version, service) and returns the challenge: a fresh nonce, nothing derived from the
  // token. Throws AuthError on a malformed hello.
  AuthChallenge challenge(std::span<const std::byte> hello);
  // Checks the client's proof and returns the server's, to send back. Throws AuthError when the client's proof is
  // wrong (the peer does not know the token): then the server sends refusal() and hangs up.
  AuthProof verify(std::span<const std::byte> client_proof);
  static AuthProof refusal() noexcept;

 private:
  std::string key_;
  AuthService service_;
  std::array<std::byte, kAuthNonceBytes> client_nonce_{};
  std::array<std::byte, kAuthNonceBytes> server_nonce_{};
  int step_ = 0;
};

}  // namespace terse::comm

#include "core/comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

namespace terse::comm {
namespace {

constexpr std::array<std::byte, 4> kHelloMagic{std::byte{'T'}, std::byte{'R'}, std::byte{'S'}, std::byte{'A'}};
// Version 2: the client proves first (version 1 sent the server's proof to anyone who connected).
constexpr uint16_t kAuthVersion = 2;
constexpr std::string_view kServerLabel = "terse-auth-v2 server";
constexpr std::string_view kClientLabel = "terse-auth-v2 client";

std::span<const std::byte> asBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::array<std::byte, kAuthNonceBytes> makeNonce() {
  std::array<std::byte, kAuthNonceBytes> nonce{};
  TERSE_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) == 1,
              InternalError, "auth: the OS random generator failed (OpenSSL RAND_bytes)");
  return nonce;
}

void putU16(std::byte* p, uint16_t v) {
  p[0] = std::byte(v & 0xff);
  p[1] = std::byte(v >> 8);
}
uint16_t getU16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) | (std::to_integer<uint16_t>(p[1]) << 8));
}

std::array<std::byte, 2> serviceBytes(AuthService service) {
  std::array<std::byte, 2> out{};
  putU16(out.data(), static_cast<uint16_t>(service));
  return out;
}

AuthProof proof(std::string_view key, std::string_view label, AuthService service,
                std::span<const std::byte> client_nonce, std::span<const std::byte> server_nonce) {
  const auto svc = serviceBytes(service);
  const std::array<std::span<const std::byte>, 4> parts{asBytes(label), std::span<const std::byte>(svc), client_nonce,
                                                        server_nonce};
  return hmacSha256(key, parts);
}

std::string_view serviceName(uint16_t service) {
  switch (service) {
    case static_cast<uint16_t>(AuthService::kStore):
      return "store";
    case static_cast<uint16_t>(AuthService::kTransport):
      return "transport";
    default:
      return "unknown";
  }
}

bool isLowerHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}
bool isHexDigit(char c) {
  return isLowerHexDigit(c) || (c >= 'A' && c <= 'F');
}

std::string toHex(std::span<const std::byte> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    hex.push_back(kHex[std::to_integer<unsigned>(b) >> 4]);
    hex.push_back(kHex[std::to_integer<unsigned>(b) & 0xf]);
  }
  return hex;
}

// What makes a token's random part (lowercase hex) a pattern rather than a draw, in words, or nullopt: too few
// distinct digits (zeros and a counter, "abcdef" repeated), or the whole is a shorter string repeated ("deadbeef",
// "0123456789abcdef"). 64 random digits are either with probability below 1e-11 (JobToken::kMinDistinctDigits).
std::optional<std::string> patternIn(std::string_view hex) {
  std::array<bool, 16> seen{};
  for (char c : hex) seen[static_cast<std::size_t>(c <= '9' ? c - '0' : c - 'a' + 10)] = true;
  const auto distinct = static_cast<std::size_t>(std::count(seen.begin(), seen.end(), true));
  if (distinct < JobToken::kMinDistinctDigits) {
    return "only " + std::to_string(distinct) + " distinct digits, fewer than " +
           std::to_string(JobToken::kMinDistinctDigits);
  }
  for (std::size_t period = 1; period <= hex.size() / 2; ++period) {
    if (hex.substr(period) == hex.substr(0, hex.size() - period)) {
      return "it repeats every " + std::to_string(period) + " digits";
    }
  }
  return std::nullopt;
}

// Every refusal names the source and what is wrong, ends with how to make a token, and shows no character of the
// secret: a mistyped token is still mostly the real one.
[[noreturn]] void refuseToken(std::string_view source, const std::string& what) {
  TERSE_THROW(InvalidArgument,
              source << ": the job token " << what
                     << "; terse accepts only tokens that `terse token` or `terse launch` generated, since a chosen "
                        "one can be guessed offline by whoever gets a rank to connect to it (core/comm/auth.h): make "
                        "one with `"
                     << JobToken::kHowToMakeOne << "`, or run the job under `terse launch`, which makes one");
}

std::string stripTrailingWhitespace(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}

}  // namespace

std::string JobToken::checksum(std::string_view random_hex) {
  // The domain tag keeps this digest apart from any other SHA-256 of the same digits.
  constexpr std::string_view kTag = "terse-token-v1:";
  std::string input;
  input.reserve(kTag.size() + random_hex.size());
  input.append(kTag).append(random_hex);
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int md_len = 0;
  TERSE_CHECK(EVP_Digest(input.data(), input.size(), md.data(), &md_len, EVP_sha256(), nullptr) == 1 && md_len == 32,
              InternalError, "auth: SHA-256 failed (OpenSSL EVP_Digest)");
  const auto digest = std::as_bytes(std::span(md.data(), kChecksumHexDigits / 2));
  return toHex(digest);
}

JobToken JobToken::generate() {
  // A draw that looks like a pattern (probability below 1e-11) is drawn again, so that every generated token passes
  // fromString.
  for (;;) {
    const auto raw = makeNonce();  // 32 random bytes
    std::string random_hex = toHex(raw);
    if (patternIn(random_hex)) continue;
    std::string token;
    token.reserve(kLength);
    token.append(kPrefix).append(random_hex).append("-").append(checksum(random_hex));
    return JobToken(std::move(token));
  }
}

JobToken JobToken::fromString(std::string secret, std::string_view source) {
  if (secret.empty()) refuseToken(source, "is empty");
  if (!secret.starts_with(kPrefix)) {
    if (secret.size() >= 32 && std::all_of(secret.begin(), secret.end(), isHexDigit)) {
      refuseToken(
          source,
          "is " + std::to_string(secret.size()) +
              " bare hexadecimal digits (what `openssl rand -hex` prints, and what earlier terse versions accepted), "
              "not a terse token (they start with \"" +
              std::string(kPrefix) + "\")");
    }
    refuseToken(source, "does not start with \"" + std::string(kPrefix) +
                            "\": it was not made by `terse token` but chosen by a person or another tool");
  }
  if (secret.size() != kLength) {
    refuseToken(source, "is " + std::to_string(secret.size()) + " characters, a " + std::string(kPrefix) +
                            " token has " + std::to_string(kLength) + ": it was cut short or added to");
  }
  const std::string_view random_hex = std::string_view(secret).substr(kPrefix.size(), kRandomHexDigits);
  const std::string_view sum = std::string_view(secret).substr(kPrefix.size() + kRandomHexDigits + 1);
  for (std::size_t i = kPrefix.size(); i < secret.size(); ++i) {
    const bool dash_here = i == kPrefix.size() + kRandomHexDigits;
    if (dash_here ? secret[i] != '-' : !isLowerHexDigit(secret[i])) {
      refuseToken(source, "has an unexpected character at position " + std::to_string(i + 1) + " (expected " +
                              (dash_here ? std::string("'-'") : std::string("a lowercase hexadecimal digit")) + ")");
    }
  }
  if (checksum(random_hex) != sum) {
    refuseToken(source, "fails its checksum: it was mistyped or edited, or made by hand in terse's format");
  }
  if (const std::optional<std::string> pattern = patternIn(random_hex)) {
    refuseToken(source, "has a random part that is a pattern (" + *pattern +
                            "), which 256 random bits almost never are: it was "
                            "made by hand in terse's format");
  }
  return JobToken(std::move(secret));
}

JobToken JobToken::fromFile(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    TERSE_THROW(InvalidArgument, "job token file " << path << ": " << std::strerror(errno));
  }
  TERSE_CHECK(S_ISREG(st.st_mode), InvalidArgument, "job token file " << path << " is not a regular file");
  TERSE_CHECK(st.st_uid == ::geteuid(), InvalidArgument,
              "job token file " << path << " is owned by uid " << st.st_uid << ", not by this user (uid " << ::geteuid()
                                << ")");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    std::ostringstream mode;
    mode << std::oct << (st.st_mode & 07777);
    TERSE_THROW(InvalidArgument, "job token file " << path << " has mode 0" << mode.str()
                                                   << ": group or others may access it; chmod 600 it");
  }
  std::ifstream in(path, std::ios::binary);
  TERSE_CHECK(in, InvalidArgument, "job token file " << path << ": cannot open it");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return fromString(stripTrailingWhitespace(std::move(text)), "job token file " + path.string());
}

std::optional<JobToken> JobToken::fromEnvironment() {
  if (const char* env = std::getenv(kJobTokenEnv); env != nullptr && *env != '\0') {
    return fromString(env, kJobTokenEnv);
  }
  if (const char* file = std::getenv(kJobTokenFileEnv); file != nullptr && *file != '\0') {
    return fromFile(file);
  }
  return std::nullopt;
}

Sha256Digest hmacSha256(std::string_view key, std::span<const std::span<const std::byte>> parts) {
  // EVP_MAC is OpenSSL 3's interface (HMAC_CTX is deprecated there).
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  TERSE_CHECK(mac != nullptr, InternalError, "auth: OpenSSL has no HMAC");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  TERSE_CHECK(ctx != nullptr, InternalError, "auth: EVP_MAC_CTX_new failed");
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest_name, 0), OSSL_PARAM_construct_end()};
  Sha256Digest out{};
  std::size_t out_len = 0;
  bool ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1;
  for (const auto& part : parts) {
    ok = ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(part.data()), part.size()) == 1;
  }
  ok = ok && EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &out_len, out.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  TERSE_CHECK(ok && out_len == out.size(), InternalError, "auth: HMAC-SHA256 failed");
  return out;
}

bool constantTimeEqual(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

AuthClient::AuthClient(const JobToken& token, AuthService service) : key_(token.secret()), service_(service) {}

AuthHello AuthClient::hello() {
  TERSE_CHECK(step_ == 0, InvalidArgument, "auth: hello() called twice on one connection");
  step_ = 1;
  client_nonce_ = makeNonce();
  AuthHello msg{};
  std::memcpy(msg.data(), kHelloMagic.data(), kHelloMagic.size());
  putU16(msg.data() + 4, kAuthVersion);
  putU16(msg.data() + 6, static_cast<uint16_t>(service_));
  std::memcpy(msg.data() + 8, client_nonce_.data(), kAuthNonceBytes);
  return msg;
}

AuthProof AuthClient::prove(std::span<const std::byte> challenge) {
  TERSE_CHECK(step_ == 1, InvalidArgument, "auth: prove() out of order (step " << step_ << ")");
  TERSE_CHECK(challenge.size() == kAuthChallengeBytes, AuthError,
              "auth: the server's challenge is " << challenge.size() << " bytes, expected " << kAuthChallengeBytes);
  step_ = 2;
  std::memcpy(server_nonce_.data(), challenge.data(), kAuthNonceBytes);
  return proof(key_, kClientLabel, service_, client_nonce_, server_nonce_);
}

void AuthClient::confirm(std::span<const std::byte> server_proof) {
  TERSE_CHECK(step_ == 2, InvalidArgument, "auth: confirm() out of order (step " << step_ << ")");
  step_ = 3;
  TERSE_CHECK(!constantTimeEqual(AuthServer::refusal(), server_proof), AuthError,
              "auth: the server refused this side's proof: the two ends hold different job tokens");
  const AuthProof expected = proof(key_, kServerLabel, service_, client_nonce_, server_nonce_);
  TERSE_CHECK(constantTimeEqual(expected, server_proof), AuthError,
              "auth: the server does not know the job token (its proof is wrong)");
}

AuthProof AuthServer::refusal() noexcept {
  constexpr std::string_view kText = "terse-auth-v2: proof refused";
  AuthProof out{};
  std::memcpy(out.data(), kText.data(), kText.size());
  return out;
}

AuthServer::AuthServer(const JobToken& token, AuthService service) : key_(token.secret()), service_(service) {}

AuthChallenge AuthServer::challenge(std::span<const std::byte> hello) {
  TERSE_CHECK(step_ == 0, InvalidArgument, "auth: challenge() called twice on one connection");
  TERSE_CHECK(hello.size() == kAuthHelloBytes, AuthError,
              "auth: hello is " << hello.size() << " bytes, expected " << kAuthHelloBytes);
  TERSE_CHECK(std::memcmp(hello.data(), kHelloMagic.data(), kHelloMagic.size()) == 0, AuthError,
              "auth: the peer did not start with the terse handshake (wrong magic): not a terse process");
  const uint16_t version = getU16(hello.data() + 4);
  TERSE_CHECK(version == kAuthVersion, AuthError,
              "auth: handshake version " << version << ", this build speaks " << kAuthVersion);
  const uint16_t service = getU16(hello.data() + 6);
  TERSE_CHECK(service == static_cast<uint16_t>(service_), AuthError,
              "auth: the peer wants the " << serviceName(service) << " service (" << service << "), this port serves "
                                          << serviceName(static_cast<uint16_t>(service_)));
  step_ = 1;
  std::memcpy(client_nonce_.data(), hello.data() + 8, kAuthNonceBytes);
  server_nonce_ = makeNonce();
  return server_nonce_;
}

AuthProof AuthServer::verify(std::span<const std::byte> client_proof) {
  TERSE_CHECK(step_ == 1, InvalidArgument, "auth: verify() out of order (step " << step_ << ")");
  step_ = 2;
  TERSE_CHECK(client_proof.size() == kAuthProofBytes, AuthError,
              "auth: the proof is " << client_proof.size() << " bytes, expected " << kAuthProofBytes);
  const AuthProof expected = proof(key_, kClientLabel, service_, client_nonce_, server_nonce_);
  TERSE_CHECK(constantTimeEqual(expected, client_proof), AuthError,
              "auth: the peer does not know the job token (wrong proof)");
  return proof(key_, kServerLabel, service_, client_nonce_, server_nonce_);
}

}  // namespace terse::comm

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

std::string stripTrailingWhitespace(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}

}  // namespace

JobToken JobToken::generate() {
  const auto raw = makeNonce();  // 32 random bytes
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(raw.size() * 2);
  for (std::byte b : raw) {
    hex.push_back(kHex[std::to_integer<unsigned>(b) >> 4]);
    hex.push_back(kHex[std::to_integer<unsigned>(b) & 0xf]);
  }
  return JobToken(std::move(hex));
}

JobToken JobToken::fromString(std::string secret, std::string_view source) {
  std::size_t non_hex = 0;
  std::array<bool, 16> seen{};
  for (char c : secret) {
    const char lower = (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower >= '0' && lower <= '9') {
      seen[static_cast<std::size_t>(lower - '0')] = true;
    } else if (lower >= 'a' && lower <= 'f') {
      seen[static_cast<std::size_t>(lower - 'a' + 10)] = true;
    } else {
      ++non_hex;
    }
  }
  const auto distinct = static_cast<std::size_t>(std::count(seen.begin(), seen.end(), true));
  constexpr std::string_view kHow =
      " (a job token must be at least 32 random hexadecimal digits: use `terse launch`, which generates one, or "
      "`openssl rand -hex 32`)";
  TERSE_CHECK(non_hex == 0, InvalidArgument,
              source << ": the job token has " << non_hex << " of its " << secret.size()
                     << " characters outside 0-9a-f: it looks chosen by a person, which a guesser tries first" << kHow);
  TERSE_CHECK(
      secret.size() >= kMinHexDigits, InvalidArgument,
      source << ": the job token is " << secret.size() << " hexadecimal digits, fewer than " << kMinHexDigits << kHow);
  TERSE_CHECK(distinct >= kMinDistinctDigits, InvalidArgument,
              source << ": the job token uses only " << distinct << " distinct hexadecimal digits: a pattern, not "
                     << "random" << kHow);
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

// Job-token authentication (core/comm/auth.h): the handshake accepts exactly the peers that know the token, for the
// service they asked for, and token files must be private.
#include "core/comm/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace terse::comm {
namespace {

JobToken token(const std::string& s) {
  return JobToken::fromString(s);
}

constexpr const char* kRight = "00112233445566778899aabbccddeeff";
constexpr const char* kWrong = "ffeeddccbbaa99887766554433221100";

TEST(Auth, SameTokenAuthenticatesBothWays) {
  const JobToken t = JobToken::generate();
  EXPECT_EQ(t.secret().size(), 64u);
  AuthClient client(t, AuthService::kTransport);
  AuthServer server(t, AuthService::kTransport);
  const AuthChallenge challenge = server.challenge(client.hello());
  const AuthProof confirm = server.verify(client.prove(challenge));
  EXPECT_NO_THROW(client.confirm(confirm));
}

TEST(Auth, GeneratedTokensDiffer) {
  EXPECT_NE(JobToken::generate().secret(), JobToken::generate().secret());
}

TEST(Auth, ServerRefusesClientWithoutTokenAndTheClientSaysSo) {
  AuthClient client(token(kWrong), AuthService::kStore);
  AuthServer server(token(kRight), AuthService::kStore);
  const AuthChallenge challenge = server.challenge(client.hello());
  EXPECT_THROW(server.verify(client.prove(challenge)), AuthError);
  try {
    client.confirm(AuthServer::refusal());
    FAIL() << "the refusal was taken for a proof";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
}

TEST(Auth, ClientRefusesServerWithoutToken) {
  // A listener that does not know the token can only make up its proof.
  AuthClient client(token(kRight), AuthService::kStore);
  AuthServer impostor(token(kWrong), AuthService::kStore);
  const AuthChallenge challenge = impostor.challenge(client.hello());
  (void)client.prove(challenge);
  AuthClient other(token(kWrong), AuthService::kStore);
  AuthServer impostor2(token(kWrong), AuthService::kStore);
  const AuthProof made_up = impostor2.verify(other.prove(impostor2.challenge(other.hello())));
  EXPECT_THROW(client.confirm(made_up), AuthError);
}

TEST(Auth, ServerRefusesAForgedProof) {
  AuthClient honest(token(kRight), AuthService::kStore);
  AuthServer server(token(kRight), AuthService::kStore);
  const AuthChallenge challenge = server.challenge(honest.hello());
  AuthProof forged = honest.prove(challenge);
  forged[0] ^= std::byte{1};
  EXPECT_THROW(server.verify(forged), AuthError);
}

// What the listener sends before the peer proved the token is the bare nonce: nothing in it depends on the token, so a
// guesser cannot test guesses against it -- not even the right one. (Version 1 sent HMAC(token, ...) here.)
TEST(Auth, AnUnauthenticatedPeerReceivesNothingThatVerifiesAGuess) {
  const JobToken t = token(kRight);
  AuthClient guesser(t, AuthService::kTransport);  // holds the right guess, and checks it every way it could
  AuthServer server(t, AuthService::kTransport);
  const AuthHello hello = guesser.hello();
  const AuthChallenge received = server.challenge(hello);
  ASSERT_EQ(received.size(), kAuthNonceBytes);
  const auto client_nonce = std::span(hello).subspan(8, kAuthNonceBytes);
  const std::array<std::byte, 2> svc{std::byte{2}, std::byte{0}};
  for (const char* label :
       {"terse-auth-v1 server", "terse-auth-v1 client", "terse-auth-v2 server", "terse-auth-v2 client"}) {
    for (bool swap : {false, true}) {
      const std::string_view l(label);
      const std::span<const std::byte> first = swap ? std::span<const std::byte>(received) : client_nonce;
      const std::span<const std::byte> second = swap ? client_nonce : std::span<const std::byte>(received);
      const std::array<std::span<const std::byte>, 4> parts{std::as_bytes(std::span(l.data(), l.size())), svc, first,
                                                            second};
      const Sha256Digest mac = hmacSha256(t.secret(), parts);
      // No 8-byte window of what was received matches any proof the right token gives over these nonces.
      for (std::size_t at = 0; at + 8 <= received.size(); ++at)
        EXPECT_NE(std::memcmp(received.data() + at, mac.data(), 8), 0) << label << " at " << at;
    }
  }
  // A wrong proof gets nothing back but the refusal, a constant of the protocol (auth.h).
  EXPECT_THROW(server.verify(AuthProof{}), AuthError);
}

TEST(Auth, ClientProofCannotBeReflectedAsServerProof) {
  const JobToken t = token(kRight);
  AuthClient client(t, AuthService::kTransport);
  AuthServer server(t, AuthService::kTransport);
  const AuthChallenge challenge = server.challenge(client.hello());
  const AuthProof mine = client.prove(challenge);
  EXPECT_THROW(client.confirm(mine), AuthError);  // a listener echoing the client's proof back
}

TEST(Auth, StepsOutOfOrderAreRefused) {
  const JobToken t = token(kRight);
  AuthClient client(t, AuthService::kTransport);
  EXPECT_THROW(client.prove(AuthChallenge{}), InvalidArgument);
  EXPECT_THROW(client.confirm(AuthProof{}), InvalidArgument);
  AuthServer server(t, AuthService::kTransport);
  EXPECT_THROW(server.verify(AuthProof{}), InvalidArgument);
}

TEST(Auth, MalformedHellosAreRefused) {
  const JobToken t = token(kRight);
  AuthClient client(t, AuthService::kTransport);
  const AuthHello good = client.hello();
  {
    AuthHello bad = good;
    bad[0] = std::byte{'X'};
    AuthServer server(t, AuthService::kTransport);
    EXPECT_THROW(server.challenge(bad), AuthError);
  }
  {
    AuthHello bad = good;
    bad[4] = std::byte{9};  // version
    AuthServer server(t, AuthService::kTransport);
    EXPECT_THROW(server.challenge(bad), AuthError);
  }
  {
    AuthServer server(t, AuthService::kTransport);
    EXPECT_THROW(server.challenge(std::span(good).first(10)), AuthError);
  }
  {
    // A store client knocking on a transport port.
    AuthServer server(t, AuthService::kStore);
    try {
      server.challenge(good);
      FAIL() << "a transport hello was accepted by a store server";
    } catch (const AuthError& e) {
      EXPECT_NE(std::string(e.what()).find("transport"), std::string::npos) << e.what();
    }
  }
}

TEST(Auth, ShortTokensAreRefusedWithoutEchoingThem) {
  try {
    JobToken::fromString("0a1b2c3d", "TERSE_JOB_TOKEN");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("TERSE_JOB_TOKEN"), std::string::npos) << m;
    EXPECT_NE(m.find("fewer than 32"), std::string::npos) << m;
    EXPECT_EQ(m.find("0a1b2c3d"), std::string::npos) << "the secret leaked into the message: " << m;
  }
}

// The rule (auth.h): at least 32 hexadecimal digits, at least 6 distinct ones. Words and patterns a person makes up
// are refused however long; what `terse launch` and `openssl rand -hex` give passes.
TEST(Auth, HumanChosenTokensAreRefused) {
  for (const char* weak : {"correct-horse-battery-staple-and-more", "ThisIsMySecretPassword1234567890",
                           "deadbeefdeadbeefdeadbeefdeadbeef", "00000000000000000000000000000000",
                           "abcabcabcabcabcabcabcabcabcabcabcabc", "0123456789abcdef 0123456789abcdef"}) {
    try {
      JobToken::fromString(weak, "test");
      ADD_FAILURE() << "accepted a weak token: " << weak;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).find(weak), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("openssl rand -hex 32"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(JobToken::fromString(JobToken::generate().secret()));
  EXPECT_NO_THROW(JobToken::fromString("3F9A0C7E1B5D2864A0F3C9E7B1D52846"));  // upper case is hex too
}

TEST(Auth, TokenFileMustBePrivate) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "token";
  std::ofstream(file) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(file.c_str(), 0644);
  try {
    JobToken::fromFile(file);
    FAIL() << "a world-readable token file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
  }
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(JobToken::fromFile(file).secret(), "0123456789abcdef0123456789abcdef");  // trailing newline stripped
  EXPECT_THROW(JobToken::fromFile(dir / "missing"), InvalidArgument);
  EXPECT_THROW(JobToken::fromFile(dir), InvalidArgument);  // not a regular file

  ::setenv(kJobTokenFileEnv, file.c_str(), 1);
  ::unsetenv(kJobTokenEnv);
  ASSERT_TRUE(JobToken::fromEnvironment().has_value());
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), "0123456789abcdef0123456789abcdef");
  ::setenv(kJobTokenEnv, "fedcba9876543210fedcba9876543210", 1);  // the variable wins over the file
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), "fedcba9876543210fedcba9876543210");
  ::unsetenv(kJobTokenEnv);
  ::unsetenv(kJobTokenFileEnv);
  EXPECT_FALSE(JobToken::fromEnvironment().has_value());
  std::filesystem::remove_all(dir);
}

TEST(Auth, HmacMatchesRfc4231TestCase2) {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
  const std::string data = "what do ya want for nothing?";
  const std::array<std::span<const std::byte>, 2> parts{std::as_bytes(std::span(data.data(), 10)),
                                                        std::as_bytes(std::span(data.data() + 10, data.size() - 10))};
  const Sha256Digest d = hmacSha256("Jefe", parts);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (std::byte b : d) {
    hex += kHex[std::to_integer<unsigned>(b) >> 4];
    hex += kHex[std::to_integer<unsigned>(b) & 0xf];
  }
  EXPECT_EQ(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

}  // namespace
}  // namespace terse::comm

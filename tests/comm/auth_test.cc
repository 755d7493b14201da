// Job-token authentication (core/comm/auth.h): the handshake accepts exactly the peers that know the token, for the
// service they asked for, and token files must be private.
#include "core/comm/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace terse::comm {
namespace {

JobToken token(const std::string& s) {
  return JobToken::fromString(s);
}

TEST(Auth, SameTokenAuthenticatesBothWays) {
  const JobToken t = JobToken::generate();
  EXPECT_EQ(t.secret().size(), 64u);
  AuthClient client(t, AuthService::kTransport);
  AuthServer server(t, AuthService::kTransport);
  const AuthChallenge challenge = server.challenge(client.hello());
  const AuthResponse response = client.answer(challenge);
  EXPECT_NO_THROW(server.verify(response));
}

TEST(Auth, GeneratedTokensDiffer) {
  EXPECT_NE(JobToken::generate().secret(), JobToken::generate().secret());
}

TEST(Auth, ClientRefusesServerWithoutToken) {
  AuthClient client(token("the-right-token-0123"), AuthService::kStore);
  AuthServer server(token("a-wrong-token-456789"), AuthService::kStore);
  const AuthChallenge challenge = server.challenge(client.hello());
  EXPECT_THROW(client.answer(challenge), AuthError);
}

TEST(Auth, ServerRefusesClientWithoutToken) {
  AuthClient honest(token("the-right-token-0123"), AuthService::kStore);
  AuthServer server(token("the-right-token-0123"), AuthService::kStore);
  const AuthChallenge challenge = server.challenge(honest.hello());
  // A client with another token cannot answer this challenge; it can only guess the proof.
  AuthResponse forged = honest.answer(challenge);
  forged[0] ^= std::byte{1};
  EXPECT_THROW(server.verify(forged), AuthError);
}

TEST(Auth, ServerProofCannotBeReflectedAsClientProof) {
  const JobToken t = token("the-right-token-0123");
  AuthClient client(t, AuthService::kTransport);
  AuthServer server(t, AuthService::kTransport);
  const AuthChallenge challenge = server.challenge(client.hello());
  AuthResponse reflected{};
  std::copy(challenge.begin() + kAuthNonceBytes, challenge.end(), reflected.begin());
  EXPECT_THROW(server.verify(reflected), AuthError);
}

TEST(Auth, MalformedHellosAreRefused) {
  const JobToken t = token("the-right-token-0123");
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
    JobToken::fromString("short", "TERSE_JOB_TOKEN");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("TERSE_JOB_TOKEN"), std::string::npos) << m;
    EXPECT_EQ(m.find("short"), std::string::npos) << "the secret leaked into the message: " << m;
  }
}

TEST(Auth, TokenFileMustBePrivate) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "token";
  std::ofstream(file) << "0123456789abcdef0123\n";
  ::chmod(file.c_str(), 0644);
  try {
    JobToken::fromFile(file);
    FAIL() << "a world-readable token file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
  }
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(JobToken::fromFile(file).secret(), "0123456789abcdef0123");  // trailing newline stripped
  EXPECT_THROW(JobToken::fromFile(dir / "missing"), InvalidArgument);
  EXPECT_THROW(JobToken::fromFile(dir), InvalidArgument);  // not a regular file

  ::setenv(kJobTokenFileEnv, file.c_str(), 1);
  ::unsetenv(kJobTokenEnv);
  ASSERT_TRUE(JobToken::fromEnvironment().has_value());
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), "0123456789abcdef0123");
  ::setenv(kJobTokenEnv, "from-the-environment-var", 1);  // the variable wins over the file
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), "from-the-environment-var");
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

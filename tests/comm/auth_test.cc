// Job-token authentication (core/comm/auth.h): the handshake accepts exactly the peers that know the token, for the
// service they asked for; token files must be private; and only tokens terse generated are accepted, so that no
// human-made string ever becomes a job's secret.
#include "core/comm/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace terse::comm {
namespace {

JobToken token(const std::string& s) {
  return JobToken::fromString(s);
}

// Two tokens in the format (auth.h), made by `terse token`.
constexpr const char* kRight = "terse-v1-60057124becc6bfb24a08ef1f6f39c6c9bc0f36f9885514de174b9ff4a0d6137-d194c558";
constexpr const char* kWrong = "terse-v1-e7fdcf67e555afaa4bf303e42126197b2dcbe79753e88359f9bf81a9e8142b57-97839d85";

TEST(Auth, SameTokenAuthenticatesBothWays) {
  const JobToken t = JobToken::generate();
  EXPECT_EQ(t.secret().size(), JobToken::kLength);
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

// ---- Which tokens are accepted (auth.h): only the format `terse token` and `terse launch` generate.

// `secret` must be refused from `source` with a message that names the source, says how to make a token, contains
// `expect` (what was wrong), and shows no 12 consecutive characters of the secret.
void expectRefused(const std::string& secret, const std::string& source, const std::string& expect) {
  SCOPED_TRACE("a token of " + std::to_string(secret.size()) + " characters from " + source + ", expecting '" + expect +
               "'");
  try {
    JobToken::fromString(secret, source);
    ADD_FAILURE() << "accepted a token that terse did not generate (length " << secret.size() << ")";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(source), std::string::npos) << m;
    EXPECT_NE(m.find(std::string(JobToken::kHowToMakeOne)), std::string::npos) << m;
    EXPECT_NE(m.find(expect), std::string::npos) << "expected '" << expect << "' in: " << m;
    for (std::size_t at = 0; at + 12 <= secret.size(); ++at) {
      ASSERT_EQ(m.find(secret.substr(at, 12)), std::string::npos) << "the message shows the secret: " << m;
    }
  }
}

// A token's random part, and a token in the format around a random part (the checksum computed for it).
std::string randomPart(const std::string& token) {
  return token.substr(JobToken::kPrefix.size(), JobToken::kRandomHexDigits);
}
std::string assemble(const std::string& random_hex) {
  return std::string(JobToken::kPrefix) + random_hex + "-" + JobToken::checksum(random_hex);
}

TEST(JobTokenFormat, GeneratedTokensHaveTheFormatAndRoundTrip) {
  for (int i = 0; i < 100; ++i) {
    const std::string t = JobToken::generate().secret();
    ASSERT_EQ(t.size(), JobToken::kLength);
    ASSERT_TRUE(t.starts_with("terse-v1-")) << "token #" << i;
    ASSERT_EQ(t[JobToken::kPrefix.size() + JobToken::kRandomHexDigits], '-');
    ASSERT_EQ(t.find_first_not_of("0123456789abcdef", JobToken::kPrefix.size()),
              JobToken::kPrefix.size() + JobToken::kRandomHexDigits);
    ASSERT_EQ(JobToken::fromString(t).secret(), t);
  }
  // Through a file, trailing newline and all, as `terse token > FILE` writes it.
  const auto file = std::filesystem::temp_directory_path() / ("terse-token-" + std::to_string(::getpid()));
  const std::string t = JobToken::generate().secret();
  std::ofstream(file) << t << "\n";
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(JobToken::fromFile(file).secret(), t);
  std::filesystem::remove(file);
}

// The checksum is pinned, so that scripts (scripts/netns-cluster) that make a token with sha256sum agree:
//   printf 'terse-token-v1:%s' RANDOM_HEX | sha256sum | cut -c1-8
TEST(JobTokenFormat, ChecksumIsTheTaggedSha256) {
  EXPECT_EQ(JobToken::checksum("60057124becc6bfb24a08ef1f6f39c6c9bc0f36f9885514de174b9ff4a0d6137"), "d194c558");
  EXPECT_EQ(JobToken::checksum(randomPart(kWrong)), "97839d85");
  EXPECT_EQ(JobToken::fromString(kRight).secret(), kRight);
}

// The attacker's finds against the old rule, `openssl rand -hex 32`'s output, damaged tokens and nothing at all: each
// refused, with what was wrong, where it came from and how to make a token, and without showing it.
TEST(JobTokenFormat, EverythingElseIsRefusedWithAClearMessage) {
  for (const char* human : {"0123456789abcdef0123456789abcdef", "00000000000000000000000000012345",
                            "deadbeefcafebabedeadbeefcafebabe", "abcdefabcdefabcdefabcdefabcdefabcdef"}) {
    expectRefused(human, "TERSE_JOB_TOKEN", "bare hexadecimal digits");
  }
  // What the README used to recommend: 64 random hex digits, however random.
  const std::string openssl_style = randomPart(JobToken::generate().secret());
  expectRefused(openssl_style, "TERSE_JOB_TOKEN", "openssl rand -hex");
  expectRefused("correct horse battery staple", "job token file token.txt", "does not start with");
  expectRefused("", "TERSE_JOB_TOKEN", "is empty");

  const std::string good = kRight;
  // One character changed: a digit of the random part, of the checksum; the case of one.
  std::string edited = good;
  edited[20] = edited[20] == '0' ? '1' : '0';
  expectRefused(edited, "TERSE_JOB_TOKEN", "fails its checksum");
  edited = good;
  edited[good.size() - 1] = edited.back() == '0' ? '1' : '0';
  expectRefused(edited, "TERSE_JOB_TOKEN", "fails its checksum");
  edited = good;
  edited[12] = 'B';  // an upper-case digit where a lowercase one belongs
  expectRefused(edited, "TERSE_JOB_TOKEN", "position 13");
  // Truncated: one character short, the checksum gone, only the prefix; and one character too many.
  expectRefused(good.substr(0, good.size() - 1), "TERSE_JOB_TOKEN", "is 81 characters");
  expectRefused(good.substr(0, JobToken::kPrefix.size() + JobToken::kRandomHexDigits), "TERSE_JOB_TOKEN",
                "is 73 characters");
  expectRefused(std::string(JobToken::kPrefix), "TERSE_JOB_TOKEN", "is 9 characters");
  expectRefused(good + "0", "TERSE_JOB_TOKEN", "is 83 characters");
  // Whitespace in the variable itself is not trimmed (only a file's trailing whitespace is), nor is leading space.
  expectRefused(" " + good, "TERSE_JOB_TOKEN", "does not start with");
}

TEST(JobTokenFormat, EveryOneCharacterEditIsRefused) {
  const std::string good = kRight;
  int edits = 0;
  for (std::size_t at = 0; at < good.size(); ++at) {
    for (char c : std::string_view("0123456789abcdefABCDEF-tv x")) {
      if (c == good[at]) continue;
      std::string edited = good;
      edited[at] = c;
      EXPECT_THROW(JobToken::fromString(edited), InvalidArgument) << "position " << at << " set to '" << c << "'";
      ++edits;
    }
  }
  EXPECT_GT(edits, 2000);
}

// Someone who reads auth.h can put a pattern in the format and compute its checksum; the random part must still not be
// a pattern (few distinct digits, or a repetition).
TEST(JobTokenFormat, PatternsInTheFormatAreRefused) {
  auto repeat = [](std::string_view unit) {
    std::string out;
    while (out.size() < JobToken::kRandomHexDigits) out += unit;
    return out.substr(0, JobToken::kRandomHexDigits);
  };
  for (const std::string& pattern :
       {repeat("0123456789abcdef"), repeat("deadbeefcafebabe"), repeat("abcdef"), repeat("0"),
        std::string(59, '0') + "12345", repeat("0123456789abcdeffedcba9876543210"), repeat("c0ffee")}) {
    expectRefused(assemble(pattern), "TERSE_JOB_TOKEN", "pattern");
  }
  // A random part of the same shape that is not a pattern passes: the checks are on the digits, not the format.
  EXPECT_NO_THROW(JobToken::fromString(assemble(randomPart(kWrong))));
}

// ---- The oracle attack (issue 43). Whoever gets a rank to connect to it receives a proof it can test guesses against
// offline; a 23k-entry list of human-made strings found tokens the old rule accepted in seconds. Here the attacker's
// list -- the four finds, hex words, repeated patterns, counters, pass phrases and hashes of words, bare and dressed
// in terse's prefix -- meets JobToken::fromString: if none is accepted, no job can hold one, and no guess from it is
// worth testing.

// The rule terse had before (at least 32 hex digits, at least 6 distinct ones): the list must beat it, so that the
// test says something about the new rule.
bool oldRuleAccepts(const std::string& s) {
  if (s.size() < 32) return false;
  std::set<char> distinct;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    distinct.insert(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return distinct.size() >= 6;
}

std::vector<std::string> attackersGuessList() {
  std::vector<std::string> bases = {"0123456789abcdef0123456789abcdef",
                                    "00000000000000000000000000012345",
                                    "deadbeefcafebabedeadbeefcafebabe",
                                    "abcdefabcdefabcdefabcdefabcdefabcdef",
                                    "password",
                                    "correct horse battery staple",
                                    "ThisIsMySecretPassword1234567890",
                                    "terse",
                                    "terse-job-token",
                                    "letmein",
                                    "changeme",
                                    "hunter2"};
  auto repeatTo = [](std::string_view unit, std::size_t n) {
    std::string out;
    while (out.size() < n) out += unit;
    return out.substr(0, n);
  };
  const std::vector<std::string> words = {"dead",    "beef",    "cafe",     "babe",   "face",     "feed",
                                          "f00d",    "c0de",    "d00d",     "fade",   "bead",     "deaf",
                                          "decade",  "facade",  "c0ffee",   "1337",   "abad1dea", "8badf00d",
                                          "badc0de", "0ddba11", "5ca1ab1e", "acce55", "5eed",     "b0ba"};
  std::vector<std::string> units = words;
  for (std::size_t i = 0; i < words.size(); ++i)
    for (std::size_t j = 0; j < words.size(); j += 3) units.push_back(words[i] + words[j]);
  const std::string digits = "0123456789abcdef";
  for (std::size_t r = 0; r < digits.size(); ++r) {
    units.push_back(digits.substr(r) + digits.substr(0, r));  // rotations
    units.push_back(std::string(digits.rbegin(), digits.rend()).substr(r));
  }
  units.push_back("abcdef");
  units.push_back("0123456789");
  units.push_back("13579bdf2468ace0");
  for (const std::string& unit : units) {
    for (std::size_t n : {32u, 64u}) bases.push_back(repeatTo(unit, n));
  }
  // Counters, zero-padded left and right, in decimal-looking and hex digits.
  for (uint64_t v : {0ull, 1ull, 42ull, 1234ull, 12345ull, 123456ull, 1234567890ull, 0xdeadbeefull, 0xcafebabeull,
                     0x0123456789abcdefull, 20240101ull, 31337ull}) {
    std::ostringstream hex;
    hex << std::hex << v;
    for (std::size_t n : {32u, 64u}) {
      bases.push_back(std::string(n - hex.str().size(), '0') + hex.str());
      bases.push_back(hex.str() + std::string(n - hex.str().size(), '0'));
    }
  }
  for (int i = 0; i < 64; ++i) {
    std::ostringstream hex;
    hex << std::hex << i;
    bases.push_back(std::string(32 - hex.str().size(), '0') + hex.str());
  }
  // Hashes of words: what looks random but is not (an HMAC under a fixed key stands in for sha256sum of a word).
  for (const char* w : {"password", "terse", "secret", "token", "letmein", "cluster"}) {
    const std::string_view word(w);
    const std::array<std::span<const std::byte>, 1> parts{std::as_bytes(std::span(word.data(), word.size()))};
    std::string hex;
    for (std::byte b : hmacSha256("sha256", parts)) {
      hex += digits[std::to_integer<unsigned>(b) >> 4];
      hex += digits[std::to_integer<unsigned>(b) & 0xf];
    }
    bases.push_back(hex);
  }
  // Every base as typed, upper-cased, and dressed in terse's prefix (with and without a dash and made-up checksum).
  std::set<std::string> guesses;
  for (const std::string& b : bases) {
    std::string upper = b;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    guesses.insert(b);
    guesses.insert(upper);
    guesses.insert(std::string(JobToken::kPrefix) + b);
    guesses.insert(std::string(JobToken::kPrefix) + b + "-00000000");
    guesses.insert(std::string(JobToken::kPrefix) + b + "-" + b.substr(0, 8));
  }
  return {guesses.begin(), guesses.end()};
}

TEST(JobTokenGuessing, TheOracleAttacksGuessListFindsNothing) {
  const std::vector<std::string> guesses = attackersGuessList();
  ASSERT_GT(guesses.size(), 1000u);
  const auto old_accepts = std::count_if(guesses.begin(), guesses.end(), oldRuleAccepts);
  EXPECT_GT(old_accepts, 300) << "the list would not have found anything under the old rule either";
  std::vector<std::string> accepted;
  for (const std::string& g : guesses) {
    try {
      (void)JobToken::fromString(g, "guess");
      accepted.push_back(g);
    } catch (const InvalidArgument&) {
    }
  }
  EXPECT_TRUE(accepted.empty()) << accepted.size() << " of " << guesses.size()
                                << " human-made guesses are accepted as job tokens, e.g. " << accepted.front();
}

TEST(Auth, TokenFileMustBePrivate) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "token";
  std::ofstream(file) << kRight << "\n";
  ::chmod(file.c_str(), 0644);
  try {
    JobToken::fromFile(file);
    FAIL() << "a world-readable token file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("0644"), std::string::npos) << e.what();
  }
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(JobToken::fromFile(file).secret(), kRight);  // trailing newline stripped
  EXPECT_THROW(JobToken::fromFile(dir / "missing"), InvalidArgument);
  EXPECT_THROW(JobToken::fromFile(dir), InvalidArgument);  // not a regular file

  ::setenv(kJobTokenFileEnv, file.c_str(), 1);
  ::unsetenv(kJobTokenEnv);
  ASSERT_TRUE(JobToken::fromEnvironment().has_value());
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), kRight);
  ::setenv(kJobTokenEnv, kWrong, 1);  // the variable wins over the file
  EXPECT_EQ(JobToken::fromEnvironment()->secret(), kWrong);
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

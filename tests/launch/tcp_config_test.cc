// The `tcp` block of the experiment schema (experiment.proto Tcp): defaults written into the resolved config, and bad
// values reported with their field path and value before anything runs.
#include <gtest/gtest.h>

#include "experiments/config/config.h"

namespace terse::experiments {
namespace {

const std::string kTcpStudy =
    "study: \"t\"\n"
    "workload { name: \"linear_regression\" }\n"
    "workers: 2\n"
    "transport: TCP\n";

ConfigOptions tcpOptions() {
  ConfigOptions o;
  o.transports = {Experiment::INPROC, Experiment::TCP};
  return o;
}

std::vector<std::string> errorsOf(const std::string& text) {
  try {
    loadStudyText(text, "t.textproto", tcpOptions());
  } catch (const ConfigError& e) {
    return e.errors();
  }
  return {};
}

TEST(TcpConfig, DefaultsAreWrittenOut) {
  const Study s = loadStudyText(kTcpStudy, "t.textproto", tcpOptions());
  ASSERT_EQ(s.experiments.size(), 1u);
  const Experiment& e = s.experiments[0];
  EXPECT_EQ(e.transport(), Experiment::TCP);
  EXPECT_EQ(e.tcp().timeout(), "30s");
  EXPECT_EQ(e.tcp().socket_buffer_bytes(), 0);
  EXPECT_EQ(e.tcp().bind_address(), "");
  EXPECT_NE(toText(e).find("timeout: \"30s\""), std::string::npos) << toText(e);
}

TEST(TcpConfig, BadValuesNameTheFieldAndValue) {
  auto errors = errorsOf(kTcpStudy + "tcp { timeout: \"soon\" }\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("tcp.timeout"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("soon"), std::string::npos) << errors[0];
  errors = errorsOf(kTcpStudy + "tcp { timeout: \"0\" }\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("tcp.timeout must be > 0, got '0'"), std::string::npos) << errors[0];
  errors = errorsOf(kTcpStudy + "tcp { socket_buffer_bytes: -1 }\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("tcp.socket_buffer_bytes must be in [0, 1073741824], got -1"), std::string::npos)
      << errors[0];
  errors = errorsOf(kTcpStudy + "tcp { bind_address: \"10.0.0.1; rm\" }\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("tcp.bind_address '10.0.0.1; rm' is not a host name or address"), std::string::npos)
      << errors[0];
  // A variant overrides one field of the block, keeping the others.
  const Study s = loadStudyText(kTcpStudy +
                                    "tcp { timeout: \"5s\" socket_buffer_bytes: 65536 }\n"
                                    "variants { name: \"a\" overrides { tcp { timeout: \"1s\" } } }\n",
                                "t.textproto", tcpOptions());
  EXPECT_EQ(s.experiments[0].tcp().timeout(), "1s");
  EXPECT_EQ(s.experiments[0].tcp().socket_buffer_bytes(), 65536);
}

}  // namespace
}  // namespace terse::experiments

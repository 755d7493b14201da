// The device twin of builtin_conformance_test.cc: every built-in compressor whose f32 caps advertise CUDA, through the
// whole conformance suite with its buffers in device memory (ConformanceOptions::device), one test per (plugin,
// check) and held to the same claims as on the host (builtin_plugins.h). Label `cuda`: built in CUDA builds, and each
// test skips with the runtime's reason on a machine without a device.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "core/conformance/conformance.h"
#include "core/plugin/loader.h"
#include "tests/conformance/builtin_plugins.h"

namespace terse {
namespace {

using conformance_test::discovered;
using conformance_test::expectations;

struct Case {
  std::string plugin;
  std::string check;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.plugin << " / " << c.check << " (cuda)";
}

Params paramsOf(const std::string& plugin) {
  auto it = expectations().find(plugin);
  return it == expectations().end() ? Params{} : it->second.params;
}

// The built-ins that advertise CUDA, asked the way the core asks (caps of an instance; no device needed for that).
// A plugin that cannot be opened or instantiated here is left to the host suite, which reports why.
std::vector<std::string> cudaPlugins() {
  std::vector<std::string> out;
  for (const auto& d : discovered()) {
    if (!d.error.empty()) continue;
    try {
      const auto plugin = CompressorPlugin::open(d.path, std::string(kOriginBuildTree));
      if (plugin->instantiate(paramsOf(d.name))->caps(DType::kF32).devices & TERSE_DEVICE_CUDA) out.push_back(d.name);
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& name : cudaPlugins()) {
    for (auto check : conformanceCheckNames()) out.push_back({name, std::string(check)});
  }
  return out;
}

class DeviceBuiltIn : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceBuiltIn);

TEST_P(DeviceBuiltIn, Conforms) {
  const Case& c = GetParam();
  if (const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 0); !problem.empty()) {
    GTEST_SKIP() << problem;
  }
  const conformance_test::Discovered* plugin_file = nullptr;
  for (const auto& d : discovered())
    if (d.name == c.plugin) plugin_file = &d;
  ASSERT_NE(plugin_file, nullptr);

  const auto plugin = CompressorPlugin::open(plugin_file->path, std::string(kOriginBuildTree));
  ConformanceOptions options;
  Params params;
  if (auto it = expectations().find(c.plugin); it != expectations().end()) {
    params = it->second.params;
    options.max_rel_error = it->second.max_rel_error;
    options.claims_unbiased = it->second.unbiased;
    options.finite_input_limit = it->second.finite_input_limit;
  }
  options.device = TERSE_DEVICE_CUDA;
  options.device_index = 0;
  options.only = {c.check};
  const ConformanceReport report = checkCompressor(*plugin, params, options);
  const CheckResult* result = report.find(c.check);
  ASSERT_NE(result, nullptr);
  std::cout << c.plugin << " " << c.check << " on " << report.device << ": " << checkStatusName(result->status) << "  "
            << result->message << std::endl;
  if (result->status == CheckStatus::kSkip) GTEST_SKIP() << result->message;
  EXPECT_EQ(checkStatusName(result->status), "PASS")
      << c.plugin << ", check " << c.check << " on " << report.device << ": " << result->message;
}

INSTANTIATE_TEST_SUITE_P(CudaPlugins, DeviceBuiltIn, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.plugin + "_" + p.param.check; });

// A CUDA build whose built-ins advertise no device path would make the suite above vacuous; `none` always has kernels
// (compressors/none/none.cu). Needs no device: caps are a host question.
TEST(DeviceBuiltInDiscovery, SomeBuiltInAdvertisesCuda) {
  const auto names = cudaPlugins();
  EXPECT_FALSE(names.empty()) << "no built-in compressor in " << TERSE_TEST_BUILD_PLUGIN_DIR
                              << " advertises TERSE_DEVICE_CUDA";
}

// The device guard zones bite: conf_device_overrun copies its input correctly but, on CUDA only, writes one byte just
// past (or before) its compress output. The host suite cannot see it; the device suite fails output_size with the
// same words the host suite uses for conf_broken's overrun.
std::shared_ptr<const CompressorPlugin> overrunFixture() {
  return CompressorPlugin::open(std::filesystem::path(TERSE_TEST_CONFORMANCE_FIXTURE_DIR) /
                                "terse_compressor_conf_device_overrun.so");
}

ConformanceOptions outputSizeOnly(uint32_t device) {
  ConformanceOptions o;
  o.shapes = {ConformanceShape::flat(0), ConformanceShape::flat(1), ConformanceShape::flat(1001)};
  o.only = {"output_size"};
  o.device = device;
  return o;
}

std::string describe(const ConformanceReport& r) {
  std::string s;
  for (const auto& c : r.checks) s += "\n  " + std::string(checkStatusName(c.status)) + " " + c.name + ": " + c.message;
  return s;
}

TEST(DeviceGuardZones, TheHostSuiteCannotSeeADeviceOnlyOverrun) {
  const auto report = checkCompressor(*overrunFixture(), {{"where", "after"}}, outputSizeOnly(TERSE_DEVICE_HOST));
  EXPECT_TRUE(report.passed()) << describe(report);
}

TEST(DeviceGuardZones, WritePastTheOutputIsCaught) {
  if (const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 0); !problem.empty()) {
    GTEST_SKIP() << problem;
  }
  const auto report = checkCompressor(*overrunFixture(), {{"where", "after"}}, outputSizeOnly(TERSE_DEVICE_CUDA));
  const CheckResult* r = report.find("output_size");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail) << describe(report);
  EXPECT_NE(r->message.find("wrote past the end of the compress output"), std::string::npos) << r->message;
}

TEST(DeviceGuardZones, WriteBeforeTheOutputIsCaught) {
  if (const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 0); !problem.empty()) {
    GTEST_SKIP() << problem;
  }
  const auto report = checkCompressor(*overrunFixture(), {{"where", "before"}}, outputSizeOnly(TERSE_DEVICE_CUDA));
  const CheckResult* r = report.find("output_size");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail) << describe(report);
  EXPECT_NE(r->message.find("1 bytes before the start of the compress output"), std::string::npos) << r->message;
}

TEST(DeviceGuardZones, TheCorrectDevicePathPasses) {
  if (const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 0); !problem.empty()) {
    GTEST_SKIP() << problem;
  }
  const auto report = checkCompressor(*overrunFixture(), {{"where", "none"}}, outputSizeOnly(TERSE_DEVICE_CUDA));
  EXPECT_TRUE(report.passed()) << describe(report);
  EXPECT_EQ(report.device.rfind("CUDA device 0", 0), 0u) << report.device;
}

}  // namespace
}  // namespace terse

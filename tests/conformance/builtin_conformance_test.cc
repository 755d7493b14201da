// The conformance suite over every compressor plugin in the build plugin directory: one test per (plugin, check), so
// ctest names exactly which plugin breaks which rule. Plugins are discovered when the test runs (PluginLoader::
// discover), so a new compressor joins without an edit here; without a row in expectations() (builtin_plugins.h) it is
// checked with no parameters, no error bound and no unbiasedness claim, which is everything the suite can say about it
// unasked.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/conformance/conformance.h"
#include "core/plugin/loader.h"
#include "tests/conformance/builtin_plugins.h"

namespace terse {
namespace {

using conformance_test::Discovered;
using conformance_test::discovered;
using conformance_test::expectations;

struct Case {
  std::string plugin;
  std::string check;
};

// Names the case in ctest's and gtest's output (instead of a byte dump of the struct).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.plugin << " / " << c.check;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& p : discovered()) {
    for (auto check : conformanceCheckNames()) out.push_back({p.name, std::string(check)});
  }
  return out;
}

class BuiltIn : public ::testing::TestWithParam<Case> {};

TEST_P(BuiltIn, Conforms) {
  const Case& c = GetParam();
  const Discovered* plugin_file = nullptr;
  for (const auto& d : discovered())
    if (d.name == c.plugin) plugin_file = &d;
  ASSERT_NE(plugin_file, nullptr);
  ASSERT_TRUE(plugin_file->error.empty())
      << "a file in the build plugin directory cannot be used: " << plugin_file->error;

  const auto plugin = CompressorPlugin::open(plugin_file->path, std::string(kOriginBuildTree));
  ConformanceOptions options;
  Params params;
  if (auto it = expectations().find(c.plugin); it != expectations().end()) {
    params = it->second.params;
    options.max_rel_error = it->second.max_rel_error;
    options.claims_unbiased = it->second.unbiased;
    options.finite_input_limit = it->second.finite_input_limit;
  }
  options.only = {c.check};
  const ConformanceReport report = checkCompressor(*plugin, params, options);
  const CheckResult* result = report.find(c.check);
  ASSERT_NE(result, nullptr);
  // The measurement is worth reading when the check passes too (ctest -V).
  std::cout << c.plugin << " " << c.check << ": " << checkStatusName(result->status) << "  " << result->message
            << std::endl;
  if (result->status == CheckStatus::kSkip) GTEST_SKIP() << result->message;
  EXPECT_EQ(checkStatusName(result->status), "PASS") << c.plugin << ", check " << c.check << ": " << result->message;
}

INSTANTIATE_TEST_SUITE_P(Plugins, BuiltIn, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.plugin + "_" + p.param.check; });

// The discovery itself: the test plugins are always built, so an empty list means the directory is wrong.
TEST(BuiltInDiscovery, FindsTheTestPlugins) {
  bool lossy = false;
  for (const auto& d : discovered()) lossy = lossy || d.name == "test_lossy";
  EXPECT_TRUE(lossy) << "no test_lossy in " << TERSE_TEST_PLUGIN_DIR;
}

}  // namespace
}  // namespace terse

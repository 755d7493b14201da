// The conformance suite must bite: on plugins broken on purpose, the check about the defect fails (and, where the
// defect is narrow, only that check), a correct plugin passes, and nothing a plugin does brings the suite down.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/conformance/conformance.h"
#include "core/plugin/loader.h"

namespace terse {
namespace {

const std::filesystem::path kTestPluginDir = TERSE_TEST_PLUGIN_DIR;
const std::filesystem::path kFixtureDir = TERSE_TEST_FIXTURE_PLUGIN_DIR;
const std::filesystem::path kConformanceFixtureDir = TERSE_TEST_CONFORMANCE_FIXTURE_DIR;

std::shared_ptr<const CompressorPlugin> open(const std::filesystem::path& dir, const std::string& name) {
  return CompressorPlugin::open(dir / ("terse_compressor_" + name + ".so"));
}

// Smaller than the defaults (no 2^20 + 3 tensor, fewer unbiasedness steps) so the fixture runs stay quick under ASan;
// every shape kind is still there: empty, one element, odd, a matrix.
ConformanceOptions quick() {
  ConformanceOptions o;
  o.shapes = {ConformanceShape::flat(0), ConformanceShape::flat(1), ConformanceShape::flat(1001),
              ConformanceShape::matrix(33, 31)};
  o.unbiased_steps = 400;
  o.unbiased_numel = 2048;  // an eighth of the default: the suite's mechanics, not its power (unbiased_power_test.cc)
  o.fuzz_payloads = 100;
  return o;
}

std::set<std::string> failed(const ConformanceReport& r) {
  std::set<std::string> out;
  for (const auto& c : r.checks)
    if (c.status == CheckStatus::kFail) out.insert(c.name);
  return out;
}

std::string describe(const ConformanceReport& r) {
  std::string s;
  for (const auto& c : r.checks) s += "\n  " + std::string(checkStatusName(c.status)) + " " + c.name + ": " + c.message;
  return s;
}

// conf_broken with mode=ok is a correct, unbiased compressor: every check passes or does not apply.
TEST(ConformanceSuite, CorrectFixturePassesEveryCheck) {
  ConformanceOptions o = quick();
  o.claims_unbiased = true;
  o.max_rel_error = 0.15;  // stochastic rounding to a 0.25 grid: about 0.1 of ||x|| on N(0, 1)
  const auto report = checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", "ok"}}, o);
  EXPECT_TRUE(report.passed()) << describe(report);
  EXPECT_EQ(report.checks.size(), conformanceCheckNames().size());
  for (const char* name : {"round_trip", "unbiased", "sum_aggregation", "deterministic", "wrong_length_payloads"}) {
    ASSERT_NE(report.find(name), nullptr) << name;
    EXPECT_EQ(report.find(name)->status, CheckStatus::kPass) << name << describe(report);
  }
}

struct Defect {
  const char* mode;
  std::set<std::string> fails;  // exactly these checks fail
  const char* says;             // and the first of them says this
};

void PrintTo(const Defect& d, std::ostream* os) {
  *os << "mode=" << d.mode;
}

class SuiteBites : public ::testing::TestWithParam<Defect> {};

TEST_P(SuiteBites, TheCheckAboutTheDefectFails) {
  const Defect& d = GetParam();
  ConformanceOptions o = quick();
  o.claims_unbiased = true;
  const auto report = checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", d.mode}}, o);
  EXPECT_EQ(failed(report), d.fails) << describe(report);
  const CheckResult* first = report.find(*d.fails.begin());
  ASSERT_NE(first, nullptr);
  EXPECT_NE(first->message.find(d.says), std::string::npos) << first->message;
}

INSTANTIATE_TEST_SUITE_P(
    ConfBroken, SuiteBites,
    ::testing::Values(Defect{"not_summable", {"sum_aggregation"}, "not summable as its caps claim"},
                      Defect{"lax_decode", {"wrong_length_payloads"}, "payloads of the wrong length"},
                      Defect{"nondeterministic", {"deterministic"}, "same (seed, step, tensor id) differ"},
                      Defect{"ignores_accumulate", {"accumulate"}, "with accumulate = 1"},
                      Defect{"biased", {"unbiased"}, "claimed unbiased, but"},
                      Defect{"dirty_workspace", {"decompress_purity"}, "never modifies the workspace"},
                      Defect{
                          "wrong_status",
                          {"byte_flip_payloads", "random_payloads", "wrong_header_payloads", "wrong_length_payloads"},
                          "instead of 'invalid payload'"},
                      Defect{"float_overflow", {"finite_decode"}, "from the finite input"},
                      Defect{"dirty_padding", {"zero_padding"}, "depends on what the output buffer held"},
                      Defect{"false_identity", {"identity"}, "caps declare TERSE_CAP_IDENTITY, but byte"},
                      Defect{"own_payload_zeros", {"accumulate"}, "decompressed with TERSE_CALL_OWN_PAYLOAD"},
                      Defect{"deferred_lax", {"deferred_verdicts"}, "the deferred decompress accepts it"}),
    [](const ::testing::TestParamInfo<Defect>& p) { return std::string(p.param.mode); });

// Writing past max_output_bytes (into capacity the core happened to offer) is caught by the guard zones in every check
// that compresses; output_size names it.
TEST(ConformanceSuite, WriteBeyondMaxOutputIsCaught) {
  const auto report =
      checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", "overrun_output"}}, quick());
  const CheckResult* r = report.find("output_size");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail) << describe(report);
  EXPECT_NE(r->message.find("wrote past the end of the compress output"), std::string::npos) << r->message;
}

// Built with AddressSanitizer, a wild access is ASan's report and exit status 1 rather than the signal.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

// A decoder that believes the payload's element count segfaults on a corrupted one: each check it crashes in is a
// FAIL naming the signal, the checks before and after it still run and report, and the suite returns normally.
TEST(ConformanceSuite, CrashingPluginFailsTheCheckNotTheSuite) {
  ConformanceReport report;
  ASSERT_NO_THROW(
      report = checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", "crash_decode"}}, quick()));
  EXPECT_EQ(report.checks.size(), conformanceCheckNames().size());
  for (const char* name : {"round_trip", "accumulate", "sum_aggregation", "zero_padding", "finite_decode"}) {
    ASSERT_NE(report.find(name), nullptr) << name;
    EXPECT_EQ(report.find(name)->status, CheckStatus::kPass) << name << describe(report);
  }
  // random_payloads runs after the crashes below. A plain build passes it; under ASan its random counts read past the
  // payload as well, which ASan reports (the child exits 1): there it is held only to having run and said so.
  const CheckResult* after = report.find("random_payloads");
  ASSERT_NE(after, nullptr);
  if (kAsan) {
    EXPECT_TRUE(after->status == CheckStatus::kPass ||
                after->message.find("exited with status 1 before reporting a result") != std::string::npos)
        << describe(report);
  } else {
    EXPECT_EQ(after->status, CheckStatus::kPass) << describe(report);
  }
  // Both lie in the numel field (2^63, 0xFF bytes).
  for (const char* name : {"wrong_header_payloads", "byte_flip_payloads"}) {
    const CheckResult* r = report.find(name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_EQ(r->status, CheckStatus::kFail) << name << describe(report);
    const char* says = kAsan ? "exited with status 1 before reporting a result" : "crashed with SIGSEGV";
    EXPECT_NE(r->message.find(says), std::string::npos) << name << ": " << r->message;
  }
}

// A decoder that never returns fails the check it hangs in once the time limit passes, with the limit in the message.
TEST(ConformanceSuite, HangingPluginFailsAtTheTimeLimit) {
  ConformanceOptions o = quick();
  o.only = {"wrong_header_payloads", "round_trip"};
  o.check_timeout_s = 0.5;
  const auto report = checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", "hang_decode"}}, o);
  const CheckResult* r = report.find("wrong_header_payloads");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail);
  EXPECT_NE(r->message.find("did not finish within the time limit of 0.5 s"), std::string::npos) << r->message;
  // The call it hung in, from the child's own report: not only that the limit passed.
  EXPECT_NE(r->message.find("it was inside the plugin's decompress of tensor "), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("(round 0, rank 0), which had not returned"), std::string::npos) << r->message;
  EXPECT_EQ(report.find("round_trip")->status, CheckStatus::kPass) << describe(report);
}

// The same for a hang in compress, from the loader fixtures' misbehave (tests/fixtures/misbehave.c).
TEST(ConformanceSuite, TheTimeLimitNamesTheCallThatHung) {
  ConformanceOptions o = quick();
  o.only = {"round_trip"};
  o.check_timeout_s = 0.5;
  const auto report = checkCompressor(*open(kFixtureDir, "misbehave"), {{"fault", "hang"}, {"call", "compress"}}, o);
  const CheckResult* r = report.find("round_trip");
  ASSERT_NE(r, nullptr) << describe(report);
  EXPECT_EQ(r->status, CheckStatus::kFail) << describe(report);
  EXPECT_NE(r->message.find("did not finish within the time limit of 0.5 s"), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("it was inside the plugin's compress of tensor "), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("(round 0, rank 0), which had not returned"), std::string::npos) << r->message;
}

// A check hung while holding stdout's lock (inside a printf, say): the child's flush after its report would wait
// forever, so the parent ends it at its deadline and keeps the report. Before, the suite waited for it forever.
TEST(ConformanceSuite, AHungCheckThatHoldsAStreamLockIsEndedAndNamed) {
  ConformanceOptions o = quick();
  o.only = {"round_trip"};
  o.check_timeout_s = 0.5;
  const auto report =
      checkCompressor(*open(kFixtureDir, "misbehave"), {{"fault", "hang_locked"}, {"call", "compress"}}, o);
  const CheckResult* r = report.find("round_trip");
  ASSERT_NE(r, nullptr) << describe(report);
  EXPECT_EQ(r->status, CheckStatus::kFail) << describe(report);
  EXPECT_NE(r->message.find("did not finish within the time limit of 0.5 s"), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("it was inside the plugin's compress of tensor "), std::string::npos) << r->message;
}

// In process (isolate = false) the checks still pass data along: round_trip reuses what shapes measured.
TEST(ConformanceSuite, InProcessAndIsolatedRunsAgree) {
  ConformanceOptions o = quick();
  o.only = {"shapes", "round_trip"};
  const auto plugin = open(kTestPluginDir, "test_lossy");
  const auto forked = checkCompressor(*plugin, {}, o);
  o.isolate = false;
  const auto in_process = checkCompressor(*plugin, {}, o);
  ASSERT_EQ(forked.checks.size(), in_process.checks.size());
  for (std::size_t i = 0; i < forked.checks.size(); ++i) {
    EXPECT_EQ(forked.checks[i].status, in_process.checks[i].status) << forked.checks[i].name;
    EXPECT_EQ(forked.checks[i].message, in_process.checks[i].message) << forked.checks[i].name;
  }
}

// A biased compressor that does not claim unbiasedness is not failed for it; its bias is reported.
TEST(ConformanceSuite, UnclaimedBiasIsReportedNotFailed) {
  ConformanceOptions o = quick();
  o.only = {"unbiased"};
  const auto report = checkCompressor(*open(kConformanceFixtureDir, "conf_broken"), {{"mode", "biased"}}, o);
  const CheckResult* r = report.find("unbiased");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kSkip);
  EXPECT_NE(r->message.find("relative bias"), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("deterministic"), std::string::npos) << r->message;
}

// The loader-level fixtures: a fixed-size plugin that returns fewer bytes, one that returns more than it declared.
TEST(ConformanceSuite, BadCapsFixedSizeLieFailsOutputSize) {
  const auto report = checkCompressor(*open(kFixtureDir, "bad_caps"), {{"mode", "fixed_lies"}}, quick());
  const CheckResult* r = report.find("output_size");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail);
  EXPECT_NE(r->message.find("caps say fixed size"), std::string::npos) << r->message;
}

TEST(ConformanceSuite, BadCapsOversizedOutputFailsOutputSize) {
  const auto report = checkCompressor(*open(kFixtureDir, "bad_caps"), {{"mode", "too_big"}}, quick());
  const CheckResult* r = report.find("output_size");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, CheckStatus::kFail);
  EXPECT_NE(r->message.find("above its max_output_bytes"), std::string::npos) << r->message;
}

// The C fixtures' payload is the raw floats, with no header: nothing tells a corrupted payload from a valid one, so the
// self-describing payload rule (DESIGN.md section 4) fails, and only that.
TEST(ConformanceSuite, HeaderlessPayloadFailsWrongHeader) {
  const auto report = checkCompressor(*open(kFixtureDir, "good_c"), {}, quick());
  EXPECT_EQ(failed(report), std::set<std::string>{"wrong_header_payloads"}) << describe(report);
}

// A plugin that throws from compress and decompress is reported, check by check, and the suite finishes.
TEST(ConformanceSuite, ThrowingPluginIsReportedNotFatal) {
  ConformanceReport report;
  ASSERT_NO_THROW(report = checkCompressor(*open(kFixtureDir, "test_throws"), {}, quick()));
  EXPECT_EQ(report.find("instantiate")->status, CheckStatus::kPass);
  const CheckResult* shapes = report.find("shapes");
  ASSERT_NE(shapes, nullptr);
  EXPECT_EQ(shapes->status, CheckStatus::kFail);
  EXPECT_NE(shapes->message.find("compress failed [plugin error]"), std::string::npos) << shapes->message;
  EXPECT_FALSE(report.passed());
}

// When init refuses (bad_init needs a parameter), instantiate fails and everything else says why it did not run.
TEST(ConformanceSuite, FailedInitSkipsTheRest) {
  const auto report = checkCompressor(*open(kFixtureDir, "bad_init"), {{"ratio", "2"}}, quick());
  ASSERT_FALSE(report.checks.empty());
  EXPECT_EQ(report.checks[0].name, "instantiate");
  EXPECT_EQ(report.checks[0].status, CheckStatus::kFail);
  EXPECT_NE(report.checks[0].message.find("'ratio' must be in (0, 1], got 2"), std::string::npos);
  for (std::size_t i = 1; i < report.checks.size(); ++i) {
    EXPECT_EQ(report.checks[i].status, CheckStatus::kSkip) << report.checks[i].name;
    EXPECT_NE(report.checks[i].message.find("no usable instance"), std::string::npos);
  }
}

TEST(ConformanceSuite, RoundTripBoundIsEnforcedOnlyWhenGiven) {
  const auto lossy = open(kTestPluginDir, "test_lossy");  // truncation to 0.5: relative error about 0.28
  ConformanceOptions o = quick();
  o.only = {"round_trip"};
  EXPECT_EQ(checkCompressor(*lossy, {}, o).find("round_trip")->status, CheckStatus::kPass);
  o.max_rel_error = 0.1;
  const auto tight = checkCompressor(*lossy, {}, o);
  EXPECT_EQ(tight.find("round_trip")->status, CheckStatus::kFail);
  EXPECT_NE(tight.find("round_trip")->message.find("exceeds the bound 0.1"), std::string::npos);
  o.max_rel_error = 0.3;
  EXPECT_EQ(checkCompressor(*lossy, {}, o).find("round_trip")->status, CheckStatus::kPass);
}

TEST(ConformanceSuite, ProgressCallbacksSeeEveryCheckInOrder) {
  std::vector<std::string> started, done;
  ConformanceOptions o = quick();
  o.finite_input_limit = 1e30;  // test_rounds sums the tensor in one f32 (builtin_plugins.h)
  o.on_check_start = [&](std::string_view n) { started.emplace_back(n); };
  o.on_check_done = [&](const CheckResult& r) { done.push_back(r.name); };
  const auto report = checkCompressor(*open(kTestPluginDir, "test_rounds"), {}, o);
  std::vector<std::string> names;
  for (auto n : conformanceCheckNames()) names.emplace_back(n);
  EXPECT_EQ(started, names);
  EXPECT_EQ(done, names);
  EXPECT_TRUE(report.passed()) << describe(report);
}

// deferred_verdicts holds a multi-round plugin's deferred compress (terse/device_verdict_v1.h) to compress's verdicts
// on prev too: test_rounds passes, with its prevs and their corruptions counted; with its planted defect (the deferred
// call takes a prev of the right size without checking its header, and raises nothing) the check fails, naming it.
TEST(ConformanceSuite, DeferredVerdictsHoldsTheDeferredCompressToCompress) {
  ConformanceOptions o = quick();
  o.finite_input_limit = 1e30;  // test_rounds sums the tensor in one f32 (builtin_plugins.h)
  o.only = {"deferred_verdicts"};
  const auto honest = checkCompressor(*open(kTestPluginDir, "test_rounds"), {}, o);
  const CheckResult* h = honest.find("deferred_verdicts");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->status, CheckStatus::kPass) << h->message;
  EXPECT_NE(h->message.find("deferred compresses of a prev and its corruptions agree with compress"), std::string::npos)
      << h->message;
  const auto lax = checkCompressor(*open(kTestPluginDir, "test_rounds"), {{"lax_deferred_prev", "true"}}, o);
  const CheckResult* l = lax.find("deferred_verdicts");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->status, CheckStatus::kFail) << l->message;
  EXPECT_NE(l->message.find("the deferred compress accepts it (status ok, word not raised)"), std::string::npos)
      << l->message;
  EXPECT_NE(l->message.find("prev byte"), std::string::npos) << l->message;
}

TEST(ConformanceSuite, RejectsMalformedOptions) {
  const auto lossy = open(kTestPluginDir, "test_lossy");
  ConformanceOptions o;
  o.world_size = 1;
  EXPECT_THROW(checkCompressor(*lossy, {}, o), InvalidArgument);
  o = ConformanceOptions{};
  o.only = {"no_such_check"};
  EXPECT_THROW(checkCompressor(*lossy, {}, o), InvalidArgument);
  o = ConformanceOptions{};
  o.check_timeout_s = -1;
  EXPECT_THROW(checkCompressor(*lossy, {}, o), InvalidArgument);
}

// Device mode (ConformanceOptions::device) where it cannot run: a clear error before any check, never a crash and
// never a report of skips that would read as a pass. These run on every machine; the device suite itself is
// tests/conformance/device_conformance_test.cc (label `cuda`).
TEST(ConformanceDevice, MalformedDeviceOptionsAreInvalidArguments) {
  const auto lossy = open(kTestPluginDir, "test_lossy");
  ConformanceOptions o = quick();
  o.device = 0x4;
  EXPECT_THROW(checkCompressor(*lossy, {}, o), InvalidArgument);
  EXPECT_NE(conformanceDeviceProblem(0x4, 0), "");
  o.device = TERSE_DEVICE_CUDA;
  o.device_index = -1;
  EXPECT_THROW(checkCompressor(*lossy, {}, o), InvalidArgument);
  EXPECT_NE(conformanceDeviceProblem(TERSE_DEVICE_CUDA, -1), "");
}

TEST(ConformanceDevice, HostModeNeedsNoDevice) {
  EXPECT_EQ(conformanceDeviceProblem(TERSE_DEVICE_HOST, 0), "");
  ConformanceOptions o = quick();
  o.only = {"sizes"};
  const auto report = checkCompressor(*open(kTestPluginDir, "test_lossy"), {}, o);
  EXPECT_EQ(report.device, "host memory");
  EXPECT_TRUE(report.passed()) << describe(report);
}

// No machine has device 999, with or without CUDA in the build: the error names why, and no check runs.
TEST(ConformanceDevice, AnUnavailableDeviceIsAClearError) {
  const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 999);
  ASSERT_NE(problem, "");
  ConformanceOptions o = quick();
  o.device = TERSE_DEVICE_CUDA;
  o.device_index = 999;
  bool started = false;
  o.on_check_start = [&](std::string_view) { started = true; };
  try {
    checkCompressor(*open(kTestPluginDir, "test_lossy"), {}, o);
    ADD_FAILURE() << "device mode on CUDA device 999 ran";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
  }
  EXPECT_FALSE(started);
}

// Device 0 on a machine without one (or in a build without CUDA): the reason the runtime (or the build) gives.
TEST(ConformanceDevice, NoDeviceIsAClearError) {
  const std::string problem = conformanceDeviceProblem(TERSE_DEVICE_CUDA, 0);
  if (problem.empty()) GTEST_SKIP() << "this machine has a CUDA device: test_conformance_cuda runs the device suite";
  EXPECT_NE(problem.find("no CUDA device to run on"), std::string::npos) << problem;
  if (!cuda::builtWithCuda()) {
    EXPECT_NE(problem.find("this build has no CUDA"), std::string::npos) << problem;
  }
  ConformanceOptions o = quick();
  o.device = TERSE_DEVICE_CUDA;
  try {
    checkCompressor(*open(kTestPluginDir, "test_lossy"), {}, o);
    ADD_FAILURE() << "device mode without a device ran";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
  }
}

TEST(PayloadSizes, MeasuresEveryRound) {
  const auto lossy = measurePayloadSizes(*open(kTestPluginDir, "test_lossy"), {}, ConformanceShape::flat(1000));
  ASSERT_EQ(lossy.rounds.size(), 1u);
  EXPECT_EQ(lossy.rounds[0].max_output_bytes, 16u + 4000u);
  EXPECT_EQ(lossy.rounds[0].produced_bytes, 16u + 4000u);
  const auto rounds = measurePayloadSizes(*open(kTestPluginDir, "test_rounds"), {}, ConformanceShape::matrix(10, 100));
  ASSERT_EQ(rounds.rounds.size(), 2u);
  EXPECT_EQ(rounds.rounds[0].produced_bytes, 20u);
  EXPECT_EQ(rounds.rounds[1].produced_bytes, 16u + 4000u);
}

}  // namespace
}  // namespace terse

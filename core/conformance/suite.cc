// The conformance suite's registry and driver (conformance.h): the checks by name in the order they run, the run of
// them into a ConformanceReport (options validated first, prerequisites always run, later checks skipped when those
// leave nothing to check, every exception a FAIL), and the report's and shapes' methods.
#include "core/conformance/conformance.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/conformance/check_context.h"
#include "core/conformance/check_runner.h"
#include "core/conformance/checks.h"
#include "core/conformance/memory.h"
#include "core/conformance/message.h"

namespace terse {
namespace {

using conformance::cat;
using conformance::ConformanceMemory;
using conformance::Context;
using conformance::Outcome;

// ---- Check names, in run order.
constexpr std::string_view kInstantiate = "instantiate";
constexpr std::string_view kSizes = "sizes";
constexpr std::string_view kShapes = "shapes";
constexpr std::string_view kRoundTrip = "round_trip";
constexpr std::string_view kOutputSize = "output_size";
constexpr std::string_view kFiniteDecode = "finite_decode";
constexpr std::string_view kDeterministic = "deterministic";
constexpr std::string_view kZeroPadding = "zero_padding";
constexpr std::string_view kIdentity = "identity";
constexpr std::string_view kSharedSeed = "shared_seed";
constexpr std::string_view kAccumulate = "accumulate";
constexpr std::string_view kPurity = "decompress_purity";
constexpr std::string_view kSumAggregation = "sum_aggregation";
constexpr std::string_view kCustomReduce = "custom_reduce";
constexpr std::string_view kAllgatherAggregation = "allgather_aggregation";
constexpr std::string_view kMultiRound = "multi_round";
constexpr std::string_view kUnbiased = "unbiased";
constexpr std::string_view kWrongLength = "wrong_length_payloads";
constexpr std::string_view kWrongHeader = "wrong_header_payloads";
constexpr std::string_view kByteFlips = "byte_flip_payloads";
constexpr std::string_view kRandomPayloads = "random_payloads";
constexpr std::string_view kDeferredVerdicts = "deferred_verdicts";

using conformance::CheckFn;
struct CheckEntry {
  std::string_view name;
  CheckFn fn;
};
constexpr CheckEntry kChecks[] = {
    {kInstantiate, &conformance::checkInstantiate},
    {kSizes, &conformance::checkSizes},
    {kShapes, &conformance::checkShapes},
    {kRoundTrip, &conformance::checkRoundTrip},
    {kOutputSize, &conformance::checkOutputSize},
    {kFiniteDecode, &conformance::checkFiniteDecode},
    {kDeterministic, &conformance::checkDeterministic},
    {kZeroPadding, &conformance::checkZeroPadding},
    {kIdentity, &conformance::checkIdentity},
    {kSharedSeed, &conformance::checkSharedSeed},
    {kAccumulate, &conformance::checkAccumulate},
    {kPurity, &conformance::checkPurity},
    {kSumAggregation, &conformance::checkSumAggregation},
    {kCustomReduce, &conformance::checkCustomReduce},
    {kAllgatherAggregation, &conformance::checkAllgatherAggregation},
    {kMultiRound, &conformance::checkMultiRound},
    {kUnbiased, &conformance::checkUnbiased},
    {kWrongLength, &conformance::checkWrongLength},
    {kWrongHeader, &conformance::checkWrongHeader},
    {kByteFlips, &conformance::checkByteFlips},
    {kRandomPayloads, &conformance::checkRandomPayloads},
    {kDeferredVerdicts, &conformance::checkDeferredVerdicts},
};

}  // namespace

std::string_view checkStatusName(CheckStatus status) noexcept {
  switch (status) {
    case CheckStatus::kPass:
      return "PASS";
    case CheckStatus::kFail:
      return "FAIL";
    case CheckStatus::kSkip:
      return "SKIP";
  }
  return "?";
}

ConformanceShape ConformanceShape::flat(uint64_t numel) {
  ConformanceShape s;
  s.numel = numel;
  return s;
}

ConformanceShape ConformanceShape::matrix(int64_t rows, int64_t cols) {
  ConformanceShape s;
  s.numel = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  s.ndim = 2;
  s.shape = {rows, cols, 0, 0};
  return s;
}

std::string ConformanceShape::label() const {
  if (ndim == 0) return std::to_string(numel);
  std::string s;
  for (int d = 0; d < ndim; ++d) s += (d ? "x" : "") + std::to_string(shape[static_cast<std::size_t>(d)]);
  return s;
}

std::vector<ConformanceShape> defaultConformanceShapes() {
  return {ConformanceShape::flat(0),        ConformanceShape::flat(1),
          ConformanceShape::flat(1001),     ConformanceShape::flat((uint64_t{1} << 20) + 3),
          ConformanceShape::matrix(33, 31), ConformanceShape::matrix(300, 257)};
}

bool ConformanceReport::passed() const noexcept {
  return count(CheckStatus::kFail) == 0;
}

std::size_t ConformanceReport::count(CheckStatus status) const noexcept {
  return static_cast<std::size_t>(
      std::count_if(checks.begin(), checks.end(), [&](const CheckResult& r) { return r.status == status; }));
}

const CheckResult* ConformanceReport::find(std::string_view name) const noexcept {
  for (const auto& r : checks)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string_view> conformanceCheckNames() {
  std::vector<std::string_view> out;
  for (const auto& c : kChecks) out.push_back(c.name);
  return out;
}

ConformanceReport checkCompressor(const CompressorPlugin& plugin, const Params& params,
                                  const ConformanceOptions& options) {
  TERSE_CHECK(options.world_size >= 2, InvalidArgument,
              "conformance: world_size must be at least 2, got " << options.world_size);
  for (const auto& name : options.only) {
    const auto names = conformanceCheckNames();
    TERSE_CHECK(std::find(names.begin(), names.end(), name) != names.end(), InvalidArgument,
                "conformance: no check named '" << name << "'");
  }
  TERSE_CHECK(options.check_timeout_s >= 0, InvalidArgument,
              "conformance: check_timeout_s is seconds, 0 for no limit, got " << options.check_timeout_s);
  TERSE_CHECK(options.device == TERSE_DEVICE_HOST || options.device == TERSE_DEVICE_CUDA, InvalidArgument,
              "conformance: device must be host (0x1) or cuda (0x2), got " << options.device);
  TERSE_CHECK(options.device == TERSE_DEVICE_HOST || options.device_index >= 0, InvalidArgument,
              "conformance: a CUDA device index is 0 or more, got " << options.device_index);
  // Before any check runs: a machine that cannot run the device mode is the caller's problem to report (an error, not
  // a report of 18 SKIPs that a CI job would count as green).
  std::shared_ptr<ConformanceMemory> memory =
      options.device == TERSE_DEVICE_HOST ? conformance::hostMemory() : conformance::cudaMemory(options.device_index);
  ConformanceReport report;
  report.plugin = plugin.info().name;
  report.path = plugin.info().path.string();
  report.device = memory->describe();
  Context ctx{.plugin = plugin,
              .params = params,
              .options = options,
              .memory = memory,
              .instance = nullptr,
              .instantiated = false,
              .caps = {},
              .shapes = {},
              .round_trip_error = {},
              .next_tensor_id = 1};
  // Each check runs in a forked child on the host, so a plugin that crashes or hangs fails that check and the rest
  // still run (check_runner.h). The CUDA mode stays in this process: the parent already holds a CUDA context (the
  // device was probed and its memory set up above), and a child forked from a process with a CUDA context must not use
  // CUDA. Forking before any CUDA use would mean moving the device probe into a child and a fresh context per check
  // (a few hundred ms each, times 20 checks); a device fault is already a sticky CUDA error that fails the check and
  // leaves the process alive (memory.h), and crashes in the plugin's host code are what the host mode finds.
  const bool isolated = options.isolate && options.device == TERSE_DEVICE_HOST;
  std::string blocked;  // why the remaining checks cannot run
  for (const auto& entry : kChecks) {
    const bool prerequisite = entry.name == kInstantiate || entry.name == kSizes;
    if (!prerequisite && !options.only.empty() &&
        std::find(options.only.begin(), options.only.end(), entry.name) == options.only.end()) {
      continue;
    }
    if (options.on_check_start) options.on_check_start(entry.name);
    CheckResult result;
    result.name = std::string(entry.name);
    if (!blocked.empty()) {
      result.status = CheckStatus::kSkip;
      result.message = blocked;
    } else {
      Outcome o = isolated ? conformance::runCheckInChild(entry.fn, ctx, options.check_timeout_s)
                           : conformance::runCheckInProcess(entry.fn, ctx);
      result.status = o.status;
      result.message = std::move(o.message);
      if (entry.name == kInstantiate && !ctx.instantiated) {
        blocked = "not run: no usable instance (see instantiate)";
      } else if (entry.name == kSizes && ctx.shapes.empty()) {
        blocked = "not run: get_sizes accepted no shape (see sizes)";
      }
    }
    if (options.on_check_done) options.on_check_done(result);
    report.checks.push_back(std::move(result));
  }
  return report;
}

std::string conformanceDeviceProblem(uint32_t device, int device_index) {
  if (device == TERSE_DEVICE_HOST) return {};
  if (device != TERSE_DEVICE_CUDA) return cat("device must be host (0x1) or cuda (0x2), got ", device);
  return conformance::cudaMemoryProblem(device_index);
}

}  // namespace terse

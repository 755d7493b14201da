// The compressor conformance suite: drives one compressor plugin through the contract of compressor_v1.h and the
// payload rules of DESIGN.md section 4, in process, on the host, and reports every check as PASS, FAIL or SKIP with a
// message that says what was measured. `terse plugins check` and tests/conformance both run it, so a plugin author
// sees the same verdict the CI does.
//
// What it can and cannot see. Every plugin status becomes a terse::Error that the suite catches, and every buffer the
// plugin writes (output, decompress target, workspace, state, reduce output) sits between guard zones that are
// checked after each call, so a wrong answer or a write out of bounds is a FAIL, not a crash. On the host each check
// runs in a forked child process of its own (check_runner.h): a plugin that segfaults or aborts fails that check with
// "crashed with SIGSEGV (Segmentation fault)", one that loops past ConformanceOptions::check_timeout_s fails it naming
// the limit and the plugin call it hung in, and the remaining checks still run. The device mode runs in process
// (suite.cc says why), where a crash still takes the process: the CLI names each check before running it. An
// out-of-bounds *read* leaves no trace; the suite hands decompress its payloads in allocations of exactly the payload's
// size, so an AddressSanitizer build (the `asan` preset, run by scripts/test) reports such a read at the plugin's line
// (in the child, which then exits 1).
//
// Error bounds. The ABI has no field for a compressor's accuracy and should not: the bound depends on the parameters
// (top-k's ratio), the data and what the experimenter accepts. So the suite measures the relative error
// ||D(C(x)) - x|| / ||x|| on standard-normal inputs and checks it only against a bound the caller gives
// (ConformanceOptions::max_rel_error: the per-plugin table in tests/conformance, `--max-rel-error` on the CLI); without
// one it reports the number. The same holds for unbiasedness: E[D(C(x))] = x is required only when the caller says
// the plugin claims it, and the measured bias is reported either way.
//
// On a device (ConformanceOptions::device = TERSE_DEVICE_CUDA) the same checks run with every buffer the plugin sees
// (input, prev, output, decompress target, workspace, state, reduce output) in device memory on a stream the suite
// owns, each written buffer between guard zones on the device; results and guards are copied back to the host after
// each call and judged exactly as on the host (memory.h says what that can and cannot see).
//
// The files of this folder (library terse::conformance), one job each: suite.cc runs the checks in order into the
// report, each through check_runner (in a child process or in this one); contract_checks, output_checks,
// aggregation_checks and payload_fuzzing hold the checks (checks.h lists them, check_context.h is what they share);
// simulation is the in-process exchange of payloads between ranks that they drive; memory puts every buffer on the host
// or a device between guard zones; vectors and message are the inputs, measures and wording the checks share;
// payload_sizes answers measurePayloadSizes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/plugin/compressor.h"
#include "core/plugin/compressor_plugin.h"
#include "terse/types_v1.h"

namespace terse {

enum class CheckStatus { kPass, kFail, kSkip };
std::string_view checkStatusName(CheckStatus status) noexcept;  // "PASS", "FAIL", "SKIP"

struct CheckResult {
  std::string name;  // one of conformanceCheckNames()
  CheckStatus status = CheckStatus::kSkip;
  std::string message;  // what was measured, or why it failed or was skipped
};

// A tensor the suite compresses: numel elements, flat (ndim 0) or with a shape (a matrix for low-rank plugins).
struct ConformanceShape {
  uint64_t numel = 0;
  int ndim = 0;
  std::array<int64_t, 4> shape{};

  static ConformanceShape flat(uint64_t numel);
  static ConformanceShape matrix(int64_t rows, int64_t cols);
  std::string label() const;  // "1001", "300x257"
};

// The default list: the empty tensor, one element, an odd count, a count just past a power of two (2^20 + 3, which
// catches tail loops and block splits), and two matrices with odd sides (33x31, small enough to fuzz, and 300x257).
std::vector<ConformanceShape> defaultConformanceShapes();

struct ConformanceOptions {
  // Keys every random choice: the inputs and the run seed the simulated ranks derive their info.seed from (with the
  // core's own derivation, core/compress/seed.h). Same seed, same report.
  uint64_t seed = 20240611;
  // Simulated ranks for the aggregation checks; at least 2 (3 folds a CUSTOM reduce on both a raw and a reduced side).
  int world_size = 3;
  std::vector<ConformanceShape> shapes = defaultConformanceShapes();
  // Fails round_trip when the measured relative error on a shape of at least kRoundTripMinNumel elements exceeds it.
  std::optional<double> max_rel_error;
  // finite_decode feeds inputs up to |x| = 3e38 and requires finite decodes. A plugin whose documented range is smaller
  // (an 8-bit float cast) gives its largest finite input here; a SUM wire of f16 or bf16 already limits it to what
  // that dtype holds.
  std::optional<double> finite_input_limit;
  // The plugin claims E[D(C(x))] = x: unbiased then fails when a test that catches a 5% bias with 99% power rejects
  // it (unbiasedness.cc states the test and its sample size).
  bool claims_unbiased = false;
  // The most steps (compressions per rank, each a fresh random draw) the unbiasedness check may take per input; the
  // number it takes follows the plugin's noise. A claimed-unbiased plugin that would need more fails, unconfirmed.
  // The noisiest built-in, random-k at 1%, needs about 3,500.
  int unbiased_steps = 20000;
  // Elements of each of the unbiasedness check's inputs, >= 64. The stated power is for the default; the suite's own
  // tests use fewer to stay fast under sanitizers (a y_t summed over fewer elements is noisier, so a claimed-unbiased
  // plugin may need more steps, never fewer).
  uint64_t unbiased_numel = uint64_t{1} << 14;
  // Random byte strings per payload in random_payloads.
  int fuzz_payloads = 300;
  // Runs only the checks named here (empty: all). Checks a named one depends on still run first, as instantiate.
  std::vector<std::string> only;
  // Where the buffers handed to the plugin live: TERSE_DEVICE_HOST (host memory, stream NULL) or TERSE_DEVICE_CUDA
  // (memory of CUDA device `device_index`, a stream of the suite's own). A plugin whose caps do not advertise the
  // device is not checked there: instantiate says so and the rest is SKIP.
  uint32_t device = TERSE_DEVICE_HOST;
  int device_index = 0;
  // Each check in a child process of its own (host memory only; the CUDA mode always runs in process). Off: one process
  // for all, for a debugger.
  bool isolate = true;
  // Seconds a check's child may run before it is stopped and the check fails, naming the plugin call it was in (0: no
  // limit). The slowest built-in check takes about a second; 60 leaves room for sanitizer builds and loaded CI machines
  // while a plugin that hangs in every check still ends within minutes.
  double check_timeout_s = 60;
  // Called before and after each check, e.g. to print progress: a crash then shows which check it was in.
  std::function<void(std::string_view name)> on_check_start;
  std::function<void(const CheckResult&)> on_check_done;
};

// Round-trip bounds apply from this many elements on: on tiny tensors the error is dominated by how a count rounds
// (top-k at 10% of one element keeps all or nothing), which says nothing about the compressor.
inline constexpr uint64_t kRoundTripMinNumel = 1000;

struct ConformanceReport {
  std::string plugin;  // the declared name
  std::string path;    // the file that was checked
  std::string device;  // where its buffers lived: "host memory", "CUDA device 0 (NVIDIA H100 80GB HBM3, sm_90)"
  std::vector<CheckResult> checks;

  bool passed() const noexcept;  // no FAIL (SKIP is not a failure)
  std::size_t count(CheckStatus status) const noexcept;
  const CheckResult* find(std::string_view name) const noexcept;
};

// The checks in the order they run; the message of each result says how it decided.
std::vector<std::string_view> conformanceCheckNames();

// Runs the suite on f32 tensors in options.device's memory. Never throws for anything the plugin does (every failure
// is a FAIL in the report); throws InvalidArgument for malformed options (world_size < 2, an unknown name in `only`,
// a device that is neither host nor cuda, a negative device index) and Unsupported, with conformanceDeviceProblem's
// text, when options.device is CUDA and this build or this machine cannot provide that device.
ConformanceReport checkCompressor(const CompressorPlugin& plugin, const Params& params,
                                  const ConformanceOptions& options = {});

// Why the suite cannot run on `device` / `device_index` in this process ("no CUDA device to run on: this build has no
// CUDA ...", "CUDA device 2 asked for, but this machine has 1 device"), or empty when it can. Never throws; for a
// front end that wants to say so before it loads anything.
std::string conformanceDeviceProblem(uint32_t device, int device_index);

// What one step of the plugin sends for a tensor, per round: get_sizes' bound and the bytes compress actually wrote
// for a standard-normal input (one rank; round r > 0 gets round r - 1's payload as its aggregate, as the SUM or
// CUSTOM path would deliver it for one rank). For `terse plugins show --numel`.
struct RoundPayload {
  int round = 0;
  uint64_t max_output_bytes = 0;
  uint64_t produced_bytes = 0;
  uint64_t sum_header_bytes = 0;  // SUM: the leading bytes that do not travel (compressor_v1.h)
};
struct PayloadSizes {
  CompressorCaps caps;
  std::vector<RoundPayload> rounds;
};
// Throws the terse::Error of the failing call (init, caps, sizes, compress).
PayloadSizes measurePayloadSizes(const CompressorPlugin& plugin, const Params& params, const ConformanceShape& shape,
                                 uint64_t seed = 20240611);

}  // namespace terse

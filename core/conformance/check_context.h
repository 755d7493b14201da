// What every conformance check is handed and hands back: the run's Context (plugin, options, memory, the instance and
// the shapes the first checks established) and an Outcome. Shared by the check files and the driver (suite.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/conformance/conformance.h"
#include "core/conformance/memory.h"
#include "core/conformance/simulation.h"
#include "core/conformance/vectors.h"

namespace terse::conformance {

// Shapes up to this size are used by the checks that compress many times or on several ranks; the larger defaults
// (2^20 + 3) run once per rank in `shapes`, `round_trip` and `output_size`, which is where their size matters.
inline constexpr uint64_t kModerateNumel = uint64_t{1} << 17;

struct Outcome {
  CheckStatus status;
  std::string message;
};
inline Outcome pass(std::string m) {
  return {CheckStatus::kPass, std::move(m)};
}
inline Outcome fail(std::string m) {
  return {CheckStatus::kFail, std::move(m)};
}
inline Outcome skip(std::string m) {
  return {CheckStatus::kSkip, std::move(m)};
}

struct Context {
  const CompressorPlugin& plugin;
  const Params& params;
  const ConformanceOptions& options;
  std::shared_ptr<ConformanceMemory> memory;  // where every buffer of every check lives
  std::shared_ptr<Compressor> instance;
  // instantiate succeeded: a check run in a child process (check_runner.h) finds `instance` empty and makes its own.
  bool instantiated = false;
  CompressorCaps caps;
  std::vector<ConformanceShape> shapes;  // those get_sizes accepted
  std::map<std::string, double> round_trip_error;
  uint64_t next_tensor_id = 1;  // also carried back from a child, so ids never repeat within a run

  uint64_t tensorId() { return next_tensor_id++; }
  Simulation sim(const ConformanceShape& s, int world);
  uint64_t inputSeed(const ConformanceShape& s, uint64_t purpose, int rank = 0) const;

  std::vector<ConformanceShape> moderate() const;
  // The shape the statistical and fuzzing checks use: at least kRoundTripMinNumel elements if possible, moderate, flat
  // before shaped.
  std::optional<ConformanceShape> representative() const;
  // The representative shape and every moderate matrix: a low-rank compressor runs its real algorithm only on
  // matrices (a flat tensor may pass through), so checks of behaviour look at both.
  std::vector<ConformanceShape> probes() const;
  // The smallest nonempty shape: small payloads get every byte flipped.
  std::optional<ConformanceShape> smallest() const;
};

// "sum (wire f16)", "allgather": how skip and pass messages name the plugin's aggregation.
std::string aggregationText(const CompressorCaps& c);

// The ranks' inputs for an aggregation check: independent normals.
struct RankInputs {
  std::vector<Floats> values;
  std::vector<const Floats*> pointers;
};
RankInputs rankInputs(const Context& c, const ConformanceShape& shape, uint64_t purpose, int world);

}  // namespace terse::conformance

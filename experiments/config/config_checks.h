// Internal to experiments/config (not installed, not for other targets): what loading and overrides (config.cc) and
// validation (validate.cc) share -- the message helpers, the check collector, and the checks an override re-runs.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "experiments/config/config.h"

namespace terse::experiments {

// A terse::Error's message without its "[core/...:123] " tag: in a config message the tag is noise, the config's own
// file:line is what the reader needs.
inline std::string untagged(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m.front() == '[') {
    if (auto end = m.find("] "); end != std::string::npos) return m.substr(end + 2);
  }
  return m;
}

inline std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

template <typename T>
std::string joined(const std::vector<T>& items) {
  std::ostringstream os;
  for (std::size_t i = 0; i < items.size(); ++i) os << (i ? ", " : "") << items[i];
  return os.str();
}

// A collectives.<field> algorithm (allreduce, allgather): what `parse` makes of `value`, or nullopt with `problem` set
// to what is wrong with it, in the same words for the validation's list and hostCommOptions' error.
template <class Parse>
auto parseCollective(const std::string& value, Parse parse, std::string_view choices, std::string& problem) {
  auto algo = parse(value);
  if (!algo) problem = " '" + value + "' is not one of " + std::string(choices);
  return algo;
}

// Collects "PATH message" strings; the path is everything before the first ' ' or ':'.
class Checks {
 public:
  std::ostringstream& fail(const std::string& path) {
    flush();
    pending_ = true;
    os_.str("");
    os_ << path;
    return os_;
  }
  std::vector<std::string> take() {
    flush();
    return std::move(out_);
  }

 private:
  void flush() {
    if (pending_) out_.push_back(os_.str());
    pending_ = false;
  }
  std::ostringstream os_;
  bool pending_ = false;
  std::vector<std::string> out_;
};

// A study's plugin checks by spec (which field, name, parameters) -> their messages. Loading and instantiating a plugin
// costs about half a millisecond, and a study's variants mostly share their plugins: loadStudyText checks each
// distinct spec once instead of once per variant.
using PluginCheckMemo = std::unordered_map<std::string, std::vector<std::string>>;
// validateExperiment (config.h), with the plugin checks looked up in `memo` (null: none).
std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options, PluginCheckMemo* memo);

// A duration string (comm::parseDuration) no longer than max_s, and above 0 when `positive`. The limit keeps every
// conversion of it (to a clock's int64 nanoseconds, to milliseconds) in range; the parser refuses not-a-number and
// infinity.
void checkDuration(Checks& c, const std::string& path, const std::string& text, double max_s, bool positive);
// A bandwidth string (comm::parseBandwidth): unlimited, or a rate in [kMinBandwidthBps, kMaxBandwidthBps].
void checkBandwidth(Checks& c, const std::string& path, const std::string& text);

// link.overrides' ranks against the workers.
void checkLinkRanks(Checks& c, const Experiment& e);
// worker_settings against the workers and the mode; the entries' own ranges are the table's.
void checkWorkerSettings(Checks& c, const Experiment& e);
// Repeats: at most limits::kSeeds, none twice, and `seed`, when given beside them, one of them.
void checkSeeds(Checks& c, const Experiment& e);

}  // namespace terse::experiments

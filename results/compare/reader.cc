// Reading result folders back (reader.h): finds variant folders, reads status.json, provenance.json and
// metrics.jsonl; config.textproto is config_reader.cc's.
#include "results/compare/reader.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>

#include "results/compare/reader_detail.h"
#include "results/result_writer.h"

namespace terse::results {

namespace fs = std::filesystem;
using detail::readFile;

namespace {

// A results file but metrics.jsonl is read whole: a config, a status or a provenance of a few KB. The cap keeps a
// wrong file (a dataset, a core dump) from being read into memory.
constexpr std::uintmax_t kMaxFileBytes = 256u << 20;
// metrics.jsonl is read a line at a time, since a long run's stream has no bound a reader could set in advance (a
// parameter server's record at 1,024 workers holds ~70 KB of per-rank counters, so 256 MiB is ~3,600 evaluations).
// No record comes near this line length; a longer line (junk without newlines) is skipped in bounded memory.
constexpr std::size_t kMaxLineBytes = std::size_t{16} << 20;
// Bad lines reported one by one per file; the rest are counted in one warning.
constexpr int kMaxLineWarnings = 20;
// What is read of one metrics.jsonl at most: ~30,000 records of a parameter server at 1,024 workers, seconds to read;
// a file larger than any run writes (a hole of terabytes) must not keep compare reading for hours.
constexpr std::uint64_t kMaxMetricsBytes = std::uint64_t{2} << 30;

// A stream's lines, without their newlines, holding at most kMaxLineBytes of one.
class LineReader {
 public:
  explicit LineReader(std::istream& in, std::uint64_t limit) : in_(in), left_(limit) {}
  // Whether the limit stopped the reading before the stream's end.
  bool cut() const { return cut_; }

  // The next line into `line`; false when the stream has none left. `had_newline` is false for a last line cut
  // short, `oversized` true for a line longer than kMaxLineBytes (`line` then holds its first kMaxLineBytes).
  bool next(std::string& line, bool& had_newline, bool& oversized) {
    line.clear();
    had_newline = false;
    oversized = false;
    bool any = false;
    for (;;) {
      if (pos_ == end_) {
        if (left_ == 0) {
          cut_ = in_.peek() != std::char_traits<char>::eof();
          if (!cut_) return any;  // the file ends at the limit: its last line, without a newline, is a torn one
          return false;           // a line the limit cut short is not a line
        }
        in_.read(buf_.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(buf_.size(), left_)));
        end_ = static_cast<std::size_t>(in_.gcount());
        left_ -= end_;
        pos_ = 0;
        if (end_ == 0) return any;
      }
      any = true;
      const char* start = buf_.data() + pos_;
      const char* stop = buf_.data() + end_;
      const char* nl = std::find(start, stop, '\n');
      const auto n = static_cast<std::size_t>(nl - start);
      if (!oversized) {
        const std::size_t room = kMaxLineBytes - line.size();
        oversized = n > room;
        line.append(start, std::min(n, room));
      }
      pos_ += n;
      if (nl != stop) {
        ++pos_;
        had_newline = true;
        return true;
      }
    }
  }

 private:
  std::istream& in_;
  std::uint64_t left_;
  bool cut_ = false;
  std::vector<char> buf_ = std::vector<char>(std::size_t{1} << 16);
  std::size_t pos_ = 0, end_ = 0;
};

std::string shortText(std::string_view s, std::size_t n = 60) {
  std::string out(s.substr(0, n));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  if (s.size() > n) out += "...";
  return out;
}

}  // namespace

namespace detail {

std::optional<std::string> readFile(const fs::path& path, std::vector<std::string>& warnings) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    warnings.push_back(path.string() + ": cannot read: " + ec.message());
    return std::nullopt;
  }
  if (size > kMaxFileBytes) {
    warnings.push_back(path.string() + ": " + std::to_string(size) + " bytes, more than a results file can be (" +
                       std::to_string(kMaxFileBytes) + "); skipped");
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    warnings.push_back(path.string() + ": cannot open");
    return std::nullopt;
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace detail

namespace {

bool isRunDir(const fs::path& dir) {
  std::error_code ec;
  for (auto name : {kConfigFile, kProvenanceFile, kMetricsFile, kStatusFile}) {
    if (fs::is_regular_file(dir / std::string(name), ec)) return true;
  }
  return false;
}

// "2026-12-06T21:19:19Z" (isoTimeUtc) as seconds since the epoch.
std::optional<std::time_t> parseIsoUtc(const std::string& text) {
  std::tm tm{};
  const char* end = ::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return ::timegm(&tm);
}

// When a run folder's results were last written, in seconds since the epoch: status.json's "updated" (a copy keeps
// it, where cp, git and tar without times reset the files' times); for a run still "running" (or killed), whose
// status.json was written at its start, the later of that and metrics.jsonl's time. nullopt without a readable time.
std::optional<std::time_t> writtenAt(const fs::path& dir) {
  std::vector<std::string> ignored;
  const auto text = readFile(dir / std::string(kStatusFile), ignored);
  const auto obj = text ? parseJsonObject(*text, nullptr) : std::nullopt;
  if (!obj) return std::nullopt;
  std::optional<std::time_t> at;
  for (const char* key : {"updated", "started"})
    if (!at) at = parseIsoUtc(getString(*obj, key).value_or(""));
  if (at && getString(*obj, "state") == kStateRunning) {
    std::error_code ec;
    const auto t = fs::last_write_time(dir / std::string(kMetricsFile), ec);
    if (!ec) at = std::max(*at, std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(t)));
  }
  return at;
}

std::string utcText(std::time_t t) {
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

// When a run folder's results were last written: the latest of its result files' times.
fs::file_time_type lastWritten(const fs::path& dir) {
  fs::file_time_type latest = fs::file_time_type::min();
  std::error_code ec;
  for (auto name : {kConfigFile, kProvenanceFile, kMetricsFile, kStatusFile}) {
    const auto t = fs::last_write_time(dir / std::string(name), ec);
    if (!ec) latest = std::max(latest, t);
  }
  return latest;
}

std::string timeText(fs::file_time_type t) {
  return utcText(std::chrono::system_clock::to_time_t(std::chrono::file_clock::to_sys(t)));
}

std::string valueText(const Json& v) {
  if (v.is_string()) return "\"" + shortText(v.get<std::string>(), 30) + "\"";
  if (!v.is_number()) return shortText(dumpJson(v), 30);
  std::ostringstream s;
  s << v.get<double>();
  return s.str();
}

// Reads metrics.jsonl: one EvalPoint per good line; every bad line is a warning naming file and line.
// A parameter-server record from before push_bytes_per_worker (result_writer.h) has wire_bytes_per_worker = the mean
// of worker<w>_bytes_out, the pushes alone: the pulls, as large as the parameters, were left out, which made a dense
// parameter server look 2(W - 1) / W times cheaper than allreduce instead of dearer. Its per-worker counts hold both
// directions, so its wire bytes are recounted as records now count them (its payload bytes stay the pushes': a pull's
// body is not recorded).
void recountPulls(const Json& record, EvalPoint& p, RunData& run) {
  double out = 0, in = 0;
  int outs = 0, ins = 0;
  for (const auto& [key, value] : record.items()) {
    if (!key.starts_with("worker")) continue;
    const std::size_t digits = key.find_first_not_of("0123456789", 6);
    if (digits == 6 || digits == std::string::npos) continue;
    const std::string_view rest = std::string_view(key).substr(digits);
    const bool is_out = rest == "_bytes_out";
    if (!is_out && rest != "_bytes_in") continue;
    const auto v = getNumber(record, key);
    if (!v || !std::isfinite(*v) || *v < 0) return;  // a damaged record keeps what it says
    (is_out ? out : in) += *v;
    ++(is_out ? outs : ins);
  }
  if (outs == 0 || outs != ins) return;
  p.push_bytes = out / outs;
  p.pull_bytes = in / ins;
  p.wire_bytes = p.push_bytes + p.pull_bytes;
  run.pulls_recounted = true;
}

void readMetrics(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    warnings.push_back(path.string() + ": missing; the variant has no records");
    return;
  }
  // A FIFO or a device (a link to /dev/zero) would never end: only a regular file is read.
  if (!fs::is_regular_file(path, ec)) {
    warnings.push_back(path.string() + ": not a regular file; the variant has no records");
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    warnings.push_back(path.string() + ": cannot open");
    return;
  }
  const std::string file = path.string();
  // A file of bad lines must not make a warning per line: the first kMaxLineWarnings, then a count.
  int line_warnings = 0, unreported = 0;
  auto warn = [&](std::string message) {
    if (line_warnings++ < kMaxLineWarnings)
      warnings.push_back(std::move(message));
    else
      ++unreported;
  };
  LineReader lines(in, kMaxMetricsBytes);
  std::string text;
  bool has_newline = false, oversized = false;
  int line_no = 0;
  while (lines.next(text, has_newline, oversized)) {
    ++line_no;
    const std::string_view line = text;
    const std::string where = file + ":" + std::to_string(line_no) + ": ";
    if (oversized) {
      warn(where + "a line longer than " + std::to_string(kMaxLineBytes) +
           " bytes, no record; skipped: " + shortText(line));
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    std::string why;
    auto obj = parseJsonObject(line, &why);
    if (!obj) {
      // The writer flushes whole lines, so a line without its newline at the end is a write cut short.
      warn(where + (has_newline ? "not a JSON object (" + why + ")" : "torn last line (no newline)") +
           ", skipped: " + shortText(line));
      continue;
    }
    EvalPoint p;
    p.line = line_no;
    std::string bad;
    auto required = [&](std::string_view key, double lo, double hi) -> double {
      const Json* it = findMember(*obj, key);
      if (it == nullptr) {
        if (bad.empty()) bad = "no '" + std::string(key) + "'";
        return 0;
      }
      const auto v = getNumber(*obj, key);
      if (!v || !std::isfinite(*v) || *v < lo || *v > hi) {
        if (bad.empty()) {
          std::ostringstream s;
          s << "'" << key << "' is " << valueText(*it) << ", must be a number in [" << lo << ", " << hi << "]";
          bad = s.str();
        }
        return 0;
      }
      return *v;
    };
    // Optional fields: absent is normal (older writers, sync runs without staleness); present but not a finite
    // non-negative number is reported and ignored.
    auto optional = [&](std::string_view key) -> double {
      const Json* it = findMember(*obj, key);
      if (it == nullptr || it->is_null()) return std::nan("");
      const auto v = getNumber(*obj, key);
      if (!v || !std::isfinite(*v) || *v < 0) {
        warn(where + "'" + std::string(key) + "' is " + valueText(*it) + ", not a non-negative number; ignored");
        return std::nan("");
      }
      return *v;
    };
    const double step = required("step", 0, 9.007199254740992e15);
    p.accuracy = required("test_accuracy", 0, 1);
    p.wire_bytes = required("wire_bytes_per_worker", 0, 1.8446744073709552e19);
    if (!bad.empty()) {
      warn(where + bad + "; record skipped");
      continue;
    }
    p.step = static_cast<int64_t>(step);
    p.epoch_progress = optional("epoch_progress");
    p.test_loss = optional("test_loss");
    p.payload_bytes = optional("payload_bytes_per_worker");
    p.control_bytes = optional("control_bytes_per_worker");
    p.negotiation_rounds = optional("negotiation_rounds_per_worker");
    p.wall_s = optional("wall_s");
    p.compute_s = optional("compute_s_per_step");
    p.compress_s = optional("compress_s_per_step");
    p.decompress_s = optional("decompress_s_per_step");
    p.comm_s = optional("comm_s_per_step");
    p.exposed_comm_s = optional("exposed_comm_s_per_step");
    p.step_s = optional("step_s_per_step");
    p.push_bytes = optional(kPushBytesKey);
    p.pull_bytes = optional(kPullBytesKey);
    if (std::isnan(p.push_bytes) && std::isnan(p.pull_bytes)) recountPulls(*obj, p, run);
    p.pull_residual = optional(kPullResidualKey);
    p.staleness_mean = optional(kStalenessMeanKey);
    p.staleness_max = optional(kStalenessMaxKey);
    p.staleness_hist_overflow = optional(kStalenessHistOverflowKey);
    p.staleness_buckets = optional(kStalenessBucketsKey);
    if (std::isnan(p.staleness_buckets)) p.staleness_buckets = static_cast<double>(kLegacyStalenessHistBuckets);
    const std::string hist_prefix(kStalenessHistPrefix);
    for (const auto& [key, value] : obj->items()) {
      if (key.rfind(hist_prefix, 0) != 0 || key == kStalenessHistOverflowKey) continue;
      const std::string tau = key.substr(hist_prefix.size());
      const bool digits = !tau.empty() && tau.size() <= 9 && tau.find_first_not_of("0123456789") == std::string::npos;
      const double count = optional(key);
      if (!digits) {
        warn(where + "'" + key + "': a staleness bucket must be " + hist_prefix +
             "<tau> with tau a non-negative integer; ignored");
      } else if (!std::isnan(count)) {
        p.staleness_hist[std::stoll(tau)] = count;
      }
    }
    if (!run.points.empty()) {
      const EvalPoint& prev = run.points.back();
      // Two runs' records mixed in one file, or a file edited by hand: the curves would be nonsense.
      if (p.step <= prev.step) {
        warn(where + "step " + std::to_string(p.step) + " does not follow step " + std::to_string(prev.step) +
             " (line " + std::to_string(prev.line) + "); record skipped");
        continue;
      }
      if (p.wire_bytes < prev.wire_bytes) {
        std::ostringstream s;
        s << where << "wire_bytes_per_worker " << p.wire_bytes << " is less than the previous record's "
          << prev.wire_bytes << " (cumulative counters never decrease); record skipped";
        warn(s.str());
        continue;
      }
    }
    run.points.push_back(std::move(p));
  }
  if (unreported > 0)
    warnings.push_back(file + ": " + std::to_string(unreported) + " more bad line(s) or field(s) after the first " +
                       std::to_string(kMaxLineWarnings) + " reported; skipped likewise");
  if (lines.cut())
    warnings.push_back(file + ": larger than any run writes; read its first " + std::to_string(kMaxMetricsBytes) +
                       " bytes, the rest left out");
}

void readStatus(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  run.state = "unknown";
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    warnings.push_back(path.string() + ": missing; state unknown");
    return;
  }
  auto text = readFile(path, warnings);
  if (!text) return;
  std::string why;
  auto obj = parseJsonObject(*text, &why);
  const auto state = obj ? getString(*obj, "state") : std::nullopt;
  if (!state) {
    warnings.push_back(path.string() + ":1: not a status object with a \"state\" string" +
                       (obj ? "" : " (" + why + ")") + "; state unknown: " + shortText(*text));
    return;
  }
  if (*state != kStateCompleted && *state != kStateFailed && *state != kStateRunning) {
    warnings.push_back(path.string() + ":1: unknown state \"" + shortText(*state, 30) + "\"; state unknown");
    return;
  }
  run.state = *state;
  run.error = getString(*obj, "error").value_or("");
  // Only a process of this host can be asked, and only whether it is gone: a pid in use again reads as running, as
  // before the pid was recorded.
  const std::optional<double> pid = getNumber(*obj, "pid");
  if (run.state == kStateRunning && pid && *pid >= 1 && *pid <= 4194304 && *pid == std::floor(*pid) &&
      getString(*obj, "host") == hostName()) {
    // EPERM: the process exists, another user's. Where the writer recorded which process the pid named (boot id and
    // start ticks, result_writer.h), another boot or another start means the pid is another process's now (pids
    // restart with a container or a reboot): the run's own is gone. A status.json without them is taken at its pid.
    const auto p = static_cast<pid_t>(*pid);
    const std::optional<std::string> boot = getString(*obj, "boot_id");
    const std::optional<double> ticks = getNumber(*obj, "pid_start");
    const std::optional<unsigned long long> now_ticks = processStartTicks(p);
    const bool reused = (boot && !boot->empty() && *boot != bootId()) ||
                        (ticks && now_ticks && static_cast<double>(*now_ticks) != *ticks);
    if (reused)
      run.gone_pid = p;
    else if (::kill(p, 0) == 0 || errno == EPERM)
      run.live_pid = p;
    else if (errno == ESRCH)
      run.gone_pid = p;
  }
}

void readProvenance(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    // A run that failed during setup writes its provenance late or never; only say so for the others.
    if (run.state != kStateFailed) warnings.push_back(path.string() + ": missing");
    return;
  }
  auto text = readFile(path, warnings);
  if (!text) return;
  std::string error;
  auto json = parseJsonObject(*text, &error);
  if (!json) {
    warnings.push_back(path.string() + ": not a JSON object (" + error + "); ignored");
    return;
  }
  run.provenance = std::move(*json);
  run.simulated = getString(*run.provenance, "clock") == "simulated";
  // What actually loaded beats the name the config asked for (a path, say).
  if (const Json* plugins = findMember(*run.provenance, "plugins"); plugins && plugins->is_array()) {
    for (const auto& p : *plugins) {
      const auto name = getString(p, "name");
      if (getString(p, "kind") == "compressor" && !getString(p, "role") && name && !name->empty()) {
        run.compressor = *name;
        break;
      }
    }
  }
}

// The kernel times of a simulated run's table (calibrationWarnings compares them across a study's runs).
void readCalibration(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!run.simulated || !fs::exists(path, ec)) return;
  auto text = readFile(path, warnings);
  if (!text) return;
  std::string error;
  const auto json = parseJsonObject(*text, &error);
  const Json* seconds = json ? findMember(*json, "seconds") : nullptr;
  if (seconds == nullptr || !seconds->is_object()) {
    warnings.push_back(path.string() + ": not a calibration table (" + (json ? "no \"seconds\" object" : error) +
                       "); ignored");
    return;
  }
  for (const auto& [key, value] : seconds->items())
    if (value.is_number()) run.calibration[key] = value.get<double>();
}

}  // namespace

RunData loadRun(const fs::path& dir, std::vector<std::string>& warnings) {
  RunData run;
  run.dir = dir;
  run.variant = dir.filename().string();
  run.study = dir.parent_path().filename().string();
  readStatus(dir / std::string(kStatusFile), run, warnings);
  detail::readConfig(dir / std::string(kConfigFile), run, warnings);
  readProvenance(dir / std::string(kProvenanceFile), run, warnings);
  readCalibration(dir / "calibration.json", run, warnings);
  readMetrics(dir / std::string(kMetricsFile), run, warnings);
  // A variant may itself be named seed-3; its config then has no `seeds` and it stays a variant of its study.
  const std::string name = dir.filename().string();
  const std::string prefix = "seed-";
  const std::string digits = name.substr(std::min(name.size(), prefix.size()));
  if (name.rfind(prefix, 0) == 0 && !digits.empty() && digits.size() <= 19 &&
      digits.find_first_not_of("0123456789") == std::string::npos && (run.config_lists_seeds || !run.has_config)) {
    run.repeat_seed = std::stoull(digits);
    run.variant = dir.parent_path().filename().string();
    run.study = dir.parent_path().parent_path().filename().string();
  }
  if (run.state == kStateFailed)
    warnings.push_back(dir.string() + ": the run failed" + (run.error.empty() ? "" : ": " + shortText(run.error, 200)) +
                       "; shown with its " + std::to_string(run.points.size()) + " record(s)");
  else if (run.state == kStateRunning && run.gone_pid != 0)
    warnings.push_back(
        dir.string() + ": status says running, but its process (pid " + std::to_string(run.gone_pid) +
        " on this host) is gone: killed without a word (SIGKILL, the out-of-memory killer); shown with " + "its " +
        std::to_string(run.points.size()) + " record(s)");
  else if (run.state == kStateRunning && run.live_pid != 0)
    warnings.push_back(dir.string() + ": still running (pid " + std::to_string(run.live_pid) +
                       " on this host); shown "
                       "with its " +
                       std::to_string(run.points.size()) + " record(s) so far");
  else if (run.state == kStateRunning)
    warnings.push_back(dir.string() + ": status says running (still running, or killed); shown with its " +
                       std::to_string(run.points.size()) + " record(s)");
  return run;
}

namespace {

// Runs of one study and variant from different results roots (the same study run in-process and under tcp, or before
// and after a change) would be rows of one name that no reader could tell apart, and the first would be taken for the
// baseline. Each such run's variant gets the part of its root's path that tells it from the others: "dense (res-tcp)";
// bare_variant keeps the name (--baseline matches it where it is not ambiguous). A run's root is the folder above its
// study's.
void labelRunsOfOneNameApart(std::vector<RunData>& runs, std::vector<std::string>& warnings) {
  auto canonical = [](const fs::path& p) {
    std::error_code ec;
    fs::path out = fs::weakly_canonical(p.empty() ? fs::path(".") : p, ec);
    return ec ? fs::absolute(p.empty() ? fs::path(".") : p, ec).lexically_normal() : out;
  };
  // A variant's folder: the run's, or its parent for a repeat (its seeds are one variant's). Two folders of one study
  // and variant name collide, whatever seeds each holds.
  std::map<std::pair<std::string, std::string>, std::vector<std::size_t>> by_name;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    runs[i].bare_variant = runs[i].variant;
    by_name[{runs[i].study, runs[i].variant}].push_back(i);
  }
  for (const auto& [key, indices] : by_name) {
    std::set<fs::path> folders;
    for (const std::size_t i : indices)
      folders.insert(canonical(runs[i].repeat_seed ? runs[i].dir.parent_path() : runs[i].dir));
    if (folders.size() < 2) continue;
    std::vector<std::vector<std::string>> roots;  // each root's components, last first
    for (const std::size_t i : indices) {
      const fs::path study_dir =
          runs[i].repeat_seed ? runs[i].dir.parent_path().parent_path() : runs[i].dir.parent_path();
      std::vector<std::string> parts;
      for (const auto& part : canonical(canonical(study_dir).parent_path()))
        if (!part.empty()) parts.push_back(part.string());  // a trailing separator's part is empty
      std::reverse(parts.begin(), parts.end());
      roots.push_back(std::move(parts));
    }
    std::vector<std::string> labels;
    for (std::size_t a = 0; a < roots.size(); ++a) {
      // The fewest trailing components of this root that no other root of the group ends in.
      std::size_t take = 1;
      for (; take < roots[a].size(); ++take) {
        bool unique = true;
        for (std::size_t b = 0; b < roots.size() && unique; ++b) {
          if (b == a) continue;
          const std::size_t n = std::min(take, roots[b].size());
          const bool same_root = roots[b] == roots[a];
          unique = same_root || n < take || !std::equal(roots[a].begin(), roots[a].begin() + take, roots[b].begin());
        }
        if (unique) break;
      }
      std::string label;
      for (std::size_t k = std::min(take, roots[a].size()); k-- > 0;)
        label += (label.empty() || label == "/" ? "" : "/") + roots[a][k];
      labels.push_back(label.empty() ? std::string("/") : label);
    }
    for (std::size_t k = 0; k < indices.size(); ++k) runs[indices[k]].variant += " (" + labels[k] + ")";
    warnings.push_back("study '" + key.first + "', variant '" + key.second +
                       "': runs of that name from several results folders; their rows are labelled by the folder");
  }
}

}  // namespace

std::vector<RunData> loadRuns(const std::vector<fs::path>& paths, std::vector<std::string>& warnings) {
  std::vector<fs::path> dirs;
  std::set<fs::path> seen;
  auto addDir = [&](const fs::path& d) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(d, ec);
    if (ec) key = d;
    if (seen.insert(key).second) dirs.push_back(d);
  };
  auto subdirs = [](const fs::path& d) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (it->is_directory(ec2)) out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  // A variant's folder that holds a run of its own and repeats (seed-<N>/ with results) holds two runs of the variant,
  // one written before the other (a single run, then the same variant with --seeds, or the reverse): their rows would
  // merge, or one would hide the other, without a word. The later is read, and a warning names both.
  auto addRun = [&](const fs::path& d) {
    std::vector<fs::path> repeats;
    for (const auto& sub : subdirs(d)) {
      const std::string name = sub.filename().string();
      if (name.size() > 5 && name.starts_with("seed-") &&
          name.find_first_not_of("0123456789", 5) == std::string::npos && isRunDir(sub))
        repeats.push_back(sub);
    }
    if (repeats.empty()) {
      addDir(d);
      return;
    }
    // status.json's times where every side has them (a copy keeps them), else the files' (a copy resets them).
    std::optional<std::time_t> own_at = writtenAt(d), seeds_at;
    std::string names;
    bool all_stamped = own_at.has_value();
    for (const auto& r : repeats) {
      const auto at = writtenAt(r);
      all_stamped = all_stamped && at.has_value();
      if (at) seeds_at = std::max(seeds_at.value_or(*at), *at);
      names += (names.empty() ? "" : ", ") + r.filename().string() + "/";
    }
    std::string own, seeds;
    bool own_later = false;
    if (all_stamped) {
      own = utcText(*own_at);
      seeds = utcText(*seeds_at);
      own_later = *own_at > *seeds_at;
    } else {
      fs::file_time_type seeds_time = fs::file_time_type::min();
      for (const auto& r : repeats) seeds_time = std::max(seeds_time, lastWritten(r));
      own = timeText(lastWritten(d));
      seeds = timeText(seeds_time);
      own_later = lastWritten(d) > seeds_time;
    }
    // A tie (one second) goes to the repeats: more runs of the variant, and its interval.
    if (own_later)
      addDir(d);
    else
      for (const auto& r : repeats) addDir(r);
    warnings.push_back(d.string() + ": holds a run of its own (written " + own + ") and repeats (" + names +
                       " written " + seeds + "), two runs of one variant; shown: the " +
                       (own_later      ? "run of its own, the later"
                        : own == seeds ? "repeats (written alike)"
                                       : "repeats, the later") +
                       "; the " + (own_later ? "repeats are" : "run of its own is") +
                       " left out (move one away to keep both)");
  };
  for (const auto& path : paths) {
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      warnings.push_back(path.string() + ": " + (fs::exists(path, ec) ? "not a directory" : "no such directory") +
                         "; skipped");
      continue;
    }
    if (isRunDir(path)) {
      addRun(path);
      continue;
    }
    const std::size_t before = dirs.size();
    // Three levels: results root / study / variant / seed-<N> of a repeat.
    for (const auto& sub : subdirs(path)) {
      if (isRunDir(sub)) {
        addRun(sub);
        continue;
      }
      for (const auto& subsub : subdirs(sub)) {
        if (isRunDir(subsub)) {
          addRun(subsub);
          continue;
        }
        for (const auto& leaf : subdirs(subsub))
          if (isRunDir(leaf)) addDir(leaf);
      }
    }
    if (dirs.size() == before)
      warnings.push_back(path.string() + ": no result folders (" + std::string(kMetricsFile) + ", " +
                         std::string(kStatusFile) + ", ...) in it or three levels below; skipped");
  }
  std::vector<RunData> runs;
  for (const auto& d : dirs) runs.push_back(loadRun(d, warnings));
  labelRunsOfOneNameApart(runs, warnings);
  return runs;
}

}  // namespace terse::results

#include "results/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>
#include <system_error>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <openssl/evp.h>

#include "experiments/config/experiment.pb.h"
#include "results/result_writer.h"

namespace terse::results {

const char* const kRowOrder =
    "variants that reached the target first, by bytes to target (fewest first); then by final accuracy (highest "
    "first); variants without records last";

namespace {

namespace fs = std::filesystem;

// A results file is read whole; a metrics stream of a long run is a few MB. The cap keeps a wrong path (a dataset, a
// core dump) from being read into memory.
constexpr std::uintmax_t kMaxFileBytes = 256u << 20;

std::string shortText(std::string_view s, std::size_t n = 60) {
  std::string out(s.substr(0, n));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  if (s.size() > n) out += "...";
  return out;
}

// Reads a file; nullopt (and a warning) when it cannot be read. Missing files are the caller's to report, since
// whether one is expected depends on the file.
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

bool isRunDir(const fs::path& dir) {
  std::error_code ec;
  for (auto name : {kConfigFile, kProvenanceFile, kMetricsFile, kStatusFile}) {
    if (fs::is_regular_file(dir / std::string(name), ec)) return true;
  }
  return false;
}

std::string valueText(const JsonValue& v) {
  if (std::holds_alternative<std::nullptr_t>(v)) return "null";
  if (std::holds_alternative<bool>(v)) return std::get<bool>(v) ? "true" : "false";
  if (std::holds_alternative<std::string>(v)) return "\"" + shortText(std::get<std::string>(v), 30) + "\"";
  std::ostringstream s;
  s << std::get<double>(v);
  return s.str();
}

// Reads metrics.jsonl: one EvalPoint per good line; every bad line is a warning naming file and line.
void readMetrics(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    warnings.push_back(path.string() + ": missing; the variant has no records");
    return;
  }
  auto text = readFile(path, warnings);
  if (!text) return;
  const std::string file = path.string();
  std::size_t pos = 0;
  int line_no = 0;
  while (pos < text->size()) {
    ++line_no;
    const auto nl = text->find('\n', pos);
    const bool has_newline = nl != std::string::npos;
    const std::string_view line(text->data() + pos, (has_newline ? nl : text->size()) - pos);
    pos = has_newline ? nl + 1 : text->size();
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = file + ":" + std::to_string(line_no) + ": ";
    auto obj = parseFlatJson(line);
    if (!obj) {
      // The writer flushes whole lines, so a line without its newline at the end is a write cut short.
      warnings.push_back(where + (has_newline ? "not a flat JSON object" : "torn last line (no newline)") +
                         ", skipped: " + shortText(line));
      continue;
    }
    EvalPoint p;
    p.line = line_no;
    std::string bad;
    auto required = [&](std::string_view key, double lo, double hi) -> double {
      auto it = obj->find(key);
      if (it == obj->end()) {
        if (bad.empty()) bad = "no '" + std::string(key) + "'";
        return 0;
      }
      const auto v = getNumber(*obj, key);
      if (!v || !std::isfinite(*v) || *v < lo || *v > hi) {
        if (bad.empty()) {
          std::ostringstream s;
          s << "'" << key << "' is " << valueText(it->second) << ", must be a number in [" << lo << ", " << hi << "]";
          bad = s.str();
        }
        return 0;
      }
      return *v;
    };
    // Optional fields: absent is normal (older writers, sync runs without staleness); present but not a finite
    // non-negative number is reported and ignored.
    auto optional = [&](std::string_view key) -> double {
      auto it = obj->find(key);
      if (it == obj->end() || std::holds_alternative<std::nullptr_t>(it->second)) return std::nan("");
      const auto v = getNumber(*obj, key);
      if (!v || !std::isfinite(*v) || *v < 0) {
        warnings.push_back(where + "'" + std::string(key) + "' is " + valueText(it->second) +
                           ", not a non-negative number; ignored");
        return std::nan("");
      }
      return *v;
    };
    const double step = required("step", 0, 9.007199254740992e15);
    p.accuracy = required("test_accuracy", 0, 1);
    p.wire_bytes = required("wire_bytes_per_worker", 0, 1.8446744073709552e19);
    if (!bad.empty()) {
      warnings.push_back(where + bad + "; record skipped");
      continue;
    }
    p.step = static_cast<int64_t>(step);
    p.epoch_progress = optional("epoch_progress");
    p.test_loss = optional("test_loss");
    p.payload_bytes = optional("payload_bytes_per_worker");
    p.wall_s = optional("wall_s");
    p.compute_s = optional("compute_s_per_step");
    p.compress_s = optional("compress_s_per_step");
    p.decompress_s = optional("decompress_s_per_step");
    p.comm_s = optional("comm_s_per_step");
    p.exposed_comm_s = optional("exposed_comm_s_per_step");
    p.step_s = optional("step_s_per_step");
    p.staleness_mean = optional(kStalenessMeanKey);
    p.staleness_max = optional(kStalenessMaxKey);
    p.staleness_hist_overflow = optional(kStalenessHistOverflowKey);
    const std::string hist_prefix(kStalenessHistPrefix);
    for (const auto& [key, value] : *obj) {
      if (key.rfind(hist_prefix, 0) != 0 || key == kStalenessHistOverflowKey) continue;
      const std::string tau = key.substr(hist_prefix.size());
      const bool digits = !tau.empty() && tau.size() <= 9 && tau.find_first_not_of("0123456789") == std::string::npos;
      const double count = optional(key);
      if (!digits) {
        warnings.push_back(where + "'" + key + "': a staleness bucket must be " + hist_prefix +
                           "<tau> with tau a non-negative integer; ignored");
      } else if (!std::isnan(count)) {
        p.staleness_hist[std::stoll(tau)] = count;
      }
    }
    if (!run.points.empty()) {
      const EvalPoint& prev = run.points.back();
      // Two runs' records mixed in one file, or a file edited by hand: the curves would be nonsense.
      if (p.step <= prev.step) {
        warnings.push_back(where + "step " + std::to_string(p.step) + " does not follow step " +
                           std::to_string(prev.step) + " (line " + std::to_string(prev.line) + "); record skipped");
        continue;
      }
      if (p.wire_bytes < prev.wire_bytes) {
        std::ostringstream s;
        s << where << "wire_bytes_per_worker " << p.wire_bytes << " is less than the previous record's "
          << prev.wire_bytes << " (cumulative counters never decrease); record skipped";
        warnings.push_back(s.str());
        continue;
      }
    }
    run.points.push_back(std::move(p));
  }
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
  auto obj = parseFlatJson(*text);
  const auto state = obj ? getString(*obj, "state") : std::nullopt;
  if (!state) {
    warnings.push_back(path.string() +
                       ":1: not a status object with a \"state\" string; state unknown: " + shortText(*text));
    return;
  }
  if (*state != kStateCompleted && *state != kStateFailed && *state != kStateRunning) {
    warnings.push_back(path.string() + ":1: unknown state \"" + shortText(*state, 30) + "\"; state unknown");
    return;
  }
  run.state = *state;
  run.error = getString(*obj, "error").value_or("");
}

// Collects the parser's first error with its line, so a broken config.textproto is reported as FILE:LINE: what.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (error.empty()) error = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string error;
};

// "workload.hidden_sizes=256" lines for every field set in `msg`, in field-number order (repeated fields one line per
// element), as protobuf's text format spells the values: the canonical form two configs are compared in.
void flattenMessage(const google::protobuf::Message& msg, const std::string& prefix, std::vector<std::string>& out) {
  const auto* reflection = msg.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(msg, &fields);
  for (const auto* f : fields) {
    const std::string path = prefix + "." + f->name();
    const int n = f->is_repeated() ? reflection->FieldSize(msg, f) : 1;
    for (int i = 0; i < n; ++i) {
      const int index = f->is_repeated() ? i : -1;
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        const auto& sub = f->is_repeated() ? reflection->GetRepeatedMessage(msg, f, i) : reflection->GetMessage(msg, f);
        flattenMessage(sub, path, out);
      } else {
        std::string value;
        google::protobuf::TextFormat::PrintFieldValueToString(msg, f, index, &value);
        out.push_back(path + "=" + value);
      }
    }
  }
}

}  // namespace

std::string sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    throw std::runtime_error("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

namespace {

void readConfig(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    warnings.push_back(path.string() + ": missing; compressor and workload unknown");
    return;
  }
  auto text = readFile(path, warnings);
  if (!text) return;
  run.config_sha256 = sha256Hex(*text);
  // Parsed with the experiment schema itself, so compare reads exactly what the runner wrote. A config written by a
  // newer terse (unknown fields) or damaged on disk is reported with its line and not used.
  experiments::Experiment config;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (text->size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !parser.ParseFromString(*text, &config)) {
    warnings.push_back(path.string() + ":" + (errors.error.empty() ? std::string("1: unreadable") : errors.error) +
                       "; config not used");
    return;
  }
  run.has_config = true;
  run.workload_fields.clear();
  run.data_fields.clear();
  if (config.has_workload()) flattenMessage(config.workload(), "workload", run.workload_fields);
  if (config.has_data()) flattenMessage(config.data(), "data", run.data_fields);
  if (config.compressor().has_name()) run.compressor = config.compressor().name();
  if (config.has_error_feedback()) run.error_feedback = config.error_feedback();
  run.async_mode = config.mode() == experiments::Experiment::ASYNC || config.mode() == experiments::Experiment::SSP ||
                   config.mode() == experiments::Experiment::HOGWILD;
  if (config.momentum_correction().has_factor() && std::isfinite(config.momentum_correction().factor())) {
    run.momentum_correction = config.momentum_correction().factor();
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
  auto json = parseJson(*text, &error);
  if (!json || json->kind != Json::Kind::kObject) {
    warnings.push_back(path.string() + ": not a JSON object (" + (json ? "another value" : error) + "); ignored");
    return;
  }
  run.provenance = std::move(*json);
  // What actually loaded beats the name the config asked for (a path, say).
  if (const Json* plugins = run.provenance->find("plugins"); plugins && plugins->kind == Json::Kind::kArray) {
    for (const auto& p : plugins->array) {
      if (p.str("kind") == "compressor" && !p.str("name").empty()) {
        run.compressor = p.str("name");
        break;
      }
    }
  }
}

bool has(double v) {
  return !std::isnan(v);
}

std::optional<double> opt(double v) {
  return has(v) ? std::optional<double>(v) : std::nullopt;
}

std::optional<StalenessSummary> staleness(const EvalPoint& p) {
  if (!has(p.staleness_mean) && !has(p.staleness_max) && p.staleness_hist.empty()) return std::nullopt;
  StalenessSummary s;
  s.mean = has(p.staleness_mean) ? p.staleness_mean : std::nan("");
  s.max = has(p.staleness_max) ? p.staleness_max : std::nan("");
  double total = has(p.staleness_hist_overflow) ? p.staleness_hist_overflow : 0;
  for (const auto& [tau, count] : p.staleness_hist) total += count;
  if (!p.staleness_hist.empty() && total > 0) {
    // Percentiles by the nearest-rank rule; a percentile that lands in the overflow bucket is unknown.
    auto percentile = [&](double q) -> std::optional<double> {
      const double rank = std::ceil(q * total);
      double seen = 0;
      for (const auto& [tau, count] : p.staleness_hist) {
        seen += count;
        if (seen >= rank) return static_cast<double>(tau);
      }
      return std::nullopt;
    };
    s.p50 = percentile(0.5);
    s.p90 = percentile(0.9);
    // Without a recorded mean or max the histogram still gives them (overflow makes the mean a lower bound: unknown).
    if (!has(s.max) && !has(p.staleness_hist_overflow)) s.max = static_cast<double>(p.staleness_hist.rbegin()->first);
    if (!has(s.mean) && !has(p.staleness_hist_overflow)) {
      double sum = 0;
      for (const auto& [tau, count] : p.staleness_hist) sum += static_cast<double>(tau) * count;
      s.mean = sum / total;
    }
  }
  return s;
}

CompareRow makeRow(const RunData& run) {
  CompareRow r;
  r.variant = run.variant;
  r.state = run.state;
  r.error = run.error;
  r.dir = run.dir;
  r.compressor = run.compressor;
  r.error_feedback = run.error_feedback || run.momentum_correction > 0;
  r.records = static_cast<int64_t>(run.points.size());
  if (run.points.empty()) return r;
  const EvalPoint& last = run.points.back();
  r.steps = last.step;
  r.final_accuracy = last.accuracy;
  double best = 0;
  for (const auto& p : run.points) best = std::max(best, p.accuracy);
  r.best_accuracy = best;
  r.wire_bytes = last.wire_bytes;
  if (last.step > 0) r.wire_bytes_per_step = last.wire_bytes / static_cast<double>(last.step);
  r.payload_bytes = opt(last.payload_bytes);
  r.compute_s = opt(last.compute_s);
  if (has(last.compress_s) || has(last.decompress_s))
    r.codec_s = (has(last.compress_s) ? last.compress_s : 0) + (has(last.decompress_s) ? last.decompress_s : 0);
  r.comm_s = opt(last.comm_s);
  r.exposed_comm_s = opt(last.exposed_comm_s);
  r.step_s = opt(last.step_s);
  r.staleness = staleness(last);
  return r;
}

bool isDense(const RunData& r) {
  return r.compressor == "none";
}

// Sort key, see kRowOrder.
bool rowBefore(const CompareRow& a, const CompareRow& b) {
  auto group = [](const CompareRow& r) { return r.to_target ? 0 : r.records > 0 ? 1 : 2; };
  if (group(a) != group(b)) return group(a) < group(b);
  if (a.to_target && a.to_target->wire_bytes != b.to_target->wire_bytes)
    return a.to_target->wire_bytes < b.to_target->wire_bytes;
  if (a.final_accuracy && b.final_accuracy && *a.final_accuracy != *b.final_accuracy)
    return *a.final_accuracy > *b.final_accuracy;
  return a.variant < b.variant;
}

// ---- Formatting.

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// Three significant figures, without exponent for the ranges tables show.
std::string sig3(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 100) return fixed(v, 0);
  if (a >= 10) return fixed(v, 1);
  if (a >= 1) return fixed(v, 2);
  if (a >= 0.1) return fixed(v, 3);
  std::ostringstream s;
  s << std::setprecision(3) << v;
  return s.str();
}

std::string orDash(const std::optional<double>& v, double scale, int digits = -1) {
  if (!v) return "-";
  return digits < 0 ? sig3(*v * scale) : fixed(*v * scale, digits);
}

// Markdown table cells: a '|' would end the cell, a newline the row.
std::string mdCell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n' || c == '\r')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string csvCell(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csvNumber(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", *v);
  return buf;
}

// Staleness is counted in versions: max and percentiles are whole numbers, the mean is not.
std::string stalenessText(const StalenessSummary& s) {
  auto whole = [](double v) { return std::isfinite(v) && v == std::floor(v) ? fixed(v, 0) : sig3(v); };
  std::string out = "mean " + sig3(s.mean) + ", max " + whole(s.max);
  if (s.p50) out += ", p50 " + whole(*s.p50);
  if (s.p90) out += ", p90 " + whole(*s.p90);
  return out;
}

std::string stateText(const CompareRow& r) {
  if (r.state == kStateRunning) return "running/killed";
  if (r.state == kStateFailed) return "**failed**";
  return r.state;
}

void addNumber(JsonObject& o, std::string_view key, const std::optional<double>& v) {
  o.add(key, v ? *v : std::nan(""));
}

std::string jsonStringArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& s : items) {
    if (out.size() > 1) out += ',';
    appendJsonString(out, s);
  }
  return out + "]";
}

std::string joinLines(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

// ---- Provenance.

struct ProvenanceRow {
  std::string study, variant, state, config_sha256, git_commit, terse_version, host, start_time, transport, mode;
  std::string world_size, link, compressor, compressor_version, compressor_abi, compressor_path, caps, params;
  std::string other_plugins;
};

std::string jsonScalarText(const Json& v) {
  switch (v.kind) {
    case Json::Kind::kString:
      return v.string;
    case Json::Kind::kNumber: {
      // Integers (rounds, sizes, versions) as integers; anything else with full precision.
      if (std::fabs(v.number) < 1e15 && v.number == std::floor(v.number)) return fixed(v.number, 0);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.10g", v.number);
      return buf;
    }
    case Json::Kind::kBool:
      return v.boolean ? "true" : "false";
    case Json::Kind::kNull:
      return "null";
    default:
      return "...";
  }
}

std::string objectText(const Json* o, std::string_view sep = " ") {
  if (o == nullptr || o->kind != Json::Kind::kObject) return "";
  std::string out;
  for (const auto& [k, v] : o->object) out += (out.empty() ? "" : std::string(sep)) + k + "=" + jsonScalarText(v);
  return out;
}

ProvenanceRow provenanceRow(const RunData& run) {
  ProvenanceRow r;
  r.study = run.study;
  r.variant = run.variant;
  r.state = run.state;
  r.config_sha256 = run.config_sha256;
  if (!run.provenance) return r;
  const Json& p = *run.provenance;
  r.git_commit = p.str("git_commit");
  r.terse_version = p.str("terse_version");
  r.host = p.str("host");
  r.start_time = p.str("start_time");
  r.transport = p.str("transport");
  r.mode = p.str("mode");
  if (auto w = p.num("world_size")) r.world_size = fixed(*w, 0);
  r.link = objectText(p.find("link_emulation"));
  if (const Json* plugins = p.find("plugins"); plugins && plugins->kind == Json::Kind::kArray) {
    for (const auto& pl : plugins->array) {
      if (pl.str("kind") == "compressor" && r.compressor.empty()) {
        r.compressor = pl.str("name");
        r.compressor_version = pl.str("version");
        if (auto abi = pl.num("abi_version")) r.compressor_abi = "v" + fixed(*abi, 0);
        r.compressor_path = pl.str("path");
        r.caps = objectText(pl.find("caps"));
        r.params = objectText(pl.find("params"));
      } else {
        r.other_plugins += (r.other_plugins.empty() ? "" : "; ") + pl.str("kind") + " " + pl.str("name") + " " +
                           pl.str("version") + " " + pl.str("path");
      }
    }
  }
  return r;
}

std::vector<std::pair<std::string, std::string ProvenanceRow::*>> provenanceColumns() {
  return {{"study", &ProvenanceRow::study},
          {"variant", &ProvenanceRow::variant},
          {"state", &ProvenanceRow::state},
          {"config_sha256", &ProvenanceRow::config_sha256},
          {"git_commit", &ProvenanceRow::git_commit},
          {"terse_version", &ProvenanceRow::terse_version},
          {"compressor", &ProvenanceRow::compressor},
          {"compressor_version", &ProvenanceRow::compressor_version},
          {"compressor_abi", &ProvenanceRow::compressor_abi},
          {"compressor_path", &ProvenanceRow::compressor_path},
          {"caps", &ProvenanceRow::caps},
          {"params", &ProvenanceRow::params},
          {"other_plugins", &ProvenanceRow::other_plugins},
          {"transport", &ProvenanceRow::transport},
          {"mode", &ProvenanceRow::mode},
          {"world_size", &ProvenanceRow::world_size},
          {"link_emulation", &ProvenanceRow::link},
          {"host", &ProvenanceRow::host},
          {"start_time", &ProvenanceRow::start_time}};
}

std::string section(const RunData& r, std::string_view name, std::vector<std::string>& flat) {
  flat = name == "workload" ? r.workload_fields : r.data_fields;
  return joinLines(flat, "\n");
}

}  // namespace

// ---- Reading.

RunData loadRun(const fs::path& dir, std::vector<std::string>& warnings) {
  RunData run;
  run.dir = dir;
  run.variant = dir.filename().string();
  run.study = dir.parent_path().filename().string();
  readStatus(dir / std::string(kStatusFile), run, warnings);
  readConfig(dir / std::string(kConfigFile), run, warnings);
  readProvenance(dir / std::string(kProvenanceFile), run, warnings);
  readMetrics(dir / std::string(kMetricsFile), run, warnings);
  if (run.state == kStateFailed)
    warnings.push_back(dir.string() + ": the run failed" + (run.error.empty() ? "" : ": " + shortText(run.error, 200)) +
                       "; shown with its " + std::to_string(run.points.size()) + " record(s)");
  else if (run.state == kStateRunning)
    warnings.push_back(dir.string() + ": status says running (still running, or killed); shown with its " +
                       std::to_string(run.points.size()) + " record(s)");
  return run;
}

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
  for (const auto& path : paths) {
    std::error_code ec;
    if (!fs::is_directory(path, ec)) {
      warnings.push_back(path.string() + ": " + (fs::exists(path, ec) ? "not a directory" : "no such directory") +
                         "; skipped");
      continue;
    }
    if (isRunDir(path)) {
      addDir(path);
      continue;
    }
    const std::size_t before = dirs.size();
    for (const auto& sub : subdirs(path)) {
      if (isRunDir(sub)) {
        addDir(sub);
        continue;
      }
      for (const auto& subsub : subdirs(sub))
        if (isRunDir(subsub)) addDir(subsub);
    }
    if (dirs.size() == before)
      warnings.push_back(path.string() + ": no result folders (" + std::string(kMetricsFile) + ", " +
                         std::string(kStatusFile) + ", ...) in it or two levels below; skipped");
  }
  std::vector<RunData> runs;
  for (const auto& d : dirs) runs.push_back(loadRun(d, warnings));
  return runs;
}

// ---- Analysis.

std::optional<TargetCrossing> crossTarget(const std::vector<EvalPoint>& points, double target) {
  for (std::size_t i = 0; i < points.size(); ++i) {
    const EvalPoint& p = points[i];
    if (p.accuracy < target) continue;
    if (i == 0) return TargetCrossing{p.wire_bytes, p.wall_s};
    const EvalPoint& q = points[i - 1];
    // q.accuracy < target <= p.accuracy, so the denominator is positive.
    const double f = (target - q.accuracy) / (p.accuracy - q.accuracy);
    return TargetCrossing{q.wire_bytes + f * (p.wire_bytes - q.wire_bytes), q.wall_s + f * (p.wall_s - q.wall_s)};
  }
  return std::nullopt;
}

Comparison compare(const std::vector<RunData>& runs, const CompareOptions& options,
                   std::vector<std::string>& warnings) {
  Comparison c;
  c.target = options.target;
  std::map<std::string, std::vector<const RunData*>> by_study;
  for (const auto& r : runs) by_study[r.study].push_back(&r);
  bool baseline_found = false;
  for (const auto& [study, members] : by_study) {
    StudyTable t;
    t.study = study;
    const RunData* base = nullptr;
    if (options.baseline) {
      for (const RunData* r : members)
        if (r->variant == *options.baseline) base = r;
      if (base != nullptr) {
        t.baseline_source = "--baseline";
        baseline_found = true;
        if (!isDense(*base))
          t.notes.push_back("baseline `" + base->variant + "` (--baseline) uses compressor '" + base->compressor +
                            "', not none");
      } else {
        t.baseline_source = "none";
        t.notes.push_back("no variant named `" + *options.baseline + "` (--baseline) in this study; no ratios");
      }
    } else {
      std::vector<const RunData*> dense;
      for (const RunData* r : members)
        if (isDense(*r)) dense.push_back(r);
      // A plain dense run is the baseline; error feedback on "none" is a no-op residual but still not the reference,
      // and in a sync-versus-async study the dense sync run is what the others are measured against.
      std::stable_sort(dense.begin(), dense.end(), [](const RunData* a, const RunData* b) {
        auto key = [](const RunData* r) {
          return std::tuple(r->error_feedback || r->momentum_correction > 0, r->async_mode, r->state != kStateCompleted,
                            r->variant);
        };
        return key(a) < key(b);
      });
      if (!dense.empty()) {
        base = dense.front();
        t.baseline_source = "auto";
        if (dense.size() > 1) {
          std::string names;
          for (const RunData* r : dense) names += (names.empty() ? "`" : ", `") + r->variant + "`";
          t.notes.push_back("several variants use compressor none (" + names + "); the baseline is `" + base->variant +
                            "` (choose another with --baseline)");
        }
      } else {
        t.baseline_source = "none";
        t.notes.push_back("no variant uses compressor none; no compression ratios (name one with --baseline)");
      }
    }
    if (base != nullptr) t.baseline = base->variant;

    std::optional<double> base_per_step;
    for (const RunData* r : members) {
      CompareRow row = makeRow(*r);
      row.to_target = crossTarget(r->points, options.target);
      row.baseline = r == base;
      if (row.baseline) base_per_step = row.wire_bytes_per_step;
      if (r->state == kStateFailed)
        t.notes.push_back("`" + r->variant + "` failed: " + (r->error.empty() ? "(no message)" : r->error));
      else if (r->state == kStateRunning)
        t.notes.push_back("`" + r->variant + "` has status running: still running or killed; its numbers are partial");
      else if (r->state == "unknown")
        t.notes.push_back("`" + r->variant + "`: status unknown (see the warnings)");
      t.rows.push_back(std::move(row));
    }
    if (base != nullptr && (!base_per_step || *base_per_step <= 0))
      t.notes.push_back("the baseline `" + base->variant + "` has no wire bytes per step; no ratios");
    for (auto& row : t.rows) {
      if (base_per_step && *base_per_step > 0 && row.wire_bytes_per_step && *row.wire_bytes_per_step > 0)
        row.ratio = *base_per_step / *row.wire_bytes_per_step;
    }
    std::stable_sort(t.rows.begin(), t.rows.end(), rowBefore);
    c.studies.push_back(std::move(t));
  }
  if (options.baseline && !baseline_found && !runs.empty())
    warnings.push_back("--baseline " + *options.baseline + ": no study has a variant of that name");
  return c;
}

std::vector<std::string> configMismatchWarnings(const std::vector<RunData>& runs) {
  std::vector<std::string> out;
  for (const std::string name : {"workload", "data"}) {
    // Group runs by the section's canonical text; one group = all agree.
    std::vector<std::pair<std::vector<std::string>, std::vector<const RunData*>>> groups;
    for (const auto& r : runs) {
      if (!r.has_config) continue;
      std::vector<std::string> flat;
      section(r, name, flat);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == flat; });
      if (it == groups.end())
        groups.push_back({flat, {&r}});
      else
        it->second.push_back(&r);
    }
    if (groups.size() < 2) continue;
    // The largest group is the reference: the odd ones out are then listed with what makes them odd.
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    std::ostringstream msg;
    msg << "the compared runs come from different " << (name == "data" ? "data" : "workloads") << " (" << name
        << " sections of config.textproto differ):";
    const std::set<std::string> first(groups[0].first.begin(), groups[0].first.end());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::string members;
      for (std::size_t i = 0; i < groups[g].second.size(); ++i) {
        if (i == 3) {
          members += " and " + std::to_string(groups[g].second.size() - 3) + " more";
          break;
        }
        members += (i ? ", " : "") + groups[g].second[i]->study + "/" + groups[g].second[i]->variant;
      }
      // For each group, the fields that differ from the first group's (all of the first's for the first).
      std::vector<std::string> diff;
      if (g == 0) {
        diff = groups[0].first;
      } else {
        const std::set<std::string> mine(groups[g].first.begin(), groups[g].first.end());
        for (const auto& f : groups[g].first)
          if (!first.count(f)) diff.push_back(f);
        for (const auto& f : groups[0].first)
          if (!mine.count(f)) diff.push_back("no " + f);
      }
      msg << "\n    " << members << ": " << (diff.empty() ? "(empty)" : joinLines(diff, " "));
    }
    out.push_back(msg.str());
  }
  return out;
}

// ---- Tables.

std::string toMarkdown(const Comparison& c) {
  std::ostringstream o;
  const std::string target = sig3(c.target);
  for (std::size_t s = 0; s < c.studies.size(); ++s) {
    const StudyTable& t = c.studies[s];
    bool any_staleness = false;
    for (const auto& r : t.rows) any_staleness = any_staleness || r.staleness.has_value();
    if (s > 0) o << '\n';
    o << "### " << mdCell(t.study) << "\n\n";
    o << "Baseline: " << (t.baseline.empty() ? "none" : "`" + t.baseline + "`")
      << (t.baseline_source == "auto"         ? " (compressor none)"
          : t.baseline_source == "--baseline" ? " (--baseline)"
                                              : "")
      << ". Target accuracy " << target << ". Rows: " << kRowOrder << ".\n\n";
    std::vector<std::string> header = {
        "variant",           "state",
        "final acc",         "best acc",
        "wire MB/worker",    "wire KB/step",
        "payload MB/worker", "ratio vs " + (t.baseline.empty() ? std::string("dense") : t.baseline),
        "MB to " + target,   "s to " + target,
        "step ms",           "compute ms",
        "codec ms",          "comm ms",
        "exposed comm ms"};
    if (any_staleness) header.push_back("staleness");
    o << '|';
    for (const auto& h : header) o << ' ' << mdCell(h) << " |";
    o << "\n|";
    for (std::size_t i = 0; i < header.size(); ++i) o << (i < 2 ? "---|" : "---:|");
    o << '\n';
    for (const auto& r : t.rows) {
      std::vector<std::string> cells = {
          r.baseline ? "**" + r.variant + "** (baseline)" : r.variant,
          stateText(r),
          orDash(r.final_accuracy, 1, 4),
          orDash(r.best_accuracy, 1, 4),
          orDash(r.wire_bytes, 1e-6),
          orDash(r.wire_bytes_per_step, 1e-3),
          orDash(r.payload_bytes, 1e-6),
          r.ratio ? sig3(*r.ratio) + "×" : "-",
          r.to_target ? sig3(r.to_target->wire_bytes * 1e-6) : (r.records > 0 ? "not reached" : "-"),
          r.to_target ? (std::isnan(r.to_target->wall_s) ? "-" : sig3(r.to_target->wall_s))
                      : (r.records > 0 ? "not reached" : "-"),
          orDash(r.step_s, 1e3),
          orDash(r.compute_s, 1e3),
          orDash(r.codec_s, 1e3),
          orDash(r.comm_s, 1e3),
          orDash(r.exposed_comm_s, 1e3)};
      if (any_staleness) cells.push_back(r.staleness ? stalenessText(*r.staleness) : "-");
      o << '|';
      for (const auto& cell : cells) o << ' ' << mdCell(cell) << " |";
      o << '\n';
    }
    if (!t.notes.empty()) {
      o << '\n';
      for (const auto& n : t.notes) o << "- " << mdCell(n) << '\n';
    }
  }
  return o.str();
}

std::string toCsv(const Comparison& c) {
  std::ostringstream o;
  o << "study,variant,baseline,state,compressor,error_feedback,records,steps,final_accuracy,best_accuracy,"
       "wire_bytes_per_worker,wire_bytes_per_step,payload_bytes_per_worker,ratio_vs_baseline,target,reached_target,"
       "bytes_to_target,seconds_to_target,step_s,compute_s,codec_s,comm_s,exposed_comm_s,staleness_mean,"
       "staleness_max,staleness_p50,staleness_p90,error\n";
  for (const auto& t : c.studies) {
    for (const auto& r : t.rows) {
      std::vector<std::string> cells = {csvCell(t.study),
                                        csvCell(r.variant),
                                        r.baseline ? "true" : "false",
                                        csvCell(r.state),
                                        csvCell(r.compressor),
                                        r.error_feedback ? "true" : "false",
                                        std::to_string(r.records),
                                        std::to_string(r.steps),
                                        csvNumber(r.final_accuracy),
                                        csvNumber(r.best_accuracy),
                                        csvNumber(r.wire_bytes),
                                        csvNumber(r.wire_bytes_per_step),
                                        csvNumber(r.payload_bytes),
                                        csvNumber(r.ratio),
                                        csvNumber(c.target),
                                        r.to_target ? "true" : "false",
                                        r.to_target ? csvNumber(r.to_target->wire_bytes) : "",
                                        r.to_target ? csvNumber(r.to_target->wall_s) : "",
                                        csvNumber(r.step_s),
                                        csvNumber(r.compute_s),
                                        csvNumber(r.codec_s),
                                        csvNumber(r.comm_s),
                                        csvNumber(r.exposed_comm_s),
                                        r.staleness ? csvNumber(r.staleness->mean) : "",
                                        r.staleness ? csvNumber(r.staleness->max) : "",
                                        r.staleness ? csvNumber(r.staleness->p50) : "",
                                        r.staleness ? csvNumber(r.staleness->p90) : "",
                                        csvCell(r.error)};
      o << joinLines(cells, ",") << '\n';
    }
  }
  return o.str();
}

std::string toJson(const Comparison& c, const std::vector<std::string>& warnings) {
  // One study per line and one row per line: diffable, and still one JSON document.
  std::string studies = "[";
  for (const auto& t : c.studies) {
    std::string rows = "[";
    for (const auto& r : t.rows) {
      JsonObject o;
      o.add("variant", r.variant)
          .add("baseline", r.baseline)
          .add("state", r.state)
          .add("error", r.error)
          .add("dir", r.dir.string())
          .add("compressor", r.compressor)
          .add("error_feedback", r.error_feedback)
          .add("records", r.records)
          .add("steps", r.steps);
      addNumber(o, "final_accuracy", r.final_accuracy);
      addNumber(o, "best_accuracy", r.best_accuracy);
      addNumber(o, "wire_bytes_per_worker", r.wire_bytes);
      addNumber(o, "wire_bytes_per_step", r.wire_bytes_per_step);
      addNumber(o, "payload_bytes_per_worker", r.payload_bytes);
      addNumber(o, "ratio_vs_baseline", r.ratio);
      o.add("reached_target", r.to_target.has_value());
      addNumber(o, "bytes_to_target",
                r.to_target ? std::optional<double>(r.to_target->wire_bytes) : std::optional<double>());
      addNumber(o, "seconds_to_target",
                r.to_target ? std::optional<double>(r.to_target->wall_s) : std::optional<double>());
      addNumber(o, "step_s", r.step_s);
      addNumber(o, "compute_s", r.compute_s);
      addNumber(o, "codec_s", r.codec_s);
      addNumber(o, "comm_s", r.comm_s);
      addNumber(o, "exposed_comm_s", r.exposed_comm_s);
      if (r.staleness) {
        JsonObject s;
        s.add("mean", r.staleness->mean).add("max", r.staleness->max);
        addNumber(s, "p50", r.staleness->p50);
        addNumber(s, "p90", r.staleness->p90);
        o.raw("staleness", s.str());
      } else {
        o.raw("staleness", "null");
      }
      rows += (rows.size() > 1 ? ",\n    " : "\n    ") + o.str();
    }
    rows += "]";
    JsonObject st;
    st.add("study", t.study)
        .add("baseline", t.baseline)
        .add("baseline_source", t.baseline_source)
        .raw("notes", jsonStringArray(t.notes))
        .raw("rows", rows);
    studies += (studies.size() > 1 ? ",\n  " : "\n  ") + st.str();
  }
  studies += "]";
  return JsonObject()
             .add("target", c.target)
             .add("row_order", kRowOrder)
             .raw("warnings", jsonStringArray(warnings))
             .raw("studies", studies)
             .str() +
         "\n";
}

std::string provenanceTableMarkdown(const std::vector<RunData>& runs) {
  std::ostringstream o;
  std::string study;
  bool first = true;
  for (const auto& run : runs) {
    const ProvenanceRow p = provenanceRow(run);
    if (first || run.study != study) {
      study = run.study;
      o << (first ? "" : "\n") << "### " << mdCell(study) << " (provenance)\n\n"
        << "| variant | state | config sha256 | git commit | compressor | caps | params | transport | link emulation "
           "| host | started |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
      first = false;
    }
    // Twelve hex digits identify a commit; a "-dirty" suffix (uncommitted changes when the run started) is kept.
    auto shortHash = [](const std::string& h) {
      if (h.empty()) return std::string("-");
      const bool dirty = h.size() > 6 && h.ends_with("-dirty");
      const std::string hash = dirty ? h.substr(0, h.size() - 6) : h;
      return (hash.size() > 12 ? hash.substr(0, 12) : hash) + (dirty ? "-dirty" : "");
    };
    const std::string compressor = p.compressor.empty() ? "-"
                                                        : p.compressor + " " + p.compressor_version + " (ABI " +
                                                              p.compressor_abi + ", " + p.compressor_path + ")" +
                                                              (p.other_plugins.empty() ? "" : "; " + p.other_plugins);
    const std::string transport =
        p.transport.empty() ? "-" : p.transport + ", " + p.mode + ", " + p.world_size + " workers";
    const std::vector<std::string> cells = {run.variant,
                                            p.state,
                                            shortHash(p.config_sha256),
                                            shortHash(p.git_commit),
                                            compressor,
                                            p.caps.empty() ? "-" : p.caps,
                                            p.params.empty() ? "-" : p.params,
                                            transport,
                                            p.link.empty() ? "-" : p.link,
                                            p.host.empty() ? "-" : p.host,
                                            p.start_time.empty() ? "-" : p.start_time};
    o << '|';
    for (const auto& c : cells) o << ' ' << mdCell(c) << " |";
    o << '\n';
  }
  return o.str();
}

std::string provenanceTableCsv(const std::vector<RunData>& runs) {
  const auto columns = provenanceColumns();
  std::ostringstream o;
  for (std::size_t i = 0; i < columns.size(); ++i) o << (i ? "," : "") << columns[i].first;
  o << '\n';
  for (const auto& run : runs) {
    const ProvenanceRow p = provenanceRow(run);
    for (std::size_t i = 0; i < columns.size(); ++i) o << (i ? "," : "") << csvCell(p.*(columns[i].second));
    o << '\n';
  }
  return o.str();
}

std::string provenanceTableJson(const std::vector<RunData>& runs, const std::vector<std::string>& warnings) {
  const auto columns = provenanceColumns();
  std::string rows = "[";
  for (const auto& run : runs) {
    const ProvenanceRow p = provenanceRow(run);
    JsonObject o;
    for (const auto& [name, member] : columns) o.add(name, p.*member);
    rows += (rows.size() > 1 ? ",\n  " : "\n  ") + o.str();
  }
  rows += "]";
  return JsonObject().raw("warnings", jsonStringArray(warnings)).raw("runs", rows).str() + "\n";
}

}  // namespace terse::results

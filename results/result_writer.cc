#include "results/result_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>

#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/common/json.h"
#include "core/common/stop_signals.h"
#include "core/train/step_trace.h"
#include "results/sha256.h"

namespace terse::results {
namespace {

std::string devicesName(uint32_t devices) {
  std::string out;
  if (devices & 0x1u) out += "host";
  if (devices & 0x2u) out += out.empty() ? "cuda" : ",cuda";
  return out;
}

Json capsJson(const CompressorCaps& c) {
  // wire_dtype as `terse plugins show` prints it: "-" unless SUM, whose payloads alone are summed as a dtype.
  return Json{{"devices", devicesName(c.devices)},
              {"aggregation", aggregationName(c.aggregation)},
              {"wire_dtype", wireDtypeText(c)},
              {"fixed_size", c.fixed_size},
              {"stateful", c.stateful},
              {"shared_seed", c.shared_seed},
              {"num_rounds", c.num_rounds}};
}

// Every writer of the process, and the lock their status and record writes take, so that failStopped() neither
// interleaves with a writer's own status (both go through status.json.tmp) nor reads a record count mid-append. One
// lock an evaluation record and a status write: not on any per-step path (docs/STYLE.md 6).
std::mutex g_writers_mutex;
std::vector<ResultWriter*> g_writers;

}  // namespace

std::string metricsRecordJson(const MetricsRecord& r) {
  Json o{{"epoch", r.epoch},
         {"epoch_progress", r.epoch_progress},
         {"step", r.step},
         {"test_accuracy", r.test_accuracy},
         {"test_loss", r.test_loss},
         {"test_examples", r.test_examples},
         {"train_loss", r.train_loss},
         {"lr", r.lr},
         {"wire_bytes_per_worker", r.wire_bytes_per_worker},
         {"payload_bytes_per_worker", r.payload_bytes_per_worker},
         {"control_bytes_per_worker", r.control_bytes_per_worker},
         {"negotiation_rounds_per_worker", r.negotiation_rounds_per_worker},
         {"wall_s", r.wall_s},
         {"compute_s_per_step", r.compute_s_per_step},
         {"compress_s_per_step", r.compress_s_per_step},
         {"decompress_s_per_step", r.decompress_s_per_step},
         {"comm_s_per_step", r.comm_s_per_step},
         {"exposed_comm_s_per_step", r.exposed_comm_s_per_step},
         {"step_s_per_step", r.step_s_per_step}};
  for (const auto& [key, value] : r.extra) o[key] = value;
  return dumpJson(o);
}

std::string provenanceJson(const Provenance& p) {
  Json link = Json::object();
  for (const auto& [k, v] : p.link) link[k] = v;
  Json simulation = Json::object();
  for (const auto& [k, v] : p.simulation) simulation[k] = v;
  Json plugins = Json::array();
  for (const auto& rec : p.plugins) {
    Json params = Json::object();
    for (const auto& [k, v] : rec.params) params[k] = v;
    Json o{{"kind", pluginKindName(rec.info.kind)}, {"name", rec.info.name},
           {"version", rec.info.version},           {"abi_version", static_cast<uint64_t>(rec.info.abi_version)},
           {"path", rec.info.path.string()},        {"origin", rec.info.origin},
           {"description", rec.info.description},   {"params", std::move(params)}};
    // The file's bytes now, just after the run loaded it: the version string is the author's claim, the hash says
    // whether two runs ran the same code. A file gone since loading is recorded as such, not a failed run.
    try {
      o["sha256"] = fileSha256Hex(rec.info.path);
    } catch (const std::exception& e) {
      o["sha256_error"] = e.what();
    }
    if (rec.caps) o["caps"] = capsJson(*rec.caps);
    if (!rec.role.empty()) o["role"] = rec.role;
    if (rec.resolved) {
      Json resolved = Json::object();
      for (const auto& [k, v] : *rec.resolved) resolved[k] = v;
      o["resolved_params"] = std::move(resolved);
    } else {
      o["resolved_params"] = nullptr;
      o["resolved_params_note"] = kDefaultsNotReported;
    }
    plugins.push_back(std::move(o));
  }
  Json out = Json::object();
  out["git_commit"] = p.git_commit;
  out["host"] = p.host;
  out["cpu"] = p.cpu;
  if (!p.gemm.empty()) out["gemm"] = p.gemm;
  out["start_time"] = p.start_time;
  out["terse_version"] = p.terse_version;
  out["transport"] = p.transport;
  out["mode"] = p.mode;
  out["world_size"] = p.world_size;
  out["link_emulation"] = std::move(link);
  out["clock"] = p.clock;
  out["simulation"] = std::move(simulation);
  if (!p.hook.empty()) {
    Json hook = Json::object();
    for (const auto& [k, v] : p.hook) hook[k] = v;
    out["hook"] = std::move(hook);
  }
  if (!p.partition.empty()) {
    Json partition = Json::object();
    for (const auto& [k, v] : p.partition) partition[k] = v;
    out["data_partition"] = std::move(partition);
  }
  if (!p.module_files.empty()) {
    Json files = Json::object();
    for (const auto& [k, v] : p.module_files) files[k] = v;
    out["module_files"] = std::move(files);
  }
  out["plugins"] = std::move(plugins);
  return dumpJson(out);
}

std::string hostName() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return buf.data();
}

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::optional<unsigned long long> processStartTicks(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces or ')': the fields count from the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) {
      char* end = nullptr;
      const unsigned long long ticks = std::strtoull(field.c_str(), &end, 10);
      if (end != field.c_str() && *end == '\0') return ticks;
    }
  return std::nullopt;
}

std::string cpuDescriptionFrom(std::string_view cpuinfo) {
  // "key<tabs>: value" lines, one block per logical CPU; the first block's fields describe them all.
  std::string model_name, family, model, flags;
  int logical = 0;
  size_t pos = 0;
  while (pos < cpuinfo.size()) {
    size_t end = cpuinfo.find('\n', pos);
    if (end == std::string_view::npos) end = cpuinfo.size();
    const std::string_view line = cpuinfo.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (key == "processor") {
      ++logical;
    } else if (logical == 1) {
      if (key == "model name") model_name = value;
      if (key == "cpu family") family = value;
      if (key == "model") model = value;
      if (key == "flags") flags = " " + std::string(value) + " ";
    }
  }
  if (logical == 0 || model_name.empty()) return "unknown";
  std::string out = model_name + " (";
  if (!family.empty()) out += "family " + family + (model.empty() ? "" : " model " + model) + ", ";
  out += std::to_string(logical) + " logical CPU" + (logical == 1 ? "" : "s");
  for (const char* isa : {"avx512f", "avx2", "sse4_2"}) {
    if (flags.find(std::string(" ") + isa + " ") != std::string::npos) {
      out += std::string(", ") + isa;
      break;
    }
  }
  return out + ")";
}

std::string cpuDescription() {
  std::ifstream in("/proc/cpuinfo");
  if (!in) return "unknown";
  std::ostringstream text;
  text << in.rdbuf();
  return cpuDescriptionFrom(text.str());
}

std::string isoTimeUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void writeStepTrace(const std::filesystem::path& dir, const train::StepTrace& trace) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TERSE_CHECK(!ec, InvalidArgument, "step trace: cannot create " << dir << ": " << ec.message());
  std::string text = train::stepTraceHeaderLine(trace.header) + '\n';
  for (const train::TraceStep& s : trace.steps) text += train::stepTraceStepLine(s) + '\n';
  writeFileAtomic(dir / train::stepTraceFileName(trace.header.rank), text);
}

void writeFileAtomic(const std::filesystem::path& path, std::string_view text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TERSE_CHECK(f != nullptr, InvalidArgument, "cannot write " << tmp.string() << ": " << std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  TERSE_CHECK(ok && closed, InvalidArgument, "cannot write " << tmp.string() << ": " << std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TERSE_CHECK(!ec, InvalidArgument,
              "cannot rename " << tmp.string() << " to " << path.string() << ": " << ec.message());
}

namespace {

// The files a run writes beside metrics.jsonl that this run might not write again: the provenance (written at the
// end, or never by a run that fails early), the step traces (steps.rank<R>.jsonl, with step_trace on) and the
// timelines (trace.rank<R>.json). Left from an earlier run into the same folder, they passed for this run's: `terse
// whatif` replayed an earlier run's traces beside this run's metrics without a word. calibration.json stays: a config
// may replay the table a run measured there (simulation.calibration), and a calibrated run rewrites it anyway.
// Files of other names (the user's) are left alone.
bool isRunFile(const std::string& name) {
  // trace.rank<R>.json, the timeline experiments/runner/runner.cc writes.
  constexpr std::string_view kTimeline = "trace.rank", kTimelineSuffix = ".json";
  const auto timeline = [&] {
    if (name.size() <= kTimeline.size() + kTimelineSuffix.size() || !name.starts_with(kTimeline) ||
        !name.ends_with(kTimelineSuffix))
      return false;
    const std::string_view digits =
        std::string_view(name).substr(kTimeline.size(), name.size() - kTimeline.size() - kTimelineSuffix.size());
    return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return name == kProvenanceFile || train::stepTraceFileRank(name).has_value() || timeline();
}

void removeEarlierRunsFiles(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || !isRunFile(it->path().filename().string())) continue;
    std::error_code removed;
    std::filesystem::remove(it->path(), removed);
    TERSE_CHECK(!removed, InvalidArgument,
                "cannot remove " << it->path().string() << ", an earlier run's file: " << removed.message());
  }
}

}  // namespace

ResultWriter::ResultWriter(const std::filesystem::path& root, std::string_view study, std::string_view variant)
    : dir_(root / std::string(study) / std::string(variant)), started_(isoTimeUtc()) {
  std::lock_guard lock(g_writers_mutex);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  TERSE_CHECK(!ec, InvalidArgument, "cannot create results folder " << dir_.string() << ": " << ec.message());
  const auto metrics = dir_ / std::string(kMetricsFile);
  metrics_ = std::fopen(metrics.c_str(), "wb");
  TERSE_CHECK(metrics_ != nullptr, InvalidArgument,
              "cannot write " << metrics.string() << ": " << std::strerror(errno));
  removeEarlierRunsFiles(dir_);
  writeStatus(kStateRunning, "");
  g_writers.push_back(this);
}

ResultWriter::~ResultWriter() {
  std::lock_guard lock(g_writers_mutex);
  std::erase(g_writers, this);
  if (state_ == kStateRunning) {
    try {
      writeStatus(kStateFailed, "the run ended without completing");
    } catch (...) {
      // A destructor must not throw; the status then still says "running", which is also true to a reader.
    }
  }
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void ResultWriter::writeConfig(std::string_view text) {
  std::lock_guard lock(g_writers_mutex);
  writeFileAtomic(dir_ / std::string(kConfigFile), text);
}

void ResultWriter::writeProvenance(const Provenance& provenance) {
  const std::string text = provenanceJson(provenance) + "\n";
  std::lock_guard lock(g_writers_mutex);
  writeFileAtomic(dir_ / std::string(kProvenanceFile), text);
}

void ResultWriter::append(const MetricsRecord& record) {
  const std::string line = metricsRecordJson(record) + "\n";
  std::lock_guard lock(g_writers_mutex);
  const bool ok = std::fwrite(line.data(), 1, line.size(), metrics_) == line.size() && std::fflush(metrics_) == 0;
  TERSE_CHECK(ok, InvalidArgument,
              "cannot append to " << (dir_ / std::string(kMetricsFile)).string() << ": " << std::strerror(errno));
  ++records_;
  if (crash_status_) crash_status_->setRecords(records_);
}

void ResultWriter::recount() {
  std::lock_guard lock(g_writers_mutex);
  recountLocked();
}

void ResultWriter::recountLocked() {
  std::FILE* f = std::fopen((dir_ / std::string(kMetricsFile)).c_str(), "r");
  TERSE_CHECK(f != nullptr, InvalidArgument,
              "cannot read " << (dir_ / std::string(kMetricsFile)).string() << ": " << std::strerror(errno));
  int64_t lines = 0;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f))
    if (c == '\n') ++lines;
  std::fclose(f);
  records_ = lines;
  if (crash_status_) crash_status_->setRecords(records_);
}

void ResultWriter::markCompleted() {
  std::lock_guard lock(g_writers_mutex);
  writeStatus(kStateCompleted, "");
}

void ResultWriter::markFailed(std::string_view error) {
  // A run that failed because the process is being stopped (a child, a peer rank, ended by the same signal before this
  // process's stopping thread got to it) failed of the stop.
  const int stopped = stop::receivedOrPending();
  std::string text(error);
  if (stopped != 0 && !text.starts_with(stop::describe(stopped))) text = stop::describe(stopped) + ": " + text;
  std::lock_guard lock(g_writers_mutex);
  writeStatus(kStateFailed, text, stopped != 0 ? stop::signalName(stopped) : "");
}

std::vector<std::filesystem::path> failStopped(std::string_view error, std::string_view signal) {
  std::unique_lock lock(g_writers_mutex);
  std::vector<std::filesystem::path> marked;
  for (ResultWriter* w : g_writers) {
    if (w->state_ != kStateRunning) continue;
    try {
      w->recountLocked();
    } catch (const std::exception&) {
      // The count the writer kept: the status is still worth writing.
    }
    try {
      w->writeStatus(kStateFailed, error, signal);
      marked.push_back(w->dir_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "terse: %s\n", e.what());
    }
  }
  // Held until the process ends (see the header): released, every writer call after this would write on.
  lock.release();
  return marked;
}

void ResultWriter::writeStatus(std::string_view state, std::string_view error, std::string_view signal) {
  Json o{{"state", state}, {"records", records_}, {"started", started_}, {"updated", isoTimeUtc()}};
  if (!error.empty()) o["error"] = error;
  if (!signal.empty()) o["signal"] = signal;
  if (state == kStateRunning) {
    o["pid"] = static_cast<int64_t>(::getpid());
    o["host"] = hostName();
    if (const std::string boot = bootId(); !boot.empty()) o["boot_id"] = boot;
    if (const auto ticks = processStartTicks(::getpid())) o["pid_start"] = static_cast<double>(*ticks);
  }
  const auto path = dir_ / std::string(kStatusFile);
  writeFileAtomic(path, dumpJson(o) + "\n");
  state_ = std::string(state);
  if (state_ != kStateRunning) {
    crash_status_.reset();
  } else if (!crash_status_) {
    crash_status_ = std::make_unique<crash::StatusFile>(path.string(), started_);
    crash_status_->setRecords(records_);
  }
}

}  // namespace terse::results

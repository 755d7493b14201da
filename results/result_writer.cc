#include "results/result_writer.h"

#include <unistd.h>
#include "results/sha256.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <system_error>

#include "core/common/dtype.h"
#include "core/common/error.h"
#include "results/json.h"
#include "results/sha256.h"

namespace terse::results {
namespace {

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::optional<std::string> gitHeadOf(const std::filesystem::path& dir) {
  const std::string cmd = "git -C " + shellQuote(dir.string()) + " rev-parse HEAD 2>/dev/null";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::array<char, 128> buf{};
  std::string out;
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr) out += buf.data();
  const int rc = ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (rc != 0 || out.size() != 40) return std::nullopt;
  // Like `git describe --dirty`: a run from a tree with uncommitted changes to tracked files is not reproducible from
  // the commit alone, and the provenance must say so.
  const std::string status =
      "git -C " + shellQuote(dir.string()) + " status --porcelain --untracked-files=no 2>/dev/null";
  if (std::FILE* st = ::popen(status.c_str(), "r")) {
    const bool changed = std::fgets(buf.data(), static_cast<int>(buf.size()), st) != nullptr;
    while (std::fgets(buf.data(), static_cast<int>(buf.size()), st) != nullptr) {
    }
    if (::pclose(st) == 0 && changed) out += "-dirty";
  }
  return out;
}

std::string devicesName(uint32_t devices) {
  std::string out;
  if (devices & 0x1u) out += "host";
  if (devices & 0x2u) out += out.empty() ? "cuda" : ",cuda";
  return out;
}

std::string capsJson(const CompressorCaps& c) {
  return JsonObject()
      .add("devices", devicesName(c.devices))
      .add("aggregation", aggregationName(c.aggregation))
      .add("wire_dtype", dtypeName(c.wire_dtype))
      .add("fixed_size", c.fixed_size)
      .add("stateful", c.stateful)
      .add("shared_seed", c.shared_seed)
      .add("num_rounds", c.num_rounds)
      .str();
}

}  // namespace

std::string metricsRecordJson(const MetricsRecord& r) {
  JsonObject o;
  o.add("epoch", r.epoch)
      .add("epoch_progress", r.epoch_progress)
      .add("step", r.step)
      .add("test_accuracy", r.test_accuracy)
      .add("test_loss", r.test_loss)
      .add("test_examples", r.test_examples)
      .add("train_loss", r.train_loss)
      .add("lr", r.lr)
      .add("wire_bytes_per_worker", r.wire_bytes_per_worker)
      .add("payload_bytes_per_worker", r.payload_bytes_per_worker)
      .add("control_bytes_per_worker", r.control_bytes_per_worker)
      .add("negotiation_rounds_per_worker", r.negotiation_rounds_per_worker)
      .add("wall_s", r.wall_s)
      .add("compute_s_per_step", r.compute_s_per_step)
      .add("compress_s_per_step", r.compress_s_per_step)
      .add("decompress_s_per_step", r.decompress_s_per_step)
      .add("comm_s_per_step", r.comm_s_per_step)
      .add("exposed_comm_s_per_step", r.exposed_comm_s_per_step)
      .add("step_s_per_step", r.step_s_per_step);
  for (const auto& [key, value] : r.extra) o.add(key, value);
  return o.str();
}

std::string provenanceJson(const Provenance& p) {
  JsonObject link;
  for (const auto& [k, v] : p.link) link.add(k, v);
  JsonObject simulation;
  for (const auto& [k, v] : p.simulation) simulation.add(k, v);
  std::string plugins = "[";
  for (const auto& rec : p.plugins) {
    JsonObject params;
    for (const auto& [k, v] : rec.params) params.add(k, v);
    JsonObject o;
    o.add("kind", pluginKindName(rec.info.kind))
        .add("name", rec.info.name)
        .add("version", rec.info.version)
        .add("abi_version", static_cast<uint64_t>(rec.info.abi_version))
        .add("path", rec.info.path.string())
        .add("origin", rec.info.origin)
        .add("description", rec.info.description)
        .raw("params", params.str());
    // The file's bytes now, just after the run loaded it: the version string is the author's claim, the hash says
    // whether two runs ran the same code. A file gone since loading is recorded as such, not a failed run.
    try {
      o.add("sha256", fileSha256Hex(rec.info.path));
    } catch (const std::exception& e) {
      o.add("sha256_error", e.what());
    }
    if (rec.caps) o.raw("caps", capsJson(*rec.caps));
    if (plugins.size() > 1) plugins += ',';
    plugins += o.str();
  }
  plugins += ']';
  return JsonObject()
      .add("git_commit", p.git_commit)
      .add("host", p.host)
      .add("start_time", p.start_time)
      .add("terse_version", p.terse_version)
      .add("transport", p.transport)
      .add("mode", p.mode)
      .add("world_size", p.world_size)
      .raw("link_emulation", link.str())
      .add("clock", p.clock)
      .raw("simulation", simulation.str())
      .raw("plugins", plugins)
      .str();
}

std::optional<std::string> gitCommitOf(const std::filesystem::path& dir) {
  return gitHeadOf(dir);
}

std::string gitCommit() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (auto head = gitHeadOf(exe.parent_path())) return *head;
  }
  if (auto head = gitHeadOf(std::filesystem::current_path(ec))) return *head;
  return "unknown";
}

std::string hostName() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return buf.data();
}

std::string isoTimeUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

ResultWriter::ResultWriter(const std::filesystem::path& root, std::string_view study, std::string_view variant)
    : dir_(root / std::string(study) / std::string(variant)), started_(isoTimeUtc()) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  TERSE_CHECK(!ec, InvalidArgument, "cannot create results folder " << dir_.string() << ": " << ec.message());
  const auto metrics = dir_ / std::string(kMetricsFile);
  metrics_ = std::fopen(metrics.c_str(), "wb");
  TERSE_CHECK(metrics_ != nullptr, InvalidArgument,
              "cannot write " << metrics.string() << ": " << std::strerror(errno));
  writeStatus(kStateRunning, "");
}

ResultWriter::~ResultWriter() {
  if (state_ == kStateRunning) {
    try {
      markFailed("the run ended without completing");
    } catch (...) {
      // A destructor must not throw; the status then still says "running", which is also true to a reader.
    }
  }
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void ResultWriter::writeConfig(std::string_view text) {
  writeFileAtomic(dir_ / std::string(kConfigFile), text);
}

void ResultWriter::writeProvenance(const Provenance& provenance) {
  writeFileAtomic(dir_ / std::string(kProvenanceFile), provenanceJson(provenance) + "\n");
}

void ResultWriter::append(const MetricsRecord& record) {
  const std::string line = metricsRecordJson(record) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), metrics_) == line.size() && std::fflush(metrics_) == 0;
  TERSE_CHECK(ok, InvalidArgument,
              "cannot append to " << (dir_ / std::string(kMetricsFile)).string() << ": " << std::strerror(errno));
  ++records_;
}

void ResultWriter::recount() {
  std::FILE* f = std::fopen((dir_ / std::string(kMetricsFile)).c_str(), "r");
  TERSE_CHECK(f != nullptr, InvalidArgument,
              "cannot read " << (dir_ / std::string(kMetricsFile)).string() << ": " << std::strerror(errno));
  int64_t lines = 0;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f))
    if (c == '\n') ++lines;
  std::fclose(f);
  records_ = lines;
}

void ResultWriter::markCompleted() {
  writeStatus(kStateCompleted, "");
}

void ResultWriter::markFailed(std::string_view error) {
  writeStatus(kStateFailed, error);
}

void ResultWriter::writeStatus(std::string_view state, std::string_view error) {
  JsonObject o;
  o.add("state", state).add("records", records_).add("started", started_).add("updated", isoTimeUtc());
  if (!error.empty()) o.add("error", error);
  writeFileAtomic(dir_ / std::string(kStatusFile), o.str() + "\n");
  state_ = std::string(state);
}

}  // namespace terse::results

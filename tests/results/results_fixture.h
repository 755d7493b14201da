// Synthetic result folders for the compare tests, written by the real ResultWriter so the reader is tested against
// what the runner produces, plus helpers to damage them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "results/result_writer.h"

namespace terse::results::testing {

namespace fs = std::filesystem;

struct Point {
  int64_t step;
  double accuracy;
  uint64_t wire;
  double wall_s;
};

struct RunSpec {
  RunSpec() = default;
  RunSpec(std::string study_name, std::string variant_name, std::string compressor_name, bool ef,
          std::vector<Point> pts)
      : study(std::move(study_name)),
        variant(std::move(variant_name)),
        compressor(std::move(compressor_name)),
        error_feedback(ef),
        points(std::move(pts)) {}

  std::string study = "s";
  std::string variant;
  std::string compressor = "none";
  bool error_feedback = false;
  std::string config_extra;  // more config lines, written as they are (e.g. "error_feedback_rule: EF21\n")
  std::vector<Point> points;
  std::string state = "completed";  // completed, failed, running
  std::string error;
  std::string hidden = "256";     // workload.hidden_sizes
  std::string batch_size = "32";  // data.batch_size
  std::string global_batch;       // data.global_batch_size; empty leaves it out
  bool simulated = false;         // provenance clock "simulated"
  bool flop_model = false;        // with simulated: compute by the FLOP model instead of measured
  std::string cpu = "Test CPU (family 1 model 2, 4 logical CPUs, avx2)";  // provenance "cpu"; "" leaves it out
  std::string gemm;                // provenance "gemm"; "" leaves it out (as in runs recorded before the field)
  std::string plugin_path;         // the compressor's file; empty: /plugins/terse_compressor_<compressor>.so (none)
  std::optional<Params> resolved;  // what the compressor reported (resolved_params_v1.h); nullopt: not reported
  std::vector<std::pair<std::string, std::string>> hook;  // provenance "hook" (a PyTorch hook's run); empty: none
  std::vector<std::pair<std::string, std::string>> module_files;  // provenance "module_files"; empty: none
  // A repeat (experiment.proto's seeds): `seeds` as the config lists them ("[1, 2, 3]") and this run's seed; the run
  // then goes to <study>/<variant>/seed-<seed>/ as the runner writes it.
  std::string seeds;
  uint64_t seed = 1;
  // A run at a point of its study's grid (experiment.proto grid_point): the variant's name in the file and the point's
  // (path, value) per axis; `variant` is then the run's own name, as the loader makes it ("dense.workers-8").
  std::string grid_variant;
  std::vector<std::pair<std::string, std::string>> grid;
};

inline std::string configText(const RunSpec& s) {
  std::ostringstream o;
  o << "study: \"" << s.study << "\"\nvariant: \"" << s.variant
    << "\"\nworkload {\n  name: \"mlp\"\n  hidden_sizes: " << s.hidden
    << "\n}\ndata {\n  dataset_dir: \"/usr/share/datasets/fashion-mnist\"\n  batch_size: " << s.batch_size
    << (s.global_batch.empty() ? "" : "\n  global_batch_size: " + s.global_batch)
    << "\n}\nworkers: 4\nmode: SYNC\ncompressor {\n  name: \"" << s.compressor
    << "\"\n}\nerror_feedback: " << (s.error_feedback ? "true" : "false") << "\nepochs: 3\nseed: " << s.seed << "\n";
  o << s.config_extra;
  if (!s.seeds.empty()) o << "seeds: " << s.seeds << "\n";
  if (s.simulated) o << "clock: SIMULATED\n";
  if (!s.grid_variant.empty()) {
    o << "grid_point {\n  variant: \"" << s.grid_variant << "\"\n";
    for (const auto& [path, value] : s.grid)
      o << "  coordinates {\n    path: \"" << path << "\"\n    value: \"" << value << "\"\n  }\n";
    o << "}\n";
  }
  return o.str();
}

inline fs::path writeRun(const fs::path& root, const RunSpec& s) {
  fs::path dir;
  {
    ResultWriter w(root, s.study, s.seeds.empty() ? s.variant : s.variant + "/seed-" + std::to_string(s.seed));
    dir = w.dir();
    w.writeConfig(configText(s));
    Provenance p;
    p.git_commit = "0123456789abcdef0123456789abcdef01234567";
    p.host = "testhost";
    p.cpu = s.cpu;
    p.gemm = s.gemm;
    p.start_time = "2026-01-01T00:00:00Z";
    p.terse_version = "0.1.0";
    p.transport = "inproc";
    p.mode = "sync";
    p.world_size = 4;
    p.link = {{"bandwidth", "1Gbps"}, {"latency", "50us"}};
    p.hook = s.hook;
    p.module_files = s.module_files;
    if (s.simulated) {
      p.clock = "simulated";
      p.simulation = {{"platform", "simgrid 3.32 CM02"},
                      {"compute", s.flop_model ? "FLOP model at 4e+10 flop/s" : "measured thread CPU time x 1"}};
    }
    PluginInfo info;
    info.kind = PluginKind::kCompressor;
    info.name = s.compressor;
    info.version = "1.0.0";
    info.abi_version = 1;
    info.path = s.plugin_path.empty() ? "/plugins/terse_compressor_" + s.compressor + ".so" : s.plugin_path;
    info.origin = "build tree";
    CompressorCaps caps{};
    caps.num_rounds = 1;
    p.plugins.push_back({info, caps, Params{}, s.resolved, {}});
    w.writeProvenance(p);
    for (const auto& pt : s.points) {
      MetricsRecord m;
      m.step = pt.step;
      m.epoch = pt.step / 100;
      m.test_accuracy = pt.accuracy;
      m.wire_bytes_per_worker = pt.wire;
      m.payload_bytes_per_worker = pt.wire / 2;
      m.wall_s = pt.wall_s;
      m.compute_s_per_step = 0.001;
      m.compress_s_per_step = 0.0002;
      m.decompress_s_per_step = 0.0001;
      m.comm_s_per_step = 0.004;
      m.exposed_comm_s_per_step = 0.003;
      m.step_s_per_step = 0.0045;
      w.append(m);
    }
    if (s.state == "completed") w.markCompleted();
    if (s.state == "failed") w.markFailed(s.error);
  }
  // The writer marks a run it leaves "running" as failed when it goes away; a killed run never gets that far.
  if (s.state == "running")
    writeFileAtomic(dir / "status.json",
                    "{\"state\":\"running\",\"records\":" + std::to_string(s.points.size()) + "}\n");
  return dir;
}

inline void appendText(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::app | std::ios::binary);
  out << text;
}

inline std::string readText(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh folder per test under the build tree (never the source tree).
inline fs::path freshDir(const std::string& name) {
  const fs::path dir = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "results_out" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The study of the known-answer tests (target 0.85):
//   dense   (none)  0.70 / 0.80 / 0.90 at 1000 / 2000 / 3000 B  -> 2500 B, 2.5 s (half way); 10 B/step
//   topk            0.60 / 0.86 / 0.88 at  100 /  200 /  300 B  -> 100 + 100 * 0.25/0.26 B; 1 B/step, ratio 10
//   fp16            0.90 at the first point (500 B, 0.5 s)       -> that point; 5 B/step, ratio 2
//   signsgd         0.70 / 0.75 / 0.80                            -> not reached, final 0.80
//   qsgd   failed   0.50 at 500 B                                 -> not reached, final 0.50, marked failed
inline std::vector<RunSpec> knownStudy() {
  std::vector<RunSpec> v;
  v.push_back({"s", "dense", "none", false, {{100, 0.70, 1000, 1.0}, {200, 0.80, 2000, 2.0}, {300, 0.90, 3000, 3.0}}});
  v.push_back({"s", "topk", "topk", true, {{100, 0.60, 100, 1.0}, {200, 0.86, 200, 2.0}, {300, 0.88, 300, 3.0}}});
  v.push_back({"s", "fp16", "fp16", false, {{100, 0.90, 500, 0.5}}});
  v.push_back({"s", "signsgd", "signsgd", false, {{100, 0.70, 10, 1.0}, {200, 0.75, 20, 2.0}, {300, 0.80, 30, 3.0}}});
  RunSpec failed{"s", "qsgd", "qsgd", false, {{100, 0.50, 500, 1.0}}};
  failed.state = "failed";
  failed.error = "rank 2: qsgd: compress failed";
  v.push_back(failed);
  return v;
}

inline bool anyContains(const std::vector<std::string>& v, const std::string& a, const std::string& b = "") {
  for (const auto& s : v)
    if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
  return false;
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

}  // namespace terse::results::testing

// Issue 44: a quickstart-like run gives the same numbers whatever x86-64 vector instructions it may use and whatever
// core OpenBLAS would pick. `terse run` trains the quickstart's MLP {256, 128} on a slice of Fashion-MNIST under
// every TERSE_CPU_ISA cap and under the OPENBLAS_CORETYPE values this CPU can run, with the default GEMM kernel
// (experiments/workloads/gemm.h), and every metrics.jsonl must be the same bytes, time fields aside. Under OpenBLAS's
// own kernels the cores' summation orders differ, and so would the digits (the issue: 0.8907 on a Xeon, 0.8879 on a
// Zen 5); the case prints whether two cores differ here too, which shows the comparison can see such a difference.
// Simulated time with the FLOP model, so nothing in a record but the math and the config decides it (the sync math
// never depends on the clock: DESIGN.md section 9).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/common/json.h"
#include "experiments/workloads/fashion_mnist.h"
#include "runner_test_util.h"
#include "terse/sdk/cpu.hpp"

namespace terse::runner {
namespace {
using namespace test_util;
namespace cpu = sdk::cpu;

constexpr const char* kGemmStudy = R"(study: "gemm_determinism"
workload {
  name: "mlp"
  hidden_sizes: [256, 128]
}
data {
  batch_size: 32
  train_subset: 1024
  test_subset: 1000
}
optimizer {
  lr: 0.05
  momentum: 0.9
  weight_decay: 0.0001
  warmup_steps: 5
  schedule: COSINE
}
workers: 2
clock: SIMULATED
simulation { compute: FLOP_MODEL }
link {
  bandwidth: "1Gbps"
  latency: "50us"
}
compressor { name: "none" }
epochs: 2
eval {
  every_steps: 8
  per_epoch: true
}
seed: 1
)";

// One `terse run` of the study with these variables set (and the GEMM, ISA and core variables otherwise unset, so the
// user's environment cannot choose for the test); returns metrics.jsonl, each record without its time fields (wall_s
// and the *_s_per_step means), or "" after a failure it reports.
std::string runWith(const fs::path& config, const fs::path& out, const std::string& vars) {
  const std::string cmd = "env -u TERSE_GEMM -u TERSE_CPU_ISA -u OPENBLAS_CORETYPE " + vars + " '" +
                          TERSE_TEST_TERSE_BIN + "' run '" + config.string() + "' --out '" + out.string() +
                          "' --plugin-path '" + TERSE_TEST_BUILD_PLUGIN_DIR + "' 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return "";
  }
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << vars << ": terse run failed:\n" << output;
    return "";
  }
  const fs::path dir = out / "gemm_determinism" / "base";
  std::string records;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto record = parseJsonObject(line);
    if (!record) {
      ADD_FAILURE() << vars << ": unparseable record " << line;
      return "";
    }
    for (auto it = record->begin(); it != record->end();) {
      const std::string& key = it.key();
      const bool time = key == "wall_s" || (key.size() > 11 && key.ends_with("_s_per_step"));
      it = time ? record->erase(it) : std::next(it);
    }
    records += dumpJson(*record) + "\n";
  }
  const auto prov = parseJsonObject(readFile(dir / "provenance.json"));
  EXPECT_TRUE(prov.has_value()) << vars;
  if (prov) std::cout << vars << ": gemm " << getString(*prov, "gemm").value_or("(none)") << "\n";
  return records;
}

// "" when the two streams are the same bytes, else the first record where they part, both ways.
std::string firstDifferentRecord(const std::string& got, const std::string& want) {
  if (got == want) return "";
  std::istringstream g(got), w(want);
  std::string gl, wl;
  for (int line = 1;; ++line) {
    const bool more_g = static_cast<bool>(std::getline(g, gl)), more_w = static_cast<bool>(std::getline(w, wl));
    if (!more_g && !more_w) return "same records, different bytes";
    if (gl != wl || more_g != more_w)
      return "record " + std::to_string(line) + ":\n  got  " + (more_g ? gl : "(none)") + "\n  want " +
             (more_w ? wl : "(none)");
  }
}

TEST(GemmDeterminism, SameMetricsUnderEveryIsaCapAndOpenBlasCore) {
  if (!fs::is_directory(workloads::kDefaultFashionMnistDir))
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << workloads::kDefaultFashionMnistDir
                 << " (apt-get install dataset-fashion-mnist)";
  const fs::path dir = freshDir("gemm_determinism");
  const fs::path config = dir / "study.textproto";
  std::ofstream(config) << kGemmStudy;

  // OpenBLAS takes a forced core at its word (driver/others/dynamic.c of the 0.3.2x sources: force_coretype checks no
  // CPU feature), so its kernels would fault on a CPU without theirs; the fixed kernel never calls them, the control
  // below does.
  std::vector<std::string> cores = {"Prescott"};
  if (cpu::hostHas(cpu::Feature::kAvx)) cores.push_back("Sandybridge");
  if (cpu::hostHas(cpu::Feature::kX86_64_v3)) cores.insert(cores.end(), {"Haswell", "Zen"});
  if (cpu::hostHas(cpu::Feature::kX86_64_v4)) cores.push_back("SkylakeX");

  const std::string reference = runWith(config, dir / "reference", "");
  ASSERT_FALSE(reference.empty());
  ASSERT_NE(reference.find("\"test_accuracy\""), std::string::npos) << reference;
  // Each cap once, each core once; a pair per run, since the fixed kernel reads neither variable of the other's.
  const std::vector<std::string> isas = {"scalar", "avx2", "avx512", "native"};
  const std::size_t runs = std::max(isas.size(), cores.size());
  for (std::size_t i = 0; i < runs; ++i) {
    const std::string vars = "TERSE_CPU_ISA=" + isas[i % isas.size()] + " OPENBLAS_CORETYPE=" + cores[i % cores.size()];
    const std::string got = runWith(config, dir / ("run" + std::to_string(i)), vars);
    EXPECT_EQ(firstDifferentRecord(got, reference), "") << vars << " changed the metrics";
  }

  // The control: OpenBLAS's own kernels under the widest and the narrowest core.
  if (cores.size() >= 2) {
    const std::string narrow =
        runWith(config, dir / "openblas_narrow", "TERSE_GEMM=openblas OPENBLAS_CORETYPE=" + cores.front());
    const std::string wide =
        runWith(config, dir / "openblas_wide", "TERSE_GEMM=openblas OPENBLAS_CORETYPE=" + cores.back());
    std::cout << "control: TERSE_GEMM=openblas gives " << (narrow == wide ? "the same" : "different")
              << " metrics under OPENBLAS_CORETYPE=" << cores.front() << " and " << cores.back()
              << "; the fixed kernel "
              << (narrow == reference || wide == reference ? "matches one of them" : "matches neither") << "\n";
  }
}

}  // namespace
}  // namespace terse::runner

// The workloads' GEMM kernels (experiments/workloads/gemm.h) on the quickstart MLP's products: terse's fixed order at
// each x86-64 level this CPU has (v4: AVX-512, v3: AVX2, 0: SSE2) against OpenBLAS's sgemm (one thread, its core for
// this CPU or OPENBLAS_CORETYPE's), in one process, so the summary's ratios compare kernels measured side by side.
// Shapes per layer of the MLP {256, 128} at a batch: forward op(X) W^T (NT), the weight gradient delta^T X (TN), the
// input gradient delta W (NN). For steadier ratios on a busy machine:
//
//   build/bin/terse-bench-gemm --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "experiments/workloads/gemm.h"
#include "experiments/workloads/nn_ops.h"
#include "terse/sdk/cpu.hpp"
#include "tests/bench/median_reporter.h"

namespace terse::workloads {
namespace {

struct GemmShape {
  std::string name;
  bool ta, tb;
  int64_t m, n, k;
};

std::vector<GemmShape> mlpShapes(int64_t batch) {
  const std::string b = std::to_string(batch);
  return {{"fwd0_NT_" + b + "x256x784", false, true, batch, 256, 784},
          {"fwd1_NT_" + b + "x128x256", false, true, batch, 128, 256},
          {"fwd2_NT_" + b + "x10x128", false, true, batch, 10, 128},
          {"dW0_TN_256x784x" + b, true, false, 256, 784, batch},
          {"dW1_TN_128x256x" + b, true, false, 128, 256, batch},
          {"dW2_TN_10x128x" + b, true, false, 10, 128, batch},
          {"dX1_NN_" + b + "x256x128", false, false, batch, 256, 128},
          {"dX2_NN_" + b + "x128x10", false, false, batch, 128, 10}};
}

std::vector<float> benchValues(std::size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

// kernel: "openblas", "fixed" (what gemm() runs under TERSE_CPU_ISA) or "fixed-v4", "fixed-v3", "fixed-v0".
void runGemm(benchmark::State& state, const std::string& kernel, const GemmShape& s) {
  const std::vector<float> a = benchValues(static_cast<std::size_t>(s.m * s.k), 1),
                           b = benchValues(static_cast<std::size_t>(s.k * s.n), 2);
  std::vector<float> c = benchValues(static_cast<std::size_t>(s.m * s.n), 3);
  const int level = kernel == "fixed-v4" ? 4 : kernel == "fixed-v3" ? 3 : 0;
  for (auto _ : state) {
    if (kernel == "openblas") {
      gemmOpenBlas(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 1.0f, c.data());
    } else if (kernel == "fixed") {
      gemmFixed(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 1.0f, c.data());
    } else {
      gemmFixedAtLevel(level, s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 1.0f, c.data());
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(2 * s.m * s.n * s.k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Prints, after the console table, each shape's GFLOP/s per kernel (medians of repetitions when there are several) and
// each fixed level's ratio to OpenBLAS, and the same for a whole step's products (the sum of the shapes' times).
class GemmSummary : public terse::bench::MedianReporter {
 public:
  explicit GemmSummary(OutputOptions options) : MedianReporter(options) {}

  void print(const std::vector<GemmShape>& shapes, const std::vector<std::string>& kernels) const {
    std::printf("\nsummary (GFLOP/s, one thread%s; ratio = fixed / openblas, measured in this run)\n",
                !haveMedians() ? "" : ", medians of the repetitions");
    std::printf("%-24s", "shape");
    for (const auto& k : kernels) std::printf(" %10s", k.c_str());
    for (const auto& k : kernels)
      if (k != "openblas")
        std::printf(" %12s", ("ratio " + k.substr(k.find('-') == std::string::npos ? 0 : 6)).c_str());
    std::printf("\n");
    std::map<std::string, double> step_seconds;
    double step_flop = 0;
    for (const auto& s : shapes) {
      std::printf("%-24s", s.name.c_str());
      std::map<std::string, double> g;
      for (const auto& k : kernels) {
        const Run* r = find("gemm/" + k + "/" + s.name);
        g[k] = r == nullptr ? 0 : r->counters.at("GFLOP/s").value;
        std::printf(" %10.1f", g[k]);
        if (g[k] > 0) step_seconds[k] += static_cast<double>(2 * s.m * s.n * s.k) * 1e-9 / g[k];
      }
      step_flop += static_cast<double>(2 * s.m * s.n * s.k) * 1e-9;
      for (const auto& k : kernels)
        if (k != "openblas") std::printf(" %12.2f", g["openblas"] > 0 ? g[k] / g["openblas"] : 0.0);
      std::printf("\n");
    }
    std::printf("%-24s", "whole step");
    for (const auto& k : kernels) std::printf(" %10.1f", step_seconds[k] > 0 ? step_flop / step_seconds[k] : 0.0);
    for (const auto& k : kernels)
      if (k != "openblas")
        std::printf(" %12.2f", step_seconds[k] > 0 ? step_seconds["openblas"] / step_seconds[k] : 0.0);
    std::printf("\n");
  }
};

}  // namespace
}  // namespace terse::workloads

int main(int argc, char** argv) {
  using namespace terse::workloads;
  namespace cpu = terse::sdk::cpu;
  setBlasThreads(1);  // as the runner's workers have it
  std::vector<GemmShape> shapes = mlpShapes(32);
  for (auto& s : mlpShapes(64)) shapes.push_back(s);
  std::vector<std::string> kernels = {"openblas", "fixed"};
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v4)) kernels.push_back("fixed-v4");
  if (gemmHasCloneLevels() && cpu::hostHas(cpu::Feature::kX86_64_v3)) kernels.push_back("fixed-v3");
  kernels.push_back("fixed-v0");
  for (const auto& s : shapes)
    for (const auto& k : kernels)
      benchmark::RegisterBenchmark(("gemm/" + k + "/" + s.name).c_str(),
                                   [k, s](benchmark::State& st) { runGemm(st, k, s); });
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  GemmSummary reporter(benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print(shapes, kernels);
  std::printf("fixed: the level TERSE_CPU_ISA leaves (x86-64-v%d, 0: baseline); %s\n", cpu::cloneLevel(),
              openBlasDescription().c_str());
  benchmark::Shutdown();
  return 0;
}

// terse-bench-topk-cuda: the exact top-k selection on the GPU (terse/kit/topk_candidates.cuh) at 2^20 to 2^28 f32
// elements and k of 0.1% and 1% of them, beside what it is measured against, in the same run and on the same input
// (standard-normal values made on the device, device_bench.cuh):
//
//   copy        a device-to-device cudaMemcpyAsync of the input: the yardstick of every GPU table in
//               results/reference/gpu. Any exact selection reads the input once and writes k values and k indices,
//               4 + 8k/n bytes per element against the copy's 8, so it could run at up to 1.96x (1%) a copy.
//   fused       selectTopK, what the topk plugin runs: the top digit on the tensor, then (when the candidates fit
//               their buffer) one DeviceSelect of the candidates and the rest on those; two passes over the tensor.
//   five-pass   radixSelect + compactByCut, three histograms and the two compaction passes on the tensor: topk's
//               selection before the fused one, and still dgc's exact path.
//   sort        a full cub radix sort of (|g| key, index) pairs (topk_sort_reference.h).
//
// cub::DeviceTopK, the other reference issue 42 names, is not in the CCCL this benchmark is built with where that is
// CUDA 13.0's (CCCL 3.0; the GPU machine runs the binary built on the CPU machine); the summary says whether the
// header was there at build time. Measuring against it is left for a build whose CCCL has it.
//
// Each case times its calls between CUDA events on one stream (manual time) and keeps the median of its iterations.
// After the timed loops every case checks its selection: the fused payload against the five-pass one (values and
// indices, byte for byte) and against the sort's first k indices ("#wrong" counts the indices that differ), and reads
// back which way the fused selection took (candidates or tensor) and how many candidates it copied.
//
// Options beyond Google Benchmark's: --min-log2=N and --max-log2=N (default 20 and 28, every second power).
// Without a CUDA device it says why and exits with status 0 (CI builds it everywhere, runs it nowhere).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "terse/kit/topk_candidates.cuh"
#include "tests/bench/device_bench.cuh"
#include "tests/bench/topk_sort_reference.h"

#if __has_include(<cub/device/device_topk.cuh>)
#define TERSE_BENCH_HAVE_DEVICE_TOPK 1
#else
#define TERSE_BENCH_HAVE_DEVICE_TOPK 0
#endif

namespace terse::bench {
namespace {

namespace tc = kit::topk::cuda;
namespace tk = kit::topk;

const double kRatios[] = {0.001, 0.01};

struct Bench {
  cuda::Stream stream{cuda::Stream::Priority::kHigh};
  cuda::DeviceBuffer input, output;
  std::map<std::string, double> median_ms;  // per benchmark name
};
Bench* g = nullptr;

template <class Call>
void timeLoop(benchmark::State& state, const std::string& name, Call call) {
  const double ms = medianDeviceMs(state, g->stream.get(), call);
  if (ms > 0) g->median_ms[name] = ms;
}

std::string sizeName(uint64_t n) {
  return "2^" + std::to_string(__builtin_ctzll(n));
}

std::string caseName(const char* what, uint64_t n, double ratio) {
  char r[16];
  std::snprintf(r, sizeof r, "%g%%", ratio * 100);
  return std::string(what) + "/" + sizeName(n) + "/" + r;
}

void benchCopy(benchmark::State& state, uint64_t n) {
  timeLoop(state, "copy/" + sizeName(n), [&] {
    TERSE_CUDA_CHECK(
        cudaMemcpyAsync(g->output.data(), g->input.data(), 4 * n, cudaMemcpyDeviceToDevice, g->stream.get()));
  });
}

void benchSort(benchmark::State& state, uint64_t n) {
  TopKSortReference sort(n, g->stream.get());
  timeLoop(state, "sort/" + sizeName(n), [&] { sort.run(g->input.as<float>(), g->stream.get()); });
}

// One selection's buffers: its workspace and the k values and indices it writes.
struct Selection {
  uint64_t n = 0, k = 0;
  cuda::DeviceBuffer workspace, values, indices;
  Selection(uint64_t n_, uint64_t k_, uint64_t workspace_bytes)
      : n(n_),
        k(k_),
        workspace(workspace_bytes, g->stream.get()),
        values(4 * k_, g->stream.get()),
        indices(4 * k_, g->stream.get()) {}
};

void runFused(Selection& s, const tc::TopKLayout& l) {
  tc::selectTopK(g->input.as<float>(), s.n, s.k, l, s.workspace.as<std::byte>(), s.values.as<float>(),
                 s.indices.as<uint32_t>(), g->stream.get());
}

void runFivePass(Selection& s, const tc::Layout& l) {
  auto* ws = s.workspace.as<std::byte>();
  tc::radixSelect(g->input.as<float>(), s.n, s.k, reinterpret_cast<tc::State*>(ws),
                  reinterpret_cast<uint32_t*>(ws + l.hist), g->stream.get());
  tc::compactByCut(g->input.as<float>(), s.n, s.k, l, ws, s.values.as<float>(), s.indices.as<uint32_t>(),
                   g->stream.get());
}

void benchFused(benchmark::State& state, uint64_t n, double ratio) {
  const uint64_t k = tk::targetCount(ratio, n);
  const tc::TopKLayout l = tc::topKLayoutFor(n, k);
  Selection s(n, k, l.total);
  timeLoop(state, caseName("fused", n, ratio), [&] { runFused(s, l); });
}

void benchFivePass(benchmark::State& state, uint64_t n, double ratio) {
  const uint64_t k = tk::targetCount(ratio, n);
  const tc::Layout l = tc::layoutFor(n);
  Selection s(n, k, l.total);
  timeLoop(state, caseName("five-pass", n, ratio), [&] { runFivePass(s, l); });
}

// What a case's check found (see the top of the file).
struct Check {
  bool on_candidates = false;
  uint64_t candidates = 0;
  uint64_t differs_from_five_pass = 0;  // bytes of values and indices
  uint64_t wrong = 0;                   // indices that differ from the sort's first k
};

template <class T>
std::vector<T> toHost(const cuda::DeviceBuffer& b) {
  std::vector<T> v(b.size() / sizeof(T));
  b.copyToHost(v.data(), v.size() * sizeof(T), g->stream.get());
  g->stream.synchronize();
  return v;
}

Check check(uint64_t n, double ratio, TopKSortReference& sort) {
  const uint64_t k = tk::targetCount(ratio, n);
  const tc::TopKLayout fl = tc::topKLayoutFor(n, k);
  const tc::Layout pl = tc::layoutFor(n);
  Selection fused(n, k, fl.total), five(n, k, pl.total);
  runFused(fused, fl);
  runFivePass(five, pl);
  Check c;
  const std::vector<std::byte> ws = toHost<std::byte>(fused.workspace);
  tc::State st;
  std::memcpy(&st, ws.data(), sizeof st);
  c.on_candidates = st.mode == tc::kOnCandidates;
  std::memcpy(&c.candidates, ws.data() + fl.selected, sizeof c.candidates);
  const auto fv = toHost<std::byte>(fused.values), pv = toHost<std::byte>(five.values);
  const auto fi = toHost<uint32_t>(fused.indices), pi = toHost<uint32_t>(five.indices);
  for (size_t j = 0; j < fv.size(); ++j) c.differs_from_five_pass += fv[j] != pv[j] ? 1 : 0;
  for (size_t j = 0; j < fi.size(); ++j) c.differs_from_five_pass += fi[j] != pi[j] ? 4 : 0;
  sort.run(g->input.as<float>(), g->stream.get());
  const std::vector<uint32_t> want = sort.topIndices(k, g->stream.get());
  for (size_t j = 0; j < want.size(); ++j) c.wrong += fi[j] != want[j] ? 1 : 0;
  return c;
}

void printSummary(const std::vector<uint64_t>& sizes) {
  const auto ms = [](const std::string& name) {
    const auto it = g->median_ms.find(name);
    return it == g->median_ms.end() ? 0.0 : it->second;
  };
  std::printf("\nsummary (medians; x copy = the copy's time over the selection's, for the same input bytes)\n");
  std::printf("%-6s %6s %10s %10s %10s %10s %7s %9s %8s %11s %10s %6s\n", "n", "k", "copy us", "fused us", "5-pass us",
              "sort us", "x copy", "x 5-pass", "x sort", "way", "cand. %n", "#wrong");
  for (uint64_t n : sizes) {
    std::unique_ptr<TopKSortReference> sort = std::make_unique<TopKSortReference>(n, g->stream.get());
    for (double ratio : kRatios) {
      const uint64_t k = tk::targetCount(ratio, n);
      const double copy = ms("copy/" + sizeName(n)), fused = ms(caseName("fused", n, ratio)),
                   five = ms(caseName("five-pass", n, ratio)), sorted = ms("sort/" + sizeName(n));
      const Check c = check(n, ratio, *sort);
      const auto over = [fused](double t) { return fused > 0 ? t / fused : 0.0; };
      std::printf("%-6s %6.3g %10.1f %10.1f %10.1f %10.1f %7.2f %9.2f %8.1f %11s %10.2f %6llu\n", sizeName(n).c_str(),
                  static_cast<double>(k), copy * 1e3, fused * 1e3, five * 1e3, sorted * 1e3, over(copy), over(five),
                  over(sorted), c.on_candidates ? "candidates" : "tensor",
                  100.0 * static_cast<double>(c.candidates) / static_cast<double>(n),
                  static_cast<unsigned long long>(c.wrong + c.differs_from_five_pass));
    }
  }
  std::printf(
      "#wrong: indices unlike the sort's first k, plus bytes unlike the five-pass payload. cub::DeviceTopK: %s\n",
      TERSE_BENCH_HAVE_DEVICE_TOPK ? "in this build's CCCL, not measured by this benchmark"
                                   : "not in this build's CCCL; the copy is the yardstick");
}

}  // namespace
}  // namespace terse::bench

int main(int argc, char** argv) {
  using namespace terse::bench;
  namespace cuda = terse::cuda;
  int min_log2 = 20, max_log2 = 28;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--min-log2=", 0) == 0) {
      min_log2 = std::stoi(a.substr(11));
    } else if (a.rfind("--max-log2=", 0) == 0) {
      max_log2 = std::stoi(a.substr(11));
    } else {
      args.push_back(argv[i]);
    }
  }
  if (min_log2 < 10 || max_log2 > 30 || min_log2 > max_log2) {
    std::cerr << "terse-bench-topk-cuda: --min-log2 and --max-log2 must satisfy 10 <= min <= max <= 30, got "
              << min_log2 << " and " << max_log2 << '\n';
    return 2;
  }
  if (const std::optional<int> status = start("terse-bench-topk-cuda", args)) return *status;
  Bench bench;
  g = &bench;
  std::vector<uint64_t> sizes;
  for (int b = min_log2; b <= max_log2; b += 2) sizes.push_back(uint64_t{1} << b);
  const uint64_t largest = sizes.back();
  bench.input = cuda::DeviceBuffer(4 * largest, bench.stream.get());
  bench.output = cuda::DeviceBuffer(4 * largest, bench.stream.get());
  fillNormal(bench.input.as<float>(), largest, bench.stream.get());
  TERSE_CUDA_CHECK(cudaGetLastError());
  bench.stream.synchronize();

  for (uint64_t n : sizes) {
    benchmark::RegisterBenchmark(("copy/" + sizeName(n)).c_str(), benchCopy, n)->UseManualTime();
    for (double ratio : kRatios) {
      benchmark::RegisterBenchmark(caseName("fused", n, ratio).c_str(), benchFused, n, ratio)->UseManualTime();
      benchmark::RegisterBenchmark(caseName("five-pass", n, ratio).c_str(), benchFivePass, n, ratio)->UseManualTime();
    }
    benchmark::RegisterBenchmark(("sort/" + sizeName(n)).c_str(), benchSort, n)->UseManualTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  printSummary(sizes);
  benchmark::Shutdown();
  g = nullptr;
  return 0;
}

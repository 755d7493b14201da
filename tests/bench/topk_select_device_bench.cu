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
// A second table is about small tensors, where launches, not bytes, set the time (most of a ResNet's 161 tensors hold
// 64 to 65,536 elements): at 2^10 to 2^18 elements and k of 1%, the topk plugin's two device ways, each timed by the
// wall clock over 200 calls queued back to back and one synchronization, so that the host's launch cost counts:
//   fused       the prefix write and selectTopK (18 launches);
//   one-block   topk_one_block.cuh's selectOneBlock, the prefix included (one launch), which the plugin takes up to
//               terse/kit/one_block.hpp's cut;
//   decode3     the grid-wide decode as the plugin runs it: the validation, a synchronization for its verdict, then the
//               clearing memset and the scatter;
//   decode1     the one-block decode: validation and scatter in one launch, then the synchronization.
// Each small case checks that both ways write the same payload byte for byte and both decodes the same output.
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
// Options beyond Google Benchmark's: --min-log2=N and --max-log2=N (default 20 and 28, every second power) for the
// first table.
// Without a CUDA device it says why and exits with status 0 (CI builds it everywhere, runs it nowhere).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "terse/kit/one_block.hpp"
#include "terse/kit/sparse_kernels.cuh"
#include "terse/kit/topk_candidates.cuh"
#include "terse/kit/topk_one_block.cuh"
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

// ---- Small tensors: the plugin's two device ways, timed with their launches (see the top of the file).

namespace ts = kit::sparse;

const uint64_t kSmallSizes[] = {uint64_t{1} << 10, uint64_t{1} << 12, uint64_t{1} << 14, uint64_t{1} << 16,
                                uint64_t{1} << 18};
constexpr double kSmallRatio = 0.01;
constexpr int kCallsPerIteration = 200;

// Runs `call` kCallsPerIteration times per iteration of `state` and synchronizes `stream` once; reports the wall time
// per call as the manual time and returns the median in milliseconds.
template <class Call>
double medianWallMsPerCall(benchmark::State& state, cudaStream_t stream, Call call) {
  std::vector<double> times;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCallsPerIteration; ++i) call();
    TERSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                      kCallsPerIteration;
    state.SetIterationTime(ms * 1e-3);
    times.push_back(ms);
  }
  if (times.empty()) return 0.0;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Any prefix of 24 bytes: the header and count the plugin would write (the selection and decode do not read it but
// to write or check it).
kit::device::Prefix smallPrefix(uint64_t k) {
  kit::device::Prefix p{};
  for (unsigned i = 0; i < 16; ++i) p.bytes[i] = std::byte{static_cast<unsigned char>(0x40 + i)};
  std::memcpy(p.bytes + 16, &k, sizeof k);
  p.size = static_cast<uint32_t>(ts::kFixedBytes);
  return p;
}

// What the plugin's device::writePrefix launches (terse/kit/device.cu, which only plugins link), so that the fused way
// counts the launch it makes in the plugin.
template <class Unused = void>
__global__ void writePrefixKernel(kit::device::Prefix prefix, std::byte* output) {
  for (unsigned i = threadIdx.x; i < prefix.size; i += blockDim.x) output[i] = prefix.bytes[i];
}

// One small case's buffers: the grid way's workspace, a payload per way, the decode's output and verdict word.
struct SmallCase {
  uint64_t n, k;
  tc::TopKLayout layout;
  kit::device::Prefix prefix;
  cuda::DeviceBuffer workspace, fused_payload, one_payload, out, status;
  explicit SmallCase(uint64_t n_)
      : n(n_),
        k(tk::targetCount(kSmallRatio, n_)),
        layout(tc::topKLayoutFor(n_, k)),
        prefix(smallPrefix(k)),
        workspace(layout.total, g->stream.get()),
        fused_payload(ts::payloadBytes(k), g->stream.get()),
        one_payload(ts::payloadBytes(k), g->stream.get()),
        out(4 * n_, g->stream.get()),
        status(sizeof(uint32_t), g->stream.get()) {
    status.fill(0, g->stream.get());
  }
  std::byte* fusedPayload() { return fused_payload.as<std::byte>(); }
  std::byte* onePayload() { return one_payload.as<std::byte>(); }

  void fused() {
    const cudaStream_t st = g->stream.get();
    writePrefixKernel<><<<1, 64, 0, st>>>(prefix, fusedPayload());
    tc::selectTopK(g->input.as<float>(), n, k, layout, workspace.as<std::byte>(),
                   reinterpret_cast<float*>(fusedPayload() + ts::kFixedBytes),
                   reinterpret_cast<uint32_t*>(fusedPayload() + ts::kFixedBytes + 4 * k), st);
  }
  void oneBlock() { tc::selectOneBlock(prefix, g->input.as<float>(), n, k, onePayload(), g->stream.get()); }
  // The plugin's two decodes of the one-block payload, written (not accumulated), each with its verdict's sync.
  void decode3() {
    const cudaStream_t st = g->stream.get();
    ts::launchValidateSparse<false>(prefix, onePayload(), k, n, 0, status.as<uint32_t>(), st);
    TERSE_CUDA_CHECK(cudaStreamSynchronize(st));
    ts::launchScatter(onePayload(), k, n, out.as<float>(), false, st);
  }
  void decode1() {
    const cudaStream_t st = g->stream.get();
    ts::launchValidateAndScatterOneBlock<false>(prefix, onePayload(), k, n, 0, out.as<float>(), false,
                                                status.as<uint32_t>(), st);
    TERSE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
};

std::string smallName(const char* what, uint64_t n) {
  return std::string("small/") + what + "/" + sizeName(n) + "/1%";
}

void benchSmall(benchmark::State& state, uint64_t n, int way) {
  SmallCase c(n);
  const char* names[] = {"fused", "one-block", "decode3", "decode1"};
  if (way == 2 || way == 3) c.oneBlock();  // a payload to decode
  const double ms = medianWallMsPerCall(state, g->stream.get(), [&] {
    switch (way) {
      case 0:
        c.fused();
        break;
      case 1:
        c.oneBlock();
        break;
      case 2:
        c.decode3();
        break;
      default:
        c.decode1();
        break;
    }
  });
  if (ms > 0) g->median_ms[smallName(names[way], n)] = ms;
}

// Bytes of the two payloads that differ, plus floats of the two decodes' outputs that differ, and a raised verdict.
uint64_t checkSmall(uint64_t n) {
  SmallCase c(n);
  c.fused();
  c.oneBlock();
  const auto fused = toHost<std::byte>(c.fused_payload), one = toHost<std::byte>(c.one_payload);
  uint64_t wrong = 0;
  for (size_t j = 0; j < fused.size(); ++j) wrong += fused[j] != one[j] ? 1 : 0;
  c.out.fill(0x7f, g->stream.get());
  c.decode3();
  const auto three = toHost<uint32_t>(c.out);
  c.out.fill(0x7f, g->stream.get());
  c.decode1();
  const auto single = toHost<uint32_t>(c.out);
  for (size_t j = 0; j < three.size(); ++j) wrong += three[j] != single[j] ? 1 : 0;
  wrong += toHost<uint32_t>(c.status)[0] != 0 ? 1 : 0;
  return wrong;
}

void printSmallSummary() {
  const auto ms = [](const std::string& name) {
    const auto it = g->median_ms.find(name);
    return it == g->median_ms.end() ? 0.0 : it->second;
  };
  std::printf(
      "\nsmall tensors (medians of the wall time a call, %d calls back to back; x = the grid way's time over the one "
      "block's)\n",
      kCallsPerIteration);
  std::printf("%-6s %6s %10s %13s %8s %11s %11s %9s %6s\n", "n", "k", "fused us", "one-block us", "x fused",
              "decode3 us", "decode1 us", "x decode", "#wrong");
  for (uint64_t n : kSmallSizes) {
    const double fused = ms(smallName("fused", n)), one = ms(smallName("one-block", n)),
                 d3 = ms(smallName("decode3", n)), d1 = ms(smallName("decode1", n));
    std::printf("%-6s %6llu %10.2f %13.2f %8.2f %11.2f %11.2f %9.2f %6llu\n", sizeName(n).c_str(),
                static_cast<unsigned long long>(tk::targetCount(kSmallRatio, n)), fused * 1e3, one * 1e3,
                one > 0 ? fused / one : 0.0, d3 * 1e3, d1 * 1e3, d1 > 0 ? d3 / d1 : 0.0,
                static_cast<unsigned long long>(checkSmall(n)));
  }
  std::printf(
      "#wrong: payload bytes unlike the fused way's, decoded floats unlike decode3's, a raised verdict. topk "
      "selects in one block up to %llu elements.\n",
      static_cast<unsigned long long>(kit::kOneBlockMaxNumel));
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
  // The input serves both tables: the small-tensor one reads up to its largest size whatever --max-log2 says.
  const uint64_t largest = std::max(sizes.back(), kSmallSizes[std::size(kSmallSizes) - 1]);
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
  for (uint64_t n : kSmallSizes) {
    int way = 0;
    for (const char* name : {"fused", "one-block", "decode3", "decode1"}) {
      benchmark::RegisterBenchmark(smallName(name, n).c_str(), benchSmall, n, way++)->UseManualTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  printSummary(sizes);
  printSmallSummary();
  benchmark::Shutdown();
  g = nullptr;
  return 0;
}

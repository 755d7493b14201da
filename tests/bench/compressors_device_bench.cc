// terse-bench-compressors-cuda: compress and decompress throughput of the built-in compressors on CUDA tensors, in
// GB/s of f32 input at 256 MiB (64M floats), beside a device-to-device cudaMemcpyAsync of the same bytes measured in
// the same run (STYLE.md 10; issue 9's target: casts and quantizers >= 0.8x the device copy). Each plugin runs through
// the core's Compressor wrapper, so the numbers include what a training step pays for the plugin boundary.
//
//   compress     one step on one rank, a new step each iteration (stochastic compressors draw fresh numbers)
//   decompress   the payload accumulated onto an output, as the core does per rank; this includes the one stream
//                synchronization a device decompress makes to learn the validation verdict
//   memcpy       the same number of bytes copied device to device
//
// Times are device times between CUDA events recorded on the stream around each call (manual time), so host-side
// launch overhead that overlaps earlier work does not count and a call that waits is charged its wait. After the run a
// table gives compress and decompress GB/s and their ratios to the copy.
//
// topk (ratio 0.01) also runs beside its reference, the full cub radix sort of (|g| key, index) pairs
// (topk_sort_reference.h), as "sort/topk_reference"; the summary prints the speedup (issue 9's target: >= 3x), and
// after the timed loop the sort's first k indices are checked against the plugin's payload ("#wrong" in the summary).
//
// Options beyond Google Benchmark's: --plugin-dir=DIR (default: the build tree's plugin directory), --mib=N (default
// 256). Without a CUDA device it says why and exits with status 0 (CI builds it everywhere, runs it nowhere).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "tests/bench/topk_sort_reference.h"

namespace terse {
namespace {

const char* const kCompressors[] = {"none",   "fp16",    "bf16", "qsgd",    "terngrad",
                                    "onebit", "signsgd", "topk", "randomk", "threshold"};

// Parameters beyond the defaults: threshold has no default tau; 2.576 passes about 1% of standard-normal gradients,
// the share topk and randomk send by default.
Params paramsFor(const std::string& name) {
  if (name == "threshold") return {{"tau", "2.576"}};
  return {};
}

uint64_t g_numel = uint64_t{64} << 20;

// What every benchmark shares: one stream, the input on the device, the memcpy reference.
struct Device {
  int index = 0;
  cuda::Stream stream{cuda::Stream::Priority::kHigh};
  cuda::DeviceBuffer input;
  cuda::DeviceBuffer output;
};
Device* g_device = nullptr;

// GB/s per benchmark name, for the summary.
std::map<std::string, double> g_rates;

TensorInfo tensorInfo(uint64_t step) {
  TensorInfo info;
  info.numel = g_numel;
  info.ndim = 1;
  info.shape[0] = static_cast<int64_t>(g_numel);
  info.device = TERSE_DEVICE_CUDA;
  info.device_index = g_device->index;
  info.tensor_id = 1;
  info.step = step;
  info.seed = 42;
  info.rank = 0;
  info.world_size = 1;
  info.source_rank = 0;
  return info;
}

// Runs `call` between two events on the benchmark stream and returns the device milliseconds between them.
template <class Call>
double deviceMilliseconds(Call call) {
  cuda::Event start(cuda::Event::Timing::kEnabled), stop(cuda::Event::Timing::kEnabled);
  start.record(g_device->stream.get());
  call();
  stop.record(g_device->stream.get());
  stop.synchronize();
  return stop.millisecondsSince(start);
}

void report(benchmark::State& state, const std::string& name, double total_ms) {
  const double bytes = static_cast<double>(state.iterations()) * 4.0 * static_cast<double>(g_numel);
  const double gbps = total_ms > 0 ? bytes / (total_ms * 1e-3) / 1e9 : 0.0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB/s"] = gbps;
  g_rates[name] = gbps;
}

void benchMemcpy(benchmark::State& state) {
  double total = 0;
  for (auto _ : state) {
    const double ms = deviceMilliseconds([] {
      TERSE_CUDA_CHECK(cudaMemcpyAsync(g_device->output.data(), g_device->input.data(), 4 * g_numel,
                                       cudaMemcpyDeviceToDevice, g_device->stream.get()));
    });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "memcpy_d2d", total);
}

void benchCompress(benchmark::State& state, const std::string& name, std::shared_ptr<const Compressor> c) {
  const CompressorSizes sizes = c->sizes(tensorInfo(0));
  cuda::DeviceBuffer payload(sizes.max_output_bytes, g_device->stream.get());
  cuda::DeviceBuffer workspace(sizes.workspace_bytes, g_device->stream.get());
  const Scratch scratch{{workspace.as<std::byte>(), workspace.size()}, {}};
  uint64_t step = 0;
  double total = 0;
  for (auto _ : state) {
    const TensorInfo info = tensorInfo(step++);
    const double ms = deviceMilliseconds([&] {
      c->compress(info, g_device->input.data(), {}, scratch, {payload.as<std::byte>(), payload.size()},
                  g_device->stream.handle());
    });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "compress/" + name, total);
  state.counters["ratio"] = 4.0 * static_cast<double>(g_numel) / static_cast<double>(sizes.max_output_bytes);
}

void benchDecompress(benchmark::State& state, const std::string& name, std::shared_ptr<const Compressor> c) {
  const TensorInfo info = tensorInfo(0);
  const CompressorSizes sizes = c->sizes(info);
  cuda::DeviceBuffer payload(sizes.max_output_bytes, g_device->stream.get());
  cuda::DeviceBuffer workspace(sizes.workspace_bytes, g_device->stream.get());
  const Scratch scratch{{workspace.as<std::byte>(), workspace.size()}, {}};
  const uint64_t bytes = c->compress(info, g_device->input.data(), {}, scratch,
                                     {payload.as<std::byte>(), payload.size()}, g_device->stream.handle());
  g_device->output.fill(0, g_device->stream.get());
  double total = 0;
  for (auto _ : state) {
    const double ms = deviceMilliseconds([&] {
      c->decompress(info, {payload.as<std::byte>(), bytes}, scratch, g_device->output.data(), true,
                    g_device->stream.handle());
    });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "decompress/" + name, total);
}

// Indices of the topk payload on the device whose set differs from the sort's first k: 0 when they agree (the
// payload is 24 B of header and count, k values, then k indices in ascending order).
uint64_t g_topk_wrong = 0;
bool g_topk_checked = false;

void benchTopKSort(benchmark::State& state, std::shared_ptr<const Compressor> topk) {
  bench::TopKSortReference sort(g_numel, g_device->stream.get());
  double total = 0;
  for (auto _ : state) {
    const double ms = deviceMilliseconds([&] { sort.run(g_device->input.as<float>(), g_device->stream.get()); });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "sort/topk_reference", total);

  const TensorInfo info = tensorInfo(0);
  const CompressorSizes sizes = topk->sizes(info);
  cuda::DeviceBuffer payload(sizes.max_output_bytes, g_device->stream.get());
  cuda::DeviceBuffer workspace(sizes.workspace_bytes, g_device->stream.get());
  const Scratch scratch{{workspace.as<std::byte>(), workspace.size()}, {}};
  topk->compress(info, g_device->input.data(), {}, scratch, {payload.as<std::byte>(), payload.size()},
                 g_device->stream.handle());
  const uint64_t k = (sizes.max_output_bytes - 24) / 8;
  std::vector<uint32_t> got(static_cast<size_t>(k));
  TERSE_CUDA_CHECK(cudaMemcpyAsync(got.data(), payload.as<std::byte>() + 24 + 4 * k, 4 * k, cudaMemcpyDeviceToHost,
                                   g_device->stream.get()));
  const std::vector<uint32_t> want = sort.topIndices(k, g_device->stream.get());
  g_topk_wrong = 0;
  for (size_t j = 0; j < want.size(); ++j) g_topk_wrong += got[j] != want[j] ? 1 : 0;
  g_topk_checked = true;
  state.counters["#wrong"] = static_cast<double>(g_topk_wrong);
}

void printSummary(const std::vector<std::string>& present) {
  const auto rate = [](const std::string& name) {
    const auto it = g_rates.find(name);
    return it == g_rates.end() ? 0.0 : it->second;
  };
  const double copy = rate("memcpy_d2d");
  std::printf("\nsummary (GB/s of f32 input, %llu MiB, device copy %.1f GB/s)\n",
              static_cast<unsigned long long>(g_numel * 4 >> 20), copy);
  std::printf("%-10s %12s %10s %14s %10s\n", "compressor", "compress", "x copy", "decompress", "x copy");
  for (const auto& p : present) {
    const double cg = rate("compress/" + p), dg = rate("decompress/" + p);
    std::printf("%-10s %12.1f %10.2f %14.1f %10.2f\n", p.c_str(), cg, copy > 0 ? cg / copy : 0.0, dg,
                copy > 0 ? dg / copy : 0.0);
  }
  if (g_topk_checked) {
    // Rates are of the same input bytes, so their ratio is the ratio of the times.
    const double sort = rate("sort/topk_reference"), topk = rate("compress/topk");
    std::printf(
        "topk 1%% compress vs the full cub radix sort of (key, index) pairs: %.1f vs %.1f GB/s, %.2fx "
        "(target >= 3x); #wrong %llu\n",
        topk, sort, sort > 0 ? topk / sort : 0.0, static_cast<unsigned long long>(g_topk_wrong));
  }
}

}  // namespace
}  // namespace terse

int main(int argc, char** argv) {
  using namespace terse;
  std::filesystem::path plugin_dir = TERSE_BENCH_PLUGIN_DIR;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--plugin-dir=", 0) == 0) {
      plugin_dir = a.substr(13);
      continue;
    }
    if (a.rfind("--mib=", 0) == 0) {
      g_numel = std::stoull(a.substr(6)) << 18;  // MiB of f32
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  const cuda::DeviceSummary summary = cuda::deviceSummary();
  if (summary.count == 0) {
    std::cout << "terse-bench-compressors-cuda: no CUDA device (" << summary.reason << "); nothing to measure\n";
    return 0;
  }
  std::cout << summary.first_name << ", " << summary.runtime << '\n';
  Device device;
  TERSE_CUDA_CHECK(cudaGetDevice(&device.index));
  g_device = &device;
  {
    // Standard-normal gradients, made once on the host.
    std::vector<float> host(static_cast<size_t>(g_numel));
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : host) x = normal(gen);
    device.input = cuda::DeviceBuffer(4 * g_numel, device.stream.get());
    device.output = cuda::DeviceBuffer(4 * g_numel, device.stream.get());
    device.input.copyFromHost(host.data(), device.input.size(), device.stream.get());
    device.stream.synchronize();
  }

  auto loader = PluginLoader::withSearchDirs({{plugin_dir, "--plugin-dir", true}});
  std::vector<std::string> present;
  benchmark::RegisterBenchmark("memcpy_d2d", benchMemcpy)->UseManualTime()->Unit(benchmark::kMillisecond);
  for (const char* name : kCompressors) {
    std::shared_ptr<const Compressor> instance;
    try {
      instance = loader.loadCompressor(name)->instantiate(paramsFor(name));
      if ((instance->caps(DType::kF32).devices & TERSE_DEVICE_CUDA) == 0) {
        std::cerr << "terse-bench-compressors-cuda: skipping " << name << ": no CUDA kernels in this build\n";
        continue;
      }
    } catch (const std::exception& e) {
      std::cerr << "terse-bench-compressors-cuda: skipping " << name << ": " << e.what() << '\n';
      continue;
    }
    present.emplace_back(name);
    benchmark::RegisterBenchmark(("compress/" + std::string(name)).c_str(), benchCompress, std::string(name), instance)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decompress/" + std::string(name)).c_str(), benchDecompress, std::string(name),
                                 instance)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    if (std::string(name) == "topk") {
      benchmark::RegisterBenchmark("sort/topk_reference", benchTopKSort, instance)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  printSummary(present);
  benchmark::Shutdown();
  g_device = nullptr;
  return 0;
}

// What the CUDA benchmarks that compile kernels of their own share (terse-bench-topk-cuda, terse-bench-quantize-cuda):
//   inputs   standard-normal values made on the device from a hash of the index (splitmix64, then Box-Muller), so
//            every size's input is a prefix of the largest and 2^28 values take milliseconds, where the host would take
//            seconds;
//   timing   a Google Benchmark loop timed between CUDA events on one stream (manual time), keeping the median;
//   start    Google Benchmark's options, then the device: without one a benchmark says why and exits with status 0
//            (CI builds it everywhere, runs it nowhere).
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <vector>

#include "core/common/cuda.h"

namespace terse::bench {

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class Unused = void>
__global__ void normalKernel(float* x, uint64_t n) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = splitmix(i);
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * 0x1p-24f;  // (0, 1]
    const float u2 = static_cast<float>((h >> 16) & 0xffffffu) * 0x1p-24f;
    x[i] = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

// Fills x[0..n) on `stream` (queued, not waited for).
inline void fillNormal(float* x, uint64_t n, cudaStream_t stream) {
  normalKernel<><<<4096, 256, 0, stream>>>(x, n);
}

// Runs `call` once per iteration of `state` between two events recorded on `stream`, reports each iteration's device
// time as the benchmark's manual time, and returns the median in milliseconds (0 when nothing ran).
template <class Call>
double medianDeviceMs(benchmark::State& state, cudaStream_t stream, Call call) {
  std::vector<double> times;
  for (auto _ : state) {
    cuda::Event start(cuda::Event::Timing::kEnabled), stop(cuda::Event::Timing::kEnabled);
    start.record(stream);
    call();
    stop.record(stream);
    stop.synchronize();
    const double ms = stop.millisecondsSince(start);
    state.SetIterationTime(ms * 1e-3);
    times.push_back(ms);
  }
  if (times.empty()) return 0.0;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Hands `args` (the program's arguments less its own options) to Google Benchmark, then looks for a device. Returns the
// status main should exit with -- 2 for an option neither knows, 0 without a device (said on stdout) -- or nothing
// when there is a device to measure (its name and runtime said on stdout).
inline std::optional<int> start(const char* program, std::vector<char*>& args) {
  int argn = static_cast<int>(args.size());
  benchmark::Initialize(&argn, args.data());
  if (benchmark::ReportUnrecognizedArguments(argn, args.data())) return 2;
  const cuda::DeviceSummary summary = cuda::deviceSummary();
  if (summary.count == 0) {
    std::cout << program << ": no CUDA device (" << summary.reason << "); nothing to measure\n";
    return 0;
  }
  std::cout << summary.first_name << ", " << summary.runtime << '\n';
  return std::nullopt;
}

}  // namespace terse::bench

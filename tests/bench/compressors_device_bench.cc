// terse-bench-compressors-cuda: compress and decompress throughput of the built-in compressors on CUDA tensors, in
// GB/s of f32 input at 256 MiB (64M floats), beside a device-to-device cudaMemcpyAsync of the same bytes measured in
// the same run (docs/STYLE.md 10; issue 9's target: casts and quantizers >= 0.8x the device copy). Each plugin runs
// through the core's Compressor wrapper, so the numbers include what a training step pays for the plugin boundary.
//
//   compress     one step on one rank, a new step each iteration (stochastic compressors draw fresh numbers)
//   decompress   the payload accumulated onto an output, as the core does per rank; this includes the one stream
//                synchronization a device decompress makes to learn the validation verdict
//   memcpy       the same number of bytes copied device to device
//
// Times are device times between CUDA events recorded on the stream around each call (manual time), so host-side
// launch overhead that overlaps earlier work does not count and a call that waits is charged its wait. After the run a
// table gives compress and decompress GB/s, their ratios to the copy and to each call's own memory bound
// (trafficPerElement).
//
// topk (ratio 0.01) also runs beside its reference, the full cub radix sort of (|g| key, index) pairs
// (topk_sort_reference.h), as "sort/topk_reference"; the summary prints the speedup (issue 9's target: >= 3x), and
// after the timed loop the sort's first k indices are checked against the plugin's payload ("#wrong" in the summary).
// dgc (ratio 0.01) runs beside it: the summary prints its speed against topk's (the point of DGC's sampling is to beat
// the exact selection), and after the run its device payload is compared with the host path's for the same input,
// step and seed (variable size: the bytes must agree in size and content; "#wrong" counts the differing bytes).
//
// powersgd (rank 4) runs as a 4096-row matrix and as a tall one of 128 columns ("powersgd-tall"), both rounds of a step
// per compress iteration (see benchPowerSgdCompress); after the run one step of each is checked against the host path
// within powersgd's tolerance. Its decode runs beside cuBLAS's f32 GEMM of the same shapes
// ("gemm/powersgd_decode_reference", out += P^ Q'^T with beta 1): the summary prints their ratio, the evidence for
// keeping the decode a kernel of its own (powersgd.cu). The two GEMMs of compress run alone too (gemm/powersgd_mq,
// gemm/powersgd_mtp), and the summary splits compress's time between them and the rest.
//
// Options beyond Google Benchmark's: --plugin-dir=DIR (default: the build tree's plugin directory), --mib=N (default
// 256). Without a CUDA device it says why and exits with status 0 (CI builds it everywhere, runs it nowhere).
#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "tests/bench/topk_sort_reference.h"

namespace terse {
namespace {

const char* const kCompressors[] = {"none",   "fp16",    "bf16", "qsgd", "terngrad", "natural",
                                    "onebit", "signsgd", "topk", "dgc",  "randomk",  "threshold"};

// Parameters beyond the defaults: threshold has no default tau; 2.576 passes about 1% of standard-normal gradients,
// the share topk and randomk send by default.
Params paramsFor(const std::string& name) {
  if (name == "threshold") return {{"tau", "2.576"}};
  return {};
}

uint64_t g_numel = uint64_t{64} << 20;

// Device memory traffic per f32 input element at this benchmark's parameters, pass by pass in each compressor's
// <name>_cuda.h: what sets the fastest a call can run, 8 B (a copy's 4 read + 4 written) over these bytes as a fraction
// of the device copy. The summary prints achieved / bound beside achieved / copy: how far a kernel is from its own
// memory traffic, not from a copy it need not match. Sparse payloads count whole 32-byte sectors for their gathers
// and scatters (their bounds are 11-22x a copy, where launches and the verdict's synchronization set the time).
struct Traffic {
  double compress = 0;
  double decompress = 0;
};
const std::map<std::string, Traffic>& trafficPerElement() {
  static const std::map<std::string, Traffic> bytes = {
      {"none", {8.0, 12.0}},
      {"fp16", {6.0, 10.0}},
      {"bf16", {6.0, 10.0}},
      {"qsgd", {9.016, 9.016}},
      {"qsgd-r16", {9.016, 9.016}},
      {"qsgd-r8", {9.016, 9.016}},
      {"terngrad", {8.281, 8.516}},
      {"terngrad-r16", {8.281, 8.516}},
      {"terngrad-r8", {8.281, 8.516}},
      {"natural", {9.125, 10.125}},
      {"natural-r16", {9.125, 10.125}},
      {"natural-r8", {9.125, 10.125}},
      {"onebit", {8.141, 8.156}},
      {"signsgd", {4.125, 8.125}},
      {"topk", {8.55, 0.72}},
      {"dgc", {8.44, 0.76}},
      {"randomk", {0.36, 0.68}},
      {"threshold", {4.16, 0.72}},
      {"powersgd", {8.02, 8.02}},
      // 128 columns: the factors are no longer small beside M. Compress adds P written (4 r / 128 B), P^ in double
      // and in f32 written (8 r / 128 + 4 r / 128) and the f32 one read by the second GEMM (4 r / 128); decompress
      // reads P^ (8 r / 128). The orthogonalization's sweeps over P^ (16 MiB at 256 MiB) are taken to stay in L2.
      {"powersgd-tall", {8.63, 8.25}}};
  return bytes;
}

// What every benchmark shares: one stream, the input on the device, the memcpy reference.
struct Device {
  int index = 0;
  cuda::Stream stream{cuda::Stream::Priority::kHigh};
  cuda::DeviceBuffer input;
  cuda::DeviceBuffer output;
  std::vector<float> host_input;  // the same values, for host-path checks after the run
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

// dgc's device payload against its host payload for the same input and tensor info (step 0), after the timed runs:
// the number of differing bytes (a size mismatch counts every byte of the longer one), and the device's count.
struct HostCheck {
  bool done = false;
  uint64_t wrong = 0;
  uint64_t bytes = 0;
  uint64_t count = 0;
};
HostCheck g_dgc_check;

HostCheck checkAgainstHost(const Compressor& c) {
  HostCheck r;
  TensorInfo info = tensorInfo(0);
  const CompressorSizes dev_sizes = c.sizes(info);
  cuda::DeviceBuffer payload(dev_sizes.max_output_bytes, g_device->stream.get());
  cuda::DeviceBuffer workspace(dev_sizes.workspace_bytes, g_device->stream.get());
  const uint64_t dev_bytes =
      c.compress(info, g_device->input.data(), {}, {{workspace.as<std::byte>(), workspace.size()}, {}},
                 {payload.as<std::byte>(), payload.size()}, g_device->stream.handle());
  std::vector<std::byte> got(static_cast<size_t>(dev_bytes));
  TERSE_CUDA_CHECK(
      cudaMemcpyAsync(got.data(), payload.data(), dev_bytes, cudaMemcpyDeviceToHost, g_device->stream.get()));
  g_device->stream.synchronize();

  info.device = TERSE_DEVICE_HOST;
  info.device_index = -1;
  const CompressorSizes host_sizes = c.sizes(info);
  std::vector<std::byte> want(static_cast<size_t>(host_sizes.max_output_bytes));
  std::vector<std::byte> host_workspace(static_cast<size_t>(host_sizes.workspace_bytes) + 64);
  // The host workspace aligned as the ABI asks (16 bytes; 64 here, as the core allocates it).
  auto* aligned =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(host_workspace.data()) + 63) & ~uintptr_t{63});
  const uint64_t host_bytes =
      c.compress(info, g_device->host_input.data(), {}, {{aligned, host_sizes.workspace_bytes}, {}},
                 {want.data(), want.size()}, nullptr);
  want.resize(static_cast<size_t>(host_bytes));
  r.done = true;
  r.bytes = dev_bytes;
  if (got.size() >= 24) std::memcpy(&r.count, got.data() + 16, sizeof r.count);
  if (got.size() != want.size()) {
    r.wrong = std::max(got.size(), want.size());
  } else {
    for (size_t i = 0; i < got.size(); ++i) r.wrong += got[i] != want[i] ? 1 : 0;
  }
  return r;
}

// ---- powersgd (rank 4): a stateful two-round SUM compressor, so it gets its own loop, at two shapes of the same
// input:
//   powersgd        4096 rows (4096 x 16384 at the default 256 MiB): a square-ish layer's matrix, P^ one block's;
//   powersgd-tall   128 columns (524,288 x 128 at 256 MiB, 131,072 x 128 at 64 MiB): an embedding's shape, whose P^
//                   is orthogonalized by one block per slice of rows (powersgd_cuda.h, kOrthoSliceRows), 16 or 4.
// One rank (world 1), whose round-0 payload is then the SUM that round 1 reads as prev.
//   compress/<label>     both rounds of one step: P = M Q, orthogonalization, Q' = M^T P^ (round 1 includes its one
//                        synchronization, to validate prev)
//   decompress/<label>   the aggregate's decode P^ Q'^T accumulated onto the output (and Q' kept for the warm start)
// After the timed loops, one fresh step on the device and on the host: the decoded matrices' difference relative to
// ||M||, against powersgd.cc's tolerance 8 u K S (K = max(n, m), S = 1); "#wrong" is 1 when it exceeds it.
struct PowerSgdShape {
  std::string label;
  uint64_t rows;
  uint64_t cols() const { return g_numel / rows; }
};
PowerSgdShape powerSgdSquare() {
  return {"powersgd", 4096};
}
PowerSgdShape powerSgdTall() {
  return {"powersgd-tall", g_numel / 128};
}

struct PowerSgdCheck {
  double error = 0;
  double tolerance = 0;
};
std::map<std::string, PowerSgdCheck> g_powersgd_checks;  // by label

TensorInfo powerSgdInfo(const PowerSgdShape& shape, uint64_t step, int round, int source_rank) {
  TensorInfo info = tensorInfo(step);
  info.ndim = 2;
  info.shape[0] = static_cast<int64_t>(shape.rows);
  info.shape[1] = static_cast<int64_t>(shape.cols());
  info.round = round;
  info.source_rank = source_rank;
  return info;
}

// One tensor's memory for powersgd on the device: the max over both rounds, the state zero-filled once.
struct PowerSgdBuffers {
  PowerSgdBuffers(const Compressor& c, PowerSgdShape matrix, cudaStream_t stream) : shape(std::move(matrix)) {
    const CompressorSizes s0 = c.sizes(powerSgdInfo(shape, 0, 0, 0)), s1 = c.sizes(powerSgdInfo(shape, 0, 1, 0));
    workspace = cuda::DeviceBuffer(std::max(s0.workspace_bytes, s1.workspace_bytes), stream);
    state = cuda::DeviceBuffer(std::max(s0.state_bytes, s1.state_bytes), stream);
    state.fill(0, stream);
    p = cuda::DeviceBuffer(s0.max_output_bytes, stream);
    q = cuda::DeviceBuffer(s1.max_output_bytes, stream);
  }
  Scratch scratch() const {
    return {{workspace.as<std::byte>(), workspace.size()}, {state.as<std::byte>(), state.size()}};
  }
  // Both rounds of `step`.
  void step(const Compressor& c, uint64_t step, const void* input, void* stream) const {
    c.compress(powerSgdInfo(shape, step, 0, 0), input, {}, scratch(), {p.as<std::byte>(), p.size()}, stream);
    c.compress(powerSgdInfo(shape, step, 1, 0), input, {p.as<std::byte>(), p.size()}, scratch(),
               {q.as<std::byte>(), q.size()}, stream);
  }
  PowerSgdShape shape;
  cuda::DeviceBuffer workspace, state, p, q;
};

void benchPowerSgdCompress(benchmark::State& state, std::shared_ptr<const Compressor> c, PowerSgdShape shape) {
  const PowerSgdBuffers b(*c, shape, g_device->stream.get());
  uint64_t step = 0;
  double total = 0;
  for (auto _ : state) {
    const uint64_t s = step++;
    const double ms = deviceMilliseconds([&] { b.step(*c, s, g_device->input.data(), g_device->stream.handle()); });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "compress/" + shape.label, total);
  state.counters["ratio"] = 4.0 * static_cast<double>(g_numel) / static_cast<double>(b.p.size() + b.q.size());
}

void benchPowerSgdDecompress(benchmark::State& state, std::shared_ptr<const Compressor> c, PowerSgdShape shape) {
  const PowerSgdBuffers b(*c, shape, g_device->stream.get());
  b.step(*c, 0, g_device->input.data(), g_device->stream.handle());
  g_device->output.fill(0, g_device->stream.get());
  const TensorInfo info = powerSgdInfo(shape, 0, 1, -1);
  double total = 0;
  for (auto _ : state) {
    const double ms = deviceMilliseconds([&] {
      c->decompress(info, {b.q.as<std::byte>(), b.q.size()}, b.scratch(), g_device->output.data(), true,
                    g_device->stream.handle());
    });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, "decompress/" + shape.label, total);
}

// PowerSGD's three products as cuBLAS runs them alone, on the 4096-row shape, with the plugin's math mode (f32, never
// TF32) and its scratch size (powersgd_cuda.h's cap, 4 MiB): beside compress/powersgd and decompress/powersgd they
// say how much of each call is the GEMMs and how much the rest (the orthogonalization, the validation and its
// synchronization, the launches). M is the input (n x m row-major, which cuBLAS sees as M^T, m x n column-major);
// the factors are the plugin's payloads' values (the time does not depend on them).
//   mq      P (n x r) = M Q, as the plugin's round 0: cublasSgemm(T, N), the product's output into `output`.
//   mtp     Q' (m x r) = M^T P, as its round 1 (P in place of P^).
//   decode  out (n x m) += P Q'^T, beta 1: the decode as a GEMM, which the plugin keeps a kernel of its own
//           (powersgd.cu says why); its reference.
enum class PowerSgdGemm { kMQ, kMtP, kDecode };
constexpr uint64_t kPayloadHeader = 16;  // sdk::kPayloadHeaderBytes: the factors' values follow it

std::string powerSgdGemmName(PowerSgdGemm which) {
  return which == PowerSgdGemm::kMQ    ? "gemm/powersgd_mq"
         : which == PowerSgdGemm::kMtP ? "gemm/powersgd_mtp"
                                       : "gemm/powersgd_decode_reference";
}

void benchPowerSgdGemm(benchmark::State& state, std::shared_ptr<const Compressor> c, PowerSgdGemm which) {
  const PowerSgdShape shape = powerSgdSquare();
  const PowerSgdBuffers b(*c, shape, g_device->stream.get());
  b.step(*c, 0, g_device->input.data(), g_device->stream.handle());
  g_device->output.fill(0, g_device->stream.get());
  const auto n = static_cast<int64_t>(shape.rows), m = static_cast<int64_t>(shape.cols());
  const auto r = static_cast<int64_t>((b.p.size() - kPayloadHeader) / (4 * shape.rows));  // the instance's rank
  const float* p = reinterpret_cast<const float*>(b.p.as<std::byte>() + kPayloadHeader);
  const float* q = reinterpret_cast<const float*>(b.q.as<std::byte>() + kPayloadHeader);
  const float* M = g_device->input.as<float>();
  float* out = g_device->output.as<float>();
  const auto check = [](cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(status));
    }
  };
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  const std::unique_ptr<cublasContext, decltype(&cublasDestroy)> owner(h, &cublasDestroy);
  check(cublasSetStream(h, g_device->stream.get()), "cublasSetStream");
  check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  constexpr uint64_t kScratch = uint64_t{4} << 20;
  const cuda::DeviceBuffer scratch(kScratch, g_device->stream.get());
  check(cublasSetWorkspace(h, scratch.data(), kScratch), "cublasSetWorkspace");
  const float one = 1.0f, zero = 0.0f;
  const auto gemm = [&] {
    switch (which) {
      case PowerSgdGemm::kMQ:
        return cublasSgemm_64(h, CUBLAS_OP_T, CUBLAS_OP_N, n, r, m, &one, M, m, q, m, &zero, out, n);
      case PowerSgdGemm::kMtP:
        return cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_N, m, r, n, &one, M, m, p, n, &zero, out, m);
      case PowerSgdGemm::kDecode:
        return cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, r, &one, q, m, p, n, &one, out, m);
    }
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  double total = 0;
  for (auto _ : state) {
    const double ms = deviceMilliseconds([&] { check(gemm(), "cublasSgemm_64"); });
    state.SetIterationTime(ms * 1e-3);
    total += ms;
  }
  report(state, powerSgdGemmName(which), total);
}

// 64-byte aligned host bytes, as the core allocates host scratch.
struct AlignedHostBytes {
  explicit AlignedHostBytes(uint64_t n) : words(static_cast<size_t>(n / 8 + 9), 0) {}
  std::span<std::byte> span(uint64_t n) {
    auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(words.data()) + 63) & ~uintptr_t{63});
    return {p, static_cast<size_t>(n)};
  }
  std::vector<uint64_t> words;
};

void checkPowerSgd(const Compressor& c, const PowerSgdShape& shape) {
  const uint64_t numel = g_numel;
  std::vector<float> m(static_cast<size_t>(numel)), dev(m.size()), host(m.size(), 0.0f);
  g_device->input.copyToHost(m.data(), 4 * numel, g_device->stream.get());
  const PowerSgdBuffers b(c, shape, g_device->stream.get());
  b.step(c, 0, g_device->input.data(), g_device->stream.handle());
  c.decompress(powerSgdInfo(shape, 0, 1, -1), {b.q.as<std::byte>(), b.q.size()}, b.scratch(), g_device->output.data(),
               false, g_device->stream.handle());
  g_device->output.copyToHost(dev.data(), 4 * numel, g_device->stream.get());
  g_device->stream.synchronize();

  const auto onHost = [](TensorInfo info) {
    info.device = TERSE_DEVICE_HOST;
    info.device_index = -1;
    return info;
  };
  const CompressorSizes s0 = c.sizes(onHost(powerSgdInfo(shape, 0, 0, 0))),
                        s1 = c.sizes(onHost(powerSgdInfo(shape, 0, 1, 0)));
  const uint64_t ws_bytes = std::max(s0.workspace_bytes, s1.workspace_bytes);
  const uint64_t st_bytes = std::max(s0.state_bytes, s1.state_bytes);
  AlignedHostBytes ws(ws_bytes), st(st_bytes), p(s0.max_output_bytes), q(s1.max_output_bytes);
  const Scratch scratch{ws.span(ws_bytes), st.span(st_bytes)};
  c.compress(onHost(powerSgdInfo(shape, 0, 0, 0)), m.data(), {}, scratch, p.span(s0.max_output_bytes), nullptr);
  c.compress(onHost(powerSgdInfo(shape, 0, 1, 0)), m.data(), p.span(s0.max_output_bytes), scratch,
             q.span(s1.max_output_bytes), nullptr);
  c.decompress(onHost(powerSgdInfo(shape, 0, 1, -1)), q.span(s1.max_output_bytes), scratch, host.data(), false,
               nullptr);

  double diff = 0, norm = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    diff += (static_cast<double>(dev[i]) - host[i]) * (static_cast<double>(dev[i]) - host[i]);
    norm += static_cast<double>(m[i]) * m[i];
  }
  PowerSgdCheck& check = g_powersgd_checks[shape.label];
  check.error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  check.tolerance = 8.0 * 0x1p-24 * static_cast<double>(std::max(shape.rows, shape.cols()));
}

void printSummary(const std::vector<std::string>& present) {
  const auto rate = [](const std::string& name) {
    const auto it = g_rates.find(name);
    return it == g_rates.end() ? 0.0 : it->second;
  };
  const double copy = rate("memcpy_d2d");
  std::printf("\nsummary (GB/s of f32 input, %llu MiB, device copy %.1f GB/s)\n",
              static_cast<unsigned long long>(g_numel * 4 >> 20), copy);
  std::printf("%-12s %12s %8s %8s %14s %8s %8s\n", "compressor", "compress", "x copy", "x bound", "decompress",
              "x copy", "x bound");
  for (const auto& p : present) {
    const double cg = rate("compress/" + p), dg = rate("decompress/" + p);
    const auto traffic = trafficPerElement().find(p);
    // A bound's rate is the copy's times 8 B over the call's bytes; achieved / bound = achieved * bytes / (copy * 8).
    const auto ofBound = [&](double gbps, double bytes) {
      return copy > 0 && bytes > 0 ? gbps * bytes / (copy * 8.0) : 0.0;
    };
    const Traffic t = traffic == trafficPerElement().end() ? Traffic{} : traffic->second;
    std::printf("%-12s %12.1f %8.2f %8.2f %14.1f %8.2f %8.2f\n", p.c_str(), cg, copy > 0 ? cg / copy : 0.0,
                ofBound(cg, t.compress), dg, copy > 0 ? dg / copy : 0.0, ofBound(dg, t.decompress));
  }
  if (g_topk_checked) {
    // Rates are of the same input bytes, so their ratio is the ratio of the times.
    const double sort = rate("sort/topk_reference"), topk = rate("compress/topk");
    std::printf(
        "topk 1%% compress vs the full cub radix sort of (key, index) pairs: %.1f vs %.1f GB/s, %.2fx "
        "(target >= 3x); #wrong %llu\n",
        topk, sort, sort > 0 ? topk / sort : 0.0, static_cast<unsigned long long>(g_topk_wrong));
  }
  if (g_dgc_check.done) {
    const double dgc = rate("compress/dgc"), topk = rate("compress/topk");
    std::printf(
        "dgc 1%% compress vs topk 1%%: %.1f vs %.1f GB/s, %.2fx; device payload %llu B (count %llu) against the "
        "host's: #wrong %llu\n",
        dgc, topk, topk > 0 ? dgc / topk : 0.0, static_cast<unsigned long long>(g_dgc_check.bytes),
        static_cast<unsigned long long>(g_dgc_check.count), static_cast<unsigned long long>(g_dgc_check.wrong));
  }
  if (rate("gemm/powersgd_mq") > 0 && rate("gemm/powersgd_mtp") > 0 && rate("compress/powersgd") > 0) {
    // Rates are of the same input bytes: a time is those bytes over the rate.
    const auto us = [&](const std::string& name) { return 4.0 * static_cast<double>(g_numel) / rate(name) * 1e-3; };
    const double whole = us("compress/powersgd"), mq = us("gemm/powersgd_mq"), mtp = us("gemm/powersgd_mtp");
    std::printf(
        "powersgd compress %.1f us: cuBLAS's two GEMMs alone %.1f (P = M Q) + %.1f (Q' = M^T P^) us; the rest "
        "(orthogonalization, validation and its synchronization, launches) %.1f us\n",
        whole, mq, mtp, whole - mq - mtp);
  }
  if (rate("gemm/powersgd_decode_reference") > 0) {
    const double kernel = rate("decompress/powersgd"), gemm = rate("gemm/powersgd_decode_reference");
    std::printf(
        "powersgd decode (accumulated, with its validation) vs cuBLAS's f32 GEMM of the same shapes: %.1f vs %.1f "
        "GB/s, %.2fx\n",
        kernel, gemm, kernel / gemm);
  }
  for (const auto& [label, check] : g_powersgd_checks) {
    const PowerSgdShape shape = label == powerSgdTall().label ? powerSgdTall() : powerSgdSquare();
    std::printf(
        "%s rank 4, %llu x %llu: device decode vs host ||D_dev - D_host|| / ||M|| = %.3g (tolerance %.3g); "
        "#wrong %d\n",
        label.c_str(), static_cast<unsigned long long>(shape.rows), static_cast<unsigned long long>(shape.cols()),
        check.error, check.tolerance, check.error <= check.tolerance ? 0 : 1);
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
    std::vector<float>& host = device.host_input;
    host.resize(static_cast<size_t>(g_numel));
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
  std::shared_ptr<const Compressor> dgc;
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
    if (std::string(name) == "dgc") dgc = instance;
    if (std::string(name) == "topk") {
      benchmark::RegisterBenchmark("sort/topk_reference", benchTopKSort, instance)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  // qsgd, terngrad and natural at rounding_bits 16 and 8 (one Philox block per 8 or 16 elements), listed as variants.
  for (const char* name : {"qsgd", "terngrad", "natural"}) {
    if (std::find(present.begin(), present.end(), name) == present.end()) continue;
    for (const char* bits : {"16", "8"}) {
      const std::string label = std::string(name) + "-r" + bits;
      std::shared_ptr<const Compressor> instance;
      try {
        instance = loader.loadCompressor(name)->instantiate({{"rounding_bits", bits}});
      } catch (const std::exception& e) {
        std::cerr << "terse-bench-compressors-cuda: skipping " << label << ": " << e.what() << '\n';
        continue;
      }
      present.push_back(label);
      benchmark::RegisterBenchmark(("compress/" + label).c_str(), benchCompress, label, instance)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decompress/" + label).c_str(), benchDecompress, label, instance)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  // powersgd is stateful and has two rounds, so it has its own loops (benchPowerSgdCompress).
  std::shared_ptr<const Compressor> powersgd;
  try {
    powersgd = loader.loadCompressor("powersgd")->instantiate({{"rank", "4"}});
    if ((powersgd->caps(DType::kF32).devices & TERSE_DEVICE_CUDA) == 0) {
      std::cerr << "terse-bench-compressors-cuda: skipping powersgd: no CUDA kernels in this build\n";
      powersgd.reset();
    }
  } catch (const std::exception& e) {
    std::cerr << "terse-bench-compressors-cuda: skipping powersgd: " << e.what() << '\n';
    powersgd.reset();
  }
  if (powersgd) {
    for (const PowerSgdShape& shape : {powerSgdSquare(), powerSgdTall()}) {
      present.push_back(shape.label);
      benchmark::RegisterBenchmark(("compress/" + shape.label).c_str(), benchPowerSgdCompress, powersgd, shape)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decompress/" + shape.label).c_str(), benchPowerSgdDecompress, powersgd, shape)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
    for (const PowerSgdGemm which : {PowerSgdGemm::kMQ, PowerSgdGemm::kMtP, PowerSgdGemm::kDecode}) {
      benchmark::RegisterBenchmark(powerSgdGemmName(which).c_str(), benchPowerSgdGemm, powersgd, which)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  if (dgc != nullptr) g_dgc_check = checkAgainstHost(*dgc);
  if (powersgd) {
    for (const PowerSgdShape& shape : {powerSgdSquare(), powerSgdTall()}) checkPowerSgd(*powersgd, shape);
  }
  printSummary(present);
  benchmark::Shutdown();
  g_device = nullptr;
  return 0;
}

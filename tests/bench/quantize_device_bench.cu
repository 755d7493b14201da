// terse-bench-quantize-cuda: where the time of qsgd's quantize kernel goes (issue 42, item 2), in one run on one input.
// qsgd's compress is a norms pass and this kernel (terse/kit/pack_kernels.cuh's quantizeKernel); the kernel ran at
// 0.43-0.56 of its call's memory bound on an H200, compute-bound on the Philox rounds and the IEEE division per element
// that the host's bits pin. Issue 42 asks for >= 0.8, or, where only other bits would get there, for both measured.
// This benchmark runs the same kernel at qsgd's defaults (levels 127: 8-bit codes; buckets of 512) and each rounding
// width (24, 16, 8 bits a draw: one Philox block per 4, 8 or 16 elements) with its per-element work swapped out piece
// by piece, beside a device copy of the input:
//
//   plugin      qsgd's own coder (qsgd_coders.cuh): |v| / norm by IEEE division, then quantizeValue, drawing
//               from Philox.
//   reciprocal  the division as q = a r, then q + (a - q d) r with both corrections fused (r = 1 / d once per
//               bucket), where a >= 2^-102, q >= 2^-126 and d lies in [2^-100, 2^126]; elsewhere the remainder a - q d
//               loses bits below the normal range and the division stays. With those guards it gave IEEE's quotient
//               in CPU trials (every a in [0, d] for 300 divisors, 3.4e11 pairs; 5e8 random ones over every divisor
//               significand); the same Philox draws. Bits are counted on this input, not assumed: #diff. This input
//               (|v| >= about 1e-10, norms about 22) never reaches the guarded region, so #diff 0 here says nothing
//               of it.
//   hash        the plugin's coder with the draws of a splitmix64 hash instead of Philox4x32-10: other bits, the
//               price of the Philox rounds.
//   recip+hash  both.
//   packing     no division, no random stream (IndexRng: the block's own counter as its words): each code is 8 bits
//               of the value. The kernel's loads, shared-memory packing and stores alone, the ceiling of any coder.
//
// The decode (decompress's kernel, the payload's codes accumulated onto an output: 0.73-0.75 of its bound on the H200,
// terngrad's and onebit's 0.67-0.69) gets the same treatment at rounding width 24:
//
//   decode/plugin  qsgd's own decoder (qsgd_coders.cuh): per run of a bucket, i / bucket and the unit ||v|| / s
//                  by IEEE division.
//   decode/table   the units divided once per bucket beforehand into a table, read per run: the same bits (#diff
//                  counts the output floats unlike decode/plugin's, and decode/plugin's unlike the plugin's own
//                  decompress through its ABI).
//   decode/codes   each code converted, no unit: the kernel's loads, unpacking and stores alone.
//
// The norms are the host's (qsgd_math.h's bucketNorm), as the plugin's device norms are bit for bit, and the plugin's
// own payload for the same input, step, seed and tensor is the reference: after the timed loops, "#diff" counts the
// 64-bit code words of the plugin and reciprocal variants that differ from that payload's (0 is the only good answer
// for the plugin row: it says this benchmark runs the plugin's kernel).
//
// x copy is the copy's time over the kernel's. x bound divides that by the kernel's own bound, 8 B over its traffic per
// element: 4 read + 1 code written + 0.008 norm read = 5.008 B, so a quantize kernel at its memory bound runs at 1.6x
// a copy; a decode reads 1 code + 0.008 norm (or unit) and reads and writes the output, 9.008 B, 0.89x a copy.
//
// Options beyond Google Benchmark's: --plugin-dir=DIR (default: the build tree's plugin directory), --mib=N (default
// 256). Without a CUDA device it says why and exits with status 0 (CI builds it everywhere, runs it nowhere).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "compressors/qsgd/qsgd_coders.cuh"
#include "compressors/qsgd/qsgd_math.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/philox.hpp"
#include "tests/bench/device_bench.cuh"

namespace terse::bench {
namespace {

namespace qs = compressors::qsgd;

// qsgd's defaults, which the plugin instances below keep.
constexpr int32_t kLevels = 127;
constexpr unsigned kMagBits = sdk::bitpack::bitsFor(kLevels);  // 7
constexpr unsigned kCodeBits = kMagBits + 1;                   // 8
constexpr uint64_t kBucket = 512;
constexpr unsigned kRoundingBits[] = {24, 16, 8};
// The tensor the plugin compresses (its Philox stream is keyed by seed, step and tensor id, as the bench's is).
constexpr uint64_t kSeed = 42, kStep = 0, kTensorId = 1;

// ---- Coders (pack_kernels.cuh's Coder concept): what each variant computes per element.

// The plugin's own coder and decoder (qsgd_coders.cuh), at qsgd's defaults.
using PluginCoder = qs::cuda::Coder;
using PluginDecoder = qs::cuda::Decoder;
PluginCoder pluginCoder(const float* norms) {
  return {norms, kBucket, static_cast<float>(kLevels), kLevels, kMagBits};
}
PluginDecoder pluginDecoder(const float* norms) {
  return {norms, kBucket, static_cast<float>(kLevels), kMagBits};
}

// The division by a reciprocal and one fused correction (see the top of the file), IEEE's where the divisor is tiny.
struct ReciprocalCoder {
  const float* norms;
  struct Run {
    uint64_t end;
    float divisor;
    float reciprocal;  // 0: divide
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / kBucket;
    const float d = qs::normDivisor(norms[b]);
    return {(b + 1) * kBucket, d, d >= 0x1p-100f && d <= 0x1p126f ? 1.0f / d : 0.0f};
  }
  __device__ uint32_t operator()(const Run& r, float v, uint32_t random_bits) const {
    const float a = qs::absValue(v);
    const float q = a * r.reciprocal;
    const float ratio = r.reciprocal != 0.0f && a >= 0x1p-102f && q >= 0x1p-126f
                            ? __fmaf_rn(__fmaf_rn(-q, r.divisor, a), r.reciprocal, q)
                            : a / r.divisor;
    return qs::quantizeRatio(ratio, v, static_cast<float>(kLevels), kLevels, kMagBits, random_bits);
  }
};

// No arithmetic: 8 bits of the value as its code (so that the load is not dead).
struct PackingCoder {
  struct Run {
    uint64_t end;
  };
  __device__ Run run(uint64_t) const { return {~uint64_t{0}}; }
  __device__ uint32_t operator()(const Run&, float v, uint32_t random_bits) const {
    return ((sdk::floatBits(v) >> 16) ^ random_bits) & sdk::bitpack::lowMask(kCodeBits);
  }
};

// Four draw words per block from splitmix64, in place of Philox4x32-10's ten rounds.
struct HashRng {
  uint64_t key;
  struct Block {
    uint32_t v[4];
  };
  __device__ Block block(uint64_t b) const {
    const uint64_t h0 = splitmix(key ^ (2 * b)), h1 = splitmix(key ^ (2 * b + 1));
    return {{static_cast<uint32_t>(h0), static_cast<uint32_t>(h0 >> 32), static_cast<uint32_t>(h1),
             static_cast<uint32_t>(h1 >> 32)}};
  }
};

// No random stream at all: a block's words are its counter, for the packing row.
struct IndexRng {
  struct Block {
    uint32_t v[4];
  };
  __device__ Block block(uint64_t b) const {
    const auto w = static_cast<uint32_t>(b);
    return {{w, w + 1, w + 2, w + 3}};
  }
};

// ---- Decoders (pack_kernels.cuh's Decoder concept).

// The plugin's decoder with the units from a table made beforehand (unitsKernel: the same division, once per bucket).
struct TableDecoder {
  const float* units;
  struct Run {
    uint64_t end;
    float unit;
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / kBucket;
    return {(b + 1) * kBucket, units[b]};
  }
  __device__ float operator()(const Run& r, uint32_t code) const { return qs::decodeValue(code, r.unit, kMagBits); }
};

// No unit: the code as a float.
struct CodesDecoder {
  struct Run {
    uint64_t end;
  };
  __device__ Run run(uint64_t) const { return {~uint64_t{0}}; }
  __device__ float operator()(const Run&, uint32_t code) const { return static_cast<float>(code); }
};

template <class Unused = void>
__global__ void unitsKernel(const float* norms, uint64_t buckets, float* units) {
  for (uint64_t b = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; b < buckets;
       b += uint64_t{gridDim.x} * blockDim.x) {
    units[b] = norms[b] / static_cast<float>(kLevels);
  }
}

// ---- The run.

struct Bench {
  uint64_t numel = 0;
  cuda::Stream stream{cuda::Stream::Priority::kHigh};
  cuda::DeviceBuffer input, copy_out, norms, words;
  cuda::DeviceBuffer units, codes, decoded;  // the decode's: the unit table, the plugin's r24 codes, its output
  std::vector<float> plugin_decoded;         // the plugin's decompress of its r24 payload onto the input, on the host
  std::map<std::string, double> median_ms;   // by case name
  std::map<unsigned, std::vector<uint64_t>> plugin_words;  // by rounding bits: the plugin's payload's code words
  std::map<std::string, uint64_t> diff_words;              // by case name: code words, or decoded floats
  uint64_t wordCount() const { return sdk::bitpack::wordCount(numel, kCodeBits); }
};
Bench* g = nullptr;

template <class Call>
void timeLoop(benchmark::State& state, const std::string& name, Call call) {
  const double ms = medianDeviceMs(state, g->stream.get(), call);
  if (ms > 0) g->median_ms[name] = ms;
}

std::string caseName(const char* variant, unsigned bits) {
  return std::string(variant) + "/r" + std::to_string(bits);
}

template <class Coder, class Rng>
void quantize(unsigned bits, const Coder& coder, const Rng& rng) {
  kit::device::launchQuantize<kCodeBits>(bits, g->input.as<float>(), g->numel, rng, coder, g->words.as<uint64_t>(),
                                         g->stream.handle());
}

// The case's code words against the plugin's payload (variants with the plugin's bits only).
uint64_t differingWords(unsigned bits) {
  std::vector<uint64_t> got(static_cast<size_t>(g->wordCount()));
  g->words.copyToHost(got.data(), 8 * got.size(), g->stream.get());
  g->stream.synchronize();
  const std::vector<uint64_t>& want = g->plugin_words[bits];
  uint64_t diff = want.size() == got.size() ? 0 : got.size();
  for (size_t j = 0; j < std::min(got.size(), want.size()); ++j) diff += got[j] != want[j] ? 1 : 0;
  return diff;
}

template <class Coder, class Rng>
void benchVariant(benchmark::State& state, const char* variant, unsigned bits, Coder coder, Rng rng, bool check) {
  const std::string name = caseName(variant, bits);
  timeLoop(state, name, [&] { quantize(bits, coder, rng); });
  if (check) {
    quantize(bits, coder, rng);
    g->diff_words[name] = differingWords(bits);
  }
}

// decode/<variant>: the plugin's r24 codes accumulated onto `decoded`, as decompress does.
template <class Decoder>
void decode(const Decoder& decoder) {
  kit::device::launchDecodeCodes<kCodeBits>(g->codes.as<uint64_t>(), g->numel, decoder, g->decoded.as<float>(), true,
                                            g->stream.handle());
}

// The decode onto a copy of the input, on the host.
template <class Decoder>
std::vector<float> decodedOntoInput(const Decoder& decoder) {
  TERSE_CUDA_CHECK(
      cudaMemcpyAsync(g->decoded.data(), g->input.data(), 4 * g->numel, cudaMemcpyDeviceToDevice, g->stream.get()));
  decode(decoder);
  std::vector<float> out(static_cast<size_t>(g->numel));
  g->decoded.copyToHost(out.data(), 4 * out.size(), g->stream.get());
  g->stream.synchronize();
  return out;
}

uint64_t differingFloats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  uint64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  return diff;
}

template <class Decoder>
void benchDecode(benchmark::State& state, const char* variant, Decoder decoder) {
  const std::string name = std::string("decode/") + variant;
  timeLoop(state, name, [&] { decode(decoder); });
}

void benchCopy(benchmark::State& state) {
  timeLoop(state, "copy", [] {
    TERSE_CUDA_CHECK(
        cudaMemcpyAsync(g->copy_out.data(), g->input.data(), 4 * g->numel, cudaMemcpyDeviceToDevice, g->stream.get()));
  });
}

// The plugin's compress of the input at `bits`, on the device: its code words (the payload's last words, qsgd.cc's
// layout) are what the plugin and reciprocal variants must reproduce.
std::vector<uint64_t> pluginWords(PluginLoader& loader, unsigned bits, bool decompress) {
  const auto c = loader.loadCompressor("qsgd")->instantiate({{"rounding_bits", std::to_string(bits)},
                                                             {"levels", std::to_string(kLevels)},
                                                             {"bucket_size", std::to_string(kBucket)}});
  TensorInfo info;
  info.numel = g->numel;
  info.ndim = 1;
  info.shape[0] = static_cast<int64_t>(g->numel);
  info.device = TERSE_DEVICE_CUDA;
  TERSE_CUDA_CHECK(cudaGetDevice(&info.device_index));
  info.tensor_id = kTensorId;
  info.step = kStep;
  info.seed = kSeed;
  info.world_size = 1;
  const CompressorSizes sizes = c->sizes(info);
  cuda::DeviceBuffer payload(sizes.max_output_bytes, g->stream.get());
  cuda::DeviceBuffer workspace(sizes.workspace_bytes, g->stream.get());
  const uint64_t bytes = c->compress(info, g->input.data(), {}, {{workspace.as<std::byte>(), workspace.size()}, {}},
                                     {payload.as<std::byte>(), payload.size()}, g->stream.handle());
  std::vector<uint64_t> words(static_cast<size_t>(g->wordCount()));
  if (bytes < 8 * words.size()) throw std::runtime_error("qsgd's payload is shorter than its code words");
  TERSE_CUDA_CHECK(cudaMemcpyAsync(words.data(), payload.as<std::byte>() + bytes - 8 * words.size(), 8 * words.size(),
                                   cudaMemcpyDeviceToHost, g->stream.get()));
  g->stream.synchronize();
  if (decompress) {
    // The plugin's own decode of this payload (as the aggregate's) onto a copy of the input: decode/plugin's reference.
    TERSE_CUDA_CHECK(
        cudaMemcpyAsync(g->decoded.data(), g->input.data(), 4 * g->numel, cudaMemcpyDeviceToDevice, g->stream.get()));
    info.source_rank = -1;
    c->decompress(info, {payload.as<std::byte>(), bytes}, {{workspace.as<std::byte>(), workspace.size()}, {}},
                  g->decoded.data(), true, g->stream.handle());
    g->plugin_decoded.resize(static_cast<size_t>(g->numel));
    g->decoded.copyToHost(g->plugin_decoded.data(), 4 * g->numel, g->stream.get());
    g->stream.synchronize();
  }
  return words;
}

void printSummary() {
  const auto ms = [](const std::string& name) {
    const auto it = g->median_ms.find(name);
    return it == g->median_ms.end() ? 0.0 : it->second;
  };
  const double copy = ms("copy");
  const double bound = 8.0 / (4.0 + kCodeBits / 8.0 + 4.0 / kBucket);  // x copy at the kernel's memory bound
  std::printf(
      "\nsummary (medians, %llu MiB of f32, qsgd levels %d, buckets of %llu; copy %.1f us; the kernel's bound "
      "is %.2fx a copy)\n",
      static_cast<unsigned long long>(g->numel >> 18), kLevels, static_cast<unsigned long long>(kBucket), copy * 1e3,
      bound);
  std::printf("%-7s %-11s %10s %8s %8s %7s\n", "draws", "variant", "us", "x copy", "x bound", "#diff");
  for (unsigned bits : kRoundingBits) {
    for (const char* variant : {"plugin", "reciprocal", "hash", "recip+hash", "packing"}) {
      const std::string name = caseName(variant, bits);
      const double t = ms(name);
      const auto diff = g->diff_words.find(name);
      const std::string d = diff == g->diff_words.end() ? "-" : std::to_string(diff->second);
      std::printf("%-7s %-11s %10.1f %8.2f %8.2f %7s\n", ("r" + std::to_string(bits)).c_str(), variant, t * 1e3,
                  t > 0 ? copy / t : 0.0, t > 0 ? copy / t / bound : 0.0, d.c_str());
    }
  }
  const double decode_bound = 8.0 / (1.0 + 4.0 / kBucket + 8.0);
  for (const char* variant : {"plugin", "table", "codes"}) {
    const std::string name = std::string("decode/") + variant;
    const double t = ms(name);
    const auto diff = g->diff_words.find(name);
    const std::string d = diff == g->diff_words.end() ? "-" : std::to_string(diff->second);
    std::printf("%-7s %-11s %10.1f %8.2f %8.2f %7s\n", "decode", variant, t * 1e3, t > 0 ? copy / t : 0.0,
                t > 0 ? copy / t / decode_bound : 0.0, d.c_str());
  }
  std::printf(
      "decode: #diff counts output floats unlike the plugin's own decompress (plugin) or decode/plugin's "
      "(table); bound %.2fx a copy\n",
      decode_bound);
  std::printf("#diff: 64-bit code words unlike the plugin's payload (of %llu); '-': other bits by design\n",
              static_cast<unsigned long long>(g->wordCount()));
}

}  // namespace
}  // namespace terse::bench

int main(int argc, char** argv) {
  using namespace terse;
  using namespace terse::bench;
  std::filesystem::path plugin_dir = TERSE_BENCH_PLUGIN_DIR;
  uint64_t mib = 256;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--plugin-dir=", 0) == 0) {
      plugin_dir = a.substr(13);
    } else if (a.rfind("--mib=", 0) == 0) {
      mib = std::stoull(a.substr(6));
    } else {
      args.push_back(argv[i]);
    }
  }
  if (mib < 1 || mib > 4096) {
    std::cerr << "terse-bench-quantize-cuda: --mib must be in [1, 4096], got " << mib << '\n';
    return 2;
  }
  if (const std::optional<int> status = start("terse-bench-quantize-cuda", args)) return *status;
  Bench bench;
  g = &bench;
  bench.numel = mib << 18;
  bench.input = cuda::DeviceBuffer(4 * bench.numel, bench.stream.get());
  bench.copy_out = cuda::DeviceBuffer(4 * bench.numel, bench.stream.get());
  bench.words = cuda::DeviceBuffer(8 * bench.wordCount(), bench.stream.get());
  bench.codes = cuda::DeviceBuffer(8 * bench.wordCount(), bench.stream.get());
  bench.decoded = cuda::DeviceBuffer(4 * bench.numel, bench.stream.get());
  fillNormal(bench.input.as<float>(), bench.numel, bench.stream.get());
  TERSE_CUDA_CHECK(cudaGetLastError());
  {
    // The host's norms, which the plugin's device norms equal bit for bit.
    std::vector<float> host(static_cast<size_t>(bench.numel));
    bench.input.copyToHost(host.data(), 4 * host.size(), bench.stream.get());
    bench.stream.synchronize();
    const uint64_t buckets = (bench.numel + kBucket - 1) / kBucket;
    std::vector<float> norms(static_cast<size_t>(buckets));
    for (uint64_t b = 0; b < buckets; ++b) {
      norms[b] = qs::bucketNorm(host.data() + b * kBucket, std::min(kBucket, bench.numel - b * kBucket));
    }
    bench.norms = cuda::DeviceBuffer(4 * buckets, bench.stream.get());
    bench.norms.copyFromHost(norms.data(), 4 * buckets, bench.stream.get());
  }
  try {
    auto loader = PluginLoader::withSearchDirs({{plugin_dir, "--plugin-dir", true}});
    for (unsigned bits : kRoundingBits) bench.plugin_words[bits] = pluginWords(loader, bits, bits == 24);
  } catch (const std::exception& e) {
    std::cerr << "terse-bench-quantize-cuda: the qsgd plugin's payload, the reference: " << e.what() << '\n';
    return 1;
  }

  const float* norms = bench.norms.as<float>();
  {
    const uint64_t buckets = (bench.numel + kBucket - 1) / kBucket;
    bench.units = cuda::DeviceBuffer(4 * buckets, bench.stream.get());
    unitsKernel<><<<1024, 256, 0, bench.stream.get()>>>(norms, buckets, bench.units.as<float>());
    TERSE_CUDA_CHECK(cudaGetLastError());
    bench.codes.copyFromHost(bench.plugin_words[24].data(), 8 * bench.wordCount(), bench.stream.get());
  }
  const sdk::PhiloxStream philox(kSeed, kStep, kTensorId);
  const HashRng hash{kSeed};
  benchmark::RegisterBenchmark("copy", benchCopy)->UseManualTime();
  for (unsigned bits : kRoundingBits) {
    const auto add = [&](const char* variant, auto coder, auto rng, bool check) {
      benchmark::RegisterBenchmark(caseName(variant, bits).c_str(), [=](benchmark::State& state) {
        benchVariant(state, variant, bits, coder, rng, check);
      })->UseManualTime();
    };
    add("plugin", pluginCoder(norms), philox, true);
    add("reciprocal", ReciprocalCoder{norms}, philox, true);
    add("hash", pluginCoder(norms), hash, false);
    add("recip+hash", ReciprocalCoder{norms}, hash, false);
    add("packing", PackingCoder{}, IndexRng{}, false);
  }
  benchmark::RegisterBenchmark("decode/plugin", [=](benchmark::State& state) {
    benchDecode(state, "plugin", pluginDecoder(norms));
  })->UseManualTime();
  benchmark::RegisterBenchmark("decode/table", [&bench](benchmark::State& state) {
    benchDecode(state, "table", TableDecoder{bench.units.as<float>()});
  })->UseManualTime();
  benchmark::RegisterBenchmark("decode/codes", [](benchmark::State& state) {
    benchDecode(state, "codes", CodesDecoder{});
  })->UseManualTime();
  benchmark::RunSpecifiedBenchmarks();
  {
    const std::vector<float> plugin = decodedOntoInput(pluginDecoder(norms));
    bench.diff_words["decode/plugin"] = differingFloats(plugin, bench.plugin_decoded);
    bench.diff_words["decode/table"] = differingFloats(decodedOntoInput(TableDecoder{bench.units.as<float>()}), plugin);
  }
  printSummary();
  benchmark::Shutdown();
  g = nullptr;
  return 0;
}

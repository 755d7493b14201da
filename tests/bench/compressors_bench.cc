// terse-bench-compressors: compress and decompress throughput of every built-in compressor present in the plugin
// directory, in GB/s of f32 input, one thread, at 64 KiB, 4 MiB and 64 MiB, beside a memcpy of the same size measured
// in the same run (docs/STYLE.md 10: kernel benchmarks report GB/s of input and the ratio to a memcpy). Each plugin
// runs through the core's own per-tensor codec (makePluginCodec), so the numbers include what a training step pays for
// the plugin boundary.
//
//   compress     one full step on one rank: every round (round r > 0 gets round r - 1's payload as its aggregate);
//                a new step each iteration, so stochastic compressors draw fresh randomness
//   decompress   the last round's payload decoded once (the aggregate for SUM and CUSTOM, the rank's payload for
//                ALLGATHER: what the core does per rank)
//   memcpy       the same number of bytes copied
//   baseline     top-k by std::nth_element on a copy of |g| (k = 1% of 16M floats), the obvious way to pick top-k
//   step         one rank's whole codec work for one training step of the quickstart MLP (784-256-128-10, its six
//                tensors) in a world of 2, with error feedback: every round's encode, a CUSTOM reduce of two payloads
//                (this rank's twice: the other rank's would cost the same; the core's SUM is formed untimed) and the
//                decode of the aggregate (of each rank's payload for ALLGATHER); in CPU ms per step.
//                step/powersgd-r2-ef is the figure issue 22 sets a target for (codec <= 1.5 ms per step)
//
// Rates are per CPU second of the one benchmark thread rather than wall time: on a shared machine (CI runners, a
// workstation that is also compiling) other processes then inflate the numbers less, and on a quiet one the two agree.
//
// After the run a table gives per compressor and size: compress GB/s, decompress GB/s, memcpy GB/s, compress and
// decompress throughput as fractions of memcpy's (same run), and the compression ratio (dense bytes / payload bytes);
// then topk's speedup over the nth_element baseline at 16M floats. With --benchmark_repetitions the table uses the
// medians. scripts/bench-vs-peers runs it beside torch's own casts.
//
// Options beyond Google Benchmark's: --plugin-dir=DIR (default: the build tree's plugin directory). Without
// --benchmark_min_time each benchmark runs for at least 0.1 s.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/common/watchdog.h"
#include "core/compress/codec.h"
#include "core/compress/make_codec.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "terse/sdk/half.hpp"
#include "tests/bench/median_reporter.h"

namespace terse {
namespace {

// The built-ins and the parameters they are measured with: the sparsifiers at 1% (the regime the papers run in).
// A variant (label set) is the plugin at other parameters, measured and listed under its label; it has no step bench.
struct Builtin {
  const char* name;
  Params params;
  const char* label = nullptr;
};
const std::vector<Builtin>& builtins() {
  static const std::vector<Builtin> list = {
      {"none", {}},
      {"fp16", {}},
      {"bf16", {}},
      {"qsgd", {}},
      // rounding_bits 16 and 8: one Philox block draws for 8 (16) elements instead of 4 (sdk/philox.hpp's drawAt).
      {"qsgd", {{"rounding_bits", "16"}}, "qsgd-r16"},
      {"qsgd", {{"rounding_bits", "8"}}, "qsgd-r8"},
      {"terngrad", {}},
      {"terngrad", {{"rounding_bits", "16"}}, "terngrad-r16"},
      {"terngrad", {{"rounding_bits", "8"}}, "terngrad-r8"},
      {"natural", {}},
      {"natural", {{"rounding_bits", "16"}}, "natural-r16"},
      {"natural", {{"rounding_bits", "8"}}, "natural-r8"},
      {"onebit", {}},
      {"signsgd", {}},
      {"topk", {{"ratio", "0.01"}}},
      {"randomk", {{"ratio", "0.01"}}},
      {"threshold", {{"tau", "2.576"}}},  // |g| >= 2.576 keeps 1% of a standard normal
      {"dgc", {{"ratio", "0.01"}}},
      {"powersgd", {{"rank", "4"}}},
  };
  return list;
}

// Square matrices, so that low-rank compressors compress (the others read the data as flat).
struct Size {
  const char* label;
  int64_t side;
  uint64_t numel() const { return static_cast<uint64_t>(side * side); }
  uint64_t bytes() const { return 4 * numel(); }
};
constexpr Size kSizes[] = {{"64KiB", 128}, {"4MiB", 1024}, {"64MiB", 4096}};
constexpr Size kBaselineSize = kSizes[2];
// Between the two: where a second thread starts to pay for a cast (sdk/parallel.hpp's per-plugin minimum).
constexpr Size kWallSize16MiB = {"16MiB", 2048};
constexpr double kTopkBaselineRatio = 0.01;

// Standard-normal gradients, made once per size and only for sizes some selected benchmark uses.
const std::vector<float>& gradient(const Size& size) {
  static std::map<int64_t, std::vector<float>> cache;
  auto& g = cache[size.side];
  if (g.empty()) {
    std::mt19937_64 rng(20240611);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    g.resize(size.numel());
    for (auto& v : g) v = normal(rng);
  }
  return g;
}

TensorInfo tensorFor(const Size& size) {
  TensorInfo t;
  t.dtype = DType::kF32;
  t.numel = size.numel();
  t.ndim = 2;
  t.shape = {size.side, size.side, 0, 0};
  t.tensor_id = 1;
  return t;
}

void benchCompress(benchmark::State& state, std::shared_ptr<const Compressor> compressor, Size size) {
  const auto& g = gradient(size);
  std::unique_ptr<TensorCodec> codec;
  try {
    codec = makePluginCodec(compressor, tensorFor(size), 1);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const int rounds = codec->caps().num_rounds;
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) out[static_cast<std::size_t>(r)].resize(codec->sizes(r).max_output_bytes);
  uint64_t step = 0, payload = 0;
  for (auto _ : state) {
    payload = 0;
    std::span<const std::byte> prev;
    try {
      for (int r = 0; r < rounds; ++r) {
        auto& buf = out[static_cast<std::size_t>(r)];
        const uint64_t n = codec->encode(step, r, g.data(), prev, buf);
        prev = std::span<const std::byte>(buf.data(), n);
        payload += n;
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    benchmark::DoNotOptimize(out.back().data());
    ++step;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size.bytes()));
  state.counters["ratio"] = payload ? static_cast<double>(size.bytes()) / static_cast<double>(payload) : 0.0;
}

void benchDecompress(benchmark::State& state, std::shared_ptr<const Compressor> compressor, Size size) {
  const auto& g = gradient(size);
  std::unique_ptr<TensorCodec> codec;
  std::vector<std::byte> last;
  try {
    codec = makePluginCodec(compressor, tensorFor(size), 1);
    std::vector<std::byte> prev;
    for (int r = 0; r < codec->caps().num_rounds; ++r) {
      std::vector<std::byte> buf(codec->sizes(r).max_output_bytes);
      buf.resize(codec->encode(0, r, g.data(), prev, buf));
      prev = std::move(buf);
    }
    last = std::move(prev);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  // One rank: its payload is the SUM or CUSTOM aggregate of a world of one.
  const int source = codec->caps().aggregation == Aggregation::kAllgather ? 0 : -1;
  std::vector<float> out(size.numel());
  for (auto _ : state) {
    try {
      codec->decode(0, last, source, out.data(), false);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size.bytes()));
  state.counters["ratio"] = last.empty() ? 0.0 : static_cast<double>(size.bytes()) / static_cast<double>(last.size());
}

void benchMemcpy(benchmark::State& state, Size size) {
  const auto& g = gradient(size);
  std::vector<float> dst(size.numel());
  for (auto _ : state) {
    std::memcpy(dst.data(), g.data(), size.bytes());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size.bytes()));
}

// The threshold of the k largest |g_i| the textbook way: a copy of |g|, then std::nth_element.
void benchNthElement(benchmark::State& state, Size size) {
  const auto& g = gradient(size);
  const auto k = static_cast<std::size_t>(std::llround(kTopkBaselineRatio * static_cast<double>(size.numel())));
  std::vector<float> mag(size.numel());
  for (auto _ : state) {
    std::transform(g.begin(), g.end(), mag.begin(), [](float v) { return std::abs(v); });
    std::nth_element(mag.begin(), mag.end() - static_cast<std::ptrdiff_t>(k), mag.end());
    benchmark::DoNotOptimize(mag[mag.size() - k]);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size.bytes()));
}

// The quickstart MLP's parameters (experiments/configs/quickstart.textproto: hidden sizes {256, 128} on 28x28 inputs,
// 10 classes), weights as rows x cols.
struct MlpTensor {
  int64_t rows, cols;
};
constexpr MlpTensor kMlp[] = {{256, 784}, {256, 1}, {128, 256}, {128, 1}, {10, 128}, {10, 1}};
constexpr int kStepWorld = 2;

// The aggregate of kStepWorld copies of `mine` as the core would form it: SUM adds the bodies in the wire dtype,
// CUSTOM folds with the plugin's reduce, ALLGATHER keeps the payload (decoded once per rank).
std::span<const std::byte> aggregate(TensorCodec& codec, uint64_t step, int round, std::span<const std::byte> mine,
                                     std::vector<std::byte>& out) {
  switch (codec.caps().aggregation) {
    case Aggregation::kSum: {
      const uint64_t header = codec.sizes(round).sum_header_bytes;
      std::memcpy(out.data(), mine.data(), mine.size());
      const DType wire = codec.caps().wire_dtype;
      const uint64_t width = wire == DType::kF32 ? 4 : 2;
      for (int r = 1; r < kStepWorld; ++r) {
        for (uint64_t i = 0; i < (mine.size() - header) / width; ++i) {
          std::byte* acc = out.data() + header + i * width;
          const std::byte* add = mine.data() + header + i * width;
          if (wire == DType::kF32) {
            float a, b;
            std::memcpy(&a, acc, 4);
            std::memcpy(&b, add, 4);
            a += b;
            std::memcpy(acc, &a, 4);
          } else {  // 16-bit wires, summed in f32 per pair and rounded back, as the core does
            uint16_t a, b;
            std::memcpy(&a, acc, 2);
            std::memcpy(&b, add, 2);
            a = wire == DType::kF16 ? terse::sdk::floatToHalf(terse::sdk::halfToFloat(a) + terse::sdk::halfToFloat(b))
                                    : terse::sdk::floatToBf16(terse::sdk::bf16ToFloat(a) + terse::sdk::bf16ToFloat(b));
            std::memcpy(acc, &a, 2);
          }
        }
      }
      return {out.data(), mine.size()};
    }
    case Aggregation::kCustom: {
      std::vector<std::byte> acc(mine.begin(), mine.end());
      uint64_t n = acc.size();
      for (int r = 1; r < kStepWorld; ++r) {
        n = codec.reduce(step, round, std::span<const std::byte>(acc.data(), n), mine, out);
        acc.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
      }
      return {out.data(), n};
    }
    case Aggregation::kAllgather:
      break;
  }
  return mine;
}

void benchStep(benchmark::State& state, std::shared_ptr<const Compressor> compressor) {
  struct Tensor {
    std::unique_ptr<TensorCodec> codec;
    std::vector<float> grad, out;
    std::vector<std::vector<std::byte>> payload, aggregate;
  };
  std::vector<Tensor> tensors;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  try {
    for (std::size_t k = 0; k < std::size(kMlp); ++k) {
      TensorInfo t;
      t.dtype = DType::kF32;
      t.numel = static_cast<uint64_t>(kMlp[k].rows * kMlp[k].cols);
      t.ndim = kMlp[k].cols == 1 ? 1 : 2;
      t.shape = {kMlp[k].rows, kMlp[k].cols == 1 ? 0 : kMlp[k].cols, 0, 0};
      t.tensor_id = k + 1;
      t.world_size = kStepWorld;
      Tensor x;
      x.codec = makeCodec(compressor, t, 1, CodecOptions{.error_feedback = true});
      x.grad.resize(t.numel);
      for (auto& v : x.grad) v = normal(rng);
      x.out.resize(t.numel);
      const int rounds = x.codec->caps().num_rounds;
      for (int r = 0; r < rounds; ++r) {
        x.payload.emplace_back(x.codec->sizes(r).max_output_bytes);
        x.aggregate.emplace_back(std::max(x.codec->sizes(r).max_output_bytes, x.codec->sizes(r).max_reduced_bytes));
      }
      tensors.push_back(std::move(x));
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  uint64_t step = 0;
  for (auto _ : state) {
    try {
      for (auto& x : tensors) {
        std::span<const std::byte> prev;
        for (std::size_t r = 0; r < x.payload.size(); ++r) {
          const int round = static_cast<int>(r);
          const uint64_t n = x.codec->encode(step, round, x.grad.data(), prev, x.payload[r]);
          const bool core_sums = x.codec->caps().aggregation == Aggregation::kSum;
          if (core_sums) state.PauseTiming();  // the core's sum, not codec work (a plugin's reduce is)
          prev = aggregate(*x.codec, step, round, std::span<const std::byte>(x.payload[r].data(), n), x.aggregate[r]);
          if (core_sums) state.ResumeTiming();
        }
        if (x.codec->caps().aggregation == Aggregation::kAllgather) {
          for (int rank = 0; rank < kStepWorld; ++rank) x.codec->decode(step, prev, rank, x.out.data(), rank > 0);
        } else {
          x.codec->decode(step, prev, -1, x.out.data(), false);
        }
        benchmark::DoNotOptimize(x.out.data());
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
    ++step;
  }
}

// Keeps what the console shows and, at the end, prints the summary table from it (the median of repetitions when
// there are several).
class SummaryReporter : public bench::MedianReporter {
 public:
  explicit SummaryReporter(OutputOptions options) : MedianReporter(options) {}

  void printSummary(std::ostream& out, const std::vector<std::string>& plugins) const {
    char line[256];
    out << "\nsummary (GB/s of f32 input per CPU second, one thread"
        << (!haveMedians() ? "" : ", medians of the repetitions")
        << "; c/memcpy, d/memcpy = compress, decompress GB/s / memcpy GB/s; ratio = dense bytes / payload bytes)\n";
    std::snprintf(line, sizeof line, "%-12s %-6s %12s %14s %12s %10s %10s %9s\n", "compressor", "size", "compress",
                  "decompress", "memcpy", "c/memcpy", "d/memcpy", "ratio");
    out << line;
    for (const auto& p : plugins) {
      for (const auto& s : kSizes) {
        const Run* c = find("compress/" + p + "/" + s.label);
        const Run* d = find("decompress/" + p + "/" + s.label);
        const Run* m = find(std::string("memcpy/") + s.label);
        if (c == nullptr && d == nullptr) continue;
        const double cg = gbps(c), dg = gbps(d), mg = gbps(m);
        const auto vs = [mg](double g) { return mg > 0 && g > 0 ? fmt(g / mg, 3) : std::string("-"); };
        std::snprintf(line, sizeof line, "%-12s %-6s %12s %14s %12s %10s %10s %9s\n", p.c_str(), s.label,
                      fmt(cg, 2).c_str(), fmt(dg, 2).c_str(), fmt(mg, 2).c_str(), vs(cg).c_str(), vs(dg).c_str(),
                      c && c->counters.count("ratio") ? (fmt(c->counters.at("ratio").value, 1) + "x").c_str() : "-");
        out << line;
      }
    }
    bool step_header = false;
    for (const auto& [name, run] : runs()) {
      if (name.rfind("step/", 0) != 0) continue;
      if (!step_header) {
        out << "\ncodec per training step (quickstart MLP, 6 tensors, world of 2, error feedback; CPU ms per step)\n";
        step_header = true;
      }
      std::snprintf(line, sizeof line, "%-28s %10.3f ms\n", name.substr(5).c_str(),
                    run.GetAdjustedCPUTime() / 1000.0);  // registered in microseconds
      out << line;
    }
    const std::string big = kBaselineSize.label;
    const Run* base = find("baseline/nth_element_topk/" + big);
    const Run* topk = find("compress/topk/" + big);
    if (base != nullptr && topk != nullptr) {
      const double tb = base->GetAdjustedCPUTime(), tt = topk->GetAdjustedCPUTime();
      out << "\ntopk (ratio " << kTopkBaselineRatio << ", " << kBaselineSize.numel() << " floats): " << fmt(tt, 2)
          << " " << benchmark::GetTimeUnitString(topk->time_unit) << " CPU per compress vs std::nth_element on |g| "
          << fmt(tb, 2) << " " << benchmark::GetTimeUnitString(base->time_unit) << ": speedup " << fmt(tb / tt, 2)
          << "x\n";  // both registered in microseconds
    }
  }

 private:
  static double gbps(const Run* r) {
    if (r == nullptr) return 0;
    auto it = r->counters.find("bytes_per_second");
    return it == r->counters.end() ? 0 : it->second.value / 1e9;
  }
  static std::string fmt(double v, int digits) {
    if (v <= 0) return "-";
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return b;
  }
};

// The plugin-call watchdog's mark (core/common/watchdog.h), which every plugin call pays: a few relaxed stores, no
// clock read. Set against the compress rows above, it is the watchdog's share of a call.
void benchWatchMark(benchmark::State& state) {
  const char* label = watchdog::intern("compressor 'bench' (bench.so)");
  uint64_t tensor = 0;
  for (auto _ : state) {
    const watchdog::WatchedCall call(label, "compress", tensor++, 0);
    benchmark::ClobberMemory();
  }
}

}  // namespace
}  // namespace terse

int main(int argc, char** argv) {
  using namespace terse;
  std::filesystem::path plugin_dir = TERSE_BENCH_PLUGIN_DIR;
  std::vector<char*> args;
  bool min_time_given = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--plugin-dir=", 0) == 0) {
      plugin_dir = a.substr(13);
      continue;
    }
    if (a.rfind("--benchmark_min_time", 0) == 0) min_time_given = true;
    args.push_back(argv[i]);
  }
  static char default_min_time[] = "--benchmark_min_time=0.1";
  if (!min_time_given) args.insert(args.begin() + 1, default_min_time);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  benchmark::RegisterBenchmark("watchdog/mark", benchWatchMark)->Unit(benchmark::kNanosecond);
  auto loader = PluginLoader::withSearchDirs({{plugin_dir, "--plugin-dir", true}});
  std::vector<std::string> present;
  for (const auto& b : builtins()) {
    const auto file = plugin_dir / PluginLoader::fileNameFor(PluginKind::kCompressor, b.name);
    if (!std::filesystem::exists(file)) continue;
    std::shared_ptr<const Compressor> instance;
    try {
      instance = loader.loadCompressor(b.name)->instantiate(b.params);
    } catch (const std::exception& e) {
      std::cerr << "terse-bench-compressors: skipping " << b.name << ": " << e.what() << '\n';
      continue;
    }
    const std::string label = b.label != nullptr ? b.label : b.name;
    present.emplace_back(label);
    for (const auto& s : kSizes) {
      benchmark::RegisterBenchmark(("compress/" + label + "/" + s.label).c_str(), benchCompress, instance, s)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("decompress/" + label + "/" + s.label).c_str(), benchDecompress, instance, s)
          ->Unit(benchmark::kMicrosecond);
    }
    if (b.label != nullptr) continue;
    // The step at the parameters issue 22's target names for PowerSGD (rank 2), the bench's own for the others.
    const bool low_rank = std::string(b.name) == "powersgd";
    auto step_instance = instance;
    if (low_rank) {
      try {
        step_instance = loader.loadCompressor(b.name)->instantiate({{"rank", "2"}});
      } catch (const std::exception& e) {
        std::cerr << "terse-bench-compressors: no step bench for powersgd: " << e.what() << '\n';
        continue;
      }
    }
    benchmark::RegisterBenchmark(("step/" + std::string(b.name) + (low_rank ? "-r2" : "") + "/mlp").c_str(), benchStep,
                                 step_instance)
        ->Unit(benchmark::kMicrosecond);
  }
  // Multi-threaded compress of one tensor (the `threads` parameter, sdk/parallel.hpp): 1 and 2 threads everywhere, 4
  // and 8 where the process may run on that many CPUs, all timed by the clock on the wall (the helper threads' CPU time
  // is not the caller's), so a ratio to the one-thread row is the speed-up.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  for (const char* name : {"fp16", "bf16", "qsgd", "terngrad"}) {
    if (std::find(present.begin(), present.end(), name) == present.end()) continue;
    for (const char* threads : {"1", "2", "4", "8"}) {
      if (std::atoi(threads) > 2 && static_cast<unsigned>(std::atoi(threads)) > cpus) continue;
      std::shared_ptr<const Compressor> instance;
      try {
        instance = loader.loadCompressor(name)->instantiate({{"threads", threads}});
      } catch (const std::exception& e) {
        std::cerr << "terse-bench-compressors: no threads=" << threads << " bench for " << name << ": " << e.what()
                  << '\n';
        continue;
      }
      for (const Size& s : {kSizes[1], kWallSize16MiB, kSizes[2]}) {
        benchmark::RegisterBenchmark(
            ("compress_wall/" + std::string(name) + "-threads" + threads + "/" + s.label).c_str(), benchCompress,
            instance, s)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  for (const auto& s : kSizes) {
    benchmark::RegisterBenchmark((std::string("memcpy/") + s.label).c_str(), benchMemcpy, s)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark((std::string("baseline/nth_element_topk/") + kBaselineSize.label).c_str(),
                               benchNthElement, kBaselineSize)
      ->Unit(benchmark::kMicrosecond);
  std::cout << "plugins from " << plugin_dir.string() << ": ";
  for (const auto& p : present) std::cout << p << ' ';
  std::cout << (present.empty() ? "(no built-in compressor found)\n" : "\n") << std::flush;

  // Colour only on a terminal and unless asked not to, as the library's own reporter decides.
  bool color = isatty(STDOUT_FILENO) != 0;
  for (char* a : args)
    if (std::string(a) == "--benchmark_color=false" || std::string(a) == "--benchmark_color=no") color = false;
  SummaryReporter reporter(color ? benchmark::ConsoleReporter::OO_ColorTabular
                                 : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printSummary(std::cout, present);
  benchmark::Shutdown();
  return 0;
}

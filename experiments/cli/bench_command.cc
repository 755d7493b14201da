// `terse bench`: communication benchmarks in nccl-tests' format (STYLE.md 10).
//
//   terse bench links       achieved bandwidth and latency of emulated links against the configured ones
//   terse bench allreduce   size, count, type, algo, time, algbw, busbw (2(n-1)/n), #wrong
//   terse bench allgather   the same with busbw = algbw * (n-1)/n
//
// With --transport inproc every rank is a thread of this process. With --transport tcp the ranks talk over real
// sockets (tcp/transport.h): under `terse launch` (or any launcher job.h detects) each process is one rank and rank 0
// prints the table; otherwise -n N runs N ranks as threads of this process, each with its own TcpTransport over
// loopback, met through an in-process store. With --transport nccl (builds with CUDA and NCCL) every process is one
// rank on its own GPU (nccl_communicator.h) and the buffers are device memory: one process alone, or N under
// `terse launch -n N`; the baseline is then a device-to-device copy of the largest size. Correctness is checked after
// the timed loop with deterministic data whose sum is exact in every dtype and every summation order, so #wrong counts
// real errors. The allreduce and allgather tables end with a single-thread memcpy bandwidth of the largest size
// measured in the same run and busbw's ratio to it: an inproc collective moves memory, so memcpy is its natural ceiling
// on this machine.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/tcp/transport.h"
#include "core/common/error.h"
#if defined(TERSE_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include "core/comm/nccl_communicator.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#endif
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "terse/sdk/half.hpp"

namespace terse::cli {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;
using comm::AllreduceAlgorithm;
using comm::HostCommOptions;
using comm::HostCommunicator;
using comm::InprocFabric;
using comm::InprocOptions;

constexpr std::string_view kBenchUsage =
    "usage: terse bench <benchmark> [<args>]\n"
    "\n"
    "benchmarks:\n"
    "  links       achieved bandwidth and latency of emulated links against the configured ones\n"
    "  allreduce   allreduce time, algbw and busbw per message size (nccl-tests format)\n"
    "  allgather   allgather time, algbw and busbw per message size (nccl-tests format)\n"
    "\n"
    "'terse bench <benchmark> --help' lists its options.\n";

constexpr std::string_view kCollectiveUsage =
    "usage: terse bench allreduce|allgather [-n RANKS] [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR] [--dtype T]\n"
    "                                       [--algo ring|rd|auto] [--transport inproc|tcp|nccl] [--bandwidth BW]\n"
    "                                       [--latency T] [--iters N] [-w WARMUP] [--json] [--check]\n"
    "\n"
    "Sizes are total message bytes (allgather: the gathered output, size/n per rank), K/M/G binary. RANKS is N, A..B\n"
    "or a comma list. The timed iterations run in 5 batches between barriers; time is the slowest rank's average per\n"
    "operation in the median batch (robust to load elsewhere on the machine). algbw = size / time, busbw = algbw *\n"
    "2(n-1)/n (allreduce) or (n-1)/n (allgather). Data is checked after the timed loop (#wrong: elements that "
    "differ).\n"
    "memcpy: one thread copying the largest size, sampled between that row's timed batches (median).\n"
    "--transport nccl: one process per GPU (alone, or N under 'terse launch -n N'), device buffers, NCCL's own\n"
    "algorithms (algo 'nccl'); the baseline is a device-to-device copy of the largest size.\n";

constexpr std::string_view kLinksUsage =
    "usage: terse bench links [-n RANKS] [--bandwidth BW] [--latency T] [--nic BW] [-b MINBYTES] [-e MAXBYTES]\n"
    "                         [-f STEPFACTOR] [--iters N] [--json] [--check]\n"
    "\n"
    "One-way time from a ping-pong between ranks 0 and 1 (median of --iters), and streaming bandwidth of back-to-back\n"
    "frames (median of 5 runs), each against\n"
    "what the configured link predicts (frame bytes include the 32-byte header). Rows of 1 MB and more must be within\n"
    "10% (--check makes a miss the exit status). With more than 2 ranks, rank 0 also sends to all others at once\n"
    "(fan-out), which --nic caps.\n";

struct CommonArgs {
  std::vector<int> ranks{2};
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
  bool check = false;
  std::string transport = "inproc";
  InprocOptions inproc;
};

std::vector<int> parseRanks(const std::string& text) {
  std::vector<int> out;
  auto toInt = [&](const std::string& s) {
    std::size_t pos = 0;
    int v = 0;
    try {
      v = std::stoi(s, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != s.size() || v < 1 || v > 64)
      throw po::error("--ranks: '" + text + "' is not N, A..B or A,B,... in 1..64");
    return v;
  };
  if (const auto dots = text.find(".."); dots != std::string::npos) {
    const int a = toInt(text.substr(0, dots)), b = toInt(text.substr(dots + 2));
    if (a > b) throw po::error("--ranks: empty range '" + text + "'");
    for (int n = a; n <= b; ++n) out.push_back(n);
    return out;
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(toInt(item));
  if (out.empty()) throw po::error("--ranks: empty");
  return out;
}

void addCommonOptions(po::options_description& o) {
  o.add_options()("help,h", "show this help")("ranks,n", po::value<std::string>()->default_value("2"),
                                              "world sizes: N, A..B or A,B,...")(
      "minbytes,b", po::value<std::string>(), "smallest message (default 4K; links 1K)")(
      "maxbytes,e", po::value<std::string>(), "largest message (default 64M; links 16M)")(
      "stepfactor,f", po::value<double>(), "size multiplier between rows (default 2; links 4)")(
      "iters", po::value<int>(), "timed iterations per size (default 20; links 10)")(
      "warmup,w", po::value<int>()->default_value(5), "untimed iterations per size")(
      "transport", po::value<std::string>()->default_value("inproc"),
      "inproc, tcp (real sockets: one process per rank under terse launch, else -n threads over loopback) or nccl "
      "(one process per GPU, device buffers)")("bandwidth", po::value<std::string>(),
                                               "emulated bandwidth per directed link, e.g. 10Gbps")(
      "latency", po::value<std::string>(), "emulated one-way latency per link, e.g. 5us")(
      "nic", po::value<std::string>(), "emulated per-rank NIC egress cap shared by its links, e.g. 25Gbps")(
      "nic-ingress", po::value<std::string>(), "emulated per-rank NIC ingress cap")(
      "json", "print JSON instead of the table")("check", "exit with status 1 when a check fails");
}

// Fills args from vm; throws po::error for bad values (reported as usage errors).
CommonArgs commonArgs(const po::variables_map& vm, uint64_t min_default, uint64_t max_default, double step_default,
                      int iters_default) {
  CommonArgs a;
  auto wrap = [](auto&& f) {
    try {
      return f();
    } catch (const Error& e) {
      throw po::error(userMessage(e.what()));
    }
  };
  const std::string transport = vm["transport"].as<std::string>();
  if (transport != "inproc" && transport != "tcp" && transport != "nccl")
    throw po::error("--transport: unknown transport '" + transport + "' (available: inproc, tcp, nccl)");
  a.transport = transport;
  a.ranks = parseRanks(vm["ranks"].as<std::string>());
  a.min_bytes =
      vm.count("minbytes") ? wrap([&] { return comm::parseByteSize(vm["minbytes"].as<std::string>()); }) : min_default;
  a.max_bytes =
      vm.count("maxbytes") ? wrap([&] { return comm::parseByteSize(vm["maxbytes"].as<std::string>()); }) : max_default;
  a.step_factor = vm.count("stepfactor") ? vm["stepfactor"].as<double>() : step_default;
  a.iters = vm.count("iters") ? vm["iters"].as<int>() : iters_default;
  a.warmup = vm["warmup"].as<int>();
  a.json = vm.count("json") != 0;
  a.check = vm.count("check") != 0;
  if (a.min_bytes == 0 || a.min_bytes > a.max_bytes) throw po::error("need 0 < minbytes <= maxbytes");
  if (!(a.step_factor > 1)) throw po::error("--stepfactor must be > 1");
  if (a.iters < 1 || a.warmup < 0) throw po::error("--iters must be >= 1 and --warmup >= 0");
  auto& emu = a.inproc.emulation;
  if (vm.count("bandwidth"))
    emu.link.bandwidth_bps = wrap([&] { return comm::parseBandwidth(vm["bandwidth"].as<std::string>()); });
  if (vm.count("latency"))
    emu.link.latency_s = wrap([&] { return comm::parseDuration(vm["latency"].as<std::string>()); });
  if (vm.count("nic")) emu.nic_egress_bps = wrap([&] { return comm::parseBandwidth(vm["nic"].as<std::string>()); });
  if (vm.count("nic-ingress"))
    emu.nic_ingress_bps = wrap([&] { return comm::parseBandwidth(vm["nic-ingress"].as<std::string>()); });
  return a;
}

std::vector<uint64_t> sizeSweep(const CommonArgs& a, uint64_t align) {
  std::vector<uint64_t> sizes;
  for (double s = static_cast<double>(a.min_bytes); s <= static_cast<double>(a.max_bytes) * 1.0000001;
       s *= a.step_factor) {
    uint64_t b = static_cast<uint64_t>(s) / align * align;
    if (b == 0) b = align;
    if (sizes.empty() || sizes.back() != b) sizes.push_back(b);
  }
  return sizes;
}

std::optional<po::variables_map> parse(const std::vector<std::string>& args, const po::options_description& options,
                                       std::string_view usage, const std::string& who, int& exit_code) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "terse bench " << who << ": " << e.what() << "\n\n" << usage << "\n" << options;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (vm.count("help")) {
    std::cout << usage << "\n" << options;
    exit_code = kExitOk;
    return std::nullopt;
  }
  return vm;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

// Runs fn(rank) on one thread per rank and rethrows the first error.
void onRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Single-thread memcpy of one buffer size, sampled between the batches of the row it is compared with, so both see
// the same conditions on a machine whose load changes from second to second.
class MemcpyProbe {
 public:
  explicit MemcpyProbe(uint64_t bytes) : src_(bytes, std::byte{1}), dst_(bytes, std::byte{2}) {}
  void sample() {
    const auto start = Clock::now();
    std::memcpy(dst_.data(), src_.data(), src_.size());
    seconds_.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    src_[seconds_.size() % src_.size()] = dst_[(seconds_.size() * 7) % src_.size()];  // keep the copies observable
  }
  // GB/s of the median sample.
  double gbps() const {
    std::vector<double> t = seconds_;
    std::sort(t.begin(), t.end());
    return static_cast<double>(src_.size()) / t[t.size() / 2] / 1e9;
  }

 private:
  std::vector<std::byte> src_;
  std::vector<std::byte> dst_;
  std::vector<double> seconds_;
};

// ---- allreduce / allgather

// Element i of rank r: an integer in [-7, 7], so any sum over up to 64 ranks (|sum| <= 448 < 2^8 needs care for bf16:
// bf16 holds integers exactly up to 256, i.e. 36 ranks) is exact in f32 and f16 and in bf16 up to 36 ranks, in any
// summation order: #wrong counts real errors, never rounding.
int benchValue(int r, std::size_t i) {
  return static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 15) - 7;
}

void storeValue(std::byte* p, std::size_t i, DType dtype, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::kF16 ? sdk::floatToHalf(v) : sdk::floatToBf16(v);
  std::memcpy(p + 2 * i, &h, 2);
}
float loadValue(const std::byte* p, std::size_t i, DType dtype) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == DType::kF16 ? sdk::halfToFloat(h) : sdk::bf16ToFloat(h);
}

// #wrong of one check: an allreduce's `count` elements against the sum of every rank's benchValue, or an allgather's
// n blocks of per_rank elements against each rank's own values.
uint64_t countWrong(const std::byte* got, bool allreduce, std::size_t count, std::size_t per_rank, int n, DType dtype) {
  uint64_t bad = 0;
  if (allreduce) {
    for (std::size_t i = 0; i < count; ++i) {
      int want = 0;
      for (int q = 0; q < n; ++q) want += benchValue(q, i);
      if (loadValue(got, i, dtype) != static_cast<float>(want)) ++bad;
    }
  } else {
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < per_rank; ++i)
        if (loadValue(got, static_cast<std::size_t>(q) * per_rank + i, dtype) != static_cast<float>(benchValue(q, i)))
          ++bad;
  }
  return bad;
}

struct Row {
  uint64_t size = 0;
  uint64_t count = 0;
  std::string algo;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
};

struct CollectiveRun {
  int ranks = 0;
  std::vector<Row> rows;
};

// nccl-tests' columns, one table per world size.
void printRunTables(const std::vector<CollectiveRun>& runs, DType dtype) {
  for (const CollectiveRun& run : runs) {
    std::cout << "#\n# ranks " << run.ranks << "\n";
    Table table({"#       size", "count", "type", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"});
    for (const Row& r : run.rows) {
      std::ostringstream size;
      size << std::setw(13) << r.size;
      table.add({size.str(), std::to_string(r.count), std::string(dtypeName(dtype)), r.algo, fixed(r.time_us, 2),
                 fixed(r.algbw, 3), fixed(r.busbw, 3), std::to_string(r.wrong)});
    }
    table.print(std::cout);
  }
}

#if defined(TERSE_HAVE_NCCL)
// ---- --transport nccl: one process per GPU, device buffers, NCCL's algorithms.

// The slowest rank's time per operation in the median batch: elapsed[rank][batch] over per_batch operations each.
double medianBatchSeconds(const std::vector<std::vector<double>>& elapsed, int batches, int per_batch) {
  std::vector<double> batch_time(static_cast<std::size_t>(batches), 0.0);
  for (const auto& e : elapsed)
    for (int b = 0; b < batches; ++b)
      batch_time[static_cast<std::size_t>(b)] =
          std::max(batch_time[static_cast<std::size_t>(b)], e[static_cast<std::size_t>(b)]);
  std::sort(batch_time.begin(), batch_time.end());
  return batch_time[batch_time.size() / 2] / per_batch;
}

int ncclCollectiveCommand(bool allreduce, const CommonArgs& a, DType dtype, bool ranks_given) {
  const std::string who = allreduce ? "allreduce" : "allgather";
  const std::size_t elem = dtypeSize(dtype);
  std::optional<comm::Job> job;
  comm::MemoryStore local_store;
  std::unique_ptr<comm::NcclCommunicator> c;
  try {
    const auto env = comm::detectJobEnv();
    if (env && env->world_size > 1) {
      job.emplace(comm::joinJob(std::chrono::seconds(60)));
    } else if (ranks_given && (a.ranks.size() != 1 || a.ranks[0] != 1)) {
      TERSE_THROW(InvalidArgument,
                  "--transport nccl runs one process per GPU: start N ranks with 'terse launch -n N "
                  "-- terse bench "
                      << who << " --transport nccl' (-n here must be 1 or left out)");
    }
    comm::NcclOptions o = job ? comm::ncclOptionsFromJob(job->env) : comm::NcclOptions{};
    o.store_prefix = "bench/nccl/";
    c = comm::connectNcclCommunicator(o, job ? *job->store : local_store);
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  const int n = c->size(), me = c->rank();
  const bool printer = me == 0;
  auto stream = static_cast<cudaStream_t>(c->stream());
  const std::vector<uint64_t> sweep = sizeSweep(a, allreduce ? elem : elem * static_cast<uint64_t>(n));
  const uint64_t largest = sweep.back();
  const int batches = std::min(a.iters, 5);
  const int per_batch = std::max(1, a.iters / batches);

  CollectiveRun run;
  run.ranks = n;
  uint64_t total_wrong = 0;
  double copy_gbps = 0;
  try {
    // Sized once for the largest row: buf is the allreduce's data or the allgather's output, send a rank's block,
    // copy_dst the baseline copy's target, stats the per-rank batch times and #wrong gathered to rank 0.
    cuda::DeviceBuffer buf(largest, stream), send(largest / static_cast<uint64_t>(n), stream),
        copy_dst(largest, stream);
    const std::size_t words = static_cast<std::size_t>(batches) + 1;
    cuda::DeviceBuffer stats(8 * words * static_cast<std::size_t>(n), stream);
    cuda::Event copy_start(cuda::Event::Timing::kEnabled), copy_stop(cuda::Event::Timing::kEnabled);
    std::vector<double> copy_seconds;
    for (uint64_t size : sweep) {
      const std::size_t count = static_cast<std::size_t>(size / elem);
      const std::size_t per_rank = count / static_cast<std::size_t>(n);
      const std::vector<uint64_t> sizes(static_cast<std::size_t>(n), per_rank * elem);
      const std::span<std::byte> out(buf.as<std::byte>(), allreduce ? size : per_rank * elem * sizes.size());
      const std::span<const std::byte> block(send.as<std::byte>(), per_rank * elem);
      std::vector<std::byte> host(allreduce ? size : per_rank * elem);
      auto fill = [&] {
        for (std::size_t i = 0; i < host.size() / elem; ++i)
          storeValue(host.data(), i, dtype, static_cast<float>(benchValue(me, i)));
        TERSE_CUDA_CHECK(cudaMemcpyAsync(allreduce ? buf.data() : send.data(), host.data(), host.size(),
                                         cudaMemcpyHostToDevice, stream));
        TERSE_CUDA_CHECK(cudaStreamSynchronize(stream));
      };
      auto op = [&] { return allreduce ? c->iallreduce(buf.data(), count, dtype) : c->iallgatherv(block, out, sizes); };
      fill();
      for (int i = 0; i < a.warmup; ++i) op().wait();
      std::vector<double> mine(words, 0.0);
      std::vector<comm::CommRequest> reqs;
      for (int b = 0; b < batches; ++b) {
        c->barrier();
        // nccl-tests' loop: every operation of the batch queued back to back, then one wait for all of them.
        const auto start = Clock::now();
        reqs.clear();
        for (int i = 0; i < per_batch; ++i) reqs.push_back(op());
        for (auto& r : reqs) r.wait();
        mine[static_cast<std::size_t>(b)] = std::chrono::duration<double>(Clock::now() - start).count();
        if (size == largest && printer) {
          // The device copy baseline, sampled between this row's batches like the host memcpy probe.
          for (int k = 0; k < 3; ++k) {
            copy_start.record(stream);
            TERSE_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), buf.data(), size, cudaMemcpyDeviceToDevice, stream));
            copy_stop.record(stream);
            copy_stop.synchronize();
            copy_seconds.push_back(copy_stop.millisecondsSince(copy_start) / 1e3);
          }
        }
      }
      fill();
      op().wait();
      std::vector<std::byte> got(out.size());
      TERSE_CUDA_CHECK(cudaMemcpyAsync(got.data(), out.data(), got.size(), cudaMemcpyDeviceToHost, stream));
      TERSE_CUDA_CHECK(cudaStreamSynchronize(stream));
      const uint64_t bad = countWrong(got.data(), allreduce, count, per_rank, n, dtype);
      mine[words - 1] = static_cast<double>(bad);
      // Every rank's batch times and #wrong to every rank (device memory, as NCCL needs), so rank 0 computes the row
      // from all of them.
      std::vector<double> all(words * static_cast<std::size_t>(n));
      auto* slot = stats.as<double>() + static_cast<std::size_t>(me) * words;
      TERSE_CUDA_CHECK(cudaMemcpyAsync(slot, mine.data(), 8 * words, cudaMemcpyHostToDevice, stream));
      const std::vector<uint64_t> part(static_cast<std::size_t>(n), 8 * words);
      c->allgatherv(std::span<const std::byte>(reinterpret_cast<const std::byte*>(slot), 8 * words),
                    std::span<std::byte>(stats.as<std::byte>(), stats.size()), part);
      TERSE_CUDA_CHECK(cudaMemcpyAsync(all.data(), stats.data(), stats.size(), cudaMemcpyDeviceToHost, stream));
      TERSE_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<std::vector<double>> elapsed(static_cast<std::size_t>(n));
      Row row;
      for (int q = 0; q < n; ++q) {
        const auto at = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(q) * words);
        elapsed[static_cast<std::size_t>(q)].assign(at, at + batches);
        row.wrong += static_cast<uint64_t>(at[batches]);
      }
      row.size = out.size();
      row.count = row.size / elem;
      row.algo = "nccl";
      const double t = medianBatchSeconds(elapsed, batches, per_batch);
      row.time_us = t * 1e6;
      row.algbw = static_cast<double>(row.size) / t / 1e9;
      row.busbw = row.algbw * (allreduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n);
      total_wrong += row.wrong;
      run.rows.push_back(row);
    }
    if (printer) {
      std::sort(copy_seconds.begin(), copy_seconds.end());
      copy_gbps = static_cast<double>(largest) / copy_seconds[copy_seconds.size() / 2] / 1e9;
    }
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": rank " << me << ": " << userMessage(e.what()) << '\n';
    c->abort(std::string("bench failed on rank ") + std::to_string(me));
    return kExitFailure;
  }
  if (!printer) return a.check && total_wrong != 0 ? kExitFailure : kExitOk;
  const Row& last = run.rows.back();
  // At world size 1 busbw is 0 by definition (nothing crosses a link); the ratio then compares algbw, the rate at
  // which the collective turns its input into its output, with the copy.
  const double rate = n > 1 ? last.busbw : last.algbw;
  const double ratio = rate / copy_gbps;
  const cuda::DeviceSummary dev = cuda::deviceSummary();
  if (a.json) {
    std::ostringstream j;
    j << "{\"benchmark\":\"" << who << "\",\"transport\":\"nccl\",\"dtype\":\"" << dtypeName(dtype)
      << "\",\"device\":\"" << dev.first_name << "\",\"iters\":" << a.iters << ",\"warmup\":" << a.warmup
      << ",\"runs\":[{\"ranks\":" << n << ",\"rows\":[";
    for (std::size_t i = 0; i < run.rows.size(); ++i) {
      const Row& r = run.rows[i];
      j << (i ? "," : "") << "{\"size\":" << r.size << ",\"count\":" << r.count << ",\"type\":\"" << dtypeName(dtype)
        << "\",\"algo\":\"nccl\",\"time_us\":" << fixed(r.time_us, 2) << ",\"algbw_gbps\":" << fixed(r.algbw, 3)
        << ",\"busbw_gbps\":" << fixed(r.busbw, 3) << ",\"wrong\":" << r.wrong << "}";
    }
    j << "]}],\"device_copy\":{\"bytes\":" << largest << ",\"gbps\":" << fixed(copy_gbps, 3)
      << "},\"bw_over_device_copy\":" << fixed(ratio, 3) << ",\"wrong\":" << total_wrong << "}";
    std::cout << j.str() << '\n';
  } else {
    std::cout << "# terse bench " << who << ": transport nccl (one process per GPU" << (job ? ", terse launch" : "")
              << "), device " << dev.first_name << ", dtype " << dtypeName(dtype) << ", iters " << a.iters
              << ", warmup " << a.warmup << "\n";
    printRunTables({run}, dtype);
    std::cout << "# Out of bounds values : " << total_wrong << (total_wrong == 0 ? " OK" : " FAILED") << "\n"
              << "# device copy " << largest << " B (cudaMemcpyAsync device to device, sampled between that row's "
              << "batches): " << fixed(copy_gbps, 2) << " GB/s\n"
              << "# " << (n > 1 ? "busbw" : "algbw") << "/device copy at " << largest << " B (ranks " << n
              << "): " << fixed(ratio, 2) << "\n";
  }
  return a.check && total_wrong != 0 ? kExitFailure : kExitOk;
}
#endif

int collectiveCommand(bool allreduce, const std::vector<std::string>& args) {
  const std::string who = allreduce ? "allreduce" : "allgather";
  po::options_description options("options");
  addCommonOptions(options);
  options.add_options()("dtype", po::value<std::string>()->default_value("f32"), "f32, f16 or bf16")(
      "algo", po::value<std::string>()->default_value("auto"), "allreduce algorithm: ring, rd or auto")(
      "threshold", po::value<std::string>()->default_value("64K"), "auto: recursive doubling below this size")(
      "segment", po::value<std::string>()->default_value("auto"),
      "maximum frame payload; auto: 256K inproc (a frame's copy stays in L2), 1M tcp (fewer frames, wake-ups and "
      "syscalls per byte)")("socket-buffer", po::value<std::string>()->default_value("0"),
                            "tcp: SO_SNDBUF/SO_RCVBUF per connection, e.g. 4M (0: the OS default, autotuned)");
  int exit_code = kExitOk;
  auto vm = parse(args, options, kCollectiveUsage, who, exit_code);
  if (!vm) return exit_code;

  CommonArgs a;
  DType dtype = DType::kF32;
  HostCommOptions comm_options;
  uint64_t socket_buffer = 0;
  try {
    a = commonArgs(*vm, 4096, 64ull << 20, 2, 20);
    const auto d = parseDType((*vm)["dtype"].as<std::string>());
    if (!d || (*d != DType::kF32 && *d != DType::kF16 && *d != DType::kBF16))
      throw po::error("--dtype must be f32, f16 or bf16, got '" + (*vm)["dtype"].as<std::string>() + "'");
    dtype = *d;
    const auto algo = comm::parseAllreduceAlgorithm((*vm)["algo"].as<std::string>());
    if (!algo) throw po::error("--algo must be ring, rd or auto, got '" + (*vm)["algo"].as<std::string>() + "'");
    comm_options.algorithm = *algo;
    comm_options.small_allreduce_bytes = comm::parseByteSize((*vm)["threshold"].as<std::string>());
    const std::string segment = (*vm)["segment"].as<std::string>();
    comm_options.segment_bytes =
        segment != "auto" ? comm::parseByteSize(segment) : (a.transport == "tcp" ? 1024 * 1024 : 256 * 1024);
    if (comm_options.segment_bytes == 0) throw po::error("--segment must be > 0");
    socket_buffer = comm::parseByteSize((*vm)["socket-buffer"].as<std::string>());
    if (socket_buffer > (uint64_t{1} << 30)) throw po::error("--socket-buffer must be at most 1G");
    for (int n : a.ranks)
      if (dtype == DType::kBF16 && n > 36) throw po::error("--dtype bf16 checks exact sums only up to 36 ranks");
  } catch (const po::error& e) {
    std::cerr << "terse bench " << who << ": " << e.what() << "\n\n" << kCollectiveUsage << "\n" << options;
    return kExitUsage;
  } catch (const Error& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitUsage;
  }
  const std::size_t elem = dtypeSize(dtype);
  if (a.transport == "nccl") {
#if defined(TERSE_HAVE_NCCL)
    if (a.inproc.emulation.enabled()) {
      std::cerr << "terse bench " << who << ": --transport nccl runs on real links; --bandwidth, --latency and --nic "
                << "emulate links of the inproc and tcp transports only\n";
      return kExitUsage;
    }
    return ncclCollectiveCommand(allreduce, a, dtype, !(*vm)["ranks"].defaulted());
#else
    std::cerr << "terse bench " << who << ": --transport nccl: this build has no NCCL (it needs CUDA and NCCL: "
              << "configure with -DTERSE_CUDA=ON where nvcc and libnccl are installed)\n";
    return kExitUsage;
#endif
  }

  // Under a launcher with --transport tcp, this process is one rank of the job; otherwise every rank is a thread here.
  std::optional<comm::Job> job;
  try {
    if (a.transport == "tcp") {
      const auto env = comm::detectJobEnv();
      if (env && env->world_size > 1) {
        job.emplace(comm::joinJob(std::chrono::seconds(60)));
        a.ranks = {job->env.world_size};
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  const bool printer = !job || job->env.rank == 0;

  std::vector<CollectiveRun> runs;
  uint64_t total_wrong = 0;
  double last_busbw_at_max = 0;
  double memcpy_gbps = 0;
  uint64_t largest = 0;
  try {
    for (int n : a.ranks) {
      CollectiveRun run;
      run.ranks = n;
      // comms[r] is rank r's communicator where it lives in this process (all of them, or this process's rank).
      std::vector<std::unique_ptr<HostCommunicator>> comms(static_cast<std::size_t>(n));
      comm::MemoryStore local_store;
      if (a.transport == "inproc") {
        auto fabric = InprocFabric::create(n, a.inproc);
        for (int r = 0; r < n; ++r)
          comms[static_cast<std::size_t>(r)] = std::make_unique<HostCommunicator>(fabric->endpoint(r), comm_options);
      } else {
        auto connect = [&](int r, comm::Store& store, const comm::JobToken& token, const std::string& host,
                           const std::string& prefix) {
          comm::TcpOptions o;
          o.rank = r;
          o.world_size = n;
          o.emulation = a.inproc.emulation;
          o.socket_buffer_bytes = static_cast<int>(socket_buffer);
          o.store_prefix = prefix;
          o.host_label = host;
          if (job && !comm::isLoopbackAddress(job->env.master_addr)) o.bind_address = "0.0.0.0";
          comms[static_cast<std::size_t>(r)] =
              std::make_unique<HostCommunicator>(comm::connectTcpTransport(o, token, store), comm_options);
        };
        const std::string prefix = "bench/" + std::to_string(n) + "/";
        if (job) {
          connect(job->env.rank, *job->store, job->token, job->env.host, prefix);
        } else {
          const comm::JobToken token = comm::JobToken::generate();
          onRanks(n, [&](int r) { connect(r, local_store, token, "", prefix); });
        }
      }
      HostCommunicator& any = job ? *comms[static_cast<std::size_t>(job->env.rank)] : *comms[0];
      // allgather: each rank contributes size / n bytes, whole elements.
      const uint64_t align = allreduce ? elem : elem * static_cast<uint64_t>(n);
      const std::vector<uint64_t> sweep = sizeSweep(a, align);
      for (uint64_t size : sweep) {
        // The largest size is compared with memcpy; its samples interleave with that row's timed batches.
        std::unique_ptr<MemcpyProbe> probe;
        if (size == sweep.back() && printer) probe = std::make_unique<MemcpyProbe>(size);  // sampled by rank 0
        const std::size_t count = static_cast<std::size_t>(size / elem);
        const std::size_t per_rank = count / static_cast<std::size_t>(n);
        std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(n));
        std::vector<std::vector<std::byte>> sends(static_cast<std::size_t>(n));
        const int batches = std::min(a.iters, 5);
        const int per_batch = std::max(1, a.iters / batches);
        std::vector<std::vector<double>> elapsed(static_cast<std::size_t>(n),
                                                 std::vector<double>(static_cast<std::size_t>(batches)));
        std::vector<uint64_t> wrong(static_cast<std::size_t>(n));
        const std::vector<uint64_t> sizes(static_cast<std::size_t>(n), per_rank * elem);
        auto body = [&](int r) {
          HostCommunicator& c = *comms[static_cast<std::size_t>(r)];
          auto& buf = bufs[static_cast<std::size_t>(r)];
          auto& send = sends[static_cast<std::size_t>(r)];
          buf.assign(size, std::byte{0});
          send.assign(per_rank * elem, std::byte{0});
          auto fill = [&] {
            if (allreduce) {
              for (std::size_t i = 0; i < count; ++i)
                storeValue(buf.data(), i, dtype, static_cast<float>(benchValue(r, i)));
            } else {
              for (std::size_t i = 0; i < per_rank; ++i)
                storeValue(send.data(), i, dtype, static_cast<float>(benchValue(r, i)));
            }
          };
          auto op = [&] {
            if (allreduce) {
              c.allreduce(buf.data(), count, dtype);
            } else {
              c.allgatherv(send, buf, sizes);
            }
          };
          // The timed data grows by a factor n per allreduce (16-bit values saturate to inf): timing does not depend
          // on the values, and correctness is checked on fresh data below.
          fill();
          for (int i = 0; i < a.warmup; ++i) op();
          // The timed iterations run in batches between barriers; the row reports the median batch, so a burst of
          // load from elsewhere on a shared machine shifts one batch rather than the whole row.
          for (int b = 0; b < batches; ++b) {
            c.barrier();
            const auto start = Clock::now();
            for (int i = 0; i < per_batch; ++i) op();
            elapsed[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] =
                std::chrono::duration<double>(Clock::now() - start).count();
            // The other ranks are parked in the next barrier meanwhile, so the copy runs alone.
            if (probe && r == 0)
              for (int k = 0; k < 3; ++k) probe->sample();
          }
          fill();
          op();
          const uint64_t bad = countWrong(buf.data(), allreduce, count, per_rank, n, dtype);
          wrong[static_cast<std::size_t>(r)] = bad;
        };
        if (job) {
          // This process ran one rank: every rank's batch times and #wrong are gathered so the row is computed from
          // all of them, exactly as with threads.
          const int me = job->env.rank;
          body(me);
          std::vector<double> mine(elapsed[static_cast<std::size_t>(me)]);
          mine.push_back(static_cast<double>(wrong[static_cast<std::size_t>(me)]));
          std::vector<double> all(mine.size() * static_cast<std::size_t>(n));
          const std::vector<uint64_t> part(static_cast<std::size_t>(n), mine.size() * sizeof(double));
          any.allgatherv(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), part);
          for (int q = 0; q < n; ++q) {
            const auto at = static_cast<std::size_t>(q) * mine.size();
            std::copy(all.begin() + static_cast<std::ptrdiff_t>(at),
                      all.begin() + static_cast<std::ptrdiff_t>(at + mine.size() - 1),
                      elapsed[static_cast<std::size_t>(q)].begin());
            wrong[static_cast<std::size_t>(q)] = static_cast<uint64_t>(all[at + mine.size() - 1]);
          }
        } else {
          onRanks(n, body);
        }
        Row row;
        row.size = allreduce ? size : per_rank * elem * static_cast<uint64_t>(n);
        row.count = row.size / elem;
        row.algo = allreduce ? std::string(comm::allreduceAlgorithmName(any.algorithmFor(size))) : "ring";
        std::vector<double> batch_time(static_cast<std::size_t>(batches), 0.0);
        for (const auto& e : elapsed)
          for (int b = 0; b < batches; ++b)
            batch_time[static_cast<std::size_t>(b)] =
                std::max(batch_time[static_cast<std::size_t>(b)], e[static_cast<std::size_t>(b)]);
        std::sort(batch_time.begin(), batch_time.end());
        const double t = batch_time[batch_time.size() / 2] / per_batch;
        row.time_us = t * 1e6;
        row.algbw = static_cast<double>(row.size) / t / 1e9;
        const double factor = allreduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        row.busbw = row.algbw * factor;
        for (uint64_t w : wrong) row.wrong += w;
        total_wrong += row.wrong;
        if (row.size >= largest) {
          largest = row.size;
          last_busbw_at_max = row.busbw;
          // Measured right after the row it is compared with, under the same conditions.
          if (probe) memcpy_gbps = probe->gbps();
        }
        run.rows.push_back(row);
      }
      runs.push_back(std::move(run));
    }
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  const double ratio = last_busbw_at_max / memcpy_gbps;
  if (!printer) return a.check && total_wrong != 0 ? kExitFailure : kExitOk;

  if (a.json) {
    std::ostringstream j;
    j << "{\"benchmark\":\"" << who << "\",\"transport\":\"" << a.transport << "\",\"dtype\":\"" << dtypeName(dtype)
      << "\",\"algo\":\"" << comm::allreduceAlgorithmName(comm_options.algorithm)
      << "\",\"threshold_bytes\":" << comm_options.small_allreduce_bytes
      << ",\"segment_bytes\":" << comm_options.segment_bytes << ",\"iters\":" << a.iters << ",\"warmup\":" << a.warmup
      << ",\"links\":\"" << a.inproc.emulation.describe() << "\",\"runs\":[";
    for (std::size_t k = 0; k < runs.size(); ++k) {
      j << (k ? "," : "") << "{\"ranks\":" << runs[k].ranks << ",\"rows\":[";
      for (std::size_t i = 0; i < runs[k].rows.size(); ++i) {
        const Row& r = runs[k].rows[i];
        j << (i ? "," : "") << "{\"size\":" << r.size << ",\"count\":" << r.count << ",\"type\":\"" << dtypeName(dtype)
          << "\",\"algo\":\"" << r.algo << "\",\"time_us\":" << fixed(r.time_us, 2)
          << ",\"algbw_gbps\":" << fixed(r.algbw, 3) << ",\"busbw_gbps\":" << fixed(r.busbw, 3)
          << ",\"wrong\":" << r.wrong << "}";
      }
      j << "]}";
    }
    j << "],\"memcpy\":{\"bytes\":" << largest << ",\"gbps\":" << fixed(memcpy_gbps, 3)
      << "},\"busbw_over_memcpy\":" << fixed(ratio, 3) << ",\"wrong\":" << total_wrong << "}";
    std::cout << j.str() << '\n';
  } else {
    std::cout << "# terse bench " << who << ": transport " << a.transport
              << (job                    ? " (one process per rank)"
                  : a.transport == "tcp" ? " (ranks as threads, loopback)"
                                         : "")
              << ", dtype " << dtypeName(dtype);
    if (allreduce) {
      std::cout << ", algo " << comm::allreduceAlgorithmName(comm_options.algorithm);
      if (comm_options.algorithm == AllreduceAlgorithm::kAuto)
        std::cout << " (rd below " << comm_options.small_allreduce_bytes << " B)";
    }
    std::cout << ", segment " << comm_options.segment_bytes << " B, iters " << a.iters << ", warmup " << a.warmup
              << ", links " << a.inproc.emulation.describe() << "\n";
    printRunTables(runs, dtype);
    std::cout << "# Out of bounds values : " << total_wrong << (total_wrong == 0 ? " OK" : " FAILED") << "\n"
              << "# memcpy " << largest
              << " B (1 thread, sampled between that row's batches): " << fixed(memcpy_gbps, 2) << " GB/s\n"
              << "# busbw/memcpy at " << largest << " B (ranks " << runs.back().ranks << "): " << fixed(ratio, 2)
              << "\n";
  }
  return a.check && total_wrong != 0 ? kExitFailure : kExitOk;
}

// ---- links

constexpr int kStreamRepeats = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct LinkRow {
  uint64_t size = 0;
  double oneway_us = 0;
  double expect_oneway_us = 0;
  double stream_gbps = 0;
  double expect_stream_gbps = 0;
  bool checked = false;
  bool ok = true;
};

int linksCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  addCommonOptions(options);
  int exit_code = kExitOk;
  auto vm = parse(args, options, kLinksUsage, "links", exit_code);
  if (!vm) return exit_code;
  CommonArgs a;
  try {
    a = commonArgs(*vm, 1024, 16ull << 20, 4, 10);
    if (a.transport != "inproc")
      throw po::error(
          "--transport: links measures the link emulation on inproc only (allreduce and allgather run on "
          "tcp)");
    if (!vm->count("bandwidth") && !vm->count("latency") && !vm->count("nic")) {
      a.inproc.emulation.link.bandwidth_bps = 10e9;
      a.inproc.emulation.link.latency_s = 50e-6;
    }
    if (a.ranks.size() != 1 || a.ranks[0] < 2) throw po::error("--ranks: links needs one world size >= 2");
    a.inproc.emulation.validate(a.ranks[0]);
  } catch (const po::error& e) {
    std::cerr << "terse bench links: " << e.what() << "\n\n" << kLinksUsage << "\n" << options;
    return kExitUsage;
  } catch (const Error& e) {
    std::cerr << "terse bench links: " << userMessage(e.what()) << '\n';
    return kExitUsage;
  }
  const int n = a.ranks[0];
  const auto& emu = a.inproc.emulation;
  const comm::LinkSpec spec = emu.linkSpec(0, 1);
  // The rate a frame from 0 to 1 gets: its link, capped by rank 0's egress and rank 1's ingress.
  double rate = spec.bandwidth_bps;
  for (double cap : {emu.nic_egress_bps, emu.nic_ingress_bps})
    if (cap > 0 && (rate <= 0 || cap < rate)) rate = cap;
  auto wireSeconds = [&](uint64_t payload) {
    return rate > 0 ? static_cast<double>(comm::frameWireBytes(payload)) * 8 / rate : 0.0;
  };

  std::vector<LinkRow> rows;
  double fan_gbps = 0, fan_expect_gbps = 0;
  uint64_t fan_size = 0;
  try {
    auto fabric = InprocFabric::create(n, a.inproc);
    std::vector<std::unique_ptr<comm::Transport>> ts;
    for (int r = 0; r < n; ++r) ts.push_back(fabric->endpoint(r));
    comm::Tag tag = 1;
    for (uint64_t size : sizeSweep(a, 1)) {
      LinkRow row;
      row.size = size;
      const int stream = static_cast<int>(std::clamp<uint64_t>((8ull << 20) / size, 4, 64));
      // Medians over the iterations: one descheduled thread on a busy machine must not decide a row.
      std::vector<double> pingpong, streamed;
      const comm::Tag t_ping = tag++, t_stream = tag++;
      onRanks(2, [&](int r) {
        comm::Transport& t = *ts[static_cast<std::size_t>(r)];
        const comm::FrameMeta ping{comm::OpKind::kP2P, t_ping, comm::kNoTensor};
        const comm::FrameMeta flow{comm::OpKind::kP2P, t_stream, comm::kNoTensor};
        std::vector<std::byte> buf(size);
        const int peer = 1 - r;
        for (int i = 0; i < a.warmup + a.iters; ++i) {
          const auto start = Clock::now();
          if (r == 0) {
            t.send(peer, ping, buf);
            t.recv(peer, ping, buf);
          } else {
            t.recv(peer, ping, buf);
            t.send(peer, ping, buf);
          }
          if (r == 0 && i >= a.warmup) pingpong.push_back(std::chrono::duration<double>(Clock::now() - start).count());
        }
        // Streaming: `stream` frames back to back; rank 1 stamps the last arrival and answers with an empty frame.
        std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(stream), std::vector<std::byte>(size));
        for (int rep = 0; rep < kStreamRepeats; ++rep) {
          std::vector<comm::Request> reqs;
          if (r == 0) {
            const auto start = Clock::now();
            for (auto& b : bufs) reqs.push_back(t.isend(peer, flow, b));
            for (auto& q : reqs) q.wait();
            t.recv(peer, flow, {});
            streamed.push_back(std::chrono::duration<double>(Clock::now() - start).count());
          } else {
            for (auto& b : bufs) reqs.push_back(t.irecv(peer, flow, b));
            for (auto& q : reqs) q.wait();
            t.send(peer, flow, {});
          }
        }
      });
      row.oneway_us = median(pingpong) / 2 * 1e6;
      row.expect_oneway_us = (wireSeconds(size) + spec.latency_s) * 1e6;
      // The stream's time includes the empty answer's trip back: one latency and a header.
      const double bits = static_cast<double>(stream) * static_cast<double>(comm::frameWireBytes(size)) * 8;
      const double expect_time = stream * wireSeconds(size) + 2 * spec.latency_s + wireSeconds(0);
      row.stream_gbps = bits / median(streamed) / 1e9;
      row.expect_stream_gbps = bits / expect_time / 1e9;
      row.checked = size >= (1u << 20) && rate > 0;
      if (row.checked) {
        const double r1 = row.oneway_us / row.expect_oneway_us, r2 = row.stream_gbps / row.expect_stream_gbps;
        row.ok = r1 > 0.9 && r1 < 1.1 && r2 > 0.9 && r2 < 1.1;
      }
      rows.push_back(row);
    }
    if (n > 2) {
      // Fan-out: rank 0 sends the largest size to every other rank at once.
      fan_size = rows.back().size;
      const comm::FrameMeta fan{comm::OpKind::kP2P, tag++, comm::kNoTensor};
      double took = 0;
      onRanks(n, [&](int r) {
        comm::Transport& t = *ts[static_cast<std::size_t>(r)];
        std::vector<std::byte> buf(fan_size);
        if (r == 0) {
          const auto start = Clock::now();
          std::vector<comm::Request> reqs;
          for (int p = 1; p < n; ++p) reqs.push_back(t.isend(p, fan, buf));
          for (auto& q : reqs) q.wait();
          took = std::chrono::duration<double>(Clock::now() - start).count();
        } else {
          t.recv(0, fan, buf);
        }
      });
      const double bits = static_cast<double>(n - 1) * static_cast<double>(comm::frameWireBytes(fan_size)) * 8;
      fan_gbps = bits / took / 1e9;
      double agg = spec.bandwidth_bps > 0 ? spec.bandwidth_bps * (n - 1) : 0;
      if (emu.nic_egress_bps > 0 && (agg <= 0 || emu.nic_egress_bps < agg)) agg = emu.nic_egress_bps;
      fan_expect_gbps = agg / 1e9;
    }
  } catch (const std::exception& e) {
    std::cerr << "terse bench links: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }

  bool all_ok = true;
  for (const auto& r : rows) all_ok = all_ok && r.ok;
  if (a.json) {
    std::ostringstream j;
    j << "{\"benchmark\":\"links\",\"transport\":\"inproc\",\"ranks\":" << n
      << ",\"bandwidth_bps\":" << spec.bandwidth_bps << ",\"latency_s\":" << spec.latency_s
      << ",\"nic_egress_bps\":" << emu.nic_egress_bps << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      j << (i ? "," : "") << "{\"size\":" << r.size << ",\"oneway_us\":" << fixed(r.oneway_us, 2)
        << ",\"expected_oneway_us\":" << fixed(r.expect_oneway_us, 2) << ",\"stream_gbps\":" << fixed(r.stream_gbps, 3)
        << ",\"expected_stream_gbps\":" << fixed(r.expect_stream_gbps, 3)
        << ",\"checked\":" << (r.checked ? "true" : "false") << ",\"ok\":" << (r.ok ? "true" : "false") << "}";
    }
    j << "]";
    if (fan_size)
      j << ",\"fanout\":{\"size\":" << fan_size << ",\"gbps\":" << fixed(fan_gbps, 3)
        << ",\"expected_gbps\":" << fixed(fan_expect_gbps, 3) << "}";
    j << ",\"ok\":" << (all_ok ? "true" : "false") << "}";
    std::cout << j.str() << '\n';
  } else {
    std::cout << "# terse bench links: transport inproc, ranks " << n << ", link 0 -> 1 "
              << comm::formatBandwidth(spec.bandwidth_bps) << " " << comm::formatDuration(spec.latency_s)
              << ", nic egress " << comm::formatBandwidth(emu.nic_egress_bps) << ", nic ingress "
              << comm::formatBandwidth(emu.nic_ingress_bps) << ", iters " << a.iters << "\n"
              << "# one-way: half a ping-pong; stream: back-to-back frames; expected from the configured rates with\n"
              << "# 32-byte frame headers; rows >= 1 MB must be within 10%\n";
    Table table(
        {"#       size", "oneway(us)", "expected(us)", "ratio", "stream(Gbps)", "expected(Gbps)", "ratio", "check"});
    for (const auto& r : rows) {
      std::ostringstream size;
      size << std::setw(13) << r.size;
      table.add({size.str(), fixed(r.oneway_us, 1), fixed(r.expect_oneway_us, 1),
                 fixed(r.oneway_us / r.expect_oneway_us, 3), fixed(r.stream_gbps, 3), fixed(r.expect_stream_gbps, 3),
                 fixed(r.stream_gbps / r.expect_stream_gbps, 3), r.checked ? (r.ok ? "ok" : "OFF") : "-"});
    }
    table.print(std::cout);
    if (fan_size) {
      std::cout << "# fan-out 0 -> all, " << fan_size << " B each: " << fixed(fan_gbps, 3)
                << " Gbps aggregate, expected " << fixed(fan_expect_gbps, 3) << " Gbps (ratio "
                << fixed(fan_gbps / fan_expect_gbps, 3) << ")\n";
    }
    std::cout << "# " << (all_ok ? "all checked rows within 10%" : "some rows are off by more than 10%") << "\n";
  }
  return a.check && !all_ok ? kExitFailure : kExitOk;
}

}  // namespace

int benchCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << kBenchUsage;
    return kExitUsage;
  }
  const std::string& sub = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "--help" || sub == "-h") {
    std::cout << kBenchUsage;
    return kExitOk;
  }
  if (sub == "links") return linksCommand(rest);
  if (sub == "allreduce") return collectiveCommand(true, rest);
  if (sub == "allgather") return collectiveCommand(false, rest);
  std::cerr << "terse bench: '" << sub << "' is not a benchmark\n\n" << kBenchUsage;
  return kExitUsage;
}

}  // namespace terse::cli

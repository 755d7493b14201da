// `terse bench allreduce|allgather`: size, count, type, algo, time, algbw, busbw and #wrong per message size in
// nccl-tests' format (docs/STYLE.md 10), over the host transports; --transport nccl goes to nccl_collective.cc.
//
// With --transport inproc every rank is a thread of this process. With --transport tcp the ranks talk over real
// sockets (core/comm/tcp/transport.h): under `terse launch` (or any launcher job.h detects) each process is one rank
// and rank 0 prints the table; otherwise -n N runs N ranks as threads of this process, each with its own TcpTransport
// over loopback, met through an in-process store. Correctness is checked after the timed loop with deterministic data
// whose sum is exact in every dtype and every summation order, so #wrong counts real errors. The tables end with a
// single-thread memcpy bandwidth of the largest size measured in the same run and busbw's ratio to it: an inproc
// collective moves memory, so memcpy is its natural ceiling on this machine.
#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
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
#include "core/common/json.h"
#include "core/common/runtime.h"
#include "core/sim/network.h"
#include "core/sim/platform.h"
#include "core/sim/simulation.h"
#include "experiments/cli/bench/bench_common.h"
#include "experiments/cli/bench/collective.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "experiments/runner/calibration.h"

namespace terse::cli::bench {
namespace {

using comm::AllreduceAlgorithm;
using comm::HostCommOptions;
using comm::HostCommunicator;
using comm::InprocFabric;

constexpr std::string_view kCollectiveUsage =
    "usage: terse bench allreduce|allgather [-n RANKS] [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR] [--dtype T]\n"
    "                                       [--algo ring|rd|hd|tree|reduce_broadcast|hierarchical|auto] "
    "[--ranks-per-node G]\n"
    "                                       (allgather: [--algo ring|bruck|hierarchical|auto])\n"
    "                                       [--transport inproc|tcp|nccl] [--bandwidth BW] [--latency T]\n"
    "                                       [--nic BW] [--nic-ingress BW]\n"
    "                                       [--threshold BYTES|table] [--segment BYTES|auto]\n"
    "                                       [--socket-buffer BYTES] [--busy-poll US|env] (tcp)\n"
    "                                       [--clock real|simulated] [--compute none|calibrated|measured|flops]\n"
    "                                       [--calibration FILE [--allow-foreign-calibration]] [--topology SPEC]\n"
    "                                       [--iters N] [-w WARMUP]\n"
    "                                       [--json] [--check]\n"
    "\n"
    "Sizes are total message bytes (allgather: the gathered output, size/n per rank), K/M/G binary. RANKS is N, A..B\n"
    "or a comma list. The timed iterations run in 5 batches between barriers; time is the slowest rank's average per\n"
    "operation in the median batch (robust to load elsewhere on the machine). algbw = size / time, busbw = algbw *\n"
    "2(n-1)/n (allreduce) or (n-1)/n (allgather). Data is checked after the timed loop (#wrong: elements that "
    "differ).\n"
    "memcpy: one thread copying the largest size, sampled between that row's timed batches (median).\n"
    "--transport nccl: one process per GPU (alone, or N under 'terse launch -n N'), device buffers, NCCL's own\n"
    "algorithms (algo 'nccl'); the baseline is a device-to-device copy of the largest size.\n";

// The command line, validated.
struct CollectiveOptions {
  CommonArgs a;
  DType dtype = DType::kF32;
  HostCommOptions comm_options;
  uint64_t socket_buffer = 0;
  int busy_poll_us = -1;       // --busy-poll: TcpOptions::busy_poll_us (-1: TERSE_TCP_BUSY_POLL_US, else off)
  int busy_poll_resolved = 0;  // tcp: what the transports use (resolveBusyPollUs; tables and JSON say it)
  bool caller_reads = false;   // tcp: whether callers read their connections (resolveCallerReads; likewise)
  int caller_spin_us = 0;      // tcp: a reading caller's spin budget (resolveCallerSpinUs; likewise)
  int inproc_spin_us = 0;      // inproc: a waiting rank's spin budget (resolveInprocSpinUs; likewise)
  bool ranks_given = false;    // -n was on the command line
  bool simulated = false;      // --clock simulated: the inproc ranks as actors of a SimGrid simulation of the links
  sim::ComputeModel compute = sim::ComputeModel::kMeasured;  // --compute: what the simulated clock charges as work
  std::optional<std::string> calibration;                    // --calibration: a table to replay (--compute calibrated)
  bool allow_foreign_calibration = false;  // --allow-foreign-calibration: replay it though another CPU or commit's
  std::shared_ptr<const runner::CalibrationOutcome> calibrated;  // --compute calibrated: the table used (calibrateSums)
  sim::TwoLevelTopology topology;  // --topology: the simulated cluster's two levels instead of per-pair links
};

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

// The ranks of one world size that live in this process: all of them as threads, or this process's rank of a job.
struct World {
  int n = 0;
  const comm::Job* job = nullptr;  // null: every rank is a thread here
  // comms[r] is rank r's communicator where it lives in this process (all of them, or this process's rank).
  std::vector<std::unique_ptr<HostCommunicator>> comms;
  HostCommunicator& any() const { return job ? *comms[static_cast<std::size_t>(job->env.rank)] : *comms[0]; }
};

// One message size of the sweep, as every rank sees it.
struct SizeStep {
  bool allreduce = true;
  DType dtype = DType::kF32;
  std::size_t elem = 0;
  int n = 0;
  uint64_t size = 0;
  std::size_t count = 0;     // elements of size
  std::size_t per_rank = 0;  // count / n: an allgather rank's block
  int warmup = 0;
  Batches batches;
  std::vector<uint64_t> sizes;  // allgatherv's per-rank bytes
};

// Every rank's measurements of one size: elapsed[rank][batch] and wrong[rank].
struct RankTimes {
  std::vector<std::vector<double>> elapsed;
  std::vector<uint64_t> wrong;
};

// Everything the output needs: the rows per world size, and the largest row's busbw beside memcpy of its size.
struct SweepResult {
  std::vector<CollectiveRun> runs;
  uint64_t total_wrong = 0;
  double last_busbw_at_max = 0;
  double memcpy_gbps = 0;
  uint64_t largest = 0;
};

// Parses and validates the options; nullopt when the command is done (help printed, or a usage error reported) with
// its exit status in `exit_code`.
std::optional<CollectiveOptions> parseCollectiveOptions(const std::string& who, const std::vector<std::string>& args,
                                                        int& exit_code) {
  po::options_description options("options");
  addCommonOptions(options);
  options.add_options()("dtype", po::value<std::string>()->default_value("f32"), "f32, f16 or bf16")(
      "algo", po::value<std::string>()->default_value("auto"),
      "allreduce algorithm: ring, rd, hd (halving-doubling), tree, reduce_broadcast, hierarchical or auto (the "
      "measured table of core/comm/allreduce_auto.h, or --threshold's rule); allgather algorithm: ring, bruck, "
      "hierarchical or auto (core/comm/allgather_auto.h)")(
      "ranks-per-node", po::value<int>(),
      "workers per node of the hierarchical allreduce and allgather (default: --topology's, else 1)")(
      "topology", po::value<std::string>(),
      "--clock simulated: a two-level cluster instead of per-pair links, a preset (8xA100-4x200G, 8xH100-8x400G, "
      "4xV100-1x100G) and/or workers=,intra=,intra_latency=,nic=,nics=,nic_latency=,oversubscription=, "
      "nodes_per_rack= (a leaf/spine fat-tree whose leaf uplinks carry the rack's NICs / oversubscription)")(
      "threshold", po::value<std::string>()->default_value("table"),
      "auto: recursive doubling below this size and the ring above, or table: the measured table")(
      "segment", po::value<std::string>()->default_value("auto"),
      "maximum frame payload; auto: 256K inproc (a frame's copy stays in L2), 1M tcp (fewer frames, wake-ups and "
      "syscalls per byte)")("socket-buffer", po::value<std::string>()->default_value("0"),
                            "tcp: SO_SNDBUF/SO_RCVBUF per connection, e.g. 4M (0: the OS default, autotuned)")(
      "busy-poll", po::value<std::string>()->default_value("env"),
      "tcp: microseconds a waiting rank (and its io thread) spins before sleeping, 0 = off; env: "
      "TERSE_TCP_BUSY_POLL_US, else off (core/comm/tcp/transport.h)")(
      "clock", po::value<std::string>()->default_value("real"),
      "real, or simulated: --transport inproc on a SimGrid simulation of the links (--bandwidth, --latency, --nic, "
      "--nic-ingress); times are simulated seconds, the summation is charged as --compute says (DESIGN.md section 9)")(
      "compute", po::value<std::string>(),
      "--clock simulated: what counts as computation, none (simulated time is the network's alone: the alpha-beta "
      "model's), calibrated (the sums' times on this CPU, from the calibration cache or measured first: "
      "experiments/runner/calibration.h), measured (each rank's thread CPU time, the default) or flops (FLOP counts "
      "at 1e11 flop/s: only what the kernels declare through rt::work)")(
      "calibration", po::value<std::string>(),
      "--compute calibrated: replay this calibration table (a run's calibration.json, or a cache file) instead of the "
      "cache; one from another CPU or commit is refused")(
      "allow-foreign-calibration", po::bool_switch(),
      "--calibration: replay a table from another CPU or commit anyway (the JSON and the header say so)");
  auto vm = parse(args, options, kCollectiveUsage, who, exit_code);
  if (!vm) return std::nullopt;

  CollectiveOptions o;
  CommonArgs& a = o.a;
  try {
    a = commonArgs(*vm, 4096, 64ull << 20, 2, 20);
    const auto d = parseDType((*vm)["dtype"].as<std::string>());
    if (!d || (*d != DType::kF32 && *d != DType::kF16 && *d != DType::kBF16))
      throw po::error("--dtype must be f32, f16 or bf16, got '" + (*vm)["dtype"].as<std::string>() + "'");
    o.dtype = *d;
    // --algo names the allreduce's algorithm for `bench allreduce`, the allgatherv's for `bench allgather`.
    const std::string algo_name = (*vm)["algo"].as<std::string>();
    const bool allreduce = who == "allreduce";
    const auto reduce = comm::parseAllreduceAlgorithm(algo_name);
    const auto gather = comm::parseAllgatherAlgorithm(algo_name);
    if (allreduce ? !reduce : !gather)
      throw po::error("--algo must be " +
                      std::string(allreduce ? comm::allreduceAlgorithmChoices() : comm::allgatherAlgorithmChoices()) +
                      ", got '" + algo_name + "'");
    if (allreduce) o.comm_options.algorithm = *reduce;
    if (!allreduce) o.comm_options.allgather = *gather;
    if (vm->count("topology")) o.topology = sim::parseTopology((*vm)["topology"].as<std::string>());
    if (vm->count("ranks-per-node")) {
      o.comm_options.ranks_per_node = (*vm)["ranks-per-node"].as<int>();
      if (o.comm_options.ranks_per_node < 1) throw po::error("--ranks-per-node must be >= 1");
    } else if (o.topology.enabled()) {
      o.comm_options.ranks_per_node = o.topology.workers_per_node;
    }
    if (algo_name == "hierarchical" && o.comm_options.ranks_per_node == 1 && !vm->count("ranks-per-node"))
      throw po::error("--algo hierarchical needs --ranks-per-node or --topology to know the nodes");
    const std::string threshold = (*vm)["threshold"].as<std::string>();
    o.comm_options.small_allreduce_bytes = threshold == "table" ? 0 : comm::parseByteSize(threshold);
    const std::string segment = (*vm)["segment"].as<std::string>();
    o.comm_options.segment_bytes =
        segment != "auto" ? comm::parseByteSize(segment) : (a.transport == "tcp" ? 1024 * 1024 : 256 * 1024);
    if (o.comm_options.segment_bytes == 0) throw po::error("--segment must be > 0");
    o.socket_buffer = comm::parseByteSize((*vm)["socket-buffer"].as<std::string>());
    if (o.socket_buffer > (uint64_t{1} << 30)) throw po::error("--socket-buffer must be at most 1G");
    const std::string busy = (*vm)["busy-poll"].as<std::string>();
    if (busy != "env") {
      int v = -1;
      const auto [ptr, ec] = std::from_chars(busy.data(), busy.data() + busy.size(), v);
      if (busy.empty() || ec != std::errc() || ptr != busy.data() + busy.size() || v < 0 || v > comm::kMaxBusyPollUs)
        throw po::error("--busy-poll must be env or 0.." + std::to_string(comm::kMaxBusyPollUs) +
                        " (microseconds), got '" + busy + "'");
      o.busy_poll_us = v;
    }
    // Resolved here, once: a bad TERSE_TCP_BUSY_POLL_US is a usage error before any rank starts, not a failure in each
    // rank's setup, and the tables say what the transports will use.
    if (a.transport == "tcp") {
      comm::TcpOptions t;
      t.emulation = a.inproc.emulation;
      t.busy_poll_us = o.busy_poll_us;
      o.busy_poll_resolved = comm::resolveBusyPollUs(t, comm::processEnv());
      o.caller_reads = comm::resolveCallerReads(t, comm::processEnv());
      o.caller_spin_us = comm::resolveCallerSpinUs(t, comm::processEnv());
    }
    if (a.transport == "inproc") {
      // A bad TERSE_INPROC_SPIN_US is a usage error here too; simulated time never spins (the fabric gets a network).
      comm::InprocOptions io = a.inproc;
      o.inproc_spin_us = comm::resolveInprocSpinUs(io, comm::processEnv());
    }
    for (int n : a.ranks)
      if (o.dtype == DType::kBF16 && n > 36) throw po::error("--dtype bf16 checks exact sums only up to 36 ranks");
    const std::string clock = (*vm)["clock"].as<std::string>();
    if (clock != "real" && clock != "simulated")
      throw po::error("--clock must be real or simulated, got '" + clock + "'");
    o.simulated = clock == "simulated";
    if (o.simulated) o.inproc_spin_us = 0;
    if (vm->count("compute")) {
      const std::string compute = (*vm)["compute"].as<std::string>();
      const auto model = sim::parseComputeModel(compute);
      if (!model)
        throw po::error("--compute must be " + std::string(sim::computeModelChoices()) + ", got '" + compute + "'");
      // Real time has no model of computation to choose: the ranks' CPUs take what they take.
      if (!o.simulated) throw po::error("--compute chooses the simulated clock's computation; add --clock simulated");
      o.compute = *model;
    }
    if (vm->count("calibration")) {
      if (o.compute != sim::ComputeModel::kCalibrated)
        throw po::error(
            "--calibration replays the table of --compute calibrated; add --clock simulated --compute "
            "calibrated");
      o.calibration = (*vm)["calibration"].as<std::string>();
      if (o.calibration->empty()) throw po::error("--calibration needs a file name");
    }
    o.allow_foreign_calibration = (*vm)["allow-foreign-calibration"].as<bool>();
    if (o.allow_foreign_calibration && !o.calibration)
      throw po::error("--allow-foreign-calibration lets a replayed table through; add --calibration FILE");
    if (o.topology.enabled() && !o.simulated)
      throw po::error("--topology builds the simulated cluster; add --clock simulated");
    if (o.topology.enabled() && a.inproc.emulation.enabled())
      throw po::error("--topology describes the network; leave out --bandwidth, --latency, --nic and --nic-ingress");
    if (o.simulated && a.transport != "inproc")
      throw po::error("--clock simulated simulates the inproc transport's links; --transport " + a.transport +
                      " runs in real time");
  } catch (const po::error& e) {
    std::cerr << "terse bench " << who << ": " << e.what() << "\n\n" << kCollectiveUsage << "\n" << options;
    exit_code = kExitUsage;
    return std::nullopt;
  } catch (const Error& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    exit_code = kExitUsage;
    return std::nullopt;
  }
  o.ranks_given = !(*vm)["ranks"].defaulted();
  return o;
}

// --transport nccl: NCCL's own path where this build has it, else a usage error.
int ncclCommand(bool allreduce, const std::string& who, const CollectiveOptions& o) {
#if defined(TERSE_HAVE_NCCL)
  if (o.a.inproc.emulation.enabled()) {
    std::cerr << "terse bench " << who << ": --transport nccl runs on real links; --bandwidth, --latency and --nic "
              << "emulate links of the inproc and tcp transports only\n";
    return kExitUsage;
  }
  return ncclCollectiveCommand(allreduce, o.a, o.dtype, o.ranks_given);
#else
  (void)allreduce;
  (void)o;
  std::cerr << "terse bench " << who << ": --transport nccl: this build has no NCCL (it needs CUDA and NCCL: "
            << "configure with -DTERSE_CUDA=ON where nvcc and libnccl are installed)\n";
  return kExitUsage;
#endif
}

// The communicators of world size `n`: an inproc fabric's endpoints, or TCP transports (this process's rank of `job`,
// or every rank as a thread over loopback, met through an in-process store).
World connectRanks(int n, const CollectiveOptions& o, const comm::Job* job) {
  World w;
  w.n = n;
  w.job = job;
  w.comms.resize(static_cast<std::size_t>(n));
  comm::MemoryStore local_store;
  if (o.a.transport == "inproc") {
    auto fabric = InprocFabric::create(n, o.a.inproc);
    for (int r = 0; r < n; ++r)
      w.comms[static_cast<std::size_t>(r)] = std::make_unique<HostCommunicator>(fabric->endpoint(r), o.comm_options);
    return w;
  }
  auto connect = [&](int r, comm::Store& store, const comm::JobToken& token, const std::string& host,
                     const std::string& prefix) {
    comm::TcpOptions t;
    t.rank = r;
    t.world_size = n;
    t.emulation = o.a.inproc.emulation;
    t.socket_buffer_bytes = static_cast<int>(o.socket_buffer);
    t.busy_poll_us = o.busy_poll_us;
    t.store_prefix = prefix;
    t.host_label = host;
    // As a run's ranks do (experiments/runner/distributed.cc): the launcher's address for this host when it gives
    // one (scripts/netns-cluster, where host names do not resolve), else every interface for a multi-host job.
    if (job) {
      if (const char* b = std::getenv("TERSE_BIND_ADDR"); b != nullptr && *b != '\0') {
        t.bind_address = b;
      } else if (!comm::isLoopbackAddress(job->env.master_addr)) {
        t.bind_address = "0.0.0.0";
      }
      if (const char* adv = std::getenv("TERSE_ADVERTISE_ADDR"); adv != nullptr) t.advertise_address = adv;
    }
    w.comms[static_cast<std::size_t>(r)] =
        std::make_unique<HostCommunicator>(comm::connectTcpTransport(t, token, store), o.comm_options);
  };
  const std::string prefix = "bench/" + std::to_string(n) + "/";
  if (job) {
    connect(job->env.rank, *job->store, job->token, job->env.host, prefix);
  } else {
    const comm::JobToken token = comm::JobToken::generate();
    onRanks(n, [&](int r) { connect(r, local_store, token, "", prefix); });
  }
  return w;
}

// One rank's part of one size: fill, warm up, the timed batches, then the check on fresh data. `buf` and `send` are
// the rank's buffers, owned by the caller for the whole row.
void timeOnRank(int r, const SizeStep& s, HostCommunicator& c, std::vector<std::byte>& buf,
                std::vector<std::byte>& send, MemcpyProbe* probe, RankTimes& out) {
  buf.assign(s.size, std::byte{0});
  send.assign(s.per_rank * s.elem, std::byte{0});
  auto fill = [&] {
    if (s.allreduce) {
      for (std::size_t i = 0; i < s.count; ++i)
        storeValue(buf.data(), i, s.dtype, static_cast<float>(benchValue(r, i)));
    } else {
      for (std::size_t i = 0; i < s.per_rank; ++i)
        storeValue(send.data(), i, s.dtype, static_cast<float>(benchValue(r, i)));
    }
  };
  auto op = [&] {
    if (s.allreduce) {
      c.allreduce(buf.data(), s.count, s.dtype);
    } else {
      c.allgatherv(send, buf, s.sizes);
    }
  };
  // The timed data grows by a factor n per allreduce (16-bit values saturate to inf): timing does not depend
  // on the values, and correctness is checked on fresh data below.
  fill();
  for (int i = 0; i < s.warmup; ++i) op();
  // The timed iterations run in batches between barriers; the row reports the median batch, so a burst of
  // load from elsewhere on a shared machine shifts one batch rather than the whole row.
  for (int b = 0; b < s.batches.batches; ++b) {
    c.barrier();
    const auto start = rt::now();
    for (int i = 0; i < s.batches.per_batch; ++i) op();
    out.elapsed[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] = rt::seconds(start, rt::now());
    // The other ranks are parked in the next barrier meanwhile, so the copy runs alone.
    if (probe && r == 0)
      for (int k = 0; k < 3; ++k) probe->sample();
  }
  fill();
  op();
  const uint64_t bad = countWrong(buf.data(), s.allreduce, s.count, s.per_rank, s.n, s.dtype);
  out.wrong[static_cast<std::size_t>(r)] = bad;
}

// This process ran one rank: every rank's batch times and #wrong are gathered so the row is computed from all of
// them, exactly as with threads.
void gatherRankTimes(HostCommunicator& c, int me, int n, RankTimes& t) {
  std::vector<double> mine(t.elapsed[static_cast<std::size_t>(me)]);
  mine.push_back(static_cast<double>(t.wrong[static_cast<std::size_t>(me)]));
  std::vector<double> all(mine.size() * static_cast<std::size_t>(n));
  const std::vector<uint64_t> part(static_cast<std::size_t>(n), mine.size() * sizeof(double));
  c.allgatherv(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), part);
  for (int q = 0; q < n; ++q) {
    const auto at = static_cast<std::size_t>(q) * mine.size();
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(at),
              all.begin() + static_cast<std::ptrdiff_t>(at + mine.size() - 1),
              t.elapsed[static_cast<std::size_t>(q)].begin());
    t.wrong[static_cast<std::size_t>(q)] = static_cast<uint64_t>(all[at + mine.size() - 1]);
  }
}

// One row of the table: every rank's part of size `s` (threads here, or this process's rank of a job), then the row
// from all of them.
CollectiveRow measureSize(const SizeStep& s, const World& w, MemcpyProbe* probe) {
  const int n = s.n;
  std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(n));
  std::vector<std::vector<std::byte>> sends(static_cast<std::size_t>(n));
  RankTimes t;
  t.elapsed.assign(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(s.batches.batches)));
  t.wrong.assign(static_cast<std::size_t>(n), 0);
  auto body = [&](int r) {
    timeOnRank(r, s, *w.comms[static_cast<std::size_t>(r)], bufs[static_cast<std::size_t>(r)],
               sends[static_cast<std::size_t>(r)], probe, t);
  };
  if (w.job) {
    const int me = w.job->env.rank;
    body(me);
    gatherRankTimes(w.any(), me, n, t);
  } else {
    onRanks(n, body);
  }
  const uint64_t bytes = s.allreduce ? s.size : s.per_rank * s.elem * static_cast<uint64_t>(n);
  const std::string algo = s.allreduce
                               ? std::string(comm::allreduceAlgorithmName(w.any().algorithmFor(s.size)))
                               : std::string(comm::allgatherAlgorithmName(w.any().allgatherAlgorithmFor(bytes)));
  CollectiveRow row = timedRow(s.allreduce, n, bytes, s.elem, algo, t.elapsed, s.batches);
  for (uint64_t wrong : t.wrong) row.wrong += wrong;
  return row;
}

// The whole sweep: every world size, every message size. `printer`: this process prints (and so samples memcpy).
SweepResult runSweep(bool allreduce, const CollectiveOptions& o, const comm::Job* job, bool printer) {
  const CommonArgs& a = o.a;
  const std::size_t elem = dtypeSize(o.dtype);
  SweepResult result;
  for (int n : a.ranks) {
    CollectiveRun run;
    run.ranks = n;
    const World w = connectRanks(n, o, job);
    // allgather: each rank contributes size / n bytes, whole elements.
    const uint64_t align = allreduce ? elem : elem * static_cast<uint64_t>(n);
    const std::vector<uint64_t> sweep = sizeSweep(a, align);
    for (uint64_t size : sweep) {
      // The largest size is compared with memcpy; its samples interleave with that row's timed batches.
      std::unique_ptr<MemcpyProbe> probe;
      if (size == sweep.back() && printer) probe = std::make_unique<MemcpyProbe>(size);  // sampled by rank 0
      SizeStep s;
      s.allreduce = allreduce;
      s.dtype = o.dtype;
      s.elem = elem;
      s.n = n;
      s.size = size;
      s.count = static_cast<std::size_t>(size / elem);
      s.per_rank = s.count / static_cast<std::size_t>(n);
      s.warmup = a.warmup;
      s.batches = batchesFor(a.iters);
      s.sizes.assign(static_cast<std::size_t>(n), s.per_rank * elem);
      const CollectiveRow row = measureSize(s, w, probe.get());
      result.total_wrong += row.wrong;
      if (row.size >= result.largest) {
        result.largest = row.size;
        result.last_busbw_at_max = row.busbw;
        // Measured right after the row it is compared with, under the same conditions.
        if (probe) result.memcpy_gbps = probe->gbps();
      }
      run.rows.push_back(row);
    }
    result.runs.push_back(std::move(run));
  }
  return result;
}

void printJson(const std::string& who, const CollectiveOptions& o, const SweepResult& r, double ratio) {
  const CommonArgs& a = o.a;
  std::ostringstream j;
  j << "{\"benchmark\":\"" << who << "\",\"transport\":\"" << a.transport << "\",\"dtype\":\"" << dtypeName(o.dtype)
    << "\",\"algo\":\""
    << (who == "allreduce" ? comm::allreduceAlgorithmName(o.comm_options.algorithm)
                           : comm::allgatherAlgorithmName(o.comm_options.allgather))
    << "\",\"threshold_bytes\":" << o.comm_options.small_allreduce_bytes
    << ",\"segment_bytes\":" << o.comm_options.segment_bytes << ",\"iters\":" << a.iters << ",\"warmup\":" << a.warmup
    << ",\"links\":\"" << a.inproc.emulation.describe() << "\",\"clock\":\"" << (o.simulated ? "simulated" : "real")
    << "\",";
  if (o.simulated) j << "\"compute\":\"" << sim::computeModelName(o.compute) << "\",";
  if (o.calibrated) {
    // What was charged, entry by entry: the run can be redone with these times (--calibration).
    const runner::CalibrationOutcome& c = *o.calibrated;
    Json kernels = Json::object();
    for (const auto& [key, seconds] : c.table.seconds) kernels[key] = seconds;
    const Json cal = {{"source", c.source},
                      {"cpu", c.table.identity.cpu},
                      {"flags", c.table.identity.flags},
                      {"commit", c.table.identity.commit},
                      {"foreign", c.foreign},
                      {"measured", c.measured.size()},
                      {"seconds", kernels}};
    j << "\"calibration\":" << dumpJson(cal) << ",";
  }
  if (a.transport == "tcp")
    j << "\"busy_poll_us\":" << o.busy_poll_resolved << ",\"caller_reads\":" << (o.caller_reads ? "true" : "false")
      << ",\"caller_spin_us\":" << (o.caller_reads ? o.caller_spin_us : 0) << ",";
  if (a.transport == "inproc") j << "\"spin_us\":" << o.inproc_spin_us << ",";
  writeRunsJson(j, r.runs, o.dtype);
  j << ",\"memcpy\":{\"bytes\":" << r.largest << ",\"gbps\":" << fixed(r.memcpy_gbps, 3)
    << "},\"busbw_over_memcpy\":" << fixed(ratio, 3) << ",\"wrong\":" << r.total_wrong << "}";
  std::cout << j.str() << '\n';
}

void printTables(bool allreduce, const std::string& who, const CollectiveOptions& o, bool in_job, const SweepResult& r,
                 double ratio) {
  const CommonArgs& a = o.a;
  std::cout << "# terse bench " << who << ": transport " << a.transport
            << (in_job                 ? " (one process per rank)"
                : a.transport == "tcp" ? " (ranks as threads, loopback)"
                : o.simulated          ? " (simulated time: SimGrid, DESIGN.md section 9, compute " +
                                    std::string(sim::computeModelName(o.compute)) + ")"
                              : "")
            << ", dtype " << dtypeName(o.dtype);
  if (allreduce) {
    std::cout << ", algo " << comm::allreduceAlgorithmName(o.comm_options.algorithm);
    if (o.comm_options.algorithm == AllreduceAlgorithm::kAuto && o.comm_options.small_allreduce_bytes != 0)
      std::cout << " (rd below " << o.comm_options.small_allreduce_bytes << " B)";
    else if (o.comm_options.algorithm == AllreduceAlgorithm::kAuto)
      std::cout << " (measured table)";
  } else {
    std::cout << ", algo " << comm::allgatherAlgorithmName(o.comm_options.allgather);
  }
  if (o.comm_options.ranks_per_node > 1) std::cout << ", " << o.comm_options.ranks_per_node << " ranks per node";
  std::cout << ", segment " << o.comm_options.segment_bytes << " B, iters " << a.iters << ", warmup " << a.warmup
            << ", links " << (o.topology.enabled() ? o.topology.describe() : a.inproc.emulation.describe());
  if (a.transport == "tcp") {
    std::cout << ", busy poll ";
    if (o.busy_poll_resolved > 0)
      std::cout << o.busy_poll_resolved << " us";
    else
      std::cout << "off";
    std::cout << ", caller reads ";
    if (!o.caller_reads)
      std::cout << "off";
    else if (o.caller_spin_us > 0)
      std::cout << "on (spin " << o.caller_spin_us << " us)";
    else
      std::cout << "on (no spin)";
  }
  if (a.transport == "inproc") {
    std::cout << ", spin ";
    if (o.inproc_spin_us > 0)
      std::cout << o.inproc_spin_us << " us";
    else
      std::cout << "off";
  }
  std::cout << "\n";
  if (o.calibrated) {
    const runner::CalibrationOutcome& c = *o.calibrated;
    std::cout << "# calibrated sums: " << c.table.seconds.size() << " kernels (" << c.source << ", "
              << c.measured.size() << " measured now) on " << c.table.identity.describe()
              << (c.foreign ? ", FOREIGN: another CPU or commit than this one (--allow-foreign-calibration)" : "")
              << "\n";
  }
  printRunTables(r.runs, o.dtype);
  printWrongSummary(r.total_wrong);
  std::cout << "# memcpy " << r.largest
            << " B (1 thread, sampled between that row's batches): " << fixed(r.memcpy_gbps, 2) << " GB/s\n"
            << "# busbw/memcpy at " << r.largest << " B (ranks " << r.runs.back().ranks << "): " << fixed(ratio, 2)
            << "\n";
}

// --compute calibrated: the sums this sweep charges, `sum <dtype> n<elements>` at the element counts its frames are
// added in (the inproc transport adds a frame a stream piece at a time: inproc_transport.cc copyFrame), for each
// world and message size: the whole message and one rank's share (a ring's or halving-doubling's chunk), each cut to
// a segment and to a piece. A sum of another count is interpolated between these (calibration.h); the sweep's counts
// are measured, not extrapolated.
std::vector<uint64_t> sumCounts(bool allreduce, const CollectiveOptions& o) {
  const uint64_t elem = dtypeSize(o.dtype);
  const uint64_t cap = std::min<uint64_t>(o.comm_options.segment_bytes, sim::kStreamPieceBytes) / elem;
  std::vector<uint64_t> counts;
  for (int n : o.a.ranks) {
    const uint64_t align = allreduce ? elem : elem * static_cast<uint64_t>(n);
    for (uint64_t size : sizeSweep(o.a, align)) {
      const uint64_t count = size / elem;
      const uint64_t share = (count + static_cast<uint64_t>(n) - 1) / static_cast<uint64_t>(n);
      for (uint64_t c : {count, share})
        counts.push_back(std::max<uint64_t>(1, std::min(c, std::max<uint64_t>(cap, 1))));
    }
  }
  return counts;
}

}  // namespace

// How long the real-clock sweep waits before its first row (collectiveCommand).
constexpr auto kLibrarySettle = std::chrono::milliseconds(250);

int collectiveCommand(bool allreduce, const std::vector<std::string>& args) {
  const std::string who = allreduce ? "allreduce" : "allgather";
  int exit_code = kExitOk;
  const std::optional<CollectiveOptions> parsed = parseCollectiveOptions(who, args, exit_code);
  if (!parsed) return exit_code;
  CollectiveOptions o = *parsed;
  if (o.a.transport == "nccl") return ncclCommand(allreduce, who, o);

  // Under a launcher with --transport tcp, this process is one rank of the job; otherwise every rank is a thread here.
  std::optional<comm::Job> job;
  try {
    if (o.a.transport == "tcp") {
      const auto env = comm::detectJobEnv();
      if (env && env->world_size > 1) {
        job.emplace(comm::joinJob(std::chrono::seconds(60)));
        o.a.ranks = {job->env.world_size};
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  const bool printer = !job || job->env.rank == 0;

  SweepResult result;
  try {
    if (o.simulated) {
      // One simulation for the whole sweep: a platform of the largest world, each world of n ranks on hosts 0..n-1.
      sim::SimulationOptions so;
      so.platform.ranks = *std::max_element(o.a.ranks.begin(), o.a.ranks.end());
      so.platform.links = o.a.inproc.emulation;
      so.platform.topology = o.topology;
      so.compute.model = o.compute;
      if (o.compute == sim::ComputeModel::kCalibrated) {
        // Before the simulation, on this thread: the sums are timed alone (calibration.h), as the runner's are.
        runner::SumCalibrationInputs in;
        in.dtype = o.dtype;
        in.sizes = sumCounts(allreduce, o);
        if (o.calibration) in.replay = std::filesystem::path(*o.calibration);
        in.allow_foreign = o.allow_foreign_calibration;
        o.calibrated = std::make_shared<runner::CalibrationOutcome>(runner::calibrateSums(in));
        so.compute.table = o.calibrated->costs;
      }
      const std::string reply = sim::runSimulation(so, [&](const sim::SimulationContext& ctx) {
        CollectiveOptions in_sim = o;
        in_sim.a.inproc.network = ctx.network;
        const SweepResult r = runSweep(allreduce, in_sim, nullptr, true);
        const double ratio = r.last_busbw_at_max / r.memcpy_gbps;
        if (o.a.json)
          printJson(who, o, r, ratio);
        else
          printTables(allreduce, who, o, false, r, ratio);
        return std::to_string(wrongExitCode(o.a, r.total_wrong));
      });
      return std::stoi(reply);
    }
    // OpenBLAS (linked for PowerSGD and the trainers; nothing here calls it) starts its worker threads when the library
    // loads, and they spin-wait with sched_yield for 2^28 TSC cycles, about 0.1 s, before they sleep. On a small
    // machine that takes a CPU from the ranks during the first row (on 2 vCPUs a 4-rank tcp 4 KiB row measured 1.3x
    // slower than the same size run later); sleeping it out keeps the first row comparable with the others.
    std::this_thread::sleep_for(kLibrarySettle);
    result = runSweep(allreduce, o, job ? &*job : nullptr, printer);
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  const double ratio = result.last_busbw_at_max / result.memcpy_gbps;
  if (printer) {
    if (o.a.json)
      printJson(who, o, result, ratio);
    else
      printTables(allreduce, who, o, job.has_value(), result, ratio);
  }
  return wrongExitCode(o.a, result.total_wrong);
}

}  // namespace terse::cli::bench

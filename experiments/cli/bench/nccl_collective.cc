// `terse bench allreduce|allgather --transport nccl` (builds with CUDA and NCCL): every process is one rank on its own
// GPU (nccl_communicator.h) and the buffers are device memory: one process alone, or N under `terse launch -n N`.
// The data and its check are collective.h's, as on the host transports; the baseline is a device-to-device copy of
// the largest size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/job.h"
#include "core/comm/nccl_communicator.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"
#include "experiments/cli/bench/bench_common.h"
#include "experiments/cli/bench/collective.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli::bench {
namespace {

// What every step of one run needs: the communicator and this rank's view of the sweep.
struct NcclRun {
  bool allreduce = true;
  DType dtype = DType::kF32;
  std::size_t elem = 0;
  int n = 0, me = 0;
  bool printer = false;
  cudaStream_t stream = nullptr;
  comm::NcclCommunicator* c = nullptr;
  int warmup = 0;
  Batches batches;
  std::size_t words = 0;  // per rank gathered to rank 0: the batch times, then #wrong
  uint64_t largest = 0;
};

// Sized once for the largest row: buf is the allreduce's data or the allgather's output, send a rank's block,
// copy_dst the baseline copy's target, stats the per-rank batch times and #wrong gathered to rank 0.
struct DeviceBuffers {
  explicit DeviceBuffers(const NcclRun& r)
      : buf(r.largest, r.stream),
        send(r.largest / static_cast<uint64_t>(r.n), r.stream),
        copy_dst(r.largest, r.stream),
        stats(8 * r.words * static_cast<std::size_t>(r.n), r.stream) {}
  cuda::DeviceBuffer buf, send, copy_dst, stats;
};

// The device copy baseline, sampled between the largest row's batches like the host memcpy probe.
class DeviceCopyProbe {
 public:
  void sample(const DeviceBuffers& d, uint64_t size, cudaStream_t stream) {
    for (int k = 0; k < 3; ++k) {
      start_.record(stream);
      TERSE_CUDA_CHECK(cudaMemcpyAsync(d.copy_dst.data(), d.buf.data(), size, cudaMemcpyDeviceToDevice, stream));
      stop_.record(stream);
      stop_.synchronize();
      seconds_.push_back(stop_.millisecondsSince(start_) / 1e3);
    }
  }
  // GB/s of the median sample.
  double gbps(uint64_t bytes) {
    std::sort(seconds_.begin(), seconds_.end());
    return static_cast<double>(bytes) / seconds_[seconds_.size() / 2] / 1e9;
  }

 private:
  cuda::Event start_{cuda::Event::Timing::kEnabled}, stop_{cuda::Event::Timing::kEnabled};
  std::vector<double> seconds_;
};

// Joins the launcher's job when there is one and connects NCCL; a failure is reported and nullptr returned.
std::unique_ptr<comm::NcclCommunicator> connectNccl(const std::string& who, bool ranks_given, const CommonArgs& a,
                                                    std::optional<comm::Job>& job, comm::MemoryStore& local_store) {
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
    return comm::connectNcclCommunicator(o, job ? *job->store : local_store);
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": " << userMessage(e.what()) << '\n';
    return nullptr;
  }
}

// This rank's part of one size: warm up, the timed batches (and the copy baseline on rank 0 at the largest size),
// then the check on fresh data. Returns the batch times followed by #wrong.
std::vector<double> timeSize(const NcclRun& r, const DeviceBuffers& d, DeviceCopyProbe& copy, uint64_t size,
                             std::span<std::byte> out) {
  comm::NcclCommunicator& c = *r.c;
  const std::size_t count = static_cast<std::size_t>(size / r.elem);
  const std::size_t per_rank = count / static_cast<std::size_t>(r.n);
  const std::vector<uint64_t> sizes(static_cast<std::size_t>(r.n), per_rank * r.elem);
  const std::span<const std::byte> block(d.send.as<std::byte>(), per_rank * r.elem);
  std::vector<std::byte> host(r.allreduce ? size : per_rank * r.elem);
  auto fill = [&] {
    for (std::size_t i = 0; i < host.size() / r.elem; ++i)
      storeValue(host.data(), i, r.dtype, static_cast<float>(benchValue(r.me, i)));
    TERSE_CUDA_CHECK(cudaMemcpyAsync(r.allreduce ? d.buf.data() : d.send.data(), host.data(), host.size(),
                                     cudaMemcpyHostToDevice, r.stream));
    TERSE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  };
  auto op = [&] { return r.allreduce ? c.iallreduce(d.buf.data(), count, r.dtype) : c.iallgatherv(block, out, sizes); };
  fill();
  for (int i = 0; i < r.warmup; ++i) op().wait();
  std::vector<double> mine(r.words, 0.0);
  std::vector<comm::CommRequest> reqs;
  for (int b = 0; b < r.batches.batches; ++b) {
    c.barrier();
    // nccl-tests' loop: every operation of the batch queued back to back, then one wait for all of them.
    const auto start = Clock::now();
    reqs.clear();
    for (int i = 0; i < r.batches.per_batch; ++i) reqs.push_back(op());
    for (auto& q : reqs) q.wait();
    mine[static_cast<std::size_t>(b)] = std::chrono::duration<double>(Clock::now() - start).count();
    if (size == r.largest && r.printer) copy.sample(d, size, r.stream);
  }
  fill();
  op().wait();
  std::vector<std::byte> got(out.size());
  TERSE_CUDA_CHECK(cudaMemcpyAsync(got.data(), out.data(), got.size(), cudaMemcpyDeviceToHost, r.stream));
  TERSE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  const uint64_t bad = countWrong(got.data(), r.allreduce, count, per_rank, r.n, r.dtype);
  mine[r.words - 1] = static_cast<double>(bad);
  return mine;
}

// Every rank's batch times and #wrong to every rank (device memory, as NCCL needs), so rank 0 computes the row from
// all of them.
CollectiveRow gatherRow(const NcclRun& r, const DeviceBuffers& d, const std::vector<double>& mine, uint64_t out_bytes) {
  const int n = r.n;
  const std::size_t words = r.words;
  std::vector<double> all(words * static_cast<std::size_t>(n));
  auto* slot = d.stats.as<double>() + static_cast<std::size_t>(r.me) * words;
  TERSE_CUDA_CHECK(cudaMemcpyAsync(slot, mine.data(), 8 * words, cudaMemcpyHostToDevice, r.stream));
  const std::vector<uint64_t> part(static_cast<std::size_t>(n), 8 * words);
  r.c->allgatherv(std::span<const std::byte>(reinterpret_cast<const std::byte*>(slot), 8 * words),
                  std::span<std::byte>(d.stats.as<std::byte>(), d.stats.size()), part);
  TERSE_CUDA_CHECK(cudaMemcpyAsync(all.data(), d.stats.data(), d.stats.size(), cudaMemcpyDeviceToHost, r.stream));
  TERSE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  const int batches = r.batches.batches;
  std::vector<std::vector<double>> elapsed(static_cast<std::size_t>(n));
  uint64_t wrong = 0;
  for (int q = 0; q < n; ++q) {
    const auto at = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(q) * words);
    elapsed[static_cast<std::size_t>(q)].assign(at, at + batches);
    wrong += static_cast<uint64_t>(at[batches]);
  }
  CollectiveRow row = timedRow(r.allreduce, n, out_bytes, r.elem, "nccl", elapsed, r.batches);
  row.wrong = wrong;
  return row;
}

void printJson(const std::string& who, const CommonArgs& a, DType dtype, const cuda::DeviceSummary& dev,
               const CollectiveRun& run, uint64_t largest, double copy_gbps, double ratio, uint64_t total_wrong) {
  std::ostringstream j;
  j << "{\"benchmark\":\"" << who << "\",\"transport\":\"nccl\",\"dtype\":\"" << dtypeName(dtype) << "\",\"device\":\""
    << dev.first_name << "\",\"iters\":" << a.iters << ",\"warmup\":" << a.warmup << ",";
  writeRunsJson(j, {run}, dtype);
  j << ",\"device_copy\":{\"bytes\":" << largest << ",\"gbps\":" << fixed(copy_gbps, 3)
    << "},\"bw_over_device_copy\":" << fixed(ratio, 3) << ",\"wrong\":" << total_wrong << "}";
  std::cout << j.str() << '\n';
}

void printTables(const std::string& who, const CommonArgs& a, DType dtype, const cuda::DeviceSummary& dev, bool in_job,
                 const CollectiveRun& run, uint64_t largest, double copy_gbps, double ratio, uint64_t total_wrong) {
  const int n = run.ranks;
  std::cout << "# terse bench " << who << ": transport nccl (one process per GPU" << (in_job ? ", terse launch" : "")
            << "), device " << dev.first_name << ", dtype " << dtypeName(dtype) << ", iters " << a.iters << ", warmup "
            << a.warmup << "\n";
  printRunTables({run}, dtype);
  printWrongSummary(total_wrong);
  std::cout << "# device copy " << largest << " B (cudaMemcpyAsync device to device, sampled between that row's "
            << "batches): " << fixed(copy_gbps, 2) << " GB/s\n"
            << "# " << (n > 1 ? "busbw" : "algbw") << "/device copy at " << largest << " B (ranks " << n
            << "): " << fixed(ratio, 2) << "\n";
}

}  // namespace

int ncclCollectiveCommand(bool allreduce, const CommonArgs& a, DType dtype, bool ranks_given) {
  const std::string who = allreduce ? "allreduce" : "allgather";
  std::optional<comm::Job> job;
  comm::MemoryStore local_store;
  const std::unique_ptr<comm::NcclCommunicator> c = connectNccl(who, ranks_given, a, job, local_store);
  if (!c) return kExitFailure;

  NcclRun r;
  r.allreduce = allreduce;
  r.dtype = dtype;
  r.elem = dtypeSize(dtype);
  r.n = c->size();
  r.me = c->rank();
  r.printer = r.me == 0;
  r.stream = static_cast<cudaStream_t>(c->stream());
  r.c = c.get();
  r.warmup = a.warmup;
  r.batches = batchesFor(a.iters);
  r.words = static_cast<std::size_t>(r.batches.batches) + 1;
  const std::vector<uint64_t> sweep = sizeSweep(a, allreduce ? r.elem : r.elem * static_cast<uint64_t>(r.n));
  r.largest = sweep.back();

  CollectiveRun run;
  run.ranks = r.n;
  uint64_t total_wrong = 0;
  double copy_gbps = 0;
  try {
    const DeviceBuffers d(r);
    DeviceCopyProbe copy;
    for (uint64_t size : sweep) {
      const std::size_t per_rank = static_cast<std::size_t>(size / r.elem) / static_cast<std::size_t>(r.n);
      const std::span<std::byte> out(d.buf.as<std::byte>(),
                                     allreduce ? size : per_rank * r.elem * static_cast<std::size_t>(r.n));
      const std::vector<double> mine = timeSize(r, d, copy, size, out);
      const CollectiveRow row = gatherRow(r, d, mine, out.size());
      total_wrong += row.wrong;
      run.rows.push_back(row);
    }
    if (r.printer) copy_gbps = copy.gbps(r.largest);
  } catch (const std::exception& e) {
    std::cerr << "terse bench " << who << ": rank " << r.me << ": " << userMessage(e.what()) << '\n';
    c->abort(std::string("bench failed on rank ") + std::to_string(r.me));
    return kExitFailure;
  }
  if (!r.printer) return wrongExitCode(a, total_wrong);
  const CollectiveRow& last = run.rows.back();
  // At world size 1 busbw is 0 by definition (nothing crosses a link); the ratio then compares algbw, the rate at
  // which the collective turns its input into its output, with the copy.
  const double rate = r.n > 1 ? last.busbw : last.algbw;
  const double ratio = rate / copy_gbps;
  const cuda::DeviceSummary dev = cuda::deviceSummary();
  if (a.json)
    printJson(who, a, dtype, dev, run, r.largest, copy_gbps, ratio, total_wrong);
  else
    printTables(who, a, dtype, dev, job.has_value(), run, r.largest, copy_gbps, ratio, total_wrong);
  return wrongExitCode(a, total_wrong);
}

}  // namespace terse::cli::bench

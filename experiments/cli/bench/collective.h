// What `terse bench allreduce|allgather` shares between its host transports (collective_command.cc) and NCCL
// (nccl_collective.cc): the deterministic data and its check, the row computed from every rank's batch times, and
// nccl-tests' table and the JSON rows (docs/STYLE.md 10).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/common/dtype.h"
#include "experiments/cli/bench/bench_common.h"

namespace terse::cli::bench {

// Element i of rank r: an integer in [-7, 7], so any sum over up to 64 ranks (|sum| <= 448 < 2^8 needs care for bf16:
// bf16 holds integers exactly up to 256, i.e. 36 ranks) is exact in f32 and f16 and in bf16 up to 36 ranks, in any
// summation order: #wrong counts real errors, never rounding.
int benchValue(int r, std::size_t i);

// Element i of a buffer of `dtype` (f32, f16 or bf16) as a float, and back.
void storeValue(std::byte* p, std::size_t i, DType dtype, float v);
float loadValue(const std::byte* p, std::size_t i, DType dtype);

// #wrong of one check: an allreduce's `count` elements against the sum of every rank's benchValue, or an allgather's
// n blocks of per_rank elements against each rank's own values.
uint64_t countWrong(const std::byte* got, bool allreduce, std::size_t count, std::size_t per_rank, int n, DType dtype);

struct CollectiveRow {
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
  std::vector<CollectiveRow> rows;
};

// The timed iterations run in `batches` batches of `per_batch` operations between barriers: min(iters, 5) batches.
struct Batches {
  int batches = 0;
  int per_batch = 0;
};
Batches batchesFor(int iters);

// A row of `size` bytes (the allreduce's data or the allgather's output) from every rank's batch times,
// elapsed[rank][batch]: the time is the slowest rank's per operation in the median batch, algbw = size / time and
// busbw = algbw * 2(n-1)/n (allreduce) or (n-1)/n (allgather), nccl-tests' bus bandwidth. #wrong is the caller's.
CollectiveRow timedRow(bool allreduce, int n, uint64_t size, std::size_t elem, std::string algo,
                       const std::vector<std::vector<double>>& elapsed, const Batches& b);

// nccl-tests' columns, one table per world size.
void printRunTables(const std::vector<CollectiveRun>& runs, DType dtype);

// `"runs":[{"ranks":N,"rows":[...]},...]` of the --json output.
void writeRunsJson(std::ostream& j, const std::vector<CollectiveRun>& runs, DType dtype);

// nccl-tests' closing line about the check.
void printWrongSummary(uint64_t total_wrong);

// The exit status: a failure when --check is on and any element was wrong.
int wrongExitCode(const CommonArgs& a, uint64_t total_wrong);

#if defined(TERSE_HAVE_NCCL)
// --transport nccl (nccl_collective.cc): one process per GPU, device buffers, NCCL's algorithms. `ranks_given`: -n
// was on the command line (it must then be 1: the ranks are processes started by terse launch).
int ncclCollectiveCommand(bool allreduce, const CommonArgs& a, DType dtype, bool ranks_given);
#endif

}  // namespace terse::cli::bench

// The data, check, rows and output that both paths of `terse bench allreduce|allgather` share (collective.h).
#include "experiments/cli/bench/collective.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "terse/sdk/half.hpp"

namespace terse::cli::bench {

namespace {

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

}  // namespace

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

uint64_t countWrong(const std::byte* got, bool allreduce, std::size_t count, std::size_t per_rank, int n, DType dtype) {
  uint64_t bad = 0;
  if (allreduce) {
    // benchValue(q, i) depends on i only through i mod 15, so the expected sums are 15 numbers: summing the n ranks'
    // values per element made the check O(count x n) per rank, O(n^2) in all, 80% of a simulated bench at 256 ranks.
    constexpr std::size_t kPeriod = 15;
    std::array<int, kPeriod> want{};
    for (std::size_t i = 0; i < kPeriod; ++i)
      for (int q = 0; q < n; ++q) want[i] += benchValue(q, i);
    for (std::size_t i = 0; i < count; ++i)
      if (loadValue(got, i, dtype) != static_cast<float>(want[i % kPeriod])) ++bad;
  } else {
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < per_rank; ++i)
        if (loadValue(got, static_cast<std::size_t>(q) * per_rank + i, dtype) != static_cast<float>(benchValue(q, i)))
          ++bad;
  }
  return bad;
}

Batches batchesFor(int iters) {
  Batches b;
  b.batches = std::min(iters, 5);
  b.per_batch = std::max(1, iters / b.batches);
  return b;
}

CollectiveRow timedRow(bool allreduce, int n, uint64_t size, std::size_t elem, std::string algo,
                       const std::vector<std::vector<double>>& elapsed, const Batches& b) {
  CollectiveRow row;
  row.size = size;
  row.count = row.size / elem;
  row.algo = std::move(algo);
  const double t = medianBatchSeconds(elapsed, b.batches, b.per_batch);
  row.time_us = t * 1e6;
  row.algbw = static_cast<double>(row.size) / t / 1e9;
  const double factor = allreduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  row.busbw = row.algbw * factor;
  return row;
}

void printRunTables(const std::vector<CollectiveRun>& runs, DType dtype) {
  for (const CollectiveRun& run : runs) {
    std::cout << "#\n# ranks " << run.ranks << "\n";
    Table table({"#       size", "count", "type", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"});
    for (const CollectiveRow& r : run.rows) {
      std::ostringstream size;
      size << std::setw(13) << r.size;
      table.add({size.str(), std::to_string(r.count), std::string(dtypeName(dtype)), r.algo, fixed(r.time_us, 2),
                 fixed(r.algbw, 3), fixed(r.busbw, 3), std::to_string(r.wrong)});
    }
    table.print(std::cout);
  }
}

void writeRunsJson(std::ostream& j, const std::vector<CollectiveRun>& runs, DType dtype) {
  j << "\"runs\":[";
  for (std::size_t k = 0; k < runs.size(); ++k) {
    j << (k ? "," : "") << "{\"ranks\":" << runs[k].ranks << ",\"rows\":[";
    for (std::size_t i = 0; i < runs[k].rows.size(); ++i) {
      const CollectiveRow& r = runs[k].rows[i];
      j << (i ? "," : "") << "{\"size\":" << r.size << ",\"count\":" << r.count << ",\"type\":\"" << dtypeName(dtype)
        << "\",\"algo\":\"" << r.algo << "\",\"time_us\":" << fixed(r.time_us, 2)
        << ",\"algbw_gbps\":" << fixed(r.algbw, 3) << ",\"busbw_gbps\":" << fixed(r.busbw, 3)
        << ",\"wrong\":" << r.wrong << "}";
    }
    j << "]}";
  }
  j << "]";
}

void printWrongSummary(uint64_t total_wrong) {
  std::cout << "# Out of bounds values : " << total_wrong << (total_wrong == 0 ? " OK" : " FAILED") << "\n";
}

int wrongExitCode(const CommonArgs& a, uint64_t total_wrong) {
  return a.check && total_wrong != 0 ? kExitFailure : kExitOk;
}

}  // namespace terse::cli::bench

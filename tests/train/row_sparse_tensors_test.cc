// RowSparseTensors (core/train/row_sparse_tensors.h): which tensors it takes, its refusal of a row-sparse tensor on a
// device, the average over 3 ranks (one touching no row) with the union of their rows and the payload bytes summed
// over runs, and the step-trace group of one run (its phases at 3 ranks, none at 1).
#include "core/train/row_sparse_tensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "tests/comm/comm_test_util.h"

namespace terse::train {
namespace {

ParamTensor tensor(const std::string& name, int64_t rows, int64_t cols, bool row_sparse) {
  ParamTensor p;
  p.name = name;
  p.shape = {rows, cols};
  p.value.assign(static_cast<std::size_t>(rows * cols), 0.0f);
  p.grad.assign(p.value.size(), 0.0f);
  p.row_sparse = row_sparse;
  return p;
}

TEST(RowSparseTensors, TakesTheRowSparseTensorsOnlyWhenEnabledAndRefusesThemOnADevice) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  const std::vector<ParamTensor> params = {tensor("dense", 4, 2, false), tensor("embedding", 5, 3, true)};
  const RowSparseTensors on(params, comm, true, false);
  EXPECT_FALSE(on.handles(0));
  EXPECT_TRUE(on.handles(1));
  EXPECT_FALSE(on.handles(2));
  EXPECT_TRUE(on.any());
  const RowSparseTensors off(params, comm, false, false);
  EXPECT_FALSE(off.handles(1));
  EXPECT_FALSE(off.any());
  // Off, a device workload is fine; on, its row-sparse tensor is refused by name.
  EXPECT_NO_THROW(RowSparseTensors(params, comm, false, true));
  try {
    RowSparseTensors(params, comm, true, true);
    FAIL() << "a row-sparse tensor on a device was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'embedding' is row-sparse"), std::string::npos) << e.what();
  }
}

TEST(RowSparseTensors, AveragesTheRowsOfThreeRanksAndTracesTheRun) {
  constexpr int kWorld = 3;
  // Large enough that the rows' payloads together stay under twice the dense tensor (no dense fallback).
  constexpr int64_t kRows = 50, kCols = 8;
  // Rank r touches rows rowsOf[r] with value r + 1 + row; rank 2 touches none.
  const std::vector<std::vector<int64_t>> rowsOf = {{0, 3}, {3, 4}, {}};
  std::vector<std::vector<float>> grads(kWorld);
  std::vector<std::vector<int64_t>> unions(kWorld);
  std::vector<uint64_t> payload(kWorld);
  std::vector<TraceGroup> groups(kWorld);
  comm::testing::World world(kWorld);
  world.runOk([&](int r, comm::HostCommunicator& comm) {
    const auto ri = static_cast<std::size_t>(r);
    std::vector<ParamTensor> params = {tensor("embedding", kRows, kCols, true)};
    RowSparseTensors sparse(params, comm, true, false);
    ParamTensor& p = params[0];
    for (int run = 0; run < 2; ++run) {
      std::fill(p.grad.begin(), p.grad.end(), 0.0f);
      p.grad_rows = rowsOf[ri];
      for (int64_t row : p.grad_rows)
        for (int64_t c = 0; c < kCols; ++c)
          p.grad[static_cast<std::size_t>(row * kCols + c)] = static_cast<float>(r + 1 + row);
      const auto t0 = rt::now();
      const RowSparseResult result = sparse.run(0, p, true);
      std::vector<StepTraceRecorder::Span> spans;
      groups[ri] = sparse.traceGroup(0, p.numel(), 7, result, t0, rt::now(), spans);
      EXPECT_EQ(spans.size(), groups[ri].phases.size());
    }
    grads[ri] = p.grad;
    unions[ri] = sparse.rows();
    payload[ri] = sparse.payloadBytes();
  });
  // Rows 0, 3, 4: (1 + 0) / 3; (1 + 3 + 2 + 3) / 3; (2 + 4) / 3; every other row zero.
  std::vector<float> expect(static_cast<std::size_t>(kRows * kCols), 0.0f);
  for (int64_t c = 0; c < kCols; ++c) {
    expect[static_cast<std::size_t>(0 * kCols + c)] = 1.0f / 3;
    expect[static_cast<std::size_t>(3 * kCols + c)] = 3;
    expect[static_cast<std::size_t>(4 * kCols + c)] = 2;
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(grads[static_cast<std::size_t>(r)], expect) << "rank " << r;
    EXPECT_EQ(unions[static_cast<std::size_t>(r)], (std::vector<int64_t>{0, 3, 4})) << "rank " << r;
    // Two runs of this rank's rows: header, ids and rows each time.
    const auto k = static_cast<uint64_t>(rowsOf[static_cast<std::size_t>(r)].size());
    EXPECT_EQ(payload[static_cast<std::size_t>(r)], 2 * rowSparsePayloadBytes(k, kCols)) << "rank " << r;
    const TraceGroup& g = groups[static_cast<std::size_t>(r)];
    EXPECT_EQ(g.seq, 7u);
    ASSERT_EQ(g.phases.size(), 4u);
    EXPECT_EQ(g.phases[0].kind, TracePhase::Kind::kCompress);
    EXPECT_EQ(g.phases[1].op, "allgather_sizes");
    EXPECT_EQ(g.phases[2].op, "allgatherv");
    EXPECT_EQ(g.phases[2].bytes, rowSparsePayloadBytes(k, kCols));
    EXPECT_EQ(g.phases[2].rank_bytes.size(), static_cast<std::size_t>(kWorld));
    EXPECT_EQ(g.phases[3].kind, TracePhase::Kind::kDecompress);
  }
}

TEST(RowSparseTensors, OneRankRunsNothingAndTracesAGroupWithoutPhases) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  std::vector<ParamTensor> params = {tensor("embedding", 3, 2, true)};
  RowSparseTensors sparse(params, comm, true, false);
  params[0].grad = {1, 2, 0, 0, 5, 6};
  params[0].grad_rows = {0, 2};
  const RowSparseResult result = sparse.run(0, params[0], true);
  EXPECT_EQ(params[0].grad, (std::vector<float>{1, 2, 0, 0, 5, 6}));
  std::vector<StepTraceRecorder::Span> spans;
  const TraceGroup g = sparse.traceGroup(0, 6, 1, result, rt::now(), rt::now(), spans);
  EXPECT_TRUE(g.phases.empty());
  EXPECT_TRUE(spans.empty());
  ASSERT_EQ(g.chunks.size(), 1u);
  EXPECT_EQ(g.chunk_elements, (std::vector<uint64_t>{6}));
}

}  // namespace
}  // namespace terse::train

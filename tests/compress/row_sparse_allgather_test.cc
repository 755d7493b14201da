// RowSparseAllgather (core/compress/row_sparse_allgather.h) over 1, 2, 3 and 5 in-process ranks: row sets with
// repeats, empty sets and every row, against the average computed locally; the wire bytes against the ring
// algorithms' formulas and the transport's own count; the dense fallback; and a malformed peer payload.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "core/compress/row_sparse_allgather.h"
#include "tests/comm/comm_test_util.h"

namespace terse {
namespace {

using comm::testing::World;

constexpr uint64_t kRows = 37;  // odd, and not a multiple of any world size tested
constexpr uint64_t kLen = 3;
constexpr uint64_t kTensor = 5;
constexpr uint64_t kFrameHeader = 32;  // allgatherv_ring.h: bytes + 32 per frame

// Rank r's rows: a rule per case, with repeats in the middle of the list.
std::vector<int64_t> rowsOf(int rank, int world, int pattern) {
  std::vector<int64_t> rows;
  if (pattern == 0) {  // a few scattered rows, some shared between ranks, each listed twice
    for (int64_t k = 0; k < 4; ++k) {
      const auto r = static_cast<int64_t>((static_cast<uint64_t>(rank) * 7 + static_cast<uint64_t>(k) * 5) % kRows);
      rows.push_back(r);
      rows.push_back(r);
    }
  } else if (pattern == 1) {  // odd ranks send nothing
    if (rank % 2 == 0) rows = {static_cast<int64_t>(kRows - 1), 0, static_cast<int64_t>(rank)};
  } else {  // rank 0 every row, in descending order; the others one row
    if (rank == 0) {
      for (int64_t r = kRows - 1; r >= 0; --r) rows.push_back(r);
    } else {
      rows.push_back(world);
    }
  }
  return rows;
}

std::vector<float> gradOf(int rank, const std::vector<int64_t>& rows) {
  std::vector<float> g(kRows * kLen, 0.0f);
  for (int64_t r : rows)
    for (uint64_t c = 0; c < kLen; ++c)
      g[static_cast<uint64_t>(r) * kLen + c] =
          static_cast<float>(rank + 1) + 0.25f * static_cast<float>(c) + 0.01f * static_cast<float>(r);
  return g;
}

struct Case {
  int world;
  int pattern;
};

class RowSparse : public ::testing::TestWithParam<Case> {};

TEST_P(RowSparse, AveragesTheRanksRowsAndCountsItsBytes) {
  const auto [n, pattern] = GetParam();
  // The expected average and union, computed locally (sums in rank order, as the collective does).
  std::vector<float> expected(kRows * kLen, 0.0f);
  std::set<int64_t> expected_union;
  std::vector<uint64_t> sizes;
  for (int r = 0; r < n; ++r) {
    const auto rows = rowsOf(r, n, pattern);
    const auto g = gradOf(r, rows);
    for (std::size_t i = 0; i < g.size(); ++i) expected[i] += g[i];
    const std::set<int64_t> distinct(rows.begin(), rows.end());
    expected_union.insert(distinct.begin(), distinct.end());
    sizes.push_back(rowSparsePayloadBytes(distinct.size(), kLen));
  }
  for (float& v : expected) v *= 1.0f / static_cast<float>(n);

  World world(n, comm::testing::ringAllgather());  // the counts below are the ring's
  world.runOk([&](int r, comm::HostCommunicator& comm) {
    RowSparseAllgather agg(comm, kRows, kLen, kTensor);
    const auto rows = rowsOf(r, n, pattern);
    auto grad = gradOf(r, rows);
    std::vector<int64_t> union_rows;
    const comm::RankTraffic before = comm.traffic();
    const RowSparseResult res = agg.run(grad.data(), rows, union_rows);
    const comm::RankTraffic after = comm.traffic();
    EXPECT_TRUE(res.sparse);
    for (std::size_t i = 0; i < grad.size(); ++i) ASSERT_EQ(grad[i], expected[i]) << "rank " << r << " element " << i;
    if (n == 1) {
      EXPECT_EQ(res.wire.sent_bytes, 0u);
      return;
    }
    EXPECT_EQ(std::vector<int64_t>(expected_union.begin(), expected_union.end()), union_rows);
    EXPECT_EQ(res.payload_bytes, sizes[static_cast<std::size_t>(r)]);
    // The size exchange: n - 1 frames of one 8-byte word; the allgatherv: every block but block r + 1 forwarded.
    uint64_t want = (static_cast<uint64_t>(n) - 1) * (8 + kFrameHeader);
    for (int b = 0; b < n; ++b)
      if (b != (r + 1) % n) want += sizes[static_cast<std::size_t>(b)] + kFrameHeader;
    EXPECT_EQ(res.wire.sent_bytes, want) << "rank " << r;
    EXPECT_EQ(after.sent.tensor(kTensor).bytes - before.sent.tensor(kTensor).bytes, want) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, RowSparse,
                         ::testing::Values(Case{1, 0}, Case{2, 0}, Case{3, 0}, Case{5, 0}, Case{3, 1}, Case{5, 1},
                                           Case{2, 2}, Case{3, 2}),
                         [](const auto& param_info) {
                           return "n" + std::to_string(param_info.param.world) + "_pattern" +
                                  std::to_string(param_info.param.pattern);
                         });

// Every rank touching every row: the payloads outweigh twice the dense tensor, so every rank takes the allreduce.
TEST(RowSparseFallback, AllRowsEverywhereGoesDense) {
  constexpr int n = 3;
  World world(n);
  world.runOk([&](int r, comm::HostCommunicator& comm) {
    RowSparseAllgather agg(comm, kRows, kLen, kTensor);
    std::vector<int64_t> rows;
    for (uint64_t k = 0; k < kRows; ++k) rows.push_back(static_cast<int64_t>(k));
    auto grad = gradOf(r, rows);
    std::vector<int64_t> union_rows;
    const RowSparseResult res = agg.run(grad.data(), rows, union_rows);
    EXPECT_FALSE(res.sparse);
    EXPECT_EQ(res.payload_bytes, kRows * kLen * 4);
    EXPECT_EQ(union_rows.size(), kRows);
    std::vector<float> expected(kRows * kLen, 0.0f);
    for (int q = 0; q < n; ++q) {
      const auto g = gradOf(q, rows);
      for (std::size_t i = 0; i < g.size(); ++i) expected[i] += g[i];
    }
    for (std::size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], expected[i] / n, 1e-5f);
  });
}

TEST(RowSparseErrors, NamesTheBadRowAndTheBadPeer) {
  World one(1);
  RowSparseAllgather agg(*one.comms[0], kRows, kLen, kTensor);
  std::vector<float> grad(kRows * kLen);
  std::vector<int64_t> u;
  const std::vector<int64_t> bad = {static_cast<int64_t>(kRows)};
  try {
    agg.run(grad.data(), bad, u);
    FAIL() << "a row out of range was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("row 37 is outside [0, 37)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RowSparseAllgather(*one.comms[0], 0, kLen, kTensor), InvalidArgument);

  // Rank 1 gathers a hand-made payload claiming a row beyond the tensor: rank 0's check names rank 1.
  World two(2);
  const comm::testing::SpawnResult res = two.run([&](int r, comm::HostCommunicator& comm) {
    if (r == 0) {
      RowSparseAllgather a(comm, kRows, kLen, kTensor);
      std::vector<float> g(kRows * kLen);
      std::vector<int64_t> rows = {1}, un;
      a.run(g.data(), rows, un);
      return;
    }
    std::vector<uint64_t> sizes(2);
    std::vector<std::byte> send(rowSparsePayloadBytes(1, kLen), std::byte{0});
    const uint32_t header[4] = {0x50535254u, 1, static_cast<uint32_t>(kLen), 0};
    std::memcpy(send.data(), header, sizeof header);
    const uint32_t row = kRows + 4;
    std::memcpy(send.data() + 16, &row, 4);
    comm.allgatherSizes(send.size(), sizes, kTensor);
    std::vector<std::byte> recv(sizes[0] + sizes[1]);
    comm.allgatherv(send, recv, sizes, kTensor);
  });
  ASSERT_TRUE(res.errors[0] != nullptr);
  EXPECT_NE(res.message(0).find("rank 1 sent row 41"), std::string::npos) << res.message(0);
}

}  // namespace
}  // namespace terse

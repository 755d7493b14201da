// Allreduce over the grid n x size x dtype x algorithm, one thread per rank, every rank's result compared bit for bit
// with the sum replayed locally in the algorithm's own order (comm_test_util.h): for f32 and for the 16-bit types,
// whose every pairwise add rounds once, this is the exact expected value rather than a tolerance.
#include <gtest/gtest.h>

#include <tuple>

#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::World;

using GridParam = std::tuple<int, std::size_t, DType, AllreduceAlgorithm>;

class AllreduceGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(AllreduceGrid, EveryRankGetsTheExactSum) {
  const auto [n, count, dtype, algo] = GetParam();
  HostCommOptions options;
  options.algorithm = algo;
  World world(n, options);
  const auto in = testing::makeInputs(n, count, dtype);
  const std::vector<std::byte> want = algo == AllreduceAlgorithm::kRing
                                          ? testing::expectedRing(in, count, dtype)
                                          : testing::expectedRecursiveDoubling(in, count, dtype);
  testing::expectAllreduceGives(world, in, count, dtype, want);
}

std::string gridName(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [n, count, dtype, algo] = info.param;
  return "n" + std::to_string(n) + "_count" + std::to_string(count) + "_" + std::string(dtypeName(dtype)) + "_" +
         std::string(allreduceAlgorithmName(algo));
}

INSTANTIATE_TEST_SUITE_P(Grid, AllreduceGrid,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7},
                                                              std::size_t{1000}, (std::size_t{1} << 20) + 3),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(AllreduceAlgorithm::kRing,
                                                              AllreduceAlgorithm::kRecursiveDoubling)),
                         gridName);

// The 16-bit replay is not vacuous: summing the same bf16 inputs in another association gives other bits somewhere.
TEST(Allreduce, Bf16OrderMattersSoTheReplayIsNeeded) {
  const int n = 5;
  const std::size_t count = 1000;
  const auto in = testing::makeInputs(n, count, DType::kBF16);
  EXPECT_FALSE(testing::sameBytes(testing::expectedRing(in, count, DType::kBF16),
                                  testing::expectedRecursiveDoubling(in, count, DType::kBF16), DType::kBF16));
}

// Auto picks recursive doubling below the threshold and the ring from it on, identically on every rank.
TEST(Allreduce, AutoThreshold) {
  HostCommOptions options;
  options.small_allreduce_bytes = 4096;
  World world(3, options);
  EXPECT_EQ(world.comms[0]->algorithmFor(4095), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(world.comms[0]->algorithmFor(4096), AllreduceAlgorithm::kRing);
  for (std::size_t count : {std::size_t{1023}, std::size_t{1024}, std::size_t{5000}}) {
    std::vector<std::vector<std::byte>> in;
    for (int r = 0; r < 3; ++r) in.push_back(testing::makeInput(r, count, DType::kBF16, count));
    const auto want = count * 2 < 4096 ? testing::expectedRecursiveDoubling(in, count, DType::kBF16)
                                       : testing::expectedRing(in, count, DType::kBF16);
    auto out = in;
    world.runOk(
        [&](int r, HostCommunicator& c) { c.allreduce(out[static_cast<std::size_t>(r)].data(), count, DType::kBF16); });
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(testing::sameBytes(out[static_cast<std::size_t>(r)], want, DType::kBF16));
  }
}

// A SUM payload: the prefix keeps each rank's bytes (never sent), the rest is summed.
TEST(Allreduce, PayloadPrefixIsNotSummed) {
  const int n = 4;
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling}) {
    HostCommOptions options;
    options.algorithm = algo;
    World world(n, options);
    const std::size_t count = 333;
    const std::size_t prefix = 16;
    std::vector<std::vector<std::byte>> in, bufs;
    for (int r = 0; r < n; ++r) in.push_back(testing::makeInput(r, count, DType::kF16, 9));
    const auto want = algo == AllreduceAlgorithm::kRing ? testing::expectedRing(in, count, DType::kF16)
                                                        : testing::expectedRecursiveDoubling(in, count, DType::kF16);
    for (int r = 0; r < n; ++r) {
      const auto& x = in[static_cast<std::size_t>(r)];
      std::vector<std::byte> b(prefix + x.size(), std::byte{0xAB});
      std::copy(x.begin(), x.end(), b.begin() + static_cast<std::ptrdiff_t>(prefix));
      bufs.push_back(std::move(b));
    }
    world.runOk([&](int r, HostCommunicator& c) {
      const WireBytes w = c.allreducePayload(bufs[static_cast<std::size_t>(r)], prefix, DType::kF16, 77);
      EXPECT_GT(w.sent_bytes, 0u);
    });
    for (int r = 0; r < n; ++r) {
      const auto& b = bufs[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < prefix; ++i) EXPECT_EQ(b[i], std::byte{0xAB});
      EXPECT_TRUE(testing::sameBytes(std::vector<std::byte>(b.begin() + prefix, b.end()), want, DType::kF16));
    }
  }
}

TEST(Allreduce, BadArguments) {
  World world(1);
  HostCommunicator& c = *world.comms[0];
  int32_t ints[4] = {};
  EXPECT_THROW(c.allreduce(ints, 4, DType::kI32), Unsupported);
  std::vector<std::byte> payload(18);
  EXPECT_THROW(c.allreducePayload(payload, 16, DType::kF32), InvalidArgument);  // 2 bytes are not an f32
  EXPECT_THROW(c.allreducePayload(payload, 20, DType::kF32), InvalidArgument);  // prefix beyond the payload
  EXPECT_THROW(c.allreduce(nullptr, 3, DType::kF32), InvalidArgument);
}

}  // namespace
}  // namespace terse::comm

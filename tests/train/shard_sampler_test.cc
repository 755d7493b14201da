// ShardSampler: disjoint shards that cover the epoch's permutation, equal sizes for odd counts, a new order every
// epoch, and the same order for the same seed.
#include "core/train/shard_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/common/error.h"

namespace terse::train {
namespace {

TEST(ShardSampler, DisjointShardsCoverAllButTheRemainder) {
  for (int64_t n : {7, 10, 101, 1000}) {
    for (int world : {1, 2, 3, 4, 7}) {
      if (n < world) continue;
      for (int64_t epoch : {0, 1, 5}) {
        std::set<int64_t> seen;
        for (int rank = 0; rank < world; ++rank) {
          ShardSampler s(n, rank, world, 42);
          const std::vector<int64_t> shard = s.epochShard(epoch);
          ASSERT_EQ(static_cast<int64_t>(shard.size()), n / world);
          for (int64_t i : shard) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, n);
            ASSERT_TRUE(seen.insert(i).second)
                << "example " << i << " is in two shards (n=" << n << ", world=" << world << ", epoch=" << epoch << ")";
          }
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n - n % world);
      }
    }
  }
}

TEST(ShardSampler, DroppedRemainderChangesAcrossEpochs) {
  // 10 examples over 3 workers drop one per epoch; over many epochs every example must be seen.
  std::set<int64_t> seen;
  for (int64_t epoch = 0; epoch < 50; ++epoch)
    for (int rank = 0; rank < 3; ++rank)
      for (int64_t i : ShardSampler(10, rank, 3, 7).epochShard(epoch)) seen.insert(i);
  EXPECT_EQ(seen.size(), 10u);
}

TEST(ShardSampler, ReshufflesPerEpochAndIsDeterministic) {
  ShardSampler a(1000, 1, 3, 123), b(1000, 1, 3, 123), other_seed(1000, 1, 3, 124);
  EXPECT_EQ(a.epochShard(0), b.epochShard(0));
  EXPECT_EQ(a.epochShard(3), b.epochShard(3));
  EXPECT_NE(a.epochShard(0), a.epochShard(1));
  EXPECT_NE(a.epochShard(0), other_seed.epochShard(0));
  // Not the identity order either.
  std::vector<int64_t> shard = a.epochShard(0);
  EXPECT_FALSE(std::is_sorted(shard.begin(), shard.end()));
}

TEST(ShardSampler, BatchesFollowTheShardAndLineUpAcrossRanks) {
  for (int rank = 0; rank < 3; ++rank) {
    ShardSampler s(100, rank, 3, 9);  // shard 33
    const auto batches = s.epochBatches(2, 10);
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_EQ(s.batchesPerEpoch(10), 4);
    EXPECT_EQ(batches.back().size(), 3u);
    std::vector<int64_t> flat;
    for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
    EXPECT_EQ(flat, s.epochShard(2));
    const auto dropped = s.epochBatches(2, 10, /*drop_last=*/true);
    ASSERT_EQ(dropped.size(), 3u);
    EXPECT_EQ(s.batchesPerEpoch(10, true), 3);
    for (const auto& b : dropped) EXPECT_EQ(b.size(), 10u);
  }
}

TEST(ShardSampler, RejectsBadArguments) {
  EXPECT_THROW(ShardSampler(10, 0, 0, 1), InvalidArgument);
  EXPECT_THROW(ShardSampler(10, 3, 3, 1), InvalidArgument);
  EXPECT_THROW(ShardSampler(10, -1, 3, 1), InvalidArgument);
  EXPECT_THROW(ShardSampler(2, 0, 3, 1), InvalidArgument);
  EXPECT_THROW(ShardSampler(10, 0, 3, 1).epochBatches(0, 0), InvalidArgument);
  EXPECT_THROW(ShardSampler(10, 0, 3, 1).epochShard(-1), InvalidArgument);
}

}  // namespace
}  // namespace terse::train

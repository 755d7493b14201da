// Non-IID shards (core/train/label_partition.h) and the sampler's fixed-shard mode (core/train/shard_sampler.h):
// equal disjoint shards of odd sizes, one partition per (labels, workers, alpha, seed), skew that follows alpha, tiny
// alphas without underflow, histograms and the distance on hand-made shards, every bad argument refused, and a
// sampler that visits exactly its shard every epoch in a new order.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/train/label_partition.h"
#include "core/train/seeded_rng.h"
#include "core/train/shard_sampler.h"

namespace terse::train::label_partition_test {

// `n` labels over `classes` classes, balanced but in a seeded order.
std::vector<int32_t> labelsOf(int64_t n, int classes, uint64_t seed = 1) {
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(i % classes));
  SeededRng rng(seed);
  for (std::size_t i = labels.size(); i > 1; --i) std::swap(labels[i - 1], labels[rng.below(i)]);
  return labels;
}

TEST(DirichletPartition, EqualDisjointShardsOfOddSizes) {
  const auto labels = labelsOf(1001, 7);
  for (const double alpha : {0.05, 1.0, 50.0}) {
    const auto shards = dirichletPartition(labels, 7, 3, alpha, 9);
    ASSERT_EQ(shards.size(), 3u);
    std::set<int64_t> seen;
    for (const auto& s : shards) {
      EXPECT_EQ(s.size(), 333u) << "alpha " << alpha;
      for (int64_t i : s) {
        EXPECT_TRUE(i >= 0 && i < 1001) << i;
        EXPECT_TRUE(seen.insert(i).second) << "example " << i << " in two shards";
      }
    }
  }
}

TEST(DirichletPartition, OnePartitionPerSeed) {
  const auto labels = labelsOf(600, 10);
  EXPECT_EQ(dirichletPartition(labels, 10, 4, 0.3, 5), dirichletPartition(labels, 10, 4, 0.3, 5));
  EXPECT_NE(dirichletPartition(labels, 10, 4, 0.3, 5), dirichletPartition(labels, 10, 4, 0.3, 6));
}

// Fashion-MNIST's shape: 60,000 examples of 10 classes over 4 workers. A near-IID alpha leaves every worker close to
// the global mix; smaller ones give each worker fewer classes, down to a floor: a worker holds a quarter of the data,
// 2.5 classes' worth, so once its own classes run out it takes what is left (the distance saturates near 0.55).
TEST(DirichletPartition, SkewFollowsAlpha) {
  const auto labels = labelsOf(60000, 10);
  auto distance = [&](double alpha, uint64_t seed) {
    const auto shards = dirichletPartition(labels, 10, 4, alpha, seed);
    return meanLabelDistance(labelHistograms(shards, labels, 10), labels, 10);
  };
  const double skewed = distance(0.1, 1), mixed = distance(1.0, 1), even = distance(1000.0, 1);
  EXPECT_GT(skewed, mixed + 0.1);
  EXPECT_GT(mixed, even + 0.1);
  EXPECT_GT(skewed, 0.5);
  EXPECT_LT(even, 0.05);
  // A tiny alpha underflows Gamma(alpha) in plain arithmetic; in log space it still gives few-class workers.
  EXPECT_GT(distance(0.001, 2), 0.5);
}

TEST(DirichletPartition, HistogramsAndDistanceOnHandMadeShards) {
  const std::vector<int32_t> labels{0, 1, 0, 1, 2, 2};
  const Partition shards{{0, 2}, {1, 4}, {3, 5}};
  const auto h = labelHistograms(shards, labels, 3);
  EXPECT_EQ(h, (std::vector<std::vector<int64_t>>{{2, 0, 0}, {0, 1, 1}, {0, 1, 1}}));
  // The global mix is a third each: TV distances 2/3, 1/3 and 1/3.
  EXPECT_NEAR(meanLabelDistance(h, labels, 3), (2.0 / 3 + 1.0 / 3 + 1.0 / 3) / 3, 1e-12);
}

TEST(DirichletPartition, RefusesBadArguments) {
  const auto labels = labelsOf(100, 4);
  auto refused = [&](auto call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused([&] { dirichletPartition(labels, 4, 0, 1, 1); }, "workers must be >= 1, got 0");
  refused([&] { dirichletPartition(labels, 4, 101, 1, 1); }, "100 examples cannot give each of 101 workers one");
  refused([&] { dirichletPartition(labels, 0, 2, 1, 1); }, "num_classes must be >= 1, got 0");
  refused([&] { dirichletPartition(labels, 4, 2, 0, 1); }, "the Dirichlet alpha must be finite and > 0, got 0");
  refused([&] { dirichletPartition(labels, 3, 2, 1, 1); }, "has label 3, outside [0, 3)");
}

TEST(ShardSamplerPartition, EachEpochVisitsExactlyTheOwnShardInANewOrder) {
  const auto labels = labelsOf(103, 5);
  auto partition = std::make_shared<const Partition>(dirichletPartition(labels, 5, 4, 0.5, 3));
  for (int r = 0; r < 4; ++r) {
    ShardSampler sampler(103, r, 4, 7, partition);
    EXPECT_EQ(sampler.shardSize(), 25);
    std::vector<int64_t> own = (*partition)[static_cast<std::size_t>(r)];
    std::sort(own.begin(), own.end());
    const auto e0 = sampler.epochShard(0);
    const auto e1 = sampler.epochShard(1);
    EXPECT_NE(e0, e1) << "rank " << r << ": the same order two epochs running";
    EXPECT_EQ(e0, ShardSampler(103, r, 4, 7, partition).epochShard(0)) << "rank " << r;
    for (auto visit : {e0, e1}) {
      std::sort(visit.begin(), visit.end());
      EXPECT_EQ(visit, own) << "rank " << r;
    }
    // Batches cut the shard as without a partition: 25 = 3 x 8 + 1.
    EXPECT_EQ(sampler.epochBatches(0, 8).size(), 4u);
  }
}

TEST(ShardSamplerPartition, RefusesAPartitionThatDoesNotFit) {
  auto refused = [](Partition p, const std::string& what) {
    try {
      ShardSampler(10, 0, 2, 1, std::make_shared<const Partition>(std::move(p)));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{0, 1, 2, 3, 4}}, "a partition of 1 shards for 2 workers");
  refused({{0, 1, 2, 3, 4}, {5, 6, 7, 8}}, "shard 1 of the partition has 4 examples, not 5");
  refused({{0, 1, 2, 3, 4}, {5, 6, 7, 8, 10}}, "shard 1 holds example 10, outside [0, 10)");
}

}  // namespace terse::train::label_partition_test

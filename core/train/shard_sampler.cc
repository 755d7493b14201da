#include "core/train/shard_sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"

namespace terse::train {

ShardSampler::ShardSampler(int64_t num_examples, int rank, int world_size, uint64_t seed,
                           std::shared_ptr<const Partition> partition)
    : num_examples_(num_examples), rank_(rank), world_size_(world_size), seed_(seed), partition_(std::move(partition)) {
  TERSE_CHECK(world_size >= 1, InvalidArgument, "ShardSampler: world_size must be >= 1, got " << world_size);
  TERSE_CHECK(rank >= 0 && rank < world_size, InvalidArgument,
              "ShardSampler: rank " << rank << " is outside [0, " << world_size << ")");
  TERSE_CHECK(num_examples >= world_size, InvalidArgument,
              "ShardSampler: " << num_examples << " examples cannot give each of " << world_size
                               << " workers a non-empty shard");
  if (partition_) {
    TERSE_CHECK(partition_->size() == static_cast<std::size_t>(world_size), InvalidArgument,
                "ShardSampler: a partition of " << partition_->size() << " shards for " << world_size << " workers");
    for (std::size_t r = 0; r < partition_->size(); ++r) {
      const auto& shard = (*partition_)[r];
      TERSE_CHECK(
          static_cast<int64_t>(shard.size()) == shardSize(), InvalidArgument,
          "ShardSampler: shard " << r << " of the partition has " << shard.size() << " examples, not " << shardSize());
      for (int64_t i : shard)
        TERSE_CHECK(i >= 0 && i < num_examples, InvalidArgument,
                    "ShardSampler: shard " << r << " holds example " << i << ", outside [0, " << num_examples << ")");
    }
  }
}

int64_t ShardSampler::batchesPerEpoch(int64_t batch_size, bool drop_last) const {
  TERSE_CHECK(batch_size >= 1, InvalidArgument, "ShardSampler: batch_size must be >= 1, got " << batch_size);
  return drop_last ? shardSize() / batch_size : (shardSize() + batch_size - 1) / batch_size;
}

std::vector<int64_t> ShardSampler::epochShard(int64_t epoch) const {
  TERSE_CHECK(epoch >= 0, InvalidArgument, "ShardSampler: epoch must be >= 0, got " << epoch);
  if (partition_) {
    // The rank's own examples in an order of (seed, rank, epoch): the stream's high bits keep ranks apart.
    std::vector<int64_t> own = (*partition_)[static_cast<std::size_t>(rank_)];
    SeededRng rng(seed_, (static_cast<uint64_t>(rank_ + 1) << 40) ^ static_cast<uint64_t>(epoch));
    for (std::size_t i = own.size(); i > 1; --i) std::swap(own[i - 1], own[static_cast<std::size_t>(rng.below(i))]);
    return own;
  }
  // Fisher-Yates over the whole data set, identical on every rank because it depends on (seed, epoch) only.
  std::vector<int64_t> perm(static_cast<std::size_t>(num_examples_));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  SeededRng rng(seed_, static_cast<uint64_t>(epoch));
  for (std::size_t i = perm.size() - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i + 1));
    std::swap(perm[i], perm[j]);
  }
  const int64_t begin = static_cast<int64_t>(rank_) * shardSize();
  return {perm.begin() + begin, perm.begin() + begin + shardSize()};
}

std::vector<std::vector<int64_t>> ShardSampler::epochBatches(int64_t epoch, int64_t batch_size, bool drop_last) const {
  const int64_t count = batchesPerEpoch(batch_size, drop_last);
  const std::vector<int64_t> shard = epochShard(epoch);
  std::vector<std::vector<int64_t>> batches;
  batches.reserve(static_cast<std::size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t begin = b * batch_size;
    const int64_t end = std::min<int64_t>(begin + batch_size, shardSize());
    batches.emplace_back(shard.begin() + begin, shard.begin() + end);
  }
  return batches;
}

}  // namespace terse::train

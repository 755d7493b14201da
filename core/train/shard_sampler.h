// Which training examples a worker sees, and in which order: disjoint shards per worker, reshuffled every epoch,
// reproducible from a seed alone (no communication: every rank computes the same global permutation locally).
//
// Each epoch draws one permutation of all N examples from (seed, epoch); rank r takes positions
// [r * S, (r + 1) * S) of it, where S = floor(N / world_size) is the shard size.
//
// Remainder policy: the N mod world_size examples at the end of the epoch's permutation are dropped for that epoch,
// so every worker has the same shard size and therefore the same number of steps per epoch -- synchronous training
// deadlocks if one rank runs one allreduce more than the others. The dropped examples change with each epoch's
// permutation, so no example is left out for good. Within a shard, batches are consecutive runs of batch_size; the
// last batch of an epoch is shorter when S mod batch_size != 0 (it is the same length on every rank), unless
// drop_last is set.
//
// Fixed shards (a Partition, e.g. label_partition.h's non-IID one): rank r owns the examples partition[r] for the whole
// run, each epoch visiting them in an order drawn from (seed, rank, epoch). Every shard has S = floor(N / world_size)
// examples, so the step counts are those of the default.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace terse::train {

// Each rank's examples, indexed by rank.
using Partition = std::vector<std::vector<int64_t>>;

class ShardSampler {
 public:
  // Throws InvalidArgument when world_size < 1, rank is outside [0, world_size), or num_examples < world_size (a rank
  // would get an empty shard); with a partition, when it has not world_size shards of floor(num_examples /
  // world_size) examples each in [0, num_examples).
  ShardSampler(int64_t num_examples, int rank, int world_size, uint64_t seed,
               std::shared_ptr<const Partition> partition = nullptr);

  int64_t numExamples() const { return num_examples_; }
  int rank() const { return rank_; }
  int worldSize() const { return world_size_; }
  // Examples this rank sees per epoch (the same on every rank).
  int64_t shardSize() const { return num_examples_ / world_size_; }
  // Steps per epoch for this batch size (the same on every rank).
  int64_t batchesPerEpoch(int64_t batch_size, bool drop_last = false) const;

  // This rank's example indices for the epoch, in visiting order.
  std::vector<int64_t> epochShard(int64_t epoch) const;
  // epochShard cut into batches (see the remainder policy above).
  std::vector<std::vector<int64_t>> epochBatches(int64_t epoch, int64_t batch_size, bool drop_last = false) const;

 private:
  int64_t num_examples_;
  int rank_;
  int world_size_;
  uint64_t seed_;
  std::shared_ptr<const Partition> partition_;  // null: a new global permutation every epoch
};

}  // namespace terse::train

// Non-IID data: which examples each worker owns when the workers' label distributions differ (data.partition
// DIRICHLET). Federated and local-SGD studies vary this heterogeneity, since it decides how far the workers' models
// drift apart between averagings (Hsu, Qi and Brown 2019, "Measuring the effects of non-identical data distribution";
// Hsieh et al. ICML 2020, "The non-IID data quagmire").
//
// Each worker w draws its class mix q_w ~ Dirichlet(alpha, ..., alpha) over the C classes: small alpha (0.1) gives
// each worker a few classes, large alpha (100) the global mix. The shards are then filled slot by slot, the workers in
// turn, each taking an example of a class drawn from its q_w among the classes that still have examples (the draw
// renormalized over them), so every worker owns exactly floor(N / workers) examples: synchronous training needs the
// same step count on every rank. A worker whose classes run out takes others' in proportion to its q_w, and, once none
// of its classes is left, in proportion to what is left. The N mod workers examples left at the end belong to no one.
//
// Every draw comes from SeededRng (seeded_rng.h), Gamma variates by Marsaglia and Tsang in log space (a small alpha
// underflows a plain Gamma(alpha) to 0), so a partition depends on (labels, workers, alpha, seed) and on libm's log,
// exp and cos alone. The ranks of a job draw it each on their own and compare partitionChecksum before training
// (runner: checkInitialReplicas), so another data file or a libm that rounds otherwise fails instead of overlapping.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace terse::train {

// Each worker's examples (indices into `labels`), floor(N / workers) each, in no particular order (the sampler
// shuffles them per epoch). Throws InvalidArgument for workers < 1, N < workers, num_classes < 1, a label outside
// [0, num_classes), or alpha not finite and > 0.
std::vector<std::vector<int64_t>> dirichletPartition(std::span<const int32_t> labels, int num_classes, int workers,
                                                     double alpha, uint64_t seed);

// FNV-1a 64 over every shard's size and examples in order, 0 for no partition: the ranks of a job compare it, since
// each draws the partition from its own copy of the labels and its own libm.
uint64_t partitionChecksum(const std::vector<std::vector<int64_t>>* shards);

// Per worker, how many of its examples have each class: the partition's label histograms, for the results.
std::vector<std::vector<int64_t>> labelHistograms(const std::vector<std::vector<int64_t>>& shards,
                                                  std::span<const int32_t> labels, int num_classes);

// The mean over workers of the total variation distance between a worker's label distribution and the whole data
// set's: 0 for identical mixes, near 1 - 1/C when each worker holds one class. A one-number summary of heterogeneity.
double meanLabelDistance(const std::vector<std::vector<int64_t>>& histograms, std::span<const int32_t> labels,
                         int num_classes);

}  // namespace terse::train

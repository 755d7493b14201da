// One resolved variant of a terse experiment config, for a PyTorch script that trains the same recipe as a native
// `terse run` of that config: the config loaded and validated by the runner's own loader (experiments/config), the
// Fashion-MNIST arrays from terse's IDX reader, the workload's initial parameters from terse's own model (same seed,
// same values), each rank's batches from core's ShardSampler, and the learning rate of every step from core's
// schedule. What differs between the two runs is then only the training framework's arithmetic and the front end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/plugin/loader.h"
#include "core/train/shard_sampler.h"
#include "experiments/config/config.h"
#include "experiments/workloads/dataset.h"

namespace terse::python {

struct InitialParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> value;
};

class Recipe {
 public:
  // Loads `path` and picks `variant` (empty: the only one; an error naming the variants when there are several).
  // Throws ConfigError / InvalidArgument as `terse run` reports them; a named variant's plugins alone are loaded, as
  // `terse run --variant` loads them.
  Recipe(const std::string& path, const std::string& variant, const std::vector<std::string>& plugin_path);

  const experiments::Experiment& experiment() const noexcept { return e_; }
  // Text format, as a results folder's config.textproto holds it.
  std::string text() const;

  // Loaded on first use and kept (the workload's data and the arrays the script trains on are one copy).
  const workloads::DataSplit& data();
  // The workload's parameters as terse initializes them, in terse's order (fc0.weight, fc0.bias, ...).
  std::vector<InitialParam> initialParameters();

  int64_t stepsPerEpoch(int world);
  int64_t totalSteps(int world) { return stepsPerEpoch(world) * e_.epochs(); }
  // This rank's batches of `epoch` (example indices), as the native trainer draws them; with data.partition DIRICHLET
  // from the non-IID shards of `world` workers (the native run draws them for `workers`: the same when they agree).
  std::vector<std::vector<int64_t>> batches(int rank, int world, int64_t epoch);
  // provenance.json's "data_partition" of that split for `world` workers, as a native run records it (kind, alpha,
  // seed, mean label distance, each worker's label histogram); empty for IID.
  std::vector<std::pair<std::string, std::string>> dataPartition(int world);
  // The learning rate of 0-based step `step` of a run with `world` workers. `steps_per_epoch` > 0 replaces the count
  // from terse's sampler over the Fashion-MNIST shard (a pytorch workload's own data has its own count).
  double learningRate(int64_t step, int world, int64_t steps_per_epoch = 0);

 private:
  PluginLoader loader_;
  experiments::Experiment e_;
  std::shared_ptr<const workloads::DataSplit> data_;
  // data.partition DIRICHLET: the shards for the world they were drawn for.
  std::shared_ptr<const train::Partition> partition_;
  int partition_world_ = 0;
  // The shards for `world` (null for IID), drawn once per world.
  const train::Partition* partition(int world);
};

}  // namespace terse::python

#include "experiments/python/recipe.h"

#include <cmath>

#include "core/common/error.h"
#include "core/train/optimizer.h"
#include "core/train/shard_sampler.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/workloads/fashion_mnist.h"
#include "experiments/workloads/workloads.h"

namespace terse::python {

Recipe::Recipe(const std::string& path, const std::string& variant, const std::vector<std::string>& plugin_path)
    : loader_(plugin_path, "plugin_path=") {
  // The loader names the folders as a Python caller passes them (plugin_path=), not as the CLI's --plugin-path.
  std::vector<std::string> names;
  if (!variant.empty()) names.push_back(variant);
  // As `terse run --variant`: the other variants' plugins need not be on this machine.
  auto options = runner::runnerConfigOptions(&loader_);
  options.plugin_variants = names;
  // A module named relative to the config is the config folder's (experiment.proto PyTorch.module), whatever the
  // working directory: the loader resolves it, so text() names the file a hook script's ResultsLogger hashes.
  options.module_dir = std::filesystem::absolute(path).parent_path();
  const experiments::Study study = experiments::loadStudy(path, options);
  std::vector<experiments::Experiment> picked = experiments::selectVariants(study, names);
  if (picked.size() != 1) {
    std::string all;
    for (const auto& x : picked) all += (all.empty() ? "" : ", ") + x.variant();
    TERSE_THROW(InvalidArgument, path << " has " << picked.size() << " variants (" << all << "); name one");
  }
  e_ = std::move(picked.front());
  TERSE_CHECK(e_.mode() == experiments::Experiment::SYNC, InvalidArgument,
              path << " variant '" << e_.variant() << "': a DDP hook trains synchronously; the config's mode is "
                   << experiments::Experiment::Mode_Name(e_.mode()));
}

std::string Recipe::text() const {
  return experiments::toText(e_);
}

const workloads::DataSplit& Recipe::data() {
  if (!data_) {
    TERSE_CHECK(workloads::workloadNeedsData(e_.workload().name()), InvalidArgument,
                "workload '" << e_.workload().name() << "' has no Fashion-MNIST data");
    workloads::FashionMnistOptions o;
    o.dir = e_.data().dataset_dir();
    o.max_train = e_.data().train_subset();
    o.max_test = e_.data().test_subset();
    data_ = std::make_shared<const workloads::DataSplit>(workloads::loadFashionMnist(o));
  }
  return *data_;
}

std::vector<InitialParam> Recipe::initialParameters() {
  data();
  const auto model = workloads::makeWorkload(e_.workload().name(), runner::detail::workloadOptions(e_), data_);
  std::vector<InitialParam> out;
  for (const train::ParamTensor& p : model->params()) out.push_back({p.name, p.shape, p.value});
  return out;
}

int64_t Recipe::stepsPerEpoch(int world) {
  const train::ShardSampler sampler(data().train.num_examples, 0, world, e_.seed());
  return sampler.batchesPerEpoch(e_.data().batch_size());
}

const train::Partition* Recipe::partition(int world) {
  // data.partition DIRICHLET: the runner's fixed non-IID shards (runner::detail::dataPartition), for this world.
  if (partition_world_ != world) {
    partition_ = runner::detail::dataPartition(e_, data().train.labels, data().train.num_classes, world);
    partition_world_ = world;
  }
  return partition_.get();
}

std::vector<std::vector<int64_t>> Recipe::batches(int rank, int world, int64_t epoch) {
  partition(world);
  const train::ShardSampler sampler(data().train.num_examples, rank, world, e_.seed(), partition_);
  return sampler.epochBatches(epoch, e_.data().batch_size());
}

std::vector<std::pair<std::string, std::string>> Recipe::dataPartition(int world) {
  const train::Partition* p = partition(world);
  results::Provenance prov;
  runner::detail::notePartition(prov, e_, data().train.labels, data().train.num_classes, p);
  return prov.partition;
}

double Recipe::learningRate(int64_t step, int world, int64_t steps_per_epoch) {
  // The trainer's own conversion (sync_trainer.cc): warm-up epochs become steps of this world's epoch.
  train::LrScheduleOptions lr = runner::detail::trainerOptions(e_).lr;
  lr.world_size = world;
  lr.steps_per_epoch = steps_per_epoch > 0 ? steps_per_epoch : stepsPerEpoch(world);
  lr.total_steps = lr.steps_per_epoch * e_.epochs();
  if (e_.optimizer().warmup_epochs() > 0)
    lr.warmup_steps = std::llround(e_.optimizer().warmup_epochs() * static_cast<double>(lr.steps_per_epoch));
  train::validateLrSchedule(lr);
  return train::learningRate(lr, step);
}

}  // namespace terse::python

#include "experiments/workloads/workloads.h"

#include <string>
#include <utility>

#include "core/common/error.h"
#include "experiments/workloads/cnn.h"
#include "experiments/workloads/linear_regression.h"
#include "experiments/workloads/mlp.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

std::vector<std::string_view> workloadNames() {
  return {"linear_regression", "softmax", "mlp", "cnn"};
}

bool workloadNeedsData(std::string_view name) {
  return name != "linear_regression";
}

std::unique_ptr<train::Workload> makeWorkload(std::string_view name, const WorkloadOptions& options,
                                              std::shared_ptr<const DataSplit> data) {
  bool known = false;
  for (std::string_view n : workloadNames()) known = known || n == name;
  if (!known) {
    std::string list;
    for (std::string_view n : workloadNames()) list += (list.empty() ? "" : ", ") + std::string(n);
    TERSE_THROW(InvalidArgument, "unknown workload '" << name << "' (available: " << list << ")");
  }
  TERSE_CHECK(!workloadNeedsData(name) || data != nullptr, InvalidArgument,
              "workload '" << name << "' needs a data set");
  if (options.blas_threads != 0) setBlasThreads(options.blas_threads);
  if (name == "linear_regression") {
    LinearRegressionOptions lr;
    lr.dims = options.dims;
    lr.noise = options.noise;
    lr.num_train = options.num_train;
    lr.num_test = options.num_test;
    lr.seed = options.seed;
    return std::make_unique<LinearRegressionWorkload>(lr);
  }
  if (name == "softmax")
    return std::make_unique<MlpWorkload>(std::move(data), std::vector<int64_t>{}, options.seed, "softmax");
  if (name == "mlp") return std::make_unique<MlpWorkload>(std::move(data), options.hidden, options.seed, "mlp");
  return std::make_unique<CnnWorkload>(std::move(data), options.seed);
}

}  // namespace terse::workloads

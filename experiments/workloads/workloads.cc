#include "experiments/workloads/workloads.h"

#include <string>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/cnn.h"
#include "experiments/workloads/gemm.h"
#include "experiments/workloads/linear_regression.h"
#include "experiments/workloads/mlp.h"
#include "experiments/workloads/nn_ops.h"
#ifdef TERSE_HAVE_CUDA
#include "experiments/workloads/cnn_cuda.h"
#include "experiments/workloads/mlp_cuda.h"
#endif

namespace terse::workloads {

std::vector<std::string_view> workloadNames() {
  return {"linear_regression", "softmax", "mlp", "cnn", "glove"};
}

bool workloadNeedsData(std::string_view name) {
  return name != "linear_regression" && name != "glove";
}

std::vector<std::string_view> workloadsWithCuda() {
  return {"softmax", "mlp", "cnn"};
}

namespace {

// Validates options.device >= 0 before any model is built, so a wrong device is one clear message up front rather
// than a CUDA error from deep inside a constructor (docs/STYLE.md 5: ask, never assume).
void checkDevice(std::string_view name, int device) {
  bool has_cuda_model = false;
  for (std::string_view n : workloadsWithCuda()) has_cuda_model = has_cuda_model || n == name;
  TERSE_CHECK(has_cuda_model, Unsupported,
              "workload '" << name << "' has no CUDA model (asked for CUDA device " << device
                           << "); use device -1 for the CPU model");
  const cuda::DeviceSummary devices = cuda::deviceSummary();
  TERSE_CHECK(cuda::builtWithCuda(), Unsupported,
              "workload '" << name << "' on CUDA device " << device << ": " << devices.reason
                           << "; use device -1 for the CPU model");
  TERSE_CHECK(device < devices.count, InvalidArgument,
              "workload '" << name << "': CUDA device " << device << " does not exist, this machine has "
                           << devices.count << " CUDA device(s)"
                           << (devices.reason.empty() ? "" : " (" + devices.reason + ")"));
}

}  // namespace

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
  TERSE_CHECK(options.device >= -1, InvalidArgument,
              "workload '" << name << "': device must be -1 (CPU) or a CUDA device ordinal, got " << options.device);
  if (options.device >= 0) {
    checkDevice(name, options.device);
#ifdef TERSE_HAVE_CUDA
    if (name == "softmax")
      return std::make_unique<MlpCudaWorkload>(std::move(data), std::vector<int64_t>{}, options.seed, options.device,
                                               "softmax");
    if (name == "mlp")
      return std::make_unique<MlpCudaWorkload>(std::move(data), options.hidden, options.seed, options.device, "mlp");
    return std::make_unique<CnnCudaWorkload>(std::move(data), options.cnn, options.seed, options.device);
#endif
    // (Without CUDA, checkDevice has thrown Unsupported.)
  }
  // The device models use cuBLAS; the GEMM kernel (a bad TERSE_GEMM fails here, before any training) and OpenBLAS's
  // thread count matter only for the CPU models.
  (void)gemmKernel();
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
  if (name == "glove")
    return std::make_unique<GloveWorkload>(loadGloveData(options.glove), options.glove, options.seed);
  if (name == "softmax")
    return std::make_unique<MlpWorkload>(std::move(data), std::vector<int64_t>{}, options.seed, "softmax");
  if (name == "mlp") return std::make_unique<MlpWorkload>(std::move(data), options.hidden, options.seed, "mlp");
  return std::make_unique<CnnWorkload>(std::move(data), options.cnn, options.seed);
}

}  // namespace terse::workloads

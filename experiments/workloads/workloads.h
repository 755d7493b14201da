// The workload factory: one name per model, built against core's Workload interface. The runner loads a data set
// once (loadFashionMnist), shares it read-only, and calls makeWorkload once per worker thread.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "core/train/workload.h"
#include "experiments/workloads/cnn.h"
#include "experiments/workloads/dataset.h"
#include "experiments/workloads/glove.h"

namespace terse::workloads {

struct WorkloadOptions {
  uint64_t seed = 1;  // parameter init (and, for linear_regression, the synthetic data); same seed, same weights
  std::vector<int64_t> hidden = {256, 128};  // mlp hidden layer sizes
  CnnShape cnn;                              // cnn: channels, hidden widths, dropout (cnn.h)
  // linear_regression (synthetic, ignores `data`).
  int64_t dims = 10;
  double noise = 0.1;
  int64_t num_train = 10000;
  int64_t num_test = 2000;
  // glove (builds its own data from a text corpus, ignores `data`): glove.h.
  GloveOptions glove;
  // OpenBLAS threads for the whole process (OpenBLAS has no per-thread setting). 1 keeps one BLAS thread per worker
  // thread; 0 leaves OpenBLAS as it is.
  int blas_threads = 1;
  // Where the model computes: -1 (the default) is the CPU model; an ordinal >= 0 is the CUDA model of softmax, mlp or
  // cnn on that device (same parameters, layer order and initial values as the CPU model; builds with CUDA only).
  int device = -1;
};

// "linear_regression", "softmax", "mlp", "cnn", "glove".
std::vector<std::string_view> workloadNames();
// Whether the workload trains on `data` (Fashion-MNIST: all but linear_regression and glove).
bool workloadNeedsData(std::string_view name);
// The workloads with a CUDA version (WorkloadOptions::device >= 0), whether or not this build has CUDA.
std::vector<std::string_view> workloadsWithCuda();

// Builds a workload. Throws InvalidArgument for an unknown name (listing the known ones), a missing data set where
// one is needed, options the model rejects, or a device ordinal that does not exist on this machine (the message
// names the ordinal and how many devices there are); Unsupported for a device >= 0 in a build without CUDA or for a
// workload without a CUDA model (linear_regression, glove).
std::unique_ptr<train::Workload> makeWorkload(std::string_view name, const WorkloadOptions& options,
                                              std::shared_ptr<const DataSplit> data);

}  // namespace terse::workloads

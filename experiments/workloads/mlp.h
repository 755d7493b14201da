// Fully connected classifier: inputs -> [Linear -> ReLU] per hidden size -> Linear -> softmax cross-entropy. With no
// hidden layers it is multinomial logistic regression (the `softmax` workload). GEMMs go through nn_ops.h's gemm.
//
// Layer l holds "fc<l>.weight" [out, in] (He-normal before a ReLU, Glorot-uniform for the output layer) and
// "fc<l>.bias" [out] (zero).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/train/workload.h"
#include "experiments/workloads/dataset.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

// The layer widths (input dims, hidden..., classes) of an MLP on `data`. Throws InvalidArgument, naming the workload
// `name`, for a missing or unusable data set or a non-positive hidden size. MlpWorkload and MlpCudaWorkload share it.
std::vector<int64_t> mlpWidths(const std::shared_ptr<const DataSplit>& data, const std::vector<int64_t>& hidden,
                               const std::string& name);
// The MLP's parameters in params() order ("fc<l>.weight", "fc<l>.bias" per layer) with their initial values for
// `seed` (see the top of this file): one definition, so the host and device models start from the same weights.
std::vector<ParamSpec> mlpParams(const std::vector<int64_t>& widths, uint64_t seed);

class MlpWorkload final : public train::Workload {
 public:
  MlpWorkload(std::shared_ptr<const DataSplit> data, std::vector<int64_t> hidden, uint64_t seed,
              std::string name = "mlp");

  std::string_view name() const override { return name_; }
  int64_t numTrainExamples() const override { return data_->train.num_examples; }
  std::span<const int32_t> trainLabels() const override { return data_->train.labels; }
  int numClasses() const override { return data_->train.num_classes; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  bool gatesLayers() const override { return true; }
  train::EvalResult evaluate(int64_t max_examples = 0) override;

 private:
  void reserve(int64_t batch);
  // Runs forward over acts_[0] (already filled with `batch` rows); the logits end in acts_.back().
  void forward(int64_t batch);

  std::shared_ptr<const DataSplit> data_;
  std::string name_;
  std::vector<int64_t> widths_;            // input, hidden..., classes
  int64_t capacity_ = 0;                   // rows the buffers hold
  std::vector<std::vector<float>> acts_;   // acts_[l]: input of layer l (post-ReLU); acts_.back(): logits
  std::vector<float> delta_, delta_prev_;  // gradient w.r.t. the current layer's output / input
  std::vector<int32_t> labels_;
};

}  // namespace terse::workloads

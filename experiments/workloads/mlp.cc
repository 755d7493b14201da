#include "experiments/workloads/mlp.h"

#include <algorithm>
#include <utility>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

std::vector<int64_t> mlpWidths(const std::shared_ptr<const DataSplit>& data, const std::vector<int64_t>& hidden,
                               const std::string& name) {
  TERSE_CHECK(data != nullptr, InvalidArgument, name << " needs a data set");
  TERSE_CHECK(data->train.num_examples > 0 && data->train.num_classes >= 2, InvalidArgument,
              name << " needs a non-empty classification training set");
  TERSE_CHECK(data->test.dims == data->train.dims, InvalidArgument,
              name << ": test features have " << data->test.dims << " dims, training features " << data->train.dims);
  std::vector<int64_t> widths{data->train.dims};
  for (int64_t h : hidden) {
    TERSE_CHECK(h > 0, InvalidArgument, name << ": hidden layer sizes must be positive, got " << h);
    widths.push_back(h);
  }
  widths.push_back(data->train.num_classes);
  return widths;
}

std::vector<ParamSpec> mlpParams(const std::vector<int64_t>& widths, uint64_t seed) {
  std::vector<ParamSpec> specs;
  const int layers = static_cast<int>(widths.size()) - 1;
  for (int l = 0; l < layers; ++l) {
    const std::string prefix = "fc" + std::to_string(l);
    const int64_t in = widths[static_cast<std::size_t>(l)], out = widths[static_cast<std::size_t>(l) + 1];
    ParamSpec w{prefix + ".weight", {out, in}, l, std::vector<float>(static_cast<std::size_t>(out * in))};
    train::SeededRng rng(seed, static_cast<uint64_t>(l));
    if (l + 1 < layers)
      initHeNormal(w.value, in, rng);
    else
      initGlorotUniform(w.value, in, out, rng);
    specs.push_back(std::move(w));
    specs.push_back(ParamSpec{prefix + ".bias", {out}, l, std::vector<float>(static_cast<std::size_t>(out))});
  }
  return specs;
}

MlpWorkload::MlpWorkload(std::shared_ptr<const DataSplit> data, std::vector<int64_t> hidden, uint64_t seed,
                         std::string name)
    : data_(std::move(data)), name_(std::move(name)) {
  widths_ = mlpWidths(data_, hidden, name_);
  for (ParamSpec& spec : mlpParams(widths_, seed)) {
    // Two statements: params() must be read after addParam, which may move the tensors.
    const std::size_t t = addParam(std::move(spec.name), std::move(spec.shape), spec.layer);
    params()[t].value = std::move(spec.value);
  }
  acts_.resize(widths_.size());
}

void MlpWorkload::reserve(int64_t batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  for (std::size_t l = 0; l < acts_.size(); ++l) acts_[l].resize(static_cast<std::size_t>(batch * widths_[l]));
  const int64_t widest = *std::max_element(widths_.begin() + 1, widths_.end());
  delta_.resize(static_cast<std::size_t>(batch * widest));
  delta_prev_.resize(delta_.size());
  labels_.resize(static_cast<std::size_t>(batch));
}

void MlpWorkload::forward(int64_t batch) {
  const std::size_t layers = widths_.size() - 1;
  for (std::size_t l = 0; l < layers; ++l) {
    const int64_t in = widths_[l], out = widths_[l + 1];
    awaitLayer(static_cast<int>(l));  // the previous step's update of this layer must be in (gatesLayers)
    const std::vector<float>& w = params()[2 * l].value;
    const std::vector<float>& b = params()[2 * l + 1].value;
    float* y = acts_[l + 1].data();
    // Broadcast the bias first so the GEMM accumulates onto it (beta = 1).
    for (int64_t i = 0; i < batch; ++i) std::copy(b.begin(), b.end(), y + i * out);
    gemm(false, true, batch, out, in, 1.0f, acts_[l].data(), w.data(), 1.0f, y);
    if (l + 1 < layers)
      for (int64_t i = 0; i < batch * out; ++i) y[i] = std::max(y[i], 0.0f);
  }
}

double MlpWorkload::forwardBackward(std::span<const int64_t> batch_indices, const train::LayerReadyFn& on_layer_ready) {
  const Dataset& train = data_->train;
  checkBatch(batch_indices, train.num_examples);
  const auto batch = static_cast<int64_t>(batch_indices.size());
  reserve(batch);
  gatherBatch(train, batch_indices, acts_[0].data(), labels_.data());
  forward(batch);

  const int layers = static_cast<int>(widths_.size()) - 1;
  int64_t correct = 0;
  const double loss = softmaxCrossEntropy(acts_.back().data(), labels_.data(), batch, widths_.back(),
                                          1.0f / static_cast<float>(batch), delta_.data(), &correct);
  for (int l = layers - 1; l >= 0; --l) {
    const auto ul = static_cast<std::size_t>(l);
    const int64_t in = widths_[ul], out = widths_[ul + 1];
    train::ParamTensor& w = params()[2 * ul];
    train::ParamTensor& b = params()[2 * ul + 1];
    // dW = delta^T x, db = column sums of delta.
    gemm(true, false, out, in, batch, 1.0f, delta_.data(), acts_[ul].data(), 0.0f, w.grad.data());
    std::fill(b.grad.begin(), b.grad.end(), 0.0f);
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t o = 0; o < out; ++o)
        b.grad[static_cast<std::size_t>(o)] += delta_[static_cast<std::size_t>(i * out + o)];
    if (l > 0) {
      // delta_prev = (delta W) masked by the ReLU of layer l-1's output (acts_[l] > 0). Computed before the report:
      // after it the caller may already be updating W in place (see the contract in core/train/workload.h).
      gemm(false, false, batch, in, out, 1.0f, delta_.data(), w.value.data(), 0.0f, delta_prev_.data());
    }
    reportLayer(on_layer_ready, l);
    if (l == 0) break;
    const float* a = acts_[ul].data();
    for (int64_t i = 0; i < batch * in; ++i)
      if (a[i] <= 0.0f) delta_prev_[static_cast<std::size_t>(i)] = 0.0f;
    std::swap(delta_, delta_prev_);
  }
  return loss / static_cast<double>(batch);
}

train::EvalResult MlpWorkload::evaluate(int64_t max_examples) {
  const Dataset& test = data_->test;
  const int64_t n = max_examples > 0 ? std::min(max_examples, test.num_examples) : test.num_examples;
  constexpr int64_t kChunk = 500;  // bounds the activation buffers evaluation needs
  reserve(std::min(n, kChunk));
  double loss = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t rows = std::min(kChunk, n - start);
    std::copy(test.example(start), test.example(start + rows), acts_[0].data());
    forward(rows);
    loss += softmaxCrossEntropy(acts_.back().data(), test.labels.data() + start, rows, widths_.back(), 0.0f, nullptr,
                                &correct);
  }
  if (n == 0) return {};
  return {loss / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n), n};
}

}  // namespace terse::workloads

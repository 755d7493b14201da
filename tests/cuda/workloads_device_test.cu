// The CUDA workloads (experiments/workloads/mlp_cuda.h, cnn_cuda.h) against their CPU siblings on the same seed and
// batches: loss, every device_grad, evaluate, a few SGD steps applied on the device; and the device contract of
// core/train/workload.h (layer reports in reverse order with each tensor once and its gradient final, awaitLayer
// before each layer's values are read, copyValuesToHost/ToDevice). Skips without a device.
//
// Tolerance: the two sides differ only by float rounding -- no TF32 (CUBLAS_DEFAULT_MATH), no contraction into FMA on
// either side (--fmad=false, -ffp-contract=off), but cuBLAS, OpenBLAS and the device's tree reductions sum in
// different orders. A sum of k float terms carries a relative error of about sqrt(k) * 6e-8 of the summed magnitudes
// (k is at most 33 * 576 here, the conv1 weight gradient), so every element must lie within kRel = 1e-4 of its
// tensor's largest CPU magnitude: tight enough that a wrong index, a missing term or a transposed GEMM (errors of order
// the values themselves) cannot pass, loose enough for rounding. Losses are compared at 1e-5 relative (the loss sums
// in double on both sides, and the logits differ by rounding only), accuracies up to one example (an arg-max whose
// two largest logits are within rounding of each other). A ReLU input or a max-pool pair within rounding of a tie could
// flip a mask in principle; with these seeds' random data that is a ~1e-7 event per element.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"
#include "core/train/workload.h"
#include "experiments/workloads/device_data.h"
#include "experiments/workloads/workloads.h"
#include "tests/workloads/workloads_test_util.h"

namespace terse::workloads {
namespace {

constexpr double kRel = 1e-4;
constexpr double kLossRel = 1e-5;
constexpr int kDevice = 0;

struct Case {
  std::string name;
  std::vector<int64_t> hidden;
  int64_t rows, cols;
};

// Readable test names in ctest's listing instead of the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " " << c.rows << "x" << c.cols;
}

// 600 examples each way: evaluate runs several of the models' chunks (500 for the MLP, 256 for the CNN).
std::shared_ptr<const DataSplit> dataFor(const Case& c) {
  static std::map<std::pair<int64_t, int64_t>, std::shared_ptr<const DataSplit>> cache;
  auto& d = cache[{c.rows, c.cols}];
  if (!d) d = testing::randomSplit(600, c.rows, c.cols, 10, 21);
  return d;
}

std::unique_ptr<train::Workload> make(const Case& c, int device, uint64_t seed = 7) {
  WorkloadOptions o;
  o.seed = seed;
  o.hidden = c.hidden;
  o.device = device;
  return makeWorkload(c.name, o, dataFor(c));
}

std::vector<float> toHost(const float* device_ptr, std::size_t n) {
  std::vector<float> out(n);
  TERSE_CUDA_CHECK(cudaMemcpy(out.data(), device_ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

// Every element within kRel of the tensor's largest CPU magnitude; reports the worst one.
void expectClose(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0.0;
  for (float v : cpu) scale = std::max(scale, std::abs(static_cast<double>(v)));
  std::size_t worst = 0, bad = 0;
  double worst_diff = -1.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double diff = std::abs(static_cast<double>(gpu[i]) - static_cast<double>(cpu[i]));
    if (diff > kRel * scale) ++bad;
    if (diff > worst_diff) {
      worst_diff = diff;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << cpu.size() << " elements differ by more than " << kRel << " x "
                     << scale << "; worst [" << worst << "] gpu " << gpu[worst] << " cpu " << cpu[worst];
}

void expectLossClose(double gpu, double cpu, const std::string& what) {
  EXPECT_NEAR(gpu, cpu, kLossRel * std::max(1.0, std::abs(cpu))) << what;
}

// Deterministic batches with repeats and a spread of indices.
std::vector<int64_t> batchOf(int64_t size, int64_t salt, int64_t n) {
  std::vector<int64_t> b(static_cast<std::size_t>(size));
  for (int64_t i = 0; i < size; ++i) b[static_cast<std::size_t>(i)] = (i * 37 + salt * 11 + 5) % n;
  return b;
}

__global__ void sgdKernel(float* w, const float* g, int64_t n, float lr) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<int64_t>(blockDim.x))
    w[i] = w[i] - lr * g[i];
}

class DeviceWorkloads : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const cuda::DeviceSummary summary = cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
  }
};

TEST_P(DeviceWorkloads, SameTensorsAndInitialValues) {
  auto cpu = make(GetParam(), -1), gpu = make(GetParam(), kDevice);
  EXPECT_EQ(gpu->name(), cpu->name());
  EXPECT_EQ(gpu->device(), kDevice);
  EXPECT_TRUE(gpu->gatesLayers());
  EXPECT_EQ(gpu->numTrainExamples(), cpu->numTrainExamples());
  ASSERT_EQ(gpu->numLayers(), cpu->numLayers());
  ASSERT_EQ(gpu->params().size(), cpu->params().size());
  for (std::size_t t = 0; t < cpu->params().size(); ++t) {
    const train::ParamTensor &g = gpu->params()[t], &c = cpu->params()[t];
    EXPECT_EQ(g.name, c.name);
    EXPECT_EQ(g.shape, c.shape);
    EXPECT_EQ(g.layer, c.layer);
    ASSERT_NE(g.device_value, nullptr);
    ASSERT_NE(g.device_grad, nullptr);
    EXPECT_EQ(c.device_value, nullptr);
    EXPECT_EQ(g.value, c.value) << g.name << ": the host mirror holds the initial values";
    EXPECT_EQ(toHost(g.device_value, g.numel()), c.value) << g.name << ": identical initial values on the device";
  }
}

// Batch sizes 1, 7, 33, then 7 again: the buffers grow, then are reused smaller.
TEST_P(DeviceWorkloads, LossAndGradientsMatchCpu) {
  auto cpu = make(GetParam(), -1), gpu = make(GetParam(), kDevice);
  int64_t salt = 0;
  for (int64_t size : {1, 7, 33, 7}) {
    const std::vector<int64_t> batch = batchOf(size, ++salt, cpu->numTrainExamples());
    const std::string where = GetParam().name + " batch " + std::to_string(size);
    const double cpu_loss = cpu->forwardBackward(batch, nullptr);
    const double gpu_loss = gpu->forwardBackward(batch, nullptr);
    expectLossClose(gpu_loss, cpu_loss, where);
    for (std::size_t t = 0; t < cpu->params().size(); ++t) {
      const train::ParamTensor& g = gpu->params()[t];
      expectClose(toHost(g.device_grad, g.numel()), cpu->params()[t].grad, where + " " + g.name);
    }
  }
}

TEST_P(DeviceWorkloads, EvaluateMatchesCpu) {
  auto cpu = make(GetParam(), -1), gpu = make(GetParam(), kDevice);
  for (int64_t max_examples : {int64_t{0}, int64_t{1}, int64_t{100}, int64_t{257}, int64_t{10000}}) {
    const train::EvalResult c = cpu->evaluate(max_examples), g = gpu->evaluate(max_examples);
    const std::string where = GetParam().name + " max_examples " + std::to_string(max_examples);
    EXPECT_EQ(g.num_examples, c.num_examples) << where;
    expectLossClose(g.loss, c.loss, where);
    EXPECT_NEAR(g.accuracy, c.accuracy, 1.0 / static_cast<double>(c.num_examples) + 1e-12) << where;
  }
}

// SGD as a trainer would run it on a device workload: each reported layer updated on another stream right away, and
// the next forward's gate waiting for that layer's update only. The CPU side updates in place in its callback.
TEST_P(DeviceWorkloads, SgdStepsOnTheDeviceTrackCpu) {
  auto cpu = make(GetParam(), -1), gpu = make(GetParam(), kDevice);
  constexpr float kLr = 0.05f;
  const cuda::DeviceGuard guard(kDevice);
  cuda::Stream updates;
  std::vector<cuda::Event> updated(static_cast<std::size_t>(gpu->numLayers()));
  gpu->setLayerGate([&](int layer) { updated[static_cast<std::size_t>(layer)].synchronize(); });
  for (int step = 0; step < 5; ++step) {
    const std::vector<int64_t> batch = batchOf(33, 100 + step, cpu->numTrainExamples());
    const double cpu_loss = cpu->forwardBackward(batch, [&](int, std::span<const std::size_t> tensors) {
      for (std::size_t t : tensors) {
        train::ParamTensor& p = cpu->params()[t];
        for (std::size_t i = 0; i < p.numel(); ++i) p.value[i] = p.value[i] - kLr * p.grad[i];
      }
    });
    const double gpu_loss = gpu->forwardBackward(batch, [&](int layer, std::span<const std::size_t> tensors) {
      for (std::size_t t : tensors) {
        train::ParamTensor& p = gpu->params()[t];
        const auto n = static_cast<int64_t>(p.numel());
        sgdKernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024)), 256, 0, updates.get()>>>(
            p.device_value, p.device_grad, n, kLr);
        TERSE_CUDA_CHECK(cudaGetLastError());
      }
      updated[static_cast<std::size_t>(layer)].record(updates.get());
    });
    // Later steps compound the rounding differences a little; 10x the one-step loss tolerance still catches an
    // update that went missing or landed twice (which moves the loss by orders of magnitude more).
    EXPECT_NEAR(gpu_loss, cpu_loss, 10 * kLossRel * std::max(1.0, std::abs(cpu_loss))) << "step " << step;
  }
  updates.synchronize();
  gpu->copyValuesToHost();
  for (std::size_t t = 0; t < cpu->params().size(); ++t)
    expectClose(gpu->params()[t].value, cpu->params()[t].value, "after 5 steps: " + cpu->params()[t].name);
  gpu->setLayerGate({});
  expectLossClose(gpu->evaluate(200).loss, cpu->evaluate(200).loss, "evaluate after 5 steps");
}

// The callback sees layers L-1..0 once each, every tensor exactly once under its own layer, and the device_grad it
// reads (on the legacy stream, not the workload's) is already final. Updating a reported layer in place (here:
// overwriting its values with NaN) changes no gradient of the layers below.
TEST_P(DeviceWorkloads, LayerReportsInReverseOrderWithFinalGradients) {
  auto clean = make(GetParam(), kDevice), w = make(GetParam(), kDevice);
  const std::vector<int64_t> batch = batchOf(33, 7, w->numTrainExamples());
  const double clean_loss = clean->forwardBackward(batch, nullptr);
  std::vector<int> layers;
  std::multiset<std::size_t> tensors;
  std::vector<std::vector<float>> seen(w->params().size());
  const double loss = w->forwardBackward(batch, [&](int layer, std::span<const std::size_t> ts) {
    layers.push_back(layer);
    for (std::size_t t : ts) {
      tensors.insert(t);
      const train::ParamTensor& p = w->params()[t];
      EXPECT_EQ(p.layer, layer);
      seen[t] = toHost(p.device_grad, p.numel());
      TERSE_CUDA_CHECK(cudaMemset(p.device_value, 0xff, p.numel() * sizeof(float)));
    }
  });
  EXPECT_EQ(loss, clean_loss);
  std::vector<int> expected;
  for (int l = w->numLayers() - 1; l >= 0; --l) expected.push_back(l);
  EXPECT_EQ(layers, expected);
  ASSERT_EQ(tensors.size(), w->params().size());
  for (std::size_t t = 0; t < w->params().size(); ++t) {
    const train::ParamTensor& p = w->params()[t];
    EXPECT_EQ(tensors.count(t), 1u) << "tensor " << t;
    const std::vector<float> final_grad = toHost(p.device_grad, p.numel());
    EXPECT_EQ(seen[t], final_grad) << p.name << " changed after its layer was reported";
    EXPECT_EQ(final_grad, toHost(clean->params()[t].device_grad, p.numel()))
        << p.name << ": updating reported layers changed a gradient";
  }
}

// awaitLayer(l) comes before anything reads layer l's values: every device_value starts as NaN and the gate restores
// layer l's values (and waits for the copy) only when called for l. Any earlier read would poison the loss.
TEST_P(DeviceWorkloads, GateRunsBeforeEachLayerIsRead) {
  auto clean = make(GetParam(), kDevice), w = make(GetParam(), kDevice);
  const std::vector<int64_t> batch = batchOf(7, 3, w->numTrainExamples());
  const cuda::DeviceGuard guard(kDevice);
  cuda::Stream copies;
  auto poison = [&] {
    for (const train::ParamTensor& p : w->params())
      TERSE_CUDA_CHECK(cudaMemset(p.device_value, 0xff, p.numel() * sizeof(float)));
    TERSE_CUDA_CHECK(cudaDeviceSynchronize());
  };
  std::vector<int> gated;
  w->setLayerGate([&](int layer) {
    gated.push_back(layer);
    for (std::size_t t : w->layerTensors(layer)) {
      const train::ParamTensor& p = w->params()[t];
      TERSE_CUDA_CHECK(cudaMemcpyAsync(p.device_value, p.value.data(), p.numel() * sizeof(float),
                                       cudaMemcpyHostToDevice, copies.get()));
    }
    copies.synchronize();
  });
  std::vector<int> one_pass;
  for (int l = 0; l < w->numLayers(); ++l) one_pass.push_back(l);

  poison();
  const double loss = w->forwardBackward(batch, nullptr);
  EXPECT_EQ(loss, clean->forwardBackward(batch, nullptr));
  EXPECT_EQ(gated, one_pass);
  for (std::size_t t = 0; t < w->params().size(); ++t) {
    const train::ParamTensor& p = w->params()[t];
    EXPECT_EQ(toHost(p.device_grad, p.numel()), toHost(clean->params()[t].device_grad, p.numel())) << p.name;
  }

  // evaluate gates every chunk's forward the same way.
  gated.clear();
  poison();
  const train::EvalResult g = w->evaluate(0), c = clean->evaluate(0);
  EXPECT_EQ(g.loss, c.loss);
  EXPECT_EQ(g.accuracy, c.accuracy);
  ASSERT_FALSE(gated.empty());
  EXPECT_EQ(gated.size() % one_pass.size(), 0u);
  for (std::size_t i = 0; i < gated.size(); ++i) EXPECT_EQ(gated[i], one_pass[i % one_pass.size()]) << i;
}

TEST_P(DeviceWorkloads, CopyValuesRoundTripAndUse) {
  auto cpu = make(GetParam(), -1), gpu = make(GetParam(), kDevice);
  // New host values on both sides, pushed to the device.
  for (std::size_t t = 0; t < cpu->params().size(); ++t) {
    for (float& v : cpu->params()[t].value) v = v * 0.5f + 0.01f;
    gpu->params()[t].value = cpu->params()[t].value;
  }
  gpu->copyValuesToDevice();
  for (train::ParamTensor& p : gpu->params()) std::fill(p.value.begin(), p.value.end(), -7.0f);
  gpu->copyValuesToHost();
  for (std::size_t t = 0; t < cpu->params().size(); ++t)
    EXPECT_EQ(gpu->params()[t].value, cpu->params()[t].value) << cpu->params()[t].name;
  // And the device computes with them.
  const std::vector<int64_t> batch = batchOf(7, 9, cpu->numTrainExamples());
  expectLossClose(gpu->forwardBackward(batch, nullptr), cpu->forwardBackward(batch, nullptr),
                  "after copyValuesToDevice");
  for (std::size_t t = 0; t < cpu->params().size(); ++t) {
    const train::ParamTensor& g = gpu->params()[t];
    expectClose(toHost(g.device_grad, g.numel()), cpu->params()[t].grad, "after copyValuesToDevice: " + g.name);
  }
}

TEST_P(DeviceWorkloads, RejectsBadBatches) {
  auto w = make(GetParam(), kDevice);
  EXPECT_THROW(w->forwardBackward({}, nullptr), InvalidArgument);
  EXPECT_THROW(w->forwardBackward(std::vector<int64_t>{0, w->numTrainExamples()}, nullptr), InvalidArgument);
  EXPECT_THROW(w->forwardBackward(std::vector<int64_t>{-1}, nullptr), InvalidArgument);
  // Still usable afterwards.
  EXPECT_TRUE(std::isfinite(w->forwardBackward(std::vector<int64_t>{0, 1}, nullptr)));
}

INSTANTIATE_TEST_SUITE_P(Workloads, DeviceWorkloads,
                         ::testing::Values(Case{"softmax", {}, 28, 28}, Case{"mlp", {256, 128}, 28, 28},
                                           Case{"cnn", {}, 28, 28}, Case{"cnn", {}, 16, 28}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name + "_" + std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// Workloads on one device built on one data set share its device copy; a new data set gets its own.
TEST(DeviceDataSplitCache, SharedPerDataSetAndDevice) {
  const cuda::DeviceSummary summary = cuda::deviceSummary();
  if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
  auto data = testing::randomSplit(20, 16, 16, 4, 1), other = testing::randomSplit(20, 16, 16, 4, 2);
  auto a = deviceDataSplit(data, kDevice), b = deviceDataSplit(data, kDevice), c = deviceDataSplit(other, kDevice);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(&a->host(), data.get());
  std::vector<float> x(data->train.features.size());
  TERSE_CUDA_CHECK(cudaMemcpy(x.data(), a->train().x(), x.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(x, data->train.features);
}

}  // namespace
}  // namespace terse::workloads

// experiments/workloads/cnn_cuda.h: cnn.cc's forward and backward on the device, a batch per GEMM.
#include <algorithm>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/cnn_cuda.h"
#include "experiments/workloads/device_ops.h"

namespace terse::workloads {
namespace {

constexpr std::size_t kConv1W = 0, kConv1B = 1, kConv2W = 2, kConv2B = 3, kFcW = 4, kFcB = 5;
constexpr int64_t kK = CnnWorkload::kKernel, kKK = kK * kK;

// The device model has no hidden fully-connected layers or dropout yet: a config that asks for them is refused here
// (and by the config check for transport NCCL), never trained as a different model.
CnnGeometry deviceGeometry(const std::shared_ptr<const DataSplit>& data, const CnnShape& shape) {
  TERSE_CHECK(shape.hidden.empty() && shape.dropout == 0, Unsupported,
              "cnn on a CUDA device: workload.hidden_sizes and workload.dropout are not implemented there (CPU only); "
              "got "
                  << shape.hidden.size() << " hidden layer(s), dropout " << shape.dropout);
  return cnnGeometry(data, shape);
}

}  // namespace

CnnCudaWorkload::CnnCudaWorkload(std::shared_ptr<const DataSplit> data, const CnnShape& shape, uint64_t seed,
                                 int device)
    : CudaWorkload(device), g_(deviceGeometry(data, shape)) {
  const cuda::DeviceGuard guard(device);
  attachData(data);
  registerParams(cnnParams(g_, seed));
}

CnnCudaWorkload::~CnnCudaWorkload() {
  releaseOnDevice([&] {
    for (cuda::DeviceBuffer* b : {&x_, &col1_, &z1_, &p1_, &arg1_, &col2_, &z2_, &p2_, &arg2_, &logits_, &labels_,
                                  &dlogits_, &dp2_, &dz2_, &dcol2_, &dp1_, &dz1_})
      *b = {};
  });
}

void CnnCudaWorkload::reserve(int64_t batch) {
  reserveLoss(batch);
  if (batch <= capacity_) return;
  capacity_ = batch;
  const int64_t hw1 = g_.h1 * g_.w1, hwp1 = g_.hp1 * g_.wp1, hw2 = g_.h2 * g_.w2;
  grow<float>(x_, batch * g_.h0 * g_.w0);
  grow<float>(col1_, kKK * batch * hw1);
  grow<float>(z1_, g_.c1 * batch * hw1);
  grow<float>(p1_, batch * g_.c1 * hwp1);
  grow<int32_t>(arg1_, batch * g_.c1 * hwp1);
  grow<float>(col2_, g_.c1 * kKK * batch * hw2);
  grow<float>(z2_, g_.c2 * batch * hw2);
  grow<float>(p2_, batch * g_.fc_in);
  grow<int32_t>(arg2_, batch * g_.fc_in);
  grow<float>(logits_, batch * g_.classes);
  grow<int32_t>(labels_, batch);
  grow<float>(dlogits_, batch * g_.classes);
  grow<float>(dp2_, batch * g_.fc_in);
  grow<float>(dz2_, g_.c2 * batch * hw2);
  grow<float>(dcol2_, g_.c1 * kKK * batch * hw2);
  grow<float>(dp1_, batch * g_.c1 * hwp1);
  grow<float>(dz1_, g_.c1 * batch * hw1);
}

void CnnCudaWorkload::forward(const float* input, int64_t batch) {
  const int64_t hw1 = g_.h1 * g_.w1, hwp1 = g_.hp1 * g_.wp1, hw2 = g_.h2 * g_.w2;
  const cudaStream_t s = stream();
  auto p = params();
  // Layer by layer over the whole batch, each awaitLayer right before the first kernel that reads the layer's values
  // (the unfolding reads only activations, so it goes first): the first layer's compute overlaps the later layers'
  // communication.
  device::im2col(input, batch, 1, g_.h0, g_.w0, kK, g_.h0 * g_.w0, g_.h0 * g_.w0, col1_.as<float>(), s);
  awaitLayer(0);
  // z1 [c1 x (batch hw1)] = W1 [c1 x kk] col1 [kk x (batch hw1)] + b1, then ReLU and pool.
  device::broadcastBias(p[kConv1B].device_value, g_.c1, batch * hw1, g_.c1 * batch * hw1, z1_.as<float>(), s);
  device::gemm(cublas(), false, false, g_.c1, batch * hw1, kKK, 1.0f, p[kConv1W].device_value, col1_.as<const float>(),
               1.0f, z1_.as<float>());
  device::relu(z1_.as<float>(), g_.c1 * batch * hw1, s);
  device::maxPool2(z1_.as<const float>(), batch, g_.c1, g_.h1, g_.w1, p1_.as<float>(), arg1_.as<int32_t>(), s);

  device::im2col(p1_.as<const float>(), batch, g_.c1, g_.hp1, g_.wp1, kK, g_.c1 * hwp1, hwp1, col2_.as<float>(), s);
  awaitLayer(1);
  device::broadcastBias(p[kConv2B].device_value, g_.c2, batch * hw2, g_.c2 * batch * hw2, z2_.as<float>(), s);
  device::gemm(cublas(), false, false, g_.c2, batch * hw2, g_.c1 * kKK, 1.0f, p[kConv2W].device_value,
               col2_.as<const float>(), 1.0f, z2_.as<float>());
  device::relu(z2_.as<float>(), g_.c2 * batch * hw2, s);
  device::maxPool2(z2_.as<const float>(), batch, g_.c2, g_.h2, g_.w2, p2_.as<float>(), arg2_.as<int32_t>(), s);

  awaitLayer(2);
  device::broadcastBias(p[kFcB].device_value, g_.classes, 1, batch * g_.classes, logits_.as<float>(), s);
  device::gemm(cublas(), false, true, batch, g_.classes, g_.fc_in, 1.0f, p2_.as<const float>(), p[kFcW].device_value,
               1.0f, logits_.as<float>());
}

double CnnCudaWorkload::forwardBackward(std::span<const int64_t> batch_indices,
                                        const train::LayerReadyFn& on_layer_ready) {
  const cuda::DeviceGuard guard(device());
  checkBatch(batch_indices, hostData().train.num_examples);
  const auto batch = static_cast<int64_t>(batch_indices.size());
  reserve(batch);
  const cudaStream_t s = stream();
  const int64_t* idx = uploadBatch(batch_indices);
  device::gatherRows(deviceData().train().x(), deviceData().train().y(), idx, batch, g_.h0 * g_.w0, x_.as<float>(),
                     labels_.as<int32_t>(), s);
  forward(x_.as<const float>(), batch);
  device::softmaxCrossEntropy(logits_.as<const float>(), labels_.as<const int32_t>(), batch, g_.classes,
                              1.0f / static_cast<float>(batch), dlogits_.as<float>(), exampleLoss(), exampleCorrect(),
                              s);
  enqueueLossSum(batch);

  const int64_t hw1 = g_.h1 * g_.w1, hwp1 = g_.hp1 * g_.wp1, hw2 = g_.h2 * g_.w2;
  auto p = params();

  // Layer 2, fc: dW = dlogits^T p2, db = column sums; then the gradient w.r.t. its input, which reads W and so comes
  // before the layer's event (once reported, the caller may update W in place).
  device::gemm(cublas(), true, false, g_.classes, g_.fc_in, batch, 1.0f, dlogits_.as<const float>(),
               p2_.as<const float>(), 0.0f, p[kFcW].device_grad);
  device::columnSums(dlogits_.as<const float>(), batch, g_.classes, p[kFcB].device_grad, s);
  device::gemm(cublas(), false, false, batch, g_.fc_in, g_.classes, 1.0f, dlogits_.as<const float>(),
               p[kFcW].device_value, 0.0f, dp2_.as<float>());
  layerDone(2);

  // Layer 1, conv2: through pool 2 and its ReLU; dW = dz2 col2^T and db = row sums of dz2 over the whole batch; the
  // gradient w.r.t. its input (dcol2 = W2^T dz2, folded back by col2im) reads W2, so it too precedes the event.
  device::maxPool2Backward(dp2_.as<const float>(), arg2_.as<const int32_t>(), z2_.as<const float>(), batch, g_.c2,
                           g_.h2, g_.w2, dz2_.as<float>(), s);
  device::gemm(cublas(), false, true, g_.c2, g_.c1 * kKK, batch * hw2, 1.0f, dz2_.as<const float>(),
               col2_.as<const float>(), 0.0f, p[kConv2W].device_grad);
  device::rowSums(dz2_.as<const float>(), g_.c2, batch * hw2, p[kConv2B].device_grad, s);
  device::gemm(cublas(), true, false, g_.c1 * kKK, batch * hw2, g_.c2, 1.0f, p[kConv2W].device_value,
               dz2_.as<const float>(), 0.0f, dcol2_.as<float>());
  device::col2im(dcol2_.as<const float>(), batch, g_.c1, g_.hp1, g_.wp1, kK, g_.c1 * hwp1, hwp1, dp1_.as<float>(), s);
  layerDone(1);
  reportWhenDone(on_layer_ready, 2);  // while the GPU runs layer 1's backward

  // Layer 0, conv1: through pool 1 and its ReLU, then the same sums.
  device::maxPool2Backward(dp1_.as<const float>(), arg1_.as<const int32_t>(), z1_.as<const float>(), batch, g_.c1,
                           g_.h1, g_.w1, dz1_.as<float>(), s);
  device::gemm(cublas(), false, true, g_.c1, kKK, batch * hw1, 1.0f, dz1_.as<const float>(), col1_.as<const float>(),
               0.0f, p[kConv1W].device_grad);
  device::rowSums(dz1_.as<const float>(), g_.c1, batch * hw1, p[kConv1B].device_grad, s);
  layerDone(0);
  reportWhenDone(on_layer_ready, 1);
  reportWhenDone(on_layer_ready, 0);
  synchronize();  // every device_grad complete, and the loss sum on the host
  return lossSum() / static_cast<double>(batch);
}

train::EvalResult CnnCudaWorkload::evaluate(int64_t max_examples) {
  return evaluateInChunks(
      max_examples, kEvalChunk, g_.classes, [this](int64_t rows) { reserve(rows); },
      [this](const float* x, int64_t rows) {
        forward(x, rows);
        return logits_.as<const float>();
      });
}

}  // namespace terse::workloads

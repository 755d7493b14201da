#include "experiments/workloads/cnn.h"

#include <algorithm>
#include <utility>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {
namespace {

constexpr std::size_t kConv1W = 0, kConv1B = 1, kConv2W = 2, kConv2B = 3;  // then weight, bias per dense layer

std::size_t sz(int64_t v) {
  return static_cast<std::size_t>(v);
}

// Unfolds src [c x h x w] into dst [(c*k*k) x (ho*wo)] for a valid k x k convolution, so the convolution is one GEMM.
void im2col(const float* src, int64_t c, int64_t h, int64_t w, int64_t k, float* dst) {
  const int64_t ho = h - k + 1, wo = w - k + 1;
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t kj = 0; kj < k; ++kj) {
        float* row = dst + ((ch * k + ki) * k + kj) * ho * wo;
        for (int64_t oi = 0; oi < ho; ++oi) {
          const float* in = src + (ch * h + oi + ki) * w + kj;
          std::copy(in, in + wo, row + oi * wo);
        }
      }
}

// The adjoint of im2col: accumulates dcol back onto dsrc (which the caller zeroes).
void col2im(const float* dcol, int64_t c, int64_t h, int64_t w, int64_t k, float* dsrc) {
  const int64_t ho = h - k + 1, wo = w - k + 1;
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t kj = 0; kj < k; ++kj) {
        const float* row = dcol + ((ch * k + ki) * k + kj) * ho * wo;
        for (int64_t oi = 0; oi < ho; ++oi) {
          float* out = dsrc + (ch * h + oi + ki) * w + kj;
          for (int64_t oj = 0; oj < wo; ++oj) out[oj] += row[oi * wo + oj];
        }
      }
}

// dst [c x (h*w)] = W [c x ckk] * col [ckk x (h*w)] + b, then ReLU.
void convForward(const float* weight, const float* bias, const float* col, int64_t c_out, int64_t ckk, int64_t hw,
                 float* dst) {
  for (int64_t o = 0; o < c_out; ++o) std::fill(dst + o * hw, dst + (o + 1) * hw, bias[o]);
  gemm(false, false, c_out, hw, ckk, 1.0f, weight, col, 1.0f, dst);
  for (int64_t i = 0; i < c_out * hw; ++i) dst[i] = std::max(dst[i], 0.0f);
}

// 2x2 max-pool with stride 2 over src [c x h x w]; arg records the flat index of each winner within src.
void maxPool2(const float* src, int64_t c, int64_t h, int64_t w, float* dst, int32_t* arg) {
  const int64_t ho = h / 2, wo = w / 2;
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j) {
        int64_t best = (ch * h + 2 * i) * w + 2 * j;
        for (int64_t di = 0; di < 2; ++di)
          for (int64_t dj = 0; dj < 2; ++dj) {
            const int64_t at = (ch * h + 2 * i + di) * w + 2 * j + dj;
            if (src[at] > src[best]) best = at;
          }
        const int64_t o = (ch * ho + i) * wo + j;
        dst[o] = src[best];
        arg[o] = static_cast<int32_t>(best);
      }
}

// Routes the pooled gradient to the winners and applies the ReLU mask of the pre-pool activation z (zeroes dz
// first). A winner with z == 0 was a clamped ReLU, whose gradient is 0.
void maxPool2Backward(const float* dpool, const int32_t* arg, int64_t pooled, const float* z, int64_t unpooled,
                      float* dz) {
  std::fill(dz, dz + unpooled, 0.0f);
  for (int64_t o = 0; o < pooled; ++o)
    if (z[arg[o]] > 0.0f) dz[arg[o]] += dpool[o];
}

}  // namespace

CnnGeometry cnnGeometry(const std::shared_ptr<const DataSplit>& data, const CnnShape& shape) {
  constexpr int64_t kKernel = CnnWorkload::kKernel;
  TERSE_CHECK(data != nullptr, InvalidArgument, "cnn needs a data set");
  const Dataset& train = data->train;
  TERSE_CHECK(train.num_examples > 0 && train.num_classes >= 2, InvalidArgument,
              "cnn needs a non-empty classification training set");
  TERSE_CHECK(train.rows > 0 && train.cols > 0 && train.rows * train.cols == train.dims, InvalidArgument,
              "cnn needs single-channel images; the data set has " << train.dims << " features of shape " << train.rows
                                                                   << "x" << train.cols);
  TERSE_CHECK(data->test.rows == train.rows && data->test.cols == train.cols, InvalidArgument,
              "cnn: test images are " << data->test.rows << "x" << data->test.cols << ", training images " << train.rows
                                      << "x" << train.cols);
  TERSE_CHECK(
      shape.conv1_channels > 0 && shape.conv2_channels > 0, InvalidArgument,
      "cnn: conv_channels must be positive, got [" << shape.conv1_channels << ", " << shape.conv2_channels << "]");
  for (int64_t h : shape.hidden)
    TERSE_CHECK(h > 0, InvalidArgument, "cnn: hidden layer sizes must be positive, got " << h);
  TERSE_CHECK(shape.dropout >= 0 && shape.dropout < 1, InvalidArgument,
              "cnn: dropout must be in [0, 1), got " << shape.dropout);
  CnnGeometry g{};
  g.h0 = train.rows;
  g.w0 = train.cols;
  g.h1 = g.h0 - kKernel + 1;
  g.w1 = g.w0 - kKernel + 1;
  g.hp1 = g.h1 / 2;
  g.wp1 = g.w1 / 2;
  g.h2 = g.hp1 - kKernel + 1;
  g.w2 = g.wp1 - kKernel + 1;
  g.hp2 = g.h2 / 2;
  g.wp2 = g.w2 / 2;
  TERSE_CHECK(
      g.h1 > 0 && g.w1 > 0 && g.h1 % 2 == 0 && g.w1 % 2 == 0 && g.h2 > 0 && g.w2 > 0 && g.h2 % 2 == 0 && g.w2 % 2 == 0,
      InvalidArgument,
      "cnn: " << g.h0 << "x" << g.w0 << " images do not give even-sided conv outputs for 2x2 pooling "
              << "(sides n with n - 4 and (n - 4) / 2 - 4 positive and even, e.g. 16 or 28)");
  g.c1 = shape.conv1_channels;
  g.c2 = shape.conv2_channels;
  g.hidden = shape.hidden;
  g.fc_in = g.c2 * g.hp2 * g.wp2;
  g.classes = train.num_classes;
  return g;
}

std::vector<ParamSpec> cnnParams(const CnnGeometry& g, uint64_t seed) {
  constexpr int64_t kKernel = CnnWorkload::kKernel;
  // Counted in double before anything is allocated: a config with huge widths gets the error, not a bad_alloc.
  double count = static_cast<double>(g.c1) * (kKernel * kKernel + 1) +
                 static_cast<double>(g.c2) * (static_cast<double>(g.c1) * kKernel * kKernel + 1);
  int64_t in = g.fc_in;
  for (int64_t h : g.hidden) {
    count += static_cast<double>(h) * (static_cast<double>(in) + 1);
    in = h;
  }
  count += static_cast<double>(g.classes) * (static_cast<double>(in) + 1);
  TERSE_CHECK(count < static_cast<double>(CnnWorkload::kMaxParameters), InvalidArgument,
              "cnn on " << g.h0 << "x" << g.w0 << " images with conv_channels [" << g.c1 << ", " << g.c2 << "] and "
                        << g.hidden.size() << " hidden layer(s) has " << count << " parameters, over the "
                        << CnnWorkload::kMaxParameters << " this workload is meant to stay under");
  auto zeros = [](int64_t n) { return std::vector<float>(sz(n)); };
  std::vector<ParamSpec> specs;
  specs.push_back({"conv1.weight", {g.c1, 1, kKernel, kKernel}, 0, zeros(g.c1 * kKernel * kKernel)});
  specs.push_back({"conv1.bias", {g.c1}, 0, zeros(g.c1)});
  specs.push_back({"conv2.weight", {g.c2, g.c1, kKernel, kKernel}, 1, zeros(g.c2 * g.c1 * kKernel * kKernel)});
  specs.push_back({"conv2.bias", {g.c2}, 1, zeros(g.c2)});
  train::SeededRng rng1(seed, 0), rng2(seed, 1);
  initHeNormal(specs[kConv1W].value, kKernel * kKernel, rng1);
  initHeNormal(specs[kConv2W].value, g.c1 * kKernel * kKernel, rng2);
  // Streams 2, 3, ...: the classifier of the model without hidden layers keeps stream 2, so its weights for a seed
  // are what they were before hidden layers existed.
  in = g.fc_in;
  for (std::size_t i = 0; i <= g.hidden.size(); ++i) {
    const bool classifier = i == g.hidden.size();
    const int64_t out = classifier ? g.classes : g.hidden[i];
    const std::string prefix = classifier ? std::string("fc") : "hidden" + std::to_string(i);
    const int layer = 2 + static_cast<int>(i);
    ParamSpec w{prefix + ".weight", {out, in}, layer, zeros(out * in)};
    train::SeededRng rng(seed, 2 + i);
    if (classifier)
      initGlorotUniform(w.value, in, out, rng);
    else
      initHeNormal(w.value, in, rng);
    specs.push_back(std::move(w));
    specs.push_back({prefix + ".bias", {out}, layer, zeros(out)});
    in = out;
  }
  return specs;
}

CnnWorkload::CnnWorkload(std::shared_ptr<const DataSplit> data, const CnnShape& shape, uint64_t seed)
    : data_(std::move(data)), dropout_(shape.dropout), seed_(seed) {
  const CnnGeometry g = cnnGeometry(data_, shape);
  h0_ = g.h0;
  w0_ = g.w0;
  h1_ = g.h1;
  w1_ = g.w1;
  hp1_ = g.hp1;
  wp1_ = g.wp1;
  h2_ = g.h2;
  w2_ = g.w2;
  hp2_ = g.hp2;
  wp2_ = g.wp2;
  c1_ = g.c1;
  c2_ = g.c2;
  classes_ = g.classes;
  widths_.push_back(g.fc_in);
  widths_.insert(widths_.end(), g.hidden.begin(), g.hidden.end());
  widths_.push_back(g.classes);
  for (ParamSpec& spec : cnnParams(g, seed)) {
    // Two statements: params() must be read after addParam, which may move the tensors.
    const std::size_t t = addParam(std::move(spec.name), std::move(spec.shape), spec.layer);
    params()[t].value = std::move(spec.value);
  }
  acts_.resize(widths_.size());
  masks_.resize(widths_.size() - 2);
}

void CnnWorkload::reserve(int64_t batch) {
  if (batch <= capacity_) return;
  capacity_ = batch;
  const int64_t kk = kKernel * kKernel;
  x_.resize(sz(batch * h0_ * w0_));
  col1_.resize(sz(batch * kk * h1_ * w1_));
  z1_.resize(sz(batch * c1_ * h1_ * w1_));
  p1_.resize(sz(batch * c1_ * hp1_ * wp1_));
  arg1_.resize(p1_.size());
  col2_.resize(sz(batch * c1_ * kk * h2_ * w2_));
  z2_.resize(sz(batch * c2_ * h2_ * w2_));
  for (std::size_t i = 0; i < acts_.size(); ++i) acts_[i].resize(sz(batch * widths_[i]));
  for (std::size_t i = 0; i < masks_.size(); ++i) masks_[i].resize(sz(batch * widths_[i + 1]));
  arg2_.resize(acts_[0].size());
  labels_.resize(sz(batch));
  const int64_t widest = *std::max_element(widths_.begin(), widths_.end());
  delta_.resize(sz(batch * widest));
  delta_prev_.resize(delta_.size());
  dz2_.resize(z2_.size());
  dcol2_.resize(sz(c1_ * kk * h2_ * w2_));  // one image at a time
  dp1_.resize(p1_.size());
  dz1_.resize(z1_.size());
}

void CnnWorkload::denseForward(std::size_t i, int64_t batch, bool training) {
  const int64_t in = widths_[i], out = widths_[i + 1];
  const std::vector<float>& w = params()[kConv2B + 1 + 2 * i].value;
  const std::vector<float>& b = params()[kConv2B + 2 + 2 * i].value;
  float* y = acts_[i + 1].data();
  // Broadcast the bias first so the GEMM accumulates onto it (beta = 1).
  for (int64_t n = 0; n < batch; ++n) std::copy(b.begin(), b.end(), y + n * out);
  gemm(false, true, batch, out, in, 1.0f, acts_[i].data(), w.data(), 1.0f, y);
  if (i + 1 == widths_.size() - 1) return;  // the classifier's logits
  for (int64_t k = 0; k < batch * out; ++k) y[k] = std::max(y[k], 0.0f);
  if (!training || dropout_ <= 0) return;
  train::SeededRng rng(seed_, (forward_passes_ << 8) + i + 0x44524F50ull);  // "DROP": apart from the init streams
  const float keep_scale = static_cast<float>(1.0 / (1.0 - dropout_));
  float* mask = masks_[i].data();
  for (int64_t k = 0; k < batch * out; ++k) {
    mask[k] = rng.uniform() < dropout_ ? 0.0f : keep_scale;
    y[k] *= mask[k];
  }
}

void CnnWorkload::forward(int64_t batch, bool training) {
  const int64_t kk = kKernel * kKernel;
  const int64_t hw1 = h1_ * w1_, hwp1 = hp1_ * wp1_, hw2 = h2_ * w2_;
  const int64_t fc_in = widths_[0];
  // Layer by layer over the whole batch (every buffer holds the batch), so that each layer waits for its own update
  // only (awaitLayer) and the first layer's compute overlaps the later layers' communication.
  awaitLayer(0);
  const float* w1 = params()[kConv1W].value.data();
  const float* b1 = params()[kConv1B].value.data();
  for (int64_t n = 0; n < batch; ++n) {
    float* col1 = col1_.data() + n * kk * hw1;
    float* z1 = z1_.data() + n * c1_ * hw1;
    float* p1 = p1_.data() + n * c1_ * hwp1;
    im2col(x_.data() + n * h0_ * w0_, 1, h0_, w0_, kKernel, col1);
    convForward(w1, b1, col1, c1_, kk, hw1, z1);
    maxPool2(z1, c1_, h1_, w1_, p1, arg1_.data() + n * c1_ * hwp1);
  }
  awaitLayer(1);
  const float* w2 = params()[kConv2W].value.data();
  const float* b2 = params()[kConv2B].value.data();
  for (int64_t n = 0; n < batch; ++n) {
    float* p1 = p1_.data() + n * c1_ * hwp1;
    float* col2 = col2_.data() + n * c1_ * kk * hw2;
    float* z2 = z2_.data() + n * c2_ * hw2;
    im2col(p1, c1_, hp1_, wp1_, kKernel, col2);
    convForward(w2, b2, col2, c2_, c1_ * kk, hw2, z2);
    maxPool2(z2, c2_, h2_, w2_, acts_[0].data() + n * fc_in, arg2_.data() + n * fc_in);
  }
  for (std::size_t i = 0; i + 1 < widths_.size(); ++i) {
    awaitLayer(2 + static_cast<int>(i));
    denseForward(i, batch, training);
  }
  if (training) ++forward_passes_;
}

double CnnWorkload::forwardBackward(std::span<const int64_t> batch_indices, const train::LayerReadyFn& on_layer_ready) {
  const Dataset& train = data_->train;
  checkBatch(batch_indices, train.num_examples);
  const auto batch = static_cast<int64_t>(batch_indices.size());
  reserve(batch);
  gatherBatch(train, batch_indices, x_.data(), labels_.data());
  forward(batch, true);
  int64_t correct = 0;
  const double loss = softmaxCrossEntropy(acts_.back().data(), labels_.data(), batch, classes_,
                                          1.0f / static_cast<float>(batch), delta_.data(), &correct);

  const int64_t kk = kKernel * kKernel;
  const int64_t hw1 = h1_ * w1_, hwp1 = hp1_ * wp1_, hw2 = h2_ * w2_;
  const int64_t fc_in = widths_[0];
  auto p = params();

  // The fully-connected layers, last first: dW = delta^T x, db = column sums; then the gradient w.r.t. the input, which
  // for a hidden layer's input goes back through its dropout mask and ReLU. Every read of a layer's values happens
  // before its report: afterwards the caller may update them in place.
  for (std::size_t i = widths_.size() - 1; i-- > 0;) {
    const int64_t in = widths_[i], out = widths_[i + 1];
    train::ParamTensor& w = p[kConv2B + 1 + 2 * i];
    train::ParamTensor& b = p[kConv2B + 2 + 2 * i];
    gemm(true, false, out, in, batch, 1.0f, delta_.data(), acts_[i].data(), 0.0f, w.grad.data());
    std::fill(b.grad.begin(), b.grad.end(), 0.0f);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t o = 0; o < out; ++o) b.grad[sz(o)] += delta_[sz(n * out + o)];
    gemm(false, false, batch, in, out, 1.0f, delta_.data(), w.value.data(), 0.0f, delta_prev_.data());
    reportLayer(on_layer_ready, 2 + static_cast<int>(i));
    if (i > 0) {
      // acts_[i] is hidden layer i-1's output after ReLU and dropout: zero where either cut it, else scaled by the
      // mask.
      const float* a = acts_[i].data();
      const bool dropped = dropout_ > 0;
      const float* mask = dropped ? masks_[i - 1].data() : nullptr;
      for (int64_t k = 0; k < batch * in; ++k) {
        if (a[k] <= 0.0f)
          delta_prev_[sz(k)] = 0.0f;
        else if (dropped)
          delta_prev_[sz(k)] *= mask[k];
      }
    }
    std::swap(delta_, delta_prev_);
  }
  // delta_ now holds the gradient w.r.t. the pooled conv2 output.

  // Layer 1, conv2: per image, dW += dz2 col2^T and db += row sums of dz2; and the gradient w.r.t. its input
  // (dcol = W2^T dz2, col2im), which reads W2 and so comes before the report.
  std::fill(p[kConv2B].grad.begin(), p[kConv2B].grad.end(), 0.0f);
  for (int64_t n = 0; n < batch; ++n) {
    float* dz2 = dz2_.data() + n * c2_ * hw2;
    maxPool2Backward(delta_.data() + n * fc_in, arg2_.data() + n * fc_in, fc_in, z2_.data() + n * c2_ * hw2, c2_ * hw2,
                     dz2);
    gemm(false, true, c2_, c1_ * kk, hw2, 1.0f, dz2, col2_.data() + n * c1_ * kk * hw2, n == 0 ? 0.0f : 1.0f,
         p[kConv2W].grad.data());
    for (int64_t c = 0; c < c2_; ++c)
      for (int64_t i = 0; i < hw2; ++i) p[kConv2B].grad[sz(c)] += dz2[c * hw2 + i];
    float* dp1 = dp1_.data() + n * c1_ * hwp1;
    gemm(true, false, c1_ * kk, hw2, c2_, 1.0f, p[kConv2W].value.data(), dz2, 0.0f, dcol2_.data());
    std::fill(dp1, dp1 + c1_ * hwp1, 0.0f);
    col2im(dcol2_.data(), c1_, hp1_, wp1_, kKernel, dp1);
  }
  reportLayer(on_layer_ready, 1);

  // Layer 0, conv1: through pool 1 and the ReLU, then the same sums.
  std::fill(p[kConv1B].grad.begin(), p[kConv1B].grad.end(), 0.0f);
  for (int64_t n = 0; n < batch; ++n) {
    float* dz1 = dz1_.data() + n * c1_ * hw1;
    maxPool2Backward(dp1_.data() + n * c1_ * hwp1, arg1_.data() + n * c1_ * hwp1, c1_ * hwp1,
                     z1_.data() + n * c1_ * hw1, c1_ * hw1, dz1);
    gemm(false, true, c1_, kk, hw1, 1.0f, dz1, col1_.data() + n * kk * hw1, n == 0 ? 0.0f : 1.0f,
         p[kConv1W].grad.data());
    for (int64_t c = 0; c < c1_; ++c)
      for (int64_t i = 0; i < hw1; ++i) p[kConv1B].grad[sz(c)] += dz1[c * hw1 + i];
  }
  reportLayer(on_layer_ready, 0);
  return loss / static_cast<double>(batch);
}

train::EvalResult CnnWorkload::evaluate(int64_t max_examples) {
  const Dataset& test = data_->test;
  const int64_t n = max_examples > 0 ? std::min(max_examples, test.num_examples) : test.num_examples;
  constexpr int64_t kChunk = 256;  // bounds the activation buffers evaluation needs
  reserve(std::min(n, kChunk));
  double loss = 0.0;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t rows = std::min(kChunk, n - start);
    std::copy(test.example(start), test.example(start + rows), x_.data());
    forward(rows, false);
    loss +=
        softmaxCrossEntropy(acts_.back().data(), test.labels.data() + start, rows, classes_, 0.0f, nullptr, &correct);
  }
  if (n == 0) return {};
  return {loss / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n), n};
}

train::LayerFlops CnnWorkload::layerFlops(int layer) const {
  const train::LayerFlops dense = Workload::layerFlops(layer);
  const double positions = layer == 0   ? static_cast<double>(h1_ * w1_)
                           : layer == 1 ? static_cast<double>(h2_ * w2_)
                                        : 1.0;  // the fully-connected layers
  return train::LayerFlops{dense.forward * positions, dense.backward * positions};
}

}  // namespace terse::workloads

// SGD (momentum, Nesterov, weight decay) and the learning-rate schedules against values computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/common/error.h"
#include "core/train/optimizer.h"
#include "core/train/sgd_math.h"

namespace terse::train {
namespace {

std::vector<ParamTensor> oneTensor(std::vector<float> value, std::vector<float> grad) {
  std::vector<ParamTensor> p(1);
  p[0].name = "w";
  p[0].shape = {static_cast<int64_t>(value.size())};
  p[0].value = std::move(value);
  p[0].grad = std::move(grad);
  return p;
}

TEST(Optimizer, PlainSgd) {
  auto p = oneTensor({1.0f, -2.0f}, {0.5f, 1.0f});
  SgdOptimizer opt(p, {});
  opt.update(0, p[0], 0.1);
  EXPECT_FLOAT_EQ(p[0].value[0], 0.95f);
  EXPECT_FLOAT_EQ(p[0].value[1], -2.1f);
}

TEST(Optimizer, HeavyBallMomentum) {
  // g = 1 every step: b1 = 1, w = -0.1; b2 = 0.9 + 1 = 1.9, w = -0.29; b3 = 2.71, w = -0.561.
  auto p = oneTensor({0.0f}, {1.0f});
  SgdOptimizer opt(p, {.momentum = 0.9});
  opt.update(0, p[0], 0.1);
  EXPECT_NEAR(p[0].value[0], -0.1, 1e-6);
  opt.update(0, p[0], 0.1);
  EXPECT_NEAR(p[0].value[0], -0.29, 1e-6);
  opt.update(0, p[0], 0.1);
  EXPECT_NEAR(p[0].value[0], -0.561, 1e-6);
}

TEST(Optimizer, Nesterov) {
  // d = g + m * b: b1 = 1, d1 = 1.9, w = -0.19; b2 = 1.9, d2 = 1 + 1.71 = 2.71, w = -0.461.
  auto p = oneTensor({0.0f}, {1.0f});
  SgdOptimizer opt(p, {.momentum = 0.9, .nesterov = true});
  opt.update(0, p[0], 0.1);
  EXPECT_NEAR(p[0].value[0], -0.19, 1e-6);
  opt.update(0, p[0], 0.1);
  EXPECT_NEAR(p[0].value[0], -0.461, 1e-6);
}

TEST(Optimizer, WeightDecay) {
  // g = 0 + 0.1 * 2 = 0.2, w = 2 - 0.5 * 0.2 = 1.9; with momentum the decayed gradient enters the buffer.
  auto p = oneTensor({2.0f}, {0.0f});
  SgdOptimizer opt(p, {.weight_decay = 0.1});
  opt.update(0, p[0], 0.5);
  EXPECT_NEAR(p[0].value[0], 1.9, 1e-6);
  auto q = oneTensor({2.0f}, {0.0f});
  SgdOptimizer mopt(q, {.momentum = 0.5, .weight_decay = 0.1});
  mopt.update(0, q[0], 0.5);  // b = 0.2, w = 1.9
  mopt.update(0, q[0], 0.5);  // g = 0.19, b = 0.1 + 0.19 = 0.29, w = 1.9 - 0.145 = 1.755
  EXPECT_NEAR(q[0].value[0], 1.755, 1e-6);
}

TEST(Optimizer, Adagrad) {
  // g = 3 then 4: G = 9, w = 1 - 0.5 * 3 / 3 = 0.5; G = 25, w = 0.5 - 0.5 * 4 / 5 = 0.1. A zero gradient changes
  // nothing, which makes updateRows over the touched rows equal to update over all of them.
  auto p = oneTensor({1.0f, 7.0f}, {3.0f, 0.0f});
  SgdOptions o;
  o.adagrad = true;
  SgdOptimizer opt(p, o);
  opt.update(0, p[0], 0.5);
  EXPECT_FLOAT_EQ(p[0].value[0], 0.5f);
  EXPECT_EQ(p[0].value[1], 7.0f);
  p[0].grad = {4.0f, 0.0f};
  const std::vector<int64_t> rows = {0};
  opt.updateRows(0, p[0], 0.5, rows);
  EXPECT_FLOAT_EQ(p[0].value[0], 0.1f);
  EXPECT_EQ(p[0].value[1], 7.0f);
  EXPECT_THROW(SgdOptimizer(p, {.momentum = 0.9, .adagrad = true}), InvalidArgument);
  EXPECT_THROW(SgdOptimizer(p, {.momentum = 0.9}).updateRows(0, p[0], 0.1, rows), InvalidArgument);
}

TEST(Optimizer, RejectsBadOptions) {
  auto p = oneTensor({0.0f}, {0.0f});
  EXPECT_THROW(SgdOptimizer(p, {.momentum = 1.0}), InvalidArgument);
  EXPECT_THROW(SgdOptimizer(p, {.nesterov = true}), InvalidArgument);
  EXPECT_THROW(SgdOptimizer(p, {.weight_decay = -1}), InvalidArgument);
}

TEST(LrSchedule, LinearWarmup) {
  LrScheduleOptions o;
  o.lr = 0.1;
  o.warmup_steps = 4;
  o.total_steps = 100;
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.025);
  EXPECT_DOUBLE_EQ(learningRate(o, 1), 0.05);
  EXPECT_DOUBLE_EQ(learningRate(o, 2), 0.075);
  EXPECT_DOUBLE_EQ(learningRate(o, 3), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(o, 50), 0.1);
}

TEST(LrSchedule, Cosine) {
  LrScheduleOptions o;
  o.lr = 1.0;
  o.schedule = LrSchedule::kCosine;
  o.warmup_steps = 2;
  o.total_steps = 12;
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.5);    // warm-up
  EXPECT_DOUBLE_EQ(learningRate(o, 2), 1.0);    // cosine starts at the full rate
  EXPECT_NEAR(learningRate(o, 7), 0.5, 1e-12);  // half way through the 10 cosine steps
  EXPECT_NEAR(learningRate(o, 12), 0.0, 1e-12);
  EXPECT_NEAR(learningRate(o, 4), 0.5 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-12);
}

TEST(LrSchedule, StepMilestones) {
  LrScheduleOptions o{.lr = 1.0,
                      .schedule = LrSchedule::kStep,
                      .milestones = {2, 4},
                      .gamma = 0.1,
                      .steps_per_epoch = 10,
                      .total_steps = 60};
  EXPECT_DOUBLE_EQ(learningRate(o, 19), 1.0);
  EXPECT_NEAR(learningRate(o, 20), 0.1, 1e-12);
  EXPECT_NEAR(learningRate(o, 39), 0.1, 1e-12);
  EXPECT_NEAR(learningRate(o, 40), 0.01, 1e-12);
}

TEST(LrSchedule, ScaleByWorldSize) {
  LrScheduleOptions o;
  o.lr = 0.1;
  o.scale_by_world_size = true;
  o.world_size = 4;
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.4);
  o.milestones = {3, 2};
  o.schedule = LrSchedule::kStep;
  EXPECT_THROW(validateLrSchedule(o), InvalidArgument);
}

// The per-element math the CUDA kernel shares (sgd_math.h) is the loop's: checked against the formulas written out.
TEST(Optimizer, SharedMathIsTheDocumentedUpdate) {
  EXPECT_EQ(sgdPlain(1.0f, 0.5f, 0.1f, 0.01f), 1.0f - 0.1f * (0.5f + 0.01f * 1.0f));
  float w = 1.0f, b = 0.25f;
  sgdMomentum(w, b, 0.5f, 0.1f, 0.01f, 0.9f, false);
  const float g = 0.5f + 0.01f * 1.0f;
  EXPECT_EQ(b, 0.9f * 0.25f + g);
  EXPECT_EQ(w, 1.0f - 0.1f * (0.9f * 0.25f + g));
  w = 1.0f;
  b = 0.25f;
  sgdMomentum(w, b, 0.5f, 0.1f, 0.01f, 0.9f, true);
  EXPECT_EQ(w, 1.0f - 0.1f * (g + 0.9f * (0.9f * 0.25f + g)));
}

// Device tensors (a GPU workload's) are all-or-nothing and need the stream their updates are ordered on; both are
// checked before anything is allocated, so these run without a GPU.
TEST(Optimizer, DeviceTensorsNeedAStreamAndNoHostMix) {
  float fake_device_memory[2] = {};
  auto p = oneTensor({1.0f, -2.0f}, {0.5f, 1.0f});
  p.push_back(p[0]);
  p[1].name = "v";
  p[0].device_value = fake_device_memory;
  p[0].device_grad = fake_device_memory;
  EXPECT_THROW(SgdOptimizer(p, {}), InvalidArgument);  // tensor v is on the host
  p[1].device_value = fake_device_memory;
  p[1].device_grad = fake_device_memory;
  EXPECT_THROW(SgdOptimizer(p, {}), InvalidArgument);  // no stream
}

}  // namespace
}  // namespace terse::train

// The updates a trainer waits for (core/train/update_gates.h): a layer's gate opens only once every tensor of the layer
// has the step's update, a step's wait only once every layer has, a later step's update opens an earlier step's waits,
// a layer the workload does not have is refused naming it, and the first failure -- not a later one -- reaches every
// wait, woken or still to come.
#include "core/train/update_gates.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/common/error.h"

namespace terse::train {
namespace {

// Tensors 0, 1 in layer 0; 2 in layer 1; 3, 4 in layer 2. Nothing runs forward or backward.
class ThreeLayers final : public Workload {
 public:
  ThreeLayers() {
    addParam("a", {3}, 0);
    addParam("b", {1}, 0);
    addParam("c", {2}, 1);
    addParam("d", {4}, 2);
    addParam("e", {5}, 2);
  }
  std::string_view name() const override { return "three-layers"; }
  int64_t numTrainExamples() const override { return 0; }
  double forwardBackward(std::span<const int64_t>, const LayerReadyFn&) override {
    throw std::logic_error("not trained here");
  }
  EvalResult evaluate(int64_t) override { return {}; }
};

// Runs `wait` on a thread; done() says whether it returned yet.
class Waiter {
 public:
  explicit Waiter(std::function<void()> wait)
      : thread_([this, wait = std::move(wait)] {
          try {
            wait();
          } catch (const std::exception& e) {
            error_ = e.what();
          }
          done_.store(true);
        }) {}
  ~Waiter() { join(); }
  bool doneAfter(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
    return done_.load();
  }
  std::string join() {
    if (thread_.joinable()) thread_.join();
    return error_;
  }

 private:
  std::atomic<bool> done_{false};
  std::string error_;
  std::thread thread_;
};

TEST(UpdateGates, ALayerOpensWhenAllItsTensorsHaveTheStep) {
  ThreeLayers w;
  UpdateGates g(w);
  Waiter layer2([&] { g.awaitLayer(2, 0); });
  Waiter step([&] { g.awaitStep(0); });
  const std::size_t d[] = {3};
  g.markApplied(0, d);
  EXPECT_FALSE(layer2.doneAfter(std::chrono::milliseconds(30))) << "layer 2 opened with one of its two tensors";
  const std::size_t e_and_a[] = {4, 0};
  g.markApplied(0, e_and_a);
  EXPECT_EQ(layer2.join(), "");
  EXPECT_FALSE(step.doneAfter(std::chrono::milliseconds(30))) << "the step's wait returned with layers 0 and 1 open";
  const std::size_t b_and_c[] = {1, 2};
  g.markApplied(0, b_and_c);
  EXPECT_EQ(step.join(), "");
  // Open waits return at once; a later step's update also opens an earlier step's waits.
  EXPECT_GE(g.awaitStep(0), 0.0);
  const std::size_t all[] = {0, 1, 2, 3, 4};
  g.markApplied(5, all);
  g.awaitStep(3);
  g.awaitLayer(1, 5);
  const auto [t0, t1] = g.awaitLayer(0, 5);
  EXPECT_LE(t0, t1);
}

TEST(UpdateGates, ALayerTheWorkloadLacksIsRefusedByName) {
  ThreeLayers w;
  UpdateGates g(w);
  for (int bad : {-1, 3}) {
    try {
      g.awaitLayer(bad, 0);
      FAIL() << "awaited layer " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("workload 'three-layers' awaited layer " + std::to_string(bad) + " of 3"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(UpdateGates, TheFirstFailureReachesEveryWait) {
  ThreeLayers w;
  UpdateGates g(w);
  Waiter layer([&] { g.awaitLayer(1, 0); });
  Waiter step([&] { g.awaitStep(0); });
  EXPECT_FALSE(layer.doneAfter(std::chrono::milliseconds(30))) << "a wait returned with nothing applied";
  EXPECT_FALSE(g.failed());
  EXPECT_TRUE(g.record(std::make_exception_ptr(std::runtime_error("first"))));
  EXPECT_FALSE(g.record(std::make_exception_ptr(std::runtime_error("second"))));
  EXPECT_TRUE(g.failed());
  g.wake();
  EXPECT_EQ(layer.join(), "first");
  EXPECT_EQ(step.join(), "first");
  // Later waits, even on updates that are in, rethrow it too.
  const std::size_t all[] = {0, 1, 2, 3, 4};
  g.markApplied(0, all);
  EXPECT_THROW(g.awaitStep(0), std::runtime_error);
  EXPECT_THROW(g.awaitLayer(0, 0), std::runtime_error);
  EXPECT_THROW(g.throwIfFailed(), std::runtime_error);
}

}  // namespace
}  // namespace terse::train

// WorkloadOptions::device on machines where it cannot be served: makeWorkload must refuse with a message that names the
// workload, the device and the reason (no CUDA in this build, no such device, no CUDA model), never fall back to the
// CPU model silently (a run that asked for the GPU would report the wrong thing). Runs in every build; the GPU models
// themselves are tested in tests/cuda/workloads_device_test.cu.
#include <gtest/gtest.h>

#include <string>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/workloads.h"
#include "tests/workloads/workloads_test_util.h"

namespace terse::workloads {
namespace {

// Runs makeWorkload and returns the exception's message, failing the test when it does not throw E.
template <class E>
std::string errorOf(std::string_view name, int device) {
  WorkloadOptions o;
  o.device = device;
  try {
    makeWorkload(name, o, testing::randomSplit(8, 16, 16, 4, 1));
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << " on device " << device << " threw the wrong type: " << e.what();
    return {};
  }
  ADD_FAILURE() << name << " on device " << device << " did not throw";
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(WorkloadDevice, NoCudaBuildRefusesEveryDevice) {
  if (cuda::builtWithCuda()) GTEST_SKIP() << "this build has CUDA";
  for (const char* name : {"softmax", "mlp", "cnn"}) {
    const std::string msg = errorOf<Unsupported>(name, 0);
    EXPECT_TRUE(contains(msg, "workload '" + std::string(name) + "' on CUDA device 0")) << msg;
    EXPECT_TRUE(contains(msg, "this build has no CUDA")) << msg;
    EXPECT_TRUE(contains(msg, "use device -1")) << msg;
  }
}

TEST(WorkloadDevice, MissingDeviceNamesOrdinalAndCount) {
  if (!cuda::builtWithCuda()) GTEST_SKIP() << "this build has no CUDA (see NoCudaBuildRefusesEveryDevice)";
  const cuda::DeviceSummary devices = cuda::deviceSummary();
  const int missing = devices.count;  // one past the last ordinal: 0 on a machine without a GPU
  for (const char* name : {"softmax", "mlp", "cnn"}) {
    const std::string msg = errorOf<InvalidArgument>(name, missing);
    EXPECT_TRUE(contains(msg, "workload '" + std::string(name) + "': CUDA device " + std::to_string(missing) +
                                  " does not exist, this machine has " + std::to_string(devices.count) +
                                  " CUDA device(s)"))
        << msg;
  }
}

TEST(WorkloadDevice, LinearRegressionHasNoCudaModel) {
  const std::string msg = errorOf<Unsupported>("linear_regression", 0);
  EXPECT_TRUE(contains(msg, "workload 'linear_regression' has no CUDA model (asked for CUDA device 0)")) << msg;
}

TEST(WorkloadDevice, RejectsNegativeOrdinals) {
  const std::string msg = errorOf<InvalidArgument>("mlp", -2);
  EXPECT_TRUE(contains(msg, "device must be -1 (CPU) or a CUDA device ordinal, got -2")) << msg;
}

TEST(WorkloadDevice, DefaultIsTheCpuModel) {
  const WorkloadOptions o;
  EXPECT_EQ(o.device, -1);
  EXPECT_EQ(makeWorkload("mlp", o, testing::randomSplit(8, 16, 16, 4, 1))->device(), -1);
}

}  // namespace
}  // namespace terse::workloads

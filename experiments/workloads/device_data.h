// A DataSplit's copy in device memory, uploaded once per (data set, device) and shared by every CUDA workload built on
// that data set and device: workers on one GPU share a read-only copy as CPU workers share the host one (Fashion-MNIST
// is 220 MB as f32, worth keeping once). Included only by CUDA builds (TERSE_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <memory>

#include "core/common/device_buffer.h"
#include "experiments/workloads/dataset.h"

namespace terse::workloads {

class DeviceDataSplit {
 public:
  // One set's features [num_examples x dims] and labels on the device.
  struct Set {
    cuda::DeviceBuffer features, labels;
    const float* x() const { return features.as<const float>(); }
    const int32_t* y() const { return labels.as<const int32_t>(); }
  };

  // Uploads `data` to `device` (blocking until the copy is done, so any stream may read it afterwards).
  DeviceDataSplit(std::shared_ptr<const DataSplit> data, int device);
  // Frees on the device it was allocated on. The memory is freed in the order of the legacy default stream, which does
  // not wait for the workloads' non-blocking streams: each workload synchronizes its stream before it lets go of its
  // reference (CudaWorkload's destructor), so no kernel still reads the data when the last reference goes.
  ~DeviceDataSplit();
  DeviceDataSplit(const DeviceDataSplit&) = delete;
  DeviceDataSplit& operator=(const DeviceDataSplit&) = delete;

  int device() const { return device_; }
  const DataSplit& host() const { return *host_; }
  const Set& train() const { return train_; }
  const Set& test() const { return test_; }

 private:
  std::shared_ptr<const DataSplit> host_;  // kept alive: the cache below keys on its address
  int device_;
  Set train_, test_;
};

// The shared copy of `data` on `device`: uploaded on first use, reused while any workload holds it. Thread-safe
// (workers construct their workloads concurrently; the second waits for the first's upload).
std::shared_ptr<const DeviceDataSplit> deviceDataSplit(const std::shared_ptr<const DataSplit>& data, int device);

}  // namespace terse::workloads

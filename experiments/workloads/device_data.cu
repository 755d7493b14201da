// experiments/workloads/device_data.h.
#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/device_data.h"

namespace terse::workloads {
namespace {

DeviceDataSplit::Set upload(const Dataset& set) {
  DeviceDataSplit::Set d;
  const std::size_t x_bytes = set.features.size() * sizeof(float), y_bytes = set.labels.size() * sizeof(int32_t);
  // The legacy default stream (nullptr): the copy is shared by workloads with their own streams, so it belongs to none
  // of them; the caller synchronizes before anyone reads it.
  d.features = cuda::DeviceBuffer(x_bytes, nullptr);
  d.labels = cuda::DeviceBuffer(y_bytes, nullptr);
  d.features.copyFromHost(set.features.data(), x_bytes, nullptr);
  d.labels.copyFromHost(set.labels.data(), y_bytes, nullptr);
  return d;
}

}  // namespace

DeviceDataSplit::DeviceDataSplit(std::shared_ptr<const DataSplit> data, int device)
    : host_(std::move(data)), device_(device) {
  TERSE_CHECK(host_ != nullptr, InvalidArgument, "no data set to upload");
  const cuda::DeviceGuard guard(device_);
  train_ = upload(host_->train);
  test_ = upload(host_->test);
  TERSE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

DeviceDataSplit::~DeviceDataSplit() {
  // DeviceGuard throws on failure and a destructor must not; the frees below are then made on whatever device is
  // current, which the runtime reports (logged by DeviceBuffer) rather than corrupting anything.
  int previous = -1;
  const bool switched =
      cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  (void)cudaGetLastError();
  train_ = Set{};
  test_ = Set{};
  if (switched && cudaSetDevice(previous) != cudaSuccess) (void)cudaGetLastError();
}

std::shared_ptr<const DeviceDataSplit> deviceDataSplit(const std::shared_ptr<const DataSplit>& data, int device) {
  struct Entry {
    const DataSplit* host;
    int device;
    std::weak_ptr<const DeviceDataSplit> copy;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;  // a handful of entries: data sets x devices
  const std::lock_guard<std::mutex> lock(mutex);
  // An entry's host address cannot be reused by another data set while the entry is live: the copy holds the host
  // data set. Expired entries are dropped here.
  std::erase_if(cache, [](const Entry& e) { return e.copy.expired(); });
  for (const Entry& e : cache)
    if (e.host == data.get() && e.device == device)
      if (auto copy = e.copy.lock()) return copy;
  auto copy = std::make_shared<const DeviceDataSplit>(data, device);
  cache.push_back({data.get(), device, copy});
  return copy;
}

}  // namespace terse::workloads

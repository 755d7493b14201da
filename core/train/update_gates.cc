#include "core/train/update_gates.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "core/common/error.h"

namespace terse::train {

UpdateGates::UpdateGates(const Workload& workload)
    : workload_(workload),
      applied_(workload.params().size(), -1),
      layer_applied_(static_cast<std::size_t>(workload.numLayers()), -1) {}

void UpdateGates::markApplied(int64_t step, std::span<const std::size_t> tensors) {
  if (tensors.empty()) return;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t t : tensors) {
      applied_[t] = step;
      const int layer = workload_.params()[t].layer;
      int64_t m = std::numeric_limits<int64_t>::max();
      for (std::size_t u : workload_.layerTensors(layer)) m = std::min(m, applied_[u]);
      layer_applied_[static_cast<std::size_t>(layer)] = m;
    }
  }
  cv_.notify_all();
}

bool UpdateGates::appliedLocked(int64_t step) const {
  return std::all_of(layer_applied_.begin(), layer_applied_.end(), [&](int64_t a) { return a >= step; });
}

template <class Open>
std::pair<rt::Clock::time_point, rt::Clock::time_point> UpdateGates::waitLocked(std::unique_lock<rt::Mutex>& lock,
                                                                                Open open) {
  const auto t0 = rt::now();
  cv_.wait(lock, [&] { return error_ || open(); });
  if (error_) std::rethrow_exception(error_);
  return {t0, rt::now()};
}

double UpdateGates::awaitStep(int64_t step) {
  std::unique_lock lock(mutex_);
  const auto [t0, t1] = waitLocked(lock, [&] { return appliedLocked(step); });
  return rt::seconds(t0, t1);
}

std::pair<rt::Clock::time_point, rt::Clock::time_point> UpdateGates::awaitLayer(int layer, int64_t step) {
  std::unique_lock lock(mutex_);
  TERSE_CHECK(layer >= 0 && static_cast<std::size_t>(layer) < layer_applied_.size(), InvalidArgument,
              "workload '" << workload_.name() << "' awaited layer " << layer << " of " << layer_applied_.size());
  return waitLocked(lock, [&] { return layer_applied_[static_cast<std::size_t>(layer)] >= step; });
}

bool UpdateGates::record(std::exception_ptr failure) {
  std::lock_guard lock(mutex_);
  if (error_) return false;
  error_ = std::move(failure);
  return true;
}

void UpdateGates::wake() {
  cv_.notify_all();
}

bool UpdateGates::failed() const {
  std::lock_guard lock(mutex_);
  return error_ != nullptr;
}

void UpdateGates::throwIfFailed() const {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace terse::train

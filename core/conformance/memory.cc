// The host side of memory.h, the guard comparison both memories share, and what the device mode answers
// when it cannot run (memory_cuda.cc is the device side, compiled only with CUDA).
#include "core/conformance/memory.h"

#include <cstring>
#include <sstream>
#include <string>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/compress/host_array.h"
#include "terse/types_v1.h"

namespace terse::conformance {
namespace {

// [guard][bytes][guard] in one zero-filled, 64-byte aligned host allocation. This sees writes out of bounds in every
// build; ASan builds additionally see writes beyond the guards.
class HostGuarded final : public GuardedRegion {
 public:
  explicit HostGuarded(std::size_t bytes) : bytes_(bytes), storage_(kGuardBytes + bytes + kGuardBytes) {
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
      storage_[i] = guardByte(i);
      storage_[kGuardBytes + bytes_ + i] = guardByte(i + kGuardBytes);
    }
  }

  std::byte* data() override { return storage_.data() + kGuardBytes; }
  std::size_t size() const override { return bytes_; }
  void write(std::span<const std::byte> from) override {
    if (!from.empty()) std::memcpy(data(), from.data(), from.size());
  }
  void read(std::span<std::byte> to) const override {
    if (!to.empty()) std::memcpy(to.data(), storage_.data() + kGuardBytes, to.size());
  }
  void check(const std::string& what) const override {
    checkGuardBytes({storage_.data(), kGuardBytes}, {storage_.data() + kGuardBytes + bytes_, kGuardBytes}, bytes_,
                    what);
  }

 private:
  std::size_t bytes_;
  HostArray<std::byte> storage_;
};

class HostCopy final : public ConstRegion {
 public:
  explicit HostCopy(std::span<const std::byte> bytes) : size_(bytes.size()), data_(new std::byte[bytes.size()]) {
    if (size_ != 0) std::memcpy(data_.get(), bytes.data(), size_);
  }
  std::span<const std::byte> span() const override { return {data_.get(), size_}; }

 private:
  std::size_t size_;
  std::unique_ptr<std::byte[]> data_;
};

// The caller's bytes as they are: the host suite has always handed the plugin its input vectors directly.
class HostView final : public ConstRegion {
 public:
  explicit HostView(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::span<const std::byte> span() const override { return bytes_; }

 private:
  std::span<const std::byte> bytes_;
};

class HostMemory final : public ConformanceMemory {
 public:
  uint32_t device() const override { return TERSE_DEVICE_HOST; }
  int deviceIndex() const override { return -1; }
  std::string describe() const override { return "host memory"; }
  std::unique_ptr<GuardedRegion> guarded(std::size_t bytes) override { return std::make_unique<HostGuarded>(bytes); }
  std::unique_ptr<ConstRegion> copy(std::span<const std::byte> bytes) override {
    return std::make_unique<HostCopy>(bytes);
  }
  std::unique_ptr<ConstRegion> input(std::span<const std::byte> bytes) override {
    return std::make_unique<HostView>(bytes);
  }
  void* stream() const override { return nullptr; }
  void finish() override {}  // host calls complete before they return (compressor_v1.h)
};

}  // namespace

void checkGuardBytes(std::span<const std::byte> front, std::span<const std::byte> back, std::size_t bytes,
                     const std::string& what) {
  for (std::size_t i = 0; i < kGuardBytes; ++i) {
    if (front[i] != guardByte(i)) {
      std::ostringstream o;
      o << "wrote " << kGuardBytes - i << " bytes before the start of the " << what;
      throw Violation(o.str());
    }
  }
  for (std::size_t i = 0; i < kGuardBytes; ++i) {
    if (back[i] != guardByte(i + kGuardBytes)) {
      std::ostringstream o;
      o << "wrote past the end of the " << what << " (" << bytes << " bytes): byte " << bytes + i << " was changed";
      throw Violation(o.str());
    }
  }
}

std::shared_ptr<ConformanceMemory> hostMemory() {
  return std::make_shared<HostMemory>();
}

std::string cudaMemoryProblem(int index) {
  std::ostringstream o;
  if (index < 0) {
    o << "a CUDA device index is 0 or more, got " << index;
    return o.str();
  }
  const cuda::DeviceSummary summary = cuda::deviceSummary();
  if (!cuda::builtWithCuda() || summary.count == 0) {
    o << "no CUDA device to run on: " << summary.reason;
  } else if (index >= summary.count) {
    o << "CUDA device " << index << " asked for, but this machine has " << summary.count
      << (summary.count == 1 ? " device" : " devices");
  }
  return o.str();
}

#if !defined(TERSE_HAVE_CUDA)
std::shared_ptr<ConformanceMemory> cudaMemory(int index) {
  // deviceSummary() of a build without CUDA says so; the text is the same the CUDA build gives on a machine without
  // a device, so a caller needs one message for both.
  TERSE_THROW(Unsupported, "conformance on CUDA: " << cudaMemoryProblem(index));
}
#endif

}  // namespace terse::conformance

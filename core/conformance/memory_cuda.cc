// The device side of memory.h: the suite's buffers in CUDA device memory, on a stream the suite owns.
// Compiled only in CUDA builds (core/conformance/CMakeLists.txt), with TERSE_WITH_CUDA_RUNTIME for TERSE_CUDA_CHECK.
//
// Every allocation, fill and copy is ordered on the one stream the plugin's calls run on (DESIGN.md section 3: streams
// are passed explicitly), so "after the call" on the host means "after the plugin's last kernel" without any
// device-wide synchronization, and a region freed while a call is in flight is reused only after it (cudaFreeAsync).
// Each read back synchronizes the stream before the host looks at the bytes.
#include <cuda_runtime_api.h>

#include <array>
#include <sstream>
#include <utility>
#include <vector>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"
#include "core/conformance/memory.h"
#include "terse/types_v1.h"

namespace terse::conformance {
namespace {

// What every region of one memory shares: the device and the stream. Regions hold it too, so a region that outlives
// the memory (it never should, but the suite is no place to crash) still frees on a live stream.
struct CudaContext {
  int device = 0;
  cuda::Stream stream;

  explicit CudaContext(int d) : device(d), stream(makeStream(d)) {}

  static cuda::Stream makeStream(int d) {
    const cuda::DeviceGuard on(d);
    return cuda::Stream(cuda::Stream::Priority::kLow);
  }
  void synchronize() const {
    const cuda::DeviceGuard on(device);
    stream.synchronize();
  }
};

// The guard fill as host bytes: the source of the uploads (static, so no copy outlives its source).
const std::array<std::byte, 2 * kGuardBytes>& guardFill() {
  static const std::array<std::byte, 2 * kGuardBytes> fill = [] {
    std::array<std::byte, 2 * kGuardBytes> f{};
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = guardByte(i);
    return f;
  }();
  return fill;
}

// [guard][bytes][guard] in one device allocation: cudaMallocAsync returns 256-byte aligned memory and kGuardBytes is a
// multiple of 64, so the data keeps the ABI's alignment. The data is zero-filled as the host's is.
class DeviceGuarded final : public GuardedRegion {
 public:
  DeviceGuarded(std::shared_ptr<CudaContext> ctx, std::size_t bytes) : ctx_(std::move(ctx)), bytes_(bytes) {
    const cuda::DeviceGuard on(ctx_->device);
    const cudaStream_t s = ctx_->stream.get();
    buffer_ = cuda::DeviceBuffer(kGuardBytes + bytes_ + kGuardBytes, s);
    std::byte* base = buffer_.as<std::byte>();
    const auto& fill = guardFill();
    TERSE_CUDA_CHECK(cudaMemcpyAsync(base, fill.data(), kGuardBytes, cudaMemcpyHostToDevice, s));
    if (bytes_ > 0) TERSE_CUDA_CHECK(cudaMemsetAsync(base + kGuardBytes, 0, bytes_, s));
    TERSE_CUDA_CHECK(cudaMemcpyAsync(base + kGuardBytes + bytes_, fill.data() + kGuardBytes, kGuardBytes,
                                     cudaMemcpyHostToDevice, s));
  }

  std::byte* data() override { return buffer_.as<std::byte>() + kGuardBytes; }
  std::size_t size() const override { return bytes_; }

  void write(std::span<const std::byte> from) override {
    TERSE_CHECK(from.size() <= bytes_, InternalError,
                "conformance: writing " << from.size() << " bytes into a device region of " << bytes_);
    if (from.empty()) return;
    const cuda::DeviceGuard on(ctx_->device);
    TERSE_CUDA_CHECK(cudaMemcpyAsync(data(), from.data(), from.size(), cudaMemcpyHostToDevice, ctx_->stream.get()));
    // The source is the caller's pageable memory, which it may change or free as soon as this returns.
    ctx_->stream.synchronize();
  }

  void read(std::span<std::byte> to) const override {
    TERSE_CHECK(to.size() <= bytes_, InternalError,
                "conformance: reading " << to.size() << " bytes out of a device region of " << bytes_);
    if (to.empty()) return;
    const cuda::DeviceGuard on(ctx_->device);
    TERSE_CUDA_CHECK(cudaMemcpyAsync(to.data(), buffer_.as<std::byte>() + kGuardBytes, to.size(),
                                     cudaMemcpyDeviceToHost, ctx_->stream.get()));
    ctx_->stream.synchronize();
  }

  void check(const std::string& what) const override {
    std::array<std::byte, 2 * kGuardBytes> guards{};
    {
      const cuda::DeviceGuard on(ctx_->device);
      const cudaStream_t s = ctx_->stream.get();
      const std::byte* base = buffer_.as<std::byte>();
      TERSE_CUDA_CHECK(cudaMemcpyAsync(guards.data(), base, kGuardBytes, cudaMemcpyDeviceToHost, s));
      TERSE_CUDA_CHECK(cudaMemcpyAsync(guards.data() + kGuardBytes, base + kGuardBytes + bytes_, kGuardBytes,
                                       cudaMemcpyDeviceToHost, s));
      ctx_->stream.synchronize();
    }
    checkGuardBytes({guards.data(), kGuardBytes}, {guards.data() + kGuardBytes, kGuardBytes}, bytes_, what);
  }

 private:
  std::shared_ptr<CudaContext> ctx_;
  std::size_t bytes_;
  cuda::DeviceBuffer buffer_;
};

// A device copy in an allocation of exactly the bytes' size (one byte for none: the pointer must not be NULL).
class DeviceCopy final : public ConstRegion {
 public:
  DeviceCopy(std::shared_ptr<CudaContext> ctx, std::span<const std::byte> bytes)
      : ctx_(std::move(ctx)), size_(bytes.size()) {
    const cuda::DeviceGuard on(ctx_->device);
    buffer_ = cuda::DeviceBuffer(size_ == 0 ? 1 : size_, ctx_->stream.get());
    buffer_.copyFromHost(bytes.data(), size_, ctx_->stream.get());
    // As in DeviceGuarded::write: the caller's bytes may go away when this returns.
    ctx_->stream.synchronize();
  }
  std::span<const std::byte> span() const override { return {buffer_.as<const std::byte>(), size_}; }

 private:
  std::shared_ptr<CudaContext> ctx_;
  std::size_t size_;
  cuda::DeviceBuffer buffer_;
};

class CudaMemory final : public ConformanceMemory {
 public:
  CudaMemory(int device, std::string name) : ctx_(std::make_shared<CudaContext>(device)), name_(std::move(name)) {}

  uint32_t device() const override { return TERSE_DEVICE_CUDA; }
  int deviceIndex() const override { return ctx_->device; }
  std::string describe() const override { return name_; }
  std::unique_ptr<GuardedRegion> guarded(std::size_t bytes) override {
    return std::make_unique<DeviceGuarded>(ctx_, bytes);
  }
  std::unique_ptr<ConstRegion> copy(std::span<const std::byte> bytes) override {
    return std::make_unique<DeviceCopy>(ctx_, bytes);
  }
  std::unique_ptr<ConstRegion> input(std::span<const std::byte> bytes) override {
    return std::make_unique<DeviceCopy>(ctx_, bytes);
  }
  void* stream() const override { return ctx_->stream.handle(); }
  void finish() override { ctx_->synchronize(); }

 private:
  std::shared_ptr<CudaContext> ctx_;
  std::string name_;
};

}  // namespace

std::shared_ptr<ConformanceMemory> cudaMemory(int index) {
  const std::string problem = cudaMemoryProblem(index);
  TERSE_CHECK(problem.empty(), Unsupported, "conformance on CUDA: " << problem);
  cudaDeviceProp prop{};
  TERSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  std::ostringstream name;
  name << "CUDA device " << index << " (" << prop.name << ", sm_" << prop.major << prop.minor << ")";
  return std::make_shared<CudaMemory>(index, name.str());
}

}  // namespace terse::conformance

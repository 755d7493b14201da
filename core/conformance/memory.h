// Where the conformance suite's buffers live (internal to core/conformance: the simulator and the checks).
//
// The suite is written once (the simulator and the checks): every buffer it hands a plugin comes from a
// ConformanceMemory, and every result it checks is read back through it. The host memory hands out host allocations
// and the plugin runs with stream NULL, exactly as the suite always did; the CUDA memory (memory_cuda.cc, only in CUDA
// builds) hands out device allocations on a CUDA stream it owns and copies results and guard zones back to the host
// after each call. A second copy of the 1500-line suite for the device would drift from the first; one layer under it
// cannot.
//
// What the device mode can and cannot see. Guard zones around every buffer the plugin writes are filled on the device
// and read back after the call, so a kernel writing up to kGuardBytes before or after its buffer is a FAIL with the
// same message as on the host. A write further off lands in some other allocation or faults; a fault (illegal
// address) is a sticky CUDA error: the check it happens in and every later one fail with the runtime's message, and
// the process survives. Reads out of bounds leave no trace on the device; run the suite under compute-sanitizer
// (memcheck) for those, as ASan is the tool on the host: payloads are still copied into allocations of exactly their
// size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace terse::conformance {

// A rule the suite observed broken itself (a guard zone overwritten), as opposed to a status the plugin returned.
class Violation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Guard bytes on each side of a written buffer: a multiple of 64, so the data stays 64-byte aligned (the ABI promises
// 64 for scratch, 16 for other buffers), and at least the slack the suite offers beyond a declared output bound.
inline constexpr std::size_t kGuardBytes = 256;

// The guard fill: byte i of the leading guard is guardByte(i), byte i of the trailing guard guardByte(kGuardBytes + i).
// No plausible write (zeros, a constant, floats) reproduces it.
inline std::byte guardByte(std::size_t i) {
  return static_cast<std::byte>(0xA5u ^ ((i * 0x3Bu) & 0xFFu));
}

// Compares the two guards, read back into host memory, with the fill; throws Violation naming `what` and the first
// damaged byte. `bytes` is the size of the buffer between them. Shared by both memories, so a damaged guard reads the
// same on the host and on the device.
void checkGuardBytes(std::span<const std::byte> front, std::span<const std::byte> back, std::size_t bytes,
                     const std::string& what);

// [guard][bytes][guard] that a call may write: the data zero-filled when made (as the core's host arrays are), 64-byte
// aligned, and readable by the plugin at data() on the memory's device.
class GuardedRegion {
 public:
  virtual ~GuardedRegion() = default;

  // The address handed to the plugin: host memory or device memory, as the ConformanceMemory that made it says.
  virtual std::byte* data() = 0;
  virtual std::size_t size() const = 0;
  // Copy host bytes into the start of the region / the start of the region out to the host. Ordered after every call
  // made so far on the memory's stream, and complete when they return.
  virtual void write(std::span<const std::byte> from) = 0;
  virtual void read(std::span<std::byte> to) const = 0;
  // Throws Violation naming `what` and the first damaged guard byte.
  virtual void check(const std::string& what) const = 0;

  std::span<std::byte> span() { return {data(), size()}; }
  // The region plus `slack` bytes of the trailing guard: offered as capacity, never to be written.
  std::span<std::byte> spanWithSlack(std::size_t slack) { return {data(), size() + slack}; }
};

// Read-only bytes handed to the plugin (an input tensor, a payload, prev, a reduce operand).
class ConstRegion {
 public:
  virtual ~ConstRegion() = default;
  // Never a null pointer, also for 0 bytes, so a zero-length payload still comes with a valid address.
  virtual std::span<const std::byte> span() const = 0;
};

// Hands out the buffers of one suite run and runs its plugin calls on one stream. Not thread-safe (the suite is not).
class ConformanceMemory {
 public:
  virtual ~ConformanceMemory() = default;

  // What TensorInfo says: TERSE_DEVICE_HOST with index -1, or TERSE_DEVICE_CUDA with the device ordinal.
  virtual uint32_t device() const = 0;
  virtual int deviceIndex() const = 0;
  // For messages: "host memory", "CUDA device 0 (NVIDIA H100 80GB HBM3 (sm_90))".
  virtual std::string describe() const = 0;

  virtual std::unique_ptr<GuardedRegion> guarded(std::size_t bytes) = 0;
  // A copy of `bytes` in an allocation of exactly that size, so that a read past the end of a payload is reported by
  // the memory checker of the build (ASan on the host, compute-sanitizer on the device).
  virtual std::unique_ptr<ConstRegion> copy(std::span<const std::byte> bytes) = 0;
  // `bytes` where the plugin can read them. The host memory passes the caller's own (which outlive the call) without a
  // copy; the device memory copies them up.
  virtual std::unique_ptr<ConstRegion> input(std::span<const std::byte> bytes) = 0;

  // The ABI's stream argument: NULL on the host (every call completes before it returns), a cudaStream_t on CUDA.
  virtual void* stream() const = 0;
  // Waits for the work the last plugin call queued on stream(); throws DeviceError for a failed kernel, so a crash on
  // the device is reported by the check whose call caused it.
  virtual void finish() = 0;
};

std::shared_ptr<ConformanceMemory> hostMemory();

// Why CUDA device `index` cannot hold the suite's buffers in this process (no CUDA in this build, no driver, no
// device, an index past the last device), or empty when it can. Never throws.
std::string cudaMemoryProblem(int index);
// Device memory on CUDA device `index` and a stream of its own there. Throws Unsupported with cudaMemoryProblem's text
// when there is a problem (in builds without CUDA, always).
std::shared_ptr<ConformanceMemory> cudaMemory(int index);

}  // namespace terse::conformance

// The CUDA path of a compressor plugin (every built-in's), as seen from its plugin class: plain C++, no CUDA header
// here, so the .cc files build the same with and without CUDA. A plugin with kernels lists its .cu files through
// terse_compressor_cuda_sources() (terseHelpers.cmake), which compiles them with this kit's device.cu, defines
// TERSE_COMPRESSOR_CUDA=1 and links the CUDA runtime when the project has CUDA; without CUDA the plugin advertises
// host memory only (kDevices) and refuses device tensors. Kernels include device.cuh.
//
// How a device call goes (one kernel body, two launchers: DESIGN.md section 5):
//   compress:    the payload prefix (header and parameters, the same bytes the host path writes) is built on the host
//                and written by a kernel that takes it by value, then the plugin's kernels fill the sections, all on
//                `stream`. Nothing is waited for: fixed-size payloads need no size read back.
//   decompress:  the payload came over the network and must be validated before its status can be returned, so the
//                plugin's validation kernel checks everything the host decoder checks and raises a host-mapped status
//                word, the call synchronizes `stream` once to read it, and only a clean payload is decoded (on the
//                stream, not waited for). A payload the device refuses is copied to the host and run through the host
//                decoder, which throws the very message the host path gives (and if it did not, that is a bug, reported
//                as an internal error rather than decoded). This rank's own payload (TERSE_CALL_OWN_PAYLOAD: error
//                feedback decoding what it sent) is trusted, decoded with nothing waited for, by the plugins whose
//                own payloads always validate (OwnPayload below). A deferred call (terse/device_verdict_v1.h) waits
//                for nothing either: the validation raises the core's word, and the decode's kernels read it and
//                write nothing when it is raised; the core reads the words of a whole collective's decodes at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "terse/sdk.hpp"

#ifndef TERSE_COMPRESSOR_CUDA
#define TERSE_COMPRESSOR_CUDA 0
#endif

namespace terse::kit::device {

// Whether this plugin was built with its CUDA kernels.
inline constexpr bool kBuilt = TERSE_COMPRESSOR_CUDA != 0;
// What such a plugin advertises in caps.devices.
inline constexpr terse_device_v1 kDevices = TERSE_DEVICE_HOST | (kBuilt ? TERSE_DEVICE_CUDA : 0u);

// The bytes in front of a payload's data sections (header, parameters), built on the host and handed to kernels by
// value. 64 bytes hold every built-in's prefix.
struct Prefix {
  alignas(16) std::byte bytes[64];
  uint32_t size;
};

// Runs `write(sdk::ByteWriter&)` into a Prefix: the same writer calls the host path makes, so the bytes cannot differ.
template <class Write>
Prefix makePrefix(Write write) {
  Prefix p{};
  sdk::ByteWriter w(std::span<std::byte>(p.bytes, sizeof p.bytes));
  write(w);
  p.size = static_cast<uint32_t>(w.offset());
  return p;
}

// What the ByteWriter's bounds check says on the host path, for a device output that cannot hold the payload.
inline void requireCapacity(std::span<const std::byte> output, uint64_t needed, const char* plugin) {
  if (output.size() < needed) {
    throw sdk::InvalidArgument(std::string(plugin) + ": the output holds " + std::to_string(output.size()) +
                               " bytes, the payload needs " + std::to_string(needed));
  }
}

#if TERSE_COMPRESSOR_CUDA

// Makes info.device_index current for a scope and restores the caller's device afterwards.
class Scope {
 public:
  explicit Scope(const terse_tensor_info_v1& info);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int previous_ = -1;
};

// Host-mapped pinned words that validation kernels raise (write 1) when they find a malformed payload. One per
// concurrent decompress: calls on different threads may share a plugin instance (the ABI's "ctx is read-only after
// init") and must not share a word, so words are leased from a pool that grows only when every word is in use, i.e.
// to the number of threads that ever decompress at once. The steady state allocates nothing.
class StatusWords {
 public:
  class Lease {
   public:
    Lease(StatusWords* pool, uint32_t* word) : pool_(pool), word_(word) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // Clears the word. Only while no kernel that may write it is queued (a lease is exclusive, and every user
    // synchronizes before giving it back).
    void clear() const;
    // The word as kernels see it.
    uint32_t* device() const;
    // Whether a kernel raised it; call after synchronizing the stream the kernels ran on.
    bool raised() const;

   private:
    StatusWords* pool_;
    uint32_t* word_;
  };

  StatusWords() = default;
  ~StatusWords();
  StatusWords(const StatusWords&) = delete;
  StatusWords& operator=(const StatusWords&) = delete;

  Lease acquire();
  // A word of the current device for kernels whose verdict nobody reads (an own payload's decode, which validates as it
  // goes): racing writers all store 1 and it is never cleared or read, so any number of calls may share it. Device
  // memory, made once a device, so that freeing it (cudaFree) waits for any kernel still writing it.
  uint32_t* discard();

 private:
  std::mutex mutex_;
  std::vector<uint32_t*> free_;
  std::vector<uint32_t*> all_;
  std::vector<std::pair<int, uint32_t*>> discard_;  // by device
};

// Writes prefix.bytes to the start of a device output (stream-ordered, no host wait). With a raised `gate` (a deferred
// verdict word, read on the device) it writes as many zero bytes instead: a header no check accepts, for a payload
// that a refused prev leaves undefined and this step's decompress must refuse (terse/device_verdict_v1.h).
void writePrefix(const Prefix& prefix, void* output, void* stream, const uint32_t* gate = nullptr);
// Blocks until the work queued on `stream` has run.
void synchronize(void* stream);
// Queues a copy of `bytes` bytes from device memory to host memory on `stream`; synchronize before reading `dst`.
void copyToHost(void* dst, const void* src, uint64_t bytes, void* stream);

// The refusal of a payload the device validation (or the size check) turned down: copies it to the host, runs
// `host_decompress` on it with a host copy of the tensor info and a scratch output, and lets the InvalidPayload that
// throws propagate. Never returns.
[[noreturn]] void rethrowHostVerdict(const sdk::DecompressArgs& args,
                                     const std::function<void(const sdk::DecompressArgs&)>& host_decompress);
// The same for reduce: both inputs are copied to the host and `host_reduce` runs on them into a host output.
[[noreturn]] void rethrowHostReduceVerdict(const sdk::ReduceArgs& args,
                                           const std::function<uint64_t(const sdk::ReduceArgs&)>& host_reduce);

// What a decompress does with this rank's own payload (args.ownPayload(): error feedback decoding what it sent). kTrust
// only where the plugin's own compress never writes a payload its validation would refuse (it refuses a non-finite
// gradient itself, or its validation checks no values): then the verdict is known, and nothing is waited for. A plugin
// whose device compress lets a non-finite value through to be refused at decode (topk, qsgd, terngrad, natural, onebit,
// powersgd) keeps kValidate: that refusal, in error feedback's own decode, is what leaves a failed step's residual
// untouched (core/compress/error_feedback.h).
enum class OwnPayload { kValidate, kTrust };

// Queues `validate(status_word)` on a leased word, synchronizes the stream once and says whether the payload was clean:
// the verdict read both checkedDecompress overloads make.
template <class Validate>
bool cleanVerdict(const sdk::DecompressArgs& args, StatusWords& words, Validate validate) {
  const auto status = words.acquire();
  status.clear();
  validate(status.device());
  synchronize(args.stream);
  return !status.raised();
}

// Whether a plugin's decode step takes the gate of a deferred verdict: `decode(const uint32_t* gate)`, whose kernels
// write nothing when gate is non-null and *gate is raised (read on the device). A decode taking no argument cannot
// defer: its calls keep the synchronization.
template <class Decode>
inline constexpr bool kDecodeTakesGate = std::is_invocable_v<Decode&, const uint32_t*>;

template <class Decode>
void runDecode(Decode& decode, const uint32_t* gate) {
  if constexpr (kDecodeTakesGate<Decode>) {
    decode(gate);
  } else {
    decode();
  }
}

// The device decompress of the built-ins, in one place: when the payload has the size the host path accepts,
// `validate(status_word)` queues the plugin's validation kernel, the stream is synchronized once to read the verdict,
// and a clean payload is decoded by `decode` (queued, not waited for; with a null gate). Anything else gets the host
// decoder's verdict: `host_decompress` throws its message. Two ways skip the synchronization:
//   - a deferred call (args.deferredVerdict(), terse/device_verdict_v1.h) of a plugin whose decode takes a gate
//     (kDecodeTakesGate): the validation raises the core's word, and `decode(gate)` with gate = that word queues
//     kernels that write nothing when it is raised. The core reads the word later, for many calls at once.
//   - with OwnPayload::kTrust, this rank's own payload of the right size is decoded by `decode` alone (null gate).
// (A plugin whose one kernel validates and decodes uses the overload below; passing it here with an empty decode
// would decode nothing on the trusted and deferred paths.)
template <class Validate, class Decode>
void checkedDecompress(const sdk::DecompressArgs& args, StatusWords& words, bool size_ok, Validate validate,
                       Decode decode, const std::function<void(const sdk::DecompressArgs&)>& host_decompress,
                       OwnPayload own = OwnPayload::kValidate) {
  const Scope scope(args.info);
  if (size_ok && own == OwnPayload::kTrust && args.ownPayload()) {
    runDecode(decode, nullptr);
    return;
  }
  if constexpr (kDecodeTakesGate<Decode>) {
    if (size_ok && args.deferredVerdict() != nullptr) {
      validate(args.deferredVerdict());
      decode(args.deferredVerdict());
      return;
    }
  }
  if (size_ok && cleanVerdict(args, words, validate)) {
    runDecode(decode, nullptr);
    return;
  }
  rethrowHostVerdict(args, host_decompress);
}

// The same for a plugin whose one kernel validates and decodes (`validate_and_decode(status_word)` raises the word and
// writes the output only for a clean payload, whatever the word held before). A deferred call runs it on the core's
// word, nothing waited for; with OwnPayload::kTrust this rank's own payload of the right size runs it with
// StatusWords::discard(), nothing waited for.
template <class ValidateAndDecode>
void checkedDecompress(const sdk::DecompressArgs& args, StatusWords& words, bool size_ok,
                       ValidateAndDecode validate_and_decode,
                       const std::function<void(const sdk::DecompressArgs&)>& host_decompress,
                       OwnPayload own = OwnPayload::kValidate) {
  const Scope scope(args.info);
  if (size_ok && own == OwnPayload::kTrust && args.ownPayload()) {
    validate_and_decode(words.discard());
    return;
  }
  if (size_ok && args.deferredVerdict() != nullptr) {
    validate_and_decode(args.deferredVerdict());
    return;
  }
  if (size_ok && cleanVerdict(args, words, validate_and_decode)) return;
  rethrowHostVerdict(args, host_decompress);
}

#endif  // TERSE_COMPRESSOR_CUDA

}  // namespace terse::kit::device

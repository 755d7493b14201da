// Test harness for compressor plugins: opens a built plugin file by name, drives its C entry points exactly as the
// core's loader would (struct sizes set, scratch allocated from the sizes the plugin reports, 64-byte aligned
// buffers), and captures what the plugin logs. Generic over every compressor, so the per-compressor tests in this
// folder (and anyone else's) share one way of calling plugins.
//
//   terse::testing::Plugin qsgd("qsgd");                       // TERSE_TEST_BUILD_PLUGIN_DIR/terse_compressor_qsgd.so
//   terse::testing::Instance c(qsgd, {{"levels", "15"}});      // init; c.initStatus(), c.lastError()
//   auto info = terse::testing::tensorInfo(1000, {.rank = 1, .world_size = 4, .step = 3});
//   terse::testing::Bytes payload = c.compress(info, grad);    // ADD_FAILUREs on a non-OK status
//   std::vector<float> out(1000);
//   EXPECT_EQ(c.decompress(info, payload, out), TERSE_OK);
//
// Statuses are returned (or checked with ADD_FAILURE where a method returns data) rather than thrown, so a test can
// assert on the exact code and on lastError(), the message the plugin logged for it.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "terse/compressor_v1.h"
#include "terse/device_verdict_v1.h"
#include "terse/sdk/half.hpp"
#include "terse/sdk/philox.hpp"
#include "terse/types_v1.h"

#ifndef TERSE_TEST_CUDA_PLUGINS
#define TERSE_TEST_CUDA_PLUGINS 0
#endif

namespace terse::testing {

// What the built-in compressors that have CUDA kernels advertise in caps.devices in this build: host memory, and CUDA
// device memory when the build has CUDA (TERSE_TEST_CUDA_PLUGINS, set by tests/compressors/CMakeLists.txt).
inline constexpr terse_device_v1 kCudaPluginDevices =
    TERSE_DEVICE_HOST | (TERSE_TEST_CUDA_PLUGINS ? TERSE_DEVICE_CUDA : 0u);

// ---- Bytes with the alignment the ABI promises for every buffer (at least 16; scratch at least 64).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};
using Bytes = std::vector<std::byte, AlignedAllocator<std::byte>>;

// ---- A terse_host_v1 that keeps every message; thread-safe like the core's.
class CapturingHost {
 public:
  struct Message {
    terse_log_level_v1 level;
    std::string text;
  };

  CapturingHost() {
    host_.struct_size = sizeof(terse_host_v1);
    host_.user = this;
    host_.log = [](void* user, terse_log_level_v1 level, const char* message) {
      auto* self = static_cast<CapturingHost*>(user);
      std::lock_guard<std::mutex> lock(self->mutex_);
      self->messages_.push_back(Message{level, message});
    };
  }
  CapturingHost(const CapturingHost&) = delete;
  CapturingHost& operator=(const CapturingHost&) = delete;

  const terse_host_v1* get() const { return &host_; }
  std::vector<Message> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  // The last ERROR message, "" if none.
  std::string lastError() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = messages_.rbegin(); it != messages_.rend(); ++it) {
      if (it->level == TERSE_LOG_ERROR) return it->text;
    }
    return "";
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.clear();
  }

 private:
  terse_host_v1 host_{};
  mutable std::mutex mutex_;
  std::vector<Message> messages_;
};

// ---- Tensor infos. Designated initializers keep call sites readable: tensorInfo(n, {.rank = 1, .world_size = 4}).
struct InfoOptions {
  int32_t rank = 0;
  int32_t world_size = 1;
  uint64_t step = 0;
  uint64_t seed = 1234;
  uint64_t tensor_id = 7;
  int32_t round = 0;
  int32_t source_rank = -2;  // -2: same as rank (a rank's own payload); -1: an aggregate
  terse_dtype_v1 dtype = TERSE_DTYPE_F32;
};

inline terse_tensor_info_v1 tensorInfo(uint64_t numel, const InfoOptions& o = {}) {
  terse_tensor_info_v1 info{};
  info.struct_size = sizeof(terse_tensor_info_v1);
  info.dtype = o.dtype;
  info.numel = numel;
  info.ndim = 1;
  info.device = TERSE_DEVICE_HOST;
  info.shape[0] = static_cast<int64_t>(numel);
  info.tensor_id = o.tensor_id;
  info.step = o.step;
  info.seed = o.seed;
  info.rank = o.rank;
  info.world_size = o.world_size;
  info.round = o.round;
  info.source_rank = o.source_rank == -2 ? o.rank : o.source_rank;
  info.device_index = -1;
  return info;
}

// The same tensor seen as the aggregate of all ranks (what the core passes to decompress after SUM or reduce).
inline terse_tensor_info_v1 aggregateInfo(terse_tensor_info_v1 info) {
  info.source_rank = -1;
  return info;
}

// ---- One plugin file, dlopen'ed for the object's lifetime.
class Plugin {
 public:
  // Opens TERSE_TEST_BUILD_PLUGIN_DIR/terse_compressor_<name>.so.
  explicit Plugin(const std::string& name) : Plugin(name, std::string(TERSE_TEST_BUILD_PLUGIN_DIR)) {}
  Plugin(const std::string& name, const std::string& dir) : path_(dir + "/terse_compressor_" + name + ".so") {
    // NODELETE as in the core's loader (core/plugin/plugin_support.cc: a CUDA plugin cannot be loaded twice).
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      ADD_FAILURE() << "dlopen(" << path_ << "): " << (why ? why : "?") << " (is the plugin target built?)";
      return;
    }
    api_ = static_cast<const terse_compressor_v1*>(dlsym(handle_, TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL));
    if (api_ == nullptr) ADD_FAILURE() << path_ << " exports no " << TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL;
  }
  ~Plugin() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  bool ok() const { return api_ != nullptr; }
  const terse_compressor_v1* api() const { return api_; }
  const std::string& path() const { return path_; }
  // The optional deferred decompress (terse/device_verdict_v1.h), or null when the plugin does not export it.
  terse_decompress_deferred_fn_v1 deferred() const {
    if (handle_ == nullptr) return nullptr;
    // dlsym hands functions back as object pointers; POSIX guarantees the round trip.
    return reinterpret_cast<terse_decompress_deferred_fn_v1>(
        dlsym(handle_, TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL));
  }
  // The optional deferred compress (terse/device_verdict_v1.h), or null when the plugin does not export it.
  terse_compress_deferred_fn_v1 deferredCompress() const {
    if (handle_ == nullptr) return nullptr;
    return reinterpret_cast<terse_compress_deferred_fn_v1>(
        dlsym(handle_, TERSE_COMPRESSOR_COMPRESS_DEFERRED_V1_SYMBOL));
  }

 private:
  std::string path_;
  void* handle_ = nullptr;
  const terse_compressor_v1* api_ = nullptr;
};

// ---- Core-owned per-tensor memory (workspace and state) for one rank, allocated from the sizes the plugin reported,
// aligned to 64 bytes, state zero-filled once. Keep one per (tensor, rank) across steps for stateful plugins.
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(const terse_compressor_sizes_v1& sizes)
      : workspace_(sizes.workspace_bytes), state_(sizes.state_bytes) {}

  terse_scratch_v1* get() {
    raw_.workspace = workspace_.empty() ? nullptr : workspace_.data();
    raw_.workspace_bytes = workspace_.size();
    raw_.state = state_.empty() ? nullptr : state_.data();
    raw_.state_bytes = state_.size();
    return &raw_;
  }
  Bytes& workspace() { return workspace_; }
  Bytes& state() { return state_; }

 private:
  Bytes workspace_;
  Bytes state_;
  terse_scratch_v1 raw_{};
};

// ---- One instance (init .. finalize) of a plugin.
class Instance {
 public:
  using ParamList = std::vector<std::pair<std::string, std::string>>;

  Instance(const Plugin& plugin, ParamList params = {}) : api_(plugin.api()) {
    if (api_ == nullptr) return;
    std::vector<terse_param_v1> raw;
    for (const auto& [k, v] : params) raw.push_back({k.c_str(), v.c_str()});
    init_status_ = api_->init(raw.empty() ? nullptr : raw.data(), raw.size(), host_.get(), &ctx_);
  }
  ~Instance() {
    if (api_ != nullptr && ctx_ != nullptr && init_status_ == TERSE_OK) {
      EXPECT_EQ(api_->finalize(ctx_), TERSE_OK) << host_.lastError();
    }
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  terse_status_v1 initStatus() const { return init_status_; }
  bool ok() const { return api_ != nullptr && init_status_ == TERSE_OK; }
  const terse_compressor_v1& api() const { return *api_; }
  void* ctx() const { return ctx_; }
  CapturingHost& host() { return host_; }
  std::string lastError() const { return host_.lastError(); }

  terse_status_v1 getCaps(terse_dtype_v1 dtype, terse_compressor_caps_v1* caps) {
    *caps = terse_compressor_caps_v1{};
    caps->struct_size = sizeof(terse_compressor_caps_v1);
    return api_->get_caps(ctx_, dtype, caps);
  }
  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype = TERSE_DTYPE_F32) {
    terse_compressor_caps_v1 c{};
    const terse_status_v1 s = getCaps(dtype, &c);
    if (s != TERSE_OK) ADD_FAILURE() << "get_caps returned " << s << ": " << lastError();
    return c;
  }
  terse_status_v1 getSizes(const terse_tensor_info_v1& info, terse_compressor_sizes_v1* sizes) {
    *sizes = terse_compressor_sizes_v1{};
    sizes->struct_size = sizeof(terse_compressor_sizes_v1);
    terse_tensor_info_v1 at_setup = info;  // the ABI: step, seed and source_rank are 0 at sizing time
    at_setup.step = 0, at_setup.seed = 0, at_setup.source_rank = 0, at_setup.reserved0 = 0;
    return api_->get_sizes(ctx_, &at_setup, sizes);
  }
  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) {
    terse_compressor_sizes_v1 s{};
    const terse_status_v1 status = getSizes(info, &s);
    if (status != TERSE_OK) ADD_FAILURE() << "get_sizes returned " << status << ": " << lastError();
    return s;
  }

  // compress into a buffer of exactly max_output_bytes (or `capacity` when given), resized to what was written.
  // `scratch` NULL: a fresh one from the sizes (fine for stateless plugins).
  terse_status_v1 tryCompress(const terse_tensor_info_v1& info, std::span<const float> input, Bytes* out,
                              Scratch* scratch = nullptr, std::span<const std::byte> prev = {}, int64_t capacity = -1) {
    return tryCompressRaw(info, input.empty() ? nullptr : input.data(), out, scratch, prev, capacity);
  }
  terse_status_v1 tryCompressRaw(const terse_tensor_info_v1& info, const void* input, Bytes* out,
                                 Scratch* scratch = nullptr, std::span<const std::byte> prev = {},
                                 int64_t capacity = -1) {
    terse_compressor_sizes_v1 s{};
    const terse_status_v1 sized = getSizes(info, &s);
    if (sized != TERSE_OK) return sized;
    Scratch local(s);
    if (scratch == nullptr) scratch = &local;
    out->assign(capacity >= 0 ? static_cast<size_t>(capacity) : static_cast<size_t>(s.max_output_bytes),
                std::byte{0xCD});  // garbage, so a plugin that skips bytes is caught by the byte-exact tests
    uint64_t written = ~uint64_t{0};
    const terse_status_v1 status =
        api_->compress(ctx_, &info, input, prev.empty() ? nullptr : prev.data(), prev.size(), scratch->get(),
                       out->empty() ? nullptr : out->data(), out->size(), &written, nullptr);
    if (status == TERSE_OK) {
      if (written > out->size()) {
        ADD_FAILURE() << "compress wrote " << written << " bytes into " << out->size();
        written = out->size();
      }
      out->resize(static_cast<size_t>(written));
    }
    return status;
  }
  Bytes compress(const terse_tensor_info_v1& info, std::span<const float> input, Scratch* scratch = nullptr,
                 std::span<const std::byte> prev = {}) {
    Bytes out;
    const terse_status_v1 status = tryCompress(info, input, &out, scratch, prev);
    if (status != TERSE_OK) {
      ADD_FAILURE() << "compress returned " << status << ": " << lastError();
      out.clear();
    }
    return out;
  }

  // decompress into `out` (info.numel floats); accumulate adds.
  terse_status_v1 decompress(const terse_tensor_info_v1& info, std::span<const std::byte> payload, std::span<float> out,
                             bool accumulate = false, Scratch* scratch = nullptr) {
    return decompressRaw(info, payload, out.empty() ? nullptr : out.data(), accumulate, scratch);
  }
  terse_status_v1 decompressRaw(const terse_tensor_info_v1& info, std::span<const std::byte> payload, void* out,
                                bool accumulate = false, Scratch* scratch = nullptr) {
    Scratch local;
    if (scratch == nullptr) {
      terse_compressor_sizes_v1 s{};
      const terse_status_v1 sized = getSizes(info, &s);
      if (sized != TERSE_OK) return sized;
      local = Scratch(s);
      scratch = &local;
    }
    // An empty payload is passed as NULL, as the core would for zero bytes.
    return api_->decompress(ctx_, &info, payload.empty() ? nullptr : payload.data(), payload.size(), scratch->get(),
                            out, accumulate ? 1 : 0, nullptr);
  }
  // decompress into a fresh vector; ADD_FAILURE on a non-OK status.
  std::vector<float> decode(const terse_tensor_info_v1& info, std::span<const std::byte> payload) {
    std::vector<float> out(static_cast<size_t>(info.numel), 0.0f);
    const terse_status_v1 status = decompress(info, payload, out);
    if (status != TERSE_OK) ADD_FAILURE() << "decompress returned " << status << ": " << lastError();
    return out;
  }

  // reduce into a buffer of max_reduced_bytes; NULL reduce pointer is reported as TERSE_ERR_UNSUPPORTED.
  terse_status_v1 tryReduce(const terse_tensor_info_v1& info, std::span<const std::byte> a,
                            std::span<const std::byte> b, Bytes* out, Scratch* scratch = nullptr) {
    if (api_->reduce == nullptr) return TERSE_ERR_UNSUPPORTED;
    terse_compressor_sizes_v1 s{};
    const terse_status_v1 sized = getSizes(info, &s);
    if (sized != TERSE_OK) return sized;
    Scratch local(s);
    if (scratch == nullptr) scratch = &local;
    out->assign(static_cast<size_t>(s.max_reduced_bytes), std::byte{0xCD});
    uint64_t written = ~uint64_t{0};
    const terse_status_v1 status =
        api_->reduce(ctx_, &info, a.empty() ? nullptr : a.data(), a.size(), b.empty() ? nullptr : b.data(), b.size(),
                     scratch->get(), out->empty() ? nullptr : out->data(), out->size(), &written, nullptr);
    if (status == TERSE_OK) {
      if (written > out->size()) {
        ADD_FAILURE() << "reduce wrote " << written << " bytes into " << out->size();
        written = out->size();
      }
      out->resize(static_cast<size_t>(written));
    }
    return status;
  }
  Bytes reduce(const terse_tensor_info_v1& info, std::span<const std::byte> a, std::span<const std::byte> b) {
    Bytes out;
    const terse_status_v1 status = tryReduce(info, a, b, &out);
    if (status != TERSE_OK) {
      ADD_FAILURE() << "reduce returned " << status << ": " << lastError();
      out.clear();
    }
    return out;
  }

 private:
  const terse_compressor_v1* api_ = nullptr;
  CapturingHost host_;
  void* ctx_ = nullptr;
  terse_status_v1 init_status_ = TERSE_ERR_INTERNAL;
};

// ---- The core's aggregation paths, written out so tests can check the end result a training step would see.

// SUM: the first header_bytes are carried through (and must be identical on every rank); the rest is summed
// elementwise as wire_dtype, 16-bit values accumulated in f32 per pair and rounded back (as the core does).
inline Bytes sumPayloads(const std::vector<Bytes>& payloads, uint64_t header_bytes, terse_dtype_v1 wire_dtype) {
  if (payloads.empty()) return {};
  Bytes total = payloads[0];
  for (size_t r = 1; r < payloads.size(); ++r) {
    if (payloads[r].size() != total.size()) {
      ADD_FAILURE() << "SUM payload sizes differ: " << payloads[r].size() << " vs " << total.size();
      return {};
    }
    if (std::memcmp(payloads[r].data(), total.data(), static_cast<size_t>(header_bytes)) != 0) {
      ADD_FAILURE() << "SUM headers differ between rank 0 and rank " << r;
    }
    if (wire_dtype == TERSE_DTYPE_F32) {
      for (size_t off = static_cast<size_t>(header_bytes); off + 4 <= total.size(); off += 4) {
        float a, b;
        std::memcpy(&a, total.data() + off, 4);
        std::memcpy(&b, payloads[r].data() + off, 4);
        a += b;
        std::memcpy(total.data() + off, &a, 4);
      }
    } else {
      const bool half = wire_dtype == TERSE_DTYPE_F16;
      for (size_t off = static_cast<size_t>(header_bytes); off + 2 <= total.size(); off += 2) {
        uint16_t a, b;
        std::memcpy(&a, total.data() + off, 2);
        std::memcpy(&b, payloads[r].data() + off, 2);
        const float s = half ? sdk::halfToFloat(a) + sdk::halfToFloat(b) : sdk::bf16ToFloat(a) + sdk::bf16ToFloat(b);
        const uint16_t c = half ? sdk::floatToHalf(s) : sdk::floatToBf16(s);
        std::memcpy(total.data() + off, &c, 2);
      }
    }
  }
  return total;
}

// CUSTOM: fold the payloads in rank order with reduce (as the core does), returning the aggregate.
inline Bytes foldPayloads(Instance& c, const terse_tensor_info_v1& info, const std::vector<Bytes>& payloads) {
  if (payloads.empty()) return {};
  Bytes acc = payloads[0];
  terse_tensor_info_v1 agg = aggregateInfo(info);
  for (size_t r = 1; r < payloads.size(); ++r) acc = c.reduce(agg, acc, payloads[r]);
  return acc;
}

// ---- Inputs and sizes the per-compressor tests share (one definition, so that their files can join one unity batch).

// n draws of N(mean, stddev^2) from mt19937(seed): the same values for the same arguments on every platform the tests
// run on (libstdc++'s normal_distribution).
inline std::vector<float> gaussian(size_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// How many buckets of `bucket` elements n elements make; bucket 0 is one bucket of all of them, and 0 elements none.
inline uint64_t bucketsOf(uint64_t n, uint64_t bucket) {
  if (n == 0) return 0;
  if (bucket == 0) return 1;
  return (n - 1) / bucket + 1;
}

// Gaussian values with the awkward ones mixed in (for the vector loops' bit-for-bit tests against the scalar ones):
// zeros of both signs, subnormals, tiny and huge normals, and runs of equal magnitudes; every `bucket`-th bucket (when
// given) holds only subnormals, and the one after it only zeros.
inline std::vector<float> awkwardInput(uint64_t n, uint32_t seed, uint64_t bucket = 0) {
  auto v = gaussian(n, seed);
  const float special[] = {0.0f,   -0.0f,  1e-40f, -3e-42f, std::numeric_limits<float>::denorm_min(),
                           1e-30f, -2e20f, 1.0f,   -1.0f,   std::numeric_limits<float>::min()};
  for (uint64_t i = 0; i < n; i += 7) v[i] = special[(i / 7) % std::size(special)];
  if (bucket != 0) {
    for (uint64_t b = 2; (b + 2) * bucket <= n; b += 5) {
      for (uint64_t i = 0; i < bucket; ++i) {
        v[b * bucket + i] = (i % 3 == 0 ? -1.0f : 1.0f) * static_cast<float>(i + 1) * 1e-44f;
        v[(b + 1) * bucket + i] = i % 2 == 0 ? 0.0f : -0.0f;
      }
    }
  }
  return v;
}

// ---- The stochastic rounding draws of qsgd and terngrad (their rounding_bits parameter), written out here from the
// documented layout rather than through sdk::drawAt, so that a wrong drawAt fails the payload tests.

// Element i's draw at width b as the quantizers read it: r_i << (32 - b), r_i being bits(i) >> 8 (b = 24), half
// (i mod 2) of stream word i div 2 (b = 16), byte (i mod 4) of word i div 4 (b = 8), the low half / byte first.
inline uint32_t referenceDraw(const sdk::PhiloxStream& s, uint64_t i, unsigned b) {
  if (b == 24) return s.bits(i);
  if (b == 16) return ((i % 2 == 0 ? s.bits(i / 2) : s.bits(i / 2) >> 16) & 0xFFFFu) << 16;
  return ((s.bits(i / 4) >> (8 * (i % 4))) & 0xFFu) << 24;
}

// Stream words for the vector loops' bit-for-bit tests: Philox words with awkward ones forced in every 5th word, so
// that 24-bit draws of 0 and of 1 - 2^-24 occur, and 16- and 8-bit draws of 0, of 1 - 2^-b and of 2^-b (the all-zero
// and all-one words, and words whose halves or bytes differ: a loop that read the wrong half or byte would differ).
inline std::vector<uint32_t> awkwardStreamWords(uint64_t count, uint64_t seed) {
  std::vector<uint32_t> bits(count);
  const sdk::PhiloxStream s(seed, 1, 2);
  for (uint64_t i = 0; i < count; ++i) bits[i] = s.bits(i);
  const uint32_t special[] = {0u,          0xFFFFFFFFu, 0xFFu,       0x100u,      0x80000000u, 0x7FFFFF00u,
                              0x0000FFFFu, 0xFFFF0000u, 0x00010000u, 0x00000001u, 0xFF00FF00u, 0x01FE7F80u};
  for (uint64_t i = 0; i < count; i += 5) bits[i] = special[(i / 5) % std::size(special)];
  return bits;
}

// ---- Payload surgery for validation tests.

// A copy with `bytes` bytes cut from the end.
inline Bytes truncated(const Bytes& p, size_t bytes) {
  return Bytes(p.begin(), p.end() - static_cast<std::ptrdiff_t>(bytes < p.size() ? bytes : p.size()));
}
// A copy with the `T` at byte offset `offset` replaced by `value`.
template <class T>
Bytes patched(const Bytes& p, size_t offset, T value) {
  Bytes q = p;
  if (offset + sizeof(T) > q.size()) {
    ADD_FAILURE() << "patch at " << offset << " beyond a payload of " << q.size() << " bytes";
    return q;
  }
  std::memcpy(q.data() + offset, &value, sizeof(T));
  return q;
}
template <class T>
T readAt(const Bytes& p, size_t offset) {
  T v{};
  if (offset + sizeof(T) > p.size()) {
    ADD_FAILURE() << "read at " << offset << " beyond a payload of " << p.size() << " bytes";
    return v;
  }
  std::memcpy(&v, p.data() + offset, sizeof(T));
  return v;
}

// The status of decompressing `payload`, and whether the output (pre-filled with a sentinel) was left untouched.
struct DecodeOutcome {
  terse_status_v1 status;
  bool untouched;
};
inline DecodeOutcome decodeOutcome(Instance& c, const terse_tensor_info_v1& info, std::span<const std::byte> payload,
                                   bool accumulate = false) {
  constexpr float kSentinel = -12345.5f;
  std::vector<float> out(static_cast<size_t>(info.numel), kSentinel);
  DecodeOutcome o{c.decompress(info, payload, out, accumulate), true};
  for (float v : out) o.untouched = o.untouched && v == kSentinel;
  return o;
}

// Checks that decompress refuses the damage every self-describing payload must catch, with TERSE_ERR_INVALID_PAYLOAD:
// every truncation (each length for payloads up to 4 KiB, a spread of lengths beyond), trailing bytes, and a changed
// magic, format version, dtype and numel in the SDK's 16-byte header. With `untouched`, also that the output was not
// written (validation before any write, so a bad payload cannot half-accumulate into the sum).
inline void expectRejectsStructuralDamage(Instance& c, const terse_tensor_info_v1& info, const Bytes& payload,
                                          bool untouched = true) {
  ASSERT_EQ(decodeOutcome(c, info, payload).status, TERSE_OK) << "the undamaged payload must decode: " << c.lastError();
  auto expectBad = [&](const Bytes& p, const std::string& what) {
    const DecodeOutcome o = decodeOutcome(c, info, p, /*accumulate=*/true);
    EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD) << what << ": " << c.lastError();
    if (untouched) {
      EXPECT_TRUE(o.untouched) << what << ": output written before the payload was rejected";
    }
  };
  const size_t n = payload.size();
  std::vector<size_t> cuts;
  if (n <= 4096) {
    for (size_t k = 1; k <= n; ++k) cuts.push_back(k);
  } else {
    for (size_t k = 1; k <= 64; ++k) cuts.push_back(k);
    for (size_t k = n - 64; k > 64; k /= 2) cuts.push_back(k);
  }
  for (size_t k : cuts) expectBad(truncated(payload, k), "truncated by " + std::to_string(k) + " bytes");
  Bytes longer = payload;
  longer.push_back(std::byte{0});
  expectBad(longer, "one trailing byte");
  for (int i = 0; i < 8; ++i) longer.push_back(std::byte{0});
  expectBad(longer, "nine trailing bytes");
  if (n >= 16) {
    expectBad(patched<uint32_t>(payload, 0, readAt<uint32_t>(payload, 0) ^ 0x00010000u), "magic changed");
    expectBad(patched<uint16_t>(payload, 4, static_cast<uint16_t>(readAt<uint16_t>(payload, 4) + 1)),
              "format version changed");
    expectBad(patched<uint16_t>(payload, 6, static_cast<uint16_t>(TERSE_DTYPE_F64)), "dtype changed");
    expectBad(patched<uint64_t>(payload, 8, info.numel + 1), "numel + 1");
    if (info.numel > 0) expectBad(patched<uint64_t>(payload, 8, info.numel - 1), "numel - 1");
    expectBad(patched<uint64_t>(payload, 8, ~uint64_t{0}), "numel 2^64 - 1");
  }
}

// Mean and variance helpers for statistical tests with fixed seeds.
struct RunningMoments {
  std::vector<double> sum, sum_sq;
  uint64_t count = 0;
  explicit RunningMoments(size_t n) : sum(n, 0.0), sum_sq(n, 0.0) {}
  void add(std::span<const float> x) {
    for (size_t i = 0; i < x.size(); ++i) {
      sum[i] += x[i];
      sum_sq[i] += static_cast<double>(x[i]) * x[i];
    }
    ++count;
  }
  double mean(size_t i) const { return sum[i] / static_cast<double>(count); }
};

}  // namespace terse::testing

// In-test terse::Compressor implementations: deterministic, tiny, and recording what the codec handed them, so the
// codec chain is tested without loading any plugin file. Payloads follow the ABI's rules (self-describing header,
// validated on decompress) so the same tests would pass against a real plugin with the same math.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/plugin/compressor.h"

namespace terse::testing {

// 16 bytes, so the float sections after it stay 16-byte aligned; also the SUM header (identical on every rank).
struct FakeHeader {
  uint32_t magic;
  uint32_t round;
  uint64_t numel;
};
static_assert(sizeof(FakeHeader) == 16);
inline constexpr uint64_t kFakeHeaderBytes = sizeof(FakeHeader);
// Size of a header + n floats payload (every fake's full-tensor payload).
inline constexpr std::size_t payloadBytes(uint64_t n) {
  return static_cast<std::size_t>(kFakeHeaderBytes + n * sizeof(float));
}

// EXPECT_THROW plus a look at the message: errors must say what was wrong and with which value.
template <class E, class F>
void expectThrowWith(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  }
}

inline TensorInfo flatTensor(uint64_t numel, DType dtype = DType::kF32, int rank = 0, int world_size = 1,
                             uint64_t tensor_id = 0) {
  TensorInfo t;
  t.dtype = dtype;
  t.numel = numel;
  t.ndim = 1;
  t.shape = {static_cast<int64_t>(numel), 0, 0, 0};
  t.tensor_id = tensor_id;
  t.rank = rank;
  t.world_size = world_size;
  t.source_rank = rank;
  return t;
}

inline std::vector<float> floatsOf(const void* p, uint64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  if (n != 0) std::memcpy(v.data(), p, static_cast<std::size_t>(n) * sizeof(float));
  return v;
}

class FakeCompressor : public Compressor {
 public:
  explicit FakeCompressor(std::string name) {
    plugin_.name = std::move(name);
    plugin_.description = "in-test fake";
    plugin_.version = "0";
    plugin_.abi_version = 1;
  }
  const PluginInfo& plugin() const override { return plugin_; }
  // Phases as a plugin reports them (terse/phases_v1.h); set before the instance is bound to a tensor.
  void setPhaseSteps(std::vector<uint64_t> steps) { phases_ = std::move(steps); }
  std::span<const uint64_t> phaseSteps() const override { return phases_; }
  // Compressor::caps answers a reference that lives as long as the instance: each dtype's answer (or its error) is
  // made once, by makeCaps, on first use; in-process ranks may ask concurrently.
  const CompressorCaps& caps(DType dtype) const final {
    const auto raw = static_cast<int32_t>(dtype);
    if (!isValidDType(raw)) TERSE_THROW(InvalidArgument, plugin_.name << ": dtype value " << raw << " is not known");
    CapsSlot& slot = caps_[static_cast<std::size_t>(raw)];
    std::call_once(slot.once, [&] {
      try {
        slot.caps = makeCaps(dtype);
      } catch (...) {
        slot.error = std::current_exception();
      }
    });
    if (slot.error) std::rethrow_exception(slot.error);
    return slot.caps;
  }
  uint64_t reduce(const TensorInfo&, std::span<const std::byte>, std::span<const std::byte>, const Scratch&,
                  std::span<std::byte>, void*) const override {
    TERSE_THROW(InvalidArgument, plugin_.name << ": reduce is for CUSTOM aggregation only");
  }

 protected:
  virtual CompressorCaps makeCaps(DType dtype) const = 0;
  // Writes a header + floats payload; returns its size.
  static uint64_t writePayload(uint32_t magic, uint32_t round, std::span<const float> values,
                               std::span<std::byte> out) {
    const uint64_t bytes = kFakeHeaderBytes + values.size() * sizeof(float);
    if (out.size() < bytes) TERSE_THROW(InvalidArgument, "fake: output too small");
    const FakeHeader h{magic, round, values.size()};
    std::memcpy(out.data(), &h, sizeof h);
    if (!values.empty()) std::memcpy(out.data() + kFakeHeaderBytes, values.data(), values.size() * sizeof(float));
    return bytes;
  }
  // Validates a header + floats payload and returns its header; the payload is untrusted.
  static FakeHeader readHeader(uint32_t magic, std::span<const std::byte> payload, uint64_t values) {
    FakeHeader h{};
    if (payload.size() < kFakeHeaderBytes) TERSE_THROW(InvalidPayload, "fake: payload shorter than its header");
    std::memcpy(&h, payload.data(), sizeof h);
    if (h.magic != magic) TERSE_THROW(InvalidPayload, "fake: bad magic");
    if (payload.size() != kFakeHeaderBytes + values * sizeof(float))
      TERSE_THROW(InvalidPayload, "fake: payload of " << payload.size() << " B for " << values << " values");
    return h;
  }
  static void writeOut(std::span<const std::byte> payload, uint64_t numel, void* out, bool accumulate) {
    auto* o = static_cast<float*>(out);
    for (uint64_t i = 0; i < numel; ++i) {
      float v;
      std::memcpy(&v, payload.data() + kFakeHeaderBytes + i * sizeof(float), sizeof v);
      o[i] = accumulate ? o[i] + v : v;
    }
  }

 private:
  struct CapsSlot {
    std::once_flag once;
    CompressorCaps caps;
    std::exception_ptr error;
  };
  PluginInfo plugin_;
  std::vector<uint64_t> phases_;
  mutable std::array<CapsSlot, TERSE_DTYPE_COUNT_V1> caps_;
};

// Deterministic lossy compressor: truncates toward zero to a multiple of 0.5. SUM over f32 with a 16-byte header.
// Caps answer every float dtype (so a codec can be built for f16 and the decorators' dtype checks are reached), but
// compress handles f32 only. Records every compress/decompress call's info.
class TruncCompressor : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x434e5254;  // "TRNC"
  explicit TruncCompressor(bool shared_seed = false) : FakeCompressor("trunc"), shared_seed_(shared_seed) {}

  // x * 2, trunc and * 0.5 are exact in binary floating point, so D(C(p)) is exactly this.
  static float quantize(float x) { return std::trunc(x * 2.0f) * 0.5f; }

  CompressorCaps makeCaps(DType dtype) const override {
    if (!isFloat(dtype)) TERSE_THROW(Unsupported, "trunc: dtype " << dtypeName(dtype));
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kSum;
    c.wire_dtype = DType::kF32;
    c.fixed_size = true;
    c.shared_seed = shared_seed_;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = kFakeHeaderBytes + info.numel * sizeof(float);
    s.sum_header_bytes = kFakeHeaderBytes;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    if (info.dtype != DType::kF32) TERSE_THROW(Unsupported, "trunc: compress handles f32 only");
    compress_calls.push_back(info);
    std::vector<float> q = floatsOf(input, info.numel);
    for (float& x : q) x = quantize(x);
    return writePayload(kMagic, 0, q, out);
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    readHeader(kMagic, payload, info.numel);
    decompress_calls.push_back(info);
    writeOut(payload, info.numel, out, accumulate);
  }

  mutable std::vector<TensorInfo> compress_calls;
  mutable std::vector<TensorInfo> decompress_calls;

 private:
  bool shared_seed_;
};

// Sparsifier for the DGC tests: keeps x where |x| >= threshold, sends 0 elsewhere (dense SUM payload with zeros, so
// D(C(v)) is v on the kept coordinates and 0 elsewhere, exactly what momentum factor masking keys on).
class ThresholdCompressor : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x48524854;  // "THRH"
  explicit ThresholdCompressor(float threshold) : FakeCompressor("threshold"), threshold_(threshold) {}

  float keep(float x) const { return std::fabs(x) >= threshold_ ? x : 0.0f; }

  CompressorCaps makeCaps(DType dtype) const override {
    if (dtype != DType::kF32) TERSE_THROW(Unsupported, "threshold: dtype " << dtypeName(dtype));
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kSum;
    c.fixed_size = true;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = kFakeHeaderBytes + info.numel * sizeof(float);
    s.sum_header_bytes = kFakeHeaderBytes;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    std::vector<float> v = floatsOf(input, info.numel);
    for (float& x : v) x = keep(x);
    return writePayload(kMagic, 0, v, out);
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    readHeader(kMagic, payload, info.numel);
    writeOut(payload, info.numel, out, accumulate);
  }

 private:
  float threshold_;
};

// A 2-round compressor shaped like PowerSGD (round 0: a small summed "factor"; round 1: the full payload computed
// against round 0's aggregate). Round 0 sends the sum of the input; round 1 sends quantize(x_i) + quantize(s) where s
// is the first value of round 0's aggregate (prev). Only a round-1 payload can be decompressed. Records the input and
// prev of every compress call and every decompress call, and keeps a marker in the workspace from round 0 to the end
// of the step, as the ABI promises.
class TwoRoundCompressor : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x444e5232;  // "2RND"
  struct Call {
    TensorInfo info;
    std::vector<float> input;
    std::vector<std::byte> prev;
  };
  struct Decode {
    TensorInfo info;
    bool accumulate;
  };

  TwoRoundCompressor() : FakeCompressor("two_round") {}

  CompressorCaps makeCaps(DType dtype) const override {
    if (dtype != DType::kF32) TERSE_THROW(Unsupported, "two_round: dtype " << dtypeName(dtype));
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kSum;
    c.fixed_size = true;
    c.num_rounds = 2;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = kFakeHeaderBytes + (info.round == 0 ? 1 : info.numel) * sizeof(float);
    s.sum_header_bytes = kFakeHeaderBytes;
    s.workspace_bytes = info.round == 0 ? 8 : 64;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte> prev, const Scratch& scratch,
                    std::span<std::byte> out, void*) const override {
    calls.push_back({info, floatsOf(input, info.numel), std::vector<std::byte>(prev.begin(), prev.end())});
    const uint64_t marker = info.step + 1;
    if (info.round == 0) {
      if (!prev.empty()) TERSE_THROW(InvalidArgument, "two_round: round 0 got a prev");
      std::memcpy(scratch.workspace.data(), &marker, sizeof marker);
      float sum = 0;
      for (float x : calls.back().input) sum += x;
      return writePayload(kMagic, 0, std::span<const float>(&sum, 1), out);
    }
    uint64_t seen;
    std::memcpy(&seen, scratch.workspace.data(), sizeof seen);
    if (seen != marker) TERSE_THROW(InternalError, "two_round: workspace lost between rounds");
    const FakeHeader h = readHeader(kMagic, prev, 1);
    if (h.round != 0) TERSE_THROW(InvalidPayload, "two_round: prev is not a round-0 aggregate");
    float s;
    std::memcpy(&s, prev.data() + kFakeHeaderBytes, sizeof s);
    std::vector<float> v = calls.back().input;
    for (float& x : v) x = TruncCompressor::quantize(x) + TruncCompressor::quantize(s);
    return writePayload(kMagic, 1, v, out);
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    const FakeHeader h = readHeader(kMagic, payload, info.numel);
    if (h.round != 1 || info.round != 1) TERSE_THROW(InvalidPayload, "two_round: only round-1 payloads decompress");
    decodes.push_back({info, accumulate});
    writeOut(payload, info.numel, out, accumulate);
  }

  mutable std::vector<Call> calls;
  mutable std::vector<Decode> decodes;
};

// Probes the codec's memory handling: 2 rounds with different workspace and state sizes (the codec must hand the
// maximum to every call, aligned to 64 bytes, with the state zero-filled once and kept across steps), CUSTOM
// aggregation (reduce's round and source_rank), and how often sizes is asked.
class ScratchProbe : public FakeCompressor {
 public:
  struct Seen {
    TensorInfo info;
    std::size_t workspace_bytes;
    std::size_t state_bytes;
    bool aligned;
    uint64_t counter;  // the state's counter before this call incremented it
  };

  ScratchProbe() : FakeCompressor("scratch_probe") {}

  CompressorCaps makeCaps(DType dtype) const override {
    if (dtype != DType::kF32) TERSE_THROW(Unsupported, "scratch_probe: dtype " << dtypeName(dtype));
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kCustom;
    c.stateful = true;
    c.num_rounds = 2;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    sizes_infos.push_back(info);
    CompressorSizes s;
    s.max_output_bytes = 8;
    s.workspace_bytes = info.round == 0 ? 100 : 300;
    s.state_bytes = info.round == 0 ? 40 : 24;
    s.max_reduced_bytes = info.round == 0 ? 8 : 16;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void*, std::span<const std::byte>, const Scratch& scratch,
                    std::span<std::byte> out, void*) const override {
    uint64_t counter;
    std::memcpy(&counter, scratch.state.data(), sizeof counter);
    seen.push_back({info, scratch.workspace.size(), scratch.state.size(), aligned(scratch), counter});
    ++counter;
    std::memcpy(scratch.state.data(), &counter, sizeof counter);
    std::memcpy(out.data(), &counter, sizeof counter);
    return 8;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte>, const Scratch& scratch, void*, bool,
                  void*) const override {
    seen.push_back({info, scratch.workspace.size(), scratch.state.size(), aligned(scratch), 0});
  }
  uint64_t reduce(const TensorInfo& info, std::span<const std::byte>, std::span<const std::byte>,
                  const Scratch& scratch, std::span<std::byte>, void*) const override {
    seen.push_back({info, scratch.workspace.size(), scratch.state.size(), aligned(scratch), 0});
    return 8;
  }

  mutable std::vector<TensorInfo> sizes_infos;
  mutable std::vector<Seen> seen;

 private:
  static bool aligned(const Scratch& s) {
    return reinterpret_cast<std::uintptr_t>(s.workspace.data()) % 64 == 0 &&
           reinterpret_cast<std::uintptr_t>(s.state.data()) % 64 == 0;
  }
};

}  // namespace terse::testing

// The core's C++ view of a compressor plugin instance: checked calls, validated caps and sizes, RAII lifetime.
// Every plugin status becomes a terse::Error whose message names the plugin, its file, the call and the plugin's own
// message; nothing the plugin answers is trusted without a check (caps, sizes, output lengths).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/dtype.h"
#include "core/plugin/plugin_info.h"

namespace terse {

enum class Aggregation : int32_t { kAllgather = 0, kSum = 1, kCustom = 2 };
std::string_view aggregationName(Aggregation a) noexcept;  // "allgather", "sum", "custom"

struct CompressorCaps {
  uint32_t devices = 0;  // TERSE_DEVICE_* bitmask
  Aggregation aggregation = Aggregation::kAllgather;
  DType wire_dtype = DType::kF32;  // SUM only: otherwise this default, not the plugin's (wireDtypeText)
  bool fixed_size = false;
  bool stateful = false;
  bool shared_seed = false;
  bool identity = false;  // TERSE_CAP_IDENTITY: the payload's body is the input unchanged (compressor_v1.h)
  int num_rounds = 1;
};

// The wire dtype as every report prints it (`terse plugins show`, provenance.json, the Python caps): the dtype a SUM
// payload is summed as; "-" for allgather and custom, whose payloads travel and are combined as bytes (the ABI ignores
// their wire_dtype, so wire_dtype above holds a default that describes nothing on the wire).
std::string_view wireDtypeText(const CompressorCaps& caps) noexcept;

struct CompressorSizes {
  uint64_t max_output_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t state_bytes = 0;
  uint64_t sum_header_bytes = 0;
  uint64_t max_reduced_bytes = 0;
};

// One call's tensor description; mirrors terse_tensor_info_v1 without tying the core to one ABI version.
struct TensorInfo {
  DType dtype = DType::kF32;
  uint64_t numel = 0;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  uint32_t device = 0x1u;  // TERSE_DEVICE_HOST or TERSE_DEVICE_CUDA
  int device_index = -1;
  uint64_t tensor_id = 0;
  uint64_t step = 0;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  int round = 0;
  int source_rank = 0;
  uint32_t call_flags = 0;  // TERSE_CALL_* of one call (terse/compressor_v1.h): 0 but for an own payload's decompress
};

// Core-owned per-tensor memory handed to every call (see terse_scratch_v1).
struct Scratch {
  std::span<std::byte> workspace;
  std::span<std::byte> state;
};

using Params = std::vector<std::pair<std::string, std::string>>;

// One initialized instance of a compressor plugin (init on construction, finalize on destruction). Thread-safety is
// the ABI's: calls for different tensors may run concurrently, calls for one tensor must be serialized by the caller.
// A plugin's instance (compressor_plugin.cc) checks everything the plugin answers; any other implementation (an
// in-test fake) keeps the same contract itself, since no layer above checks it again.
class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const PluginInfo& plugin() const = 0;
  // Every parameter the instance uses with its value, the defaults it applied included (provenance records them);
  // nullopt when the plugin does not report them (terse/resolved_params_v1.h is optional) or is not a plugin.
  virtual std::optional<Params> resolvedParams() const { return std::nullopt; }
  // The steps at which the work of a call changes (terse/phases_v1.h), checked once at init: strictly increasing, each
  // above 0, at most TERSE_MAX_PHASES_V1. Empty: one phase (a plugin without the entry point, or not a plugin). Valid
  // while the instance lives. A CALIBRATED simulation measures a step of each phase (experiments/runner/calibration.h).
  virtual std::span<const uint64_t> phaseSteps() const { return {}; }

  // The contract a plugin promises, checked once here in core/plugin (compressor_plugin.cc) for every plugin and
  // trusted by every layer above (plugin_codec.cc, pipeline.cc, engine.cc), which therefore do not check it again:
  // devices nonzero and known, aggregation known, SUM has a float wire dtype and fixed size, rounds in
  // 1..TERSE_MAX_ROUNDS_V1, several rounds only with SUM or CUSTOM, CUSTOM has reduce. Throws Unsupported when the
  // plugin does not handle the dtype. The answer is the instance's one copy of the caps: it stays valid and unchanged
  // while the instance lives, so codecs and pipelines hold a reference to it instead of a copy.
  virtual const CompressorCaps& caps(DType dtype) const = 0;
  // Checked against caps here as well: state only when stateful, SUM header a multiple of the wire dtype and within the
  // output, SUM's summed region a whole number of wire elements, CUSTOM's max_reduced_bytes >= max_output_bytes.
  virtual CompressorSizes sizes(const TensorInfo& info) const = 0;

  // Returns the payload size. The checked calls validate `info` and ask `sizes` (get_sizes) for this call, then run the
  // bound call below, which checks the per-call sizes.
  virtual uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte> prev,
                            const Scratch& scratch, std::span<std::byte> out, void* stream) const = 0;
  virtual void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch& scratch, void* out,
                          bool accumulate, void* stream) const = 0;
  // CUSTOM only; throws InvalidArgument for other aggregations.
  virtual uint64_t reduce(const TensorInfo& info, std::span<const std::byte> a, std::span<const std::byte> b,
                          const Scratch& scratch, std::span<std::byte> out, void* stream) const = 0;

  // ---- The hot path of a bound tensor (core/compress/plugin_codec.h binds one per tensor). The codec validated `info`
  // once at setup (shape, device, rank, round range) and asked `sizes` for the call's round then; these calls trust
  // both, so the hot path looks nothing up and takes no lock. They are the one place every per-call size is checked,
  // for bound and checked calls alike: the caller's scratch and output capacity against `sizes` (InvalidArgument), and
  // what the plugin hands back (its status, the bytes it wrote against `out` and `sizes`, a fixed size exactly;
  // PluginError). The layers above trust a returned size. The defaults run the checked calls.
  virtual uint64_t compressBound(const TensorInfo& info, const CompressorSizes& sizes, const void* input,
                                 std::span<const std::byte> prev, const Scratch& scratch, std::span<std::byte> out,
                                 void* stream) const {
    (void)sizes;
    return compress(info, input, prev, scratch, out, stream);
  }
  virtual void decompressBound(const TensorInfo& info, const CompressorSizes& sizes, std::span<const std::byte> payload,
                               const Scratch& scratch, void* out, bool accumulate, void* stream) const {
    (void)sizes;
    decompress(info, payload, scratch, out, accumulate, stream);
  }
  // decompressBound with the payload check's verdict left in `verdict` (terse/device_verdict_v1.h): a word in the
  // call's memory (the tensor's device, or the host) that the caller zeroed and reads once the call's work has run; a
  // raised (nonzero) word is a refused payload, and the output and state are then as they were. What the plugin can
  // refuse at once is thrown, as from decompressBound. The default -- and a plugin without the entry point -- is
  // decompressBound, which leaves the word alone. A caller that finds a word raised calls decompressBound on the same
  // payload for the refusal's message (the plugin's own).
  virtual void decompressDeferred(const TensorInfo& info, const CompressorSizes& sizes,
                                  std::span<const std::byte> payload, const Scratch& scratch, void* out,
                                  bool accumulate, uint32_t* verdict, void* stream) const {
    (void)verdict;
    decompressBound(info, sizes, payload, scratch, out, accumulate, stream);
  }
  // Whether decompressDeferred may leave its verdict in the word (the plugin exports the entry point).
  virtual bool defersVerdicts() const { return false; }
  // compressBound with the check of `prev` left in `verdict` (terse/device_verdict_v1.h, compress_deferred), a word as
  // decompressDeferred's: a raised word is a refused prev, the output and workspace then undefined, the state as it
  // was, and this step's decompress of the tensor refuses. The default -- and a plugin without the entry point -- is
  // compressBound, which leaves the word alone. A caller that finds the word raised calls compressBound on the same
  // prev for the refusal's message.
  virtual uint64_t compressDeferred(const TensorInfo& info, const CompressorSizes& sizes, const void* input,
                                    std::span<const std::byte> prev, const Scratch& scratch, std::span<std::byte> out,
                                    uint32_t* verdict, void* stream) const {
    (void)verdict;
    return compressBound(info, sizes, input, prev, scratch, out, stream);
  }
  // Whether compressDeferred may leave its verdict in the word (the plugin exports the entry point).
  virtual bool defersPrevVerdicts() const { return false; }
  virtual uint64_t reduceBound(const TensorInfo& info, const CompressorSizes& sizes, std::span<const std::byte> a,
                               std::span<const std::byte> b, const Scratch& scratch, std::span<std::byte> out,
                               void* stream) const {
    (void)sizes;
    return reduce(info, a, b, scratch, out, stream);
  }
};

}  // namespace terse

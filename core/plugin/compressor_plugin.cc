#include "core/plugin/compressor_plugin.h"

#include <array>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/watchdog.h"
#include "core/plugin/plugin_support.h"
#include "terse/compressor_v1.h"
#include "terse/device_verdict_v1.h"
#include "terse/phases_v1.h"

namespace terse {
namespace {

// The struct the instance code drives: the newest compressor ABI this build knows. With a v2 this becomes
// terse_compressor_v2 and the v1 row's adapter fills v2's new fields.
using CompressorApi = terse_compressor_v1;

// Which call of a run failed, for the end of its message: a diverged run's "gradient element 0 is NaN" says nothing of
// where; " (tensor 3, step 57)" says which tensor and step, the round of a multi-round codec, and for a decode whose
// payload it was.
std::string callContext(const TensorInfo& info, bool decode) {
  std::ostringstream s;
  s << " (tensor " << info.tensor_id << ", step " << info.step;
  if (info.round > 0) s << ", round " << info.round;
  if (decode) {
    if (info.source_rank >= 0) {
      s << ", rank " << info.source_rank << "'s payload";
    } else {
      s << ", the aggregate";
    }
  }
  s << ")";
  return s.str();
}

// Validates the exported object found under a row's symbol and lifts it to CompressorApi. `prefix` starts every
// error ("cannot load compressor plugin <path>: ").
using AdaptFn = CompressorApi (*)(const void* symbol, const std::string& prefix);

struct AbiRow {
  uint32_t version;
  const char* symbol;
  AdaptFn adapt;
};

CompressorApi adaptV1(const void* symbol, const std::string& prefix) {
  using A = CompressorApi;
  return detail::readPluginStruct<A>(symbol, TERSE_COMPRESSOR_ABI_V1, TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL, prefix,
                                     {{"init", [](const A& a) { return a.init != nullptr; }},
                                      {"finalize", [](const A& a) { return a.finalize != nullptr; }},
                                      {"get_caps", [](const A& a) { return a.get_caps != nullptr; }},
                                      {"get_sizes", [](const A& a) { return a.get_sizes != nullptr; }},
                                      {"compress", [](const A& a) { return a.compress != nullptr; }},
                                      {"decompress", [](const A& a) { return a.decompress != nullptr; }}});
}

// Newest first.
constexpr AbiRow kAbis[] = {
    {TERSE_COMPRESSOR_ABI_V1, TERSE_COMPRESSOR_PLUGIN_V1_SYMBOL, &adaptV1},
};

std::string hex(uint64_t v) {
  std::ostringstream o;
  o << "0x" << std::hex << v;
  return o.str();
}

std::string devicesName(uint32_t devices) {
  std::string out;
  if (devices & TERSE_DEVICE_HOST) out += "host";
  if (devices & TERSE_DEVICE_CUDA) out += out.empty() ? "cuda" : ",cuda";
  return out.empty() ? "none" : out;
}

std::string describeTensor(const TensorInfo& info) {
  std::ostringstream o;
  o << "tensor " << info.tensor_id << " (" << dtypeName(info.dtype) << ", numel " << info.numel << ", round "
    << info.round << ")";
  return o.str();
}

terse_tensor_info_v1 toAbi(const TensorInfo& info) {
  terse_tensor_info_v1 v{};
  v.struct_size = sizeof(terse_tensor_info_v1);
  v.dtype = static_cast<terse_dtype_v1>(info.dtype);
  v.numel = info.numel;
  v.ndim = info.ndim;
  v.device = info.device;
  for (int i = 0; i < 4; ++i) v.shape[i] = i < info.ndim ? info.shape[static_cast<std::size_t>(i)] : 0;
  v.tensor_id = info.tensor_id;
  v.step = info.step;
  v.seed = info.seed;
  v.rank = info.rank;
  v.world_size = info.world_size;
  v.round = info.round;
  v.source_rank = info.source_rank;
  v.device_index = info.device == TERSE_DEVICE_CUDA ? info.device_index : -1;
  v.reserved0 = info.call_flags;
  return v;
}

terse_scratch_v1 toAbi(const Scratch& s, const CompressorSizes& sizes) {
  // Hand the plugin exactly what it asked for, and NULL exactly when that is 0, as the ABI promises.
  terse_scratch_v1 v{};
  v.workspace_bytes = sizes.workspace_bytes;
  v.workspace = sizes.workspace_bytes ? s.workspace.data() : nullptr;
  v.state_bytes = sizes.state_bytes;
  v.state = sizes.state_bytes ? s.state.data() : nullptr;
  return v;
}

enum class Call { kSizes, kCompress, kDecompress, kReduce };

class PluginCompressor;

}  // namespace

struct CompressorPlugin::Impl {
  std::shared_ptr<detail::SharedLibrary> lib;
  CompressorApi api{};
  terse_resolved_params_fn_v1 resolved_params = nullptr;          // optional (terse/resolved_params_v1.h)
  terse_decompress_deferred_fn_v1 decompress_deferred = nullptr;  // optional (terse/device_verdict_v1.h)
  terse_compress_deferred_fn_v1 compress_deferred = nullptr;      // optional (terse/device_verdict_v1.h)
  terse_compressor_phases_fn_v1 phases = nullptr;                 // optional (terse/phases_v1.h)
  PluginInfo info;
  std::string label;
};

namespace {

// One instance: init in the constructor, finalize in the destructor. Caps are asked for every dtype once, right after
// init (they are pure per the ABI), so caps() and the hot-path checks read an immutable table without a lock.
class PluginCompressor final : public Compressor {
 public:
  PluginCompressor(std::shared_ptr<const CompressorPlugin> plugin, const CompressorPlugin::Impl& impl,
                   const Params& params)
      : plugin_(std::move(plugin)),
        api_(impl.api),
        resolved_params_(impl.resolved_params),
        decompress_deferred_(impl.decompress_deferred),
        compress_deferred_(impl.compress_deferred),
        info_(impl.info),
        label_(impl.label),
        host_(impl.label),
        watch_label_(watchdog::intern(impl.label)) {
    const auto abi_params = detail::toAbiParams(params, label_);
    detail::clearPluginError();
    const watchdog::WatchedCall watched(watch_label_, "init", watchdog::kNoTensor, -1);
    const terse_status_v1 status = api_.init(abi_params.data(), abi_params.size(), host_.host(), &ctx_);
    if (status != TERSE_OK) detail::throwPluginStatus(label_, "init", status);
    for (int32_t d = 0; d < TERSE_DTYPE_COUNT_V1; ++d) {
      try {
        caps_[static_cast<std::size_t>(d)].caps = queryCaps(static_cast<DType>(d));
      } catch (...) {
        caps_[static_cast<std::size_t>(d)].error = std::current_exception();
      }
    }
    if (impl.phases != nullptr) {
      try {
        phase_steps_ = queryPhases(impl.phases);
      } catch (...) {
        finalizeQuietly();  // the destructor does not run for a constructor that throws
        throw;
      }
    }
  }

  ~PluginCompressor() override { finalizeQuietly(); }

  const PluginInfo& plugin() const override { return info_; }
  std::optional<Params> resolvedParams() const override {
    return detail::queryResolvedParams(resolved_params_, ctx_, label_);
  }
  std::span<const uint64_t> phaseSteps() const override { return phase_steps_; }

  const CompressorCaps& caps(DType dtype) const override { return capsRef(dtype); }

  CompressorSizes sizes(const TensorInfo& info) const override {
    const CompressorCaps& caps = capsRef(info.dtype);
    checkInfo(info, caps, Call::kSizes);
    return querySizes(info, caps);
  }

  // The checked calls validate the tensor and ask get_sizes for it, then run the bound call, which checks the scratch,
  // the capacity and what the plugin wrote. They keep no cache: the one per-tensor copy of the sizes is the bound
  // codec's (core/compress/plugin_codec.h), and the hot path runs the bound calls.

  uint64_t compress(const TensorInfo& info_in, const void* input, std::span<const std::byte> prev,
                    const Scratch& scratch, std::span<std::byte> out, void* stream) const override {
    const CompressorCaps& caps = capsRef(info_in.dtype);
    TensorInfo info = info_in;
    info.source_rank = info.rank;  // the ABI: compress sees source_rank == rank
    checkInfo(info, caps, Call::kCompress);
    return compressBound(info, querySizes(info, caps), input, prev, scratch, out, stream);
  }

  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch& scratch, void* out,
                  bool accumulate, void* stream) const override {
    const CompressorCaps& caps = capsRef(info.dtype);
    checkInfo(info, caps, Call::kDecompress);
    TERSE_CHECK(
        info.call_flags == 0 || !accumulate, InvalidArgument,
        label_ << ": TERSE_CALL_OWN_PAYLOAD with accumulate = 1; an own payload is decoded, not accumulated, for "
               << describeTensor(info));
    decompressBound(info, querySizes(info, caps), payload, scratch, out, accumulate, stream);
  }

  uint64_t reduce(const TensorInfo& info, std::span<const std::byte> a, std::span<const std::byte> b,
                  const Scratch& scratch, std::span<std::byte> out, void* stream) const override {
    const CompressorCaps& caps = capsRef(info.dtype);
    TERSE_CHECK(caps.aggregation == Aggregation::kCustom, InvalidArgument,
                label_ << ": reduce called, but its aggregation for " << dtypeName(info.dtype) << " is "
                       << aggregationName(caps.aggregation) << ", not custom");
    checkInfo(info, caps, Call::kReduce);
    return reduceBound(info, querySizes(info, caps), a, b, scratch, out, stream);
  }

  // The bound calls: every per-call size is checked here, once, for bound and checked calls alike (compressor.h).
  uint64_t compressBound(const TensorInfo& info, const CompressorSizes& sz, const void* input,
                         std::span<const std::byte> prev, const Scratch& scratch, std::span<std::byte> out,
                         void* stream) const override {
    return compressCall(info, sz, input, prev, scratch, out, nullptr, stream);
  }

  uint64_t compressDeferred(const TensorInfo& info, const CompressorSizes& sz, const void* input,
                            std::span<const std::byte> prev, const Scratch& scratch, std::span<std::byte> out,
                            uint32_t* verdict, void* stream) const override {
    TERSE_CHECK(verdict != nullptr, InternalError, label_ << ": compress_deferred without a verdict word");
    return compressCall(info, sz, input, prev, scratch, out, compress_deferred_ ? verdict : nullptr, stream);
  }

  bool defersPrevVerdicts() const override { return compress_deferred_ != nullptr; }

  // compress, or compress_deferred with `verdict`; both are checked alike.
  uint64_t compressCall(const TensorInfo& info, const CompressorSizes& sz, const void* input,
                        std::span<const std::byte> prev, const Scratch& scratch, std::span<std::byte> out,
                        uint32_t* verdict, void* stream) const {
    checkCapacity(Call::kCompress, info, sz, scratch, out.size());
    const terse_tensor_info_v1 abi = toAbi(info);
    const terse_scratch_v1 abi_scratch = toAbi(scratch, sz);
    const char* const call = verdict != nullptr ? "compress_deferred" : "compress";
    uint64_t written = 0;
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, call, info.tensor_id, info.rank, info.round);
      const void* const p = prev.empty() ? nullptr : prev.data();
      status = verdict != nullptr ? compress_deferred_(ctx_, &abi, input, p, prev.size(), &abi_scratch, out.data(),
                                                       out.size(), &written, verdict, stream)
                                  : api_.compress(ctx_, &abi, input, p, prev.size(), &abi_scratch, out.data(),
                                                  out.size(), &written, stream);
    }
    if (status != TERSE_OK) detail::throwPluginStatus(label_, call, status, callContext(info, false));
    // A size that breaks the plugin's promises is its bug, classified like the SDK's TERSE_ERR_INTERNAL for the same.
    if (written > out.size()) {
      detail::throwPluginBrokeContract(label_, call,
                                       "it reported " + std::to_string(written) + " bytes written into a buffer of " +
                                           std::to_string(out.size()) + " for " + describeTensor(info));
    }
    if (written > sz.max_output_bytes) {
      detail::throwPluginBrokeContract(label_, call,
                                       "it returned " + std::to_string(written) +
                                           " bytes, above its max_output_bytes " + std::to_string(sz.max_output_bytes) +
                                           " for " + describeTensor(info));
    }
    if (fixedSize(info.dtype) && written != sz.max_output_bytes) {
      detail::throwPluginBrokeContract(label_, call,
                                       "it returned " + std::to_string(written) +
                                           " bytes, but its caps say fixed size and max_output_bytes is " +
                                           std::to_string(sz.max_output_bytes) + " for " + describeTensor(info));
    }
    return written;
  }

  void decompressBound(const TensorInfo& info, const CompressorSizes& sz, std::span<const std::byte> payload,
                       const Scratch& scratch, void* out, bool accumulate, void* stream) const override {
    decompressCall(info, sz, payload, scratch, out, accumulate, nullptr, stream);
  }

  void decompressDeferred(const TensorInfo& info, const CompressorSizes& sz, std::span<const std::byte> payload,
                          const Scratch& scratch, void* out, bool accumulate, uint32_t* verdict,
                          void* stream) const override {
    TERSE_CHECK(verdict != nullptr, InternalError, label_ << ": decompress_deferred without a verdict word");
    decompressCall(info, sz, payload, scratch, out, accumulate, decompress_deferred_ ? verdict : nullptr, stream);
  }

  bool defersVerdicts() const override { return decompress_deferred_ != nullptr; }

  uint64_t reduceBound(const TensorInfo& info, const CompressorSizes& sz, std::span<const std::byte> a,
                       std::span<const std::byte> b, const Scratch& scratch, std::span<std::byte> out,
                       void* stream) const override {
    checkCapacity(Call::kReduce, info, sz, scratch, out.size());
    const terse_tensor_info_v1 abi = toAbi(info);
    const terse_scratch_v1 abi_scratch = toAbi(scratch, sz);
    uint64_t written = 0;
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, "reduce", info.tensor_id, info.rank, info.round);
      status = api_.reduce(ctx_, &abi, a.data(), a.size(), b.data(), b.size(), &abi_scratch, out.data(), out.size(),
                           &written, stream);
    }
    if (status != TERSE_OK) detail::throwPluginStatus(label_, "reduce", status, callContext(info, false));
    if (written > out.size()) {
      detail::throwPluginBrokeContract(label_, "reduce",
                                       "it reported " + std::to_string(written) + " bytes written into a buffer of " +
                                           std::to_string(out.size()) + " for " + describeTensor(info));
    }
    if (written > sz.max_reduced_bytes) {
      detail::throwPluginBrokeContract(label_, "reduce",
                                       "it returned " + std::to_string(written) +
                                           " bytes, above its max_reduced_bytes " +
                                           std::to_string(sz.max_reduced_bytes) + " for " + describeTensor(info));
    }
    return written;
  }

 private:
  struct CapsEntry {
    std::optional<CompressorCaps> caps;
    std::exception_ptr error;  // the Unsupported / PluginError the query raised
  };

  // A bound tensor's dtype was checked against the caps table at bind time: this is one array read.
  bool fixedSize(DType dtype) const { return caps_[static_cast<std::size_t>(dtype)].caps->fixed_size; }

  const CompressorCaps& capsRef(DType dtype) const {
    const auto raw = static_cast<int32_t>(dtype);
    TERSE_CHECK(isValidDType(raw), InvalidArgument, label_ << ": dtype value " << raw << " is not a known dtype");
    const CapsEntry& e = caps_[static_cast<std::size_t>(raw)];
    if (e.error) std::rethrow_exception(e.error);
    return *e.caps;
  }

  CompressorCaps queryCaps(DType dtype) const {
    terse_compressor_caps_v1 raw{};
    raw.struct_size = sizeof raw;
    detail::clearPluginError();
    const watchdog::WatchedCall watched(watch_label_, "get_caps", watchdog::kNoTensor, -1);
    const terse_status_v1 status = api_.get_caps(ctx_, static_cast<terse_dtype_v1>(dtype), &raw);
    if (status != TERSE_OK) {
      detail::throwPluginStatus(label_, "get_caps(" + std::string(dtypeName(dtype)) + ")", status);
    }
    const std::string prefix = label_ + ": invalid caps for " + std::string(dtypeName(dtype)) + ": ";
    TERSE_CHECK(raw.devices != 0 && (raw.devices & ~TERSE_DEVICE_ALL_V1) == 0, PluginError,
                prefix << "devices = " << hex(raw.devices) << ", must be a nonzero subset of "
                       << hex(TERSE_DEVICE_ALL_V1) << " (host 0x1, cuda 0x2)");
    TERSE_CHECK(raw.aggregation >= TERSE_AGG_ALLGATHER && raw.aggregation <= TERSE_AGG_CUSTOM, PluginError,
                prefix << "aggregation = " << raw.aggregation << ", must be 0 (allgather), 1 (sum) or 2 (custom)");
    TERSE_CHECK((raw.flags & ~TERSE_CAP_ALL_V1) == 0, PluginError,
                prefix << "flags = " << hex(raw.flags) << " has bits outside TERSE_CAP_ALL_V1 ("
                       << hex(TERSE_CAP_ALL_V1) << ")");
    TERSE_CHECK(raw.num_rounds >= 1 && raw.num_rounds <= TERSE_MAX_ROUNDS_V1, PluginError,
                prefix << "num_rounds = " << raw.num_rounds << ", must be in 1.." << TERSE_MAX_ROUNDS_V1);
    // With allgather, `prev` would be several payloads whose framing v1 does not define; one aggregate it must be.
    TERSE_CHECK(raw.num_rounds == 1 || raw.aggregation != TERSE_AGG_ALLGATHER, PluginError,
                prefix << "num_rounds = " << raw.num_rounds << " needs aggregation sum or custom, got allgather");
    CompressorCaps caps;
    caps.devices = raw.devices;
    caps.aggregation = static_cast<Aggregation>(raw.aggregation);
    caps.fixed_size = (raw.flags & TERSE_CAP_FIXED_SIZE) != 0;
    caps.stateful = (raw.flags & TERSE_CAP_STATEFUL) != 0;
    caps.shared_seed = (raw.flags & TERSE_CAP_SHARED_SEED) != 0;
    caps.identity = (raw.flags & TERSE_CAP_IDENTITY) != 0;
    caps.num_rounds = raw.num_rounds;
    if (caps.aggregation == Aggregation::kSum) {
      const bool float_wire =
          raw.wire_dtype == TERSE_DTYPE_F32 || raw.wire_dtype == TERSE_DTYPE_F16 || raw.wire_dtype == TERSE_DTYPE_BF16;
      TERSE_CHECK(float_wire, PluginError,
                  prefix << "wire_dtype = " << raw.wire_dtype << " ("
                         << (isValidDType(raw.wire_dtype) ? dtypeName(static_cast<DType>(raw.wire_dtype)) : "unknown")
                         << "), aggregation sum needs f32, f16 or bf16");
      TERSE_CHECK(caps.fixed_size, PluginError,
                  prefix << "aggregation sum requires TERSE_CAP_FIXED_SIZE, but flags = " << hex(raw.flags));
      caps.wire_dtype = static_cast<DType>(raw.wire_dtype);
    }
    // A core that sums the gradient where it lies skips the plugin altogether, so the promise must describe a payload
    // that is the input: summed in the input's own dtype, in one round, with nothing kept between steps.
    TERSE_CHECK(!caps.identity || (caps.aggregation == Aggregation::kSum && caps.wire_dtype == dtype &&
                                   caps.num_rounds == 1 && !caps.stateful),
                PluginError,
                prefix << "TERSE_CAP_IDENTITY needs aggregation sum with wire_dtype " << dtypeName(dtype)
                       << ", one round and no state; got aggregation " << raw.aggregation << ", wire_dtype "
                       << raw.wire_dtype << ", num_rounds " << raw.num_rounds << ", flags = " << hex(raw.flags));
    TERSE_CHECK(caps.aggregation != Aggregation::kCustom || api_.reduce != nullptr, PluginError,
                prefix << "aggregation custom requires the function pointer 'reduce', which is NULL");
    return caps;
  }

  // The core's own preconditions (InvalidArgument: a bug or misuse on the core side, not the plugin's).
  void checkInfo(const TensorInfo& info, const CompressorCaps& caps, Call call) const {
    TERSE_CHECK(info.ndim >= 0 && info.ndim <= 4, InvalidArgument,
                label_ << ": ndim = " << info.ndim << " must be in 0..4 for " << describeTensor(info));
    if (info.ndim > 0) {
      uint64_t product = 1;
      for (int i = 0; i < info.ndim; ++i) {
        const int64_t extent = info.shape[static_cast<std::size_t>(i)];
        TERSE_CHECK(extent >= 0, InvalidArgument, label_ << ": negative shape entry for " << describeTensor(info));
        product *= static_cast<uint64_t>(extent);
      }
      TERSE_CHECK(product == info.numel, InvalidArgument,
                  label_ << ": shape product " << product << " != numel for " << describeTensor(info));
    }
    TERSE_CHECK(info.device == TERSE_DEVICE_HOST || info.device == TERSE_DEVICE_CUDA, InvalidArgument,
                label_ << ": device = " << hex(info.device) << " must be host (0x1) or cuda (0x2)");
    TERSE_CHECK(info.device != TERSE_DEVICE_CUDA || info.device_index >= 0, InvalidArgument,
                label_ << ": a cuda tensor needs device_index >= 0, got " << info.device_index);
    TERSE_CHECK((caps.devices & info.device) != 0, Unsupported,
                label_ << ": does not run on " << devicesName(info.device) << " for " << dtypeName(info.dtype)
                       << " (caps.devices = " << devicesName(caps.devices) << ")");
    TERSE_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size, InvalidArgument,
                label_ << ": rank " << info.rank << " / world_size " << info.world_size << " is not a valid rank");
    TERSE_CHECK(
        info.round >= 0 && info.round < caps.num_rounds, InvalidArgument,
        label_ << ": round " << info.round << " outside 0.." << caps.num_rounds - 1 << " for " << describeTensor(info));
    if (call == Call::kDecompress || call == Call::kReduce) {
      TERSE_CHECK(info.source_rank >= -1 && info.source_rank < info.world_size, InvalidArgument,
                  label_ << ": source_rank " << info.source_rank << " must be -1 or a rank below " << info.world_size);
    }
    // The one call flag marks a decompress of this rank's own payload; anything else is a core bug.
    TERSE_CHECK(info.call_flags == 0 || (info.call_flags == TERSE_CALL_OWN_PAYLOAD && call == Call::kDecompress &&
                                         info.source_rank == info.rank),
                InvalidArgument,
                label_ << ": call flags " << hex(info.call_flags)
                       << " on this call; TERSE_CALL_OWN_PAYLOAD is for a decompress of this rank's own payload "
                          "(source_rank == rank) only, for "
                       << describeTensor(info));
  }

  // The caller's side of a call's sizes (InvalidArgument: a bug or misuse on the core side): the scratch holds what the
  // plugin asked for, and the output holds the call's bound (max_output_bytes for compress, max_reduced_bytes for
  // reduce; decompress writes the tensor, which the caller sized from `info`).
  void checkCapacity(Call call, const TensorInfo& info, const CompressorSizes& sz, const Scratch& scratch,
                     std::size_t capacity) const {
    const char* name = call == Call::kCompress ? "compress" : call == Call::kReduce ? "reduce" : "decompress";
    TERSE_CHECK(scratch.workspace.size() >= sz.workspace_bytes && scratch.state.size() >= sz.state_bytes,
                InvalidArgument,
                label_ << ": " << name << ": scratch has workspace " << scratch.workspace.size() << " / state "
                       << scratch.state.size() << " bytes, the plugin needs " << sz.workspace_bytes << " / "
                       << sz.state_bytes << " for " << describeTensor(info));
    if (call == Call::kDecompress) return;
    const uint64_t bound = call == Call::kCompress ? sz.max_output_bytes : sz.max_reduced_bytes;
    TERSE_CHECK(capacity >= bound, InvalidArgument,
                label_ << ": " << name << ": output capacity " << capacity << " is below "
                       << (call == Call::kCompress ? "max_output_bytes " : "max_reduced_bytes ") << bound << " for "
                       << describeTensor(info));
  }

  CompressorSizes querySizes(const TensorInfo& info_in, const CompressorCaps& caps) const {
    TensorInfo info = info_in;
    info.step = 0;  // the ABI: step, seed and source_rank are 0 in get_sizes, so sizes cannot depend on them
    info.seed = 0;
    info.source_rank = 0;
    info.call_flags = 0;  // flags are per call, and get_sizes is none of the flagged ones
    const terse_tensor_info_v1 abi = toAbi(info);
    terse_compressor_sizes_v1 raw{};
    raw.struct_size = sizeof raw;
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, "get_sizes", info.tensor_id, info.rank, info.round);
      status = api_.get_sizes(ctx_, &abi, &raw);
    }
    if (status != TERSE_OK) detail::throwPluginStatus(label_, "get_sizes", status);
    const std::string prefix = label_ + ": invalid sizes for " + describeTensor(info) + ": ";
    TERSE_CHECK(raw.state_bytes == 0 || caps.stateful, PluginError,
                prefix << "state_bytes = " << raw.state_bytes << " but caps for " << dtypeName(info.dtype)
                       << " are not stateful");
    if (caps.aggregation == Aggregation::kSum) {
      const uint64_t w = dtypeSize(caps.wire_dtype);
      TERSE_CHECK(raw.sum_header_bytes % w == 0, PluginError,
                  prefix << "sum_header_bytes = " << raw.sum_header_bytes << " is not a multiple of the wire dtype "
                         << dtypeName(caps.wire_dtype) << "'s " << w << " bytes");
      TERSE_CHECK(raw.sum_header_bytes <= raw.max_output_bytes, PluginError,
                  prefix << "sum_header_bytes = " << raw.sum_header_bytes
                         << " exceeds max_output_bytes = " << raw.max_output_bytes);
      TERSE_CHECK((raw.max_output_bytes - raw.sum_header_bytes) % w == 0, PluginError,
                  prefix << "the summed region (max_output_bytes " << raw.max_output_bytes << " - sum_header_bytes "
                         << raw.sum_header_bytes << ") is not a whole number of " << dtypeName(caps.wire_dtype)
                         << " elements");
    }
    if (caps.aggregation == Aggregation::kCustom) {
      TERSE_CHECK(raw.max_reduced_bytes >= raw.max_output_bytes, PluginError,
                  prefix << "max_reduced_bytes = " << raw.max_reduced_bytes
                         << " is below max_output_bytes = " << raw.max_output_bytes);
    }
    CompressorSizes sz;
    sz.max_output_bytes = raw.max_output_bytes;
    sz.workspace_bytes = raw.workspace_bytes;
    sz.state_bytes = raw.state_bytes;
    sz.sum_header_bytes = caps.aggregation == Aggregation::kSum ? raw.sum_header_bytes : 0;
    sz.max_reduced_bytes = caps.aggregation == Aggregation::kCustom ? raw.max_reduced_bytes : 0;
    return sz;
  }

  // Both decompress entry points, with the same checks: the deferred one (terse/device_verdict_v1.h) when `verdict`
  // is set.
  void decompressCall(const TensorInfo& info, const CompressorSizes& sz, std::span<const std::byte> payload,
                      const Scratch& scratch, void* out, bool accumulate, uint32_t* verdict, void* stream) const {
    checkCapacity(Call::kDecompress, info, sz, scratch, 0);
    const terse_tensor_info_v1 abi = toAbi(info);
    const terse_scratch_v1 abi_scratch = toAbi(scratch, sz);
    const char* const call = verdict != nullptr ? "decompress_deferred" : "decompress";
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, call, info.tensor_id, info.rank, info.round);
      status = verdict != nullptr ? decompress_deferred_(ctx_, &abi, payload.data(), payload.size(), &abi_scratch, out,
                                                         accumulate ? 1 : 0, verdict, stream)
                                  : api_.decompress(ctx_, &abi, payload.data(), payload.size(), &abi_scratch, out,
                                                    accumulate ? 1 : 0, stream);
    }
    if (status != TERSE_OK) detail::throwPluginStatus(label_, call, status, callContext(info, true));
  }

  // finalize, its failure logged: a destructor, or a constructor that refuses the instance after init, cannot throw it.
  void finalizeQuietly() noexcept {
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, "finalize", watchdog::kNoTensor, -1);
      status = api_.finalize(ctx_);
    }
    if (status != TERSE_OK) {
      TERSE_LOG(LogLevel::kWarn,
                label_ << ": finalize failed [" << detail::statusName(status) << "]: " << detail::takePluginError());
    }
  }

  // terse_compressor_phases_v1's answer, copied and checked (terse/phases_v1.h): the plugin's array is untrusted.
  std::vector<uint64_t> queryPhases(terse_compressor_phases_fn_v1 entry) const {
    const uint64_t* steps = nullptr;
    size_t count = 0;
    detail::clearPluginError();
    terse_status_v1 status;
    {
      const watchdog::WatchedCall watched(watch_label_, "phases", watchdog::kNoTensor, -1);
      status = entry(ctx_, &steps, &count);
    }
    if (status != TERSE_OK) detail::throwPluginStatus(label_, "phases", status);
    TERSE_CHECK(
        count <= TERSE_MAX_PHASES_V1, PluginError,
        label_ << ": phases: " << count << " phase steps, at most " << TERSE_MAX_PHASES_V1 << " (terse/phases_v1.h)");
    TERSE_CHECK(count == 0 || steps != nullptr, PluginError,
                label_ << ": phases: " << count << " phase steps at a NULL array");
    std::vector<uint64_t> out(steps, steps + count);
    for (std::size_t i = 0; i < out.size(); ++i) {
      TERSE_CHECK(out[i] > 0 && (i == 0 || out[i] > out[i - 1]), PluginError,
                  label_ << ": phases: step " << out[i] << " at position " << i
                         << ": the steps must be above 0 and strictly increasing (terse/phases_v1.h)");
    }
    return out;
  }

  std::shared_ptr<const CompressorPlugin> plugin_;  // keeps the file mapped; api_, info_, label_ point into it
  const CompressorApi& api_;
  terse_resolved_params_fn_v1 resolved_params_;
  terse_decompress_deferred_fn_v1 decompress_deferred_;
  terse_compress_deferred_fn_v1 compress_deferred_;
  const PluginInfo& info_;
  const std::string& label_;
  detail::HostBinding host_;
  const char* watch_label_;  // label_ as the watchdog and the crash handler name it (watchdog::intern)
  void* ctx_ = nullptr;
  // The instance's one copy of the caps (compressor.h): codecs and pipelines hold references into it.
  std::array<CapsEntry, TERSE_DTYPE_COUNT_V1> caps_;
  std::vector<uint64_t> phase_steps_;  // terse/phases_v1.h, checked
};

}  // namespace

CompressorPlugin::CompressorPlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompressorPlugin::~CompressorPlugin() = default;

const PluginInfo& CompressorPlugin::info() const noexcept {
  return impl_->info;
}

std::vector<uint32_t> CompressorPlugin::supportedAbiVersions() {
  std::vector<uint32_t> out;
  for (const auto& row : kAbis) out.push_back(row.version);
  return out;
}

std::shared_ptr<const CompressorPlugin> CompressorPlugin::open(const std::filesystem::path& path, std::string origin,
                                                               std::vector<std::filesystem::path> shadowed) {
  auto lib =
      detail::SharedLibrary::open(detail::canonicalPluginPath(path, PluginKind::kCompressor), PluginKind::kCompressor);
  const std::filesystem::path& file = lib->path();
  const std::string prefix = detail::loadErrorPrefix(PluginKind::kCompressor, file);
  for (const auto& row : kAbis) {
    const void* symbol = lib->symbol(row.symbol);
    if (symbol == nullptr) continue;
    auto impl = std::make_unique<Impl>();
    impl->api = row.adapt(symbol, prefix);
    impl->info.path = file;
    impl->resolved_params = detail::resolvedParamsEntry(*lib, PluginKind::kCompressor);
    // dlsym hands functions back as object pointers; POSIX guarantees the round trip.
    impl->decompress_deferred = reinterpret_cast<terse_decompress_deferred_fn_v1>(
        const_cast<void*>(lib->symbol(TERSE_COMPRESSOR_DECOMPRESS_DEFERRED_V1_SYMBOL)));
    impl->compress_deferred = reinterpret_cast<terse_compress_deferred_fn_v1>(
        const_cast<void*>(lib->symbol(TERSE_COMPRESSOR_COMPRESS_DEFERRED_V1_SYMBOL)));
    impl->phases = reinterpret_cast<terse_compressor_phases_fn_v1>(
        const_cast<void*>(lib->symbol(TERSE_COMPRESSOR_PHASES_V1_SYMBOL)));
    impl->info.optimized = detail::builtOptimized(*lib, PluginKind::kCompressor);
    impl->lib = std::move(lib);
    impl->info.kind = PluginKind::kCompressor;
    impl->info.name = impl->api.name;
    impl->info.description = impl->api.description;
    impl->info.version = impl->api.version;
    impl->info.abi_version = row.version;
    impl->info.origin = std::move(origin);
    impl->info.shadowed = std::move(shadowed);
    impl->label = detail::pluginLabel(impl->info);
    return std::make_shared<CompressorPlugin>(std::move(impl));
  }
  const auto versions = supportedAbiVersions();
  detail::throwNoPluginSymbol(*lib, PluginKind::kCompressor, versions);
}

std::shared_ptr<Compressor> CompressorPlugin::instantiate(const Params& params) const {
  return std::make_shared<PluginCompressor>(shared_from_this(), *impl_, params);
}

}  // namespace terse

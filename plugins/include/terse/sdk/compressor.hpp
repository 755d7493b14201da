// terse plugin SDK: a compressor as a C++ class, exported as the ABI's terse_compressor_v1 by one macro.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "terse/compressor_v1.h"
#include "terse/device_verdict_v1.h"
#include "terse/phases_v1.h"
#include "terse/resolved_params_v1.h"
#include "terse/sdk/abi_checks.hpp"
#include "terse/sdk/cpu.hpp"
#include "terse/sdk/error.hpp"
#include "terse/sdk/host.hpp"
#include "terse/sdk/params.hpp"

namespace terse::sdk {

// One compress call (see compressor_v1.h for the contract). Buffers live on info.device; the spans are views that
// are never NULL with a nonzero length.
struct CompressArgs {
  const terse_tensor_info_v1& info;
  const void* raw_input;            // info.numel elements of info.dtype; NULL when numel == 0
  std::span<const std::byte> prev;  // the aggregate of round - 1; empty in round 0
  std::span<std::byte> workspace;   // kept from round 0's compress to the step's last decompress
  std::span<std::byte> state;       // kept across steps (TERSE_CAP_STATEFUL), zero-filled at first
  std::span<std::byte> output;      // the whole capacity; write from the start, return the size written
  void* stream;                     // cudaStream_t on the CUDA path, NULL on the host
  // The deferred call's verdict word (terse/device_verdict_v1.h), null in an ordinary compress.
  uint32_t* verdict = nullptr;

  // The word a deferred compress (terse/device_verdict_v1.h) leaves a fault of `prev` in, instead of throwing
  // InvalidPayload after a wait: zeroed by the core, in the call's memory; null in an ordinary compress (and in round
  // 0, which has no prev, and on the host). A plugin that uses it raises it from its check kernel, writes no state when
  // it is raised, and leaves its workspace so that this step's decompress refuses; ignoring it is always correct.
  uint32_t* deferredVerdict() const { return verdict; }

  // The input as T (float for f32, ...). Throws Unsupported when T does not match info.dtype.
  template <class T>
  std::span<const T> input() const {
    return detail::tensorView<const T>(info, raw_input, "input");
  }
};

// One decompress call: output = payload decoded, or output += it when accumulate.
struct DecompressArgs {
  const terse_tensor_info_v1& info;
  std::span<const std::byte> payload;  // untrusted: validate everything (ByteReader, readHeader)
  std::span<std::byte> workspace;
  std::span<std::byte> state;
  void* raw_output;  // info.numel elements of info.dtype; NULL when numel == 0
  bool accumulate;
  void* stream;
  // The deferred call's verdict word (terse/device_verdict_v1.h), null in an ordinary decompress.
  uint32_t* verdict = nullptr;

  // Whether the payload is this rank's own, just written by its compress (TERSE_CALL_OWN_PAYLOAD): error feedback
  // decoding what it sent. A plugin whose own payloads always validate may then skip its validation (compressor_v1.h
  // says when not to); ignoring this is always correct.
  bool ownPayload() const { return (info.reserved0 & TERSE_CALL_OWN_PAYLOAD) != 0; }

  // The word a deferred decompress (terse/device_verdict_v1.h) leaves a payload fault in, instead of throwing
  // InvalidPayload after a wait: zeroed by the core, in the call's memory; null in an ordinary decompress. A plugin
  // that uses it raises it from its check kernel and skips every write when it is raised (the kit's
  // device::checkedDecompress does both); ignoring it is always correct.
  uint32_t* deferredVerdict() const { return verdict; }

  template <class T>
  std::span<T> output() const {
    return detail::tensorView<T>(info, raw_output, "output");
  }
};

// One reduce call (CUSTOM aggregation): output = a (+) b, returning the size written.
struct ReduceArgs {
  const terse_tensor_info_v1& info;
  std::span<const std::byte> a;  // untrusted, like a decompress payload
  std::span<const std::byte> b;
  std::span<std::byte> workspace;
  std::span<std::byte> state;
  std::span<std::byte> output;  // capacity max_reduced_bytes; never aliases a or b
  void* stream;
};

// Base of a compressor. The derived class's constructor takes (sdk::Params&, sdk::Host&), reads every parameter it
// knows through the getters (unknown ones are rejected after it returns) and throws to refuse them.
//
// The methods are const because the core may call them concurrently for different tensors with one instance (the
// ABI's "ctx is read-only after init"): per-tensor data goes in the workspace and state buffers, not in members.
class Compressor {
 public:
  virtual ~Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  // What the plugin does for gradients of `dtype`; throw Unsupported for a dtype it does not handle. struct_size is
  // filled by the SDK.
  virtual terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const = 0;
  // Sizes for info's tensor and info.round, asked once at setup. struct_size and reserved0 are filled by the SDK.
  virtual terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const = 0;
  // Returns the bytes written to args.output (checked against its capacity by the SDK).
  virtual uint64_t compress(const CompressArgs& args) const = 0;
  virtual void decompress(const DecompressArgs& args) const = 0;
  // CUSTOM aggregation only. The export macro sets the ABI's reduce pointer only when the class overrides this, found
  // by the type of &Class::reduce: so do not overload reduce with other signatures in the class.
  virtual uint64_t reduce(const ReduceArgs& /*args*/) const {
    throw Unsupported("reduce is not implemented (only CUSTOM aggregation uses it)");
  }
  // The steps at which the work of a call changes (terse/phases_v1.h: strictly increasing, each above 0, at most
  // TERSE_MAX_PHASES_V1), e.g. a warm-up's stage boundaries; asked once, right after the constructor. Empty (the
  // default): the same work every step. A core that prices calls from a measurement (terse's CALIBRATED simulation)
  // measures a step of each phase.
  virtual std::vector<uint64_t> phaseSteps() const { return {}; }

 protected:
  Compressor() = default;
};

namespace detail {

inline std::span<std::byte> workspaceOf(const terse_scratch_v1* s, const char* call) {
  if (s == nullptr) return {};
  return bytesOf<std::byte>(s->workspace, s->workspace_bytes, (std::string(call) + ": scratch workspace").c_str());
}
inline std::span<std::byte> stateOf(const terse_scratch_v1* s, const char* call) {
  if (s == nullptr) return {};
  return bytesOf<std::byte>(s->state, s->state_bytes, (std::string(call) + ": scratch state").c_str());
}

// The C entry points for one plugin class. Export is the macro's traits struct: Type, kName, kDescription, kVersion.
template <class Export>
struct CompressorAdapter {
  using Class = typename Export::Type;
  static_assert(std::is_base_of_v<Compressor, Class>,
                "TERSE_EXPORT_COMPRESSOR: the class must derive from sdk::Compressor");
  static_assert(std::is_constructible_v<Class, Params&, Host&>,
                "TERSE_EXPORT_COMPRESSOR: the class needs a constructor taking (sdk::Params&, sdk::Host&)");

  // Overridden exactly when &Class::reduce is not the base's member (an override has Class, or a base between, as its
  // class type).
  static constexpr bool kHasReduce =
      !std::is_same_v<decltype(&Class::reduce), uint64_t (Compressor::*)(const ReduceArgs&) const>;

  // What ctx points to. The host is declared first so the instance, which may keep a reference to it, dies first.
  struct Context {
    explicit Context(const terse_host_v1* h) : host(h) {}
    Host host;
    std::unique_ptr<Class> instance;
    ResolvedParams resolved;       // terse_compressor_resolved_params_v1
    std::vector<uint64_t> phases;  // terse_compressor_phases_v1
  };

  static terse_status_v1 init(const terse_param_v1* params, size_t num_params, const terse_host_v1* host,
                              void** ctx) noexcept {
    if (ctx != nullptr) *ctx = nullptr;
    if (host == nullptr || host->log == nullptr) return TERSE_ERR_INVALID_ARGUMENT;  // nowhere to say why
    return guard(host, Export::kName, [&] {
      checkedPointer(ctx, "init: ctx");
      cpu::check();  // a bad TERSE_CPU_ISA fails here, at setup, rather than in the first compress
      auto context = std::make_unique<Context>(host);
      Params p(Export::kName, params, num_params);
      context->instance = std::make_unique<Class>(p, context->host);
      p.finish();
      context->resolved.set(p.resolved());
      context->phases = context->instance->phaseSteps();
      checkPhases(context->phases);
      *ctx = context.release();
    });
  }

  // The plugin's own mistake, refused at init with its name rather than by the core later (terse/phases_v1.h).
  static void checkPhases(const std::vector<uint64_t>& steps) {
    if (steps.size() > TERSE_MAX_PHASES_V1) {
      throw InvalidArgument("phaseSteps: " + std::to_string(steps.size()) + " phase steps, at most " +
                            std::to_string(TERSE_MAX_PHASES_V1));
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i] == 0 || (i > 0 && steps[i] <= steps[i - 1])) {
        throw InvalidArgument("phaseSteps: step " + std::to_string(steps[i]) + " at position " + std::to_string(i) +
                              ": the steps must be above 0 and strictly increasing");
      }
    }
  }

  // terse_compressor_phases_v1 (terse/phases_v1.h).
  static terse_status_v1 phases(void* ctx, const uint64_t** steps, size_t* num_steps) noexcept {
    if (ctx == nullptr || steps == nullptr || num_steps == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    *steps = c->phases.data();
    *num_steps = c->phases.size();
    return TERSE_OK;
  }

  static terse_status_v1 finalize(void* ctx) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    auto* c = static_cast<Context*>(ctx);
    const terse_host_v1* host = c->host.raw();  // core-owned: outlives the context
    return guard(host, Export::kName, [&] { delete c; });
  }

  static terse_status_v1 getCaps(void* ctx, terse_dtype_v1 dtype, terse_compressor_caps_v1* caps) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkedPointer(caps, "get_caps: caps");
      checkStructSize(caps->struct_size, sizeof(terse_compressor_caps_v1), "get_caps: caps");
      if (!isValidDtype(dtype)) throw Unsupported("get_caps: unknown dtype " + std::to_string(dtype));
      terse_compressor_caps_v1 out = c->instance->caps(dtype);
      out.struct_size = sizeof(terse_compressor_caps_v1);
      *caps = out;
    });
  }

  static terse_status_v1 getSizes(void* ctx, const terse_tensor_info_v1* info,
                                  terse_compressor_sizes_v1* sizes) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkInfo(info, "get_sizes");
      checkedPointer(sizes, "get_sizes: sizes");
      checkStructSize(sizes->struct_size, sizeof(terse_compressor_sizes_v1), "get_sizes: sizes");
      terse_compressor_sizes_v1 out = c->instance->sizes(*info);
      out.struct_size = sizeof(terse_compressor_sizes_v1);
      out.reserved0 = 0;
      *sizes = out;
    });
  }

  static terse_status_v1 compress(void* ctx, const terse_tensor_info_v1* info, const void* input, const void* prev,
                                  uint64_t prev_bytes, const terse_scratch_v1* scratch, void* output,
                                  uint64_t output_capacity, uint64_t* output_bytes, void* stream) noexcept {
    return compressWith(ctx, info, input, prev, prev_bytes, scratch, output, output_capacity, output_bytes, nullptr,
                        stream, "compress");
  }

  // terse_compressor_compress_deferred_v1 (terse/device_verdict_v1.h): the same call with the verdict word in
  // CompressArgs::verdict.
  static terse_status_v1 compressDeferred(void* ctx, const terse_tensor_info_v1* info, const void* input,
                                          const void* prev, uint64_t prev_bytes, const terse_scratch_v1* scratch,
                                          void* output, uint64_t output_capacity, uint64_t* output_bytes,
                                          uint32_t* verdict, void* stream) noexcept {
    if (verdict == nullptr) {
      if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
      return guard(static_cast<const Context*>(ctx)->host.raw(), Export::kName,
                   [] { throw InvalidArgument("compress_deferred: verdict is NULL"); });
    }
    return compressWith(ctx, info, input, prev, prev_bytes, scratch, output, output_capacity, output_bytes, verdict,
                        stream, "compress_deferred");
  }

  static terse_status_v1 compressWith(void* ctx, const terse_tensor_info_v1* info, const void* input, const void* prev,
                                      uint64_t prev_bytes, const terse_scratch_v1* scratch, void* output,
                                      uint64_t output_capacity, uint64_t* output_bytes, uint32_t* verdict, void* stream,
                                      const char* call) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkInfo(info, call);
      checkedPointer(output_bytes, "compress: output_bytes");
      *output_bytes = 0;
      if (input == nullptr && info->numel > 0) throw InvalidArgument(std::string(call) + ": input is NULL");
      const CompressArgs args{*info,
                              input,
                              bytesOf<const std::byte>(prev, prev_bytes, "compress: prev"),
                              workspaceOf(scratch, "compress"),
                              stateOf(scratch, "compress"),
                              bytesOf<std::byte>(output, output_capacity, "compress: output"),
                              stream,
                              verdict};
      const uint64_t n = c->instance->compress(args);
      // The class's own bug, not the caller's: TERSE_ERR_INTERNAL, which the core raises as a plugin error.
      if (n > output_capacity) {
        throw Error(TERSE_ERR_INTERNAL, std::string(call) + " reported " + std::to_string(n) +
                                            " output bytes but the output holds " + std::to_string(output_capacity) +
                                            "; compress must return the bytes it wrote, at most args.output.size()");
      }
      *output_bytes = n;
    });
  }

  static terse_status_v1 decompress(void* ctx, const terse_tensor_info_v1* info, const void* payload,
                                    uint64_t payload_bytes, const terse_scratch_v1* scratch, void* output,
                                    int32_t accumulate, void* stream) noexcept {
    return decompressWith(ctx, info, payload, payload_bytes, scratch, output, accumulate, nullptr, stream,
                          "decompress");
  }

  // terse_compressor_decompress_deferred_v1 (terse/device_verdict_v1.h): the same call with the verdict word in
  // DecompressArgs::verdict.
  static terse_status_v1 decompressDeferred(void* ctx, const terse_tensor_info_v1* info, const void* payload,
                                            uint64_t payload_bytes, const terse_scratch_v1* scratch, void* output,
                                            int32_t accumulate, uint32_t* verdict, void* stream) noexcept {
    if (verdict == nullptr) {
      if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
      return guard(static_cast<const Context*>(ctx)->host.raw(), Export::kName,
                   [] { throw InvalidArgument("decompress_deferred: verdict is NULL"); });
    }
    return decompressWith(ctx, info, payload, payload_bytes, scratch, output, accumulate, verdict, stream,
                          "decompress_deferred");
  }

  static terse_status_v1 decompressWith(void* ctx, const terse_tensor_info_v1* info, const void* payload,
                                        uint64_t payload_bytes, const terse_scratch_v1* scratch, void* output,
                                        int32_t accumulate, uint32_t* verdict, void* stream,
                                        const char* call) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkInfo(info, call);
      if (output == nullptr && info->numel > 0) throw InvalidArgument(std::string(call) + ": output is NULL");
      const DecompressArgs args{*info,
                                bytesOf<const std::byte>(payload, payload_bytes, "decompress: payload"),
                                workspaceOf(scratch, "decompress"),
                                stateOf(scratch, "decompress"),
                                output,
                                accumulate != 0,
                                stream,
                                verdict};
      c->instance->decompress(args);
    });
  }

  static terse_status_v1 reduce(void* ctx, const terse_tensor_info_v1* info, const void* a, uint64_t a_bytes,
                                const void* b, uint64_t b_bytes, const terse_scratch_v1* scratch, void* output,
                                uint64_t output_capacity, uint64_t* output_bytes, void* stream) noexcept {
    if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    const auto* c = static_cast<const Context*>(ctx);
    return guard(c->host.raw(), Export::kName, [&] {
      checkInfo(info, "reduce");
      checkedPointer(output_bytes, "reduce: output_bytes");
      *output_bytes = 0;
      const ReduceArgs args{*info,
                            bytesOf<const std::byte>(a, a_bytes, "reduce: a"),
                            bytesOf<const std::byte>(b, b_bytes, "reduce: b"),
                            workspaceOf(scratch, "reduce"),
                            stateOf(scratch, "reduce"),
                            bytesOf<std::byte>(output, output_capacity, "reduce: output"),
                            stream};
      const uint64_t n = c->instance->reduce(args);
      if (n > output_capacity) {
        throw Error(TERSE_ERR_INTERNAL, "reduce reported " + std::to_string(n) + " output bytes but the output holds " +
                                            std::to_string(output_capacity) +
                                            "; reduce must return the bytes it wrote, at most args.output.size()");
      }
      *output_bytes = n;
    });
  }

  static constexpr terse_compressor_v1 table() {
    return terse_compressor_v1{TERSE_COMPRESSOR_ABI_V1,
                               sizeof(terse_compressor_v1),
                               Export::kName,
                               Export::kDescription,
                               Export::kVersion,
                               &init,
                               &finalize,
                               &getCaps,
                               &getSizes,
                               &compress,
                               &decompress,
                               kHasReduce ? &reduce : nullptr};
  }
};

}  // namespace detail
}  // namespace terse::sdk

// TERSE_EXPORT_COMPRESSOR's own optional symbols, expanded by TERSE_SDK_DETAIL_EXPORT_PLUGIN (params.hpp) with its
// traits struct: terse_compressor_decompress_deferred_v1 and terse_compressor_compress_deferred_v1
// (terse/device_verdict_v1.h), and terse_compressor_phases_v1 (terse/phases_v1.h).
#define TERSE_SDK_DETAIL_EXPORT_KIND_Compressor(Export_)                                                             \
  TERSE_PLUGIN_V1_EXPORT terse_status_v1 terse_compressor_decompress_deferred_v1(                                    \
      void* ctx, const terse_tensor_info_v1* info, const void* payload, uint64_t payload_bytes,                      \
      const terse_scratch_v1* scratch, void* output, int32_t accumulate, uint32_t* verdict, void* stream) noexcept { \
    return ::terse::sdk::detail::CompressorAdapter<Export_>::decompressDeferred(                                     \
        ctx, info, payload, payload_bytes, scratch, output, accumulate, verdict, stream);                            \
  }                                                                                                                  \
  TERSE_PLUGIN_V1_EXPORT terse_status_v1 terse_compressor_compress_deferred_v1(                                      \
      void* ctx, const terse_tensor_info_v1* info, const void* input, const void* prev, uint64_t prev_bytes,         \
      const terse_scratch_v1* scratch, void* output, uint64_t output_capacity, uint64_t* output_bytes,               \
      uint32_t* verdict, void* stream) noexcept {                                                                    \
    return ::terse::sdk::detail::CompressorAdapter<Export_>::compressDeferred(                                       \
        ctx, info, input, prev, prev_bytes, scratch, output, output_capacity, output_bytes, verdict, stream);        \
  }                                                                                                                  \
  TERSE_PLUGIN_V1_EXPORT terse_status_v1 terse_compressor_phases_v1(void* ctx, const uint64_t** steps,               \
                                                                    size_t* num_steps) noexcept {                    \
    return ::terse::sdk::detail::CompressorAdapter<Export_>::phases(ctx, steps, num_steps);                          \
  }

// Exports Class as the plugin's struct, terse_compressor_plugin_v1 (constant-initialized, default visibility,
// C linkage), the optional terse_compressor_resolved_params_v1 (resolved_params_v1.h: the parameters the constructor
// read, defaults included), terse_compressor_build_info_v1 (build_info_v1.h: whether this file was compiled with
// optimisation), and the compressor's own optional symbols above (device_verdict_v1.h, phases_v1.h). Use once per
// shared library, at namespace scope. name_ must be a string literal matching [a-z0-9_]+ and equal to the <name> given
// to terse_add_compressor(). reduce is exported only when Class overrides it.
#define TERSE_EXPORT_COMPRESSOR(Class_, name_, description_, version_)                                           \
  TERSE_SDK_DETAIL_EXPORT_PLUGIN("TERSE_EXPORT_COMPRESSOR", Compressor, compressor, Class_, name_, description_, \
                                 version_)

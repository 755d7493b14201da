#include "core/compress/plugin_codec.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/compress/seed.h"
#include "terse/compressor.h"

namespace terse {
namespace {

// "compressor 'topk', tensor 7: " — every message names both, since one run drives many tensors through one plugin.
std::string where(const Compressor& c, const TensorInfo& t) {
  return "compressor '" + c.plugin().name + "', tensor " + std::to_string(t.tensor_id) + ": ";
}

// The codec's first step, run before its caps_ reference is bound: a compressor to ask, a well-formed tensor, and the
// compressor's caps for its dtype (Unsupported for a dtype the plugin does not handle).
const CompressorCaps& capsFor(const std::shared_ptr<const Compressor>& compressor, const TensorInfo& tensor) {
  TERSE_CHECK(compressor != nullptr, InvalidArgument, "makePluginCodec: compressor is null");
  validateTensorInfo(tensor);
  return compressor->caps(tensor.dtype);
}

}  // namespace

void validateTensorInfo(const TensorInfo& t) {
  const std::string who = "tensor " + std::to_string(t.tensor_id) + ": ";
  TERSE_CHECK(isValidDType(static_cast<int32_t>(t.dtype)), InvalidArgument,
              who << "unknown dtype value " << static_cast<int32_t>(t.dtype));
  TERSE_CHECK(t.ndim >= 0 && t.ndim <= 4, InvalidArgument, who << "ndim must be in 0..4, got " << t.ndim);
  uint64_t product = 1;
  for (int d = 0; d < 4; ++d) {
    const int64_t extent = t.shape[static_cast<std::size_t>(d)];
    if (d >= t.ndim) {
      TERSE_CHECK(extent == 0, InvalidArgument,
                  who << "shape[" << d << "] must be 0 beyond ndim = " << t.ndim << ", got " << extent);
      continue;
    }
    TERSE_CHECK(extent >= 0, InvalidArgument, who << "shape[" << d << "] must be >= 0, got " << extent);
    const auto e = static_cast<uint64_t>(extent);
    TERSE_CHECK(e == 0 || product <= std::numeric_limits<uint64_t>::max() / e, InvalidArgument,
                who << "the shape's element count overflows 64 bits");
    product *= e;
  }
  TERSE_CHECK(t.ndim == 0 || product == t.numel, InvalidArgument,
              who << "numel " << t.numel << " does not match the shape's product " << product);
  const std::size_t elem = dtypeSize(t.dtype);
  TERSE_CHECK(t.numel <= std::numeric_limits<uint64_t>::max() / elem, InvalidArgument,
              who << "numel " << t.numel << " of " << dtypeName(t.dtype) << " overflows 64-bit byte counts");
  TERSE_CHECK(t.world_size >= 1, InvalidArgument, who << "world_size must be >= 1, got " << t.world_size);
  TERSE_CHECK(t.rank >= 0 && t.rank < t.world_size, InvalidArgument,
              who << "rank must be in [0, " << t.world_size << "), got " << t.rank);
}

PluginCodec::PluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor, uint64_t run_seed,
                         void* stream)
    : compressor_(std::move(compressor)), info_(tensor), caps_(capsFor(compressor_, tensor)) {
  const std::string who = where(*compressor_, tensor);
  TERSE_CHECK(tensor.device == TERSE_DEVICE_HOST || tensor.device == TERSE_DEVICE_CUDA, InvalidArgument,
              who << "device must be HOST (" << TERSE_DEVICE_HOST << ") or CUDA (" << TERSE_DEVICE_CUDA << "), got "
                  << tensor.device);
  const bool cuda = tensor.device == TERSE_DEVICE_CUDA;
  TERSE_CHECK(
      !cuda || cuda::builtWithCuda(), Unsupported,
      who << "a CUDA tensor needs a build with CUDA (this one was configured with TERSE_CUDA=OFF or without nvcc)");

  TERSE_CHECK((caps_.devices & tensor.device) != 0, Unsupported,
              who << "the plugin does not support " << (cuda ? "CUDA" : "host") << " tensors (devices mask "
                  << caps_.devices << ")");
  TERSE_CHECK(cuda == (stream != nullptr), InvalidArgument,
              who << (cuda ? "a CUDA tensor needs the stream its calls are ordered on; got none"
                           : "a host tensor takes no stream (the ABI's host calls get NULL)"));
  TERSE_CHECK(!cuda || tensor.device_index >= 0, InvalidArgument,
              who << "a CUDA tensor needs its device ordinal in device_index, got " << tensor.device_index);
  placement_ = cuda ? Placement::cuda(stream) : Placement::host();

  // num_rounds is in 1..TERSE_MAX_ROUNDS_V1 and each round's sizes keep the caps' rules: Compressor::caps and ::sizes
  // check both (core/plugin/compressor_plugin.cc), so sizes_ has at least one entry and the pipeline can trust them.

  // The per-call fields as the ABI wants them at sizing time: step, seed and source_rank 0.
  if (!cuda) info_.device_index = -1;
  info_.step = 0;
  info_.seed = 0;
  info_.source_rank = 0;
  sizes_.resize(static_cast<std::size_t>(caps_.num_rounds));
  uint64_t workspace = 0;
  uint64_t state = 0;
  for (int r = 0; r < caps_.num_rounds; ++r) {
    info_.round = r;
    CompressorSizes& s = sizes_[static_cast<std::size_t>(r)];
    s = compressor_->sizes(info_);
    workspace = std::max(workspace, s.workspace_bytes);
    state = std::max(state, s.state_bytes);
  }
  TERSE_CHECK(workspace <= std::numeric_limits<std::size_t>::max() && state <= std::numeric_limits<std::size_t>::max(),
              PluginError, who << "workspace (" << workspace << " B) or state (" << state << " B) too large");
  workspace_bytes_ = static_cast<std::size_t>(workspace);
  workspace_ = TensorBuffer(static_cast<std::size_t>(workspace), placement_);
  state_ = TensorBuffer(static_cast<std::size_t>(state), placement_);

  info_.round = 0;
  info_.source_rank = info_.rank;
  info_.seed = codecSeed(run_seed, caps_.shared_seed, info_.rank);
}

CodecDecorator::CodecDecorator(std::unique_ptr<TensorCodec> inner, const char* who) : inner_(std::move(inner)) {
  TERSE_CHECK(inner_ != nullptr, InvalidArgument, who << ": inner codec is null");
}

void CodecDecorator::checkRound(const std::string& where, uint64_t step, int round, int rounds) const {
  TERSE_CHECK(round >= 0 && round < rounds, InvalidArgument,
              where << "encode: round must be in [0, " << rounds << "), got " << round);
  TERSE_CHECK(round == 0 || (round == next_round_ && step == step_), InvalidArgument,
              where << "encode: round " << round << " of step " << step << " must follow round " << round - 1
                    << " of the same step; expected round " << next_round_ << " of step " << step_);
}

void CodecDecorator::checkWritten(const std::string& where, uint64_t bytes, std::size_t capacity) {
  TERSE_CHECK(bytes <= capacity, InternalError,
              where << "inner codec reported " << bytes << " B written into a " << capacity << " B span");
}

int TensorCodec::phaseAt(uint64_t step) const {
  const std::span<const uint64_t> steps = phaseSteps();
  return static_cast<int>(std::upper_bound(steps.begin(), steps.end(), step) - steps.begin());
}

const CompressorSizes& TensorCodec::sizes(int round) const {
  const std::span<const CompressorSizes> all = roundSizes();
  TERSE_CHECK(round >= 0 && static_cast<std::size_t>(round) < all.size(), InvalidArgument,
              "tensor " << info().tensor_id << ": sizes: round must be in [0, " << all.size() << "), got " << round);
  return all[static_cast<std::size_t>(round)];
}

void PluginCodec::checkRound(const char* call, int round) const {
  TERSE_CHECK(
      round >= 0 && round < caps_.num_rounds, InvalidArgument,
      where(*compressor_, info_) << call << ": round must be in [0, " << caps_.num_rounds << "), got " << round);
}

TensorInfo PluginCodec::callInfo(uint64_t step, int round, int source_rank) const {
  TensorInfo call = info_;
  call.step = step;
  call.round = round;
  call.source_rank = source_rank;
  return call;
}

uint64_t PluginCodec::encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                             std::span<std::byte> out) {
  checkRound("encode", round);
  TERSE_CHECK(grad != nullptr || info_.numel == 0, InvalidArgument,
              where(*compressor_, info_) << "encode: gradient is null for " << info_.numel << " elements");
  TERSE_CHECK(round > 0 || prev.empty(), InvalidArgument,
              where(*compressor_, info_) << "encode round 0 takes no previous aggregate, got " << prev.size() << " B");
  // Bound call: the tensor was validated and sized at setup; the compressor checks `out` against the round's sizes and
  // what the plugin wrote (at most max_output_bytes, exactly that when fixed), which the wire buffers were sized from.
  return compressor_->compressBound(callInfo(step, round, info_.rank), sizes_[static_cast<std::size_t>(round)], grad,
                                    prev, scratch(), out, stream());
}

uint64_t PluginCodec::encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                                     std::span<std::byte> out, EncodeWords words) {
  // Only a device's check is worth deferring (a host plugin reads prev where it lies), and round 0 has no prev.
  if (words.prev == nullptr || round == 0 || !defersPrevVerdicts()) return encode(step, round, grad, prev, out);
  checkRound("encode", round);
  TERSE_CHECK(grad != nullptr || info_.numel == 0, InvalidArgument,
              where(*compressor_, info_) << "encode: gradient is null for " << info_.numel << " elements");
  return compressor_->compressDeferred(callInfo(step, round, info_.rank), sizes_[static_cast<std::size_t>(round)], grad,
                                       prev, scratch(), out, words.prev, stream());
}

void PluginCodec::recheckPrev(uint64_t step, int round, std::span<const std::byte> prev) {
  checkRound("encode", round);
  const CompressorSizes& sizes = sizes_[static_cast<std::size_t>(round)];
  // Scratch memory, allocated on the failure path only: zeros for the input (whose values no check of prev reads) and
  // the round's payload bound for the output, so that nothing of the caller's is written. The workspace is the
  // tensor's own, undefined once its step failed.
  const TensorBuffer input(static_cast<std::size_t>(info_.numel) * dtypeSize(info_.dtype), placement_);
  const TensorBuffer out(static_cast<std::size_t>(sizes.max_output_bytes), placement_);
  (void)compressor_->compressBound(callInfo(step, round, info_.rank), sizes, input.data(), prev, scratch(), out.span(),
                                   stream());
  if (placement_.device) cuda::synchronize(placement_.stream);
}

void PluginCodec::decode(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out,
                         bool accumulate) {
  decodeAs(step, payload, source_rank, out, accumulate, 0);
}

void PluginCodec::decodeDeferred(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out,
                                 bool accumulate, uint32_t* verdict) {
  TERSE_CHECK(verdict != nullptr, InvalidArgument, where(*compressor_, info_) << "decode: the verdict word is null");
  decodeAs(step, payload, source_rank, out, accumulate, 0, verdict);
}

void PluginCodec::decodeOwn(uint64_t step, std::span<const std::byte> payload, void* out) {
  decodeAs(step, payload, info_.rank, out, false, TERSE_CALL_OWN_PAYLOAD);
}

void PluginCodec::decodeOwnDeferred(uint64_t step, std::span<const std::byte> payload, void* out, uint32_t* verdict) {
  TERSE_CHECK(verdict != nullptr, InvalidArgument, where(*compressor_, info_) << "decode: the verdict word is null");
  decodeAs(step, payload, info_.rank, out, false, TERSE_CALL_OWN_PAYLOAD, verdict);
}

void PluginCodec::decodeAs(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out,
                           bool accumulate, uint32_t call_flags, uint32_t* verdict) {
  TERSE_CHECK(source_rank >= -1 && source_rank < info_.world_size, InvalidArgument,
              where(*compressor_, info_) << "decode: source_rank must be -1 (aggregate) or in [0, " << info_.world_size
                                         << "), got " << source_rank);
  TERSE_CHECK(out != nullptr || info_.numel == 0, InvalidArgument,
              where(*compressor_, info_) << "decode: output is null for " << info_.numel << " elements");
  const int round = caps_.num_rounds - 1;
  TensorInfo call = callInfo(step, round, source_rank);
  call.call_flags = call_flags;
  const CompressorSizes& sizes = sizes_[static_cast<std::size_t>(round)];
  if (verdict != nullptr) {
    compressor_->decompressDeferred(call, sizes, payload, scratch(), out, accumulate, verdict, stream());
  } else {
    compressor_->decompressBound(call, sizes, payload, scratch(), out, accumulate, stream());
  }
}

uint64_t PluginCodec::reduce(uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b,
                             std::span<std::byte> out) {
  TERSE_CHECK(caps_.aggregation == Aggregation::kCustom, InvalidArgument,
              where(*compressor_, info_) << "reduce is only for custom aggregation; this plugin's aggregation is "
                                         << aggregationName(caps_.aggregation));
  checkRound("reduce", round);
  // The compressor checks `out` against max_reduced_bytes and what the plugin wrote.
  return compressor_->reduceBound(callInfo(step, round, -1), sizes_[static_cast<std::size_t>(round)], a, b, scratch(),
                                  out, stream());
}

std::unique_ptr<TensorCodec> makePluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                             uint64_t run_seed, void* stream) {
  return std::make_unique<PluginCodec>(std::move(compressor), tensor, run_seed, stream);
}

PluginCodec::PluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor, uint64_t run_seed,
                         std::shared_ptr<SharedWorkspace> workspace)
    : PluginCodec(std::move(compressor), tensor, run_seed, nullptr) {
  TERSE_CHECK(workspace != nullptr, InvalidArgument, where(*compressor_, info_) << "the shared workspace is null");
  // The delegated constructor allocated an own workspace (a CUDA tensor was refused there: it takes no null stream);
  // it goes back, and the shared one grows to this codec's need.
  workspace->reserve(workspace_bytes_);
  workspace_ = TensorBuffer();
  shared_ = std::move(workspace);
}

std::unique_ptr<TensorCodec> makePluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                             uint64_t run_seed, std::shared_ptr<SharedWorkspace> workspace) {
  return std::make_unique<PluginCodec>(std::move(compressor), tensor, run_seed, std::move(workspace));
}

}  // namespace terse

#include "core/compress/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/compress/device_kernels.h"
#include "terse/sdk/half.hpp"

namespace terse {
namespace {

std::string where(const TensorCodec& codec) {
  return "pipeline, tensor " + std::to_string(codec.info().tensor_id) + " (" +
         std::string(aggregationName(codec.caps().aggregation)) + "): ";
}

uint64_t maxOverRounds(const TensorCodec& codec, uint64_t CompressorSizes::*field) {
  uint64_t m = 0;
  for (int r = 0; r < codec.caps().num_rounds; ++r) m = std::max(m, codec.sizes(r).*field);
  return m;
}

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <class T>
void divideAll(T* p, std::size_t n, T w) {
  for (std::size_t i = 0; i < n; ++i) p[i] /= w;
}

}  // namespace

void validatePipeline(const TensorCodec& codec, const comm::Communicator& comm) {
  const TensorInfo& t = codec.info();
  const CompressorCaps& caps = codec.caps();
  const std::string who = where(codec);
  TERSE_CHECK(t.world_size == comm.size() && t.rank == comm.rank(), InvalidArgument,
              who << "the codec was built for rank " << t.rank << " of " << t.world_size
                  << ", the communicator is rank " << comm.rank() << " of " << comm.size());
  const bool cuda = codec.placement().device;
  TERSE_CHECK(cuda == comm.deviceMemory(), Unsupported,
              who << "a " << (cuda ? "CUDA" : "host") << " tensor needs a communicator on "
                  << (cuda ? "device" : "host") << " memory; the '" << comm.backend() << "' communicator works on "
                  << (comm.deviceMemory() ? "device" : "host") << " memory");
  TERSE_CHECK(!cuda || codec.placement().stream == comm.deviceStream(), InvalidArgument,
              who << "a CUDA tensor's codec must run on the communicator's stream, so that compression, the collective "
                     "and decompression are ordered without extra synchronization");
  TERSE_CHECK(isFloat(t.dtype), Unsupported,
              who << "gradients of " << dtypeName(t.dtype) << " cannot be averaged (f32, f64, f16, bf16)");
  TERSE_CHECK(caps.num_rounds >= 1, InvalidArgument, who << "num_rounds must be >= 1, got " << caps.num_rounds);
  switch (caps.aggregation) {
    case Aggregation::kSum: {
      TERSE_CHECK(caps.fixed_size, InvalidArgument,
                  who << "a SUM payload is summed elementwise across ranks, so it needs a fixed size; this compressor "
                         "reports a variable size (use ALLGATHER aggregation)");
      TERSE_CHECK(comm.supportsSum(caps.wire_dtype), Unsupported,
                  who << "wire dtype " << dtypeName(caps.wire_dtype) << " cannot be summed by the '" << comm.backend()
                      << "' communicator");
      const std::size_t elem = dtypeSize(caps.wire_dtype);
      for (int r = 0; r < caps.num_rounds; ++r) {
        const CompressorSizes& s = codec.sizes(r);
        TERSE_CHECK(s.sum_header_bytes <= s.max_output_bytes && s.sum_header_bytes % elem == 0 &&
                        (s.max_output_bytes - s.sum_header_bytes) % elem == 0,
                    InvalidArgument,
                    who << "round " << r << ": header of " << s.sum_header_bytes << " bytes and payload of "
                        << s.max_output_bytes << " bytes do not leave whole " << dtypeName(caps.wire_dtype)
                        << " elements to sum");
      }
      break;
    }
    case Aggregation::kAllgather:
      TERSE_CHECK(caps.num_rounds == 1, InvalidArgument,
                  who << caps.num_rounds
                      << " rounds need one aggregated payload as the next round's prev, which "
                         "ALLGATHER does not produce (use SUM or CUSTOM)");
      break;
    case Aggregation::kCustom:
      for (int r = 0; r < caps.num_rounds; ++r) {
        const CompressorSizes& s = codec.sizes(r);
        TERSE_CHECK(s.max_reduced_bytes >= s.max_output_bytes, InvalidArgument,
                    who << "round " << r << ": max_reduced_bytes " << s.max_reduced_bytes
                        << " is below max_output_bytes " << s.max_output_bytes);
      }
      break;
    default:
      TERSE_THROW(InvalidArgument, who << "unknown aggregation " << static_cast<int>(caps.aggregation));
  }
}

CompressionPipeline::CompressionPipeline(std::unique_ptr<TensorCodec> codec, comm::Communicator& comm)
    : codec_(std::move(codec)), comm_(comm) {
  TERSE_CHECK(codec_ != nullptr, InvalidArgument, "pipeline: codec is null");
  validatePipeline(*codec_, comm_);
  world_ = comm_.size();
  tensor_ = codec_->info().tensor_id;
  placement_ = codec_->placement();
  const auto max_payload = static_cast<std::size_t>(maxOverRounds(*codec_, &CompressorSizes::max_output_bytes));
  switch (aggregation()) {
    case Aggregation::kSum:
      payload_[0] = TensorBuffer(max_payload, placement_);
      if (codec_->caps().num_rounds > 1) payload_[1] = TensorBuffer(max_payload, placement_);
      break;
    case Aggregation::kCustom: {
      const auto max_reduced = static_cast<std::size_t>(maxOverRounds(*codec_, &CompressorSizes::max_reduced_bytes));
      reduced_[0] = TensorBuffer(max_reduced, placement_);
      reduced_[1] = TensorBuffer(max_reduced, placement_);
      [[fallthrough]];
    }
    case Aggregation::kAllgather:
      payload_[0] = TensorBuffer(max_payload, placement_);
      gathered_ = TensorBuffer(max_payload * static_cast<std::size_t>(world_), placement_);
      break;
  }
  sizes_.assign(static_cast<std::size_t>(world_), 0);
}

void CompressionPipeline::gather(std::span<const std::byte> local, uint64_t max_bytes) {
  if (codec_->caps().fixed_size) {
    // Every rank's payload has exactly max_bytes (the plugin codec enforces it), so no size exchange is needed.
    std::fill(sizes_.begin(), sizes_.end(), max_bytes);
    TERSE_CHECK(
        local.size() == max_bytes, PluginError,
        where(*codec_) << "a fixed-size compressor produced " << local.size() << " bytes instead of " << max_bytes);
  } else {
    stats_.wire += comm_.allgatherSizes(local.size(), sizes_, tensor_);
    for (int i = 0; i < world_; ++i) {
      // A peer's size is untrusted: it must fit the slot every rank reserved for it.
      TERSE_CHECK(sizes_[static_cast<std::size_t>(i)] <= max_bytes, InvalidPayload,
                  where(*codec_) << "rank " << i << " announced a payload of " << sizes_[static_cast<std::size_t>(i)]
                                 << " bytes, above max_output_bytes " << max_bytes);
    }
  }
  uint64_t total = 0;
  for (uint64_t s : sizes_) total += s;
  stats_.wire += comm_.allgatherv(local, gathered_.span().first(static_cast<std::size_t>(total)), sizes_, tensor_);
}

std::span<const std::byte> CompressionPipeline::gatheredBlock(int rank) const {
  uint64_t off = 0;
  for (int j = 0; j < rank; ++j) off += sizes_[static_cast<std::size_t>(j)];
  return gathered_.span().subspan(static_cast<std::size_t>(off),
                                  static_cast<std::size_t>(sizes_[static_cast<std::size_t>(rank)]));
}

void CompressionPipeline::step(uint64_t step, const void* grad, void* out) {
  const CompressorCaps& caps = codec_->caps();
  const TensorInfo& info = codec_->info();
  TERSE_CHECK(out != nullptr || info.numel == 0, InvalidArgument, where(*codec_) << "output is null");
  std::span<const std::byte> aggregate;
  for (int r = 0; r < caps.num_rounds; ++r) {
    const CompressorSizes& sz = codec_->sizes(r);
    TensorBuffer& buf = payload_[caps.aggregation == Aggregation::kSum ? static_cast<std::size_t>(r % 2) : 0];
    const auto encode_start = Clock::now();
    const uint64_t bytes = codec_->encode(step, r, grad, aggregate, buf.span());
    stats_.encode_s += seconds(encode_start, Clock::now());
    stats_.payload_bytes += bytes;
    const std::span<std::byte> local = buf.span().first(static_cast<std::size_t>(bytes));
    switch (caps.aggregation) {
      case Aggregation::kSum:
        TERSE_CHECK(bytes == sz.max_output_bytes, PluginError,
                    where(*codec_) << "round " << r << ": a SUM payload must have its fixed size "
                                   << sz.max_output_bytes << ", got " << bytes);
        stats_.wire +=
            comm_.allreducePayload(local, static_cast<std::size_t>(sz.sum_header_bytes), caps.wire_dtype, tensor_);
        aggregate = local;
        break;
      case Aggregation::kAllgather:
        gather(local, sz.max_output_bytes);
        break;
      case Aggregation::kCustom: {
        gather(local, sz.max_output_bytes);
        // Folded in rank order on every rank, so every rank decodes the same aggregate.
        aggregate = gatheredBlock(0);
        const auto reduce_start = Clock::now();
        for (int i = 1; i < world_; ++i) {
          TensorBuffer& dst = reduced_[static_cast<std::size_t>(i % 2)];
          const uint64_t n = codec_->reduce(step, r, aggregate, gatheredBlock(i), dst.span());
          TERSE_CHECK(
              n <= sz.max_reduced_bytes, PluginError,
              where(*codec_) << "reduce wrote " << n << " bytes, above max_reduced_bytes " << sz.max_reduced_bytes);
          aggregate = dst.span().first(static_cast<std::size_t>(n));
        }
        stats_.decode_s += seconds(reduce_start, Clock::now());
        break;
      }
    }
  }
  const auto decode_start = Clock::now();
  if (caps.aggregation == Aggregation::kAllgather) {
    zeroOut(out);
    for (int i = 0; i < world_; ++i) codec_->decode(step, gatheredBlock(i), i, out, true);
  } else {
    codec_->decode(step, aggregate, -1, out, false);
  }
  stats_.decode_s += seconds(decode_start, Clock::now());
  average(out);
  ++stats_.steps;
}

bool CompressionPipeline::fusible() const noexcept {
  const CompressorCaps& caps = codec_->caps();
  return caps.num_rounds == 1 && (caps.aggregation == Aggregation::kSum || caps.aggregation == Aggregation::kAllgather);
}

uint64_t CompressionPipeline::maxPayloadBytes() const noexcept {
  uint64_t total = 0;
  for (int r = 0; r < codec_->caps().num_rounds; ++r) total += codec_->sizes(r).max_output_bytes;
  return total;
}

std::span<std::byte> CompressionPipeline::encodeForFusion(uint64_t step, const void* grad) {
  TERSE_CHECK(fusible(), InvalidArgument, where(*codec_) << "cannot take part in a fused group");
  const CompressorSizes& sz = codec_->sizes(0);
  const auto encode_start = Clock::now();
  const uint64_t bytes = codec_->encode(step, 0, grad, {}, payload_[0].span());
  stats_.encode_s += seconds(encode_start, Clock::now());
  stats_.payload_bytes += bytes;
  if (codec_->caps().aggregation == Aggregation::kSum) {
    TERSE_CHECK(
        bytes == sz.max_output_bytes, PluginError,
        where(*codec_) << "a SUM payload must have its fixed size " << sz.max_output_bytes << ", got " << bytes);
  } else if (codec_->caps().fixed_size) {
    TERSE_CHECK(
        bytes == sz.max_output_bytes, PluginError,
        where(*codec_) << "a fixed-size compressor produced " << bytes << " bytes instead of " << sz.max_output_bytes);
  }
  return payload_[0].span().first(static_cast<std::size_t>(bytes));
}

void CompressionPipeline::finishSum(uint64_t step, void* out) {
  TERSE_CHECK(fusible() && aggregation() == Aggregation::kSum, InvalidArgument, where(*codec_) << "finishSum");
  const auto bytes = static_cast<std::size_t>(codec_->sizes(0).max_output_bytes);
  const auto decode_start = Clock::now();
  codec_->decode(step, payload_[0].span().first(bytes), -1, out, false);
  stats_.decode_s += seconds(decode_start, Clock::now());
  average(out);
  ++stats_.steps;
}

void CompressionPipeline::finishGathered(uint64_t step, std::span<const std::span<const std::byte>> payloads,
                                         void* out) {
  TERSE_CHECK(fusible() && aggregation() == Aggregation::kAllgather, InvalidArgument,
              where(*codec_) << "finishGathered");
  TERSE_CHECK(payloads.size() == static_cast<std::size_t>(world_), InvalidArgument,
              where(*codec_) << payloads.size() << " gathered payloads for a world of " << world_);
  const auto decode_start = Clock::now();
  zeroOut(out);
  for (int i = 0; i < world_; ++i) codec_->decode(step, payloads[static_cast<std::size_t>(i)], i, out, true);
  stats_.decode_s += seconds(decode_start, Clock::now());
  average(out);
  ++stats_.steps;
}

void CompressionPipeline::zeroOut(void* out) const {
  const TensorInfo& info = codec_->info();
  const std::size_t bytes = static_cast<std::size_t>(info.numel) * dtypeSize(info.dtype);
  if (bytes == 0) return;
  if (placement_.device) {
    cuda::zeroAsync(out, bytes, placement_.stream);
  } else {
    std::memset(out, 0, bytes);
  }
}

void CompressionPipeline::average(void* out) const {
  if (world_ == 1) return;
  const auto n = static_cast<std::size_t>(codec_->info().numel);
  if (placement_.device) {
    device_kernels::divide(out, n, codec_->info().dtype, world_, placement_.stream);
    return;
  }
  switch (codec_->info().dtype) {
    case DType::kF32:
      divideAll(static_cast<float*>(out), n, static_cast<float>(world_));
      return;
    case DType::kF64:
      divideAll(static_cast<double*>(out), n, static_cast<double>(world_));
      return;
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = sdk::floatToHalf(sdk::halfToFloat(p[i]) / static_cast<float>(world_));
      return;
    }
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = sdk::floatToBf16(sdk::bf16ToFloat(p[i]) / static_cast<float>(world_));
      return;
    }
    default:
      TERSE_THROW(Unsupported, where(*codec_) << "cannot average " << dtypeName(codec_->info().dtype) << " gradients");
  }
}

}  // namespace terse

#include "core/compress/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/common/runtime.h"
#include "core/common/watchdog.h"
#include "core/compress/device_kernels.h"
#include "terse/sdk/cpu.hpp"
#include "terse/sdk/half.hpp"

namespace terse {
namespace {

std::string where(const TensorCodec& codec) {
  return "pipeline, tensor " + std::to_string(codec.info().tensor_id) + " (" +
         std::string(aggregationName(codec.caps().aggregation)) + "): ";
}

// The runtime's clock: codec time is simulated time in a simulation (core/common/runtime.h).
using Clock = rt::Clock;
using rt::seconds;

// The FLOP model of a simulation (rt::Kernel): a codec pass reads and writes each element a few times, whatever the
// compressor. In that model compressors differ by their bytes only; measured computation sees their real cost.
constexpr double kCodecFlopsPerElement = 4;

// out /= world_size, in blocks of a fixed length: GCC's -O2 cost model leaves a division loop of unknown length
// scalar (one divss per element, 0.2 ms a step on the DDP hook's 0.94 MB bucket, a tenth of its allreduce), while the
// fixed inner loop becomes vector divisions. Called through sdk::cpu::clones, so AVX-512 or AVX2 where the CPU and
// TERSE_CPU_ISA allow. An IEEE division rounds the same in a vector lane as alone: the bits do not change.
template <class T>
void divideAll(T* __restrict p, std::size_t n, T w) {
  constexpr std::size_t kBlock = 64 / sizeof(T);
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (std::size_t j = 0; j < kBlock; ++j) p[i + j] /= w;
  }
  for (; i < n; ++i) p[i] /= w;
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
  // The caps' and sizes' own rules (SUM fixed size, whole wire elements after the header, one ALLGATHER round, CUSTOM's
  // reduce bound) were checked when the codec was bound (core/plugin/compressor_plugin.cc); what is left is whether
  // this communicator can carry the path they name.
  TERSE_CHECK(caps.aggregation != Aggregation::kSum || comm.supportsSum(caps.wire_dtype), Unsupported,
              who << "wire dtype " << dtypeName(caps.wire_dtype) << " cannot be summed by the '" << comm.backend()
                  << "' communicator");
}

CompressionPipeline::CompressionPipeline(std::unique_ptr<TensorCodec> codec, const comm::Communicator& comm)
    : codec_(std::move(codec)) {
  TERSE_CHECK(codec_ != nullptr, InvalidArgument, "pipeline: codec is null");
  validatePipeline(*codec_, comm);
  caps_ = &codec_->caps();
  sizes_ = codec_->roundSizes();
  world_ = comm.size();
  tensor_ = codec_->info().tensor_id;
  placement_ = codec_->placement();
  defers_ = codec_->defersVerdicts();
  // Only a SUM's last prev stays in place until the step's decodes (the other payload buffer); a CUSTOM's is a fold
  // output that the next round's fold overwrites.
  // And only with deferred decodes: a refused prev makes the step's decodes refuse, and an ordinary decode would throw
  // its own refusal at once, before the word that names the cause is read.
  defers_prev_ =
      defers_ && caps_->aggregation == Aggregation::kSum && caps_->num_rounds > 1 && codec_->defersPrevVerdicts();
  uint64_t max_payload = 0;
  uint64_t max_reduced = 0;
  for (const CompressorSizes& s : sizes_) {
    max_payload = std::max(max_payload, s.max_output_bytes);
    max_reduced = std::max(max_reduced, s.max_reduced_bytes);
  }
  payload_[0] = guardedBuffer(max_payload);
  if (caps_->aggregation == Aggregation::kSum && caps_->num_rounds > 1) payload_[1] = guardedBuffer(max_payload);
  if (caps_->aggregation == Aggregation::kCustom) {
    reduced_[0] = guardedBuffer(max_reduced);
    reduced_[1] = guardedBuffer(max_reduced);
  }
}

TensorBuffer CompressionPipeline::guardedBuffer(uint64_t bytes) const {
  const std::size_t guard = placement_.device ? 0 : kGuardBytes;
  TensorBuffer buf(static_cast<std::size_t>(bytes) + guard, placement_);
  if (guard > 0) std::fill_n(buf.data() + bytes, guard, kGuardByte);
  return buf;
}

std::span<std::byte> CompressionPipeline::usable(const TensorBuffer& buf) const noexcept {
  return buf.span().first(buf.size() - (placement_.device ? 0 : kGuardBytes));
}

void CompressionPipeline::checkGuard(const TensorBuffer& buf, const char* call) const {
  if (placement_.device) return;
  const std::span<const std::byte> guard = buf.span().last(kGuardBytes);
  const bool intact = std::all_of(guard.begin(), guard.end(), [](std::byte b) { return b == kGuardByte; });
  if (intact) return;
  // The plugin call that just returned on this thread is the one that wrote there.
  const std::string plugin = watchdog::lastPluginOfThisThread();
  TERSE_CHECK(intact, PluginError,
              (plugin.empty() ? std::string() : plugin + ": ")
                  << where(*codec_) << call << " wrote past the end of its output buffer of "
                  << buf.size() - kGuardBytes
                  << " bytes (the guard bytes after it changed): the plugin corrupts memory it does not "
                     "own, so the run stops here");
}

uint64_t CompressionPipeline::maxPayloadBytes() const noexcept {
  uint64_t total = 0;
  for (const CompressorSizes& s : sizes_) total += s.max_output_bytes;
  return total;
}

std::span<std::byte> CompressionPipeline::encode(uint64_t step, int round, const void* grad,
                                                 std::span<const std::byte> prev, TensorCodec::EncodeWords words) {
  TensorBuffer& buf = payload_[caps_->aggregation == Aggregation::kSum ? static_cast<std::size_t>(round % 2) : 0];
  const auto encode_start = rt::now();
  const auto numel = static_cast<double>(codec_->info().numel);
  uint64_t bytes = 0;
  {
    const rt::Kernel kernel({.kind = rt::CostKind::kCompress,
                             .layer = round,
                             .size = numel,
                             .flops = kCodecFlopsPerElement * numel,
                             .codec = cost_codec_,
                             .phase = codec_->phaseAt(step)});
    if (!defers_) words.own = nullptr;
    // The last round's only: an earlier round's prev would be overwritten before the step's end (SUM alternates two
    // buffers), so a refusal read then could not be explained.
    if (!defers_prev_ || round != caps_->num_rounds - 1) words.prev = nullptr;
    bytes = words.own != nullptr || words.prev != nullptr
                ? codec_->encodeDeferred(step, round, grad, prev, usable(buf), words)
                : codec_->encode(step, round, grad, prev, usable(buf));
  }
  if (words.prev != nullptr) {
    deferred_prev_round_ = round;
    deferred_prev_ = prev;
  }
  last_bytes_ = bytes;
  checkGuard(buf, "compress");
  stats_.encode_s += seconds(encode_start, rt::now());
  stats_.payload_bytes += bytes;
  // A SUM payload is summed elementwise and a fixed-size gather reserves exactly max_output_bytes per rank: the
  // compressor's bound call held a fixed-size plugin to that size (core/plugin/compressor_plugin.cc), so every rank
  // sends the announced size.
  if (caps_->aggregation == Aggregation::kSum) stats_.unsent_header_bytes += std::min(bytes, sumHeaderBytes(round));
  return buf.span().first(static_cast<std::size_t>(bytes));
}

std::span<const std::byte> CompressionPipeline::fold(uint64_t step, int round,
                                                     std::span<const std::span<const std::byte>> blocks) {
  const auto reduce_start = rt::now();
  std::span<const std::byte> aggregate = blocks[0];
  const auto numel = static_cast<double>(codec_->info().numel);
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    TensorBuffer& dst = reduced_[i % 2];
    uint64_t n = 0;
    {
      const rt::Kernel kernel({.kind = rt::CostKind::kReduce,
                               .size = numel,
                               .flops = kCodecFlopsPerElement * numel,
                               .phase = codec_->phaseAt(step)});
      n = codec_->reduce(step, round, aggregate, blocks[i], usable(dst));
    }
    // n <= max_reduced_bytes: the compressor's bound call checked what the plugin wrote (compressor_plugin.cc).
    checkGuard(dst, "reduce");
    aggregate = usable(dst).first(static_cast<std::size_t>(n));
  }
  stats_.decode_s += seconds(reduce_start, rt::now());
  return aggregate;
}

void CompressionPipeline::finishAggregate(uint64_t step, std::span<const std::byte> aggregate, void* out,
                                          uint32_t* verdict) {
  const auto decode_start = rt::now();
  const auto numel = static_cast<double>(codec_->info().numel);
  {
    const rt::Kernel kernel({.kind = rt::CostKind::kDecompress,
                             .size = numel,
                             .flops = kCodecFlopsPerElement * numel,
                             .codec = cost_codec_,
                             .phase = codec_->phaseAt(step)});
    const bool deferred = defers_ && verdict != nullptr;
    if (deferred) {
      codec_->decodeDeferred(step, aggregate, -1, out, false, verdict);
    } else {
      codec_->decode(step, aggregate, -1, out, false);
    }
  }
  commitAggregate(step, out, defers_ && verdict != nullptr ? verdict : nullptr, 1);
  stats_.decode_s += seconds(decode_start, rt::now());
  average(out);
  ++stats_.steps;
}

void CompressionPipeline::finishGathered(uint64_t step, std::span<const std::span<const std::byte>> payloads, void* out,
                                         uint32_t* verdicts) {
  TERSE_CHECK(payloads.size() == static_cast<std::size_t>(world_), InternalError,
              where(*codec_) << payloads.size() << " gathered payloads for a world of " << world_);
  const auto decode_start = rt::now();
  const auto numel = static_cast<double>(codec_->info().numel);
  {
    const rt::Kernel kernel({.kind = rt::CostKind::kDecompress,
                             .size = numel,
                             .count = static_cast<double>(world_),
                             .flops = kCodecFlopsPerElement * numel * world_,
                             .codec = cost_codec_,
                             .phase = codec_->phaseAt(step)});
    zeroOut(out);
    const bool deferred = defers_ && verdicts != nullptr;
    for (int i = 0; i < world_; ++i) {
      const std::span<const std::byte> payload = payloads[static_cast<std::size_t>(i)];
      if (deferred) {
        codec_->decodeDeferred(step, payload, i, out, true, verdicts + i);
      } else {
        codec_->decode(step, payload, i, out, true);
      }
    }
  }
  commitAggregate(step, out, defers_ && verdicts != nullptr ? verdicts : nullptr, static_cast<std::size_t>(world_));
  stats_.decode_s += seconds(decode_start, rt::now());
  average(out);
  ++stats_.steps;
}

void CompressionPipeline::commitAggregate(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count) {
  if (!codec_->keepsAggregateState()) return;
  // EF21's commit: out += H, H = out, h and v copied from what encode staged (ef21.h): passes of their own, after the
  // decode (an ALLGATHER decode is charged once a rank, and this runs once a step).
  const auto numel = static_cast<double>(codec_->info().numel);
  const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = numel, .count = 2, .flops = 2 * numel});
  codec_->aggregated(step, out, verdicts, verdicts != nullptr ? count : 0);
}

void CompressionPipeline::explainRefusal(uint64_t step, std::span<const std::byte> payload, int source_rank) {
  redecode([&](void* scratch) { codec_->decode(step, payload, source_rank, scratch, false); },
           source_rank < 0 ? std::string("the aggregate") : "rank " + std::to_string(source_rank) + "'s", step);
}

void CompressionPipeline::explainOwnRefusal(uint64_t step) {
  if (caps_->aggregation != Aggregation::kSum) {
    // The last round's payload buffer (ALLGATHER and CUSTOM have one round's, and the collective only read it).
    const std::span<const std::byte> own = usable(payload_[0]).first(static_cast<std::size_t>(last_bytes_));
    redecode([&](void* scratch) { codec_->decodeOwn(step, own, scratch); }, "this rank's own", step);
  }
  TERSE_THROW(InvalidPayload,
              where(*codec_) << "the compressor refused this rank's own payload of step " << step
                             << " when error feedback decoded it on the device (for the built-ins, a "
                                "non-finite gradient); the residual (EF21: the estimate) is as it was before the step");
}

void CompressionPipeline::explainPrevRefusal(uint64_t step) {
  TERSE_CHECK(deferred_prev_round_ > 0, InternalError,
              where(*codec_) << "a check of prev was refused in step " << step
                             << ", but no encode of this tensor left one in a word");
  codec_->recheckPrev(step, deferred_prev_round_, deferred_prev_);
  TERSE_THROW(PluginError,
              where(*codec_) << "the compressor's deferred compress refused the aggregate of round "
                             << deferred_prev_round_ - 1 << " of step " << step
                             << " (it raised its verdict word), which its compress accepts: the plugin's two compress "
                                "entry points disagree (terse/device_verdict_v1.h)");
}

void CompressionPipeline::redecode(const std::function<void(void*)>& decode, const std::string& whose, uint64_t step) {
  const TensorInfo& info = codec_->info();
  // Scratch memory, so that a decode that accepts (the plugin's fault) writes nothing of the caller's. Allocated on the
  // failure path only.
  TensorBuffer scratch(static_cast<std::size_t>(info.numel) * dtypeSize(info.dtype), placement_);
  decode(scratch.data());
  if (placement_.device) cuda::synchronize(placement_.stream);
  TERSE_THROW(PluginError,
              where(*codec_) << "the compressor's deferred decompress refused " << whose << " payload of step " << step
                             << " (it raised its verdict word), which its decompress accepts: the "
                                "plugin's two decompress entry points disagree (terse/device_verdict_v1.h)");
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
  // A pass over the tensor, which the FLOP model counts in the decode's four flops per element.
  const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = static_cast<double>(n)});
  const DType dtype = codec_->info().dtype;
  TERSE_CHECK(placement_.device || dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
                  dtype == DType::kBF16,
              Unsupported, where(*codec_) << "cannot average " << dtypeName(dtype) << " gradients");
  averageSummed(out, n, dtype, world_, placement_);
}

void averageSummed(void* out, uint64_t numel, DType dtype, int world, const Placement& placement) {
  if (world == 1) return;
  const auto n = static_cast<std::size_t>(numel);
  if (placement.device) {
    device_kernels::divide(out, n, dtype, world, placement.stream);
    return;
  }
  switch (dtype) {
    case DType::kF32:
      sdk::cpu::clones<divideAll<float>>(static_cast<float*>(out), n, static_cast<float>(world));
      return;
    case DType::kF64:
      sdk::cpu::clones<divideAll<double>>(static_cast<double*>(out), n, static_cast<double>(world));
      return;
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = sdk::floatToHalf(sdk::halfToFloat(p[i]) / static_cast<float>(world));
      return;
    }
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(out);
      for (std::size_t i = 0; i < n; ++i) p[i] = sdk::floatToBf16(sdk::bf16ToFloat(p[i]) / static_cast<float>(world));
      return;
    }
    default:
      TERSE_THROW(Unsupported, "cannot average " << dtypeName(dtype) << " gradients");
  }
}

}  // namespace terse

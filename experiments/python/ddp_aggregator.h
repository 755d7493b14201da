// The state behind terse.torch.ddp_hook: one DDP gradient bucket at a time through core's codecs and core's
// aggregation engine, over the DDP process group (torch_communicator.h). Nothing here re-implements a protocol: the
// plugin comes from core's loader (validated there), each tensor's codec chain from makeCodec (error feedback and
// momentum correction as core's decorators), each pipeline is core's CompressionPipeline (validated against the
// communicator: caps, wire dtype, sizes), and AggregationEngine::run picks the collective the caps ask for -- SUM
// allreduce, ALLGATHER with sizes, CUSTOM with the plugin's reduce fold, every round of a multi-round plugin.
//
// Granularity. DDP hands the hook a bucket: one flat tensor holding several parameters' gradients.
//   kTensor (the default of terse.torch): each parameter in the bucket is its own tensor, with its shape (PowerSGD
//       factors matrices; top-k keeps k per tensor, as terse's trainer does), and the bucket is one group of the
//       engine (fused into one collective per fusion class, engine.h). Pipelines are keyed by tensor id, not by
//       bucket, so DDP re-forming its buckets (it does after the first step) regroups tensors without losing their
//       error-feedback residuals. A tensor id seen again with another shape or dtype is refused.
//   kBucket: the whole flat bucket is one tensor (id = bucket index; a vector, so matrix compressors pass it
//       through). A bucket whose size or dtype changes gets a new pipeline -- its residual starts from zero. DDP
//       re-forms its buckets once, in its second step (in the order its first step's gradients became ready), so every
//       multi-bucket model changes sizes there: that is said once at info level. A change at any other step is not
//       DDP's rebuild, and each is a warning.
//
// Devices. A state aggregates host tensors or the CUDA tensors of one device, never both: the Python side binds it
// (bindHost, bindCuda) at construction when the module shows its device, else at the first bucket, and refuses a later
// bucket elsewhere. Bound to CUDA, every pipeline is built on the device (TensorInfo device CUDA, the plugin's device
// code, codec buffers in device memory) ordered on the bound stream, and the communicator runs in device mode
// (torch_communicator.h): the bucket's gradients are encoded, gathered or summed and decoded where they lie, with no
// copy to the host. Bound to the host, a process group whose backend carries CUDA tensors only (nccl) is refused.
// Both bindings refuse before any collective, so a refusal that hits every rank leaves none inside one.
//
// Threads. aggregate() runs without the GIL -- on the hook's worker thread when the hook overlaps backward, inside the
// hook otherwise -- and takes it only for the torch.distributed calls (torch_communicator.h). The chained path
// (beginChained / finishChained) encodes in the hook call and decodes in a collective's callback -- on gloo's thread,
// possibly while the next bucket begins, or under NCCL at once on the thread that issued it --: those calls and
// aggregate() exclude each other (a mutex). The counters are read with no bucket in flight: the Python state
// (terse/torch.py) waits for its worker and its chained Futures first.
//
// Steps. DDP has no step number; this counts one per backward pass, ending with the bucket DDP marks last. Every
// call validates the whole bucket layout before the first collective, so a bad call (a CUDA tensor, a dtype, an
// overlapping layout) raises on every rank alike and no peer is left inside a collective.
//
// Step trace. With a HookTrace attached (traceTo), each aggregated bucket is one group of the trace's open step
// (HookTrace::openStep, the step the hook's tracer began last): its chunks are the parameters the caller names (whole
// tensors, also in kBucket mode, where the bucket is compressed as one), issued when the hook was called, its phases
// as the engine ran them.
//
// In place. With a compressor whose caps declare TERSE_CAP_IDENTITY (none: its payload's body is the gradient
// unchanged), no error feedback or momentum correction and no trace attached, a bucket of f32 (host or CUDA) is summed
// where it lies, as one collective over the whole buffer, and divided by the world size as every pipeline divides:
// the plugin is never called, so nothing is copied in or out, as DDP's own allreduce copies nothing. The bits are the
// plugin path's (the fused bodies are the bucket's elements in the same order, summed by the same collective); its
// bytes are the body's (no header is produced), and the bucket counts as one tensor. inPlace() says whether it holds.
//
// Dense warm-up (compression_start_step > 0; torch's PowerSGD hook's start_powerSGD_iter, core/train/sync_trainer.h's
// "Dense warm-up"). The steps before compression_start_step average every bucket uncompressed: in place, as above,
// whatever the compressor; with a trace attached, through pipelines of their own (compressor `none` without
// decorators) beside the compressor's. f32 only (`none`'s and the in-place sum's dtype): checkWarmupDtype refuses
// another at its first bucket, after the compressor's own refusal of it. The compressor's pipelines see their
// first gradient at compression_start_step, their error feedback starting there. Steps are counted as above, so the
// switch falls between two of DDP's backward passes, on every rank alike.
//
// Bytes. Per bucket index: the last step's payload bytes (what the compressor produced on this rank, all rounds) and
// wire bytes (what the communicator passed to torch.distributed, modelled as torch_communicator.h says), and their
// sums since the start.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/compress/engine.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/loader.h"
#include "experiments/python/hook_trace.h"
#include "experiments/python/torch_communicator.h"

namespace terse::python {

enum class Granularity { kTensor, kBucket };

struct AggregatorOptions {
  std::string compressor = "none";       // a plugin name or a path (core/plugin/loader.h)
  Params params;                         // the plugin's parameters
  CodecOptions codec;                    // error feedback, momentum correction
  uint64_t seed = 1;                     // the run seed (random-k's shared seed, stochastic rounding)
  std::vector<std::string> plugin_path;  // searched first, like --plugin-path
  Granularity granularity = Granularity::kTensor;
  // > 0: a dense warm-up (see the top of this file): steps before this one are averaged uncompressed.
  uint64_t compression_start_step = 0;
};

// One tensor of a bucket: `numel` elements at element `offset` of the bucket's buffer.
struct BucketMember {
  uint64_t tensor_id = 0;
  uint64_t offset = 0;
  std::vector<int64_t> shape;  // its numel is the product
};

struct ByteCounts {
  uint64_t payload = 0;
  comm::WireBytes wire;
};

struct BucketBytes {
  uint64_t numel = 0;  // of the last step
  std::size_t tensors = 0;
  ByteCounts last_step;
  ByteCounts total;
  uint64_t steps = 0;
};

// One bucket between beginChained and finishChained (see DdpAggregator).
struct ChainedBucket {
  int bucket_index = 0;
  uint64_t numel = 0;
  std::size_t tensors = 0;
  bool is_last = false;
  ByteCounts before;
  std::vector<GroupMember> group;
  SplitSum* split = nullptr;  // the aggregator's, one per bucket index
  double begin_s = 0;         // beginChained's own time, added to hookSeconds at the finish
  bool in_place = false;      // summed where it lies (inPlace()): split->sums views the bucket's data
  void* data = nullptr;       // the bucket's data (null for an empty bucket)
  uint64_t epoch = 0;         // the chained step it belongs to (DdpAggregator, began)
};

class DdpAggregator {
 public:
  // Host tensors whose summed body is this large or larger are summed alone in place (ddp_aggregator.cc, bindHost).
  static constexpr uint64_t kHostSumInPlaceBytes = uint64_t{1} << 20;

  // Loads and instantiates the compressor (PluginError, InvalidArgument with the plugin's message) and validates the
  // codec options, all before any collective. `group` as TorchCommunicator's.
  DdpAggregator(AggregatorOptions options, pybind11::object group);

  // Binds the state to host tensors: throws Unsupported when the process group carries CUDA tensors only (nccl), and
  // InvalidArgument when it is bound to a CUDA device already. Idempotent.
  void bindHost();
  // Binds the state to CUDA device `device`, its pipelines ordered on `stream` (a cudaStream_t; never 0, which terse
  // reserves for host tensors: torch's default stream comes as cudaStreamLegacy). Throws, before any collective:
  // Unsupported naming the plugin when it has no CUDA code; Unsupported when this build has no CUDA or the device is
  // not there; Unsupported naming the backend when the process group cannot carry CUDA tensors; InvalidArgument when
  // the state is bound to the host or to another device or stream already. Idempotent for the same device and stream.
  void bindCuda(int device, uintptr_t stream);
  bool bound() const noexcept { return bound_; }
  bool onDevice() const noexcept { return placement_.device; }
  int device() const noexcept { return device_; }

  // Averages one bucket in place: `data` points to `numel` elements of `dtype` in the bound memory (host, or the
  // bound CUDA device's). In kTensor mode
  // `members` lay the parameters out in the buffer (they must tile it exactly); in kBucket mode they are ignored.
  void aggregate(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                 const std::vector<BucketMember>& members, bool is_last);
  // Averages `numel` f32 elements at `data` across the group uncompressed, whatever the compressor: one allreduce and
  // the division, as the in-place path sums a bucket, counted under `bucket_index` (payload: the f32 bytes) without
  // counting a step. terse.torch.LocalSGD's BatchNorm statistics, which are state, not a change to compress. With a
  // trace attached, a group of the open step with no tensors: the allreduce, then the division as its decompress.
  void averageDense(int bucket_index, uintptr_t data, uint64_t numel);
  // With a trace attached, records an all-gather of `bytes` a rank that the caller ran through torch.distributed
  // itself from `start` to `end` (steadySeconds) as a group of the open step with no tensors, so that a replay prices
  // it at its world size and has the workers meet there (terse.torch.LocalSGD's finiteness check before each
  // averaging, where the replicas that drifted apart wait for each other). Nothing without a trace.
  void traceGather(uint64_t bytes, double start, double end);
  // The same, recorded as a group of the attached trace (see the top of this file): `issued` is when the hook was
  // called (steadySeconds), `traced` the bucket's parameters (tensor id, elements) in DDP's order.
  void aggregate(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                 const std::vector<BucketMember>& members, bool is_last, double issued,
                 const std::vector<std::pair<uint64_t, uint64_t>>& traced);
  // The chained path (terse/torch.py): a bucket's aggregation in pieces around its collectives, which the caller
  // issues on torch.distributed's asynchronous all_reduce and chains the next piece on, as DDP's own hooks chain
  // theirs. For a SUM compressor: of any number of rounds on host tensors; on CUDA ones of one round, or of several
  // when its later rounds' checks of prev stay on the device (chainable(), prevChecksDeferred()).
  // beginChained validates the layout and encodes round 0 (as aggregate() does, before any collective); the caller
  // then sums every one of `bucket.split->sums` across the group, in order, and calls finishChained with the seconds
  // they took. That either lays out the next round's `sums` and returns true (the caller sums those and finishes
  // again), or decodes into the bucket, counts its bytes and time as aggregate() does and returns false. The caller
  // must issue every rank's collectives in one order (terse/torch.py, _Sequencer, says how a later round is placed).
  // On CUDA tensors: the collectives' callbacks run at once on the thread that issued
  // them (NCCL completes a Future when its kernel is queued), backward's own, so no finish may wait for the device.
  // Each bucket's decode leaves its payload checks' verdicts on the device (AggregationEngine::finishSum,
  // Settle::kLater), and they are read together, one synchronization a step, by the finish that ends the step: the
  // last of its buckets to finish once the bucket DDP marks last has begun. A raised one fails that finish with the
  // plugin's message (engine.h, "Payload checks"); the step's gradients are then undefined, as a failed step's are.
  // Several buckets may be in flight at once, and a finish may run on another thread (gloo's, in a Future's callback)
  // while the next bucket begins: the calls exclude each other and aggregate(). The bits are aggregate()'s (engine.h,
  // SplitSum).
  bool chainable() const;
  // Whether a later round's check of prev stays on the device (the plugin exports compress_deferred and defers its
  // decodes' checks, and the engine defers): what chaining a multi-round compressor on CUDA tensors needs, since a
  // later round's encode runs in the round before's callback, under NCCL at once on backward's thread.
  bool prevChecksDeferred() const;
  // For tests without a device: finish chained host buckets as device ones are, their verdicts read once a step (the
  // host's fused decodes still read theirs at once: engine.h). verdictReads() counts the reads, one a step when every
  // step's buckets defer their checks.
  void settleLaterOnHost(bool on) noexcept { settle_later_ = on; }
  uint64_t verdictReads() const noexcept { return verdict_reads_; }
  // Whether this step is the dense warm-up's (step() < compression_start_step).
  bool warmingUp() const noexcept { return step_ < options_.compression_start_step; }
  // The compressor instance's phases (Compressor::phaseSteps, terse/phases_v1.h: dgc's warm-up stages), for the step
  // trace's header.
  std::vector<uint64_t> phaseSteps() const {
    const std::span<const uint64_t> s = instance_->phaseSteps();
    return {s.begin(), s.end()};
  }
  // Whether a bucket of f32 is summed in place now, without the plugin (see the top of this file). It can change
  // only when a trace is attached and at compression_start_step; the caller may leave the members out while it holds.
  bool inPlace() const noexcept;
  // Whether a bucket of `dtype` is summed in place now: inPlace() and f32, the only dtype the path sums.
  bool inPlaceFor(DType dtype) const noexcept { return dtype == DType::kF32 && inPlace(); }
  std::unique_ptr<ChainedBucket> beginChained(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                                              const std::vector<BucketMember>& members, bool is_last);
  bool finishChained(ChainedBucket& bucket, double comm_seconds);

  // Attaches (or with null detaches) a step trace; it must outlive the aggregator's calls.
  void traceTo(HookTrace* trace) noexcept { trace_ = trace; }
  HookTrace* trace() const noexcept { return trace_; }

  uint64_t step() const noexcept { return step_; }
  const std::map<int, BucketBytes>& buckets() const noexcept { return buckets_; }
  // Every pipeline's counters summed (this rank).
  ByteCounts totals() const;
  double encodeSeconds() const;
  double decodeSeconds() const;
  // Time inside torch.distributed calls, and inside aggregate() altogether (this rank).
  double commSeconds() const;
  double hookSeconds() const noexcept { return hook_s_; }
  // What backward waited for the aggregation, as the Python state measures it (terse/torch.py): the whole of each
  // call without overlap, the tail after DDP's last bucket with it.
  void addExposed(double seconds) noexcept { exposed_s_ += seconds; }
  double exposedSeconds() const noexcept { return exposed_s_; }

  const AggregatorOptions& options() const noexcept { return options_; }
  const CompressorPlugin& plugin() const noexcept { return *plugin_; }
  // The dense warm-up's `none` and an instance of it (compression_start_step > 0); null without a warm-up.
  const CompressorPlugin* densePlugin() const noexcept { return dense_plugin_.get(); }
  const Compressor* denseInstance() const noexcept { return dense_instance_.get(); }
  CompressorCaps caps() const { return instance_->caps(DType::kF32); }
  // Refuses gradients of `dtype` as the first bucket of them would, for a caller that knows the model's dtypes before
  // any bucket (module=): Unsupported with the plugin's message for a dtype it does not handle. (Error feedback's own
  // f32-only refusal still comes with the first bucket: no built-in compresses another dtype.)
  void checkDtype(DType dtype) const;
  // checkDtype, during the dense warm-up, once a dtype (the warm-up's buckets reach no pipeline of the compressor).
  void checkWarmupDtype(DType dtype);
  std::optional<Params> resolvedParams() const { return instance_->resolvedParams(); }
  TorchCommunicator& communicator() noexcept { return *comm_; }

 private:
  struct Bound {
    std::unique_ptr<CompressionPipeline> pipeline;
    std::vector<int64_t> shape;
    DType dtype = DType::kF32;
  };
  CompressionPipeline& pipelineFor(uint64_t id, const std::vector<int64_t>& shape, DType dtype, bool rebind);
  // Checks the bucket and binds every member's pipeline (group_), before any collective: aggregate()'s first half.
  void bindBucket(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                  const std::vector<BucketMember>& members, std::vector<GroupMember>& group, ByteCounts& before,
                  std::size_t& tensors);
  void countBucket(int bucket_index, uint64_t numel, std::size_t tensors, const std::vector<GroupMember>& group,
                   const ByteCounts& before, bool is_last);
  // The checks every bucket gets before any collective, on either path (the group, the binding, data and index).
  void checkBucket(int bucket_index, uintptr_t data, uint64_t numel);
  // The in-place path's second half (inPlace()): the average and the count after the sum.
  void finishInPlace(int bucket_index, void* data, uint64_t numel, const comm::WireBytes& wire, bool is_last);
  // The chained path's steps ("epochs": a step ends with the bucket DDP marks last; under gloo its buckets finish in
  // any order on gloo's threads, and DDP begins no bucket of the next step before every one of this step finished,
  // but a caller other than DDP might). began() puts a bucket in the current epoch after its beginChained, and its
  // last bucket ends the epoch; ended() counts it out after its last finish, with its split
  // when its verdicts are left to read (`failed`: its finish threw). An epoch whose last bucket has begun and whose
  // buckets have all ended has its verdicts read (settleThrough: those of it and of any earlier epoch, one
  // synchronization), or, when the ending finish failed, dropped with it.
  void began(ChainedBucket& bucket);
  void ended(const ChainedBucket& bucket, SplitSum* pending, bool failed);
  void settleThrough(uint64_t epoch);

  AggregatorOptions options_;
  PluginLoader loader_;
  std::shared_ptr<const CompressorPlugin> plugin_;
  std::shared_ptr<Compressor> instance_;
  std::unique_ptr<TorchCommunicator> comm_;
  std::unique_ptr<AggregationEngine> engine_;
  std::map<uint64_t, Bound> pipelines_;                   // by tensor id
  std::shared_ptr<const CompressorPlugin> dense_plugin_;  // `none`, for the dense warm-up (compression_start_step)
  std::shared_ptr<Compressor> dense_instance_;
  std::map<uint64_t, Bound> dense_pipelines_;       // the dense warm-up's, by tensor id; cleared past it (pipelineFor)
  double dense_encode_s_ = 0, dense_decode_s_ = 0;  // the cleared ones' codec time
  std::set<DType> warmup_dtypes_;                   // checkWarmupDtype's, checked
  std::map<int, BucketBytes> buckets_;
  std::map<int, SplitSum> splits_;  // the chained path's, by bucket index
  struct Unsettled {
    uint64_t epoch;
    SplitSum* split;
  };
  std::vector<Unsettled> unsettled_;      // chained splits finished with their verdicts not yet read
  std::vector<SplitSum*> settling_;       // settleThrough's, reused
  std::map<uint64_t, std::size_t> open_;  // chained buckets begun and not yet ended, by epoch
  uint64_t epoch_ = 0;                    // the epoch a bucket beginning now belongs to
  uint64_t verdict_reads_ = 0;            // settleThrough calls that read some verdicts
  bool settle_later_ = false;             // settleLaterOnHost
  std::mutex mutex_;                      // aggregate(), beginChained, finishChained (see beginChained)
  std::vector<GroupMember> group_;        // reused per call
  uint64_t step_ = 0;
  bool rebuild_noted_ = false;  // bucket granularity: DDP's rebuild in the second step was logged (pipelineFor)
  bool bound_ = false;
  bool identity_ = false;  // the plugin's caps for f32 declare TERSE_CAP_IDENTITY
  double in_place_s_ = 0;  // the in-place path's averaging, counted as decode
  Placement placement_;    // where the bound tensors live (host until bindCuda)
  int device_ = -1;
  // Records a group of the open step that carries no tensor of the trace: `collective`, then, given `decoded`, its
  // decode up to then. With the mutex held and a trace attached.
  void traceGroupOfNoTensor(const PhaseCollective& collective,
                            std::optional<std::chrono::steady_clock::time_point> decoded);
  HookTrace* trace_ = nullptr;
  uint64_t trace_seq_ = 0;  // groups recorded so far: the run-wide issue number
  double hook_s_ = 0;
  double exposed_s_ = 0;
};

}  // namespace terse::python

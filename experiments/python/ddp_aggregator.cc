#include "experiments/python/ddp_aggregator.h"

#include <algorithm>
#include <numeric>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/train/param_info.h"
#include "core/train/trace_group.h"

namespace py = pybind11;

namespace terse::python {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t numelOf(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

ByteCounts countsOf(const PipelineStats& s) {
  return ByteCounts{s.payload_bytes, s.wire};
}

ByteCounts& operator+=(ByteCounts& a, const ByteCounts& b) {
  a.payload += b.payload;
  a.wire += b.wire;
  return a;
}

ByteCounts operator-(const ByteCounts& a, const ByteCounts& b) {
  return ByteCounts{
      a.payload - b.payload,
      comm::WireBytes{a.wire.sent_bytes - b.wire.sent_bytes, a.wire.received_bytes - b.wire.received_bytes,
                      a.wire.sent_frames - b.wire.sent_frames, a.wire.received_frames - b.wire.received_frames}};
}

}  // namespace

DdpAggregator::DdpAggregator(AggregatorOptions options, py::object group)
    : options_(std::move(options)), loader_(options_.plugin_path, "plugin_path=") {
  // The loader names the folders as a Python caller passes them (plugin_path=), not as the CLI's --plugin-path.
  validateCodecOptions(options_.codec);
  plugin_ = loader_.loadCompressor(options_.compressor);
  instance_ = plugin_->instantiate(options_.params);
  if (options_.compression_start_step > 0) {
    dense_plugin_ = loader_.loadCompressor("none");
    dense_instance_ = dense_plugin_->instantiate({});
  }
  // What Ef21's constructor would refuse at the first bucket (core/compress/ef21.h), refused before any.
  if (options_.codec.error_feedback && options_.codec.error_feedback_rule == ErrorFeedbackRule::kEf21) {
    const CompressorCaps& caps = instance_->caps(DType::kF32);
    TERSE_CHECK(caps.aggregation != Aggregation::kCustom, Unsupported,
                "terse.torch: error_feedback_rule='ef21' needs an aggregate that is the sum of what the ranks sent; "
                "compressor '"
                    << options_.compressor
                    << "' has CUSTOM aggregation (e.g. a majority vote): use a SUM or ALLGATHER "
                       "compressor, or error_feedback_rule='ef'");
    TERSE_CHECK(caps.aggregation != Aggregation::kSum || caps.wire_dtype == DType::kF32, Unsupported,
                "terse.torch: error_feedback_rule='ef21' keeps the sum of the estimates from the aggregate, where what "
                "a 16-bit sum rounds away stays for good; compressor '"
                    << options_.compressor << "' sums in " << dtypeName(caps.wire_dtype)
                    << ": use one that sums in f32, or error_feedback_rule='ef'");
  }
  comm_ = std::make_unique<TorchCommunicator>(std::move(group));
  engine_ = std::make_unique<AggregationEngine>(*comm_);
  const CompressorCaps f32 = caps();
  identity_ = f32.identity;
}

bool DdpAggregator::inPlace() const noexcept {
  // Error feedback and momentum correction keep a residual per tensor, which needs the codec. Host and device alike:
  // on the device the collective is the one the plugin path's payloads go through (torch.distributed on a view of
  // device memory, ordered after the bound stream's work) and the division is averageSummed's kernel on that stream.
  // The dense warm-up's steps are summed as an identity compressor's are: no codec runs in them.
  return (warmingUp() || (identity_ && !options_.codec.error_feedback && options_.codec.momentum_correction == 0)) &&
         trace_ == nullptr;
}

void DdpAggregator::checkBucket(int bucket_index, uintptr_t data, uint64_t numel) {
  comm_->checkGroup();
  if (!bound_) bindHost();  // a caller that binds nothing aggregates host tensors, as before devices were known
  TERSE_CHECK(data != 0 || numel == 0, InvalidArgument, "terse.torch: bucket " << bucket_index << " has no data");
  TERSE_CHECK(bucket_index >= 0, InvalidArgument, "terse.torch: bucket index " << bucket_index << " is negative");
}

void DdpAggregator::finishInPlace(int bucket_index, void* data, uint64_t numel, const comm::WireBytes& wire,
                                  bool is_last) {
  const auto start = Clock::now();
  averageSummed(data, numel, DType::kF32, comm_->size(), placement_);
  in_place_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  BucketBytes& b = buckets_[bucket_index];
  b.numel = numel;
  b.tensors = 1;
  b.last_step = ByteCounts{numel * sizeof(float), wire};
  b.total += b.last_step;
  ++b.steps;
  if (is_last) ++step_;
}

void DdpAggregator::bindHost() {
  TERSE_CHECK(!placement_.device, InvalidArgument,
              "terse.torch: a CPU bucket reached a state bound to cuda:"
                  << device_ << "; a model's gradients must all be on one device (build one state per device)");
  TERSE_CHECK(comm_->torchBackend() != "nccl", Unsupported,
              "terse.torch: the gradients are CPU tensors and the process group's backend is 'nccl', which carries "
              "CUDA tensors only; use a 'gloo' process group for a CPU model, or move the model to its GPU");
  // A tensor of 1 MiB or more is summed alone, in place behind its header, instead of being copied into the fused
  // buffer and back: on the CPU two copies of a megabyte cost about what one more gloo collective's latency does,
  // and DDP's own allreduce copies nothing. Measured with bench_ddp_hooks.py's CNN (one 15.9 MB weight among small
  // tensors), terse none over DDP's allreduce 1.067-1.125 fused against 0.941-1.040 with the large tensor alone; the
  // MLP (largest tensor 0.8 MB) is fused as before. Bit-identical at 1 and 2 ranks (engine.h). On the device the
  // engine fuses everything, as measured on the H200: a copy there costs far less beside a collective's latency.
  engine_->sumInPlaceFrom(kHostSumInPlaceBytes);
  bound_ = true;
}

void DdpAggregator::bindCuda(int device, uintptr_t stream) {
  void* handle = reinterpret_cast<void*>(stream);
  if (placement_.device && device == device_ && handle == placement_.stream) return;
  TERSE_CHECK(!placement_.device, InvalidArgument,
              "terse.torch: a bucket on cuda:" << device << " reached a state bound to cuda:" << device_
                                               << "; a model's gradients must all be on one device (build one state "
                                                  "per device)");
  TERSE_CHECK(!bound_, InvalidArgument,
              "terse.torch: a bucket on cuda:" << device
                                               << " reached a state bound to CPU tensors; a model's gradients must all "
                                                  "be on one device (build one state per device)");
  TERSE_CHECK(device >= 0, InvalidArgument, "terse.torch: CUDA device ordinal " << device << " is negative");
  TERSE_CHECK(handle != nullptr, InvalidArgument,
              "terse.torch: a CUDA state needs a stream; torch's default stream is passed as cudaStreamLegacy (1)");
  // The plugin first: the refusal that names what the user can change (another compressor) holds on any machine.
  TERSE_CHECK((caps().devices & TERSE_DEVICE_CUDA) != 0, Unsupported,
              "terse.torch: compressor '"
                  << plugin_->info().name << "' (" << plugin_->info().path.string()
                  << ") has no CUDA code, so it cannot compress this model's CUDA gradients; pick a compressor whose "
                     "`terse plugins show` lists devices cuda, or train on the CPU"
                  << (cuda::builtWithCuda() ? "" : " (this terse was built without CUDA, so are its plugins)"));
  TERSE_CHECK(cuda::builtWithCuda(), Unsupported,
              "terse.torch: the gradients are on cuda:" << device
                                                        << " and this terse extension was built without CUDA; "
                                                           "rebuild it with -DTERSE_CUDA=ON");
  const cuda::DeviceSummary devices = cuda::deviceSummary();
  TERSE_CHECK(device < devices.count, Unsupported,
              "terse.torch: CUDA device "
                  << device << " is not visible to terse ("
                  << (devices.count == 0 ? devices.reason : std::to_string(devices.count) + " device(s)") << ")");
  comm_->useDevice(device, handle);
  placement_ = Placement::cuda(handle);
  device_ = device;
  bound_ = true;
}

CompressionPipeline& DdpAggregator::pipelineFor(uint64_t id, const std::vector<int64_t>& shape, DType dtype,
                                                bool rebind) {
  const bool dense = warmingUp();
  if (!dense && !dense_pipelines_.empty()) {
    // Past the warm-up, for good: its pipelines' buffers (a model's worth) go, their codec time stays counted.
    for (const auto& [tensor, b] : dense_pipelines_) {
      dense_encode_s_ += b.pipeline->stats().encode_s;
      dense_decode_s_ += b.pipeline->stats().decode_s;
    }
    dense_pipelines_.clear();
  }
  std::map<uint64_t, Bound>& pipelines = dense ? dense_pipelines_ : pipelines_;
  auto it = pipelines.find(id);
  if (it != pipelines.end()) {
    if (it->second.shape == shape && it->second.dtype == dtype) return *it->second.pipeline;
    TERSE_CHECK(rebind, InvalidArgument,
                "terse.torch: tensor " << id << " was bound as " << dtypeName(it->second.dtype) << " "
                                       << shapeText(it->second.shape) << " and is now " << dtypeName(dtype) << " "
                                       << shapeText(shape)
                                       << "; a parameter cannot change shape under a hook (build a new one)");
    // DDP re-forms its buckets once, as its second backward begins (Reducer::rebuild_buckets, in the order the first
    // step's gradients became ready), so on every model of several buckets sizes change there: expected, and said
    // once, at info level. A change at any other step is something else re-forming them, so each is a warning.
    const std::string change = "bucket " + std::to_string(id) + " changed from " + shapeText(it->second.shape) + " " +
                               std::string(dtypeName(it->second.dtype)) + " to " + shapeText(shape) + " " +
                               std::string(dtypeName(dtype));
    if (step_ == 1) {
      if (!rebuild_noted_) {
        TERSE_LOG(LogLevel::kInfo, "terse.torch: DDP re-formed its buckets after its first step, as it does once ("
                                       << change << "): each bucket that changed gets a new pipeline"
                                       << (dense ? "" : ", whose error-feedback residual starts at zero"));
      }
      rebuild_noted_ = true;
    } else {
      TERSE_LOG(LogLevel::kWarn, "terse.torch: " << change << " after " << step_
                                                 << " steps, not DDP's own rebuild (once, after its first step): new "
                                                    "pipeline"
                                                 << (dense ? "" : ", its error-feedback residual starts at zero"));
    }
    pipelines.erase(it);
  }
  train::ParamTensor p;
  p.shape = shape;
  p.value.resize(static_cast<std::size_t>(numelOf(shape)));  // paramTensorInfo reads numel from the values
  TensorInfo info = train::paramTensorInfo(p, static_cast<std::size_t>(id), comm_->rank(), comm_->size());
  info.dtype = dtype;
  if (placement_.device) {
    info.device = TERSE_DEVICE_CUDA;
    info.device_index = device_;
  }
  Bound b{std::make_unique<CompressionPipeline>(
              makeCodec(dense ? dense_instance_ : instance_, info, options_.seed,
                        dense ? CodecOptions{} : options_.codec, placement_.device ? placement_.stream : nullptr),
              *comm_),
          shape, dtype};
  return *pipelines.emplace(id, std::move(b)).first->second.pipeline;
}

void DdpAggregator::aggregate(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                              const std::vector<BucketMember>& members, bool is_last) {
  aggregate(bucket_index, data, numel, dtype, members, is_last, 0.0, {});
}

void DdpAggregator::bindBucket(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                               const std::vector<BucketMember>& members, std::vector<GroupMember>& group,
                               ByteCounts& before, std::size_t& tensors) {
  checkBucket(bucket_index, data, numel);
  const std::size_t elem = dtypeSize(dtype);
  auto* base = reinterpret_cast<std::byte*>(data);

  std::vector<BucketMember> layout;
  const bool whole = options_.granularity == Granularity::kBucket;
  if (whole) {
    layout.push_back(BucketMember{static_cast<uint64_t>(bucket_index), 0, {static_cast<int64_t>(numel)}});
  } else {
    layout = members;
    // The members must tile the buffer: no overlap (a gradient averaged twice), no gap (one never averaged).
    std::sort(layout.begin(), layout.end(),
              [](const BucketMember& a, const BucketMember& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    for (const BucketMember& m : layout) {
      TERSE_CHECK(m.offset == at, InvalidArgument,
                  "terse.torch: bucket " << bucket_index << ": tensor " << m.tensor_id << " starts at element "
                                         << m.offset << ", expected " << at
                                         << " (the bucket's tensors must tile its buffer)");
      at += numelOf(m.shape);
    }
    TERSE_CHECK(
        at == numel, InvalidArgument,
        "terse.torch: bucket " << bucket_index << ": its tensors hold " << at << " elements, the buffer " << numel);
  }

  // Bind every member before the first collective: a refusal is raised on every rank alike.
  group.clear();
  before = ByteCounts{};
  for (const BucketMember& m : layout) {
    CompressionPipeline& p = pipelineFor(m.tensor_id, m.shape, dtype, whole);
    before += countsOf(p.stats());
    void* at = base + m.offset * elem;
    group.push_back(GroupMember{&p, at, at});
  }
  tensors = layout.size();
}

void DdpAggregator::countBucket(int bucket_index, uint64_t numel, std::size_t tensors,
                                const std::vector<GroupMember>& group, const ByteCounts& before, bool is_last) {
  ByteCounts after;
  for (const GroupMember& m : group) after += countsOf(m.pipeline->stats());
  BucketBytes& b = buckets_[bucket_index];
  b.numel = numel;
  b.tensors = tensors;
  b.last_step = after - before;
  b.total += b.last_step;
  ++b.steps;
  if (is_last) ++step_;
}

void DdpAggregator::aggregate(int bucket_index, uintptr_t data, uint64_t numel, DType dtype,
                              const std::vector<BucketMember>& members, bool is_last, double issued,
                              const std::vector<std::pair<uint64_t, uint64_t>>& traced) {
  const std::lock_guard lock(mutex_);
  const auto start = Clock::now();
  checkWarmupDtype(dtype);
  if (inPlaceFor(dtype)) {
    checkBucket(bucket_index, data, numel);
    // Every rank's bucket has the same size, so an empty one issues nothing anywhere.
    auto* at = reinterpret_cast<void*>(data);
    const comm::WireBytes wire =
        numel == 0 ? comm::WireBytes{} : comm_->allreduce(at, numel, DType::kF32, comm::ReduceOp::kSum, bucket_index);
    finishInPlace(bucket_index, at, numel, wire, is_last);
    hook_s_ += std::chrono::duration<double>(Clock::now() - start).count();
    return;
  }
  ByteCounts before;
  std::size_t tensors = 0;
  bindBucket(bucket_index, data, numel, dtype, members, group_, before, tensors);
  if (trace_ != nullptr) {
    train::TracedGroupPhases phases;
    engine_->run(step_, group_, phases.recorder());
    phases.group.seq = trace_seq_++;
    for (const auto& [id, elements] : traced) {
      phases.group.chunks.emplace_back(id, 0);
      phases.group.chunk_elements.push_back(elements);
    }
    trace_->recorder().group(trace_->openStep(), std::move(phases.group), steadyPoint(issued), phases.spans);
  } else {
    engine_->run(step_, group_);
  }
  countBucket(bucket_index, numel, tensors, group_, before, is_last);
  hook_s_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void DdpAggregator::averageDense(int bucket_index, uintptr_t data, uint64_t numel) {
  const std::lock_guard lock(mutex_);
  const auto start = Clock::now();
  checkBucket(bucket_index, data, numel);
  auto* at = reinterpret_cast<void*>(data);
  const comm::WireBytes wire =
      numel == 0 ? comm::WireBytes{} : comm_->allreduce(at, numel, DType::kF32, comm::ReduceOp::kSum, bucket_index);
  const auto summed = Clock::now();
  finishInPlace(bucket_index, at, numel, wire, /*is_last=*/false);
  if (trace_ != nullptr && numel > 0) {
    // Buffers are not parameters: a group of no tensor, its division a decode.
    PhaseCollective sum;
    sum.op = "allreduce";
    sum.algorithm = comm_->allreduceAlgorithmRun(numel * sizeof(float));
    sum.dtype = DType::kF32;
    sum.bytes = numel * sizeof(float);
    sum.start = start;
    sum.end = summed;
    traceGroupOfNoTensor(sum, Clock::now());
  }
  hook_s_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void DdpAggregator::traceGather(uint64_t bytes, double start, double end) {
  const std::lock_guard lock(mutex_);
  if (trace_ == nullptr) return;
  const std::vector<uint64_t> blocks(static_cast<std::size_t>(comm_->size()), bytes);
  PhaseCollective gather;
  gather.op = "allgatherv";
  gather.algorithm = comm_->allgatherAlgorithmRun(bytes * blocks.size());
  gather.dtype = DType::kU8;
  gather.bytes = bytes;
  gather.rank_bytes = blocks;
  gather.start = steadyPoint(start);
  gather.end = steadyPoint(std::max(start, end));
  traceGroupOfNoTensor(gather, std::nullopt);
}

void DdpAggregator::traceGroupOfNoTensor(const PhaseCollective& collective, std::optional<Clock::time_point> decoded) {
  // One collective, then the decode from its end to `decoded` where there is one: a replay prices the collective at
  // its world size and runs it in its place among the step's groups, once the step's computation has ended.
  train::TracedGroupPhases phases;
  phases.add(collective.op, collective.start, collective.end, std::span(&collective, 1));
  if (decoded) phases.add("decompress", collective.end, *decoded, {});
  phases.group.seq = trace_seq_++;
  trace_->recorder().group(trace_->openStep(), std::move(phases.group), collective.start, phases.spans);
}

void DdpAggregator::checkDtype(DType dtype) const {
  (void)instance_->caps(dtype);  // the plugin's own refusal, as a pipeline of this dtype gets it (plugin_codec.h)
}

void DdpAggregator::checkWarmupDtype(DType dtype) {
  // The compressor's pipelines see no bucket before the switch; what they would refuse is refused at the first bucket
  // of the dtype all the same, not hours later at compression_start_step.
  if (!warmingUp() || !warmup_dtypes_.insert(dtype).second) return;
  try {
    checkDtype(dtype);
    // Every built-in compressor refuses a dtype but f32 above; this is for a plugin that takes one.
    TERSE_CHECK(dtype == DType::kF32, Unsupported,
                "terse.torch: compression_start_step " << options_.compression_start_step
                                                       << ": the dense warm-up averages f32 gradients, and this bucket "
                                                          "holds "
                                                       << dtypeName(dtype)
                                                       << "; convert the model (module.float()) or leave "
                                                          "compression_start_step 0");
  } catch (...) {
    warmup_dtypes_.erase(dtype);
    throw;
  }
}

bool DdpAggregator::prevChecksDeferred() const {
  return instance_->defersPrevVerdicts() && instance_->defersVerdicts() && engine_->defersVerdicts();
}

bool DdpAggregator::chainable() const {
  const CompressorCaps c = caps();
  // On the host of any number of rounds: the caller issues each round's sums in an order fixed beforehand from the
  // bucket order alone (terse/torch.py, _Sequencer), never as they become ready, since gloo pairs collectives by the
  // order they were issued in. On a device of one round, or of several where the later rounds' checks of prev stay on
  // the device too (see the header).
  return c.aggregation == Aggregation::kSum && (!placement_.device || c.num_rounds == 1 || prevChecksDeferred());
}

void DdpAggregator::settleThrough(uint64_t epoch) {
  settling_.clear();
  std::erase_if(unsettled_, [&](const Unsettled& u) {
    if (u.epoch > epoch) return false;
    settling_.push_back(u.split);
    return true;
  });
  if (settling_.empty()) return;
  ++verdict_reads_;
  engine_->settleSums(settling_);
}

std::unique_ptr<ChainedBucket> DdpAggregator::beginChained(int bucket_index, uintptr_t data, uint64_t numel,
                                                           DType dtype, const std::vector<BucketMember>& members,
                                                           bool is_last) {
  const std::lock_guard lock(mutex_);
  const auto start = Clock::now();
  TERSE_CHECK(chainable(), InvalidArgument,
              "terse.torch: compressor '" << plugin_->info().name
                                          << "' cannot be chained on asynchronous collectives (only a SUM compressor "
                                             "can: of any number of rounds on CPU tensors; on CUDA tensors of one "
                                             "round, or of several when it exports "
                                             "terse_compressor_compress_deferred_v1)");
  // A split finished and not yet read belongs to an earlier step that never ended (a bucket of it failed, and the hook
  // stops after a failure, so this is for a caller that goes on): every unread verdict is read before its pipelines
  // encode again, and the steps left open are given up.
  if (const auto it = splits_.find(bucket_index);
      it != splits_.end() && it->second.sums.empty() && it->second.verdictsPending()) {
    std::erase_if(open_, [&](const auto& e) { return e.first < epoch_; });  // earlier steps: given up
    settleThrough(UINT64_MAX);
  }
  auto b = std::make_unique<ChainedBucket>();
  b->bucket_index = bucket_index;
  b->numel = numel;
  b->is_last = is_last;
  checkWarmupDtype(dtype);
  if (inPlaceFor(dtype)) {
    checkBucket(bucket_index, data, numel);
    b->split = &splits_[bucket_index];
    TERSE_CHECK(b->split->sums.empty(), InvalidArgument,
                "terse.torch: bucket " << bucket_index << " was handed over again before its aggregation finished");
    b->in_place = true;
    b->data = reinterpret_cast<void*>(data);
    // An empty bucket has no sums on any rank: the caller issues nothing and finishes at once.
    if (numel > 0) {
      b->split->sums.push_back(
          SplitSum::Sum{std::span<std::byte>(static_cast<std::byte*>(b->data), numel * sizeof(float)), DType::kF32,
                        static_cast<uint64_t>(bucket_index)});
    }
    b->begin_s = std::chrono::duration<double>(Clock::now() - start).count();
    began(*b);
    return b;
  }
  bindBucket(bucket_index, data, numel, dtype, members, b->group, b->before, b->tensors);
  b->split = &splits_[bucket_index];
  TERSE_CHECK(b->split->sums.empty(), InvalidArgument,
              "terse.torch: bucket " << bucket_index << " was handed over again before its aggregation finished");
  try {
    engine_->beginSum(step_, b->group, *b->split);
  } catch (...) {
    b->split->sums.clear();  // nothing of this bucket is in flight: its index may begin again
    throw;
  }
  b->begin_s = std::chrono::duration<double>(Clock::now() - start).count();
  began(*b);
  return b;
}

void DdpAggregator::began(ChainedBucket& bucket) {
  bucket.epoch = epoch_;
  ++open_[epoch_];
  if (bucket.is_last) ++epoch_;
}

void DdpAggregator::ended(const ChainedBucket& bucket, SplitSum* pending, bool failed) {
  if (pending != nullptr) unsettled_.push_back(Unsettled{bucket.epoch, pending});
  const auto it = open_.find(bucket.epoch);
  // A step given up (beginChained), one with buckets in flight, or one whose last bucket has not begun: not yet.
  if (it == open_.end() || --it->second != 0 || bucket.epoch >= epoch_) return;
  open_.erase(it);
  if (failed) {
    // The step failed in this finish: its error is the step's, and what its other buckets left unread goes with it.
    std::erase_if(unsettled_, [&](const Unsettled& u) {
      if (u.epoch != bucket.epoch) return false;
      u.split->discardVerdicts();
      return true;
    });
    return;
  }
  settleThrough(bucket.epoch);
}

bool DdpAggregator::finishChained(ChainedBucket& bucket, double comm_seconds) {
  const std::lock_guard lock(mutex_);
  const auto start = Clock::now();
  SplitSum& split = *bucket.split;
  std::vector<comm::WireBytes> wires;
  wires.reserve(split.sums.size());
  // The seconds of the bucket's collectives, which ran together, shared out by bytes.
  uint64_t total = 0;
  for (const SplitSum::Sum& s : split.sums) total += s.data.size();
  for (const SplitSum::Sum& s : split.sums)
    wires.push_back(comm_->recordAllreduce(
        s.data.size(), s.tensor,
        total == 0 ? 0.0 : comm_seconds * static_cast<double>(s.data.size()) / static_cast<double>(total)));
  if (bucket.in_place) {
    split.sums.clear();
    finishInPlace(bucket.bucket_index, bucket.data, bucket.numel, wires.empty() ? comm::WireBytes{} : wires[0],
                  bucket.is_last);
    hook_s_ += comm_seconds + bucket.begin_s + std::chrono::duration<double>(Clock::now() - start).count();
    ended(bucket, nullptr, false);
    return false;
  }
  // On a device the verdicts wait for the step's end (see the header); on the host they are read here.
  const bool later = placement_.device || settle_later_;
  bool more = false;
  try {
    more =
        engine_->finishSum(split, wires, later ? AggregationEngine::Settle::kLater : AggregationEngine::Settle::kNow);
  } catch (...) {
    split.sums.clear();
    ended(bucket, nullptr, true);
    throw;
  }
  hook_s_ += comm_seconds + std::chrono::duration<double>(Clock::now() - start).count();
  if (more) return true;  // the next round's sums are laid out
  countBucket(bucket.bucket_index, bucket.numel, bucket.tensors, bucket.group, bucket.before, bucket.is_last);
  hook_s_ += bucket.begin_s;
  const auto settle_start = Clock::now();
  ended(bucket, split.verdictsPending() ? &split : nullptr, false);
  hook_s_ += std::chrono::duration<double>(Clock::now() - settle_start).count();
  return false;
}

ByteCounts DdpAggregator::totals() const {
  // Every pipeline is used only through aggregate() and the chained calls, so the buckets' sums are the pipelines'
  // sums, and they keep the counts of a kBucket pipeline that was replaced.
  ByteCounts t;
  for (const auto& [index, b] : buckets_) t += b.total;
  return t;
}

double DdpAggregator::encodeSeconds() const {
  double s = 0;
  for (const auto* set : {&pipelines_, &dense_pipelines_})
    for (const auto& [id, b] : *set) s += b.pipeline->stats().encode_s;
  return s + dense_encode_s_;
}

double DdpAggregator::decodeSeconds() const {
  double s = 0;
  for (const auto* set : {&pipelines_, &dense_pipelines_})
    for (const auto& [id, b] : *set) s += b.pipeline->stats().decode_s;
  return s + dense_decode_s_ + in_place_s_;
}

double DdpAggregator::commSeconds() const {
  const comm::CommStats s = comm_->stats();
  return std::accumulate(s.by_kind.begin(), s.by_kind.end(), 0.0,
                         [](double acc, const comm::OpStats& o) { return acc + o.seconds; });
}

}  // namespace terse::python

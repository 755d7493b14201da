#include "core/train/sync_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/train/param_info.h"

namespace terse::train {
namespace {

using Clock = rt::Clock;
using rt::seconds;

double commSeconds(const comm::Communicator& comm) {
  double s = 0;
  for (const auto& k : comm.stats().by_kind) s += k.seconds;
  return s;
}

// The FLOP model's optimizer cost: momentum update and step, each a multiply-add per element.
constexpr double kOptimizerFlopsPerElement = 4;

std::string layerName(int layer) {
  return "L" + std::to_string(layer);
}

}  // namespace

void stragglerSleep(double slowdown, double raw_compute_s) {
  if (slowdown > 1 && raw_compute_s > 0) rt::sleepFor(std::chrono::duration<double>((slowdown - 1) * raw_compute_s));
}

uint64_t parameterChecksum(std::span<const ParamTensor> params) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  for (const auto& p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.value.data());
    const std::size_t n = p.value.size() * sizeof(float);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= bytes[i];
      h *= 1099511628211ull;  // FNV prime
    }
  }
  return h;
}

SyncTrainer::SyncTrainer(Workload& workload, comm::Communicator& comm, PipelineFactory pipelines,
                         const SyncTrainerOptions& options, std::unique_ptr<Scheduler> scheduler)
    : workload_(workload),
      comm_(comm),
      device_(workload.device() >= 0),
      options_(options),
      sampler_(workload.numTrainExamples(), comm.rank(), comm.size(), options.seed),
      optimizer_(workload.params(), options.sgd, workload.device() >= 0 ? comm.deviceStream() : nullptr),
      scheduler_(std::move(scheduler)),
      factory_(std::move(pipelines)),
      engine_(comm) {
  TERSE_CHECK(options.batch_size >= 1, InvalidArgument, "batch_size must be >= 1, got " << options.batch_size);
  TERSE_CHECK(options.epochs >= 1, InvalidArgument, "epochs must be >= 1, got " << options.epochs);
  TERSE_CHECK(options.slowdown >= 1 && std::isfinite(options.slowdown), InvalidArgument,
              "slowdown must be a finite factor >= 1, got " << options.slowdown);
  const auto params = workload.params();
  TERSE_CHECK((workload.device() >= 0) == comm.deviceMemory(), InvalidArgument,
              "workload '" << workload.name() << "' computes on "
                           << (workload.device() >= 0 ? "CUDA device " + std::to_string(workload.device()) : "the host")
                           << " but the '" << comm.backend() << "' communicator works on "
                           << (comm.deviceMemory() ? "device" : "host")
                           << " memory (a GPU workload needs the NCCL transport, a host one a host transport)");
  TERSE_CHECK(scheduler_ != nullptr, InvalidArgument,
              "the trainer needs a scheduler (fifo, the default, sends whole tensors in ready order)");
  TERSE_CHECK(factory_ != nullptr, InvalidArgument, "the trainer needs a pipeline factory");
  for (std::size_t i = 0; i < params.size(); ++i) {
    pipelines_.push_back(makePipeline(paramTensorInfo(params[i], i, comm.rank(), comm.size(), workload.device())));
    const bool sparse = options.sparse_rows && params[i].row_sparse;
    TERSE_CHECK(!sparse || !device_, InvalidArgument,
                "tensor '" << params[i].name << "' is row-sparse, but sparse rows are aggregated on the host only");
    sparse_.push_back(sparse ? std::make_unique<RowSparseAllgather>(comm, static_cast<uint64_t>(params[i].shape.at(0)),
                                                                    params[i].rowLength(), i)
                             : nullptr);
  }
  TERSE_CHECK(options.accumulation_steps >= 1, InvalidArgument,
              "gradient_accumulation_steps must be >= 1, got " << options.accumulation_steps);
  TERSE_CHECK(std::isfinite(options.clip_grad_norm) && options.clip_grad_norm >= 0, InvalidArgument,
              "optimizer.clip_grad_norm must be finite and >= 0, got " << options.clip_grad_norm);
  const bool any_sparse = std::any_of(sparse_.begin(), sparse_.end(), [](const auto& s) { return s != nullptr; });
  TERSE_CHECK(!any_sparse || (options.accumulation_steps == 1 && options.clip_grad_norm == 0), InvalidArgument,
              "gradient_accumulation_steps (" << options.accumulation_steps << ") and optimizer.clip_grad_norm ("
                                              << options.clip_grad_norm
                                              << ") do not combine with sparse_rows: row-sparse tensors are applied "
                                                 "as their rows arrive");
  TERSE_CHECK(device_ == false || (options.accumulation_steps == 1 && options.clip_grad_norm == 0), InvalidArgument,
              "gradient_accumulation_steps (" << options.accumulation_steps << ") and optimizer.clip_grad_norm ("
                                              << options.clip_grad_norm << ") are host-only; workload '"
                                              << workload.name() << "' computes on a CUDA device");
  const int64_t micro_batches = sampler_.batchesPerEpoch(options.batch_size, options.drop_last);
  steps_per_epoch_ = (micro_batches + options.accumulation_steps - 1) / options.accumulation_steps;
  if (options.accumulation_steps > 1)
    for (const auto& p : params) accumulated_.emplace_back(p.numel());
  TERSE_CHECK(steps_per_epoch_ >= 1, InvalidArgument,
              "a shard of " << sampler_.shardSize() << " examples holds no full batch of " << options.batch_size
                            << " (drop_last)");
  lr_ = options.lr;
  lr_.world_size = comm.size();
  lr_.steps_per_epoch = steps_per_epoch_;
  lr_.total_steps = totalSteps();
  TERSE_CHECK(options.warmup_epochs >= 0 && !(options.warmup_epochs > 0 && lr_.warmup_steps > 0), InvalidArgument,
              "warm-up: give steps (" << lr_.warmup_steps << ") or epochs (" << options.warmup_epochs
                                      << "), not both, and not negative");
  if (options.warmup_epochs > 0) {
    lr_.warmup_steps = std::llround(options.warmup_epochs * static_cast<double>(steps_per_epoch_));
  }
  validateLrSchedule(lr_);
  issue_order_.reserve(params.size());
  chunks_left_.assign(params.size(), 0);
  started_.assign(params.size(), false);
  applied_.assign(params.size(), -1);
  layer_applied_.assign(static_cast<std::size_t>(workload.numLayers()), -1);
  for (int l = 0; l < workload.numLayers(); ++l) layer_flops_.push_back(workload.layerFlops(l));
  TERSE_CHECK(options.max_groups_in_flight >= 1, InvalidArgument,
              "max_groups_in_flight must be >= 1, got " << options.max_groups_in_flight);
  if (options.max_groups_in_flight > 1) {
    for (int k = 0; k < options.max_groups_in_flight; ++k) {
      Lane lane;
      lane.channel = comm.openChannel();
      TERSE_CHECK(lane.channel != nullptr, InvalidArgument,
                  "max_groups_in_flight " << options.max_groups_in_flight << " needs a communicator that runs "
                                          << "collectives side by side; the '" << comm.backend()
                                          << "' communicator runs one at a time (use 1)");
      lane.engine = std::make_unique<AggregationEngine>(*lane.channel);
      lanes_.push_back(std::move(lane));
    }
    for (std::size_t k = 0; k < lanes_.size(); ++k)
      lanes_[k].thread = rt::Thread(
          "lane " + std::to_string(comm_.rank()) + "." + std::to_string(k), [this, k] { laneLoop(k); }, comm_.rank());
  }
  workload_.setLayerGate([this](int layer) { gate(layer); });
  comm_thread_ = rt::Thread(
      "comm " + std::to_string(comm_.rank()),
      [this] {
        if (device_) {
          // CUDA's current device is per host thread: this thread launches the pipelines' kernels and allocates the
          // chunk pipelines' buffers, which must land on the workload's device, not on device 0.
          try {
            cuda::setDevice(workload_.device());
          } catch (const std::exception& x) {
            {
              std::lock_guard lock(mutex_);
              if (!error_) error_ = std::current_exception();
            }
            failComm(x.what());
            applied_cv_.notify_all();
            return;
          }
        }
        commLoop();
      },
      comm_.rank());
}

SyncTrainer::~SyncTrainer() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  comm_thread_.join();
  {
    std::lock_guard lock(mutex_);
    lanes_stop_ = true;
  }
  lane_cv_.notify_all();
  for (Lane& lane : lanes_) lane.thread.join();
  workload_.setLayerGate({});
}

Negotiation SyncTrainer::negotiation() const {
  std::lock_guard lock(mutex_);
  return {acc_negotiations_, acc_negotiation_bytes_};
}

uint64_t SyncTrainer::payloadBytes() {
  drain();
  uint64_t total = 0;
  for (const auto& p : pipelines_) total += p->stats().payload_bytes - p->stats().unsent_header_bytes;
  for (const auto& [key, p] : chunk_pipelines_) total += p->stats().payload_bytes - p->stats().unsent_header_bytes;
  return total + sparse_payload_bytes_;
}

const std::vector<std::size_t>& SyncTrainer::lastIssueOrder() {
  drain();
  return issue_order_;
}

const std::vector<IssuedGroup>& SyncTrainer::lastGroups() {
  drain();
  return groups_;
}

uint64_t SyncTrainer::checksum() {
  drain();
  workload_.copyValuesToHost();  // a device workload's host mirror is refreshed only on request
  return parameterChecksum(workload_.params());
}

void SyncTrainer::enqueue(int64_t step, std::span<const std::size_t> tensors, double lr) {
  {
    std::lock_guard lock(mutex_);
    for (std::size_t t : tensors) inbox_.push_back(Ready{static_cast<uint64_t>(step), t, lr});
  }
  work_cv_.notify_one();
}

void SyncTrainer::failComm(const std::string& where) {
  // Every rank's pending and later collectives fail at once instead of waiting for this rank.
  comm_.abort("rank " + std::to_string(comm_.rank()) + ": " + where);
}

std::unique_ptr<CompressionPipeline> SyncTrainer::makePipeline(const TensorInfo& info) {
  std::unique_ptr<CompressionPipeline> p = factory_(info);
  // The factory is the caller's code: hold it to the tensor it was asked for, since the engine trusts the sizes.
  TERSE_CHECK(p != nullptr, InvalidArgument, "the pipeline factory returned no pipeline for tensor " << info.tensor_id);
  const TensorInfo& got = p->codec().info();
  TERSE_CHECK(got.numel == info.numel && got.tensor_id == info.tensor_id && got.world_size == comm_.size() &&
                  got.rank == comm_.rank(),
              InvalidArgument,
              "the pipeline factory was asked for tensor id "
                  << info.tensor_id << " (" << info.numel << " elements, rank " << comm_.rank() << " of "
                  << comm_.size() << ") and returned one for tensor id " << got.tensor_id << " (" << got.numel
                  << " elements, rank " << got.rank << " of " << got.world_size << ")");
  return p;
}

CompressionPipeline& SyncTrainer::chunkPipeline(const Chunk& c) {
  const auto t = static_cast<std::size_t>(c.tensor_id);
  if (c.offset == 0 && c.numel == pipelines_[t]->codec().info().numel) return *pipelines_[t];
  auto& slot = chunk_pipelines_[{t, c.offset, c.numel}];
  if (!slot) {
    slot = makePipeline(chunkTensorInfo(workload_.params()[t], t, c.offset, c.numel, c.chunk_index, comm_.rank(),
                                        comm_.size(), workload_.device()));
  }
  return *slot;
}

void SyncTrainer::admit(const Ready& r) {
  const auto params = workload_.params();
  if (static_cast<int64_t>(r.step) != comm_step_) {
    // The previous step is complete here: its updates were all applied before this step's forward could pass the
    // gates (or, for a non-gating workload, before forwardBackward started), and that is the only way to get here.
    comm_step_ = static_cast<int64_t>(r.step);
    comm_lr_ = r.lr;
    admitted_ = 0;
    std::fill(started_.begin(), started_.end(), false);
    scheduler_->beginStep(r.step);
    std::lock_guard lock(mutex_);
    issue_order_.clear();
    groups_.clear();
  }
  if (sparse_[r.tensor]) {
    // The same admissions in the same order on every rank (the negotiation), so this collective lines up too.
    runSparse(r.tensor);
    if (++admitted_ == params.size()) scheduler_->markAllEnqueued();
    return;
  }
  const ParamTensor& p = params[r.tensor];
  std::vector<Chunk> chunks;
  {
    SchedTensor t;
    t.dtype = DType::kF32;
    t.tensor_id = r.tensor;
    t.numel = p.numel();
    t.step = r.step;
    t.layer_index = p.layer;
    t.num_layers = workload_.numLayers();
    chunks = scheduler_->partition(t);
    // Schedulers see compressed sizes: the compressor's two-phase sizing of each chunk's own pipeline.
    for (Chunk& c : chunks) c.wire_bytes = chunkPipeline(c).maxPayloadBytes();
    scheduler_->enqueue(chunks);
  }
  chunks_left_[r.tensor] = chunks.size();
  if (++admitted_ == params.size()) scheduler_->markAllEnqueued();
}

std::unique_ptr<SyncTrainer::GroupJob> SyncTrainer::prepareGroup(const std::vector<Chunk>& group,
                                                                 std::size_t in_flight) {
  const auto params = workload_.params();
  auto job = std::make_unique<GroupJob>();
  job->step = static_cast<uint64_t>(comm_step_);
  job->chunks = group;
  job->where = "a group of " + std::to_string(group.size()) + " chunks (first: tensor " +
               std::to_string(group.front().tensor_id) + " '" +
               params[static_cast<std::size_t>(group.front().tensor_id)].name + "')";
  IssuedGroup issued;
  issued.credit_left = scheduler_->creditLeft();
  issued.groups_in_flight = in_flight;
  issued.min_pending_layer = scheduler_->minPendingLayer();
  for (const Chunk& c : group) {
    const auto t = static_cast<std::size_t>(c.tensor_id);
    // A device workload's gradient is on the device, where its pipelines (on the communicator's stream) read it.
    float* grad = (device_ ? params[t].device_grad : params[t].grad.data()) + c.offset;
    CompressionPipeline& pipe = chunkPipeline(c);
    job->members.push_back(GroupMember{&pipe, grad, grad});
    issued.chunks.emplace_back(c.tensor_id, c.chunk_index);
    issued.wire_bytes += c.wire_bytes;
    if (!started_[t]) {
      started_[t] = true;
      if (!backward_done_.load(std::memory_order_acquire)) overlapped_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mutex_);
      issue_order_.push_back(t);
    }
  }
  job->wire_bytes = issued.wire_bytes;
  std::lock_guard lock(mutex_);
  groups_.push_back(std::move(issued));
  return job;
}

void SyncTrainer::executeGroup(GroupJob& job, AggregationEngine& engine, const comm::Communicator& timed, int tid) {
  // Codec and communicator time of this group: its pipelines and `timed` serve no other group meanwhile.
  double encode0 = 0, decode0 = 0;
  for (const GroupMember& m : job.members) {
    encode0 += m.pipeline->stats().encode_s;
    decode0 += m.pipeline->stats().decode_s;
  }
  const double comm0 = commSeconds(timed);
  GroupPhaseFn phase;
  std::string label;
  if (options_.trace) {
    for (const Chunk& c : job.chunks) {
      if (!label.empty()) label += ' ';
      label += 't' + std::to_string(c.tensor_id) + '.' + std::to_string(c.chunk_index);
    }
    phase = [&](const char* what, Clock::time_point a, Clock::time_point b, std::size_t, std::size_t) {
      options_.trace->span(tid, std::string(what) + ' ' + label, what, a, b);
    };
  }
  engine.run(job.step, job.members, phase);
  double encode1 = 0, decode1 = 0;
  for (const GroupMember& m : job.members) {
    encode1 += m.pipeline->stats().encode_s;
    decode1 += m.pipeline->stats().decode_s;
  }
  job.encode_s = encode1 - encode0;
  job.decode_s = decode1 - decode0;
  job.comm_s = commSeconds(timed) - comm0;
}

void SyncTrainer::finishGroup(const GroupJob& job) {
  const auto params = workload_.params();
  // Tensors whose last chunk just arrived: apply the optimizer now, so the next forward of their layer can start.
  std::vector<std::size_t> done;
  for (const Chunk& c : job.chunks) {
    const auto t = static_cast<std::size_t>(c.tensor_id);
    if (--chunks_left_[t] == 0) done.push_back(t);
  }
  if (options_.clip_grad_norm > 0) {
    // The norm is global: nothing is applied until the step's last tensor is in.
    clip_ready_.insert(clip_ready_.end(), done.begin(), done.end());
    done.clear();
    if (clip_ready_.size() == params.size()) {
      clipGradients();
      done.swap(clip_ready_);
    }
  }
  for (std::size_t t : done) {
    const auto u0 = rt::now();
    // FLOP model: SGD with momentum reads and writes each element a few times (rt::work).
    rt::work(kOptimizerFlopsPerElement * static_cast<double>(params[t].numel()));
    optimizer_.update(t, params[t], comm_lr_);
    if (options_.trace)
      options_.trace->span(TraceRecorder::kCommThread, "update " + params[t].name, "update", u0, rt::now());
  }
  // Device updates were only enqueued on the communicator's stream; a gate opened below lets the worker's forward (on
  // the workload's stream) read these values, so they must be complete first. One wait per group that finished a
  // tensor, and the wait is the update kernels' time, which the host would otherwise spend on the next group's launch.
  if (device_ && !done.empty()) cuda::synchronize(comm_.deviceStream());
  {
    std::lock_guard lock(mutex_);
    acc_encode_s_ += job.encode_s;
    acc_decode_s_ += job.decode_s;
    acc_comm_s_ += job.comm_s;
    markAppliedLocked(done);
  }
  if (!done.empty()) applied_cv_.notify_all();
}

void SyncTrainer::clipGradients() {
  const auto params = workload_.params();
  double sq = 0;
  for (const ParamTensor& p : params)
    for (float g : p.grad) sq += static_cast<double>(g) * static_cast<double>(g);
  // torch.nn.utils.clip_grad_norm_: the 1e-6 keeps a zero gradient finite; a scale >= 1 leaves the gradient alone.
  const double scale = options_.clip_grad_norm / (std::sqrt(sq) + 1e-6);
  if (scale >= 1) return;
  rt::work(static_cast<double>(workload_.numParameters()) * 3);  // FLOP model: square-add, then scale
  const auto f = static_cast<float>(scale);
  for (ParamTensor& p : params)
    for (float& g : p.grad) g *= f;
}

void SyncTrainer::accumulate(std::span<const std::size_t> tensors, float weight, bool first, bool last) {
  const auto params = workload_.params();
  for (std::size_t t : tensors) {
    std::vector<float>& g = params[t].grad;
    std::vector<float>& a = accumulated_[t];
    rt::work(2 * static_cast<double>(g.size()));
    for (std::size_t i = 0; i < g.size(); ++i) {
      a[i] = first ? weight * g[i] : a[i] + weight * g[i];
      if (last) g[i] = a[i];
    }
  }
}

void SyncTrainer::markAppliedLocked(const std::vector<std::size_t>& done) {
  for (std::size_t t : done) {
    applied_[t] = comm_step_;
    const int layer = workload_.params()[t].layer;
    int64_t m = std::numeric_limits<int64_t>::max();
    for (std::size_t u : workload_.layerTensors(layer)) m = std::min(m, applied_[u]);
    layer_applied_[static_cast<std::size_t>(layer)] = m;
  }
}

void SyncTrainer::runSparse(std::size_t t) {
  ParamTensor& p = workload_.params()[t];
  if (!started_[t]) {
    started_[t] = true;
    if (!backward_done_.load(std::memory_order_acquire)) overlapped_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    issue_order_.push_back(t);
  }
  const double comm0 = commSeconds(comm_);
  const auto c0 = rt::now();
  const RowSparseResult result = sparse_[t]->run(p.grad.data(), p.grad_rows, union_rows_);
  sparse_payload_bytes_ += result.payload_bytes;
  const double comm1 = commSeconds(comm_);
  if (options_.trace)
    options_.trace->span(TraceRecorder::kCommThread, (result.sparse ? "sparse rows " : "dense ") + p.name, "comm", c0,
                         rt::now());
  const auto u0 = rt::now();
  if (optimizer_.lazyRowsExact()) {
    rt::work(kOptimizerFlopsPerElement * static_cast<double>(union_rows_.size() * p.rowLength()));
    optimizer_.updateRows(t, p, comm_lr_, union_rows_);
  } else {
    rt::work(kOptimizerFlopsPerElement * static_cast<double>(p.numel()));
    optimizer_.update(t, p, comm_lr_);
  }
  if (options_.trace) options_.trace->span(TraceRecorder::kCommThread, "update " + p.name, "update", u0, rt::now());
  {
    std::lock_guard lock(mutex_);
    acc_comm_s_ += comm1 - comm0;
    markAppliedLocked({t});
  }
  applied_cv_.notify_all();
}

void SyncTrainer::fail(std::exception_ptr failure, const std::string& where, int64_t step) {
  std::string what = "unknown error";
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  {
    // Recorded before the abort: the abort fails the other lanes' collectives, whose errors must not win.
    std::lock_guard lock(mutex_);
    if (!error_) error_ = failure;
  }
  failComm(where + " failed at step " + std::to_string(step) + ": " + what);
  applied_cv_.notify_all();
  work_cv_.notify_all();
  lane_cv_.notify_all();
}

void SyncTrainer::laneLoop(std::size_t k) {
  Lane& lane = lanes_[k];
  for (;;) {
    std::unique_ptr<GroupJob> job;
    {
      std::unique_lock lock(mutex_);
      lane_cv_.wait(lock, [&] { return lanes_stop_ || !lane_queue_.empty(); });
      if (lane_queue_.empty()) return;
      job = std::move(lane_queue_.front());
      lane_queue_.pop_front();
      if (error_) continue;  // the job's peers fail through the abort anyway
    }
    try {
      lane.channel->select(job->seq);
      executeGroup(*job, *lane.engine, *lane.channel, TraceRecorder::kCommThread + static_cast<int>(k));
      {
        std::lock_guard lock(mutex_);
        lane_done_.push_back(std::move(job));
      }
      work_cv_.notify_all();
    } catch (...) {
      fail(std::current_exception(), job->where, static_cast<int64_t>(job->step));
    }
  }
}

void SyncTrainer::commLoop() {
  // Ready tensors received from the worker but not yet admitted to the scheduler, in ready order.
  std::deque<Ready> received;
  uint64_t received_total = 0;  // tensors received over the whole run: the same sequence on every rank
  uint64_t admitted_total = 0;  // of those, admitted to the scheduler (agreed by every rank)
  bool round = false;           // one group at a time: a round is owed to the peers after every group
  std::vector<uint64_t> counts(static_cast<std::size_t>(comm_.size()));
  // Lanes: the groups handed out whose completion the scheduler has not been told of, in issue order, with whether
  // they finished here; finished jobs come back through lane_done_.
  struct Flying {
    std::vector<uint64_t> ids;
    uint64_t wire_bytes = 0;
    bool finished = false;
  };
  std::deque<Flying> flying;
  uint64_t flying_base = 0;  // run-wide number of flying.front()
  const std::size_t max_flying = lanes_.empty() ? 1 : lanes_.size();
  std::vector<std::unique_ptr<GroupJob>> finished;
  bool failed = false;
  // Groups finished here, from the oldest on, that the scheduler was not told of.
  const auto finishedPrefix = [&] {
    std::size_t n = 0;
    while (n < flying.size() && flying[n].finished) ++n;
    return n;
  };
  // Whether a round could change anything: a completion to agree on (every rank finishes it), or tensors to admit
  // while a lane and credit are free to hand something out. The state it reads is agreed, so every rank that has the
  // same news comes to the same answer, and a rank without it yet gets it (its worker or its lanes catch up).
  const auto owed = [&] {
    const bool can_hand_out = flying.size() < max_flying && (flying.empty() || scheduler_->creditLeft() > 0);
    return !failed && (round || finishedPrefix() > 0 || (received_total > admitted_total && can_hand_out));
  };
  for (;;) {
    const bool owe = owed();
    {
      std::unique_lock lock(mutex_);
      const auto quit = [&] { return stop_ && (error_ || (!owe && flying.empty())); };
      work_cv_.wait(lock, [&] { return quit() || !inbox_.empty() || !lane_done_.empty() || (owe && !error_); });
      // A round owed to the peers (they run it too) is finished even when stopping, and so are the groups in flight:
      // skipping them would leave the peers waiting.
      if (quit()) return;
      if (error_) {
        // After a failure nothing more runs: the other ranks' collectives fail through the abort anyway.
        inbox_.clear();
        lane_done_.clear();
        round = false;
        failed = true;
        if (stop_) return;
        continue;
      }
      for (const Ready& r : inbox_) received.push_back(r);
      received_total += inbox_.size();
      inbox_.clear();
      for (auto& job : lane_done_) finished.push_back(std::move(job));
      lane_done_.clear();
    }
    std::string where = "scheduling";
    try {
      for (const auto& job : finished) {
        where = job->where;
        finishGroup(*job);
        flying[job->seq - flying_base].finished = true;
      }
      finished.clear();
      where = "scheduling";
      if (!owed()) continue;
      const std::size_t prefix = finishedPrefix();
      // Negotiation (Horovod's coordinator cycle, Sergeev and Del Balso 2018): a scheduler's answer depends on what
      // was enqueued and completed before it was asked, and backward and the collectives run at a different pace on
      // every rank, so every rank first learns how many tensors ALL ranks have ready (and, with lanes, how many groups
      // ALL have finished) -- one 8-byte allgather, in ceil(log2 n) rounds -- and tells its scheduler only that many.
      // Every rank then asks its scheduler with the same enqueues and completions behind it and gets the same group:
      // the same collectives in the same order. Ready order itself is the same everywhere (backward's order).
      uint64_t agreed = received_total;
      std::size_t agreed_done = prefix;
      if (comm_.size() > 1) {
        where = "negotiation";
        const auto n0 = rt::now();
        const double c0 = commSeconds(comm_);
        const uint64_t news = received_total - admitted_total;
        TERSE_CHECK(lanes_.empty() || news < (uint64_t{1} << 32), InternalError,
                    "negotiation: " << news << " tensors received and not admitted do not fit its word");
        const uint64_t word = lanes_.empty() ? received_total : news << 32 | prefix;
        const comm::WireBytes sent = comm_.allgatherControl(word, counts, kNegotiationTensor);
        {
          // Control traffic, but communication time all the same: it counts in comm_s. Rounds and bytes are counted
          // together, once a round is complete, so the pair read by negotiation() always agrees.
          std::lock_guard lock(mutex_);
          acc_comm_s_ += commSeconds(comm_) - c0;
          ++acc_negotiations_;
          acc_negotiation_bytes_ += sent.sent_bytes;
        }
        if (lanes_.empty()) {
          agreed = *std::min_element(counts.begin(), counts.end());
        } else {
          uint64_t min_news = news, min_done = prefix;
          for (uint64_t c : counts) {
            min_news = std::min(min_news, c >> 32);
            min_done = std::min<uint64_t>(min_done, c & 0xffffffffu);
          }
          agreed = admitted_total + min_news;
          agreed_done = static_cast<std::size_t>(min_done);
        }
        const auto n1 = rt::now();
        if (options_.trace && n1 - n0 > std::chrono::microseconds(200))
          options_.trace->span(TraceRecorder::kCommThread, "negotiate", "negotiate", n0, n1);
        where = "scheduling";
      }
      // Completions first, in issue order: the scheduler hears of them as the one-at-a-time path tells it, before the
      // tensors that became ready meanwhile.
      for (std::size_t i = 0; i < agreed_done; ++i) {
        scheduler_->onComplete(flying.front().ids, flying.front().wire_bytes);
        flying.pop_front();
        ++flying_base;
      }
      for (; admitted_total < agreed; ++admitted_total) {
        admit(received.front());
        received.pop_front();
      }
      if (lanes_.empty()) {
        const std::vector<Chunk> group = scheduler_->next();
        if (!group.empty()) {
          auto job = prepareGroup(group, 0);
          where = job->where;
          executeGroup(*job, engine_, comm_, TraceRecorder::kCommThread);
          ids_.clear();
          for (const Chunk& c : group) ids_.push_back(c.chunk_id);
          scheduler_->onComplete(ids_, job->wire_bytes);
          finishGroup(*job);
        }
        // Symmetric on every rank: after a group everyone negotiates again at once; otherwise a rank that holds
        // tensors the others have not agreed to yet goes again (blocking until they join), and the others wait for
        // their worker.
        round = !group.empty();
      } else {
        while (flying.size() < max_flying) {
          const std::vector<Chunk> group = scheduler_->next();
          if (group.empty()) break;
          auto job = prepareGroup(group, flying.size());
          job->seq = group_seq_++;
          Flying f;
          for (const Chunk& c : group) f.ids.push_back(c.chunk_id);
          f.wire_bytes = job->wire_bytes;
          flying.push_back(std::move(f));
          {
            std::lock_guard lock(mutex_);
            lane_queue_.push_back(std::move(job));
          }
          lane_cv_.notify_one();
        }
      }
    } catch (...) {
      fail(std::current_exception(), where, comm_step_);
      failed = true;
      round = false;
    }
  }
}

double SyncTrainer::waitApplied(std::unique_lock<rt::Mutex>& lock, int64_t upto) {
  const auto t0 = rt::now();
  applied_cv_.wait(lock, [&] {
    if (error_) return true;
    for (int64_t a : layer_applied_)
      if (a < upto) return false;
    return true;
  });
  return seconds(t0, rt::now());
}

void SyncTrainer::chargeForwardUpTo(int layer) {
  if (!in_step_) return;
  for (; forward_charged_ < layer; ++forward_charged_)
    rt::work(layer_flops_[static_cast<std::size_t>(forward_charged_)].forward * batch_examples_);
}

void SyncTrainer::gate(int layer) {
  chargeForwardUpTo(layer);
  std::unique_lock lock(mutex_);
  TERSE_CHECK(layer >= 0 && static_cast<std::size_t>(layer) < layer_applied_.size(), InvalidArgument,
              "workload '" << workload_.name() << "' awaited layer " << layer << " of " << layer_applied_.size());
  const auto t0 = rt::now();
  applied_cv_.wait(lock, [&] { return error_ || layer_applied_[static_cast<std::size_t>(layer)] >= handed_step_; });
  if (error_) std::rethrow_exception(error_);
  const auto t1 = rt::now();
  gate_wait_s_ += seconds(t0, t1);
  lock.unlock();
  if (options_.trace) {
    const auto now = rt::now();
    if (t1 - t0 > std::chrono::microseconds(1))
      options_.trace->span(TraceRecorder::kComputeThread, "wait " + layerName(layer), "wait", t0, t1);
    // The compute between two gates is the forward of the previous gated layer.
    if (gate_layer_ >= 0)
      options_.trace->span(TraceRecorder::kComputeThread, "forward " + layerName(gate_layer_), "compute", gate_mark_,
                           t0);
    gate_layer_ = layer;
    gate_mark_ = now;
  }
}

void SyncTrainer::drain() {
  std::unique_lock lock(mutex_);
  if (drained_step_ >= handed_step_ && !error_) return;
  const double waited = waitApplied(lock, handed_step_);
  if (error_) std::rethrow_exception(error_);
  drained_step_ = handed_step_;
  totals_.times.exposed_comm_s += waited;
  totals_.times.step_s += waited;
}

StepRecord SyncTrainer::step() {
  TERSE_CHECK(!finished(), InvalidArgument, "training finished after " << totalSteps() << " steps");
  StepRecord rec;
  rec.step = next_step_;
  rec.epoch = next_step_ / steps_per_epoch_;
  rec.step_in_epoch = next_step_ % steps_per_epoch_;
  if (rec.step_in_epoch == 0)
    epoch_batches_ = sampler_.epochBatches(rec.epoch, options_.batch_size, options_.drop_last);
  // This step's micro-batches: accumulation_steps consecutive batches, fewer at the end of an epoch.
  const auto first_batch = static_cast<std::size_t>(rec.step_in_epoch * options_.accumulation_steps);
  const std::size_t micro =
      std::min(static_cast<std::size_t>(options_.accumulation_steps), epoch_batches_.size() - first_batch);
  std::size_t examples = 0;
  for (std::size_t m = 0; m < micro; ++m) examples += epoch_batches_[first_batch + m].size();
  rec.lr = learningRate(lr_, rec.step);

  const auto t0 = rt::now();
  double full_wait = 0;
  double comm_before = 0, encode_before = 0, decode_before = 0;
  {
    std::unique_lock lock(mutex_);
    // The communication thread may have failed after the previous step returned (step() does not wait for the
    // step's communication): report that first failure, not a misuse of the API.
    if (error_) std::rethrow_exception(error_);
    // A workload that does not gate its forward per layer reads every layer: every update must be in first.
    if (!workload_.gatesLayers()) full_wait = waitApplied(lock, handed_step_);
    if (error_) std::rethrow_exception(error_);
    comm_before = acc_comm_s_;
    encode_before = acc_encode_s_;
    decode_before = acc_decode_s_;
  }
  backward_done_.store(false, std::memory_order_release);
  overlapped_.store(0, std::memory_order_relaxed);
  gate_wait_s_ = 0;
  gate_layer_ = -1;

  const auto t1 = rt::now();
  stragglerSleep(options_.slowdown, last_raw_compute_s_);
  const auto t1_work = rt::now();
  std::exception_ptr compute_error;
  Clock::time_point last_mark = t1;
  try {
    const int64_t step_index = rec.step;
    const double lr = rec.lr;
    in_step_ = true;
    for (std::size_t m = 0; m < micro; ++m) {
      const std::vector<int64_t>& batch = epoch_batches_[first_batch + m];
      // The mean loss over all the step's examples is the micro-batches' means weighted by their lengths; so is its
      // gradient.
      const double weight = micro == 1 ? 1.0 : static_cast<double>(batch.size()) / static_cast<double>(examples);
      const bool last = m + 1 == micro;
      forward_charged_ = 0;
      batch_examples_ = static_cast<double>(batch.size());
      rec.loss += weight * workload_.forwardBackward(batch, [&](int layer, std::span<const std::size_t> tensors) {
        chargeForwardUpTo(workload_.numLayers());
        rt::work(layer_flops_[static_cast<std::size_t>(layer)].backward * batch_examples_);
        if (micro > 1) accumulate(tensors, static_cast<float>(weight), m == 0, last);
        if (!last) return;
        if (options_.trace) {
          const auto now = rt::now();
          if (gate_layer_ >= 0) {
            // From the last gate to the first report: the last layer's forward, the loss and its backward.
            options_.trace->span(TraceRecorder::kComputeThread, "forward+backward " + layerName(gate_layer_), "compute",
                                 gate_mark_, now);
            gate_layer_ = -1;
          } else {
            options_.trace->span(TraceRecorder::kComputeThread, "backward " + layerName(layer), "compute", last_mark,
                                 now);
          }
          last_mark = now;
        }
        enqueue(step_index, tensors, lr);
      });
    }
  } catch (...) {
    compute_error = std::current_exception();
  }
  in_step_ = false;
  backward_done_.store(true, std::memory_order_release);
  const auto t2 = rt::now();
  {
    std::unique_lock lock(mutex_);
    if (compute_error && !error_) {
      // Tensors already handed over may be mid-collective; the peers would wait for the rest forever.
      error_ = compute_error;
      lock.unlock();
      failComm("forwardBackward failed at step " + std::to_string(rec.step));
      applied_cv_.notify_all();
      std::rethrow_exception(compute_error);
    }
    if (error_) std::rethrow_exception(error_);
    handed_step_ = rec.step;
  }
  ++next_step_;
  // The last step has no next forward to overlap with: wait for its updates so the replica is final.
  double drain_wait = 0;
  if (finished()) {
    std::unique_lock lock(mutex_);
    drain_wait = waitApplied(lock, handed_step_);
    if (error_) std::rethrow_exception(error_);
    drained_step_ = handed_step_;
  }
  const auto t3 = rt::now();
  {
    std::lock_guard lock(mutex_);
    rec.times.comm_s = acc_comm_s_ - comm_before;
    rec.times.compress_s = acc_encode_s_ - encode_before;
    rec.times.decompress_s = acc_decode_s_ - decode_before;
    totals_.negotiation_rounds = acc_negotiations_;
  }
  if (options_.trace && full_wait > 0) options_.trace->span(TraceRecorder::kComputeThread, "wait all", "wait", t0, t1);
  if (options_.trace && drain_wait > 0) options_.trace->span(TraceRecorder::kComputeThread, "drain", "wait", t2, t3);

  if (options_.trace)
    options_.trace->span(TraceRecorder::kComputeThread, "step " + std::to_string(rec.step), "step", t0, t3);

  rec.overlapped_tensors = overlapped_.load(std::memory_order_relaxed);
  rec.gate_wait_s = gate_wait_s_;
  rec.times.compute_s = seconds(t1, t2) - gate_wait_s_;
  last_raw_compute_s_ = seconds(t1_work, t2) - gate_wait_s_;
  rec.times.exposed_comm_s = full_wait + gate_wait_s_ + drain_wait;
  rec.times.step_s = seconds(t0, t3);

  ++totals_.steps;
  totals_.loss_sum += rec.loss;
  totals_.times.compute_s += rec.times.compute_s;
  totals_.times.compress_s += rec.times.compress_s;
  totals_.times.decompress_s += rec.times.decompress_s;
  totals_.times.comm_s += rec.times.comm_s;
  totals_.times.exposed_comm_s += rec.times.exposed_comm_s;
  totals_.times.step_s += rec.times.step_s;
  return rec;
}

}  // namespace terse::train

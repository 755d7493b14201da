// The group scheduler (group_scheduler.h): the communication thread that admits ready gradients, asks the scheduler for
// groups and negotiates them across ranks, the lanes that run several groups in flight, and the waits the worker's
// gates and drains do on the updates.
#include "core/train/group_scheduler.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/train/trace_group.h"

namespace terse::train {
namespace {

using Clock = rt::Clock;

double commSecondsOf(const comm::Communicator& comm) {
  double s = 0;
  for (const auto& k : comm.stats().by_kind) s += k.seconds;
  return s;
}

}  // namespace

GroupScheduler::GroupScheduler(Workload& workload, comm::Communicator& comm, PipelineFactory pipelines,
                               std::unique_ptr<Scheduler> scheduler, const GroupSchedulerOptions& options,
                               GradientSink& sink)
    : workload_(workload),
      comm_(comm),
      sink_(sink),
      options_(options),
      device_(workload.device() >= 0),
      scheduler_(std::move(scheduler)),
      pipelines_(workload, comm, std::move(pipelines)),
      sparse_(workload.params(), comm, options.sparse_rows, device_),
      engine_(comm),
      lanes_(comm, options.max_groups_in_flight),
      books_(workload.params().size()),
      gates_(workload) {
  TERSE_CHECK(scheduler_ != nullptr, InvalidArgument,
              "the trainer needs a scheduler (fifo, the default, sends whole tensors in ready order)");
  TERSE_CHECK(options.max_groups_in_flight >= 1, InvalidArgument,
              "max_groups_in_flight must be >= 1, got " << options.max_groups_in_flight);
  TERSE_CHECK(options.compression_start_step >= 0, InvalidArgument,
              "compression_start_step must be >= 0, got " << options.compression_start_step);
  if (options.compression_start_step > 0) {
    TERSE_CHECK(
        options.dense != nullptr, InvalidArgument,
        "compression_start_step " << options.compression_start_step << " needs the dense warm-up's pipeline factory");
    dense_.emplace(workload, comm, options.dense);
  }
}

void GroupScheduler::start() {
  lanes_.start([this](std::unique_ptr<GroupJob> job, Lane& lane, std::size_t k) { runOnLane(std::move(job), lane, k); },
               comm_.rank());
  comm_thread_ = rt::Thread(
      "comm " + std::to_string(comm_.rank()),
      [this] {
        if (device_) {
          // CUDA's current device is per host thread: this thread launches the pipelines' kernels and allocates the
          // chunk pipelines' buffers, which must land on the workload's device, not on device 0.
          try {
            cuda::setDevice(workload_.device());
          } catch (const std::exception& x) {
            gates_.record(std::current_exception());
            abortComm(x.what());
            gates_.wake();
            return;
          }
        }
        commLoop();
      },
      comm_.rank());
}

GroupScheduler::~GroupScheduler() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  comm_thread_.join();
  lanes_.stop();  // before the members its jobs use go
}

// ---- The worker's side.

void GroupScheduler::feed(int64_t step, std::span<const std::size_t> tensors, double lr) {
  {
    std::lock_guard lock(mutex_);
    for (std::size_t t : tensors) ready_.push_back(Ready{static_cast<uint64_t>(step), t, lr});
  }
  work_cv_.notify_one();
}

double GroupScheduler::awaitApplied(int64_t step) {
  return gates_.awaitStep(step);
}

std::pair<rt::Clock::time_point, rt::Clock::time_point> GroupScheduler::awaitLayer(int layer, int64_t step) {
  return gates_.awaitLayer(layer, step);
}

void GroupScheduler::abortComm(const std::string& reason) {
  // Every rank's pending and later collectives fail at once instead of waiting for this rank.
  comm_.abort("rank " + std::to_string(comm_.rank()) + ": " + reason);
}

void GroupScheduler::failFrom(std::exception_ptr failure, const std::string& reason) {
  // Tensors already handed over may be mid-collective; the peers would wait for the rest forever.
  if (!gates_.record(std::move(failure))) return;
  abortComm(reason);
  gates_.wake();
}

bool GroupScheduler::failed() const {
  return gates_.failed();
}

void GroupScheduler::throwIfFailed() const {
  gates_.throwIfFailed();
}

void GroupScheduler::backwardStarts() {
  backward_done_.store(false, std::memory_order_release);
  overlapped_.store(0, std::memory_order_relaxed);
}

void GroupScheduler::backwardEnds() {
  backward_done_.store(true, std::memory_order_release);
}

CommCounters GroupScheduler::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

uint64_t GroupScheduler::payloadBytes() const {
  return pipelines_.payloadBytes() + (dense_ ? dense_->payloadBytes() : dense_payload_bytes_) + sparse_.payloadBytes();
}

bool GroupScheduler::anyRowSparse() const {
  return sparse_.any();
}

// ---- The communication thread and its lanes.

void GroupScheduler::markStarted(std::size_t t) {
  if (books_.start(t) && !backward_done_.load(std::memory_order_acquire))
    overlapped_.fetch_add(1, std::memory_order_relaxed);
}

void GroupScheduler::fail(std::exception_ptr failure, const std::string& where, int64_t step) {
  std::string what = "unknown error";
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  // Recorded before the abort: the abort fails the other lanes' collectives, whose errors must not win.
  gates_.record(failure);
  abortComm(where + " failed at step " + std::to_string(step) + ": " + what);
  gates_.wake();
  // The communication thread checks failed() under mutex_: taking it here orders this wake-up after any check that
  // came before the failure was recorded, so none is lost.
  { std::lock_guard lock(mutex_); }
  work_cv_.notify_all();
}

void GroupScheduler::admit(const Ready& r) {
  const auto params = workload_.params();
  // A new step: the previous one is complete here. Its updates were all applied before this step's forward could pass
  // the gates (or, for a non-gating workload, before forwardBackward started), and that is the only way to get here.
  if (books_.begin(static_cast<int64_t>(r.step), r.lr)) {
    scheduler_->beginStep(r.step);
    // The step before is applied, so nothing of the warm-up is in flight once the compressor's steps begin.
    if (dense_ && static_cast<int64_t>(r.step) >= options_.compression_start_step) {
      dense_payload_bytes_ = dense_->payloadBytes();
      dense_.reset();
    }
  }
  if (sparse_.handles(r.tensor)) {
    // The same admissions in the same order on every rank (the negotiation), so this collective lines up too.
    runSparse(r.tensor);
    if (books_.admitted()) scheduler_->markAllEnqueued();
    return;
  }
  const ParamTensor& p = params[r.tensor];
  SchedTensor t;
  t.dtype = DType::kF32;
  t.tensor_id = r.tensor;
  t.numel = p.numel();
  t.step = r.step;
  t.layer_index = p.layer;
  t.num_layers = workload_.numLayers();
  if (p.shape.size() >= 2 && p.shape.front() > 0) t.row_numel = p.rowLength();
  std::vector<Chunk> chunks = scheduler_->partition(t);
  // Schedulers see compressed sizes: the compressor's two-phase sizing of each chunk's own pipeline.
  for (Chunk& c : chunks) c.wire_bytes = pipelinesAt(static_cast<int64_t>(r.step)).chunk(c).maxPayloadBytes();
  scheduler_->enqueue(chunks);
  books_.expect(r.tensor, chunks.size());
  if (books_.admitted()) scheduler_->markAllEnqueued();
}

std::unique_ptr<GroupScheduler::GroupJob> GroupScheduler::prepareGroup(const std::vector<Chunk>& group,
                                                                       std::size_t in_flight) {
  const auto params = workload_.params();
  auto job = std::make_unique<GroupJob>();
  job->step = static_cast<uint64_t>(books_.step());
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
    CompressionPipeline& pipe = pipelinesAt(books_.step()).chunk(c);
    job->members.push_back(GroupMember{&pipe, grad, grad});
    issued.chunks.emplace_back(c.tensor_id, c.chunk_index);
    issued.wire_bytes += c.wire_bytes;
    markStarted(t);
  }
  job->wire_bytes = issued.wire_bytes;
  job->trace_seq = trace_seq_++;
  if (options_.step_trace) job->issued = rt::now();
  books_.issued(std::move(issued));
  return job;
}

void GroupScheduler::executeGroup(GroupJob& job, AggregationEngine& engine, const comm::Communicator& timed, int tid) {
  // Codec and communicator time of this group: its pipelines and `timed` serve no other group meanwhile.
  double encode0 = 0, decode0 = 0;
  for (const GroupMember& m : job.members) {
    encode0 += m.pipeline->stats().encode_s;
    decode0 += m.pipeline->stats().decode_s;
  }
  const double comm0 = commSecondsOf(timed);
  GroupPhaseFn phase;
  std::string label;
  if (options_.trace) {
    for (const Chunk& c : job.chunks) {
      if (!label.empty()) label += ' ';
      label += 't' + std::to_string(c.tensor_id) + '.' + std::to_string(c.chunk_index);
    }
  }
  // Step trace: the group's phases in order, one per collective (a size exchange and its gather are two).
  TracedGroupPhases traced;
  if (options_.trace || options_.step_trace) {
    phase = [&](const char* what, Clock::time_point a, Clock::time_point b, std::size_t, std::size_t,
                std::span<const PhaseCollective> collectives) {
      if (options_.trace) options_.trace->span(tid, std::string(what) + ' ' + label, what, a, b);
      if (options_.step_trace) traced.add(what, a, b, collectives);
    };
  }
  engine.run(job.step, job.members, phase);
  if (options_.step_trace) {
    traced.group.seq = job.trace_seq;
    for (const Chunk& c : job.chunks) {
      traced.group.chunks.emplace_back(c.tensor_id, c.chunk_index);
      traced.group.chunk_elements.push_back(c.numel);
    }
    options_.step_trace->group(static_cast<int64_t>(job.step), std::move(traced.group), job.issued, traced.spans);
  }
  double encode1 = 0, decode1 = 0;
  for (const GroupMember& m : job.members) {
    encode1 += m.pipeline->stats().encode_s;
    decode1 += m.pipeline->stats().decode_s;
  }
  job.encode_s = encode1 - encode0;
  job.decode_s = decode1 - decode0;
  job.comm_s = commSecondsOf(timed) - comm0;
}

void GroupScheduler::finishGroup(const GroupJob& job) {
  // Tensors whose last chunk just arrived go to the sink now, so the next forward of their layer can start.
  std::vector<std::size_t> done = books_.finish(job.chunks);
  if (!done.empty()) done = sink_.aggregated(books_.step(), books_.lr(), std::move(done));
  {
    std::lock_guard lock(mutex_);
    counters_.encode_s += job.encode_s;
    counters_.decode_s += job.decode_s;
    counters_.comm_s += job.comm_s;
  }
  // After the counters: a worker that finds its updates in reads the counters that include them.
  gates_.markApplied(books_.step(), done);
}

void GroupScheduler::runSparse(std::size_t t) {
  ParamTensor& p = workload_.params()[t];
  markStarted(t);
  const double comm0 = commSecondsOf(comm_);
  const auto c0 = rt::now();
  const uint64_t seq = trace_seq_++;
  const RowSparseResult result = sparse_.run(t, p, options_.step_trace != nullptr);
  const double comm1 = commSecondsOf(comm_);
  const auto c1 = rt::now();
  if (options_.trace)
    options_.trace->span(TraceRecorder::kCommThread, (result.sparse ? "sparse rows " : "dense ") + p.name, "comm", c0,
                         c1);
  if (options_.step_trace) {
    std::vector<StepTraceRecorder::Span> spans;
    options_.step_trace->group(books_.step(), sparse_.traceGroup(t, p.numel(), seq, result, c0, c1, spans), c0, spans);
  }
  sink_.aggregatedRows(books_.step(), books_.lr(), t, sparse_.rows());
  {
    std::lock_guard lock(mutex_);
    counters_.comm_s += comm1 - comm0;
  }
  const std::size_t done[] = {t};
  gates_.markApplied(books_.step(), done);
}

void GroupScheduler::runOnLane(std::unique_ptr<GroupJob> job, Lane& lane, std::size_t k) {
  if (failed()) return;  // the job's peers fail through the abort anyway
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

// Negotiation (Horovod's coordinator cycle, Sergeev and Del Balso 2018): a scheduler's answer depends on what was
// enqueued and completed before it was asked, and backward and the collectives run at a different pace on every rank,
// so every rank first learns how many tensors ALL ranks have ready (and, with lanes, how many groups ALL have
// finished) -- one 8-byte allgather, in ceil(log2 n) rounds -- and tells its scheduler only that many. Every rank then
// asks its scheduler with the same enqueues and completions behind it and gets the same group: the same collectives in
// the same order. Ready order itself is the same everywhere (backward's order).
std::pair<uint64_t, std::size_t> GroupScheduler::negotiate(uint64_t received_total, uint64_t admitted_total,
                                                           std::size_t finished, int64_t received_step,
                                                           std::vector<uint64_t>& counts) {
  const auto n0 = rt::now();
  const double c0 = commSecondsOf(comm_);
  const uint64_t news = received_total - admitted_total;
  TERSE_CHECK(lanes_.empty() || news < (uint64_t{1} << 32), InternalError,
              "negotiation: " << news << " tensors received and not admitted do not fit its word");
  const uint64_t word = lanes_.empty() ? received_total : news << 32 | finished;
  const comm::WireBytes sent = comm_.allgatherControl(word, counts, kNegotiationTensor);
  {
    // Control traffic, but communication time all the same: it counts in comm_s. Rounds and bytes are counted
    // together, once a round is complete, so the pair read by negotiation() always agrees.
    std::lock_guard lock(mutex_);
    counters_.comm_s += commSecondsOf(comm_) - c0;
    ++counters_.negotiation.rounds;
    counters_.negotiation.bytes += sent.sent_bytes;
  }
  std::pair<uint64_t, std::size_t> agreed;
  if (lanes_.empty()) {
    agreed = {*std::min_element(counts.begin(), counts.end()), finished};
  } else {
    uint64_t min_news = news, min_done = finished;
    for (uint64_t c : counts) {
      min_news = std::min(min_news, c >> 32);
      min_done = std::min<uint64_t>(min_done, c & 0xffffffffu);
    }
    agreed = {admitted_total + min_news, static_cast<std::size_t>(min_done)};
  }
  const auto n1 = rt::now();
  if (options_.trace && n1 - n0 > std::chrono::microseconds(200))
    options_.trace->span(TraceRecorder::kCommThread, "negotiate", "negotiate", n0, n1);
  // Filed under the step of the tensors it agrees on (admit() moves the books on only after the round).
  if (options_.step_trace && received_step >= 0)
    options_.step_trace->negotiation(received_step, {n0, n1}, std::string(comm_.controlAlgorithmRun()));
  return agreed;
}

void GroupScheduler::commLoop() {
  // Tensors received from the worker over the whole run (the same sequence on every rank) and, of those, admitted to
  // the scheduler (agreed by every rank): ready_ holds the difference, oldest first.
  uint64_t received_total = 0;
  uint64_t admitted_total = 0;
  int64_t received_step = -1;  // the step of the last tensor received: the step trace files a round under it
  bool round = false;          // one group at a time: a round is owed to the peers after every group
  std::vector<uint64_t> counts(static_cast<std::size_t>(comm_.size()));
  std::vector<Ready> admitting;
  std::vector<uint64_t> ids;
  // Lanes: the groups handed out whose completion the scheduler has not been told of, in issue order, with whether
  // they finished here. This is the scheduler's book of its credit, not a hand-over: the jobs travel through the lanes'
  // queue and lane_done_.
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
      const auto quit = [&] { return stop_ && (gates_.failed() || (!owe && flying.empty())); };
      // ready_ holds every tensor received and not admitted; news is what came after the last wake-up.
      const auto news = [&] { return admitted_total + ready_.size() > received_total; };
      work_cv_.wait(lock, [&] { return quit() || news() || !lane_done_.empty() || (owe && !gates_.failed()); });
      // A round owed to the peers (they run it too) is finished even when stopping, and so are the groups in flight:
      // skipping them would leave the peers waiting.
      if (quit()) return;
      if (gates_.failed()) {
        // After a failure nothing more runs: the other ranks' collectives fail through the abort anyway.
        ready_.clear();
        lane_done_.clear();
        round = false;
        failed = true;
        if (stop_) return;
        continue;
      }
      if (news()) {
        received_step = static_cast<int64_t>(ready_.back().step);
        received_total = admitted_total + ready_.size();
      }
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
      uint64_t agreed = received_total;
      std::size_t agreed_done = prefix;
      if (comm_.size() > 1) {
        where = "negotiation";
        std::tie(agreed, agreed_done) = negotiate(received_total, admitted_total, prefix, received_step, counts);
        where = "scheduling";
      }
      // Completions first, in issue order: the scheduler hears of them as the one-at-a-time path tells it, before the
      // tensors that became ready meanwhile.
      for (std::size_t i = 0; i < agreed_done; ++i) {
        scheduler_->onComplete(flying.front().ids, flying.front().wire_bytes);
        flying.pop_front();
        ++flying_base;
      }
      if (agreed > admitted_total) {
        // The agreed tensors leave ready_ (the worker only appends behind them) before the scheduler sees them.
        admitting.clear();
        {
          std::lock_guard lock(mutex_);
          for (; admitted_total < agreed; ++admitted_total) {
            admitting.push_back(ready_.front());
            ready_.pop_front();
          }
        }
        for (const Ready& r : admitting) admit(r);
      }
      if (lanes_.empty()) {
        const std::vector<Chunk> group = scheduler_->next();
        if (!group.empty()) {
          auto job = prepareGroup(group, 0);
          where = job->where;
          executeGroup(*job, engine_, comm_, TraceRecorder::kCommThread);
          ids.clear();
          for (const Chunk& c : group) ids.push_back(c.chunk_id);
          scheduler_->onComplete(ids, job->wire_bytes);
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
          lanes_.submit(std::move(job));
        }
      }
    } catch (...) {
      fail(std::current_exception(), where, books_.step());
      failed = true;
      round = false;
    }
  }
}

}  // namespace terse::train

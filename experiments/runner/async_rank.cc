#include "experiments/runner/async_rank.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <sstream>

#include "core/common/error.h"
#include "core/train/async_trainer.h"
#include "core/train/label_partition.h"
#include "core/train/param_server_client.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/runner_detail.h"

namespace terse::runner::detail {
namespace {

constexpr comm::Tag kWorkerReportTag = 0x4152'5057;  // "ARPW"
constexpr comm::Tag kShardReportTag = 0x4152'5053;   // "ARPS"
constexpr comm::Tag kReleaseTag = 0x4152'5052;       // "ARPR": rank 0 wrote the last record, everyone may leave
constexpr std::size_t kWorkerReportMax = 512;
constexpr std::size_t kShardReportSlack = 1 << 20;  // staleness map and fields beyond the parameters

uint64_t dataBytes(const comm::RankTraffic& t, bool sent) {
  const auto& d = sent ? t.sent : t.received;
  return d.total().bytes - d.kind(comm::OpKind::kControl).bytes;
}

// Waits for rank 0's release (the end of the variant). A barrier would not do: a lost worker cannot join one.
void awaitRelease(comm::Transport& ctl) {
  std::byte none{};
  ctl.recv(0, comm::FrameMeta{comm::OpKind::kP2P, kReleaseTag, comm::kNoTensor}, std::span<std::byte>(&none, 0));
}

ShardReport shardReport(int64_t step, std::span<const float> params, const train::ServerStats& st,
                        Clock::time_point start) {
  ShardReport r;
  r.set_step(step);
  r.set_params(std::string(reinterpret_cast<const char*>(params.data()), params.size() * sizeof(float)));
  for (const auto& [tau, n] : st.staleness) (*r.mutable_staleness())[tau] = n;
  uint64_t in = 0, out = 0;
  for (auto b : st.bytes_in) in += b;
  for (auto b : st.bytes_out) out += b;
  r.set_bytes_in(in);
  r.set_bytes_out(out);
  r.set_delta_pulls(st.delta_pulls);
  r.set_pull_residual_sq(st.pull_residual_sq);
  r.set_pull_params_sq(st.pull_params_sq);
  for (std::size_t w = 0; w < st.dead.size(); ++w) {
    r.add_dead(st.dead[w]);
    r.add_dead_s(st.dead[w] ? std::chrono::duration<double>(st.dead_at[w] - start).count() : -1.0);
  }
  return r;
}

ShardTally tallyOf(const ShardReport& r) {
  ShardTally t;
  for (const auto& [tau, n] : r.staleness()) t.staleness[tau] = n;
  t.bytes_in = r.bytes_in();
  t.bytes_out = r.bytes_out();
  t.delta_pulls = r.delta_pulls();
  t.pull_residual_sq = r.pull_residual_sq();
  t.pull_params_sq = r.pull_params_sq();
  for (int w = 0; w < r.dead_size(); ++w) t.dropped_s.push_back(r.dead(w) && w < r.dead_s_size() ? r.dead_s(w) : -1);
  return t;
}

}  // namespace

AsyncRank::AsyncRank(const experiments::Experiment& e, int rank, train::Workload& model, comm::HostCommunicator& data,
                     comm::HostCommunicator& control, std::shared_ptr<Compressor> instance,
                     std::shared_ptr<Compressor> pull_instance, std::shared_ptr<const train::Partition> partition)
    : e_(e),
      rank_(rank),
      S_(e.parameter_server().servers()),
      W_(e.workers()),
      model_(model),
      data_comm_(data),
      data_(data.transport()),
      control_(control),
      ctl_(control.transport()),
      instance_(rawPushes(e) ? nullptr : std::move(instance)),
      pull_instance_(std::move(pull_instance)),
      partition_(std::move(partition)),
      plan_(psPlan(e, model.params(), S_)),
      flat_(static_cast<std::size_t>(plan_.total_numel)),
      steps_(asyncStepPlan(e, model.numTrainExamples())),
      lr_(asyncLrSchedule(e, steps_)),
      points_(evalPoints(e, steps_)),
      sender_(ctl_) {
  train::copyValuesOut(model.params(), flat_);
}

void AsyncRank::checkInitialReplicas() {
  // The initial parameters, and the non-IID shards every process drew on its own (label_partition.h).
  const int world = S_ + W_;
  const std::array<uint64_t, 2> mine{train::parameterChecksum(model_.params()),
                                     train::partitionChecksum(partition_.get())};
  std::vector<uint64_t> all(2 * static_cast<std::size_t>(world));
  control_.allgatherv(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                      std::vector<uint64_t>(static_cast<std::size_t>(world), sizeof(mine)));
  for (int r = 0; r < world; ++r) {
    TERSE_CHECK(all[2 * static_cast<std::size_t>(r)] == mine[0], InternalError,
                "replica " << r << " starts with different parameters than replica " << rank_
                           << ": do all ranks run the same build and config?");
  }
  // Every rank's checksum, so that the odd one out shows whichever rank it is.
  std::ostringstream shards;
  bool agree = true;
  for (int r = 0; r < world; ++r) {
    const uint64_t theirs = all[2 * static_cast<std::size_t>(r) + 1];
    shards << (r ? ", " : "") << "rank " << r << " " << std::hex << theirs << std::dec;
    agree = agree && theirs == mine[1];
  }
  TERSE_CHECK(agree, InvalidArgument,
              "the ranks drew different data shards (data.partition DIRICHLET; partition checksums: "
                  << shards.str() << "): do all ranks read the same data set, with the same build?");
}

void AsyncRank::run(std::optional<AsyncReport> report, const World& world, const std::string& host) {
  start_ = rt::now();
  if (rank_ >= S_) return worker(world);
  startShard(host);
  if (rank_ != 0) return shard();
  AsyncRecorder recorder(e_, steps_, lr_, model_, world, *report);
  primary(recorder);
}

ReportSender::~ReportSender() {
  try {
    if (pending_) pending_->wait();
  } catch (...) {
    // A failed job: the error was reported where it happened.
  }
}

void ReportSender::send(comm::Tag tag, const google::protobuf::MessageLite& m) {
  if (pending_) pending_->wait();
  buffer_.clear();
  TERSE_CHECK(m.SerializeToString(&buffer_), InternalError, "cannot serialize a report");
  pending_ = t_.isend(0, comm::FrameMeta{comm::OpKind::kP2P, tag, comm::kNoTensor},
                      std::as_bytes(std::span(buffer_.data(), buffer_.size())));
}

void ReportSender::flush() {
  if (pending_) pending_->wait();
  pending_.reset();
}

void AsyncRank::worker(const World& world) {
  const int w = rank_ - S_;
  train::ClientOptions copts = clientOptions(e_);
  copts.compressor = instance_;
  copts.pull_compressor = pull_instance_;
  train::ParamServerClient client(data_, plan_, w, W_, copts);
  train::AsyncTrainerOptions options = asyncWorkerOptions(e_, w);
  options.slowdown = world.trainerSlowdown(options.slowdown);  // a simulation slows the actor instead
  options.partition = partition_;
  train::AsyncWorker worker(model_, client, w, W_, options);
  WorkerReport rep;
  auto fill = [&] {
    rep.set_steps(worker.stepsDone());
    rep.set_compute_s(worker.totals().compute_s);
    rep.set_compress_s(worker.totals().compress_s);
    rep.set_decompress_s(worker.totals().decompress_s);
    rep.set_comm_s(worker.totals().comm_s);
    rep.set_exposed_comm_s(worker.totals().exposed_comm_s);
    rep.set_step_time_s(worker.totals().step_s);
    rep.set_payload_bytes(client.payloadBytes());
    rep.set_pull_payload_bytes(client.pullPayloadBytes());
    const auto t = data_.traffic();
    rep.set_bytes_out(dataBytes(t, true));
    rep.set_bytes_in(dataBytes(t, false));
  };
  const int64_t fail_after = experiments::workerSettings(e_, w).fail_after_steps();
  const int64_t left = runAsyncWorker(
      worker, fail_after,
      [&] {
        const train::AsyncStepRecord rec = worker.step();
        fill();
        rep.set_loss(rec.loss);
        // The step after which it stops dead says so itself: a record that holds this step (async_rank.h, collect)
        // counts the worker as gone, as a record taken after it stopped must.
        if (fail_after > 0 && worker.stepsDone() >= fail_after) {
          rep.set_left_step(worker.stepsDone());
          rep.set_left_s(since(start_));
        }
        sender_.send(kWorkerReportTag, rep);
      },
      [] { return false; });
  if (left >= 0) {
    rep.set_left_step(left);  // silent from here on: no goodbye to the shards
  } else {
    worker.leave();
    rep.set_done(true);
  }
  fill();
  sender_.send(kWorkerReportTag, rep);
  sender_.flush();
  awaitRelease(ctl_);  // rank 0 wrote its last record
}

void AsyncRank::startShard(const std::string& host) {
  train::ServerOptions so = serverOptions(e_, lr_, points_);
  so.compressor = instance_;
  so.pull_compressor = pull_instance_;
  const auto [begin, end] = plan_.ranges[static_cast<std::size_t>(rank_)];
  shard_ =
      std::make_unique<train::ParamServerShard>(data_, plan_, rank_, W_,
                                                std::vector<float>(flat_.begin() + static_cast<std::ptrdiff_t>(begin),
                                                                   flat_.begin() + static_cast<std::ptrdiff_t>(end)),
                                                so);
  shard_thread_ = rt::Thread(
      "shard " + std::to_string(rank_),
      [this, host] {
        try {
          shard_->run();
        } catch (...) {
          shard_error_ = std::current_exception();
          // Tell every rank at once rather than leaving the workers to time out.
          data_.abort("server shard " + std::to_string(rank_) + " (rank " + std::to_string(rank_) + ", " + host +
                      ") failed");
        }
      },
      rank_);
}

void AsyncRank::check() {
  if (shard_error_) std::rethrow_exception(shard_error_);
  // Barriers on an aborted communicator throw its first failure at once.
  if (data_.aborted()) data_comm_.barrier();
  if (ctl_.aborted()) control_.barrier();
}

// Shards 1 .. S-1: their snapshot at every evaluation point, then their final report.
void AsyncRank::shard() {
  for (const int64_t point : points_) {
    // Blocks until the shard takes it, or returns nothing once the shard stopped without it: a point the workers never
    // reached, or a failed job (the abort ends the shard's loop).
    const std::optional<train::ShardSnapshot> snap =
        shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds::max());
    if (!snap) break;
    sender_.send(kShardReportTag, shardReport(point, snap->params, snap->stats, start_));
  }
  joinShard();
  check();
  sender_.send(kShardReportTag, shardReport(-1, shard_->params(), shard_->stats(), start_));
  sender_.flush();
  awaitRelease(ctl_);
}

void AsyncRank::receive(int r) {
  Inbox& in = inbox_[static_cast<std::size_t>(r)];
  const bool from_shard = r < S_;
  const int w = r - S_;
  try {
    if (!in.posted) {
      in.recv = ctl_.irecv(
          r, comm::FrameMeta{comm::OpKind::kP2P, from_shard ? kShardReportTag : kWorkerReportTag, comm::kNoTensor},
          in.buffer);
      in.posted = true;
    }
    in.recv.wait();
  } catch (const comm::CommError&) {
    if (from_shard || ctl_.aborted()) throw;
    // A worker process that died (an expendable rank): it left at its last report.
    lost_[static_cast<std::size_t>(w)] = true;
    WorkerReport& last = latest_[static_cast<std::size_t>(w)];
    if (!last.done() && last.left_step() == 0) {
      last.set_left_step(std::max<int64_t>(1, last.steps()));
      left_s_[static_cast<std::size_t>(w)] = since(start_);
    }
    return;
  }
  in.posted = false;
  file(r, static_cast<std::size_t>(in.recv.bytes()));
}

void AsyncRank::file(int r, std::size_t n) {
  const std::vector<std::byte>& buffer = inbox_[static_cast<std::size_t>(r)].buffer;
  if (r < S_) {
    ShardReport rep;
    TERSE_CHECK(rep.ParseFromArray(buffer.data(), static_cast<int>(n)), InvalidPayload,
                "rank " << r << " (server shard " << r << ") sent an unreadable report of " << n << " bytes");
    const auto [b, e2] = plan_.ranges[static_cast<std::size_t>(r)];
    TERSE_CHECK(rep.params().size() == (e2 - b) * sizeof(float) && rep.dead_size() == W_, InvalidPayload,
                "rank " << r << " (server shard " << r << ") sent a report of the wrong shape");
    auto& slot = rep.step() < 0 ? finals_[static_cast<std::size_t>(r)] : next_[static_cast<std::size_t>(r)];
    slot = std::move(rep);
    return;
  }
  WorkerReport rep;
  const int w = r - S_;
  TERSE_CHECK(rep.ParseFromArray(buffer.data(), static_cast<int>(n)), InvalidPayload,
              "rank " << r << " (worker " << w << ") sent an unreadable report of " << n << " bytes");
  auto& l = losses_[static_cast<std::size_t>(w)];
  // A step's report is the one that moves `steps` on (the last one may also say the worker stops dead); the report a
  // worker ends with repeats its last step's count.
  if (rep.steps() == static_cast<int64_t>(l.size()) + 1) l.push_back(rep.loss());
  if (rep.left_step() > 0) left_s_[static_cast<std::size_t>(w)] = rep.left_s();
  latest_[static_cast<std::size_t>(w)] = std::move(rep);
}

bool AsyncRank::workerStopped(int w) const {
  const WorkerReport& rep = latest_[static_cast<std::size_t>(w)];
  return lost_[static_cast<std::size_t>(w)] || rep.done() || rep.left_step() > 0;
}

void AsyncRank::assemble(std::span<const float> own, const train::ServerStats& own_stats,
                         const std::function<const ShardReport&(int k)>& others) {
  shard_tallies_.clear();
  std::copy(own.begin(), own.end(), flat_.begin());
  shard_tallies_.push_back(shardTally(own_stats, start_));
  for (int k = 1; k < S_; ++k) {
    const ShardReport& rep = others(k);
    std::memcpy(flat_.data() + plan_.ranges[static_cast<std::size_t>(k)].first, rep.params().data(),
                rep.params().size());
    shard_tallies_.push_back(tallyOf(rep));
  }
}

AsyncTallies AsyncRank::tallies() {
  AsyncTallies t;
  t.shards = shard_tallies_;
  for (int w = 0; w < W_; ++w) {
    const WorkerReport& r = latest_[static_cast<std::size_t>(w)];
    WorkerTally& wt = t.workers.emplace_back();
    wt.steps = r.steps();
    wt.times.compute_s = r.compute_s();
    wt.times.compress_s = r.compress_s();
    wt.times.decompress_s = r.decompress_s();
    wt.times.comm_s = r.comm_s();
    wt.times.exposed_comm_s = r.exposed_comm_s();
    wt.times.step_s = r.step_time_s();
    wt.payload_bytes = r.payload_bytes();
    wt.pull_payload_bytes = r.pull_payload_bytes();
    wt.bytes_out = r.bytes_out();
    wt.bytes_in = r.bytes_in();
    if (r.left_step() > 0) {
      wt.left_step = r.left_step();
      wt.left_s = left_s_[static_cast<std::size_t>(w)];
    }
  }
  return t;
}

std::pair<double, int64_t> AsyncRank::losses(int worker, int64_t from, int64_t to) {
  const auto& l = losses_[static_cast<std::size_t>(worker)];
  std::pair<double, int64_t> sum{0.0, 0};
  for (int64_t i = from; i < std::min<int64_t>(to, static_cast<int64_t>(l.size())); ++i) {
    sum.first += l[static_cast<std::size_t>(i)];
    ++sum.second;
  }
  return sum;
}

// A point is evaluated once rank 0's own snapshot and every other shard's are in, so a record holds the parameters at
// that global step as in process. A point some shard never reached (its workers all stopped first) has no record.
std::optional<AsyncPoint> AsyncRank::collect(int64_t point) {
  const std::optional<train::ShardSnapshot> own =
      shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds::max());
  if (!own) {
    check();  // a failed job, rather than a point never reached
    return std::nullopt;
  }
  for (int k = 1; k < S_; ++k) {
    auto& next = next_[static_cast<std::size_t>(k)];
    while (!next && !finals_[static_cast<std::size_t>(k)]) receive(k);
    // Shard k stopped before the point: its final report came instead.
    if (!next) return std::nullopt;
    TERSE_CHECK(next->step() == point, InvalidPayload,
                "rank " << k << " (server shard " << k << ") reported step " << next->step() << " where step " << point
                        << " was due");
  }
  // Every number of the record is as of the snapshot: each worker's reports up to the steps the snapshot holds (each
  // of them comes: a worker reports a step right after its clock), and no later ones, so that the record does not
  // depend on how far the workers ran meanwhile. Shard 0's counts stand for every shard's (a step clocks on all).
  for (int w = 0; w < W_; ++w) {
    const auto held = static_cast<int64_t>(own->completed[static_cast<std::size_t>(w)]);
    while (!workerStopped(w) && latest_[static_cast<std::size_t>(w)].steps() < held) receive(S_ + w);
  }
  std::vector<ShardReport> reports(static_cast<std::size_t>(S_));
  for (int k = 1; k < S_; ++k) {
    reports[static_cast<std::size_t>(k)] = std::move(*next_[static_cast<std::size_t>(k)]);
    next_[static_cast<std::size_t>(k)].reset();
  }
  assemble(own->params, own->stats, [&](int k) -> const ShardReport& { return reports[static_cast<std::size_t>(k)]; });
  int64_t worker_steps = 0;
  for (const auto& r : latest_) worker_steps += r.steps();
  return AsyncPoint{point, worker_steps, rt::seconds(start_, own->taken)};
}

// The end: every worker stopped (its last report, or its process lost), every shard done and its final report in.
AsyncPoint AsyncRank::collectFinal() {
  joinShard();  // its shard returns once every worker left or was dropped
  check();
  for (int k = 1; k < S_; ++k) {
    // Points past the last record (asked for no more once one was not reached) come before the final report.
    while (!finals_[static_cast<std::size_t>(k)]) {
      next_[static_cast<std::size_t>(k)].reset();
      receive(k);
    }
  }
  for (int w = 0; w < W_; ++w)
    while (!workerStopped(w)) receive(S_ + w);
  assemble(shard_->params(), shard_->stats(),
           [&](int k) -> const ShardReport& { return *finals_[static_cast<std::size_t>(k)]; });
  int64_t worker_steps = 0;
  for (const auto& r : latest_) worker_steps += r.steps();
  return {worker_steps / W_, worker_steps, since(start_)};
}

// Rank 0: shard 0, and the monitor that writes the records.
void AsyncRank::primary(AsyncRecorder& recorder) {
  const int world = S_ + W_;
  inbox_.resize(static_cast<std::size_t>(world));
  latest_.resize(static_cast<std::size_t>(W_));
  losses_.resize(static_cast<std::size_t>(W_));
  left_s_.assign(static_cast<std::size_t>(W_), 0);
  lost_.assign(static_cast<std::size_t>(W_), false);
  next_.resize(static_cast<std::size_t>(S_));
  finals_.resize(static_cast<std::size_t>(S_));
  for (int r = 1; r < world; ++r) {
    std::size_t cap = kWorkerReportMax;
    if (r < S_) {
      const auto [b, e2] = plan_.ranges[static_cast<std::size_t>(r)];
      cap = (e2 - b) * sizeof(float) + kShardReportSlack;
    }
    inbox_[static_cast<std::size_t>(r)].buffer.resize(cap);
  }
  recorder.recordPoints(*this, points_);
  recorder.recordFinal(*this);
  // Not a barrier: a lost worker cannot take part in one. Every rank still connected is told to leave.
  for (int r = 1; r < world; ++r)
    if (r < S_ || !lost_[static_cast<std::size_t>(r - S_)]) {
      try {
        ctl_.send(r, comm::FrameMeta{comm::OpKind::kP2P, kReleaseTag, comm::kNoTensor}, {});
      } catch (const comm::CommError&) {
        if (ctl_.aborted()) throw;  // otherwise a worker lost just now: nothing to tell it
      }
    }
}

}  // namespace terse::runner::detail

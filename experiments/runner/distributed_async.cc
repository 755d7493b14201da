// Modes ASYNC and SSP over transport TCP: this process is one rank of a job of servers + workers ranks (`terse launch
// -n S+W -- terse run CONFIG`, srun, mpirun). Ranks 0 .. S-1 are the parameter server's shards, ranks S .. S+W-1 the
// workers, exactly as in process (async_runner.cc), over a tcp transport with the config's link emulation.
//
// Rank 0 is shard 0 and also writes the results. It learns the rest over a second, control-only tcp transport (no
// emulation, not counted in the records, as in distributed.cc): every worker sends a WorkerReport (async_report.proto)
// after each step -- its cumulative times and bytes and that step's loss -- and each other shard sends a ShardReport
// with its snapshot at every evaluation point (ServerOptions::snapshot_steps) and a final one when it stops. Rank 0
// evaluates a point once its own snapshot and every other shard's are in, so a record holds the parameters at that
// global step as in process. Reports are cumulative, so rank 0 only keeps the latest of each worker.
//
// Rank 0 blocks for what it needs, in an order every report arrives in, and never polls: its own shard's snapshot
// (which comes, or its shard stops without it), then each other shard's next report (a shard sends its points in order,
// then its final one), then whatever worker reports are in; at the end each worker's last report. A blocking read
// fails at once when the job is aborted or the peer's process is lost, so nothing waits on a rank that is gone. Why:
// the loop this replaces looked at every inbox and slept 1 ms when nothing had come, which cost a wake-up every
// millisecond for the whole run, delayed each record by up to a millisecond, and has no meaning in simulated time,
// where a timed sleep moves the clock.
//
// Elastic workers: workers are expendable ranks of both tcp transports (TcpOptions::expendable_ranks), so a worker
// process that dies or goes silent past the tcp timeout fails only its own links: the shards drop it at once, rank 0
// records that it left at its last report, and the others finish the run. A worker with
// worker_settings.fail_after_steps stops speaking to the shards (no goodbye) but keeps its process, as the in-process
// run's silent thread does; the shards drop it after worker_timeout. A shard process that dies fails every rank: a
// clear error naming the rank and host (a parameter server without one of its shards has lost parameters).
//
// The end: workers leave with a goodbye, shards stop once every worker left or was dropped, shards 1.. send their
// final reports, rank 0 writes the last record and releases every rank still connected (a message, not a barrier: a
// lost worker cannot join a barrier).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>

#include "core/comm/host_communicator.h"
#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/tcp/transport.h"
#include "core/common/crash.h"
#include "core/common/error.h"
#include "core/common/runtime.h"
#include "core/plugin/loader.h"
#include "core/train/async_trainer.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/async_rank_driver.h"
#include "experiments/runner/async_report.pb.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/runner/world.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

using Clock = rt::Clock;
using experiments::Experiment;

constexpr comm::Tag kWorkerReportTag = 0x4152'5057;  // "ARPW"
constexpr comm::Tag kShardReportTag = 0x4152'5053;   // "ARPS"
constexpr comm::Tag kReleaseTag = 0x4152'5052;       // "ARPR": rank 0 wrote the last record, everyone may leave
constexpr std::size_t kWorkerReportMax = 512;
constexpr std::size_t kShardReportSlack = 1 << 20;  // staleness map and fields beyond the parameters

uint64_t dataBytes(const comm::RankTraffic& t, bool sent) {
  const auto& d = sent ? t.sent : t.received;
  return d.total().bytes - d.kind(comm::OpKind::kControl).bytes;
}

// Sends serialized messages to rank 0 one at a time (the previous send must finish before its buffer is reused).
class ReportSender {
 public:
  explicit ReportSender(comm::Transport& t) : t_(t) {}
  ~ReportSender() {
    try {
      if (pending_) pending_->wait();
    } catch (...) {
      // A failed job: the error was reported where it happened.
    }
  }
  void send(comm::Tag tag, const google::protobuf::MessageLite& m) {
    if (pending_) pending_->wait();
    buffer_.clear();
    TERSE_CHECK(m.SerializeToString(&buffer_), InternalError, "cannot serialize a report");
    pending_ = t_.isend(0, comm::FrameMeta{comm::OpKind::kP2P, tag, comm::kNoTensor},
                        std::as_bytes(std::span(buffer_.data(), buffer_.size())));
  }
  void flush() {
    if (pending_) pending_->wait();
    pending_.reset();
  }

 private:
  comm::Transport& t_;
  std::string buffer_;
  std::optional<comm::Request> pending_;
};

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
  for (std::size_t w = 0; w < st.dead.size(); ++w) {
    r.add_dead(st.dead[w]);
    r.add_dead_s(st.dead[w] ? std::chrono::duration<double>(st.dead_at[w] - start).count() : -1.0);
  }
  return r;
}

detail::ShardTally tallyOf(const ShardReport& r) {
  detail::ShardTally t;
  for (const auto& [tau, n] : r.staleness()) t.staleness[tau] = n;
  t.bytes_in = r.bytes_in();
  t.bytes_out = r.bytes_out();
  for (int w = 0; w < r.dead_size(); ++w) t.dropped_s.push_back(r.dead(w) && w < r.dead_s_size() ? r.dead_s(w) : -1);
  return t;
}

// This process's rank of the job: its replica (shards take their initial range from it; rank 0 evaluates on it) and
// its endpoints. Ranks 0 .. S-1 serve a shard, the others are workers; rank 0 also writes the records.
class TcpAsyncRank final : public detail::AsyncView {
 public:
  TcpAsyncRank(const Experiment& e, int rank, train::Workload& model, comm::HostCommunicator& data,
               comm::HostCommunicator& control, std::shared_ptr<Compressor> instance)
      : e_(e),
        rank_(rank),
        S_(e.parameter_server().servers()),
        W_(e.workers()),
        model_(model),
        data_comm_(data),
        data_(data.transport()),
        control_(control),
        ctl_(control.transport()),
        instance_(detail::rawPushes(e) ? nullptr : std::move(instance)),
        plan_(detail::psPlan(e, model.params(), S_)),
        flat_(static_cast<std::size_t>(plan_.total_numel)),
        steps_(detail::asyncStepPlan(e, model.numTrainExamples())),
        lr_(detail::asyncLrSchedule(e, steps_)),
        points_(detail::evalPoints(e, steps_)),
        sender_(ctl_) {
    train::copyValuesOut(model.params(), flat_);
  }
  ~TcpAsyncRank() { joinShard(); }

  const train::StepPlan& steps() const { return steps_; }

  // Every replica must start from the same parameters (same seed, same build).
  void checkInitialReplicas() {
    const int world = S_ + W_;
    const uint64_t mine = train::parameterChecksum(model_.params());
    std::vector<uint64_t> all(static_cast<std::size_t>(world));
    control_.allgatherv(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)),
                        std::vector<uint64_t>(static_cast<std::size_t>(world), sizeof(uint64_t)));
    for (int r = 0; r < world; ++r)
      TERSE_CHECK(all[static_cast<std::size_t>(r)] == mine, InternalError,
                  "replica " << r << " starts with different parameters than replica " << rank_
                             << ": do all ranks run the same build and config?");
  }

  // The rank's loop; `report` is rank 0's (records), null on the others. Returns after rank 0's last record.
  void run(std::optional<detail::AsyncReport> report, const detail::World& world, const std::string& host) {
    start_ = rt::now();
    if (rank_ >= S_) return worker();
    startShard(host);
    if (rank_ != 0) return shard();
    detail::AsyncRecorder recorder(e_, steps_, lr_, model_, world, *report);
    primary(recorder);
  }

  // A failed rank: its shard stops serving (the World already aborted the endpoints).
  void stop() {
    if (shard_) shard_->stop();
    joinShard();
  }

 private:
  void worker();
  void startShard(const std::string& host);
  void shard();
  void primary(detail::AsyncRecorder& recorder);
  // Throws the shard's failure, or the job's first one once an endpoint was aborted.
  void check();
  void joinShard() {
    if (shard_thread_.joinable()) shard_thread_.join();
  }
  // Takes every worker report that has arrived, without waiting.
  void takeWorkerReports();
  // Takes rank r's next report (a worker's, or a shard's: its next point or its final report) if it is in, or waits
  // for it (`block`), and files it; false when none came. A worker whose process is lost (the read fails, and the job
  // was not aborted) is filed as stopped at its last report. Throws InvalidPayload naming the rank for a report that
  // does not parse or has the wrong shape, CommError when the job failed.
  bool receive(int r, bool block);
  void file(int r, std::size_t bytes);
  bool workerStopped(int w) const;
  // Rank 0's view of the others, from their reports.
  std::optional<detail::AsyncPoint> collect(int64_t point) override;
  detail::AsyncPoint collectFinal() override;
  std::span<const float> params() const override { return flat_; }
  detail::AsyncTallies tallies() override;
  std::pair<double, int64_t> losses(int worker, int64_t from, int64_t to) override;
  // The global model and the shards' tallies: `own` is shard 0's range, `others` shard k's report (k = 1 .. S-1).
  void assemble(std::span<const float> own, const std::function<const ShardReport&(int k)>& others);

  const Experiment& e_;
  const int rank_, S_, W_;
  train::Workload& model_;
  comm::HostCommunicator& data_comm_;
  comm::Transport& data_;
  comm::HostCommunicator& control_;
  comm::Transport& ctl_;
  std::shared_ptr<Compressor> instance_;  // null: raw pushes
  const train::PsPlan plan_;
  std::vector<float> flat_;
  const train::StepPlan steps_;
  const train::LrScheduleOptions lr_;
  const std::vector<int64_t> points_;
  Clock::time_point start_;
  ReportSender sender_;

  std::unique_ptr<train::ParamServerShard> shard_;
  rt::Thread shard_thread_;  // the runtime's: an actor on this rank's host in a simulation
  std::exception_ptr shard_error_;

  // Rank 0's view of the others.
  struct Inbox {
    std::vector<std::byte> buffer;
    comm::Request recv;
    bool posted = false;
  };
  std::vector<Inbox> inbox_;
  std::vector<WorkerReport> latest_;
  std::vector<std::vector<double>> losses_;
  std::vector<double> left_s_;                    // when rank 0 learned a worker stopped dead
  std::vector<bool> lost_;                        // its process died: no more reports
  std::vector<std::optional<ShardReport>> next_;  // per shard, the report of a point not yet asked for
  std::vector<std::optional<ShardReport>> finals_;
  std::vector<detail::ShardTally> shard_tallies_;  // of the record being written
};

void TcpAsyncRank::worker() {
  const int w = rank_ - S_;
  train::ClientOptions copts = detail::clientOptions(e_);
  copts.compressor = instance_;
  train::ParamServerClient client(data_, plan_, w, W_, copts);
  train::AsyncWorker worker(model_, client, w, W_, detail::asyncWorkerOptions(e_, w));
  WorkerReport rep;
  auto fill = [&] {
    rep.set_steps(worker.stepsDone());
    rep.set_compute_s(worker.totals().compute_s);
    rep.set_compress_s(worker.totals().compress_s);
    rep.set_comm_s(worker.totals().comm_s);
    rep.set_exposed_comm_s(worker.totals().exposed_comm_s);
    rep.set_step_time_s(worker.totals().step_s);
    rep.set_payload_bytes(client.payloadBytes());
    const auto t = data_.traffic();
    rep.set_bytes_out(dataBytes(t, true));
    rep.set_bytes_in(dataBytes(t, false));
  };
  const int64_t left = detail::runAsyncWorker(
      worker, experiments::workerSettings(e_, w).fail_after_steps(),
      [&] {
        const train::AsyncStepRecord rec = worker.step();
        fill();
        rep.set_loss(rec.loss);
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

void TcpAsyncRank::startShard(const std::string& host) {
  train::ServerOptions so = detail::serverOptions(e_, lr_, points_);
  so.compressor = instance_;
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

void TcpAsyncRank::check() {
  if (shard_error_) std::rethrow_exception(shard_error_);
  // Barriers on an aborted communicator throw its first failure at once.
  if (data_.aborted()) data_comm_.barrier();
  if (ctl_.aborted()) control_.barrier();
}

// Shards 1 .. S-1: their snapshot at every evaluation point, then their final report.
void TcpAsyncRank::shard() {
  for (const int64_t point : points_) {
    // Blocks until the shard takes it, or returns nothing once the shard stopped without it: a point the workers never
    // reached, or a failed job (the abort ends the shard's loop).
    const std::optional<train::ShardSnapshot> snap =
        shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds::max());
    if (!snap) break;
    sender_.send(kShardReportTag, shardReport(point, snap->params, shard_->stats(), start_));
  }
  joinShard();
  check();
  sender_.send(kShardReportTag, shardReport(-1, shard_->params(), shard_->stats(), start_));
  sender_.flush();
  awaitRelease(ctl_);
}

bool TcpAsyncRank::receive(int r, bool block) {
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
    if (block)
      in.recv.wait();
    else if (!in.recv.test())
      return false;
  } catch (const comm::CommError&) {
    if (from_shard || ctl_.aborted()) throw;
    // A worker process that died (an expendable rank): it left at its last report.
    lost_[static_cast<std::size_t>(w)] = true;
    WorkerReport& last = latest_[static_cast<std::size_t>(w)];
    if (!last.done() && last.left_step() == 0) {
      last.set_left_step(std::max<int64_t>(1, last.steps()));
      left_s_[static_cast<std::size_t>(w)] = detail::since(start_);
    }
    return true;
  }
  in.posted = false;
  file(r, static_cast<std::size_t>(in.recv.bytes()));
  return true;
}

void TcpAsyncRank::file(int r, std::size_t n) {
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
  if (!rep.done() && rep.left_step() == 0 && rep.steps() == static_cast<int64_t>(l.size()) + 1) l.push_back(rep.loss());
  if (rep.left_step() > 0 && left_s_[static_cast<std::size_t>(w)] == 0)
    left_s_[static_cast<std::size_t>(w)] = detail::since(start_);
  latest_[static_cast<std::size_t>(w)] = std::move(rep);
}

void TcpAsyncRank::takeWorkerReports() {
  for (int w = 0; w < W_; ++w)
    while (!lost_[static_cast<std::size_t>(w)] && receive(S_ + w, false)) {
    }
}

bool TcpAsyncRank::workerStopped(int w) const {
  const WorkerReport& rep = latest_[static_cast<std::size_t>(w)];
  return lost_[static_cast<std::size_t>(w)] || rep.done() || rep.left_step() > 0;
}

void TcpAsyncRank::assemble(std::span<const float> own, const std::function<const ShardReport&(int k)>& others) {
  shard_tallies_.clear();
  std::copy(own.begin(), own.end(), flat_.begin());
  shard_tallies_.push_back(detail::shardTally(shard_->stats(), start_));
  for (int k = 1; k < S_; ++k) {
    const ShardReport& rep = others(k);
    std::memcpy(flat_.data() + plan_.ranges[static_cast<std::size_t>(k)].first, rep.params().data(),
                rep.params().size());
    shard_tallies_.push_back(tallyOf(rep));
  }
}

detail::AsyncTallies TcpAsyncRank::tallies() {
  detail::AsyncTallies t;
  t.shards = shard_tallies_;
  for (int w = 0; w < W_; ++w) {
    const WorkerReport& r = latest_[static_cast<std::size_t>(w)];
    detail::WorkerTally& wt = t.workers.emplace_back();
    wt.steps = r.steps();
    wt.times.compute_s = r.compute_s();
    wt.times.compress_s = r.compress_s();
    wt.times.comm_s = r.comm_s();
    wt.times.exposed_comm_s = r.exposed_comm_s();
    wt.times.step_s = r.step_time_s();
    wt.payload_bytes = r.payload_bytes();
    wt.bytes_out = r.bytes_out();
    wt.bytes_in = r.bytes_in();
    if (r.left_step() > 0) {
      wt.left_step = r.left_step();
      wt.left_s = left_s_[static_cast<std::size_t>(w)];
    }
  }
  return t;
}

std::pair<double, int64_t> TcpAsyncRank::losses(int worker, int64_t from, int64_t to) {
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
std::optional<detail::AsyncPoint> TcpAsyncRank::collect(int64_t point) {
  const std::optional<train::ShardSnapshot> own =
      shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds::max());
  if (!own) {
    check();  // a failed job, rather than a point never reached
    return std::nullopt;
  }
  for (int k = 1; k < S_; ++k) {
    auto& next = next_[static_cast<std::size_t>(k)];
    while (!next && !finals_[static_cast<std::size_t>(k)]) receive(k, true);
    // Shard k stopped before the point: its final report came instead.
    if (!next) return std::nullopt;
    TERSE_CHECK(next->step() == point, InvalidPayload,
                "rank " << k << " (server shard " << k << ") reported step " << next->step() << " where step " << point
                        << " was due");
  }
  takeWorkerReports();
  std::vector<ShardReport> reports(static_cast<std::size_t>(S_));
  for (int k = 1; k < S_; ++k) {
    reports[static_cast<std::size_t>(k)] = std::move(*next_[static_cast<std::size_t>(k)]);
    next_[static_cast<std::size_t>(k)].reset();
  }
  assemble(own->params, [&](int k) -> const ShardReport& { return reports[static_cast<std::size_t>(k)]; });
  int64_t worker_steps = 0;
  for (const auto& r : latest_) worker_steps += r.steps();
  return detail::AsyncPoint{point, worker_steps, rt::seconds(start_, own->taken)};
}

// The end: every worker stopped (its last report, or its process lost), every shard done and its final report in.
detail::AsyncPoint TcpAsyncRank::collectFinal() {
  joinShard();  // its shard returns once every worker left or was dropped
  check();
  for (int k = 1; k < S_; ++k) {
    // Points past the last record (asked for no more once one was not reached) come before the final report.
    while (!finals_[static_cast<std::size_t>(k)]) {
      next_[static_cast<std::size_t>(k)].reset();
      receive(k, true);
    }
  }
  for (int w = 0; w < W_; ++w)
    while (!workerStopped(w)) receive(S_ + w, true);
  assemble(shard_->params(), [&](int k) -> const ShardReport& { return *finals_[static_cast<std::size_t>(k)]; });
  int64_t worker_steps = 0;
  for (const auto& r : latest_) worker_steps += r.steps();
  return {worker_steps / W_, worker_steps, detail::since(start_)};
}

// Rank 0: shard 0, and the monitor that writes the records.
void TcpAsyncRank::primary(detail::AsyncRecorder& recorder) {
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

}  // namespace

RunSummary Runner::runTcpAsync(const Experiment& e) {
  const auto timeout = detail::tcpTimeout(e);
  const std::optional<comm::JobEnv> detected = comm::detectJobEnv();
  comm::JobEnv env;
  env.source = "single";
  if (detected) env = *detected;
  const int rank = env.rank;
  crash::setProcessRank(rank);
  const int world = env.world_size;
  const int S = e.parameter_server().servers();
  const int W = e.workers();
  TERSE_CHECK(world == S + W, InvalidArgument,
              "variant '" << e.variant() << "': mode " << Experiment::Mode_Name(e.mode())
                          << " needs servers + workers = " << S << " + " << W << " = " << S + W
                          << " ranks but this job has " << world << " (from "
                          << (env.source == "single" ? "no launcher: a single process" : env.source)
                          << "); start it with `terse launch -n " << S + W << " -- terse run CONFIG`");
  std::optional<results::ResultWriter> writer;
  RunSummary summary;
  const std::string prefix = startTcpVariant(
      e, rank, timeout, options_.output_root.value_or(std::filesystem::path(e.output_dir())), writer, summary);
  const comm::JobEnv& joined = job_->env;
  // The data transport lives in a communicator only so that a barrier on it, once aborted, throws the job's first
  // failure (communicator.h); the shard and the client use its transport directly.
  std::unique_ptr<comm::HostCommunicator> data;
  std::unique_ptr<comm::HostCommunicator> control;
  std::unique_ptr<train::Workload> model;
  std::unique_ptr<TcpAsyncRank> me;                      // after what it refers to
  detail::ProcessWorld ranks(rank, world, joined.host);  // after what it aborts: it goes first
  ranks.onAbort([&](const std::string& why) {
    if (data) data->transport().abort(why);
    if (control) control->transport().abort(why);
  });
  try {
    if (writer) writer->writeConfig(experiments::toText(e));
    const auto start_time = results::isoTimeUtc();
    model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), dataFor(e));
    comm::TcpOptions to = detail::tcpOptions(e, joined, rank, world, timeout, prefix);
    // Workers are expendable: a worker process that dies or goes silent is dropped by the shards, the job goes on.
    for (int r = S; r < world; ++r) to.expendable_ranks.push_back(r);
    data = std::make_unique<comm::HostCommunicator>(comm::connectTcpTransport(to, job_->token, *job_->store));
    ranks.attach(data.get(), &data->transport());
    control = std::make_unique<comm::HostCommunicator>(detail::connectControl(to, *job_, prefix));
    auto plugin = options_.loader->loadCompressor(e.compressor().name());
    const Params params = experiments::pluginParams(e.compressor());
    std::shared_ptr<Compressor> instance = plugin->instantiate(params);
    me = std::make_unique<TcpAsyncRank>(e, rank, *model, *data, *control, instance);
    me->checkInitialReplicas();
    if (writer) {
      results::Provenance prov =
          detail::baseProvenance(e, "tcp", world, start_time, options_.terse_version, to.emulation.enabled());
      prov.mode = detail::asyncModeName(e.mode());
      prov.link.emplace_back("job", joined.source + ", " + std::to_string(world) + " processes (" + std::to_string(S) +
                                        " shards), store " + joined.master_addr + ":" +
                                        std::to_string(joined.master_port));
      prov.plugins.push_back({plugin->info(), instance->caps(DType::kF32), params, instance->resolvedParams()});
      writer->writeProvenance(prov);
    }
    detail::Progress progress(rank == 0 ? options_.progress : ProgressMode::kOff,
                              options_.progress_out ? *options_.progress_out : std::cerr, e.variant(), e.epochs(),
                              me->steps().total_steps, me->steps().steps_per_epoch);
    std::optional<detail::AsyncReport> report;
    if (writer) report.emplace(detail::AsyncReport{*writer, summary, progress});
    ranks.run([&](int) { me->run(report, ranks, joined.host); });
    progress.finish();
    if (writer) writer->markCompleted();
    return summary;
  } catch (const std::exception& x) {
    const std::string what = ranks.failed(x);
    if (me) me->stop();
    throw detail::tcpRunFailed(e, rank, world, writer, what);
  }
}

}  // namespace terse::runner

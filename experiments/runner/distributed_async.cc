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
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "core/comm/host_communicator.h"
#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/tcp/transport.h"
#include "core/common/crash.h"
#include "core/common/error.h"
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

using Clock = std::chrono::steady_clock;
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
    start_ = Clock::now();
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
  // Takes every report that arrived; throws InvalidPayload naming the rank for one that does not parse.
  bool pump();
  bool workersStopped() const;
  bool shardsFinished() const;
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
  std::thread shard_thread_;
  std::exception_ptr shard_error_;
  std::atomic<bool> shard_done_{false};

  // Rank 0's view of the others.
  struct Inbox {
    std::vector<std::byte> buffer;
    comm::Request recv;
    bool posted = false;
  };
  std::vector<Inbox> inbox_;
  std::vector<WorkerReport> latest_;
  std::vector<std::vector<double>> losses_;
  std::vector<double> left_s_;  // when rank 0 learned a worker stopped dead
  std::vector<bool> lost_;      // its process died: no more reports
  std::vector<std::map<int64_t, ShardReport>> shard_reports_;
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
  shard_thread_ = std::thread([this, host] {
    try {
      shard_->run();
    } catch (...) {
      shard_error_ = std::current_exception();
      // Tell every rank at once rather than leaving the workers to time out.
      data_.abort("server shard " + std::to_string(rank_) + " (rank " + std::to_string(rank_) + ", " + host +
                  ") failed");
    }
    shard_done_.store(true);
  });
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
    std::optional<train::ShardSnapshot> snap;
    while (!snap) {
      check();
      const bool stopped = shard_done_.load();
      snap = shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds(100));
      if (!snap && stopped) break;  // a point the workers never reached
    }
    if (!snap) break;
    sender_.send(kShardReportTag, shardReport(point, snap->params, shard_->stats(), start_));
  }
  joinShard();
  check();
  sender_.send(kShardReportTag, shardReport(-1, shard_->params(), shard_->stats(), start_));
  sender_.flush();
  awaitRelease(ctl_);
}

bool TcpAsyncRank::pump() {
  bool any = false;
  for (int r = 1; r < S_ + W_; ++r) {
    Inbox& in = inbox_[static_cast<std::size_t>(r)];
    const bool from_shard = r < S_;
    if (!from_shard && lost_[static_cast<std::size_t>(r - S_)]) continue;
    for (;;) {
      bool arrived = false;
      try {
        if (!in.posted) {
          in.recv = ctl_.irecv(
              r, comm::FrameMeta{comm::OpKind::kP2P, from_shard ? kShardReportTag : kWorkerReportTag, comm::kNoTensor},
              in.buffer);
          in.posted = true;
        }
        arrived = in.recv.test();
      } catch (const comm::CommError&) {
        if (from_shard || ctl_.aborted()) throw;
        // A worker process that died (an expendable rank): it left at its last report.
        const int w = r - S_;
        lost_[static_cast<std::size_t>(w)] = true;
        WorkerReport& last = latest_[static_cast<std::size_t>(w)];
        if (!last.done() && last.left_step() == 0) {
          last.set_left_step(std::max<int64_t>(1, last.steps()));
          left_s_[static_cast<std::size_t>(w)] = detail::since(start_);
        }
        any = true;
        break;
      }
      if (!arrived) break;
      in.posted = false;
      any = true;
      const auto n = static_cast<int>(in.recv.bytes());
      if (from_shard) {
        ShardReport rep;
        TERSE_CHECK(rep.ParseFromArray(in.buffer.data(), n), InvalidPayload,
                    "rank " << r << " (server shard " << r << ") sent an unreadable report of " << n << " bytes");
        const auto [b, e2] = plan_.ranges[static_cast<std::size_t>(r)];
        TERSE_CHECK(rep.params().size() == (e2 - b) * sizeof(float) && rep.dead_size() == W_, InvalidPayload,
                    "rank " << r << " (server shard " << r << ") sent a report of the wrong shape");
        if (rep.step() < 0)
          finals_[static_cast<std::size_t>(r)] = std::move(rep);
        else
          shard_reports_[static_cast<std::size_t>(r)][rep.step()] = std::move(rep);
      } else {
        WorkerReport rep;
        const int w = r - S_;
        TERSE_CHECK(rep.ParseFromArray(in.buffer.data(), n), InvalidPayload,
                    "rank " << r << " (worker " << w << ") sent an unreadable report of " << n << " bytes");
        auto& l = losses_[static_cast<std::size_t>(w)];
        if (!rep.done() && rep.left_step() == 0 && rep.steps() == static_cast<int64_t>(l.size()) + 1)
          l.push_back(rep.loss());
        if (rep.left_step() > 0 && left_s_[static_cast<std::size_t>(w)] == 0)
          left_s_[static_cast<std::size_t>(w)] = detail::since(start_);
        latest_[static_cast<std::size_t>(w)] = std::move(rep);
      }
    }
  }
  return any;
}

bool TcpAsyncRank::workersStopped() const {
  for (const auto& rep : latest_)
    if (!rep.done() && rep.left_step() == 0) return false;
  return true;
}

bool TcpAsyncRank::shardsFinished() const {
  bool finished = workersStopped() && shard_done_.load();
  for (int k = 1; k < S_ && finished; ++k) finished = finals_[static_cast<std::size_t>(k)].has_value();
  return finished;
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
// that global step as in process.
std::optional<detail::AsyncPoint> TcpAsyncRank::collect(int64_t point) {
  std::optional<train::ShardSnapshot> own;
  for (;;) {
    check();
    const bool any = pump();
    if (!own) own = shard_->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds(0));
    bool all = own.has_value();
    for (int k = 1; k < S_ && all; ++k) all = shard_reports_[static_cast<std::size_t>(k)].count(point) > 0;
    if (all) break;
    // Unreachable: every worker stopped and every shard is done without a snapshot of it.
    if (!own && shardsFinished()) return std::nullopt;
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<ShardReport> reports(static_cast<std::size_t>(S_));
  for (int k = 1; k < S_; ++k)
    reports[static_cast<std::size_t>(k)] =
        std::move(shard_reports_[static_cast<std::size_t>(k)].extract(point).mapped());
  assemble(own->params, [&](int k) -> const ShardReport& { return reports[static_cast<std::size_t>(k)]; });
  int64_t worker_steps = 0;
  for (const auto& r : latest_) worker_steps += r.steps();
  return detail::AsyncPoint{point, worker_steps, std::chrono::duration<double>(own->taken - start_).count()};
}

// The end: every worker stopped, every shard done and reported.
detail::AsyncPoint TcpAsyncRank::collectFinal() {
  for (;;) {
    check();
    const bool any = pump();
    if (shardsFinished()) break;
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  joinShard();
  check();
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
  shard_reports_.resize(static_cast<std::size_t>(S_));
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

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
#include <chrono>
#include <cstring>
#include <iostream>
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
#include "experiments/runner/async_report.pb.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
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

}  // namespace

RunSummary Runner::runTcpAsync(const Experiment& e) {
  const double timeout_s = comm::parseDuration(e.tcp().timeout());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000 + 0.5));
  const std::optional<comm::JobEnv> detected = comm::detectJobEnv();
  comm::JobEnv env;
  env.source = "single";
  if (detected) env = *detected;
  const int rank = env.rank;
  crash::setProcessRank(rank);
  const int world = env.world_size;
  const int S = e.parameter_server().servers();
  const int W = e.workers();
  primary_ = rank == 0;
  TERSE_CHECK(world == S + W, InvalidArgument,
              "variant '" << e.variant() << "': mode " << Experiment::Mode_Name(e.mode())
                          << " needs servers + workers = " << S << " + " << W << " = " << S + W
                          << " ranks but this job has " << world << " (from "
                          << (env.source == "single" ? "no launcher: a single process" : env.source)
                          << "); start it with `terse launch -n " << S + W << " -- terse run CONFIG`");
  if (!job_) job_ = std::make_shared<comm::Job>(comm::joinJob(timeout));
  const comm::JobEnv& joined = job_->env;
  const std::string prefix = "run" + std::to_string(tcp_runs_++) + "/" + e.study() + "/" + e.variant() + "/";
  const bool is_shard = rank < S;
  const int shard_index = rank;
  const int worker_index = rank - S;

  std::optional<results::ResultWriter> writer;
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  if (rank == 0) writer.emplace(root, e.study(), experiments::resultsSubfolder(e));
  RunSummary summary;
  summary.study = e.study();
  summary.variant = e.variant();
  if (writer) summary.dir = writer->dir();
  // The data transport lives in a communicator only so that a barrier on it, once aborted, throws the job's first
  // failure (communicator.h); the shard and the client use its transport directly.
  std::unique_ptr<comm::HostCommunicator> data_comm;
  comm::Transport* data = nullptr;
  std::unique_ptr<comm::HostCommunicator> control;
  std::unique_ptr<train::ParamServerShard> shard;
  std::thread shard_thread;
  std::exception_ptr shard_error;
  std::atomic<bool> shard_done{false};
  auto joinShard = [&] {
    if (shard_thread.joinable()) shard_thread.join();
  };
  try {
    if (writer) writer->writeConfig(experiments::toText(e));
    const auto start_time = results::isoTimeUtc();

    // ---- Setup: the same replica on every rank (shards take their initial range from it; rank 0 evaluates on it).
    auto dataset = dataFor(e);
    std::unique_ptr<train::Workload> model =
        workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), dataset);
    const train::PsPlan plan = detail::psPlan(e, model->params(), S);
    std::vector<float> flat(static_cast<std::size_t>(plan.total_numel));
    train::copyValuesOut(model->params(), flat);
    const train::StepPlan steps = detail::asyncStepPlan(e, model->numTrainExamples());
    const train::LrScheduleOptions lr = detail::asyncLrSchedule(e, steps);
    const std::vector<int64_t> points = detail::evalPoints(e, steps);

    comm::TcpOptions to = detail::tcpOptions(e, joined, rank, world, timeout, prefix);
    // Workers are expendable: a worker process that dies or goes silent is dropped by the shards, the job goes on.
    for (int r = S; r < world; ++r) to.expendable_ranks.push_back(r);
    data_comm = std::make_unique<comm::HostCommunicator>(comm::connectTcpTransport(to, job_->token, *job_->store));
    data = &data_comm->transport();
    comm::TcpOptions co = to;
    co.emulation = {};
    co.busy_poll_us = 0;  // bookkeeping off the critical path: its threads sleep rather than spin beside the trainer's
    co.store_prefix = prefix + "control/";
    control = std::make_unique<comm::HostCommunicator>(comm::connectTcpTransport(co, job_->token, *job_->store));
    comm::Transport& ctl = control->transport();
    const auto on_overrun = detail::abortOnOverrun([&](const std::string& reason) {
      const std::string why = "rank " + std::to_string(rank) + " (" + joined.host + ") failed: " + reason;
      data->abort(why);
      ctl.abort(why);
    });
    {
      // Every replica must start from the same parameters (same seed, same build).
      const uint64_t mine = train::parameterChecksum(model->params());
      std::vector<uint64_t> all(static_cast<std::size_t>(world));
      control->allgatherv(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)),
                          std::vector<uint64_t>(static_cast<std::size_t>(world), sizeof(uint64_t)));
      for (int r = 0; r < world; ++r)
        TERSE_CHECK(all[static_cast<std::size_t>(r)] == mine, InternalError,
                    "replica " << r << " starts with different parameters than replica " << rank
                               << ": do all ranks run the same build and config?");
    }

    auto plugin = options_.loader->loadCompressor(e.compressor().name());
    const Params params = experiments::pluginParams(e.compressor());
    std::shared_ptr<Compressor> instance = plugin->instantiate(params);
    const bool raw = detail::rawPushes(e);
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
    const auto run_start = Clock::now();
    ReportSender sender(ctl);

    if (!is_shard) {
      // ---- A worker.
      train::ClientOptions copts = detail::clientOptions(e);
      if (!raw) copts.compressor = instance;
      train::ParamServerClient client(*data, plan, worker_index, W, copts);
      train::AsyncWorker worker(*model, client, worker_index, W, detail::asyncWorkerOptions(e, worker_index));
      const int64_t fail_after = experiments::workerSettings(e, worker_index).fail_after_steps();
      WorkerReport rep;
      auto fill = [&] {
        rep.set_steps(worker.stepsDone());
        rep.set_compute_s(worker.totals().compute_s);
        rep.set_compress_s(worker.totals().compress_s);
        rep.set_comm_s(worker.totals().comm_s);
        rep.set_exposed_comm_s(worker.totals().exposed_comm_s);
        rep.set_step_time_s(worker.totals().step_s);
        rep.set_payload_bytes(client.payloadBytes());
        const auto t = data->traffic();
        rep.set_bytes_out(dataBytes(t, true));
        rep.set_bytes_in(dataBytes(t, false));
      };
      while (!worker.finished()) {
        if (fail_after > 0 && worker.stepsDone() >= fail_after) {
          rep.set_left_step(worker.stepsDone());
          break;  // silent from here on: no goodbye to the shards
        }
        const train::AsyncStepRecord rec = worker.step();
        fill();
        rep.set_loss(rec.loss);
        sender.send(kWorkerReportTag, rep);
      }
      if (rep.left_step() == 0) {
        worker.leave();
        rep.set_done(true);
      }
      fill();
      sender.send(kWorkerReportTag, rep);
      sender.flush();
      awaitRelease(ctl);  // rank 0 wrote its last record
      return summary;
    }

    // ---- A shard.
    train::ServerOptions so = detail::serverOptions(e, lr, points);
    if (!raw) so.compressor = instance;
    const auto [begin, end] = plan.ranges[static_cast<std::size_t>(shard_index)];
    shard =
        std::make_unique<train::ParamServerShard>(*data, plan, shard_index, W,
                                                  std::vector<float>(flat.begin() + static_cast<std::ptrdiff_t>(begin),
                                                                     flat.begin() + static_cast<std::ptrdiff_t>(end)),
                                                  so);
    shard_thread = std::thread([&] {
      try {
        shard->run();
      } catch (...) {
        shard_error = std::current_exception();
        // Tell every rank at once rather than leaving the workers to time out.
        data->abort("server shard " + std::to_string(shard_index) + " (rank " + std::to_string(rank) + ", " +
                    joined.host + ") failed");
      }
      shard_done.store(true);
    });
    auto check = [&] {
      if (shard_error) std::rethrow_exception(shard_error);
      // Barriers on an aborted communicator throw its first failure at once.
      if (data->aborted()) data_comm->barrier();
      if (ctl.aborted()) control->barrier();
    };

    if (rank != 0) {
      for (const int64_t point : points) {
        std::optional<train::ShardSnapshot> snap;
        while (!snap) {
          check();
          const bool stopped = shard_done.load();
          snap = shard->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds(100));
          if (!snap && stopped) break;  // a point the workers never reached
        }
        if (!snap) break;
        sender.send(kShardReportTag, shardReport(point, snap->params, shard->stats(), run_start));
      }
      joinShard();
      check();
      sender.send(kShardReportTag, shardReport(-1, shard->params(), shard->stats(), run_start));
      sender.flush();
      awaitRelease(ctl);
      return summary;
    }

    // ---- Rank 0: shard 0, and the monitor that writes the records.
    struct Inbox {
      std::vector<std::byte> buffer;
      comm::Request recv;
      bool posted = false;
    };
    std::vector<Inbox> inbox(static_cast<std::size_t>(world));
    std::vector<WorkerReport> latest(static_cast<std::size_t>(W));
    std::vector<std::vector<double>> losses(static_cast<std::size_t>(W));
    std::vector<double> left_s(static_cast<std::size_t>(W), 0);  // when rank 0 learned a worker stopped dead
    std::vector<bool> lost(static_cast<std::size_t>(W), false);  // its process died: no more reports
    std::vector<std::map<int64_t, ShardReport>> shard_reports(static_cast<std::size_t>(S));
    std::vector<std::optional<ShardReport>> finals(static_cast<std::size_t>(S));
    for (int r = 1; r < world; ++r) {
      const bool from_shard = r < S;
      std::size_t cap = kWorkerReportMax;
      if (from_shard) {
        const auto [b, e2] = plan.ranges[static_cast<std::size_t>(r)];
        cap = (e2 - b) * sizeof(float) + kShardReportSlack;
      }
      inbox[static_cast<std::size_t>(r)].buffer.resize(cap);
    }
    // Takes every report that arrived; throws InvalidPayload naming the rank for one that does not parse.
    auto pump = [&] {
      bool any = false;
      for (int r = 1; r < world; ++r) {
        Inbox& in = inbox[static_cast<std::size_t>(r)];
        const bool from_shard = r < S;
        if (!from_shard && lost[static_cast<std::size_t>(r - S)]) continue;
        for (;;) {
          bool arrived = false;
          try {
            if (!in.posted) {
              in.recv = ctl.irecv(
                  r,
                  comm::FrameMeta{comm::OpKind::kP2P, from_shard ? kShardReportTag : kWorkerReportTag, comm::kNoTensor},
                  in.buffer);
              in.posted = true;
            }
            arrived = in.recv.test();
          } catch (const comm::CommError&) {
            if (from_shard || ctl.aborted()) throw;
            // A worker process that died (an expendable rank): it left at its last report.
            const int w = r - S;
            lost[static_cast<std::size_t>(w)] = true;
            WorkerReport& last = latest[static_cast<std::size_t>(w)];
            if (!last.done() && last.left_step() == 0) {
              last.set_left_step(std::max<int64_t>(1, last.steps()));
              left_s[static_cast<std::size_t>(w)] = detail::since(run_start);
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
            const auto [b, e2] = plan.ranges[static_cast<std::size_t>(r)];
            TERSE_CHECK(rep.params().size() == (e2 - b) * sizeof(float) && rep.dead_size() == W, InvalidPayload,
                        "rank " << r << " (server shard " << r << ") sent a report of the wrong shape");
            if (rep.step() < 0)
              finals[static_cast<std::size_t>(r)] = std::move(rep);
            else
              shard_reports[static_cast<std::size_t>(r)][rep.step()] = std::move(rep);
          } else {
            WorkerReport rep;
            const int w = r - S;
            TERSE_CHECK(rep.ParseFromArray(in.buffer.data(), n), InvalidPayload,
                        "rank " << r << " (worker " << w << ") sent an unreadable report of " << n << " bytes");
            auto& l = losses[static_cast<std::size_t>(w)];
            if (!rep.done() && rep.left_step() == 0 && rep.steps() == static_cast<int64_t>(l.size()) + 1)
              l.push_back(rep.loss());
            if (rep.left_step() > 0 && left_s[static_cast<std::size_t>(w)] == 0)
              left_s[static_cast<std::size_t>(w)] = detail::since(run_start);
            latest[static_cast<std::size_t>(w)] = std::move(rep);
          }
        }
      }
      return any;
    };
    auto workersStopped = [&] {
      for (const auto& rep : latest)
        if (!rep.done() && rep.left_step() == 0) return false;
      return true;
    };
    detail::Progress progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr,
                              e.variant(), e.epochs(), steps.total_steps, steps.steps_per_epoch);
    int64_t last_done = 0;
    // One record at global step `done` with the parameters in `flat`.
    auto record = [&](int64_t done, double wall_s, const std::vector<detail::ShardTally>& shard_tally) {
      train::copyValuesIn(model->params(), flat);
      const train::EvalResult ev = model->evaluate(0);
      std::vector<detail::WorkerTally> tally(static_cast<std::size_t>(W));
      int64_t worker_steps = 0;
      for (int w = 0; w < W; ++w) {
        const WorkerReport& r = latest[static_cast<std::size_t>(w)];
        detail::WorkerTally& t = tally[static_cast<std::size_t>(w)];
        t.steps = r.steps();
        t.times.compute_s = r.compute_s();
        t.times.compress_s = r.compress_s();
        t.times.comm_s = r.comm_s();
        t.times.exposed_comm_s = r.exposed_comm_s();
        t.times.step_s = r.step_time_s();
        t.payload_bytes = r.payload_bytes();
        t.bytes_out = r.bytes_out();
        t.bytes_in = r.bytes_in();
        if (r.left_step() > 0) {
          t.left_step = r.left_step();
          t.left_s = left_s[static_cast<std::size_t>(w)];
        }
        worker_steps += r.steps();
      }
      // train_loss as in process: worker 0's losses of steps [last_done, done), else every worker's.
      double loss = 0;
      int64_t count = 0;
      for (int w = 0; w < W && count == 0; ++w) {
        const auto& l = losses[static_cast<std::size_t>(w)];
        for (int64_t i = last_done; i < std::min<int64_t>(done, static_cast<int64_t>(l.size())); ++i) {
          loss += l[static_cast<std::size_t>(i)];
          ++count;
        }
        if (w == 0 && count > 0) break;
      }
      results::MetricsRecord m = detail::evalRecord(done, steps.steps_per_epoch, ev, loss, count,
                                                    train::learningRate(lr, std::max<int64_t>(0, done - 1)));
      last_done = done;
      m.wall_s = wall_s;
      detail::fillAsyncRecord(m, worker_steps, tally, shard_tally, {});
      writer->append(m);
      detail::noteRecord(summary, m, ev, writer->records());
      progress.update(done, ev.accuracy, m.wire_bytes_per_worker, m.wall_s, true);
    };
    auto ownTally = [&] {
      const train::ServerStats st = shard->stats();
      ShardReport r = shardReport(0, {}, st, run_start);
      return tallyOf(r);
    };

    for (const int64_t point : points) {
      std::optional<train::ShardSnapshot> own;
      bool reachable = true;
      for (;;) {
        check();
        const bool any = pump();
        if (!own) own = shard->takeSnapshot(static_cast<uint64_t>(point), std::chrono::milliseconds(0));
        bool all = own.has_value();
        for (int k = 1; k < S && all; ++k) all = shard_reports[static_cast<std::size_t>(k)].count(point) > 0;
        if (all) break;
        // Unreachable: every worker stopped and every shard is done without a snapshot of it.
        bool finished = workersStopped() && shard_done.load() && !own;
        for (int k = 1; k < S && finished; ++k) finished = finals[static_cast<std::size_t>(k)].has_value();
        if (finished) {
          reachable = false;
          break;
        }
        if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!reachable) break;
      std::vector<detail::ShardTally> shard_tally;
      std::copy(own->params.begin(), own->params.end(), flat.begin());
      shard_tally.push_back(ownTally());
      for (int k = 1; k < S; ++k) {
        auto node = shard_reports[static_cast<std::size_t>(k)].extract(point);
        const ShardReport& rep = node.mapped();
        std::memcpy(flat.data() + plan.ranges[static_cast<std::size_t>(k)].first, rep.params().data(),
                    rep.params().size());
        shard_tally.push_back(tallyOf(rep));
      }
      record(point, std::chrono::duration<double>(own->taken - run_start).count(), shard_tally);
    }
    // The end: every worker stopped, every shard done and reported.
    for (;;) {
      check();
      const bool any = pump();
      bool finished = workersStopped() && shard_done.load();
      for (int k = 1; k < S && finished; ++k) finished = finals[static_cast<std::size_t>(k)].has_value();
      if (finished) break;
      if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    joinShard();
    check();
    {
      std::vector<detail::ShardTally> shard_tally;
      const auto own = shard->params();
      std::copy(own.begin(), own.end(), flat.begin());
      shard_tally.push_back(ownTally());
      for (int k = 1; k < S; ++k) {
        const ShardReport& rep = *finals[static_cast<std::size_t>(k)];
        std::memcpy(flat.data() + plan.ranges[static_cast<std::size_t>(k)].first, rep.params().data(),
                    rep.params().size());
        shard_tally.push_back(tallyOf(rep));
      }
      int64_t worker_steps = 0;
      for (const auto& r : latest) worker_steps += r.steps();
      record(worker_steps / W, detail::since(run_start), shard_tally);
    }
    progress.finish();
    // Not a barrier: a lost worker cannot take part in one. Every rank still connected is told to leave.
    for (int r = 1; r < world; ++r)
      if (r < S || !lost[static_cast<std::size_t>(r - S)]) {
        try {
          ctl.send(r, comm::FrameMeta{comm::OpKind::kP2P, kReleaseTag, comm::kNoTensor}, {});
        } catch (const comm::CommError&) {
          if (ctl.aborted()) throw;  // otherwise a worker lost just now: nothing to tell it
        }
      }
    writer->markCompleted();
    return summary;
  } catch (const std::exception& x) {
    std::string what = x.what();
    if (data != nullptr && data->aborted()) {
      // The job-wide first reason travels on the data transport's abort notices (distributed.cc explains).
      try {
        data_comm->barrier();
      } catch (const std::exception& first) {
        what = first.what();
      }
    }
    const std::string reason = "rank " + std::to_string(rank) + " (" + joined.host + ") failed: " + what;
    if (data != nullptr) data->abort(reason);
    if (control) control->abort(reason);
    if (shard) shard->stop();
    joinShard();
    if (writer) writer->markFailed(what);
    throw RunFailed("variant '" + e.variant() + "' of study '" + e.study() + "' failed on rank " +
                        std::to_string(rank) + " of " + std::to_string(world) +
                        (writer ? " (partial results in " + writer->dir().string() + ")" : std::string()) + ": " + what,
                    writer ? writer->dir() : std::filesystem::path());
  }
}

}  // namespace terse::runner

// The runner's multi-process path (transports TCP and NCCL): this process is one rank of a job started by `terse
// launch`, srun, mpirun or scripts/netns-cluster (core/comm/job.h reads which rank from the environment). Each rank
// builds its own replica, compressor instance, pipelines and SyncTrainer exactly as the in-process runner builds rank
// r's (the helpers in runner_detail.h), over a tcp transport (core/comm/tcp/transport.h) connected through the job's
// store under a key prefix of its own per variant, so the variants of a study get fresh transports.
//
// What the in-process runner does through shared memory at an evaluation point -- every rank publishes its wire and
// payload bytes, parameter checksum and time totals, rank 0 checks the replicas and writes the record -- goes over a
// communicator here: after draining, every rank allgathers a fixed record of 8-byte words (kCounterWords). Rank 0
// then evaluates and appends the metrics record; the others go straight on to the next step, as in-process.
//
// That exchange runs on a second, control-only communicator (its own tcp transport, no link emulation), never on the
// trainer's: the trainer's communication thread issues collectives of its own (the scheduler's negotiation rounds)
// whose timing differs per rank, so a collective issued from the runner's thread on the same communicator would be
// ordered differently on different ranks -- a mismatch, not a measurement. It also keeps the exchange out of the
// trainer's byte accounting; with the transport's own control frames (handshake, heartbeats) left out too, a tcp run
// reports exactly the wire bytes the in-process run of the same config reports. A dead rank fails both transports.
//
// Transport NCCL (one process per GPU, builds with CUDA and NCCL): the same path with the trainer's communicator an
// NcclCommunicator (core/comm/nccl_communicator.h) bootstrapped through the job's store, the device picked by local
// rank; the workload is the model's CUDA version on that device (Workload::device()), and every tensor's codec runs
// on the communicator's stream with device buffers, so gradients never leave the GPU. The control communicator stays
// TCP (host words). Link emulation does not apply (the config refuses it): NCCL runs at the hardware's speed, and its
// byte counts are the ring model nccl_communicator.h documents.
//
// Results: rank 0 writes the results folder; other ranks write nothing. A failure on any rank aborts the transport on
// every rank (the first reason wins, naming the rank and host); rank 0 marks the folder failed and keeps every record
// already written. A rank 0 that dies leaves the folder "running" with its records intact (flushed per record).
#include <chrono>
#include <cstring>
#include <iostream>
#include <sstream>

#include "core/comm/host_communicator.h"
#if defined(TERSE_HAVE_NCCL)
#include "core/comm/nccl_communicator.h"
#endif
#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/tcp/transport.h"
#include "core/comm/transport.h"
#include "core/common/crash.h"
#include "core/common/error.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/loader.h"
#include "core/train/sync_trainer.h"
#include "core/train/trace.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

using Clock = std::chrono::steady_clock;
using experiments::Experiment;

// One rank's counters at an evaluation point, as 8-byte words (doubles bit-copied), in this order.
enum CounterWord : std::size_t {
  kWire,
  kPayload,
  kChecksum,
  kCompute,
  kCompress,
  kDecompress,
  kComm,
  kExposedComm,
  kStep,
  kControl,  // the scheduler negotiation's bytes (kNegotiationTensor)
  kRounds,   // and its rounds
  kCounterWords
};
using Counters = std::array<uint64_t, kCounterWords>;

uint64_t bitsOf(double v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}
double doubleOf(uint64_t u) {
  double v = 0;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// Bytes this rank sent that the in-process transport would have sent too: everything but the tcp transport's own
// control frames (handshake, heartbeats, abort notices) and the scheduler negotiation's (sync_trainer.h, left out of
// the in-process runner's count too).
uint64_t dataBytesSent(const comm::Communicator& comm) {
  const comm::RankTraffic t = comm.traffic();
  return t.sent.total().bytes - t.sent.kind(comm::OpKind::kControl).bytes -
         t.sent.tensor(train::kNegotiationTensor).bytes;
}

// The address this rank's transport listens on (experiment.proto Tcp.bind_address).
std::string bindAddressFor(const Experiment& e, const comm::JobEnv& env) {
  if (!e.tcp().bind_address().empty()) return e.tcp().bind_address();
  if (const char* b = std::getenv("TERSE_BIND_ADDR"); b != nullptr && *b != '\0') return b;
  return comm::isLoopbackAddress(env.master_addr) ? "127.0.0.1" : "0.0.0.0";
}

// Every rank's counters, in rank order, over the control communicator.
std::vector<Counters> gatherCounters(comm::Communicator& control, const Counters& mine) {
  const int world = control.size();
  std::vector<Counters> all(static_cast<std::size_t>(world));
  const std::vector<uint64_t> sizes(static_cast<std::size_t>(world), sizeof(Counters));
  control.allgatherv(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), sizes);
  return all;
}

}  // namespace

comm::TcpOptions detail::tcpOptions(const Experiment& e, const comm::JobEnv& joined, int rank, int world,
                                    std::chrono::milliseconds timeout, const std::string& prefix) {
  comm::TcpOptions to;
  to.rank = rank;
  to.world_size = world;
  to.bind_address = bindAddressFor(e, joined);
  if (const char* a = std::getenv("TERSE_ADVERTISE_ADDR"); a != nullptr) to.advertise_address = a;
  to.timeout = timeout;
  to.socket_buffer_bytes = e.tcp().socket_buffer_bytes();
  to.emulation = experiments::emulationConfig(e);
  to.store_prefix = prefix;
  to.host_label = joined.host;
  return to;
}

RunSummary Runner::runTcp(const Experiment& e) {
  const bool nccl = e.transport() == Experiment::NCCL;
  const char* transport_name = nccl ? "nccl" : "tcp";
  TERSE_CHECK(e.mode() == Experiment::SYNC, InvalidArgument,
              "this path runs mode SYNC only, got " << Experiment::Mode_Name(e.mode()));
#if !defined(TERSE_HAVE_NCCL)
  TERSE_CHECK(!nccl, Unsupported,
              "variant '" << e.variant()
                          << "': transport NCCL needs a terse built with CUDA and NCCL (nvcc and libnccl found when "
                             "configuring); this build has neither");
#endif
  const double timeout_s = comm::parseDuration(e.tcp().timeout());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000 + 0.5));
  // The job's size is checked before joining it, so that every rank of a mismatched job fails at once with the same
  // message instead of waiting for a store that rank 0 never opens.
  const std::optional<comm::JobEnv> detected = comm::detectJobEnv();
  comm::JobEnv env;  // no launcher variables: a job of one process
  env.source = "single";
  if (detected) env = *detected;
  const int rank = env.rank;
  crash::setProcessRank(rank);
  const int world = env.world_size;
  primary_ = rank == 0;
  TERSE_CHECK(world == e.workers(), InvalidArgument,
              "variant '" << e.variant() << "': the config has workers = " << e.workers() << " but this job has "
                          << world << " rank(s) (from "
                          << (env.source == "single" ? "no launcher: a single process" : env.source)
                          << "); start it with `terse launch -n " << e.workers()
                          << " -- terse run CONFIG` (or srun/mpirun with that many tasks), or change workers");
  if (!job_) job_ = std::make_shared<comm::Job>(comm::joinJob(timeout));
  const comm::JobEnv& joined = job_->env;
  const std::string prefix = "run" + std::to_string(tcp_runs_++) + "/" + e.study() + "/" + e.variant() + "/";

  // Rank 0 owns the results folder; the others write nothing.
  std::optional<results::ResultWriter> writer;
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  if (rank == 0) writer.emplace(root, e.study(), experiments::resultsSubfolder(e));
  RunSummary summary;
  summary.study = e.study();
  summary.variant = e.variant();
  if (writer) summary.dir = writer->dir();
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::HostCommunicator> control;
  comm::Transport* data_link = nullptr;  // the trainer's transport (owned by comm), for its abort reason
  try {
    if (writer) writer->writeConfig(experiments::toText(e));
    const auto start_time = results::isoTimeUtc();

    // ---- Setup: this rank's replica, compressor instance, pipelines and trainer (as runner.cc builds rank r's).
    // The communicator first: with NCCL it picks this rank's GPU, where the workload is then built.
    const comm::TcpOptions to = detail::tcpOptions(e, joined, rank, world, timeout, prefix);
    int device = -1;
    if (nccl) {
#if defined(TERSE_HAVE_NCCL)
      comm::NcclOptions no = comm::ncclOptionsFromJob(joined, prefix);
      no.timeout = timeout;  // tcp.timeout bounds the bootstrap too: one knob for "a peer is not coming"
      auto nc = comm::connectNcclCommunicator(no, *job_->store);
      device = nc->device();
      comm = std::move(nc);
#endif
    } else {
      std::unique_ptr<comm::Transport> data_transport = comm::connectTcpTransport(to, job_->token, *job_->store);
      data_link = data_transport.get();
      comm = std::make_unique<comm::HostCommunicator>(std::move(data_transport), experiments::hostCommOptions(e));
    }

    auto data = dataFor(e);
    workloads::WorkloadOptions wo = detail::workloadOptions(e);
    wo.device = device;
    std::unique_ptr<train::Workload> model = workloads::makeWorkload(e.workload().name(), wo, data);
    const uint64_t init_checksum = train::parameterChecksum(model->params());

    auto plugin = options_.loader->loadCompressor(e.compressor().name());
    const Params params = experiments::pluginParams(e.compressor());
    const CodecOptions codec_options = experiments::codecOptions(e);

    comm::TcpOptions co = to;
    co.emulation = {};    // bookkeeping, not the experiment: in-process it is shared memory
    co.busy_poll_us = 0;  // rare and off the critical path: its threads sleep rather than spin beside the trainer's
    co.store_prefix = prefix + "control/";
    control = std::make_unique<comm::HostCommunicator>(comm::connectTcpTransport(co, job_->token, *job_->store));
    // A plugin call past plugin_timeout: tell every other rank now (the process then ends, detail::PluginWatch).
    const auto on_overrun = detail::abortOnOverrun([&](const std::string& reason) {
      const std::string why = "rank " + std::to_string(rank) + " (" + joined.host + ") failed: " + reason;
      if (comm) comm->abort(why);
      if (control) control->abort(why);
    });

    // Every replica must start from the same parameters (same seed, same build): checked once, up front.
    {
      Counters c{};
      c[kChecksum] = init_checksum;
      const auto all = gatherCounters(*control, c);
      for (int r = 0; r < world; ++r) {
        TERSE_CHECK(all[static_cast<std::size_t>(r)][kChecksum] == init_checksum, InternalError,
                    "replica " << r << " of workload '" << e.workload().name()
                               << "' starts with different parameters than replica " << rank << " (same seed "
                               << e.seed() << "): do all ranks run the same build and config?");
      }
    }

    auto sched_plugin = options_.loader->loadScheduler(e.scheduler().name());
    const Params sched_params = experiments::pluginParams(e.scheduler());
    std::shared_ptr<Compressor> instance = plugin->instantiate(params);
    train::SyncTrainerOptions topts = detail::trainerOptions(e);
    topts.slowdown = experiments::workerSettings(e, rank).slowdown();
    std::unique_ptr<train::TraceRecorder> trace;
    if (e.trace()) {
      trace = std::make_unique<train::TraceRecorder>(rank, Clock::now());
      topts.trace = trace.get();
    }
    // Every rank writes its own, into the variant's folder (on one host, rank 0's: it collects them all).
    detail::StepTraceFiles step_trace(e, root / e.study() / experiments::resultsSubfolder(e), false);
    topts.step_trace = step_trace.add(Clock::now());
    comm::Communicator& comm_ref = *comm;
    auto pipelines = [&comm_ref, instance, seed = e.seed(), codec_options](const TensorInfo& info) {
      return std::make_unique<CompressionPipeline>(
          makeCodec(instance, info, seed, codec_options, comm_ref.deviceStream()), comm_ref);
    };
    auto trainer = std::make_unique<train::SyncTrainer>(*model, *comm, std::move(pipelines), topts,
                                                        sched_plugin->instantiate(sched_params));
    // Each rank keeps its own timeline; in a shared folder (one host) rank 0's folder collects them all.
    struct TraceFile {
      train::TraceRecorder* trace;
      std::filesystem::path path;
      ~TraceFile() {
        if (trace == nullptr) return;
        try {
          trace->write(path);
        } catch (const std::exception& x) {
          std::cerr << "warning: " << x.what() << '\n';
        }
      }
    } trace_file{trace.get(), root / e.study() / e.variant() / ("trace.rank" + std::to_string(rank) + ".json")};

    if (writer) {
      // rank 0's host; the other ranks' hosts are in the job's messages
      results::Provenance prov = detail::baseProvenance(e, transport_name, world, start_time, options_.terse_version,
                                                        !nccl && to.emulation.enabled());
      if (device >= 0) prov.gemm = "cublas";
      prov.link.emplace_back("job", joined.source + ", " + std::to_string(world) + " processes, store " +
                                        joined.master_addr + ":" + std::to_string(joined.master_port));
      prov.plugins.push_back({plugin->info(), instance->caps(DType::kF32), params, instance->resolvedParams()});
      prov.plugins.push_back(detail::schedulerRecord(*sched_plugin, sched_params));
      writer->writeProvenance(prov);
    }

    // ---- The run.
    const int64_t total = trainer->totalSteps();
    const int64_t per_epoch = trainer->stepsPerEpoch();
    const int64_t every = e.eval().every_steps();
    const bool per_epoch_eval = e.eval().per_epoch();
    auto isEvalPoint = [&](int64_t done) {
      return (every > 0 && done % every == 0) || (per_epoch_eval && done % per_epoch == 0) || done == total;
    };
    detail::Progress progress(rank == 0 ? options_.progress : ProgressMode::kOff,
                              options_.progress_out ? *options_.progress_out : std::cerr, e.variant(), e.epochs(),
                              total, per_epoch);
    const auto run_start = Clock::now();
    double loss_since = 0;
    int64_t steps_since = 0;
    while (!trainer->finished()) {
      const train::StepRecord rec = trainer->step();
      const int64_t done = rec.step + 1;
      loss_since += rec.loss;
      ++steps_since;
      if (!isEvalPoint(done)) {
        progress.update(done, summary.records > 0 ? summary.final_accuracy : -1, dataBytesSent(*comm),
                        detail::since(run_start), false);
        continue;
      }
      // Communication of the last step overlaps the next one; an evaluation point needs all of it done first.
      trainer->drain();
      const train::TrainerTotals totals = trainer->totals();
      Counters mine{};
      mine[kWire] = dataBytesSent(*comm);
      mine[kPayload] = trainer->payloadBytes();
      mine[kChecksum] = trainer->checksum();
      mine[kCompute] = bitsOf(totals.times.compute_s);
      mine[kCompress] = bitsOf(totals.times.compress_s);
      mine[kDecompress] = bitsOf(totals.times.decompress_s);
      mine[kComm] = bitsOf(totals.times.comm_s);
      mine[kExposedComm] = bitsOf(totals.times.exposed_comm_s);
      mine[kStep] = bitsOf(totals.times.step_s);
      const train::Negotiation nego = trainer->negotiation();
      mine[kControl] = nego.bytes;
      mine[kRounds] = nego.rounds;
      const std::vector<Counters> all = gatherCounters(*control, mine);
      if (rank != 0) continue;

      for (int r = 1; r < world; ++r) {
        const uint64_t theirs = all[static_cast<std::size_t>(r)][kChecksum];
        TERSE_CHECK(theirs == all[0][kChecksum], InternalError,
                    "replicas diverged: after step " << done << " rank " << r << "'s parameters differ from rank 0's"
                                                     << " (checksums " << theirs << " vs " << all[0][kChecksum] << ")");
      }
      const train::EvalResult ev = model->evaluate(0);
      results::MetricsRecord m = detail::evalRecord(done, per_epoch, ev, loss_since, steps_since, rec.lr);
      uint64_t wire = 0, payload = 0, control_bytes = 0, rounds = 0;
      double compute = 0, compress = 0, decompress = 0, comm_s = 0, exposed = 0, step_s = 0;
      for (const auto& c : all) {
        wire += c[kWire];
        payload += c[kPayload];
        control_bytes += c[kControl];
        rounds += c[kRounds];
        compute += doubleOf(c[kCompute]);
        compress += doubleOf(c[kCompress]);
        decompress += doubleOf(c[kDecompress]);
        comm_s += doubleOf(c[kComm]);
        exposed += doubleOf(c[kExposedComm]);
        step_s += doubleOf(c[kStep]);
      }
      const auto w = static_cast<uint64_t>(world);
      const double n = static_cast<double>(done) * world;
      m.wire_bytes_per_worker = wire / w;
      m.payload_bytes_per_worker = payload / w;
      m.control_bytes_per_worker = static_cast<double>(control_bytes) / world;
      m.negotiation_rounds_per_worker = static_cast<double>(rounds) / world;
      m.wall_s = detail::since(run_start);
      m.compute_s_per_step = compute / n;
      m.compress_s_per_step = compress / n;
      m.decompress_s_per_step = decompress / n;
      m.comm_s_per_step = comm_s / n;
      m.exposed_comm_s_per_step = exposed / n;
      m.step_s_per_step = step_s / n;
      writer->append(m);
      loss_since = 0;
      steps_since = 0;
      detail::noteRecord(summary, m, ev, writer->records());
      progress.update(done, ev.accuracy, m.wire_bytes_per_worker, m.wall_s, true);
    }
    progress.finish();
    // Everyone leaves the variant together, after rank 0's last record: a rank that ran ahead into the next variant's
    // connection setup would otherwise spend its timeout waiting for rank 0's final evaluation.
    control->barrier();
    // Trainers own communication threads that use the communicator: stop them before it goes.
    trainer.reset();
    data_link = nullptr;
    comm.reset();  // a clean goodbye: peers see an orderly close, not a dead rank
    control.reset();
    if (writer) writer->markCompleted();
    return summary;
  } catch (const std::exception& x) {
    std::string what = x.what();
    // A dead rank fails both transports, and which one this rank notices first is a race: the control channel may
    // only see the next rank hang up, while the trainer's transport holds the job-wide first reason (the abort notices
    // travel there). Report that one when there is one.
    if (data_link != nullptr && data_link->aborted() && comm) {
      try {
        comm->barrier();  // on an aborted communicator: throws at once, naming the first failure (communicator.h)
      } catch (const std::exception& first) {
        what = first.what();
      }
    }
    // Tell every other rank at once (the first reason wins job-wide) instead of letting them find out by timeout.
    const std::string reason = "rank " + std::to_string(rank) + " (" + joined.host + ") failed: " + what;
    if (comm) comm->abort(reason);
    if (control) control->abort(reason);
    if (writer) writer->markFailed(what);
    throw RunFailed("variant '" + e.variant() + "' of study '" + e.study() + "' failed on rank " +
                        std::to_string(rank) + " of " + std::to_string(world) +
                        (writer ? " (partial results in " + writer->dir().string() + ")" : std::string()) + ": " + what,
                    writer ? writer->dir() : std::filesystem::path());
  }
}

}  // namespace terse::runner

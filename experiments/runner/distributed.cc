// The runner's multi-process path (transports TCP and NCCL): this process is one rank of a job started by `terse
// launch`, srun, mpirun or scripts/netns-cluster (core/comm/job.h reads which rank from the environment). Each rank
// builds its own replica, compressor instance, pipelines and SyncTrainer exactly as the in-process runner builds rank
// r's (the helpers in runner_detail.h), over a tcp transport (core/comm/tcp/transport.h) connected through the job's
// store under a key prefix of its own per variant, so the variants of a study get fresh transports.
//
// The rank's loop is the in-process runner's (rank_driver.h: SyncRankDriver, the same code for every World): at an
// evaluation point every rank sends its slot to rank 0 over the control channel, a tcp transport of its own (no link
// emulation); rank 0 checks the replicas, evaluates and appends the record, the others go straight on to the next
// step. With the transport's own control frames (handshake, heartbeats) left out of the count too, a tcp run reports
// exactly the wire bytes the in-process run of the same config reports. A dead rank fails both transports; this
// process is a ProcessWorld (world.h), which tells every other rank of a failure at once.
//
// Transport NCCL (one process per GPU, builds with CUDA and NCCL): the same path with the trainer's communicator an
// NcclCommunicator (core/comm/nccl_communicator.h) bootstrapped through the job's store, the device picked by local
// rank; the workload is the model's CUDA version on that device (Workload::device()), and every tensor's codec runs
// on the communicator's stream with device buffers, so gradients never leave the GPU. The control channel stays a
// tcp transport (host words). Link emulation does not apply (the config refuses it): NCCL runs at the hardware's speed,
// and its byte counts are the ring model nccl_communicator.h documents.
//
// Results: rank 0 writes the results folder; other ranks write nothing. A failure on any rank aborts the transport on
// every rank (the first reason wins, naming the rank and host); rank 0 marks the folder failed and keeps every record
// already written. A rank 0 that dies leaves the folder "running" with its records intact (flushed per record).
#include <chrono>
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
#include "experiments/runner/rank_driver.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/runner/world.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

using experiments::Experiment;

// The address this rank's transport listens on (experiment.proto Tcp.bind_address).
std::string bindAddressFor(const Experiment& e, const comm::JobEnv& env) {
  if (!e.tcp().bind_address().empty()) return e.tcp().bind_address();
  if (const char* b = std::getenv("TERSE_BIND_ADDR"); b != nullptr && *b != '\0') return b;
  return comm::isLoopbackAddress(env.master_addr) ? "127.0.0.1" : "0.0.0.0";
}

// The job this process is a rank of (mode SYNC; NCCL only in a build that has it), checked against the config before
// joining it, so that every rank of a
// mismatched job fails at once with the same message instead of waiting for a store that rank 0 never opens.
comm::JobEnv checkedJobEnv(const Experiment& e) {
  TERSE_CHECK(e.mode() == Experiment::SYNC, InvalidArgument,
              "this path runs mode SYNC only, got " << Experiment::Mode_Name(e.mode()));
#if !defined(TERSE_HAVE_NCCL)
  TERSE_CHECK(e.transport() != Experiment::NCCL, Unsupported,
              "variant '" << e.variant()
                          << "': transport NCCL needs a terse built with CUDA and NCCL (nvcc and libnccl found when "
                             "configuring); this build has neither");
#endif
  const std::optional<comm::JobEnv> detected = comm::detectJobEnv();
  comm::JobEnv env;  // no launcher variables: a job of one process
  env.source = "single";
  if (detected) env = *detected;
  crash::setProcessRank(env.rank);
  TERSE_CHECK(env.world_size == e.workers(), InvalidArgument,
              "variant '" << e.variant() << "': the config has workers = " << e.workers() << " but this job has "
                          << env.world_size << " rank(s) (from " << comm::describeJobSource(env)
                          << "); start it with `terse launch -n " << e.workers()
                          << " -- terse run CONFIG` (or srun/mpirun with that many tasks), or change workers");
  return env;
}

// The trainer's communicator: NCCL (which picks this rank's GPU: `device`) or a HostCommunicator over tcp (its
// transport in `data_link`, for the job's first failure reason).
std::unique_ptr<comm::Communicator> connectTrainerComm(const Experiment& e, const comm::TcpOptions& to, comm::Job& job,
                                                       const std::string& prefix, int& device,
                                                       comm::Transport*& data_link) {
  (void)prefix;  // NCCL's store keys, and the device it picks: unused in a build without it
  (void)device;
  if (e.transport() == Experiment::NCCL) {
#if defined(TERSE_HAVE_NCCL)
    comm::NcclOptions no = comm::ncclOptionsFromJob(job.env, prefix);
    no.timeout = to.timeout;  // tcp.timeout bounds the bootstrap too: one knob for "a peer is not coming"
    auto nc = comm::connectNcclCommunicator(no, *job.store);
    device = nc->device();
    return nc;
#endif
  }
  std::unique_ptr<comm::Transport> data_transport = comm::connectTcpTransport(to, job.token, *job.store);
  data_link = data_transport.get();
  return std::make_unique<comm::HostCommunicator>(std::move(data_transport), experiments::hostCommOptions(e));
}

// What rank 0 writes to provenance.json before the plugins: rank 0's host (the other ranks' are in the job's
// messages), the job, and cuBLAS as the GEMM when the workload runs on a device.
results::Provenance jobProvenance(const Experiment& e, const comm::JobEnv& joined, int device,
                                  const std::string& start_time, const std::string& version,
                                  const comm::TcpOptions& to) {
  const bool nccl = e.transport() == Experiment::NCCL;
  results::Provenance prov = detail::baseProvenance(e, nccl ? "nccl" : "tcp", joined.world_size, start_time, version,
                                                    !nccl && to.emulation.enabled());
  if (device >= 0) prov.gemm = "cublas";
  prov.link.emplace_back("job", joined.source + ", " + std::to_string(joined.world_size) + " processes, store " +
                                    joined.master_addr + ":" + std::to_string(joined.master_port));
  return prov;
}

}  // namespace

// Bookkeeping, not the experiment -- in-process it has no emulation either -- and rare and off the critical path:
// its threads sleep rather than spin beside the trainer's.
std::unique_ptr<comm::Transport> detail::connectControl(const comm::TcpOptions& to, comm::Job& job,
                                                        const std::string& prefix) {
  comm::TcpOptions co = to;
  co.emulation = {};
  co.busy_poll_us = 0;
  co.store_prefix = prefix + "control/";
  return comm::connectTcpTransport(co, job.token, *job.store);
}

std::chrono::milliseconds detail::tcpTimeout(const Experiment& e) {
  return std::chrono::milliseconds(static_cast<int64_t>(comm::parseDuration(e.tcp().timeout()) * 1000 + 0.5));
}

RunFailed detail::tcpRunFailed(const Experiment& e, int rank, int world, std::optional<results::ResultWriter>& writer,
                               const std::string& what) {
  if (writer) writer->markFailed(what);
  return RunFailed("variant '" + e.variant() + "' of study '" + e.study() + "' failed on rank " + std::to_string(rank) +
                       " of " + std::to_string(world) +
                       (writer ? std::string(writer->records() > 0 ? " (partial results in " : " (status in ") +
                                     writer->dir().string() + ")"
                               : std::string()) +
                       ": " + what,
                   writer ? writer->dir() : std::filesystem::path());
}

std::string Runner::startTcpVariant(const Experiment& e, int rank, std::chrono::milliseconds timeout,
                                    const std::filesystem::path& root, std::optional<results::ResultWriter>& writer,
                                    RunSummary& summary) {
  primary_ = rank == 0;
  if (!job_) job_ = std::make_shared<comm::Job>(comm::joinJob(timeout));
  // Numbered before anything can fail on one rank only: every rank must keep the same count for the later variants.
  std::string prefix = "run" + std::to_string(tcp_runs_++) + "/" + e.study() + "/" + e.variant() + "/";
  if (rank == 0) writer.emplace(root, e.study(), experiments::resultsSubfolder(e));
  summary.study = e.study();
  summary.variant = e.variant();
  if (writer) summary.dir = writer->dir();
  return prefix;
}

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
  const auto timeout = detail::tcpTimeout(e);
  const comm::JobEnv env = checkedJobEnv(e);
  const int rank = env.rank;
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  std::optional<results::ResultWriter> writer;
  RunSummary summary;
  const std::string prefix = startTcpVariant(e, rank, timeout, root, writer, summary);
  const comm::JobEnv& joined = job_->env;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::Transport> control;
  detail::ProcessWorld ranks(rank, env.world_size, joined.host);  // after what it aborts: it goes first
  ranks.onAbort([&](const std::string& why) {
    if (comm) comm->abort(why);
    if (control) control->abort(why);
  });
  try {
    if (writer) writer->writeConfig(experiments::toText(e));
    const auto start_time = results::isoTimeUtc();
    // ---- Setup: this rank's replica, compressor instance, pipelines and trainer (as runner.cc builds rank r's).
    // The communicator first: with NCCL it picks this rank's GPU, where the workload is then built.
    const comm::TcpOptions to = detail::tcpOptions(e, joined, rank, env.world_size, timeout, prefix);
    int device = -1;
    comm::Transport* data_link = nullptr;
    comm = connectTrainerComm(e, to, *job_, prefix, device, data_link);
    ranks.attach(comm.get(), data_link);
    workloads::WorkloadOptions wo = detail::workloadOptions(e);
    wo.device = device;
    std::unique_ptr<train::Workload> model = workloads::makeWorkload(e.workload().name(), wo, dataFor(e));
    control = detail::connectControl(to, *job_, prefix);
    auto plugin = options_.loader->loadCompressor(e.compressor().name());
    const Params params = experiments::pluginParams(e.compressor());
    auto sched_plugin = options_.loader->loadScheduler(e.scheduler().name());
    std::shared_ptr<Compressor> instance = plugin->instantiate(params);
    train::SyncTrainerOptions topts = detail::trainerOptions(e);
    topts.slowdown = experiments::workerSettings(e, rank).slowdown();
    topts.jitter = detail::computeJitter(e, rank);
    topts.partition = detail::dataPartition(e, *model);
    // Every rank writes its own traces into the variant's folder (on one host, rank 0's: it collects them all).
    detail::StepTraceFiles step_trace(e, root / e.study() / experiments::resultsSubfolder(e), false);
    detail::TraceFiles trace(e.trace(), root / e.study() / e.variant());
    topts.trace = trace.add(rank, std::chrono::steady_clock::now());
    topts.step_trace = step_trace.add(std::chrono::steady_clock::now(), instance->phaseSteps());
    const std::shared_ptr<const CompressorPlugin> dense_plugin = detail::densePlugin(e, *options_.loader);
    std::shared_ptr<Compressor> dense = dense_plugin ? dense_plugin->instantiate({}) : nullptr;
    auto trainer = detail::makeSyncTrainer(e, *model, *comm, instance, *sched_plugin, topts, dense);
    if (writer) {
      results::Provenance prov = jobProvenance(e, joined, device, start_time, options_.terse_version, to);
      prov.plugins.push_back({plugin->info(), instance->caps(DType::kF32), params, instance->resolvedParams(), {}});
      prov.plugins.push_back(detail::schedulerRecord(*sched_plugin, experiments::pluginParams(e.scheduler())));
      if (dense_plugin) prov.plugins.push_back(detail::denseRecord(*dense_plugin, *dense));
      detail::notePartition(prov, e, *model, topts.partition.get());
      writer->writeProvenance(prov);
    }
    if (const std::string w = detail::localSgdEvaluationWarning(e, trainer->stepsPerEpoch(), trainer->totalSteps(),
                                                                trainer->localSgdSchedule());
        rank == 0 && !w.empty())
      std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
    if (const std::string w = detail::compressionStartWarning(e, trainer->totalSteps()); rank == 0 && !w.empty())
      std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
    if (const std::string w = detail::compressorPhasesWarning(e, instance->phaseSteps(), trainer->totalSteps());
        rank == 0 && !w.empty())
      std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
    // ---- The run: the in-process ranks' code (rank_driver.h).
    detail::Progress progress(rank == 0 ? options_.progress : ProgressMode::kOff,
                              options_.progress_out ? *options_.progress_out : std::cerr, e.variant(), e.epochs(),
                              trainer->totalSteps(), trainer->stepsPerEpoch());
    std::optional<detail::SyncReport> report;
    if (writer) report.emplace(detail::SyncReport{*writer, summary, progress, rt::now()});
    ranks.run([&](int) {
      detail::ControlChannel channel(*control);
      detail::SyncRankDriver(e, ranks, {*trainer, *model, *comm, channel}, report ? &*report : nullptr).run();
    });
    // Trainers own communication threads that use the communicator: stop them before it goes.
    trainer.reset();
    ranks.attach(nullptr, nullptr);
    comm.reset();  // a clean goodbye: peers see an orderly close, not a dead rank
    control.reset();
    if (writer) writer->markCompleted();
    return summary;
  } catch (const std::exception& x) {
    throw detail::tcpRunFailed(e, rank, env.world_size, writer, ranks.failed(x));
  }
}

}  // namespace terse::runner

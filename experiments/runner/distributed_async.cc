// Modes ASYNC and SSP over transport TCP: this process is one rank of a job of servers + workers ranks (`terse launch
// -n S+W -- terse run CONFIG`, srun, mpirun), running async_rank.h's rank over a tcp transport with the config's link
// emulation and a second, control-only tcp transport for the reports (no emulation, not counted in the records, as in
// distributed.cc).
//
// Elastic workers: workers are expendable ranks of both tcp transports (TcpOptions::expendable_ranks), so a worker
// process that dies or goes silent past the tcp timeout fails only its own links: the shards drop it at once, rank 0
// records that it left at its last report, and the others finish the run. A worker with
// worker_settings.fail_after_steps stops speaking to the shards (no goodbye) but keeps its process, as the in-process
// run's silent thread does; the shards drop it after worker_timeout. A shard process that dies fails every rank: a
// clear error naming the rank and host (a parameter server without one of its shards has lost parameters).
#include <iostream>
#include <optional>

#include "core/comm/host_communicator.h"
#include "core/comm/job.h"
#include "core/comm/tcp/transport.h"
#include "core/common/crash.h"
#include "core/common/error.h"
#include "core/plugin/loader.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/async_rank.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/runner/world.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {

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
                          << " ranks but this job has " << world << " (from " << comm::describeJobSource(env)
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
  std::unique_ptr<detail::AsyncRank> me;                 // after what it refers to
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
    const auto pull_plugin = detail::loadPullCompressor(e, *options_.loader);
    const Params pull_params = experiments::pluginParams(e.parameter_server().pull_compressor());
    std::shared_ptr<Compressor> pull = pull_plugin ? pull_plugin->instantiate(pull_params) : nullptr;
    me = std::make_unique<detail::AsyncRank>(e, rank, *model, *data, *control, instance, pull,
                                             detail::dataPartition(e, *model));
    me->checkInitialReplicas();
    if (writer) {
      results::Provenance prov =
          detail::baseProvenance(e, "tcp", world, start_time, options_.terse_version, to.emulation.enabled());
      prov.mode = detail::asyncModeName(e.mode());
      prov.link.emplace_back("job", joined.source + ", " + std::to_string(world) + " processes (" + std::to_string(S) +
                                        " shards), store " + joined.master_addr + ":" +
                                        std::to_string(joined.master_port));
      prov.plugins.push_back({plugin->info(), instance->caps(DType::kF32), params, instance->resolvedParams(), {}});
      if (pull)
        prov.plugins.push_back(
            {pull_plugin->info(), pull->caps(DType::kF32), pull_params, pull->resolvedParams(), "pull_compressor"});
      detail::notePartition(prov, e, *model, me->partition());
      writer->writeProvenance(prov);
    }
    if (const std::string w =
            detail::compressorPhasesWarning(e, instance->phaseSteps(), static_cast<int64_t>(me->steps().total_steps));
        rank == 0 && !w.empty())
      std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
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

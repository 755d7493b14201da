#include "experiments/runner/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/comm/transport.h"
#include "core/common/crash.h"
#include "core/common/error.h"
#include "core/common/launch_notify.h"
#include "core/common/log.h"
#include "core/common/runtime.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/loader.h"
#include "core/sim/platform.h"
#include "core/sim/simulation.h"
#include "core/train/label_partition.h"
#include "core/train/sync_trainer.h"
#include "core/train/trace.h"
#include "experiments/runner/calibration.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/rank_driver.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/runner/world.h"
#include "experiments/workloads/fashion_mnist.h"
#include "experiments/workloads/gemm.h"
#include "experiments/workloads/workloads.h"
#include "results/build_commit.h"
#include "results/result_writer.h"

namespace terse::runner {
// Helpers shared with the multi-process path (distributed.cc) through runner_detail.h.
namespace detail {

using Clock = rt::Clock;
using experiments::Experiment;

double since(Clock::time_point t) {
  return rt::seconds(t, rt::now());
}

train::LrSchedule schedule(experiments::Optimizer::Schedule s) {
  switch (s) {
    case experiments::Optimizer::STEP:
      return train::LrSchedule::kStep;
    case experiments::Optimizer::COSINE:
      return train::LrSchedule::kCosine;
    default:
      return train::LrSchedule::kConstant;
  }
}

train::SyncTrainerOptions trainerOptions(const Experiment& e) {
  train::SyncTrainerOptions o;
  o.batch_size = e.data().batch_size();
  o.epochs = e.epochs();
  o.seed = e.seed();
  const auto& opt = e.optimizer();
  o.sgd.momentum = opt.momentum();
  o.sgd.nesterov = opt.nesterov();
  o.sgd.weight_decay = opt.weight_decay();
  o.lr.lr = opt.lr();
  o.lr.schedule = schedule(opt.schedule());
  o.lr.warmup_steps = opt.warmup_steps();
  o.lr.milestones.assign(opt.milestones().begin(), opt.milestones().end());
  o.lr.gamma = opt.gamma();
  o.lr.scale_by_world_size = opt.scale_lr_by_world_size();
  o.accumulation_steps = e.has_gradient_accumulation_steps() ? e.gradient_accumulation_steps() : 1;
  o.max_groups_in_flight = e.has_max_groups_in_flight() ? e.max_groups_in_flight() : 1;
  o.clip_grad_norm = opt.clip_grad_norm();
  o.warmup_epochs = opt.warmup_epochs();
  o.sgd.adagrad = e.workload().name() == "glove" && e.workload().glove().optimizer() == experiments::Glove::ADAGRAD;
  o.sparse_rows = e.sparse_gradients();
  // The evaluation points (SyncRankDriver::isEvalPoint) average too: the driver checks there that the replicas agree.
  o.compression_start_step = e.compression_start_step();
  o.local_sgd = {.period = e.local_sgd().period(),
                 .start_step = e.local_sgd().start_step(),
                 .every_steps = e.eval().every_steps(),
                 .per_epoch = e.eval().per_epoch(),
                 .outer_lr = e.local_sgd().outer_lr(),
                 .outer_momentum = e.local_sgd().outer_momentum(),
                 .outer_nesterov = e.local_sgd().outer_nesterov(),
                 .qsr_alpha = e.local_sgd().qsr_alpha()};
  return o;
}

uint64_t partitionSeed(const Experiment& e) {
  return e.data().has_partition_seed() ? e.data().partition_seed() : e.seed();
}

std::shared_ptr<const train::Partition> dataPartition(const Experiment& e, std::span<const int32_t> labels,
                                                      int num_classes, int workers) {
  if (e.data().partition() != experiments::Data::DIRICHLET) return nullptr;
  return std::make_shared<const train::Partition>(
      train::dirichletPartition(labels, num_classes, workers, e.data().dirichlet_alpha(), partitionSeed(e)));
}

std::shared_ptr<const train::Partition> dataPartition(const Experiment& e, const train::Workload& model) {
  TERSE_CHECK(e.data().partition() != experiments::Data::DIRICHLET || !model.trainLabels().empty(), InvalidArgument,
              "data.partition DIRICHLET: workload '" << model.name() << "' has no class labels to split by");
  return dataPartition(e, model.trainLabels(), model.numClasses(), e.workers());
}

void notePartition(results::Provenance& prov, const Experiment& e, const train::Workload& model,
                   const train::Partition* partition) {
  notePartition(prov, e, model.trainLabels(), model.numClasses(), partition);
}

void notePartition(results::Provenance& prov, const Experiment& e, std::span<const int32_t> labels, int num_classes,
                   const train::Partition* partition) {
  if (partition == nullptr) return;
  const auto histograms = train::labelHistograms(*partition, labels, num_classes);
  std::ostringstream alpha, distance;
  alpha << e.data().dirichlet_alpha();
  distance << std::fixed << std::setprecision(4) << train::meanLabelDistance(histograms, labels, num_classes);
  prov.partition = {{"kind", "dirichlet"},
                    {"alpha", alpha.str()},
                    {"seed", std::to_string(partitionSeed(e))},
                    {"mean_label_distance", distance.str()}};
  for (std::size_t w = 0; w < histograms.size(); ++w) {
    std::string counts;
    for (int64_t k : histograms[w]) counts += (counts.empty() ? "" : " ") + std::to_string(k);
    prov.partition.emplace_back("worker" + std::to_string(w), counts);
  }
}

std::string compressionStartWarning(const Experiment& e, int64_t total_steps) {
  const int64_t start = e.compression_start_step();
  if (start == 0) return "";
  // A grid or a study's base may set the warm-up for every variant, the dense baseline too: harmless, and said.
  if ((e.compressor().name().empty() || e.compressor().name() == "none") && !e.error_feedback() &&
      e.momentum_correction().factor() == 0)
    return "compression_start_step " + std::to_string(start) +
           " with compressor 'none': every step is allreduced uncompressed anyway; the warm-up changes nothing";
  if (start < total_steps) return "";
  return "compression_start_step " + std::to_string(start) + " is at or past the run's last step (" +
         std::to_string(total_steps) + " steps): compressor '" + e.compressor().name() +
         "' never runs, every step is allreduced uncompressed; lower compression_start_step or train longer";
}

std::string compressorPhasesWarning(const Experiment& e, std::span<const uint64_t> phases, int64_t total_steps) {
  if (phases.empty()) return "";
  const auto last = static_cast<int64_t>(phases.back());
  const std::string name = "compressor '" + e.compressor().name() + "'";
  if (e.compression_start_step() >= last)
    return name + " changes its work per step until step " + std::to_string(last) +
           " (its phases, e.g. dgc's warm-up), and compression_start_step " +
           std::to_string(e.compression_start_step()) +
           " allreduces every step before that uncompressed: a compressor counts steps from 0, the dense ones "
           "included, so none of those phases runs; shorten one of the two warm-ups";
  if (last >= total_steps)
    return name + " changes its work per step until step " + std::to_string(last) +
           " (its phases, e.g. dgc's warm-up), at or past the run's last step (" + std::to_string(total_steps) +
           " steps): the run ends before its last phase; shorten the compressor's warm-up or train longer";
  return "";
}

std::string localSgdEvaluationWarning(const Experiment& e, int64_t steps_per_epoch, int64_t total_steps,
                                      const train::LocalSgdSchedule& schedule) {
  const int64_t period = e.local_sgd().period();
  if (period == 0) return "";  // local SGD off
  const int64_t start = e.local_sgd().start_step();
  // A run shortened below its start_step (a quick try with fewer epochs or a subset) is synchronous throughout.
  if (start >= total_steps)
    return "local_sgd.start_step " + std::to_string(start) + " is at or past the run's last step (" +
           std::to_string(total_steps) + " steps): no local step runs, the run is synchronous SGD throughout; " +
           "lower local_sgd.start_step or train longer";
  const int64_t every = e.eval().every_steps();
  const int64_t epoch = e.eval().per_epoch() ? steps_per_epoch : 0;
  // The evaluation points (SyncRankDriver::isEvalPoint) in the local phase and before the last step, which averages
  // anyway, that are off the schedule (SyncTrainer::averagingStep). Counted up to a bound: it is a warning.
  constexpr int64_t kCounted = 10'000'000;
  int64_t extra = 0, first = 0, visited = 0;
  for (const int64_t each : {every, epoch}) {
    if (each <= 0) continue;
    for (int64_t done = each; done < total_steps && visited < kCounted; done += each, ++visited) {
      if (each == epoch && every > 0 && done % every == 0) continue;  // counted with every_steps
      if (done <= start || schedule.averagesAfter(done)) continue;
      ++extra;
      first = first == 0 ? done : std::min(first, done);
    }
  }
  if (extra == 0) return "";
  const int64_t scheduled = schedule.count();
  const bool qsr = e.local_sgd().qsr_alpha() > 0;
  std::string text = std::to_string(extra) + " evaluation point" + (extra == 1 ? " falls" : "s fall") +
                     " between the " +
                     (qsr ? "averagings of local_sgd's quadratic synchronization rule (rounds of at least period " +
                                std::to_string(period) + " from start_step " + std::to_string(start) + ")"
                          : "averagings of local_sgd.period " + std::to_string(period) + " (counted from start_step " +
                                std::to_string(start) + ")") +
                     ", the first after step " + std::to_string(first) +
                     ": each averages the models too, with a shorter local phase before it (and, with an outer "
                     "momentum, an outer step), " +
                     std::to_string(extra) + " extra beside " + std::to_string(scheduled) +
                     " scheduled averagings in " + std::to_string(total_steps) + " steps; ";
  if (qsr) return text + "evaluate less often (eval.every_steps, eval.per_epoch) for the rule's rounds to hold";
  return text + "make eval.every_steps and the epoch (" + std::to_string(steps_per_epoch) +
         " steps) multiples of the period, counted from start_step, for the period to hold";
}

train::ComputeJitter computeJitter(const Experiment& e, int worker) {
  return {.sigma = e.compute_jitter(), .seed = e.seed(), .worker = worker};
}

workloads::WorkloadOptions workloadOptions(const Experiment& e) {
  workloads::WorkloadOptions wo;
  wo.seed = e.seed();
  if (e.workload().hidden_sizes_size() > 0)
    wo.hidden.assign(e.workload().hidden_sizes().begin(), e.workload().hidden_sizes().end());
  if (e.workload().conv_channels_size() == 2) {
    wo.cnn.conv1_channels = e.workload().conv_channels(0);
    wo.cnn.conv2_channels = e.workload().conv_channels(1);
  }
  wo.cnn.hidden.assign(e.workload().hidden_sizes().begin(), e.workload().hidden_sizes().end());
  wo.cnn.dropout = e.workload().dropout();
  if (e.data().train_subset() > 0) wo.num_train = e.data().train_subset();
  if (e.data().test_subset() > 0) wo.num_test = e.data().test_subset();
  const experiments::Glove& g = e.workload().glove();
  wo.glove.cooc.corpus = g.corpus();
  wo.glove.cooc.window = g.window();
  wo.glove.cooc.vocab_size = g.vocab_size();
  wo.glove.cooc.min_count = g.min_count();
  wo.glove.cooc.test_fraction = g.test_fraction();
  wo.glove.cooc.split_seed = 1;  // the split is the data's, not the run's: every seed evaluates on the same pairs
  wo.glove.cooc.cache_dir = g.cache_dir();
  if (wo.glove.cooc.cache_dir.empty()) {
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
      wo.glove.cooc.cache_dir = std::string(xdg) + "/terse";
    else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
      wo.glove.cooc.cache_dir = std::string(home) + "/.cache/terse";
  }
  wo.glove.dim = g.dim();
  wo.glove.x_max = g.x_max();
  wo.glove.alpha = g.alpha();
  return wo;
}

PluginWatch::PluginWatch(const Experiment& e) {
  watchdog::setTimeout(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(comm::parseDuration(e.plugin_timeout()))));
  exit_ = watchdog::Registration([](const watchdog::Overrun& o) {
    // Handlers run in registration order and this one is the outermost: it must not end the process before the run's
    // abort actions, registered after it, have run. So the exit waits on its own thread.
    std::thread([o] {
      std::this_thread::sleep_for(kOverrunGrace);
      const auto folders = crash::failRegistered(o.message(), o.plugin);
      std::ostringstream msg;
      msg << "terse: " << o.message() << "; a hung call can be neither stopped nor joined, so the process ends";
      for (const auto& f : folders) msg << " (status: " << f << ")";
      msg << '\n';
      std::cerr << msg.str() << std::flush;
      std::fflush(nullptr);
      notifyLauncher("failed " + o.message());  // terse launch: this rank failed (launch_notify.h)
      ::_exit(1);
    }).detach();
  });
}

PluginWatch::~PluginWatch() {
  watchdog::setTimeout(std::chrono::nanoseconds(0));
}

watchdog::Registration abortOnOverrun(std::function<void(const std::string& reason)> abort) {
  return watchdog::Registration([abort = std::move(abort)](const watchdog::Overrun& o) { abort(o.message()); });
}

std::string replicasWhat(const Experiment& e, int count, const std::vector<std::unique_ptr<train::Workload>>& built) {
  std::ostringstream out;
  out << count << " model replicas of workload '" << e.workload().name() << "'";
  std::string details;
  if (e.workload().hidden_sizes_size() > 0) {
    details = "hidden sizes [";
    for (int i = 0; i < e.workload().hidden_sizes_size(); ++i)
      details += (i ? ", " : "") + std::to_string(e.workload().hidden_sizes(i));
    details += "]";
  }
  if (!built.empty() && built.front() != nullptr) {
    const std::size_t n = built.front()->numParameters();
    details += (details.empty() ? "" : "; ") + std::to_string(n) + " parameters, " + std::to_string(n * sizeof(float)) +
               " bytes of f32 values each";
  }
  if (!details.empty()) out << " (" << details << ")";
  return out.str();
}

std::string shortWhat(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

bool isCommError(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const comm::CommError&) {
    return true;
  } catch (...) {
    return false;
  }
}

results::PluginRecord schedulerRecord(const SchedulerPlugin& plugin, const Params& params) {
  return {plugin.info(), std::nullopt, params, plugin.instantiate(params)->resolvedParams(), {}};
}

results::Provenance baseProvenance(const Experiment& e, std::string_view transport, int world,
                                   const std::string& start_time, const std::string& terse_version,
                                   bool emulation_enabled) {
  results::Provenance prov;
  prov.git_commit = std::string(results::buildCommit());
  prov.host = results::hostName();
  prov.cpu = results::cpuDescription();
  // The host models' GEMM (a device model's is cuBLAS: distributed.cc says so); it decides the last digits of every
  // accuracy, so a table that mixes kernels must say so (`terse compare` warns).
  prov.gemm = workloads::gemmDescription();
  prov.start_time = start_time;
  prov.terse_version = terse_version;
  prov.transport = std::string(transport);
  prov.mode = "sync";
  prov.world_size = world;
  const auto& link = e.link();
  prov.link = {{"bandwidth", link.bandwidth()},
               {"latency", link.latency()},
               {"nic", link.nic()},
               {"nic_ingress", link.nic_ingress()},
               {"emulation", emulation_enabled ? "on" : "off"}};
  for (const auto& o : link.overrides()) {
    prov.link.emplace_back("override " + std::to_string(o.src()) + "->" + std::to_string(o.dst()),
                           o.bandwidth() + " " + o.latency());
  }
  return prov;
}

void noteRecord(RunSummary& summary, const results::MetricsRecord& m, const train::EvalResult& ev, int64_t records) {
  summary.records = records;
  summary.steps = m.step;
  summary.final_accuracy = ev.accuracy;
  summary.final_test_loss = ev.loss;
  summary.best_accuracy = std::max(summary.best_accuracy, ev.accuracy);
  summary.wire_bytes_per_worker = m.wire_bytes_per_worker;
  summary.payload_bytes_per_worker = m.payload_bytes_per_worker;
  summary.wall_s = m.wall_s;
}

results::MetricsRecord evalRecord(int64_t done, int64_t per_epoch, const train::EvalResult& ev, double loss_since,
                                  int64_t steps_since, double lr) {
  results::MetricsRecord m;
  m.step = done;
  m.epoch = done / per_epoch;
  m.epoch_progress = static_cast<double>(done) / static_cast<double>(per_epoch);
  m.test_accuracy = ev.accuracy;
  m.test_loss = ev.loss;
  m.test_examples = ev.num_examples;
  m.train_loss = loss_since / static_cast<double>(std::max<int64_t>(1, steps_since));
  m.lr = lr;
  return m;
}

sim::ComputeOptions computeOptions(const Experiment& e) {
  sim::ComputeOptions c;
  switch (e.simulation().compute()) {
    case experiments::Simulation::FLOP_MODEL:
      c.model = sim::ComputeModel::kFlops;
      break;
    case experiments::Simulation::MEASURED:
      c.model = sim::ComputeModel::kMeasured;
      break;
    default:
      c.model = sim::ComputeModel::kCalibrated;
      break;
  }
  c.compute_scale = e.simulation().compute_scale();
  c.flops_per_second = e.simulation().flops_per_second();
  return c;
}

sim::PlatformSpec simulatedPlatform(const Experiment& e) {
  sim::PlatformSpec platform;
  // A parameter server's shards are ranks of their own, before the workers (core/train/param_server_plan.h).
  platform.ranks =
      e.workers() +
      (e.mode() == Experiment::SYNC || e.mode() == Experiment::HOGWILD ? 0 : e.parameter_server().servers());
  platform.links = experiments::emulationConfig(e);
  platform.topology = experiments::topology(e);
  return platform;
}

void noteSimulation(results::Provenance& prov, const Experiment& e, const sim::ComputeOptions& compute,
                    const std::vector<std::pair<std::string, std::string>>& notes) {
  prov.clock = "simulated";
  prov.simulation = {{"platform", sim::describePlatform(simulatedPlatform(e))}, {"compute", compute.describe()}};
  prov.simulation.insert(prov.simulation.end(), notes.begin(), notes.end());
}

// A simulated run's summary crosses from the simulation's process (simulation.h) as text: one value per line, doubles
// with 17 significant digits so they come back bit-exact.
std::string encodeSummary(const RunSummary& s) {
  std::ostringstream out;
  out.precision(17);
  out << s.steps << '\n'
      << s.records << '\n'
      << s.final_accuracy << '\n'
      << s.best_accuracy << '\n'
      << s.final_test_loss << '\n'
      << s.wire_bytes_per_worker << '\n'
      << s.payload_bytes_per_worker << '\n'
      << s.wall_s << '\n';
  return out.str();
}

void decodeSummary(const std::string& text, RunSummary& s) {
  std::istringstream in(text);
  in >> s.steps >> s.records >> s.final_accuracy >> s.best_accuracy >> s.final_test_loss >> s.wire_bytes_per_worker >>
      s.payload_bytes_per_worker >> s.wall_s;
  TERSE_CHECK(!in.fail(), InternalError, "the simulation's summary is malformed: '" << text << "'");
}

train::TraceHeader stepTraceHeader(const Experiment& e, bool simulated) {
  train::TraceHeader h;
  h.mode = "sync";
  h.source = "terse";
  h.workload = e.workload().name();
  h.compressor = e.compressor().name();
  const Params params = experiments::pluginParams(e.compressor());
  for (std::size_t i = 0; i < params.size(); ++i)
    h.compressor += (i == 0 ? ":" : ",") + params[i].first + "=" + params[i].second;
  h.scheduler = e.scheduler().name();
  h.compression_start_step = e.compression_start_step();
  if (e.transport() == Experiment::NCCL) {
    h.allreduce_algorithm = h.allgather_algorithm = "nccl";
  } else {
    const comm::HostCommOptions co = experiments::hostCommOptions(e);
    h.allreduce_algorithm = comm::allreduceAlgorithmName(co.algorithm);
    h.allgather_algorithm = comm::allgatherAlgorithmName(co.allgather);
  }
  h.clock = simulated ? "simulated" : "real_time";
  if (simulated) {
    switch (computeOptions(e).model) {
      case sim::ComputeModel::kCalibrated:
        h.compute_model = "calibrated";
        break;
      case sim::ComputeModel::kMeasured:
        h.compute_model = "measured";
        break;
      case sim::ComputeModel::kFlops:
        h.compute_model = "flops";
        break;
      case sim::ComputeModel::kNone:
        h.compute_model = "none";
        break;
    }
  }
  return h;
}

StepTraceFiles::StepTraceFiles(const Experiment& e, std::filesystem::path dir, bool simulated) : dir_(std::move(dir)) {
  if (e.step_trace()) header_ = stepTraceHeader(e, simulated);
}

StepTraceFiles::~StepTraceFiles() {
  for (const auto& r : recorders_) {
    try {
      results::writeStepTrace(dir_, r->snapshot());
    } catch (const std::exception& x) {
      std::cerr << "warning: " << x.what() << '\n';
    }
  }
}

train::StepTraceRecorder* StepTraceFiles::add(std::chrono::steady_clock::time_point origin,
                                              std::span<const uint64_t> compressor_phases) {
  if (!header_) return nullptr;
  train::TraceHeader h = *header_;
  if (!compressor_phases.empty()) h.compressor_phases_end = static_cast<int64_t>(compressor_phases.back());
  recorders_.push_back(std::make_unique<train::StepTraceRecorder>(h, origin));
  return recorders_.back().get();
}

TraceFiles::~TraceFiles() {
  for (const auto& t : traces_) {
    try {
      t->write(dir_ / ("trace.rank" + std::to_string(t->rank()) + ".json"));
    } catch (const std::exception& x) {
      std::cerr << "warning: " << x.what() << '\n';
    }
  }
}

train::TraceRecorder* TraceFiles::add(int rank, std::chrono::steady_clock::time_point origin) {
  if (!enabled_) return nullptr;
  traces_.push_back(std::make_unique<train::TraceRecorder>(rank, origin));
  return traces_.back().get();
}

InprocLinks makeInprocLinks(const Experiment& e, const comm::InprocOptions& io) {
  InprocLinks links;
  const int world = e.workers();
  allocating(
      [&] {
        for (auto& t : comm::makeInprocTransports(world, io)) {
          links.comms.push_back(
              std::make_unique<comm::HostCommunicator>(std::move(t), experiments::hostCommOptions(e)));
        }
        // Bookkeeping, not the experiment: no link emulation, no simulated network (rank_driver.h).
        links.control = comm::makeInprocTransports(world, comm::InprocOptions{});
      },
      [&] { return std::to_string(world) + " in-process transports and communicators"; });
  return links;
}

std::unique_ptr<train::SyncTrainer> makeSyncTrainer(const Experiment& e, train::Workload& model,
                                                    comm::Communicator& comm, std::shared_ptr<Compressor> instance,
                                                    const SchedulerPlugin& scheduler, train::SyncTrainerOptions to,
                                                    std::shared_ptr<Compressor> dense) {
  const auto factory = [&comm, seed = e.seed()](std::shared_ptr<Compressor> codec, const CodecOptions& options,
                                                int charged_as) {
    return [&comm, codec = std::move(codec), seed, options, charged_as](const TensorInfo& info) {
      auto p = std::make_unique<CompressionPipeline>(makeCodec(codec, info, seed, options, comm.deviceStream()), comm);
      p->chargeAs(charged_as);
      return p;
    };
  };
  train::PipelineFactory pipelines = factory(std::move(instance), experiments::codecOptions(e), rt::kRunCodec);
  if (dense) to.dense_pipelines = factory(std::move(dense), CodecOptions{}, rt::kDenseCodec);
  return std::make_unique<train::SyncTrainer>(model, comm, std::move(pipelines), to,
                                              scheduler.instantiate(experiments::pluginParams(e.scheduler())));
}

std::shared_ptr<const CompressorPlugin> densePlugin(const Experiment& e, PluginLoader& loader) {
  if (e.compression_start_step() == 0) return nullptr;
  return loader.loadCompressor("none");
}

results::PluginRecord denseRecord(const CompressorPlugin& plugin, const Compressor& instance) {
  return {plugin.info(), instance.caps(DType::kF32), {}, instance.resolvedParams(), "dense_warmup"};
}

}  // namespace detail
using namespace detail;

experiments::ConfigOptions runnerConfigOptions(PluginLoader* loader) {
  experiments::ConfigOptions o;
  for (auto name : workloads::workloadNames()) o.workloads.emplace_back(name);
  o.workloads.emplace_back("pytorch");  // trained by the Python package's driver (pytorch_runner.cc)
  // Names only: whether this build has CUDA is the transport's question (NCCL is offered only by CUDA builds).
  for (auto name : workloads::workloadsWithCuda()) o.cuda_workloads.emplace_back(name);
  o.loader = loader;
  o.transports = {experiments::Experiment::INPROC, experiments::Experiment::TCP};
#if defined(TERSE_HAVE_NCCL)
  o.transports.push_back(experiments::Experiment::NCCL);  // one process per GPU (distributed.cc)
#endif
  o.modes = {experiments::Experiment::SYNC, experiments::Experiment::ASYNC, experiments::Experiment::SSP,
             experiments::Experiment::HOGWILD};
  return o;
}

Runner::Runner(RunnerOptions options) : options_(std::move(options)) {
  TERSE_CHECK(options_.loader != nullptr, InvalidArgument, "Runner needs a plugin loader");
}

std::shared_ptr<const workloads::DataSplit> Runner::dataFor(const Experiment& e) {
  if (!workloads::workloadNeedsData(e.workload().name())) return nullptr;
  const std::string key = e.data().dataset_dir() + '\n' + std::to_string(e.data().train_subset()) + '\n' +
                          std::to_string(e.data().test_subset());
  auto& slot = data_cache_[key];
  if (!slot) {
    workloads::FashionMnistOptions o;
    o.dir = e.data().dataset_dir();
    o.max_train = e.data().train_subset();
    o.max_test = e.data().test_subset();
    slot = std::make_shared<const workloads::DataSplit>(workloads::loadFashionMnist(o));
  }
  return slot;
}

void Runner::skip(const Experiment& e, std::string_view why) {
  if (!primary_) return;
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  results::ResultWriter writer(root, e.study(), experiments::resultsSubfolder(e));
  writer.writeConfig(experiments::toText(e));
  writer.markFailed(why);
}

RunSummary Runner::run(const Experiment& e) {
  const PluginWatch watch(e);
  if (e.workload().name() == "pytorch") return runPyTorch(e);                                   // pytorch_runner.cc
  if (e.mode() != Experiment::SYNC && e.transport() == Experiment::TCP) return runTcpAsync(e);  // distributed_async.cc
  // One rank per process (distributed.cc); NCCL: one per GPU.
  if (e.transport() == Experiment::TCP || e.transport() == Experiment::NCCL) return runTcp(e);
  TERSE_CHECK(e.transport() == Experiment::INPROC, InvalidArgument,
              "the runner implements transport " << Experiment::Transport_Name(e.transport()) << " in-process");
  // The ranks as threads: the sync trainer's, or the parameter server's shards and workers (async_runner.cc).
  const auto runInproc = [&](results::ResultWriter& writer, RunSummary& summary,
                             std::shared_ptr<comm::FrameNetwork> network) {
    if (e.mode() == Experiment::SYNC) {
      runInprocSync(e, writer, summary, std::move(network));
    } else {
      runInprocAsync(e, writer, summary, std::move(network));
    }
  };
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  results::ResultWriter writer(root, e.study(), experiments::resultsSubfolder(e));
  RunSummary summary;
  summary.study = e.study();
  summary.variant = e.variant();
  summary.dir = writer.dir();
  try {
    writer.writeConfig(experiments::toText(e));
    if (e.clock() == Experiment::SIMULATED) {
      // The data set is loaded here, before the simulation's process is forked, so the cache keeps it for the study's
      // next variants (what the child loads is lost with it).
      const auto data = dataFor(e);
      sim::SimulationOptions so;
      so.platform = simulatedPlatform(e);
      so.compute = computeOptions(e);
      sim_notes_.clear();
      if (so.compute.model == sim::ComputeModel::kCalibrated) {
        // Measured here, before the fork, on this thread: nothing of the simulation runs yet (calibration.h).
        CalibrationOutcome cal = calibrate({e, data, *options_.loader, std::nullopt});
        results::writeFileAtomic(writer.dir() / "calibration.json", cal.table.toJson());
        so.compute.table = cal.costs;
        std::string measured = std::to_string(cal.measured.size()) + " of " + std::to_string(cal.table.seconds.size()) +
                               " kernels timed for this run";
        sim_notes_ = {{"calibration", "calibration.json"},
                      {"calibration_source", cal.source},
                      {"calibration_measured", measured}};
        if (cal.foreign) {
          sim_notes_.emplace_back("calibration_foreign",
                                  "allowed (allow_foreign_calibration): measured on " + cal.table.identity.describe());
        }
        TERSE_LOG(LogLevel::kInfo, "calibration: " << measured << " (" << cal.source << ")");
      }
      sim_compute_ = std::make_shared<const sim::ComputeOptions>(so.compute);
      // The child writes metrics, provenance and traces; this process keeps the status (simulation.h: what the child
      // changes in memory is lost, so its record count is read back from the file).
      const std::string reply = sim::runSimulation(so, [&](const sim::SimulationContext& ctx) {
        runInproc(writer, summary, ctx.network);
        return encodeSummary(summary);
      });
      decodeSummary(reply, summary);
      summary.simulated = true;
      writer.recount();
    } else {
      runInproc(writer, summary, nullptr);
    }
    writer.markCompleted();
    return summary;
  } catch (const std::exception& x) {
    if (e.clock() == Experiment::SIMULATED) writer.recount();
    writer.markFailed(x.what());
    // "partial results" only where there are some (as pytorch_runner.cc says it).
    throw RunFailed("variant '" + e.variant() + "' of study '" + e.study() + "' failed (" +
                        (writer.records() > 0 ? "partial results in " : "status in ") + writer.dir().string() +
                        "): " + x.what(),
                    writer.dir());
  }
}

void Runner::runInprocSync(const Experiment& e, results::ResultWriter& writer, RunSummary& summary,
                           std::shared_ptr<comm::FrameNetwork> network) {
  const bool simulated = network != nullptr;
  const auto start_time = results::isoTimeUtc();
  const int world = e.workers();
  // ---- Setup: data, replicas, compressor instances, transports, pipelines, trainers.
  auto data = dataFor(e);
  const workloads::WorkloadOptions wo = workloadOptions(e);
  std::vector<std::unique_ptr<train::Workload>> models;
  allocating(
      [&] {
        for (int r = 0; r < world; ++r) models.push_back(workloads::makeWorkload(e.workload().name(), wo, data));
      },
      [&] { return replicasWhat(e, world, models); });
  auto plugin = options_.loader->loadCompressor(e.compressor().name());
  const Params params = experiments::pluginParams(e.compressor());
  comm::InprocOptions io;
  io.emulation = experiments::emulationConfig(e);
  io.network = network;  // simulated: SimGrid times the frames instead of the pacers
  InprocLinks links = makeInprocLinks(e, io);
  // The ranks: actors of the simulation (each at its straggler factor), or threads.
  std::unique_ptr<ThreadWorld> ranks;
  if (simulated) {
    std::vector<double> slowdowns;
    for (int r = 0; r < world; ++r) slowdowns.push_back(experiments::workerSettings(e, r).slowdown());
    ranks = std::make_unique<SimulatedWorld>(std::move(slowdowns));
  } else {
    ranks = std::make_unique<ThreadWorld>(world);
  }
  for (int r = 0; r < world; ++r) {
    ranks->onAbort([&links, r](const std::string& reason) {
      links.comms[static_cast<std::size_t>(r)]->abort(reason);
      links.control[static_cast<std::size_t>(r)]->abort(reason);
    });
  }

  // The scheduler, one instance per rank like the compressor; "fifo" (the default) is a plugin like any other.
  auto sched_plugin = options_.loader->loadScheduler(e.scheduler().name());
  const auto trace_origin = rt::now();
  StepTraceFiles step_traces(e, writer.dir(), simulated);
  TraceFiles traces(e.trace(), writer.dir());  // before the trainers: they are joined before it writes
  std::vector<std::unique_ptr<train::SyncTrainer>> trainers;
  std::shared_ptr<Compressor> first_instance, first_dense;
  const std::shared_ptr<const CompressorPlugin> dense_plugin = densePlugin(e, *options_.loader);
  const std::shared_ptr<const train::Partition> partition = dataPartition(e, *models[0]);
  allocating(
      [&] {
        for (int r = 0; r < world; ++r) {
          // One instance per rank, as separate processes would have: no plugin state is shared between ranks.
          std::shared_ptr<Compressor> instance = plugin->instantiate(params);
          if (!first_instance) first_instance = instance;
          train::SyncTrainerOptions to = trainerOptions(e);
          to.slowdown = ranks->trainerSlowdown(experiments::workerSettings(e, r).slowdown());
          to.jitter = computeJitter(e, r);
          to.trace = traces.add(r, trace_origin);
          to.step_trace = step_traces.add(trace_origin, instance->phaseSteps());
          to.partition = partition;
          std::shared_ptr<Compressor> dense = dense_plugin ? dense_plugin->instantiate({}) : nullptr;
          if (!first_dense) first_dense = dense;
          trainers.push_back(makeSyncTrainer(e, *models[r], *links.comms[r], instance, *sched_plugin, to, dense));
        }
      },
      [&] {
        return std::to_string(world) + " workers' trainers (gradient buffers, compressor '" + e.compressor().name() +
               "' instances and pipelines for " + std::to_string(models[0]->params().size()) + " tensors of " +
               std::to_string(models[0]->numParameters()) + " parameters each)";
      });
  results::Provenance prov =
      baseProvenance(e, "inproc", world, start_time, options_.terse_version, io.emulation.enabled());
  prov.plugins.push_back(
      {plugin->info(), first_instance->caps(DType::kF32), params, first_instance->resolvedParams(), {}});
  prov.plugins.push_back(schedulerRecord(*sched_plugin, experiments::pluginParams(e.scheduler())));
  if (dense_plugin) prov.plugins.push_back(denseRecord(*dense_plugin, *first_dense));
  if (simulated) noteSimulation(prov, e, *sim_compute_, sim_notes_);
  notePartition(prov, e, *models[0], partition.get());
  writer.writeProvenance(prov);

  if (const std::string w = localSgdEvaluationWarning(e, trainers[0]->stepsPerEpoch(), trainers[0]->totalSteps(),
                                                      trainers[0]->localSgdSchedule());
      !w.empty())
    std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
  if (const std::string w = compressionStartWarning(e, trainers[0]->totalSteps()); !w.empty())
    std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
  if (const std::string w = compressorPhasesWarning(e, first_instance->phaseSteps(), trainers[0]->totalSteps());
      !w.empty())
    std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
  // ---- The run: every rank runs the multi-process code (rank_driver.h), rank 0 writes.
  Progress progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr, e.variant(),
                    e.epochs(), trainers[0]->totalSteps(), trainers[0]->stepsPerEpoch());
  SyncReport report{writer, summary, progress, rt::now()};
  ranks->run([&](int r) {
    const auto i = static_cast<std::size_t>(r);
    ControlChannel control(*links.control[i]);
    SyncRankDriver(e, *ranks, {*trainers[i], *models[i], *links.comms[i], control}, r == 0 ? &report : nullptr).run();
  });
}

}  // namespace terse::runner

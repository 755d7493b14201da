// `terse whatif TRACE --workers N ...`: replays a recorded step trace on a simulated cluster of N workers (issue 40,
// core/sim/replay.h) and reports the step time, the exposed communication, the links' utilisation and, with the run's
// evaluation records beside the trace, the time to a target accuracy as recorded at the trace's world size.
//
// Every argument is checked before anything runs: the options (replay.h's validate), the topology's text, the traces
// (their reader, then checkReplayable), so a bad flag or file is an error naming it, never a simulation that fails
// later.
#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/error.h"
#include "core/common/json.h"
#include "core/sim/replay.h"
#include "core/train/step_trace.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

constexpr std::string_view kUsage =
    "usage: terse whatif TRACE --workers N [--topology SPEC | --bandwidth BW --latency T [--nic BW|none]]\n"
    "                    [--steps K] [--compute-scale F | --step-flops F --device-flops R] [--codec-scale F]\n"
    "                    [--scheduler recorded|fifo|priority]"
    " [--allreduce ALGO] [--allgather ALGO]\n"
    "                    [--jitter SIGMA] [--seed S] [--stragglers K:F] [--target-accuracy A] [--json FILE|-]\n"
    "\n"
    "Replays a recorded step trace on N simulated workers (SimGrid) and reports the simulated step time, exposed\n"
    "communication, compute, bytes per worker and per-link-class utilisation. TRACE is a run's steps.rank<R>.jsonl, a\n"
    "folder holding them (every rank's is replayed: worker w behaves as rank w mod W), synthetic:resnet50 (a\n"
    "ResNet-50-sized trace built in code: 161 tensors, 25.6 M parameters, 0.1 s of compute per step, one allreduce\n"
    "per tensor) or synthetic:allreduce=BYTES[K|M|G][,algo=NAME] (one allreduce, no compute).";

struct Source {
  std::vector<train::StepTrace> ranks;
  std::vector<std::string> names;  // the files, for messages
  fs::path folder;                 // where metrics.jsonl would be; empty for a synthetic trace
};

// A trace of a run that began with a warm-up -- a dense one (compression_start_step; core/train/sync_trainer.h), whose
// steps are allreduces of `none`, or the compressor's own (the header's compressor_phases_end: a compressor whose work
// per call changes until that step, terse/phases_v1.h, as dgc's warm-up stages do) -- holds steps unlike the rest. The
// question a replay answers is the compressor's steady state, so the warm-up's steps (those before the later of the
// two) are set aside (`steps`, every rank's, to price the time to accuracy) whenever the trace holds steps after them;
// a trace that ends inside the warm-up is replayed as recorded, and said so.
struct WarmupSplit {
  int64_t start = 0;                    // the header's compression_start_step; 0: none
  int64_t phases_end = 0;               // the header's compressor_phases_end; 0: none
  int64_t end = 0;                      // the first step after the warm-up: the later of the two; 0: no warm-up
  std::vector<train::StepTrace> steps;  // the warm-up's steps, set aside; empty when nothing was
  std::string note;                     // what was done, for the report; empty without a warm-up
};

WarmupSplit splitWarmup(Source& src) {
  WarmupSplit w;
  const train::TraceHeader& header = src.ranks.front().header;
  w.start = header.compression_start_step;
  w.phases_end = header.compressor_phases_end;
  w.end = std::max(w.start, w.phases_end);
  if (w.end <= 0) return w;
  const std::string compressor = header.compressor;
  const auto& lead = src.ranks.front().steps;
  const auto count = [&](int64_t below) {
    return static_cast<std::size_t>(
        std::count_if(lead.begin(), lead.end(), [&](const train::TraceStep& s) { return s.step < below; }));
  };
  const std::size_t before = count(w.end);  // the recorded steps of the warm-up (either kind)
  const std::size_t dense_steps = count(w.start);
  // What the warm-up's recorded steps are, in the notes' words: the dense warm-up's, the compressor's own (its phases
  // after the dense warm-up) or both, as far as the recorded steps reach; `header_what`: what the header says.
  const std::string dense = "the dense warm-up (compression_start_step " + std::to_string(w.start) + ")";
  const std::string own = compressor + "'s own warm-up (its phases, to step " + std::to_string(w.phases_end) + ")";
  const bool own_recorded = w.phases_end > w.start && before > dense_steps;
  const std::string what = !own_recorded ? dense : dense_steps > 0 ? dense + " and " + own : own;
  const std::string header_what = w.phases_end <= w.start ? dense : w.start > 0 ? dense + " and " + own : own;
  if (before == lead.size()) {
    w.note = !own_recorded ? "every recorded step is of the dense warm-up (compression_start_step " +
                                 std::to_string(w.start) + "): this replays allreduces of none, not of " + compressor +
                                 "; record past step " + std::to_string(w.end) + " for the compressor's"
                           : "every recorded step is of " + what + ": this replays those, not " + compressor +
                                 "'s steady state; record past step " + std::to_string(w.end) + " for it";
    return w;
  }
  if (before == 0) {
    w.note = w.phases_end <= w.start
                 ? "the trace's header says the run began with a dense warm-up of " + std::to_string(w.start) +
                       " steps (compression_start_step), but it holds none of them: replaying " + compressor +
                       "'s steps; a time to accuracy prices the warm-up's steps at the compressor's step time"
                 : "the trace's header says the run began with " + header_what +
                       ", but it holds none of its steps: replaying " + compressor +
                       "'s later steps; a time to accuracy prices the warm-up's steps at the replayed steps' time";
    return w;
  }
  for (auto& rank : src.ranks) {
    train::StepTrace warm;
    warm.header = rank.header;
    std::vector<train::TraceStep> kept;
    for (auto& s : rank.steps) (s.step < w.end ? warm.steps : kept).push_back(std::move(s));
    rank.steps = std::move(kept);
    w.steps.push_back(std::move(warm));
  }
  w.note = !own_recorded
               ? "the first " + std::to_string(before) +
                     " recorded steps are the dense warm-up's (compression_start_step " + std::to_string(w.start) +
                     "): replaying the " + std::to_string(lead.size()) + " of " + compressor + " after them"
               : "the first " + std::to_string(before) + " recorded steps are " + what + ": replaying the " +
                     std::to_string(lead.size()) + " of " + compressor + " after them";
  return w;
}

Source loadSource(const std::string& text, int steps) {
  Source src;
  if (text.rfind("synthetic:", 0) == 0) {
    const std::string which = text.substr(10);
    static const std::regex kAllreduce(R"(allreduce=([0-9]+)([KMG]?)(,algo=([a-z_]+))?)");
    std::smatch m;
    sim::SyntheticTraceSpec spec;
    spec.steps = std::max(steps, 1);
    if (which == "resnet50") {
      spec.layers = sim::resnet50Layers(0.1);
    } else if (std::regex_match(which, m, kAllreduce)) {
      // One buffer of BYTES, no computation: the replayed step is the collective's network time alone, to set beside
      // `terse bench allreduce --clock simulated --compute none` (scripts/validate-replay-model).
      const uint64_t unit = m[2] == "K" ? 1024 : m[2] == "M" ? 1024 * 1024 : m[2] == "G" ? 1024ull * 1024 * 1024 : 1;
      const uint64_t bytes = std::stoull(m[1]) * unit;
      TERSE_CHECK(bytes % 4 == 0, InvalidArgument,
                  "TRACE '" << text << "': the buffer is f32: bytes must be a multiple of 4");
      spec.layers = {{{bytes / 4}, 0, 0}};
      if (m[4].matched) {
        TERSE_CHECK(comm::parseAllreduceAlgorithm(m[4].str()).has_value(), InvalidArgument,
                    "TRACE '" << text << "': unknown algorithm '" << m[4].str() << "' ("
                              << comm::allreduceAlgorithmChoices() << ")");
        spec.allreduce = m[4].str();
      }
    } else {
      TERSE_THROW(InvalidArgument, "TRACE '" << text << "': unknown synthetic trace '" << which
                                             << "' (resnet50, allreduce=BYTES[K|M|G][,algo=NAME])");
    }
    src.ranks.push_back(sim::syntheticStepTrace(spec));
    src.names.push_back(text);
    return src;
  }
  const fs::path p(text);
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(p, ec)) {
    std::vector<std::pair<int, fs::path>> found;
    for (const auto& e : fs::directory_iterator(p)) {
      const auto rank = train::stepTraceFileRank(e.path().filename().string());
      if (e.is_regular_file() && rank) found.emplace_back(*rank, e.path());
    }
    if (found.empty()) {
      // A study's folder holds its variants' folders (and a repeat's, <variant>/seed-N): name those that hold traces.
      std::vector<std::string> traced;
      auto visit = [&](const fs::path& dir, int depth, auto&& self) -> void {
        std::error_code dir_ec;
        for (fs::directory_iterator it(dir, dir_ec), end; !dir_ec && it != end; it.increment(dir_ec)) {
          std::error_code entry_ec;
          if (!it->is_directory(entry_ec) || entry_ec) continue;
          if (fs::exists(it->path() / "steps.rank0.jsonl", entry_ec))
            traced.push_back(it->path().string());
          else if (depth < 2)
            self(it->path(), depth + 1, self);
        }
      };
      visit(p, 1, visit);
      std::sort(traced.begin(), traced.end());
      std::ostringstream hint;
      for (std::size_t i = 0; i < traced.size() && i < 8; ++i) hint << (i ? ", " : "") << traced[i];
      if (traced.size() > 8) hint << ", ... (" << traced.size() << " in all)";
      TERSE_THROW(
          InvalidArgument,
          p.string() << ": no steps.rank<R>.jsonl files"
                     << (traced.empty() ? std::string(" here or in its subfolders: record the run with step "
                                                      "traces (step_trace: true in the config, or terse run "
                                                      "--set step_trace=true; CompressionState(..., "
                                                      "step_trace=True) in a script)")
                                        : "; it looks like a study's folder: give one of its runs, " + hint.str()));
    }
    std::sort(found.begin(), found.end());
    for (std::size_t i = 0; i < found.size(); ++i) {
      TERSE_CHECK(found[i].first == static_cast<int>(i), InvalidArgument,
                  p.string() << ": the step traces skip rank " << i << " (found " << found[i].second.filename().string()
                             << ")");
      files.push_back(found[i].second);
    }
    src.folder = p;
  } else if (fs::is_regular_file(p, ec)) {
    files.push_back(p);
    src.folder = p.parent_path();
  } else {
    TERSE_THROW(InvalidArgument, p.string() << ": no such file or directory");
  }
  for (const auto& f : files) {
    src.ranks.push_back(train::readStepTrace(f));
    src.names.push_back(f.string());
    sim::checkReplayable(src.ranks.back(), f.string());
  }
  return src;
}

std::string seconds(double s) {
  std::ostringstream o;
  if (s >= 1)
    o << std::fixed << std::setprecision(3) << s << " s";
  else if (s >= 1e-3)
    o << std::fixed << std::setprecision(3) << s * 1e3 << " ms";
  else
    o << std::fixed << std::setprecision(2) << s * 1e6 << " us";
  return o.str();
}

}  // namespace

int whatifCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("trace", po::value<std::string>(), "the step trace")(
      "workers", po::value<int>(), "simulated workers N (>= 1)")(
      "topology", po::value<std::string>(),
      "two-level cluster: a preset (8xA100-4x200G, 8xH100-8x400G, 4xV100-1x100G) and/or workers=,intra=,"
      "intra_latency=,nic=,nics=,nic_latency=,oversubscription=,nodes_per_rack=")(
      "bandwidth", po::value<std::string>(), "per-pair wires: bandwidth per directed link, e.g. 10Gbps")(
      "latency", po::value<std::string>(), "per-pair wires: one-way latency, e.g. 5us")(
      "nic", po::value<std::string>(), "per-rank NIC cap shared by its links (default: --bandwidth; none: no cap)")(
      "steps", po::value<int>()->default_value(0), "steps to replay (0: the trace's)")(
      "compute-scale", po::value<double>()->default_value(1.0),
      "multiplies every recorded compute, codec and update time (0.5: a device twice as fast)")(
      "step-flops", po::value<double>()->default_value(0.0),
      "with --device-flops: the model's training FLOPs per worker step (e.g. 3.1e12)")(
      "device-flops", po::value<double>()->default_value(0.0),
      "with --step-flops: the device's effective FLOP/s; compute then takes step-flops / device-flops a step")(
      "codec-scale", po::value<double>()->default_value(0.0),
      "multiplies the recorded codec times instead (0: --compute-scale's factor)")(
      "allreduce", po::value<std::string>()->default_value(""),
      "allreduce algorithm instead of the trace's (ring, rd, hd, tree, reduce_broadcast, hierarchical, auto)")(
      "allgather", po::value<std::string>()->default_value(""),
      "allgather algorithm instead of the trace's (ring, bruck, hierarchical, auto)")(
      "scheduler", po::value<std::string>()->default_value("recorded"),
      "the groups' issue order: recorded (the trace's), or re-issued fifo or priority (P3) with per-tensor updates")(
      "jitter", po::value<double>()->default_value(0.0), "lognormal sigma per compute segment (0: none)")(
      "seed", po::value<std::string>()->default_value("1"), "the jitter's seed")(
      "stragglers", po::value<std::string>(), "K:F: the first K workers compute F times slower")(
      "target-accuracy", po::value<double>(), "time to this test accuracy from the run's metrics.jsonl")(
      "json", po::value<std::string>(), "also write the result as JSON to FILE (- for stdout)");
  po::positional_options_description positional;
  positional.add("trace", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "terse whatif: " << e.what() << "\n" << kUsage << '\n';
    return kExitUsage;
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n\n" << options;
    return kExitOk;
  }
  sim::ReplayOptions o;
  std::string trace_text;
  try {
    if (!vm.count("trace") || !vm.count("workers")) throw po::error("needs TRACE and --workers N");
    trace_text = vm["trace"].as<std::string>();
    o.workers = vm["workers"].as<int>();
    if (vm.count("topology")) {
      if (vm.count("bandwidth") || vm.count("latency") || vm.count("nic"))
        throw po::error("--topology describes the network; leave out --bandwidth, --latency and --nic");
      o.topology = sim::parseTopology(vm["topology"].as<std::string>());
    } else {
      if (!vm.count("bandwidth")) throw po::error("needs --topology SPEC or --bandwidth BW (per-pair wires)");
      o.links.link.bandwidth_bps = comm::parseBandwidth(vm["bandwidth"].as<std::string>());
      if (vm.count("latency")) o.links.link.latency_s = comm::parseDuration(vm["latency"].as<std::string>());
      const std::string nic = vm.count("nic") ? vm["nic"].as<std::string>() : "";
      o.links.nic_egress_bps = nic.empty() ? o.links.link.bandwidth_bps : nic == "none" ? 0 : comm::parseBandwidth(nic);
      o.links.nic_ingress_bps = o.links.nic_egress_bps;
    }
    o.steps = vm["steps"].as<int>();
    o.compute_scale = vm["compute-scale"].as<double>();
    o.codec_scale = vm["codec-scale"].as<double>();
    o.step_flops = vm["step-flops"].as<double>();
    o.device_flops = vm["device-flops"].as<double>();
    o.order = sim::parseReplayOrder(vm["scheduler"].as<std::string>());
    o.allreduce = vm["allreduce"].as<std::string>();
    o.allgather = vm["allgather"].as<std::string>();
    o.jitter_sigma = vm["jitter"].as<double>();
    o.seed = parseUnsigned("--seed", vm["seed"].as<std::string>());
    if (vm.count("stragglers")) {
      const std::string s = vm["stragglers"].as<std::string>();
      static const std::regex kSpec(R"(([0-9]+):([0-9]*\.?[0-9]+(e[+-]?[0-9]+)?))");
      std::smatch m;
      if (!std::regex_match(s, m, kSpec)) throw po::error("--stragglers '" + s + "' is not K:F (e.g. 4:1.5)");
      o.stragglers = std::stoi(m[1]);
      o.straggler_factor = std::stod(m[2]);
    }
    if (vm.count("target-accuracy")) {
      const double a = vm["target-accuracy"].as<double>();
      if (!(a > 0 && a <= 1)) throw po::error("--target-accuracy must be in (0, 1], got " + std::to_string(a));
    }
    o.validate();
  } catch (const po::error& e) {
    std::cerr << "terse whatif: " << e.what() << "\n" << kUsage << '\n';
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "terse whatif: " << userMessage(e.what()) << '\n';
    return kExitUsage;
  }
  try {
    Source src = loadSource(trace_text, o.steps);
    const WarmupSplit warm = splitWarmup(src);
    if (o.order != sim::ReplayOptions::Order::kRecorded)
      for (std::size_t r = 0; r < src.ranks.size(); ++r) sim::checkReorderable(src.ranks[r], src.names[r]);
    int64_t accuracy_step = -2;  // -2: not asked
    fs::path metrics;
    if (vm.count("target-accuracy")) {
      TERSE_CHECK(!src.folder.empty(), InvalidArgument,
                  "--target-accuracy needs a recorded run's metrics.jsonl; " << trace_text << " has none");
      metrics = src.folder / "metrics.jsonl";
      accuracy_step = sim::stepToAccuracy(metrics, vm["target-accuracy"].as<double>());
    }
    const sim::ReplayResult r = sim::replayTrace(src.ranks, o);
    const train::TraceHeader& h = src.ranks.front().header;
    // The time to accuracy counts the warm-up's steps at the warm-up's own step time, replayed apart.
    double warm_step_s = r.mean_step_s;
    if (accuracy_step > 0 && !warm.steps.empty()) {
      sim::ReplayOptions wo = o;
      wo.steps = static_cast<int>(
          std::min<std::size_t>(warm.steps.front().steps.size(),
                                o.steps > 0 ? static_cast<std::size_t>(o.steps) : warm.steps.front().steps.size()));
      warm_step_s = sim::replayTrace(warm.steps, wo).mean_step_s;
    }
    // The warm-up's steps count at their own time when the trace holds them, else at the compressor's.
    const int64_t warm_steps = accuracy_step > 0 ? std::min(accuracy_step, warm.end) : 0;
    const double accuracy_s = static_cast<double>(warm_steps) * warm_step_s +
                              static_cast<double>(std::max<int64_t>(accuracy_step - warm_steps, 0)) * r.mean_step_s;
    std::cout << "whatif: " << src.names.front() << (src.ranks.size() > 1 ? " (+ other ranks)" : "") << ", recorded at "
              << h.world << " worker(s), " << h.compressor << " / " << h.scheduler
              << (o.order == sim::ReplayOptions::Order::kRecorded
                      ? std::string()
                      : std::string(" re-issued ") + sim::replayOrderName(o.order))
              << ", replayed at " << r.workers << " workers, " << r.step_s.size() << " steps\n"
              << "network: " << r.platform << "\n";
    if (!warm.note.empty()) std::cout << "warm-up: " << warm.note << "\n";
    if (r.compute_scale != 1.0)
      std::cout << "compute: x " << r.compute_scale << " (" << seconds(r.recorded_compute_s) << " recorded a step"
                << (o.step_flops > 0 ? ", scaled to the device's FLOP rate" : "") << ")\n";
    for (const auto& c : r.collectives) std::cout << "collectives: " << c << "\n";
    Table t({"metric", "value"});
    t.add({"step time (mean)", seconds(r.mean_step_s)});
    t.add({"step time (median)", seconds(r.median_step_s)});
    t.add({"compute per step", seconds(r.compute_s)});
    // A PyTorch trace's updates are the script's whole gap between backward and the next forward (optimizer.step(),
    // zero_grad(), the data loader): its own line, since the exposed communication leaves it out.
    t.add({h.source == "pytorch" ? "optimizer and script per step" : "updates per step", seconds(r.optimizer_s)});
    t.add({"exposed communication per step", seconds(r.exposed_comm_s)});
    t.add({"collectives' network time per step", seconds(r.comm_s)});
    std::ostringstream bytes;
    bytes << std::fixed << std::setprecision(2) << r.bytes_per_worker / 1e6 << " MB";
    t.add({"bytes sent per worker per step", bytes.str()});
    std::string accuracy_text;
    if (accuracy_step >= 0) {
      accuracy_text = seconds(accuracy_s) + " (" + std::to_string(accuracy_step) + " steps" +
                      (warm_steps > 0 ? ", " + std::to_string(warm_steps) +
                                            (warm.phases_end > warm.start ? " of them the warm-up's"
                                                                          : " of them the dense warm-up's")
                                      : "") +
                      "; accuracy as recorded at world " + std::to_string(h.world) + ")";
      t.add({"time to target accuracy", accuracy_text});
    } else if (accuracy_step == -1) {
      accuracy_text = "not reached in the recorded run";
      t.add({"time to target accuracy", accuracy_text});
    }
    t.print(std::cout);
    Table links({"link class", "links", "capacity", "bytes", "utilisation"});
    for (const auto& l : r.links) {
      std::ostringstream cap, b, u;
      cap << std::setprecision(4) << l.capacity_bytes_per_s * 8 / 1e9 << " Gbps";
      b << std::setprecision(4) << l.bytes / 1e9 << " GB";
      u << std::fixed << std::setprecision(2) << 100 * l.utilisation << "%";
      links.add({l.name, std::to_string(l.links), cap.str(), b.str(), u.str()});
    }
    std::cout << "\n";
    links.print(std::cout);
    if (vm.count("json")) {
      Json j{{"trace", src.names.front()},
             {"recorded_world", h.world},
             {"compressor", h.compressor},
             {"scheduler", h.scheduler},
             {"order", sim::replayOrderName(o.order)},
             {"compute_scale", r.compute_scale},
             {"recorded_compute_s_per_step", r.recorded_compute_s},
             {"codec_scale", o.codec_scale > 0 ? o.codec_scale : r.compute_scale},
             {"workers", r.workers},
             {"platform", r.platform},
             {"steps", r.step_s.size()},
             {"step_s", r.step_s},
             {"mean_step_s", r.mean_step_s},
             {"median_step_s", r.median_step_s},
             {"compute_s_per_step", r.compute_s},
             {"optimizer_s_per_step", r.optimizer_s},
             {"exposed_comm_s_per_step", r.exposed_comm_s},
             {"comm_s_per_step", r.comm_s},
             {"bytes_per_worker_per_step", r.bytes_per_worker},
             {"collectives", r.collectives},
             {"links", Json::array()}};
      if (warm.end > 0) {
        j["warmup"] = Json{{"compression_start_step", warm.start},
                           {"steps_set_aside", warm.steps.empty() ? 0 : warm.steps.front().steps.size()},
                           {"note", warm.note}};
        if (warm.phases_end > 0) j["warmup"]["compressor_phases_end"] = warm.phases_end;
        j["warmup"]["end"] = warm.end;  // the first step after the warm-up: the later of the two
        if (accuracy_step > 0 && !warm.steps.empty()) j["warmup"]["mean_step_s"] = warm_step_s;
      }
      for (const auto& l : r.links)
        j["links"].push_back(Json{{"class", l.name},
                                  {"links", l.links},
                                  {"capacity_bytes_per_s", l.capacity_bytes_per_s},
                                  {"bytes", l.bytes},
                                  {"utilisation", l.utilisation}});
      if (accuracy_step >= 0)
        j["time_to_accuracy"] = Json{{"target", vm["target-accuracy"].as<double>()},
                                     {"step", accuracy_step},
                                     {"seconds", accuracy_s},
                                     {"warmup_steps", warm_steps},
                                     {"label", "accuracy as recorded at world " + std::to_string(h.world)}};
      const std::string out = vm["json"].as<std::string>();
      if (out == "-") {
        std::cout << dumpJson(j, 2) << "\n";
      } else {
        std::ofstream f(out, std::ios::trunc);
        f << dumpJson(j, 2) << "\n";
        TERSE_CHECK(f.good(), InvalidArgument, out << ": cannot write");
      }
    }
    return kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "terse whatif: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
}

}  // namespace terse::cli

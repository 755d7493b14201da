// The replay of a step trace on a simulated cluster (replay.h): the collectives' rounds, their flow patterns measured
// on SimGrid, and the per-worker timeline.
#include "core/sim/replay.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>

#include "core/comm/allgather_auto.h"
#include "core/comm/allreduce_auto.h"
#include "core/comm/collective.h"
#include "core/comm/communicator.h"
#include "core/comm/host_communicator.h"
#include "core/common/error.h"
#include "core/common/json.h"
#include "core/sim/simulation.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;

namespace {

// The probe's bytes per flow: large enough that the latencies are a small part of the measured time, and the seconds
// per byte come out to many digits; the time itself is simulated, so the size costs nothing.
constexpr double kProbeBytes = 1 << 30;
// Flows timed together at most, but for a component larger than this (measurePatterns).
constexpr std::size_t kFlowsPerBatch = 512;

// A set of flows that run at once: src -> dst pairs, each carrying the same bytes.
using Flows = std::vector<std::pair<int, int>>;

// One round of a collective as priced: its pattern (by key), bytes per flow, latencies paid; `timed` bytes when its
// time is not that of `bytes` (a pipelined tree's start-up), else < 0.
struct Round {
  std::string pattern;
  double bytes = 0;
  int latencies = 1;
  double timed = -1;
};

// What SimGrid said of a pattern.
struct PatternCost {
  double latency_s = 0;                     // the longest route latency among its flows
  double s_per_byte = 0;                    // of its slowest flow with all of them running
  double flows = 0;                         // how many
  std::map<std::string, double> crossings;  // by link class: sum over flows of the class's links on its route
};

// The collectives' algorithms as rounds of flow patterns at N workers (replay.h, "The network macro-model"). Patterns
// are made once per key and measured once.
class Planner {
 public:
  Planner(int n, int ranks_per_node) : n_(n), g_(ranks_per_node) {}

  const std::map<std::string, Flows>& patterns() const { return patterns_; }

  std::vector<Round> allreduce(comm::AllreduceAlgorithm algo, double b) {
    using A = comm::AllreduceAlgorithm;
    std::vector<Round> rounds;
    if (n_ <= 1) return rounds;
    switch (algo) {
      case A::kRing:
        rounds.push_back({ring("ring", n_, 1), 2.0 * (n_ - 1) / n_ * b, 2 * (n_ - 1)});
        break;
      case A::kRecursiveDoubling:
      case A::kHalvingDoubling: {
        const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n_)));
        const int rem = n_ - p;
        if (rem > 0) rounds.push_back({fold(true), b, 1});
        if (algo == A::kRecursiveDoubling) {
          for (int d = 1; d < p; d *= 2) rounds.push_back({exchange(d, p, rem), b, 1});
        } else {
          // Halving, nearest partner first (allreduce_halving_doubling.h): at distance d a rank gives away p / (2d)
          // of the p blocks; doubling retraces the steps farthest first, sending the p / (2d) it holds.
          for (int d = 1; d < p; d *= 2) rounds.push_back({exchange(d, p, rem), b / (2.0 * d), 1});
          for (int d = p / 2; d >= 1; d /= 2) rounds.push_back({exchange(d, p, rem), b / (2.0 * d), 1});
        }
        if (rem > 0) rounds.push_back({fold(false), b, 1});
        break;
      }
      case A::kTree: {
        // Each phase pipelines segments level by level (allreduce_tree.h): a segment goes on up (or down) as soon as
        // it is in, and a stream's segments leave back to back (core/sim/network.h, "Streams"), so a phase over a
        // depth of D takes D latencies and D + k - 1 segment times for k segments (scripts/validate-alpha-beta's
        // tree form, which the full simulation meets within 1%).
        const int depth = static_cast<int>(std::bit_width(static_cast<unsigned>(n_))) - 1;  // floor(log2 n): heap order
        const double seg = std::min(b, static_cast<double>(segment_));
        const double segments = seg > 0 ? std::ceil(b / seg) : 1;
        const double timed = (depth + segments - 1) * seg;
        rounds.push_back({tree(true), b, depth, timed});
        rounds.push_back({tree(false), b, depth, timed});
        break;
      }
      case A::kReduceBroadcast:
        rounds.push_back({star(true), b, 1});
        rounds.push_back({star(false), b, 1});
        break;
      case A::kHierarchical: {
        const int g = std::min(std::max(g_, 1), n_);
        const int m = (n_ + g - 1) / g;
        if (g > 1) rounds.push_back({chain(true, g), b, g - 1});
        if (m > 1) rounds.push_back({ring("leaders-ring", m, g), 2.0 * (m - 1) / m * b, 2 * (m - 1)});
        if (g > 1) rounds.push_back({chain(false, g), b, g - 1});
        break;
      }
      case A::kAuto:
        TERSE_THROW(InternalError, "replay: allreduce algorithm auto reached the planner unresolved");
    }
    return rounds;
  }

  // total: the gathered bytes at N (every worker's block).
  std::vector<Round> allgather(comm::AllgatherAlgorithm algo, double total) {
    using A = comm::AllgatherAlgorithm;
    std::vector<Round> rounds;
    if (n_ <= 1) return rounds;
    switch (algo) {
      case A::kRing:
        rounds.push_back({ring("ring", n_, 1), (n_ - 1.0) / n_ * total, n_ - 1});
        break;
      case A::kBruck:
        bruck(rounds, "shift", n_, 1, total);
        break;
      case A::kHierarchical: {
        const int g = std::min(std::max(g_, 1), n_);
        const int m = (n_ + g - 1) / g;
        if (g > 1) rounds.push_back({gatherToLeaders(g), total / n_, 1});
        if (m > 1) {
          if (comm::flatAllgatherChoice(m, static_cast<uint64_t>(total)) == A::kBruck)
            bruck(rounds, "leaders-shift", m, g, total);
          else
            rounds.push_back({ring("leaders-ring", m, g), (m - 1.0) / m * total, m - 1});
        }
        // The leader's binomial broadcast of the whole result inside its node.
        for (int d = 1; d < g; d *= 2) rounds.push_back({nodeBroadcast(d, g), total, 1});
        break;
      }
      case A::kAuto:
        TERSE_THROW(InternalError, "replay: allgather algorithm auto reached the planner unresolved");
    }
    return rounds;
  }

 private:
  // m members `stride` apart (rank stride x i), each to the next (mod m).
  std::string ring(const std::string& name, int m, int stride) {
    return pattern(name + "/" + std::to_string(stride), [&] {
      Flows f;
      for (int i = 0; i < m; ++i) f.emplace_back(i * stride, ((i + 1) % m) * stride);
      return f;
    });
  }
  // Bruck among m members `stride` apart: round k sends min(2^k, m - 2^k) blocks of total / m to the member 2^k back.
  void bruck(std::vector<Round>& rounds, const std::string& name, int m, int stride, double total) {
    for (int d = 1; d < m; d *= 2) {
      const std::string key = name + "/" + std::to_string(stride) + "/" + std::to_string(d);
      pattern(key, [&] {
        Flows f;
        for (int i = 0; i < m; ++i) f.emplace_back(i * stride, ((i - d + m) % m) * stride);
        return f;
      });
      rounds.push_back({key, std::min(d, m - d) * total / m, 1});
    }
  }
  // The power-of-two fold (allreduce_recursive_doubling.h): the first 2 rem ranks pair up, the even ones hand their
  // buffer to the odd ones (in) and get the result back (out).
  std::string fold(bool in) {
    return pattern(in ? "fold-in" : "fold-out", [&] {
      const int rem = n_ - static_cast<int>(std::bit_floor(static_cast<unsigned>(n_)));
      Flows f;
      for (int i = 0; i < rem; ++i) f.push_back(in ? std::pair{2 * i, 2 * i + 1} : std::pair{2 * i + 1, 2 * i});
      return f;
    });
  }
  // Virtual rank v (of p) exchanges with v ^ d; virtual ranks below rem are the odd ranks of the folded pairs.
  std::string exchange(int d, int p, int rem) {
    return pattern("xor/" + std::to_string(d), [&] {
      auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
      Flows f;
      for (int v = 0; v < p; ++v) f.emplace_back(real(v), real(v ^ d));
      return f;
    });
  }
  // Heap-ordered binary tree: each rank v > 0 to its parent (up) or from it (down).
  std::string tree(bool up) {
    return pattern(up ? "tree-up" : "tree-down", [&] {
      Flows f;
      for (int v = 1; v < n_; ++v) f.push_back(up ? std::pair{v, (v - 1) / 2} : std::pair{(v - 1) / 2, v});
      return f;
    });
  }
  std::string star(bool in) {
    return pattern(in ? "to-root" : "from-root", [&] {
      Flows f;
      for (int v = 1; v < n_; ++v) f.push_back(in ? std::pair{v, 0} : std::pair{0, v});
      return f;
    });
  }
  // The hierarchical allreduce's pipelined chains inside each node: member j + 1 -> j (reduce) or j -> j + 1.
  std::string chain(bool up, int g) {
    return pattern(up ? "chain-up" : "chain-down", [&] {
      Flows f;
      for (int r = 0; r + 1 < n_; ++r)
        if ((r + 1) % g != 0) f.push_back(up ? std::pair{r + 1, r} : std::pair{r, r + 1});
      return f;
    });
  }
  std::string gatherToLeaders(int g) {
    return pattern("to-leader", [&] {
      Flows f;
      for (int r = 0; r < n_; ++r)
        if (r % g != 0) f.emplace_back(r, r - r % g);
      return f;
    });
  }
  // Binomial broadcast round at distance d inside each node: member j < d sends to j + d.
  std::string nodeBroadcast(int d, int g) {
    return pattern("node-bcast/" + std::to_string(d), [&] {
      Flows f;
      for (int leader = 0; leader < n_; leader += g)
        for (int j = 0; j < d && j + d < g && leader + j + d < n_; ++j) f.emplace_back(leader + j, leader + j + d);
      return f;
    });
  }

  // Makes pattern `key` by `build` the first time it is asked for (each is measured once); returns the key.
  template <class Build>
  std::string pattern(std::string key, Build&& build) {
    if (!patterns_.count(key)) patterns_[key] = build();
    return key;
  }

  int n_;
  int g_;
  uint64_t segment_ = comm::HostCommOptions().segment_bytes;
  std::map<std::string, Flows> patterns_;
};

// The link classes of the platform's link names (platform.cc): what a user reads in the utilisation table.
std::string linkClass(const std::string& name) {
  auto starts = [&](std::string_view p) { return name.rfind(p, 0) == 0; };
  auto ends = [&](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (starts("nic-out")) return "nic egress";
  if (starts("nic-in")) return "nic ingress";
  if (starts("wire")) return "wire";
  if (starts("node") && ends("-out")) return "node nic out";
  if (starts("node") && ends("-in")) return "node nic in";
  if (starts("rack") && ends("-up")) return "rack uplink";
  if (starts("rack") && ends("-down")) return "rack downlink";
  if (name == "core") return "core";
  if (starts("up") || starts("down")) return "intra-node";
  return "";  // SimGrid's own (its loopback): no route of terse's crosses it
}

// Measures every pattern on the SimGrid platform, in one simulation (the child process of simulation.h); returns JSON:
// {"patterns": {key: {latency_s, s_per_byte, flows, crossings: {class: n}}}, "classes": {class: [links, capacity]}}.
std::string measurePatterns(const std::map<std::string, Flows>& patterns, const SimulationContext&) {
  sg4::Engine* engine = sg4::Engine::get_instance();
  std::vector<sg4::Host*> hosts;
  const int n = static_cast<int>(engine->get_host_count());
  hosts.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) hosts.push_back(engine->host_by_name("rank" + std::to_string(r)));
  Json out{{"patterns", Json::object()}, {"classes", Json::object()}};
  for (const auto& [key, flows] : patterns) {
    std::map<std::string, double> crossings;
    double latency = 0;
    // Flows that share a link are one component (union-find over the links of their routes): max-min sharing couples
    // a component's flows and nothing else, so components can be timed apart and the pattern's time is the slowest
    // one's.
    std::vector<std::size_t> parent(flows.size());
    std::iota(parent.begin(), parent.end(), std::size_t{0});
    auto root = [&parent](std::size_t i) {
      while (parent[i] != i) i = parent[i] = parent[parent[i]];
      return i;
    };
    std::unordered_map<const sg4::Link*, std::size_t> first_user;
    std::vector<double> route_latency(flows.size(), 0);
    for (std::size_t f = 0; f < flows.size(); ++f) {
      std::vector<sg4::Link*> route;
      double l = 0;
      hosts[static_cast<std::size_t>(flows[f].first)]->route_to(hosts[static_cast<std::size_t>(flows[f].second)], route,
                                                                &l);
      route_latency[f] = l;
      latency = std::max(latency, l);
      for (const sg4::Link* link : route) {
        const std::string c = linkClass(link->get_name());
        if (!c.empty()) crossings[c] += 1.0;
        const auto [it, fresh] = first_user.emplace(link, f);
        if (!fresh) parent[root(f)] = root(it->second);
      }
    }
    std::map<std::size_t, std::vector<std::size_t>> components;
    for (std::size_t f = 0; f < flows.size(); ++f) components[root(f)].push_back(f);
    // Whole components packed into batches of about kFlowsPerBatch flows, each batch's flows started together and
    // waited for before the next batch: SimGrid 3.32 ends every host-to-host communication with a linear search of
    // a list of all of them in flight, so a pattern's 16,384 flows at once made the measurement quadratic in N (49 s
    // for the patterns at 8,192 workers). A component larger than a batch runs alone, as large as it is.
    double s_per_byte = 0;
    std::vector<std::size_t> batch;
    auto runBatch = [&] {
      if (batch.empty()) return;
      double lat = 0;
      std::vector<sg4::CommPtr> comms;
      comms.reserve(batch.size());
      const double start = sg4::Engine::get_clock();
      for (std::size_t f : batch) {
        lat = std::max(lat, route_latency[f]);
        comms.push_back(sg4::Comm::sendto_async(hosts[static_cast<std::size_t>(flows[f].first)],
                                                hosts[static_cast<std::size_t>(flows[f].second)],
                                                static_cast<uint64_t>(kProbeBytes)));
      }
      sg4::Comm::wait_all(comms);
      s_per_byte = std::max(s_per_byte, (sg4::Engine::get_clock() - start - lat) / kProbeBytes);
      batch.clear();
    };
    for (const auto& [r, members] : components) {
      if (batch.size() + members.size() > kFlowsPerBatch) runBatch();
      batch.insert(batch.end(), members.begin(), members.end());
    }
    runBatch();
    Json classes = Json::object();
    for (const auto& [c, x] : crossings) classes[c] = x;
    out["patterns"][key] = Json{{"latency_s", latency},
                                {"s_per_byte", s_per_byte},
                                {"flows", static_cast<double>(flows.size())},
                                {"crossings", classes}};
  }
  // After the probes: a mesh makes its wires on first use, so the wires counted are those that carried flows.
  for (const sg4::Link* link : engine->get_all_links()) {
    const std::string c = linkClass(link->get_name());
    if (c.empty()) continue;
    Json& entry = out["classes"][c];
    if (entry.is_null()) entry = Json::array({0.0, 0.0});
    entry[0] = entry[0].get<double>() + 1;
    entry[1] = entry[1].get<double>() + link->get_bandwidth();
  }
  return dumpJson(out);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The collective a phase runs at N, as rounds; what it says in the summary.
struct PricedCollective {
  std::vector<Round> rounds;
  std::string label;
};

}  // namespace

void ReplayOptions::validate() const {
  TERSE_CHECK(workers >= 1, InvalidArgument, "replay: --workers must be >= 1, got " << workers);
  TERSE_CHECK(std::isfinite(compute_scale) && compute_scale > 0, InvalidArgument,
              "replay: --compute-scale must be a finite number > 0, got " << compute_scale);
  TERSE_CHECK(std::isfinite(jitter_sigma) && jitter_sigma >= 0, InvalidArgument,
              "replay: --jitter must be a finite sigma >= 0, got " << jitter_sigma);
  TERSE_CHECK(steps >= 0, InvalidArgument, "replay: --steps must be >= 0, got " << steps);
  TERSE_CHECK(stragglers >= 0 && stragglers <= workers, InvalidArgument,
              "replay: --stragglers K must be between 0 and the " << workers << " workers, got " << stragglers);
  TERSE_CHECK(std::isfinite(straggler_factor) && straggler_factor >= 1, InvalidArgument,
              "replay: --stragglers K:F needs a slowdown F >= 1, got " << straggler_factor);
  TERSE_CHECK(std::isfinite(step_flops) && step_flops >= 0 && std::isfinite(device_flops) && device_flops >= 0,
              InvalidArgument,
              "replay: --step-flops and --device-flops must be finite numbers > 0, got " << step_flops << " and "
                                                                                         << device_flops);
  TERSE_CHECK((step_flops > 0) == (device_flops > 0), InvalidArgument,
              "replay: --step-flops (the model's training FLOPs per worker step) and --device-flops (the device's "
              "effective FLOP/s) go together; got only "
                  << (step_flops > 0 ? "--step-flops" : "--device-flops"));
  TERSE_CHECK(step_flops == 0 || compute_scale == 1.0, InvalidArgument,
              "replay: --compute-scale " << compute_scale
                                         << " and --step-flops/--device-flops both set the compute's speed; use one");
  TERSE_CHECK(std::isfinite(codec_scale) && codec_scale >= 0, InvalidArgument,
              "replay: --codec-scale must be a finite number > 0 (0: --compute-scale), got " << codec_scale);
  TERSE_CHECK(allreduce.empty() || comm::parseAllreduceAlgorithm(allreduce), InvalidArgument,
              "replay: --allreduce '" << allreduce << "' is not one of " << comm::allreduceAlgorithmChoices());
  TERSE_CHECK(allgather.empty() || comm::parseAllgatherAlgorithm(allgather), InvalidArgument,
              "replay: --allgather '" << allgather << "' is not one of " << comm::allgatherAlgorithmChoices());
  if (topology.enabled()) {
    topology.validate();
    TERSE_CHECK(!links.enabled(), InvalidArgument,
                "replay: --topology and per-pair links (--bandwidth, --latency, --nic) both describe the network; "
                "use one");
  } else {
    links.validate(workers);
  }
}

ReplayOptions::Order parseReplayOrder(const std::string& text) {
  if (text == "recorded") return ReplayOptions::Order::kRecorded;
  if (text == "fifo") return ReplayOptions::Order::kFifo;
  if (text == "priority") return ReplayOptions::Order::kPriority;
  TERSE_THROW(InvalidArgument, "replay: --scheduler '" << text << "' is not one of recorded, fifo, priority");
}

const char* replayOrderName(ReplayOptions::Order order) {
  switch (order) {
    case ReplayOptions::Order::kFifo:
      return "fifo";
    case ReplayOptions::Order::kPriority:
      return "priority";
    case ReplayOptions::Order::kRecorded:
      break;
  }
  return "recorded";
}

void checkReorderable(const train::StepTrace& trace, const std::string& what) {
  for (const auto& st : trace.steps)
    TERSE_CHECK(st.negotiations.empty(), InvalidArgument,
                what << ": step " << st.step << " has " << st.negotiations.size()
                     << " recorded 'negotiations': scheduler '" << trace.header.scheduler
                     << "' agreed on its order across the workers, so the trace can only be replayed in that order "
                        "(--scheduler recorded); record the run with the scheduler to compare instead");
}

void checkReplayable(const train::StepTrace& trace, const std::string& what) {
  const train::TraceHeader& h = trace.header;
  TERSE_CHECK(h.format == train::kStepTraceFormat, InvalidArgument,
              what << ": field 'format' is '" << h.format << "', not a " << train::kStepTraceFormat);
  TERSE_CHECK(
      h.version == train::kStepTraceVersion, InvalidArgument,
      what << ": field 'version' is " << h.version << "; this terse replays version " << train::kStepTraceVersion);
  TERSE_CHECK(h.mode == "sync", InvalidArgument,
              what << ": field 'mode' is '" << h.mode << "'; only synchronous runs can be replayed");
  TERSE_CHECK(h.world >= 1, InvalidArgument, what << ": field 'world' must be >= 1, got " << h.world);
  TERSE_CHECK(!trace.steps.empty(), InvalidArgument, what << ": no steps recorded");
  for (std::size_t i = 0; i < h.tensors.size(); ++i)
    TERSE_CHECK(h.tensors[i].id == i, InvalidArgument,
                what << ": field 'tensors': entry " << i << " has id " << h.tensors[i].id);
  const uint64_t nt = h.tensors.size();
  for (const train::TraceStep& s : trace.steps) {
    auto where = [&] { return what + ": step " + std::to_string(s.step) + ": "; };
    for (const auto& c : s.compute) {
      TERSE_CHECK(std::isfinite(c.dur_s) && c.dur_s >= 0, InvalidArgument,
                  where() << "field 'compute.dur_s' is " << c.dur_s);
      for (uint64_t id : c.ready)
        TERSE_CHECK(id < nt, InvalidArgument, where() << "field 'compute.ready' names unknown tensor " << id);
    }
    for (const auto& g : s.groups) {
      for (const auto& [id, chunk] : g.chunks)
        TERSE_CHECK(id < nt, InvalidArgument,
                    where() << "group " << g.seq << ": field 'chunks' names unknown tensor " << id);
      for (const auto& p : g.phases) {
        TERSE_CHECK(std::isfinite(p.dur_s) && p.dur_s >= 0, InvalidArgument,
                    where() << "group " << g.seq << ": field 'phases.dur_s' is " << p.dur_s);
        if (p.kind != train::TracePhase::Kind::kCollective) continue;
        TERSE_CHECK(p.op == "allreduce" || p.op == "allgatherv" || p.op == "allgather_sizes", InvalidArgument,
                    where() << "group " << g.seq << ": field 'phases.op' is '" << p.op
                            << "' (a replay knows allreduce, allgatherv, allgather_sizes)");
      }
    }
    for (const auto& u : s.updates)
      TERSE_CHECK(u.tensor < nt, InvalidArgument,
                  where() << "field 'updates.tensor' names unknown tensor " << u.tensor);
  }
}

ReplayResult replayTrace(const std::vector<train::StepTrace>& ranks, const ReplayOptions& options) {
  options.validate();
  TERSE_CHECK(!ranks.empty(), InvalidArgument, "replay: no trace to replay");
  for (std::size_t r = 0; r < ranks.size(); ++r) checkReplayable(ranks[r], "trace of rank " + std::to_string(r));
  const train::StepTrace& lead = ranks.front();
  const std::size_t recorded = lead.steps.size();
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    TERSE_CHECK(ranks[r].steps.size() == recorded && ranks[r].header.tensors.size() == lead.header.tensors.size(),
                InvalidArgument,
                "replay: the trace of rank " << r << " has " << ranks[r].steps.size() << " steps and "
                                             << ranks[r].header.tensors.size() << " tensors, rank 0's " << recorded
                                             << " and " << lead.header.tensors.size());
    for (std::size_t s = 0; s < recorded; ++s)
      TERSE_CHECK(ranks[r].steps[s].groups.size() == lead.steps[s].groups.size(), InvalidArgument,
                  "replay: step " << lead.steps[s].step << ": rank " << r << " ran " << ranks[r].steps[s].groups.size()
                                  << " groups, rank 0 " << lead.steps[s].groups.size());
  }
  const int n = options.workers;
  const int steps = options.steps > 0 ? options.steps : static_cast<int>(recorded);
  const int rpn = options.topology.enabled() ? options.topology.workers_per_node : 1;
  const train::TraceHeader& h = lead.header;

  // The recorded compute a step (rank 0's segments, median over its steps), and the factor that makes it the
  // device's when the options give a FLOP count and rate.
  std::vector<double> recorded_compute;
  for (const auto& st : lead.steps) {
    double c = 0;
    for (const auto& seg : st.compute) c += seg.dur_s;
    recorded_compute.push_back(c);
  }
  const double recorded_compute_s = median(recorded_compute);
  double scale = options.compute_scale;
  if (options.step_flops > 0) {
    TERSE_CHECK(recorded_compute_s > 0, InvalidArgument,
                "replay: --step-flops/--device-flops scale the trace's compute, but its steps record none");
    scale = options.step_flops / options.device_flops / recorded_compute_s;
  }

  // The algorithms as configured ("auto" or a name), or as the options override them; an unknown name (a trace from
  // NCCL says "nccl", one from the PyTorch hook "torch:gloo") is auto's.
  const auto configured_ar =
      comm::parseAllreduceAlgorithm(options.allreduce.empty() ? h.allreduce_algorithm : options.allreduce);
  const auto configured_ag =
      comm::parseAllgatherAlgorithm(options.allgather.empty() ? h.allgather_algorithm : options.allgather);

  // Every collective of the replayed steps, priced as rounds (identical phases share one entry).
  Planner planner(n, rpn);
  std::map<std::string, PricedCollective> priced;
  auto keyOf = [](const train::TracePhase& p) {
    std::ostringstream k;
    k << p.op << '/' << p.bytes;
    for (uint64_t b : p.rank_bytes) k << ',' << b;
    return k.str();
  };
  std::map<std::string, double> sent_per_worker;  // by collective key: mean bytes a worker sends
  for (std::size_t s = 0; s < recorded; ++s) {
    for (const auto& g : lead.steps[s].groups) {
      for (const auto& p : g.phases) {
        if (p.kind != train::TracePhase::Kind::kCollective) continue;
        const std::string key = keyOf(p);
        if (priced.count(key)) continue;
        PricedCollective c;
        if (p.op == "allreduce") {
          comm::AllreduceAlgorithm a = configured_ar.value_or(comm::AllreduceAlgorithm::kAuto);
          if (a == comm::AllreduceAlgorithm::kAuto) a = comm::autoAllreduceChoice(n, rpn, p.bytes);
          // An empty buffer sends nothing: every algorithm returns at once (a PowerSGD round of a vector tensor).
          if (p.bytes > 0) c.rounds = planner.allreduce(a, static_cast<double>(p.bytes));
          c.label = p.bytes > 0 ? "allreduce " + std::string(comm::allreduceAlgorithmName(a)) : "allreduce of 0 bytes";
        } else {
          // allgatherv: worker w's block is the recorded rank_bytes[w mod W]; allgather_sizes: 8 bytes each.
          double total = 0;
          if (p.op == "allgather_sizes") {
            total = 8.0 * n;
          } else if (p.rank_bytes.empty()) {
            total = static_cast<double>(p.bytes) * n;
          } else {
            const std::size_t w = p.rank_bytes.size();
            const double sum = std::accumulate(p.rank_bytes.begin(), p.rank_bytes.end(), 0.0);
            const std::size_t whole = static_cast<std::size_t>(n) / w;
            total = sum * static_cast<double>(whole);
            for (std::size_t i = 0; i < static_cast<std::size_t>(n) % w; ++i)
              total += static_cast<double>(p.rank_bytes[i]);
          }
          comm::AllgatherAlgorithm a = configured_ag.value_or(comm::AllgatherAlgorithm::kAuto);
          if (a == comm::AllgatherAlgorithm::kAuto) a = comm::allgatherChoice(n, rpn, static_cast<uint64_t>(total));
          c.rounds = planner.allgather(a, total);
          c.label = p.op + " " + std::string(comm::allgatherAlgorithmName(a));
        }
        priced.emplace(key, std::move(c));
      }
    }
  }

  // The scheduler negotiation's rounds (step_trace.h): one 8-byte word per worker, by the algorithm the trace says
  // ran (the host communicator's Bruck), at N.
  const std::string kNegotiationKey = "negotiation";
  bool negotiates = false;
  for (std::size_t s = 0; s < recorded && !negotiates; ++s) negotiates = !lead.steps[s].negotiations.empty();
  if (negotiates) {
    const auto recorded_algo = comm::parseAllgatherAlgorithm(lead.steps.front().negotiations.empty()
                                                                 ? std::string("bruck")
                                                                 : lead.steps.front().negotiations.front().algorithm);
    comm::AllgatherAlgorithm a = recorded_algo.value_or(comm::AllgatherAlgorithm::kBruck);
    if (a == comm::AllgatherAlgorithm::kAuto) a = comm::AllgatherAlgorithm::kBruck;
    PricedCollective c;
    c.rounds = planner.allgather(a, 8.0 * n);
    c.label = "negotiation " + std::string(comm::allgatherAlgorithmName(a));
    priced.emplace(kNegotiationKey, std::move(c));
  }

  // The patterns on SimGrid.
  SimulationOptions sim;
  sim.platform.ranks = n;
  sim.platform.links = options.links;
  sim.platform.topology = options.topology;
  sim.compute.model = ComputeModel::kNone;
  const auto& patterns = planner.patterns();
  std::string measured_text = "{\"patterns\":{},\"classes\":{}}";
  if (!patterns.empty())
    measured_text = runSimulation(sim, [&](const SimulationContext& ctx) { return measurePatterns(patterns, ctx); });
  const auto measured = parseJson(measured_text);
  TERSE_CHECK(measured.has_value(), InternalError, "replay: the simulation's answer is not JSON");
  std::map<std::string, PatternCost> costs;
  for (const auto& [key, v] : (*measured)["patterns"].items()) {
    PatternCost c;
    c.latency_s = v["latency_s"].get<double>();
    c.s_per_byte = v["s_per_byte"].get<double>();
    c.flows = v["flows"].get<double>();
    for (const auto& [cls, x] : v["crossings"].items()) c.crossings[cls] = x.get<double>();
    costs[key] = std::move(c);
  }

  // Each collective's time, bytes per worker and bytes per link class.
  struct CollectiveCost {
    double seconds = 0;
    double sent_per_worker = 0;
    std::map<std::string, double> class_bytes;
    const std::string* label = nullptr;
  };
  std::unordered_map<std::string, CollectiveCost> collective;
  for (const auto& [key, c] : priced) {
    CollectiveCost cc;
    cc.label = &c.label;
    for (const Round& r : c.rounds) {
      const PatternCost& pc = costs.at(r.pattern);
      cc.seconds += r.latencies * pc.latency_s + (r.timed >= 0 ? r.timed : r.bytes) * pc.s_per_byte;
      cc.sent_per_worker += r.bytes * pc.flows / n;
      for (const auto& [cls, x] : pc.crossings) cc.class_bytes[cls] += x * r.bytes;
    }
    collective[key] = std::move(cc);
  }

  // Worker behaviours: (recorded rank, straggler) without jitter, where identical workers share a timeline; every
  // worker its own with it.
  const std::size_t nr = ranks.size();
  struct Behaviour {
    std::size_t rank = 0;
    double slow = 1;
    int first_worker = 0;  // seeds its jitter
  };
  std::vector<Behaviour> behaviours;
  if (options.jitter_sigma > 0) {
    for (int w = 0; w < n; ++w)
      behaviours.push_back(
          {static_cast<std::size_t>(w) % nr, w < options.stragglers ? options.straggler_factor : 1, w});
  } else {
    std::set<std::pair<std::size_t, bool>> seen;
    for (int w = 0; w < n; ++w) {
      const bool slow = w < options.stragglers;
      if (seen.insert({static_cast<std::size_t>(w) % nr, slow}).second)
        behaviours.push_back({static_cast<std::size_t>(w) % nr, slow ? options.straggler_factor : 1, w});
      if (seen.size() == 2 * nr) break;
    }
  }
  const std::size_t nb = behaviours.size();
  const std::size_t nt = h.tensors.size();
  std::vector<std::vector<uint64_t>> layer_tensors(static_cast<std::size_t>(std::max(h.layers, 0)) + 1);
  for (const auto& t : h.tensors) {
    const auto l = static_cast<std::size_t>(std::max(t.layer, 0));
    if (l >= layer_tensors.size()) layer_tensors.resize(l + 1);
    layer_tensors[l].push_back(t.id);
  }
  std::vector<std::mt19937_64> rng;
  for (const Behaviour& b : behaviours)
    rng.emplace_back(options.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(b.first_worker));
  std::normal_distribution<double> normal(0.0, options.jitter_sigma > 0 ? options.jitter_sigma : 1.0);

  std::vector<double> compute_free(nb, 0), comm_free(nb, 0), arrive(nb, 0);
  std::vector<std::vector<double>> updated(nb, std::vector<double>(nt, 0)), ready(nb, std::vector<double>(nt, 0));
  std::vector<double> busy(nb, 0);
  ReplayResult result;
  result.workers = n;
  result.platform = describePlatform(sim.platform);
  result.behaviours = static_cast<int>(nb);
  result.patterns = static_cast<int>(patterns.size());
  for (const auto& [key, f] : patterns) result.flows += f.size();
  std::map<std::string, double> class_bytes;
  std::map<std::string, int> per_step_count;  // label -> collectives in the replay
  double prev_end = 0, compute_sum = 0, optimizer_sum = 0, exposed_sum = 0, comm_sum = 0, sent_sum = 0;
  result.recorded_compute_s = recorded_compute_s;
  result.compute_scale = scale;
  const double codec_scale = options.codec_scale > 0 ? options.codec_scale : scale;
  const bool reorder = options.order != ReplayOptions::Order::kRecorded;
  if (reorder)
    for (std::size_t r = 0; r < nr; ++r) checkReorderable(ranks[r], "the trace of rank " + std::to_string(r));
  // A PyTorch trace as recorded: DDP's optimizer step, after backward returns. Re-ordered, the updates follow their
  // tensors' last groups (a per-parameter optimizer, as ByteScheduler's PyTorch plugin runs one).
  const bool pytorch = h.source == "pytorch";
  const bool updates_after_backward = pytorch && !reorder;
  // Each tensor's layer, for the priority order (the front-most layer's group goes first).
  std::vector<int> layer_of(nt, 0);
  for (const auto& t : h.tensors) layer_of[t.id] = t.layer;
  // Each recorded rank's updates a recorded step (the optimizer's time), summed once rather than per worker and step.
  std::vector<std::vector<double>> recorded_updates_s(nr, std::vector<double>(recorded, 0.0));
  for (std::size_t r = 0; r < nr; ++r)
    for (std::size_t i = 0; i < recorded; ++i)
      for (const auto& u : ranks[r].steps[i].updates) recorded_updates_s[r][i] += u.dur_s * scale;
  for (int s = 0; s < steps; ++s) {
    const std::size_t si = static_cast<std::size_t>(s) % recorded;
    // Compute: each behaviour's segments in order.
    for (std::size_t b = 0; b < nb; ++b) {
      const train::TraceStep& st = ranks[behaviours[b].rank].steps[si];
      double t = compute_free[b];
      busy[b] = 0;
      std::fill(ready[b].begin(), ready[b].end(), -1.0);
      for (const auto& c : st.compute) {
        if (c.kind == train::TraceCompute::Kind::kForward && static_cast<std::size_t>(c.layer) < layer_tensors.size())
          for (uint64_t id : layer_tensors[static_cast<std::size_t>(c.layer)]) t = std::max(t, updated[b][id]);
        double d = c.dur_s * scale * behaviours[b].slow;
        if (options.jitter_sigma > 0) d *= std::exp(normal(rng[b]));
        t += d;
        busy[b] += d;
        for (uint64_t id : c.ready) ready[b][id] = t;
      }
      compute_free[b] = t;
      // A tensor no backward reported is ready when the step's computation ends.
      for (double& r : ready[b])
        if (r < 0) r = t;
      comm_free[b] = std::max(comm_free[b], 0.0);
    }
    // The issue order. Re-issued, the communication side is one queue for the whole cluster (a collective needs every
    // worker): a group may go once its tensors are ready on every worker; whenever the side frees, the ready group
    // first by the order's key goes (fifo: the earliest ready; priority: the front-most layer, then the earliest
    // ready), or, when none is ready, the next to become so. A group holds the side for its collectives' network time,
    // the lead rank's codec times and the updates of the tensors it carries whole; the replay below then times the
    // chosen order exactly as it times a recorded one.
    auto issueOrder = [&](std::size_t step_index) {
      const auto& gs = lead.steps[step_index].groups;
      std::vector<std::size_t> order(gs.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      if (!reorder || gs.size() < 2) return order;
      const std::size_t ng = gs.size();
      std::vector<double> at(ng, 0), hold(ng, 0);
      std::vector<int> front(ng, std::numeric_limits<int>::max());
      std::vector<int> carriers(nt, 0);
      for (const auto& g : gs)
        for (const auto& [id, chunk] : g.chunks) ++carriers[id];
      std::vector<double> update_s(nt, 0);
      for (const auto& u : lead.steps[step_index].updates) update_s[u.tensor] = u.dur_s * scale;
      for (std::size_t g = 0; g < ng; ++g) {
        for (std::size_t b = 0; b < nb; ++b) {
          const auto& chunks = ranks[behaviours[b].rank].steps[step_index].groups[g].chunks;
          if (chunks.empty()) at[g] = std::max(at[g], compute_free[b]);  // see the replay below
          for (const auto& [id, chunk] : chunks) at[g] = std::max(at[g], ready[b][id]);
        }
        for (const auto& [id, chunk] : gs[g].chunks) {
          front[g] = std::min(front[g], layer_of[id]);
          if (carriers[id] == 1) hold[g] += update_s[id];
        }
        for (const auto& ph : gs[g].phases)
          hold[g] += ph.kind == train::TracePhase::Kind::kCollective ? collective.at(keyOf(ph)).seconds
                                                                     : ph.dur_s * codec_scale;
      }
      const bool by_layer = options.order == ReplayOptions::Order::kPriority;
      auto before = [&](std::size_t a, std::size_t b) {
        if (by_layer && front[a] != front[b]) return front[a] < front[b];
        return at[a] != at[b] ? at[a] < at[b] : a < b;
      };
      std::vector<char> issued(ng, 0);
      double t = *std::max_element(comm_free.begin(), comm_free.end());
      for (std::size_t k = 0; k < ng; ++k) {
        std::size_t pick = ng, next = ng;
        for (std::size_t g = 0; g < ng; ++g) {
          if (issued[g]) continue;
          if (at[g] <= t && (pick == ng || before(g, pick))) pick = g;
          if (next == ng || at[g] < at[next] || (at[g] == at[next] && before(g, next))) next = g;
        }
        if (pick == ng) pick = next;
        issued[pick] = 1;
        order[k] = pick;
        t = std::max(t, at[pick]) + hold[pick];
      }
      return order;
    };
    // Communication: the groups in issue order (the recorded one, or re-issued by options.order).
    const auto& groups = lead.steps[si].groups;
    const std::vector<std::size_t> issue = issueOrder(si);
    std::vector<int> last_group(nt, -1);
    for (std::size_t gi : issue)
      for (const auto& [id, chunk] : groups[gi].chunks) last_group[id] = static_cast<int>(gi);
    // Each recorded rank's updates by the group that releases them: a scan of every update per group and worker was
    // tensors^2 x workers per step (a jittered replay at 1,024 workers spent 0.16 s of host time per step there).
    // A PyTorch trace's updates are the script's optimizer step, after backward returns: after the last group.
    std::vector<std::vector<std::vector<const train::TraceUpdate*>>> group_updates(nr);
    for (std::size_t r = 0; r < nr; ++r) {
      group_updates[r].resize(groups.size());
      for (const auto& u : ranks[r].steps[si].updates)
        if (last_group[u.tensor] >= 0)
          group_updates[r][updates_after_backward ? issue.back() : static_cast<std::size_t>(last_group[u.tensor])]
              .push_back(&u);
    }
    double step_comm = 0, step_sent = 0;
    // The negotiation rounds each group waited for: those recorded after the previous group's issue and up to its
    // own (every rank runs the same rounds; rank 0's are taken). The last of them agreed on the group's tensors, so
    // it starts once they are ready on every worker; the others ran while the communication side waited for them,
    // so they start when it was free. Rounds after the last group's issue hold up the next step's communication.
    const auto& rounds_recorded = lead.steps[si].negotiations;
    std::size_t next_round = 0;
    const CollectiveCost* negotiation = negotiates ? &collective.at(kNegotiationKey) : nullptr;
    auto countRounds = [&](double until) {
      std::size_t k = 0;
      while (next_round < rounds_recorded.size() && rounds_recorded[next_round].start_s <= until) ++next_round, ++k;
      return k;
    };
    auto chargeRounds = [&](std::size_t k) {
      step_comm += static_cast<double>(k) * negotiation->seconds;
      step_sent += static_cast<double>(k) * negotiation->sent_per_worker;
      for (const auto& [cls, x] : negotiation->class_bytes) class_bytes[cls] += static_cast<double>(k) * x;
      per_step_count[*negotiation->label] += static_cast<int>(k);
    };
    for (std::size_t gi : issue) {
      const std::size_t k = negotiation ? countRounds(groups[gi].issue_s) : 0;
      for (std::size_t b = 0; b < nb; ++b) {
        double a = comm_free[b] + (k > 1 ? static_cast<double>(k - 1) * negotiation->seconds : 0.0);
        const auto& chunks = ranks[behaviours[b].rank].steps[si].groups[gi].chunks;
        // A group that carries no tensor (a PyTorch local SGD averaging's finiteness check or buffers) was issued
        // after the step's computation, as every group of an averaging is.
        if (chunks.empty()) a = std::max(a, compute_free[b]);
        for (const auto& [id, chunk] : chunks) a = std::max(a, ready[b][id]);
        arrive[b] = a;
      }
      if (k > 0) {
        // The agreeing round: a collective of every worker.
        const double start = *std::max_element(arrive.begin(), arrive.end());
        for (double& a : arrive) a = start + negotiation->seconds;
        chargeRounds(k);
      }
      const auto& phases = groups[gi].phases;
      for (std::size_t pi = 0; pi < phases.size(); ++pi) {
        if (phases[pi].kind == train::TracePhase::Kind::kCollective) {
          const CollectiveCost& cc = collective.at(keyOf(phases[pi]));
          const double start = *std::max_element(arrive.begin(), arrive.end());
          for (double& a : arrive) a = start + cc.seconds;
          step_comm += cc.seconds;
          step_sent += cc.sent_per_worker;
          for (const auto& [cls, x] : cc.class_bytes) class_bytes[cls] += x;
          ++per_step_count[*cc.label];
        } else {
          for (std::size_t b = 0; b < nb; ++b) {
            const auto& mine = ranks[behaviours[b].rank].steps[si].groups[gi].phases;
            arrive[b] += (pi < mine.size() ? mine[pi].dur_s : phases[pi].dur_s) * codec_scale;
          }
        }
      }
      // The updates of the tensors whose last chunk this group carried.
      for (std::size_t b = 0; b < nb; ++b) {
        for (const train::TraceUpdate* u : group_updates[behaviours[b].rank][gi]) {
          arrive[b] += u->dur_s * scale;
          updated[b][u->tensor] = arrive[b];
        }
        for (const auto& [id, chunk] : groups[gi].chunks)
          if (last_group[id] == static_cast<int>(gi)) updated[b][id] = std::max(updated[b][id], arrive[b]);
        comm_free[b] = arrive[b];
      }
    }
    if (negotiation) {
      const std::size_t k = rounds_recorded.size() - next_round;
      next_round = rounds_recorded.size();
      if (k > 0) {
        const double start = *std::max_element(comm_free.begin(), comm_free.end());
        for (double& c : comm_free) c = start + static_cast<double>(k) * negotiation->seconds;
        chargeRounds(k);
      }
    }
    // Tensors no group carried (nothing to exchange) are updated by the worker once ready. A PyTorch trace's are the
    // script's optimizer step, one tensor after the other once backward has returned and the step's groups are done
    // (a local SGD step, which exchanges nothing, is its computation and then its whole optimizer step), and the next
    // forward begins when optimizer.step() has returned: every tensor counts as updated at its end.
    // Re-issued (a per-parameter optimizer), the tensors a group released are updated as it lands, and those no group
    // carried still one after the other once backward has returned: there is nothing to re-order in a local step.
    for (std::size_t b = 0; b < nb; ++b) {
      const train::TraceStep& st = ranks[behaviours[b].rank].steps[si];
      if (pytorch) {
        double t = std::max(compute_free[b], groups.empty() ? 0.0 : comm_free[b]);
        for (const auto& u : st.updates)
          if (last_group[u.tensor] < 0) updated[b][u.tensor] = t += u.dur_s * scale;
        if (updates_after_backward)
          for (double& u : updated[b]) u = std::max(u, t);
        continue;
      }
      std::vector<double> udur(nt, 0);
      for (const auto& u : st.updates) udur[u.tensor] = u.dur_s * scale;
      for (std::size_t id = 0; id < nt; ++id)
        if (last_group[id] < 0) updated[b][id] = ready[b][id] + udur[id];
    }
    double end = prev_end;
    double busiest = 0, optimizer = 0, serial = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      end = std::max(end, compute_free[b]);
      for (double u : updated[b]) end = std::max(end, u);
      busiest = std::max(busiest, busy[b]);
      const double updates = recorded_updates_s[behaviours[b].rank][si];
      optimizer = std::max(optimizer, updates);
      serial = std::max(serial, busy[b] + updates);
    }
    const double step_s = end - prev_end;
    prev_end = end;
    result.step_s.push_back(step_s);
    compute_sum += busiest;
    optimizer_sum += optimizer;
    // A PyTorch trace's optimizer runs after backward and the groups, on no communication's path: the step's own work,
    // as its computation is. terse's trainer updates on the communication side, where an update is part of what the
    // exchange leaves exposed.
    exposed_sum += std::max(0.0, step_s - (updates_after_backward ? serial : busiest));
    comm_sum += step_comm;
    sent_sum += step_sent;
  }
  const double k = std::max(steps, 1);
  result.mean_step_s = std::accumulate(result.step_s.begin(), result.step_s.end(), 0.0) / k;
  result.median_step_s = median(result.step_s);
  result.compute_s = compute_sum / k;
  result.optimizer_s = optimizer_sum / k;
  result.exposed_comm_s = exposed_sum / k;
  result.comm_s = comm_sum / k;
  result.bytes_per_worker = sent_sum / k;
  for (const auto& [label, count] : per_step_count) {
    std::ostringstream line;
    line << label << " x " << count / k << " per step";
    result.collectives.push_back(line.str());
  }
  for (const auto& [cls, v] : (*measured)["classes"].items()) {
    LinkClassUse u;
    u.name = cls;
    u.links = static_cast<int>(v[0].get<double>());
    u.capacity_bytes_per_s = v[1].get<double>();
    u.bytes = class_bytes.count(cls) ? class_bytes[cls] : 0.0;
    u.utilisation = prev_end > 0 && u.capacity_bytes_per_s > 0 ? u.bytes / (u.capacity_bytes_per_s * prev_end) : 0;
    result.links.push_back(u);
  }
  return result;
}

int64_t stepToAccuracy(const std::filesystem::path& metrics, double target) {
  std::ifstream in(metrics);
  TERSE_CHECK(in.good(), InvalidArgument,
              metrics.string() << ": cannot open (a time to accuracy needs the run's metrics.jsonl beside the trace)");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    std::string why;
    const auto obj = parseJsonObject(line, &why);
    TERSE_CHECK(obj.has_value(), InvalidArgument,
                metrics.string() << ":" << n << ": not a JSON object (" << why << ")");
    const auto step = getNumber(*obj, "step");
    const auto acc = getNumber(*obj, "test_accuracy");
    TERSE_CHECK(step && acc, InvalidArgument,
                metrics.string() << ":" << n << ": an evaluation record needs numeric 'step' and 'test_accuracy'");
    if (*acc >= target) return static_cast<int64_t>(*step);
  }
  return -1;
}

train::StepTrace syntheticStepTrace(const SyntheticTraceSpec& spec) {
  TERSE_CHECK(!spec.layers.empty(), InvalidArgument, "synthetic trace: no layers");
  TERSE_CHECK(spec.steps >= 1 && spec.world >= 1, InvalidArgument, "synthetic trace: steps and world must be >= 1");
  train::StepTrace trace;
  train::TraceHeader& h = trace.header;
  h.world = spec.world;
  h.workload = "synthetic";
  h.compressor = spec.wire_ratio == 1.0 ? "none" : "synthetic";
  h.scheduler = spec.bucket_bytes == 0 ? "fifo" : "fusion";
  h.allreduce_algorithm = spec.allreduce;
  h.allgather_algorithm = "auto";
  h.clock = "simulated";
  h.compute_model = "synthetic";
  h.layers = static_cast<int>(spec.layers.size());
  for (std::size_t l = 0; l < spec.layers.size(); ++l)
    for (uint64_t e : spec.layers[l].tensors) {
      train::TraceTensor t;
      t.id = h.tensors.size();
      t.name = "layer" + std::to_string(l) + "." + std::to_string(t.id);
      t.elements = e;
      t.layer = static_cast<int>(l);
      h.tensors.push_back(t);
    }
  for (int s = 0; s < spec.steps; ++s) {
    train::TraceStep st;
    st.step = s;
    double t = 0;
    for (std::size_t l = 0; l < spec.layers.size(); ++l) {
      st.compute.push_back({train::TraceCompute::Kind::kForward, static_cast<int>(l), t, spec.layers[l].forward_s, {}});
      t += spec.layers[l].forward_s;
    }
    // Backward from the last layer; groups close on bucket_bytes in that order.
    std::vector<uint64_t> pending;
    uint64_t pending_bytes = 0;
    auto close = [&](double at) {
      if (pending.empty()) return;
      train::TraceGroup g;
      g.seq = static_cast<uint64_t>(s) * 1000000 + st.groups.size();
      g.issue_s = at;
      for (uint64_t id : pending) {
        g.chunks.emplace_back(id, 0);
        g.chunk_elements.push_back(h.tensors[id].elements);
      }
      const double bytes = static_cast<double>(pending_bytes);
      train::TracePhase compress{
          train::TracePhase::Kind::kCompress, at, bytes * spec.compress_s_per_byte, "", "", "", 0, {}};
      train::TracePhase coll{train::TracePhase::Kind::kCollective,
                             at,
                             0,
                             "allreduce",
                             "ring",
                             "f32",
                             static_cast<uint64_t>(std::llround(bytes * spec.wire_ratio)),
                             {}};
      train::TracePhase decompress{
          train::TracePhase::Kind::kDecompress, at, bytes * spec.compress_s_per_byte, "", "", "", 0, {}};
      if (spec.compress_s_per_byte > 0) g.phases.push_back(compress);
      g.phases.push_back(coll);
      if (spec.compress_s_per_byte > 0) g.phases.push_back(decompress);
      st.groups.push_back(std::move(g));
      pending.clear();
      pending_bytes = 0;
    };
    for (std::size_t l = spec.layers.size(); l-- > 0;) {
      train::TraceCompute c{
          train::TraceCompute::Kind::kBackward, static_cast<int>(l), t, spec.layers[l].backward_s, {}};
      t += spec.layers[l].backward_s;
      for (const auto& tensor : h.tensors)
        if (tensor.layer == static_cast<int>(l)) c.ready.push_back(tensor.id);
      st.compute.push_back(c);
      for (auto it = c.ready.rbegin(); it != c.ready.rend(); ++it) {
        pending.push_back(*it);
        pending_bytes += 4 * h.tensors[*it].elements;
        if (pending_bytes >= spec.bucket_bytes) close(t);
      }
    }
    close(t);
    for (const auto& tensor : h.tensors)
      st.updates.push_back({tensor.id, t, static_cast<double>(tensor.elements) * spec.update_s_per_param});
    st.step_s = t;
    trace.steps.push_back(std::move(st));
  }
  return trace;
}

std::vector<SyntheticLayer> resnet50Layers(double step_compute_s) {
  struct Conv {
    int k, cin, cout, out_hw;
  };
  std::vector<Conv> convs{{7, 3, 64, 112}};
  int in = 64;
  const int blocks[] = {3, 4, 6, 3};
  const int widths[] = {64, 128, 256, 512};
  const int sizes[] = {56, 28, 14, 7};
  for (int stage = 0; stage < 4; ++stage) {
    const int w = widths[stage], hw = sizes[stage];
    for (int b = 0; b < blocks[stage]; ++b) {
      convs.push_back({1, in, w, b == 0 && stage > 0 ? hw * 2 : hw});
      convs.push_back({3, w, w, hw});
      convs.push_back({1, w, 4 * w, hw});
      if (b == 0) convs.push_back({1, in, 4 * w, hw});  // the projection shortcut
      in = 4 * w;
    }
  }
  std::vector<SyntheticLayer> layers;
  std::vector<double> macs;
  for (const Conv& c : convs) {
    const auto weights = static_cast<uint64_t>(c.k) * c.k * c.cin * c.cout;
    layers.push_back({{weights, static_cast<uint64_t>(c.cout), static_cast<uint64_t>(c.cout)}, 0, 0});
    macs.push_back(static_cast<double>(weights) * c.out_hw * c.out_hw);
  }
  layers.push_back({{2048ULL * 1000, 1000}, 0, 0});
  macs.push_back(2048.0 * 1000);
  const double total = std::accumulate(macs.begin(), macs.end(), 0.0);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    layers[i].forward_s = step_compute_s / 3 * macs[i] / total;
    layers[i].backward_s = 2 * layers[i].forward_s;
  }
  return layers;
}

}  // namespace terse::sim

// The replay of a step trace at N workers (core/sim/replay.h): hand-built traces whose step times follow from the
// alpha-beta model and the replay's rules (compute, a collective's rounds, overlap behind a later layer's backward, the
// scheduler's issue order), the topology (racks' oversubscribed uplinks), allgather payloads redrawn at N, seeded
// jitter and stragglers, the synthetic ResNet-50 and the refusals of bad options and traces.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/sim/replay.h"

namespace terse::sim {
namespace {

using train::StepTrace;
using train::TraceCompute;
using train::TracePhase;

constexpr double kGbps = 1e9;

// A layer of one tensor: its elements and forward / backward times.
struct Layer {
  uint64_t elements;
  double forward_s;
  double backward_s;
};

// A trace of `steps` identical steps: forward 0..L-1, backward L-1..0 (layer l's tensor l ready at its end), then one
// group per entry of `order` (tensor ids), each one allreduce of `bytes[i]`, issued in that order.
StepTrace handTrace(const std::vector<Layer>& layers, const std::vector<uint64_t>& order,
                    const std::vector<uint64_t>& bytes, int steps = 3, const std::string& algorithm = "ring") {
  StepTrace t;
  t.header.world = 2;
  t.header.allreduce_algorithm = algorithm;
  t.header.allgather_algorithm = "ring";
  t.header.layers = static_cast<int>(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l)
    t.header.tensors.push_back({l, "w" + std::to_string(l), layers[l].elements, static_cast<int>(l)});
  for (int s = 0; s < steps; ++s) {
    train::TraceStep st;
    st.step = s;
    for (std::size_t l = 0; l < layers.size(); ++l)
      st.compute.push_back({TraceCompute::Kind::kForward, static_cast<int>(l), 0, layers[l].forward_s, {}});
    for (std::size_t l = layers.size(); l-- > 0;)
      st.compute.push_back({TraceCompute::Kind::kBackward, static_cast<int>(l), 0, layers[l].backward_s, {l}});
    for (std::size_t i = 0; i < order.size(); ++i) {
      train::TraceGroup g;
      g.seq = static_cast<uint64_t>(s * 100) + i;
      g.chunks = {{order[i], 0}};
      g.chunk_elements = {layers[order[i]].elements};
      g.phases.push_back({TracePhase::Kind::kCollective, 0, 0, "allreduce", "ring", "f32", bytes[i], {}});
      st.groups.push_back(g);
    }
    for (std::size_t l = 0; l < layers.size(); ++l) st.updates.push_back({l, 0, 0});
    t.steps.push_back(st);
  }
  return t;
}

// Per-pair wires of `bps` and `latency` with a NIC of the same rate per rank (one port, as the bench's default).
ReplayOptions mesh(int workers, double bps, double latency) {
  ReplayOptions o;
  o.workers = workers;
  o.links.link = comm::LinkSpec{bps, latency};
  o.links.nic_egress_bps = bps;
  o.links.nic_ingress_bps = bps;
  return o;
}

void expectRel(double got, double want, double rel = 1e-6) {
  EXPECT_NEAR(got, want, rel * std::abs(want)) << "got " << got << ", want " << want;
}

TEST(Replay, NegotiationRoundsSitOnTheCriticalPath) {
  // The one-layer trace above, with the scheduler negotiation's rounds recorded (step_trace.h): one before the group
  // (the round that agreed on its tensor), two before it of which one waited while the tensor was not ready (no
  // cost: it ran during the backward), and one after the group (which holds up the next step's communication, not
  // this step's end). Each round is an 8-byte Bruck allgather: at 2 workers one exchange of a latency and 8 bytes.
  const double round = 50e-6 + 8 / 125e6;
  const double bare = 0.030 + 2 * 50e-6 + 1e6 / 125e6;
  auto traced = [&](std::vector<double> starts) {
    StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
    for (auto& st : t.steps) {
      st.groups[0].issue_s = 0.030;
      for (double at : starts) st.negotiations.push_back({at, 0, "bruck"});
    }
    return replayTrace({t}, mesh(2, 1 * kGbps, 50e-6));
  };
  const ReplayResult one = traced({0.030});
  for (double s : one.step_s) expectRel(s, bare + round);
  expectRel(traced({0.010, 0.030}).step_s.at(0), bare + round);
  // A round after the group: the step ends as before, and the next step's group waits for it only if the worker's
  // communication is still busy when the tensor is ready (it is not: 30 ms of compute come first).
  const ReplayResult after = traced({0.030, 0.040});
  expectRel(after.step_s.at(0), bare + round);
  expectRel(after.step_s.at(1), bare + round);
  bool listed = false;
  for (const std::string& c : one.collectives) listed = listed || c.starts_with("negotiation bruck x 1 per step");
  EXPECT_TRUE(listed) << "the negotiation is one of the replay's collectives";
}

TEST(Replay, AnEmptyAllreduceCostsNothing) {
  // PowerSGD's first round of a vector tensor allreduces 0 bytes; the communicator's algorithms return at once, so a
  // replay that charged it latencies (2 (N-1) of them for a ring) made the step 20% long at 64 workers.
  StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
  const double with_one = replayTrace({t}, mesh(16, 1 * kGbps, 50e-6)).median_step_s;
  for (auto& st : t.steps)
    st.groups[0].phases.insert(st.groups[0].phases.begin(),
                               {TracePhase::Kind::kCollective, 0, 0, "allreduce", "ring", "f32", 0, {}});
  expectRel(replayTrace({t}, mesh(16, 1 * kGbps, 50e-6)).median_step_s, with_one);
}

TEST(Replay, OneLayerRingAtTwoWorkersIsComputePlusAlphaBeta) {
  // 10 ms forward, 20 ms backward, 1 MB on a 1 Gbps / 50 us link: a ring of 2 pays 2 latencies and sends 2 (n-1)/n of
  // the buffer, the whole megabyte, at 125 MB/s.
  const StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
  const ReplayResult r = replayTrace({t}, mesh(2, 1 * kGbps, 50e-6));
  const double want = 0.030 + 2 * 50e-6 + 1e6 / 125e6;
  ASSERT_EQ(r.step_s.size(), 3u);
  for (double s : r.step_s) expectRel(s, want);
  expectRel(r.median_step_s, want);
  expectRel(r.compute_s, 0.030);
  expectRel(r.exposed_comm_s, want - 0.030);
  expectRel(r.bytes_per_worker, 1e6);
  ASSERT_EQ(r.collectives.size(), 1u);
  EXPECT_EQ(r.collectives[0], "allreduce ring x 1 per step");
}

TEST(Replay, AutoResolvesAtTheReplayedWorldSize) {
  // auto at 2 ranks and 64 KB is recursive doubling (allreduce_auto.cc): one latency and the whole buffer, once.
  const StepTrace t = handTrace({{16000, 0.001, 0.002}}, {0}, {64000}, 2, "auto");
  const ReplayResult r = replayTrace({t}, mesh(2, 1 * kGbps, 50e-6));
  expectRel(r.median_step_s, 0.003 + 50e-6 + 64000 / 125e6);
  EXPECT_EQ(r.collectives.at(0), "allreduce rd x 1 per step");
  // At 16 workers it is halving-doubling: 2 log2(16) = 8 latencies and 2 (n-1)/n of the buffer.
  const ReplayResult r16 = replayTrace({t}, mesh(16, 1 * kGbps, 50e-6));
  EXPECT_EQ(r16.collectives.at(0), "allreduce hd x 1 per step");
  expectRel(r16.median_step_s, 0.003 + 8 * 50e-6 + 2.0 * 15 / 16 * 64000 / 125e6);
}

TEST(Replay, CommunicationHidesBehindTheNextLayersBackward) {
  // Layer 1's group (5 ms on the wire) runs during layer 0's 8 ms backward; layer 0's (1 ms) is exposed.
  const double c1 = 625000 / 125e6, c0 = 125000 / 125e6;
  const StepTrace hidden = handTrace({{1, 0.004, 0.008}, {1, 0.004, 0.003}}, {1, 0}, {625000, 125000});
  const ReplayResult r = replayTrace({hidden}, mesh(2, 1 * kGbps, 0));
  expectRel(r.median_step_s, 0.004 + 0.004 + 0.003 + 0.008 + c0);
  expectRel(r.exposed_comm_s, c0);
  // With layer 0's backward shorter than layer 1's transfer, the rest of the transfer shows.
  const StepTrace exposed = handTrace({{1, 0.004, 0.001}, {1, 0.004, 0.003}}, {1, 0}, {625000, 125000});
  const ReplayResult e = replayTrace({exposed}, mesh(2, 1 * kGbps, 0));
  expectRel(e.median_step_s, 0.004 + 0.004 + 0.003 + c1 + c0);
}

TEST(Replay, APyTorchTraceUpdatesAfterItsLastGroup) {
  // The hidden case above with a 3 ms update of layer 1's tensor. terse's trainer updates a tensor as soon as its group
  // is in: the update hides in layer 0's backward as the transfer does (20 ms a step). A PyTorch trace's optimizer
  // runs after backward returned, so the update follows the last group: 3 ms more a step.
  StepTrace t = handTrace({{1, 0.004, 0.008}, {1, 0.004, 0.003}}, {1, 0}, {625000, 125000});
  for (auto& st : t.steps)
    for (auto& u : st.updates)
      if (u.tensor == 1) u.dur_s = 0.003;
  const double c0 = 125000 / 125e6;
  const ReplayResult native = replayTrace({t}, mesh(2, 1 * kGbps, 0));
  for (double s : native.step_s) expectRel(s, 0.004 + 0.004 + 0.003 + 0.008 + c0);
  t.header.source = "pytorch";
  const ReplayResult torch = replayTrace({t}, mesh(2, 1 * kGbps, 0));
  for (double s : torch.step_s) expectRel(s, 0.004 + 0.004 + 0.003 + 0.008 + c0 + 0.003);
}

TEST(Replay, APyTorchLocalSgdTraceRunsEachOptimizerStepAfterItsComputationAndAveragesAfterIt) {
  // terse.torch.LocalSGD's trace: three local steps (backward makes no tensor ready, no group), then a step whose
  // averaging sends both tensors' deltas in one group (ready when the computation ends, as recorded). Each step's
  // optimizer updates its two tensors, 2 ms each, one after the other once backward has returned: a local step is
  // its 19 ms of computation and then 4 ms of updates, the averaging step those and its collectives. terse's own
  // trainer updates a tensor as soon as it is ready, so its local step ends 2 ms after the computation.
  StepTrace t = handTrace({{1, 0.004, 0.008}, {1, 0.004, 0.003}}, {}, {}, 4);
  for (auto& st : t.steps) {
    for (auto& c : st.compute) c.ready.clear();
    for (auto& u : st.updates) u.dur_s = 0.002;
  }
  // The averaging: a check of no tensor (LocalSGD's finiteness check, 125 kB here so that it shows), then the deltas.
  train::TraceGroup& check = t.steps[3].groups.emplace_back();
  check.phases.push_back({TracePhase::Kind::kCollective, 0, 0, "allreduce", "ring", "f32", 125000, {}});
  train::TraceGroup& g = t.steps[3].groups.emplace_back();
  g.chunks = {{0, 0}, {1, 0}};
  g.chunk_elements = {1, 1};
  g.phases.push_back({TracePhase::Kind::kCollective, 0, 0, "allreduce", "ring", "f32", 625000, {}});
  // Both after the computation, one after the other: 750 kB on the wire in all.
  const double compute = 0.004 + 0.008 + 0.004 + 0.003, c = 750000 / 125e6;
  const ReplayResult native = replayTrace({t}, mesh(2, 1 * kGbps, 0));
  for (int s = 0; s < 3; ++s) expectRel(native.step_s.at(s), compute + 0.002);
  t.header.source = "pytorch";
  const ReplayResult torch = replayTrace({t}, mesh(2, 1 * kGbps, 0));
  for (int s = 0; s < 3; ++s) expectRel(torch.step_s.at(s), compute + 0.004);
  expectRel(torch.step_s.at(3), compute + c + 0.004);
  // The optimizer is the script's own work, not an exchange's: only the averaging's allreduce is exposed.
  expectRel(torch.optimizer_s, 0.004);
  expectRel(torch.exposed_comm_s, c / 4);
  expectRel(native.optimizer_s, 0.004);
  // Re-issued by a scheduler, a local step has nothing to re-order: the same updates, one tensor after the other
  // (not side by side). The per-parameter optimizer a re-issue assumes lets the next forward of layer 0 start once
  // its own tensor is updated, so layer 1's update hides under it from the second step on.
  ReplayOptions o = mesh(2, 1 * kGbps, 0);
  for (const auto order : {ReplayOptions::Order::kFifo, ReplayOptions::Order::kPriority}) {
    o.order = order;
    const ReplayResult r = replayTrace({t}, o);
    expectRel(r.step_s.at(0), compute + 0.004);
    for (int s = 1; s < 3; ++s) expectRel(r.step_s.at(s), compute + 0.002);
  }
}

TEST(Replay, PriorityOrderLetsTheNextForwardStartEarlier) {
  // Layers: f0 10 ms, f1 1 ms, b1 2 ms, b0 1 ms; layer 1's group 5 ms, layer 0's 0.5 ms on the wire.
  // fifo (backward order: 1 then 0): f0 + f1 + b1 + c1 + c0 per step.
  // priority (layer 0 first): layer 0's update is in c0 after b0, the next forward of layer 0 starts then and hides
  // layer 1's transfer: f0 + f1 + b1 + b0 + c0 per step once the pipeline runs (the first step pays c1 instead).
  const std::vector<Layer> layers{{1, 0.010, 0.001}, {1, 0.001, 0.002}};
  const double c1 = 625000 / 125e6, c0 = 62500 / 125e6;
  const StepTrace fifo = handTrace(layers, {1, 0}, {625000, 62500}, 4);
  const StepTrace priority = handTrace(layers, {0, 1}, {62500, 625000}, 4);
  const ReplayResult f = replayTrace({fifo}, mesh(2, 1 * kGbps, 0));
  const ReplayResult p = replayTrace({priority}, mesh(2, 1 * kGbps, 0));
  for (double s : f.step_s) expectRel(s, 0.010 + 0.001 + 0.002 + c1 + c0);
  expectRel(p.step_s[0], 0.010 + 0.001 + 0.002 + 0.001 + c0 + c1);
  for (std::size_t i = 1; i < p.step_s.size(); ++i) expectRel(p.step_s[i], 0.010 + 0.001 + 0.002 + 0.001 + c0);
  EXPECT_LT(p.median_step_s, f.median_step_s);
}

TEST(Replay, PriorityReissueSendsTheFrontLayerFirstAndUpdatesPerTensor) {
  // A PyTorch trace of three layers (forward 10, 1, 1 ms; each backward 1 ms) whose buckets DDP issued in backward
  // order: layer 2's and layer 1's 5 ms on the wire, layer 0's 0.5 ms. As recorded the optimizer waits for all three:
  // f + b2 + c2 + c1 + c0 a step. Re-issued fifo, the order and so the step are the same. Re-issued priority, layer
  // 0's group overtakes layer 1's (both wait while layer 2's transfers), its update is in at once and the next
  // forward starts under layer 1's transfer: f + b2 + c2 + c0 a step once the pipeline runs.
  const std::vector<Layer> layers{{1, 0.010, 0.001}, {1, 0.001, 0.001}, {1, 0.001, 0.001}};
  StepTrace t = handTrace(layers, {2, 1, 0}, {625000, 625000, 62500}, 4);
  t.header.source = "pytorch";
  const double c = 625000 / 125e6, c0 = 62500 / 125e6;
  ReplayOptions o = mesh(2, 1 * kGbps, 0);
  for (double s : replayTrace({t}, o).step_s) expectRel(s, 0.012 + 0.001 + 2 * c + c0);
  o.order = ReplayOptions::Order::kFifo;
  for (double s : replayTrace({t}, o).step_s) expectRel(s, 0.012 + 0.001 + 2 * c + c0);
  o.order = ReplayOptions::Order::kPriority;
  const ReplayResult p = replayTrace({t}, o);
  expectRel(p.step_s.at(0), 0.012 + 0.001 + 2 * c + c0);
  for (std::size_t i = 1; i < p.step_s.size(); ++i) expectRel(p.step_s[i], 0.012 + 0.001 + c + c0);
}

TEST(Replay, FifoReissueSendsWhatIsReadyFirst) {
  // Two layers (forward 10 and 1 ms, backward 1 ms each), 5 ms on the wire each, recorded front layer first as a
  // priority scheduler issues them: the side waits for layer 0's tensor (ready 1 ms after layer 1's), and from the
  // second step layer 1's transfer hides under the next forward: f + b + c a step. Re-issued fifo, layer 1's goes
  // as soon as it is ready and layer 0's, the next forward's first need, waits behind it: f + b1 + 2 c a step.
  const std::vector<Layer> layers{{1, 0.010, 0.001}, {1, 0.001, 0.001}};
  StepTrace t = handTrace(layers, {0, 1}, {625000, 625000}, 3);
  const double c = 625000 / 125e6;
  ReplayOptions o = mesh(2, 1 * kGbps, 0);
  const ReplayResult recorded = replayTrace({t}, o);
  expectRel(recorded.step_s.at(0), 0.013 + 2 * c);
  for (std::size_t i = 1; i < recorded.step_s.size(); ++i) expectRel(recorded.step_s[i], 0.013 + c);
  o.order = ReplayOptions::Order::kFifo;
  for (double s : replayTrace({t}, o).step_s) expectRel(s, 0.012 + 2 * c);
}

TEST(Replay, AnAlgorithmOverrideReplacesTheTracesOwn) {
  // The trace configured auto (halving-doubling for 1 MB at 8 workers on this mesh) replayed with the ring asked
  // for: the ring's 2 (N-1) latencies, where the override is ignored if the auto label stays.
  const StepTrace t = handTrace({{250000, 0.001, 0.001}}, {0}, {1000000}, 1, "auto");
  ReplayOptions o = mesh(8, 10 * kGbps, 50e-6);
  const ReplayResult automatic = replayTrace({t}, o);
  o.allreduce = "ring";
  const ReplayResult ring = replayTrace({t}, o);
  ASSERT_EQ(ring.collectives.size(), 1u);
  EXPECT_TRUE(ring.collectives[0].starts_with("allreduce ring x 1")) << ring.collectives[0];
  ASSERT_EQ(automatic.collectives.size(), 1u);
  EXPECT_FALSE(automatic.collectives[0].starts_with("allreduce ring")) << automatic.collectives[0];
  expectRel(ring.median_step_s, 0.002 + 14 * 50e-6 + 2.0 * 7 / 8 * 1e6 / 1.25e9, 1e-3);
}

TEST(Replay, ADeviceFlopRateSetsTheStepsCompute) {
  // 30 ms of recorded compute a step; 6e9 FLOPs a step at 1e12 FLOP/s is 6 ms: compute scaled by 0.2, exactly as
  // --compute-scale 0.2 gives.
  const StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
  ReplayOptions o = mesh(2, 1 * kGbps, 50e-6);
  o.step_flops = 6e9;
  o.device_flops = 1e12;
  const ReplayResult r = replayTrace({t}, o);
  expectRel(r.recorded_compute_s, 0.030);
  expectRel(r.compute_scale, 0.2);
  expectRel(r.compute_s, 0.006);
  ReplayOptions by_factor = mesh(2, 1 * kGbps, 50e-6);
  by_factor.compute_scale = 0.2;
  expectRel(r.median_step_s, replayTrace({t}, by_factor).median_step_s);
  expectRel(r.median_step_s, 0.006 + 2 * 50e-6 + 1e6 / 125e6);
}

TEST(Replay, CodecScaleScalesCodecsOnly) {
  // A 2 ms compress before the group's allreduce: with compute_scale alone it scales as compute does; codec_scale
  // takes it over and leaves compute at compute_scale.
  StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
  TracePhase compress;  // kCompress, from 0
  compress.dur_s = 0.002;
  for (auto& st : t.steps) st.groups[0].phases.insert(st.groups[0].phases.begin(), compress);
  const double comm = 2 * 50e-6 + 1e6 / 125e6;
  ReplayOptions o = mesh(2, 1 * kGbps, 50e-6);
  o.compute_scale = 0.5;
  expectRel(replayTrace({t}, o).median_step_s, 0.015 + 0.001 + comm);
  o.codec_scale = 3;
  const ReplayResult r = replayTrace({t}, o);
  expectRel(r.median_step_s, 0.015 + 0.006 + comm);
  expectRel(r.compute_s, 0.015);
}

TEST(Replay, OversubscribedRackUplinksSlowCrossRackRings) {
  // 8 workers, one per node and per rack: every ring hop crosses two racks' uplinks. At 4:1 an uplink is a quarter
  // of the NIC, so a bandwidth-bound ring takes about 4 times as long.
  const StepTrace t = handTrace({{1, 0, 0}}, {0}, {64 << 20}, 2, "ring");
  ReplayOptions o;
  o.workers = 8;
  o.topology = parseTopology("workers=1,intra=100Gbps,intra_latency=1us,nic=10Gbps,nic_latency=5us,nodes_per_rack=1");
  const ReplayResult flat = replayTrace({t}, o);
  o.topology.oversubscription = 4;
  const ReplayResult racks = replayTrace({t}, o);
  const double ratio = racks.comm_s / flat.comm_s;
  EXPECT_GT(ratio, 3.9);
  EXPECT_LT(ratio, 4.01);
  // The ring moves 2 (n-1)/n of 64 MiB per worker over 10 Gbps (and 14 latencies of two NIC hops and the intra links).
  expectRel(flat.comm_s, 2.0 * 7 / 8 * (64 << 20) / 1.25e9, 0.01);
  bool uplinks = false;
  for (const auto& l : racks.links)
    if (l.name == "rack uplink") {
      uplinks = true;
      EXPECT_EQ(l.links, 8);
      EXPECT_GT(l.utilisation, 0.9);  // the bottleneck, busy the whole (communication-only) step
      EXPECT_LE(l.utilisation, 1.0 + 1e-9);
    }
  EXPECT_TRUE(uplinks);
}

// One group, one allgatherv of the recorded blocks (world 2).
StepTrace allgatherTrace(std::vector<uint64_t> rank_bytes) {
  StepTrace t = handTrace({{1, 0, 0}}, {0}, {0}, 1);
  TracePhase& p = t.steps[0].groups[0].phases[0];
  p.op = "allgatherv";
  p.dtype = "u8";
  p.bytes = rank_bytes[0];
  p.rank_bytes = std::move(rank_bytes);
  return t;
}

TEST(Replay, AllgatherBytesGrowWithTheWorld) {
  // Blocks of 1,000 and 3,000 bytes recorded at 2 ranks; at N, worker w sends rank_bytes[w mod 2], and a ring worker
  // forwards every block but one: (N-1)/N of the gathered total, which grows with N.
  const StepTrace t = allgatherTrace({1000, 3000});
  double previous = 0;
  for (int n : {2, 3, 4, 8, 16}) {
    const ReplayResult r = replayTrace({t}, mesh(n, 10 * kGbps, 5e-6));
    double total = 0;
    for (int w = 0; w < n; ++w) total += w % 2 == 0 ? 1000 : 3000;
    expectRel(r.bytes_per_worker, (n - 1.0) / n * total, 1e-12);
    EXPECT_GT(r.bytes_per_worker, previous) << n;
    previous = r.bytes_per_worker;
    // The ring's n - 1 latencies and (n-1)/n of the total at 10 Gbps.
    expectRel(r.comm_s, (n - 1) * 5e-6 + (n - 1.0) / n * total / 1.25e9);
  }
}

TEST(Replay, JitterWithASeedIsReproducible) {
  const StepTrace t = handTrace({{1, 0.004, 0.008}, {1, 0.004, 0.003}}, {1, 0}, {625000, 125000}, 5);
  ReplayOptions o = mesh(6, 1 * kGbps, 10e-6);
  const ReplayResult plain = replayTrace({t}, o);
  EXPECT_EQ(plain.behaviours, 1);
  o.jitter_sigma = 0.2;
  o.seed = 7;
  const ReplayResult a = replayTrace({t}, o);
  const ReplayResult b = replayTrace({t}, o);
  EXPECT_EQ(a.behaviours, 6);
  EXPECT_EQ(a.step_s, b.step_s);
  o.seed = 8;
  const ReplayResult c = replayTrace({t}, o);
  EXPECT_NE(a.step_s, c.step_s);
  // The step waits for the slowest of six lognormal draws per layer: slower on average than none.
  EXPECT_GT(a.mean_step_s, plain.mean_step_s);
}

TEST(Replay, StragglersSlowTheStepByTheirFactor) {
  const StepTrace t = handTrace({{1, 0.010, 0.020}}, {0}, {1000}, 2);
  ReplayOptions o = mesh(4, 1 * kGbps, 0);
  o.stragglers = 1;
  o.straggler_factor = 2;
  const ReplayResult r = replayTrace({t}, o);
  EXPECT_EQ(r.behaviours, 2);
  expectRel(r.compute_s, 0.060);
  expectRel(r.median_step_s, 0.060 + 2.0 * 3 / 4 * 1000 / 125e6 + 0);
}

TEST(Replay, EveryRecordedRankLendsItsBehaviour) {
  // Two recorded ranks, rank 1's backward twice rank 0's: at 4 workers, workers 1 and 3 behave as rank 1 and the
  // collective waits for them.
  const StepTrace r0 = handTrace({{1, 0.010, 0.020}}, {0}, {1000}, 2);
  StepTrace r1 = r0;
  r1.header.rank = 1;
  for (auto& st : r1.steps) st.compute[1].dur_s = 0.040;
  const ReplayResult r = replayTrace({r0, r1}, mesh(4, 1 * kGbps, 0));
  EXPECT_EQ(r.behaviours, 2);
  expectRel(r.compute_s, 0.050);
  expectRel(r.median_step_s, 0.050 + 2.0 * 3 / 4 * 1000 / 125e6);
  // Rank 0's trace alone is the faster step.
  expectRel(replayTrace({r0}, mesh(4, 1 * kGbps, 0)).median_step_s, 0.030 + 2.0 * 3 / 4 * 1000 / 125e6);
}

TEST(Replay, ComputeScaleScalesComputeOnly) {
  const StepTrace t = handTrace({{250000, 0.010, 0.020}}, {0}, {1000000});
  ReplayOptions o = mesh(2, 1 * kGbps, 50e-6);
  o.compute_scale = 0.5;
  expectRel(replayTrace({t}, o).median_step_s, 0.015 + 2 * 50e-6 + 1e6 / 125e6);
}

TEST(Replay, SyntheticResNet50HasItsShape) {
  const auto layers = resnet50Layers(0.3);
  SyntheticTraceSpec spec;
  spec.layers = layers;
  spec.steps = 2;
  const StepTrace t = syntheticStepTrace(spec);
  EXPECT_EQ(t.header.tensors.size(), 161u);
  const uint64_t params = std::accumulate(t.header.tensors.begin(), t.header.tensors.end(), uint64_t{0},
                                          [](uint64_t a, const train::TraceTensor& x) { return a + x.elements; });
  EXPECT_EQ(params, 25557032u);  // torchvision's resnet50: 25,557,032 parameters
  EXPECT_EQ(t.steps[0].groups.size(), 161u);
  double compute = 0;
  for (const auto& c : t.steps[0].compute) compute += c.dur_s;
  expectRel(compute, 0.3, 1e-9);
  checkReplayable(t, "synthetic");
  // Replayed at 64 workers on 10 Gbps: the step is at least its compute, and the collectives are halving-doubling and
  // the ring as auto picks them by size.
  const ReplayResult r = replayTrace({t}, mesh(64, 10 * kGbps, 5e-6));
  EXPECT_GT(r.median_step_s, 0.3);
  EXPECT_GT(r.exposed_comm_s, 0);
  EXPECT_EQ(r.step_s.size(), 2u);
}

TEST(Replay, StepToAccuracyReadsTheRunsEvaluationRecords) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "replay_accuracy";
  std::filesystem::create_directories(dir);
  const auto metrics = dir / "metrics.jsonl";
  {
    std::ofstream f(metrics);
    f << "{\"epoch\":0,\"step\":100,\"test_accuracy\":0.41}\n"
      << "{\"epoch\":1,\"step\":200,\"test_accuracy\":0.62}\n"
      << "{\"epoch\":2,\"step\":300,\"test_accuracy\":0.70}\n";
  }
  EXPECT_EQ(stepToAccuracy(metrics, 0.6), 200);
  EXPECT_EQ(stepToAccuracy(metrics, 0.7), 300);
  EXPECT_EQ(stepToAccuracy(metrics, 0.9), -1);
  {
    std::ofstream f(metrics, std::ios::app);
    f << "{\"epoch\":3,\"step\":\"four hundred\",\"test_accuracy\":0.95}\n";
  }
  try {
    stepToAccuracy(metrics, 0.9);
    ADD_FAILURE() << "a record without a numeric step was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:4: an evaluation record needs numeric 'step'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(stepToAccuracy(dir / "missing.jsonl", 0.5), InvalidArgument);
}

template <typename F>
void expectInvalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Replay, BadInputIsRefusedNamingTheField) {
  const StepTrace good = handTrace({{1, 0.001, 0.001}}, {0}, {1000}, 1);
  expectInvalid([&] { replayTrace({good}, mesh(0, kGbps, 0)); }, "--workers must be >= 1, got 0");
  StepTrace newer = good;
  newer.header.version = train::kStepTraceVersion + 1;
  expectInvalid([&] { replayTrace({newer}, mesh(2, kGbps, 0)); },
                "field 'version' is " + std::to_string(train::kStepTraceVersion + 1));
  StepTrace async = good;
  async.header.mode = "async";
  expectInvalid([&] { replayTrace({async}, mesh(2, kGbps, 0)); }, "field 'mode' is 'async'");
  StepTrace empty = good;
  empty.steps.clear();
  expectInvalid([&] { checkReplayable(empty, "steps.rank0.jsonl"); }, "steps.rank0.jsonl: no steps recorded");
  StepTrace unknown = good;
  unknown.steps[0].groups[0].chunks[0].first = 9;
  expectInvalid([&] { replayTrace({unknown}, mesh(2, kGbps, 0)); }, "names unknown tensor 9");
  StepTrace op = good;
  op.steps[0].groups[0].phases[0].op = "alltoall";
  expectInvalid([&] { replayTrace({op}, mesh(2, kGbps, 0)); }, "field 'phases.op' is 'alltoall'");
  ReplayOptions scale = mesh(2, kGbps, 0);
  scale.compute_scale = 0;
  expectInvalid([&] { replayTrace({good}, scale); }, "--compute-scale");
  ReplayOptions strag = mesh(2, kGbps, 0);
  strag.stragglers = 3;
  expectInvalid([&] { replayTrace({good}, strag); }, "--stragglers");
  // A per-pair override naming a rank the replayed world does not have.
  ReplayOptions over = mesh(2, kGbps, 0);
  over.links.overrides.push_back({0, 5, comm::LinkSpec{kGbps, 0}});
  EXPECT_THROW(replayTrace({good}, over), InvalidArgument);
  // Both a topology and wires.
  ReplayOptions both = mesh(2, kGbps, 0);
  both.topology = parseTopology("8xA100-4x200G");
  expectInvalid([&] { replayTrace({good}, both); }, "both describe the network");
  ReplayOptions flops = mesh(2, kGbps, 0);
  flops.step_flops = 1e9;
  expectInvalid([&] { replayTrace({good}, flops); }, "go together; got only --step-flops");
  flops.device_flops = 1e12;
  flops.compute_scale = 0.5;
  expectInvalid([&] { replayTrace({good}, flops); }, "both set the compute's speed");
  flops.compute_scale = 1;
  flops.device_flops = -1;
  expectInvalid([&] { replayTrace({good}, flops); }, "must be finite numbers > 0");
  StepTrace idle = good;
  for (auto& st : idle.steps)
    for (auto& c : st.compute) c.dur_s = 0;
  flops.device_flops = 1e12;
  expectInvalid([&] { replayTrace({idle}, flops); }, "its steps record none");
  ReplayOptions codec = mesh(2, kGbps, 0);
  codec.codec_scale = -1;
  expectInvalid([&] { replayTrace({good}, codec); }, "--codec-scale");
  expectInvalid([] { parseReplayOrder("lifo"); }, "--scheduler 'lifo' is not one of recorded, fifo, priority");
  ReplayOptions algo = mesh(2, kGbps, 0);
  algo.allreduce = "butterfly";
  expectInvalid([&] { replayTrace({good}, algo); }, "--allreduce 'butterfly' is not one of");
  algo.allreduce.clear();
  algo.allgather = "hd";
  expectInvalid([&] { replayTrace({good}, algo); }, "--allgather 'hd' is not one of");
  // A trace whose scheduler negotiated its order cannot be re-issued; as recorded it replays.
  StepTrace negotiated = good;
  negotiated.steps[0].negotiations.push_back({0.001, 0, "bruck"});
  ReplayOptions reissue = mesh(2, kGbps, 0);
  reissue.order = ReplayOptions::Order::kPriority;
  expectInvalid([&] { checkReorderable(negotiated, "steps.rank0.jsonl"); },
                "steps.rank0.jsonl: step 0 has 1 recorded 'negotiations'");
  expectInvalid([&] { replayTrace({negotiated}, reissue); }, "'negotiations'");
  EXPECT_NO_THROW(replayTrace({negotiated}, mesh(2, kGbps, 0)));
  // Ranks that disagree on their groups.
  StepTrace other = good;
  other.steps[0].groups.clear();
  expectInvalid([&] { replayTrace({good, other}, mesh(2, kGbps, 0)); }, "rank 1 ran 0 groups");
}

}  // namespace
}  // namespace terse::sim

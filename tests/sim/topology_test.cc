// The two-level cluster (core/sim/platform.h TwoLevelTopology): one frame's time inside a node and across nodes
// against latency + bytes / the slowest link, the core's oversubscription dividing concurrent inter-node flows, the
// hierarchical allreduce crossing the slow network once per node where the flat ring crosses it with every rank's
// share, and invalid topologies refused before anything is forked; the fat-tree's racks (their routes' links and
// bandwidths, traffic inside a rack apart from the oversubscribed uplinks, the refusals).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include "core/comm/frame.h"
#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/runtime.h"
#include "core/sim/simulation.h"

namespace terse::sim {
namespace {

std::string str(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

// nodes of `per` workers: 100 Gbps / 1 us inside, one 10 Gbps NIC / 5 us per node.
SimulationOptions twoLevel(int ranks, int per, double oversubscription = 1) {
  SimulationOptions o;
  o.platform.ranks = ranks;
  o.platform.topology.workers_per_node = per;
  o.platform.topology.intra = comm::LinkSpec{100e9, 1e-6};
  o.platform.topology.nic = comm::LinkSpec{10e9, 5e-6};
  o.platform.topology.oversubscription = oversubscription;
  o.compute.compute_scale = 0;
  return o;
}

// Every pair (from[k], to[k]) sends one frame of `bytes` at once; returns the simulated seconds until all arrived.
double frames(const SimulationOptions& o, const std::vector<std::pair<int, int>>& pairs, uint64_t bytes) {
  return std::stod(runSimulation(o, [&](const SimulationContext& ctx) {
    comm::InprocOptions io;
    io.network = ctx.network;
    auto t = comm::makeInprocTransports(o.platform.ranks, io);
    const comm::FrameMeta meta{comm::OpKind::kP2P, 1, 0};
    std::vector<std::vector<std::byte>> src(pairs.size(), std::vector<std::byte>(bytes, std::byte{3}));
    std::vector<std::vector<std::byte>> dst(pairs.size(), std::vector<std::byte>(bytes));
    std::vector<comm::Request> reqs;
    const rt::Clock::time_point t0 = rt::now();
    for (std::size_t k = 0; k < pairs.size(); ++k) {
      reqs.push_back(t[static_cast<std::size_t>(pairs[k].second)]->irecv(pairs[k].first, meta, dst[k]));
      reqs.push_back(t[static_cast<std::size_t>(pairs[k].first)]->isend(pairs[k].second, meta, src[k]));
    }
    for (auto& r : reqs) r.wait();
    if (dst != src) throw std::runtime_error("payload corrupted");
    return str(rt::seconds(t0, rt::now()));
  }));
}

constexpr uint64_t kBytes = 1 << 20;
const double kWireBits = static_cast<double>(comm::frameWireBytes(kBytes)) * 8;

TEST(TwoLevel, OneFrameInsideANodeCrossesTheIntraNodeLinksOnly) {
  const double expect = 1e-6 + kWireBits / 100e9;
  EXPECT_NEAR(frames(twoLevel(8, 4), {{1, 2}}, kBytes), expect, expect * 1e-5);
}

TEST(TwoLevel, OneFrameAcrossNodesPaysBothLatenciesAndTheNicsRate) {
  const double expect = 1e-6 + 5e-6 + kWireBits / 10e9;
  EXPECT_NEAR(frames(twoLevel(8, 4), {{1, 6}}, kBytes), expect, expect * 1e-5);
  // Two NICs per node double the node's rate.
  SimulationOptions two = twoLevel(8, 4);
  two.platform.topology.nics_per_node = 2;
  const double faster = 1e-6 + 5e-6 + kWireBits / 20e9;
  EXPECT_NEAR(frames(two, {{1, 6}}, kBytes), faster, faster * 1e-5);
}

TEST(TwoLevel, WorkersOfANodeShareItsNic) {
  // Two workers of node 0 send to node 1 at once: the node's one NIC carries both.
  const double expect = 1e-6 + 5e-6 + 2 * kWireBits / 10e9;
  EXPECT_NEAR(frames(twoLevel(8, 4), {{0, 4}, {1, 5}}, kBytes), expect, expect * 1e-5);
}

TEST(TwoLevel, AnOversubscribedCoreDividesTheNodesTraffic) {
  // 4 nodes of 1 worker, each sending to the next (a ring step): non-blocking, every flow at the NIC's rate; 4:1, the
  // core carries 4 x 10 / 4 = 10 Gbps for all four.
  const std::vector<std::pair<int, int>> ring{{0, 1}, {1, 2}, {2, 3}, {3, 0}};
  const double free = 1e-6 + 5e-6 + kWireBits / 10e9;
  EXPECT_NEAR(frames(twoLevel(4, 1), ring, kBytes), free, free * 1e-5);
  const double shared = 1e-6 + 5e-6 + 4 * kWireBits / 10e9;
  EXPECT_NEAR(frames(twoLevel(4, 1, 4), ring, kBytes), shared, shared * 1e-5);
}

// Simulated seconds of one allreduce of `count` floats on every rank.
double allreduceTime(const SimulationOptions& o, comm::AllreduceAlgorithm algo, int per, std::size_t count) {
  return std::stod(runSimulation(o, [&](const SimulationContext& ctx) {
    const int n = o.platform.ranks;
    comm::InprocOptions io;
    io.network = ctx.network;
    auto t = comm::makeInprocTransports(n, io);
    const rt::Clock::time_point t0 = rt::now();
    std::vector<rt::Thread> threads;
    bool ok = true;
    for (int rank = 0; rank < n; ++rank) {
      threads.emplace_back(
          "rank" + std::to_string(rank),
          [&, rank] {
            comm::HostCommOptions co;
            co.algorithm = algo;
            co.ranks_per_node = per;
            comm::HostCommunicator c(std::move(t[static_cast<std::size_t>(rank)]), co);
            std::vector<float> v(count, 1.0f);
            c.allreduce(v.data(), count, DType::kF32);
            for (float x : v) ok = ok && x == static_cast<float>(n);
          },
          rank);
    }
    for (auto& th : threads) th.join();
    if (!ok) throw std::runtime_error("wrong sum");
    return str(rt::seconds(t0, rt::now()));
  }));
}

TEST(TwoLevel, HierarchicalAllreduceCrossesTheNetworkOncePerNode) {
  // 2 nodes of 4 workers, 4 MiB: the flat ring's two inter-node edges each carry 2 (8-1)/8 S = 1.75 S at the NIC's
  // rate; the hierarchical allreduce's two leaders exchange 2 (2-1)/2 S = S, and its chains run on the 10x faster
  // intra-node links.
  const std::size_t count = 1 << 20;
  const double s_over_nic = static_cast<double>(count) * 4 * 8 / 10e9;
  const double ring = allreduceTime(twoLevel(8, 4), comm::AllreduceAlgorithm::kRing, 4, count);
  const double hier = allreduceTime(twoLevel(8, 4), comm::AllreduceAlgorithm::kHierarchical, 4, count);
  EXPECT_GT(ring, 1.7 * s_over_nic) << "ring " << ring;
  // S over the NIC plus two chains of about S / 100 Gbps + 3 segment hops each: 3.36 + 2 x 0.42 ms (4.2 ms measured;
  // chains that let their frames share a link would take 3 S / 100 Gbps each, 5.4 ms in all).
  EXPECT_GT(hier, s_over_nic);
  EXPECT_LT(hier, 1.3 * s_over_nic) << "hierarchical " << hier;
  EXPECT_LT(hier, 0.75 * ring) << "hierarchical " << hier << ", ring " << ring;
}

TEST(TwoLevel, InvalidTopologiesAreRefusedBeforeForking) {
  auto body = [](const SimulationContext&) { return std::string(); };
  SimulationOptions o = twoLevel(8, 4);
  o.platform.topology.nics_per_node = 0;
  EXPECT_THROW(runSimulation(o, body), InvalidArgument);
  o = twoLevel(8, 4, 0.5);
  EXPECT_THROW(runSimulation(o, body), InvalidArgument);
  o = twoLevel(8, 4);
  o.platform.links = comm::parseEmulation("bandwidth=1Gbps");
  try {
    runSimulation(o, body);
    FAIL() << "a topology with emulated links was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use one"), std::string::npos) << e.what();
  }
}

TEST(TwoLevel, PresetsCarryTheirFigures) {
  const auto a100 = topologyPreset("8xA100-4x200G");
  ASSERT_TRUE(a100.has_value());
  EXPECT_EQ(a100->workers_per_node, 8);
  EXPECT_EQ(a100->nics_per_node, 4);
  EXPECT_EQ(a100->nic.bandwidth_bps, 200e9);
  EXPECT_EQ(a100->intra.bandwidth_bps, 2400e9);
  EXPECT_FALSE(topologyPreset("8xA100").has_value());
  for (const char* name : {"8xH100-8x400G", "4xV100-1x100G"}) {
    const auto p = topologyPreset(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_NO_THROW(p->validate());
    EXPECT_NE(presetNames().find(name), std::string::npos);
  }
}

// The links of route src -> dst, each as "name@bits-per-second", and the route's latency, read off the engine the
// simulation built (platform.h's routes, spelled out).
std::string routes(const SimulationOptions& o, const std::vector<std::pair<int, int>>& pairs) {
  return runSimulation(o, [&](const SimulationContext&) {
    std::ostringstream out;
    for (const auto& [src, dst] : pairs) {
      std::vector<simgrid::s4u::Link*> links;
      double latency = 0;
      simgrid::s4u::Host::by_name("rank" + std::to_string(src))
          ->route_to(simgrid::s4u::Host::by_name("rank" + std::to_string(dst)), links, &latency);
      out << src << "->" << dst << ":";
      for (const auto* l : links) out << " " << l->get_name() << "@" << l->get_bandwidth() * 8;
      out << " (" << latency * 1e6 << " us)\n";
    }
    return out.str();
  });
}

// 10 ranks in nodes of 2 (5 nodes), racks of 2 nodes (the last rack one node), 4:1 leaf uplinks.
SimulationOptions racks(double oversubscription = 4) {
  SimulationOptions o = twoLevel(10, 2, oversubscription);
  o.platform.topology.nodes_per_rack = 2;
  return o;
}

TEST(FatTree, RoutesInsideARackSkipTheUplinksAndAcrossRacksCrossTheirsOnce) {
  EXPECT_EQ(routes(racks(), {{0, 1}, {0, 2}, {1, 5}, {5, 9}, {9, 3}}),
            // same node: the two intra-node links
            "0->1: up0@1e+11 down1@1e+11 (1 us)\n"
            // same rack, other node: the NICs, no uplink
            "0->2: up0@1e+11 node0-out@1e+10 node1-in@1e+10 down2@1e+11 (6 us)\n"
            // rack 0 -> rack 1: its leaf's uplink, rack 1's downlink, each (2 nodes x 10 Gbps) / 4
            "1->5: up1@1e+11 node0-out@1e+10 rack0-up@5e+09 rack1-down@5e+09 node2-in@1e+10 down5@1e+11 (6 us)\n"
            // into the short last rack: its downlink is (1 node x 10 Gbps) / 4
            "5->9: up5@1e+11 node2-out@1e+10 rack1-up@5e+09 rack2-down@2.5e+09 node4-in@1e+10 down9@1e+11 (6 us)\n"
            "9->3: up9@1e+11 node4-out@1e+10 rack2-up@2.5e+09 rack0-down@5e+09 node1-in@1e+10 down3@1e+11 (6 us)\n");
}

TEST(FatTree, WithoutRacksTheRoutesKeepTheOneCore) {
  EXPECT_EQ(routes(twoLevel(4, 2, 4), {{0, 1}, {1, 2}}),
            "0->1: up0@1e+11 down1@1e+11 (1 us)\n"
            // the core: (2 nodes x 10 Gbps) / 4
            "1->2: up1@1e+11 node0-out@1e+10 core@5e+09 node1-in@1e+10 down2@1e+11 (6 us)\n");
  // A non-blocking fat-tree's uplinks carry the rack's NICs in full.
  EXPECT_EQ(routes(racks(1), {{0, 4}}),
            "0->4: up0@1e+11 node0-out@1e+10 rack0-up@2e+10 rack1-down@2e+10 node2-in@1e+10 down4@1e+11 (6 us)\n");
}

TEST(FatTree, TrafficInsideARackKeepsItsPaceWhileRacksShareTheirUplinks) {
  // 8 nodes of 1 worker in racks of 4, 4:1: each leaf uplink carries (4 x 10) / 4 = 10 Gbps.
  SimulationOptions o = twoLevel(8, 1, 4);
  o.platform.topology.nodes_per_rack = 4;
  // A ring inside each rack: every flow at its NIC's rate, the uplinks untouched.
  const double free = 1e-6 + 5e-6 + kWireBits / 10e9;
  EXPECT_NEAR(frames(o, {{0, 1}, {1, 2}, {2, 3}, {3, 0}, {4, 5}, {5, 6}, {6, 7}, {7, 4}}, kBytes), free, free * 1e-5);
  // Every node of rack 0 sends to rack 1: four flows share rack 0's one 10 Gbps uplink.
  const double shared = 1e-6 + 5e-6 + 4 * kWireBits / 10e9;
  EXPECT_NEAR(frames(o, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, kBytes), shared, shared * 1e-5);
}

TEST(FatTree, ParsedAndDescribed) {
  const TwoLevelTopology t = parseTopology("8xA100-4x200G,nodes_per_rack=4,oversubscription=4");
  EXPECT_EQ(t.nodes_per_rack, 4);
  EXPECT_EQ(t.oversubscription, 4);
  EXPECT_EQ(t.workers_per_node, 8);
  EXPECT_NE(t.describe().find("fat-tree: racks of 4 nodes, leaf uplinks oversubscribed 4:1"), std::string::npos)
      << t.describe();
  EXPECT_EQ(parseTopology("8xA100-4x200G").nodes_per_rack, 0);
  EXPECT_NE(parseTopology("8xA100-4x200G,oversubscription=4").describe().find("core oversubscribed 4:1"),
            std::string::npos);
}

TEST(FatTree, BadRacksAreRefusedNamingTheField) {
  auto message = [](const std::string& text) {
    try {
      parseTopology(text);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("workers=8,nodes_per_rack=-1").find("nodes_per_rack must be >= 0 (0 = no racks), got -1"),
            std::string::npos)
      << message("workers=8,nodes_per_rack=-1");
  EXPECT_NE(message("workers=8,nodes_per_rack=two").find("nodes_per_rack 'two' is not an integer"), std::string::npos)
      << message("workers=8,nodes_per_rack=two");
  EXPECT_NE(message("workers=8,racks=2").find("unknown key 'racks'"), std::string::npos);
  EXPECT_NE(message("workers=8,racks=2").find("nodes_per_rack)"), std::string::npos);
  SimulationOptions o = racks();
  o.platform.topology.nodes_per_rack = -2;
  EXPECT_THROW(runSimulation(o, [](const SimulationContext&) { return std::string(); }), InvalidArgument);
}

// Every route of an odd-sized cluster (13 ranks in nodes of 3, the last node one rank; racks of 2 nodes, the last rack
// one node) against platform.h's description, spelled out here from the ranks' indices: the one-zone platform computes
// its routes (platform.cc TwoLevelZone), so each case of that computation is checked, with and without racks and the
// core.
std::string expectedRoutes(int ranks, int per, int per_rack, bool core) {
  std::ostringstream out;
  for (int i = 0; i < ranks; ++i) {
    for (int j = 0; j < ranks; ++j) {
      if (i == j) continue;
      const int a = i / per;
      const int b = j / per;
      out << i << "->" << j << ": up" << i;
      if (a != b) {
        out << " node" << a << "-out";
        if (per_rack > 0 && a / per_rack != b / per_rack)
          out << " rack" << a / per_rack << "-up rack" << b / per_rack << "-down";
        if (per_rack == 0 && core) out << " core";
        out << " node" << b << "-in";
      }
      out << " down" << j << " (" << (a != b ? 6 : 1) << " us)\n";
    }
  }
  return out.str();
}

std::string routeNames(const SimulationOptions& o) {
  return runSimulation(o, [&](const SimulationContext&) {
    std::ostringstream out;
    for (int i = 0; i < o.platform.ranks; ++i) {
      for (int j = 0; j < o.platform.ranks; ++j) {
        if (i == j) continue;
        std::vector<simgrid::s4u::Link*> links;
        double latency = 0;
        simgrid::s4u::Host::by_name("rank" + std::to_string(i))
            ->route_to(simgrid::s4u::Host::by_name("rank" + std::to_string(j)), links, &latency);
        out << i << "->" << j << ":";
        for (const auto* l : links) out << " " << l->get_name();
        out << " (" << latency * 1e6 << " us)\n";
      }
    }
    return out.str();
  });
}

TEST(FatTree, EveryRouteOfAnOddClusterIsItsPath) {
  SimulationOptions o = twoLevel(13, 3, 4);
  o.platform.topology.nodes_per_rack = 2;
  EXPECT_EQ(routeNames(o), expectedRoutes(13, 3, 2, false));
  o.platform.topology.nodes_per_rack = 0;  // one oversubscribed core
  EXPECT_EQ(routeNames(o), expectedRoutes(13, 3, 0, true));
  EXPECT_EQ(routeNames(twoLevel(13, 3)), expectedRoutes(13, 3, 0, false));  // non-blocking: no core link
  // One worker per node, one node per rack: every route crosses the spine.
  SimulationOptions single = twoLevel(5, 1, 2);
  single.platform.topology.nodes_per_rack = 1;
  EXPECT_EQ(routeNames(single), expectedRoutes(5, 1, 1, false));
}

// The mesh's routes (platform.cc MeshZone): each asked in turn, so the wire a rank's last route crossed (kept per rank)
// is never handed out for another peer, and a pair's overridden wire keeps its latency however often it is asked.
TEST(Mesh, EachRouteCrossesItsOwnWireWhateverWasAskedBefore) {
  SimulationOptions o;
  o.platform.ranks = 3;
  o.platform.links.link = comm::LinkSpec{10e9, 5e-6};
  o.platform.links.overrides.push_back({0, 2, {1e9, 20e-6}});
  o.platform.links.nic_egress_bps = 10e9;
  o.compute.compute_scale = 0;
  EXPECT_EQ(routes(o, {{0, 1}, {0, 2}, {0, 1}, {0, 2}, {0, 2}, {2, 0}, {1, 0}, {0, 1}}),
            "0->1: nic-out0@1e+10 wire0-1@1e+10 (5 us)\n"
            "0->2: nic-out0@1e+10 wire0-2@1e+09 (20 us)\n"
            "0->1: nic-out0@1e+10 wire0-1@1e+10 (5 us)\n"
            "0->2: nic-out0@1e+10 wire0-2@1e+09 (20 us)\n"
            "0->2: nic-out0@1e+10 wire0-2@1e+09 (20 us)\n"
            "2->0: nic-out2@1e+10 wire2-0@1e+10 (5 us)\n"
            "1->0: nic-out1@1e+10 wire1-0@1e+10 (5 us)\n"
            "0->1: nic-out0@1e+10 wire0-1@1e+10 (5 us)\n");
}

// The platform is one SimGrid zone whatever its size: SimGrid checks each host and link it creates against the names
// of every zone, so a zone per node or rack made building N workers cost N x N / workers_per_node (minutes at 16,384
// workers in racks). The links are one per rank each way, two per node and per rack, and the core's: N, not N^2.
TEST(FatTree, ThePlatformIsOneZoneWithLinksLinearInTheRanks) {
  SimulationOptions o = twoLevel(1000, 8, 4);
  o.platform.topology.nodes_per_rack = 4;
  const std::string got = runSimulation(o, [&](const SimulationContext&) {
    auto* e = simgrid::s4u::Engine::get_instance();
    // get_filtered_netzones lists the zones below the root.
    return std::to_string(e->get_filtered_netzones<simgrid::kernel::routing::NetZoneImpl>().size()) +
           " zones below the root, " + std::to_string(e->get_link_count()) + " links, " +
           std::to_string(e->get_host_count()) + " hosts";
  });
  // 1000 x (up, down) + 125 nodes x (out, in) + 32 racks x (up, down) (the last rack one node), and SimGrid's own
  // loopback.
  EXPECT_EQ(got, "0 zones below the root, " + std::to_string(2000 + 250 + 64 + 1) + " links, 1000 hosts");
}

}  // namespace
}  // namespace terse::sim

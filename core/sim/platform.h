// The simulated cluster (DESIGN.md section 9): a SimGrid platform built from the same link model the real-time
// emulation paces (core/comm/link_emulation.h), and the network model settings that make SimGrid time it the same way.
//
// Hosts: one per rank ("rank0", ...). Route i -> j crosses, in order: rank i's NIC egress link (when `nic` is set),
// the directed wire i -> j (its bandwidth and latency, overrides included), rank j's NIC ingress link (when
// `nic_ingress` is set). Each directed wire is its own SimGrid link, so the two directions of a pair never share
// capacity (full duplex), and a NIC shared by several outgoing flows divides its bandwidth among them max-min fairly --
// what the pacer's slice interleaving approximates in real time, here without slices.
//
// Network model (why these settings): SimGrid's default (LV08) multiplies latencies by 13.01 and bandwidths by 0.97,
// adds 5% reverse-path cross traffic for TCP acknowledgements and caps a flow at TCP-gamma / (2 x latency): fitted to
// real TCP, so a 125 MB flow on an idle 1 Gbps link takes 1.08 s instead of 1.00. terse's model is the configured one:
// a frame of S bytes (header included) alone on a link of bandwidth B and latency L takes L + S / B. So: CM02 (the
// max-min flow model without correction factors), no cross traffic, no TCP window cap. Unlimited bandwidth is a link
// of 1e15 bytes/s (a megabyte crosses in a nanosecond): SimGrid needs a finite rate.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/link_emulation.h"

namespace simgrid::s4u {
class Engine;
class Host;
}  // namespace simgrid::s4u

namespace terse::sim {

// A two-level cluster (Topology in experiments/config/experiment.proto says it for users). Hosts of a node hang off
// its switch by two links each (up and down: full duplex); each node reaches the core through an egress and an ingress
// link of nics x nic bandwidth; with oversubscription r > 1 every inter-node route also crosses one shared core link of
// (nodes x nics x nic bandwidth) / r. Routes: same node: up(i) [intra latency], down(j); other node: up(i) [intra
// latency], node-out(a) [nic latency], core, node-in(b), down(j). So one flow alone takes latency + S / (its slowest
// link) as in the mesh, and SimGrid's max-min sharing divides each link among the flows that cross it.
//
// With nodes_per_rack > 0 the network is a two-tier fat-tree (leaf/spine) instead of one core: nodes in racks of
// nodes_per_rack consecutive nodes (the last one shorter), each rack's leaf switch on an uplink and a downlink to the
// spine of (rack's nodes x nics x nic bandwidth) / oversubscription each, the r:1 oversubscription of a leaf whose
// uplink ports number 1/r of its node-facing ones (Leiserson 1985; Al-Fares et al., SIGCOMM 2008). Routes: same rack:
// up(i), node-out(a), node-in(b), down(j), so traffic inside a rack never touches the oversubscribed uplinks; other
// rack: up(i), node-out(a), rack-up(R), rack-down(S), node-in(b), down(j). No shared core link: the spine is
// non-blocking, the leaves' uplinks are the bottleneck, as in a fat-tree whose spine has as many ports as the leaves
// have uplinks.
struct TwoLevelTopology {
  int workers_per_node = 0;  // 0 = no topology: the mesh of per-pair wires above
  comm::LinkSpec intra;
  comm::LinkSpec nic;  // per NIC
  int nics_per_node = 1;
  double oversubscription = 1;
  int nodes_per_rack = 0;  // 0 = no racks: one core link (shared when oversubscribed), as before racks existed

  bool enabled() const noexcept { return workers_per_node > 0; }
  bool racks() const noexcept { return nodes_per_rack > 0; }
  // Throws InvalidArgument naming the field for workers_per_node < 1, nics_per_node < 1, nodes_per_rack < 0,
  // oversubscription < 1 or not finite, or negative link values.
  void validate() const;
  std::string describe() const;
};

// The named presets, with the figures they use (per direction):
//   "8xA100-4x200G": 8 workers, NVLink 3 at 300 GB/s = 2400 Gbps, 2 us; 4 NICs of 200 Gbps (HDR InfiniBand), 5 us.
//   "8xH100-8x400G": 8 workers, NVLink 4 at 450 GB/s = 3600 Gbps, 2 us; 8 NICs of 400 Gbps (NDR InfiniBand), 5 us.
//   "4xV100-1x100G": 4 workers, NVLink 2 at 150 GB/s = 1200 Gbps, 2 us; 1 NIC of 100 Gbps (EDR InfiniBand), 5 us.
// Returns nullopt for an unknown name; presetNames() lists them for messages.
std::optional<TwoLevelTopology> topologyPreset(std::string_view name);
std::string presetNames();

// The command line's spelling: a preset name and/or key=value pairs, comma-separated, later ones overriding earlier:
// "8xA100-4x200G", "8xA100-4x200G,oversubscription=4",
// "workers=8,intra=2400Gbps,intra_latency=2us,nic=200Gbps,nics=4,nic_latency=5us,oversubscription=4"; racks:
// "8xA100-4x200G,nodes_per_rack=4,oversubscription=4". Throws
// InvalidArgument quoting the text for an unknown key or preset, a malformed value, or an invalid result (validate).
TwoLevelTopology parseTopology(std::string_view text);

struct PlatformSpec {
  int ranks = 1;
  comm::EmulationConfig links;  // slice_bytes is ignored: SimGrid shares bandwidth per flow, not per slice
  TwoLevelTopology topology;    // when enabled, `links` must not be (the two describe one network)
};

// The network-model configuration above; call on a fresh engine before building the platform.
void configureNetworkModel(simgrid::s4u::Engine& engine);
// Builds the platform into `engine`; returns the hosts in rank order. Throws InvalidArgument for ranks < 1, an
// invalid link config (EmulationConfig::validate) or topology, or both a topology and emulated links.
std::vector<simgrid::s4u::Host*> buildPlatform(simgrid::s4u::Engine& engine, const PlatformSpec& spec);
// One line for provenance and logs: "simgrid 3.32 CM02 full-duplex mesh of 4 hosts: link 1Gbps 50us, nic egress ...".
std::string describePlatform(const PlatformSpec& spec);

}  // namespace terse::sim

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

#include <string>
#include <vector>

#include "core/comm/link_emulation.h"

namespace simgrid::s4u {
class Engine;
class Host;
}  // namespace simgrid::s4u

namespace terse::sim {

struct PlatformSpec {
  int ranks = 1;
  comm::EmulationConfig links;  // slice_bytes is ignored: SimGrid shares bandwidth per flow, not per slice
};

// The network-model configuration above; call on a fresh engine before building the platform.
void configureNetworkModel(simgrid::s4u::Engine& engine);
// Builds the platform into `engine`; returns the hosts in rank order. Throws InvalidArgument for ranks < 1 or an
// invalid link config (EmulationConfig::validate).
std::vector<simgrid::s4u::Host*> buildPlatform(simgrid::s4u::Engine& engine, const PlatformSpec& spec);
// One line for provenance and logs: "simgrid 3.32 CM02 full-duplex mesh of 4 hosts: link 1Gbps 50us, nic egress ...".
std::string describePlatform(const PlatformSpec& spec);

}  // namespace terse::sim

// Builds the simulated cluster's SimGrid platform (platform.h).
#include "core/sim/platform.h"

#include <simgrid/config.h>
#include <simgrid/version.h>
#include <xbt/base.h>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include "core/common/error.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;

namespace {

constexpr double kUnlimitedBytesPerSecond = 1e15;

double bytesPerSecond(double bps) {
  return bps > 0 ? bps / 8.0 : kUnlimitedBytesPerSecond;
}

}  // namespace

void configureNetworkModel(sg4::Engine& engine) {
  (void)engine;  // the settings are the engine's; the parameter says which engine must exist
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");
}

std::vector<sg4::Host*> buildPlatform(sg4::Engine& engine, const PlatformSpec& spec) {
  (void)engine;
  TERSE_CHECK(spec.ranks >= 1, InvalidArgument, "simulated platform: ranks must be >= 1, got " << spec.ranks);
  spec.links.validate(spec.ranks);
  const auto n = static_cast<std::size_t>(spec.ranks);
  sg4::NetZone* zone = sg4::create_full_zone("cluster");
  std::vector<sg4::Host*> hosts;
  std::vector<sg4::Link*> egress(n, nullptr), ingress(n, nullptr);
  for (std::size_t r = 0; r < n; ++r) {
    // The speed only matters to SimGrid executions, which terse does not use: computation is slept (runtime.h).
    hosts.push_back(zone->create_host("rank" + std::to_string(r), 1e9));
    if (spec.links.nic_egress_bps > 0)
      egress[r] = zone->create_link("nic-out" + std::to_string(r), bytesPerSecond(spec.links.nic_egress_bps));
    if (spec.links.nic_ingress_bps > 0)
      ingress[r] = zone->create_link("nic-in" + std::to_string(r), bytesPerSecond(spec.links.nic_ingress_bps));
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;  // a rank's frames to itself never touch the network (network.h)
      const comm::LinkSpec s = spec.links.linkSpec(static_cast<int>(i), static_cast<int>(j));
      sg4::Link* wire =
          zone->create_link("wire" + std::to_string(i) + "-" + std::to_string(j), bytesPerSecond(s.bandwidth_bps));
      wire->set_latency(s.latency_s);
      std::vector<sg4::LinkInRoute> route;
      if (egress[i] != nullptr) route.emplace_back(egress[i]);
      route.emplace_back(wire);
      if (ingress[j] != nullptr) route.emplace_back(ingress[j]);
      zone->add_route(hosts[i]->get_netpoint(), hosts[j]->get_netpoint(), nullptr, nullptr, route, false);
    }
  }
  zone->seal();
  return hosts;
}

std::string describePlatform(const PlatformSpec& spec) {
  return "simgrid " + std::to_string(SIMGRID_VERSION_MAJOR) + "." + std::to_string(SIMGRID_VERSION_MINOR) +
         " CM02 (no correction factors, no cross traffic, no TCP window cap), full-duplex mesh of " +
         std::to_string(spec.ranks) + " hosts: " + spec.links.describe();
}

}  // namespace terse::sim

// Builds the simulated cluster's SimGrid platform (platform.h).
#include "core/sim/platform.h"

#include <cmath>
#include <sstream>
#include <utility>

#include <simgrid/config.h>
#include <simgrid/version.h>
#include <xbt/base.h>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
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

void TwoLevelTopology::validate() const {
  TERSE_CHECK(workers_per_node >= 1, InvalidArgument,
              "topology: workers_per_node must be >= 1, got " << workers_per_node);
  TERSE_CHECK(nics_per_node >= 1, InvalidArgument, "topology: nics_per_node must be >= 1, got " << nics_per_node);
  TERSE_CHECK(nodes_per_rack >= 0, InvalidArgument,
              "topology: nodes_per_rack must be >= 0 (0 = no racks), got " << nodes_per_rack);
  TERSE_CHECK(std::isfinite(oversubscription) && oversubscription >= 1, InvalidArgument,
              "topology: oversubscription must be finite and >= 1, got " << oversubscription);
  for (const auto& [what, l] : {std::pair{"intra", intra}, std::pair{"nic", nic}}) {
    TERSE_CHECK(
        std::isfinite(l.bandwidth_bps) && l.bandwidth_bps >= 0 && std::isfinite(l.latency_s) && l.latency_s >= 0,
        InvalidArgument,
        "topology: " << what << " bandwidth and latency must be finite and >= 0, got " << l.bandwidth_bps << " bps, "
                     << l.latency_s << " s");
  }
}

std::string TwoLevelTopology::describe() const {
  std::ostringstream out;
  out << "two-level: nodes of " << workers_per_node << " workers on " << comm::formatBandwidth(intra.bandwidth_bps)
      << " " << comm::formatDuration(intra.latency_s) << " links, " << nics_per_node << " x "
      << comm::formatBandwidth(nic.bandwidth_bps) << " NICs " << comm::formatDuration(nic.latency_s);
  if (racks()) {
    out << ", fat-tree: racks of " << nodes_per_rack << " nodes, leaf uplinks ";
    if (oversubscription > 1)
      out << "oversubscribed " << oversubscription << ":1";
    else
      out << "non-blocking";
  } else if (oversubscription > 1) {
    out << ", core oversubscribed " << oversubscription << ":1";
  } else {
    out << ", non-blocking core";
  }
  return out.str();
}

std::optional<TwoLevelTopology> topologyPreset(std::string_view name) {
  auto make = [](int workers, double intra_gbps, int nics, double nic_gbps) {
    TwoLevelTopology t;
    t.workers_per_node = workers;
    t.intra = comm::LinkSpec{intra_gbps * 1e9, 2e-6};
    t.nic = comm::LinkSpec{nic_gbps * 1e9, 5e-6};
    t.nics_per_node = nics;
    return t;
  };
  if (name == "8xA100-4x200G") return make(8, 2400, 4, 200);
  if (name == "8xH100-8x400G") return make(8, 3600, 8, 400);
  if (name == "4xV100-1x100G") return make(4, 1200, 1, 100);
  return std::nullopt;
}

std::string presetNames() {
  return "8xA100-4x200G, 8xH100-8x400G, 4xV100-1x100G";
}

TwoLevelTopology parseTopology(std::string_view text) {
  TwoLevelTopology t;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      const auto preset = topologyPreset(item);
      TERSE_CHECK(
          preset.has_value(), InvalidArgument,
          "topology '" << text << "': '" << item << "' is neither key=value nor a preset (" << presetNames() << ")");
      t = *preset;
      continue;
    }
    const std::string_view key = item.substr(0, eq);
    const std::string value(item.substr(eq + 1));
    auto integer = [&] {
      std::size_t pos = 0;
      int v = 0;
      try {
        v = std::stoi(value, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      TERSE_CHECK(pos == value.size() && !value.empty(), InvalidArgument,
                  "topology '" << text << "': " << key << " '" << value << "' is not an integer");
      return v;
    };
    if (key == "workers") {
      t.workers_per_node = integer();
    } else if (key == "nics") {
      t.nics_per_node = integer();
    } else if (key == "nodes_per_rack") {
      t.nodes_per_rack = integer();
    } else if (key == "intra") {
      t.intra.bandwidth_bps = comm::parseBandwidth(value);
    } else if (key == "intra_latency") {
      t.intra.latency_s = comm::parseDuration(value);
    } else if (key == "nic") {
      t.nic.bandwidth_bps = comm::parseBandwidth(value);
    } else if (key == "nic_latency") {
      t.nic.latency_s = comm::parseDuration(value);
    } else if (key == "oversubscription") {
      std::size_t pos = 0;
      double v = 0;
      try {
        v = std::stod(value, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      TERSE_CHECK(pos == value.size() && !value.empty(), InvalidArgument,
                  "topology '" << text << "': oversubscription '" << value << "' is not a number");
      t.oversubscription = v;
    } else {
      TERSE_THROW(InvalidArgument, "topology '" << text << "': unknown key '" << key
                                                << "' (workers, intra, intra_latency, nic, nics, nic_latency, "
                                                   "oversubscription, nodes_per_rack)");
    }
  }
  if (!t.enabled()) t.workers_per_node = -1;  // validate() names the missing node size
  t.validate();
  return t;
}

namespace {

// One star zone per node inside a star zone for the cluster (or for its rack, inside the cluster's), so routes grow
// with the hosts, not with their pairs (a full zone of 1,024 ranks would hold a million routes): a host's UP links
// toward its node's centre and DOWN links from it, each node's UP (its NICs out, then the core when there is one) and
// DOWN (its NICs in) toward its parent's centre through the node's gateway router, and each rack's UP (leaf uplink)
// and DOWN (leaf downlink) toward the spine through the rack's gateway router. SimGrid joins them into the routes
// platform.h describes.
struct ZoneLinks {
  sg4::NetZone* zone;
  simgrid::kernel::routing::NetPoint* gateway;
};

// Hangs `child` off `parent`'s centre by UP links `up` and DOWN links `down`, leaving through `child.gateway`.
void attach(sg4::NetZone* parent, const ZoneLinks& child, std::vector<sg4::LinkInRoute> up, sg4::Link* down) {
  parent->add_route(child.zone->get_netpoint(), nullptr, child.gateway, nullptr, up, false);
  parent->add_route(nullptr, child.zone->get_netpoint(), nullptr, child.gateway, {sg4::LinkInRoute(down)}, false);
}

// The mesh of per-pair wires (platform.h), its wires made when a route first crosses them. A full zone holds every
// wire and every route from the start: n(n-1) of each, a million links at 1,024 ranks, gigabytes of SimGrid's link and
// constraint objects and seconds to build them, for the n or n log n pairs a collective ever uses. This zone keeps the
// ranks' NIC links and answers a route by looking its wire up in a table indexed by pair, making the wire on the first
// route through it: the routes, their links, latencies and so the simulated times are those of the full mesh.
//
// The wires live in a zone of their own that is never sealed (SimGrid refuses new links in a sealed zone, and the
// engine seals the platform's tree when it starts running): no routes go through it, it only owns the links. SimGrid
// asks for routes from its kernel (the maestro) when a communication starts, where the s4u calls below run in place.
class MeshZone final : public simgrid::kernel::routing::NetZoneImpl {
 public:
  MeshZone(const std::string& name, const comm::EmulationConfig& links, int ranks)
      : NetZoneImpl(name), links_(links), n_(static_cast<std::size_t>(ranks)), wires_(n_ * n_, nullptr) {}

  // The hosts in rank order, with their NIC links; the zone sealed.
  std::vector<sg4::Host*> build() {
    std::vector<sg4::Host*> hosts;
    egress_.assign(n_, nullptr);
    ingress_.assign(n_, nullptr);
    for (std::size_t r = 0; r < n_; ++r) {
      // The speed only matters to SimGrid executions, which terse does not use: computation is slept (runtime.h).
      sg4::Host* host = get_iface()->create_host("rank" + std::to_string(r), 1e9);
      // NetPoint ids number a zone's vertices in the order they joined it: the ranks' here, nothing else joins.
      TERSE_CHECK(host->get_netpoint()->id() == r, InternalError,
                  "simulated platform: rank " << r << "'s host got vertex " << host->get_netpoint()->id());
      hosts.push_back(host);
      if (links_.nic_egress_bps > 0)
        egress_[r] =
            get_iface()->create_link("nic-out" + std::to_string(r), bytesPerSecond(links_.nic_egress_bps))->get_impl();
      if (links_.nic_ingress_bps > 0)
        ingress_[r] =
            get_iface()->create_link("nic-in" + std::to_string(r), bytesPerSecond(links_.nic_ingress_bps))->get_impl();
    }
    wire_zone_ = new WireZone(get_name() + "-wires");
    wire_zone_->set_network_model(get_network_model());
    get_iface()->seal();
    return hosts;
  }

  void get_local_route(const simgrid::kernel::routing::NetPoint* src, const simgrid::kernel::routing::NetPoint* dst,
                       simgrid::kernel::routing::Route* into, double* latency) override {
    const std::size_t i = src->id();
    const std::size_t j = dst->id();
    // A rank's frames to itself never touch the network (network.h), and nothing else lives in this zone.
    TERSE_CHECK(i < n_ && j < n_ && i != j, InternalError,
                "simulated platform: no route " << src->get_name() << " -> " << dst->get_name());
    if (egress_[i] != nullptr) into->link_list_.push_back(egress_[i]);
    into->link_list_.push_back(wire(i, j));
    if (ingress_[j] != nullptr) into->link_list_.push_back(ingress_[j]);
    // The NIC links have no latency: the wire's is the route's.
    if (latency != nullptr) *latency += links_.linkSpec(static_cast<int>(i), static_cast<int>(j)).latency_s;
  }

 private:
  // Owns the wires; routes nothing.
  class WireZone final : public simgrid::kernel::routing::NetZoneImpl {
   public:
    explicit WireZone(const std::string& name) : NetZoneImpl(name) {}
    void get_local_route(const simgrid::kernel::routing::NetPoint* src, const simgrid::kernel::routing::NetPoint*,
                         simgrid::kernel::routing::Route*, double*) override {
      TERSE_THROW(InternalError,
                  "simulated platform: the wires' zone routes nothing (asked from " << src->get_name() << ")");
    }
  };

  simgrid::kernel::resource::StandardLinkImpl* wire(std::size_t i, std::size_t j) {
    auto*& w = wires_[i * n_ + j];
    if (w == nullptr) {
      const comm::LinkSpec s = links_.linkSpec(static_cast<int>(i), static_cast<int>(j));
      sg4::Link* link = wire_zone_->create_link("wire" + std::to_string(i) + "-" + std::to_string(j),
                                                {bytesPerSecond(s.bandwidth_bps)});
      link->set_latency(s.latency_s);
      link->seal();
      w = link->get_impl();
    }
    return w;
  }

  comm::EmulationConfig links_;
  std::size_t n_;
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> egress_, ingress_;
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> wires_;  // i * n + j, made by wire()
  WireZone* wire_zone_ = nullptr;
};

std::vector<sg4::Host*> buildTwoLevel(const PlatformSpec& spec) {
  const TwoLevelTopology& t = spec.topology;
  t.validate();
  const int n = spec.ranks;
  const int per = t.workers_per_node;
  const int nodes = (n + per - 1) / per;
  const int per_rack = t.racks() ? t.nodes_per_rack : nodes;
  const double node_bps = t.nic.bandwidth_bps * t.nics_per_node;
  sg4::NetZone* cluster = sg4::create_star_zone("cluster");
  sg4::Link* core = nullptr;
  if (!t.racks() && t.oversubscription > 1 && node_bps > 0)
    core = cluster->create_link("core", bytesPerSecond(node_bps * nodes / t.oversubscription));
  std::vector<sg4::Host*> hosts;
  for (int first_node = 0; first_node < nodes; first_node += per_rack) {
    const int last_node = std::min(nodes, first_node + per_rack);
    // Without racks the nodes hang off the cluster itself; with them, off their rack's zone.
    ZoneLinks rack{cluster, nullptr};
    if (t.racks()) {
      const std::string name = "rack" + std::to_string(first_node / per_rack);
      rack.zone = sg4::create_star_zone(name);
      rack.zone->set_parent(cluster);
      // The leaf switch is a router in a zone of its own, hung off the rack's centre by no links: SimGrid's recursive
      // routing drops the lower levels' links of a route to a gateway that sits in a zone holding other zones (a
      // router made in the rack's zone itself gave routes of the rack links alone).
      ZoneLinks leaf{sg4::create_star_zone(name + "-leaf"), nullptr};
      leaf.zone->set_parent(rack.zone);
      leaf.gateway = leaf.zone->create_router(name + "-gw");
      leaf.zone->seal();
      rack.zone->add_route(leaf.zone->get_netpoint(), nullptr, leaf.gateway, nullptr, {}, false);
      rack.zone->add_route(nullptr, leaf.zone->get_netpoint(), nullptr, leaf.gateway, {}, false);
      rack.gateway = leaf.gateway;
    }
    for (int a = first_node; a < last_node; ++a) {
      const std::string name = "node" + std::to_string(a);
      ZoneLinks node{sg4::create_star_zone(name), nullptr};
      node.zone->set_parent(rack.zone);
      for (int r = a * per; r < std::min(n, (a + 1) * per); ++r) {
        const std::string rank = std::to_string(r);
        sg4::Host* host = node.zone->create_host("rank" + rank, 1e9);
        sg4::Link* up = node.zone->create_link("up" + rank, bytesPerSecond(t.intra.bandwidth_bps));
        up->set_latency(t.intra.latency_s);
        sg4::Link* down = node.zone->create_link("down" + rank, bytesPerSecond(t.intra.bandwidth_bps));
        node.zone->add_route(host->get_netpoint(), nullptr, nullptr, nullptr, {sg4::LinkInRoute(up)}, false);
        node.zone->add_route(nullptr, host->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(down)}, false);
        hosts.push_back(host);
      }
      node.gateway = node.zone->create_router(name + "-gw");
      node.zone->seal();
      sg4::Link* out = rack.zone->create_link(name + "-out", bytesPerSecond(node_bps));
      out->set_latency(t.nic.latency_s);
      sg4::Link* in = rack.zone->create_link(name + "-in", bytesPerSecond(node_bps));
      std::vector<sg4::LinkInRoute> up{sg4::LinkInRoute(out)};
      if (core != nullptr) up.emplace_back(core);
      attach(rack.zone, node, up, in);
    }
    if (!t.racks()) continue;
    rack.zone->seal();
    // The rack's share of the spine: its own nodes' NICs (a short last rack has fewer), divided by the ratio.
    const double uplink = bytesPerSecond(node_bps * (last_node - first_node) / t.oversubscription);
    const std::string name = rack.zone->get_name();
    attach(cluster, rack, {sg4::LinkInRoute(cluster->create_link(name + "-up", uplink))},
           cluster->create_link(name + "-down", uplink));
  }
  cluster->seal();
  return hosts;
}

}  // namespace

std::vector<sg4::Host*> buildPlatform(sg4::Engine& engine, const PlatformSpec& spec) {
  (void)engine;
  TERSE_CHECK(spec.ranks >= 1, InvalidArgument, "simulated platform: ranks must be >= 1, got " << spec.ranks);
  spec.links.validate(spec.ranks);
  if (spec.topology.enabled()) {
    TERSE_CHECK(!spec.links.enabled(), InvalidArgument,
                "simulated platform: a topology and emulated links (" << spec.links.describe()
                                                                      << ") both describe the network; use one");
    return buildTwoLevel(spec);
  }
  auto* zone = new MeshZone("cluster", spec.links, spec.ranks);
  return zone->build();
}

std::string describePlatform(const PlatformSpec& spec) {
  const std::string head = "simgrid " + std::to_string(SIMGRID_VERSION_MAJOR) + "." +
                           std::to_string(SIMGRID_VERSION_MINOR) +
                           " CM02 (no correction factors, no cross traffic, no TCP window cap), ";
  if (spec.topology.enabled()) return head + std::to_string(spec.ranks) + " hosts, " + spec.topology.describe();
  return head + "full-duplex mesh of " + std::to_string(spec.ranks) + " hosts: " + spec.links.describe();
}

}  // namespace terse::sim

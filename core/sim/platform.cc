// Builds the simulated cluster's SimGrid platform (platform.h).
#include "core/sim/platform.h"

#include <cmath>
#include <sstream>
#include <unordered_map>
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

// The mesh of per-pair wires (platform.h), its wires made when a route first crosses them. A full zone holds every
// wire and every route from the start: n(n-1) of each, a million links at 1,024 ranks, gigabytes of SimGrid's link and
// constraint objects and seconds to build them, for the n or n log n pairs a collective ever uses. This zone keeps the
// ranks' NIC links and answers a route by looking its wire up in a table indexed by pair, making the wire on the first
// route through it: the routes, their links, latencies and so the simulated times are those of the full mesh. The table
// is a hash map of the wires made, not an n x n array: the array's pointers alone were 2 GiB at 16,384 ranks.
//
// The wires live in a zone of their own that is never sealed (SimGrid refuses new links in a sealed zone, and the
// engine seals the platform's tree when it starts running): no routes go through it, it only owns the links. SimGrid
// asks for routes from its kernel (the maestro) when a communication starts, where the s4u calls below run in place.
// The ranks a route of a zone of n ranks joins. A rank's frames to itself never touch the network (network.h), and
// nothing else lives in these zones.
std::pair<std::size_t, std::size_t> routeEnds(const simgrid::kernel::routing::NetPoint* src,
                                              const simgrid::kernel::routing::NetPoint* dst, std::size_t n) {
  const std::size_t i = src->id();
  const std::size_t j = dst->id();
  TERSE_CHECK(i < n && j < n && i != j, InternalError,
              "simulated platform: no route " << src->get_name() << " -> " << dst->get_name());
  return {i, j};
}

class MeshZone final : public simgrid::kernel::routing::NetZoneImpl {
 public:
  MeshZone(const std::string& name, const comm::EmulationConfig& links, int ranks)
      : NetZoneImpl(name), links_(links), n_(static_cast<std::size_t>(ranks)) {}

  // The hosts in rank order, with their NIC links; the zone sealed.
  std::vector<sg4::Host*> build() {
    std::vector<sg4::Host*> hosts;
    egress_.assign(n_, nullptr);
    ingress_.assign(n_, nullptr);
    last_.assign(n_, LastWire{});
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
    const auto [i, j] = routeEnds(src, dst, n_);
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
    // SimGrid asks for a route at every communication's start, and a rank mostly sends to the peer it sent to last (a
    // ring's next rank, a stream's pieces): that answer is kept per rank, where the hash lookup behind it was 1.4% of
    // a 512-rank ring's host time.
    LastWire& last = last_[i];
    if (last.link != nullptr && last.to == j) return last.link;
    auto*& w = wires_[i * n_ + j];  // a new entry is nullptr
    if (w == nullptr) {
      const comm::LinkSpec s = links_.linkSpec(static_cast<int>(i), static_cast<int>(j));
      sg4::Link* link = wire_zone_->create_link("wire" + std::to_string(i) + "-" + std::to_string(j),
                                                {bytesPerSecond(s.bandwidth_bps)});
      link->set_latency(s.latency_s);
      link->seal();
      w = link->get_impl();
    }
    last = LastWire{j, w};
    return w;
  }

  struct LastWire {
    std::size_t to = 0;
    simgrid::kernel::resource::StandardLinkImpl* link = nullptr;
  };

  comm::EmulationConfig links_;
  std::size_t n_;
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> egress_, ingress_;
  std::unordered_map<std::size_t, simgrid::kernel::resource::StandardLinkImpl*> wires_;  // i * n + j, made by wire()
  std::vector<LastWire> last_;  // per rank: the wire of its last route (wire())
  WireZone* wire_zone_ = nullptr;
};

// The two-level cluster (platform.h) in one zone that computes each route from the ranks' indices. A tree of SimGrid
// zones (a star per node, per rack and for the cluster) gave the same routes, but SimGrid checks every host and link it
// creates against the names of the whole platform by walking every zone: one walk per creation over N /
// workers_per_node zones, so building 16,384 workers in racks took minutes (70% of a whole `terse whatif` at 8,192).
// Here the platform has one zone, a creation's check is one map lookup, and a route is a few array reads.
//
// The links are made in the order the zone tree made them (the core; then per node its ranks' up and down links and
// its NICs out and in; per rack, after its nodes, its uplink and downlink), and each route lists its links in the
// order SimGrid's recursive routing joined them (platform.h), so the max-min solver sees the same constraints in the
// same order and every simulated time is the tree's to the bit. A route's latency is the sum of its links' as the tree
// summed them: the up link's intra-node latency and the node's egress NIC latency, the only links with one.
class TwoLevelZone final : public simgrid::kernel::routing::NetZoneImpl {
 public:
  TwoLevelZone(const std::string& name, const TwoLevelTopology& t, int ranks)
      : NetZoneImpl(name), t_(t), n_(static_cast<std::size_t>(ranks)) {}

  // The hosts in rank order, with every link; the zone sealed.
  std::vector<sg4::Host*> build() {
    const std::size_t per = static_cast<std::size_t>(t_.workers_per_node);
    const std::size_t nodes = (n_ + per - 1) / per;
    const std::size_t per_rack = t_.racks() ? static_cast<std::size_t>(t_.nodes_per_rack) : nodes;
    const double node_bps = t_.nic.bandwidth_bps * t_.nics_per_node;
    sg4::NetZone* zone = get_iface();
    if (!t_.racks() && t_.oversubscription > 1 && node_bps > 0)
      core_ = zone->create_link("core", bytesPerSecond(node_bps * static_cast<double>(nodes) / t_.oversubscription))
                  ->get_impl();
    std::vector<sg4::Host*> hosts;
    hosts.reserve(n_);
    up_.reserve(n_);
    down_.reserve(n_);
    for (std::size_t first_node = 0; first_node < nodes; first_node += per_rack) {
      const std::size_t last_node = std::min(nodes, first_node + per_rack);
      for (std::size_t a = first_node; a < last_node; ++a) {
        for (std::size_t r = a * per; r < std::min(n_, (a + 1) * per); ++r) {
          const std::string rank = std::to_string(r);
          sg4::Host* host = zone->create_host("rank" + rank, 1e9);
          // NetPoint ids number a zone's vertices in the order they joined it: the ranks' here, nothing else joins.
          TERSE_CHECK(host->get_netpoint()->id() == r, InternalError,
                      "simulated platform: rank " << r << "'s host got vertex " << host->get_netpoint()->id());
          hosts.push_back(host);
          sg4::Link* up = zone->create_link("up" + rank, bytesPerSecond(t_.intra.bandwidth_bps));
          up->set_latency(t_.intra.latency_s);
          up_.push_back(up->get_impl());
          down_.push_back(zone->create_link("down" + rank, bytesPerSecond(t_.intra.bandwidth_bps))->get_impl());
        }
        const std::string name = "node" + std::to_string(a);
        sg4::Link* out = zone->create_link(name + "-out", bytesPerSecond(node_bps));
        out->set_latency(t_.nic.latency_s);
        node_out_.push_back(out->get_impl());
        node_in_.push_back(zone->create_link(name + "-in", bytesPerSecond(node_bps))->get_impl());
      }
      if (!t_.racks()) continue;
      // The rack's share of the spine: its own nodes' NICs (a short last rack has fewer), divided by the ratio.
      const double uplink =
          bytesPerSecond(node_bps * static_cast<double>(last_node - first_node) / t_.oversubscription);
      const std::string name = "rack" + std::to_string(first_node / per_rack);
      rack_up_.push_back(zone->create_link(name + "-up", uplink)->get_impl());
      rack_down_.push_back(zone->create_link(name + "-down", uplink)->get_impl());
    }
    zone->seal();
    return hosts;
  }

  void get_local_route(const simgrid::kernel::routing::NetPoint* src, const simgrid::kernel::routing::NetPoint* dst,
                       simgrid::kernel::routing::Route* into, double* latency) override {
    const auto [i, j] = routeEnds(src, dst, n_);
    const std::size_t per = static_cast<std::size_t>(t_.workers_per_node);
    const std::size_t a = i / per;
    const std::size_t b = j / per;
    auto& links = into->link_list_;
    links.push_back(up_[i]);
    double l = t_.intra.latency_s;
    if (a != b) {
      links.push_back(node_out_[a]);
      // The tree's recursive routing added the node's egress NIC's latency first, the up link's after: the same sum
      // (two terms, the other links add zeros).
      l = t_.nic.latency_s + l;
      if (t_.racks()) {
        const std::size_t per_rack = static_cast<std::size_t>(t_.nodes_per_rack);
        if (a / per_rack != b / per_rack) {
          links.push_back(rack_up_[a / per_rack]);
          links.push_back(rack_down_[b / per_rack]);
        }
      } else if (core_ != nullptr) {
        links.push_back(core_);
      }
      links.push_back(node_in_[b]);
    }
    links.push_back(down_[j]);
    if (latency != nullptr) *latency += l;
  }

 private:
  TwoLevelTopology t_;
  std::size_t n_;
  simgrid::kernel::resource::StandardLinkImpl* core_ = nullptr;
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> up_, down_;            // per rank
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> node_out_, node_in_;   // per node
  std::vector<simgrid::kernel::resource::StandardLinkImpl*> rack_up_, rack_down_;  // per rack
};

std::vector<sg4::Host*> buildTwoLevel(const PlatformSpec& spec) {
  spec.topology.validate();
  auto* zone = new TwoLevelZone("cluster", spec.topology, spec.ranks);
  return zone->build();
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

// The runtime's options from a resolved experiment (config.h): emulated links, the simulated topology, collectives
// and codec options, plugin parameters. The config was validated before; the checks here guard direct callers.
#include <algorithm>
#include <sstream>
#include <string>

#include "experiments/config/config.h"
#include "experiments/config/config_checks.h"

namespace terse::experiments {

comm::EmulationConfig emulationConfig(const Experiment& experiment) {
  const auto& link = experiment.link();
  comm::EmulationConfig config;
  config.link.bandwidth_bps = comm::parseBandwidth(link.bandwidth());
  config.link.latency_s = comm::parseDuration(link.latency());
  config.nic_egress_bps = comm::parseBandwidth(link.nic());
  config.nic_ingress_bps = comm::parseBandwidth(link.nic_ingress());
  for (const auto& o : link.overrides()) {
    config.overrides.push_back(
        {o.src(), o.dst(), comm::LinkSpec{comm::parseBandwidth(o.bandwidth()), comm::parseDuration(o.latency())}});
  }
  return config;
}

sim::TwoLevelTopology topology(const Experiment& experiment) {
  if (!experiment.simulation().has_topology()) return {};
  const Topology& t = experiment.simulation().topology();
  sim::TwoLevelTopology out;
  if (t.has_preset()) {
    const auto preset = sim::topologyPreset(t.preset());
    TERSE_CHECK(preset.has_value(), InvalidArgument,
                "simulation.topology.preset '" << t.preset() << "' is not one of " << sim::presetNames());
    out = *preset;
  }
  if (t.has_workers_per_node()) out.workers_per_node = t.workers_per_node();
  if (t.has_intra_bandwidth()) out.intra.bandwidth_bps = comm::parseBandwidth(t.intra_bandwidth());
  if (t.has_intra_latency()) out.intra.latency_s = comm::parseDuration(t.intra_latency());
  if (t.has_nic_bandwidth()) out.nic.bandwidth_bps = comm::parseBandwidth(t.nic_bandwidth());
  if (t.has_nic_latency()) out.nic.latency_s = comm::parseDuration(t.nic_latency());
  if (t.has_nics_per_node()) out.nics_per_node = t.nics_per_node();
  if (t.has_oversubscription()) out.oversubscription = t.oversubscription();
  if (t.has_nodes_per_rack()) out.nodes_per_rack = t.nodes_per_rack();
  // A topology without a node size is one nobody finished describing: validate() names the field.
  if (!out.enabled()) out.workers_per_node = -1;
  return out;
}

comm::HostCommOptions hostCommOptions(const Experiment& experiment) {
  comm::HostCommOptions o;
  std::string problem;
  const auto reduce = parseCollective(experiment.collectives().allreduce(), comm::parseAllreduceAlgorithm,
                                      comm::allreduceAlgorithmChoices(), problem);
  TERSE_CHECK(reduce.has_value(), InvalidArgument, "collectives.allreduce" << problem);
  const auto gather = parseCollective(experiment.collectives().allgather(), comm::parseAllgatherAlgorithm,
                                      comm::allgatherAlgorithmChoices(), problem);
  TERSE_CHECK(gather.has_value(), InvalidArgument, "collectives.allgather" << problem);
  o.algorithm = *reduce;
  o.allgather = *gather;
  if (experiment.collectives().has_ranks_per_node()) {
    o.ranks_per_node = experiment.collectives().ranks_per_node();
  } else if (experiment.clock() == Experiment::SIMULATED && experiment.simulation().has_topology()) {
    o.ranks_per_node = std::max(1, std::min(topology(experiment).workers_per_node, experiment.workers()));
  }
  return o;
}

CodecOptions codecOptions(const Experiment& experiment) {
  CodecOptions options;
  options.error_feedback = experiment.error_feedback();
  if (experiment.error_feedback_rule() == Experiment::EF21) options.error_feedback_rule = ErrorFeedbackRule::kEf21;
  // Unfilled by the loader (config_fields.cc): unset reads as plain EF21's 1, not proto's 0.
  options.ef21_momentum = experiment.has_ef21_momentum() ? experiment.ef21_momentum() : 1.0;
  options.momentum_correction = experiment.momentum_correction().factor();
  options.momentum_masking = experiment.momentum_correction().masking();
  options.momentum_nesterov = experiment.momentum_correction().nesterov();
  return options;
}

std::string errorFeedbackRuleLabel(const Experiment& experiment) {
  if (experiment.error_feedback_rule() != Experiment::EF21) return "EF";
  // Unfilled by the loader: unset is plain EF21's 1.
  if (!experiment.has_ef21_momentum() || experiment.ef21_momentum() == 1) return "EF21";
  std::ostringstream eta;
  eta << experiment.ef21_momentum();
  return "EF21 eta=" + eta.str();
}

Params pluginParams(const PluginSpec& spec) {
  Params params(spec.params().begin(), spec.params().end());
  std::sort(params.begin(), params.end());
  return params;
}

}  // namespace terse::experiments

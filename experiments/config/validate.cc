// Validation of a resolved experiment (config.h's validateExperiment): the field tables' rules and the checks across
// fields (config_fields.cc), and the plugins loaded with their params, as "path message" strings that loadStudyText
// turns into file:line errors.
#include <algorithm>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/config/config_table.h"

namespace terse::experiments {
namespace {

// A parameter server decodes every push and delta pull on its own (core/train/param_server_detail.h says why).
void checkParameterServerCaps(Checks& c, const std::string& what, const PluginSpec& spec, const CompressorCaps& caps) {
  if (caps.aggregation == Aggregation::kCustom)
    c.fail(what + ".name") << ": " << quoted(spec.name())
                           << " has CUSTOM aggregation, and a parameter server decodes each push and pull on its own; "
                              "use a SUM or ALLGATHER compressor";
  else if (caps.num_rounds != 1)
    c.fail(what + ".name") << ": " << quoted(spec.name()) << " has " << caps.num_rounds
                           << " rounds, and a parameter server decodes each push and pull on its own; use a "
                              "single-round compressor";
  else if ((caps.devices & TERSE_DEVICE_HOST) == 0)
    c.fail(what + ".name") << ": " << quoted(spec.name())
                           << " has no host implementation, which a parameter server's shards need";
}

void checkPlugin(Checks& c, const std::string& what, const PluginSpec& spec, const ConfigOptions& options,
                 table::PluginRole role) {
  const bool scheduler = role == table::PluginRole::kScheduler;
  if (spec.name().empty()) {
    c.fail(what + ".name") << " must be set";
    return;
  }
  if (scheduler && std::find(options.builtin_schedulers.begin(), options.builtin_schedulers.end(), spec.name()) !=
                       options.builtin_schedulers.end()) {
    if (!spec.params().empty())
      c.fail(what + ".params") << ": the built-in scheduler " << quoted(spec.name()) << " takes no parameters";
    return;
  }
  if (options.loader == nullptr) return;
  // The params' line when there are any; otherwise the name's, which the reader is looking at anyway.
  const std::string params_path = what + (spec.params().empty() ? ".name" : ".params");
  try {
    if (scheduler) {
      auto plugin = options.loader->loadScheduler(spec.name());
      try {
        plugin->instantiate(pluginParams(spec));
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    } else {
      auto plugin = options.loader->loadCompressor(spec.name());
      try {
        const auto instance = plugin->instantiate(pluginParams(spec));
        if (role == table::PluginRole::kParameterServerCompressor)
          checkParameterServerCaps(c, what, spec, instance->caps(DType::kF32));
        const bool local =
            role == table::PluginRole::kLocalSgdCompressor || role == table::PluginRole::kPostLocalSgdCompressor;
        if (local && instance->caps(DType::kF32).aggregation == Aggregation::kCustom)
          c.fail(what + ".name") << ": " << quoted(spec.name())
                                 << " has CUSTOM aggregation, whose aggregate need not be the mean of the inputs (a "
                                    "majority vote of signs is +-1 per element), and local SGD's averagings move the "
                                    "models by that aggregate; use a SUM or ALLGATHER compressor";
        else if (role == table::PluginRole::kEf21Compressor &&
                 instance->caps(DType::kF32).aggregation == Aggregation::kCustom)
          c.fail(what + ".name") << ": " << quoted(spec.name())
                                 << " has CUSTOM aggregation, whose aggregate need not be the sum of what the ranks "
                                    "sent (a majority vote of signs is +-1 per element), and EF21 adds that aggregate "
                                    "to the sum of the ranks' estimates; use a SUM or ALLGATHER compressor, or "
                                    "error_feedback_rule EF";
        else if (role == table::PluginRole::kEf21Compressor &&
                 instance->caps(DType::kF32).aggregation == Aggregation::kSum &&
                 instance->caps(DType::kF32).wire_dtype != DType::kF32)
          c.fail(what + ".name") << ": " << quoted(spec.name()) << " sums in "
                                 << dtypeName(instance->caps(DType::kF32).wire_dtype)
                                 << ", and EF21 keeps the sum of the estimates from those sums, where what a 16-bit "
                                    "sum rounds away stays for good; use a compressor that sums in f32, or "
                                    "error_feedback_rule EF";
        else if (role == table::PluginRole::kPostLocalSgdCompressor && instance->caps(DType::kF32).stateful)
          c.fail(what + ".name") << ": " << quoted(spec.name())
                                 << " keeps state from step to step, which local_sgd.start_step > 0 would carry from "
                                    "the gradient steps into the averaged parameter deltas; use start_step 0 or a "
                                    "stateless compressor";
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    }
  } catch (const Error& e) {
    c.fail(what + ".name") << ": " << untagged(e);
  }
}

}  // namespace

std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options) {
  return validateExperiment(e, options, nullptr);
}

std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options, PluginCheckMemo* memo) {
  // A plugin spec's check (load, instantiate with the params) depends on the spec alone: with a memo each distinct one
  // is checked once per study.
  struct State {
    const ConfigOptions& options;
    PluginCheckMemo* memo;
  } state{options, memo};
  auto plugin = [](Checks& c, const std::string& what, const PluginSpec& spec, table::PluginRole role, void* opaque) {
    const State& s = *static_cast<const State*>(opaque);
    if (s.memo == nullptr) return checkPlugin(c, what, spec, s.options, role);
    std::string key = what + '\n' + std::to_string(static_cast<int>(role)) + '\n' + spec.name();
    for (const auto& [k, v] : pluginParams(spec))
      key += '\n' + std::to_string(k.size()) + ':' + k + std::to_string(v.size()) + ':' + v;
    auto [it, inserted] = s.memo->try_emplace(std::move(key));
    if (inserted) {
      Checks mine;
      checkPlugin(mine, what, spec, s.options, role);
      it->second = mine.take();
    }
    for (const auto& m : it->second) c.fail(m);
  };
  Checks c;
  table::checkFields(c, e);
  const table::RuleContext context{options, plugin, &state};
  for (const auto& rule : table::rules()) rule.check(c, e, context);
  return c.take();
}

}  // namespace terse::experiments

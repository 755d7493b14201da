// The provenance table's rows (provenance.h) from what a run's provenance.json and config say.
#include "results/compare/provenance.h"

#include <cmath>
#include <filesystem>

#include "results/compare/text.h"
#include "results/result_writer.h"

namespace terse::results::detail {

namespace {

std::string jsonScalarText(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  // Integers (rounds, sizes, versions) as integers; anything else with full precision.
  if (v.is_number_integer()) return dumpJson(v);
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::fabs(d) < 1e15 && d == std::floor(d)) return fixed(d, 0);
    return fullPrecision(d);
  }
  if (v.is_structured()) return "...";
  return dumpJson(v);  // true, false, null
}

std::string objectText(const Json* o, std::string_view sep = " ") {
  if (o == nullptr || !o->is_object()) return "";
  std::string out;
  for (const auto& [k, v] : o->items()) out += (out.empty() ? "" : std::string(sep)) + k + "=" + jsonScalarText(v);
  return out;
}

// A plugin record's "resolved_params" (result_writer.h's PluginRecord): "" when absent (an older run), the note when
// null, else key=value pairs ("(none)" for a plugin without parameters).
std::string resolvedText(const Json& plugin) {
  const Json* r = findMember(plugin, "resolved_params");
  if (r == nullptr) return "";
  if (!r->is_object()) return std::string(kDefaultsNotReported);
  return r->empty() ? "(none)" : objectText(r);
}

// Which file a plugin record names, as the tables show it: its file name and where the loader found it ("build tree",
// "install", "plugin path", "path"), e.g. "terse_compressor_topk.so [build tree]". Not the absolute path: the table is
// committed beside the study (results/reference/) and read on other machines, where the SHA-256 beside it says whether
// two runs loaded the same file and the directory would only name the machine that made it. The run folder's own
// provenance.json keeps the full path.
std::string pluginFileText(const Json& plugin) {
  const std::string path = getString(plugin, "path").value_or("");
  if (path.empty()) return "";
  const std::string origin = getString(plugin, "origin").value_or("");
  return std::filesystem::path(path).filename().string() + (origin.empty() ? "" : " [" + origin + "]");
}

}  // namespace

std::string shortHash(const std::string& h) {
  if (h.empty()) return "-";
  const bool dirty = h.size() > 6 && h.ends_with("-dirty");
  const std::string hash = dirty ? h.substr(0, h.size() - 6) : h;
  return (hash.size() > 12 ? hash.substr(0, 12) : hash) + (dirty ? "-dirty" : "");
}

ProvenanceRow provenanceRow(const RunData& run) {
  ProvenanceRow r;
  r.study = run.study;
  r.variant = run.variant;
  r.state = run.state;
  r.config_sha256 = run.config_sha256;
  if (!run.provenance) return r;
  const Json& p = *run.provenance;
  auto str = [](const Json& o, std::string_view key) { return getString(o, key).value_or(""); };
  r.git_commit = str(p, "git_commit");
  r.terse_version = str(p, "terse_version");
  r.host = str(p, "host");
  r.cpu = str(p, "cpu");
  r.gemm = str(p, "gemm");
  r.start_time = str(p, "start_time");
  r.transport = str(p, "transport");
  r.mode = str(p, "mode");
  if (auto w = getNumber(p, "world_size")) r.world_size = fixed(*w, 0);
  r.link = objectText(findMember(p, "link_emulation"));
  // Runs from before the clock setting existed measured real time.
  r.clock = str(p, "clock").empty() ? "real_time" : str(p, "clock");
  if (const Json* s = findMember(p, "simulation"); s && s->is_object() && !s->empty()) r.simulation = objectText(s);
  r.hook = objectText(findMember(p, "hook"));
  if (const Json* plugins = findMember(p, "plugins"); plugins && plugins->is_array()) {
    for (const auto& pl : *plugins) {
      if (str(pl, "kind") == "compressor" && str(pl, "role").empty() && r.compressor.empty()) {
        r.compressor = str(pl, "name");
        r.compressor_version = str(pl, "version");
        if (auto abi = getNumber(pl, "abi_version")) r.compressor_abi = "v" + fixed(*abi, 0);
        r.compressor_file = pluginFileText(pl);
        r.caps = objectText(findMember(pl, "caps"));
        r.params = objectText(findMember(pl, "params"));
        r.compressor_sha256 = str(pl, "sha256");
        r.resolved_params = resolvedText(pl);
      } else {
        const std::string params = objectText(findMember(pl, "params"));
        const std::string resolved = resolvedText(pl);
        // A role (a parameter server's pull compressor) says more than the kind.
        const std::string what = str(pl, "role").empty() ? str(pl, "kind") : str(pl, "role");
        r.other_plugins +=
            (r.other_plugins.empty() ? "" : "; ") + what + " " + str(pl, "name") + " " + str(pl, "version") + " " +
            pluginFileText(pl) + (str(pl, "sha256").empty() ? "" : " sha256 " + shortHash(str(pl, "sha256"))) +
            (params.empty() ? "" : " " + params) + (resolved.empty() ? "" : " (resolved: " + resolved + ")");
      }
    }
  }
  return r;
}

std::vector<std::pair<std::string, std::string ProvenanceRow::*>> provenanceColumns() {
  return {{"study", &ProvenanceRow::study},
          {"variant", &ProvenanceRow::variant},
          {"state", &ProvenanceRow::state},
          {"config_sha256", &ProvenanceRow::config_sha256},
          {"git_commit", &ProvenanceRow::git_commit},
          {"terse_version", &ProvenanceRow::terse_version},
          {"compressor", &ProvenanceRow::compressor},
          {"compressor_version", &ProvenanceRow::compressor_version},
          {"compressor_abi", &ProvenanceRow::compressor_abi},
          {"compressor_file", &ProvenanceRow::compressor_file},
          {"compressor_sha256", &ProvenanceRow::compressor_sha256},
          {"caps", &ProvenanceRow::caps},
          {"params", &ProvenanceRow::params},
          {"resolved_params", &ProvenanceRow::resolved_params},
          {"other_plugins", &ProvenanceRow::other_plugins},
          {"transport", &ProvenanceRow::transport},
          {"mode", &ProvenanceRow::mode},
          {"world_size", &ProvenanceRow::world_size},
          {"link_emulation", &ProvenanceRow::link},
          {"clock", &ProvenanceRow::clock},
          {"simulation", &ProvenanceRow::simulation},
          {"host", &ProvenanceRow::host},
          {"cpu", &ProvenanceRow::cpu},
          {"gemm", &ProvenanceRow::gemm},
          {"start_time", &ProvenanceRow::start_time},
          // Last: added after the others, so a tool that reads the CSV by position keeps its columns.
          {"hook", &ProvenanceRow::hook}};
}

}  // namespace terse::results::detail

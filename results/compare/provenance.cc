// The provenance table's rows (provenance.h) from what a run's provenance.json and config say.
#include "results/compare/provenance.h"

#include <cmath>

#include "results/compare/text.h"

namespace terse::results::detail {

namespace {

std::string jsonScalarText(const Json& v) {
  switch (v.kind) {
    case Json::Kind::kString:
      return v.string;
    case Json::Kind::kNumber: {
      // Integers (rounds, sizes, versions) as integers; anything else with full precision.
      if (std::fabs(v.number) < 1e15 && v.number == std::floor(v.number)) return fixed(v.number, 0);
      return fullPrecision(v.number);
    }
    case Json::Kind::kBool:
      return v.boolean ? "true" : "false";
    case Json::Kind::kNull:
      return "null";
    default:
      return "...";
  }
}

std::string objectText(const Json* o, std::string_view sep = " ") {
  if (o == nullptr || o->kind != Json::Kind::kObject) return "";
  std::string out;
  for (const auto& [k, v] : o->object) out += (out.empty() ? "" : std::string(sep)) + k + "=" + jsonScalarText(v);
  return out;
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
  r.git_commit = p.str("git_commit");
  r.terse_version = p.str("terse_version");
  r.host = p.str("host");
  r.start_time = p.str("start_time");
  r.transport = p.str("transport");
  r.mode = p.str("mode");
  if (auto w = p.num("world_size")) r.world_size = fixed(*w, 0);
  r.link = objectText(p.find("link_emulation"));
  // Runs from before the clock setting existed measured real time.
  r.clock = p.str("clock").empty() ? "real_time" : p.str("clock");
  if (const Json* s = p.find("simulation"); s && s->kind == Json::Kind::kObject && !s->object.empty())
    r.simulation = objectText(s);
  if (const Json* plugins = p.find("plugins"); plugins && plugins->kind == Json::Kind::kArray) {
    for (const auto& pl : plugins->array) {
      if (pl.str("kind") == "compressor" && r.compressor.empty()) {
        r.compressor = pl.str("name");
        r.compressor_version = pl.str("version");
        if (auto abi = pl.num("abi_version")) r.compressor_abi = "v" + fixed(*abi, 0);
        r.compressor_path = pl.str("path");
        r.caps = objectText(pl.find("caps"));
        r.params = objectText(pl.find("params"));
        r.compressor_sha256 = pl.str("sha256");
      } else {
        const std::string params = objectText(pl.find("params"));
        r.other_plugins += (r.other_plugins.empty() ? "" : "; ") + pl.str("kind") + " " + pl.str("name") + " " +
                           pl.str("version") + " " + pl.str("path") +
                           (pl.str("sha256").empty() ? "" : " sha256 " + shortHash(pl.str("sha256"))) +
                           (params.empty() ? "" : " " + params);
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
          {"compressor_path", &ProvenanceRow::compressor_path},
          {"compressor_sha256", &ProvenanceRow::compressor_sha256},
          {"caps", &ProvenanceRow::caps},
          {"params", &ProvenanceRow::params},
          {"other_plugins", &ProvenanceRow::other_plugins},
          {"transport", &ProvenanceRow::transport},
          {"mode", &ProvenanceRow::mode},
          {"world_size", &ProvenanceRow::world_size},
          {"link_emulation", &ProvenanceRow::link},
          {"clock", &ProvenanceRow::clock},
          {"simulation", &ProvenanceRow::simulation},
          {"host", &ProvenanceRow::host},
          {"start_time", &ProvenanceRow::start_time}};
}

}  // namespace terse::results::detail

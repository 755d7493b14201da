// The JSON documents of `terse compare` (format.h): the tables with the warnings embedded.
#include "core/common/json.h"
#include "results/compare/format.h"
#include "results/compare/provenance.h"

namespace terse::results {

namespace {

// JSON has no NaN: an absent figure is null.
Json number(const std::optional<double>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json seedStatsJson(const SeedStats& st) {
  // Each sample's seed beside it (null for a run that is not a repeat's), so a reader can pair them as the test did.
  Json seeds = Json::array();
  for (const auto& seed : st.seeds) seeds.push_back(seed ? Json(*seed) : Json(nullptr));
  return Json{{"samples", st.samples},
              {"sample_seeds", std::move(seeds)},
              {"ci95", number(st.ci95)},
              {"p_vs_baseline", number(st.p_vs_baseline)},
              {"test", st.test ? Json(noiseTestName(*st.test)) : Json(nullptr)},
              {"within_noise", st.withinNoise()}};
}

Json rowJson(const CompareRow& r) {
  Json o{{"variant", r.variant},
         {"baseline", r.baseline},
         {"state", r.state},
         {"error", r.error},
         {"dir", r.dir.string()},
         {"compressor", r.compressor},
         {"error_feedback", r.error_feedback},
         {"error_feedback_rule", r.error_feedback_rule},
         {"compression_start_step", r.compression_start_step},
         {"records", r.records},
         {"steps", r.steps},
         {"final_accuracy", number(r.final_accuracy)},
         {"best_accuracy", number(r.best_accuracy)},
         {"wire_bytes_per_worker", number(r.wire_bytes)},
         {"wire_bytes_per_step", number(r.wire_bytes_per_step)},
         {"payload_bytes_per_worker", number(r.payload_bytes)},
         {"push_bytes_per_worker", number(r.push_bytes)},
         {"pull_bytes_per_worker", number(r.pull_bytes)},
         {"pull_residual_rel", number(r.pull_residual)},
         {"control_bytes_per_worker", number(r.control_bytes)},
         {"negotiation_rounds_per_worker", number(r.negotiation_rounds)},
         {"ratio_vs_baseline", number(r.ratio)},
         {"reached_target", r.to_target.has_value()},
         {"bytes_to_target", r.to_target ? Json(r.to_target->wire_bytes) : Json(nullptr)},
         {"seconds_to_target", r.to_target ? Json(r.to_target->wall_s) : Json(nullptr)},
         {"clock", r.simulated ? "simulated" : "real_time"},
         {"step_s", number(r.step_s)},
         {"compute_s", number(r.compute_s)},
         {"codec_s", number(r.codec_s)},
         {"comm_s", number(r.comm_s)},
         {"exposed_comm_s", number(r.exposed_comm_s)},
         {"seeds", r.seeds},
         {"reached_target_seeds", r.reached_target}};
  // Per metric over the seeds: the values and their seeds, the 95% t-interval's half-width, and the p-value against the
  // baseline with the test that gave it ("paired" on the per-seed differences, or "welch": stats.h).
  o["over_seeds"] = Json{{"final_accuracy", seedStatsJson(r.final_stats)},
                         {"best_accuracy", seedStatsJson(r.best_stats)},
                         {"wire_bytes_per_worker", seedStatsJson(r.wire_stats)},
                         {"bytes_to_target", seedStatsJson(r.bytes_to_target_stats)},
                         {"seconds_to_target", seedStatsJson(r.s_to_target_stats)}};
  o["staleness"] = r.staleness ? Json{{"mean", r.staleness->mean},
                                      {"max", r.staleness->max},
                                      {"p50", number(r.staleness->p50)},
                                      {"p90", number(r.staleness->p90)},
                                      // true: the percentile is past the histogram's buckets, at least p50 / p90
                                      {"p50_at_least", r.staleness->p50_beyond},
                                      {"p90_at_least", r.staleness->p90_beyond}}
                               : Json(nullptr);
  return o;
}

}  // namespace

// Pretty-printed (two spaces): one member per line, so two documents diff line by line.
std::string toJson(const Comparison& c, const std::vector<std::string>& warnings) {
  Json studies = Json::array();
  for (const auto& t : c.studies) {
    Json rows = Json::array();
    for (const auto& r : t.rows) rows.push_back(rowJson(r));
    Json grid = Json::object();  // a grid point's table: axis path -> value
    for (const auto& [path, value] : t.grid) grid[path] = value;
    studies.push_back(Json{{"study", t.study},
                           {"grid_point", std::move(grid)},
                           {"baseline", t.baseline},
                           {"baseline_source", t.baseline_source},
                           {"notes", t.notes},
                           {"rows", std::move(rows)}});
  }
  return dumpJson(Json{{"target", c.target},
                       {"row_order", kRowOrder},
                       {"warnings", warnings},
                       {"studies", std::move(studies)}},
                  2) +
         "\n";
}

std::string provenanceTableJson(const std::vector<RunData>& runs, const std::vector<std::string>& warnings) {
  const auto columns = detail::provenanceColumns();
  Json rows = Json::array();
  for (const auto& run : runs) {
    const detail::ProvenanceRow p = detail::provenanceRow(run);
    Json o = Json::object();
    for (const auto& [name, member] : columns) o[name] = p.*member;
    rows.push_back(std::move(o));
  }
  return dumpJson(Json{{"warnings", warnings}, {"runs", std::move(rows)}}, 2) + "\n";
}

}  // namespace terse::results

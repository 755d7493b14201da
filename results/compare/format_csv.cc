// The CSV tables of `terse compare` (format.h): one row per run, numbers in full precision for scripts.
#include <cmath>
#include <sstream>

#include "results/compare/format.h"
#include "results/compare/provenance.h"
#include "results/compare/text.h"

namespace terse::results {

namespace {

std::string csvCell(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csvNumber(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return "";
  return detail::fullPrecision(*v);
}

}  // namespace

std::string toCsv(const Comparison& c) {
  std::ostringstream o;
  o << "study,variant,baseline,state,compressor,error_feedback,records,steps,final_accuracy,best_accuracy,"
       "wire_bytes_per_worker,wire_bytes_per_step,payload_bytes_per_worker,ratio_vs_baseline,target,reached_target,"
       "bytes_to_target,seconds_to_target,step_s,compute_s,codec_s,comm_s,exposed_comm_s,staleness_mean,"
       "staleness_max,staleness_p50,staleness_p90,error,clock,seeds,reached_target_seeds,final_accuracy_ci95,"
       "best_accuracy_ci95,wire_bytes_ci95,bytes_to_target_ci95,seconds_to_target_ci95,final_accuracy_p_vs_baseline,"
       "best_accuracy_p_vs_baseline,wire_bytes_p_vs_baseline,bytes_to_target_p_vs_baseline,"
       "seconds_to_target_p_vs_baseline,control_bytes_per_worker,negotiation_rounds_per_worker,push_bytes_per_worker,"
       "pull_bytes_per_worker,grid_point,pull_residual_rel,error_feedback_rule,"
       "compression_start_step\n";
  for (const auto& t : c.studies) {
    for (const auto& r : t.rows) {
      // Past the histogram's last bucket a percentile is a bound, not a number: left empty.
      const std::string p50 = r.staleness && !r.staleness->p50_beyond ? csvNumber(r.staleness->p50) : "";
      const std::string p90 = r.staleness && !r.staleness->p90_beyond ? csvNumber(r.staleness->p90) : "";
      std::vector<std::string> cells = {csvCell(t.study),
                                        csvCell(r.variant),
                                        r.baseline ? "true" : "false",
                                        csvCell(r.state),
                                        csvCell(r.compressor),
                                        r.error_feedback ? "true" : "false",
                                        std::to_string(r.records),
                                        std::to_string(r.steps),
                                        csvNumber(r.final_accuracy),
                                        csvNumber(r.best_accuracy),
                                        csvNumber(r.wire_bytes),
                                        csvNumber(r.wire_bytes_per_step),
                                        csvNumber(r.payload_bytes),
                                        csvNumber(r.ratio),
                                        csvNumber(c.target),
                                        r.to_target ? "true" : "false",
                                        r.to_target ? csvNumber(r.to_target->wire_bytes) : "",
                                        r.to_target ? csvNumber(r.to_target->wall_s) : "",
                                        csvNumber(r.step_s),
                                        csvNumber(r.compute_s),
                                        csvNumber(r.codec_s),
                                        csvNumber(r.comm_s),
                                        csvNumber(r.exposed_comm_s),
                                        r.staleness ? csvNumber(r.staleness->mean) : "",
                                        r.staleness ? csvNumber(r.staleness->max) : "",
                                        p50,
                                        p90,
                                        csvCell(r.error),
                                        r.simulated ? "simulated" : "real_time",
                                        std::to_string(r.seeds),
                                        std::to_string(r.reached_target)};
      // Appended after the older columns, so scripts that index columns keep working.
      for (const SeedStats* st :
           {&r.final_stats, &r.best_stats, &r.wire_stats, &r.bytes_to_target_stats, &r.s_to_target_stats})
        cells.push_back(csvNumber(st->ci95));
      for (const SeedStats* st :
           {&r.final_stats, &r.best_stats, &r.wire_stats, &r.bytes_to_target_stats, &r.s_to_target_stats})
        cells.push_back(csvNumber(st->p_vs_baseline));
      cells.push_back(csvNumber(r.control_bytes));
      cells.push_back(csvNumber(r.negotiation_rounds));
      cells.push_back(csvNumber(r.push_bytes));
      cells.push_back(csvNumber(r.pull_bytes));
      // A grid point's table: "link.bandwidth=1Gbps;workers=8", one row per variant and point, for a figure across
      // them.
      std::string point;
      for (const auto& [path, value] : t.grid) point += (point.empty() ? "" : ";") + path + "=" + value;
      cells.push_back(csvCell(point));
      cells.push_back(csvNumber(r.pull_residual));
      cells.push_back(csvCell(r.error_feedback_rule));
      cells.push_back(std::to_string(r.compression_start_step));
      o << detail::joinLines(cells, ",") << '\n';
    }
  }
  return o.str();
}

std::string provenanceTableCsv(const std::vector<RunData>& runs) {
  const auto columns = detail::provenanceColumns();
  std::ostringstream o;
  for (std::size_t i = 0; i < columns.size(); ++i) o << (i ? "," : "") << columns[i].first;
  o << '\n';
  for (const auto& run : runs) {
    const detail::ProvenanceRow p = detail::provenanceRow(run);
    for (std::size_t i = 0; i < columns.size(); ++i) o << (i ? "," : "") << csvCell(p.*(columns[i].second));
    o << '\n';
  }
  return o.str();
}

}  // namespace terse::results

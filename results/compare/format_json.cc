// The JSON documents of `terse compare` (format.h): the tables with the warnings embedded, one study and one row
// per line.
#include <cmath>
#include <cstdio>

#include "results/compare/format.h"
#include "results/compare/provenance.h"
#include "results/json.h"

namespace terse::results {

namespace {

void addNumber(JsonObject& o, std::string_view key, const std::optional<double>& v) {
  o.add(key, v ? *v : std::nan(""));
}

std::string jsonStringArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& s : items) {
    if (out.size() > 1) out += ',';
    appendJsonString(out, s);
  }
  return out + "]";
}

}  // namespace

std::string toJson(const Comparison& c, const std::vector<std::string>& warnings) {
  // One study per line and one row per line: diffable, and still one JSON document.
  std::string studies = "[";
  for (const auto& t : c.studies) {
    std::string rows = "[";
    for (const auto& r : t.rows) {
      JsonObject o;
      o.add("variant", r.variant)
          .add("baseline", r.baseline)
          .add("state", r.state)
          .add("error", r.error)
          .add("dir", r.dir.string())
          .add("compressor", r.compressor)
          .add("error_feedback", r.error_feedback)
          .add("records", r.records)
          .add("steps", r.steps);
      addNumber(o, "final_accuracy", r.final_accuracy);
      addNumber(o, "best_accuracy", r.best_accuracy);
      addNumber(o, "wire_bytes_per_worker", r.wire_bytes);
      addNumber(o, "wire_bytes_per_step", r.wire_bytes_per_step);
      addNumber(o, "payload_bytes_per_worker", r.payload_bytes);
      addNumber(o, "control_bytes_per_worker", r.control_bytes);
      addNumber(o, "negotiation_rounds_per_worker", r.negotiation_rounds);
      addNumber(o, "ratio_vs_baseline", r.ratio);
      o.add("reached_target", r.to_target.has_value());
      addNumber(o, "bytes_to_target",
                r.to_target ? std::optional<double>(r.to_target->wire_bytes) : std::optional<double>());
      addNumber(o, "seconds_to_target",
                r.to_target ? std::optional<double>(r.to_target->wall_s) : std::optional<double>());
      o.add("clock", r.simulated ? "simulated" : "real_time");
      addNumber(o, "step_s", r.step_s);
      addNumber(o, "compute_s", r.compute_s);
      addNumber(o, "codec_s", r.codec_s);
      addNumber(o, "comm_s", r.comm_s);
      addNumber(o, "exposed_comm_s", r.exposed_comm_s);
      o.add("seeds", static_cast<int64_t>(r.seeds)).add("reached_target_seeds", static_cast<int64_t>(r.reached_target));
      // Per metric over the seeds: the values, the 95% t-interval's half-width and Welch's p against the baseline.
      JsonObject over;
      for (const auto& [key, st] : {std::pair<const char*, const SeedStats*>{"final_accuracy", &r.final_stats},
                                    {"best_accuracy", &r.best_stats},
                                    {"wire_bytes_per_worker", &r.wire_stats},
                                    {"bytes_to_target", &r.bytes_to_target_stats},
                                    {"seconds_to_target", &r.s_to_target_stats}}) {
        JsonObject m;
        std::string samples = "[";
        for (double v : st->samples) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.17g", v);  // as JsonObject writes numbers; samples are finite
          samples += (samples.size() > 1 ? "," : "") + std::string(buf);
        }
        m.raw("samples", samples + "]");
        addNumber(m, "ci95", st->ci95);
        addNumber(m, "p_vs_baseline", st->p_vs_baseline);
        m.add("within_noise", st->withinNoise());
        over.raw(key, m.str());
      }
      o.raw("over_seeds", over.str());
      if (r.staleness) {
        JsonObject s;
        s.add("mean", r.staleness->mean).add("max", r.staleness->max);
        addNumber(s, "p50", r.staleness->p50);
        addNumber(s, "p90", r.staleness->p90);
        o.raw("staleness", s.str());
      } else {
        o.raw("staleness", "null");
      }
      rows += (rows.size() > 1 ? ",\n    " : "\n    ") + o.str();
    }
    rows += "]";
    JsonObject st;
    st.add("study", t.study)
        .add("baseline", t.baseline)
        .add("baseline_source", t.baseline_source)
        .raw("notes", jsonStringArray(t.notes))
        .raw("rows", rows);
    studies += (studies.size() > 1 ? ",\n  " : "\n  ") + st.str();
  }
  studies += "]";
  return JsonObject()
             .add("target", c.target)
             .add("row_order", kRowOrder)
             .raw("warnings", jsonStringArray(warnings))
             .raw("studies", studies)
             .str() +
         "\n";
}

std::string provenanceTableJson(const std::vector<RunData>& runs, const std::vector<std::string>& warnings) {
  const auto columns = detail::provenanceColumns();
  std::string rows = "[";
  for (const auto& run : runs) {
    const detail::ProvenanceRow p = detail::provenanceRow(run);
    JsonObject o;
    for (const auto& [name, member] : columns) o.add(name, p.*member);
    rows += (rows.size() > 1 ? ",\n  " : "\n  ") + o.str();
  }
  rows += "]";
  return JsonObject().raw("warnings", jsonStringArray(warnings)).raw("runs", rows).str() + "\n";
}

}  // namespace terse::results

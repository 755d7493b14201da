// The markdown tables of `terse compare` (format.h): the comparison table and the provenance table, one section per
// study, numbers rounded for reading.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "results/compare/format.h"
#include "results/compare/provenance.h"
#include "results/compare/text.h"
#include "results/result_writer.h"

namespace terse::results {

namespace {

using detail::fixed;

// Three significant figures, without exponent for the ranges tables show.
std::string sig3(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 100) return fixed(v, 0);
  if (a >= 10) return fixed(v, 1);
  if (a >= 1) return fixed(v, 2);
  if (a >= 0.1) return fixed(v, 3);
  std::ostringstream s;
  s << std::setprecision(3) << v;
  return s.str();
}

std::string orDash(const std::optional<double>& v, double scale, int digits = -1) {
  if (!v) return "-";
  return digits < 0 ? sig3(*v * scale) : fixed(*v * scale, digits);
}

// Markdown table cells: a '|' would end the cell, a newline the row.
std::string mdCell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n' || c == '\r')
      out += ' ';
    else
      out += c;
  }
  return out;
}

// Staleness is counted in versions: max and percentiles are whole numbers, the mean is not.
std::string stalenessText(const StalenessSummary& s) {
  auto whole = [](double v) { return std::isfinite(v) && v == std::floor(v) ? fixed(v, 0) : sig3(v); };
  std::string out = "mean " + sig3(s.mean) + ", max " + whole(s.max);
  if (s.p50) out += ", p50 " + std::string(s.p50_beyond ? ">= " : "") + whole(*s.p50);
  if (s.p90) out += ", p90 " + std::string(s.p90_beyond ? ">= " : "") + whole(*s.p90);
  return out;
}

// "mean ± half-width" when the row has an interval, then "≈" when the difference from the baseline is within noise.
std::string withSpread(std::string mean, const SeedStats& stats, double scale, int digits = -1) {
  if (mean == "-" || mean == "not reached") return mean;
  if (stats.ci95) mean += " ± " + (digits < 0 ? sig3(*stats.ci95 * scale) : fixed(*stats.ci95 * scale, digits));
  if (stats.withinNoise()) mean += " ≈";
  return mean;
}

// The legend's words for the test behind the table's ≈ marks (compute.h "Repeats"): the paired test where every row
// ran the baseline's seeds, Welch's where none did, and where both were used, the cells Welch's test judged.
std::string noiseTestText(const StudyTable& t) {
  const std::string paired = "a paired t-test on the per-seed differences from the baseline (same seeds)";
  const std::string welch = "Welch's t-test (unpaired: the seeds differ from the baseline's)";
  std::vector<std::string> welch_cells;
  bool any_paired = false;
  for (const auto& r : t.rows) {
    const std::pair<const SeedStats*, const char*> metrics[] = {{&r.final_stats, "final acc"},
                                                                {&r.best_stats, "best acc"},
                                                                {&r.wire_stats, "wire MB"},
                                                                {&r.bytes_to_target_stats, "MB to target"},
                                                                {&r.s_to_target_stats, "s to target"}};
    std::string unpaired;
    for (const auto& [st, name] : metrics) {
      if (st->test == NoiseTest::kPaired) any_paired = true;
      if (st->test == NoiseTest::kWelch) unpaired += (unpaired.empty() ? "" : ", ") + std::string(name);
    }
    if (!unpaired.empty()) welch_cells.push_back("`" + r.variant + "` (" + unpaired + ")");
  }
  if (welch_cells.empty() && any_paired) return paired;
  if (!any_paired && !welch_cells.empty()) return welch;
  if (welch_cells.empty())
    return "a paired t-test on the per-seed differences where a row ran the baseline's seeds, else Welch's t-test";
  std::string cells;
  for (const auto& c : welch_cells) cells += (cells.empty() ? "" : "; ") + c;
  return paired + ", or " + welch + " for " + cells;
}

// A grid study's tables side by side (compute.h): for each variant and point the time to the target (with its speedup
// over that point's baseline), the wire bytes (with the baseline's over them) and the final accuracy, each with its
// seed interval and noise mark, so that where compression pays (a slow link, many workers) reads off one table.
// `tables` are one study's, one per point, in the comparison's order. Rows: the baselines first, then by name.
void gridPivots(std::ostringstream& o, const std::vector<const StudyTable*>& tables, const std::string& target) {
  std::vector<std::string> variants, baselines;
  for (const StudyTable* t : tables) {
    if (!t->baseline.empty() && std::find(baselines.begin(), baselines.end(), t->baseline) == baselines.end())
      baselines.push_back(t->baseline);
    for (const auto& r : t->rows)
      if (std::find(variants.begin(), variants.end(), r.variant) == variants.end()) variants.push_back(r.variant);
  }
  std::sort(variants.begin(), variants.end(), [&](const std::string& a, const std::string& b) {
    const bool ba = std::find(baselines.begin(), baselines.end(), a) != baselines.end();
    const bool bb = std::find(baselines.begin(), baselines.end(), b) != baselines.end();
    return ba != bb ? ba : a < b;
  });
  auto find = [](const StudyTable& t, const std::string& variant) -> const CompareRow* {
    for (const auto& r : t.rows)
      if (r.variant == variant) return &r;
    return nullptr;
  };
  std::string axes;
  for (const auto& [path, value] : tables.front()->grid) axes += (axes.empty() ? "" : ", ") + path;
  bool all_simulated = true;
  for (const StudyTable* t : tables)
    for (const auto& r : t->rows) all_simulated = all_simulated && r.simulated;
  o << "\n### " << mdCell(tables.front()->study) << " across its grid\n\n"
    << "One column per point (" << mdCell(axes) << "), each against its own baseline"
    << (baselines.empty() ? "" : " (in brackets)") << "; rows: the baseline, then by name; `-`: the variant did not "
    << "run there.\n";
  auto header = [&] {
    o << "| variant |";
    for (const StudyTable* t : tables) {
      std::string values;
      for (const auto& [path, value] : t->grid) values += (values.empty() ? "" : ", ") + value;
      o << ' ' << mdCell(values) << " |";
    }
    o << "\n|---|";
    for (std::size_t i = 0; i < tables.size(); ++i) o << "---:|";
    o << '\n';
  };
  // One pivot: `cell` writes a row's cell at a point, given the point's baseline row (null without one).
  auto pivot = [&](const std::string& title, auto cell) {
    o << '\n' << title << ":\n\n";
    header();
    for (const auto& v : variants) {
      o << "| " << mdCell(v) << " |";
      for (const StudyTable* t : tables) {
        const CompareRow* r = find(*t, v);
        const CompareRow* base = find(*t, t->baseline);
        o << ' ' << mdCell(r == nullptr ? "-" : cell(*r, base != r ? base : nullptr)) << " |";
      }
      o << '\n';
    }
  };
  pivot(std::string(all_simulated ? "Simulated seconds" : "Seconds") + " to " + target +
            (baselines.empty() ? "" : " (speedup: the baseline's time / the variant's)"),
        [&](const CompareRow& r, const CompareRow* base) -> std::string {
          if (!r.to_target || !std::isfinite(r.to_target->wall_s)) return r.records > 0 ? "not reached" : "-";
          std::string cell = withSpread(sig3(r.to_target->wall_s), r.s_to_target_stats, 1);
          if (base != nullptr && base->to_target && r.to_target->wall_s > 0)
            cell += " (" + sig3(base->to_target->wall_s / r.to_target->wall_s) + "×)";
          return cell;
        });
  pivot(std::string("Wire MB/worker") +
            (baselines.empty() ? "" : " (ratio: the baseline's bytes per step / the variant's)"),
        [&](const CompareRow& r, const CompareRow* base) -> std::string {
          std::string cell = withSpread(orDash(r.wire_bytes, 1e-6), r.wire_stats, 1e-6);
          if (base != nullptr && r.ratio) cell += " (" + sig3(*r.ratio) + "×)";
          return cell;
        });
  pivot("Final accuracy", [&](const CompareRow& r, const CompareRow*) -> std::string {
    return withSpread(orDash(r.final_accuracy, 1, 4), r.final_stats, 1, 4);
  });
}

std::string stateText(const CompareRow& r) {
  if (r.state == kStateRunning && r.gone_pid != 0) return "running (pid " + std::to_string(r.gone_pid) + " gone)";
  if (r.state == kStateRunning && r.live_pid != 0) return "running";
  if (r.state == kStateRunning) return "running/killed";
  if (r.state == kStateFailed) return "**failed**";
  return r.state;
}

}  // namespace

std::string toMarkdown(const Comparison& c) {
  std::ostringstream o;
  const std::string target = sig3(c.target);
  for (std::size_t s = 0; s < c.studies.size(); ++s) {
    const StudyTable& t = c.studies[s];
    bool any_staleness = false, any_control = false, any_push_pull = false, any_residual = false;
    int simulated = 0, most_seeds = 1;
    for (const auto& r : t.rows) {
      most_seeds = std::max(most_seeds, r.seeds);
      any_control = any_control || r.control_bytes.has_value();
      any_push_pull = any_push_pull || r.push_bytes.has_value() || r.pull_bytes.has_value();
      any_staleness = any_staleness || r.staleness.has_value();
      any_residual = any_residual || r.pull_residual.has_value();
      simulated += r.simulated ? 1 : 0;
    }
    // Simulated seconds (DESIGN.md section 9) are the modeled cluster's, not this host's: say so in the header when
    // every row has them, on the rows when only some do (their times do not compare with the others').
    const bool all_simulated = simulated > 0 && simulated == static_cast<int>(t.rows.size());
    const std::string sim = all_simulated ? "sim " : "";
    if (s > 0) o << '\n';
    o << "### " << mdCell(t.study) << (t.grid.empty() ? "" : " at " + mdCell(gridTitle(t))) << "\n\n";
    o << "Baseline: " << (t.baseline.empty() ? "none" : "`" + t.baseline + "`")
      << (t.baseline_source == "auto"         ? " (compressor none)"
          : t.baseline_source == "--baseline" ? " (--baseline)"
                                              : "")
      << ". Target accuracy " << target << ". Rows: " << kRowOrder << ".\n\n";
    if (most_seeds > 1)
      o << "Repeated seeds: each number is the mean over the row's seeds; ± is the half-width of the 95% Student "
           "t-interval of the mean (t(0.975, n-1) s / sqrt(n)); ≈ marks a difference from the baseline within the "
           "seed-to-seed noise: p >= 0.05 by "
        << noiseTestText(t) << ".\n\n";
    std::vector<std::string> header = {"variant",
                                       "state",
                                       "final acc",
                                       "best acc",
                                       "wire MB/worker",
                                       "wire KB/step",
                                       "payload MB/worker",
                                       "ratio vs " + (t.baseline.empty() ? std::string("dense") : t.baseline),
                                       "MB to " + target,
                                       sim + "s to " + target,
                                       sim + "step ms",
                                       sim + "compute ms",
                                       sim + "codec ms",
                                       sim + "comm ms",
                                       sim + "exposed comm ms"};
    // Beside the wire bytes, never folded into them: their count depends on timing (result_writer.h).
    if (any_control) header.insert(header.begin() + 5, "control KB/worker (rounds)");
    // A parameter server's wire bytes in their two directions (compute.h): both are in "wire MB/worker".
    if (any_push_pull) header.insert(header.begin() + 5, "push / pull MB/worker");
    if (any_staleness) header.push_back("staleness");
    if (any_residual) header.push_back("pull residual");
    // A study of single runs keeps the table it always had.
    if (most_seeds > 1) header.insert(header.begin() + 2, "seeds");
    o << '|';
    for (const auto& h : header) o << ' ' << mdCell(h) << " |";
    o << "\n|";
    for (std::size_t i = 0; i < header.size(); ++i) o << (i < 2 ? "---|" : "---:|");
    o << '\n';
    for (const auto& r : t.rows) {
      std::vector<std::string> cells = {
          (r.baseline ? "**" + r.variant + "** (baseline)" : r.variant) +
              (r.simulated && !all_simulated ? " (simulated time)" : ""),
          stateText(r),
          withSpread(orDash(r.final_accuracy, 1, 4), r.final_stats, 1, 4),
          withSpread(orDash(r.best_accuracy, 1, 4), r.best_stats, 1, 4),
          withSpread(orDash(r.wire_bytes, 1e-6), r.wire_stats, 1e-6),
          orDash(r.wire_bytes_per_step, 1e-3),
          orDash(r.payload_bytes, 1e-6),
          r.ratio ? sig3(*r.ratio) + "×" : "-",
          r.to_target ? withSpread(sig3(r.to_target->wire_bytes * 1e-6), r.bytes_to_target_stats, 1e-6)
                      : (r.records > 0 ? "not reached" : "-"),
          r.to_target
              ? (std::isnan(r.to_target->wall_s) ? "-" : withSpread(sig3(r.to_target->wall_s), r.s_to_target_stats, 1))
              : (r.records > 0 ? "not reached" : "-"),
          orDash(r.step_s, 1e3),
          orDash(r.compute_s, 1e3),
          orDash(r.codec_s, 1e3),
          orDash(r.comm_s, 1e3),
          orDash(r.exposed_comm_s, 1e3)};
      if (any_control)
        cells.insert(
            cells.begin() + 5,
            r.control_bytes ? sig3(*r.control_bytes * 1e-3) + " (" + orDash(r.negotiation_rounds, 1, 0) + ")" : "-");
      if (any_push_pull)
        cells.insert(cells.begin() + 5, r.push_bytes || r.pull_bytes
                                            ? orDash(r.push_bytes, 1e-6) + " / " + orDash(r.pull_bytes, 1e-6)
                                            : "-");
      if (any_staleness) cells.push_back(r.staleness ? stalenessText(*r.staleness) : "-");
      if (any_residual) cells.push_back(r.pull_residual ? sig3(*r.pull_residual) : "-");
      if (most_seeds > 1) cells.insert(cells.begin() + 2, std::to_string(r.seeds));
      o << '|';
      for (const auto& cell : cells) o << ' ' << mdCell(cell) << " |";
      o << '\n';
    }
    std::vector<std::string> notes = t.notes;
    if (any_push_pull)
      notes.push_back(
          "wire MB/worker counts all a run put on the network over its workers: every rank's sends for allreduce, "
          "both directions for a parameter server, push (the workers' pushes and requests) + pull (the shards' "
          "replies: the parameters); ratio and MB to target compare them on that footing");
    // What the CSV and JSON have as columns of their own, said here for the rows where it is not the default: a dense
    // warm-up's steps count in every column, and an error feedback rule other than EF changes what the row is.
    std::string warm, rules;
    for (const auto& r : t.rows) {
      if (r.compression_start_step > 0)
        warm += (warm.empty() ? "" : ", ") + r.variant + " from step " + std::to_string(r.compression_start_step);
      if (!r.error_feedback_rule.empty() && r.error_feedback_rule != "EF")
        rules += (rules.empty() ? "" : ", ") + r.variant + " " + r.error_feedback_rule;
    }
    if (!warm.empty())
      notes.push_back(
          "compressed after a dense warm-up (compression_start_step; the warm-up's steps are allreduced "
          "uncompressed and count in every column): " +
          warm);
    if (!rules.empty()) notes.push_back("error feedback's rule other than EF: " + rules);
    if (all_simulated) {
      notes.push_back("times are simulated seconds on the modeled cluster (clock SIMULATED), not this host's");
    } else if (simulated > 0) {
      notes.push_back(
          "rows marked (simulated time) report simulated seconds on the modeled cluster; their times do "
          "not compare with the real-time rows'");
    }
    if (!notes.empty()) {
      o << '\n';
      for (const auto& n : notes) o << "- " << mdCell(n) << '\n';
    }
    // After a grid study's last point, its points side by side.
    if (!t.grid.empty() && (s + 1 == c.studies.size() || c.studies[s + 1].study != t.study)) {
      // One pivot per set of axes: runs of one study made with other axes share no columns.
      const auto axesOf = [](const StudyTable& x) {
        std::vector<std::string> paths;
        for (const auto& [path, value] : x.grid) paths.push_back(path);
        return paths;
      };
      std::vector<std::vector<const StudyTable*>> groups;
      for (std::size_t k = 0; k <= s; ++k) {
        if (c.studies[k].study != t.study || c.studies[k].grid.empty()) continue;
        auto g = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& group) { return axesOf(*group.front()) == axesOf(c.studies[k]); });
        if (g == groups.end()) {
          groups.emplace_back();
          g = groups.end() - 1;
        }
        g->push_back(&c.studies[k]);
      }
      for (const auto& points : groups)
        if (points.size() > 1) gridPivots(o, points, target);
    }
  }
  return o.str();
}

std::string provenanceTableMarkdown(const std::vector<RunData>& runs) {
  std::ostringstream o;
  std::string study;
  bool first = true;
  for (const auto& run : runs) {
    const detail::ProvenanceRow p = detail::provenanceRow(run);
    if (first || run.study != study) {
      study = run.study;
      o << (first ? "" : "\n") << "### " << mdCell(study) << " (provenance)\n\n"
        << "| variant | state | config sha256 | git commit | compressor | caps | params | resolved params | transport "
           "| link emulation | host, cpu, gemm | started |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
      first = false;
    }
    const std::string compressor =
        p.compressor.empty()
            ? "-"
            : p.compressor + " " + p.compressor_version + " (ABI " + p.compressor_abi + ", " + p.compressor_file +
                  (p.compressor_sha256.empty() ? "" : ", sha256 " + detail::shortHash(p.compressor_sha256)) + ")" +
                  (p.other_plugins.empty() ? "" : "; " + p.other_plugins);
    // The clock belongs with the transport: a simulated run's times are its platform's (DESIGN.md section 9). So
    // does a PyTorch hook's granularity: how the gradients were cut up for the compressor.
    const std::string transport = p.transport.empty()
                                      ? "-"
                                      : p.transport + ", " + p.mode + ", " + p.world_size + " workers" +
                                            (p.clock == "simulated" ? ", simulated time (" + p.simulation + ")" : "") +
                                            (p.hook.empty() ? "" : ", hook " + p.hook);
    const std::vector<std::string> cells = {run.variant,
                                            p.state,
                                            detail::shortHash(p.config_sha256),
                                            detail::shortHash(p.git_commit),
                                            compressor,
                                            p.caps.empty() ? "-" : p.caps,
                                            p.params.empty() ? "-" : p.params,
                                            p.resolved_params.empty() ? "-" : p.resolved_params,
                                            transport,
                                            p.link.empty() ? "-" : p.link,
                                            (p.host.empty() ? "-" : p.host) + (p.cpu.empty() ? "" : ", " + p.cpu) +
                                                (p.gemm.empty() ? "" : ", gemm " + p.gemm),
                                            p.start_time.empty() ? "-" : p.start_time};
    o << '|';
    for (const auto& c : cells) o << ' ' << mdCell(c) << " |";
    o << '\n';
  }
  return o.str();
}

}  // namespace terse::results

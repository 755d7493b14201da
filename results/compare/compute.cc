// The comparison table's numbers (compute.h): one row per run, the study's baseline and ratios, the row order, and
// the check that the compared runs share a workload and data.
#include "results/compare/compute.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

#include "experiments/config/grid.h"  // pathsOverlap: the axes' own rule for one field inside another
#include "results/compare/provenance.h"
#include "results/compare/text.h"
#include "results/result_writer.h"

namespace terse::results {

const char* const kRowOrder =
    "variants that reached the target first, by bytes to target (fewest first); then by final accuracy (highest "
    "first); variants without records last";

using detail::joinLines;

namespace {

bool has(double v) {
  return !std::isnan(v);
}

std::optional<double> opt(double v) {
  return has(v) ? std::optional<double>(v) : std::nullopt;
}

std::optional<StalenessSummary> staleness(const EvalPoint& p) {
  if (!has(p.staleness_mean) && !has(p.staleness_max) && p.staleness_hist.empty()) return std::nullopt;
  StalenessSummary s;
  s.mean = has(p.staleness_mean) ? p.staleness_mean : std::nan("");
  s.max = has(p.staleness_max) ? p.staleness_max : std::nan("");
  double total = has(p.staleness_hist_overflow) ? p.staleness_hist_overflow : 0;
  for (const auto& [tau, count] : p.staleness_hist) total += count;
  // Every push past the buckets (an empty histogram with an overflow) still gives bounds: ">= 1024".
  if (total > 0) {
    // Percentiles by the nearest-rank rule; one that lands in the overflow bucket is known only to be at least the
    // bucket's bound (with hundreds of workers most pushes can be there: it used to vanish from the table).
    auto percentile = [&](double q, bool& beyond) -> std::optional<double> {
      const double rank = std::ceil(q * total);
      double seen = 0;
      for (const auto& [tau, count] : p.staleness_hist) {
        seen += count;
        if (seen >= rank) return static_cast<double>(tau);
      }
      if (!has(p.staleness_hist_overflow) || p.staleness_hist_overflow <= 0) return std::nullopt;
      beyond = true;
      return p.staleness_buckets;
    };
    s.p50 = percentile(0.5, s.p50_beyond);
    s.p90 = percentile(0.9, s.p90_beyond);
    // Without a recorded mean or max the histogram still gives them (overflow makes the mean a lower bound: unknown).
    if (!has(s.max) && !has(p.staleness_hist_overflow) && !p.staleness_hist.empty())
      s.max = static_cast<double>(p.staleness_hist.rbegin()->first);
    if (!has(s.mean) && !has(p.staleness_hist_overflow)) {
      double sum = 0;
      for (const auto& [tau, count] : p.staleness_hist) sum += static_cast<double>(tau) * count;
      s.mean = sum / total;
    }
  }
  return s;
}

// Natural order of a grid's values: digit runs compare as numbers, so 1Gbps, 10Gbps, 100Gbps and 2, 4, 16 come in
// their order, not the characters'.
bool naturalLess(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      std::string_view na(a.data() + i, ei - i), nb(b.data() + j, ej - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

// A value that is a number followed by a unit (or nothing): "0.05", "1e-3", "1.5Gbps". nullopt for anything else.
std::optional<std::pair<double, std::string_view>> numberAndUnit(const std::string& v) {
  if (v.empty() || std::isspace(static_cast<unsigned char>(v.front())) != 0) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || !std::isfinite(x)) return std::nullopt;
  return std::pair{x, std::string_view(v).substr(static_cast<std::size_t>(end - v.c_str()))};
}

// Grid values in order: numbers of one unit by value (0.05 before 0.1, which digit runs alone would put after it),
// else in natural order; values it takes for one (0.1 and 0.10, 4 and 04) are still two points.
bool valueLess(const std::string& a, const std::string& b) {
  const auto na = numberAndUnit(a), nb = numberAndUnit(b);
  if (na && nb && na->second == nb->second && na->first != nb->first) return na->first < nb->first;
  if (naturalLess(a, b)) return true;
  if (naturalLess(b, a)) return false;
  return a < b;
}

CompareRow makeRow(const RunData& run) {
  CompareRow r;
  r.variant = rowName(run);
  r.state = run.state;
  r.error = run.error;
  r.gone_pid = run.gone_pid;
  r.live_pid = run.live_pid;
  r.dir = run.dir;
  r.compressor = run.compressor;
  r.simulated = run.simulated;
  r.error_feedback = run.error_feedback || run.momentum_correction > 0;
  r.error_feedback_rule = run.error_feedback_rule.empty() && r.error_feedback ? "EF" : run.error_feedback_rule;
  r.compression_start_step = run.compression_start_step;
  r.records = static_cast<int64_t>(run.points.size());
  if (run.points.empty()) return r;
  const EvalPoint& last = run.points.back();
  r.steps = last.step;
  r.final_accuracy = last.accuracy;
  double best = 0;
  for (const auto& p : run.points) best = std::max(best, p.accuracy);
  r.best_accuracy = best;
  r.wire_bytes = last.wire_bytes;
  if (last.step > 0) r.wire_bytes_per_step = last.wire_bytes / static_cast<double>(last.step);
  r.payload_bytes = opt(last.payload_bytes);
  r.push_bytes = opt(last.push_bytes);
  r.pull_bytes = opt(last.pull_bytes);
  r.pull_residual = opt(last.pull_residual);
  r.control_bytes = opt(last.control_bytes);
  r.negotiation_rounds = opt(last.negotiation_rounds);
  r.compute_s = opt(last.compute_s);
  if (has(last.compress_s) || has(last.decompress_s))
    r.codec_s = (has(last.compress_s) ? last.compress_s : 0) + (has(last.decompress_s) ? last.decompress_s : 0);
  r.comm_s = opt(last.comm_s);
  r.exposed_comm_s = opt(last.exposed_comm_s);
  r.step_s = opt(last.step_s);
  r.staleness = staleness(last);
  return r;
}

bool isDense(const RunData& r) {
  return r.compressor == "none";
}

// Sort key, see kRowOrder.
bool rowBefore(const CompareRow& a, const CompareRow& b) {
  auto group = [](const CompareRow& r) { return r.to_target ? 0 : r.records > 0 ? 1 : 2; };
  if (group(a) != group(b)) return group(a) < group(b);
  if (a.to_target && a.to_target->wire_bytes != b.to_target->wire_bytes)
    return a.to_target->wire_bytes < b.to_target->wire_bytes;
  if (a.final_accuracy && b.final_accuracy && *a.final_accuracy != *b.final_accuracy)
    return *a.final_accuracy > *b.final_accuracy;
  return a.variant < b.variant;
}

// The section's "path=value" lines, less the fields a grid axis of the run's study varies: those differ by design. So
// does data.batch_size beside data.global_batch_size: it is the global batch's share, which moves with the workers.
std::string section(const RunData& r, std::string_view name, std::vector<std::string>& flat) {
  flat = name == "workload" ? r.workload_fields : r.data_fields;
  const bool global_batch = std::any_of(
      flat.begin(), flat.end(), [](const std::string& line) { return line.starts_with("data.global_batch_size="); });
  if (global_batch) std::erase_if(flat, [](const std::string& line) { return line.starts_with("data.batch_size="); });
  std::erase_if(flat, [&](const std::string& line) {
    const std::string_view path = std::string_view(line).substr(0, line.find('='));
    return std::any_of(r.grid.begin(), r.grid.end(),
                       [&](const auto& axis) { return experiments::pathsOverlap(axis.first, path); });
  });
  return joinLines(flat, "\n");
}

}  // namespace

std::optional<TargetCrossing> crossTarget(const std::vector<EvalPoint>& points, double target) {
  for (std::size_t i = 0; i < points.size(); ++i) {
    const EvalPoint& p = points[i];
    if (p.accuracy < target) continue;
    if (i == 0) return TargetCrossing{p.wire_bytes, p.wall_s};
    const EvalPoint& q = points[i - 1];
    // q.accuracy < target <= p.accuracy, so the denominator is positive.
    const double f = (target - q.accuracy) / (p.accuracy - q.accuracy);
    return TargetCrossing{q.wire_bytes + f * (p.wire_bytes - q.wire_bytes), q.wall_s + f * (p.wall_s - q.wall_s)};
  }
  return std::nullopt;
}

namespace {

void fillStats(SeedStats& stats, std::vector<double> samples, std::vector<std::optional<uint64_t>> seeds) {
  stats.samples = std::move(samples);
  stats.seeds = std::move(seeds);
  stats.ci95 = meanInterval(stats.samples).half_width;
}

// The mean of the values present; none when no run has one.
std::optional<double> meanOf(const std::vector<CompareRow>& rows, std::optional<double> CompareRow::*field) {
  std::vector<double> v;
  for (const auto& r : rows)
    if (r.*field) v.push_back(*(r.*field));
  if (v.empty()) return std::nullopt;
  return meanInterval(v).mean;
}

// One row from a variant's runs (one per seed of a repeat), with the notes its state deserves: every number the mean
// over the seeds, the SeedStats of the metrics compute.h lists.
CompareRow combineSeeds(const std::vector<const RunData*>& runs, double target, std::vector<std::string>& notes) {
  std::vector<CompareRow> rows;
  for (const RunData* r : runs) {
    rows.push_back(makeRow(*r));
    rows.back().to_target = crossTarget(r->points, target);
  }
  CompareRow out = rows.front();
  out.seeds = static_cast<int>(rows.size());
  for (const RunData* r : runs) out.run_dirs.push_back(r->dir);
  const std::string name = "`" + out.variant + "`";
  auto seedOf = [&](std::size_t i) {
    return runs[i]->repeat_seed ? " (seed " + std::to_string(*runs[i]->repeat_seed) + ")" : std::string();
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const RunData& r = *runs[i];
    if (r.state == kStateFailed)
      notes.push_back(name + seedOf(i) + " failed: " + (r.error.empty() ? "(no message)" : r.error));
    else if (r.state == kStateRunning && r.gone_pid != 0)
      notes.push_back(name + seedOf(i) + " has status running, but its process (pid " + std::to_string(r.gone_pid) +
                      ") is gone: it was killed; its numbers are partial");
    else if (r.state == kStateRunning && r.live_pid != 0)
      notes.push_back(name + seedOf(i) + " is still running (pid " + std::to_string(r.live_pid) +
                      " on this host); its numbers are partial");
    else if (r.state == kStateRunning)
      notes.push_back(name + seedOf(i) + " has status running: still running or killed; its numbers are partial");
    else if (r.state == "unknown")
      notes.push_back(name + seedOf(i) + ": status unknown (see the warnings)");
  }
  // Repeats of one variant must differ in their seed alone for the mean and interval to be over seed noise: a seed
  // re-run with --set (fewer epochs, another rate) would be averaged in unseen. The runs are grouped by their settings;
  // the largest group (the first run's, on a tie) is the reference, and each other group is named with what differs.
  auto seedName = [&](std::size_t i) {
    return runs[i]->repeat_seed ? std::to_string(*runs[i]->repeat_seed) : "run " + std::to_string(i + 1);
  };
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i]->has_config) continue;
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& x) { return runs[x.front()]->setting_fields == runs[i]->setting_fields; });
    if (g == groups.end())
      groups.push_back({i});
    else
      g->push_back(i);
  }
  if (groups.size() > 1) {
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    auto names = [&](const std::vector<std::size_t>& g) {
      const bool seeded = std::all_of(g.begin(), g.end(), [&](std::size_t i) { return runs[i]->repeat_seed; });
      std::string text = !seeded ? "" : g.size() == 1 ? "seed " : "seeds ";
      for (std::size_t k = 0; k < g.size(); ++k) text += (k ? ", " : "") + seedName(g[k]);
      return text;
    };
    // path -> value ("a,b" for a list's elements); a field one side lacks is "unset" there.
    auto byPath = [](const std::vector<std::string>& lines) {
      std::map<std::string, std::string> values;
      for (const auto& l : lines) {
        auto& v = values[l.substr(0, l.find('='))];
        v += (v.empty() ? "" : ",") + l.substr(l.find('=') + 1);
      }
      return values;
    };
    const auto reference = byPath(runs[groups[0].front()]->setting_fields);
    for (std::size_t g = 1; g < groups.size(); ++g) {
      const auto mine = byPath(runs[groups[g].front()]->setting_fields);
      std::set<std::string> paths;
      for (const auto& [p, v] : reference) paths.insert(p);
      for (const auto& [p, v] : mine) paths.insert(p);
      std::vector<std::string> differs;
      for (const auto& p : paths) {
        const auto a = reference.find(p), b = mine.find(p);
        const std::string va = a == reference.end() ? "unset" : a->second;
        const std::string vb = b == mine.end() ? "unset" : b->second;
        // A value of a long list is cut: the note names the field, the config has the rest.
        auto cut = [](const std::string& v) {
          return v.size() > 60 ? v.substr(0, 60) + "... (" + std::to_string(v.size()) + " bytes)" : v;
        };
        if (va != vb) differs.push_back(p + " " + cut(vb) + " (" + cut(va) + ")");
      }
      std::string text;
      for (std::size_t k = 0; k < differs.size() && k < 3; ++k) text += (k ? ", " : "") + differs[k];
      if (differs.size() > 3) text += " and " + std::to_string(differs.size() - 3) + " more";
      notes.push_back(name + ": " + names(groups[g]) + " ran with other settings than " + names(groups[0]) + ": " +
                      text + "; the row's means and intervals mix settings, not only seeds (run its seeds alike)");
    }
  }
  // The row's state is its worst seed's.
  auto severity = [](const std::string& state) {
    return state == kStateFailed ? 3 : state == kStateRunning ? 2 : state == kStateCompleted ? 0 : 1;
  };
  // Each metric's samples with the seed that gave them: the paired test matches them to the baseline's by seed.
  struct Samples {
    std::vector<double> values;
    std::vector<std::optional<uint64_t>> seeds;
    void add(double v, std::optional<uint64_t> seed) {
      values.push_back(v);
      seeds.push_back(seed);
    }
  };
  Samples final_acc, best_acc, wire, bytes_to_target, s_to_target;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& r = rows[i];
    const std::optional<uint64_t> seed = runs[i]->repeat_seed;
    if (severity(r.state) > severity(out.state)) {
      out.state = r.state;
      out.error = r.error;
      out.gone_pid = r.gone_pid;
      out.live_pid = r.live_pid;
    }
    if (r.final_accuracy) final_acc.add(*r.final_accuracy, seed);
    if (r.best_accuracy) best_acc.add(*r.best_accuracy, seed);
    if (r.wire_bytes) wire.add(*r.wire_bytes, seed);
    if (r.to_target) {
      ++out.reached_target;
      bytes_to_target.add(r.to_target->wire_bytes, seed);
      if (!std::isnan(r.to_target->wall_s)) s_to_target.add(r.to_target->wall_s, seed);
    }
  }
  fillStats(out.final_stats, final_acc.values, final_acc.seeds);
  fillStats(out.best_stats, best_acc.values, best_acc.seeds);
  fillStats(out.wire_stats, wire.values, wire.seeds);
  fillStats(out.bytes_to_target_stats, bytes_to_target.values, bytes_to_target.seeds);
  fillStats(out.s_to_target_stats, s_to_target.values, s_to_target.seeds);
  if (rows.size() == 1) return out;

  out.dir = runs.front()->dir.parent_path();
  for (const auto& r : rows) {
    out.records = std::min(out.records, r.records);
    out.steps = std::min(out.steps, r.steps);
    out.simulated = out.simulated && r.simulated;
  }
  for (auto field :
       {&CompareRow::final_accuracy, &CompareRow::best_accuracy, &CompareRow::wire_bytes,
        &CompareRow::wire_bytes_per_step, &CompareRow::payload_bytes, &CompareRow::push_bytes, &CompareRow::pull_bytes,
        &CompareRow::pull_residual, &CompareRow::control_bytes, &CompareRow::negotiation_rounds, &CompareRow::compute_s,
        &CompareRow::codec_s, &CompareRow::comm_s, &CompareRow::exposed_comm_s, &CompareRow::step_s})
    out.*field = meanOf(rows, field);
  // To target only when every seed gets there: a mean over the lucky seeds would flatter the variant.
  out.to_target.reset();
  if (out.reached_target == out.seeds) {
    out.to_target =
        TargetCrossing{meanInterval(bytes_to_target.values).mean,
                       s_to_target.values.size() == rows.size() ? meanInterval(s_to_target.values).mean : std::nan("")};
  } else if (out.reached_target > 0) {
    notes.push_back(name + " reached the target in " + std::to_string(out.reached_target) + " of " +
                    std::to_string(out.seeds) + " seeds; shown as not reached");
  }
  return out;
}

}  // namespace

bool SeedStats::withinNoise() const {
  return p_vs_baseline && *p_vs_baseline >= kNoiseAlpha;
}

void testAgainstBaseline(SeedStats& row, const SeedStats& baseline) {
  row.p_vs_baseline.reset();
  row.test.reset();
  // Paired when every sample on both sides has a seed, no seed twice, and the two sides' seeds are the same set: the
  // baseline's samples are then reordered to the row's seeds. A seed on one side only (a run that failed before its
  // first record, a seed that missed the target) leaves Welch's test on what each side has.
  std::map<uint64_t, double> base_by_seed;
  bool paired = row.samples.size() >= 2 && row.samples.size() == baseline.samples.size() &&
                row.seeds.size() == row.samples.size() && baseline.seeds.size() == baseline.samples.size();
  for (std::size_t i = 0; paired && i < baseline.samples.size(); ++i)
    paired = baseline.seeds[i] && base_by_seed.emplace(*baseline.seeds[i], baseline.samples[i]).second;
  std::vector<double> base_aligned;
  std::set<uint64_t> row_seeds;
  for (std::size_t i = 0; paired && i < row.samples.size(); ++i) {
    const auto it = row.seeds[i] ? base_by_seed.find(*row.seeds[i]) : base_by_seed.end();
    paired = it != base_by_seed.end() && row_seeds.insert(*row.seeds[i]).second;
    if (paired) base_aligned.push_back(it->second);
  }
  if (paired) {
    row.p_vs_baseline = pairedP(row.samples, base_aligned);
    row.test = NoiseTest::kPaired;
    return;
  }
  row.p_vs_baseline = welchP(row.samples, baseline.samples);
  if (row.p_vs_baseline) row.test = NoiseTest::kWelch;
}

Comparison compare(const std::vector<RunData>& runs, const CompareOptions& options,
                   std::vector<std::string>& warnings) {
  Comparison c;
  c.target = options.target;
  // (study, grid point) -> rows: the runs of one row, keyed by the folder that holds them (a repeat's variant folder,
  // else the run folder itself: two folders of one name given on the command line stay two rows), in the order first
  // met. A study's grid points are tables of their own, in the natural order of their values.
  using Point = std::vector<std::pair<std::string, std::string>>;
  struct Key {
    std::string study;
    Point point;
    bool operator<(const Key& o) const {
      if (study != o.study) return study < o.study;
      return std::lexicographical_compare(point.begin(), point.end(), o.point.begin(), o.point.end(),
                                          [](const auto& a, const auto& b) {
                                            if (a.first != b.first) return a.first < b.first;
                                            return valueLess(a.second, b.second);
                                          });
    }
  };
  std::map<Key, std::vector<std::pair<std::filesystem::path, std::vector<const RunData*>>>> by_study;
  for (const auto& r : runs) {
    auto& variants = by_study[Key{r.study, r.grid}];
    const std::filesystem::path key = r.repeat_seed ? r.dir.parent_path() : r.dir;
    auto it = std::find_if(variants.begin(), variants.end(), [&](const auto& v) { return v.first == key; });
    if (it == variants.end())
      variants.push_back({key, {&r}});
    else
      it->second.push_back(&r);
  }
  bool baseline_found = false;
  for (const auto& [study_point, variants] : by_study) {
    StudyTable t;
    t.study = study_point.study;
    t.grid = study_point.point;
    // Each variant's first run stands for it where the baseline is chosen: its seeds share the config.
    std::vector<const RunData*> members;
    for (const auto& v : variants) members.push_back(v.second.front());
    const RunData* base = nullptr;
    if (options.baseline) {
      for (const RunData* r : members)
        if (rowName(*r) == *options.baseline) base = r;
      // A name that runs from several results folders share is labelled by folder (reader.h), so the bare name names
      // several rows: the note lists the names to pass.
      std::vector<const RunData*> bare;
      for (const RunData* r : members)
        if (bareName(*r) == *options.baseline && rowName(*r) != bareName(*r)) bare.push_back(r);
      if (base == nullptr && !bare.empty()) {
        std::string names;
        for (const RunData* r : bare) names += (names.empty() ? "`" : ", `") + rowName(*r) + "`";
        t.notes.push_back("`" + *options.baseline + "` (--baseline) names several rows here, " + names +
                          ", from several results folders: pass one of those names");
      }
      if (base != nullptr) {
        t.baseline_source = "--baseline";
        baseline_found = true;
        if (!isDense(*base))
          t.notes.push_back("baseline `" + rowName(*base) + "` (--baseline) uses compressor '" + base->compressor +
                            "', not none");
      } else {
        t.baseline_source = "none";
        if (bare.empty())
          t.notes.push_back("no variant named `" + *options.baseline + "` (--baseline) in this study; no ratios");
      }
    } else {
      std::vector<const RunData*> dense;
      for (const RunData* r : members)
        if (isDense(*r)) dense.push_back(r);
      // A plain dense run is the baseline; error feedback on "none" is a no-op residual but still not the reference,
      // and in a sync-versus-async study the dense sync run is what the others are measured against.
      std::stable_sort(dense.begin(), dense.end(), [](const RunData* a, const RunData* b) {
        auto key = [](const RunData* r) {
          return std::tuple(r->error_feedback || r->momentum_correction > 0, r->async_mode, r->state != kStateCompleted,
                            rowName(*r));
        };
        return key(a) < key(b);
      });
      if (!dense.empty()) {
        base = dense.front();
        t.baseline_source = "auto";
        if (dense.size() > 1) {
          std::string names;
          for (const RunData* r : dense) names += (names.empty() ? "`" : ", `") + rowName(*r) + "`";
          t.notes.push_back("several variants use compressor none (" + names + "); the baseline is `" + rowName(*base) +
                            "` (choose another with --baseline)");
        }
      } else {
        t.baseline_source = "none";
        t.notes.push_back("no variant uses compressor none; no compression ratios (name one with --baseline)");
      }
    }
    if (base != nullptr) t.baseline = rowName(*base);

    std::string recounted;
    for (const auto& v : variants)
      if (std::any_of(v.second.begin(), v.second.end(), [](const RunData* r) { return r->pulls_recounted; }))
        recounted += (recounted.empty() ? "`" : ", `") + rowName(*v.second.front()) + "`";
    if (!recounted.empty())
      t.notes.push_back(recounted +
                        ": recorded when a parameter server's wire_bytes_per_worker counted the workers' pushes alone; "
                        "their wire bytes here add what the workers received (the pulls, worker<w>_bytes_in), as "
                        "records now count them (their payload bytes stay the pushes' alone)");

    std::optional<double> base_per_step;
    for (const auto& [variant, seeds] : variants) {
      CompareRow row = combineSeeds(seeds, options.target, t.notes);
      row.baseline = seeds.front() == base;
      if (row.baseline) base_per_step = row.wire_bytes_per_step;
      t.rows.push_back(std::move(row));
    }
    if (base != nullptr && (!base_per_step || *base_per_step <= 0))
      t.notes.push_back("the baseline `" + rowName(*base) + "` has no wire bytes per step; no ratios");
    const auto base_row = std::find_if(t.rows.begin(), t.rows.end(), [](const CompareRow& r) { return r.baseline; });
    for (auto& row : t.rows) {
      if (base_per_step && *base_per_step > 0 && row.wire_bytes_per_step && *row.wire_bytes_per_step > 0)
        row.ratio = *base_per_step / *row.wire_bytes_per_step;
      if (base_row == t.rows.end() || row.baseline) continue;
      testAgainstBaseline(row.final_stats, base_row->final_stats);
      testAgainstBaseline(row.best_stats, base_row->best_stats);
      testAgainstBaseline(row.wire_stats, base_row->wire_stats);
      testAgainstBaseline(row.bytes_to_target_stats, base_row->bytes_to_target_stats);
      testAgainstBaseline(row.s_to_target_stats, base_row->s_to_target_stats);
    }
    std::stable_sort(t.rows.begin(), t.rows.end(), rowBefore);
    c.studies.push_back(std::move(t));
  }
  if (options.baseline && !baseline_found && !runs.empty())
    warnings.push_back("--baseline " + *options.baseline + ": no study has a variant of that name");
  return c;
}

std::string rowName(const RunData& run) {
  if (run.grid_variant.empty()) return run.variant;
  return run.grid_variant + run.variant.substr(std::min(run.variant.size(), run.bare_variant.size()));
}

std::string bareName(const RunData& run) {
  return run.grid_variant.empty() ? run.bare_variant : run.grid_variant;
}

std::string gridTitle(const StudyTable& table) {
  std::string out;
  for (const auto& [path, value] : table.grid) out += (out.empty() ? "" : ", ") + path + "=" + value;
  return out;
}

std::vector<std::string> configMismatchWarnings(const std::vector<RunData>& runs) {
  std::vector<std::string> out;
  for (const std::string name : {"workload", "data"}) {
    // Group runs by the section's canonical text; one group = all agree.
    std::vector<std::pair<std::vector<std::string>, std::vector<const RunData*>>> groups;
    for (const auto& r : runs) {
      if (!r.has_config) continue;
      std::vector<std::string> flat;
      section(r, name, flat);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == flat; });
      if (it == groups.end())
        groups.push_back({flat, {&r}});
      else
        it->second.push_back(&r);
    }
    if (groups.size() < 2) continue;
    // The largest group is the reference: the odd ones out are then listed with what makes them odd.
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    std::ostringstream msg;
    msg << "the compared runs come from different " << (name == "data" ? "data" : "workloads") << " (" << name
        << " sections of config.textproto differ):";
    const std::set<std::string> first(groups[0].first.begin(), groups[0].first.end());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::string members;
      for (std::size_t i = 0; i < groups[g].second.size(); ++i) {
        if (i == 3) {
          members += " and " + std::to_string(groups[g].second.size() - 3) + " more";
          break;
        }
        members += (i ? ", " : "") + groups[g].second[i]->study + "/" + groups[g].second[i]->variant;
      }
      // For each group, the fields that differ from the first group's (all of the first's for the first).
      std::vector<std::string> diff;
      if (g == 0) {
        diff = groups[0].first;
      } else {
        const std::set<std::string> mine(groups[g].first.begin(), groups[g].first.end());
        for (const auto& f : groups[g].first)
          if (!first.count(f)) diff.push_back(f);
        for (const auto& f : groups[0].first)
          if (!mine.count(f)) diff.push_back("no " + f);
      }
      msg << "\n    " << members << ": " << (diff.empty() ? "(empty)" : joinLines(diff, " "));
    }
    out.push_back(msg.str());
  }
  return out;
}

namespace {

// A warning about runs of one study that should agree on a value (a plugin file's hash, the CPU) and do not: the
// opening, then each value as `show` writes it, followed by the runs that had it ("variant (dir)").
template <typename Show>
std::string runsByValue(const std::string& opening, const std::map<std::string, std::vector<const RunData*>>& by_value,
                        Show show) {
  std::ostringstream msg;
  msg << opening;
  for (const auto& [value, which] : by_value) {
    msg << "\n  " << show(value) << ":";
    for (const RunData* r : which) msg << ' ' << r->variant << " (" << r->dir.string() << ")";
  }
  return msg.str();
}

}  // namespace

std::vector<std::string> pluginHashWarnings(const std::vector<RunData>& runs) {
  // (study, kind, name) -> hash -> the runs that loaded that file, in the order given.
  std::map<std::tuple<std::string, std::string, std::string>, std::map<std::string, std::vector<const RunData*>>> seen;
  for (const auto& r : runs) {
    if (!r.provenance) continue;
    const Json* plugins = findMember(*r.provenance, "plugins");
    if (plugins == nullptr || !plugins->is_array()) continue;
    for (const auto& pl : *plugins) {
      const auto hash = getString(pl, "sha256");
      if (!hash || hash->empty()) continue;
      seen[{r.study, getString(pl, "kind").value_or(""), getString(pl, "name").value_or("")}][*hash].push_back(&r);
    }
  }
  std::vector<std::string> out;
  for (const auto& [key, by_hash] : seen) {
    if (by_hash.size() < 2) continue;
    const auto& [study, kind, name] = key;
    out.push_back(runsByValue("study " + study + ": " + kind + " " + name + " was loaded from " +
                                  std::to_string(by_hash.size()) +
                                  " different files (SHA-256), so these runs did not run the same plugin code:",
                              by_hash, detail::shortHash));
  }
  return out;
}

std::vector<std::string> cpuWarnings(const std::vector<RunData>& runs) {
  // study -> cpu -> the runs measured on it, in the order given.
  std::map<std::string, std::map<std::string, std::vector<const RunData*>>> seen;
  for (const auto& r : runs) {
    if (!r.provenance) continue;
    const std::string cpu = getString(*r.provenance, "cpu").value_or("");
    if (cpu.empty()) continue;
    // The FLOP model's times follow from the config alone (DESIGN.md section 9), whatever ran them.
    if (const Json* sim = findMember(*r.provenance, "simulation"); sim != nullptr && sim->is_object()) {
      if (getString(*sim, "compute").value_or("").starts_with("FLOP model")) continue;
    }
    seen[r.study][cpu].push_back(&r);
  }
  std::vector<std::string> out;
  for (const auto& [study, by_cpu] : seen) {
    if (by_cpu.size() < 2) continue;
    out.push_back(runsByValue("study " + study + ": computation was measured on " + std::to_string(by_cpu.size()) +
                                  " different CPUs, so the time columns compare machines as well as variants:",
                              by_cpu, [](const std::string& cpu) { return cpu; }));
  }
  return out;
}

std::vector<std::string> calibrationWarnings(const std::vector<RunData>& runs) {
  // study -> kernel -> the first time seen and its run; tables of different variants hold different kernels (each
  // its own codec's), so only a kernel two tables share can disagree.
  std::map<std::string, std::map<std::string, std::pair<double, const RunData*>>> first;
  struct Differs {
    std::string kernel;
    double a = 0, b = 0;
    const RunData* ra = nullptr;
    const RunData* rb = nullptr;
    std::set<std::string> kernels;
  };
  std::map<std::string, Differs> differs;
  for (const auto& r : runs) {
    for (const auto& [kernel, seconds] : r.calibration) {
      const auto [it, fresh] = first[r.study].emplace(kernel, std::pair{seconds, &r});
      if (fresh || it->second.first == seconds) continue;
      Differs& d = differs[r.study];
      if (d.kernels.empty()) d = {kernel, it->second.first, seconds, it->second.second, &r, {}};
      d.kernels.insert(kernel);
    }
  }
  std::vector<std::string> out;
  for (const auto& [study, d] : differs) {
    std::ostringstream msg;
    msg << "study " << study << ": its simulated runs were charged from different calibration tables, so their times "
        << "differ by the measurement too (a few percent): kernel '" << d.kernel << "' costs " << d.a << " s in "
        << d.ra->variant << " and " << d.b << " s in " << d.rb->variant;
    if (d.kernels.size() > 1) msg << " (" << d.kernels.size() << " kernels differ)";
    msg << "; run them with one table (simulation.calibration: " << (d.ra->dir / "calibration.json").string()
        << ") to compare like with like";
    out.push_back(msg.str());
  }
  return out;
}

std::vector<std::string> gemmWarnings(const std::vector<RunData>& runs) {
  // study -> kernel -> its runs, in the order given.
  std::map<std::string, std::map<std::string, std::vector<const RunData*>>> seen;
  for (const auto& r : runs) {
    if (!r.provenance) continue;
    const std::string gemm = getString(*r.provenance, "gemm").value_or("");
    if (!gemm.empty()) seen[r.study][gemm].push_back(&r);
  }
  std::vector<std::string> out;
  for (const auto& [study, by_gemm] : seen) {
    if (by_gemm.size() < 2) continue;
    out.push_back(runsByValue("study " + study + ": the models' matrix products came from " +
                                  std::to_string(by_gemm.size()) +
                                  " different GEMM kernels, whose sums round differently, so accuracies and losses "
                                  "differ in their last digits for that reason alone:",
                              by_gemm, [](const std::string& gemm) { return gemm; }));
  }
  return out;
}

}  // namespace terse::results

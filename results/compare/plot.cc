#include "results/compare/plot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/common/error.h"
#include "results/compare/stats.h"
#include "results/compare/text.h"
#include "results/result_writer.h"
#include "results/sha256.h"

namespace terse::results {
namespace {

namespace fs = std::filesystem;
using detail::fullPrecision;

// gnuplot single-quoted strings have no escapes except '' for a quote; a newline would end the command.
std::string gpQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else if (c == '\n' || c == '\r')
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}

// Text from a results folder (study and variant names, grid values: untrusted) in a comment of a script or data file:
// one line, so that nothing of it becomes a command (gnuplot runs the script) or a data line, and no backslash, which
// would continue the comment onto the next line.
std::string gpComment(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\n' || c == '\r' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  return out;
}

// Runs `gnuplot script` with `dir` as the working directory, its output into `log`. Returns the exit status, or -1
// with errno's text in `why` when it could not be started.
int runGnuplot(const fs::path& gnuplot, const fs::path& dir, const std::string& script, const fs::path& log,
               std::string& why) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    why = std::string("fork: ") + std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    // The child only calls async-signal-safe functions before exec.
    if (::chdir(dir.c_str()) != 0) ::_exit(126);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execl(gnuplot.c_str(), "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      why = std::string("waitpid: ") + std::strerror(errno);
      return -1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  why = "killed by signal " + std::to_string(WTERMSIG(status));
  return -1;
}

std::string tail(const fs::path& file, std::size_t n) {
  std::ifstream in(file);
  std::ostringstream s;
  s << in.rdbuf();
  std::string t = s.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t.size() > n ? "..." + t.substr(t.size() - n) : t;
}

void writeText(const fs::path& path, const std::string& text, std::vector<fs::path>& written) {
  writeFileAtomic(path, text);
  written.push_back(path);
}

bool endsEpoch(const EvalPoint& p) {
  return p.epoch_progress > 0 && std::fabs(p.epoch_progress - std::round(p.epoch_progress)) < 1e-9;
}

// Lines that are not the baseline cycle through these (gnuplot's default colours without its black, which the baseline
// keeps for itself); each further eight are dashed, then dotted.
constexpr std::array<const char*, 8> kPalette = {"#9400d3", "#009e73", "#56b4e9", "#e69f00",
                                                 "#0072b2", "#e51e10", "#a0522d", "#f0e442"};

}  // namespace

std::vector<EvalPoint> plotPoints(const std::vector<EvalPoint>& points) {
  if (points.size() < 2) return points;
  std::vector<int64_t> gaps;
  for (std::size_t i = 1; i < points.size(); ++i) gaps.push_back(points[i].step - points[i - 1].step);
  std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
  const double near = static_cast<double>(gaps[gaps.size() / 2]) / 4;
  std::vector<EvalPoint> out;
  for (const EvalPoint& p : points) {
    if (!out.empty() && static_cast<double>(p.step - out.back().step) < near) {
      if (endsEpoch(p) && !endsEpoch(out.back())) out.back() = p;
      continue;
    }
    out.push_back(p);
  }
  return out;
}

std::vector<BandPoint> meanLine(const std::vector<const RunData*>& seeds) {
  std::vector<std::vector<EvalPoint>> lines;
  for (const RunData* r : seeds) lines.push_back(plotPoints(r->points));
  std::vector<BandPoint> out;
  if (lines.empty()) return out;
  for (std::size_t i = 0;; ++i) {
    std::vector<double> acc;
    BandPoint b;
    b.mean = lines.front().size() > i ? lines.front()[i] : EvalPoint{};
    double wire = 0, wall = 0;
    bool aligned = true;
    for (const auto& line : lines) {
      if (line.size() <= i || line[i].step != b.mean.step) {
        aligned = false;
        break;
      }
      acc.push_back(line[i].accuracy);
      wire += line[i].wire_bytes;
      wall += line[i].wall_s;
    }
    if (!aligned) break;
    const MeanInterval m = meanInterval(acc);
    const auto n = static_cast<double>(lines.size());
    b.mean.accuracy = m.mean;
    b.mean.wire_bytes = wire / n;
    b.mean.wall_s = wall / n;
    b.lo = m.mean - m.half_width.value_or(0);
    b.hi = m.mean + m.half_width.value_or(0);
    out.push_back(b);
  }
  return out;
}

AccuracyRange accuracyRange(const std::vector<std::vector<EvalPoint>>& lines) {
  double lowest = INFINITY, highest = -INFINITY, weakest_best = INFINITY;
  for (const auto& line : lines) {
    double best = -INFINITY;
    for (const EvalPoint& p : line) {
      if (!std::isfinite(p.accuracy)) continue;
      lowest = std::min(lowest, p.accuracy);
      highest = std::max(highest, p.accuracy);
      best = std::max(best, p.accuracy);
    }
    if (std::isfinite(best)) weakest_best = std::min(weakest_best, best);
  }
  if (!std::isfinite(highest)) return {};
  double lo = std::max(lowest, weakest_best - 0.25), hi = highest;
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  if (hi - lo < 0.05) {
    const double mid = (hi + lo) / 2;
    lo = mid - 0.025;
    hi = mid + 0.025;
  }
  return {std::max(lo, 0.0), std::min(hi, 1.0)};
}

std::optional<fs::path> findExecutable(std::string_view name, std::string_view search_path) {
  std::size_t start = 0;
  for (;;) {
    const auto colon = search_path.find(':', start);
    const std::string_view entry =
        search_path.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
    const fs::path candidate = fs::path(entry.empty() ? "." : std::string(entry)) / std::string(name);
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    start = colon + 1;
  }
}

std::string safeFileStem(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "study" + out;
  return out;
}

namespace {

// A grid study's points side by side, as lines (format_markdown.cc's pivots drawn): along the first axis (its values in
// the tables' order), one line per variant and value of the other axes, with the speedup in time to the target over
// each point's baseline, the final accuracy and the wire ratio. Writes <stem>.dat and <stem>.gp; returns the kinds of
// plot the script draws (stem + kind + ".png"/".svg"), none when no table of the study has a row to draw.
std::vector<std::string> writeAcrossGrid(const Comparison& c, const std::vector<const StudyTable*>& tables,
                                         const std::string& stem, const fs::path& out, std::vector<fs::path>& written) {
  std::vector<std::string> xs;  // the first axis's values
  struct Line {
    std::string variant, others;  // the row's variant and the other axes' values
    bool baseline = false;
    std::map<std::size_t, double> speedup, accuracy, ratio;  // by x
    std::string title() const { return variant + (others.empty() ? "" : " (" + others + ")"); }
  };
  std::vector<Line> lines;
  std::vector<std::string> variants, combos;  // in order of appearance: a colour each, a dash type each
  const auto lineOf = [&](const std::string& variant, const std::string& others, bool baseline) -> Line& {
    if (std::find(variants.begin(), variants.end(), variant) == variants.end()) variants.push_back(variant);
    if (std::find(combos.begin(), combos.end(), others) == combos.end()) combos.push_back(others);
    for (auto& l : lines)
      if (l.variant == variant && l.others == others) return l;
    lines.push_back(Line{variant, others, baseline, {}, {}, {}});
    return lines.back();
  };
  for (const StudyTable* t : tables) {
    const std::string& value = t->grid.front().second;
    auto it = std::find(xs.begin(), xs.end(), value);
    const auto x = static_cast<std::size_t>(it - xs.begin());
    if (it == xs.end()) xs.push_back(value);
    std::string others;
    for (std::size_t a = 1; a < t->grid.size(); ++a)
      others += (others.empty() ? "" : ", ") + t->grid[a].first.substr(t->grid[a].first.rfind('.') + 1) + "=" +
                t->grid[a].second;
    const CompareRow* base = nullptr;
    for (const auto& r : t->rows)
      if (r.variant == t->baseline) base = &r;
    for (const auto& r : t->rows) {
      if (r.records == 0) continue;
      Line& l = lineOf(r.variant, others, r.baseline);
      if (base != nullptr && base->to_target && r.to_target && std::isfinite(base->to_target->wall_s) &&
          std::isfinite(r.to_target->wall_s) && r.to_target->wall_s > 0)
        l.speedup[x] = base->to_target->wall_s / r.to_target->wall_s;
      if (r.final_accuracy) l.accuracy[x] = *r.final_accuracy;
      if (r.ratio) l.ratio[x] = *r.ratio;
    }
  }
  if (lines.empty()) return {};
  std::ostringstream dat;
  dat << "# terse compare: study " << gpComment(tables.front()->study) << " across its grid, along "
      << gpComment(tables.front()->grid.front().first) << "; one block per line (gnuplot index 0, 1, ...)\n"
      << "# columns: x (the axis value's position) speedup_in_time_to_target final_accuracy wire_ratio (NaN: none)\n";
  bool any_speedup = false, any_ratio = false;
  const auto cell = [](const std::map<std::size_t, double>& m, std::size_t x) {
    const auto it = m.find(x);
    return it == m.end() ? std::string("NaN") : fullPrecision(it->second);
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    any_speedup = any_speedup || !l.speedup.empty();
    any_ratio = any_ratio || !l.ratio.empty();
    if (i > 0) dat << "\n\n";
    dat << "# line " << gpComment(l.title()) << '\n';
    for (std::size_t x = 0; x < xs.size(); ++x)
      dat << x << ' ' << cell(l.speedup, x) << ' ' << cell(l.accuracy, x) << ' ' << cell(l.ratio, x) << '\n';
  }
  writeText(out / (stem + ".dat"), dat.str(), written);

  std::vector<std::string> kinds;
  const std::string axis = tables.front()->grid.front().first;
  std::ostringstream gp;
  gp << "# Written by `terse compare --out`: study " << gpComment(tables.front()->study) << " across its grid, along "
     << gpComment(axis) << ":\n# one line per variant (and value of the other axes). Data: " << stem
     << ".dat. Edit freely and rerun `gnuplot " << stem << ".gp` in this folder.\n"
     << "stem = " << gpQuote(stem) << "\n"
     << "data = stem . '.dat'\n"
     << "array names[" << lines.size() << "]\narray colors[" << lines.size() << "]\narray widths[" << lines.size()
     << "]\narray dashes[" << lines.size() << "]\n";
  // A colour per variant (the baseline black and thick), a dash type per value of the other axes: a variant's lines
  // read as one family, the other axes' values as one pattern across the families.
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    std::size_t colour = 0;
    for (const auto& v : variants) {
      if (v == l.variant) break;
      bool base = false;
      for (const auto& m : lines) base = base || (m.variant == v && m.baseline);
      if (!base) ++colour;
    }
    const auto combo = static_cast<std::size_t>(std::find(combos.begin(), combos.end(), l.others) - combos.begin());
    gp << "names[" << i + 1 << "] = " << gpQuote(l.title() + (l.baseline ? " (baseline)" : "")) << "; colors[" << i + 1
       << "] = " << gpQuote(l.baseline ? "black" : kPalette[colour % kPalette.size()]) << "; widths[" << i + 1
       << "] = " << (l.baseline ? "3" : "1.5") << "; dashes[" << i + 1 << "] = " << combo % 5 + 1 << '\n';
  }
  gp << "set xtics (";
  for (std::size_t x = 0; x < xs.size(); ++x) gp << (x ? ", " : "") << gpQuote(xs[x]) << ' ' << x;
  gp << ") noenhanced\n"
     << "set xrange [-0.5:" << static_cast<double>(xs.size()) - 0.5 << "]\n"
     << "set xlabel " << gpQuote(axis) << " noenhanced\n"
     << "set key outside right top noenhanced\n"
     << "set grid\n"
     << "set style data linespoints\n"
     << "png_term = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'\n"
     << "do for [fmt in 'png svg'] {\n"
     << "  if (fmt eq 'png') { eval('set terminal ' . png_term . ' size 1200,700 noenhanced') } "
        "else { set terminal svg size 1200,700 noenhanced dynamic }\n";
  const auto plot = [&](const std::string& kind, int column, const std::string& ylabel) {
    kinds.push_back(kind);
    gp << "  set output stem . " << gpQuote(kind + ".") << " . fmt\n"
       << "  set title " << gpQuote("study " + tables.front()->study + ": " + ylabel) << " noenhanced\n"
       << "  set ylabel " << gpQuote(ylabel) << " noenhanced\n"
       << "  plot for [i=1:|names|] data index (i-1) using 1:" << column
       << " lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) + 1 ps 1 title names[i]\n";
  };
  if (any_speedup)
    plot("_speedup", 2, "speedup in time to " + fullPrecision(c.target) + " over the point's baseline (x)");
  plot("_final_accuracy", 3, "final test accuracy");
  if (any_ratio) plot("_wire_ratio", 4, "the baseline's wire bytes per step / the variant's (x)");
  gp << "}\nunset output\n";
  writeText(out / (stem + ".gp"), gp.str(), written);
  return kinds;
}

}  // namespace

PlotOutcome writePlots(const Comparison& c, const std::vector<RunData>& runs, const fs::path& out,
                       std::string_view search_path) {
  PlotOutcome outcome;
  std::error_code ec;
  fs::create_directories(out, ec);
  TERSE_CHECK(!ec, InvalidArgument, "cannot create " << out.string() << ": " << ec.message());
  std::map<fs::path, const RunData*> by_dir;
  for (const auto& r : runs) by_dir[r.dir] = &r;
  // A row's runs (one per seed) that have records.
  auto seedsOf = [&](const CompareRow& row) {
    std::vector<const RunData*> found;
    for (const auto& d : row.run_dirs) {
      const auto it = by_dir.find(d);
      if (it != by_dir.end() && !it->second->points.empty()) found.push_back(it->second);
    }
    return found;
  };

  std::vector<std::string> scripts;
  std::map<std::string, std::vector<std::string>> kinds;  // per script: the plots it draws, stem + kind + ".png/.svg"
  std::set<std::string> stems;  // each table's files apart, whatever its study's and point's names make of them
  for (const auto& t : c.studies) {
    // A grid point's table gets its own files: the study's name and the point's, as its runs' folders spell it. The
    // point comes from the runs' config.textproto, untrusted: a name too long for a file is cut and told apart by a
    // hash of the whole, and a name another table's files already have gets a number.
    std::string name = t.study;
    for (const auto& [path, value] : t.grid) name += "." + path.substr(path.rfind('.') + 1) + "-" + value;
    std::string stem = safeFileStem(name);
    if (stem.size() > 160) stem = stem.substr(0, 140) + "-" + sha256Hex(name).substr(0, 16);
    for (int k = 2; !stems.insert(stem).second; ++k) stem = safeFileStem(name).substr(0, 140) + "-" + std::to_string(k);
    std::ostringstream dat;
    std::vector<std::string> titles;
    dat << "# terse compare: study " << gpComment(t.study) << (t.grid.empty() ? "" : " at " + gpComment(gridTitle(t)))
        << ", one block per variant (gnuplot index 0, 1, ...) in table order\n"
        << "# columns: wire_bytes_per_worker wall_s test_accuracy step accuracy_lo accuracy_hi: means over the "
           "variant's seeds and the 95% t-interval of the accuracy (lo = hi for one seed)\n";
    // Simulated seconds are the modeled cluster's: the time axis says so when every line has them, the lines do when
    // only some have (DESIGN.md section 9).
    int simulated = 0, drawable = 0;
    for (const auto& row : t.rows) {
      if (seedsOf(row).empty()) continue;
      ++drawable;
      simulated += row.simulated ? 1 : 0;
    }
    const bool all_simulated = simulated > 0 && simulated == drawable;
    std::vector<std::vector<EvalPoint>> lines;
    std::vector<std::string> colors, widths, dashes;
    std::size_t others = 0;  // lines drawn so far that are not the baseline
    for (const auto& row : t.rows) {
      const std::vector<const RunData*> seeds = seedsOf(row);
      // Variants without records have no line to draw; an empty block would make gnuplot stop with an error.
      if (seeds.empty()) continue;
      const std::vector<BandPoint> band = meanLine(seeds);
      if (band.empty()) continue;
      if (!titles.empty()) dat << "\n\n";
      dat << "# variant " << gpComment(row.variant)
          << (seeds.size() > 1 ? ", mean of " + std::to_string(seeds.size()) + " seeds" : "") << '\n';
      lines.emplace_back();
      for (const auto& b : band) {
        const EvalPoint& p = b.mean;
        lines.back().push_back(p);
        dat << fullPrecision(p.wire_bytes) << ' ' << (std::isnan(p.wall_s) ? "NaN" : fullPrecision(p.wall_s)) << ' '
            << fullPrecision(p.accuracy) << ' ' << p.step << ' ' << fullPrecision(b.lo) << ' ' << fullPrecision(b.hi)
            << '\n';
      }
      std::string title = row.variant;
      if (seeds.size() > 1) title += " (mean of " + std::to_string(seeds.size()) + " seeds)";
      if (row.simulated && !all_simulated) title += " (simulated time)";
      if (row.baseline) title += " (baseline)";
      if (row.state == kStateFailed) title += " (failed)";
      if (row.state == kStateRunning) title += " (incomplete)";
      titles.push_back(title);
      // The baseline is the line every other is read against: black and thick.
      colors.push_back(row.baseline ? "black" : kPalette[others % kPalette.size()]);
      widths.push_back(row.baseline ? "3" : "1.5");
      dashes.push_back(row.baseline ? "1" : std::to_string(others / kPalette.size() % 3 + 1));
      if (!row.baseline) ++others;
    }
    if (titles.empty()) continue;
    writeText(out / (stem + ".dat"), dat.str(), outcome.written);

    std::ostringstream gp;
    gp << "# Written by `terse compare --out`: test accuracy against wire bytes per worker (log scale) and against\n"
       << "# wall time for study " << gpComment(t.study) << ", one line per variant. Data: " << stem
       << ".dat (one block per variant,\n"
       << "# columns wire bytes, wall s, accuracy, step). Edit freely and rerun `gnuplot " << stem
       << ".gp` in this folder.\n"
       << "stem = " << gpQuote(stem) << "\n"
       << "data = stem . '.dat'\n"
       << "target = " << fullPrecision(c.target) << "\n"
       << "array names[" << titles.size() << "]\n";
    gp << "array colors[" << titles.size() << "]\narray widths[" << titles.size() << "]\narray dashes[" << titles.size()
       << "]\n";
    for (std::size_t i = 0; i < titles.size(); ++i) {
      gp << "names[" << i + 1 << "] = " << gpQuote(titles[i]) << "; colors[" << i + 1 << "] = " << gpQuote(colors[i])
         << "; widths[" << i + 1 << "] = " << widths[i] << "; dashes[" << i + 1 << "] = " << dashes[i] << '\n';
    }
    const AccuracyRange range = accuracyRange(lines);
    gp << "set key outside right top noenhanced\n"
       << "set grid\n"
       << "set ylabel 'test accuracy'\n"
       << "set style data linespoints\n"
       << "# From the data (plot.h, accuracyRange): points far below the weakest line's best leave the plot\n"
       << "# downwards. `set yrange [*:*]` shows every point.\n"
       << "set yrange [" << fullPrecision(range.lo) << ":" << fullPrecision(range.hi) << "]\n"
       << "if (target >= " << fullPrecision(range.lo) << " && target <= " << fullPrecision(range.hi) << ") {\n"
       << "  set arrow 1 from graph 0, first target to graph 1, first target nohead dashtype 2 lc rgb 'gray40'\n"
       << "  set label 1 sprintf('target %g', target) at graph 0.01, first target offset 0, 0.6 tc rgb 'gray40'\n"
       << "}\n"
       << "# pngcairo draws nicer lines; the plain png terminal (libgd) is the fallback where cairo is missing.\n"
       << "png_term = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'\n"
       << "do for [fmt in 'png svg'] {\n"
       << "  if (fmt eq 'png') { eval('set terminal ' . png_term . ' size 1200,700 noenhanced') } "
          "else { set terminal svg size 1200,700 noenhanced dynamic }\n"
       << "  set output stem . '_acc_vs_bytes.' . fmt\n"
       << "  set title 'study ' . stem . ': test accuracy vs wire bytes per worker' noenhanced\n"
       << "  set logscale x\n"
       << "  set format x '%.0s %cB'\n"
       << "  set xlabel 'wire bytes per worker (log scale)'\n"
       << "  plot for [i=1:|names|] data index (i-1) using 1:5:6 with filledcurves lc rgb colors[i] fs transparent "
          "solid 0.15 noborder notitle, \\\n"
       << "       for [i=1:|names|] data index (i-1) using 1:3 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) "
          "+ 1 ps 0.7 title names[i]\n"
       << "  set output stem . '_acc_vs_time.' . fmt\n"
       << "  set title 'study ' . stem . ': test accuracy vs " << (all_simulated ? "simulated" : "wall")
       << " time' noenhanced\n"
       << "  unset logscale x\n"
       << "  set format x '%g'\n"
       << "  set xlabel '" << (all_simulated ? "simulated time (s)" : "wall time (s)") << "'\n"
       << "  plot for [i=1:|names|] data index (i-1) using 2:5:6 with filledcurves lc rgb colors[i] fs transparent "
          "solid 0.15 noborder notitle, \\\n"
       << "       for [i=1:|names|] data index (i-1) using 2:3 lw widths[i] lc rgb colors[i] dt dashes[i] pt (i % 13) "
          "+ 1 ps 0.7 title names[i]\n"
       << "}\n"
       << "unset output\n";
    writeText(out / (stem + ".gp"), gp.str(), outcome.written);
    scripts.push_back(stem);
    kinds[stem] = {"_acc_vs_bytes", "_acc_vs_time"};
  }
  // Each grid study's points side by side (writeAcrossGrid), after its tables' own plots: one drawing per study and set
  // of axes (a results folder may hold runs of one study made with other axes: their values share no x axis).
  std::vector<std::pair<std::string, std::string>> groups;  // (study, axes), in order of appearance
  std::map<std::pair<std::string, std::string>, std::vector<const StudyTable*>> grid_tables;
  std::map<std::string, int> groups_of;  // per study
  for (const auto& t : c.studies) {
    if (t.grid.empty()) continue;
    std::string axes;
    for (const auto& [path, value] : t.grid) axes += (axes.empty() ? "" : "+") + path;
    const auto key = std::pair{t.study, axes};
    if (!grid_tables.contains(key)) {
      groups.push_back(key);
      ++groups_of[t.study];
    }
    grid_tables[key].push_back(&t);
  }
  for (const auto& key : groups) {
    const std::string base = safeFileStem(key.first).substr(0, 140) + "_across_grid" +
                             (groups_of[key.first] > 1 ? "-" + safeFileStem(key.second).substr(0, 60) : "");
    std::string stem = base;
    for (int k = 2; !stems.insert(stem).second; ++k) stem = base + "-" + std::to_string(k);
    std::vector<std::string> drawn = writeAcrossGrid(c, grid_tables[key], stem, out, outcome.written);
    if (drawn.empty()) continue;
    scripts.push_back(stem);
    kinds[stem] = std::move(drawn);
  }
  if (scripts.empty()) {
    outcome.message = "no variant has records to plot";
    return outcome;
  }

  const auto gnuplot = findExecutable("gnuplot", search_path);
  if (!gnuplot) {
    outcome.message = "gnuplot not found in PATH, so no plots were drawn; the data and scripts are in " + out.string() +
                      " (install gnuplot, e.g. with scripts/bootstrap or apt-get install gnuplot-nox, "
                      "then run `gnuplot <study>.gp` there)";
    return outcome;
  }
  std::string failures;
  for (const auto& stem : scripts) {
    const fs::path log = out / (stem + ".gnuplot.log");
    std::string why;
    const int rc = runGnuplot(*gnuplot, out, stem + ".gp", log, why);
    if (rc != 0) {
      failures += "\n  " + stem +
                  ".gp: " + (rc < 0 ? why : "gnuplot exited with " + std::to_string(rc) + ": " + tail(log, 600));
      continue;
    }
    fs::remove(log, ec);  // a successful run's log holds nothing worth keeping
    for (const std::string& kind : kinds[stem])
      for (const char* ext : {".png", ".svg"}) {
        const fs::path plot = out / (stem + kind + ext);
        if (fs::exists(plot, ec)) outcome.written.push_back(plot);
      }
  }
  if (!failures.empty()) {
    outcome.message = "gnuplot (" + gnuplot->string() + ") failed; tables and data are written:" + failures;
    return outcome;
  }
  outcome.plotted = true;
  return outcome;
}

}  // namespace terse::results

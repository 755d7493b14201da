// `terse compare DIR... [--target A] [--baseline NAME] [--format md|csv|json] [--out DIR] [--no-plots]
//                      [--provenance]`: the comparison tables of DESIGN.md section 7 (results/compare.h) and, with
// --out, the plots (results/compare/plot.h).
//
// Everything wrong inside a results folder is a warning on stderr and the table is still printed (exit 0); the
// command fails (exit 1) only when nothing could be read, --baseline names no variant of the folders, or --out cannot
// be written; a bad option is exit 2.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/common/spelling.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "results/compare.h"
#include "results/result_writer.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

constexpr std::string_view kUsage =
    "usage: terse compare DIR... [--target ACC] [--baseline NAME] [--format md|csv|json] [--out DIR] [--no-plots]\n"
    "       terse compare --provenance DIR... [--format md|csv|json] [--out DIR]\n"
    "\n"
    "Compares result folders: DIR is a variant folder (<root>/<study>/<variant>/), a study folder or a results root.\n"
    "One table per study: final and best test accuracy, wire and payload bytes per worker, the compression ratio\n"
    "against the study's dense baseline (compressor none, or --baseline), bytes and time to reach --target\n"
    "(interpolated between evaluation points), the step time split and, for async runs, staleness. --out DIR writes\n"
    "compare.{md,csv,json} and, per study, accuracy-vs-bytes and accuracy-vs-time plots (PNG, SVG, the gnuplot script\n"
    "and its data). --provenance prints what ran instead: config hash, git commit, plugins with versions and caps,\n"
    "transport, link emulation, host. Problems in a folder are warned about and skipped.";

}  // namespace

int compareCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("target", po::value<double>()->default_value(0.85, "0.85"),
                                                    "test accuracy for the bytes/time-to-target columns")(
      "baseline", po::value<std::string>(), "the baseline variant's name (default: the one with compressor none)")(
      "format", po::value<std::string>()->default_value("md"), "what to print: md, csv or json")(
      "out", po::value<std::string>(), "also write the tables (all three formats) and plots into DIR")(
      "no-plots", "with --out: tables only")("provenance", "print what ran (hashes, commits, plugins, hosts) instead")(
      "dir", po::value<std::vector<std::string>>(), "result folders");
  po::positional_options_description positional;
  positional.add("dir", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n\n" << options;
      return kExitOk;
    }
    if (!vm.count("dir")) throw po::error("give at least one result folder");
    const std::string format = vm["format"].as<std::string>();
    if (format != "md" && format != "csv" && format != "json")
      throw po::error("--format must be md, csv or json, got '" + format + "'");
    const double target = vm["target"].as<double>();
    if (!(target > 0 && target <= 1)) throw po::error("--target must be in (0, 1], got " + std::to_string(target));
    if (vm.count("provenance") && vm.count("baseline")) throw po::error("--baseline does not apply to --provenance");
  } catch (const po::error& e) {
    std::cerr << "terse compare: " << e.what() << "\n\n" << kUsage << "\n\n" << options;
    return kExitUsage;
  }

  std::vector<fs::path> dirs;
  for (const auto& d : vm["dir"].as<std::vector<std::string>>()) dirs.emplace_back(d);
  std::vector<std::string> warnings;
  const std::vector<results::RunData> runs = results::loadRuns(dirs, warnings);
  for (auto& w : results::configMismatchWarnings(runs)) warnings.push_back(std::move(w));
  for (auto& w : results::pluginHashWarnings(runs)) warnings.push_back(std::move(w));
  for (auto& w : results::cpuWarnings(runs)) warnings.push_back(std::move(w));
  for (auto& w : results::gemmWarnings(runs)) warnings.push_back(std::move(w));
  for (auto& w : results::calibrationWarnings(runs)) warnings.push_back(std::move(w));

  if (vm.count("baseline") && !runs.empty()) {
    // A misspelt baseline would give a table without ratios and exit 0 (a script would keep it): refused, with the
    // names it could have been.
    const std::string baseline = vm["baseline"].as<std::string>();
    std::vector<std::string> names;
    for (const auto& r : runs) {
      if (results::rowName(r) == baseline || results::bareName(r) == baseline) {
        names.clear();
        break;
      }
      if (std::find(names.begin(), names.end(), results::rowName(r)) == names.end())
        names.push_back(results::rowName(r));
    }
    if (!names.empty()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      const auto close = closestName(baseline, names);
      std::cerr << "terse compare: --baseline " << baseline << ": no variant of that name in the folders given"
                << (close ? "; did you mean " + *close + "?" : "") << " (variants: " << list << ")\n";
      return kExitFailure;
    }
  }

  const std::string format = vm["format"].as<std::string>();
  const bool provenance = vm.count("provenance") > 0;
  std::string md, csv, json;
  results::Comparison comparison;
  if (!runs.empty()) {
    if (provenance) {
      md = results::provenanceTableMarkdown(runs);
      csv = results::provenanceTableCsv(runs);
    } else {
      results::CompareOptions co;
      co.target = vm["target"].as<double>();
      if (vm.count("baseline")) co.baseline = vm["baseline"].as<std::string>();
      comparison = results::compare(runs, co, warnings);
      md = results::toMarkdown(comparison);
      csv = results::toCsv(comparison);
    }
  }
  // Warnings first, so they are on the terminal above the table they qualify; JSON carries them too.
  for (const auto& w : warnings) std::cerr << "terse compare: warning: " << userMessage(w) << '\n';
  if (runs.empty()) {
    std::cerr << "terse compare: no result folders to compare\n";
    return kExitFailure;
  }
  json = provenance ? results::provenanceTableJson(runs, warnings) : results::toJson(comparison, warnings);
  std::cout << (format == "md" ? md : format == "csv" ? csv : json);

  if (!vm.count("out")) return kExitOk;
  const fs::path out = vm["out"].as<std::string>();
  try {
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw std::runtime_error("cannot create " + out.string() + ": " + ec.message());
    const std::string stem = provenance ? "provenance" : "compare";
    results::writeFileAtomic(out / (stem + ".md"), md);
    results::writeFileAtomic(out / (stem + ".csv"), csv);
    results::writeFileAtomic(out / (stem + ".json"), json);
    std::cerr << "terse compare: wrote " << (out / (stem + ".{md,csv,json}")).string() << '\n';
    if (!provenance && !vm.count("no-plots")) {
      const char* path = std::getenv("PATH");
      const results::PlotOutcome plots = results::writePlots(comparison, runs, out, path != nullptr ? path : "");
      if (plots.plotted)
        std::cerr << "terse compare: plots (png, svg) and their gnuplot scripts in " << out.string() << '\n';
      else
        std::cerr << "terse compare: warning: " << plots.message << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "terse compare: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace terse::cli

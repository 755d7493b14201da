// `terse trace merge DIR_OR_FILE... -o OUT`: combines the per-rank timelines a run writes when its config says
// `trace: true` (results/<study>/<variant>/trace.rank<R>.json, core/train/trace.h) into one Chrome trace file with one
// process per rank (pid = rank), to open in chrome://tracing or ui.perfetto.dev.
//
// The inputs are untrusted text: every line is parsed as a flat JSON object and checked (name, ph, pid, tid, and ts/dur
// for complete events); the first bad line fails the merge with FILE:LINE and the reason. Two inputs that claim one
// rank are an error rather than a silently interleaved timeline.
#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/json.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

constexpr std::string_view kUsage =
    "usage: terse trace merge DIR_OR_FILE... -o OUT.json\n"
    "\n"
    "Merges per-rank Chrome traces (trace.rank<R>.json, written by a run whose config sets `trace: true`) into one\n"
    "file, one process per rank. A directory stands for every trace.rank<R>.json in it.";

class MergeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string at(const fs::path& file, std::size_t line) {
  return file.string() + ":" + std::to_string(line) + ": ";
}

// Events of one file, re-serialized; the rank (pid) they all carry.
struct RankTrace {
  fs::path file;
  int64_t pid = -1;
  std::vector<std::string> events;
};

RankTrace readTrace(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw MergeError(file.string() + ": cannot open");
  RankTrace out;
  out.file = file;
  std::string line;
  std::size_t n = 0;
  bool opened = false, closed = false;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    if (closed) throw MergeError(at(file, n) + "text after the closing ]}");
    if (!opened) {
      if (line != "{\"traceEvents\":[")
        throw MergeError(at(file, n) + "not a terse trace (expected {\"traceEvents\":[)");
      opened = true;
      continue;
    }
    if (line == "]}") {
      closed = true;
      continue;
    }
    if (line.back() == ',') line.pop_back();
    std::string why;
    const auto obj = parseJsonObject(line, &why);
    if (!obj) throw MergeError(at(file, n) + "not a JSON object (" + why + ")");
    const auto name = getString(*obj, "name");
    const auto ph = getString(*obj, "ph");
    const auto pid = getNumber(*obj, "pid");
    const auto tid = getNumber(*obj, "tid");
    if (!name || !ph || !pid || !tid) throw MergeError(at(file, n) + "an event needs name, ph, pid and tid");
    if (*pid < 0 || *pid != static_cast<double>(static_cast<int64_t>(*pid)) || *pid > 1e6)
      throw MergeError(at(file, n) + "pid must be a rank (an integer >= 0), got " + std::to_string(*pid));
    if (out.pid < 0) out.pid = static_cast<int64_t>(*pid);
    if (static_cast<int64_t>(*pid) != out.pid)
      throw MergeError(at(file, n) + "pid " + std::to_string(static_cast<int64_t>(*pid)) + " in a file of rank " +
                       std::to_string(out.pid));
    Json e{{"name", *name}, {"ph", *ph}, {"pid", static_cast<int64_t>(*pid)}, {"tid", static_cast<int64_t>(*tid)}};
    if (*ph == "X") {
      const auto ts = getNumber(*obj, "ts");
      const auto dur = getNumber(*obj, "dur");
      if (!ts || !dur || *dur < 0) throw MergeError(at(file, n) + "a complete event needs ts and dur >= 0");
      e["ts"] = *ts;
      e["dur"] = *dur;
      if (auto cat = getString(*obj, "cat")) e["cat"] = *cat;
    } else if (*ph == "M") {
      const auto value = getString(*obj, "args_name");
      if (!value) throw MergeError(at(file, n) + "a metadata event needs args_name");
      e["args"] = Json{{"name", *value}};
    } else {
      throw MergeError(at(file, n) + "unsupported event phase '" + *ph + "' (terse writes X and M)");
    }
    out.events.push_back(dumpJson(e));
  }
  if (!opened || !closed) throw MergeError(file.string() + ": truncated trace (no closing ]})");
  return out;
}

std::vector<fs::path> expand(const std::vector<std::string>& inputs) {
  static const std::regex kRankFile(R"(trace\.rank[0-9]+\.json)");
  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    const fs::path p(in);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(p)) {
        if (entry.is_regular_file() && std::regex_match(entry.path().filename().string(), kRankFile))
          found.push_back(entry.path());
      }
      if (found.empty()) throw MergeError(p.string() + ": no trace.rank<R>.json files (did the run set trace: true?)");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      throw MergeError(p.string() + ": no such file or directory");
    }
  }
  return files;
}

int merge(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("output,o", po::value<std::string>(), "the merged file")(
      "input", po::value<std::vector<std::string>>(), "trace files or result folders");
  po::positional_options_description positional;
  positional.add("input", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "terse trace merge: " << e.what() << "\n" << kUsage << '\n';
    return kExitUsage;
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n\n" << options;
    return kExitOk;
  }
  if (!vm.count("input") || !vm.count("output")) {
    std::cerr << "terse trace merge: needs at least one input and -o OUT\n" << kUsage << '\n';
    return kExitUsage;
  }
  try {
    std::map<int64_t, RankTrace> ranks;
    for (const auto& file : expand(vm["input"].as<std::vector<std::string>>())) {
      RankTrace t = readTrace(file);
      if (t.pid < 0) continue;  // an empty timeline
      auto [it, inserted] = ranks.emplace(t.pid, std::move(t));
      if (!inserted)
        throw MergeError(file.string() + ": rank " + std::to_string(it->first) + " is also in " +
                         it->second.file.string());
    }
    const fs::path out_path(vm["output"].as<std::string>());
    std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
    if (!out) throw MergeError(out_path.string() + ": cannot write");
    out << "{\"traceEvents\":[\n";
    bool first = true;
    std::size_t events = 0;
    for (const auto& [pid, t] : ranks) {
      for (const auto& e : t.events) {
        out << (first ? "" : ",\n") << e;
        first = false;
        ++events;
      }
    }
    out << "\n],\"displayTimeUnit\":\"ms\"}\n";
    out.close();
    if (!out) throw MergeError(out_path.string() + ": write failed");
    std::cout << "merged " << ranks.size() << " rank(s), " << events << " events into " << out_path.string() << '\n';
    return kExitOk;
  } catch (const MergeError& e) {
    std::cerr << "terse trace merge: " << e.what() << '\n';
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "terse trace merge: " << e.what() << '\n';
    return kExitFailure;
  }
}

}  // namespace

int traceCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage << '\n';
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "merge") return merge(std::vector<std::string>(args.begin() + 1, args.end()));
  std::cerr << "terse trace: unknown subcommand '" << args[0] << "'\n" << kUsage << '\n';
  return kExitUsage;
}

}  // namespace terse::cli

// The step trace's JSON Lines (step_trace.h): the writer, the strict reader and the trainer's recorder.
#include "core/train/step_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/common/error.h"
#include "core/common/json.h"

namespace terse::train {
namespace {

std::string_view computeKindName(TraceCompute::Kind k) {
  return k == TraceCompute::Kind::kForward ? "forward" : "backward";
}

std::string_view phaseKindName(TracePhase::Kind k) {
  switch (k) {
    case TracePhase::Kind::kCompress:
      return "compress";
    case TracePhase::Kind::kCollective:
      return "collective";
    case TracePhase::Kind::kDecompress:
      return "decompress";
  }
  return "?";
}

Json idArray(const std::vector<uint64_t>& v) {
  Json a = Json::array();
  for (uint64_t x : v) a.push_back(x);
  return a;
}

// ---- Reading. One Field names where a value sits, "groups[2].phases[0].bytes", for the error messages.

class LineReader {
 public:
  LineReader(const std::filesystem::path& file, std::size_t line) : file_(file), line_(line) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    TERSE_THROW(InvalidArgument,
                "step trace " << file_.string() << ", line " << line_ << ": field '" << field << "' " << what);
  }

  const Json& member(const Json& object, const std::string& path, std::string_view key) const {
    const std::string field = join(path, key);
    if (!object.is_object()) fail(path.empty() ? std::string(key) : path, "is not an object");
    const auto it = object.find(std::string(key));
    if (it == object.end()) fail(field, "is missing");
    return *it;
  }
  const Json* optionalMember(const Json& object, std::string_view key) const {
    const auto it = object.find(std::string(key));
    return it == object.end() ? nullptr : &*it;
  }

  std::string str(const Json& object, const std::string& path, std::string_view key) const {
    const Json& v = member(object, path, key);
    if (!v.is_string()) fail(join(path, key), "must be a string, got " + dumpJson(v));
    return v.get<std::string>();
  }
  int64_t integer(const Json& v, const std::string& field, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(field, "must be an integer, got " + clip(dumpJson(v)));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + dumpJson(v));
    const auto x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
    return x;
  }
  int64_t integer(const Json& object, const std::string& path, std::string_view key, int64_t lo, int64_t hi) const {
    return integer(member(object, path, key), join(path, key), lo, hi);
  }
  uint64_t count(const Json& v, const std::string& field) const {
    if (!v.is_number_unsigned()) fail(field, "must be an unsigned integer, got " + clip(dumpJson(v)));
    return v.get<uint64_t>();
  }
  uint64_t count(const Json& object, const std::string& path, std::string_view key) const {
    return count(member(object, path, key), join(path, key));
  }
  // Times and durations: finite and >= 0 (strict parseJson already refuses nan and inf spellings; 1e999 is not).
  double seconds(const Json& object, const std::string& path, std::string_view key) const {
    const Json& v = member(object, path, key);
    const std::string field = join(path, key);
    if (!v.is_number()) fail(field, "must be a number of seconds, got " + clip(dumpJson(v)));
    const auto x = v.get<double>();
    if (!std::isfinite(x) || x < 0) fail(field, "must be finite and >= 0, got " + dumpJson(v));
    return x;
  }
  const Json& array(const Json& object, const std::string& path, std::string_view key) const {
    const Json& v = member(object, path, key);
    if (!v.is_array()) fail(join(path, key), "must be an array, got " + clip(dumpJson(v)));
    return v;
  }
  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  static std::string at(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

 private:
  static std::string clip(std::string s) {
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  }
  const std::filesystem::path& file_;
  std::size_t line_;
};

TraceHeader readHeader(const LineReader& r, const Json& o) {
  TraceHeader h;
  h.format = r.str(o, "", "format");
  if (h.format != kStepTraceFormat)
    r.fail("format", "must be \"" + std::string(kStepTraceFormat) + "\", got \"" + h.format + "\"");
  h.version = static_cast<int>(r.integer(o, "", "version", 0, std::numeric_limits<int>::max()));
  if (h.version != kStepTraceVersion)
    r.fail("version", "is " + std::to_string(h.version) + "; this build reads version " +
                          std::to_string(kStepTraceVersion) + " only");
  h.world = static_cast<int>(r.integer(o, "", "world", 1, std::numeric_limits<int>::max()));
  h.rank = static_cast<int>(r.integer(o, "", "rank", 0, h.world - 1));
  h.mode = r.str(o, "", "mode");
  if (h.mode != "sync" && h.mode != "async") r.fail("mode", "must be \"sync\" or \"async\", got \"" + h.mode + "\"");
  h.source = r.str(o, "", "source");
  if (h.source != "terse" && h.source != "pytorch")
    r.fail("source", "must be \"terse\" or \"pytorch\", got \"" + h.source + "\"");
  h.workload = r.str(o, "", "workload");
  h.compressor = r.str(o, "", "compressor");
  h.scheduler = r.str(o, "", "scheduler");
  h.allreduce_algorithm = r.str(o, "", "allreduce_algorithm");
  h.allgather_algorithm = r.str(o, "", "allgather_algorithm");
  h.clock = r.str(o, "", "clock");
  if (h.clock != "simulated" && h.clock != "real_time")
    r.fail("clock", "must be \"simulated\" or \"real_time\", got \"" + h.clock + "\"");
  h.compute_model = r.str(o, "", "compute_model");
  h.batch_size = r.integer(o, "", "batch_size", 0, std::numeric_limits<int64_t>::max());
  if (const Json* start = r.optionalMember(o, "compression_start_step"))
    h.compression_start_step = r.integer(*start, "compression_start_step", 0, std::numeric_limits<int64_t>::max());
  if (const Json* end = r.optionalMember(o, "compressor_phases_end"))
    h.compressor_phases_end = r.integer(*end, "compressor_phases_end", 0, std::numeric_limits<int64_t>::max());
  h.layers = static_cast<int>(r.integer(o, "", "layers", 0, std::numeric_limits<int>::max()));
  const Json& tensors = r.array(o, "", "tensors");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string path = LineReader::at("tensors", i);
    TraceTensor t;
    t.id = r.count(tensors[i], path, "id");
    if (t.id != i)
      r.fail(path + ".id", "must be " + std::to_string(i) + " (tensors by id), got " + std::to_string(t.id));
    t.name = r.str(tensors[i], path, "name");
    t.elements = r.count(tensors[i], path, "elements");
    t.layer = static_cast<int>(r.integer(tensors[i], path, "layer", 0, std::max(h.layers - 1, 0)));
    h.tensors.push_back(std::move(t));
  }
  return h;
}

uint64_t tensorId(const LineReader& r, const TraceHeader& h, const Json& v, const std::string& field) {
  const uint64_t id = r.count(v, field);
  if (id >= h.tensors.size())
    r.fail(field, "names tensor " + std::to_string(id) + ", not in the header (" + std::to_string(h.tensors.size()) +
                      " tensors)");
  return id;
}

TracePhase readPhase(const LineReader& r, const TraceHeader& h, const Json& o, const std::string& path) {
  TracePhase p;
  const std::string kind = r.str(o, path, "kind");
  if (kind == "compress") {
    p.kind = TracePhase::Kind::kCompress;
  } else if (kind == "collective") {
    p.kind = TracePhase::Kind::kCollective;
  } else if (kind == "decompress") {
    p.kind = TracePhase::Kind::kDecompress;
  } else {
    r.fail(path + ".kind", "must be compress, collective or decompress, got \"" + kind + "\"");
  }
  p.start_s = r.seconds(o, path, "start_s");
  p.dur_s = r.seconds(o, path, "dur_s");
  if (p.kind != TracePhase::Kind::kCollective) return p;
  p.op = r.str(o, path, "op");
  if (p.op != "allreduce" && p.op != "allgatherv" && p.op != "allgather_sizes")
    r.fail(path + ".op", "must be allreduce, allgatherv or allgather_sizes, got \"" + p.op + "\"");
  p.algorithm = r.str(o, path, "algorithm");
  if (p.algorithm.empty()) r.fail(path + ".algorithm", "must name the algorithm that ran, got \"\"");
  p.dtype = r.str(o, path, "dtype");
  if (p.dtype != "f32" && p.dtype != "f16" && p.dtype != "bf16" && p.dtype != "u8")
    r.fail(path + ".dtype", "must be f32, f16, bf16 or u8, got \"" + p.dtype + "\"");
  p.bytes = r.count(o, path, "bytes");
  const Json& rank_bytes = r.array(o, path, "rank_bytes");
  for (std::size_t i = 0; i < rank_bytes.size(); ++i)
    p.rank_bytes.push_back(r.count(rank_bytes[i], LineReader::at(path + ".rank_bytes", i)));
  if (p.op == "allgatherv") {
    if (p.rank_bytes.size() != static_cast<std::size_t>(h.world))
      r.fail(path + ".rank_bytes", "has " + std::to_string(p.rank_bytes.size()) +
                                       " entries; an allgatherv needs one "
                                       "per rank (world " +
                                       std::to_string(h.world) + ")");
    if (p.rank_bytes[static_cast<std::size_t>(h.rank)] != p.bytes)
      r.fail(path + ".rank_bytes", "gives rank " + std::to_string(h.rank) + " " +
                                       std::to_string(p.rank_bytes[static_cast<std::size_t>(h.rank)]) +
                                       " bytes, but bytes is " + std::to_string(p.bytes));
  } else if (!p.rank_bytes.empty()) {
    r.fail(path + ".rank_bytes",
           "must be empty for " + p.op + ", got " + std::to_string(p.rank_bytes.size()) + " entries");
  }
  return p;
}

TraceStep readStep(const LineReader& r, const TraceHeader& h, const Json& o) {
  TraceStep s;
  s.step = r.integer(o, "", "step", 0, std::numeric_limits<int64_t>::max());
  s.start_s = r.seconds(o, "", "start_s");
  s.step_s = r.seconds(o, "", "step_s");
  const Json& compute = r.array(o, "", "compute");
  for (std::size_t i = 0; i < compute.size(); ++i) {
    const std::string path = LineReader::at("compute", i);
    TraceCompute c;
    const std::string kind = r.str(compute[i], path, "kind");
    if (kind == "forward") {
      c.kind = TraceCompute::Kind::kForward;
    } else if (kind == "backward") {
      c.kind = TraceCompute::Kind::kBackward;
    } else {
      r.fail(path + ".kind", "must be forward or backward, got \"" + kind + "\"");
    }
    c.layer = static_cast<int>(r.integer(compute[i], path, "layer", 0, std::max(h.layers - 1, 0)));
    c.start_s = r.seconds(compute[i], path, "start_s");
    c.dur_s = r.seconds(compute[i], path, "dur_s");
    if (const Json* ready = r.optionalMember(compute[i], "ready")) {
      if (!ready->is_array()) r.fail(path + ".ready", "must be an array, got " + dumpJson(*ready));
      for (std::size_t k = 0; k < ready->size(); ++k)
        c.ready.push_back(tensorId(r, h, (*ready)[k], LineReader::at(path + ".ready", k)));
      if (c.kind == TraceCompute::Kind::kForward && !c.ready.empty())
        r.fail(path + ".ready", "must be empty for a forward segment");
    }
    s.compute.push_back(std::move(c));
  }
  const Json& groups = r.array(o, "", "groups");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string path = LineReader::at("groups", i);
    TraceGroup g;
    g.seq = r.count(groups[i], path, "seq");
    if (!s.groups.empty() && g.seq <= s.groups.back().seq)
      r.fail(path + ".seq", "is " + std::to_string(g.seq) + ", not after the previous group's " +
                                std::to_string(s.groups.back().seq) + " (groups are in issue order)");
    const Json& chunks = r.array(groups[i], path, "chunks");
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      const std::string cp = LineReader::at(path + ".chunks", k);
      if (!chunks[k].is_array() || chunks[k].size() != 2)
        r.fail(cp, "must be a pair [tensor id, chunk index], got " + dumpJson(chunks[k]));
      const uint64_t t = tensorId(r, h, chunks[k][0], cp + "[0]");
      const auto c = static_cast<int>(r.integer(chunks[k][1], cp + "[1]", 0, std::numeric_limits<int>::max()));
      g.chunks.emplace_back(t, c);
    }
    const Json& elements = r.array(groups[i], path, "chunk_elements");
    for (std::size_t k = 0; k < elements.size(); ++k)
      g.chunk_elements.push_back(r.count(elements[k], LineReader::at(path + ".chunk_elements", k)));
    if (g.chunk_elements.size() != g.chunks.size())
      r.fail(path + ".chunk_elements", "has " + std::to_string(g.chunk_elements.size()) + " entries for " +
                                           std::to_string(g.chunks.size()) + " chunks");
    g.issue_s = r.seconds(groups[i], path, "issue_s");
    const Json& phases = r.array(groups[i], path, "phases");
    for (std::size_t k = 0; k < phases.size(); ++k)
      g.phases.push_back(readPhase(r, h, phases[k], LineReader::at(path + ".phases", k)));
    s.groups.push_back(std::move(g));
  }
  const Json& updates = r.array(o, "", "updates");
  for (std::size_t i = 0; i < updates.size(); ++i) {
    const std::string path = LineReader::at("updates", i);
    TraceUpdate u;
    u.tensor = tensorId(r, h, r.member(updates[i], path, "tensor"), path + ".tensor");
    u.start_s = r.seconds(updates[i], path, "start_s");
    u.dur_s = r.seconds(updates[i], path, "dur_s");
    s.updates.push_back(u);
  }
  const Json& negotiations = r.array(o, "", "negotiations");
  for (std::size_t i = 0; i < negotiations.size(); ++i) {
    const std::string path = LineReader::at("negotiations", i);
    TraceNegotiation n;
    n.start_s = r.seconds(negotiations[i], path, "start_s");
    n.dur_s = r.seconds(negotiations[i], path, "dur_s");
    n.algorithm = r.str(negotiations[i], path, "algorithm");
    if (n.algorithm.empty()) r.fail(path + ".algorithm", "must name the algorithm that ran, got \"\"");
    if (!s.negotiations.empty() && n.start_s < s.negotiations.back().start_s)
      r.fail(path + ".start_s", "is before the previous round's (rounds are in order)");
    s.negotiations.push_back(std::move(n));
  }
  return s;
}

}  // namespace

namespace {
constexpr std::string_view kStepTracePrefix = "steps.rank", kStepTraceSuffix = ".jsonl";
}  // namespace

std::string stepTraceFileName(int rank) {
  return std::string(kStepTracePrefix) + std::to_string(rank) + std::string(kStepTraceSuffix);
}

std::optional<int> stepTraceFileRank(std::string_view name) {
  if (name.size() <= kStepTracePrefix.size() + kStepTraceSuffix.size() || !name.starts_with(kStepTracePrefix) ||
      !name.ends_with(kStepTraceSuffix))
    return std::nullopt;
  const std::string_view digits =
      name.substr(kStepTracePrefix.size(), name.size() - kStepTracePrefix.size() - kStepTraceSuffix.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int rank = 0;
  for (char c : digits) rank = rank * 10 + (c - '0');
  return rank;
}

std::string stepTraceHeaderLine(const TraceHeader& h) {
  Json tensors = Json::array();
  for (const TraceTensor& t : h.tensors)
    tensors.push_back(Json{{"id", t.id}, {"name", t.name}, {"elements", t.elements}, {"layer", t.layer}});
  Json header{{"format", std::string(h.format)},
              {"version", h.version},
              {"rank", h.rank},
              {"world", h.world},
              {"mode", h.mode},
              {"source", h.source},
              {"workload", h.workload},
              {"compressor", h.compressor},
              {"scheduler", h.scheduler},
              {"allreduce_algorithm", h.allreduce_algorithm},
              {"allgather_algorithm", h.allgather_algorithm},
              {"clock", h.clock},
              {"compute_model", h.compute_model},
              {"batch_size", h.batch_size},
              {"layers", h.layers},
              {"tensors", std::move(tensors)}};
  if (h.compression_start_step > 0) header["compression_start_step"] = h.compression_start_step;
  if (h.compressor_phases_end > 0) header["compressor_phases_end"] = h.compressor_phases_end;
  return dumpJson(header);
}

std::string stepTraceStepLine(const TraceStep& s) {
  Json compute = Json::array();
  for (const TraceCompute& c : s.compute) {
    Json e{
        {"kind", std::string(computeKindName(c.kind))}, {"layer", c.layer}, {"start_s", c.start_s}, {"dur_s", c.dur_s}};
    if (c.kind == TraceCompute::Kind::kBackward) e["ready"] = idArray(c.ready);
    compute.push_back(std::move(e));
  }
  Json groups = Json::array();
  for (const TraceGroup& g : s.groups) {
    Json chunks = Json::array();
    for (const auto& [t, c] : g.chunks) chunks.push_back(Json::array({t, c}));
    Json phases = Json::array();
    for (const TracePhase& p : g.phases) {
      Json e{{"kind", std::string(phaseKindName(p.kind))}, {"start_s", p.start_s}, {"dur_s", p.dur_s}};
      if (p.kind == TracePhase::Kind::kCollective) {
        e["op"] = p.op;
        e["algorithm"] = p.algorithm;
        e["dtype"] = p.dtype;
        e["bytes"] = p.bytes;
        e["rank_bytes"] = idArray(p.rank_bytes);
      }
      phases.push_back(std::move(e));
    }
    groups.push_back(Json{{"seq", g.seq},
                          {"chunks", std::move(chunks)},
                          {"chunk_elements", idArray(g.chunk_elements)},
                          {"issue_s", g.issue_s},
                          {"phases", std::move(phases)}});
  }
  Json updates = Json::array();
  for (const TraceUpdate& u : s.updates)
    updates.push_back(Json{{"tensor", u.tensor}, {"start_s", u.start_s}, {"dur_s", u.dur_s}});
  Json negotiations = Json::array();
  for (const TraceNegotiation& n : s.negotiations)
    negotiations.push_back(Json{{"start_s", n.start_s}, {"dur_s", n.dur_s}, {"algorithm", n.algorithm}});
  return dumpJson(Json{{"step", s.step},
                       {"start_s", s.start_s},
                       {"step_s", s.step_s},
                       {"compute", std::move(compute)},
                       {"groups", std::move(groups)},
                       {"updates", std::move(updates)},
                       {"negotiations", std::move(negotiations)}});
}

void writeStepTrace(const std::filesystem::path& path, const StepTrace& trace) {
  std::string text = stepTraceHeaderLine(trace.header) + '\n';
  for (const TraceStep& s : trace.steps) text += stepTraceStepLine(s) + '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  TERSE_CHECK(f.good(), InvalidArgument, "step trace: cannot write " << path);
  f << text;
  f.close();
  TERSE_CHECK(!f.fail(), InvalidArgument, "step trace: writing " << path << " failed");
}

StepTrace readStepTrace(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TERSE_CHECK(f.good(), InvalidArgument, "step trace: cannot read " << path);
  std::ostringstream all;
  all << f.rdbuf();
  const std::string text = all.str();
  TERSE_CHECK(!text.empty(), InvalidArgument, "step trace " << path.string() << ": the file is empty (no header line)");
  StepTrace trace;
  std::size_t pos = 0, line = 0;
  while (pos < text.size()) {
    ++line;
    const std::size_t nl = text.find('\n', pos);
    // Every line the writer writes ends in a newline: a last line without one was cut short.
    TERSE_CHECK(nl != std::string::npos, InvalidArgument,
                "step trace " << path.string() << ", line " << line
                              << ": truncated (the last line has no newline; the file was cut short)");
    const std::string_view body(text.data() + pos, nl - pos);
    pos = nl + 1;
    std::string error;
    const std::optional<Json> o = parseJsonObject(body, &error);
    TERSE_CHECK(o.has_value(), InvalidArgument,
                "step trace " << path.string() << ", line " << line << ": not a JSON object: " << error);
    const LineReader r(path, line);
    if (line == 1) {
      trace.header = readHeader(r, *o);
      continue;
    }
    TraceStep s = readStep(r, trace.header, *o);
    if (!trace.steps.empty() && s.step <= trace.steps.back().step)
      r.fail("step", "is " + std::to_string(s.step) + ", not after the previous line's " +
                         std::to_string(trace.steps.back().step) + " (steps go forward)");
    trace.steps.push_back(std::move(s));
  }
  return trace;
}

// ---- The recorder.

StepTraceRecorder::StepTraceRecorder(TraceHeader header, Clock::time_point origin)
    : header_(std::move(header)), origin_(origin) {}

void StepTraceRecorder::describe(int rank, int world, int64_t batch_size, int layers,
                                 std::vector<TraceTensor> tensors) {
  std::lock_guard lock(mutex_);
  header_.rank = rank;
  header_.world = world;
  header_.batch_size = batch_size;
  header_.layers = layers;
  header_.tensors = std::move(tensors);
}

int StepTraceRecorder::rank() const {
  std::lock_guard lock(mutex_);
  return header_.rank;
}

TraceStep& StepTraceRecorder::stepLocked(int64_t step) {
  TraceStep& s = steps_[step];
  s.step = step;
  return s;
}

double StepTraceRecorder::since(int64_t step, Clock::time_point t) const {
  const auto it = starts_.find(step);
  const Clock::time_point start = it == starts_.end() ? origin_ : it->second;
  // A time before its step's start would be a recording bug; the format promises non-negative times, so clamp.
  return std::max(0.0, std::chrono::duration<double>(t - start).count());
}

void StepTraceRecorder::beginStep(int64_t step, Clock::time_point start) {
  std::lock_guard lock(mutex_);
  starts_[step] = start;
  stepLocked(step).start_s = std::max(0.0, std::chrono::duration<double>(start - origin_).count());
}

void StepTraceRecorder::compute(int64_t step, TraceCompute::Kind kind, int layer, Span span,
                                std::vector<uint64_t> ready) {
  std::lock_guard lock(mutex_);
  const double start = since(step, span.first);
  stepLocked(step).compute.push_back(
      TraceCompute{kind, layer, start, std::max(0.0, since(step, span.second) - start), std::move(ready)});
}

void StepTraceRecorder::extendLastCompute(int64_t step, Clock::time_point end) {
  std::lock_guard lock(mutex_);
  TraceStep& s = stepLocked(step);
  if (s.compute.empty()) return;
  TraceCompute& c = s.compute.back();
  c.dur_s = std::max(c.dur_s, since(step, end) - c.start_s);
}

void StepTraceRecorder::endStep(int64_t step, double step_s) {
  std::lock_guard lock(mutex_);
  stepLocked(step).step_s = std::max(0.0, step_s);
}

void StepTraceRecorder::group(int64_t step, TraceGroup group, Clock::time_point issued,
                              const std::vector<Span>& phase_spans) {
  std::lock_guard lock(mutex_);
  group.issue_s = since(step, issued);
  for (std::size_t i = 0; i < group.phases.size() && i < phase_spans.size(); ++i) {
    group.phases[i].start_s = since(step, phase_spans[i].first);
    group.phases[i].dur_s = std::max(0.0, since(step, phase_spans[i].second) - group.phases[i].start_s);
  }
  stepLocked(step).groups.push_back(std::move(group));
}

void StepTraceRecorder::update(int64_t step, uint64_t tensor, Span span) {
  std::lock_guard lock(mutex_);
  const double start = since(step, span.first);
  stepLocked(step).updates.push_back(TraceUpdate{tensor, start, std::max(0.0, since(step, span.second) - start)});
}

void StepTraceRecorder::negotiation(int64_t step, Span span, std::string algorithm) {
  std::lock_guard lock(mutex_);
  const double start = since(step, span.first);
  stepLocked(step).negotiations.push_back(
      TraceNegotiation{start, std::max(0.0, since(step, span.second) - start), std::move(algorithm)});
}

StepTrace StepTraceRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  StepTrace trace;
  trace.header = header_;
  for (const auto& [index, step] : steps_) {
    trace.steps.push_back(step);
    auto& groups = trace.steps.back().groups;
    std::sort(groups.begin(), groups.end(), [](const TraceGroup& a, const TraceGroup& b) { return a.seq < b.seq; });
  }
  return trace;
}

}  // namespace terse::train

#include "experiments/config/config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "core/plugin/loader.h"

namespace terse::experiments {
namespace {

namespace pb = google::protobuf;

// Collects the parser's reports (line and column count from 0 there).
class CollectingErrors : public pb::io::ErrorCollector {
 public:
  struct Report {
    int line;
    int column;
    std::string message;
  };

#if GOOGLE_PROTOBUF_VERSION >= 4022000
  void RecordError(int line, pb::io::ColumnNumber column, absl::string_view message) override {
    reports.push_back({line, column, std::string(message)});
  }
#else
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    reports.push_back({line, column, message});
  }
#endif

  std::vector<Report> reports;
};

// Swallows the tokenizer's own complaints: the parser reports the same text better.
class IgnoreErrors : public pb::io::ErrorCollector {
 public:
#if GOOGLE_PROTOBUF_VERSION >= 4022000
  void RecordError(int, pb::io::ColumnNumber, absl::string_view) override {}
#else
  void AddError(int, pb::io::ColumnNumber, const std::string&) override {}
#endif
};

// The text parser's messages do not always say which field they are about ("Expected double, got: \"fast\""), and
// some point at the token after the culprit (an unknown field name or enum value is reported once consumed). This
// re-reads the tokens before the error to name the field path being parsed ("optimizer.lr") and, where the message
// quotes the culprit, moves the position back onto it.
std::string describeParseError(std::string_view text, const std::string& source, CollectingErrors::Report report) {
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreErrors ignore;
  pb::io::Tokenizer tokens(&input, &ignore);
  tokens.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
  std::string quoted_culprit;
  for (const char* lead : {"has no field named \"", "Unknown enumeration value of \"", "Non-repeated field \""}) {
    if (auto pos = report.message.find(lead); pos != std::string::npos) {
      pos += std::strlen(lead);
      quoted_culprit = report.message.substr(pos, report.message.find('"', pos) - pos);
    }
  }
  std::vector<std::string> scopes;
  std::string field, previous;
  int culprit_line = -1, culprit_column = -1;
  while (tokens.Next()) {
    const auto& t = tokens.current();
    if (std::make_pair(t.line, t.column) >= std::make_pair(report.line, report.column)) break;
    if (t.type == pb::io::Tokenizer::TYPE_IDENTIFIER && t.text == quoted_culprit) {
      culprit_line = t.line;
      culprit_column = t.column;
    }
    if ((t.text == ":" || t.text == "{" || t.text == "<") && !previous.empty()) field = previous;
    if (t.text == "{" || t.text == "<") {
      scopes.push_back(field);
      field.clear();
    } else if ((t.text == "}" || t.text == ">") && !scopes.empty()) {
      scopes.pop_back();
      field.clear();
    }
    previous = t.type == pb::io::Tokenizer::TYPE_IDENTIFIER ? t.text : "";
  }
  if (culprit_line >= 0) {
    report.line = culprit_line;
    report.column = culprit_column;
  }
  std::string path;
  for (const auto& s : scopes) path += s + ".";
  path += field;
  if (!path.empty() && path.back() == '.') path.pop_back();

  std::ostringstream os;
  os << source;
  if (report.line >= 0) os << ':' << report.line + 1 << ':' << report.column + 1;
  os << ": " << (path.empty() ? "" : path + ": ") << report.message;
  return os.str();
}

[[noreturn]] void throwConfigError(const char* file, int line, const std::string& source,
                                   std::vector<std::string> errors) {
  std::ostringstream os;
  os << detail::where(file, line) << "config " << source << " is invalid (" << errors.size()
     << (errors.size() == 1 ? " error" : " errors") << "):";
  for (const auto& e : errors) os << "\n  " << e;
  throw ConfigError(os.str(), source, std::move(errors));
}

// A terse::Error's message without its "[core/...:123] " tag: in a config message the tag is noise, the config's own
// file:line is what the reader needs.
std::string untagged(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m.front() == '[') {
    if (auto end = m.find("] "); end != std::string::npos) return m.substr(end + 2);
  }
  return m;
}

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

// Study and variant names become folders under output_dir; anything else could escape it or collide.
bool isFolderName(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

template <typename T>
std::string joined(const std::vector<T>& items) {
  std::ostringstream os;
  for (std::size_t i = 0; i < items.size(); ++i) os << (i ? ", " : "") << items[i];
  return os.str();
}

// A collectives.<field> algorithm (allreduce, allgather): what `parse` makes of `value`, or nullopt with `problem` set
// to what is wrong with it, in the same words for the validation's list and hostCommOptions' error.
template <class Parse>
auto parseCollective(const std::string& value, Parse parse, std::string_view choices, std::string& problem) {
  auto algo = parse(value);
  if (!algo) problem = " '" + value + "' is not one of " + std::string(choices);
  return algo;
}

// Collects "PATH message" strings; the path is everything before the first ' ' or ':'.
class Checks {
 public:
  std::ostringstream& fail(const std::string& path) {
    flush();
    pending_ = true;
    os_.str("");
    os_ << path;
    return os_;
  }
  std::vector<std::string> take() {
    flush();
    return std::move(out_);
  }

 private:
  void flush() {
    if (pending_) out_.push_back(os_.str());
    pending_ = false;
  }
  std::ostringstream os_;
  bool pending_ = false;
  std::vector<std::string> out_;
};

// Repeats per variant: enough for any interval a table reports, few enough that a typo (a range pasted in) fails.
constexpr int kMaxSeeds = 100;

void checkPositiveList(Checks& c, const std::string& path, const pb::RepeatedField<int32_t>& values) {
  for (int i = 0; i < values.size(); ++i) {
    if (values[i] < 1) c.fail(path + "[" + std::to_string(i) + "]") << " must be >= 1, got " << values[i];
  }
}

void checkLinkRanks(Checks& c, const Experiment& e) {
  // A parameter server's shards are ranks too (the first ones), and their links are emulated like the workers'.
  const int ranks = jobRanks(e);
  const std::string range = usesParameterServer(e) ? "servers + workers = " : "workers = ";
  for (int i = 0; i < e.link().overrides_size(); ++i) {
    const auto& o = e.link().overrides(i);
    const std::string p = "link.overrides[" + std::to_string(i) + "]";
    if (o.src() < 0 || o.src() >= ranks)
      c.fail(p + ".src") << " must be in [0, " << range << ranks << "), got " << o.src();
    if (o.dst() < 0 || o.dst() >= ranks)
      c.fail(p + ".dst") << " must be in [0, " << range << ranks << "), got " << o.dst();
    if (o.src() == o.dst()) c.fail(p + ".dst") << " must differ from src, got " << o.dst() << " for both";
  }
}

// worker_settings against the workers and the mode (also after --workers changed the count).
void checkWorkerSettings(Checks& c, const Experiment& e) {
  const bool async_mode =
      e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP || e.mode() == Experiment::HOGWILD;
  std::vector<bool> listed(static_cast<std::size_t>(std::max(0, e.workers())), false);
  for (int i = 0; i < e.worker_settings_size(); ++i) {
    const auto& w = e.worker_settings(i);
    const std::string p = "worker_settings[" + std::to_string(i) + "]";
    if (!w.has_worker()) {
      c.fail(p + ".worker") << " must be set";
    } else if (w.worker() < 0 || w.worker() >= e.workers()) {
      c.fail(p + ".worker") << " must be in [0, workers = " << e.workers() << "), got " << w.worker();
    } else if (listed[static_cast<std::size_t>(w.worker())]) {
      c.fail(p + ".worker") << ": worker " << w.worker() << " is listed twice";
    } else {
      listed[static_cast<std::size_t>(w.worker())] = true;
    }
    if (!(w.slowdown() >= 1 && std::isfinite(w.slowdown())))
      c.fail(p + ".slowdown") << " must be a finite factor >= 1, got " << w.slowdown();
    if (w.fail_after_steps() < 0) c.fail(p + ".fail_after_steps") << " must be >= 0, got " << w.fail_after_steps();
    if (w.fail_after_steps() > 0 && !async_mode)
      c.fail(p + ".fail_after_steps") << ": a failed worker stops a " << Experiment::Mode_Name(e.mode())
                                      << " run; only ASYNC, SSP and HOGWILD go on without it";
  }
}

// Parses one emulation string with the comm parser; records the parser's message under `path` on failure.
template <typename Parse>
double parseLinkValue(Checks& c, const std::string& path, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const Error& e) {
    c.fail(path) << ": " << untagged(e);
    return 0;
  }
}

void checkPlugin(Checks& c, const std::string& what, const PluginSpec& spec, const ConfigOptions& options,
                 bool scheduler) {
  if (spec.name().empty()) {
    c.fail(what + ".name") << " must be set";
    return;
  }
  if (scheduler && std::find(options.builtin_schedulers.begin(), options.builtin_schedulers.end(), spec.name()) !=
                       options.builtin_schedulers.end()) {
    if (!spec.params().empty())
      c.fail(what + ".params") << ": the built-in scheduler " << quoted(spec.name()) << " takes no parameters";
    return;
  }
  if (options.loader == nullptr) return;
  // The params' line when there are any; otherwise the name's, which the reader is looking at anyway.
  const std::string params_path = what + (spec.params().empty() ? ".name" : ".params");
  try {
    if (scheduler) {
      auto plugin = options.loader->loadScheduler(spec.name());
      try {
        plugin->instantiate(pluginParams(spec));
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    } else {
      auto plugin = options.loader->loadCompressor(spec.name());
      try {
        plugin->instantiate(pluginParams(spec));
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    }
  } catch (const Error& e) {
    c.fail(what + ".name") << ": " << untagged(e);
  }
}

// Location of `path` ("variants[2].overrides.link.overrides[0].src") in the parsed file, or line -1.
pb::TextFormat::ParseLocation locate(const pb::TextFormat::ParseInfoTree* tree, const std::string& path) {
  const pb::Descriptor* type = Experiment::descriptor();
  std::size_t pos = 0;
  while (tree != nullptr && type != nullptr && pos <= path.size()) {
    std::size_t end = path.find('.', pos);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(pos, end - pos);
    int index = -1;
    if (auto open = part.find('['); open != std::string::npos) {
      index = std::atoi(part.c_str() + open + 1);
      part.resize(open);
    }
    const pb::FieldDescriptor* field = type->FindFieldByName(part);
    if (field == nullptr) break;
    // The parser records repeated fields by index and singular ones with -1; a path naming a whole list points at its
    // first entry.
    index = field->is_repeated() ? std::max(index, 0) : -1;
    if (end == path.size()) return tree->GetLocation(field, index);
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) break;
    tree = tree->GetTreeForNested(field, index);
    type = field->message_type();
    pos = end + 1;
  }
  return {};
}

std::string pathOf(const std::string& message) {
  return message.substr(0, message.find_first_of(" :"));
}

std::string at(const std::string& source, const pb::TextFormat::ParseLocation& loc) {
  if (loc.line < 0) return source + ": ";
  return source + ":" + std::to_string(loc.line + 1) + ":" + std::to_string(loc.column + 1) + ": ";
}

// A PluginSpec's params belong to its plugin, so a variant's PluginSpec replaces the base's whole; lists replace lists
// (experiment.proto, "Variant merging"). Clearing these in `base` first leaves MergeFrom to do the rest.
void clearReplaced(pb::Message& base, const pb::Message& over) {
  const pb::Reflection* from = over.GetReflection();
  const pb::Reflection* to = base.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  from->ListFields(over, &fields);
  for (const auto* f : fields) {
    if (f->is_repeated() ||
        (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && f->message_type() == PluginSpec::descriptor())) {
      to->ClearField(&base, f);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      clearReplaced(*to->MutableMessage(&base, f), from->GetMessage(over, f));
    }
  }
}

}  // namespace

Experiment parseConfigText(std::string_view text, const std::string& source, pb::TextFormat::ParseInfoTree* tree) {
  if (text.size() > static_cast<std::size_t>(INT_MAX)) {
    throwConfigError(__FILE__, __LINE__, source,
                     {source + ": file too large (" + std::to_string(text.size()) + " bytes)"});
  }
  CollectingErrors errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (tree != nullptr) parser.WriteLocationsTo(tree);
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  Experiment experiment;
  if (!parser.Parse(&input, &experiment)) {
    std::vector<std::string> messages;
    for (const auto& report : errors.reports) messages.push_back(describeParseError(text, source, report));
    if (messages.empty()) messages.push_back(source + ": not a valid Experiment in text format");
    throwConfigError(__FILE__, __LINE__, source, std::move(messages));
  }
  return experiment;
}

Study loadStudy(const std::filesystem::path& path, const ConfigOptions& options) {
  std::ifstream in(path, std::ios::binary);
  TERSE_CHECK(in, InvalidArgument, "cannot read experiment config " << path.string());
  std::ostringstream text;
  text << in.rdbuf();
  TERSE_CHECK(!in.bad(), InvalidArgument, "error reading experiment config " << path.string());
  return loadStudyText(text.str(), path.string(), options);
}

Study loadStudyText(std::string_view text, const std::string& source, const ConfigOptions& options) {
  pb::TextFormat::ParseInfoTree tree;
  Study study;
  study.source = source;
  study.file = parseConfigText(text, source, &tree);
  const Experiment& file = study.file;

  // Structure first: resolving needs unique variant names and overrides that stay inside one experiment.
  std::vector<std::string> errors;
  auto report = [&](const std::string& message) {
    errors.push_back(at(source, locate(&tree, pathOf(message))) + message);
  };
  if (file.has_variant() && file.variants_size() > 0) {
    report("variant: names the base of a study without variants; here each variant has its own name");
  }
  for (int i = 0; i < file.variants_size(); ++i) {
    const Variant& v = file.variants(i);
    const std::string p = "variants[" + std::to_string(i) + "]";
    if (!isFolderName(v.name())) {
      report(p + ".name must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got " + quoted(v.name()));
    }
    for (int j = 0; j < i; ++j) {
      if (file.variants(j).name() == v.name()) {
        report(p + ".name " + quoted(v.name()) + " repeats variants[" + std::to_string(j) + "].name");
        break;
      }
    }
    if (v.overrides().has_study()) report(p + ".overrides.study: a variant cannot change the study");
    if (v.overrides().has_variant()) report(p + ".overrides.variant: the variant's name is variants[].name");
    if (v.overrides().variants_size() > 0) report(p + ".overrides.variants: variants do not nest");
  }
  if (!errors.empty()) throwConfigError(__FILE__, __LINE__, source, std::move(errors));

  study.experiments = resolveVariants(file);
  std::set<std::string> reported;  // a base field's error is the same in every variant: say it once
  for (std::size_t k = 0; k < study.experiments.size(); ++k) {
    for (const auto& message : validateExperiment(study.experiments[k], options)) {
      const std::string path = pathOf(message);
      std::string line;
      if (file.variants_size() > 0) {
        const std::string variant = "variants[" + std::to_string(k) + "]";
        const std::string prefix = variant + " (\"" + file.variants(static_cast<int>(k)).name() + "\").";
        if (auto loc = locate(&tree, variant + ".overrides." + path); loc.line >= 0) {
          line = at(source, loc) + prefix + message;
        } else if (loc = locate(&tree, path); loc.line >= 0) {
          line = at(source, loc) + message;
        } else {
          line = at(source, loc) + prefix + message;
        }
      } else {
        line = at(source, locate(&tree, path)) + message;
      }
      if (reported.insert(line).second) errors.push_back(line);
    }
  }
  if (!errors.empty()) throwConfigError(__FILE__, __LINE__, source, std::move(errors));
  return study;
}

void mergeOverrides(Experiment& base, const Experiment& overrides) {
  clearReplaced(base, overrides);
  base.MergeFrom(overrides);
}

void applyDefaults(Experiment& e) {
  if (!e.has_variant()) e.set_variant(std::string(kBaseVariantName));
  auto* data = e.mutable_data();
  if (!data->has_dataset_dir()) data->set_dataset_dir(std::string(kDefaultDatasetDir));
  if (!data->has_batch_size()) data->set_batch_size(32);
  if (!data->has_train_subset()) data->set_train_subset(0);
  if (!data->has_test_subset()) data->set_test_subset(0);
  auto* opt = e.mutable_optimizer();
  if (!opt->has_lr()) opt->set_lr(0.01);
  if (!opt->has_momentum()) opt->set_momentum(0);
  if (!opt->has_nesterov()) opt->set_nesterov(false);
  if (!opt->has_weight_decay()) opt->set_weight_decay(0);
  if (!opt->has_warmup_steps()) opt->set_warmup_steps(0);
  if (!opt->has_warmup_epochs()) opt->set_warmup_epochs(0);
  if (!opt->has_schedule()) opt->set_schedule(Optimizer::CONSTANT);
  if (!opt->has_gamma()) opt->set_gamma(0.1);
  if (!opt->has_scale_lr_by_world_size()) opt->set_scale_lr_by_world_size(false);
  if (!e.has_workers()) e.set_workers(1);
  if (!e.has_mode()) e.set_mode(Experiment::SYNC);
  if (!e.has_staleness_bound()) e.set_staleness_bound(0);
  if (!e.has_transport()) e.set_transport(Experiment::INPROC);
  auto* ps = e.mutable_parameter_server();
  if (!ps->has_servers()) ps->set_servers(1);
  if (!ps->has_staleness_aware_lr()) ps->set_staleness_aware_lr(false);
  if (!ps->has_pull_dtype()) ps->set_pull_dtype(ParameterServer::F32);
  if (!ps->has_worker_timeout()) ps->set_worker_timeout("10s");
  for (auto& w : *e.mutable_worker_settings()) {
    if (!w.has_slowdown()) w.set_slowdown(1);
    if (!w.has_fail_after_steps()) w.set_fail_after_steps(0);
  }
  auto* tcp = e.mutable_tcp();
  if (!tcp->has_timeout()) tcp->set_timeout("30s");
  if (!tcp->has_socket_buffer_bytes()) tcp->set_socket_buffer_bytes(0);
  if (!tcp->has_bind_address()) tcp->set_bind_address("");
  auto* link = e.mutable_link();
  if (!link->has_bandwidth()) link->set_bandwidth("unlimited");
  if (!link->has_latency()) link->set_latency("0");
  if (!link->has_nic()) link->set_nic("unlimited");
  if (!link->has_nic_ingress()) link->set_nic_ingress("unlimited");
  for (auto& o : *link->mutable_overrides()) {
    if (!o.has_src()) o.set_src(0);
    if (!o.has_dst()) o.set_dst(0);
    if (!o.has_bandwidth()) o.set_bandwidth(link->bandwidth());
    if (!o.has_latency()) o.set_latency(link->latency());
  }
  // Only the cnn reads dropout: another workload's resolved config stays as it was before the field existed.
  if (e.workload().name() == "cnn" && !e.workload().has_dropout()) e.mutable_workload()->set_dropout(0);
  if (e.workload().name() == "glove") {
    auto* g = e.mutable_workload()->mutable_glove();
    if (!g->has_corpus()) g->set_corpus("/usr/share/games/fortunes");
    if (!g->has_window()) g->set_window(10);
    if (!g->has_vocab_size()) g->set_vocab_size(10000);
    if (!g->has_min_count()) g->set_min_count(5);
    if (!g->has_dim()) g->set_dim(50);
    if (!g->has_x_max()) g->set_x_max(100);
    if (!g->has_alpha()) g->set_alpha(0.75);
    if (!g->has_optimizer()) g->set_optimizer(Glove::ADAGRAD);
    if (!g->has_test_fraction()) g->set_test_fraction(0.1);
    if (!g->has_cache_dir()) g->set_cache_dir("");
  }
  if (!e.has_sparse_gradients()) e.set_sparse_gradients(false);
  if (!e.compressor().has_name()) e.mutable_compressor()->set_name("none");
  if (!e.has_error_feedback()) e.set_error_feedback(false);
  auto* mc = e.mutable_momentum_correction();
  if (!mc->has_factor()) mc->set_factor(0);
  if (!mc->has_masking()) mc->set_masking(true);
  if (!mc->has_nesterov()) mc->set_nesterov(false);
  if (!e.scheduler().has_name()) e.mutable_scheduler()->set_name("fifo");
  if (!e.has_epochs()) e.set_epochs(1);
  auto* eval = e.mutable_eval();
  if (!eval->has_every_steps()) eval->set_every_steps(0);
  if (!eval->has_per_epoch()) eval->set_per_epoch(true);
  if (!e.has_seed()) e.set_seed(e.seeds_size() > 0 ? e.seeds(0) : 1);
  if (!e.has_output_dir()) e.set_output_dir("results");
  if (!e.has_clock()) e.set_clock(Experiment::REAL_TIME);
  if (!e.simulation().has_compute_scale()) e.mutable_simulation()->set_compute_scale(1.0);
  if (!e.simulation().has_compute()) e.mutable_simulation()->set_compute(Simulation::MEASURED);
  if (!e.simulation().has_flops_per_second()) e.mutable_simulation()->set_flops_per_second(1e11);
  if (!e.collectives().has_allreduce()) e.mutable_collectives()->set_allreduce("auto");
  if (!e.collectives().has_allgather()) e.mutable_collectives()->set_allgather("auto");
}

std::vector<Experiment> resolveVariants(const Experiment& file) {
  std::vector<Experiment> out;
  Experiment base = file;
  base.clear_variants();
  if (file.variants_size() == 0) {
    applyDefaults(base);
    out.push_back(std::move(base));
    return out;
  }
  base.clear_variant();
  for (const auto& v : file.variants()) {
    Experiment e = base;
    mergeOverrides(e, v.overrides());
    e.set_variant(v.name());
    applyDefaults(e);
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

// workload.glove's ranges (glove.h, cooccurrence.h restate them for callers that bypass the config).
void checkGlove(Checks& c, const Experiment& e) {
  const Glove& g = e.workload().glove();
  if (g.corpus().empty()) c.fail("workload.glove.corpus") << " must name a text file or a directory of them";
  if (g.window() < 1 || g.window() > 1000)
    c.fail("workload.glove.window") << " must be in [1, 1000], got " << g.window();
  if (g.vocab_size() < 2 || g.vocab_size() > (int64_t{1} << 24))
    c.fail("workload.glove.vocab_size") << " must be in [2, 2^24], got " << g.vocab_size();
  if (g.min_count() < 1) c.fail("workload.glove.min_count") << " must be >= 1, got " << g.min_count();
  if (g.dim() < 1 || g.dim() > 4096) c.fail("workload.glove.dim") << " must be in [1, 4096], got " << g.dim();
  if (!(std::isfinite(g.x_max()) && g.x_max() > 0)) c.fail("workload.glove.x_max") << " must be > 0, got " << g.x_max();
  if (!(g.alpha() > 0 && g.alpha() <= 1)) c.fail("workload.glove.alpha") << " must be in (0, 1], got " << g.alpha();
  if (!(g.test_fraction() >= 0 && g.test_fraction() < 1))
    c.fail("workload.glove.test_fraction") << " must be in [0, 1), got " << g.test_fraction();
  if (g.optimizer() != Glove::ADAGRAD && g.optimizer() != Glove::SGD)
    c.fail("workload.glove.optimizer") << " must be ADAGRAD or SGD";
  if (g.optimizer() == Glove::ADAGRAD && e.optimizer().momentum() != 0)
    c.fail("workload.glove.optimizer") << ": ADAGRAD takes no momentum, got optimizer.momentum "
                                       << e.optimizer().momentum();
  if (g.optimizer() == Glove::ADAGRAD && e.mode() == Experiment::HOGWILD)
    c.fail("workload.glove.optimizer") << ": mode HOGWILD applies plain SGD; use SGD";
}

// Repeats: at most kMaxSeeds, none twice, and `seed`, when given beside them, one of them.
void checkSeeds(Checks& c, const Experiment& e) {
  if (e.seeds_size() > kMaxSeeds) c.fail("seeds") << " lists " << e.seeds_size() << " seeds, at most " << kMaxSeeds;
  for (int i = 0; i < e.seeds_size(); ++i) {
    for (int j = 0; j < i; ++j) {
      if (e.seeds(j) == e.seeds(i)) {
        c.fail("seeds") << ": entry " << i << " repeats entry " << j << " (" << e.seeds(i)
                        << "): a seed run twice gives the same numbers twice, which "
                           "narrows the interval without measuring anything";
        break;
      }
    }
  }
  if (e.seeds_size() > 0 && std::find(e.seeds().begin(), e.seeds().end(), e.seed()) == e.seeds().end()) {
    std::string list;
    for (const uint64_t s : e.seeds()) list += (list.empty() ? "" : ", ") + std::to_string(s);
    c.fail("seed") << " " << e.seed() << " is not one of seeds [" << list
                   << "]: with seeds, give seed only to name one of them (or leave it out)";
  }
}

}  // namespace

std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options) {
  Checks c;
  const auto folder_rule = " must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got ";
  if (!isFolderName(e.study())) c.fail("study") << folder_rule << quoted(e.study());
  if (!isFolderName(e.variant())) c.fail("variant") << folder_rule << quoted(e.variant());

  const auto& w = e.workload();
  if (w.name().empty()) {
    c.fail("workload.name") << " must be set"
                            << (options.workloads.empty() ? "" : " (one of: " + joined(options.workloads) + ")");
  } else if (!options.workloads.empty() &&
             std::find(options.workloads.begin(), options.workloads.end(), w.name()) == options.workloads.end()) {
    c.fail("workload.name") << ": unknown workload " << quoted(w.name()) << " (known: " << joined(options.workloads)
                            << ")";
  }
  checkPositiveList(c, "workload.hidden_sizes", w.hidden_sizes());
  checkPositiveList(c, "workload.conv_channels", w.conv_channels());
  // Fields a workload does not read are errors, not silently ignored settings.
  if (w.name() == "cnn") {
    if (w.conv_channels_size() != 0 && w.conv_channels_size() != 2)
      c.fail("workload.conv_channels")
          << ": cnn has two convolutions, give 2 channel counts (or none for [8, 16]), got " << w.conv_channels_size();
    if (w.has_dropout() && !(w.dropout() >= 0 && w.dropout() < 1))
      c.fail("workload.dropout") << " must be in [0, 1), got " << w.dropout();
  } else if (!w.name().empty()) {
    if (w.conv_channels_size() > 0)
      c.fail("workload.conv_channels") << ": only workload cnn has convolutions, not " << quoted(w.name());
    if (w.has_dropout()) c.fail("workload.dropout") << ": only workload cnn has dropout, not " << quoted(w.name());
  }
  if (w.name() == "glove") {
    checkGlove(c, e);
  } else if (!w.name().empty() && w.has_glove()) {
    c.fail("workload.glove") << ": only workload glove reads it, not " << quoted(w.name());
  }
  if (e.sparse_gradients() && e.mode() == Experiment::HOGWILD)
    c.fail("sparse_gradients") << ": mode HOGWILD sends nothing (its workers write one shared vector in memory); "
                                  "row-sparse tensors travel in modes SYNC, ASYNC and SSP (leave it false)";
  if (e.sparse_gradients() && e.transport() == Experiment::NCCL)
    c.fail("sparse_gradients") << ": transport NCCL trains on the GPU, whose tensors are dense (leave it false)";

  const auto& d = e.data();
  if (d.dataset_dir().empty()) c.fail("data.dataset_dir") << " must be set";
  if (d.batch_size() < 1) c.fail("data.batch_size") << " must be >= 1, got " << d.batch_size();
  if (d.train_subset() < 0) c.fail("data.train_subset") << " must be >= 0 (0 = all), got " << d.train_subset();
  if (d.test_subset() < 0) c.fail("data.test_subset") << " must be >= 0 (0 = all), got " << d.test_subset();

  const auto& o = e.optimizer();
  if (!(std::isfinite(o.lr()) && o.lr() > 0)) c.fail("optimizer.lr") << " must be > 0, got " << o.lr();
  if (!(o.momentum() >= 0 && o.momentum() < 1))
    c.fail("optimizer.momentum") << " must be in [0, 1), got " << o.momentum();
  if (o.nesterov() && o.momentum() == 0) c.fail("optimizer.nesterov") << " needs optimizer.momentum > 0";
  if (!(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0)) {
    c.fail("optimizer.weight_decay") << " must be >= 0, got " << o.weight_decay();
  }
  if (o.warmup_steps() < 0) c.fail("optimizer.warmup_steps") << " must be >= 0, got " << o.warmup_steps();
  if (!(std::isfinite(o.warmup_epochs()) && o.warmup_epochs() >= 0)) {
    c.fail("optimizer.warmup_epochs") << " must be >= 0, got " << o.warmup_epochs();
  }
  if (o.warmup_steps() > 0 && o.warmup_epochs() > 0) {
    c.fail("optimizer.warmup_epochs") << ": set warm-up in steps or in epochs, not both (warmup_steps "
                                      << o.warmup_steps() << ", warmup_epochs " << o.warmup_epochs() << ")";
  }
  if (o.schedule() == Optimizer::SCHEDULE_UNSPECIFIED)
    c.fail("optimizer.schedule") << " must be CONSTANT, STEP or COSINE";
  if (o.schedule() == Optimizer::STEP) {
    if (o.milestones().empty()) c.fail("optimizer.milestones") << " must list at least one epoch for schedule STEP";
    for (int i = 0; i < o.milestones_size(); ++i) {
      const std::string p = "optimizer.milestones[" + std::to_string(i) + "]";
      if (o.milestones(i) < 1) {
        c.fail(p) << " must be >= 1, got " << o.milestones(i);
      } else if (i > 0 && o.milestones(i) <= o.milestones(i - 1)) {
        c.fail(p) << " must be greater than the one before (" << o.milestones(i - 1) << "), got " << o.milestones(i);
      }
    }
    if (!(o.gamma() > 0 && o.gamma() <= 1)) c.fail("optimizer.gamma") << " must be in (0, 1], got " << o.gamma();
  } else if (!o.milestones().empty()) {
    c.fail("optimizer.milestones") << " only apply with schedule STEP, got schedule "
                                   << Optimizer::Schedule_Name(o.schedule());
  }

  if (e.workers() < 1) c.fail("workers") << " must be >= 1, got " << e.workers();
  auto names = [](const auto& values, auto name_of) {
    std::vector<std::string> out;
    for (auto v : values) out.push_back(name_of(v));
    return joined(out);
  };
  if (std::find(options.modes.begin(), options.modes.end(), e.mode()) == options.modes.end()) {
    c.fail("mode") << ": " << Experiment::Mode_Name(e.mode()) << " is not supported by this runner (supported: "
                   << names(options.modes, [](auto m) { return Experiment::Mode_Name(m); }) << ")";
  }
  if (e.staleness_bound() < 0) c.fail("staleness_bound") << " must be >= 0, got " << e.staleness_bound();
  if (e.staleness_bound() > 0 && e.mode() != Experiment::SSP) {
    c.fail("staleness_bound") << " only applies with mode SSP, got mode " << Experiment::Mode_Name(e.mode());
  }
  const bool async_mode =
      e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP || e.mode() == Experiment::HOGWILD;
  const auto& ps = e.parameter_server();
  if (ps.servers() < 1) c.fail("parameter_server.servers") << " must be >= 1, got " << ps.servers();
  if (ps.pull_dtype() == ParameterServer::PULL_DTYPE_UNSPECIFIED)
    c.fail("parameter_server.pull_dtype") << " must be F32, F16 or BF16";
  try {
    if (!(comm::parseDuration(ps.worker_timeout()) > 0))
      c.fail("parameter_server.worker_timeout") << " must be > 0, got '" << ps.worker_timeout() << "'";
  } catch (const Error& err) {
    c.fail("parameter_server.worker_timeout") << ": " << untagged(err);
  }
  if (e.mode() == Experiment::HOGWILD) {
    // Hogwild shares one parameter vector in memory: there is nothing to compress and no wire.
    if (e.transport() != Experiment::INPROC)
      c.fail("transport") << ": mode HOGWILD shares memory between threads and needs INPROC, got "
                          << Experiment::Transport_Name(e.transport());
    if (e.compressor().name() != "none")
      c.fail("compressor.name") << ": mode HOGWILD sends nothing to compress, got '" << e.compressor().name() << "'";
    if (e.error_feedback()) c.fail("error_feedback") << ": mode HOGWILD sends nothing to compress";
    if (e.optimizer().momentum() > 0)
      c.fail("optimizer.momentum") << ": mode HOGWILD applies plain SGD (lock-free shared parameters have no agreed "
                                      "momentum buffer), got "
                                   << e.optimizer().momentum();
  }
  if (async_mode && e.trace()) c.fail("trace") << ": timelines are recorded in mode SYNC only";
  // Unset stays unset (1): a default written here would change every existing config's hash.
  if (e.has_max_groups_in_flight()) {
    // A lane is a thread (an actor in a simulation) per in-flight group: 64 is far above what a credit window needs.
    if (e.max_groups_in_flight() < 1 || e.max_groups_in_flight() > 64)
      c.fail("max_groups_in_flight") << " must be in [1, 64], got " << e.max_groups_in_flight();
    if (e.max_groups_in_flight() > 1 && e.mode() != Experiment::SYNC)
      c.fail("max_groups_in_flight") << ": groups are the sync trainer's; mode " << Experiment::Mode_Name(e.mode())
                                     << " has none (leave it unset)";
    if (e.max_groups_in_flight() > 1 && e.transport() == Experiment::NCCL)
      c.fail("max_groups_in_flight") << ": transport NCCL runs one collective at a time on its stream (leave it unset)";
  }
  if (e.has_gradient_accumulation_steps() && e.gradient_accumulation_steps() < 1)
    c.fail("gradient_accumulation_steps") << " must be >= 1, got " << e.gradient_accumulation_steps();
  const double clip = e.optimizer().clip_grad_norm();
  if (!(std::isfinite(clip) && clip >= 0))
    c.fail("optimizer.clip_grad_norm") << " must be finite and >= 0, got " << clip;
  // The parameter server and Hogwild apply each worker's gradient as it arrives: a worker accumulates its own
  // micro-batches and pushes (applies) once, and clips its own gradient before that
  // (AsyncTrainerOptions::accumulation_steps, clip_grad_norm). NCCL's workloads keep their gradients on the device,
  // where the trainer does not accumulate or clip.
  for (const auto& [field, set] : {std::pair{"gradient_accumulation_steps", e.gradient_accumulation_steps() > 1},
                                   std::pair{"optimizer.clip_grad_norm", clip > 0}}) {
    if (set && e.transport() == Experiment::NCCL)
      c.fail(field) << ": transport NCCL keeps gradients on the device; it needs INPROC or TCP";
    // Mode SYNC applies row-sparse tensors as their rows arrive (SyncTrainer::runSparse): not accumulated, not in the
    // norm. A parameter-server worker accumulates and clips its own gradient before the push, rows and all.
    if (set && e.sparse_gradients() && !async_mode)
      c.fail(field) << ": sparse_gradients applies each row-sparse tensor as its rows arrive, with no accumulated "
                       "step or global norm; set one of the two";
  }
  if (e.clock() == Experiment::CLOCK_UNSPECIFIED) c.fail("clock") << " must be REAL_TIME or SIMULATED";
  if (e.clock() == Experiment::SIMULATED) {
    // The simulated cluster runs the in-process threads (sync trainer, parameter server shards and workers) as
    // SimGrid actors; other processes or GPUs keep real time, and so do Hogwild's threads, whose lock-free races
    // happen between threads running at the same instant (actors run one at a time).
    if (e.transport() != Experiment::INPROC)
      c.fail("clock") << ": SIMULATED simulates the in-process cluster and needs transport INPROC, got "
                      << Experiment::Transport_Name(e.transport()) << " (which runs in real time)";
    if (e.mode() == Experiment::HOGWILD)
      c.fail("clock") << ": SIMULATED runs modes SYNC, ASYNC and SSP; mode HOGWILD's lock-free races need threads "
                         "running at once and run in real time (clock REAL_TIME)";
  }
  if (e.simulation().has_topology()) {
    if (e.clock() != Experiment::SIMULATED)
      c.fail("simulation.topology") << ": a topology is built for the simulated cluster (clock SIMULATED); the "
                                       "real-time emulation paces the per-link model of `link`";
    try {
      const sim::TwoLevelTopology t = topology(e);
      t.validate();
    } catch (const Error& err) {
      c.fail("simulation.topology") << ": " << untagged(err);
    }
    bool links = false;
    try {
      links = emulationConfig(e).enabled();
    } catch (const Error&) {
      links = true;  // a malformed link value is reported under its own field
    }
    if (links) c.fail("link") << ": simulation.topology describes the network; leave link (and its overrides) unset";
  }
  {
    const auto& co = e.collectives();
    std::string reduce_problem, gather_problem;
    const auto reduce = parseCollective(co.allreduce(), comm::parseAllreduceAlgorithm,
                                        comm::allreduceAlgorithmChoices(), reduce_problem);
    const auto gather = parseCollective(co.allgather(), comm::parseAllgatherAlgorithm,
                                        comm::allgatherAlgorithmChoices(), gather_problem);
    if (!reduce) c.fail("collectives.allreduce") << reduce_problem;
    if (!gather) c.fail("collectives.allgather") << gather_problem;
    if (co.has_ranks_per_node()) {
      const int per = co.ranks_per_node();
      if (per < 1 || per > std::max(1, e.workers()))
        c.fail("collectives.ranks_per_node") << " must be in [1, workers = " << e.workers() << "], got " << per;
    }
    const bool nodes_known = co.has_ranks_per_node() || e.simulation().has_topology();
    if (reduce == comm::AllreduceAlgorithm::kHierarchical && !nodes_known)
      c.fail("collectives.allreduce") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                         "topology) to know the nodes";
    if (gather == comm::AllgatherAlgorithm::kHierarchical && !nodes_known)
      c.fail("collectives.allgather") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                         "topology) to know the nodes";
  }
  const double scale = e.simulation().compute_scale();
  if (!(scale >= 0 && scale < 1e6)) c.fail("simulation.compute_scale") << " must be in [0, 1e6), got " << scale;
  if (e.simulation().compute() == Simulation::COMPUTE_UNSPECIFIED)
    c.fail("simulation.compute") << " must be MEASURED or FLOP_MODEL";
  const double flops = e.simulation().flops_per_second();
  if (!(flops > 0 && std::isfinite(flops)))
    c.fail("simulation.flops_per_second") << " must be finite and > 0, got " << flops;
  checkWorkerSettings(c, e);
  if (std::find(options.transports.begin(), options.transports.end(), e.transport()) == options.transports.end()) {
    c.fail("transport")
        << ": " << Experiment::Transport_Name(e.transport()) << " is not supported by this runner (supported: "
        << names(options.transports, [](auto t) { return Experiment::Transport_Name(t); }) << ")"
        << (e.transport() == Experiment::NCCL
                ? ": NCCL needs a terse built with CUDA and NCCL (nvcc and libnccl found when configuring)"
                : "");
  }
  const bool nccl_offered =
      std::find(options.transports.begin(), options.transports.end(), Experiment::NCCL) != options.transports.end();
  if (e.transport() == Experiment::NCCL && nccl_offered) {
    // One process per GPU, gradients kept on the device: bulk-synchronous only (the parameter server runs over TCP),
    // a model with a CUDA version, and no emulated links (NCCL runs at the hardware's speed).
    if (e.mode() != Experiment::SYNC)
      c.fail("mode") << ": transport NCCL runs mode SYNC (the parameter server modes run over TCP), got "
                     << Experiment::Mode_Name(e.mode());
    const auto& cw = options.cuda_workloads;
    if (std::find(cw.begin(), cw.end(), e.workload().name()) == cw.end())
      c.fail("workload.name") << ": transport NCCL trains on the GPU, and '" << e.workload().name()
                              << "' has no CUDA version (those with one: " << joined(cw) << ")";
    if (e.workload().name() == "cnn" && (e.workload().hidden_sizes_size() > 0 || e.workload().dropout() > 0))
      c.fail("workload.hidden_sizes") << ": transport NCCL trains on the GPU, whose cnn has no hidden layers or "
                                         "dropout yet (cnn_cuda.h); leave hidden_sizes and dropout unset";
    // Resolved defaults spell "no emulation" as unlimited bandwidth and zero latency.
    bool emulated = false;
    try {
      emulated = emulationConfig(e).enabled();
    } catch (const Error&) {
      emulated = true;  // a malformed link value is reported under its own field; it still asks for emulation
    }
    if (emulated)
      c.fail("link") << ": emulated links apply to the host transports (INPROC, TCP); transport NCCL runs at the "
                        "hardware's speed, so leave link unset";
  }

  try {
    if (!(comm::parseDuration(e.tcp().timeout()) > 0))
      c.fail("tcp.timeout") << " must be > 0, got '" << e.tcp().timeout() << "'";
  } catch (const Error& err) {
    c.fail("tcp.timeout") << ": " << untagged(err);
  }
  if (e.tcp().socket_buffer_bytes() < 0)
    c.fail("tcp.socket_buffer_bytes") << " must be >= 0, got " << e.tcp().socket_buffer_bytes();
  for (char ch : e.tcp().bind_address()) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '-' || ch == '_')) {
      c.fail("tcp.bind_address") << " '" << e.tcp().bind_address() << "' is not a host name or address";
      break;
    }
  }

  const auto& link = e.link();
  parseLinkValue(c, "link.bandwidth", link.bandwidth(), comm::parseBandwidth);
  parseLinkValue(c, "link.latency", link.latency(), comm::parseDuration);
  parseLinkValue(c, "link.nic", link.nic(), comm::parseBandwidth);
  parseLinkValue(c, "link.nic_ingress", link.nic_ingress(), comm::parseBandwidth);
  for (int i = 0; i < link.overrides_size(); ++i) {
    const std::string p = "link.overrides[" + std::to_string(i) + "]";
    parseLinkValue(c, p + ".bandwidth", link.overrides(i).bandwidth(), comm::parseBandwidth);
    parseLinkValue(c, p + ".latency", link.overrides(i).latency(), comm::parseDuration);
  }
  if (e.workers() >= 1) checkLinkRanks(c, e);

  checkPlugin(c, "compressor", e.compressor(), options, /*scheduler=*/false);
  try {
    validateCodecOptions(codecOptions(e));
  } catch (const Error& err) {
    c.fail("momentum_correction.factor") << ": " << untagged(err);
  }
  if (e.momentum_correction().factor() > 0 && o.momentum() > 0) {
    c.fail("momentum_correction.factor") << " " << e.momentum_correction().factor()
                                         << " needs optimizer.momentum 0, got " << o.momentum()
                                         << ": DGC's momentum correction carries the momentum itself";
  }
  checkPlugin(c, "scheduler", e.scheduler(), options, /*scheduler=*/true);

  if (e.epochs() < 1) c.fail("epochs") << " must be >= 1, got " << e.epochs();
  if (e.eval().every_steps() < 0) c.fail("eval.every_steps") << " must be >= 0, got " << e.eval().every_steps();
  if (e.eval().every_steps() == 0 && !e.eval().per_epoch()) {
    c.fail("eval.per_epoch") << ": false with eval.every_steps 0 would never evaluate";
  }
  if (e.output_dir().empty()) c.fail("output_dir") << " must be set";
  checkSeeds(c, e);
  return c.take();
}

std::string toText(const Experiment& experiment) {
  std::string out;
  pb::TextFormat::Printer printer;
  TERSE_CHECK(printer.PrintToString(experiment, &out), InternalError, "cannot print experiment as text");
  return out;
}

void writeResolvedConfig(const Experiment& experiment, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TERSE_CHECK(out, InvalidArgument, "cannot write resolved config " << path.string());
  out << "# Resolved config of study '" << experiment.study() << "', variant '" << experiment.variant()
      << "': the variant merged onto the base, every default filled in.\n"
      << toText(experiment);
  out.flush();
  TERSE_CHECK(out, InvalidArgument, "error writing resolved config " << path.string());
}

std::vector<Experiment> expandRepeats(const std::vector<Experiment>& experiments) {
  std::vector<Experiment> out;
  for (const auto& e : experiments) {
    if (e.seeds_size() == 0) {
      out.push_back(e);
      continue;
    }
    for (const uint64_t seed : e.seeds()) {
      out.push_back(e);
      out.back().set_seed(seed);
    }
  }
  return out;
}

std::string resultsSubfolder(const Experiment& e) {
  return e.seeds_size() == 0 ? e.variant() : e.variant() + "/seed-" + std::to_string(e.seed());
}

std::vector<Experiment> selectVariants(const Study& study, const std::vector<std::string>& names) {
  if (names.empty()) return study.experiments;
  std::vector<Experiment> out;
  for (const auto& name : names) {
    auto it = std::find_if(study.experiments.begin(), study.experiments.end(),
                           [&](const Experiment& e) { return e.variant() == name; });
    if (it == study.experiments.end()) {
      std::vector<std::string> known;
      for (const auto& e : study.experiments) known.push_back(e.variant());
      TERSE_THROW(InvalidArgument, "--variant " << quoted(name) << ": no such variant in " << study.source
                                                << " (variants: " << joined(known) << ")");
    }
    out.push_back(*it);
  }
  return out;
}

namespace {

// A command-line override changes every variant of a study after the file's own checks ran: `set` applies it to one
// variant and `check` re-runs the checks it can break; every failure names the option and the variant, and all of
// them come in one ConfigError, as a file's errors do.
template <typename Set, typename Check>
void recheckAfterOverride(std::vector<Experiment>& experiments, const std::string& source, Set set, Check check) {
  std::vector<std::string> errors;
  for (auto& e : experiments) {
    set(e);
    Checks c;
    check(c, e);
    for (const auto& m : c.take()) errors.push_back(source + ": variant " + quoted(e.variant()) + ": " + m);
  }
  if (!errors.empty()) throwConfigError(__FILE__, __LINE__, source, std::move(errors));
}

}  // namespace

void overrideWorkers(std::vector<Experiment>& experiments, int workers, const std::string& source) {
  TERSE_CHECK(workers >= 1, InvalidArgument, "--workers must be >= 1, got " << workers);
  recheckAfterOverride(
      experiments, source, [&](Experiment& e) { e.set_workers(workers); },
      [](Checks& c, const Experiment& e) {
        checkLinkRanks(c, e);
        checkWorkerSettings(c, e);
      });
}

void overrideSeeds(std::vector<Experiment>& experiments, std::span<const uint64_t> seeds, const std::string& source) {
  TERSE_CHECK(!seeds.empty(), InvalidArgument, source << " needs at least one seed");
  recheckAfterOverride(
      experiments, source,
      [&](Experiment& e) {
        e.mutable_seeds()->Assign(seeds.begin(), seeds.end());
        e.set_seed(seeds.front());
      },
      checkSeeds);
}

comm::EmulationConfig emulationConfig(const Experiment& experiment) {
  const auto& link = experiment.link();
  comm::EmulationConfig config;
  config.link.bandwidth_bps = comm::parseBandwidth(link.bandwidth());
  config.link.latency_s = comm::parseDuration(link.latency());
  config.nic_egress_bps = comm::parseBandwidth(link.nic());
  config.nic_ingress_bps = comm::parseBandwidth(link.nic_ingress());
  for (const auto& o : link.overrides()) {
    config.overrides.push_back(
        {o.src(), o.dst(), comm::LinkSpec{comm::parseBandwidth(o.bandwidth()), comm::parseDuration(o.latency())}});
  }
  return config;
}

sim::TwoLevelTopology topology(const Experiment& experiment) {
  if (!experiment.simulation().has_topology()) return {};
  const Topology& t = experiment.simulation().topology();
  sim::TwoLevelTopology out;
  if (t.has_preset()) {
    const auto preset = sim::topologyPreset(t.preset());
    TERSE_CHECK(preset.has_value(), InvalidArgument,
                "simulation.topology.preset '" << t.preset() << "' is not one of " << sim::presetNames());
    out = *preset;
  }
  if (t.has_workers_per_node()) out.workers_per_node = t.workers_per_node();
  if (t.has_intra_bandwidth()) out.intra.bandwidth_bps = comm::parseBandwidth(t.intra_bandwidth());
  if (t.has_intra_latency()) out.intra.latency_s = comm::parseDuration(t.intra_latency());
  if (t.has_nic_bandwidth()) out.nic.bandwidth_bps = comm::parseBandwidth(t.nic_bandwidth());
  if (t.has_nic_latency()) out.nic.latency_s = comm::parseDuration(t.nic_latency());
  if (t.has_nics_per_node()) out.nics_per_node = t.nics_per_node();
  if (t.has_oversubscription()) out.oversubscription = t.oversubscription();
  if (t.has_nodes_per_rack()) out.nodes_per_rack = t.nodes_per_rack();
  // A topology without a node size is one nobody finished describing: validate() names the field.
  if (!out.enabled()) out.workers_per_node = -1;
  return out;
}

comm::HostCommOptions hostCommOptions(const Experiment& experiment) {
  comm::HostCommOptions o;
  std::string problem;
  const auto reduce = parseCollective(experiment.collectives().allreduce(), comm::parseAllreduceAlgorithm,
                                      comm::allreduceAlgorithmChoices(), problem);
  TERSE_CHECK(reduce.has_value(), InvalidArgument, "collectives.allreduce" << problem);
  const auto gather = parseCollective(experiment.collectives().allgather(), comm::parseAllgatherAlgorithm,
                                      comm::allgatherAlgorithmChoices(), problem);
  TERSE_CHECK(gather.has_value(), InvalidArgument, "collectives.allgather" << problem);
  o.algorithm = *reduce;
  o.allgather = *gather;
  if (experiment.collectives().has_ranks_per_node()) {
    o.ranks_per_node = experiment.collectives().ranks_per_node();
  } else if (experiment.clock() == Experiment::SIMULATED && experiment.simulation().has_topology()) {
    o.ranks_per_node = std::max(1, std::min(topology(experiment).workers_per_node, experiment.workers()));
  }
  return o;
}

CodecOptions codecOptions(const Experiment& experiment) {
  CodecOptions options;
  options.error_feedback = experiment.error_feedback();
  options.momentum_correction = experiment.momentum_correction().factor();
  options.momentum_masking = experiment.momentum_correction().masking();
  options.momentum_nesterov = experiment.momentum_correction().nesterov();
  return options;
}

Params pluginParams(const PluginSpec& spec) {
  Params params(spec.params().begin(), spec.params().end());
  std::sort(params.begin(), params.end());
  return params;
}

}  // namespace terse::experiments

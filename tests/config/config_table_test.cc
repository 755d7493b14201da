// The config tables (experiments/config/config_fields.cc) against the schema they describe: every scalar field of every
// message has an entry (or is listed as not in a table), every entry names a real field of the right type with a
// default its type and its own rule accept, the proto comment's "Default X" is the table's, and the README's field
// reference is what the tables generate. Then the engine's behaviours: what it fills, what it leaves unset, and the
// messages of each kind of rule.
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/config/config.h"
#include "experiments/config/config_table.h"

namespace terse::experiments {
namespace {

namespace pb = google::protobuf;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The message a section's path names ("link.overrides[]" -> LinkOverride), or null.
const pb::Descriptor* sectionType(std::string_view path) {
  const pb::Descriptor* type = Experiment::descriptor();
  std::string p(path);
  for (std::size_t pos = 0; !p.empty() && pos <= p.size();) {
    std::size_t end = p.find('.', pos);
    if (end == std::string::npos) end = p.size();
    std::string name = p.substr(pos, end - pos);
    if (name.ends_with("[]")) name.resize(name.size() - 2);
    const auto* f = type->FindFieldByName(name);
    if (f == nullptr || f->message_type() == nullptr) return nullptr;
    type = f->message_type();
    pos = end + 1;
  }
  return type;
}

std::string joinPath(std::string_view section, std::string_view field) {
  return section.empty() ? std::string(field) : std::string(section) + "." + std::string(field);
}

// Every field a config can set, as the tables name it: "optimizer.lr", "worker_settings[].slowdown"; messages are
// walked into, except the study's structure (variants) whose overrides are Experiments again.
void schemaPaths(const pb::Descriptor* type, const std::string& prefix, std::set<std::string>& out) {
  for (int i = 0; i < type->field_count(); ++i) {
    const auto* f = type->field(i);
    const std::string path = prefix + f->name();
    if (f->message_type() != nullptr && !f->is_map() && path != "variants") {
      schemaPaths(f->message_type(), path + (f->is_repeated() ? "[]." : "."), out);
    } else {
      out.insert(path);
    }
  }
}

TEST(ConfigTable, TablesFitTheSchema) {
  const auto problems = table::checkTables(table::sections());
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

// The check above would pass on a checker that finds nothing: each kind of mistake an entry can make is caught,
// naming the section and the field.
TEST(ConfigTable, ABrokenTableIsCaughtNamingTheEntry) {
  using namespace table;
  static constexpr Field kBad[] = {
      {.name = "lr", .def = value("fast"), .rule = finite(above(0))},        // not a double
      {.name = "learning_rate", .def = value("0.1")},                        // no such field
      {.name = "schedule", .def = value("SOMETIMES"), .rule = enumValue()},  // no such enum value
      {.name = "momentum", .def = value("2"), .rule = upTo(0, 1)},           // refused by its own rule
      {.name = "nesterov", .def = value("false"), .rule = bandwidth()},      // a string rule on a bool
      {.name = "gamma", .def = value("0.1"), .rule = enumValue()},           // an enum rule on a double
      {.name = "milestones", .def = value("1")},                             // a list with a default
      {.name = "lr", .def = value("0.1")},                                   // listed twice
  };
  static constexpr Field kFine[] = {{.name = "batch_size", .def = value("32"), .rule = between(1, 64)}};
  static constexpr Section kBroken[] = {
      {.path = "optimizer", .fields = kBad},
      {.path = "optimizer.lr", .fields = kFine},     // not a message
      {.path = "worker_settings", .fields = kFine},  // repeated, without []
      {.path = "data[]", .fields = kFine},           // not repeated
  };
  const auto problems = checkTables(kBroken);
  const std::vector<std::string> expected = {
      "section 'optimizer' field 'lr': default 'fast' is not a double",
      "section 'optimizer' field 'learning_rate': no such field in terse.experiments.Optimizer",
      "section 'optimizer' field 'schedule': default 'SOMETIMES' is not a terse.experiments.Optimizer.Schedule",
      "section 'optimizer' field 'momentum': its own rule refuses the default: momentum must be in [0, 1), got 2",
      "section 'optimizer' field 'nesterov': the rule needs a (non-repeated) string",
      "section 'optimizer' field 'gamma': an enum rule needs an enum",
      "section 'optimizer' field 'milestones': a list takes no default here",
      "section 'optimizer' field 'lr': listed twice",
      "section 'optimizer.lr': 'lr' is not a message field of terse.experiments.Optimizer",
      "section 'worker_settings': 'worker_settings' is not a message field of terse.experiments.Experiment",
      "section 'data[]': 'data' is not a repeated message field of terse.experiments.Experiment",
  };
  EXPECT_EQ(problems, expected);
}

// Every scalar (and list, and map) of the schema is an entry or explicitly not in a table; every entry is a field.
TEST(ConfigTable, EveryFieldOfTheSchemaHasAnEntry) {
  std::set<std::string> schema;
  schemaPaths(Experiment::descriptor(), "", schema);
  std::set<std::string> tabled;
  for (const auto& s : table::sections()) {
    ASSERT_NE(sectionType(s.path), nullptr) << s.path;
    for (const auto& f : s.fields) EXPECT_TRUE(tabled.insert(joinPath(s.path, f.name)).second) << s.path << f.name;
  }
  for (auto p : table::notInTables()) EXPECT_TRUE(tabled.insert(std::string(p)).second) << p;
  for (const auto& p : schema)
    EXPECT_TRUE(tabled.contains(p)) << p << " has no entry in experiments/config/config_fields.cc (nor in "
                                    << "kNotInTables)";
  for (const auto& p : tabled) EXPECT_TRUE(schema.contains(p)) << p << " is in a table but not a field of the schema";
  EXPECT_GT(schema.size(), 90u);
  std::set<std::string_view> names;
  for (const auto& r : table::rules()) {
    EXPECT_TRUE(names.insert(r.name).second) << "rule " << r.name << " listed twice";
    EXPECT_NE(r.check, nullptr) << r.name;
  }
}

// What the comment says after "Default" (or "Defaults", "Default:"): its first word, without the punctuation and
// quotes around it. Empty when the comment states no default.
std::string statedDefault(const std::string& comment) {
  for (std::size_t pos = comment.find("Default"); pos != std::string::npos; pos = comment.find("Default", pos + 1)) {
    if (pos > 0 && !std::isspace(static_cast<unsigned char>(comment[pos - 1])) && comment[pos - 1] != '(') continue;
    std::size_t at = pos + 7;
    if (at < comment.size() && comment[at] == 's') ++at;
    if (at < comment.size() && comment[at] == ':') ++at;
    if (at >= comment.size() || !std::isspace(static_cast<unsigned char>(comment[at]))) continue;
    std::istringstream words(comment.substr(at));
    std::string word;
    words >> word;
    while (!word.empty() && std::string_view(".;,:)").find(word.back()) != std::string_view::npos) word.pop_back();
    if (word.size() >= 2 && word.front() == '"' && word.back() == '"') word = word.substr(1, word.size() - 2);
    return word;
  }
  return {};
}

// Numbers compare as numbers (1e11 and 100000000000 are one default).
bool sameValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}

TEST(ConfigTable, StatedDefaultReadsTheCommentsWords) {
  EXPECT_EQ(statedDefault(" Data-parallel workers. Default 1; must be in [1, 1024].\n"), "1");
  EXPECT_EQ(statedDefault(" How long. Default \"60s\"; \"0s\" turns it off.\n"), "60s");
  EXPECT_EQ(statedDefault(" Fills the fields.\n Default: none.\n"), "none");
  EXPECT_EQ(statedDefault(" The weighting. Defaults 100 (> 0) and 0.75.\n"), "100");
  EXPECT_EQ(statedDefault(" Where. Default \"\" = $XDG_CACHE_HOME/terse.\n"), "");
  EXPECT_EQ(statedDefault(" Directory. Default /usr/share/datasets/fashion-mnist.\n"),
            "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(statedDefault(" Evaluate at the end. Default\n true. At least one.\n"), "true");
  EXPECT_EQ(statedDefault(" Nothing said here (the default is elsewhere).\n"), "");
  EXPECT_FALSE(sameValue("0.1", "0.01"));
  EXPECT_TRUE(sameValue("1e11", "100000000000"));
}

// experiment.proto's comments, as protoc attaches them to the fields: the build runs
// `protoc --include_source_info --descriptor_set_out` on the checked-in file (tests/config/CMakeLists.txt). Reading
// protoc's own attachment, rather than parsing the .proto here, puts each comment on the field protoc puts it on; the
// descriptors compiled into the library carry no comments.
TEST(ConfigTable, ProtoCommentDefaultsAreTheTables) {
  pb::FileDescriptorSet set;
  {
    std::ifstream in(TERSE_TEST_PROTO_DESCRIPTORS, std::ios::binary);
    ASSERT_TRUE(in) << TERSE_TEST_PROTO_DESCRIPTORS;
    ASSERT_TRUE(set.ParseFromIstream(&in));
  }
  const pb::FileDescriptorProto* file = nullptr;
  for (const auto& f : set.file())
    if (f.name().ends_with("experiment.proto")) file = &f;
  ASSERT_NE(file, nullptr);
  // message name -> field name -> leading comment. Location paths: 4 = message_type, 2 = field.
  std::map<std::string, std::map<std::string, std::string>> comments;
  for (const auto& loc : file->source_code_info().location()) {
    if (loc.path_size() != 4 || loc.path(0) != 4 || loc.path(2) != 2) continue;
    const auto& message = file->message_type(loc.path(1));
    comments[message.name()][message.field(loc.path(3)).name()] = loc.leading_comments();
  }
  ASSERT_GT(comments["Experiment"].size(), 10u);

  int compared = 0;
  auto compare = [&](const std::string& where, const std::string& comment, const table::Field& entry) {
    const std::string stated = statedDefault(comment);
    if (stated.empty()) return;
    ++compared;
    std::string ours(entry.def.text);
    if (entry.def.kind == table::Default::Kind::kNone || entry.def.kind == table::Default::Kind::kComputed) {
      ours = statedDefault("Default " + ours);  // the words' first, as the comment's
    }
    EXPECT_TRUE(sameValue(stated, ours)) << where << ": experiment.proto says Default " << stated
                                         << ", the table (experiments/config/config_fields.cc) says " << ours;
  };
  for (const auto& s : table::sections()) {
    const pb::Descriptor* type = sectionType(s.path);
    for (const auto& f : s.fields) compare(joinPath(s.path, f.name), comments[type->name()][std::string(f.name)], f);
  }
  // A plugin's Default is stated on the Experiment field that holds the PluginSpec: its name's default.
  for (const std::string plugin : {"compressor", "scheduler"}) {
    for (const auto& s : table::sections())
      if (s.path == plugin) compare(plugin, comments["Experiment"][plugin], s.fields[0]);
  }
  EXPECT_GT(compared, 60);
}

// experiments/configs/README.md's field reference is the tables' (`terse config reference --write` regenerates it).
TEST(ConfigTable, ReadmeReferenceIsGenerated) {
  const std::string path = std::string(TERSE_TEST_SOURCE_DIR) + "/experiments/configs/README.md";
  const std::string readme = readFile(path);
  const std::string expected = withConfigReference(readme, path);
  EXPECT_TRUE(readme == expected)
      << path << " has a stale field reference: run `terse config reference --write experiments/configs/README.md` "
      << "from the source tree and commit the result";
  EXPECT_NE(
      readme.find(
          "| `batch_size` | 32, or global_batch_size / (workers x gradient_accumulation_steps) | in [1, 65536] |"),
      std::string::npos);
  EXPECT_THROW(withConfigReference("# no markers\n", "x.md"), InvalidArgument);
}

Experiment parsed(const std::string& text) {
  return parseConfigText(text, "t.textproto");
}

// Defaults fill what is unset and only that; "left unset" defaults and sections without value defaults stay absent.
TEST(ConfigTable, FillsUnsetFieldsOnly) {
  Experiment e = parsed(
      "study: \"s\" workload { name: \"mlp\" } optimizer { lr: 0.5 } seeds: [7, 8] "
      "link { latency: \"5ms\" overrides { src: 0 dst: 1 bandwidth: \"1Gbps\" } }");
  applyDefaults(e);
  EXPECT_DOUBLE_EQ(e.optimizer().lr(), 0.5);
  EXPECT_DOUBLE_EQ(e.optimizer().gamma(), 0.1);
  EXPECT_EQ(e.seed(), 7u) << "computed: the first of seeds";
  EXPECT_EQ(e.link().overrides(0).bandwidth(), "1Gbps");
  EXPECT_EQ(e.link().overrides(0).latency(), "5ms") << "computed: the link's";
  EXPECT_EQ(e.simulation().flops_per_second(), 1e11);
  EXPECT_FALSE(e.has_trace());
  EXPECT_FALSE(e.optimizer().has_clip_grad_norm());
  EXPECT_FALSE(e.has_max_groups_in_flight());
  EXPECT_FALSE(e.has_gradient_accumulation_steps());
  EXPECT_FALSE(e.simulation().has_topology());
  EXPECT_FALSE(e.collectives().has_ranks_per_node());
  EXPECT_FALSE(e.workload().has_glove());
  Experiment again = e;
  applyDefaults(again);
  EXPECT_EQ(again.SerializeAsString(), e.SerializeAsString()) << "filling twice changes nothing";

  Experiment synthetic =
      parsed("study: \"s\" workload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" data: SYNTHETIC } }");
  applyDefaults(synthetic);
  EXPECT_EQ(synthetic.workload().pytorch().synthetic_examples(), 4096);
  EXPECT_EQ(synthetic.workload().pytorch().image_size(), 32);
}

std::vector<std::string> check(const std::string& text) {
  Experiment e = parsed(text);
  applyDefaults(e);
  Checks c;
  table::checkFields(c, e);
  return c.take();
}

// Each kind of rule names the field, the value and what is allowed.
TEST(ConfigTable, RuleMessagesNameFieldValueAndRange) {
  const std::string base = "study: \"s\" workload { name: \"mlp\" } ";
  EXPECT_EQ(check(base + "workers: 0"),
            std::vector<std::string>{"workers must be in [1, 1024], got 0 (the most `terse launch -n` starts and the "
                                     "simulator is studied at)"});
  EXPECT_EQ(check(base + "optimizer { lr: inf }"),
            std::vector<std::string>{"optimizer.lr must be finite and > 0, got inf"});
  EXPECT_EQ(check(base + "optimizer { lr: -0.1 }"), std::vector<std::string>{"optimizer.lr must be > 0, got -0.1"});
  EXPECT_EQ(check(base + "optimizer { momentum: nan }"),
            std::vector<std::string>{"optimizer.momentum must be in [0, 1), got nan"});
  EXPECT_EQ(check(base + "data { train_subset: -1 }"),
            std::vector<std::string>{"data.train_subset must be >= 0, got -1 (0 = all)"});
  EXPECT_EQ(check(base + "clock: CLOCK_UNSPECIFIED"), std::vector<std::string>{"clock must be REAL_TIME or SIMULATED"});
  EXPECT_EQ(check(base + "clock: 7"), std::vector<std::string>{"clock must be REAL_TIME or SIMULATED"})
      << "an enum number without a name is not a clock";
  EXPECT_EQ(check(base + "output_dir: \"\""), std::vector<std::string>{"output_dir must be set"});
  EXPECT_EQ(check(base + "variant: \"..\""),
            std::vector<std::string>{"variant must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got '..'"});
  EXPECT_EQ(check("study: \"s\" workload { name: \"mlp\" hidden_sizes: [8, 0] }"),
            std::vector<std::string>{"workload.hidden_sizes[1] must be in [1, 65536], got 0"});
  EXPECT_EQ(check(base + "worker_settings { worker: 0 slowdown: 0.5 } worker_settings { worker: 1 slowdown: inf }"),
            (std::vector<std::string>{"worker_settings[0].slowdown must be in [1, 1000], got 0.5",
                                      "worker_settings[1].slowdown must be in [1, 1000], got inf"}));
  EXPECT_EQ(check(base + "tcp { bind_address: \"a b\" }"),
            std::vector<std::string>{"tcp.bind_address 'a b' is not a host name or address"});
  // Conditional entries: gamma only with STEP, dropout only for the cnn, glove's fields only for glove, topology's
  // only when there is one (and then only those set).
  EXPECT_TRUE(check(base + "optimizer { gamma: 5 }").empty());
  EXPECT_EQ(check(base + "optimizer { gamma: 5 schedule: STEP milestones: 1 }"),
            std::vector<std::string>{"optimizer.gamma must be in (0, 1], got 5"});
  EXPECT_TRUE(check("study: \"s\" workload { name: \"mlp\" glove { dim: 0 } }").empty())
      << "the glove-only rule reports it";
  EXPECT_EQ(check("study: \"s\" workload { name: \"glove\" glove { dim: 0 } }"),
            std::vector<std::string>{"workload.glove.dim must be in [1, 4096], got 0"});
  EXPECT_EQ(check(base + "simulation { topology { nics_per_node: 100 } }"),
            std::vector<std::string>{"simulation.topology.nics_per_node must be at most 64, got 100"});
  EXPECT_EQ(check("study: \"s\" workload { name: \"pytorch\" pytorch { module: \"m.py\" device: \"tpu\" } }"),
            std::vector<std::string>{"workload.pytorch.device must be \"cpu\" or \"cuda\", got 'tpu'"});
}

}  // namespace
}  // namespace terse::experiments

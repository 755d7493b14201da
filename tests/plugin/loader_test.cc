// The plugin loader: search order and shadowing, loading by name and by path, one test per load error (the error type
// and the words that name the file and the reason), the compressor adapter's checks, and discovery.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>
#include <array>
#include <cstring>
#include <fstream>
#include <span>
#include <vector>

#include "core/common/error.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "terse/compressor_v1.h"
#include "tests/plugin/loader_test_util.h"

namespace terse {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::fixtureCompressor;
using test::fixtureScheduler;
using test::kBuildPluginDir;
using test::kFixtureDir;
using test::kShadowDir;
using test::messageOf;

// A loader that searches exactly the fixture directory, so tests do not depend on the environment or the build tree.
PluginLoader fixtureLoader() {
  return PluginLoader::withSearchDirs({{kFixtureDir, "--plugin-path", true}});
}

std::string pathOf(const std::string& name) {
  return fixtureCompressor(name).string();
}

std::shared_ptr<Compressor> instantiateFixture(const std::string& name, const Params& params = {}) {
  return CompressorPlugin::open(fixtureCompressor(name))->instantiate(params);
}

TensorInfo f32Tensor(uint64_t numel) {
  TensorInfo info;
  info.dtype = DType::kF32;
  info.numel = numel;
  info.tensor_id = 7;
  return info;
}

// ---- Search directories

TEST(SearchDirs, SplitPathListSkipsEmptyEntries) {
  const auto dirs = PluginLoader::splitPathList(":a::b/c:");
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], fs::path("a"));
  EXPECT_EQ(dirs[1], fs::path("b/c"));
  EXPECT_TRUE(PluginLoader::splitPathList("").empty());
}

TEST(SearchDirs, PathArgumentsVersusNames) {
  EXPECT_TRUE(PluginLoader::isPathArgument("./topk"));
  EXPECT_TRUE(PluginLoader::isPathArgument("/abs/terse_compressor_topk.so"));
  EXPECT_TRUE(PluginLoader::isPathArgument("terse_compressor_topk.so"));
  EXPECT_TRUE(PluginLoader::isPathArgument("../etc/passwd"));
  EXPECT_FALSE(PluginLoader::isPathArgument("topk"));
  EXPECT_FALSE(PluginLoader::isPathArgument("Top-K"));
  EXPECT_EQ(PluginLoader::fileNameFor(PluginKind::kScheduler, "p3"), "terse_scheduler_p3.so");
}

// Folders of a test's own, made fresh under the build tree's tests/plugin/<name>/.
fs::path freshDirs(const std::string& name, std::initializer_list<const char*> subdirs) {
  const fs::path root = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "plugin" / name;
  fs::remove_all(root);
  for (const char* d : subdirs) fs::create_directories(root / d);
  return root;
}

TEST(SearchDirs, OrderIsPluginPathEnvInstallBuildTree) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", "/nonexistent/env1::/nonexistent/env2");
  const fs::path root = freshDirs("search_order", {"a", "b", "c"});
  PluginLoader loader(
      std::vector<std::string>{(root / "a").string() + ":" + (root / "b").string(), (root / "c").string()});
  const auto dirs = loader.searchDirs();
  ASSERT_GE(dirs.size(), 6u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {(root / "a").string(), "--plugin-path"},   {(root / "b").string(), "--plugin-path"},
      {(root / "c").string(), "--plugin-path"},   {"/nonexistent/env1", "TERSE_PLUGIN_PATH"},
      {"/nonexistent/env2", "TERSE_PLUGIN_PATH"},
  };
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(dirs[i].dir.string(), expected[i].first) << i;
    EXPECT_EQ(dirs[i].origin, expected[i].second) << i;
  }
  EXPECT_TRUE(dirs[0].exists);
  EXPECT_FALSE(dirs[3].exists);
  // This test is a file of the build tree, so the build tree comes last
  // (TheBuildTreeIsSearchedOnlyFromAFileOfTheBuildTree).
  EXPECT_TRUE(dirs.back().exists);
  EXPECT_EQ(dirs.back().dir, kBuildPluginDir);
  EXPECT_EQ(dirs.back().origin, "build tree");
  // The install dir is <dir of the running executable>/../<plugin subdir>, searched before the build tree. Executables
  // of the build tree live in <build>/bin, so there it is the build tree's plugin dir and is searched once, as the
  // build tree (the installed case: tests/install/out_of_tree.cmake).
  const fs::path subdir = kBuildPluginDir.lexically_relative(TERSE_TEST_BINARY_DIR);
  const fs::path install = (fs::read_symlink("/proc/self/exe").parent_path() / ".." / subdir).lexically_normal();
  if (fs::weakly_canonical(install) == fs::weakly_canonical(kBuildPluginDir)) {
    EXPECT_EQ(dirs.size(), 6u);
  } else {
    ASSERT_EQ(dirs.size(), 7u);
    EXPECT_EQ(dirs[5].origin, "install");
    EXPECT_EQ(dirs[5].dir, install);
  }
}

// An extension module (terse._terse) finds the plugins of the installation it belongs to from its own file, not from
// python3's executable: the nearest of its folder and 4 parents that holds the plugin subdirectory.
TEST(SearchDirs, InstallPluginDirOfAModuleIsTheNearestPrefixWithPlugins) {
  const fs::path root = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "plugin" / "install_dir_of";
  fs::remove_all(root);
  const fs::path subdir = "lib/terse/plugins";
  fs::create_directories(root);
  const fs::path prefix = fs::canonical(root) / "prefix";  // the answers are links resolved
  const fs::path package = prefix / "lib/python3.11/dist-packages/terse";
  fs::create_directories(package);
  const fs::path module = package / "_terse.cpython-311-x86_64-linux-gnu.so";
  std::ofstream(module).put('\0');
  EXPECT_EQ(PluginLoader::installPluginDirOf(module, subdir), std::nullopt);  // no plugin folder anywhere yet

  fs::create_directories(prefix / subdir);
  EXPECT_EQ(PluginLoader::installPluginDirOf(module, subdir), prefix / subdir);
  // Debian's layout for /usr, one level less deep; and a link to the module finds the module's installation.
  const fs::path usr_package = prefix / "lib/python3/dist-packages/terse";
  fs::create_directories(usr_package);
  EXPECT_EQ(PluginLoader::installPluginDirOf(usr_package / "_terse.so", subdir), prefix / subdir);
  const fs::path elsewhere = root / "elsewhere";
  fs::create_directories(elsewhere);
  fs::create_symlink(module, elsewhere / "_terse.so");
  EXPECT_EQ(PluginLoader::installPluginDirOf(elsewhere / "_terse.so", subdir), prefix / subdir);

  // The nearest wins: a plugin folder of a tree inside the prefix comes before the prefix's own.
  fs::create_directories(prefix / "lib/python3.11" / subdir);
  EXPECT_EQ(PluginLoader::installPluginDirOf(module, subdir), prefix / "lib/python3.11" / subdir);
  fs::remove_all(prefix / "lib/python3.11" / subdir);

  // Never further up than a package's depth below its prefix: an installation above it is not this module's.
  const fs::path deep = prefix / "lib/python3.11/dist-packages/terse/sub/deeper";
  fs::create_directories(deep);
  EXPECT_EQ(PluginLoader::installPluginDirOf(deep / "_terse.so", subdir), std::nullopt);
  fs::remove_all(root);
}

// The build tree's plugins are searched by a file of the build tree only: an installed terse (or Python package) never
// searches the tree it was built in, even when installed into a prefix inside it.
TEST(SearchDirs, TheBuildTreeIsSearchedOnlyFromAFileOfTheBuildTree) {
  const fs::path subdir = "lib/terse/plugins";
  const fs::path root = fs::canonical(freshDirs(
      "build_tree_of", {"build/lib/terse/plugins", "build/bin", "build/python/terse", "build/a/b/c/d/e",
                        "build/tests/install/work/prefix/bin", "build/tests/install/work/prefix/lib/terse/plugins",
                        "build-old/bin", "prefix/bin", "elsewhere"}));
  const fs::path build = root / "build";
  auto file = [](const fs::path& p) {
    std::ofstream(p).put('\0');
    return p;
  };
  // The build tree's own: its executables, its Python extension, a file too deep to reach a plugin folder, a link.
  EXPECT_TRUE(PluginLoader::belongsToBuildTree(file(build / "bin/terse"), build, subdir));
  EXPECT_TRUE(PluginLoader::belongsToBuildTree(file(build / "python/terse/_terse.so"), build, subdir));
  EXPECT_TRUE(PluginLoader::belongsToBuildTree(file(build / "a/b/c/d/e/probe"), build, subdir));
  fs::create_symlink(build / "bin/terse", root / "elsewhere/terse");
  EXPECT_TRUE(PluginLoader::belongsToBuildTree(root / "elsewhere/terse", build, subdir));
  // Not the build tree's: an installation inside it, one outside, a sibling folder whose name starts alike.
  EXPECT_FALSE(PluginLoader::belongsToBuildTree(file(build / "tests/install/work/prefix/bin/terse"), build, subdir));
  EXPECT_FALSE(PluginLoader::belongsToBuildTree(file(root / "prefix/bin/terse"), build, subdir));
  EXPECT_FALSE(PluginLoader::belongsToBuildTree(file(root / "build-old/bin/terse"), build, subdir));
  fs::remove_all(root);
}

// A pip-installed package keeps its plugins beside its extension (terse/plugins): found from the extension's own file,
// through a link too, and only where that folder exists.
TEST(SearchDirs, PackagePluginDirIsThePluginsFolderBesideTheExtension) {
  const fs::path root = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "plugin" / "package_dir_of";
  fs::remove_all(root);
  const fs::path package = fs::weakly_canonical(fs::path(TERSE_TEST_BINARY_DIR)) / "tests" / "plugin" /
                           "package_dir_of" / "venv/lib/python3.11/site-packages/terse";
  fs::create_directories(package);
  const fs::path module = package / "_terse.cpython-311-x86_64-linux-gnu.so";
  std::ofstream(module).put('\0');
  EXPECT_EQ(PluginLoader::packagePluginDirOf(module), std::nullopt);  // the build tree's package has none
  fs::create_directories(package / "plugins");
  EXPECT_EQ(PluginLoader::packagePluginDirOf(module), package / "plugins");
  const fs::path elsewhere = root / "elsewhere";
  fs::create_directories(elsewhere);
  fs::create_symlink(module, elsewhere / "_terse.so");
  EXPECT_EQ(PluginLoader::packagePluginDirOf(elsewhere / "_terse.so"), package / "plugins");
  fs::remove_all(root);
}

TEST(SearchDirs, ADirectoryListedTwiceIsSearchedOnceAtItsFirstPlace) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", kBuildPluginDir.string());
  PluginLoader loader(std::vector<fs::path>{kBuildPluginDir, kBuildPluginDir / "."});
  const auto dirs = loader.searchDirs();
  int seen = 0;
  for (const auto& d : dirs) {
    if (fs::weakly_canonical(d.dir) == fs::weakly_canonical(kBuildPluginDir)) {
      ++seen;
      EXPECT_EQ(d.origin, "--plugin-path");
    }
  }
  EXPECT_EQ(seen, 1);
}

// ---- Loading by name: --plugin-path, TERSE_PLUGIN_PATH, shadowing

TEST(LoadByName, FromPluginPath) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", std::nullopt);
  PluginLoader loader(std::vector<std::string>{kFixtureDir.string()});
  auto plugin = loader.loadCompressor("good_c");
  const PluginInfo& info = plugin->info();
  EXPECT_EQ(info.kind, PluginKind::kCompressor);
  EXPECT_EQ(info.name, "good_c");
  EXPECT_EQ(info.version, "1.0.0");
  EXPECT_EQ(info.abi_version, 1u);
  EXPECT_EQ(info.origin, "--plugin-path");
  EXPECT_EQ(info.path, fs::canonical(fixtureCompressor("good_c")));
  EXPECT_FALSE(info.description.empty());
  EXPECT_TRUE(info.shadowed.empty());
}

// ---- Resolved parameters (terse/resolved_params_v1.h, optional): SDK plugins report theirs, defaults included;
// a plugin written before the entry point existed (good_c and fake_sched, plain C) loads, runs and reports nothing.

TEST(ResolvedParams, SdkPluginsReportTheirDefaults) {
  PluginLoader loader(std::vector<std::string>{TERSE_TEST_PLUGIN_DIR});
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  EXPECT_EQ(lossy->resolvedParams(), (Params{{"step", "0.5"}}));
  auto given = loader.loadCompressor("test_lossy")->instantiate({{"step", "0.25"}});
  EXPECT_EQ(given->resolvedParams(), (Params{{"step", "0.25"}}));
  auto fifo = loader.loadScheduler("test_fifo")->instantiate({{"credit_bytes", "64"}});
  const auto resolved = fifo->resolvedParams();
  ASSERT_TRUE(resolved);
  EXPECT_EQ(*resolved, (Params{{"chunk_numel", "0"}, {"credit_bytes", "64"}}));
}

TEST(ResolvedParams, PluginsWithoutTheEntryPointStillLoadAndReportNothing) {
  auto loader = fixtureLoader();
  auto good = loader.loadCompressor("good_c")->instantiate({});
  EXPECT_EQ(good->resolvedParams(), std::nullopt);
  EXPECT_EQ(good->caps(DType::kF32).num_rounds, 1);
  auto sched = loader.loadScheduler("fake_sched")->instantiate({});
  EXPECT_EQ(sched->resolvedParams(), std::nullopt);
}

// ---- Build info (terse/build_info_v1.h, optional): SDK plugins say whether they were compiled with optimisation, so
// `terse plugins show` can name one built at -O0; plugins in C (good_c, fake_sched) say nothing and load as before.

TEST(BuildInfo, SdkPluginsSayWhetherTheyWereOptimised) {
  const auto unoptimised = CompressorPlugin::open(TERSE_TEST_UNOPTIMISED_PLUGIN);
  EXPECT_EQ(unoptimised->info().name, "test_lossy");
  EXPECT_EQ(unoptimised->info().optimized, std::optional<bool>(false));
  PluginLoader loader(std::vector<std::string>{TERSE_TEST_PLUGIN_DIR});
  // The test plugins are built with the build type's flags, as the built-ins are.
  const std::optional<bool> expected(TERSE_TEST_BUILTINS_OPTIMISED != 0);
  EXPECT_EQ(loader.loadCompressor("test_lossy")->info().optimized, expected);
  EXPECT_EQ(loader.loadScheduler("test_fifo")->info().optimized, expected);
}

TEST(BuildInfo, PluginsWithoutItLoadAndSayNothing) {
  auto loader = fixtureLoader();
  EXPECT_EQ(loader.loadCompressor("good_c")->info().optimized, std::nullopt);
  EXPECT_EQ(loader.loadScheduler("fake_sched")->info().optimized, std::nullopt);
}

TEST(BuildInfo, TooSmallIsUnknownAndTheFlagsAreNotRead) {
  test::LogCapture log;
  auto plugin = fixtureLoader().loadCompressor("bad_build_info");
  // Its flags say optimised, beyond the 4 bytes it declares.
  EXPECT_EQ(plugin->info().optimized, std::nullopt);
  EXPECT_TRUE(contains(log.text(), {"warn", "terse_compressor_bad_build_info.so", "terse_compressor_build_info_v1",
                                    "struct_size 4", "unknown"}));
  EXPECT_EQ(plugin->instantiate({})->caps(DType::kF32).num_rounds, 1);
}

// terse/phases_v1.h: an instance's phases are the plugin's answer, checked. dgc reports its warm-up's stage starts and
// end; a plugin without the entry point, or without a warm-up, has one phase; a repeated step is refused at
// instantiation, naming the plugin and the step.
TEST(Phases, AnInstanceHasThePluginsCheckedSteps) {
  PluginLoader built = PluginLoader::withSearchDirs({{kBuildPluginDir, "build tree", true}});
  const auto dgc = built.loadCompressor("dgc");
  const auto ramp = dgc->instantiate({{"warmup_steps", "10"}, {"warmup_stages", "4"}});
  const std::span<const uint64_t> steps = ramp->phaseSteps();
  EXPECT_EQ(std::vector<uint64_t>(steps.begin(), steps.end()), (std::vector<uint64_t>{3, 5, 8, 10}));
  EXPECT_TRUE(dgc->instantiate({})->phaseSteps().empty());
  EXPECT_TRUE(fixtureLoader().loadCompressor("good_c")->instantiate({})->phaseSteps().empty());

  const auto bad = fixtureLoader().loadCompressor("bad_phases");
  for (const auto& [mode, needle] : std::vector<std::pair<std::string, std::string>>{
           {"repeat", "phases: step 5 at position 1: the steps must be above 0 and strictly increasing"},
           {"zero", "phases: step 0 at position 0: the steps must be above 0 and strictly increasing"},
           {"many", "phases: 65 phase steps, at most 64"},
           {"null", "phases: 3 phase steps at a NULL array"},
           {"status", "phases failed [plugin error]"}}) {
    test::ScopedEnv env("TERSE_TEST_BAD_PHASES", mode);
    try {
      bad->instantiate({});
      ADD_FAILURE() << mode << ": accepted";
    } catch (const PluginError& e) {
      EXPECT_TRUE(contains(e.what(), {"bad_phases", needle})) << mode << ": " << e.what();
    }
  }
}

TEST(LoadByName, FromTersePluginPathEnvironment) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", "/nonexistent/dir:" + kFixtureDir.string());
  PluginLoader loader;
  auto plugin = loader.loadCompressor("good_c");
  EXPECT_EQ(plugin->info().origin, "TERSE_PLUGIN_PATH");
}

TEST(LoadByName, NotFoundOnceTheEnvironmentIsUnset) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", std::nullopt);
  PluginLoader loader;
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("good_c"); });
  EXPECT_TRUE(contains(m, {"compressor 'good_c' not found", "terse_compressor_good_c.so", "(build tree)"}));
}

TEST(LoadByName, PluginPathWinsOverEnvironmentAndShadowsIt) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", kShadowDir.string());
  test::LogCapture log;
  PluginLoader loader(std::vector<std::string>{kFixtureDir.string()});
  auto plugin = loader.loadCompressor("good_dup");
  EXPECT_EQ(plugin->info().path, fs::canonical(kFixtureDir / "terse_compressor_good_dup.so"));
  EXPECT_EQ(plugin->info().origin, "--plugin-path");
  ASSERT_EQ(plugin->info().shadowed.size(), 1u);
  EXPECT_EQ(plugin->info().shadowed[0], kShadowDir / "terse_compressor_good_dup.so");
  // Shadowing is never silent.
  EXPECT_TRUE(contains(log.text(), {"warn", "good_dup", "shadows", kShadowDir.string(), "TERSE_PLUGIN_PATH"}));
}

TEST(LoadByName, FirstMatchInSearchOrderWins) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", std::nullopt);
  PluginLoader loader(std::vector<std::string>{kShadowDir.string() + ":" + kFixtureDir.string()});
  const PluginLocation loc = loader.locate(PluginKind::kCompressor, "good_dup");
  EXPECT_EQ(loc.path, kShadowDir / "terse_compressor_good_dup.so");
  ASSERT_EQ(loc.shadowed.size(), 1u);
  EXPECT_EQ(loc.shadowed[0].first, kFixtureDir / "terse_compressor_good_dup.so");
  EXPECT_EQ(loc.shadowed[0].second, "--plugin-path");
  EXPECT_EQ(loader.loadCompressor("good_dup")->info().path, fs::canonical(loc.path));
}

// The build tree holds what terse ships; the test plugins live apart and are found through a search directory.
TEST(LoadByName, TestPluginsLiveApartFromTheBuiltIns) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", std::nullopt);
  PluginLoader loader;
  EXPECT_EQ(loader.loadScheduler("fifo")->info().origin, "build tree");
  for (const auto& e : loader.discover()) EXPECT_FALSE(e.name.starts_with("test_")) << e.path;
  EXPECT_THROW(loader.loadCompressor("test_lossy"), PluginError);
  PluginLoader with_tests(std::vector<std::string>{TERSE_TEST_PLUGIN_DIR});
  auto fifo = with_tests.loadScheduler("test_fifo");
  EXPECT_EQ(fifo->info().origin, "--plugin-path");
  EXPECT_EQ(fifo->info().kind, PluginKind::kScheduler);
  auto lossy = with_tests.loadCompressor("test_lossy");
  EXPECT_EQ(lossy->info().path.parent_path(), fs::canonical(TERSE_TEST_PLUGIN_DIR));
}

// ---- Load errors: each names the file and the reason

TEST(LoadErrors, NotFoundListsEveryDirectorySearchedAndWhichExist) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", "/nonexistent/env");
  PluginLoader loader(std::vector<std::string>{kFixtureDir.string()});
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("nope"); });
  EXPECT_TRUE(contains(
      m, {"compressor 'nope' not found", "terse_compressor_nope.so", kFixtureDir.string() + " (--plugin-path)",
          "/nonexistent/env (TERSE_PLUGIN_PATH, does not exist)", kBuildPluginDir.string() + " (build tree)"}));
  const std::string s = messageOf<PluginError>([&] { loader.loadScheduler("nope"); });
  EXPECT_TRUE(contains(s, {"scheduler 'nope' not found", "terse_scheduler_nope.so"}));
}

// The message says how to add a directory in the caller's own terms (the CLI's flag by default, the Python keyword when
// the extension says so) and lists the names the directories hold.
TEST(LoadErrors, NotFoundNamesTheCallersWayToAddADirectoryAndWhatIsThere) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", "");
  PluginLoader cli(std::vector<std::string>{kFixtureDir.string()});
  const std::string m = messageOf<PluginError>([&] { cli.loadCompressor("nope"); });
  EXPECT_TRUE(contains(m, {"add a directory with --plugin-path or TERSE_PLUGIN_PATH", "the compressors there: ", "topk",
                           kFixtureDir.string() + " (--plugin-path)"}))
      << m;
  PluginLoader python(std::vector<std::string>{kFixtureDir.string()}, "plugin_path=");
  const std::string p = messageOf<PluginError>([&] { python.loadCompressor("nope"); });
  EXPECT_TRUE(
      contains(p, {"add a directory with plugin_path= or TERSE_PLUGIN_PATH", kFixtureDir.string() + " (plugin_path=)"}))
      << p;
  EXPECT_EQ(p.find("--plugin-path"), std::string::npos) << p;
  const std::string s = messageOf<PluginError>([&] { python.loadScheduler("nope"); });
  EXPECT_TRUE(contains(s, {"the schedulers there: ", "fifo"})) << s;
}

// A folder the caller names that is not one is refused at once, naming it and how it was given: a misspelt
// --plugin-path would otherwise show up only as a plugin "not found" later, or never, when a folder further on holds
// one of the same name.
TEST(LoadErrors, ACallersPluginPathThatIsNotAFolderIsRefused) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", std::nullopt);
  std::string m = messageOf<InvalidArgument>(
      [&] { PluginLoader(std::vector<std::string>{kFixtureDir.string() + ":/nonexistent/terse"}); });
  EXPECT_TRUE(contains(m, {"plugin folder '/nonexistent/terse' (from --plugin-path) does not exist: give a folder that "
                           "holds terse_compressor_<name>.so or terse_scheduler_<name>.so files"}))
      << m;
  // The Python package's keyword, a relative entry (with where it was looked for), and directories given as paths.
  m = messageOf<InvalidArgument>([&] { PluginLoader(std::vector<std::string>{"no/such/plugins"}, "plugin_path="); });
  EXPECT_TRUE(contains(m, {"plugin folder 'no/such/plugins' (from plugin_path=, looked for as " +
                           (fs::current_path() / "no/such/plugins").string() + ") does not exist"}))
      << m;
  m = messageOf<InvalidArgument>([&] { PluginLoader(std::vector<fs::path>{"/nonexistent/a:b"}); });
  EXPECT_TRUE(contains(m, {"plugin folder '/nonexistent/a:b' (from --plugin-path) does not exist"})) << m;
}

// A plugin's own file given as a plugin path is not a missing folder: the message says what it is and what to give.
// From the caller it is refused; on TERSE_PLUGIN_PATH it is a warning, and a load error says it again.
TEST(LoadErrors, APluginPathThatIsAFileIsNamedSo) {
  const fs::path file = kFixtureDir / PluginLoader::fileNameFor(PluginKind::kCompressor, "good_c");
  ASSERT_TRUE(fs::is_regular_file(file)) << file;
  {
    test::ScopedEnv env("TERSE_PLUGIN_PATH", "");
    const std::string m = messageOf<InvalidArgument>([&] { PluginLoader(std::vector<std::string>{file.string()}); });
    EXPECT_TRUE(contains(m, {"plugin folder '" + file.string() +
                             "' (from --plugin-path) is a file, not a folder: give the plugin's file as its name, or "
                             "its folder here"}))
        << m;
  }
  test::ScopedEnv env("TERSE_PLUGIN_PATH", file.string());
  test::LogCapture log;
  PluginLoader loader;
  EXPECT_TRUE(contains(log.text(), {"warn", "TERSE_PLUGIN_PATH: '" + file.string() + "' is a file, not a folder"}))
      << log.text();
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("good_c"); });
  EXPECT_TRUE(
      contains(m, {file.string() + " (TERSE_PLUGIN_PATH, a file, not a folder: give the plugin's file as its name"}))
      << m;
}

// A stale TERSE_PLUGIN_PATH entry does not stop anything (environments carry them), but it is not silent either.
TEST(LoadByName, AStaleEnvironmentEntryIsAWarning) {
  test::ScopedEnv env("TERSE_PLUGIN_PATH", "/nonexistent/env:" + kFixtureDir.string());
  test::LogCapture log;
  PluginLoader loader;
  EXPECT_EQ(loader.loadCompressor("good_c")->info().origin, "TERSE_PLUGIN_PATH");
  EXPECT_TRUE(contains(log.text(), {"warn",
                                    "TERSE_PLUGIN_PATH: '/nonexistent/env' does not exist, so no plugin is "
                                    "found there; remove it from TERSE_PLUGIN_PATH if it is stale"}))
      << log.text();
  EXPECT_EQ(log.text().find(kFixtureDir.string() + "' "), std::string::npos) << log.text();
}

TEST(LoadErrors, InvalidNameIsRejectedBeforeAnySearch) {
  auto loader = fixtureLoader();
  for (const char* bad : {"Top-K", "top k", "", "ünï", "topk;rm"}) {
    const std::string m = messageOf<PluginError>([&] { loader.loadCompressor(bad); });
    EXPECT_TRUE(contains(m, {"is not valid", "[a-z0-9_]+"})) << bad;
  }
}

TEST(LoadErrors, PathThatDoesNotExist) {
  auto loader = fixtureLoader();
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("../no/such/terse_compressor_x.so"); });
  EXPECT_TRUE(contains(m, {"cannot load compressor plugin", "terse_compressor_x.so", "no such file"}));
}

TEST(LoadErrors, DlopenFailureCarriesDlerror) {
  const fs::path dir = fs::temp_directory_path() / ("terse_loader_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "terse_compressor_garbage.so";
  std::ofstream(file) << "this is not an ELF file\n";
  auto loader = PluginLoader::withSearchDirs({{dir, "--plugin-path", true}});
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("garbage"); });
  EXPECT_TRUE(contains(m, {"cannot load compressor plugin", file.string(), "dlopen failed:"}));
  fs::remove_all(dir);
}

TEST(LoadErrors, NoTerseSymbol) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_nosymbol")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_nosymbol.so", "not a terse compressor plugin",
                           "no terse_compressor_plugin_v1 symbol"}));
}

TEST(LoadErrors, BuiltForANewerAbi) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_future")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_future.so", "built for compressor ABI v2", "this terse supports v1"}));
}

TEST(LoadErrors, SchedulerLoadedAsCompressorAndViceVersa) {
  auto loader = fixtureLoader();
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor(fixtureScheduler("fake_sched").string()); });
  EXPECT_TRUE(contains(m, {"terse_scheduler_fake_sched.so", "not a compressor plugin",
                           "exports terse_scheduler_plugin_v1", "it is a scheduler plugin"}));
  const std::string s = messageOf<PluginError>([&] { loader.loadScheduler(pathOf("good_c")); });
  EXPECT_TRUE(contains(s, {"terse_compressor_good_c.so", "not a scheduler plugin", "it is a compressor plugin"}));
}

TEST(LoadErrors, AbiVersionFieldDisagreesWithSymbol) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_abi")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_abi.so", "abi_version field is 7", "terse_compressor_plugin_v1"}));
}

TEST(LoadErrors, StructTooSmall) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_small")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_small.so",
                           "struct too small: 40 bytes, v1 needs " + std::to_string(sizeof(terse_compressor_v1))}));
}

TEST(LoadErrors, NullRequiredFunctionPointer) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_nullfn")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_nullfn.so", "required function pointer 'compress' is NULL"}));
}

TEST(LoadErrors, NullString) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_nullstr")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_nullstr.so", "field 'description' is NULL"}));
}

TEST(LoadErrors, DeclaredNameNotValid) {
  const std::string m = messageOf<PluginError>([] { fixtureLoader().loadCompressor(pathOf("bad_badname")); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_badname.so", "declared name 'Bad-Name'", "[a-z0-9_]+"}));
}

TEST(LoadErrors, FileNameDoesNotMatchDeclaredNameWhenLoadedByName) {
  auto loader = fixtureLoader();
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor("bad_name"); });
  EXPECT_TRUE(contains(m, {"terse_compressor_bad_name.so", "declares the name 'other'", "loaded by the name 'bad_name'",
                           "terse_compressor_other.so"}));
  // By path the file name is not a promise: it loads (with a warning) under its declared name.
  test::LogCapture log;
  auto plugin = loader.loadCompressor(pathOf("bad_name"));
  EXPECT_EQ(plugin->info().name, "other");
  EXPECT_TRUE(contains(log.text(), {"does not match the declared name"}));
  // ... and the cached plugin is not a way around the check.
  const std::string again = messageOf<PluginError>([&] { loader.loadCompressor("bad_name"); });
  EXPECT_TRUE(contains(again, {"declares the name 'other'"}));
}

TEST(LoadErrors, TwoPluginsWithOneName) {
  auto loader = fixtureLoader();
  auto first = loader.loadCompressor("good_dup");
  const fs::path second = kShadowDir / "terse_compressor_good_dup.so";
  const std::string m = messageOf<PluginError>([&] { loader.loadCompressor(second.string()); });
  EXPECT_TRUE(contains(m, {"two plugins with one name", "compressor 'good_dup'", first->info().path.string(),
                           fs::canonical(second).string()}));
  // The registry keeps the first.
  const auto loaded = loader.registry().loaded();
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].path, first->info().path);
}

TEST(Registry, SameFileTwiceIsTheCachedPlugin) {
  auto loader = fixtureLoader();
  auto by_name = loader.loadCompressor("good_c");
  auto by_path = loader.loadCompressor(pathOf("good_c"));
  auto by_other_path = loader.loadCompressor((kFixtureDir / "." / "terse_compressor_good_c.so").string());
  EXPECT_EQ(by_name.get(), by_path.get());
  EXPECT_EQ(by_name.get(), by_other_path.get());
  EXPECT_EQ(loader.registry().loaded().size(), 1u);
}

TEST(Registry, SeparateLoadersHaveSeparateRegistries) {
  auto a = fixtureLoader();
  auto b = PluginLoader::withSearchDirs({{kShadowDir, "--plugin-path", true}});
  EXPECT_NE(a.loadCompressor("good_dup")->info().path, b.loadCompressor("good_dup")->info().path);
}

// ---- The compressor adapter

TEST(CompressorAdapter, GoodCRoundTrip) {
  auto c = instantiateFixture("good_c");
  const CompressorCaps caps = c->caps(DType::kF32);
  EXPECT_EQ(caps.aggregation, Aggregation::kSum);
  EXPECT_EQ(caps.devices, static_cast<uint32_t>(TERSE_DEVICE_HOST));
  EXPECT_EQ(caps.wire_dtype, DType::kF32);
  EXPECT_TRUE(caps.fixed_size);
  EXPECT_FALSE(caps.stateful);
  EXPECT_EQ(caps.num_rounds, 1);
  EXPECT_EQ(aggregationName(caps.aggregation), "sum");

  const TensorInfo info = f32Tensor(12);
  const CompressorSizes sizes = c->sizes(info);
  EXPECT_EQ(sizes.max_output_bytes, 48u);
  std::vector<float> in(12), out(12, 1.0f);
  for (int i = 0; i < 12; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(i) - 3.5f;
  std::vector<std::byte> payload(sizes.max_output_bytes);
  const uint64_t n = c->compress(info, in.data(), {}, {}, payload, nullptr);
  EXPECT_EQ(n, 48u);
  c->decompress(info, std::span(payload).first(n), {}, out.data(), /*accumulate=*/true, nullptr);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(out[i], in[i] + 1.0f);
  // An empty tensor works too.
  const TensorInfo empty = f32Tensor(0);
  EXPECT_EQ(c->sizes(empty).max_output_bytes, 0u);
  EXPECT_EQ(c->compress(empty, nullptr, {}, {}, {}, nullptr), 0u);
}

TEST(CompressorAdapter, UnsupportedDtype) {
  auto c = instantiateFixture("good_c");
  const std::string m = messageOf<Unsupported>([&] { c->caps(DType::kF16); });
  EXPECT_TRUE(contains(m, {"compressor 'good_c'", "get_caps(f16) failed [unsupported]: good_c: only f32 gradients"}));
}

TEST(CompressorAdapter, InstanceKeepsTheFileLoaded) {
  std::shared_ptr<Compressor> c;
  {
    auto loader = fixtureLoader();
    c = loader.loadCompressor("good_c")->instantiate();
  }  // loader, registry and plugin object are gone; the instance still holds the file
  EXPECT_EQ(c->plugin().name, "good_c");
  std::vector<float> in{1, 2, 3};
  std::vector<std::byte> payload(12);
  EXPECT_EQ(c->compress(f32Tensor(3), in.data(), {}, {}, payload, nullptr), 12u);
}

// Once loaded, a plugin file stays mapped after its last user is gone, so that opening it again does not run its CUDA
// registration a second time (plugin_support.cc: the runtime keeps the first one's kernels).
TEST(CompressorAdapter, AReleasedPluginStaysMapped) {
  const std::string path = pathOf("good_c");
  {
    auto c = CompressorPlugin::open(path)->instantiate();
    EXPECT_EQ(c->plugin().name, "good_c");
  }  // every reference to the file is gone
  void* still = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  EXPECT_NE(still, nullptr) << path << " was unmapped when its last user went away";
  if (still != nullptr) dlclose(still);  // RTLD_NOLOAD took a reference
}

TEST(CompressorAdapter, InitFailureCarriesThePluginsMessage) {
  auto plugin = CompressorPlugin::open(fixtureCompressor("bad_init"));
  const std::string m = messageOf<InvalidArgument>([&] { plugin->instantiate({{"ratio", "2"}}); });
  EXPECT_TRUE(contains(m, {"compressor 'bad_init' (" + fs::canonical(fixtureCompressor("bad_init")).string() + ")",
                           "init failed [invalid argument]: bad_init: 'ratio' must be in (0, 1], got 2"}));
}

TEST(CompressorAdapter, UnknownParameterAndRepeatedKey) {
  auto plugin = CompressorPlugin::open(fixtureCompressor("good_c"));
  const std::string m = messageOf<InvalidArgument>([&] { plugin->instantiate({{"ratio", "0.1"}}); });
  EXPECT_TRUE(contains(m, {"init failed [invalid argument]: good_c: unknown parameter 'ratio'"}));
  const std::string twice = messageOf<InvalidArgument>([&] { plugin->instantiate({{"mode", "ok"}, {"mode", "ok"}}); });
  EXPECT_TRUE(contains(twice, {"parameter 'mode' given twice"}));
}

struct BadCapsCase {
  const char* mode;
  const char* expect;
};

class InvalidCaps : public ::testing::TestWithParam<BadCapsCase> {};

TEST_P(InvalidCaps, AreRefusedNamingFieldAndValue) {
  auto c = instantiateFixture("bad_caps", {{"mode", GetParam().mode}});
  const std::string m = messageOf<PluginError>([&] { c->caps(DType::kF32); });
  EXPECT_TRUE(contains(m, {"compressor 'bad_caps'", "invalid caps for f32", GetParam().expect}));
  // Other dtypes are simply unsupported, and asking for them is not an error of the instance.
  EXPECT_THROW(c->caps(DType::kF16), Unsupported);
}

INSTANTIATE_TEST_SUITE_P(
    BadCaps, InvalidCaps,
    ::testing::Values(BadCapsCase{"sum_not_fixed", "aggregation sum requires TERSE_CAP_FIXED_SIZE, but flags = 0x0"},
                      BadCapsCase{"zero_rounds", "num_rounds = 0, must be in 1..8"},
                      BadCapsCase{"many_rounds", "num_rounds = 9, must be in 1..8"},
                      BadCapsCase{"zero_devices", "devices = 0x0, must be a nonzero subset of 0x3"},
                      BadCapsCase{"unknown_devices", "devices = 0x5"},
                      BadCapsCase{"bad_agg", "aggregation = 5, must be 0 (allgather), 1 (sum) or 2 (custom)"},
                      BadCapsCase{"bad_wire", "wire_dtype = 3 (f64), aggregation sum needs f32, f16 or bf16"},
                      BadCapsCase{"bad_flags", "flags = 0x11 has bits outside TERSE_CAP_ALL_V1 (0xf)"},
                      BadCapsCase{"identity_allgather",
                                  "TERSE_CAP_IDENTITY needs aggregation sum with wire_dtype f32, "
                                  "one round and no state; got aggregation 0"},
                      BadCapsCase{"identity_stateful",
                                  "TERSE_CAP_IDENTITY needs aggregation sum with wire_dtype f32, "
                                  "one round and no state; got aggregation 1, wire_dtype 0, "
                                  "num_rounds 1, flags = 0xb"},
                      BadCapsCase{"custom_no_reduce", "aggregation custom requires the function pointer 'reduce'"},
                      BadCapsCase{"rounds_allgather", "num_rounds = 2 needs aggregation sum or custom"}),
    [](const auto& p) { return std::string(p.param.mode); });

TEST(CompressorAdapter, InvalidSizes) {
  auto state = instantiateFixture("bad_caps", {{"mode", "state_not_stateful"}});
  std::string m = messageOf<PluginError>([&] { state->sizes(f32Tensor(12)); });
  EXPECT_TRUE(contains(m, {"invalid sizes for tensor 7 (f32, numel 12, round 0)",
                           "state_bytes = 64 but caps for f32 are not stateful"}));
  auto header = instantiateFixture("bad_caps", {{"mode", "bad_header"}});
  m = messageOf<PluginError>([&] { header->sizes(f32Tensor(12)); });
  EXPECT_TRUE(contains(m, {"sum_header_bytes = 2 is not a multiple of the wire dtype f32's 4 bytes"}));
  // The rest of the sizes' rules (compressor.h). Each is checked once, here; the codec, the pipeline and the engine
  // build their buffers and their wire sums on these sizes without looking again, so each case fails if its check goes.
  auto over = instantiateFixture("bad_caps", {{"mode", "header_over"}});
  m = messageOf<PluginError>([&] { over->sizes(f32Tensor(12)); });
  EXPECT_TRUE(contains(m, {"sum_header_bytes = 52 exceeds max_output_bytes = 48"}));
  auto ragged = instantiateFixture("bad_caps", {{"mode", "ragged_body"}});
  m = messageOf<PluginError>([&] { ragged->sizes(f32Tensor(12)); });
  EXPECT_TRUE(
      contains(m, {"the summed region (max_output_bytes 50 - sum_header_bytes 0) is not a whole number of f32"}));
  auto reduced = instantiateFixture("bad_custom", {{"mode", "reduced_small"}});
  m = messageOf<PluginError>([&] { reduced->sizes(f32Tensor(12)); });
  EXPECT_TRUE(contains(m, {"compressor 'bad_custom'", "invalid sizes for tensor 7 (f32, numel 12, round 0)",
                           "max_reduced_bytes = 44 is below max_output_bytes = 48"}));
  // The checked calls ask for the sizes too, so they cannot run on sizes the check refused.
  std::vector<float> in(12, 1.0f);
  std::vector<std::byte> out(64);
  m = messageOf<PluginError>([&] { ragged->compress(f32Tensor(12), in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"is not a whole number of f32"}));
}

TEST(CompressorAdapter, ReduceOutputsAreChecked) {
  TensorInfo info = f32Tensor(12);
  info.source_rank = -1;
  std::vector<float> a(12, 1.0f), b(12, 2.0f);
  const auto bytesOf = [](const std::vector<float>& v) { return std::as_bytes(std::span(v)); };
  std::vector<std::byte> out(64);

  auto ok = instantiateFixture("bad_custom");
  EXPECT_EQ(ok->caps(DType::kF32).aggregation, Aggregation::kCustom);
  EXPECT_EQ(ok->reduce(info, bytesOf(a), bytesOf(b), {}, out, nullptr), 48u);
  float first = 0;
  std::memcpy(&first, out.data(), sizeof first);
  EXPECT_EQ(first, 3.0f);

  auto too_big = instantiateFixture("bad_custom", {{"mode", "reduce_too_big"}});
  std::string m = messageOf<PluginError>([&] { too_big->reduce(info, bytesOf(a), bytesOf(b), {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compressor 'bad_custom'",
                           "reduce failed [plugin error]: it returned 52 bytes, above its max_reduced_bytes 48"}));

  auto overflow = instantiateFixture("bad_custom", {{"mode", "reduce_overflow"}});
  m = messageOf<PluginError>([&] { overflow->reduce(info, bytesOf(a), bytesOf(b), {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"reduce failed [plugin error]: it reported 65 bytes written into a buffer of 64"}));

  // The caller's side: an output below max_reduced_bytes is refused before the plugin runs.
  std::vector<std::byte> small(44);
  m = messageOf<InvalidArgument>([&] { ok->reduce(info, bytesOf(a), bytesOf(b), {}, small, nullptr); });
  EXPECT_TRUE(contains(m, {"reduce: output capacity 44 is below max_reduced_bytes 48"}));
}

// The bound calls (what a codec's hot path runs) are the one place every per-call size is checked: the same errors as
// the checked calls, with the sizes the caller bound the tensor with and no lookup.
TEST(CompressorAdapter, BoundCallsCheckEveryPerCallSize) {
  const TensorInfo info = f32Tensor(12);
  std::vector<float> in(12, 1.0f);
  std::vector<std::byte> out(64);

  auto good = instantiateFixture("good_c");
  const CompressorSizes sizes = good->sizes(info);
  std::vector<std::byte> small(40);
  std::string m =
      messageOf<InvalidArgument>([&] { good->compressBound(info, sizes, in.data(), {}, {}, small, nullptr); });
  EXPECT_TRUE(contains(m, {"compress: output capacity 40 is below max_output_bytes 48"}));

  auto lies = instantiateFixture("bad_caps", {{"mode", "fixed_lies"}});
  m = messageOf<PluginError>([&] { lies->compressBound(info, lies->sizes(info), in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress failed [plugin error]: it returned 44 bytes, but its caps say fixed size and "
                           "max_output_bytes is 48"}));

  auto too_big = instantiateFixture("bad_caps", {{"mode", "too_big"}});
  m = messageOf<PluginError>(
      [&] { too_big->compressBound(info, too_big->sizes(info), in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress failed [plugin error]: it returned 52 bytes, above its max_output_bytes 48"}));

  // A scratch smaller than the plugin asked for, on every call that hands one over, bound or checked.
  auto workspace = instantiateFixture("bad_caps", {{"mode", "needs_workspace"}});
  const CompressorSizes ws = workspace->sizes(info);
  EXPECT_EQ(ws.workspace_bytes, 64u);
  const std::string needle = "scratch has workspace 0 / state 0 bytes, the plugin needs 64 / 0";
  m = messageOf<InvalidArgument>([&] { workspace->compressBound(info, ws, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress: " + needle}));
  m = messageOf<InvalidArgument>([&] { workspace->compress(info, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress: " + needle}));
  std::vector<float> dense(12);
  m = messageOf<InvalidArgument>(
      [&] { workspace->decompressBound(info, ws, std::span(out).first(48), {}, dense.data(), false, nullptr); });
  EXPECT_TRUE(contains(m, {"decompress: " + needle}));
  std::vector<std::byte> scratch(64);
  EXPECT_EQ(workspace->compressBound(info, ws, in.data(), {}, Scratch{scratch, {}}, out, nullptr), 48u);
}

TEST(CompressorAdapter, CompressOutputsAreChecked) {
  const TensorInfo info = f32Tensor(12);
  std::vector<float> in(12, 1.0f);
  std::vector<std::byte> out(64);

  auto lies = instantiateFixture("bad_caps", {{"mode", "fixed_lies"}});
  std::string m = messageOf<PluginError>([&] { lies->compress(info, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress failed [plugin error]: it returned 44 bytes, but its caps say fixed size and "
                           "max_output_bytes is 48"}));

  auto overflow = instantiateFixture("bad_caps", {{"mode", "overflow"}});
  m = messageOf<PluginError>([&] { overflow->compress(info, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress failed [plugin error]: it reported 65 bytes written into a buffer of 64"}));

  auto too_big = instantiateFixture("bad_caps", {{"mode", "too_big"}});
  m = messageOf<PluginError>([&] { too_big->compress(info, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"compress failed [plugin error]: it returned 52 bytes, above its max_output_bytes 48"}));
}

TEST(CompressorAdapter, IdentityFlagReachesTheCaps) {
  // The flag lets the PyTorch hook skip the plugin and sum in place: only a plugin that declares it gets that.
  EXPECT_TRUE(instantiateFixture("bad_caps", {{"mode", "identity_ok"}})->caps(DType::kF32).identity);
  EXPECT_FALSE(instantiateFixture("bad_caps", {{"mode", "ok"}})->caps(DType::kF32).identity);
}

TEST(CompressorAdapter, DecompressFailureCarriesThePluginsMessage) {
  auto c = instantiateFixture("bad_caps", {{"mode", "ok"}});
  std::vector<std::byte> payload(40);
  std::vector<float> out(12);
  const std::string m =
      messageOf<InvalidPayload>([&] { c->decompress(f32Tensor(12), payload, {}, out.data(), false, nullptr); });
  EXPECT_TRUE(contains(m, {"compressor 'bad_caps' (",
                           "terse_compressor_bad_caps.so): decompress failed [invalid "
                           "payload]: fixture: payload numel 10 does not match the tensor's 12"}));
}

TEST(CompressorAdapter, CoreSidePreconditions) {
  auto c = instantiateFixture("good_c");
  std::vector<float> in(12);
  std::vector<std::byte> small(40);
  std::string m = messageOf<InvalidArgument>([&] { c->compress(f32Tensor(12), in.data(), {}, {}, small, nullptr); });
  EXPECT_TRUE(contains(m, {"output capacity 40 is below max_output_bytes 48"}));

  TensorInfo round1 = f32Tensor(12);
  round1.round = 1;
  m = messageOf<InvalidArgument>([&] { c->sizes(round1); });
  EXPECT_TRUE(contains(m, {"round 1 outside 0..0"}));

  TensorInfo shaped = f32Tensor(12);
  shaped.ndim = 2;
  shaped.shape = {3, 5, 0, 0};
  m = messageOf<InvalidArgument>([&] { c->sizes(shaped); });
  EXPECT_TRUE(contains(m, {"shape product 15 != numel"}));

  TensorInfo cuda = f32Tensor(12);
  cuda.device = TERSE_DEVICE_CUDA;
  cuda.device_index = 0;
  m = messageOf<Unsupported>([&] { c->sizes(cuda); });
  EXPECT_TRUE(contains(m, {"does not run on cuda for f32"}));

  std::vector<std::byte> out(48);
  m = messageOf<InvalidArgument>([&] { c->reduce(f32Tensor(12), out, out, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"reduce called, but its aggregation for f32 is sum"}));

  // TERSE_CALL_OWN_PAYLOAD belongs on a decompress of this rank's own payload, decoded, not accumulated; unknown bits
  // nowhere. (A good payload, so that only the flags can be what is refused.)
  const std::size_t bytes = c->compress(f32Tensor(12), in.data(), {}, {}, out, nullptr);
  const std::span<const std::byte> payload(out.data(), bytes);
  std::vector<float> dense(12);
  TensorInfo own = f32Tensor(12);
  own.call_flags = TERSE_CALL_OWN_PAYLOAD;
  own.source_rank = own.rank;
  EXPECT_NO_THROW(c->decompress(own, payload, {}, dense.data(), false, nullptr));
  m = messageOf<InvalidArgument>([&] { c->decompress(own, payload, {}, dense.data(), true, nullptr); });
  EXPECT_TRUE(contains(m, {"TERSE_CALL_OWN_PAYLOAD with accumulate = 1"}));
  TensorInfo aggregate = own;
  aggregate.source_rank = -1;
  m = messageOf<InvalidArgument>([&] { c->decompress(aggregate, payload, {}, dense.data(), false, nullptr); });
  EXPECT_TRUE(contains(m, {"call flags 0x1 on this call", "source_rank == rank"}));
  m = messageOf<InvalidArgument>([&] { c->compress(own, in.data(), {}, {}, out, nullptr); });
  EXPECT_TRUE(contains(m, {"call flags 0x1 on this call"}));
  TensorInfo unknown = f32Tensor(12);
  unknown.call_flags = 0x4;
  unknown.source_rank = unknown.rank;
  m = messageOf<InvalidArgument>([&] { c->decompress(unknown, payload, {}, dense.data(), false, nullptr); });
  EXPECT_TRUE(contains(m, {"call flags 0x4 on this call"}));
}

// test_throws (built by the SDK work into the fixture dir): exceptions inside the plugin come back through the ABI as
// TERSE_ERR_INTERNAL with the logged message, and the core raises them as PluginError.
// The message ends with which call of the run it was: the tensor and the step (a diverged run's "element 0 is NaN" says
// nothing of where), the round past the first, and for a decode whose payload.
TEST(CompressorAdapter, ExceptionsInsideThePluginBecomeErrors) {
  auto c = instantiateFixture("test_throws");
  TensorInfo info = f32Tensor(12);
  info.tensor_id = 3;
  info.step = 57;
  info.world_size = 3;
  const CompressorSizes sizes = c->sizes(info);
  std::vector<float> in(12, 1.0f);
  std::vector<std::byte> out(sizes.max_output_bytes);
  try {
    c->compress(info, in.data(), {}, {}, out, nullptr);
    ADD_FAILURE() << "compress did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), TERSE_ERR_INTERNAL);
    EXPECT_TRUE(contains(e.what(), {"compressor 'test_throws'", "compress failed [plugin error]",
                                    "deliberate failure in compress", "(tensor 3, step 57)"}))
        << e.what();
  }
  std::vector<float> dense(12);
  for (const int source : {2, -1}) {
    info.source_rank = source;
    try {
      c->decompress(info, out, {}, dense.data(), false, nullptr);
      ADD_FAILURE() << "decompress did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), TERSE_ERR_INTERNAL);
      EXPECT_TRUE(
          contains(e.what(), {"decompress failed [plugin error]", source >= 0 ? "(tensor 3, step 57, rank 2's payload)"
                                                                              : "(tensor 3, step 57, the aggregate)"}))
          << e.what();
    }
  }
}

// test_bad_size (the SDK, tests/plugins): a compress that reports a size breaking its promises is the plugin's error,
// whichever side catches it: the SDK (more than the buffer holds, returned as TERSE_ERR_INTERNAL) or the core (above
// max_output_bytes, or short of a fixed size). The same type, status and tag, and the plugin, the call and the sizes.
TEST(CompressorAdapter, AWrongSizeFromAnSdkPluginIsThePluginsError) {
  const TensorInfo info = f32Tensor(12);  // max_output_bytes 16 + 48 = 64
  std::vector<float> in(12, 1.0f);
  struct Case {
    const char* mode;
    std::size_t buffer;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"too_many", 64, "compress reported 65 output bytes but the output holds 64"},
      {"too_big", 80, "it returned 68 bytes, above its max_output_bytes 64 for tensor"},
      {"short_fixed", 64, "it returned 60 bytes, but its caps say fixed size and max_output_bytes is 64"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mode);
    auto plugin = instantiateFixture("test_bad_size", {{"mode", c.mode}});
    std::vector<std::byte> out(c.buffer);
    try {
      plugin->compress(info, in.data(), {}, {}, out, nullptr);
      ADD_FAILURE() << "compress did not throw";
    } catch (const PluginError& e) {
      EXPECT_EQ(e.status(), TERSE_ERR_INTERNAL);
      EXPECT_TRUE(contains(e.what(), {"compressor 'test_bad_size'", "compress failed [plugin error]: "}));
      EXPECT_TRUE(contains(e.what(), {c.needle}));
      EXPECT_EQ(std::string(e.what()).find("internal error"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a PluginError: " << e.what();
    }
  }
}

// ---- Discovery

const DiscoveredPlugin* findEntry(const std::vector<DiscoveredPlugin>& all, const std::string& name,
                                  const fs::path& dir) {
  for (const auto& e : all)
    if (e.name == name && e.path.parent_path() == dir) return &e;
  return nullptr;
}

TEST(Discover, BrokenFilesAreEntriesNotExceptions) {
  auto loader = PluginLoader::withSearchDirs(
      {{kFixtureDir, "--plugin-path", true}, {kShadowDir, "--plugin-path", true}, {"/nonexistent", "install", false}});
  std::vector<DiscoveredPlugin> all;
  ASSERT_NO_THROW(all = loader.discover());

  const auto* good = findEntry(all, "good_c", kFixtureDir);
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->error.empty()) << good->error;
  ASSERT_TRUE(good->info.has_value());
  EXPECT_EQ(good->info->version, "1.0.0");
  ASSERT_TRUE(good->compressor_caps.has_value());
  EXPECT_EQ(good->compressor_caps->aggregation, Aggregation::kSum);

  const std::pair<const char*, const char*> broken[] = {
      {"bad_nosymbol", "not a terse compressor plugin"},
      {"bad_abi", "abi_version field is 7"},
      {"bad_future", "built for compressor ABI v2"},
      {"bad_small", "struct too small"},
      {"bad_nullfn", "'compress' is NULL"},
      {"bad_name", "declares the name 'other'"},
      {"bad_caps", "invalid caps for f32"},
      {"bad_badname", "declared name 'Bad-Name'"},
  };
  for (auto [name, why] : broken) {
    const auto* e = findEntry(all, name, kFixtureDir);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_TRUE(contains(e->error, {why})) << name;
  }

  const auto* needs = findEntry(all, "bad_init", kFixtureDir);
  ASSERT_NE(needs, nullptr);
  EXPECT_TRUE(needs->error.empty());
  EXPECT_TRUE(contains(needs->note, {"needs parameters", "'ratio' must be in (0, 1], got 2"}));

  const auto* sched = findEntry(all, "fake_sched", kFixtureDir);
  ASSERT_NE(sched, nullptr);
  EXPECT_EQ(sched->kind, PluginKind::kScheduler);
  ASSERT_TRUE(sched->scheduler_caps.has_value());

  const auto* first = findEntry(all, "good_dup", kFixtureDir);
  const auto* shadowed = findEntry(all, "good_dup", kShadowDir);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(shadowed, nullptr);
  EXPECT_FALSE(first->shadowed_by.has_value());
  ASSERT_TRUE(shadowed->shadowed_by.has_value());
  EXPECT_EQ(*shadowed->shadowed_by, kFixtureDir / "terse_compressor_good_dup.so");
}

}  // namespace
}  // namespace terse

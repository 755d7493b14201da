// The built-in compressors as the conformance tests see them: what each claims (parameters, error bound,
// unbiasedness) and the plugin files found in the build plugin directory. Shared by the host suite
// (builtin_conformance_test.cc) and its device twin (device_conformance_test.cc), so a plugin is held to the same
// claims on both.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/plugin/compressor.h"
#include "core/plugin/loader.h"

namespace terse::conformance_test {

// What each built-in claims, from its header comment, and the parameters it is checked with. The bounds are the
// relative error ||D(C(x)) - x|| / ||x|| on standard-normal inputs of 1001 and more elements (round_trip), with the
// arithmetic that gives each; a plugin that claims E[D(C(x))] = x is held to it (unbiased). A finite-input limit is
// the range the plugin's own arithmetic allows, with the reason.
struct Expectation {
  Params params;
  std::optional<double> max_rel_error;
  bool unbiased = false;
  // The largest |x| the plugin's documented range holds, where it is below what f32 (or its SUM wire) carries
  // (finite_decode).
  std::optional<double> finite_input_limit;
};

inline const std::map<std::string, Expectation>& expectations() {
  static const std::map<std::string, Expectation> table = {
      // Lossless: the decode is the input.
      {"none", {{}, 1e-7, true, {}}},
      // Round 0 sends the sum of the tensor as one f32 and round 1 the differences x_i - c from the rounded mean c:
      // with
      // |x| <= 1e30 neither the sum of 2^20 elements nor a difference comes near 3.4e38.
      {"test_rounds", {{}, 1e-6, false, 1e30}},
      // Round to nearest with 10 (fp16) and 7 (bf16) stored mantissa bits: |e_i| <= 2^-11 |x_i| and 2^-8 |x_i|, so
      // ||e|| is within that fraction of ||x|| (normal range; N(0, 1) inputs stay in it).
      {"fp16", {{}, 0x1p-11, false, {}}},
      {"bf16", {{}, 0x1p-8, false, {}}},
      // QSGD, s = 127, buckets of 512: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 = 0.032 ||v||^2
      // (Lemma 3.1),
      // so about 0.18 in norm.
      {"qsgd", {{}, 0.2, true, {}}},
      // TernGrad, buckets of 512: E||t - g||^2 = sum (s |g_i| - g_i^2) with s the bucket max, about 3 for 512 normals:
      // (3 E|g| - 1) ||g||^2 / n = 1.4 ||g||^2, so about 1.18.
      {"terngrad", {{}, 1.4, true, {}}},
      // Natural compression: E(C(x) - x)^2 = a^2 p (1 - p) <= x^2 / 8 for x = a (1 + p) (Theorem 1), so at most 0.354
      // in norm; on N(0, 1) about 0.29. Inputs at or above 2^127 may round up past the largest f32 power of two.
      {"natural", {{}, 0.36, true, 0x1p127}},
      // rand_k scaled by n / k: E||r - g||^2 = (n / k - 1) ||g||^2 = 3 ||g||^2 at ratio 1/4, about 1.73.
      // The unbiased decode is x_i n / k, about 4 x_i: inputs above FLT_MAX / 4 = 8.5e37 have no finite decode.
      {"randomk", {{{"ratio", "0.25"}, {"unbiased", "true"}}, 2.0, true, 1e37}},
      // top 10% of N(0, 1) by magnitude keeps 44% of the energy: sqrt(1 - 0.44) = 0.75.
      {"topk", {{{"ratio", "0.1"}}, 0.8, false, {}}},
      // DGC at 10%, the count anywhere in [0.8k, 1.3k]: at 0.8k the top 8% keep 38% of the energy, sqrt(0.62) = 0.79.
      {"dgc", {{{"ratio", "0.1"}}, 0.85, false, {}}},
      // |g| >= 1 keeps 80% of the energy of N(0, 1): sqrt(0.2) = 0.45.
      {"threshold", {{{"tau", "1"}}, 0.5, false, {}}},
      // P^ P^T M is an orthogonal projection of M, so the error never exceeds ||M|| (random normal matrices have no
      // low-rank structure to find, hence nothing tighter); 1-D shapes pass through exactly.
      {"powersgd", {{}, 1.0, false, {}}},
      // One bit per element decoded to the bucket's mean on its side of zero: sqrt(1 - (E|g|)^2 / E g^2) =
      // sqrt(1 - 2 / pi) = 0.60 on N(0, 1).
      {"onebit", {{}, 0.65, false, {}}},
      // sign(g) with scale 1: E(|g| - 1)^2 = 2 - 2 sqrt(2 / pi) = 0.40, so 0.64 in norm.
      {"signsgd", {{}, 0.7, false, {}}},
      // Truncation to multiples of 0.5: the error is uniform-ish on [0, 0.5) in magnitude, about 0.28 of ||x||.
      {"test_lossy", {{}, 0.3, false, {}}},
  };
  return table;
}

struct Discovered {
  std::string name;
  std::filesystem::path path;
  std::string error;  // the loader's reason a file in the build plugin directory cannot be used
};

inline const std::vector<Discovered>& discovered() {
  static const std::vector<Discovered> list = [] {
    std::vector<Discovered> out;
    // The built-ins and the working test plugins (test_lossy, test_rounds), which live apart (tests/CMakeLists.txt).
    auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, std::string(kOriginBuildTree), true},
                                                {TERSE_TEST_PLUGIN_DIR, "test plugins", true}});
    for (const auto& e : loader.discover()) {
      if (e.kind == PluginKind::kCompressor) out.push_back({e.name, e.path, e.error});
    }
    return out;
  }();
  return list;
}

}  // namespace terse::conformance_test

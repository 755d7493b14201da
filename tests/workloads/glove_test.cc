// The glove workload (experiments/workloads/glove.h) and its co-occurrence pipeline (cooccurrence.h): counts on a tiny
// corpus checked by hand, the vocabulary rules, the cache, the gradient against finite differences, the row-sparse
// report, the errors for bad options, and a short AdaGrad run whose held-out loss falls. About 0.1 s in all.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/common/error.h"
#include "core/train/optimizer.h"
#include "experiments/workloads/cooccurrence.h"
#include "experiments/workloads/glove.h"

namespace terse::workloads {
namespace {

CooccurrenceOptions tinyOptions(int window) {
  CooccurrenceOptions o;
  o.corpus = "tiny";
  o.window = window;
  o.min_count = 1;
  o.test_fraction = 0;
  return o;
}

std::map<std::pair<std::string, std::string>, float> byWord(const Cooccurrence& c) {
  std::map<std::pair<std::string, std::string>, float> m;
  for (const CoEntry& e : c.train)
    m[{c.words[static_cast<std::size_t>(e.i)], c.words[static_cast<std::size_t>(e.j)]}] = e.x;
  return m;
}

TEST(Cooccurrence, TokenizesLowerCasesAndKeepsApostrophes) {
  EXPECT_EQ(tokenize("Don't PANIC!  42 times--\xc3\xa9t\xc3\xa9"),
            (std::vector<std::string>{"don't", "panic", "42", "times", "t"}));
}

// "the cat sat on the mat. The cat!" with window 2: tokens the(0) cat(1) sat(2) on(3) the(4) mat(5) the(6) cat(7).
// Pairs (positions) at distance 1 add 1, at distance 2 add 1/2, to X[a][b] and X[b][a]:
//   the-cat (0,1) (6,7): 2    the-sat (0,2) (2,4): 1    cat-sat (1,2): 1     cat-on (1,3): 0.5    sat-on (2,3): 1
//   on-the (3,4): 1           on-mat (3,5): 0.5         the-mat (4,5) (5,6): 2                   mat-cat (5,7): 0.5
//   the-the (4,6): 0.5 added both ways to the one diagonal entry: 1
TEST(Cooccurrence, CountsATinyCorpusByHand) {
  const Cooccurrence c = countCooccurrence({"the cat sat on the mat. The cat!"}, tinyOptions(2));
  EXPECT_EQ(c.tokens, 8);
  EXPECT_EQ(c.words, (std::vector<std::string>{"the", "cat", "mat", "on", "sat"}));  // by count, then by word
  EXPECT_EQ(c.counts, (std::vector<int64_t>{3, 2, 1, 1, 1}));
  const std::map<std::pair<std::string, std::string>, float> want = {
      {{"the", "cat"}, 2}, {{"the", "sat"}, 1},   {{"cat", "sat"}, 1}, {{"cat", "on"}, 0.5f}, {{"sat", "on"}, 1},
      {{"on", "the"}, 1},  {{"on", "mat"}, 0.5f}, {{"the", "mat"}, 2}, {{"the", "the"}, 1},   {{"mat", "cat"}, 0.5f}};
  std::map<std::pair<std::string, std::string>, float> symmetric;
  for (const auto& [k, v] : want) {
    symmetric[k] = v;
    symmetric[{k.second, k.first}] = v;
  }
  EXPECT_EQ(byWord(c), symmetric);
  for (std::size_t k = 1; k < c.train.size(); ++k)
    EXPECT_TRUE(std::pair(c.train[k - 1].i, c.train[k - 1].j) < std::pair(c.train[k].i, c.train[k].j));
}

TEST(Cooccurrence, WindowsStopAtFilesAndTheVocabularyAtItsCap) {
  // Two files: "b" and "c" are adjacent only across the file boundary, which no window spans.
  const Cooccurrence two = countCooccurrence({"a b", "c a"}, tinyOptions(5));
  const auto m = byWord(two);
  EXPECT_EQ(m.count({"b", "c"}), 0u);
  EXPECT_EQ(m.at({"a", "b"}), 1.0f);
  // vocab_size 2 and min_count 2: "x" (1 occurrence) goes, then the cap keeps the two most frequent.
  CooccurrenceOptions o = tinyOptions(1);
  o.vocab_size = 2;
  o.min_count = 2;
  const Cooccurrence capped = countCooccurrence({"p q r p q r p q x"}, o);
  EXPECT_EQ(capped.words, (std::vector<std::string>{"p", "q"}));
  // r between q and p keeps its position: q-p at distance 2 is outside window 1.
  EXPECT_EQ(byWord(capped), (std::map<std::pair<std::string, std::string>, float>{{{"p", "q"}, 3}, {{"q", "p"}, 3}}));
}

TEST(Cooccurrence, HoldsOutAShareAndCachesTheResult) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse-glove-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "corpus.txt") << "one two three four five six seven eight nine ten one two three four five "
                                         "six seven eight nine ten eleven twelve one three five seven nine eleven";
  }
  CooccurrenceOptions o = tinyOptions(4);
  o.corpus = (dir / "corpus.txt").string();
  o.test_fraction = 0.3;
  o.cache_dir = (dir / "cache").string();
  const Cooccurrence built = buildCooccurrence(o);
  EXPECT_FALSE(built.from_cache);
  EXPECT_FALSE(built.test.empty());
  EXPECT_GT(built.train.size(), built.test.size());
  const Cooccurrence cached = buildCooccurrence(o);
  EXPECT_TRUE(cached.from_cache);
  EXPECT_EQ(cached.cache_file, built.cache_file);
  EXPECT_EQ(cached.words, built.words);
  ASSERT_EQ(cached.train.size(), built.train.size());
  for (std::size_t k = 0; k < built.train.size(); ++k) EXPECT_EQ(cached.train[k].x, built.train[k].x);
  // A different window is a different key: counted again, not read from the first file.
  o.window = 3;
  EXPECT_FALSE(buildCooccurrence(o).from_cache);
  // A truncated cache file is an error naming it.
  std::filesystem::resize_file(built.cache_file, 30);
  o.window = 4;
  try {
    buildCooccurrence(o);
    ADD_FAILURE() << "a truncated cache was read";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(built.cache_file), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Cooccurrence, BadOptionsAreNamed) {
  auto expectNamed = [](CooccurrenceOptions o, const std::string& field) {
    try {
      countCooccurrence({"a b a b"}, o);
      ADD_FAILURE() << field << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  const std::vector<std::pair<std::function<void(CooccurrenceOptions&)>, std::string>> cases = {
      {[](CooccurrenceOptions& c) { c.window = 0; }, "glove.window must be in [1, 1000], got 0"},
      {[](CooccurrenceOptions& c) { c.vocab_size = 1; }, "glove.vocab_size must be in [2, 2^24], got 1"},
      {[](CooccurrenceOptions& c) { c.min_count = 0; }, "glove.min_count must be >= 1, got 0"},
      {[](CooccurrenceOptions& c) { c.test_fraction = 1; }, "glove.test_fraction must be in [0, 1), got 1"}};
  for (const auto& [mutate, field] : cases) {
    CooccurrenceOptions bad = tinyOptions(2);
    mutate(bad);
    expectNamed(bad, field);
  }
  CooccurrenceOptions o = tinyOptions(2);
  o.corpus = "/nonexistent/corpus";
  EXPECT_THROW(buildCooccurrence(o), InvalidArgument);
  GloveOptions g;
  g.cooc = tinyOptions(2);
  g.alpha = 1.5;
  EXPECT_THROW(validateGloveOptions(g), InvalidArgument);
}

// A corpus with the probe words and enough structure to learn from.
std::shared_ptr<const GloveData> smallData() {
  std::string text;
  for (int k = 0; k < 30; ++k)
    text +=
        "the man and the woman love the world . a king and a friend read the book at night . time is money "
        "and work is life . people drink water in the house . ";
  CooccurrenceOptions o = tinyOptions(3);
  o.test_fraction = 0.2;
  return makeGloveData(countCooccurrence({text}, o));
}

GloveOptions smallOptions() {
  GloveOptions g;
  g.dim = 6;
  g.x_max = 10;  // the corpus's counts straddle it, so both branches of f are exercised
  return g;
}

TEST(Glove, GradientMatchesFiniteDifferences) {
  const auto data = smallData();
  GloveWorkload w(data, smallOptions(), 3);
  ASSERT_EQ(w.params().size(), 4u);
  std::vector<int64_t> batch;
  for (int64_t k = 0; k < w.numTrainExamples(); k += 3) batch.push_back(k);
  w.forwardBackward(batch, {});
  std::vector<std::vector<float>> analytic;
  for (const auto& p : w.params()) analytic.push_back(p.grad);
  int checked = 0;
  for (std::size_t t = 0; t < w.params().size(); ++t) {
    const std::size_t n = w.params()[t].numel();
    for (std::size_t i = 0; i < n; i += 5) {
      float& v = w.params()[t].value[i];
      const float keep = v;
      const float eps = 1e-2f;
      v = keep + eps;
      const double up = w.forwardBackward(batch, {});
      v = keep - eps;
      const double down = w.forwardBackward(batch, {});
      v = keep;
      const double numeric = (up - down) / (2.0 * eps);
      EXPECT_NEAR(analytic[t][i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << w.params()[t].name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Glove, ReportsTheRowsItsGradientTouches) {
  const auto data = smallData();
  GloveWorkload w(data, smallOptions(), 3);
  const std::vector<int64_t> batch = {0, 5, 5, 17};
  int reports = 0;
  w.forwardBackward(batch, [&](int layer, std::span<const std::size_t> tensors) {
    EXPECT_EQ(layer, 0);
    EXPECT_EQ(tensors.size(), 4u);
    ++reports;
  });
  EXPECT_EQ(reports, 1);
  std::set<int64_t> words, contexts;
  for (int64_t k : batch) {
    words.insert(data->cooc.train[static_cast<std::size_t>(k)].i);
    contexts.insert(data->cooc.train[static_cast<std::size_t>(k)].j);
  }
  const auto ps = w.params();
  for (std::size_t t = 0; t < ps.size(); ++t) {
    EXPECT_TRUE(ps[t].row_sparse);
    const std::set<int64_t>& want = (t == 0 || t == 2) ? words : contexts;
    EXPECT_EQ(ps[t].grad_rows, std::vector<int64_t>(want.begin(), want.end())) << ps[t].name;
    const std::size_t len = ps[t].rowLength();
    for (std::size_t r = 0; r * len < ps[t].numel(); ++r)
      if (!want.count(static_cast<int64_t>(r))) {
        for (std::size_t c = 0; c < len; ++c) ASSERT_EQ(ps[t].grad[r * len + c], 0.0f) << ps[t].name << " row " << r;
      }
  }
}

TEST(Glove, AdagradLowersTheHeldOutLoss) {
  const auto data = smallData();
  GloveWorkload w(data, smallOptions(), 5);
  const train::EvalResult before = w.evaluate();
  EXPECT_GT(before.num_examples, 0);
  EXPECT_GE(before.accuracy, 0.0);
  EXPECT_LE(before.accuracy, 1.0);
  train::SgdOptions sgd;
  sgd.adagrad = true;
  train::SgdOptimizer opt(w.params(), sgd);
  const int64_t n = w.numTrainExamples();
  for (int epoch = 0; epoch < 60; ++epoch)
    for (int64_t start = 0; start < n; start += 16) {
      std::vector<int64_t> batch;
      for (int64_t k = start; k < std::min(n, start + 16); ++k) batch.push_back(k);
      w.forwardBackward(batch, {});
      for (std::size_t t = 0; t < w.params().size(); ++t)
        opt.updateRows(t, w.params()[t], 0.1, w.params()[t].grad_rows);
    }
  const train::EvalResult after = w.evaluate();
  EXPECT_LT(after.loss, 0.5 * before.loss);
}

}  // namespace
}  // namespace terse::workloads

#include "experiments/workloads/glove.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <tuple>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {
namespace {

enum Tensor : std::size_t { kWord = 0, kContext = 1, kWordBias = 2, kContextBias = 3 };

// The kNeighbours largest of sim (excluding `self`), by similarity then id.
std::vector<int32_t> topK(const std::vector<double>& sim, int32_t self) {
  std::vector<int32_t> ids(sim.size());
  std::iota(ids.begin(), ids.end(), 0);
  ids.erase(ids.begin() + self);
  const auto k = std::min<std::size_t>(kNeighbours, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
    return sim[static_cast<std::size_t>(a)] != sim[static_cast<std::size_t>(b)]
               ? sim[static_cast<std::size_t>(a)] > sim[static_cast<std::size_t>(b)]
               : a < b;
  });
  ids.resize(k);
  return ids;
}

}  // namespace

void validateGloveOptions(const GloveOptions& o) {
  validateCooccurrenceOptions(o.cooc);
  TERSE_CHECK(o.dim >= 1 && o.dim <= 4096, InvalidArgument, "glove.dim must be in [1, 4096], got " << o.dim);
  TERSE_CHECK(o.x_max > 0 && std::isfinite(o.x_max), InvalidArgument, "glove.x_max must be > 0, got " << o.x_max);
  TERSE_CHECK(o.alpha > 0 && o.alpha <= 1, InvalidArgument, "glove.alpha must be in (0, 1], got " << o.alpha);
}

std::shared_ptr<const GloveData> makeGloveData(Cooccurrence cooc) {
  auto d = std::make_shared<GloveData>();
  d->cooc = std::move(cooc);
  const auto& words = d->cooc.words;
  const std::size_t v = words.size();
  for (const char* w : kProbeWords) {
    const auto it = std::find(words.begin(), words.end(), w);
    if (it != words.end()) d->probes.push_back(static_cast<int32_t>(it - words.begin()));
  }
  TERSE_CHECK(
      !d->probes.empty(), InvalidArgument,
      "glove: none of the probe words (man, woman, time, ...) is in the corpus's vocabulary of " << v << " words");
  // Reference similarity: cosine of the rows of the positive PMI matrix of the training counts, max(0, log(X_ij X /
  // (X_i X_j))) (Levy and Goldberg 2014: what GloVe and word2vec factorize, up to shifts and weights).
  std::vector<double> row_sum(v, 0.0);
  double total = 0;
  for (const CoEntry& e : d->cooc.train) {
    row_sum[static_cast<std::size_t>(e.i)] += e.x;
    total += e.x;
  }
  std::vector<float> ppmi(d->cooc.train.size());
  std::vector<double> norm(v, 0.0);
  for (std::size_t k = 0; k < ppmi.size(); ++k) {
    const CoEntry& e = d->cooc.train[k];
    const double pmi =
        std::log(e.x * total / (row_sum[static_cast<std::size_t>(e.i)] * row_sum[static_cast<std::size_t>(e.j)]));
    ppmi[k] = static_cast<float>(std::max(0.0, pmi));
    norm[static_cast<std::size_t>(e.i)] += static_cast<double>(ppmi[k]) * ppmi[k];
  }
  for (double& n : norm) n = std::sqrt(n);
  std::vector<double> row(v), sim(v);
  for (int32_t p : d->probes) {
    std::fill(row.begin(), row.end(), 0.0);
    std::fill(sim.begin(), sim.end(), 0.0);
    for (std::size_t k = 0; k < ppmi.size(); ++k)
      if (d->cooc.train[k].i == p) row[static_cast<std::size_t>(d->cooc.train[k].j)] = ppmi[k];
    for (std::size_t k = 0; k < ppmi.size(); ++k) {
      const CoEntry& e = d->cooc.train[k];
      sim[static_cast<std::size_t>(e.i)] += row[static_cast<std::size_t>(e.j)] * ppmi[k];
    }
    for (std::size_t i = 0; i < v; ++i) sim[i] = norm[i] > 0 ? sim[i] / norm[i] : -1.0;
    d->reference.push_back(topK(sim, p));
  }
  return d;
}

std::shared_ptr<const GloveData> loadGloveData(const GloveOptions& o) {
  validateGloveOptions(o);
  // Every replica of a run (and every variant of a study over the same corpus) shares one copy.
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const GloveData>> cache;
  std::ostringstream key;
  key << o.cooc.corpus << '\n'
      << o.cooc.window << ' ' << o.cooc.vocab_size << ' ' << o.cooc.min_count << ' ' << o.cooc.test_fraction << ' '
      << o.cooc.split_seed << ' ' << o.cooc.cache_dir;
  std::lock_guard lock(mutex);
  auto& slot = cache[key.str()];
  if (auto d = slot.lock()) return d;
  auto d = makeGloveData(buildCooccurrence(o.cooc));
  slot = d;
  return d;
}

GloveWorkload::GloveWorkload(std::shared_ptr<const GloveData> data, const GloveOptions& options, uint64_t seed)
    : data_(std::move(data)), options_(options) {
  TERSE_CHECK(data_ != nullptr, InvalidArgument, "glove needs its co-occurrence data");
  validateGloveOptions(options_);
  vocab_ = static_cast<int64_t>(data_->cooc.words.size());
  const int64_t d = options_.dim;
  addParam("glove.word", {vocab_, d}, 0);
  addParam("glove.context", {vocab_, d}, 0);
  addParam("glove.word_bias", {vocab_}, 0);
  addParam("glove.context_bias", {vocab_}, 0);
  const auto scale = static_cast<float>(1.0 / static_cast<double>(d));
  for (std::size_t t = 0; t < params().size(); ++t) {
    train::ParamTensor& p = params()[t];
    train::SeededRng rng(seed, t);
    for (float& v : p.value) v = (static_cast<float>(rng.uniform()) - 0.5f) * scale;
    p.row_sparse = true;
  }
  seen_.assign(static_cast<std::size_t>(vocab_), 0);
}

double GloveWorkload::weight(float x) const {
  return x >= options_.x_max ? 1.0 : std::pow(static_cast<double>(x) / options_.x_max, options_.alpha);
}

train::LayerFlops GloveWorkload::layerFlops(int) const {
  const auto d = static_cast<double>(options_.dim);
  return {2 * d + 4, 4 * d + 4};
}

double GloveWorkload::forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) {
  checkBatch(batch, numTrainExamples());
  awaitLayer(0);
  auto ps = params();
  // The aggregation wrote the averaged gradient over every rank's rows (or all of them): clear all of it.
  for (train::ParamTensor& p : ps) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
  const auto d = static_cast<std::size_t>(options_.dim);
  const float* w = ps[kWord].value.data();
  const float* wc = ps[kContext].value.data();
  const float* b = ps[kWordBias].value.data();
  const float* bc = ps[kContextBias].value.data();
  float* gw = ps[kWord].grad.data();
  float* gwc = ps[kContext].grad.data();
  float* gb = ps[kWordBias].grad.data();
  float* gbc = ps[kContextBias].grad.data();
  const double inv = 1.0 / static_cast<double>(batch.size());
  double loss = 0;
  for (int64_t k : batch) {
    const CoEntry& e = data_->cooc.train[static_cast<std::size_t>(k)];
    const std::size_t i = static_cast<std::size_t>(e.i) * d, j = static_cast<std::size_t>(e.j) * d;
    double dot = 0;
    for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(w[i + c]) * wc[j + c];
    const double diff = dot + b[e.i] + bc[e.j] - std::log(static_cast<double>(e.x));
    const double f = weight(e.x);
    loss += f * diff * diff;
    const auto g = static_cast<float>(2 * f * diff * inv);
    for (std::size_t c = 0; c < d; ++c) {
      gw[i + c] += g * wc[j + c];
      gwc[j + c] += g * w[i + c];
    }
    gb[e.i] += g;
    gbc[e.j] += g;
  }
  // The rows each tensor's grad may be nonzero in: the batch's words (word tensors) and contexts (context tensors).
  for (const auto& [vec, bias, is_word] : {std::tuple{kWord, kWordBias, true}, {kContext, kContextBias, false}}) {
    batchRows(batch, is_word, ps[vec].grad_rows);
    ps[bias].grad_rows = ps[vec].grad_rows;
  }
  reportLayer(on_layer_ready, 0);
  return loss * inv;
}

void GloveWorkload::batchRows(std::span<const int64_t> batch, bool is_word, std::vector<int64_t>& rows) {
  rows.clear();
  for (int64_t k : batch) {
    const CoEntry& e = data_->cooc.train[static_cast<std::size_t>(k)];
    const int32_t r = is_word ? e.i : e.j;
    if (!seen_[static_cast<std::size_t>(r)]) {
      seen_[static_cast<std::size_t>(r)] = 1;
      rows.push_back(r);
    }
  }
  for (int64_t r : rows) seen_[static_cast<std::size_t>(r)] = 0;
  std::sort(rows.begin(), rows.end());
}

bool GloveWorkload::forwardRows(std::span<const int64_t> batch, std::span<std::vector<int64_t>> rows) {
  checkBatch(batch, numTrainExamples());
  TERSE_CHECK(rows.size() == params().size(), InvalidArgument,
              "glove: forwardRows into " << rows.size() << " tensors, the model has " << params().size());
  for (const auto& [vec, bias, is_word] : {std::tuple{kWord, kWordBias, true}, {kContext, kContextBias, false}}) {
    batchRows(batch, is_word, rows[vec]);
    rows[bias] = rows[vec];
  }
  return true;
}

train::EvalResult GloveWorkload::evaluate(int64_t max_examples) {
  awaitLayer(0);
  const auto ps = params();
  const auto d = static_cast<std::size_t>(options_.dim);
  const std::vector<CoEntry>& test = data_->cooc.test;
  const auto n =
      static_cast<std::size_t>(max_examples > 0 ? std::min<int64_t>(max_examples, static_cast<int64_t>(test.size()))
                                                : static_cast<int64_t>(test.size()));
  const float* w = ps[kWord].value.data();
  const float* wc = ps[kContext].value.data();
  double loss = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const CoEntry& e = test[k];
    const std::size_t i = static_cast<std::size_t>(e.i) * d, j = static_cast<std::size_t>(e.j) * d;
    double dot = 0;
    for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(w[i + c]) * wc[j + c];
    const double diff = dot + ps[kWordBias].value[static_cast<std::size_t>(e.i)] +
                        ps[kContextBias].value[static_cast<std::size_t>(e.j)] - std::log(static_cast<double>(e.x));
    loss += weight(e.x) * diff * diff;
  }
  // Nearest-neighbour agreement of w + w~ with the counts' own neighbours (glove.h).
  const auto v = static_cast<std::size_t>(vocab_);
  std::vector<float> sum(v * d);
  std::vector<double> norm(v), sim(v);
  for (std::size_t r = 0; r < v; ++r) {
    double s = 0;
    for (std::size_t c = 0; c < d; ++c) {
      sum[r * d + c] = w[r * d + c] + wc[r * d + c];
      s += static_cast<double>(sum[r * d + c]) * sum[r * d + c];
    }
    norm[r] = std::sqrt(s);
  }
  double agree = 0;
  for (std::size_t p = 0; p < data_->probes.size(); ++p) {
    const auto q = static_cast<std::size_t>(data_->probes[p]);
    for (std::size_t r = 0; r < v; ++r) {
      double s = 0;
      for (std::size_t c = 0; c < d; ++c) s += static_cast<double>(sum[q * d + c]) * sum[r * d + c];
      sim[r] = norm[r] > 0 && norm[q] > 0 ? s / (norm[r] * norm[q]) : -1.0;
    }
    const std::vector<int32_t> mine = topK(sim, data_->probes[p]);
    const std::vector<int32_t>& ref = data_->reference[p];
    int hits = 0;
    for (int32_t m : mine) hits += std::count(ref.begin(), ref.end(), m) > 0 ? 1 : 0;
    agree += ref.empty() ? 0.0 : static_cast<double>(hits) / static_cast<double>(ref.size());
  }
  train::EvalResult r;
  r.num_examples = static_cast<int64_t>(n);
  r.loss = n > 0 ? loss / static_cast<double>(n) : 0.0;
  r.accuracy = agree / static_cast<double>(data_->probes.size());
  return r;
}

}  // namespace terse::workloads

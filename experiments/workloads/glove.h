// GloVe word vectors (Pennington, Socher, Manning, EMNLP 2014) on a co-occurrence matrix from cooccurrence.h.
//
// Parameters, all in layer 0 and all row-sparse (ParamTensor::row_sparse; a batch touches the rows of its words):
//   "glove.word" [V, dim] w_i, "glove.context" [V, dim] w~_j, "glove.word_bias" [V] b_i, "glove.context_bias" [V] b~_j,
// initialized uniform in [-0.5/dim, 0.5/dim] (the reference implementation's init).
// An example is one nonzero training entry (i, j, X_ij); the loss of a batch B is the paper's weighted least squares
//   J = 1/|B| sum_{(i,j) in B} f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2,   f(x) = min(1, (x / x_max)^alpha)
// (no 1/2 factor: the gradient is 2 f(X_ij) diff times the other vector).
//
// evaluate(): loss = the same J over the held-out entries (the first max_examples of them when > 0); accuracy = the
// nearest-neighbour agreement on a fixed probe list (kProbeWords below, the ones in the vocabulary): for each probe,
// the share of its kNeighbours nearest words by cosine of w + w~ (the paper's sum of the two vectors) that are also
// among its kNeighbours nearest by cosine of the rows of the positive PMI of the training counts, max(0, log(X_ij X /
// (X_i X_j))) -- the count matrix's own similarity (Levy and Goldberg 2014), computed once. It rises from chance
// (~k / V) as the vectors learn the counts; it is a training signal comparable across the variants of a study, not an
// analogy benchmark.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/train/workload.h"
#include "experiments/workloads/cooccurrence.h"

namespace terse::workloads {

struct GloveOptions {
  CooccurrenceOptions cooc;  // corpus, window, vocab cap, min count, split, cache
  int64_t dim = 50;          // >= 1
  double x_max = 100;        // > 0
  double alpha = 0.75;       // in (0, 1]
};

// The data every replica shares read-only: the counts and the probes' reference neighbours.
struct GloveData {
  Cooccurrence cooc;
  std::vector<int32_t> probes;                  // ids of the probe words in the vocabulary
  std::vector<std::vector<int32_t>> reference;  // per probe: its kNeighbours nearest ids by the counts
};

inline constexpr int kNeighbours = 10;
// Common English words; a corpus that lacks some simply has fewer probes (at least one is required).
inline constexpr const char* kProbeWords[] = {"man",   "woman",  "time", "day",  "night",  "life",  "love",
                                              "world", "money",  "god",  "war",  "work",   "house", "computer",
                                              "water", "people", "king", "mind", "friend", "book"};

// Throws InvalidArgument naming the option for a value out of range.
void validateGloveOptions(const GloveOptions& options);
// Builds (or loads from the cache) the counts and the reference neighbours. Throws InvalidArgument as
// buildCooccurrence does, and when no probe word is in the vocabulary.
std::shared_ptr<const GloveData> loadGloveData(const GloveOptions& options);
// The same from counts already made (tests).
std::shared_ptr<const GloveData> makeGloveData(Cooccurrence cooc);

class GloveWorkload final : public train::Workload {
 public:
  GloveWorkload(std::shared_ptr<const GloveData> data, const GloveOptions& options, uint64_t seed);

  std::string_view name() const override { return "glove"; }
  int64_t numTrainExamples() const override { return static_cast<int64_t>(data_->cooc.train.size()); }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  train::EvalResult evaluate(int64_t max_examples = 0) override;
  bool gatesLayers() const override { return true; }
  // Per example: the dot product and the loss (2 dim + 4), and the four gradients (4 dim + 4); not per parameter.
  train::LayerFlops layerFlops(int layer) const override;

  // The batch's words (word tensors) and contexts (context tensors): the rows its forward reads and its gradient
  // touches.
  bool forwardRows(std::span<const int64_t> batch, std::span<std::vector<int64_t>> rows) override;

  const GloveData& data() const { return *data_; }

 private:
  double weight(float x) const;
  // The distinct rows of the batch's words (is_word) or contexts, ascending.
  void batchRows(std::span<const int64_t> batch, bool is_word, std::vector<int64_t>& rows);

  std::shared_ptr<const GloveData> data_;
  GloveOptions options_;
  int64_t vocab_ = 0;
  std::vector<uint8_t> seen_;  // scratch: rows touched by this batch
};

}  // namespace terse::workloads

// The co-occurrence pipeline of the glove workload (Pennington, Socher, Manning, "GloVe: Global Vectors for Word
// Representation", EMNLP 2014, section 3 and the reference implementation's vocab_count / cooccur):
//
//   1. Corpus: one text file, or every regular file of a directory (sorted by name; symbolic links and fortune's
//      "*.dat" index files skipped), read as bytes.
//   2. Tokens: maximal runs of ASCII letters, digits and apostrophes, lower-cased; everything else separates them
//      (so "Don't!" is "don't"; non-ASCII bytes are separators). Files are concatenated: a window never spans two
//      files.
//   3. Vocabulary: words occurring at least min_count times, the vocab_size most frequent of them (ties by word,
//      bytewise), ids in that order (id 0 = most frequent).
//   4. Counts: for every pair of in-vocabulary tokens at distance 1 <= d <= window in the token stream
//   (out-of-vocabulary
//      tokens keep their positions, as in the reference code), X[i][j] += 1/d and X[j][i] += 1/d: symmetric and
//      harmonically weighted.
//   5. Split: the nonzero entries (i, j, X_ij) in (i, j) order; an entry goes to the held-out set when a hash of
//      (i, j, seed) falls in the lowest test_fraction of its range, to the training set otherwise.
//
// The result is cached: buildCooccurrence writes it to <cache_dir>/glove-cooc-<key>.bin, where the key hashes the
// corpus bytes and every option above, and loads that file instead of recounting when it exists (the key changes with
// the corpus, so a stale cache is never read). The file is a header (magic, version, sizes) then the words and the
// entries; a truncated or foreign file is an error naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace terse::workloads {

struct CooccurrenceOptions {
  std::string corpus;          // a text file or a directory of them
  int window = 10;             // >= 1
  int64_t vocab_size = 10000;  // >= 2: the cap
  int64_t min_count = 5;       // >= 1
  double test_fraction = 0.1;  // in [0, 1)
  uint64_t split_seed = 1;
  std::string cache_dir;  // "" = no cache
};

struct CoEntry {
  int32_t i = 0;  // word
  int32_t j = 0;  // context
  float x = 0;    // X_ij
};

struct Cooccurrence {
  std::vector<std::string> words;    // id -> word
  std::vector<int64_t> counts;       // id -> occurrences in the corpus
  std::vector<CoEntry> train, test;  // in (i, j) order each
  int64_t tokens = 0;                // tokens in the corpus, in vocabulary or not
  std::string cache_file;            // where it was read from or written to ("" without a cache)
  bool from_cache = false;
};

// Throws InvalidArgument naming the option for a value out of range, and for a corpus that is missing, unreadable or
// yields fewer than 2 vocabulary words or no co-occurrence at all.
void validateCooccurrenceOptions(const CooccurrenceOptions& options);

// Steps 2-5 on text already in memory (one string per file); no cache. The tests' entry point.
Cooccurrence countCooccurrence(const std::vector<std::string>& texts, const CooccurrenceOptions& options);

// Steps 1-5 with the cache described above.
Cooccurrence buildCooccurrence(const CooccurrenceOptions& options);

// Tokens of one text as step 2 defines them.
std::vector<std::string> tokenize(std::string_view text);

}  // namespace terse::workloads

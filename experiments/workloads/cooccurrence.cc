#include "experiments/workloads/cooccurrence.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>

#include <unistd.h>

#include "core/common/error.h"
#include "core/common/fnv.h"

namespace terse::workloads {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kCacheMagic = 0x434c4754;  // "TGLC" little-endian
constexpr uint32_t kCacheVersion = 1;

// SplitMix64's finalizer: the split hash of an entry, uniform enough that the held-out share is test_fraction.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool isWordByte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '\'';
}

std::vector<fs::path> corpusFiles(const std::string& corpus) {
  std::error_code ec;
  const fs::file_status st = fs::status(corpus, ec);
  TERSE_CHECK(!ec && fs::exists(st), InvalidArgument,
              "glove.corpus '" << corpus << "' does not exist (install the fortunes package, or name a text file)");
  if (fs::is_regular_file(st)) return {fs::path(corpus)};
  TERSE_CHECK(fs::is_directory(st), InvalidArgument,
              "glove.corpus '" << corpus << "' is neither a text file nor a directory");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    // fortune's directory holds each file once as text, once as a "*.u8" link to it and once as a "*.dat" index.
    if (entry.is_symlink() || !entry.is_regular_file() || entry.path().extension() == ".dat") continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  TERSE_CHECK(!files.empty(), InvalidArgument, "glove.corpus '" << corpus << "' holds no regular text files");
  return files;
}

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TERSE_CHECK(in.good(), InvalidArgument, "glove.corpus: cannot read '" << path.string() << "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
void put(std::ostream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T get(std::istream& in, const std::string& file) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  TERSE_CHECK(in.good(), InvalidArgument, "co-occurrence cache '" << file << "' is truncated");
  return v;
}

void writeCache(const Cooccurrence& c, const std::string& file) {
  const std::string tmp = file + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TERSE_CHECK(out.good(), InvalidArgument, "cannot write the co-occurrence cache '" << tmp << "'");
    put(out, kCacheMagic);
    put(out, kCacheVersion);
    put<uint64_t>(out, c.words.size());
    put<int64_t>(out, c.tokens);
    put<uint64_t>(out, c.train.size());
    put<uint64_t>(out, c.test.size());
    for (std::size_t w = 0; w < c.words.size(); ++w) {
      put<uint32_t>(out, static_cast<uint32_t>(c.words[w].size()));
      out.write(c.words[w].data(), static_cast<std::streamsize>(c.words[w].size()));
      put<int64_t>(out, c.counts[w]);
    }
    for (const auto* set : {&c.train, &c.test})
      out.write(reinterpret_cast<const char*>(set->data()),
                static_cast<std::streamsize>(set->size() * sizeof(CoEntry)));
    TERSE_CHECK(out.good(), InvalidArgument, "writing the co-occurrence cache '" << tmp << "' failed");
  }
  // Renamed into place so a concurrent reader (another process of a study) sees a whole file or none.
  fs::rename(tmp, file);
}

Cooccurrence readCache(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  TERSE_CHECK(in.good(), InvalidArgument, "cannot read the co-occurrence cache '" << file << "'");
  TERSE_CHECK(get<uint32_t>(in, file) == kCacheMagic && get<uint32_t>(in, file) == kCacheVersion, InvalidArgument,
              "'" << file << "' is not a co-occurrence cache of version " << kCacheVersion << "; delete it");
  Cooccurrence c;
  const auto words = get<uint64_t>(in, file);
  c.tokens = get<int64_t>(in, file);
  const auto train = get<uint64_t>(in, file), test = get<uint64_t>(in, file);
  TERSE_CHECK(words >= 2 && words < (uint64_t{1} << 31) && train < (uint64_t{1} << 40) && test < (uint64_t{1} << 40),
              InvalidArgument, "co-occurrence cache '" << file << "' has implausible sizes; delete it");
  for (uint64_t w = 0; w < words; ++w) {
    const auto len = get<uint32_t>(in, file);
    TERSE_CHECK(len > 0 && len < 4096, InvalidArgument, "co-occurrence cache '" << file << "' is corrupt; delete it");
    std::string s(len, '\0');
    in.read(s.data(), len);
    c.words.push_back(std::move(s));
    c.counts.push_back(get<int64_t>(in, file));
  }
  c.train.resize(train);
  c.test.resize(test);
  for (auto* set : {&c.train, &c.test}) {
    in.read(reinterpret_cast<char*>(set->data()), static_cast<std::streamsize>(set->size() * sizeof(CoEntry)));
    TERSE_CHECK(in.good(), InvalidArgument, "co-occurrence cache '" << file << "' is truncated");
    for (const CoEntry& e : *set)
      TERSE_CHECK(e.i >= 0 && e.j >= 0 && static_cast<uint64_t>(e.i) < words && static_cast<uint64_t>(e.j) < words &&
                      e.x > 0 && std::isfinite(e.x),
                  InvalidArgument, "co-occurrence cache '" << file << "' holds an invalid entry; delete it");
  }
  c.cache_file = file;
  c.from_cache = true;
  return c;
}

}  // namespace

void validateCooccurrenceOptions(const CooccurrenceOptions& o) {
  TERSE_CHECK(o.window >= 1 && o.window <= 1000, InvalidArgument,
              "glove.window must be in [1, 1000], got " << o.window);
  TERSE_CHECK(o.vocab_size >= 2 && o.vocab_size <= (int64_t{1} << 24), InvalidArgument,
              "glove.vocab_size must be in [2, 2^24], got " << o.vocab_size);
  TERSE_CHECK(o.min_count >= 1, InvalidArgument, "glove.min_count must be >= 1, got " << o.min_count);
  TERSE_CHECK(o.test_fraction >= 0 && o.test_fraction < 1, InvalidArgument,
              "glove.test_fraction must be in [0, 1), got " << o.test_fraction);
}

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && !isWordByte(static_cast<unsigned char>(text[i]))) ++i;
    const std::size_t start = i;
    while (i < text.size() && isWordByte(static_cast<unsigned char>(text[i]))) ++i;
    if (i == start) continue;
    std::string t(text.substr(start, i - start));
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    tokens.push_back(std::move(t));
  }
  return tokens;
}

Cooccurrence countCooccurrence(const std::vector<std::string>& texts, const CooccurrenceOptions& o) {
  validateCooccurrenceOptions(o);
  std::vector<std::vector<std::string>> files;
  std::unordered_map<std::string, int64_t> freq;
  Cooccurrence c;
  for (const std::string& t : texts) {
    files.push_back(tokenize(t));
    for (const std::string& w : files.back()) ++freq[w];
    c.tokens += static_cast<int64_t>(files.back().size());
  }
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& [w, n] : freq)
    if (n >= o.min_count) kept.emplace_back(w, n);
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int64_t>(kept.size()) > o.vocab_size) kept.resize(static_cast<std::size_t>(o.vocab_size));
  TERSE_CHECK(kept.size() >= 2, InvalidArgument,
              "glove: the corpus '" << o.corpus << "' has " << kept.size() << " word(s) with min_count " << o.min_count
                                    << "; at least 2 are needed");
  std::unordered_map<std::string, int32_t> id;
  for (const auto& [w, n] : kept) {
    id.emplace(w, static_cast<int32_t>(c.words.size()));
    c.words.push_back(w);
    c.counts.push_back(n);
  }

  std::unordered_map<uint64_t, double> x;
  for (const auto& tokens : files) {
    std::vector<int32_t> ids(tokens.size(), -1);
    for (std::size_t k = 0; k < tokens.size(); ++k) {
      const auto it = id.find(tokens[k]);
      if (it != id.end()) ids[k] = it->second;
    }
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0) continue;
      const std::size_t last = std::min(ids.size() - 1, k + static_cast<std::size_t>(o.window));
      for (std::size_t m = k + 1; m <= last; ++m) {
        if (ids[m] < 0) continue;
        const double w = 1.0 / static_cast<double>(m - k);
        const auto a = static_cast<uint64_t>(ids[k]), b = static_cast<uint64_t>(ids[m]);
        x[(a << 32) | b] += w;
        x[(b << 32) | a] += w;
      }
    }
  }
  TERSE_CHECK(!x.empty(), InvalidArgument,
              "glove: the corpus '" << o.corpus << "' has no two vocabulary words within a window of " << o.window);
  std::vector<std::pair<uint64_t, double>> entries(x.begin(), x.end());
  std::sort(entries.begin(), entries.end());
  const auto threshold = static_cast<uint64_t>(o.test_fraction * 0x1.0p64);
  for (const auto& [key, value] : entries) {
    const CoEntry e{static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xffffffffu),
                    static_cast<float>(value)};
    const bool held_out = o.test_fraction > 0 && mix(key ^ mix(o.split_seed)) < threshold;
    (held_out ? c.test : c.train).push_back(e);
  }
  TERSE_CHECK(!c.train.empty(), InvalidArgument, "glove: no training entries are left after the held-out split");
  return c;
}

Cooccurrence buildCooccurrence(const CooccurrenceOptions& o) {
  validateCooccurrenceOptions(o);
  std::vector<std::string> texts;
  for (const fs::path& f : corpusFiles(o.corpus)) texts.push_back(readAll(f));
  std::string file;
  if (!o.cache_dir.empty()) {
    uint64_t h = kFnv1aBasis;
    for (const std::string& t : texts) {
      const uint64_t n = t.size();
      h = fnv1a(h, &n, sizeof n);
      h = fnv1a(h, t.data(), t.size());
    }
    std::ostringstream key;
    key << o.window << ' ' << o.vocab_size << ' ' << o.min_count << ' ' << o.test_fraction << ' ' << o.split_seed;
    const std::string k = key.str();
    h = fnv1a(h, k.data(), k.size());
    std::ostringstream name;
    name << "glove-cooc-" << std::hex << h << ".bin";
    file = (fs::path(o.cache_dir) / name.str()).string();
    if (fs::exists(file)) return readCache(file);
  }
  Cooccurrence c = countCooccurrence(texts, o);
  if (!file.empty()) {
    std::error_code ec;
    fs::create_directories(o.cache_dir, ec);
    TERSE_CHECK(!ec, InvalidArgument, "glove.cache_dir '" << o.cache_dir << "' cannot be created: " << ec.message());
    writeCache(c, file);
    c.cache_file = file;
  }
  return c;
}

}  // namespace terse::workloads

// "Did you mean ...?" for names a user typed: a config's field or enum value, a command-line override's path, a
// variant named on the command line. One rule everywhere, so that a suggestion means the same thing in every message.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace terse {

// Levenshtein distance: insertions, deletions and substitutions, each 1.
inline std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `name`, when it is a typo away: fewer edits than a third of the name's length plus one
// (so "lrr" finds "lr", "sync-dens" finds "sync-dense", and "x" finds nothing), and fewer than the name's length, so a
// short name is not "corrected" into an unrelated one. Case differences count as edits but are tried first: "sspp"
// finds "SSP". The first of equally close candidates wins.
inline std::optional<std::string> closestName(std::string_view name, const std::vector<std::string>& candidates) {
  const auto lower = [](std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    return out;
  };
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(1, name.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t d = editDistance(lower(name), lower(candidate));
    if (d < best_distance && d < name.size() && candidate != name) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace terse

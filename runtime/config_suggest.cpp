#include "runtime/config_suggest.hpp"

#include <algorithm>
#include <vector>

namespace kvtier {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Longer inputs are never configuration words; bounding them keeps a fuzzed key from costing
// quadratic time.
constexpr std::size_t kMaxCompared = 64;

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  a = a.substr(0, kMaxCompared);
  b = b.substr(0, kMaxCompared);
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  // Three rolling rows: transpositions look two rows back.
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1])) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::optional<std::string_view> closest_match(std::string_view word,
                                              std::span<const std::string_view> candidates) {
  std::optional<std::string_view> best;
  std::size_t best_distance = 0;
  for (std::string_view c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (!best || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  if (!best) return std::nullopt;
  // One edit per three characters, at least one and at most three: "lru2" -> "lru", "capcity" ->
  // "capacity", but "foo" suggests nothing. Distance 0 is a case difference ("LRU"), worth naming.
  const std::size_t longest = std::max(word.size(), best->size());
  const std::size_t allowed = std::clamp<std::size_t>(longest / 3, 1, 3);
  if (best_distance > allowed) return std::nullopt;
  return best;
}

std::string join_words(std::span<const std::string_view> words) {
  std::string out;
  for (std::string_view w : words) {
    if (!out.empty()) out += ", ";
    out += w;
  }
  return out;
}

}  // namespace kvtier

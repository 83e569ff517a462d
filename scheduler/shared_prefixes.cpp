#include "scheduler/shared_prefixes.hpp"

#include <algorithm>
#include <cstddef>

namespace kvtier {

std::vector<uint32_t> shared_prefix_lengths(std::span<const std::span<const BlockKey>> contexts) {
  std::vector<uint32_t> shared(contexts.size(), 0);
  // Sequences, in batch order, that hold the same keys at depths [0, depth).
  struct Group {
    std::vector<uint32_t> members;
    uint32_t depth = 0;
  };
  std::vector<Group> work(1);
  for (uint32_t i = 0; i < contexts.size(); ++i) work[0].members.push_back(i);
  while (!work.empty()) {
    Group g = std::move(work.back());
    work.pop_back();
    for (;;) {
      std::vector<uint32_t>& m = g.members;
      const uint32_t d = g.depth;
      m.erase(
          std::remove_if(m.begin(), m.end(), [&](uint32_t i) { return contexts[i].size() <= d; }),
          m.end());
      if (m.size() < 2) break;
      // By key at this depth, then by position in the batch: the first of a run of equal keys is
      // the sequence that holds the block first, and every other one shares it.
      std::sort(m.begin(), m.end(), [&](uint32_t a, uint32_t b) {
        const BlockKey& ka = contexts[a][d];
        const BlockKey& kb = contexts[b][d];
        return ka != kb ? ka < kb : a < b;
      });
      std::vector<Group> split;
      for (std::size_t s = 0; s < m.size();) {
        std::size_t e = s + 1;
        while (e < m.size() && contexts[m[e]][d] == contexts[m[s]][d]) ++e;
        if (e - s >= 2) {
          for (std::size_t j = s + 1; j < e; ++j) shared[m[j]] = d + 1;
          split.push_back(Group{std::vector<uint32_t>(m.begin() + static_cast<std::ptrdiff_t>(s),
                                                      m.begin() + static_cast<std::ptrdiff_t>(e)),
                                d + 1});
        }
        s = e;
      }
      if (split.size() == 1 && split[0].members.size() == m.size()) {
        ++g.depth;  // nobody left the group: walk on without copying it
        continue;
      }
      for (Group& s : split) work.push_back(std::move(s));
      break;
    }
  }
  return shared;
}

}  // namespace kvtier

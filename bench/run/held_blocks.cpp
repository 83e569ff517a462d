// See held_blocks.hpp.
#include "bench/run/held_blocks.hpp"

#include <algorithm>

namespace kvtier::bench::run {

uint64_t HeldBlocks::estimate(std::span<const BlockKey> prompt_keys, uint64_t pages) const {
  uint64_t shared = 0;
  for (; shared < prompt_keys.size(); ++shared) {
    auto it = held_.find(prompt_keys[shared]);
    if (it == held_.end() || !it->second.computed) break;
  }
  return (pages - std::min(pages, shared)) * layers_;
}

HeldBlocks::Share HeldBlocks::add(std::span<const BlockKey> prompt_keys, uint32_t reused,
                                  uint64_t pages) {
  Share share;
  for (std::size_t b = 0; b < prompt_keys.size(); ++b) {
    auto it = held_.find(prompt_keys[b]);
    if (it == held_.end()) {
      held_.emplace(prompt_keys[b], Held{1, b < reused});
    } else if (b < reused) {
      ++it->second.requests;
      it->second.computed = true;
    } else {
      continue;  // computed again beside a running request that holds it: a copy of its own
    }
    share.keys.push_back(prompt_keys[b]);
  }
  share.own_pages = pages - std::min<uint64_t>(pages, share.keys.size());
  own_pages_ += share.own_pages;
  return share;
}

void HeldBlocks::computed(std::span<const BlockKey> keys) {
  for (const BlockKey& key : keys) {
    auto it = held_.find(key);
    if (it != held_.end()) it->second.computed = true;
  }
}

void HeldBlocks::remove(const Share& share) {
  for (const BlockKey& key : share.keys) {
    auto it = held_.find(key);
    if (it != held_.end() && --it->second.requests == 0) held_.erase(it);
  }
  own_pages_ -= std::min(own_pages_, share.own_pages);
}

}  // namespace kvtier::bench::run

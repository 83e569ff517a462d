// HeldBlocks: the HBM frames the running requests' KV takes, with prompt blocks requests share
// counted once, as a serving engine's block manager counts them (a block reused from the prefix
// cache is referenced, not copied).
//
// Per request: the content keys of its prompt blocks go into a table of keys with the number of
// running requests that hold each; a key goes in when the request reused that block, or computes
// it and no running request holds it yet (a later request reuses it from there). A block the
// request computes while another running request holds the same key (both prefill the same prompt
// at once: neither could reuse the other's unfinished block) is a copy of its own, as are its
// partial last prompt block and its output. Frames = (distinct keys + own pages) x layers.
// estimate() tells admission what a request would add before it is opened: its leading prompt
// blocks held already, the rest its own.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.hpp"

namespace kvtier::bench::run {

class HeldBlocks {
 public:
  explicit HeldBlocks(uint32_t layers) : layers_(layers) {}

  // A request's share, kept by the caller and handed back to remove().
  struct Share {
    std::vector<BlockKey> keys;  // its keys in the table
    uint64_t own_pages = 0;
  };

  // Frames a request of `pages` pages whose prompt blocks have `prompt_keys` would add if it
  // reused every leading block the running requests hold.
  uint64_t estimate(std::span<const BlockKey> prompt_keys, uint64_t pages) const;
  // Adds a request that reused its first `reused` prompt blocks.
  Share add(std::span<const BlockKey> prompt_keys, uint32_t reused, uint64_t pages);
  void remove(const Share& share);
  uint64_t frames() const { return (held_.size() + own_pages_) * layers_; }

 private:
  uint32_t layers_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> held_;  // key -> running requests
  uint64_t own_pages_ = 0;
};

}  // namespace kvtier::bench::run

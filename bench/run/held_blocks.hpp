// HeldBlocks: the HBM frames the running requests' KV takes, with prompt blocks requests share
// counted once, as a serving engine's block manager counts them (a block reused from the prefix
// cache is referenced, not copied).
//
// Per request: the content keys of its prompt blocks go into a table of keys with the number of
// running requests that hold each; a key goes in when the request reused that block, or computes
// it and no running request holds it yet (a later request reuses it from there once computed). A
// block the request computes while another running request holds the same key (both prefill the
// same prompt at once: neither could reuse the other's unfinished block) is a copy of its own, as
// are its partial last prompt block and its output. Frames = (distinct keys + own pages) x layers.
// estimate() tells admission what a request would add before it is opened: its leading prompt
// blocks held already and computed (a block still being prefilled cannot be reused), the rest its
// own; computed() marks blocks as their prefill ends.
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
  // reused every leading block the running requests hold and have computed.
  uint64_t estimate(std::span<const BlockKey> prompt_keys, uint64_t pages) const;
  // Adds a request that reused its first `reused` prompt blocks.
  Share add(std::span<const BlockKey> prompt_keys, uint32_t reused, uint64_t pages);
  // The blocks of `keys` are computed now (a request's prefill wrote them).
  void computed(std::span<const BlockKey> keys);
  void remove(const Share& share);
  uint64_t frames() const { return (held_.size() + own_pages_) * layers_; }

 private:
  struct Held {
    uint32_t requests = 0;  // running requests that hold it
    bool computed = false;  // reusable: reused by a request, or its prefill ended
  };
  uint32_t layers_;
  std::unordered_map<BlockKey, Held, BlockKeyHash> held_;
  uint64_t own_pages_ = 0;
};

}  // namespace kvtier::bench::run

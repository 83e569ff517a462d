// Block keys: 128-bit content identities of full KV blocks, chained over the prefix.
//
// Equal keys mean equal KV, across processes and machines, so the hash is fixed byte for byte:
//
//   root(ns)        = XXH3_128bits_withSeed(bytes("kvtier.ns.v1:") ++ bytes(ns), seed = 0)
//   key(parent, t)  = XXH3_128bits_withSeed(le64(parent.lo) ++ le64(parent.hi)
//                                           ++ le32(t[0]) ++ ... ++ le32(t[n-1]), seed = 0)
//                     with its namespace tag stamped into the top 16 bits of `hi` (below)
//
// where the first block's parent is root(ns), `t` are the block's page_tokens token ids (a block
// spans page_tokens tokens across all layers), le64/le32 are little-endian encodings and `lo`/`hi`
// are XXH128_hash_t's low64/high64. The top 16 bits of `hi` carry the namespace tag, tag(ns) =
// (root(ns).hi >> 48) | 1 (never 0), so a key presented under the wrong namespace is detected
// without a lookup. Tag 0 marks private keys (the still-growing last block of one sequence, which
// has no content identity and is never shared). A partial block has no content key.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

struct BlockKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  constexpr uint16_t namespace_tag() const { return static_cast<uint16_t>(hi >> 48); }
  constexpr bool is_private() const { return namespace_tag() == 0; }
  constexpr bool is_null() const { return lo == 0 && hi == 0; }

  friend constexpr bool operator==(const BlockKey&, const BlockKey&) = default;
  friend constexpr auto operator<=>(const BlockKey&, const BlockKey&) = default;
};

// 32 lower-case hex digits, hi then lo ("0123...cdef").
std::string to_string(const BlockKey& key);

// The chain root of a namespace (model, adapter, tenant...).
BlockKey namespace_root(std::string_view key_namespace);
uint16_t namespace_tag(std::string_view key_namespace);

// Key of one full block whose parent is `parent` (namespace_root for the first block).
BlockKey chain_block_key(const BlockKey& parent, std::span<const uint32_t> block_tokens);

// Keys of every FULL block of `tokens` (tokens.size() / block_tokens of them, block_tokens being
// the geometry's page_tokens); a trailing partial block gets no key.
std::vector<BlockKey> chain_block_keys(std::string_view key_namespace,
                                       std::span<const uint32_t> tokens, uint32_t block_tokens);

// A private key for the still-growing block `index` of sequence `sequence_id`: tag 0, unique per
// (sequence, index) within one process.
constexpr BlockKey private_block_key(uint64_t sequence_id, uint64_t index) {
  return BlockKey{sequence_id, index & 0x0000'FFFF'FFFF'FFFFull};
}

struct BlockKeyHash {
  std::size_t operator()(const BlockKey& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

}  // namespace kvtier

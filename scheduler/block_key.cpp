#include "kvtier/block_key.hpp"

#include <xxhash.h>

#include <cstring>
#include <memory>

namespace kvtier {
namespace {

constexpr std::string_view kNamespacePrefix = "kvtier.ns.v1:";
constexpr uint64_t kTagMask = 0xFFFFull << 48;

void put_le64(unsigned char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_le32(unsigned char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

BlockKey stamp_tag(XXH128_hash_t h, uint16_t tag) {
  return BlockKey{h.low64, (h.high64 & ~kTagMask) | (static_cast<uint64_t>(tag) << 48)};
}

uint16_t tag_of_root_hash(XXH128_hash_t h) { return static_cast<uint16_t>((h.high64 >> 48) | 1u); }

XXH128_hash_t root_hash(std::string_view key_namespace) {
  std::string bytes(kNamespacePrefix);
  bytes.append(key_namespace);
  return XXH3_128bits_withSeed(bytes.data(), bytes.size(), 0);
}

}  // namespace

std::string to_string(const BlockKey& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) out[15 - i] = kHex[(key.hi >> (4 * i)) & 0xF];
  for (int i = 0; i < 16; ++i) out[31 - i] = kHex[(key.lo >> (4 * i)) & 0xF];
  return out;
}

uint16_t namespace_tag(std::string_view key_namespace) {
  return tag_of_root_hash(root_hash(key_namespace));
}

BlockKey namespace_root(std::string_view key_namespace) {
  const XXH128_hash_t h = root_hash(key_namespace);
  return stamp_tag(h, tag_of_root_hash(h));
}

BlockKey chain_block_key(const BlockKey& parent, std::span<const uint32_t> block_tokens) {
  // One contiguous little-endian buffer, so the hash is the same on every host byte order.
  constexpr std::size_t kStackTokens = 512;
  unsigned char stack_buf[16 + 4 * kStackTokens];
  std::unique_ptr<unsigned char[]> heap_buf;
  unsigned char* buf = stack_buf;
  const std::size_t bytes = 16 + 4 * block_tokens.size();
  if (block_tokens.size() > kStackTokens) {
    heap_buf.reset(new unsigned char[bytes]);
    buf = heap_buf.get();
  }
  put_le64(buf, parent.lo);
  put_le64(buf + 8, parent.hi);
  for (std::size_t i = 0; i < block_tokens.size(); ++i) put_le32(buf + 16 + 4 * i, block_tokens[i]);
  return stamp_tag(XXH3_128bits_withSeed(buf, bytes, 0), parent.namespace_tag());
}

std::vector<BlockKey> chain_block_keys(std::string_view key_namespace,
                                       std::span<const uint32_t> tokens, uint32_t block_tokens) {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  keys.reserve(tokens.size() / block_tokens);
  BlockKey parent = namespace_root(key_namespace);
  for (std::size_t start = 0; start + block_tokens <= tokens.size(); start += block_tokens) {
    parent = chain_block_key(parent, tokens.subspan(start, block_tokens));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace kvtier

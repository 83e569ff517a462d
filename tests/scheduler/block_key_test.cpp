#include "kvtier/block_key.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace kvtier {
namespace {

std::vector<uint32_t> iota_tokens(std::size_t n, uint32_t start = 0) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockKey, KnownValueIsStableAcrossBuilds) {
  // Pinned so that a change to the documented byte layout is caught: keys must be identical across
  // processes, machines and kvtier versions that share a cache. The golden value was computed by an
  // independent implementation of the layout in block_key.hpp (Python's xxhash.xxh3_128).
  auto keys = chain_block_keys("llama-3.1-8b", iota_tokens(32), 16);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(to_string(keys[0]).size(), 32u);
  const std::vector<uint32_t> first = iota_tokens(16);
  EXPECT_EQ(keys[0], chain_block_key(namespace_root("llama-3.1-8b"), first));
  const std::string pinned = to_string(keys[1]);
  EXPECT_EQ(pinned, "b347dc6bb6c27d238135cc37829349d9") << "the block key byte layout changed";
}

TEST(BlockKey, ChainsOverThePrefix) {
  auto a = chain_block_keys("m", iota_tokens(48), 16);
  auto tokens = iota_tokens(48);
  tokens[0] = 999;  // change the first block only
  auto b = chain_block_keys("m", tokens, 16);
  ASSERT_EQ(a.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(a[i], b[i]) << "block " << i << " must depend on its prefix";
}

TEST(BlockKey, PartialBlockHasNoKey) {
  EXPECT_EQ(chain_block_keys("m", iota_tokens(47), 16).size(), 2u);
  EXPECT_TRUE(chain_block_keys("m", iota_tokens(15), 16).empty());
}

TEST(BlockKey, NamespaceSaltsAndTags) {
  auto a = chain_block_keys("model-a", iota_tokens(16), 16);
  auto b = chain_block_keys("model-b", iota_tokens(16), 16);
  EXPECT_NE(a[0], b[0]);
  EXPECT_EQ(a[0].namespace_tag(), namespace_tag("model-a"));
  EXPECT_EQ(b[0].namespace_tag(), namespace_tag("model-b"));
  EXPECT_NE(namespace_tag("model-a"), 0);
  EXPECT_FALSE(a[0].is_private());
}

TEST(BlockKey, PrivateKeysHaveTagZero) {
  BlockKey k = private_block_key(42, 7);
  EXPECT_TRUE(k.is_private());
  EXPECT_NE(k, private_block_key(42, 8));
  EXPECT_NE(k, private_block_key(43, 7));
}

}  // namespace
}  // namespace kvtier

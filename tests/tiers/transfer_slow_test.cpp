// The long version of transfer_stress_test (label `slow`, opt-in: `make test-slow`).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

// Many rounds of fill -> write -> read back -> verify -> erase over a store sized to wrap many
// times, so extents are reused thousands of times under concurrency.
TEST(TransferSlow, StoreWrapsManyTimesUnderConcurrency) {
  const Geometry g = testing::small_geometry(Dtype::kBF16, 8, 16, 4, 64);  // 16 KiB pages
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  NvmeStoreOptions o;
  o.config.paths = {dir.file("slow0.kvs"), dir.file("slow1.kvs")};
  o.config.capacity_bytes = 64 * (g.block_bytes() + 4096);
  o.config.queue_depth = 32;
  o.config.io_threads = 2;
  auto store = NvmeStore::create(g, std::move(o));
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  NvmeStore& s = **store;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      testing::AlignedPages src(g.layers, s.page_io_bytes());
      testing::AlignedPages dst(g.layers, s.page_io_bytes());
      for (uint64_t i = 0; i < 10000; ++i) {
        const uint64_t id = (uint64_t(t) << 40) | i;
        src.fill(id, g.page_bytes());
        auto w = s.write_block(testing::test_key(id), src.const_pages());
        if (!w.ok() || !w->wait().ok()) {
          ++failures;
          continue;
        }
        dst.scribble();
        auto r = s.read_block(testing::test_key(id), dst.pages());
        if (!r.ok() || !r->wait().ok() || !dst.matches(id, g.page_bytes())) ++failures;
        if (!s.erase(testing::test_key(id)).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(s.used_blocks(), 0u);
  EXPECT_TRUE(s.audit().ok());
}

}  // namespace
}  // namespace kvtier

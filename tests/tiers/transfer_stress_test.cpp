// Thousands of concurrent transfers over every link at once, from several threads, checked byte
// for byte (within e4m3's bound when a tier below HBM holds fp8: the copy engine's and the
// converting store's codecs then run on their threads too), with exact accounting at the end.
// Labelled `stress` (run again under TSan by `make tsan`); the longer variant is labelled `slow`.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "tests/tiers/fp8_test_support.hpp"
#include "tests/tiers/tier_test_support.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

const Geometry kGeom = testing::small_geometry(Dtype::kF16, 2, 8, 1, 64);  // 2 KiB pages

// Each thread owns a slice of HBM and host frames and its own keys, and cycles
// HBM -> host -> NVMe -> host -> HBM with several transfers in flight at a time.
void run_stress(int threads, int rounds, int in_flight,
                TierKvDtype host_dtype = TierKvDtype::kModel,
                TierKvDtype nvme_dtype = TierKvDtype::kModel) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint32_t slice = 2 * kGeom.layers * static_cast<uint32_t>(in_flight) * 2;
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = uint64_t{slice} * static_cast<uint64_t>(threads) * 4096;
  c.host.capacity_bytes = uint64_t{slice} * static_cast<uint64_t>(threads) * 4096;
  c.nvme.paths = {dir.file("stress0.kvs"), dir.file("stress1.kvs")};
  c.nvme.capacity_bytes =
      static_cast<uint64_t>(threads) * in_flight * 2 * (kGeom.block_bytes() + 4096 + 1024);
  c.nvme.queue_depth = 16;
  c.nvme.io_threads = 2;
  c.host.kv_dtype = host_dtype;
  c.nvme.kv_dtype = nvme_dtype;
  const bool lossy = nvme_dtype == TierKvDtype::kFp8E4M3;  // the host is fp8 only over fp8 NVMe
  auto opened = open_tiers(c, kGeom);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  TierStack& s = **opened;
  const std::size_t page = kGeom.page_bytes();
  const uint32_t L = kGeom.layers;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> transfers{0};

  auto worker = [&](int t) {
    const uint32_t base = static_cast<uint32_t>(t) * slice;
    for (int r = 0; r < rounds; ++r) {
      struct Item {
        BlockKey key;
        uint64_t seed;
        std::vector<uint32_t> hbm, host, host_back, hbm_back;
      };
      std::vector<Item> items(in_flight);
      for (int i = 0; i < in_flight; ++i) {
        Item& it = items[i];
        it.key = testing::test_key((uint64_t(t) << 32) | (uint64_t(r) << 8) | i);
        it.seed = it.key.lo;
        for (uint32_t l = 0; l < L; ++l) {
          const uint32_t k = static_cast<uint32_t>(i) * L + l;
          it.hbm.push_back(base + k);
          it.host.push_back(base + slice / 2 + k);
          it.host_back.push_back(base + slice / 2 + slice / 4 + k);
          it.hbm_back.push_back(base + slice / 2 + k);
          if (lossy) {
            testing::fill_values(s.hbm->frame_address(base + k), kGeom, it.seed + l);
          } else {
            testing::fill_pattern(s.hbm->frame_address(base + k), page, it.seed + l);
          }
        }
      }
      auto pairs = [](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
        std::vector<FramePair> p;
        for (std::size_t i = 0; i < a.size(); ++i) p.push_back({a[i], b[i]});
        return p;
      };
      auto run_all = [&](auto&& submit) {
        std::vector<Transfer> ts;
        for (Item& it : items) {
          auto tr = submit(it);
          if (!tr.ok()) {
            ++failures;
            continue;
          }
          ts.push_back(std::move(tr).value());
        }
        for (Transfer& x : ts) {
          if (!x.wait().ok()) ++failures;
          ++transfers;
        }
      };
      run_all([&](Item& it) {
        return s.engine->copy(CopyDirection::kHbmToHost, pairs(it.hbm, it.host));
      });
      run_all([&](Item& it) { return s.engine->write_block(it.key, it.host); });
      run_all([&](Item& it) { return s.engine->read_block(it.key, it.host_back); });
      run_all([&](Item& it) {
        return s.engine->copy(CopyDirection::kHostToHbm, pairs(it.host_back, it.hbm_back));
      });
      std::vector<std::byte> orig(page);
      for (Item& it : items) {
        for (uint32_t l = 0; l < L; ++l) {
          const std::byte* back = s.hbm->frame_address(it.hbm_back[l]);
          if (lossy) {
            testing::fill_values(orig.data(), kGeom, it.seed + l);
            if (!testing::within_fp8_bound(orig.data(), back, kGeom)) ++failures;
          } else if (!testing::matches_pattern(back, page, it.seed + l)) {
            ++failures;
          }
        }
        if (!s.nvme->erase(it.key).ok()) ++failures;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& th : pool) th.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(transfers.load(), uint64_t(threads) * rounds * in_flight * 4);
  EXPECT_TRUE(s.hbm->audit().ok());
  EXPECT_TRUE(s.host->audit().ok());
  Status a = s.nvme->audit();
  EXPECT_TRUE(a.ok()) << a.to_string();
  EXPECT_EQ(s.nvme->used_blocks(), 0u);
  const auto& st = *s.stats;
  uint64_t ops = 0;
  for (Link l : kAllLinks) ops += st.link(l).ops.load();
  EXPECT_EQ(ops, transfers.load());
  EXPECT_EQ(st.checksum_failures.load(), 0u);
}

TEST(TransferStress, ThousandsOfConcurrentTransfers) { run_stress(4, 25, 8); }  // 3200 transfers

TEST(TransferStress, ThousandsOfConcurrentTransfersThroughFp8Tiers) {
  run_stress(4, 10, 8, TierKvDtype::kModel, TierKvDtype::kFp8E4M3);    // converting store
  run_stress(4, 10, 8, TierKvDtype::kFp8E4M3, TierKvDtype::kFp8E4M3);  // copy engine codec
}

}  // namespace
}  // namespace kvtier

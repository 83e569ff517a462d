// One conformance suite, run against every tier: the emulated HBM arena, the host pool and the
// NVMe store (the CUDA HBM arena is covered by cuda_tier_test where a GPU exists). Each tier is
// driven through a small adapter that stores and loads whole blocks, so the same expectations —
// bit-exact round trips, exhaustion at capacity without side effects, reuse after removal,
// concurrent use, exact accounting after every test — apply to all of them.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/hbm_arena.hpp"
#include "tiers/host_pool.hpp"
#include "tiers/nvme_store.hpp"

namespace kvtier {
namespace {

using testing::fill_pattern;
using testing::matches_pattern;

class TierUnderTest {
 public:
  virtual ~TierUnderTest() = default;
  virtual uint64_t capacity_blocks() = 0;
  virtual uint64_t used_blocks() = 0;
  virtual Status put(uint64_t id, uint64_t seed) = 0;
  virtual Result<bool> matches(uint64_t id, uint64_t seed) = 0;
  virtual Status remove(uint64_t id) = 0;
  virtual bool contains(uint64_t id) = 0;
  virtual Status audit() = 0;
  virtual std::size_t live() = 0;  // blocks the adapter believes are stored
};

// A block in a frame arena: `layers` frames from the arena's allocator.
class ArenaTier final : public TierUnderTest {
 public:
  explicit ArenaTier(std::unique_ptr<FrameArena> arena) : arena_(std::move(arena)) {}

  uint64_t capacity_blocks() override { return arena_->frame_count() / arena_->geometry().layers; }
  uint64_t used_blocks() override { return arena_->allocator().used() / arena_->geometry().layers; }

  Status put(uint64_t id, uint64_t seed) override {
    const uint32_t layers = arena_->geometry().layers;
    std::vector<uint32_t> frames;
    for (uint32_t l = 0; l < layers; ++l) {
      auto f = arena_->allocator().allocate();
      if (!f.ok()) {
        for (uint32_t g : frames) arena_->allocator().free(g).ignore();
        return std::move(f).status();
      }
      frames.push_back(*f);
    }
    for (uint32_t l = 0; l < layers; ++l) {
      fill_pattern(arena_->frame_address(frames[l]), arena_->page_bytes(), seed * 1000 + l);
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[id] = std::move(frames);
    return Status();
  }

  Result<bool> matches(uint64_t id, uint64_t seed) override {
    std::vector<uint32_t> frames;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(id);
      if (it == blocks_.end()) return not_found("no block " + std::to_string(id));
      frames = it->second;
    }
    for (uint32_t l = 0; l < frames.size(); ++l) {
      if (!matches_pattern(arena_->frame_address(frames[l]), arena_->page_bytes(),
                           seed * 1000 + l)) {
        return false;
      }
    }
    return true;
  }

  Status remove(uint64_t id) override {
    std::vector<uint32_t> frames;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(id);
      if (it == blocks_.end()) return not_found("no block " + std::to_string(id));
      frames = std::move(it->second);
      blocks_.erase(it);
    }
    for (uint32_t f : frames) KVTIER_RETURN_IF_ERROR(arena_->allocator().free(f));
    return Status();
  }

  bool contains(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.count(id) != 0;
  }
  Status audit() override { return arena_->audit(); }
  std::size_t live() override {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.size();
  }

 private:
  std::unique_ptr<FrameArena> arena_;
  std::mutex mu_;
  std::map<uint64_t, std::vector<uint32_t>> blocks_;
};

// A block in the NVMe store, written from and read into per-call aligned buffers.
class StoreTier final : public TierUnderTest {
 public:
  StoreTier(std::unique_ptr<testing::TempDir> dir, std::unique_ptr<NvmeStore> store)
      : dir_(std::move(dir)), store_(std::move(store)) {}
  ~StoreTier() override { store_.reset(); }

  uint64_t capacity_blocks() override { return store_->capacity_blocks(); }
  uint64_t used_blocks() override { return store_->used_blocks(); }

  Status put(uint64_t id, uint64_t seed) override {
    Buffers b(*store_);
    for (uint32_t l = 0; l < b.pages.size(); ++l) {
      fill_pattern(b.pages[l], store_->geometry().page_bytes(), seed * 1000 + l);
    }
    std::vector<const std::byte*> src(b.pages.begin(), b.pages.end());
    KVTIER_ASSIGN_OR_RETURN(Transfer t, store_->write_block(testing::test_key(id), src));
    return t.wait();
  }

  Result<bool> matches(uint64_t id, uint64_t seed) override {
    Buffers b(*store_);
    KVTIER_ASSIGN_OR_RETURN(Transfer t, store_->read_block(testing::test_key(id), b.pages));
    KVTIER_RETURN_IF_ERROR(t.wait());
    for (uint32_t l = 0; l < b.pages.size(); ++l) {
      if (!matches_pattern(b.pages[l], store_->geometry().page_bytes(), seed * 1000 + l)) {
        return false;
      }
    }
    return true;
  }

  Status remove(uint64_t id) override { return store_->erase(testing::test_key(id)); }
  bool contains(uint64_t id) override { return store_->contains(testing::test_key(id)); }
  Status audit() override { return store_->audit(); }
  std::size_t live() override { return store_->keys().size(); }

 private:
  struct Buffers {
    explicit Buffers(const NvmeStore& s) {
      const std::size_t n = s.geometry().layers;
      bytes.reset(static_cast<std::byte*>(
          std::aligned_alloc(4096, n * 4096 * ((s.page_io_bytes() + 4095) / 4096))));
      for (std::size_t l = 0; l < n; ++l) {
        pages.push_back(bytes.get() + l * 4096 * ((s.page_io_bytes() + 4095) / 4096));
      }
    }
    struct Free {
      void operator()(std::byte* p) const { std::free(p); }
    };
    std::unique_ptr<std::byte, Free> bytes;
    std::vector<std::byte*> pages;
  };

  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<NvmeStore> store_;
};

struct TierParam {
  std::string name;
  std::function<std::unique_ptr<TierUnderTest>()> make;
};

const Geometry kGeometry = testing::small_geometry(Dtype::kBF16, 4, 16, 2, 64);  // 8 KiB pages

std::vector<TierParam> tiers() {
  return {
      {"emulated_hbm",
       [] {
         HbmTierConfig c;
         c.capacity_bytes = 48 * kGeometry.page_bytes();
         c.backend = HbmBackend::kEmulated;
         auto a = HbmArena::create(c, kGeometry, nullptr);
         EXPECT_TRUE(a.ok()) << a.status().to_string();
         return std::unique_ptr<TierUnderTest>(std::make_unique<ArenaTier>(std::move(a).value()));
       }},
      {"host_pool",
       [] {
         HostTierConfig c;
         c.capacity_bytes = 48 * kGeometry.page_bytes();
         auto p = HostPool::create(c, kGeometry, nullptr);
         EXPECT_TRUE(p.ok()) << p.status().to_string();
         return std::unique_ptr<TierUnderTest>(std::make_unique<ArenaTier>(std::move(p).value()));
       }},
      {"nvme_store",
       [] {
         auto dir = std::make_unique<testing::TempDir>();
         EXPECT_TRUE(dir->ok());
         NvmeStoreOptions o;
         o.config.paths = {dir->file("store0.kvs")};
         o.config.queue_depth = 8;
         o.config.capacity_bytes = 12 * (kGeometry.block_bytes() + 4096);
         auto s = NvmeStore::create(kGeometry, std::move(o));
         EXPECT_TRUE(s.ok()) << s.status().to_string();
         return std::unique_ptr<TierUnderTest>(
             std::make_unique<StoreTier>(std::move(dir), std::move(s).value()));
       }},
  };
}

class TierConformance : public ::testing::TestWithParam<TierParam> {
 protected:
  void SetUp() override {
    tier_ = GetParam().make();
    ASSERT_NE(tier_, nullptr);
  }
  // Exact accounting after every test: the tier's own audit, and what it holds is what we stored.
  void TearDown() override {
    if (!tier_) return;
    Status a = tier_->audit();
    EXPECT_TRUE(a.ok()) << a.to_string();
    EXPECT_EQ(tier_->used_blocks(), tier_->live());
  }
  std::unique_ptr<TierUnderTest> tier_;
};

TEST_P(TierConformance, StartsEmpty) {
  EXPECT_GT(tier_->capacity_blocks(), 0u);
  EXPECT_EQ(tier_->used_blocks(), 0u);
  EXPECT_FALSE(tier_->contains(1));
}

TEST_P(TierConformance, RoundTripIsBitExact) {
  for (uint64_t id = 0; id < 5; ++id) ASSERT_TRUE(tier_->put(id, id + 17).ok());
  for (uint64_t id = 0; id < 5; ++id) {
    auto m = tier_->matches(id, id + 17);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_TRUE(*m) << "block " << id;
    auto wrong = tier_->matches(id, id + 18);
    ASSERT_TRUE(wrong.ok());
    EXPECT_FALSE(*wrong) << "the comparison must be able to fail";
  }
  EXPECT_EQ(tier_->used_blocks(), 5u);
}

TEST_P(TierConformance, FullTierRefusesWithoutSideEffects) {
  const uint64_t cap = tier_->capacity_blocks();
  for (uint64_t id = 0; id < cap; ++id) ASSERT_TRUE(tier_->put(id, id).ok()) << id;
  Status s = tier_->put(cap, 99);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_FALSE(tier_->contains(cap));
  EXPECT_EQ(tier_->used_blocks(), cap);
  for (uint64_t id = 0; id < cap; ++id) {
    auto m = tier_->matches(id, id);
    ASSERT_TRUE(m.ok() && *m) << id;
  }
}

TEST_P(TierConformance, RemovedSpaceIsReused) {
  const uint64_t cap = tier_->capacity_blocks();
  for (uint64_t id = 0; id < cap; ++id) ASSERT_TRUE(tier_->put(id, id).ok());
  ASSERT_TRUE(tier_->remove(2).ok());
  EXPECT_FALSE(tier_->contains(2));
  EXPECT_EQ(tier_->remove(2).code(), StatusCode::kNotFound);
  ASSERT_TRUE(tier_->put(1000, 1000).ok());
  auto m = tier_->matches(1000, 1000);
  ASSERT_TRUE(m.ok() && *m);
  for (uint64_t id = 0; id < cap; ++id) {
    if (id == 2) continue;
    auto k = tier_->matches(id, id);
    ASSERT_TRUE(k.ok() && *k) << "block " << id << " changed when its neighbour was replaced";
  }
}

TEST_P(TierConformance, ConcurrentUseKeepsDataAndAccounting) {
  constexpr int kThreads = 4;
  const uint64_t per_thread = tier_->capacity_blocks() / kThreads;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 6; ++round) {
        for (uint64_t i = 0; i < per_thread; ++i) {
          const uint64_t id = t * 1000 + i;
          if (!tier_->put(id, id * 31 + round).ok()) ++failures;
        }
        for (uint64_t i = 0; i < per_thread; ++i) {
          const uint64_t id = t * 1000 + i;
          auto m = tier_->matches(id, id * 31 + round);
          if (!m.ok() || !*m) ++failures;
          if (round < 5 && !tier_->remove(id).ok()) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier_->used_blocks(), per_thread * kThreads);
}

INSTANTIATE_TEST_SUITE_P(AllTiers, TierConformance, ::testing::ValuesIn(tiers()),
                         [](const ::testing::TestParamInfo<TierParam>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace kvtier

#include "tiers/frame_allocator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

std::unique_ptr<FrameAllocator> make(uint32_t n) {
  auto r = FrameAllocator::create(n);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(FrameAllocator, AllocatesEveryFrameOnceThenExhausts) {
  auto a = make(100);
  std::set<uint32_t> seen;
  for (int i = 0; i < 100; ++i) {
    auto f = a->allocate();
    ASSERT_TRUE(f.ok());
    EXPECT_LT(*f, 100u);
    EXPECT_TRUE(seen.insert(*f).second) << "frame handed out twice: " << *f;
  }
  auto none = a->allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a->used(), 100u);
  EXPECT_EQ(a->free_count(), 0u);
  ASSERT_TRUE(a->audit().ok());
}

TEST(FrameAllocator, DoubleFreeAndOutOfRangeAreErrors) {
  auto a = make(8);
  auto f = a->allocate();
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(a->free(*f).ok());
  Status twice = a->free(*f);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("double free"), std::string::npos);
  EXPECT_EQ(a->free(8).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(a->free(3).code(), StatusCode::kFailedPrecondition);  // never allocated
  EXPECT_EQ(a->used(), 0u);
  ASSERT_TRUE(a->audit().ok());
}

TEST(FrameAllocator, ARetiredFrameIsNeverHandedOutAgain) {
  auto a = make(4);
  auto bad = a->allocate();
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE(a->retire(*bad).ok());
  EXPECT_EQ(a->retired(), 1u);
  EXPECT_EQ(a->in_service(), 3u);
  EXPECT_EQ(a->used(), 0u);
  EXPECT_EQ(a->free_count(), 3u);
  EXPECT_FALSE(a->is_allocated(*bad));
  ASSERT_TRUE(a->audit().ok()) << a->audit().to_string();
  // Frees and allocations cycle through the three in service only: the freed frame is the next
  // one handed out (the stacks are LIFO), so a retired one coming back would show at once.
  std::set<uint32_t> seen;
  for (int round = 0; round < 3; ++round) {
    std::vector<uint32_t> held;
    for (int i = 0; i < 3; ++i) {
      auto f = a->allocate();
      ASSERT_TRUE(f.ok());
      EXPECT_NE(*f, *bad);
      seen.insert(*f);
      held.push_back(*f);
    }
    EXPECT_EQ(a->allocate().status().code(), StatusCode::kResourceExhausted);
    for (uint32_t f : held) ASSERT_TRUE(a->free(f).ok());
  }
  EXPECT_EQ(seen.size(), 3u);
  // Misuse is an error that changes nothing.
  Status twice = a->retire(*bad);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("retired already"), std::string::npos) << twice.message();
  Status freed = a->free(*bad);
  EXPECT_EQ(freed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(freed.message().find("retired"), std::string::npos) << freed.message();
  EXPECT_EQ(a->retire(4).code(), StatusCode::kOutOfRange);
  const uint32_t free_one = *bad == 0 ? 1 : 0;
  EXPECT_NE(a->retire(free_one).message().find("not allocated"), std::string::npos);
  const uint32_t wanted[] = {*bad};
  EXPECT_EQ(a->reserve_all(wanted).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->retired(), 1u);
  ASSERT_TRUE(a->audit().ok()) << a->audit().to_string();
}

TEST(FrameAllocator, AnUnretiredFrameIsFreeAndHandedOutAgain) {
  auto a = make(4);
  std::vector<uint32_t> held;
  for (int i = 0; i < 4; ++i) held.push_back(*a->allocate());
  ASSERT_TRUE(a->retire(held[1]).ok());
  ASSERT_TRUE(a->retire(held[2]).ok());
  EXPECT_TRUE(a->is_retired(held[1]));
  EXPECT_EQ(a->in_service(), 2u);
  // Misuse is an error that changes nothing.
  EXPECT_EQ(a->unretire(held[0]).code(), StatusCode::kFailedPrecondition);  // allocated
  EXPECT_NE(a->unretire(held[0]).message().find("not retired"), std::string::npos);
  EXPECT_EQ(a->unretire(4).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(a->retired(), 2u);

  ASSERT_TRUE(a->unretire(held[1]).ok());
  EXPECT_FALSE(a->is_retired(held[1]));
  EXPECT_EQ(a->retired(), 1u);
  EXPECT_EQ(a->in_service(), 3u);
  EXPECT_EQ(a->used(), 2u);  // held[0] and held[3]
  EXPECT_EQ(a->free_count(), 1u);
  ASSERT_TRUE(a->audit().ok()) << a->audit().to_string();
  auto back = a->allocate();
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, held[1]);
  EXPECT_EQ(a->unretire(held[1]).code(), StatusCode::kFailedPrecondition);  // allocated again

  // unretire_up_to takes back as many as asked, and no more than there are.
  EXPECT_EQ(a->unretire_up_to(5), 1u);
  EXPECT_EQ(a->retired(), 0u);
  EXPECT_EQ(a->unretire_up_to(5), 0u);
  ASSERT_TRUE(a->audit().ok()) << a->audit().to_string();
}

TEST(FrameAllocator, ZeroCapacityIsEmpty) {
  auto a = make(0);
  EXPECT_EQ(a->allocate().status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(a->audit().ok());
}

TEST(FrameAllocator, RandomOpsMatchModel) {
  auto a = make(257);
  std::set<uint32_t> model;
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 == 0) {
      auto f = a->allocate();
      if (model.size() == 257) {
        EXPECT_FALSE(f.ok());
      } else {
        ASSERT_TRUE(f.ok());
        EXPECT_TRUE(model.insert(*f).second);
      }
    } else if (!model.empty()) {
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      ASSERT_TRUE(a->free(*it).ok());
      model.erase(it);
    }
    ASSERT_EQ(a->used(), model.size());
  }
  for (uint32_t f = 0; f < 257; ++f) EXPECT_EQ(a->is_allocated(f), model.count(f) == 1);
  ASSERT_TRUE(a->audit().ok());
}

TEST(FrameAllocator, ConcurrentAllocFreeKeepsAccountingExact) {
  constexpr uint32_t kFrames = 1024;
  auto a = make(kFrames);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<std::vector<uint32_t>> kept(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<uint32_t> mine;
      for (int i = 0; i < 50000; ++i) {
        if (mine.size() < 64 && rng() % 3 != 0) {
          auto f = a->allocate();
          if (f.ok()) mine.push_back(*f);
        } else if (!mine.empty()) {
          Status s = a->free(mine.back());
          ASSERT_TRUE(s.ok()) << s.to_string();
          mine.pop_back();
        }
      }
      kept[t] = mine;
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> all;
  std::size_t total = 0;
  for (auto& v : kept) {
    total += v.size();
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), total) << "a frame was owned by two threads";
  EXPECT_EQ(a->used(), total);
  ASSERT_TRUE(a->audit().ok());
}

}  // namespace
}  // namespace kvtier

// Threaded tests of tiers/frame_allocator that the page table relies on: frames freed on one
// thread's stripe are allocatable from any other, frames handed between threads keep the
// per-thread used() counts exact, and threads beyond the private counter slots (or reusing the
// slots of threads that exited) still count exactly. Labelled `stress`: also run under TSan.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tiers/frame_allocator.hpp"

namespace kvtier {
namespace {

std::unique_ptr<FrameAllocator> make(uint32_t n) {
  auto r = FrameAllocator::create(n);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(FrameAllocatorThreads, FramesFreedByOneThreadAreVisibleToAnother) {
  constexpr uint32_t kFrames = 1000;
  auto a = make(kFrames);
  std::vector<uint32_t> frames;
  // The first thread stays alive while the second runs, so the two hold different counter slots
  // and home stripes (a slot is reused only after its thread exits).
  std::mutex mu;
  std::condition_variable cv;
  bool first_done = false, second_done = false;
  std::thread first([&] {
    // No ASSERT here: this thread must reach the handshake below even when a check fails.
    for (uint32_t i = 0; i < kFrames; ++i) {
      auto f = a->allocate();
      EXPECT_TRUE(f.ok()) << "frame " << i << ": " << f.status().to_string();
      if (!f.ok()) break;
      frames.push_back(*f);
    }
    EXPECT_EQ(a->allocate().status().code(), StatusCode::kResourceExhausted);
    for (uint32_t f : frames) EXPECT_TRUE(a->free(f).ok());  // all onto this thread's stripe
    std::unique_lock<std::mutex> lock(mu);
    first_done = true;
    cv.notify_all();
    cv.wait(lock, [&] { return second_done; });
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return first_done; });
  }
  std::set<uint32_t> again;
  std::thread second([&] {
    for (uint32_t i = 0; i < kFrames; ++i) {
      auto f = a->allocate();
      ASSERT_TRUE(f.ok()) << "frame " << i << ": " << f.status().to_string();
      again.insert(*f);
    }
    EXPECT_EQ(a->allocate().status().code(), StatusCode::kResourceExhausted);
  });
  second.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    second_done = true;
    cv.notify_all();
  }
  first.join();
  EXPECT_EQ(again.size(), kFrames);
  EXPECT_EQ(a->used(), kFrames);
  Status s = a->audit();
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(FrameAllocatorThreads, FramesHandedBetweenThreadsKeepTheCountExact) {
  constexpr uint32_t kFrames = 512;
  constexpr int kThreads = 4;
#if defined(__SANITIZE_THREAD__)
  constexpr int kSteps = 4000;
#else
  constexpr int kSteps = 40000;
#endif
  auto a = make(kFrames);
  std::mutex mu;
  std::deque<uint32_t> handoff;  // allocated by one thread, freed by another
  std::atomic<int> failures{0};
  std::vector<std::vector<uint32_t>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<uint32_t>& mine = kept[t];
      for (int i = 0; i < kSteps; ++i) {
        switch (rng() % 4) {
          case 0:
          case 1: {
            auto f = a->allocate();
            if (!f.ok()) {
              if (f.status().code() != StatusCode::kResourceExhausted) ++failures;
              break;
            }
            if (rng() % 2) {
              std::lock_guard<std::mutex> lock(mu);
              handoff.push_back(*f);
            } else {
              mine.push_back(*f);
            }
            break;
          }
          case 2:
            if (!mine.empty()) {
              if (!a->free(mine.back()).ok()) ++failures;
              mine.pop_back();
            }
            break;
          default: {
            uint32_t f = FrameAllocator::kNoFrame;
            {
              std::lock_guard<std::mutex> lock(mu);
              if (!handoff.empty()) {
                f = handoff.front();
                handoff.pop_front();
              }
            }
            if (f != FrameAllocator::kNoFrame && !a->free(f).ok()) ++failures;
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::set<uint32_t> held(handoff.begin(), handoff.end());
  std::size_t total = handoff.size();
  for (const auto& v : kept) {
    held.insert(v.begin(), v.end());
    total += v.size();
  }
  EXPECT_EQ(held.size(), total) << "a frame was handed out twice";
  EXPECT_EQ(a->used(), total);
  EXPECT_EQ(a->used() + a->free_count(), a->capacity());
  for (uint32_t f : held) EXPECT_TRUE(a->is_allocated(f));
  Status s = a->audit();
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(FrameAllocatorThreads, MoreThreadsThanCounterSlotsAndSlotReuse) {
  constexpr uint32_t kFrames = 4096;
  auto a = make(kFrames);
  // Waves of short-lived threads: slots are returned and reused, counts carry over.
  std::atomic<uint32_t> held{0};
  std::vector<uint32_t> leftovers;
  std::mutex mu;
  for (int wave = 0; wave < 3; ++wave) {
    std::vector<std::thread> threads;
    // More threads alive at once than there are private slots: the rest share one.
    for (uint32_t t = 0; t < FrameAllocator::kCounterSlots + 8; ++t) {
      threads.emplace_back([&] {
        uint32_t f1 = FrameAllocator::kNoFrame, f2 = FrameAllocator::kNoFrame;
        auto r1 = a->allocate();
        auto r2 = a->allocate();
        if (r1.ok()) f1 = *r1;
        if (r2.ok()) f2 = *r2;
        if (f1 != FrameAllocator::kNoFrame) a->free(f1).ignore();  // freed by its allocator
        if (f2 != FrameAllocator::kNoFrame) {
          std::lock_guard<std::mutex> lock(mu);
          leftovers.push_back(f2);  // freed later by another thread, or kept
          ++held;
        }
      });
    }
    for (auto& th : threads) th.join();
    // Free half of the leftovers from this (main) thread.
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = 0; i < leftovers.size() / 2; ++i) {
      ASSERT_TRUE(a->free(leftovers.back()).ok());
      leftovers.pop_back();
      --held;
    }
  }
  EXPECT_EQ(a->used(), held.load());
  EXPECT_EQ(a->used(), leftovers.size());
  Status s = a->audit();
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace kvtier

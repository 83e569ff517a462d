// The scheduler's event loops and link queues.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "scheduler/asio_event_loop.hpp"
#include "scheduler/link_queues.hpp"
#include "scheduler/sim_event_loop.hpp"

namespace kvtier {
namespace {

TEST(SimEventLoop, RunsEventsInTimeThenPostOrder) {
  SimEventLoop loop;
  std::vector<int> order;
  loop.post_after(30, [&] { order.push_back(3); });
  loop.post_after(10, [&] { order.push_back(1); });
  loop.post_after(10, [&] { order.push_back(2); });
  loop.post([&] { order.push_back(0); });
  const TimerId cancelled = loop.post_after(20, [&] { order.push_back(99); });
  EXPECT_TRUE(loop.cancel_timer(cancelled));
  EXPECT_EQ(loop.run_until_idle(), 4u);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(loop.now(), 30);
}

// As AsioEventLoop's: cancelling a timer that already ran (a timer's own task may, as a prefix
// pin's expiry does through unpin_prefix) or was cancelled before is false and changes nothing;
// pending() counts what is left to run.
TEST(SimEventLoop, CancellingATimerThatRanOrWasCancelledIsFalse) {
  SimEventLoop loop;
  TimerId self = 0;
  bool cancelled_itself = true;
  self = loop.post_after(10, [&] { cancelled_itself = loop.cancel_timer(self); });
  const TimerId twice = loop.post_after(20, [] {});
  loop.post_after(30, [] {});
  EXPECT_TRUE(loop.cancel_timer(twice));
  EXPECT_FALSE(loop.cancel_timer(twice));
  EXPECT_EQ(loop.pending(), 2u);
  EXPECT_TRUE(loop.run_one());
  EXPECT_FALSE(cancelled_itself);
  EXPECT_EQ(loop.pending(), 1u);
  EXPECT_FALSE(loop.cancel_timer(self));
  EXPECT_EQ(loop.run_until_idle(), 1u);
  EXPECT_EQ(loop.pending(), 0u);
  EXPECT_EQ(loop.now(), 30);
}

TEST(SimEventLoop, RunUntilStopsAtTheGivenTime) {
  SimEventLoop loop;
  int fired = 0;
  loop.post_after(100, [&] { ++fired; });
  loop.post_after(300, [&] { ++fired; });
  loop.run_until(200);
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(loop.now(), 200);
  // Events posted from a running event land at the current virtual time.
  loop.post_after(50, [&] { loop.post_after(0, [&] { ++fired; }); });
  loop.run_until_idle();
  EXPECT_EQ(fired, 3);
  EXPECT_EQ(loop.now(), 300);
}

// Events that keep posting each other at one instant (a livelock) stop each run at its bound: a
// test fails instead of hanging.
TEST(SimEventLoop, EveryRunStopsAfterItsMostEvents) {
  SimEventLoop loop;
  uint64_t ran = 0;
  std::function<void()> again = [&] {
    ++ran;
    loop.post(again);
  };
  loop.post_after(10, again);
  EXPECT_EQ(loop.run_until(100, 5), 5u);
  EXPECT_EQ(loop.now(), 10) << "a run cut short leaves the clock at its last event";
  EXPECT_EQ(loop.run_until_idle(7), 7u);
  EXPECT_FALSE(loop.run_while_not([] { return false; }, 3));
  EXPECT_TRUE(loop.run_while_not([&] { return ran >= 20; }, 10));
  EXPECT_EQ(ran, 20u);
  EXPECT_EQ(loop.pending(), 1u);
}

TEST(AsioEventLoop, PostsRunOnTheLoopThreadInOrder) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  std::vector<int> order;
  std::atomic<bool> on_loop{true};
  for (int i = 0; i < 100; ++i) {
    (*loop)->post([&, i] {
      on_loop = on_loop && (*loop)->in_loop();
      order.push_back(i);
    });
  }
  Status s = (*loop)->run_sync([] { return ok_status(); }, kNanosPerSecond);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_TRUE(on_loop);
  EXPECT_FALSE((*loop)->in_loop());
}

TEST(AsioEventLoop, RunSyncReturnsTheTaskStatusAndTimesOutWhenTheLoopIsBusy) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  Status s = (*loop)->run_sync([] { return not_found("x"); }, kNanosPerSecond);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  // Keep the loop busy; a call that cannot start in time is refused and never runs.
  std::atomic<bool> release{false};
  (*loop)->post([&] {
    while (!release) std::this_thread::yield();
  });
  std::atomic<bool> ran{false};
  Status late = (*loop)->run_sync(
      [&] {
        ran = true;
        return ok_status();
      },
      20 * kNanosPerMilli);
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded);
  release = true;
  ASSERT_TRUE((*loop)->run_sync([] { return ok_status(); }, 5 * kNanosPerSecond).ok());
  EXPECT_FALSE(ran) << "a call the caller gave up on must not run";
}

TEST(AsioEventLoop, RunSyncOnAnIdleLoopRunsOnTheCallersThreadAsALoopTask) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  std::thread::id ran_on;
  bool in_loop = false;
  Status nested;  // OK until the inner call runs
  Status s = (*loop)->run_sync(
      [&] {
        ran_on = std::this_thread::get_id();
        in_loop = (*loop)->in_loop();
        // A task may call run_sync itself: it runs inline, it does not wait for itself.
        nested = (*loop)->run_sync([] { return not_found("inner"); }, kNanosPerSecond);
        return ok_status();
      },
      kNanosPerSecond);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(in_loop);
  EXPECT_EQ(nested.code(), StatusCode::kNotFound);
  EXPECT_FALSE((*loop)->in_loop());
}

TEST(AsioEventLoop, RunOnLoopThreadAlwaysRunsOnTheLoopsOwnThread) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  std::thread::id ran_on = std::this_thread::get_id();
  bool in_loop = false;
  Status s = (*loop)->run_on_loop_thread(
      [&] {
        ran_on = std::this_thread::get_id();
        in_loop = (*loop)->in_loop();
        return not_found("x");
      },
      kNanosPerSecond);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(ran_on, std::this_thread::get_id())
      << "the loop was idle, and still it was handed over";
  EXPECT_TRUE(in_loop);
}

TEST(AsioEventLoop, RunSyncRunsAfterEveryTaskPostedBeforeIt) {
  // Run on the caller's thread or handed to the loop's, a call never overtakes a posted task: the
  // posted task has not started when run_sync is called, almost every time.
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  int value = 0;  // touched by loop tasks only
  int overtaken = 0;
  for (int i = 1; i <= 2000; ++i) {
    (*loop)->post([&value, i] { value = i; });
    Status s = (*loop)->run_sync(
        [&] {
          if (value != i) ++overtaken;
          return ok_status();
        },
        5 * kNanosPerSecond);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_EQ(overtaken, 0);
}

TEST(AsioEventLoop, ATaskThatThrowsGivesItsCallerAnInternalErrorAndTheLoopGoesOn) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  auto throwing = []() -> Status { throw std::runtime_error("boom"); };
  // On the caller's thread (the loop is idle).
  Status here = (*loop)->run_sync(throwing, kNanosPerSecond);
  EXPECT_EQ(here.code(), StatusCode::kInternal);
  EXPECT_NE(here.message().find("boom"), std::string::npos) << here.to_string();
  // Handed to the loop's thread: a posted task holds the loop until the call is waiting.
  std::atomic<bool> release{false};
  (*loop)->post([&] {
    while (!release) std::this_thread::yield();
  });
  Status handed;  // OK until the call returns
  std::thread caller([&] { handed = (*loop)->run_sync(throwing, 5 * kNanosPerSecond); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  release = true;
  caller.join();
  EXPECT_EQ(handed.code(), StatusCode::kInternal);
  EXPECT_NE(handed.message().find("boom"), std::string::npos) << handed.to_string();
  EXPECT_TRUE((*loop)->run_sync([] { return ok_status(); }, kNanosPerSecond).ok());
}

TEST(AsioEventLoop, TimersFireAndCancel) {
  auto loop = AsioEventLoop::create();
  ASSERT_TRUE(loop.ok());
  std::atomic<int> fired{0};
  (*loop)->post_after(1 * kNanosPerMilli, [&] { fired += 1; });
  const TimerId t = (*loop)->post_after(10 * kNanosPerSecond, [&] { fired += 100; });
  EXPECT_TRUE((*loop)->cancel_timer(t));
  for (int i = 0; i < 200 && fired.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(fired.load(), 1);
}

// Jobs for LinkQueues that record the order they start in and keep their completions for the
// test to call.
struct StartedJobs {
  std::vector<std::string> started;
  std::vector<std::function<void()>> finishers;
  JobStart job(std::string name) {
    return [this, name = std::move(name)](std::function<void()> finished) {
      started.push_back(name);
      finishers.push_back(std::move(finished));
    };
  }
};

TEST(LinkQueues, DemandOvertakesPrefetchAndWriteBackUnderTheCap) {
  std::array<uint64_t, kNumLinks> caps{};
  caps[static_cast<int>(Link::kHostToHbm)] = 100;
  LinkQueues q(caps);
  StartedJobs jobs;
  std::vector<std::string>& started = jobs.started;
  std::vector<std::function<void()>>& finishers = jobs.finishers;
  const auto job = [&](std::string name) { return jobs.job(std::move(name)); };
  q.enqueue(Link::kHostToHbm, TransferPriority::kWriteBack, 100, job("wb1"));  // starts: link idle
  q.enqueue(Link::kHostToHbm, TransferPriority::kWriteBack, 50, job("wb2"));
  q.enqueue(Link::kHostToHbm, TransferPriority::kPrefetch, 50, job("pf"));
  const JobId late = q.enqueue(Link::kHostToHbm, TransferPriority::kPrefetch, 50, job("pf-late"));
  q.enqueue(Link::kHostToHbm, TransferPriority::kDemand, 50, job("demand"));
  EXPECT_EQ(started, (std::vector<std::string>{"wb1"}));
  EXPECT_EQ(q.inflight_bytes(Link::kHostToHbm), 100u);
  EXPECT_TRUE(q.promote(late, TransferPriority::kDemand));
  finishers[0]();
  EXPECT_EQ(started, (std::vector<std::string>{"wb1", "demand", "pf-late"}));
  finishers[1]();
  finishers[2]();
  EXPECT_EQ(started.size(), 5u);
  EXPECT_EQ(started[3], "pf");
  EXPECT_EQ(started[4], "wb2");
  finishers[3]();
  finishers[4]();
  EXPECT_TRUE(q.idle());
  EXPECT_FALSE(q.promote(late, TransferPriority::kDemand));
}

// A sequence just opened (kAdmitted) goes after demands and before prefetches; the bytes queued
// ahead of a priority, which compute-or-load weighs, follow jobs as they are promoted and start.
TEST(LinkQueues, AdmittedJobsGoBetweenDemandsAndPrefetchesAndBytesAheadFollowThem) {
  std::array<uint64_t, kNumLinks> caps{};
  caps[static_cast<int>(Link::kNvmeToHost)] = 100;
  SchedulerStats gauges;
  LinkQueues q(caps, &gauges);
  const auto queued_gauge = [&](TransferPriority p) {
    return gauges.link_queued_bytes[static_cast<int>(Link::kNvmeToHost)][static_cast<int>(p)]
        .load();
  };
  const auto inflight_gauge = [&] {
    return gauges.link_inflight_bytes[static_cast<int>(Link::kNvmeToHost)].load();
  };
  StartedJobs jobs;
  std::vector<std::string>& started = jobs.started;
  std::vector<std::function<void()>>& finishers = jobs.finishers;
  const auto job = [&](std::string name) { return jobs.job(std::move(name)); };
  const Link l = Link::kNvmeToHost;
  q.enqueue(l, TransferPriority::kWriteBack, 100, job("wb1"));  // starts: link idle
  q.enqueue(l, TransferPriority::kWriteBack, 10, job("wb2"));
  q.enqueue(l, TransferPriority::kPrefetch, 20, job("pf"));
  const JobId late = q.enqueue(l, TransferPriority::kPrefetch, 30, job("pf-late"));
  q.enqueue(l, TransferPriority::kAdmitted, 40, job("admitted"));
  q.enqueue(l, TransferPriority::kDemand, 50, job("demand"));
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kDemand), 50u);
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kAdmitted), 90u);
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kPrefetch), 140u);
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kWriteBack), q.queued_bytes(l));
  EXPECT_EQ(q.queued_bytes(l), 150u);
  EXPECT_EQ(queued_gauge(TransferPriority::kDemand), 50u);
  EXPECT_EQ(queued_gauge(TransferPriority::kAdmitted), 40u);
  EXPECT_EQ(queued_gauge(TransferPriority::kPrefetch), 50u);
  EXPECT_EQ(queued_gauge(TransferPriority::kWriteBack), 10u);
  EXPECT_EQ(inflight_gauge(), 100u);
  EXPECT_TRUE(q.promote(late, TransferPriority::kAdmitted));
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kAdmitted), 120u);
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kPrefetch), 140u);
  EXPECT_EQ(queued_gauge(TransferPriority::kAdmitted), 70u);
  EXPECT_EQ(queued_gauge(TransferPriority::kPrefetch), 20u);
  finishers[0]();  // room for 100 bytes: the demand, then the admitted jobs in their order
  EXPECT_EQ(started, (std::vector<std::string>{"wb1", "demand", "admitted"}));
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kAdmitted), 30u);
  EXPECT_EQ(queued_gauge(TransferPriority::kDemand), 0u);
  EXPECT_EQ(queued_gauge(TransferPriority::kAdmitted), 30u);
  EXPECT_EQ(inflight_gauge(), 90u);
  finishers[1]();
  finishers[2]();
  EXPECT_EQ(started,
            (std::vector<std::string>{"wb1", "demand", "admitted", "pf-late", "pf", "wb2"}));
  EXPECT_EQ(q.queued_bytes_ahead(l, TransferPriority::kWriteBack), 0u);
  for (std::size_t i = 3; i < finishers.size(); ++i) finishers[i]();
  EXPECT_TRUE(q.idle());
  for (TransferPriority p : {TransferPriority::kDemand, TransferPriority::kAdmitted,
                             TransferPriority::kPrefetch, TransferPriority::kWriteBack}) {
    EXPECT_EQ(queued_gauge(p), 0u);
  }
  EXPECT_EQ(inflight_gauge(), 0u);
}

TEST(LinkQueues, ASynchronousFailureInStartDoesNotRecurseOrStall) {
  LinkQueues q({});
  int ran = 0;
  for (int i = 0; i < 1000; ++i) {
    q.enqueue(Link::kNvmeToHost, TransferPriority::kDemand, 1 << 20,
              [&](std::function<void()> finished) {
                ++ran;
                finished();  // a submit error completes at once
              });
  }
  EXPECT_EQ(ran, 1000);
  EXPECT_TRUE(q.idle());
}

}  // namespace
}  // namespace kvtier

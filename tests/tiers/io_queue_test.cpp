// The io_uring IoQueue on its own: reads, writes and wake-ups in each way its wake poll can be
// armed — multishot, one-shot (forced), and multishot refused by the kernel with -EINVAL as before
// Linux 5.13 (simulated with a poll flag no kernel knows, which fails the same way) — and a
// multishot poll the kernel terminates (a CQE without IORING_CQE_F_MORE, provoked by overflowing
// the CQ with wake-ups), which must be re-armed. Skips where io_uring is refused.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/io_backend.hpp"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kDepth = 4;
constexpr std::size_t kChunk = 4096;

std::unique_ptr<IoQueue> make_queue_or_skip(WakePoll mode, bool& skipped) {
  QueueOptions o;
  o.depth = kDepth;
  o.wake_poll = mode;
  auto q = make_uring_queue(o);
  skipped = !q.ok() && q.status().code() == StatusCode::kUnavailable;
  if (skipped) return nullptr;
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  return q.ok() ? std::move(q).value() : nullptr;
}

// Waits until `tags` have all completed (each exactly once, with `bytes`); false on a stall.
bool collect(IoQueue& q, std::set<uint64_t> tags, int32_t bytes) {
  std::vector<IoCompletion> out;
  for (int rounds = 0; !tags.empty() && rounds < 1000; ++rounds) {
    out.clear();
    if (!q.wait(out, 1000).ok()) return false;
    for (const IoCompletion& c : out) {
      EXPECT_EQ(tags.erase(c.tag), 1u) << "unknown or repeated tag " << c.tag;
      EXPECT_EQ(c.result, bytes) << "tag " << c.tag;
    }
  }
  return tags.empty();
}

class UringQueueTest : public ::testing::TestWithParam<WakePoll> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    bool skipped = false;
    q_ = make_queue_or_skip(GetParam(), skipped);
    if (skipped) GTEST_SKIP() << "io_uring refused here";
    ASSERT_NE(q_, nullptr);
    fd_ = ::open(dir_.file("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Writes `chunks` chunks of a pattern, then reads them back, submitting more requests than the
  // queue's depth so it must accept a prefix at a time.
  void round_trip(int chunks, uint8_t seed) {
    std::vector<std::vector<uint8_t>> bufs(chunks, std::vector<uint8_t>(kChunk));
    std::vector<iovec> iov(chunks);
    for (int i = 0; i < chunks; ++i) {
      std::memset(bufs[i].data(), seed + i, kChunk);
      iov[i] = iovec{bufs[i].data(), kChunk};
    }
    run(IoOpcode::kWrite, iov);
    for (auto& b : bufs) std::memset(b.data(), 0, kChunk);
    run(IoOpcode::kRead, iov);
    for (int i = 0; i < chunks; ++i) {
      ASSERT_EQ(bufs[i][0], static_cast<uint8_t>(seed + i)) << i;
      ASSERT_EQ(bufs[i][kChunk - 1], static_cast<uint8_t>(seed + i)) << i;
    }
  }

  void run(IoOpcode op, std::vector<iovec>& iov) {
    std::vector<IoRequest> reqs;
    for (std::size_t i = 0; i < iov.size(); ++i) {
      IoRequest r;
      r.tag = 100 + i;
      r.opcode = op;
      r.fd = fd_;
      r.offset = i * kChunk;
      r.iov = &iov[i];
      r.iovcnt = 1;
      reqs.push_back(r);
    }
    std::size_t next = 0;
    std::set<uint64_t> pending;
    std::vector<IoCompletion> out;
    for (int rounds = 0; (next < reqs.size() || !pending.empty()) && rounds < 10000; ++rounds) {
      if (next < reqs.size()) {
        auto n = q_->submit(std::span<const IoRequest>(reqs).subspan(next));
        ASSERT_TRUE(n.ok()) << n.status().to_string();
        for (std::size_t k = 0; k < *n; ++k) pending.insert(reqs[next + k].tag);
        next += *n;
      }
      out.clear();
      ASSERT_TRUE(q_->wait(out, 1000).ok());
      for (const IoCompletion& c : out) {
        ASSERT_EQ(pending.erase(c.tag), 1u) << "unknown or repeated tag " << c.tag;
        ASSERT_EQ(c.result, static_cast<int32_t>(kChunk)) << "tag " << c.tag;
      }
    }
    EXPECT_EQ(next, reqs.size());
    EXPECT_TRUE(pending.empty()) << pending.size() << " requests never completed";
  }

  // A wait with no limit, interrupted by wake() from another thread. A lost wake-up would block
  // forever; the 60 s limit turns that into a failure (the wake comes after 2 ms).
  void expect_woken_from_another_thread() {
    std::vector<IoCompletion> out;
    auto waker = std::async(std::launch::async, [this] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      q_->wake();
    });
    const auto start = Clock::now();
    ASSERT_TRUE(q_->wait(out, 60000).ok());
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "wake() did not end the wait";
    EXPECT_TRUE(out.empty());
    waker.get();
  }

  // Idle waits with a short limit, for about 300 ms: each should sleep out its limit. A queue that
  // took an error completion of its wake poll for a wake-up would return at once, thousands of
  // times (the I/O thread's busy loop).
  void expect_idle_waits_sleep() {
    std::vector<IoCompletion> out;
    int returns = 0;
    const auto end = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < end && returns < 1000) {
      ASSERT_TRUE(q_->wait(out, 50).ok());
      ++returns;
    }
    EXPECT_TRUE(out.empty());
    EXPECT_LE(returns, 20) << "idle wait() returned early " << returns << " times in 300 ms";
  }

  UringWakeState state() {
    auto s = uring_wake_state(*q_);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : UringWakeState{};
  }

  testing::TempDir dir_;
  std::unique_ptr<IoQueue> q_;
  int fd_ = -1;
};

TEST_P(UringQueueTest, ReadsWritesAndWakesUp) {
  round_trip(3 * kDepth + 1, 7);
  for (int i = 0; i < 5; ++i) expect_woken_from_another_thread();
  expect_idle_waits_sleep();
  round_trip(kDepth, 40);
  // A wake-up before the wait is not lost either.
  q_->wake();
  std::vector<IoCompletion> out;
  const auto start = Clock::now();
  ASSERT_TRUE(q_->wait(out, 60000).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));

  const UringWakeState s = state();
  EXPECT_TRUE(s.polling);
  if (GetParam() == WakePoll::kAuto) {
    EXPECT_TRUE(s.multishot);
    EXPECT_EQ(s.arms, 1u) << "a live multishot poll was armed again";
  } else {
    // One-shot from the start, or after the refused multishot: re-armed after every wake (7 here).
    EXPECT_FALSE(s.multishot);
    EXPECT_GE(s.arms, 7u);
  }
}

TEST_P(UringQueueTest, WakesUpWhileRequestsAreInFlight) {
  // Completions and wake-ups interleave; neither is lost or mistaken for the other.
  std::vector<uint8_t> buf(kChunk, 3);
  iovec v{buf.data(), kChunk};
  for (int i = 0; i < 20; ++i) {
    IoRequest r;
    r.tag = 1 + i;
    r.opcode = IoOpcode::kWrite;
    r.fd = fd_;
    r.offset = 0;
    r.iov = &v;
    r.iovcnt = 1;
    auto n = q_->submit(std::span<const IoRequest>(&r, 1));
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(*n, 1u);
    q_->wake();
    ASSERT_TRUE(collect(*q_, {r.tag}, static_cast<int32_t>(kChunk)));
  }
  expect_woken_from_another_thread();
  expect_idle_waits_sleep();
}

// The kernel ends a multishot poll that cannot post its CQE (the CQ is full): its last CQE comes
// without F_MORE. Each wake() posts one CQE; many more than the CQ holds, with no wait() between,
// overflow it. The queue must arm a new poll, or every later wait() sleeps through wake().
TEST_P(UringQueueTest, RearmsAWakePollTheKernelEnded) {
  std::vector<IoCompletion> out;
  ASSERT_TRUE(q_->wait(out, 0).ok());  // a refused multishot poll has become a one-shot one
  const UringWakeState before = state();
  for (uint32_t i = 0; i < 16 * (kDepth + 1); ++i) q_->wake();
  // The CQEs past the CQ's size (the last one among them) wait in the kernel's overflow list until
  // the next io_uring_enter, which a wait() makes once it finds the CQ empty.
  for (int i = 0; i < 4 && state().arms == before.arms; ++i) ASSERT_TRUE(q_->wait(out, 10).ok());
  EXPECT_TRUE(out.empty());
  const UringWakeState after = state();
  EXPECT_GT(after.arms, before.arms) << "the ended wake poll was not armed again";
  EXPECT_TRUE(after.polling);
  EXPECT_EQ(after.multishot, before.multishot) << "an ended multishot poll is no refusal";
  for (int i = 0; i < 3; ++i) expect_woken_from_another_thread();
  round_trip(2 * kDepth, 90);
  expect_woken_from_another_thread();
  expect_idle_waits_sleep();
}

INSTANTIATE_TEST_SUITE_P(WakePolls, UringQueueTest,
                         ::testing::Values(WakePoll::kAuto, WakePoll::kOneShot,
                                           WakePoll::kRefusedMultishot),
                         [](const ::testing::TestParamInfo<WakePoll>& info) {
                           switch (info.param) {
                             case WakePoll::kAuto: return std::string("Multishot");
                             case WakePoll::kOneShot: return std::string("OneShot");
                             case WakePoll::kRefusedMultishot:
                               return std::string("MultishotRefused");
                           }
                           return std::string("Unknown");
                         });

TEST(UringWakeState, RefusesAQueueThatIsNotIoUring) {
  auto q = make_sync_queue(QueueOptions{});
  ASSERT_TRUE(q.ok());
  auto s = uring_wake_state(**q);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier

// The synchronous IoQueue (the fallback where io_uring is refused): requests run on the queue's
// own threads, several at once, each completing exactly once; a file whose system calls hang
// holds at most half of the threads, while the caller's wait() keeps its timeout and the other
// files' requests complete; once the hung calls return, every request held completes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/scoped_fd.hpp"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunk = 4096;

// A system call that blocks for requests to `hung_fd` until release(), counting how many are
// blocked at once; others run as preadv/pwritev.
class HangingCalls {
 public:
  explicit HangingCalls(int hung_fd) : hung_fd_(hung_fd) {}

  int32_t operator()(const IoRequest& r) {
    if (r.fd != hung_fd_) {
      const ssize_t n =
          r.opcode == IoOpcode::kRead
              ? ::preadv(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset))
              : ::pwritev(r.fd, r.iov, static_cast<int>(r.iovcnt), static_cast<off_t>(r.offset));
      return n < 0 ? -errno : static_cast<int32_t>(n);
    }
    std::unique_lock<std::mutex> lock(mu_);
    most_blocked_ = std::max(most_blocked_, ++blocked_);
    cv_.wait(lock, [&] { return released_; });
    --blocked_;
    return -EIO;  // the drive's controller was reset
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  uint32_t most_blocked() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_blocked_;
  }

 private:
  const int hung_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t blocked_ = 0;
  uint32_t most_blocked_ = 0;
  bool released_ = false;
};

class SyncQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    const std::string path = dir_.file("data");
    file_ = ScopedFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(file_.valid());
    std::vector<char> bytes(kChunk * 16);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i / kChunk);
    ASSERT_EQ(::pwrite(file_.get(), bytes.data(), bytes.size(), 0),
              static_cast<ssize_t>(bytes.size()));
    const std::string other = dir_.file("hung");
    hung_ = ScopedFd(::open(other.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(hung_.valid());
    buffers_.assign(32, std::vector<char>(kChunk));
    iovs_.resize(32);
    for (std::size_t i = 0; i < 32; ++i) iovs_[i] = iovec{buffers_[i].data(), kChunk};
  }

  // A read of chunk `chunk` of `fd` into buffer `slot`, tagged slot + 1.
  IoRequest read_of(int fd, uint32_t slot, uint32_t chunk) {
    IoRequest r;
    r.tag = slot + 1;
    r.opcode = IoOpcode::kRead;
    r.fd = fd;
    r.offset = uint64_t{chunk} * kChunk;
    r.iov = &iovs_[slot];
    r.iovcnt = 1;
    return r;
  }

  // Waits (up to 5 s) until every tag of `tags` completed, each once, with `bytes`.
  static bool collect(IoQueue& q, std::set<uint64_t> tags, int32_t bytes) {
    const auto until = Clock::now() + std::chrono::seconds(5);
    std::vector<IoCompletion> out;
    while (!tags.empty() && Clock::now() < until) {
      out.clear();
      if (!q.wait(out, 100).ok()) return false;
      for (const IoCompletion& c : out) {
        EXPECT_EQ(tags.erase(c.tag), 1u) << "unknown or repeated tag " << c.tag;
        EXPECT_EQ(c.result, bytes) << "tag " << c.tag;
      }
    }
    return tags.empty();
  }

  testing::TempDir dir_;
  ScopedFd file_;
  ScopedFd hung_;
  std::vector<std::vector<char>> buffers_;
  std::vector<iovec> iovs_;
};

TEST_F(SyncQueueTest, RunsRequestsOnItsThreadsAndCompletesEachOnce) {
  QueueOptions o;
  o.depth = 16;
  auto q = make_sync_queue(o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ((*q)->kind(), "sync");
  std::vector<IoRequest> reqs;
  std::set<uint64_t> tags;
  for (uint32_t i = 0; i < 20; ++i) {
    reqs.push_back(read_of(file_.get(), i, i % 16));
    tags.insert(i + 1);
  }
  // A prefix up to the depth is accepted; the rest once completions are returned.
  auto n = (*q)->submit(reqs);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 16u);
  std::set<uint64_t> first(tags.begin(), std::next(tags.begin(), 16));
  ASSERT_TRUE(collect(**q, first, kChunk));
  auto rest = (*q)->submit(std::span<const IoRequest>(reqs).subspan(16));
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 4u);
  ASSERT_TRUE(collect(**q, {17, 18, 19, 20}, kChunk));
  for (uint32_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(std::all_of(buffers_[i].begin(), buffers_[i].end(),
                            [&](char c) { return c == static_cast<char>(i % 16); }))
        << "request " << i << " read the wrong bytes";
  }
}

// Eight threads at depth 16: the hung file's six requests hold four of them and wait for the
// rest; the other file's eight requests complete meanwhile, and wait() returns at its timeout
// while only hung requests are left. Released, the hung requests all complete, with their error.
TEST_F(SyncQueueTest, AFileWhoseCallsHangHoldsHalfTheThreadsAndTheOthersGoOn) {
  HangingCalls calls(hung_.get());
  QueueOptions o;
  o.depth = 16;
  o.sync_call = [&calls](const IoRequest& r) { return calls(r); };
  auto q = make_sync_queue(o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  std::vector<IoRequest> reqs;
  std::set<uint64_t> hung_tags, other_tags;
  for (uint32_t i = 0; i < 6; ++i) {
    reqs.push_back(read_of(hung_.get(), i, 0));
    hung_tags.insert(i + 1);
  }
  for (uint32_t i = 6; i < 14; ++i) {
    reqs.push_back(read_of(file_.get(), i, i));
    other_tags.insert(i + 1);
  }
  auto n = (*q)->submit(reqs);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, reqs.size());
  ASSERT_TRUE(collect(**q, other_tags, kChunk)) << "the other file's requests were held";
  std::vector<IoCompletion> out;
  const auto before = Clock::now();
  ASSERT_TRUE((*q)->wait(out, 50).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(5)) << "wait() was held by a hung call";
  EXPECT_EQ(calls.most_blocked(), 4u) << "the hung file holds half the threads, no more";
  calls.release();
  EXPECT_TRUE(collect(**q, hung_tags, -EIO));
}

TEST_F(SyncQueueTest, WakeInterruptsAWaitWithNothingToReturn) {
  auto q = make_sync_queue(QueueOptions{});
  ASSERT_TRUE(q.ok());
  (*q)->wake();
  std::vector<IoCompletion> out;
  const auto before = Clock::now();
  ASSERT_TRUE((*q)->wait(out, 10000).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(5));
}

TEST(SyncQueue, RefusesDepthZero) {
  QueueOptions o;
  o.depth = 0;
  EXPECT_EQ(make_sync_queue(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier

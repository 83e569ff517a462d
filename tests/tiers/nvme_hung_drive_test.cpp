// A hung drive: requests it leaves unanswered past tiers.nvme.io_timeout_ms count against it; a
// write is told it failed then (its extent stays reserved until the drive answers), a read ends
// only when the drive answers (its memory is the caller's, and the drive may still fill it) unless
// its caller takes that memory back later (on_buffers_released: it then fails at its timeout), and
// every new request to that drive fails at once until it has answered them all. Among several
// drives a hung one is taken out of service like a dead one; a store opens past a hung drive.
// Each test runs twice: over io_uring's shape of queue, the hung requests held unanswered by the
// queue, and over the synchronous fallback (io_uring refused), the hung requests holding the
// queue's threads inside their system calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/tiers/fault_store_fixture.hpp"

namespace kvtier {
namespace {

constexpr uint32_t kTimeoutMs = 400;

// Whether the hung drive holds the queue's threads in their system calls (the synchronous queue).
enum class HangsIn { kQueue, kSystemCall };

class HungDriveTest : public FaultTest, public ::testing::WithParamInterface<HangsIn> {
 protected:
  NvmeStoreOptions hung_options() {
    NvmeStoreOptions o = options();
    o.config.io_timeout_ms = kTimeoutMs;
    return o;
  }
  void SetUp() override {
    FaultTest::SetUp();
    if (GetParam() == HangsIn::kSystemCall) faults_->hang_in_system_calls();
    store_ = open_with(hung_options());
    ASSERT_NE(store_, nullptr);
    if (GetParam() == HangsIn::kSystemCall) {
      ASSERT_EQ(store_->io_kind(), "sync");
    }
  }
  // The store cannot close while the drive holds requests (their memory is in use): the drive
  // answers before the base fixture audits the store.
  void TearDown() override {
    faults_->answer_hung();
    if (store_) {
      EXPECT_TRUE(eventually([&] { return store_->stats().requests_unanswered.load() == 0; }));
    }
    FaultTest::TearDown();
  }
  uint64_t unanswered() const { return store_->stats().requests_unanswered.load(); }
  uint64_t timeouts() const { return store_->stats().io_timeouts.load(); }
};

TEST_P(HungDriveTest, AHungWriteFailsAtItsTimeoutAndKeepsItsExtentUntilTheDriveAnswers) {
  ASSERT_TRUE(write(1, 1).ok());
  faults_->hang_file("store0.kvs");
  const Status w = write(2, 2);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded) << w.to_string();
  EXPECT_NE(w.message().find("store0.kvs"), std::string::npos) << w.message();
  EXPECT_NE(w.message().find("unanswered after " + std::to_string(kTimeoutMs) + " ms"),
            std::string::npos)
      << w.message();
  EXPECT_EQ(timeouts(), 1u);
  EXPECT_EQ(unanswered(), 1u);
  EXPECT_FALSE(store_->contains(test_key(2)));
  // The drive may still write the extent: it is reserved, not free.
  EXPECT_EQ(store_->used_blocks(), 2u);
  EXPECT_EQ(store_->keys().size(), 1u);
  ASSERT_TRUE(store_->audit().ok());

  // Until the drive answers, requests to it fail at once, naming it; nothing more is held.
  const uint64_t held = faults_->injected();
  const Status w3 = write(3, 3);
  EXPECT_EQ(w3.code(), StatusCode::kDeadlineExceeded) << w3.to_string();
  EXPECT_NE(w3.message().find("1 requests unanswered"), std::string::npos) << w3.message();
  const Status r1 = read(1, 1);
  EXPECT_EQ(r1.code(), StatusCode::kDeadlineExceeded) << r1.to_string();
  EXPECT_EQ(faults_->injected(), held) << "a request reached the hung drive";
  EXPECT_TRUE(store_->contains(test_key(1))) << "a refused read drops nothing";

  faults_->answer_hung();
  ASSERT_TRUE(eventually([&] { return unanswered() == 0; }));
  // The late write does not bring its block back (its writer was told it failed); its extent is
  // free again.
  EXPECT_FALSE(store_->contains(test_key(2)));
  EXPECT_EQ(store_->used_blocks(), 1u);
  EXPECT_EQ(store_->retired_blocks(), 0u);
  EXPECT_TRUE(read(1, 1).ok());
  EXPECT_TRUE(write(2, 2).ok());
  EXPECT_TRUE(read(2, 2).ok());
}

TEST_P(HungDriveTest, AHungReadEndsOnlyWhenTheDriveAnswers) {
  for (int error : {0, EIO}) {
    SCOPED_TRACE(error);
    const uint64_t id = error == 0 ? 1 : 2;
    ASSERT_TRUE(write(id, id).ok());
    faults_->hang_file("store0.kvs");
    AlignedPages p(kGeom.layers, store_->page_io_bytes());
    p.scribble();
    auto t = store_->read_block(test_key(id), p.pages());
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const uint64_t timeouts_before = timeouts();
    ASSERT_TRUE(eventually([&] { return timeouts() == timeouts_before + 1; }));
    // Past its timeout the read is still the drive's: its memory may yet be written.
    EXPECT_EQ(t->wait_for(std::chrono::milliseconds(2 * kTimeoutMs)).code(),
              StatusCode::kDeadlineExceeded);
    EXPECT_EQ(unanswered(), 1u);
    faults_->answer_hung(error);
    const Status r = t->wait();
    if (error == 0) {
      EXPECT_TRUE(r.ok()) << r.to_string();
      EXPECT_TRUE(p.matches(id, kGeom.page_bytes()));
    } else {
      EXPECT_EQ(r.code(), StatusCode::kIoError) << r.to_string();
    }
    EXPECT_TRUE(eventually([&] { return unanswered() == 0; }));
  }
}

// A caller that takes its buffers back later (on_buffers_released) need not wait for a hung
// drive: its read fails at the timeout, abandoned, and the buffers are released only when the
// drive answers, whatever it then wrote into them. The block stays readable: a timeout is no
// proof of bad data.
TEST_P(HungDriveTest, AHungReadWhoseCallerTakesItsBuffersBackLaterFailsAtItsTimeout) {
  for (int error : {0, EIO}) {
    SCOPED_TRACE(error);
    const uint64_t id = error == 0 ? 1 : 2;
    ASSERT_TRUE(write(id, id).ok());
    faults_->hang_file("store0.kvs");
    AlignedPages p(kGeom.layers, store_->page_io_bytes());
    std::atomic<int> events{0};
    std::atomic<int> completed_at{0};
    std::atomic<int> released_at{0};
    TransferOptions options;
    options.on_complete = [&](const Status&) { completed_at = ++events; };
    options.on_buffers_released = [&](const Status&) { released_at = ++events; };
    auto t = store_->read_block(test_key(id), p.pages(), std::move(options));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(eventually([&] { return completed_at.load() != 0; }))
        << "the read waits for the hung drive";
    const Status r = t->wait();
    EXPECT_EQ(r.code(), StatusCode::kDeadlineExceeded) << r.to_string();
    EXPECT_NE(r.message().find("abandoned, its buffers stay the drive's until it answers"),
              std::string::npos)
        << r.message();
    EXPECT_EQ(completed_at.load(), 1);
    EXPECT_EQ(unanswered(), 1u);
    // The drive may still fill the pages: they are not released.
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs / 4));
    EXPECT_EQ(released_at.load(), 0);
    EXPECT_TRUE(store_->contains(test_key(id)));
    // Until the drive answers, the block's next read is refused at once.
    EXPECT_EQ(read(id, id).code(), StatusCode::kDeadlineExceeded);

    faults_->answer_hung(error);
    ASSERT_TRUE(eventually([&] { return released_at.load() != 0; }));
    EXPECT_EQ(released_at.load(), 2) << "released after the completion, once";
    EXPECT_EQ(unanswered(), 0u);
    EXPECT_TRUE(read(id, id).ok()) << "a timed-out read drops nothing";
    EXPECT_TRUE(store_->audit().ok());
  }
}

// A write past its timeout fails then, as always; the pages it was given are released only when
// the drive answers, for the drive may read them until then.
TEST_P(HungDriveTest, AHungWriteReleasesItsPagesOnlyWhenTheDriveAnswers) {
  faults_->hang_file("store0.kvs");
  AlignedPages p(kGeom.layers, store_->page_io_bytes());
  p.fill(1, kGeom.page_bytes());
  std::atomic<bool> released{false};
  TransferOptions options;
  options.on_buffers_released = [&](const Status&) { released = true; };
  auto t = store_->write_block(test_key(1), p.const_pages(), std::move(options));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->wait().code(), StatusCode::kDeadlineExceeded);
  std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs / 4));
  EXPECT_FALSE(released.load()) << "the drive may still read the pages";
  faults_->answer_hung();
  EXPECT_TRUE(eventually([&] { return released.load(); }));
  EXPECT_TRUE(eventually([&] { return unanswered() == 0; }));
}

// Four drives, the third hung: its requests time out or are refused at once, and after
// kDefaultFailuresInARow of them, none answered, it is out of service like a dead drive: its blocks
// are listed as lost, its extents retired (the one a write left reserved once the drive answers);
// every later write lands on the other three.
TEST_P(HungDriveTest, AHungDriveAmongSeveralIsTakenOutOfService) {
  store_.reset();
  NvmeStoreOptions o = hung_options();
  spread_over(o, {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs"}, 32);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  const auto on_hung_drive = [&](uint64_t id) { return lies_on(id, "d2.kvs"); };
  std::vector<BlockKey> expected_lost;
  for (uint64_t id = 0; id < 72; ++id) {  // the first two files, and 8 blocks of the third
    ASSERT_TRUE(write(id, id).ok());
    if (on_hung_drive(id)) expected_lost.push_back(test_key(id));
  }
  ASSERT_EQ(expected_lost.size(), 8u);
  faults_->hang_file("d2.kvs");
  int timed_out = 0;
  int refused = 0;
  int out_of_service = 0;
  for (uint64_t id = 100; id < 130; ++id) {
    const Status w = write(id, id);
    if (w.code() == StatusCode::kDeadlineExceeded) {
      (w.message().find("unanswered after") != std::string::npos ? timed_out : refused) += 1;
    } else if (w.code() == StatusCode::kUnavailable) {
      EXPECT_NE(w.message().find("d2.kvs"), std::string::npos) << w.message();
      EXPECT_NE(w.message().find("out of service"), std::string::npos) << w.message();
      ++out_of_service;
    } else {
      ASSERT_TRUE(w.ok()) << w.to_string();
      EXPECT_FALSE(on_hung_drive(id)) << "a write succeeded on the hung drive";
    }
  }
  EXPECT_EQ(timed_out, 1) << "one request was sent to the hung drive";
  EXPECT_EQ(refused, static_cast<int>(NvmeFileHealth::kDefaultFailuresInARow) - 2);
  EXPECT_EQ(out_of_service, 1);
  EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
  std::vector<BlockKey> lost = store_->take_lost_blocks();
  std::sort(lost.begin(), lost.end());
  std::sort(expected_lost.begin(), expected_lost.end());
  EXPECT_EQ(lost, expected_lost);
  EXPECT_EQ(store_->retired_blocks(), 31u) << "all but the extent the drive still holds";
  faults_->answer_hung();
  ASSERT_TRUE(eventually([&] { return unanswered() == 0; }));
  EXPECT_EQ(store_->retired_blocks(), 32u);
  EXPECT_EQ(store_->capacity_blocks(), 96u);
  for (uint64_t id = 0; id < 72; ++id) {
    if (store_->contains(test_key(id))) {
      EXPECT_TRUE(read(id, id).ok()) << id;
    }
  }
}

// The restart scan reads every extent header: a hung drive's first header reads time out (it may
// hold no more than half the I/O slots), the rest are refused, its extents count as unreadable and
// the drive goes out of service; the store opens with the others' blocks.
TEST_P(HungDriveTest, AStoreOpensPastAHungDrive) {
  store_.reset();
  NvmeStoreOptions o = hung_options();
  spread_over(o, {"d0.kvs", "d1.kvs"}, 16);
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  for (uint64_t id = 0; id < 20; ++id) ASSERT_TRUE(write(id, id).ok());  // 16 on d0, 4 on d1
  store_.reset();
  faults_->hang_file("d1.kvs");
  store_ = open_with(o);
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->keys().size(), 16u);
  for (uint64_t id = 0; id < 16; ++id) EXPECT_TRUE(read(id, id).ok()) << id;
  EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
  // Half the slots (queue_depth 4) went to the hung drive; its other headers were refused.
  EXPECT_EQ(timeouts(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Queues, HungDriveTest,
                         ::testing::Values(HangsIn::kQueue, HangsIn::kSystemCall),
                         [](const ::testing::TestParamInfo<HangsIn>& info) {
                           return std::string(info.param == HangsIn::kQueue ? "InTheQueue"
                                                                            : "InASystemCall");
                         });

}  // namespace
}  // namespace kvtier

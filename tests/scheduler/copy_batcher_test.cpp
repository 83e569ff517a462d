// CopyBatcher: write-back page copies of one loop turn go to the port as batches (one link job,
// one copy_pages call, one completion each); other priorities go alone at once; a batch the
// destination refuses is retried page by page so only the page it cannot hold fails.
#include "scheduler/copy_batcher.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/sim_event_loop.hpp"

namespace kvtier {
namespace {

constexpr uint64_t kPageBytes = 4096;

// A TransferPort that records each copy_pages call and completes it on the loop's next turn,
// refusing (kInvalidArgument) a copy that includes a page read from frame `refused_src`.
class RecordingPort final : public TransferPort {
 public:
  explicit RecordingPort(EventLoop& loop) : loop_(loop) {}

  std::vector<std::size_t> calls;  // pages per copy_pages call, in call order
  uint32_t refused_src = UINT32_MAX;

  Status copy_pages(Link, std::span<const FrameMove> moves, TransferDone done) override {
    calls.push_back(moves.size());
    bool refused = false;
    for (const FrameMove& m : moves) refused = refused || m.src == refused_src;
    loop_.post(
        [done, refused] { done(refused ? invalid_argument("the page holds NaN") : ok_status()); });
    return ok_status();
  }
  Status write_block(const BlockKey&, std::span<const uint32_t>, TransferDone) override {
    return failed_precondition("not used");
  }
  Status read_block(const BlockKey&, std::span<const uint32_t>, TransferDone,
                    FramesReleased) override {
    return failed_precondition("not used");
  }
  Status read_page(const BlockKey&, uint32_t, uint32_t, TransferDone, FramesReleased) override {
    return failed_precondition("not used");
  }
  Status erase_block(const BlockKey&) override { return failed_precondition("not used"); }
  uint64_t nvme_retired_extents() const override { return 0; }
  std::vector<BlockKey> take_lost_nvme_blocks() override { return {}; }
  LinkModel link_model(Link) const override { return LinkModel{}; }
  uint64_t host_page_bytes() const override { return kPageBytes; }
  uint64_t nvme_page_bytes() const override { return kPageBytes; }

 private:
  EventLoop& loop_;
};

struct BatcherWorld {
  SimEventLoop loop;
  RecordingPort port{loop};
  LinkQueues links{std::array<uint64_t, kNumLinks>{}};
  // Per page, in the order the pages were given: the code it was told (none until then).
  std::vector<std::optional<StatusCode>> done;
  uint32_t completed = 0;  // pages told so far
  // At each after_batch call: how many pages had been told by then.
  std::vector<uint32_t> batch_ends;

  LoopTask after_batch() {
    return [this] { batch_ends.push_back(completed); };
  }

  // Copies page i (frame i to frame 100 + i) and records its status's code at done[i].
  void copy(CopyBatcher& b, uint32_t i, TransferPriority prio) {
    if (done.size() <= i) done.resize(i + 1);
    b.copy_page(Link::kHbmToHost, prio, FrameMove{i, 100 + i}, [this, i](const Status& s) {
      done[i] = s.code();
      ++completed;
    });
  }
};

TEST(CopyBatcher, WriteBackCopiesOfOneTurnGoAsOneCopyOfAtMostMaxPages) {
  BatcherWorld w;
  CopyBatcher batcher(w.loop, w.links, w.port, /*max_pages=*/4, w.after_batch());
  for (uint32_t i = 0; i < 6; ++i) w.copy(batcher, i, TransferPriority::kWriteBack);
  // The first four filled a batch and went at once; the other two wait for the turn's end.
  EXPECT_EQ(w.port.calls, (std::vector<std::size_t>{4}));
  EXPECT_EQ(w.links.inflight_bytes(Link::kHbmToHost), 4 * kPageBytes);
  EXPECT_FALSE(batcher.idle()) << "two pages wait in the open batch";
  w.loop.run_until_idle();
  EXPECT_TRUE(batcher.idle());
  // after_batch ran once per batch, each time after every page of the batch was told.
  EXPECT_EQ(w.batch_ends, (std::vector<uint32_t>{4, 6}));
  EXPECT_EQ(w.port.calls, (std::vector<std::size_t>{4, 2}));
  for (const auto& code : w.done) EXPECT_EQ(code, StatusCode::kOk);
  EXPECT_EQ(w.links.inflight_bytes(Link::kHbmToHost), 0u);
  EXPECT_TRUE(w.links.idle());
}

TEST(CopyBatcher, CopiesAboveWriteBackGoAloneAtOnce) {
  BatcherWorld w;
  CopyBatcher batcher(w.loop, w.links, w.port, /*max_pages=*/64, w.after_batch());
  w.copy(batcher, 0, TransferPriority::kWriteBack);
  w.copy(batcher, 1, TransferPriority::kDemand);
  w.copy(batcher, 2, TransferPriority::kPrefetch);
  // The demand and the prefetch were submitted as they came; the write-back waits for the turn.
  EXPECT_EQ(w.port.calls, (std::vector<std::size_t>{1, 1}));
  w.loop.run_until_idle();
  EXPECT_EQ(w.port.calls, (std::vector<std::size_t>{1, 1, 1}));
  for (const auto& code : w.done) EXPECT_EQ(code, StatusCode::kOk);
}

TEST(CopyBatcher, ARefusedBatchIsRetriedPageByPageAndOnlyThePageRefusedFails) {
  BatcherWorld w;
  w.port.refused_src = 2;
  CopyBatcher batcher(w.loop, w.links, w.port, /*max_pages=*/64, w.after_batch());
  for (uint32_t i = 0; i < 4; ++i) w.copy(batcher, i, TransferPriority::kWriteBack);
  w.loop.run_until_idle();
  EXPECT_EQ(w.port.calls, (std::vector<std::size_t>{4, 1, 1, 1, 1}));
  EXPECT_EQ(w.batch_ends, (std::vector<uint32_t>{1, 2, 3, 4})) << "once after each retried page";
  for (uint32_t i = 0; i < 4; ++i) {
    if (i == 2) {
      EXPECT_EQ(w.done[i], StatusCode::kInvalidArgument);
    } else {
      EXPECT_EQ(w.done[i], StatusCode::kOk) << i;
    }
  }
  EXPECT_TRUE(w.links.idle());
}

}  // namespace
}  // namespace kvtier

// TransferEngine: HBM<->host copies (emulated engine and the CUDA engine over a fake device),
// batching, cross-direction hazards on reused frames, callbacks, the completion eventfd,
// cancellation, and host<->NVMe through the same handles.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/tier_stack.hpp"

namespace kvtier {
namespace {

using testing::fill_pattern;
using testing::matches_pattern;

const Geometry kGeom = testing::small_geometry(Dtype::kBF16, 4, 16, 2, 64);  // 8 KiB pages

TiersConfig small_tiers(const std::string& dir, uint32_t hbm_frames = 64,
                        uint32_t host_frames = 64) {
  TiersConfig c;
  c.hbm.backend = HbmBackend::kEmulated;
  c.hbm.capacity_bytes = uint64_t{hbm_frames} * kGeom.page_bytes();
  c.host.capacity_bytes = uint64_t{host_frames} * kGeom.page_bytes();
  c.nvme.enabled = !dir.empty();
  c.nvme.paths = {dir + "/store0.kvs"};
  c.nvme.capacity_bytes = 16 * (kGeom.block_bytes() + 4096);
  c.nvme.queue_depth = 8;
  return c;
}

std::unique_ptr<TierStack> open_stack(const TiersConfig& c, TierStackOptions o = {}) {
  auto s = open_tiers(c, kGeom, std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}

void expect_exact(const TierStack& s) {
  Status h = s.hbm->audit();
  Status p = s.host->audit();
  EXPECT_TRUE(h.ok()) << h.to_string();
  EXPECT_TRUE(p.ok()) << p.to_string();
  if (s.nvme) {
    Status n = s.nvme->audit();
    EXPECT_TRUE(n.ok()) << n.to_string();
  }
}

TEST(TransferEngine, CopiesBothWaysBitExact) {
  auto s = open_stack(small_tiers(""));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->hbm->backend(), "emulated");
  EXPECT_EQ(s->engine->copy_engine_name(), "host-memcpy");
  const std::size_t page = kGeom.page_bytes();
  std::vector<FramePair> out;
  for (uint32_t i = 0; i < 10; ++i) {
    fill_pattern(s->hbm->frame_address(i), page, 100 + i);
    out.push_back({i, 20 + 2 * i});  // scattered on the host side
  }
  auto t = s->engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->wait().ok());
  for (uint32_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(matches_pattern(s->host->frame_address(20 + 2 * i), page, 100 + i)) << i;
  }
  std::vector<FramePair> back;
  for (uint32_t i = 0; i < 10; ++i) back.push_back({20 + 2 * i, 40 + i});
  auto u = s->engine->copy(CopyDirection::kHostToHbm, back);
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE(u->wait().ok());
  for (uint32_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(matches_pattern(s->hbm->frame_address(40 + i), page, 100 + i)) << i;
  }
  const auto& stats = s->engine->stats();
  EXPECT_EQ(stats.link(Link::kHbmToHost).ops.load(), 1u);
  EXPECT_EQ(stats.link(Link::kHbmToHost).bytes.load(), 10 * page);
  EXPECT_EQ(stats.link(Link::kHostToHbm).bytes.load(), 10 * page);
  EXPECT_EQ(stats.link(Link::kHostToHbm).latency.count.load(), 1u);
  expect_exact(*s);
}

TEST(TransferEngine, BatchesConsecutiveFramesIntoOneCopy) {
  auto s = open_stack(small_tiers(""));
  ASSERT_NE(s, nullptr);
  std::vector<FramePair> run;
  for (uint32_t i = 0; i < 16; ++i) run.push_back({i, 32 + i});
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHbmToHost, run)->wait().ok());
  EXPECT_EQ(s->engine->stats().copy_segments.load(), 1u);
  EXPECT_EQ(s->engine->stats().copy_pages.load(), 16u);
  std::vector<FramePair> scattered;
  for (uint32_t i = 0; i < 8; ++i) scattered.push_back({2 * i, 2 * i});
  ASSERT_TRUE(s->engine->copy(CopyDirection::kHbmToHost, scattered)->wait().ok());
  EXPECT_EQ(s->engine->stats().copy_segments.load(), 1u + 8u);
}

TEST(TransferEngine, RejectsBadRequestsWithoutStartingAnything) {
  auto s = open_stack(small_tiers(""));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->engine->copy(CopyDirection::kHbmToHost, {}).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<FramePair> bad = {{0, 0}, {1000, 1}};
  auto r = s->engine->copy(CopyDirection::kHbmToHost, bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("1000"), std::string::npos);
  EXPECT_EQ(s->engine->stats().link(Link::kHbmToHost).ops.load(), 0u);
  std::vector<uint32_t> frames = {0, 1, 2, 3};
  EXPECT_EQ(s->engine->write_block(testing::test_key(1), frames).status().code(),
            StatusCode::kUnavailable);  // no NVMe tier configured
}

// A frame copied out and then overwritten by a copy in, without waiting in between: the copy out
// must see the old bytes. The throttle makes the copy out slow, so a missing dependency would let
// the copy in overtake it.
TEST(TransferEngine, CopyInWaitsForAnEarlierCopyOutOfTheSameFrame) {
  TiersConfig c = small_tiers("");
  c.hbm.link_gbps = 0.02;  // 20 MB/s: 24 pages take ~10 ms
  auto s = open_stack(c);
  ASSERT_NE(s, nullptr);
  const std::size_t page = kGeom.page_bytes();
  std::vector<FramePair> out;
  for (uint32_t i = 0; i < 24; ++i) {
    fill_pattern(s->hbm->frame_address(i), page, 500 + i);
    out.push_back({i, i});
  }
  for (uint32_t i = 0; i < 24; ++i) fill_pattern(s->host->frame_address(40 + i), page, 900 + i);
  std::vector<FramePair> in;
  for (uint32_t i = 0; i < 24; ++i) in.push_back({40 + i, i});  // into the frames being read
  auto t_out = s->engine->copy(CopyDirection::kHbmToHost, out);
  auto t_in = s->engine->copy(CopyDirection::kHostToHbm, in);
  ASSERT_TRUE(t_out.ok() && t_in.ok());
  ASSERT_TRUE(t_in->wait().ok());
  ASSERT_TRUE(t_out->wait().ok());
  for (uint32_t i = 0; i < 24; ++i) {
    EXPECT_TRUE(matches_pattern(s->host->frame_address(i), page, 500 + i))
        << "old bytes, frame " << i;
    EXPECT_TRUE(matches_pattern(s->hbm->frame_address(i), page, 900 + i))
        << "new bytes, frame " << i;
  }
}

TEST(TransferEngine, CallbackRunsAndEventfdFires) {
  auto s = open_stack(small_tiers(""));
  ASSERT_NE(s, nullptr);
  std::atomic<int> calls{0};
  StatusCode seen = StatusCode::kInternal;
  TransferOptions o;
  o.on_complete = [&](const Status& st) {
    seen = st.code();
    ++calls;
  };
  std::vector<FramePair> pages = {{0, 0}, {1, 1}};
  auto t = s->engine->copy(CopyDirection::kHbmToHost, pages, std::move(o));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->wait().ok());
  EXPECT_EQ(calls.load(), 1);  // the callback ran before wait() returned
  EXPECT_EQ(seen, StatusCode::kOk);
  pollfd p = {s->engine->completion_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_GE(s->engine->notifier()->drain(), 1u);
  EXPECT_EQ(s->engine->notifier()->drain(), 0u);
}

// on_buffers_released runs once, after the callback: at completion, or, when the engine held the
// buffers past it (a request a hung drive holds), when the engine lets them go.
TEST(TransferEngine, BuffersAreReleasedAfterTheCallbackOrWhenTheEngineLetsThemGo) {
  std::vector<std::string> events;
  const auto options = [&] {
    TransferOptions o;
    o.on_complete = [&](const Status& st) { events.push_back("complete " + st.to_string()); };
    o.on_buffers_released = [&](const Status&) { events.push_back("released"); };
    return o;
  };
  TransferState at_once(Link::kNvmeToHost, 0, options(), nullptr, nullptr);
  EXPECT_TRUE(at_once.may_hold_buffers());
  at_once.complete(Status());
  EXPECT_EQ(events, (std::vector<std::string>{"complete ok", "released"}));

  events.clear();
  TransferState held(Link::kNvmeToHost, 0, options(), nullptr, nullptr);
  held.hold_buffers();
  held.complete(deadline_exceeded("unanswered"));
  EXPECT_TRUE(held.done());
  EXPECT_EQ(events.size(), 1u);
  held.release_buffers();
  held.release_buffers();  // a second release is a bug of the engine: ignored
  EXPECT_EQ(events,
            (std::vector<std::string>{"complete deadline_exceeded: unanswered", "released"}));

  TransferState without(Link::kNvmeToHost, 0, TransferOptions{}, nullptr, nullptr);
  EXPECT_FALSE(without.may_hold_buffers());
  without.complete(Status());
}

TEST(TransferEngine, CancelBeforeStartCopiesNothing) {
  TiersConfig c = small_tiers("");
  c.hbm.link_gbps = 0.002;  // 2 MB/s: the first job (32 pages, 256 KiB) holds the queue ~130 ms
  auto s = open_stack(c);
  ASSERT_NE(s, nullptr);
  const std::size_t page = kGeom.page_bytes();
  std::vector<FramePair> slow;
  for (uint32_t i = 0; i < 32; ++i) slow.push_back({i, i});
  fill_pattern(s->hbm->frame_address(40), page, 7);
  std::memset(s->host->frame_address(40), 0, page);
  auto first = s->engine->copy(CopyDirection::kHbmToHost, slow);
  std::vector<FramePair> one = {{40, 40}};
  auto second = s->engine->copy(CopyDirection::kHbmToHost, one);
  ASSERT_TRUE(first.ok() && second.ok());
  second->cancel();
  EXPECT_EQ(second->wait().code(), StatusCode::kCancelled);
  EXPECT_TRUE(first->wait().ok());
  std::vector<std::byte> zeros(page);
  EXPECT_EQ(std::memcmp(s->host->frame_address(40), zeros.data(), page), 0);
  EXPECT_EQ(s->engine->stats().link(Link::kHbmToHost).cancelled.load(), 1u);
}

TEST(TransferEngine, WaitForReportsDeadlineThenCompletes) {
  TiersConfig c = small_tiers("");
  c.hbm.link_gbps = 0.002;
  auto s = open_stack(c);
  ASSERT_NE(s, nullptr);
  std::vector<FramePair> slow;
  for (uint32_t i = 0; i < 32; ++i) slow.push_back({i, i});
  auto t = s->engine->copy(CopyDirection::kHbmToHost, slow);
  ASSERT_TRUE(t.ok());
  Status early = t->wait_for(std::chrono::microseconds(1));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.message().find("hbm->host"), std::string::npos);
  EXPECT_TRUE(t->wait().ok());
}

TEST(TransferEngine, HostNvmeThroughTheEngine) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = open_stack(small_tiers(dir.path()));
  ASSERT_NE(s, nullptr);
  const std::size_t page = kGeom.page_bytes();
  std::vector<uint32_t> frames = {3, 9, 4, 10};  // any frames, one per layer
  for (uint32_t l = 0; l < 4; ++l) fill_pattern(s->host->frame_address(frames[l]), page, 60 + l);
  ASSERT_TRUE(s->engine->write_block(testing::test_key(1), frames)->wait().ok());
  std::vector<uint32_t> into = {20, 21, 22, 23};
  ASSERT_TRUE(s->engine->read_block(testing::test_key(1), into)->wait().ok());
  for (uint32_t l = 0; l < 4; ++l) {
    EXPECT_TRUE(matches_pattern(s->host->frame_address(into[l]), page, 60 + l));
  }
  ASSERT_TRUE(s->engine->read_page(testing::test_key(1), 2, 30)->wait().ok());
  EXPECT_TRUE(matches_pattern(s->host->frame_address(30), page, 62));
  const auto& st = s->engine->stats();
  EXPECT_EQ(st.link(Link::kHostToNvme).ops.load(), 1u);
  EXPECT_EQ(st.link(Link::kNvmeToHost).ops.load(), 2u);
  EXPECT_EQ(st.link(Link::kNvmeToHost).bytes.load(), kGeom.block_bytes() + page);
  if (s->nvme->io_kind() != "sync") {
    EXPECT_TRUE(s->nvme->fixed_buffers_active());
  }
  expect_exact(*s);
}

// --- The CUDA engine, run on the CPU through FakeDevice ----------------------------------------

class CudaEngineOnFake : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = std::make_shared<testing::FakeDevice>();
    TierStackOptions o;
    o.device = device_;
    stack_ = open_stack(small_tiers(""), std::move(o));
    ASSERT_NE(stack_, nullptr);
    ASSERT_EQ(stack_->hbm->backend(), "cuda");
    ASSERT_EQ(stack_->host->backend(), "cuda_pinned");
    ASSERT_EQ(stack_->engine->copy_engine_name(), "cuda-streams");
  }
  std::shared_ptr<testing::FakeDevice> device_;
  std::unique_ptr<TierStack> stack_;
};

TEST_F(CudaEngineOnFake, RoundTripIsBitExactWithOneBatchedCallPerTransfer) {
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  std::vector<FramePair> out;
  for (uint32_t i = 0; i < 12; ++i) {
    fill_pattern(s.hbm->frame_address(i), page,
                 300 + i);       // the fake's device memory is host memory
    out.push_back({i, 63 - i});  // no two consecutive: 12 segments
  }
  auto t = s.engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->device_event(), nullptr);
  ASSERT_TRUE(t->wait().ok());
  EXPECT_EQ(device_->copy_calls.load(), 1);
  EXPECT_EQ(device_->copy_segments.load(), 12);
  std::vector<FramePair> back;
  for (uint32_t i = 0; i < 12; ++i) back.push_back({63 - i, 20 + i});
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHostToHbm, back)->wait().ok());
  for (uint32_t i = 0; i < 12; ++i) {
    EXPECT_TRUE(matches_pattern(s.hbm->frame_address(20 + i), page, 300 + i)) << i;
  }
}

TEST_F(CudaEngineOnFake, CopyInToAFrameBeingCopiedOutWaitsOnTheEvent) {
  device_->d2h_delay_ms = 30;  // the device-to-host stream is slow
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  fill_pattern(s.hbm->frame_address(5), page, 1);
  fill_pattern(s.host->frame_address(7), page, 2);
  std::vector<FramePair> out = {{5, 6}};
  std::vector<FramePair> in = {{7, 5}};
  auto t_out = s.engine->copy(CopyDirection::kHbmToHost, out);
  auto t_in = s.engine->copy(CopyDirection::kHostToHbm, in);
  ASSERT_TRUE(t_out.ok() && t_in.ok());
  ASSERT_TRUE(t_in->wait().ok());
  ASSERT_TRUE(t_out->wait().ok());
  EXPECT_TRUE(matches_pattern(s.host->frame_address(6), page, 1)) << "copy out saw the new bytes";
  EXPECT_TRUE(matches_pattern(s.hbm->frame_address(5), page, 2));
}

TEST_F(CudaEngineOnFake, CopyWaitsForTheCallersEvent) {
  device_->h2d_delay_ms = 30;  // "compute" writing the frame is slow
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  std::memset(s.hbm->frame_address(3), 0, page);
  testing::AlignedPages fresh(1, page);
  fresh.fill(77, page);
  // The engine's compute stream writes frame 3, then records an event.
  auto compute = DeviceStream::create(device_);
  auto written = DeviceEvent::create(device_);
  ASSERT_TRUE(compute.ok() && written.ok());
  CopySegment seg{s.hbm->frame_address(3), fresh[0], page};
  ASSERT_TRUE(device_->copy_async({&seg, 1}, CopyKind::kHostToDevice, compute->get()).ok());
  ASSERT_TRUE(device_->record_event(written->get(), compute->get()).ok());
  TransferOptions o;
  o.wait_device_event = written->get().raw;
  std::vector<FramePair> out = {{3, 3}};
  auto t = s.engine->copy(CopyDirection::kHbmToHost, out, std::move(o));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->wait().ok());
  EXPECT_TRUE(matches_pattern(s.host->frame_address(3), page, 77 * 1000));
  ASSERT_TRUE(device_->synchronize_stream(compute->get()).ok());
}

TEST_F(CudaEngineOnFake, DeviceErrorFailsTheTransferAndIsCounted) {
  device_->fail_copy_call = 1;
  std::vector<FramePair> out = {{0, 0}};
  auto t = stack_->engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(t.ok());
  Status st = t->wait();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("illegal memory access"), std::string::npos);
  EXPECT_EQ(stack_->engine->stats().link(Link::kHbmToHost).errors.load(), 1u);
  // The engine keeps working.
  EXPECT_TRUE(stack_->engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
}

// Without a completion event the engine cannot tell when a job's DMA lands, so such a job must
// enqueue nothing (no event could be created) or be reported done only once its stream drained
// (the event could not be recorded): the frames of a failed transfer are reused at once.
TEST_F(CudaEngineOnFake, NoEventCreatedMeansNothingCopied) {
  device_->d2h_delay_ms = 30;
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  fill_pattern(s.hbm->frame_address(2), page, 5);
  std::memset(s.host->frame_address(4), 0xEE, page);
  const int calls = device_->copy_calls.load();
  device_->fail_event_creates = 1;
  std::vector<FramePair> out = {{2, 4}};
  auto t = s.engine->copy(CopyDirection::kHbmToHost, out);
  ASSERT_TRUE(t.ok());
  Status st = t->wait();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("cudaEventCreate"), std::string::npos) << st.message();
  // A later copy on the same stream completes after anything the failed one could have enqueued.
  std::vector<FramePair> later = {{3, 9}};
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHbmToHost, later)->wait().ok());
  EXPECT_EQ(device_->copy_calls.load(), calls + 1);
  const auto* host = reinterpret_cast<const unsigned char*>(s.host->frame_address(4));
  EXPECT_TRUE(std::all_of(host, host + page, [](unsigned char b) { return b == 0xEE; }))
      << "the failed copy wrote its destination after it was reported done";
}

TEST_F(CudaEngineOnFake, UnrecordedEventIsReportedOnlyOnceTheStreamDrained) {
  device_->d2h_delay_ms = 50;
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  fill_pattern(s.hbm->frame_address(2), page, 6);
  fill_pattern(s.host->frame_address(7), page, 8);
  std::memset(s.host->frame_address(4), 0xEE, page);
  device_->fail_event_records = 1;
  std::vector<FramePair> out = {{2, 4}};
  std::vector<FramePair> in = {{7, 2}};  // overwrites the frame being copied out
  auto t_out = s.engine->copy(CopyDirection::kHbmToHost, out);
  auto t_in = s.engine->copy(CopyDirection::kHostToHbm, in);
  ASSERT_TRUE(t_out.ok() && t_in.ok());
  Status st = t_out->wait();
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_NE(st.message().find("cudaEventRecord"), std::string::npos) << st.message();
  // Reported done: the DMA has landed and will not write host frame 4 any more.
  EXPECT_TRUE(matches_pattern(s.host->frame_address(4), page, 6))
      << "the copy was reported done before its DMA finished (or it saw the copy in's bytes)";
  ASSERT_TRUE(t_in->wait().ok());
  EXPECT_TRUE(matches_pattern(s.hbm->frame_address(2), page, 8));
  // The engine keeps working.
  ASSERT_TRUE(s.engine->copy(CopyDirection::kHbmToHost, out)->wait().ok());
  EXPECT_TRUE(matches_pattern(s.host->frame_address(4), page, 8));
}

TEST_F(CudaEngineOnFake, ManyTransfersInBothDirections) {
  auto& s = *stack_;
  const std::size_t page = kGeom.page_bytes();
  std::vector<Transfer> ts;
  for (uint32_t round = 0; round < 50; ++round) {
    const uint32_t f = round % 32;
    fill_pattern(s.host->frame_address(f), page, round);
    std::vector<FramePair> in = {{f, f}};
    ts.push_back(std::move(s.engine->copy(CopyDirection::kHostToHbm, in)).value());
    std::vector<FramePair> out = {{f, 32 + f}};
    ts.push_back(std::move(s.engine->copy(CopyDirection::kHbmToHost, out)).value());
    // The next round rewrites host frame f only after this round's copy in read it.
    ASSERT_TRUE(ts[ts.size() - 2].wait().ok());
    ASSERT_TRUE(ts.back().wait().ok());
    EXPECT_TRUE(matches_pattern(s.host->frame_address(32 + f), page, round)) << round;
  }
}

}  // namespace
}  // namespace kvtier

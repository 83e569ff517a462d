// A whole Runtime over a real NVMe store whose I/O fails underneath it (EIO from the I/O backend).
// A disk that fails every write: the engine's steps all run on memory alone, writing pauses after
// tiers.nvme.pause_after_failed_writes failures in a row, no write reaches the disk while paused,
// /metrics says so, and a shutdown while paused persists nothing and returns. A bad sector: it
// costs one failed write (or read) and its extent, which the store and the scheduler retire,
// and nothing else. A disk that fails every read: reading pauses after
// tiers.nvme.pause_after_failed_reads failures in a row, and prompts then recompute what is cached
// on NVMe only, without a read, instead of failing on it. A dead drive among four: the store takes
// it out of service, the scheduler forgets the blocks it held, and the engine runs on the others;
// so it does when the drive hangs instead (tiers.nvme.io_timeout_ms), and a lone drive that hangs
// is paused like one that fails. A dead drive that answers again is readmitted
// (tiers.nvme.readmit_after_ms) and filled again; a runtime restarted with a drive dead opens
// without it and readmits it once it answers.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/scheduler_stats.hpp"
#include "tests/runtime/metrics_test_util.hpp"
#include "tests/runtime/runtime_test_util.hpp"
#include "tiers/fault_injection.hpp"

namespace kvtier {
namespace {

struct Scrape {
  double paused = -1;
  double pauses = -1;
  double refused = -1;
  double retired = -1;
  double failed_loads = -1;
  double reads_paused = -1;
  double read_pauses = -1;
  double files_out = -1;
  double blocks_lost = -1;
  double io_timeouts = -1;
  double unanswered = -1;
  double writes_pending = -1;  // bytes queued or in flight host -> NVMe
  double reads_pending = -1;   // bytes queued or in flight NVMe -> host
  double probes = -1;
  double readmitted = -1;
  double replaced = -1;
  double frames_held = -1;  // host frames failed NVMe reads hold
};

// Bytes a link has queued (at any priority) or in flight, from a scrape; -1 if it has no gauge.
double pending_bytes(const std::string& body, const std::string& src, const std::string& dst) {
  const std::string link = "src=\"" + src + "\",dst=\"" + dst + "\"";
  double pending =
      testing::sample_value(body, "kvtier_link_inflight_bytes{" + link + "}").value_or(-1);
  for (const char* priority : kQueuePriorityNames) {
    const std::string series =
        "kvtier_link_queued_bytes{" + link + ",priority=\"" + priority + "\"}";
    pending += testing::sample_value(body, series).value_or(0);
  }
  return pending;
}

Scrape scrape(const Runtime& rt) {
  const testing::HttpResponse r = testing::http_get(rt.metrics_port(), "/metrics");
  EXPECT_EQ(r.status, 200) << r.error;
  Scrape s;
  s.paused = testing::sample_value(r.body, "kvtier_nvme_writes_paused").value_or(-1);
  s.pauses = testing::sample_value(r.body, "kvtier_nvme_write_pauses_total").value_or(-1);
  s.refused = testing::sample_value(r.body, "kvtier_refused_demotions_total").value_or(-1);
  s.retired = testing::sample_value(r.body, "kvtier_nvme_retired_extents").value_or(-1);
  s.failed_loads = testing::sample_value(r.body, "kvtier_failed_loads_total").value_or(-1);
  s.reads_paused = testing::sample_value(r.body, "kvtier_nvme_reads_paused").value_or(-1);
  s.frames_held = testing::sample_value(r.body, "kvtier_host_frames_held").value_or(-1);
  s.read_pauses = testing::sample_value(r.body, "kvtier_nvme_read_pauses_total").value_or(-1);
  s.files_out = testing::sample_value(r.body, "kvtier_nvme_files_out_of_service").value_or(-1);
  s.blocks_lost = testing::sample_value(r.body, "kvtier_nvme_blocks_lost_total").value_or(-1);
  s.io_timeouts = testing::sample_value(r.body, "kvtier_nvme_io_timeouts_total").value_or(-1);
  s.unanswered = testing::sample_value(r.body, "kvtier_nvme_requests_unanswered").value_or(-1);
  s.probes = testing::sample_value(r.body, "kvtier_nvme_probes_total").value_or(-1);
  s.readmitted = testing::sample_value(r.body, "kvtier_nvme_files_readmitted_total").value_or(-1);
  s.replaced = testing::sample_value(r.body, "kvtier_nvme_files_replaced_total").value_or(-1);
  s.writes_pending = pending_bytes(r.body, "host", "nvme");
  s.reads_pending = pending_bytes(r.body, "nvme", "host");
  return s;
}

// Scrapes until `settled` holds, for up to 10 s: reads a step stopped waiting for (it recomputed
// their blocks instead) end after the step, and what their failures change shows then.
Scrape scrape_until(const Runtime& rt, const std::function<bool(const Scrape&)>& settled) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Scrape s = scrape(rt);
  while (!settled(s) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = scrape(rt);
  }
  return s;
}

// Prefills one 8-block prompt of its own (or reuses what is cached of it), checking the bytes,
// and closes it. Returns the step's status; `must_run` expects it OK.
Status prefill_prompt(Runtime& rt, uint32_t seed, bool must_run = true) {
  const std::vector<uint32_t> tokens = testing::make_tokens(8 * 16, seed);
  auto seq = rt.open_sequence(rt.block_keys(tokens));
  EXPECT_TRUE(seq.ok()) << seq.status().to_string();
  if (!seq.ok()) return seq.status();
  bool bytes_ok = true;
  const Status ran = testing::run_checked_step(
      rt, seq->id, tokens, seq->reused_tokens,
      static_cast<uint32_t>(tokens.size() - seq->reused_tokens), &bytes_ok);
  if (must_run) {
    EXPECT_TRUE(ran.ok()) << "prompt " << seed << ": " << ran.to_string();
  }
  EXPECT_TRUE(bytes_ok) << "prompt " << seed << " was served wrong bytes";
  EXPECT_TRUE(rt.close_sequence(seq->id).ok());
  return ran;
}

// Prefills new prompts, `seed` and on, until a scrape says `done`, for up to 10 s: the store
// posts a probe only with a write. Returns the last scrape; `seed` is the next prompt's.
Scrape prefill_until(Runtime& rt, uint32_t& seed, const std::function<bool(const Scrape&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Scrape s = scrape(rt);
  while (!done(s) && std::chrono::steady_clock::now() < deadline) {
    if (!prefill_prompt(rt, seed++).ok()) break;  // prefill_prompt has failed the test
    s = scrape(rt);
  }
  return s;
}

// A runtime over the small test tiers in a scratch directory, its NVMe store's I/O through
// faults_, /metrics on an ephemeral port.
class RuntimeNvmeFailures : public ::testing::Test {
 protected:
  // False where the NVMe store cannot be opened (O_DIRECT or io_uring refused): the test skips.
  bool open(const std::function<void(Config&)>& tweak = {}, const RuntimeOptions& options = {}) {
    Config c = testing::small_config(dir_.path());
    c.metrics.listen = "127.0.0.1:0";
    if (tweak) tweak(c);
    TierStackOptions seams;
    seams.io = faults_;
    rt_ = testing::open_or_skip(c, seams, options);
    return rt_ != nullptr;
  }
  // The store over four files, drive0.kvs .. drive3.kvs, one per drive.
  void four_drives(Config& c) const {
    c.tiers.nvme.paths.clear();
    for (int d = 0; d < 4; ++d) {
      c.tiers.nvme.paths.push_back((dir_.path() / ("drive" + std::to_string(d) + ".kvs")).string());
    }
  }
  // Four drives, probed 200 ms after one goes out.
  void readmitting_four_drives(Config& c) const {
    four_drives(c);
    c.tiers.nvme.readmit_after_ms = 200;
  }
  // Thirty prompts push blocks onto the drives; the second dies, and the first ten prompts asked
  // again (failing or recomputing) take it out of service.
  void prefill_then_kill_drive1() {
    for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
    faults_->fail_file("drive1.kvs");
    for (uint32_t seed = 1; seed <= 10; ++seed) {
      prefill_prompt(*rt_, seed, /*must_run=*/false).ignore();
    }
    const Scrape s = scrape_until(*rt_, [](const Scrape& now) { return now.files_out == 1.0; });
    ASSERT_EQ(s.files_out, 1.0);
  }
  static constexpr const char* kNoStore =
      "the NVMe store cannot be opened here (O_DIRECT or io_uring refused)";

  // The body of the hung-drive tests below.
  void hung_drive_among_four() {
    RuntimeOptions options;
    // Far past the I/O timeout: a step reading from the hung drive fails at the I/O timeout, its
    // read abandoned, and never waits for this.
    options.wait_timeout = std::chrono::milliseconds(60'000);
    const bool opened = open(
        [&](Config& c) {
          four_drives(c);
          c.tiers.nvme.io_timeout_ms = 500;
        },
        options);
    if (!opened) GTEST_SKIP() << kNoStore;
    for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
    faults_->hang_file("drive1.kvs");
    // A prompt asked again fails as the hung drive makes it, or recomputes: its read timed out
    // or was refused (kDeadlineExceeded), the drive is out (kUnavailable), or a refused read was
    // the last copy of a block its sequence holds (kIoError, "was lost": recomputed next step).
    for (uint32_t seed = 1; seed <= 10; ++seed) {
      const Status again = prefill_prompt(*rt_, seed, /*must_run=*/false);
      EXPECT_TRUE(again.ok() || again.code() == StatusCode::kDeadlineExceeded ||
                  again.code() == StatusCode::kUnavailable ||
                  (again.code() == StatusCode::kIoError &&
                   again.message().find("was lost") != std::string::npos))
          << again.to_string();
      EXPECT_EQ(again.message().find("layer not ready after"), std::string::npos)
          << "a step waited for the hung drive: " << again.to_string();
    }
    Scrape s = scrape_until(
        *rt_, [](const Scrape& now) { return now.files_out == 1.0 && now.blocks_lost > 0; });
    ASSERT_EQ(s.files_out, 1.0);
    EXPECT_GT(s.blocks_lost, 0.0);
    EXPECT_GE(s.io_timeouts, 1.0);
    EXPECT_GE(s.unanswered, 1.0);
    const uint64_t held = faults_->injected();
    for (uint32_t seed = 11; seed <= 40; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
    EXPECT_EQ(faults_->injected(), held) << "a request reached the hung drive";
    // Prompts 1..10 wait: a block whose read the drive holds is the drive's until it answers.
    faults_->answer_hung();
    s = scrape_until(*rt_, [](const Scrape& now) { return now.unanswered == 0.0; });
    ASSERT_EQ(s.unanswered, 0.0);
    for (uint32_t seed = 1; seed <= 10; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
    s = scrape(*rt_);
    EXPECT_EQ(s.files_out, 1.0);
    EXPECT_EQ(s.pauses, 0.0) << "writing never paused";
    EXPECT_TRUE(rt_->audit().ok());
    EXPECT_TRUE(rt_->shutdown().ok());
  }

  testing::ScratchDir dir_{"runtime-nvme-failures"};
  std::shared_ptr<FaultInjectingIoBackend> faults_ = std::make_shared<FaultInjectingIoBackend>();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(RuntimeNvmeFailures, ADiskThatFailsEveryWriteIsPausedAndTheEngineRunsOnMemory) {
  const bool opened = open([](Config& c) {
    c.tiers.nvme.pause_after_failed_writes = 2;
    c.tiers.nvme.pause_ms = 600'000;  // holds for the whole test
  });
  if (!opened) GTEST_SKIP() << kNoStore;
  ASSERT_NE(rt_->metrics_port(), 0);
  EXPECT_EQ(scrape(*rt_).paused, 0.0);
  // Every write from now on fails with EIO.
  faults_->add_rule({IoOpcode::kWrite, FaultKind::kError, 1, 1u << 30, EIO});

  // 8-block prompts, 32 pages each: HBM holds 2 of them and host memory 8, so from the eleventh on
  // blocks leave host memory, and the disk is asked to write them.
  uint32_t seed = 1;
  for (; seed <= 40 && scrape(*rt_).paused != 1.0; ++seed) prefill_prompt(*rt_, seed).ignore();
  Scrape s = scrape(*rt_);
  ASSERT_EQ(s.paused, 1.0) << "40 prompts and writing to NVMe never paused";
  EXPECT_EQ(s.pauses, 1.0);
  // Each failed write retired its extent (the first of them, up to one extent in 32) or refused
  // its block.
  EXPECT_GE(s.retired + s.refused, 2.0);

  // While paused, the disk sees no write, and every step still runs: once the writes planned
  // before the pause have ended, none reaches it.
  s = scrape_until(*rt_, [](const Scrape& now) { return now.writes_pending == 0.0; });
  ASSERT_EQ(s.writes_pending, 0.0);
  const uint64_t writes = faults_->requests(IoOpcode::kWrite);
  for (uint32_t more = 0; more < 20; ++more) prefill_prompt(*rt_, 1000 + more).ignore();
  EXPECT_EQ(faults_->requests(IoOpcode::kWrite), writes) << "a write reached the paused disk";
  s = scrape(*rt_);
  EXPECT_EQ(s.paused, 1.0);
  EXPECT_EQ(s.pauses, 1.0);
  const RuntimeStats stats = rt_->stats();
  EXPECT_EQ(stats.used_bytes[tier_index(Tier::kNvme)], 0u) << "nothing was written to NVMe";
  EXPECT_GT(stats.evictions[tier_index(Tier::kHost)], 0u) << "blocks left host memory, dropped";
  EXPECT_TRUE(rt_->audit().ok());
  // A shutdown while paused persists nothing (it says so) and returns.
  EXPECT_TRUE(rt_->shutdown().ok());
  EXPECT_EQ(faults_->requests(IoOpcode::kWrite), writes);
}

uint64_t nvme_capacity(const Runtime& rt) {
  return rt.stats().capacity_bytes[tier_index(Tier::kNvme)];
}

// The next block written lands on a bad sector: that write fails, its extent is retired (in the
// store, and in the scheduler's count), and the block is not refused: written again, elsewhere.
// Nothing pauses, no write fails again, and every step's bytes check out.
TEST_F(RuntimeNvmeFailures, ABadSectorUnderAWriteCostsOneWriteAndItsExtent) {
  if (!open()) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  faults_->make_next_bad(IoOpcode::kWrite);
  // From the eleventh prompt on, blocks leave host memory by way of NVMe.
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_EQ(faults_->injected(), 1u) << "the bad sector failed more than one write";
  EXPECT_GT(faults_->requests(IoOpcode::kWrite), 20u) << "writes went on after it";
  const Scrape s = scrape(*rt_);
  EXPECT_EQ(s.retired, 1.0);
  EXPECT_EQ(s.refused, 0.0) << "the block whose write failed is written again elsewhere";
  EXPECT_EQ(s.pauses, 0.0);
  EXPECT_LT(nvme_capacity(*rt_), capacity) << "the tier holds one extent fewer";
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// A block on NVMe only whose read hits a bad sector: the read fails (the step runs without it or
// fails, never on wrong bytes), the block is dropped, and its extent retired on both sides.
TEST_F(RuntimeNvmeFailures, ABadSectorUnderAReadRetiresItsExtentOnceTheBlockIsDropped) {
  if (!open()) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  // Thirty prompts push the first ones' blocks out of memory, to NVMe.
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  ASSERT_EQ(scrape(*rt_).retired, 0.0);
  faults_->make_next_bad(IoOpcode::kRead);
  // The first prompt again: its blocks are read back from NVMe, and the first read fails.
  const Status again = prefill_prompt(*rt_, 1, /*must_run=*/false);
  EXPECT_TRUE(again.ok() || again.code() == StatusCode::kIoError) << again.to_string();
  EXPECT_EQ(faults_->injected(), 1u);
  const Scrape s = scrape(*rt_);
  EXPECT_GE(s.failed_loads, 1.0);
  EXPECT_EQ(s.retired, 1.0);
  EXPECT_LT(nvme_capacity(*rt_), capacity);
  // Prompts go on as before, the first one included (recomputed where its block was lost).
  for (uint32_t seed = 1; seed <= 5; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_EQ(scrape(*rt_).retired, 1.0);
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// One read the drive holds, the drive otherwise well: the step reading it fails at
// tiers.nvme.io_timeout_ms, the read abandoned (or, after it, refused while the drive holds it),
// and never waits for the step's wait_timeout, a minute here. Reading pauses after that failure,
// and the prompt asked once more recomputes what it read from NVMe while the drive still holds
// the read: the block is no longer tied to it. The host frames the read would fill stay out of
// use until the drive answers, and the runtime audits clean meanwhile; then prompts run as before.
TEST_F(RuntimeNvmeFailures, AReadTheDriveHoldsFailsItsStepAtTheIoTimeout) {
  RuntimeOptions options;
  options.wait_timeout = std::chrono::milliseconds(60'000);
  const bool opened = open(
      [](Config& c) {
        c.tiers.nvme.io_timeout_ms = 300;
        c.tiers.nvme.pause_after_failed_reads = 1;
        c.tiers.nvme.pause_ms = 600'000;  // holds for the whole test
      },
      options);
  if (!opened) GTEST_SKIP() << kNoStore;
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  faults_->add_rule({IoOpcode::kRead, FaultKind::kHang, 1, 1});
  const Status again = prefill_prompt(*rt_, 1, /*must_run=*/false);
  EXPECT_EQ(again.code(), StatusCode::kDeadlineExceeded) << again.to_string();
  EXPECT_NE(again.message().find("unanswered"), std::string::npos) << again.to_string();
  EXPECT_EQ(again.message().find("layer not ready after"), std::string::npos)
      << "the step waited for the hung drive: " << again.to_string();
  Scrape s = scrape(*rt_);
  EXPECT_EQ(s.unanswered, 1.0);
  EXPECT_GE(s.io_timeouts, 1.0);
  EXPECT_GE(s.frames_held, 1.0) << "the host frames the drive may still fill";
  const Status held = rt_->audit();
  EXPECT_TRUE(held.ok()) << "with the read's frames held: " << held.to_string();
  ASSERT_TRUE(prefill_prompt(*rt_, 1).ok());
  EXPECT_EQ(scrape(*rt_).unanswered, 1.0) << "the drive still holds the read";
  faults_->answer_hung();
  s = scrape_until(
      *rt_, [](const Scrape& now) { return now.unanswered == 0.0 && now.frames_held == 0.0; });
  ASSERT_EQ(s.unanswered, 0.0);
  EXPECT_EQ(s.frames_held, 0.0) << "released when the drive answered";
  for (uint32_t seed = 1; seed <= 5; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// Every read fails once thirty prompts have pushed the first ones' blocks to NVMe. The first
// prompt asked again reads its blocks back, and the reads fail, which pauses reading (two failures
// in a row); every prompt after it recomputes its blocks without a read, runs, and is served the
// right bytes. The disk sees no read while paused, and nothing is dropped from it.
TEST_F(RuntimeNvmeFailures, ADiskThatFailsEveryReadIsPausedAndPromptsRecompute) {
  const bool opened = open([](Config& c) {
    c.tiers.nvme.pause_after_failed_reads = 2;
    c.tiers.nvme.pause_ms = 600'000;  // holds for the whole test
  });
  if (!opened) GTEST_SKIP() << kNoStore;
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  const uint64_t on_nvme = rt_->stats().used_bytes[tier_index(Tier::kNvme)];
  ASSERT_GT(on_nvme, 0u);
  EXPECT_EQ(scrape(*rt_).reads_paused, 0.0);
  faults_->add_rule({IoOpcode::kRead, FaultKind::kError, 1, 1u << 30, EIO});

  // Its step fails with the reads, or runs recomputing the blocks they lost; never on wrong bytes.
  const Status first = prefill_prompt(*rt_, 1, /*must_run=*/false);
  EXPECT_TRUE(first.ok() || first.code() == StatusCode::kIoError) << first.to_string();
  EXPECT_GE(faults_->injected(), 2u);
  // The step's other reads were sent with the two that failed, and may reach the disk after the
  // pause: counted once they end.
  Scrape s = scrape_until(
      *rt_, [](const Scrape& now) { return now.reads_paused == 1.0 && now.reads_pending == 0.0; });
  ASSERT_EQ(s.reads_paused, 1.0);
  ASSERT_EQ(s.reads_pending, 0.0);
  EXPECT_EQ(s.read_pauses, 1.0);
  const uint64_t reads = faults_->requests(IoOpcode::kRead);
  for (uint32_t seed = 2; seed <= 10; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_EQ(faults_->requests(IoOpcode::kRead), reads) << "a read reached the paused disk";
  s = scrape(*rt_);
  EXPECT_EQ(s.reads_paused, 1.0);
  EXPECT_EQ(s.read_pauses, 1.0);
  EXPECT_EQ(s.pauses, 0.0) << "writes were never paused";
  EXPECT_GT(rt_->stats().used_bytes[tier_index(Tier::kNvme)], 0u) << "NVMe keeps its blocks";
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// The store over four files, one per drive; thirty prompts push blocks to NVMe, the first of them
// onto the first drive, which then dies: every request to it fails with EIO. The first prompts
// asked again read their blocks from it and fail or recompute; within a few failures the store
// takes the drive out of service and the scheduler forgets its blocks. From then on every prompt
// runs, nothing pauses, no request reaches the dead drive's file, and the tier holds a quarter
// fewer blocks.
TEST_F(RuntimeNvmeFailures, ADeadDriveAmongFourIsTakenOutAndTheEngineRunsOnTheOthers) {
  const bool opened = open([&](Config& c) { four_drives(c); });
  if (!opened) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  faults_->fail_file("drive1.kvs");
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    const Status again = prefill_prompt(*rt_, seed, /*must_run=*/false);
    EXPECT_TRUE(again.ok() || again.code() == StatusCode::kIoError ||
                again.code() == StatusCode::kUnavailable)
        << again.to_string();
  }
  Scrape s = scrape_until(
      *rt_, [](const Scrape& now) { return now.files_out == 1.0 && now.blocks_lost > 0; });
  ASSERT_EQ(s.files_out, 1.0);
  EXPECT_GT(s.blocks_lost, 0.0);
  const uint64_t injected = faults_->injected();
  for (uint32_t seed = 11; seed <= 40; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  for (uint32_t seed = 1; seed <= 10; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_EQ(faults_->injected(), injected) << "a request reached the dead drive";
  s = scrape(*rt_);
  EXPECT_EQ(s.pauses, 0.0) << "writing never paused";
  EXPECT_EQ(s.read_pauses, 0.0) << "reading never paused";
  EXPECT_LE(nvme_capacity(*rt_), capacity * 3 / 4);
  EXPECT_GT(rt_->stats().used_bytes[tier_index(Tier::kNvme)], 0u);
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// As above, and then the drive answers again. While it is dead, probes fail and it stays out; once
// it answers, a probe (posted with a write, 200 ms after the last) puts it back in service, the
// scheduler's NVMe capacity is whole again, and the tier fills past the three quarters the other
// drives hold. Its old blocks stay forgotten: the first prompts recompute them.
TEST_F(RuntimeNvmeFailures, ADeadDriveThatAnswersAgainIsReadmittedAndFilledAgain) {
  if (!open([&](Config& c) { readmitting_four_drives(c); })) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  ASSERT_NO_FATAL_FAILURE(prefill_then_kill_drive1());
  uint32_t seed = 100;
  // Dead still: prompts run on the other drives while probes fail.
  Scrape s = prefill_until(*rt_, seed, [](const Scrape& now) { return now.probes >= 1.0; });
  ASSERT_GE(s.probes, 1.0);
  EXPECT_EQ(s.files_out, 1.0);
  EXPECT_EQ(s.readmitted, 0.0);
  EXPECT_LE(nvme_capacity(*rt_), capacity * 3 / 4);
  // The drive answers: the next probe due readmits it.
  faults_->clear();
  s = prefill_until(*rt_, seed, [](const Scrape& now) { return now.readmitted >= 1.0; });
  ASSERT_EQ(s.readmitted, 1.0);
  EXPECT_EQ(s.files_out, 0.0);
  for (uint32_t more = 0; more < 60; ++more) ASSERT_TRUE(prefill_prompt(*rt_, seed++).ok());
  // Whole again, but for the extents its failed writes marked bad (at most one in 32).
  EXPECT_GE(nvme_capacity(*rt_), capacity - capacity / 32);
  EXPECT_GT(nvme_capacity(*rt_), capacity * 3 / 4);
  EXPECT_GT(rt_->stats().used_bytes[tier_index(Tier::kNvme)], capacity * 3 / 4)
      << "the readmitted drive holds blocks again";
  for (uint32_t first = 1; first <= 10; ++first) ASSERT_TRUE(prefill_prompt(*rt_, first).ok());
  s = scrape(*rt_);
  EXPECT_EQ(s.pauses, 0.0) << "writing never paused";
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// The second of four drives dies while the runtime runs, and is replaced: a new, empty file where
// its file was (a new drive's file system mounted there; the store still holds the old file
// open). Its next probe formats the new file, and the scheduler plans with the whole capacity
// again: the new drive has none of the old one's bad-sector marks. Prompts fill it, and after a
// restart it is a drive like the others.
TEST_F(RuntimeNvmeFailures, ADriveReplacedWhileTheRuntimeRunsIsFormattedAndFilled) {
  const auto config = [&](Config& c) { readmitting_four_drives(c); };
  if (!open(config)) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  ASSERT_NO_FATAL_FAILURE(prefill_then_kill_drive1());
  const std::filesystem::path drive1 = dir_.path() / "drive1.kvs";
  ASSERT_TRUE(std::filesystem::remove(drive1));
  { std::ofstream created(drive1); }
  faults_->clear();
  uint32_t seed = 100;
  Scrape s = prefill_until(*rt_, seed, [](const Scrape& now) { return now.replaced >= 1.0; });
  ASSERT_EQ(s.replaced, 1.0);
  EXPECT_EQ(s.readmitted, 1.0);
  EXPECT_EQ(s.files_out, 0.0);
  for (uint32_t more = 0; more < 60; ++more) ASSERT_TRUE(prefill_prompt(*rt_, seed++).ok());
  EXPECT_EQ(nvme_capacity(*rt_), capacity) << "the new drive carries no bad-sector marks";
  EXPECT_GT(rt_->stats().used_bytes[tier_index(Tier::kNvme)], capacity * 3 / 4)
      << "the new drive holds blocks";
  EXPECT_TRUE(rt_->audit().ok());
  ASSERT_TRUE(rt_->shutdown().ok());
  rt_.reset();
  ASSERT_TRUE(open(config));
  s = scrape(*rt_);
  EXPECT_EQ(s.files_out, 0.0);
  EXPECT_EQ(s.replaced, 0.0) << "after the restart it is a drive of the store like the others";
  EXPECT_EQ(nvme_capacity(*rt_), capacity);
  for (uint32_t first = 1; first <= 10; ++first) ASSERT_TRUE(prefill_prompt(*rt_, first).ok());
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// Thirty prompts push blocks onto four drives; the runtime is restarted with the third one dead.
// It opens (the store without that drive, out of service from the start), every prompt runs,
// those whose blocks were on the dead drive recomputing them, and the scheduler plans with three
// quarters of the capacity. Once the drive answers, a probe readmits it.
TEST_F(RuntimeNvmeFailures, ARuntimeRestartedWithADriveDeadOpensWithoutItAndReadmitsIt) {
  const auto config = [&](Config& c) { readmitting_four_drives(c); };
  if (!open(config)) GTEST_SKIP() << kNoStore;
  const uint64_t capacity = nvme_capacity(*rt_);
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  ASSERT_TRUE(rt_->shutdown().ok());
  rt_.reset();
  faults_->fail_file("drive2.kvs");
  ASSERT_TRUE(open(config));
  Scrape s = scrape(*rt_);
  EXPECT_EQ(s.files_out, 1.0);
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_LE(nvme_capacity(*rt_), capacity * 3 / 4);
  faults_->clear();
  uint32_t seed = 100;
  s = prefill_until(*rt_, seed, [](const Scrape& now) { return now.readmitted >= 1.0; });
  EXPECT_EQ(s.readmitted, 1.0);
  EXPECT_EQ(s.files_out, 0.0);
  ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  EXPECT_EQ(nvme_capacity(*rt_), capacity) << "no request failed: no extent was marked bad";
  EXPECT_EQ(s.pauses, 0.0) << "writing never paused";
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

// As above, but the drive hangs: its requests are never answered. The store counts the first
// requests past tiers.nvme.io_timeout_ms against the drive and refuses every later one at once,
// so within a few prompts the drive is out of service and its blocks are forgotten. A step that
// waits on a read the drive holds fails at wait_timeout (2 s here). From then on every new prompt
// runs on the other drives, and no request reaches the hung one; when it answers at last, the
// reads it held end, and the first prompts run again (a block whose read the drive held could not
// be used, nor recomputed, until then).
TEST_F(RuntimeNvmeFailures, AHungDriveAmongFourIsTakenOutAndTheEngineRunsOnTheOthers) {
  hung_drive_among_four();
}

// The same over the synchronous I/O queue (io_uring refused, as in containers whose seccomp
// profile refuses it), the hung drive holding the queue's threads inside their system calls.
TEST_F(RuntimeNvmeFailures, AHungDriveAmongFourOverTheSynchronousQueueIsTakenOutToo) {
  faults_->hang_in_system_calls();
  hung_drive_among_four();
}

// A lone drive that hangs once thirty prompts have pushed blocks to it: the first request past
// tiers.nvme.io_timeout_ms fails, every later one fails at once, and the scheduler's pauses count
// both. Writing pauses and the engine runs on memory; the first prompts asked again fail or
// recompute what their reads lost until reading pauses too, and then recompute without a read.
// No request reaches the drive while both are paused.
TEST_F(RuntimeNvmeFailures, ALoneHungDriveIsPausedAndTheEngineRunsOnMemory) {
  RuntimeOptions options;
  options.wait_timeout = std::chrono::milliseconds(2000);
  const bool opened = open(
      [](Config& c) {
        c.tiers.nvme.io_timeout_ms = 500;
        c.tiers.nvme.pause_after_failed_writes = 2;
        c.tiers.nvme.pause_after_failed_reads = 2;
        c.tiers.nvme.pause_ms = 600'000;  // holds for the whole test
      },
      options);
  if (!opened) GTEST_SKIP() << kNoStore;
  for (uint32_t seed = 1; seed <= 30; ++seed) ASSERT_TRUE(prefill_prompt(*rt_, seed).ok());
  ASSERT_GT(rt_->stats().used_bytes[tier_index(Tier::kNvme)], 0u);
  faults_->hang_file("store0.kvs");
  uint32_t seed = 31;
  for (; seed <= 70 && scrape(*rt_).paused != 1.0; ++seed) prefill_prompt(*rt_, seed).ignore();
  Scrape s = scrape(*rt_);
  ASSERT_EQ(s.paused, 1.0) << "40 prompts and writing to the hung drive never paused";
  EXPECT_GE(s.io_timeouts, 1.0);
  for (uint32_t again = 1; again <= 5; ++again) {
    const Status ran = prefill_prompt(*rt_, again, /*must_run=*/false);
    EXPECT_TRUE(ran.ok() || ran.code() == StatusCode::kDeadlineExceeded) << ran.to_string();
  }
  s = scrape_until(*rt_, [](const Scrape& now) { return now.reads_paused == 1.0; });
  ASSERT_EQ(s.reads_paused, 1.0);
  const uint64_t held = faults_->injected();
  for (uint32_t again = 6; again <= 15; ++again) ASSERT_TRUE(prefill_prompt(*rt_, again).ok());
  for (uint32_t more = 0; more < 10; ++more) ASSERT_TRUE(prefill_prompt(*rt_, 100 + more).ok());
  EXPECT_EQ(faults_->injected(), held) << "a request reached the paused drive";
  faults_->answer_hung();
  s = scrape_until(*rt_, [](const Scrape& now) { return now.unanswered == 0.0; });
  EXPECT_EQ(s.unanswered, 0.0);
  EXPECT_EQ(s.files_out, 0.0) << "the only drive stays in service";
  EXPECT_TRUE(rt_->audit().ok());
  EXPECT_TRUE(rt_->shutdown().ok());
}

}  // namespace
}  // namespace kvtier

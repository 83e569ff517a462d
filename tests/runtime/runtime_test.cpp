// The Runtime over real tiers (emulated HBM, host pool, io_uring NVMe store in a temp dir): bytes
// written through block tables come back identical after travelling down the tiers and up again,
// across a restart; bad input is an error, not a crash; accounting stays exact.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "metrics_test_util.hpp"
#include "runtime_test_util.hpp"

namespace kvtier {
namespace {

using testing::check_tokens;
using testing::make_tokens;
using testing::open_or_skip;
using testing::run_checked_step;
using testing::ScratchDir;
using testing::small_config;

TEST(Runtime, PagesSurviveEvictionToHostAndNvmeBitForBit) {
  ScratchDir dir("runtime-evict");
  auto rt = open_or_skip(small_config(dir.path()));
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here (O_DIRECT or io_uring refused)";
  const Geometry& g = rt->geometry();
  // 12 prompts of 6 blocks (24 pages each): far more than HBM (64 frames) and host (256) hold.
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 12; ++p) prompts.push_back(make_tokens(6 * g.page_tokens, p + 1));
  for (const auto& tokens : prompts) {
    auto seq = rt->open_sequence(rt->block_keys(tokens));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    bool bytes_ok = true;
    Status s =
        run_checked_step(*rt, seq->id, tokens, 0, static_cast<uint32_t>(tokens.size()), &bytes_ok);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  const RuntimeStats mid = rt->stats();
  EXPECT_GT(mid.demotions[tier_index(Tier::kHost)], 0u);
  // Every prompt comes back, from wherever it went, with exactly the bytes that were written.
  for (const auto& tokens : prompts) {
    auto seq = rt->open_sequence(rt->block_keys(tokens));
    ASSERT_TRUE(seq.ok());
    bool bytes_ok = true;
    Status s =
        run_checked_step(*rt, seq->id, tokens, seq->reused_tokens,
                         static_cast<uint32_t>(tokens.size() - seq->reused_tokens), &bytes_ok);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_TRUE(bytes_ok) << "a reused page differs from what was written";
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  const RuntimeStats end = rt->stats();
  uint64_t hits = 0;
  for (uint64_t h : end.hit_tokens) hits += h;
  EXPECT_GT(hits, 0u);
  EXPECT_EQ(end.failed_loads, 0u);
  EXPECT_EQ(end.checksum_failures, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
}

// Computes `tokens` as one prompt in a runtime opened on `c` and shuts it down, which persists the
// prompt's blocks to NVMe: the next runtime opened on `c` finds them there. Skips the test when
// the NVMe store cannot be opened here (O_DIRECT or io_uring refused).
void persist_prompt(const Config& c, const std::vector<uint32_t>& tokens) {
  auto rt = open_or_skip(c);
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here";
  auto seq = rt->open_sequence(rt->block_keys(tokens));
  ASSERT_TRUE(seq.ok());
  bool ok = true;
  ASSERT_TRUE(
      run_checked_step(*rt, seq->id, tokens, 0, static_cast<uint32_t>(tokens.size()), &ok).ok());
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  ASSERT_TRUE(rt->shutdown().ok());
}

// Decodes one token after the prompt `tokens` of sequence `seq`, whose prefix it reused, and
// checks every byte the step reads through its block tables.
void decode_one_and_check_bytes(Runtime& rt, const OpenedSequence& seq,
                                const std::vector<uint32_t>& tokens) {
  std::vector<uint32_t> with_next = tokens;  // the prompt and the one token decoded after it
  with_next.push_back(7);
  bool bytes_ok = true;
  ASSERT_TRUE(run_checked_step(rt, seq.id, with_next, seq.reused_tokens, 1, &bytes_ok).ok());
  EXPECT_TRUE(bytes_ok) << "bytes read back from NVMe differ from those written";
}

TEST(Runtime, AfterARestartThePrefixIsFoundOnNvme) {
  ScratchDir dir("runtime-restart");
  const Config c = small_config(dir.path());
  const auto tokens = make_tokens(8 * c.model.geometry.page_tokens, 77);
  ASSERT_NO_FATAL_FAILURE(persist_prompt(c, tokens));
  if (IsSkipped()) return;
  auto rt = open_or_skip(c);
  ASSERT_NE(rt, nullptr);
  EXPECT_GE(rt->stats().nvme_recovered_blocks, 8u);
  auto m = rt->match(rt->block_keys(tokens));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blocks, 8u);
  EXPECT_EQ(m->by_tier[tier_index(Tier::kNvme)], 8u);
  auto seq = rt->open_sequence(rt->block_keys(tokens));
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(seq->reused_blocks, 8u) << "the prefix must be loaded, not recomputed";
  ASSERT_NO_FATAL_FAILURE(decode_one_and_check_bytes(*rt, *seq, tokens));
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
}

// A waiting request's hint reads its prefix up from NVMe (found there after a restart) before the
// request starts; the request then reuses it from host memory, with the bytes that were written,
// and the reads are counted as hinted and reused.
TEST(Runtime, AHintReadsAWaitingPrefixUpFromNvmeAndItsRequestReusesIt) {
  ScratchDir dir("runtime-hint");
  const Config c = small_config(dir.path());
  const auto tokens = make_tokens(8 * c.model.geometry.page_tokens, 78);
  ASSERT_NO_FATAL_FAILURE(persist_prompt(c, tokens));
  if (IsSkipped()) return;
  auto rt = open_or_skip(c);
  ASSERT_NE(rt, nullptr);
  const std::vector<BlockKey> keys = rt->block_keys(tokens);
  ASSERT_EQ(rt->match(keys)->by_tier[tier_index(Tier::kNvme)], 8u);
  const int64_t in_a_second =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch() + std::chrono::seconds(1))
          .count();
  const HintedRequest waiting{1, in_a_second, keys};
  ASSERT_TRUE(rt->hint(std::span(&waiting, 1)).ok());
  const int host = tier_index(Tier::kHost);
  for (int i = 0; i < 1000 && rt->stats().hinted_loads[host] < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(rt->stats().hinted_loads[host], 8u);
  EXPECT_EQ(rt->stats().hinted_loads[tier_index(Tier::kNvme)], 0u);
  EXPECT_EQ(rt->match(keys)->by_tier[tier_index(Tier::kNvme)], 0u) << "read up before it started";

  auto seq = rt->open_sequence(keys);
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(seq->reused_blocks, 8u);
  const RuntimeStats s = rt->stats();
  EXPECT_EQ(s.hinted_loads_reused[host], 8u);
  EXPECT_EQ(s.hinted_loads_reused[tier_index(Tier::kHbm)], s.hinted_loads[tier_index(Tier::kHbm)]);
  ASSERT_NO_FATAL_FAILURE(decode_one_and_check_bytes(*rt, *seq, tokens));
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  ASSERT_TRUE(rt->hint({}).ok());
}

TEST(Runtime, BadInputIsAnErrorAndNothingLeaks) {
  ScratchDir dir("runtime-bad");
  Config c = small_config(dir.path());
  c.tiers.nvme.enabled = false;
  auto rt = open_or_skip(c);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->close_sequence(12345).code(), StatusCode::kNotFound);
  const StepItem ghost{777, 1};
  EXPECT_EQ(rt->begin_step(std::span(&ghost, 1)).status().code(), StatusCode::kNotFound);
  // Keys of another namespace.
  const auto tokens = make_tokens(32, 5);
  const auto foreign = chain_block_keys("another-model", tokens, 16);
  auto wrong = rt->open_sequence(foreign);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("another namespace"), std::string::npos);
  // A step that cannot fit in HBM (one layer needs more than 64 frames).
  auto big = rt->open_sequence(rt->block_keys(make_tokens(16 * 80, 6)));
  ASSERT_TRUE(big.ok());
  const StepItem huge{big->id, 16 * 80};
  auto too_big = rt->begin_step(std::span(&huge, 1));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  // The same sequence twice in one step; a step over a sequence already in a step.
  auto seq = rt->open_sequence(rt->block_keys(tokens));
  ASSERT_TRUE(seq.ok());
  const StepItem twice[2] = {{seq->id, 1}, {seq->id, 1}};
  EXPECT_EQ(rt->begin_step(twice).status().code(), StatusCode::kInvalidArgument);
  const StepItem one{seq->id, 32};
  auto step = rt->begin_step(std::span(&one, 1));
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(rt->begin_step(std::span(&one, 1)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt->layer_table(step->id, 99).status().code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(rt->abort_step(step->id).ok());
  EXPECT_EQ(rt->end_step(step->id).code(), StatusCode::kNotFound);
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  EXPECT_EQ(rt->close_sequence(seq->id).code(), StatusCode::kNotFound);
  ASSERT_TRUE(rt->close_sequence(big->id).ok());
  // Nothing is left allocated once every sequence is closed and nothing was published.
  const RuntimeStats s = rt->stats();
  EXPECT_EQ(s.used_bytes[tier_index(Tier::kHbm)], 0u);
  EXPECT_EQ(s.open_sequences, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
  // Calls after shutdown.
  EXPECT_EQ(rt->open_sequence(rt->block_keys(tokens)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt->match(rt->block_keys(tokens)).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(rt->shutdown().ok()) << "shutdown is idempotent";
}

TEST(Runtime, AnInvalidConfigIsRefusedWithItsKey) {
  ScratchDir dir("runtime-config");
  Config c = small_config(dir.path());
  c.tiers.hbm.watermarks.low = 2.0;
  auto rt = Runtime::open(c);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rt.status().message().find("tiers.hbm.watermarks"), std::string::npos)
      << rt.status().message();
}

TEST(Runtime, PinnedPrefixStaysInHbmUntilUnpinned) {
  ScratchDir dir("runtime-pin");
  Config c = small_config(dir.path());
  c.policies.pin_quota = 0.5;
  auto rt = open_or_skip(c);
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here";
  const Geometry& g = rt->geometry();
  const auto system = make_tokens(4 * g.page_tokens, 1);
  {
    auto seq = rt->open_sequence(rt->block_keys(system));
    ASSERT_TRUE(seq.ok());
    bool ok = true;
    ASSERT_TRUE(
        run_checked_step(*rt, seq->id, system, 0, static_cast<uint32_t>(system.size()), &ok).ok());
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  auto pin = rt->pin_prefix(rt->block_keys(system), std::chrono::minutes(10));
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  // Over the quota (0.5 x 64 frames = 8 blocks of 4 layers): refused, nothing changes.
  auto too_much = rt->pin_prefix(rt->block_keys(make_tokens(16 * 5, 3)), std::chrono::minutes(1));
  EXPECT_FALSE(too_much.ok());
  // Churn enough other prompts through HBM to evict everything that is not pinned.
  for (uint32_t p = 0; p < 10; ++p) {
    const auto tokens = make_tokens(6 * g.page_tokens, 100 + p);
    auto seq = rt->open_sequence(rt->block_keys(tokens));
    ASSERT_TRUE(seq.ok());
    bool ok = true;
    ASSERT_TRUE(
        run_checked_step(*rt, seq->id, tokens, 0, static_cast<uint32_t>(tokens.size()), &ok).ok());
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  auto m = rt->match(rt->block_keys(system));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->by_tier[tier_index(Tier::kHbm)], 4u) << "a pinned prefix left HBM";
  EXPECT_EQ(rt->stats().pinned_prefix_blocks, 4u);
  ASSERT_TRUE(rt->unpin_prefix(*pin).ok());
  EXPECT_EQ(rt->unpin_prefix(*pin).code(), StatusCode::kNotFound);
  EXPECT_EQ(rt->stats().pinned_prefix_blocks, 0u);
}

TEST(Runtime, PinnedPrefixExpiresAfterItsTtl) {
  ScratchDir dir("runtime-ttl");
  Config c = small_config(dir.path());
  c.tiers.nvme.enabled = false;
  auto rt = open_or_skip(c);
  ASSERT_NE(rt, nullptr);
  const auto system = make_tokens(2 * 16, 9);
  auto seq = rt->open_sequence(rt->block_keys(system));
  ASSERT_TRUE(seq.ok());
  bool ok = true;
  ASSERT_TRUE(run_checked_step(*rt, seq->id, system, 0, 32, &ok).ok());
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  auto pin = rt->pin_prefix(rt->block_keys(system), std::chrono::milliseconds(20));
  ASSERT_TRUE(pin.ok());
  for (int i = 0; i < 500 && rt->stats().pinned_prefix_blocks != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(rt->stats().pinned_prefix_blocks, 0u);
  EXPECT_EQ(rt->unpin_prefix(*pin).code(), StatusCode::kNotFound);
}

// A zero or negative timeout is a mistake, refused with the option's name.
TEST(RuntimeOptions, NonPositiveTimeoutsAreRefusedByName) {
  ScratchDir dir("runtime-options");
  Config c = small_config(dir.path());
  c.tiers.nvme.enabled = false;
  RuntimeOptions zero_call;
  zero_call.call_timeout = std::chrono::milliseconds(0);
  RuntimeOptions negative_wait;
  negative_wait.wait_timeout = std::chrono::milliseconds(-5);
  RuntimeOptions zero_shutdown;
  zero_shutdown.shutdown_timeout = std::chrono::milliseconds(0);
  const std::pair<RuntimeOptions, std::string> cases[] = {
      {zero_call, "options.call_timeout is 0;"},
      {negative_wait, "options.wait_timeout is -5;"},
      {zero_shutdown, "options.shutdown_timeout is 0;"}};
  for (const auto& [options, text] : cases) {
    auto rt = Runtime::open(c, options);
    ASSERT_FALSE(rt.ok()) << text;
    EXPECT_EQ(rt.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(rt.status().message().find(text), std::string::npos) << rt.status().message();
  }
}

// milliseconds::max() (INT64_MAX, the usual "never time out") is honoured as a very long wait, not
// overflowed into a negative one when converted to nanoseconds.
TEST(RuntimeOptions, TheLargestTimeoutsAndTtlMeanNoTimeout) {
  ScratchDir dir("runtime-forever");
  Config c = small_config(dir.path());
  c.tiers.nvme.enabled = false;
  RuntimeOptions forever;
  forever.call_timeout = std::chrono::milliseconds::max();
  forever.wait_timeout = std::chrono::milliseconds::max();
  forever.shutdown_timeout = std::chrono::milliseconds::max();
  auto opened = Runtime::open(c, forever);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto rt = std::move(opened).value();
  const auto tokens = make_tokens(2 * 16, 11);
  auto seq = rt->open_sequence(rt->block_keys(tokens));
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  bool ok = true;
  ASSERT_TRUE(run_checked_step(*rt, seq->id, tokens, 0, 32, &ok).ok());
  ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  auto pin = rt->pin_prefix(rt->block_keys(tokens), std::chrono::milliseconds::max());
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  EXPECT_EQ(rt->stats().pinned_prefix_blocks, 2u) << "the pin did not expire at once";
  EXPECT_FALSE(rt->pin_prefix(rt->block_keys(tokens), std::chrono::milliseconds(0)).ok());
  ASSERT_TRUE(rt->unpin_prefix(*pin).ok());
  const Status down = rt->shutdown();
  EXPECT_TRUE(down.ok()) << "shutdown waited for the (idle) transfers: " << down.to_string();
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// The runtime serves its counters on metrics.listen: a known number of hit tokens, scraped over
// HTTP while the runtime runs, shows up as exactly that number.
TEST(RuntimeMetrics, ServedOverHttpWhileRunning) {
  testing::ScratchDir dir("runtime-metrics");
  Config c = testing::small_config(dir.path());
  c.tiers.nvme.enabled = false;
  c.metrics.listen = "127.0.0.1:0";
  auto opened = Runtime::open(c);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto rt = std::move(opened).value();
  ASSERT_NE(rt->metrics_port(), 0) << "the exporter did not bind a loopback port";
  const auto tokens = testing::make_tokens(4 * 16, 3);
  std::vector<uint32_t> with_next = tokens;  // the prompt and one token decoded after it
  with_next.push_back(7);
  for (int round = 0; round < 2; ++round) {
    auto seq = rt->open_sequence(rt->block_keys(tokens));
    ASSERT_TRUE(seq.ok());
    bool ok = true;
    ASSERT_TRUE(
        testing::run_checked_step(*rt, seq->id, with_next, seq->reused_tokens,
                                  static_cast<uint32_t>(with_next.size() - seq->reused_tokens), &ok)
            .ok());
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  const testing::HttpResponse r = testing::http_get(rt->metrics_port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.error;
  // The second round found the 4-block prompt in HBM: 64 hit tokens there, 128 looked up in all.
  EXPECT_EQ(testing::sample_value(r.body, "kvtier_hit_tokens_total{tier=\"hbm\"}"), 64.0);
  EXPECT_EQ(testing::sample_value(r.body, "kvtier_lookup_tokens_total"), 128.0);
  EXPECT_EQ(rt->stats().hit_tokens[tier_index(Tier::kHbm)], 64u);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Shutdown while an engine thread waits on a layer: the waiter returns at once, and every later
// call — including hbm_view and stats, which hold no Status — is safe.
// An fp8 tier cannot hold a page with NaN or inf, and the bytes this test writes are random (as
// bf16, nearly every page holds some). Such blocks must not clog the tier above: the slower tier
// refuses them once, and they are dropped instead of sent down again once no step needs them, so
// every step still runs and every page read back is exactly what was written. With fp8 on the
// host tier the HBM->host copy refuses; with fp8 on NVMe only, the NVMe write does; under
// write_through the copies of pages still pinned by their step are refused as well.
class RefusedPages : public ::testing::TestWithParam<std::tuple<bool, WritePolicy>> {};

TEST_P(RefusedPages, AreDroppedNotStuck) {
  ScratchDir dir("runtime-fp8-nan");
  Config c = small_config(dir.path());
  const auto [host_fp8, write] = GetParam();
  if (host_fp8) c.tiers.host.kv_dtype = TierKvDtype::kFp8E4M3;
  c.tiers.nvme.kv_dtype = TierKvDtype::kFp8E4M3;
  c.policies.write = write;
  auto rt = open_or_skip(c);
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here (O_DIRECT or io_uring refused)";
  const Geometry& g = rt->geometry();
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 12; ++p) prompts.push_back(make_tokens(6 * g.page_tokens, p + 1));
  for (int round = 0; round < 2; ++round) {
    for (const auto& tokens : prompts) {
      auto seq = rt->open_sequence(rt->block_keys(tokens));
      ASSERT_TRUE(seq.ok()) << seq.status().to_string();
      bool bytes_ok = true;
      Status s =
          run_checked_step(*rt, seq->id, tokens, seq->reused_tokens,
                           static_cast<uint32_t>(tokens.size() - seq->reused_tokens), &bytes_ok);
      ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.to_string();
      EXPECT_TRUE(bytes_ok) << "a reused page differs from what was written";
      ASSERT_TRUE(rt->close_sequence(seq->id).ok());
    }
  }
  const RuntimeStats st = rt->stats();
  EXPECT_GT(st.evictions[tier_index(host_fp8 ? Tier::kHbm : Tier::kHost)], 0u);
  EXPECT_EQ(st.failed_loads, 0u);
  ASSERT_TRUE(rt->shutdown().ok());
}

INSTANTIATE_TEST_SUITE_P(
    Fp8Tiers, RefusedPages,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(WritePolicy::kWriteBack, WritePolicy::kWriteThrough)),
    [](const ::testing::TestParamInfo<std::tuple<bool, WritePolicy>>& info) {
      return std::string(std::get<0>(info.param) ? "HostAndNvme" : "NvmeOnly") +
             (std::get<1>(info.param) == WritePolicy::kWriteBack ? "_WriteBack" : "_WriteThrough");
    });

TEST(RuntimeShutdown, WakesWaitersAndLaterCallsAreSafe) {
  testing::ScratchDir dir("runtime-shutdown");
  Config c = testing::small_config(dir.path());
  c.tiers.nvme.enabled = false;
  auto opened = Runtime::open(c);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto rt = std::move(opened).value();
  // 40 blocks need 40 of the 64 HBM frames per layer: a window of one layer at a time, so the last
  // layer is not even planned until the engine ends the ones before it.
  const auto tokens = testing::make_tokens(40 * 16, 8);
  auto seq = rt->open_sequence(rt->block_keys(tokens));
  ASSERT_TRUE(seq.ok());
  const StepItem item{seq->id, static_cast<uint32_t>(tokens.size())};
  auto step = rt->begin_step(std::span(&item, 1));
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_TRUE(step->windowed);
  Status waited;
  std::thread waiter([&] { waited = rt->wait_layer(step->id, step->layers - 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(rt->shutdown().ok());
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(waited.ok());
  EXPECT_EQ(waited.code(), StatusCode::kCancelled) << waited.to_string();
  EXPECT_EQ(rt->hbm_view().base, nullptr);
  EXPECT_EQ(rt->stats().open_sequences, 1u) << "the final counters stay readable";
  EXPECT_EQ(rt->metrics_port(), 0);
  EXPECT_EQ(rt->wait_layer(step->id, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rt->layer_table(step->id, 0).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier

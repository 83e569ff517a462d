// The scheduler in virtual time with its eviction policies: a request hinted again is seen with
// its new keys and start; every policy keeps the blocks an open sequence reads in HBM; lookahead
// learns which prompts come back from how much their requests generated.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::SimSetup;
using testing::SimWorld;

// hint() replaces the waiting queue: a request hinted again with other keys or another expected
// start is seen with its new ones (the lookahead evictor keeps what the queue will read, and,
// among hinted blocks, lets go first those whose reader starts last).
// The lookahead policy over an HBM of 8 blocks (of 4 layers) and a roomy host tier, no NVMe.
SimSetup lookahead_over_a_small_hbm() {
  SimSetup setup;
  setup.hbm_frames = 32;
  setup.host_frames = 256;
  setup.nvme_extents = 0;
  setup.policies.eviction = EvictionPolicy::kLookahead;
  return setup;
}

TEST(SchedulerSim, AHintedRequestHintedAgainIsSeenWithItsNewKeysAndStart) {
  for (const bool change_keys : {true, false}) {
    SCOPED_TRACE(change_keys ? "new keys" : "new expected start");
    SimWorld w(lookahead_over_a_small_hbm());
    const std::vector<BlockKey> x = w.prompt(4, 1);  // the older prompt
    const std::vector<BlockKey> y = w.prompt(4, 2);
    ASSERT_TRUE(w.prefill_and_close(x, kNanosPerMicro).ok());
    ASSERT_TRUE(w.prefill_and_close(y, kNanosPerMicro).ok());
    w.settle();
    ASSERT_EQ(w.hbm().free_count(), 0u);
    if (change_keys) {
      // Request 1 will read y; then, hinted again, x instead (y is read by no one).
      const HintedRequest first{1, 100, y};
      ASSERT_TRUE(w.scheduler().hint(std::span(&first, 1)).ok());
      const HintedRequest again{1, 100, x};
      ASSERT_TRUE(w.scheduler().hint(std::span(&again, 1)).ok());
    } else {
      // Both are read; x's reader starts last, until y's is hinted again to start after it.
      const HintedRequest first[2] = {{1, 100, x}, {2, 50, y}};
      ASSERT_TRUE(w.scheduler().hint(first).ok());
      const HintedRequest again[2] = {{1, 100, x}, {2, 200, y}};
      ASSERT_TRUE(w.scheduler().hint(again).ok());
    }
    // A third prompt needs half of HBM: x is kept, y goes.
    ASSERT_TRUE(w.prefill_and_close(w.prompt(4, 3), kNanosPerMicro).ok());
    w.settle();
    EXPECT_EQ(w.scheduler().match(x).by_tier[tier_index(Tier::kHbm)], 4u);
    EXPECT_EQ(w.scheduler().match(y).by_tier[tier_index(Tier::kHbm)], 0u);
    expect_consistent(w);
  }
}

// With HBM full of an open sequence's prompt (`decoding`, 4 blocks) and a closed one (`closed`), a
// third prompt needs half of HBM: the closed prompt goes down to host memory, the open sequence's
// stays, and its next step finds its pages in HBM (nothing is promoted for it). Closes it.
void expect_the_open_sequence_stays_in_hbm(SimWorld& w, SequenceId open,
                                           const std::vector<BlockKey>& decoding,
                                           const std::vector<BlockKey>& closed) {
  ASSERT_EQ(w.hbm().free_count(), 0u);
  ASSERT_TRUE(w.prefill_and_close(w.prompt(4, 3), kNanosPerMicro).ok());
  w.settle();
  EXPECT_EQ(w.scheduler().match(decoding).by_tier[tier_index(Tier::kHbm)], 4u);
  EXPECT_EQ(w.scheduler().match(closed).by_tier[tier_index(Tier::kHbm)], 0u);
  EXPECT_EQ(w.scheduler().match(closed).blocks, 4u);  // in host memory
  const uint64_t promoted = w.scheduler().stats().promotions[tier_index(Tier::kHbm)].load();
  const StepItem decode{open, 1};
  const auto step = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  ASSERT_TRUE(step.status.ok()) << step.status.to_string();
  EXPECT_EQ(w.scheduler().stats().promotions[tier_index(Tier::kHbm)].load(), promoted);
  ASSERT_TRUE(w.scheduler().close_sequence(open).ok());
  expect_consistent(w);
}

// The blocks an open sequence holds are read by its next step (every step reads all of its KV):
// the lookahead policy keeps them in HBM over a closed prompt's, whatever their classes say (a
// prompt reused many times ranks above one computed once). Without it, on the Mooncake trace at
// its recorded rate, decoding sequences lost their KV to HBM between steps and loaded it back:
// 0.84 requests/s, against 2.38 with it (kvtier-bench run, virtual clock).
TEST(SchedulerSim, LookaheadKeepsTheBlocksOfAnOpenSequenceInHbm) {
  SimWorld w(lookahead_over_a_small_hbm());
  const std::vector<BlockKey> reused = w.prompt(4, 1);
  ASSERT_TRUE(w.prefill_and_close(reused, kNanosPerMicro).ok());
  for (int i = 0; i < 6; ++i) {  // matched again and again: a prefix that comes back
    auto s = w.scheduler().open_sequence(reused);
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->reused_blocks, 4u);
    ASSERT_TRUE(w.scheduler().close_sequence(s->id).ok());
  }
  const std::vector<BlockKey> decoding = w.prompt(4, 2);
  auto open = w.scheduler().open_sequence(decoding);
  ASSERT_TRUE(open.ok());
  const StepItem prefill{open->id, 4 * 16};
  ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
  w.settle();
  expect_the_open_sequence_stays_in_hbm(w, open->id, decoding, reused);
}

// Whatever the policy, a block an open sequence holds leaves HBM only once nothing else can
// (Placement): here a closed prompt used after the open sequence's goes down instead, though LRU,
// LFU (a tie, the older first), S3-FIFO (first in, first out) and prefix_aware rank the open
// sequence's blocks first. Without the rule, LRU on the Mooncake trace at its recorded rate loaded
// such blocks back for their sequence's next step (28.3 TB host->HBM, 13.7 TB with it: 1.78 ->
// 2.26 requests/s in kvtier-bench run, virtual clock).
TEST(SchedulerSim, EveryPolicyKeepsTheBlocksAnOpenSequenceReadsInHbm) {
  for (const EvictionPolicy policy :
       {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
        EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    SimSetup setup = lookahead_over_a_small_hbm();  // HBM: two prompts of 4 blocks x 4 layers
    setup.policies.eviction = policy;
    SimWorld w(setup);
    SCOPED_TRACE(std::string(eviction_policy_name(policy)));
    const std::vector<BlockKey> decoding = w.prompt(4, 1);
    auto open = w.scheduler().open_sequence(decoding);
    ASSERT_TRUE(open.ok());
    const StepItem prefill{open->id, 4 * 16};
    ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
    const std::vector<BlockKey> closed = w.prompt(4, 2);  // computed after, and closed
    ASSERT_TRUE(w.prefill_and_close(closed, kNanosPerMicro).ok());
    w.settle();
    expect_the_open_sequence_stays_in_hbm(w, open->id, decoding, closed);
  }
}

// Prefills `keys`, decodes `answer` tokens one step each, and closes the sequence, telling the
// scheduler the request generated `answer` tokens when `tell` says so.
void answer_and_close(SimWorld& w, const std::vector<BlockKey>& keys, uint32_t answer,
                      bool tell = true) {
  auto s = w.scheduler().open_sequence(keys);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const uint32_t prompt_tokens =
      static_cast<uint32_t>(keys.size()) * w.setup().geometry.page_tokens;
  const StepItem prefill{s->id, prompt_tokens - static_cast<uint32_t>(s->reused_tokens)};
  ASSERT_TRUE(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status.ok());
  for (uint32_t t = 0; t < answer; ++t) {
    const StepItem decode{s->id, 1};
    ASSERT_TRUE(w.run_step(std::span(&decode, 1), kNanosPerMicro).status.ok());
  }
  ASSERT_TRUE(w.scheduler()
                  .close_sequence(s->id, tell ? std::optional<uint64_t>(answer) : std::nullopt)
                  .ok());
  w.settle();
}

// The engine tells close_sequence how much the request generated: lookahead learns that here the
// prompts answered in a few tokens come back (asked again at once) and those answered at length do
// not, and then keeps a prompt answered shortly over a newer one answered at length. Untold, or
// when both answers are short, both rank as first uses, and the older goes first.
TEST(SchedulerSim, LookaheadLearnsWhichPromptsComeBackFromHowMuchTheirRequestsGenerated) {
  for (const auto& [newer_answer, tell] : {std::pair{64u, true}, {2u, true}, {64u, false}}) {
    SCOPED_TRACE("newer prompt answered in " + std::to_string(newer_answer) + " tokens, " +
                 (tell ? "told" : "untold"));
    SimWorld w(lookahead_over_a_small_hbm());  // HBM: 8 blocks
    uint32_t salt = 1;
    for (int round = 0; round < 12; ++round) {
      const std::vector<BlockKey> asked_again = w.prompt(2, salt++);
      answer_and_close(w, asked_again, 2, tell);
      auto again = w.scheduler().open_sequence(asked_again);
      ASSERT_TRUE(again.ok());
      ASSERT_EQ(again->matched_blocks, 2u);
      ASSERT_TRUE(w.scheduler().close_sequence(again->id).ok());
      answer_and_close(w, w.prompt(2, salt++), 64, tell);  // never asked again
    }
    const std::vector<BlockKey> older = w.prompt(2, salt++);
    answer_and_close(w, older, 2, tell);
    const std::vector<BlockKey> newer = w.prompt(2, salt++);
    answer_and_close(w, newer, newer_answer, tell);
    // A prompt of 6 blocks leaves HBM room for one of the two.
    answer_and_close(w, w.prompt(6, salt++), 0, tell);
    const bool keeps_older = tell && newer_answer >= 64;
    EXPECT_EQ(w.scheduler().match(older).by_tier[tier_index(Tier::kHbm)], keeps_older ? 2u : 0u);
    EXPECT_EQ(w.scheduler().match(newer).by_tier[tier_index(Tier::kHbm)], keeps_older ? 0u : 2u);
    EXPECT_EQ(w.scheduler().match(older).blocks, 2u);  // the other one is in host memory
    EXPECT_EQ(w.scheduler().match(newer).blocks, 2u);
    expect_consistent(w);
  }
}

}  // namespace
}  // namespace kvtier

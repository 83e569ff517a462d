// The scheduler in virtual time under random serving workloads, the way an engine drives it:
// batches of up to three sequences, full blocks published under their content keys as steps fill
// them (the generated ones too, so a later turn's prompt reuses them), prefixes pinned and
// unpinned, and the waiting queue hinted. Each "conversation" is a token stream; a sequence opens
// over some whole blocks of one, so prompts share prefixes, extend earlier turns and meet blocks
// other sequences published meanwhile (deduplicated, refilled). With every other seed, a prefix
// still loading from a slow NVMe link when its first step begins is recomputed; with every third,
// transfers on any link fail now and then, NVMe reads and writes hit bad sectors (their extents
// retired), a drive dies now and then with a quarter of the blocks on NVMe (forgotten), and reads
// and writes pause as they fail, and reads hang now and then (their frames held until answered):
// a step whose load failed fails (kIoError, kDeadlineExceeded when hung), and so does one that a
// failed NVMe write or read left without room (kUnavailable: a block it was admitted beside as
// bound for NVMe must stay in memory), and a block in use that lost a page to a failed read is
// recomputed. The tiers are small and the policies vary by seed, as in
// scheduler_sim_random_test.cpp, whose invariants this checks after every operation once its
// transfers are done: the page table's audit and each tier's policy membership hold, no block a
// sequence references has lost a page (but to a failed read), a step is refused at once or
// completes (or fails as above), and at the end every frame is accounted for and the scheduler is
// idle. 120 seeds here; the slow-labelled scheduler_sim_random_wide_test builds this file again for
// 3,000 more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

// The seeds this binary runs: [KVTIER_SERVING_SEED_FIRST, KVTIER_SERVING_SEED_END).
#ifndef KVTIER_SERVING_SEED_FIRST
#define KVTIER_SERVING_SEED_FIRST 0
#define KVTIER_SERVING_SEED_END 120
#endif

namespace kvtier {
namespace {

using testing::expect_consistent;
using testing::lost_page;
using testing::maybe_hit_a_failing_disk;
using testing::pause_nvme_at_every_failure;
using testing::random_workload_setup;
using testing::SimSetup;
using testing::SimWorld;

constexpr uint32_t kConversations = 8;
constexpr uint32_t kMaxBlocks = 12;  // a conversation's stream, in blocks

// Token i of conversation c: the first (c % 3) blocks are common to every conversation (a shared
// system prompt of 0 to 2 blocks), the rest its own.
uint32_t token(uint32_t c, uint64_t i, uint32_t page_tokens) {
  const bool shared = i < static_cast<uint64_t>(c % 3) * page_tokens;
  return static_cast<uint32_t>(i) * 7 + (shared ? 0 : (c + 1) * 100003u);
}

class SchedulerServingWorkload : public ::testing::TestWithParam<int> {};

TEST_P(SchedulerServingWorkload, NeverBreaksAnInvariant) {
  std::mt19937 rng(static_cast<uint32_t>(GetParam()));
  SimSetup setup = random_workload_setup(GetParam());
  setup.policies.pin_quota = 0.5;
  if (GetParam() % 2 == 1) {
    // A slow NVMe link and a 1 ms deadline: a reused prefix still loading when its first step
    // begins is given up and recomputed (refilled where its entries are unreferenced).
    setup.nvme_read_gbps = 0.05;
    setup.policies.prefetch.on_late = LatePolicy::kRecompute;
    setup.policies.prefetch.deadline_ms = 1;
  }
  // Every third seed: transfers on a random link fail now and then (kIoError).
  const bool inject_failures = GetParam() % 3 == 2;
  if (inject_failures) pause_nvme_at_every_failure(setup);
  SimWorld w(setup);
  const uint32_t pt = setup.geometry.page_tokens;

  struct Open {
    SequenceId id = 0;
    uint32_t conversation = 0;
    uint64_t tokens = 0;  // with K/V, as the scheduler counts them
  };
  std::vector<Open> open;
  std::vector<uint64_t> pins;
  // The keys of conversation c's first `tokens` tokens' full blocks.
  const auto keys_of = [&](uint32_t c, uint64_t tokens) {
    std::vector<uint32_t> stream(tokens);
    for (uint64_t i = 0; i < tokens; ++i) stream[i] = token(c, i, pt);
    return chain_block_keys("sim", stream, pt);
  };
  const auto random_prompt = [&](uint32_t& c) {
    c = static_cast<uint32_t>(rng() % kConversations);
    return keys_of(c, static_cast<uint64_t>(1 + rng() % (kMaxBlocks / 2)) * pt);
  };

  std::mt19937 disk(static_cast<uint32_t>(GetParam()) * 104729u + 7);
  for (int op = 0; op < 300; ++op) {
    if (inject_failures && rng() % 16 == 0) {
      // The next transfer on one link fails: a copy between HBM and host memory, or an NVMe
      // read or write.
      w.port().fail_next(kAllLinks[rng() % kAllLinks.size()], 1);
    }
    if (inject_failures) maybe_hit_a_failing_disk(w, disk);
    const int choice = static_cast<int>(rng() % 20);
    std::string what;
    if (choice < 5 || open.empty()) {
      uint32_t c = 0;
      const std::vector<BlockKey> prompt = random_prompt(c);
      auto s = w.scheduler().open_sequence(prompt);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      open.push_back(Open{s->id, c, static_cast<uint64_t>(s->reused_blocks) * pt});
      what = "open";
    } else if (choice < 14) {
      // A batch of up to three distinct open sequences short of their stream's end; each
      // completes the blocks it fills.
      const uint64_t stream_end = static_cast<uint64_t>(kMaxBlocks) * pt;
      std::vector<std::size_t> members;
      const std::size_t want = 1 + rng() % 3;
      for (std::size_t tries = 0; tries < 6 && members.size() < want; ++tries) {
        const std::size_t i = rng() % open.size();
        if (open[i].tokens < stream_end &&
            std::find(members.begin(), members.end(), i) == members.end()) {
          members.push_back(i);
        }
      }
      std::vector<StepItem> batch;
      for (std::size_t i : members) {
        const uint64_t room = stream_end - open[i].tokens;
        const auto n = static_cast<uint32_t>(1 + rng() % std::min<uint64_t>(room, 40));
        batch.push_back(StepItem{open[i].id, n});
      }
      // The blocks each item fills, from the one its context ends in (a first step that
      // recomputes a late prefix starts earlier than the sequence's count).
      const auto completions_of = [&](const StepInfo& info) {
        std::vector<StepCompletion> out;
        for (std::size_t j = 0; j < members.size(); ++j) {
          const StepItemInfo& item = info.items[j];
          const uint64_t end = item.context_tokens + item.recomputed_tokens + item.new_tokens;
          const std::vector<BlockKey> full = keys_of(open[members[j]].conversation, end);
          const auto first = full.begin() + static_cast<long>(item.context_tokens / pt);
          out.push_back(StepCompletion{item.sequence, std::vector<BlockKey>(first, full.end())});
        }
        return out;
      };
      auto r = batch.empty() ? SimWorld::StepResult{}
                             : w.run_step(batch, kNanosPerMicro, completions_of);
      if (r.status.ok()) {
        for (std::size_t j = 0; j < members.size(); ++j) {
          const StepItemInfo& item = r.info.items[j];
          Open& o = open[members[j]];
          EXPECT_LE(item.context_tokens, o.tokens) << "op " << op;
          o.tokens = item.context_tokens + item.recomputed_tokens + item.new_tokens;
        }
      } else {
        // Refused at once; or, with failures injected, a layer whose load failed or whose step
        // a failed transfer left without room (the step is aborted, as an engine would).
        const StatusCode code = r.status.code();
        const bool begun = r.info.id != 0;
        EXPECT_TRUE((!begun && code == StatusCode::kResourceExhausted) ||
                    (begun && inject_failures &&
                     (code == StatusCode::kIoError || code == StatusCode::kUnavailable ||
                      code == StatusCode::kDeadlineExceeded)))
            << "op " << op << ": " << r.status.to_string();
      }
      what = "step";
    } else if (choice < 17) {
      // A sequence closes; one that reached its stream's end always does.
      std::size_t i = rng() % open.size();
      for (std::size_t j = 0; j < open.size(); ++j) {
        if (open[j].tokens >= static_cast<uint64_t>(kMaxBlocks) * pt) i = j;
      }
      ASSERT_TRUE(w.scheduler().close_sequence(open[i].id).ok());
      open.erase(open.begin() + static_cast<long>(i));
      what = "close";
    } else if (choice < 19) {
      if (!pins.empty() && rng() % 2 == 0) {
        const std::size_t i = rng() % pins.size();
        // Or it expired: while a request waits for frames no transfer frees (a prefetch of a
        // hinted prefix, say), the scheduler is never idle and the loop runs past the pin's TTL.
        Status unpinned = w.scheduler().unpin_prefix(pins[i]);
        ASSERT_TRUE(unpinned.ok() || unpinned.code() == StatusCode::kNotFound)
            << "op " << op << ": " << unpinned.to_string();
        pins.erase(pins.begin() + static_cast<long>(i));
        what = "unpin";
      } else {
        uint32_t c = 0;
        auto pinned = w.scheduler().pin_prefix(random_prompt(c), 3600 * kNanosPerSecond);
        if (pinned.ok()) {
          pins.push_back(*pinned);
        } else {
          // Not cached whole, or beyond the quota or the frames open steps leave.
          EXPECT_TRUE(pinned.status().code() == StatusCode::kNotFound ||
                      pinned.status().code() == StatusCode::kResourceExhausted)
              << "op " << op << ": " << pinned.status().to_string();
        }
        what = "pin";
      }
    } else {
      std::vector<HintedRequest> waiting(1 + rng() % 3);
      for (std::size_t j = 0; j < waiting.size(); ++j) {
        uint32_t c = 0;
        waiting[j].request_id = static_cast<uint64_t>(op) * 4 + j;
        waiting[j].expected_start_ns = w.loop().now() + static_cast<Nanos>(rng() % 5000) * 1000;
        waiting[j].keys = random_prompt(c);
      }
      ASSERT_TRUE(w.scheduler().hint(waiting).ok());
      what = "hint";
    }
    // Until the transfers are done, not through the pins' timers (settle would expire them all).
    const bool quiet =
        w.loop().run_while_not([&] { return w.scheduler().idle(); }, SimWorld::kMaxSettleEvents);
    ASSERT_TRUE(quiet || w.loop().pending() == 0)
        << "op " << op << " (" << what << "): a livelock; " << w.scheduler().pending_summary();
    ASSERT_EQ(w.broken(), "") << "op " << op << " (" << what << ")";
    Status audit = w.table().audit();
    ASSERT_TRUE(audit.ok()) << "op " << op << " (" << what << "): " << audit.to_string();
    Status members = w.scheduler().audit_membership();
    ASSERT_TRUE(members.ok()) << "op " << op << " (" << what << "): " << members.to_string();
    const std::string lost = lost_page(w);
    ASSERT_EQ(lost, "") << "op " << op << " (" << what << "): a referenced block lost a page";
  }
  for (uint64_t pin : pins) {
    Status unpinned = w.scheduler().unpin_prefix(pin);
    ASSERT_TRUE(unpinned.ok() || unpinned.code() == StatusCode::kNotFound) << unpinned.to_string();
  }
  for (const Open& o : open) ASSERT_TRUE(w.scheduler().close_sequence(o.id).ok());
  ASSERT_TRUE(w.scheduler().hint({}).ok());
  w.port().answer_hung_reads();
  w.settle();
  expect_consistent(w);
  EXPECT_TRUE(w.scheduler().idle()) << w.scheduler().pending_summary();
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerServingWorkload,
                         ::testing::Range(KVTIER_SERVING_SEED_FIRST, KVTIER_SERVING_SEED_END));

}  // namespace
}  // namespace kvtier

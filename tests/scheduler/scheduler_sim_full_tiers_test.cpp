// HBM and host memory both full of pages that must stay in them: private blocks (never published,
// so they cannot go to NVMe, which is addressed by content key), with or without an NVMe tier. Two
// sequences larger than HBM take turns: each step brings one sequence's pages up and sends the
// other's down, which works only if the two tiers trade pages — a page brought up frees its host
// frame for one going down. Past what the tiers hold, begin_step refuses a step, and once the
// engine closes a sequence the others step again and the scheduler is idle. A step that fits only
// layer by layer beside private pages that fill HBM is windowed. With host memory full of private
// pages, a prefix on NVMe only still comes up through the frames kept for staging. With NVMe
// smaller than the blocks in use, those it has no room for stay in memory too, and begin_step
// counts them.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tests/scheduler/scheduler_sim_harness.hpp"

namespace kvtier {
namespace {

using testing::close_and_expect_idle;
using testing::expect_tables_valid;
using testing::SimSetup;
using testing::SimWorld;

constexpr uint32_t kFrames = 64;  // HBM and host memory alike

SimSetup full_tiers_setup(bool with_nvme) {
  SimSetup setup;
  setup.hbm_frames = kFrames;
  setup.host_frames = kFrames;
  setup.nvme_extents = with_nvme ? 256 : 0;
  return setup;
}

// Frames private pages may take: with NVMe, host memory keeps two blocks' worth for staging.
uint32_t usable_frames(const SimSetup& s) {
  const uint32_t reserve = s.nvme_extents > 0 ? 2 * s.geometry.layers : 0;
  return s.hbm_frames + s.host_frames - reserve;
}

// Fills host memory with private pages but for the frames it keeps for NVMe staging: sequence A
// (left open) computes them, and a second sequence that takes all of HBM pushes them there, and
// closes.
Status fill_host_with_private_pages(SimWorld& w) {
  const uint32_t layers = w.setup().geometry.layers;
  const uint32_t page_tokens = w.setup().geometry.page_tokens;
  const uint32_t reserve = 2 * layers;
  for (const uint32_t blocks : {(kFrames - reserve) / layers, kFrames / layers}) {
    auto s = w.scheduler().open_sequence({});
    if (!s.ok()) return s.status();
    const StepItem prefill{s->id, blocks * page_tokens};
    KVTIER_RETURN_IF_ERROR(w.run_step(std::span(&prefill, 1), kNanosPerMicro).status);
    if (blocks == kFrames / layers) KVTIER_RETURN_IF_ERROR(w.scheduler().close_sequence(s->id));
    w.settle();
  }
  return ok_status();
}

class FullTiers : public ::testing::TestWithParam<bool> {};

TEST_P(FullTiers, TwoSequencesLargerThanHbmTakeTurns) {
  const SimSetup setup = full_tiers_setup(GetParam());
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  // Sequences of B and B + 1 blocks, plus the block each one's first decoded token opens, fill
  // every usable frame but one block's: 2B + 4 = usable / layers - 1 (both are even).
  const uint32_t blocks = (usable_frames(setup) / layers - 4) / 2;
  ASSERT_GT(blocks * layers, kFrames / 2) << "each sequence must hold more than half of HBM";
  SequenceId seqs[2];
  for (uint32_t i = 0; i < 2; ++i) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    seqs[i] = s->id;
    const StepItem prefill{s->id, (blocks + i) * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  }
  // Decode turn by turn: 12 tokens each, all within the block the first one opened.
  for (int turn = 0; turn < 24; ++turn) {
    const StepItem item{seqs[turn % 2], 1};
    auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "turn " << turn << ": " << r.status.to_string() << "; "
                               << w.scheduler().pending_summary();
    expect_tables_valid(w, r);
    w.settle();
  }
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
  close_and_expect_idle(w, seqs);
}

TEST_P(FullTiers, AStepPastWhatTheTiersHoldFailsAndTheRestMovesOnOnceASequenceCloses) {
  const SimSetup setup = full_tiers_setup(GetParam());
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  // Three sequences of B blocks fill the usable frames but for a few blocks; a fourth sequence
  // appends one block more than that.
  const uint32_t blocks = usable_frames(setup) / layers / 3;
  const uint32_t left = usable_frames(setup) / layers - 3 * blocks;
  std::vector<SequenceId> seqs;
  for (int i = 0; i < 4; ++i) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    seqs.push_back(s->id);
  }
  for (int i = 0; i < 3; ++i) {
    const StepItem prefill{seqs[i], blocks * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "sequence " << i << ": " << r.status.to_string();
  }
  // Not one layer of it fits beside the private pages host memory cannot take: begin_step says so
  // (naming what keeps them in memory) and opens nothing.
  const StepItem too_much{seqs[3], (left + 1) * page_tokens};
  auto failed = w.run_step(std::span(&too_much, 1), kNanosPerMicro);
  EXPECT_EQ(failed.status.code(), StatusCode::kResourceExhausted) << failed.status.to_string();
  const char* why = GetParam() ? "cannot go to NVMe" : "cannot leave memory without an NVMe tier";
  EXPECT_NE(failed.status.message().find(why), std::string::npos) << failed.status.to_string();
  EXPECT_EQ(w.table().private_blocks(), 3 * blocks) << "the refused step opened a block";
  // The engine closes a sequence: what waited for frames goes on, and the fourth sequence's step
  // (and one more step of each other sequence) runs.
  ASSERT_TRUE(w.scheduler().close_sequence(seqs[0]).ok());
  w.settle();
  for (int i = 1; i < 4; ++i) {
    const StepItem item{seqs[i], 1};
    auto r = w.run_step(std::span(&item, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "sequence " << i << ": " << r.status.to_string() << "; "
                               << w.scheduler().pending_summary();
    expect_tables_valid(w, r);
  }
  close_and_expect_idle(w, std::span(seqs).subspan(1));
  EXPECT_EQ(w.hbm().free_count(), setup.hbm_frames);
  EXPECT_EQ(w.host().free_count(), setup.host_frames);
}

// Host memory full of private pages (but for the frames kept for NVMe staging), HBM with room: a
// prefix cached on NVMe only still comes up. Its read takes host frames from the reserve, and
// gives them back once the pages are in HBM (they keep their NVMe copy), so the next block's read
// finds them.
TEST(FullHost, APrefixOnNvmeOnlyComesUpThroughTheReserve) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t reserve = 2 * layers;
  // The prefix: published and written through to NVMe, then closed.
  constexpr uint32_t kPrefixBlocks = 3;
  const std::vector<BlockKey> prefix = w.prompt(kPrefixBlocks, /*salt=*/1);
  ASSERT_TRUE(w.prefill_and_close(prefix, kNanosPerMicro).ok());
  w.settle();
  // Sequence A's private pages fill host memory but for the reserve.
  const Status filled = fill_host_with_private_pages(w);
  ASSERT_TRUE(filled.ok()) << filled.to_string();
  ASSERT_EQ(w.host().free_count(), reserve) << w.scheduler().pending_summary();
  for (const BlockKey& key : prefix) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    ASSERT_EQ(info->nvme, CopyState::kReady);
    for (const PageInfo& p : info->pages) ASSERT_EQ(p.host, CopyState::kAbsent);
  }
  // The prefix again, one token more: every block comes up from NVMe.
  auto q = w.scheduler().open_sequence(prefix);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  ASSERT_EQ(q->reused_blocks, kPrefixBlocks);
  const StepItem decode{q->id, 1};
  auto r = w.run_step(std::span(&decode, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string() << "; " << w.scheduler().pending_summary();
  expect_tables_valid(w, r);
  close_and_expect_idle(w, {q->id});
}

// Host memory full of private pages but for its reserve; HBM full of the pages of two open
// sequences: one reused from NVMe (so its blocks may leave HBM at once, being safe below) and one
// private (its pages can go nowhere: host memory has no frame it may take). A third sequence over
// a prefix on NVMe needs HBM frames: room is made by dropping the reused blocks, which come back
// from NVMe for their own next step, not by demoting private pages into frames that never come.
TEST(FullHost, HbmRoomComesFromBlocksSafeOnNvmeNotFromPagesHostCannotTake) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const uint32_t reserve = 2 * layers;
  // Two prompts computed once and written through to NVMe.
  const std::vector<BlockKey> reused = w.prompt(8, /*salt=*/1);
  const std::vector<BlockKey> prefix = w.prompt(3, /*salt=*/2);
  for (const auto* keys : {&reused, &prefix}) {
    ASSERT_TRUE(w.prefill_and_close(*keys, kNanosPerMicro).ok());
    w.settle();
  }
  // Sequence A's private pages fill host memory but for the reserve.
  const Status filled = fill_host_with_private_pages(w);
  ASSERT_TRUE(filled.ok()) << filled.to_string();
  // B's private pages take all of HBM but what K needs: K reuses its prompt from NVMe and
  // decodes a token (one private block). Both stay open; B's pages are the older.
  auto b = w.scheduler().open_sequence({});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const uint32_t b_blocks = kFrames / layers - static_cast<uint32_t>(reused.size()) - 1;
  const StepItem b_prefill{b->id, b_blocks * page_tokens};
  auto rb = w.run_step(std::span(&b_prefill, 1), kNanosPerMicro);
  ASSERT_TRUE(rb.status.ok()) << rb.status.to_string() << "; " << w.scheduler().pending_summary();
  w.settle();
  auto k = w.scheduler().open_sequence(reused);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_EQ(k->reused_blocks, reused.size());
  const StepItem k_decode{k->id, 1};
  auto rk = w.run_step(std::span(&k_decode, 1), kNanosPerMicro);
  ASSERT_TRUE(rk.status.ok()) << rk.status.to_string() << "; " << w.scheduler().pending_summary();
  w.settle();
  ASSERT_EQ(w.hbm().free_count(), 0u) << w.scheduler().pending_summary();
  ASSERT_LE(w.host().free_count(), reserve) << w.scheduler().pending_summary();
  // The third sequence: its prefix comes up from NVMe into room K's blocks leave.
  auto q = w.scheduler().open_sequence(prefix);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  ASSERT_EQ(q->reused_blocks, prefix.size());
  const StepItem q_decode{q->id, 1};
  auto rq = w.run_step(std::span(&q_decode, 1), kNanosPerMicro);
  ASSERT_TRUE(rq.status.ok()) << rq.status.to_string();
  expect_tables_valid(w, rq);
  ASSERT_TRUE(w.scheduler().close_sequence(q->id).ok());
  w.settle();
  // K's next step reads its prompt back from NVMe; nothing of B's was lost.
  auto rk2 = w.run_step(std::span(&k_decode, 1), kNanosPerMicro);
  ASSERT_TRUE(rk2.status.ok()) << rk2.status.to_string();
  expect_tables_valid(w, rk2);
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
  close_and_expect_idle(w, {k->id, b->id});
}

// A step that reads a page whose demotion still waits for its host frame keeps the page where it
// is: the demotion is withdrawn, and the layer is ready at once, with no copy down and back up.
// Here the host frames are on their way — cached blocks being written to a slow NVMe — when the
// step comes.
TEST(FullHost, AStepKeepsAPageWhoseDemotionStillWaitsForItsHostFrame) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.policies.write = WritePolicy::kWriteBack;
  setup.nvme_write_gbps = 0.001;  // 16 us per page: the writes are still going when B steps
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const uint32_t reserve = 2 * layers;
  // Cached one-block prompts that only host memory holds (write-back: not on NVMe) fill it but
  // for its reserve, once two open private sequences, B then D, take all of HBM.
  std::vector<std::vector<BlockKey>> prompts;
  ASSERT_TRUE(w.compute_prompts((kFrames - reserve) / layers, 1, kNanosPerMicro, prompts).ok());
  const uint32_t half = kFrames / layers / 2;
  SequenceId b = 0;
  for (SequenceId* id : {&b, static_cast<SequenceId*>(nullptr)}) {
    auto s = w.scheduler().open_sequence({});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    if (id != nullptr) *id = s->id;
    // B's last block is partial: its next token needs no new frame.
    const StepItem prefill{s->id, half * page_tokens - (id != nullptr ? 4 : 0)};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    w.settle();
  }
  ASSERT_EQ(w.hbm().free_count(), 0u) << w.scheduler().pending_summary();
  ASSERT_EQ(w.host().free_count(), reserve) << w.scheduler().pending_summary();
  // C needs HBM frames: B's pages, the older, start down to host memory, whose frames come as
  // the cached blocks are written to NVMe. Nothing has moved yet when B steps.
  auto c = w.scheduler().open_sequence({});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const StepItem c_prefill{c->id, 2 * page_tokens};
  auto c_step = w.scheduler().begin_step(std::span(&c_prefill, 1));
  ASSERT_TRUE(c_step.ok()) << c_step.status().to_string();
  const uint64_t demotions_before = w.scheduler().stats().demotions[tier_index(Tier::kHost)];
  uint32_t b_draining = 0;
  for (const auto& [key, info] : w.table().snapshot()) {
    for (const PageInfo& p : info.pages) b_draining += p.hbm == CopyState::kDraining;
  }
  ASSERT_GT(b_draining, 0u) << "C's room must come from B's pages: "
                            << w.scheduler().pending_summary();
  const StepItem b_decode{b, 1};
  auto b_step = w.scheduler().begin_step(std::span(&b_decode, 1));
  ASSERT_TRUE(b_step.ok()) << b_step.status().to_string();
  for (uint32_t l = 0; l < layers; ++l) {
    auto ready = w.scheduler().layer_readiness(b_step->id, l);
    ASSERT_TRUE(ready.ok()) << ready.status().to_string();
    EXPECT_TRUE((*ready)->finished())
        << "layer " << l << " waits: " << w.scheduler().pending_summary();
  }
  EXPECT_EQ(w.scheduler().stats().demotions[tier_index(Tier::kHost)], demotions_before);
  // Both steps end; everything is still where a sequence finds it.
  ASSERT_TRUE(w.scheduler().abort_step(b_step->id).ok());
  w.settle();
  ASSERT_TRUE(w.scheduler().abort_step(c_step->id).ok());
  w.settle();
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
}

// Host memory full of private pages but for its reserve and the frames of the parameter (fewer
// than a block has pages), HBM full of the pages of open sequences, none of them on NVMe
// (write-back): a fourth sequence's step still gets HBM frames. A block in use that has a content
// key leaves HBM by way of NVMe, staged through the reserve, and comes back from there when its
// sequence steps again.
class FullHostFreeFrames : public ::testing::TestWithParam<uint32_t> {};

TEST_P(FullHostFreeFrames, ABlockInUseLeavesHbmByWayOfNvmeWhenHostHasNoRoomForIt) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.host_frames += GetParam();
  ASSERT_LT(GetParam(), setup.geometry.layers);
  setup.policies.write = WritePolicy::kWriteBack;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const uint32_t reserve = 2 * layers;
  // Sequence A's private pages fill host memory but for the reserve.
  const Status filled = fill_host_with_private_pages(w);
  ASSERT_TRUE(filled.ok()) << filled.to_string();
  // B (private) and K (a prompt: blocks with content keys, on no other tier) fill HBM.
  auto b = w.scheduler().open_sequence({});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const StepItem b_prefill{b->id, 4 * page_tokens};
  ASSERT_TRUE(w.run_step(std::span(&b_prefill, 1), kNanosPerMicro).status.ok());
  const std::vector<BlockKey> prompt = w.prompt(kFrames / layers - 4, /*salt=*/3);
  auto k = w.scheduler().open_sequence(prompt);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  const StepItem k_prefill{k->id, static_cast<uint32_t>(prompt.size()) * page_tokens};
  ASSERT_TRUE(w.run_step(std::span(&k_prefill, 1), kNanosPerMicro).status.ok());
  w.settle();
  ASSERT_EQ(w.hbm().free_count(), 0u) << w.scheduler().pending_summary();
  ASSERT_EQ(w.host().free_count(), reserve + GetParam()) << w.scheduler().pending_summary();
  // Q's first token needs a block's worth of HBM frames. A block staged for them gives its HBM
  // frames up as its NVMe copy lands (pages a step pins aside), in that same event: left for a
  // later plan, another staging could take the NVMe extent first and leave them last copies.
  std::vector<bool> was_on_nvme(prompt.size(), false);
  uint32_t kept_after_staging = 0;
  w.loop().after_each_event([&] {
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      auto info = w.table().lookup(prompt[i]);
      if (!info.ok()) continue;
      const bool on_nvme = info->nvme == CopyState::kReady;
      if (on_nvme && !was_on_nvme[i]) {
        for (const PageInfo& p : info->pages) {
          kept_after_staging += p.hbm == CopyState::kReady && p.pins == 0 ? 1 : 0;
        }
      }
      was_on_nvme[i] = on_nvme;
    }
  });
  auto q = w.scheduler().open_sequence({});
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const StepItem q_token{q->id, 1};
  auto rq = w.run_step(std::span(&q_token, 1), kNanosPerMicro);
  w.loop().after_each_event({});
  ASSERT_TRUE(rq.status.ok()) << rq.status.to_string();
  EXPECT_EQ(kept_after_staging, 0u) << "a staged block kept HBM pages once written to NVMe";
  expect_tables_valid(w, rq);
  uint32_t on_nvme = 0;
  for (const BlockKey& key : prompt) {
    auto info = w.table().lookup(key);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    on_nvme += info->nvme == CopyState::kReady;
  }
  EXPECT_GT(on_nvme, 0u) << "K's room was to be made through NVMe";
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
  // Q and B close; K steps again, reading its whole prompt, from wherever it is.
  for (SequenceId id : {q->id, b->id}) ASSERT_TRUE(w.scheduler().close_sequence(id).ok());
  w.settle();
  const StepItem k_decode{k->id, 1};
  auto rk = w.run_step(std::span(&k_decode, 1), kNanosPerMicro);
  ASSERT_TRUE(rk.status.ok()) << rk.status.to_string() << "; " << w.scheduler().pending_summary();
  expect_tables_valid(w, rk);
  close_and_expect_idle(w, {k->id});
}

// Host memory full of private pages but for its reserve, and B's private pages in half of HBM:
// they can go nowhere. K reuses a prompt from NVMe that needs more than the other half of HBM for
// all its layers at once, though not for a few: begin_step counts B's pages as taken, so the step
// is windowed and runs, where pinning every layer would wait for frames that never come.
TEST(FullHost, AStepWindowsWhenHbmHoldsPrivatePagesHostCannotTake) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.policies.write = WritePolicy::kWriteThrough;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const std::vector<BlockKey> reused = w.prompt(kFrames / layers - 4, /*salt=*/1);
  ASSERT_TRUE(w.prefill_and_close(reused, kNanosPerMicro).ok());
  w.settle();
  const Status filled = fill_host_with_private_pages(w);
  ASSERT_TRUE(filled.ok()) << filled.to_string();
  auto b = w.scheduler().open_sequence({});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const StepItem b_prefill{b->id, kFrames / layers / 2 * page_tokens};
  ASSERT_TRUE(w.run_step(std::span(&b_prefill, 1), kNanosPerMicro).status.ok());
  w.settle();
  ASSERT_GT(w.host().free_count() + kFrames / 2, w.hbm().capacity() - w.hbm().free_count())
      << "B's pages must be in HBM: " << w.scheduler().pending_summary();
  auto k = w.scheduler().open_sequence(reused);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_EQ(k->reused_blocks, reused.size());
  const StepItem k_decode{k->id, 1};
  auto rk = w.run_step(std::span(&k_decode, 1), kNanosPerMicro);
  ASSERT_TRUE(rk.status.ok()) << rk.status.to_string() << "; " << w.scheduler().pending_summary();
  EXPECT_TRUE(rk.info.windowed);
  EXPECT_LT(rk.info.window, layers);
  expect_tables_valid(w, rk);
  EXPECT_EQ(testing::lost_page(w), "") << "a page of a sequence has no copy left";
  close_and_expect_idle(w, {k->id, b->id});
}

// An NVMe tier smaller than the blocks in use: they have a content key, but those NVMe has no
// extent for cannot leave memory either. Three open sequences over prompts of B blocks fill HBM,
// host memory (but for its reserve) and NVMe's 4 extents but for a few blocks; a fourth sequence's
// prefill of more than those is refused at once, naming NVMe's size, and once the engine closes
// a sequence it runs.
TEST(FullTiersSmallNvme, BlocksInUseThatNvmeHasNoRoomForStayInMemory) {
  SimSetup setup = full_tiers_setup(/*with_nvme=*/true);
  setup.nvme_extents = 4;
  SimWorld w(setup);
  const uint32_t layers = setup.geometry.layers;
  const uint32_t page_tokens = setup.geometry.page_tokens;
  const uint32_t room = usable_frames(setup) / layers + setup.nvme_extents;  // blocks
  const uint32_t blocks = room / 3;
  std::vector<SequenceId> seqs;
  for (uint32_t i = 0; i < 3; ++i) {
    const std::vector<BlockKey> prompt = w.prompt(blocks, /*salt=*/i + 1);
    auto s = w.scheduler().open_sequence(prompt);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    seqs.push_back(s->id);
    const StepItem prefill{s->id, blocks * page_tokens};
    auto r = w.run_step(std::span(&prefill, 1), kNanosPerMicro);
    ASSERT_TRUE(r.status.ok()) << "sequence " << i << ": " << r.status.to_string();
    w.settle();
  }
  ASSERT_EQ(w.table().private_blocks(), 0u) << "every prompt block has its content key";
  const std::vector<BlockKey> fourth = w.prompt(blocks, /*salt=*/4);
  auto s = w.scheduler().open_sequence(fourth);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  seqs.push_back(s->id);
  const StepItem too_much{s->id, blocks * page_tokens};
  auto failed = w.run_step(std::span(&too_much, 1), kNanosPerMicro);
  EXPECT_EQ(failed.status.code(), StatusCode::kResourceExhausted) << failed.status.to_string();
  EXPECT_NE(failed.status.message().find("NVMe has room for 4"), std::string::npos)
      << failed.status.to_string();
  ASSERT_TRUE(w.scheduler().close_sequence(seqs[0]).ok());
  w.settle();
  auto r = w.run_step(std::span(&too_much, 1), kNanosPerMicro);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string() << "; " << w.scheduler().pending_summary();
  expect_tables_valid(w, r);
  close_and_expect_idle(w, std::span(seqs).subspan(1));
}

INSTANTIATE_TEST_SUITE_P(BeyondTheReserve, FullHostFreeFrames, ::testing::Values(0u, 2u));

INSTANTIATE_TEST_SUITE_P(Nvme, FullTiers, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "WithNvme" : "WithoutNvme");
                         });

}  // namespace
}  // namespace kvtier

// Steps that HBM and host memory cannot serve. An engine that never publishes the blocks it fills
// keeps them under private keys, which live only in HBM and host memory; without NVMe, so do the
// blocks of every open sequence. Once they fill both tiers, a step that would need more is refused
// by begin_step at once (kResourceExhausted), saying how many frames one layer needs, how many are
// left and what holds the rest. A step that begin_step admits but whose layer cannot arrive in time
// (here: a link too slow for the pages that must leave HBM first) gives up at the runtime's
// wait_timeout, and the kDeadlineExceeded says what the scheduler waits on and who holds the
// frames; a shutdown while copies wait for frames only the engine can free cancels them at once.
// Nothing is lost: once the engine closes a sequence (or the copies end) the step runs, and every
// page the other sequences wrote reads back as written.
#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime_test_util.hpp"

namespace kvtier {
namespace {

using testing::make_tokens;
using testing::run_checked_step;

// A runtime whose HBM and host memory hold 64 frames each, without NVMe, that gives up waiting for
// a layer after 300 ms; `link_gbps` throttles the HBM link (0: unthrottled).
std::unique_ptr<Runtime> open_small(const testing::ScratchDir& dir,
                                    WritePolicy write = WritePolicy::kWriteBack,
                                    double link_gbps = 0.0) {
  Config c = testing::small_config(dir.path());
  c.tiers.nvme.enabled = false;
  c.tiers.host.capacity_bytes = 64 * 8192;
  c.tiers.hbm.link_gbps = link_gbps;
  c.policies.write = write;
  RuntimeOptions options;
  options.wait_timeout = std::chrono::milliseconds(300);
  auto opened = Runtime::open(c, options);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  return opened.ok() ? std::move(opened).value() : nullptr;
}

// A step of `new_tokens` tokens of `tokens` by `seq` is refused at once (kResourceExhausted, before
// wait_timeout), with a message that says each of `says`.
void expect_refused_at_once(Runtime& rt, SequenceId seq, const std::vector<uint32_t>& tokens,
                            uint32_t new_tokens, std::initializer_list<std::string_view> says) {
  bool bytes_ok = true;
  const auto start = std::chrono::steady_clock::now();
  Status refused = run_checked_step(rt, seq, tokens, 0, new_tokens, &bytes_ok);
  ASSERT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300))
      << "refused without waiting";
  const std::string& why = refused.message();
  for (std::string_view part : says) EXPECT_NE(why.find(part), std::string::npos) << why;
}

// Opens `count` sequences with no prompt blocks and has all but the last append `blocks` blocks
// that no end_step names (they stay private). Returns the sequences and their tokens.
struct PrivateSequences {
  std::vector<SequenceId> ids;
  std::vector<std::vector<uint32_t>> tokens;
};
PrivateSequences fill_with_private_blocks(Runtime& rt, int count, uint32_t blocks) {
  PrivateSequences out;
  for (int i = 0; i < count; ++i) {
    auto seq = rt.open_sequence({});
    EXPECT_TRUE(seq.ok()) << seq.status().to_string();
    if (!seq.ok()) return out;
    out.ids.push_back(seq->id);
    out.tokens.push_back(
        make_tokens(blocks * rt.geometry().page_tokens, 100 + static_cast<uint32_t>(i)));
  }
  bool bytes_ok = true;
  for (int i = 0; i + 1 < count; ++i) {
    Status s = run_checked_step(rt, out.ids[i], out.tokens[i], 0,
                                blocks * rt.geometry().page_tokens, &bytes_ok);
    EXPECT_TRUE(s.ok()) << "sequence " << i << ": " << s.to_string();
  }
  return out;
}

TEST(RuntimeWaitTimeout, PrivatePagesFillingTheTiersRefuseAStepAtOnce) {
  testing::ScratchDir dir("runtime-wait-refused");
  auto rt = open_small(dir);
  ASSERT_NE(rt, nullptr);
  const uint32_t page_tokens = rt->geometry().page_tokens;
  // 10 blocks are 40 pages over 4 layers; HBM and host hold 128: three sequences fit (120 pages),
  // the fourth cannot.
  constexpr uint32_t kBlocks = 10;
  constexpr int kSequences = 4;
  PrivateSequences seqs = fill_with_private_blocks(*rt, kSequences, kBlocks);
  ASSERT_EQ(seqs.ids.size(), static_cast<std::size_t>(kSequences));
  bool bytes_ok = true;
  expect_refused_at_once(
      *rt, seqs.ids.back(), seqs.tokens.back(), kBlocks * page_tokens,
      {"one layer of this batch needs 10 HBM frames", "cannot leave memory without an NVMe tier",
       "30 blocks in use, 30 of them private"});

  // The engine frees one sequence; the refused step now runs (120 pages: HBM and host full but
  // for 8 frames). It closes another, and the two left take turns, each step
  // bringing one up and sending the other down, and read back every token they wrote.
  ASSERT_TRUE(rt->close_sequence(seqs.ids[0]).ok());
  Status retried = run_checked_step(*rt, seqs.ids.back(), seqs.tokens.back(), 0,
                                    kBlocks * page_tokens, &bytes_ok);
  ASSERT_TRUE(retried.ok()) << retried.to_string();
  ASSERT_TRUE(rt->close_sequence(seqs.ids[2]).ok());
  for (int turn = 0; turn < 6; ++turn) {
    const int i = turn % 2 == 0 ? 1 : 3;
    // One more token after the context: the step reads (and checks) all of it.
    std::vector<uint32_t>& t = seqs.tokens[i];
    t.push_back(7);
    Status s = run_checked_step(*rt, seqs.ids[i], t, t.size() - 1, 1, &bytes_ok);
    ASSERT_TRUE(s.ok()) << "turn " << turn << ", sequence " << i << ": " << s.to_string();
  }
  EXPECT_TRUE(bytes_ok) << "a page read back differs from what its sequence wrote";
  ASSERT_TRUE(rt->close_sequence(seqs.ids[1]).ok());
  ASSERT_TRUE(rt->close_sequence(seqs.ids[3]).ok());
  ASSERT_TRUE(rt->shutdown().ok());
}

// Without NVMe: A's private pages fill host memory, and B's prompt, open, three quarters of HBM.
// Neither can leave memory. Returns A and B, and B's tokens.
struct BlocksInUse {
  SequenceId private_sequence = 0;
  SequenceId prompt_sequence = 0;
  std::vector<uint32_t> prompt;
};
BlocksInUse fill_with_blocks_in_use(Runtime& rt) {
  BlocksInUse out;
  const uint32_t page_tokens = rt.geometry().page_tokens;
  bool bytes_ok = true;
  PrivateSequences a = fill_with_private_blocks(rt, 2, 16);  // 64 pages; the second stays empty
  EXPECT_EQ(a.ids.size(), 2u);
  if (a.ids.size() != 2) return out;
  EXPECT_TRUE(rt.close_sequence(a.ids[1]).ok());
  out.private_sequence = a.ids[0];
  out.prompt = make_tokens(12 * page_tokens, 7);
  auto b = rt.open_sequence(rt.block_keys(out.prompt));
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return out;
  out.prompt_sequence = b->id;
  Status s = run_checked_step(rt, b->id, out.prompt, 0, 12 * page_tokens, &bytes_ok);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(bytes_ok);
  return out;
}

TEST(RuntimeWaitTimeout, BlocksInUseFillingTheTiersWithoutNvmeRefuseAStepAtOnce) {
  testing::ScratchDir dir("runtime-wait-in-use");
  auto rt = open_small(dir);
  ASSERT_NE(rt, nullptr);
  const uint32_t page_tokens = rt->geometry().page_tokens;
  const BlocksInUse held = fill_with_blocks_in_use(*rt);
  ASSERT_NE(held.prompt_sequence, 0u);
  // C's 5 blocks need 5 frames a layer; B's published prompt holds 48 of HBM's 64 frames and
  // cannot leave it (host memory is full of A's private pages, and there is no NVMe), and C's own
  // pages of the layers it is not computing would need room too.
  auto c = rt->open_sequence({});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::vector<uint32_t> tokens = make_tokens(5 * page_tokens, 11);
  bool bytes_ok = true;
  expect_refused_at_once(
      *rt, c->id, tokens, 5 * page_tokens,
      {"one layer of this batch needs 5 HBM frames", "cannot leave memory without an NVMe tier",
       "28 blocks in use, 16 of them private"});
  // The engine closes A: C's step runs, and B's next step reads its whole prompt back.
  ASSERT_TRUE(rt->close_sequence(held.private_sequence).ok());
  Status retried = run_checked_step(*rt, c->id, tokens, 0, 5 * page_tokens, &bytes_ok);
  ASSERT_TRUE(retried.ok()) << retried.to_string();
  std::vector<uint32_t> prompt = held.prompt;
  prompt.push_back(3);
  Status b_step =
      run_checked_step(*rt, held.prompt_sequence, prompt, prompt.size() - 1, 1, &bytes_ok);
  ASSERT_TRUE(b_step.ok()) << b_step.to_string();
  EXPECT_TRUE(bytes_ok) << "a page read back differs from what its sequence wrote";
  for (SequenceId id : {c->id, held.prompt_sequence}) ASSERT_TRUE(rt->close_sequence(id).ok());
  ASSERT_TRUE(rt->shutdown().ok());
}

// HBM holds a closed sequence's prompt, cached and written nowhere else (write-back); a new step of
// two blocks fits only layer by layer, and the frames its later layers need are freed only by
// copies to host memory, over a link throttled to 0.4 s a page. Such a layer cannot arrive within
// wait_timeout: the step gives up with kDeadlineExceeded, naming the frames it waits for and the
// copies in flight. Once they end, the same step runs.
TEST(RuntimeWaitTimeout, ALayerASlowLinkCannotBringInTimeIsNamedInTheTimeout) {
  testing::ScratchDir dir("runtime-wait-slow-link");
  auto opened = open_small(dir, WritePolicy::kWriteBack, /*link_gbps=*/8192.0 / 0.4 / 1e9);
  ASSERT_NE(opened, nullptr);
  Runtime& rt = *opened;
  const uint32_t page_tokens = rt.geometry().page_tokens;
  bool bytes_ok = true;
  const std::vector<uint32_t> prompt = make_tokens(15 * page_tokens, 5);
  auto b = rt.open_sequence(rt.block_keys(prompt));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(run_checked_step(rt, b->id, prompt, 0, 15 * page_tokens, &bytes_ok).ok());
  ASSERT_TRUE(rt.close_sequence(b->id).ok());
  // C's 2 blocks need 8 frames, 2 a layer; B left 4 free.
  auto seq = rt.open_sequence({});
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  const std::vector<uint32_t> tokens = make_tokens(2 * page_tokens, 11);
  Status stuck = run_checked_step(rt, seq->id, tokens, 0, 2 * page_tokens, &bytes_ok);
  ASSERT_EQ(stuck.code(), StatusCode::kDeadlineExceeded) << stuck.to_string();
  const std::string& why = stuck.message();
  EXPECT_NE(why.find("wait_layer: step "), std::string::npos) << why;
  EXPECT_NE(why.find("the scheduler is waiting on: "), std::string::npos) << why;
  EXPECT_NE(why.find("waiting for hbm frames"), std::string::npos) << why;
  EXPECT_NE(why.find("bytes in flight"), std::string::npos) << why;
  EXPECT_NE(why.find("drain hbm"), std::string::npos) << why;
  EXPECT_NE(why.find("hbm frames: "), std::string::npos) << "who holds the frames: " << why;
  Status retried = Status();
  for (int attempt = 0; attempt < 40; ++attempt) {
    retried = run_checked_step(rt, seq->id, tokens, 0, 2 * page_tokens, &bytes_ok);
    if (retried.code() != StatusCode::kDeadlineExceeded) break;
  }
  ASSERT_TRUE(retried.ok()) << retried.to_string();
  EXPECT_TRUE(bytes_ok) << "a page read back differs from what its sequence wrote";
  ASSERT_TRUE(rt.close_sequence(seq->id).ok());
  ASSERT_TRUE(rt.shutdown().ok());
}

// Shutting down while a copy waits for frames that only the engine could free (its sequences are
// still open) does not wait out shutdown_timeout: it cancels the copy at once and says what held
// it. The copy: write-through of a prompt to host memory, which private pages fill.
TEST(RuntimeWaitTimeout, ShutdownDoesNotWaitForCopiesNothingCanStart) {
  testing::ScratchDir dir("runtime-wait-shutdown");
  auto rt = open_small(dir, WritePolicy::kWriteThrough);
  ASSERT_NE(rt, nullptr);
  const uint32_t page_tokens = rt->geometry().page_tokens;
  // A (16 blocks: all of HBM) and A2 (14 blocks), private, fill host memory with 56 of A's pages
  // and HBM with the rest; B's two-block prompt takes the HBM frames of A's last pages, which
  // fill host memory.
  PrivateSequences seqs = fill_with_private_blocks(*rt, 2, 16);
  ASSERT_EQ(seqs.ids.size(), 2u);
  bool bytes_ok = true;
  seqs.tokens[1].resize(14 * page_tokens);
  ASSERT_TRUE(
      run_checked_step(*rt, seqs.ids[1], seqs.tokens[1], 0, 14 * page_tokens, &bytes_ok).ok());
  const std::vector<uint32_t> prompt = make_tokens(2 * page_tokens, 9);
  auto b = rt->open_sequence(rt->block_keys(prompt));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Status s = run_checked_step(*rt, b->id, prompt, 0, 2 * page_tokens, &bytes_ok);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const auto start = std::chrono::steady_clock::now();
  Status down = rt->shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(down.code(), StatusCode::kCancelled) << down.to_string();
  EXPECT_NE(down.message().find("waiting for host frames"), std::string::npos) << down.message();
  EXPECT_NE(down.message().find(" private, "), std::string::npos) << down.message();
  EXPECT_NE(down.message().find("full_block_keys"), std::string::npos)
      << "what the engine can do: " << down.message();
}

}  // namespace
}  // namespace kvtier

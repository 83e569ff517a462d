// A layer that cannot arrive: an engine that never publishes the blocks it fills keeps them under
// private keys, which live only in HBM and host memory. Once they fill both, a step that needs one
// more frame waits for a move no plan can make. The wait ends at the runtime's wait_timeout with
// kDeadlineExceeded, and the message says what the scheduler waits on and who holds the frames (the
// private pages), with what the engine can do about it. Nothing is lost: once the engine closes a
// sequence the step runs, and every page the other sequences wrote reads back as written.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime_test_util.hpp"

namespace kvtier {
namespace {

using testing::make_tokens;
using testing::run_checked_step;

// A runtime whose HBM and host memory hold 64 frames each, without NVMe, that gives up waiting for
// a layer after 300 ms.
std::unique_ptr<Runtime> open_small(const testing::ScratchDir& dir) {
  Config c = testing::small_config(dir.path());
  c.tiers.nvme.enabled = false;
  c.tiers.host.capacity_bytes = 64 * 8192;
  RuntimeOptions options;
  options.wait_timeout = std::chrono::milliseconds(300);
  auto opened = Runtime::open(c, options);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  return opened.ok() ? std::move(opened).value() : nullptr;
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

TEST(RuntimeWaitTimeout, PrivatePagesFillingHostAreNamedInTheTimeout) {
  testing::ScratchDir dir("runtime-wait-timeout");
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
  const auto start = std::chrono::steady_clock::now();
  Status stuck = run_checked_step(*rt, seqs.ids.back(), seqs.tokens.back(), 0,
                                  kBlocks * page_tokens, &bytes_ok);
  ASSERT_EQ(stuck.code(), StatusCode::kDeadlineExceeded) << stuck.to_string();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  const std::string& why = stuck.message();
  EXPECT_NE(why.find("wait_layer: step "), std::string::npos) << why;
  EXPECT_NE(why.find("the scheduler is waiting on: "), std::string::npos) << why;
  EXPECT_NE(why.find(" private, "), std::string::npos) << "who holds the frames: " << why;
  EXPECT_NE(why.find("cannot go to NVMe"), std::string::npos) << why;
  EXPECT_NE(why.find("full_block_keys"), std::string::npos) << why;

  // The engine frees one sequence; the step that waited in vain now runs (120 pages: HBM and
  // host full but for 8 frames). It closes another, and the two left take turns, each step
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

// Shutting down while a copy waits for frames that only the engine could free (its sequences are
// still open) does not wait out shutdown_timeout: it cancels the copy at once and says what held
// it. The copy: a prefix cached on NVMe only, prefetched for a new sequence while host memory is
// full of private pages but for the frames it keeps for staging NVMe writes, which no prefetch
// may take.
TEST(RuntimeWaitTimeout, ShutdownDoesNotWaitForCopiesNothingCanStart) {
  testing::ScratchDir dir("runtime-wait-shutdown");
  Config c = testing::small_config(dir.path());
  c.tiers.host.capacity_bytes = 64 * 8192;
  c.policies.write = WritePolicy::kWriteThrough;
  auto rt = testing::open_or_skip(c);
  if (!rt) GTEST_SKIP() << "the NVMe store cannot be opened here (O_DIRECT or io_uring refused)";
  const uint32_t page_tokens = rt->geometry().page_tokens;
  // The prefix: two blocks, computed and written through to NVMe.
  const std::vector<uint32_t> prefix = make_tokens(2 * page_tokens, 9);
  bool bytes_ok = true;
  {
    auto seq = rt->open_sequence(rt->block_keys(prefix));
    ASSERT_TRUE(seq.ok()) << seq.status().to_string();
    ASSERT_TRUE(run_checked_step(*rt, seq->id, prefix, 0, 2 * page_tokens, &bytes_ok).ok());
    ASSERT_TRUE(rt->close_sequence(seq->id).ok());
  }
  // Private pages fill HBM (64 frames) and host memory but for its reserve (56 of 64): three
  // sequences of 10 blocks over 4 layers.
  PrivateSequences seqs = fill_with_private_blocks(*rt, 4, 10);
  ASSERT_EQ(seqs.ids.size(), 4u);
  auto m = rt->match(rt->block_keys(prefix));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->by_tier[tier_index(Tier::kNvme)], 2u) << "the prefix must be on NVMe only";
  auto again = rt->open_sequence(rt->block_keys(prefix));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  const auto start = std::chrono::steady_clock::now();
  Status down = rt->shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(down.code(), StatusCode::kCancelled) << down.to_string();
  EXPECT_NE(down.message().find("waiting for host frames"), std::string::npos) << down.message();
  EXPECT_NE(down.message().find(" private, "), std::string::npos) << down.message();
}

}  // namespace
}  // namespace kvtier

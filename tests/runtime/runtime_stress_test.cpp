// Engine threads calling the Runtime concurrently while its loop moves pages between tiers: the
// bytes every thread reads back are the bytes written, the runtime's invariants hold between any
// two of the loop's decisions (an auditor thread calls Runtime::audit throughout), and the
// accounting is exact afterwards.
// Labelled `stress`: `make tsan` runs it under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "runtime_test_util.hpp"

namespace kvtier {
namespace {

using testing::Auditor;
using testing::make_tokens;
using testing::run_checked_step;
using testing::ScratchDir;
using testing::small_config;

TEST(RuntimeStress, EngineThreadsShareAPrefixWhileTheLoopMovesPages) {
  ScratchDir dir("runtime-stress");
  Config c = small_config(dir.path());
  c.tiers.hbm.capacity_bytes = 96 * 8192;  // room for a few concurrent steps, not for the cache
  c.tiers.host.capacity_bytes = 160 * 8192;
  auto opened = Runtime::open(c);
  if (!opened.ok() && opened.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "the NVMe store cannot be opened here: " << opened.status().to_string();
  }
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto rt = std::move(opened).value();
  const Geometry& g = rt->geometry();
  constexpr int kThreads = 4;
  constexpr int kRequestsPerThread = 12;
  std::atomic<int> bad_bytes{0};
  std::atomic<int> failures{0};
  Auditor auditor(*rt);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRequestsPerThread; ++r) {
        // Every request shares a 2-block system prompt; requests of a thread repeat every 3rd time.
        const auto tokens = make_tokens(5 * g.page_tokens, static_cast<uint32_t>(t * 1000 + r % 3),
                                        2 * g.page_tokens);
        auto seq = rt->open_sequence(rt->block_keys(tokens));
        if (!seq.ok()) {
          ++failures;
          continue;
        }
        bool ok = true;
        Status s = run_checked_step(*rt, seq->id, tokens, seq->reused_tokens,
                                    static_cast<uint32_t>(tokens.size() - seq->reused_tokens), &ok);
        // Decode a few tokens on top.
        std::vector<uint32_t> grown = tokens;
        for (int d = 0; d < 3 && s.ok(); ++d) {
          grown.push_back(static_cast<uint32_t>(d + 7));
          s = run_checked_step(*rt, seq->id, grown, grown.size() - 1, 1, &ok);
        }
        // A step may not fit while other threads hold HBM; that is an error, not a failure.
        if (!s.ok() && s.code() != StatusCode::kResourceExhausted) ++failures;
        if (!ok) ++bad_bytes;
        if (!rt->close_sequence(seq->id).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string broken = auditor.stop();
  EXPECT_EQ(broken, "");
  EXPECT_GT(auditor.passed(), 0u);
  const Status quiet = rt->audit();
  EXPECT_TRUE(quiet.ok()) << quiet.to_string();
  EXPECT_EQ(bad_bytes.load(), 0) << "a thread read back bytes that differ from what was written";
  EXPECT_EQ(failures.load(), 0);
  const RuntimeStats s = rt->stats();
  EXPECT_EQ(s.open_sequences, 0u);
  uint64_t hits = 0;
  for (uint64_t h : s.hit_tokens) hits += h;
  EXPECT_GT(hits, 0u) << "the shared prefix should have been reused";
  EXPECT_LE(s.used_bytes[tier_index(Tier::kHbm)], s.capacity_bytes[tier_index(Tier::kHbm)]);
  ASSERT_TRUE(rt->shutdown().ok());
}

}  // namespace
}  // namespace kvtier

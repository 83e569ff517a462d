// The engine over the simulated scheduler, per baseline: the invariants every run must hold
// (requests served once, token times ordered, tiers a baseline lacks never used, no reuse without
// keys), the ordering a reuse-heavy workload must show, determinism, contexts larger than HBM,
// and the scheduler's invariants after every event.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/run/batcher.hpp"
#include "run_test_util.hpp"
#include "scheduler/policies/evictor.hpp"

namespace kvtier::bench::run {
namespace {

using testing::baseline;
using testing::h200_8b;
using testing::run_or_fail;
using testing::tiny_chat;
using testing::tiny_tiers;

void expect_served_in_order(const BaselineResult& r) {
  for (const RequestRecord& rec : r.records) {
    ASSERT_FALSE(rec.rejected);
    ASSERT_GE(rec.first_token, rec.arrival);
    ASSERT_GE(rec.finish, rec.first_token);
    uint64_t reused = 0;
    for (uint64_t t : rec.reused_tokens) reused += t;
    EXPECT_LE(reused, rec.input_tokens);
  }
  EXPECT_EQ(r.completed(), r.requests());
}

uint64_t link(const BaselineResult& r, Link l) { return r.link_bytes[static_cast<int>(l)]; }

TEST(Engine, RecomputeReusesNothingAndComputesEveryPromptToken) {
  const PerfModel m = h200_8b();
  const Workload w = tiny_chat(m);
  const BaselineResult r = run_or_fail(w, baseline(m, "recompute"), m, tiny_tiers(m));
  expect_served_in_order(r);
  EXPECT_EQ(r.hit_rate(), 0.0);
  EXPECT_EQ(r.prefill_tokens, w.total_input_tokens());
  for (Link l : kAllLinks) EXPECT_EQ(link(r, l), 0u) << link_name(l);
  EXPECT_EQ(r.tier_bytes[tier_index(Tier::kHost)], 0u);
  EXPECT_EQ(r.tier_bytes[tier_index(Tier::kNvme)], 0u);
}

TEST(Engine, EachBaselineUsesOnlyItsTiers) {
  const PerfModel m = h200_8b();
  const Workload w = tiny_chat(m);
  const BaselineResult lru = run_or_fail(w, baseline(m, "hbm_lru"), m, tiny_tiers(m));
  const BaselineResult host = run_or_fail(w, baseline(m, "hbm_host"), m, tiny_tiers(m));
  const BaselineResult kv = run_or_fail(w, baseline(m, "kvtier"), m, tiny_tiers(m));
  for (const BaselineResult* r : {&lru, &host, &kv}) expect_served_in_order(*r);
  EXPECT_EQ(lru.hit_rate(Tier::kHost) + lru.hit_rate(Tier::kNvme), 0.0);
  for (Link l : kAllLinks) EXPECT_EQ(link(lru, l), 0u) << link_name(l);
  EXPECT_EQ(host.hit_rate(Tier::kNvme), 0.0);
  EXPECT_EQ(link(host, Link::kNvmeToHost) + link(host, Link::kHostToNvme), 0u);
  EXPECT_GT(link(host, Link::kHbmToHost), 0u) << "HBM never overflowed: the test is too small";
  // Prefill work shrinks by what is reused: each reused token is a prompt token not computed.
  for (const BaselineResult* r : {&lru, &host, &kv}) {
    uint64_t reused = 0;
    for (Tier t : kAllTiers) reused += r->hit_tokens(t);
    EXPECT_EQ(r->prefill_tokens + reused, w.total_input_tokens()) << r->name;
  }
}

TEST(Engine, MoreTiersReuseMoreOnAReuseHeavyWorkload) {
  const PerfModel m = h200_8b();
  const Workload w = tiny_chat(m);
  const BaselineResult none = run_or_fail(w, baseline(m, "recompute"), m, tiny_tiers(m));
  const BaselineResult lru = run_or_fail(w, baseline(m, "hbm_lru"), m, tiny_tiers(m));
  const BaselineResult host = run_or_fail(w, baseline(m, "hbm_host"), m, tiny_tiers(m));
  const BaselineResult kv = run_or_fail(w, baseline(m, "kvtier"), m, tiny_tiers(m));
  EXPECT_GT(lru.hit_rate(), 0.0);
  EXPECT_GE(host.hit_rate(), lru.hit_rate());
  EXPECT_GE(kv.hit_rate(), lru.hit_rate());
  EXPECT_GT(kv.hit_rate(Tier::kHost) + kv.hit_rate(Tier::kNvme), 0.0);
  EXPECT_LT(kv.prefill_gpu_ns, lru.prefill_gpu_ns);
  EXPECT_LT(lru.prefill_gpu_ns, none.prefill_gpu_ns);
}

TEST(Engine, DeterministicForASeed) {
  const PerfModel m = h200_8b();
  const Workload w = tiny_chat(m, 3);
  const BaselineSpec b = baseline(m, "kvtier");
  const BaselineResult a = run_or_fail(w, b, m, tiny_tiers(m));
  const BaselineResult c = run_or_fail(w, b, m, tiny_tiers(m));
  ASSERT_EQ(a.records.size(), c.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    EXPECT_EQ(a.records[i].first_token, c.records[i].first_token) << i;
    EXPECT_EQ(a.records[i].finish, c.records[i].finish) << i;
    EXPECT_EQ(a.records[i].reused_tokens, c.records[i].reused_tokens) << i;
  }
  EXPECT_EQ(a.link_bytes, c.link_bytes);
  EXPECT_EQ(a.stall_ns, c.stall_ns);
  EXPECT_EQ(a.steps, c.steps);
  EXPECT_EQ(a.prefetches, c.prefetches);
}

TEST(Engine, ContextLargerThanHbmRunsLayerByLayerWhereAHostTierExists) {
  const PerfModel m = h200_8b();
  auto w = generate_workload("long_context",
                             {{"context", "40000"}, {"questions", "1"}, {"answer_tokens", "8"}}, 1,
                             m.sim_geometry().page_tokens);
  ASSERT_TRUE(w.ok());
  VirtualRunOptions o = tiny_tiers(m);
  const uint64_t kv = w->max_request_tokens() * m.kv_bytes_per_token();
  o.hbm_kv_bytes = kv / 5;  // HBM a fifth of the context's KV
  o.host_bytes = 2 * kv;
  for (const char* name : {"hbm_host", "kvtier"}) {
    const BaselineResult r = run_or_fail(*w, baseline(m, name), m, o);
    expect_served_in_order(r);
    EXPECT_GT(r.windowed_steps, 0u) << name;
    EXPECT_GT(link(r, Link::kHostToHbm), kv) << name << ": decode streams the context from host";
  }
  for (const char* name : {"recompute", "hbm_lru"}) {
    const BaselineResult r = run_or_fail(*w, baseline(m, name), m, o);
    EXPECT_EQ(r.rejected(), 1u) << name << ": no host tier to stream from";
    EXPECT_EQ(r.completed(), 0u);
  }
}

TEST(Engine, AHostTierSmallerThanTheWorkingSetNeverStarvesALoad) {
  // 30 chat users on 1 or 2 GB of HBM, 2 GB of host memory and 8 GB of NVMe (`kvtier-bench run
  // --workload chat --params users=30,turns=4 --hbm 1GB --host 2GB --nvme 8GB`). Loads used to
  // wait forever: room-making gave up after four rounds of in-use blocks that could not leave
  // host memory while cached blocks ranked behind them; HBM waiters were never served again once
  // the NVMe transfers that kept cached blocks out of every plan had ended; and (2 GB) long
  // prompts recomputed rather than loaded from NVMe went into private blocks that could never
  // leave host memory, until it was full of them.
  const PerfModel m = h200_8b();
  auto w =
      generate_workload("chat", {{"users", "30"}, {"turns", "4"}}, 1, m.sim_geometry().page_tokens);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  for (const uint64_t hbm : {1'000'000'000ull, 2'000'000'000ull}) {
    VirtualRunOptions o = tiny_tiers(m);
    o.hbm_kv_bytes = hbm;
    o.host_bytes = 2'000'000'000;
    o.nvme_bytes = 8'000'000'000;
    o.watermarks = {};
    const BaselineResult r = run_or_fail(*w, baseline(m, "kvtier"), m, o);
    // Every request is served, or refused at admission because its KV fits in no tier.
    EXPECT_EQ(r.completed() + r.rejected(), r.requests()) << hbm;
    EXPECT_GT(r.completed(), r.requests() * 9 / 10) << hbm;
    EXPECT_GT(r.hit_rate(Tier::kNvme), 0.0) << hbm << ": the workload must overflow host memory";
  }
}

// The scheduler's invariants (the page table's audit, each tier's policy tracking exactly the
// blocks with a ready copy there) hold after every event of the simulated loop, over each
// eviction policy on tiers the workload overflows and a context windowed through a small HBM;
// and auditing changes nothing the run reports. (At larger scale: default_run_test.cpp.)
TEST(Engine, TheSchedulerKeepsItsInvariantsAfterEveryEvent) {
  const PerfModel m = h200_8b();
  struct Case {
    std::string name;
    Workload workload;
    VirtualRunOptions options;
    EvictionPolicy eviction = EvictionPolicy::kLru;
  };
  std::vector<Case> cases;
  for (EvictionPolicy e : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    cases.push_back(
        {"tiny chat, " + std::string(eviction_policy_name(e)), tiny_chat(m), tiny_tiers(m), e});
  }
  auto context = generate_workload(
      "long_context", {{"context", "40000"}, {"questions", "2"}, {"answer_tokens", "8"}}, 1,
      m.sim_geometry().page_tokens);
  ASSERT_TRUE(context.ok());
  VirtualRunOptions windowed = tiny_tiers(m);
  const uint64_t kv = context->max_request_tokens() * m.kv_bytes_per_token();
  windowed.hbm_kv_bytes = kv / 5;
  windowed.host_bytes = 2 * kv;
  cases.push_back({"long context, HBM a fifth of it", *context, windowed});
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    PoliciesConfig policies;
    policies.eviction = c.eviction;
    auto specs = make_baselines("kvtier", policies, m.prefill_tokens_per_s());
    ASSERT_TRUE(specs.ok());
    const BaselineResult plain = run_or_fail(c.workload, specs->front(), m, c.options);
    c.options.audit_every = 1;
    const BaselineResult audited = run_or_fail(c.workload, specs->front(), m, c.options);
    EXPECT_GT(audited.hit_rate(Tier::kHost) + audited.hit_rate(Tier::kNvme), 0.0)
        << "nothing moved between tiers: the case checks too little";
    EXPECT_EQ(audited.link_bytes, plain.link_bytes);
    EXPECT_EQ(audited.steps, plain.steps);
    EXPECT_EQ(audited.prefill_tokens, plain.prefill_tokens);
  }
}

TEST(Engine, ServesNoMetricsUnlessAskedTo) {
  // A run's metrics endpoint is opt-in (kvtier-bench run --metrics), not the config default.
  EXPECT_TRUE(VirtualRunOptions{}.metrics.listen.empty());
}

// `count` requests of `input` prompt and `output` generated tokens over prompt blocks `keys`, in
// 16-token pages, all arriving at 0.
Workload same_requests(int count, uint64_t input, uint64_t output,
                       const std::vector<BlockKey>& keys = {}) {
  Workload w;
  w.page_tokens = 16;
  for (int i = 0; i < count; ++i) {
    Request r;
    r.id = i;
    r.input_tokens = input;
    r.output_tokens = output;
    r.keys = keys;
    w.requests.push_back(r);
  }
  return w;
}

// A batcher over 16-token pages of 2 layers, with `hbm_frames` HBM frames.
BatcherConfig two_layer_batcher(uint64_t hbm_frames) {
  BatcherConfig c;
  c.page_tokens = 16;
  c.layers = 2;
  c.hbm_frames = hbm_frames;
  return c;
}

TEST(Batcher, AdmitsInOrderWhileKvFitsAndPlansChunkedPrefill) {
  const Workload w = same_requests(3, 100, 4);
  // 7 pages x 2 layers = 14 frames per request: two fit at 0.95
  BatcherConfig c = two_layer_batcher(30);
  c.max_batched_tokens = 64;
  BaselineResult result;
  Batcher b(w, c, result, nullptr);
  b.take_arrivals(0);
  SequenceId next = 1;
  ASSERT_TRUE(b.admit([&](std::span<const BlockKey>) -> Result<OpenedSequence> {
                 OpenedSequence o;
                 o.id = next++;
                 return o;
               }).ok());
  EXPECT_EQ(b.running().size(), 2u);
  EXPECT_TRUE(b.has_waiting());
  const StepPlan p = b.plan(0, 1, [](const IterationWork&) { return Nanos{10}; });
  ASSERT_EQ(p.items.size(), 1u) << "the first prompt takes the whole budget";
  EXPECT_EQ(p.items[0].new_tokens, 64u);
  ASSERT_EQ(p.iterations.size(), 1u);
  EXPECT_EQ(p.iterations[0].prefill_tokens, 64u);
  EXPECT_DOUBLE_EQ(p.iterations[0].prefill_pairs, chunk_pairs(0, 64));
}

// The frames of running requests count a prompt block they share once: a block another running
// request holds and this one reused is referenced, not copied; one it computed itself beside
// them (neither could reuse the other's unfinished block) is a copy of its own.
TEST(HeldBlocks, APromptBlockRunningRequestsShareIsCountedOnce) {
  HeldBlocks held(/*layers=*/2);
  const std::vector<BlockKey> prompt = {BlockKey{1, 7}, BlockKey{2, 7}, BlockKey{3, 7}};
  EXPECT_EQ(held.estimate(prompt, 5), 10u) << "nothing held: 5 pages of 2 layers";
  const HeldBlocks::Share a = held.add(prompt, /*reused=*/0, 5);
  EXPECT_EQ(held.frames(), 10u);
  EXPECT_EQ(held.estimate(prompt, 5), 10u) << "A still prefills the prompt: nothing to reuse";
  held.computed(std::span(prompt).first(2));
  EXPECT_EQ(held.estimate(prompt, 5), 6u) << "2 blocks computed and held: 3 pages of its own";
  held.computed(prompt);
  EXPECT_EQ(held.estimate(prompt, 5), 4u) << "the 3 prompt blocks held: 2 pages of its own";
  const HeldBlocks::Share b = held.add(prompt, /*reused=*/3, 5);
  EXPECT_EQ(held.frames(), 14u);
  const HeldBlocks::Share c = held.add(prompt, /*reused=*/1, 5);
  EXPECT_EQ(held.frames(), 22u) << "C computed blocks 1 and 2 again: copies of its own";
  // A leaves: its blocks stay counted while B and C hold them.
  held.remove(a);
  EXPECT_EQ(held.frames(), 18u);
  held.remove(b);
  held.remove(c);
  EXPECT_EQ(held.frames(), 0u);
  // Another prompt after a shared first block: only the leading run counts as held.
  const HeldBlocks::Share d = held.add(prompt, 3, 5);
  const std::vector<BlockKey> other = {BlockKey{1, 7}, BlockKey{9, 7}, BlockKey{3, 7}};
  EXPECT_EQ(held.estimate(other, 5), 8u);
  held.remove(d);
}

// Three requests over one 6-block prompt, in 30 frames of 2 layers: each one's full KV is 7 pages
// (14 frames), so counted apart two fit. When the prompt is cached, each reuses it and adds a page:
// all three fit. When the first computes it, the others cannot reuse it until its prefill ends,
// and each would hold a copy: two fit.
TEST(Batcher, RequestsThatReuseARunningPromptAreAdmittedBesideIt) {
  for (const uint32_t reused : {6u, 0u}) {
    std::vector<BlockKey> keys;
    for (uint64_t k = 1; k <= 6; ++k) keys.push_back(BlockKey{k, 7});
    const Workload w = same_requests(3, 96, 4, keys);
    const BatcherConfig c = two_layer_batcher(30);
    BaselineResult result;
    Batcher b(w, c, result, nullptr);
    b.take_arrivals(0);
    SequenceId next = 1;
    ASSERT_TRUE(b.admit([&](std::span<const BlockKey> k) -> Result<OpenedSequence> {
                   OpenedSequence o;
                   o.id = next++;
                   o.reused_blocks = std::min<uint32_t>(reused, k.size());
                   o.reused_tokens = o.reused_blocks * 16ull;
                   return o;
                 }).ok());
    EXPECT_EQ(b.running().size(), reused == 6 ? 3u : 2u) << "reused " << reused;
  }
}

TEST(Batcher, RejectsWhatNoTierCanHold) {
  const Workload w = same_requests(1, 1000, 1);
  BatcherConfig c = two_layer_batcher(40);
  c.host_frames = 0;
  BaselineResult result;
  Batcher b(w, c, result, nullptr);
  b.take_arrivals(0);
  ASSERT_TRUE(b.admit([](std::span<const BlockKey>) -> Result<OpenedSequence> {
                 return internal_error("must not open");
               }).ok());
  EXPECT_TRUE(b.finished());
  EXPECT_TRUE(result.records[0].rejected);
}

}  // namespace
}  // namespace kvtier::bench::run

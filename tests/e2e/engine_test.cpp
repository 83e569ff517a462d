// The reference engine on its own: the model's weights and dense operations, attention over
// frames against a naive reference, and the engine's determinism — outputs that do not depend on
// batching, chunking, thread count or whether a prefix was cached — over a runtime without NVMe.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "bench/engine/ops.hpp"
#include "kernels/numeric_formats.hpp"
#include "tests/e2e/e2e_util.hpp"

namespace kvtier::e2e {
namespace {

using engine::ModelShape;
using engine::PagedAttention;
using engine::StepSlice;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_floats(std::size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  const auto t = tokens(n, seed);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(t[i]) / 256.0f - 1.0f) * scale;
  return v;
}

TEST(ReferenceModel, WeightsAreAPureFunctionOfTheSeed) {
  ModelShape shape;
  shape.layers = 2;
  auto a = Weights::generate(shape);
  auto b = Weights::generate(shape);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(same_bits((*a)->layers[1].w_down, (*b)->layers[1].w_down));
  EXPECT_TRUE(same_bits((*a)->embedding, (*b)->embedding));
  shape.seed += 1;
  auto c = Weights::generate(shape);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(same_bits((*a)->layers[1].w_down, (*c)->layers[1].w_down));
  // Fan-in scaling keeps every weight within sqrt(3 / fan_in).
  const float bound = std::sqrt(3.0f / static_cast<float>(shape.ffn_dim));
  for (float w : (*a)->layers[0].w_down) ASSERT_LE(std::fabs(w), bound);
  EXPECT_EQ((*a)->parameter_count(),
            2ull * (2 * 256 + 256 * 256 * 2 + 2 * 256 * 64 + 3 * 256 * 512) + 512 * 256 * 2 + 256);
}

TEST(ReferenceModel, InvalidShapesAreRefused) {
  ModelShape s;
  s.kv_heads = 3;
  EXPECT_EQ(s.validate().code(), StatusCode::kInvalidArgument);
  s = ModelShape{};
  s.head_dim = 24;
  EXPECT_EQ(Weights::generate(s).status().code(), StatusCode::kInvalidArgument);
  s = ModelShape{};
  s.vocab = 0;
  EXPECT_EQ(s.validate().code(), StatusCode::kInvalidArgument);
}

TEST(ReferenceOps, MatmulRowsDoNotDependOnTheirBatchOrThreads) {
  const uint32_t rows = 37, in = 256, out = 320;
  const auto x = random_floats(rows * in, 1);
  const auto w = random_floats(in * out, 2, 0.1f);
  std::vector<float> all(rows * out), threaded(rows * out);
  tbb::task_arena one(1), two(2);
  one.execute([&] { engine::matmul(x.data(), rows, in, w.data(), out, all.data()); });
  two.execute([&] { engine::matmul(x.data(), rows, in, w.data(), out, threaded.data()); });
  EXPECT_TRUE(same_bits(all, threaded));
  for (uint32_t r = 0; r < rows; r += 7) {
    std::vector<float> alone(out);
    engine::matmul(x.data() + r * in, 1, in, w.data(), out, alone.data());
    EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * out, out * sizeof(float))) << r;
    for (uint32_t c = 0; c < out; c += 31) {
      double ref = 0;
      for (uint32_t k = 0; k < in; ++k) ref += double{x[r * in + k]} * w[k * out + c];
      EXPECT_NEAR(alone[c], ref, 1e-4) << r << "," << c;
    }
  }
}

TEST(ReferenceOps, NormRopeSwigluArgmax) {
  std::vector<float> x = {3.0f, -4.0f};
  const std::vector<float> gain = {1.0f, 2.0f};
  engine::rms_norm(x.data(), 1, 2, gain.data(), 0.0f, x.data());
  EXPECT_NEAR(x[0], 3.0f / std::sqrt(12.5f), 1e-6);
  EXPECT_NEAR(x[1], -8.0f / std::sqrt(12.5f), 1e-6);

  // Rotation keeps each pair's length; position 0 is the identity.
  auto v = random_floats(2 * 32, 3);
  const auto orig = v;
  const uint64_t pos[2] = {0, 1234};
  engine::apply_rope(v.data(), 2, 1, 32, pos, 10000.0f);
  EXPECT_TRUE(std::equal(v.begin(), v.begin() + 32, orig.begin()));
  for (uint32_t i = 0; i < 16; ++i) {
    const float before = std::hypot(orig[32 + i], orig[32 + i + 16]);
    EXPECT_NEAR(std::hypot(v[32 + i], v[32 + i + 16]), before, 1e-5);
  }
  EXPECT_NE(v[32], orig[32]);

  const float gate[2] = {0.0f, 2.0f};
  const float up[2] = {5.0f, 3.0f};
  float o[2];
  engine::swiglu(gate, up, 2, o);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2.0f / (1.0f + std::exp(-2.0f)) * 3.0f, 1e-6);

  const float ties[5] = {1.0f, 7.0f, NAN, 7.0f, -2.0f};
  EXPECT_EQ(engine::argmax(ties, 5), 1u);
  const float nan_first[3] = {NAN, -1.0f, -3.0f};
  EXPECT_EQ(engine::argmax(nan_first, 3), 1u);
}

// A hand-made arena and layer table: the frames of one sequence, not in order, so a table that is
// read wrongly shows.
struct FrameSetup {
  explicit FrameSetup(uint32_t n = 24) : frames(n) {}
  Geometry g = ModelShape{}.geometry(Dtype::kBF16, kPageTokens);
  uint32_t frames;
  std::vector<uint8_t> arena = std::vector<uint8_t>(frames * g.page_bytes());
  HbmView view{arena.data(), g.page_bytes(), g.page_bytes(), frames, false};

  LayerTable table(uint64_t tokens) const {
    LayerTable t;
    const uint32_t pages = static_cast<uint32_t>((tokens + kPageTokens - 1) / kPageTokens);
    t.indptr = {0, static_cast<int32_t>(pages)};
    for (uint32_t p = 0; p < pages; ++p)
      t.indices.push_back(static_cast<int32_t>((p * 7 + 3) % frames));
    t.last_page_len = {static_cast<int32_t>(tokens - (pages - 1) * kPageTokens)};
    return t;
  }
};

// Naive causal attention over the stored (bf16-rounded) K/V, in double.
std::vector<float> naive_attention(const FrameSetup& f, const LayerTable& t, const float* q,
                                   uint64_t first, uint32_t rows) {
  const ModelShape m;
  const uint32_t group = m.qo_heads / m.kv_heads;
  const std::size_t tb = f.g.token_bytes();
  std::vector<float> out(rows * m.q_dim());
  for (uint32_t r = 0; r < rows; ++r) {
    const uint64_t pos = first + r;
    for (uint32_t h = 0; h < m.qo_heads; ++h) {
      const uint32_t kvh = h / group;
      std::vector<double> score(pos + 1);
      double mx = -1e300;
      for (uint64_t j = 0; j <= pos; ++j) {
        const uint8_t* page = f.arena.data() + t.indices[j / kPageTokens] * f.view.frame_stride;
        const uint8_t* k = page + (j % kPageTokens) * tb + kvh * m.head_dim * 2;
        double s = 0;
        for (uint32_t d = 0; d < m.head_dim; ++d) {
          s += double{q[(r * m.qo_heads + h) * m.head_dim + d]} *
               kernels::load_as_float(k, Dtype::kBF16, d);
        }
        score[j] = s / std::sqrt(static_cast<double>(m.head_dim));
        mx = std::max(mx, score[j]);
      }
      double sum = 0;
      std::vector<double> acc(m.head_dim);
      for (uint64_t j = 0; j <= pos; ++j) {
        const uint8_t* page = f.arena.data() + t.indices[j / kPageTokens] * f.view.frame_stride;
        const uint8_t* v = page + (kPageTokens + j % kPageTokens) * tb + kvh * m.head_dim * 2;
        const double p = std::exp(score[j] - mx);
        sum += p;
        for (uint32_t d = 0; d < m.head_dim; ++d)
          acc[d] += p * kernels::load_as_float(v, Dtype::kBF16, d);
      }
      for (uint32_t d = 0; d < m.head_dim; ++d) {
        out[(r * m.qo_heads + h) * m.head_dim + d] = static_cast<float>(acc[d] / sum);
      }
    }
  }
  return out;
}

TEST(ReferenceAttention, MatchesANaiveReferenceAndIgnoresChunkingAndThreads) {
  const ModelShape m;
  FrameSetup f;
  const uint64_t prompt = 70;  // four full pages and a partial one
  const auto k = random_floats((prompt + 1) * m.kv_dim(), 11);
  const auto v = random_floats((prompt + 1) * m.kv_dim(), 12);
  const auto q = random_floats((prompt + 1) * m.q_dim(), 13, 2.0f);
  auto att = PagedAttention::create(m, f.g, f.view);
  ASSERT_TRUE(att.ok()) << att.status().to_string();

  // The whole prompt in one step.
  const LayerTable t = f.table(prompt);
  const StepSlice whole{0, static_cast<uint32_t>(prompt), false};
  ASSERT_TRUE(att->write_kv(t, std::span(&whole, 1), k.data(), v.data()).ok());
  std::vector<float> one_chunk(prompt * m.q_dim());
  ASSERT_TRUE(att->attend(t, std::span(&whole, 1), q.data(), one_chunk.data()).ok());
  const auto expected = naive_attention(f, t, q.data(), 0, static_cast<uint32_t>(prompt));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(one_chunk[i], expected[i], 2e-5) << "element " << i;
  }

  // The same prompt in page-aligned chunks of other sizes, on one thread: the same bits.
  std::vector<float> chunked(prompt * m.q_dim());
  tbb::task_arena one(1);
  for (const auto& [first, n] : {std::pair<uint64_t, uint32_t>{0, 16}, {16, 32}, {48, 22}}) {
    const LayerTable tc = f.table(first + n);
    const StepSlice s{first, n, false};
    one.execute([&] {
      ASSERT_TRUE(att->attend(tc, std::span(&s, 1), q.data() + first * m.q_dim(),
                              chunked.data() + first * m.q_dim())
                      .ok());
    });
  }
  EXPECT_TRUE(same_bits(one_chunk, chunked));

  // A decode step after the prompt, alone and beside the prompt's chunk in one batch.
  const LayerTable td = f.table(prompt + 1);
  const StepSlice dec{prompt, 1, true};
  ASSERT_TRUE(att->write_kv(td, std::span(&dec, 1), k.data() + prompt * m.kv_dim(),
                            v.data() + prompt * m.kv_dim())
                  .ok());
  std::vector<float> decoded(m.q_dim());
  ASSERT_TRUE(
      att->attend(td, std::span(&dec, 1), q.data() + prompt * m.q_dim(), decoded.data()).ok());
  const auto ref = naive_attention(f, td, q.data() + prompt * m.q_dim(), prompt, 1);
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(decoded[i], ref[i], 2e-5);

  LayerTable both = f.table(prompt + 1);  // item 0: the decode; item 1: the last chunk again
  const LayerTable last = f.table(prompt);
  both.indices.insert(both.indices.end(), last.indices.begin(), last.indices.end());
  both.indptr.push_back(static_cast<int32_t>(both.indices.size()));
  both.last_page_len.push_back(last.last_page_len[0]);
  const StepSlice mixed[2] = {dec, {48, 22, false}};
  std::vector<float> qm(q.begin() + prompt * m.q_dim(), q.end());
  qm.insert(qm.end(), q.begin() + 48 * m.q_dim(), q.begin() + prompt * m.q_dim());
  std::vector<float> om(23 * m.q_dim());
  ASSERT_TRUE(att->attend(both, mixed, qm.data(), om.data()).ok());
  EXPECT_EQ(0, std::memcmp(om.data(), decoded.data(), m.q_dim() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(om.data() + m.q_dim(), one_chunk.data() + 48 * m.q_dim(),
                           22 * m.q_dim() * sizeof(float)));
}

TEST(ReferenceAttention, LongContextsGiveTheSameBitsAloneOrBatchedOnAnyThreadCount) {
  // The kernels' default split-K plan depends on the batch's total tokens and on the arena's
  // concurrency; the engine turns it off, so a long row keeps one summation order.
  const ModelShape m;
  FrameSetup f(160);
  const uint64_t len = 1100;  // 69 pages
  const auto k = random_floats(len * m.kv_dim(), 21);
  const auto v = random_floats(len * m.kv_dim(), 22);
  const auto q = random_floats(2 * m.q_dim(), 23, 2.0f);
  auto att = PagedAttention::create(m, f.g, f.view);
  ASSERT_TRUE(att.ok());
  const LayerTable t = f.table(len);
  const StepSlice prompt{0, static_cast<uint32_t>(len), false};
  ASSERT_TRUE(att->write_kv(t, std::span(&prompt, 1), k.data(), v.data()).ok());

  const StepSlice dec{len - 1, 1, true};
  std::vector<float> alone(m.q_dim()), wide(m.q_dim());
  tbb::task_arena one(1), eight(8);
  one.execute(
      [&] { ASSERT_TRUE(att->attend(t, std::span(&dec, 1), q.data(), alone.data()).ok()); });
  eight.execute(
      [&] { ASSERT_TRUE(att->attend(t, std::span(&dec, 1), q.data(), wide.data()).ok()); });
  EXPECT_TRUE(same_bits(alone, wide)) << "the thread count changed a decode row";

  // Beside a second long sequence (the same frames) in one batch.
  LayerTable two = t;
  two.indices.insert(two.indices.end(), t.indices.begin(), t.indices.end());
  two.indptr.push_back(static_cast<int32_t>(two.indices.size()));
  two.last_page_len.push_back(t.last_page_len[0]);
  const StepSlice decs[2] = {dec, {len - 1, 1, true}};
  std::vector<float> batched(2 * m.q_dim());
  one.execute([&] { ASSERT_TRUE(att->attend(two, decs, q.data(), batched.data()).ok()); });
  EXPECT_EQ(0, std::memcmp(batched.data(), alone.data(), m.q_dim() * sizeof(float)))
      << "the batch changed a decode row";
}

TEST(ReferenceAttention, RefusesTablesThatDoNotFit) {
  const ModelShape m;
  FrameSetup f;
  auto att = PagedAttention::create(m, f.g, f.view);
  ASSERT_TRUE(att.ok());
  const auto k = random_floats(40 * m.kv_dim(), 1);
  LayerTable t = f.table(20);  // two pages
  const StepSlice too_long{0, 40, false};
  EXPECT_EQ(att->write_kv(t, std::span(&too_long, 1), k.data(), k.data()).code(),
            StatusCode::kInternal);
  t.indices[1] = 999;
  const StepSlice fits{0, 20, false};
  const Status s = att->write_kv(t, std::span(&fits, 1), k.data(), k.data());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("frame 999"), std::string::npos) << s.message();
  const StepSlice two_decode{0, 2, true};
  std::vector<float> out(2 * m.q_dim());
  EXPECT_EQ(att->attend(f.table(2), std::span(&two_decode, 1), k.data(), out.data()).code(),
            StatusCode::kInvalidArgument);
  // fp8 KV (no scales in the view), another geometry, device memory.
  EXPECT_EQ(PagedAttention::create(m, m.geometry(Dtype::kFP8E4M3, 16), f.view).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttention::create(m, Geometry{}, f.view).status().code(),
            StatusCode::kInvalidArgument);
  HbmView device = f.view;
  device.on_device = true;
  EXPECT_EQ(PagedAttention::create(m, f.g, device).status().code(), StatusCode::kUnavailable);
}

// A runtime without NVMe, HBM for everything.
std::unique_ptr<Runtime> memory_runtime(const ScratchDir& dir, uint32_t hbm_frames = 2048) {
  TierSizes sizes;
  sizes.hbm_frames = hbm_frames;
  sizes.host_frames = 256;
  sizes.nvme_bytes = 0;
  return open_runtime(engine_config(dir.path(), sizes));
}

std::vector<Request> small_workload() {
  const auto shared = tokens(48, 77);
  return {{10, concat(shared, tokens(21, 1)), 24, 0},
          {11, concat(shared, tokens(40, 2)), 30, 0},
          {12, tokens(33, 3), 28, 2},
          {13, concat(shared, tokens(5, 4)), 20, 6}};
}

TEST(ReferenceEngineTest, SameOutputsWhateverTheBatchingChunkingAndThreads) {
  ScratchDir dir("engine-batching");
  std::vector<RequestOutput> first;
  struct Variant {
    uint32_t max_running, prefill_chunk, threads;
  };
  for (const Variant& v : {Variant{1, 16, 1}, Variant{4, 64, 2}, Variant{2, 32, 0}}) {
    auto rt = memory_runtime(dir);
    ASSERT_NE(rt, nullptr);
    EngineOptions o;
    o.max_running = v.max_running;
    o.prefill_chunk = v.prefill_chunk;
    o.threads = v.threads;
    const RunResult r = run_engine(*rt, small_workload(), o);
    ASSERT_EQ(r.outputs.size(), 4u);
    EXPECT_EQ(generated(r.outputs), 24u + 30 + 28 + 20);
    if (first.empty()) {
      first = r.outputs;
    } else {
      expect_identical(first, r.outputs, "max_running " + std::to_string(v.max_running));
    }
    EXPECT_EQ(rt->stats().open_sequences, 0u);
  }
}

TEST(ReferenceEngineTest, ACachedPrefixGivesTheSameOutputsAsComputingIt) {
  const auto shared = tokens(80, 5);
  const Request probe{1, concat(shared, tokens(9, 6)), 40, 0};
  const Request warmer{2, concat(shared, tokens(30, 7)), 5, 0};
  ScratchDir dir("engine-reuse");
  std::vector<RequestOutput> cold;
  {
    auto rt = memory_runtime(dir);
    ASSERT_NE(rt, nullptr);
    const RunResult r = run_engine(*rt, {probe});
    cold = r.outputs;
    EXPECT_EQ(r.engine.reused_tokens, 0u);
    EXPECT_EQ(r.engine.prefilled_tokens, probe.prompt.size());
  }
  auto rt = memory_runtime(dir);
  ASSERT_NE(rt, nullptr);
  const RunResult w = run_engine(*rt, {warmer});
  ASSERT_EQ(w.outputs.size(), 1u);
  const RunResult r = run_engine(*rt, {probe});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].reused_tokens, 80u);
  EXPECT_EQ(r.outputs[0].reused_by_tier[tier_index(Tier::kHbm)], 5u);
  EXPECT_EQ(r.outputs[0].prefilled_tokens, 9u);
  expect_identical(cold, r.outputs, "prefix from the cache vs. computed");
}

// Flips one bit of every HBM frame: whatever the engine reads next has changed under it.
void corrupt_every_hbm_frame(Runtime& rt) {
  const HbmView hbm = rt.hbm_view();
  auto* base = static_cast<uint8_t*>(hbm.base);
  for (uint32_t f = 0; f < hbm.frames; ++f) base[f * hbm.frame_stride + 3] ^= 0x10;
}

TEST(ReferenceEngineTest, AKvShadowCatchesRowsThatChangedUnderTheEngine) {
  const auto shared = tokens(80, 5);
  const Request warmer{2, concat(shared, tokens(30, 7)), 5, 0};
  const Request probe{1, concat(shared, tokens(9, 6)), 40, 0};
  EngineOptions o;
  ScratchDir dir("engine-shadow");
  auto rt = memory_runtime(dir);
  ASSERT_NE(rt, nullptr);
  o.kv_shadow = std::make_shared<KvShadow>(rt->geometry());

  // Unchanged frames pass: a prefix published by one engine is checked in the next one.
  run_engine(*rt, {warmer}, o);
  const RunResult r = run_engine(*rt, {probe}, o);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].reused_tokens, 80u);
  EXPECT_GT(o.kv_shadow->verified_rows(), 40u * ModelShape{}.layers);
  EXPECT_EQ(o.kv_shadow->learnt_blocks(), 0u);

  // The cached prefix changes in HBM: the first read of it names the block and its key.
  corrupt_every_hbm_frame(*rt);
  auto eng = ReferenceEngine::create(*rt, model(), o);
  ASSERT_TRUE(eng.ok());
  ASSERT_TRUE((*eng)->submit({3, concat(shared, tokens(12, 8)), 4, 0}).ok());
  Status s = (*eng)->step();
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.to_string();
  EXPECT_NE(s.to_string().find("layer 0 block 0"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("as published under key"), std::string::npos) << s.to_string();

  // A sequence's own rows change between two of its steps.
  auto own = ReferenceEngine::create(*rt, model(), o);
  ASSERT_TRUE(own.ok());
  ASSERT_TRUE((*own)->submit({4, tokens(40, 9), 8, 0}).ok());
  ASSERT_TRUE((*own)->step().ok());
  corrupt_every_hbm_frame(*rt);
  s = (*own)->step();
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.to_string();
  EXPECT_NE(s.to_string().find("as this sequence wrote them"), std::string::npos) << s.to_string();

  // A shadow for another geometry is refused.
  EngineOptions wrong;
  Geometry g = rt->geometry();
  g.page_tokens *= 2;
  wrong.kv_shadow = std::make_shared<KvShadow>(g);
  EXPECT_EQ(ReferenceEngine::create(*rt, model(), wrong).status().code(),
            StatusCode::kInvalidArgument);
}

// The shadow on its own, over a hand-made arena of four one-page frames: a key published a second
// time with other bytes (what a decode-computed block and a prefill of the same tokens give) is
// learnt from the next read by the sequence that published it second, and by later reusers.
TEST(KvShadowTest, AKeyPublishedTwiceWithOtherBytesIsLearntAgainNotReported) {
  const Geometry g{/*layers=*/1, /*kv_heads=*/1, /*head_dim=*/4, Dtype::kF32, /*page_tokens=*/4};
  std::vector<uint8_t> arena(4 * g.page_bytes());
  const HbmView hbm{arena.data(), g.page_bytes(), g.page_bytes(), 4, false};
  const auto fill = [&](int32_t frame, uint8_t value) {
    std::fill_n(arena.begin() + frame * g.page_bytes(), g.page_bytes(), value);
  };
  const auto table = [](std::vector<int32_t> frames, int32_t last) {
    return LayerTable{{0, static_cast<int32_t>(frames.size())}, std::move(frames), {last}};
  };
  const BlockKey key{42, 0x0001'0000'0000'0000ull};
  KvShadow shadow(g);
  const SequenceId first[] = {1}, second[] = {2}, third[] = {3};
  const StepSlice prefill[] = {{0, 4, false}};

  shadow.open(1, {});
  fill(0, 0xA1);
  shadow.record(hbm, table({0}, 4), first, prefill, 0);
  shadow.publish(1, 0, std::span(&key, 1));
  shadow.open(2, {});
  fill(1, 0xB2);
  shadow.record(hbm, table({1}, 4), second, prefill, 0);
  shadow.publish(2, 0, std::span(&key, 1));  // other bytes: the runtime keeps frame 0's copy

  // Sequence 2 decodes over the cached copy: learnt, then checked.
  const StepSlice decode[] = {{4, 1, true}};
  EXPECT_TRUE(shadow.verify(hbm, table({0, 2}, 1), second, decode, 0, false).ok());
  fill(0, 0xC3);
  Status s = shadow.verify(hbm, table({0, 2}, 1), second, decode, 0, false);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.to_string();
  EXPECT_NE(s.to_string().find("as this sequence wrote them"), std::string::npos) << s.to_string();

  // A later reuser of the ambiguous key learns it too.
  const uint64_t learnt = shadow.learnt_blocks();
  shadow.open(3, std::span(&key, 1));
  EXPECT_TRUE(shadow.verify(hbm, table({0, 3}, 1), third, decode, 0, false).ok());
  EXPECT_EQ(shadow.learnt_blocks(), learnt + 1);
  EXPECT_TRUE(shadow.verify(hbm, table({0, 3}, 1), third, decode, 0, false).ok());
  fill(0, 0xD4);
  EXPECT_EQ(shadow.verify(hbm, table({0, 3}, 1), third, decode, 0, false).code(),
            StatusCode::kInternal);
}

TEST(ReferenceEngineTest, OutputsDependOnTheEarliestContext) {
  // Attention really reads the early pages: one changed first token changes the last logits.
  auto prompt = tokens(150, 9);
  const Request a{1, prompt, 30, 0};
  prompt[0] = (prompt[0] + 1) % ModelShape{}.vocab;
  const Request b{2, prompt, 30, 0};
  ScratchDir dir("engine-context");
  auto rt = memory_runtime(dir);
  ASSERT_NE(rt, nullptr);
  const RunResult r = run_engine(*rt, {a, b});
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_NE(0, std::memcmp(r.outputs[0].final_logits.data(), r.outputs[1].final_logits.data(),
                           r.outputs[0].final_logits.size() * sizeof(float)));
}

TEST(ReferenceEngineTest, BadRequestsAndOptionsAreRefused) {
  ScratchDir dir("engine-bad");
  auto rt = memory_runtime(dir, /*hbm_frames=*/64);
  ASSERT_NE(rt, nullptr);
  EngineOptions o;
  o.prefill_chunk = 24;
  EXPECT_EQ(ReferenceEngine::create(*rt, model(), o).status().code(), StatusCode::kInvalidArgument);
  o = EngineOptions{};
  o.max_step_tokens = 8;
  EXPECT_EQ(ReferenceEngine::create(*rt, model(), o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReferenceEngine::create(*rt, nullptr).status().code(), StatusCode::kInvalidArgument);

  auto eng = ReferenceEngine::create(*rt, model());
  ASSERT_TRUE(eng.ok());
  ReferenceEngine& e = **eng;
  EXPECT_EQ(e.submit({1, {}, 4, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.submit({1, {1, 2, 512}, 4, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.submit({1, {1, 2, 3}, 0, 0}).code(), StatusCode::kInvalidArgument);
  // 64 frames hold 1024 tokens of one layer; 1000 + 100 - 1 do not fit.
  EXPECT_EQ(e.submit({1, tokens(1000, 1), 100, 0}).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(e.submit({1, tokens(20, 1), 3, 0}).ok());
  EXPECT_EQ(e.submit({1, tokens(20, 2), 3, 0}).code(), StatusCode::kInvalidArgument);
  // Still serves what was accepted.
  auto out = e.run_to_completion();
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].tokens.size(), 3u);
  EXPECT_EQ((*out)[0].final_logits.size(), ModelShape{}.vocab);

  // A runtime opened for another model.
  Config other = engine_config(dir.path(), TierSizes{64, 64, 0});
  other.model.geometry.head_dim = 64;
  auto rt2 = open_runtime(other);
  ASSERT_NE(rt2, nullptr);
  EXPECT_EQ(ReferenceEngine::create(*rt2, model()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::e2e

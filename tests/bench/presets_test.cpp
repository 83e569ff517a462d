// Presets and the roofline: the compiled-in presets load, bad files are refused with where and
// why, and iteration times follow the formulas of perf_model.hpp.
#include "bench/run/presets.hpp"

#include <gtest/gtest.h>

#include <string>

#include "bench/run/perf_model.hpp"
#include "run_test_util.hpp"

namespace kvtier::bench::run {
namespace {

TEST(Presets, EveryNamedPresetLoads) {
  for (const std::string& name : gpu_preset_names()) {
    auto g = load_gpu_preset(name);
    ASSERT_TRUE(g.ok()) << name << ": " << g.status().to_string();
    EXPECT_EQ(g->name, name);
    EXPECT_GT(g->hbm_bytes, g->reserved_bytes);
  }
  for (const std::string& name : model_preset_names()) {
    auto m = load_model_preset(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().to_string();
    EXPECT_EQ(m->name, name);
  }
}

TEST(Presets, DatasheetFigures) {
  const GpuPreset h200 = *load_gpu_preset("h200");
  EXPECT_EQ(h200.hbm_bytes, 141'000'000'000ull);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(h200.bf16_flops, 989.5e12);
  const GpuPreset h100 = *load_gpu_preset("h100");
  EXPECT_EQ(h100.hbm_bytes, 80'000'000'000ull);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3.35e12);
  const ModelPreset m8 = *load_model_preset("llama-3.1-8b");
  EXPECT_EQ(m8.kv_bytes_per_token(), 128u * 1024u);  // 2 x 32 x 8 x 128 x 2
  const ModelPreset m70 = *load_model_preset("llama-3.1-70b");
  EXPECT_EQ(m70.kv_bytes_per_token(), 320u * 1024u);
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  auto g = load_gpu_preset("h2000");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find("h200"), std::string::npos) << g.status().message();
}

TEST(Presets, UnknownKeyNamesLineColumnAndSuggestion) {
  std::string text(embedded_preset("llama-3.1-8b"));
  const auto at = text.find("  layers:");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "  lyers:");
  auto m = parse_model_preset(text, "x.yaml");
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find("x.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.lyers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean model.layers"), std::string::npos) << msg;
}

TEST(Presets, MissingKeyAndBadValuesAreRefused) {
  std::string text(embedded_preset("h200"));
  const auto at = text.find("  hbm_bandwidth:");
  const auto eol = text.find('\n', at);
  std::string missing = text;
  missing.erase(at, eol - at + 1);
  auto a = parse_gpu_preset(missing, "m.yaml");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("missing key gpu.hbm_bandwidth"), std::string::npos)
      << a.status().message();
  std::string bad = text;
  bad.replace(at, eol - at, "  hbm_bandwidth: fast");
  auto b = parse_gpu_preset(bad, "b.yaml");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a number"), std::string::npos) << b.status().message();
  std::string frac = text;
  const auto f = frac.find("  flops: 0.55");
  ASSERT_NE(f, std::string::npos);
  frac.replace(f, 13, "  flops: 1.5");
  EXPECT_FALSE(parse_gpu_preset(frac, "f.yaml").ok());
  EXPECT_FALSE(parse_gpu_preset("gpu: [1, 2", "broken.yaml").ok());
}

TEST(PerfModel, HbmForKvIsWhatWeightsAndReserveLeave) {
  const PerfModel m = testing::h200_8b();
  EXPECT_EQ(m.weight_bytes(), static_cast<uint64_t>(8.03e9 * 2));
  EXPECT_EQ(m.hbm_kv_bytes(), 141'000'000'000ull - m.weight_bytes() - 18'000'000'000ull);
  // 4 model layers per simulated layer: a simulated page holds 4 layers' K and V.
  EXPECT_EQ(m.sim_geometry().layers, 8u);
  EXPECT_EQ(m.sim_geometry().page_bytes(), 256ull * 4 * 2 * 8 * 128 * 2);
  EXPECT_EQ(m.sim_geometry().block_bytes(), 256ull * m.kv_bytes_per_token());
}

TEST(PerfModel, DecodeIsMemoryBoundAndPrefillComputeBound) {
  const PerfModel m = testing::h200_8b();
  const GpuPreset& g = m.gpu();
  IterationWork decode;
  decode.decode_tokens = 1;
  decode.decode_context = 1000;
  const double bytes = static_cast<double>(m.weight_bytes()) + 1001.0 * m.kv_bytes_per_token();
  const double expect =
      bytes / (g.hbm_bandwidth * g.hbm_efficiency) + g.iteration_overhead_us * 1e-6;
  EXPECT_NEAR(nanos_to_seconds(m.iteration_time(decode)), expect, 1e-6);

  IterationWork prefill;
  prefill.prefill_tokens = 8192;
  prefill.prefill_pairs = chunk_pairs(0, 8192);
  const double flops = 2 * 8.03e9 * 8192 + 4.0 * 32 * 32 * 128 * chunk_pairs(0, 8192);
  const double t = flops / (g.bf16_flops * g.flops_efficiency);
  EXPECT_NEAR(nanos_to_seconds(m.prefill_time(prefill)), t, 1e-6);
  EXPECT_NEAR(nanos_to_seconds(m.iteration_time(prefill)), t + g.iteration_overhead_us * 1e-6,
              1e-6);
  // Attention over a long context costs more than the same chunk at the start.
  IterationWork later = prefill;
  later.prefill_pairs = chunk_pairs(100000, 8192);
  later.prefill_context = 100000;
  EXPECT_GT(m.iteration_time(later), m.iteration_time(prefill));
  EXPECT_GT(m.prefill_tokens_per_s(), 10000.0);
  EXPECT_LT(m.prefill_tokens_per_s(), 100000.0);
}

TEST(PerfModel, RefusesAModelThatDoesNotFitAndAGroupThatDoesNotDivide) {
  GpuPreset g = *load_gpu_preset("h100");
  ModelPreset big = *load_model_preset("llama-3.1-70b");
  big.weight_bytes = 2;  // bf16 70B: 141 GB of weights on an 80 GB GPU
  EXPECT_FALSE(PerfModel::create(g, big).ok());
  ModelPreset m = *load_model_preset("llama-3.1-8b");
  g.layer_group = 3;
  auto r = PerfModel::create(g, m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer_group"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::bench::run

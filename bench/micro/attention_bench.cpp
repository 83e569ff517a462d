// Micro-benchmarks of the CPU kernels (Google Benchmark). Each kernel has a baseline beside it
// over the same bytes, so the report reads as ratios: decode attention vs a streaming read of the
// KV pages, gather/scatter vs one memcpy of the same size, fp8 quantization vs the gather.
// `kvtier-bench attn` is the end-to-end form of the attention comparison.
#include <benchmark/benchmark.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_params.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/frame_ops.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/numeric_formats.hpp"

namespace kvtier::kernels {
namespace {

// Llama-3-8B's KV geometry, one layer: 8 KV heads x 128, 32 query heads, 16-token pages.
constexpr uint32_t kKvHeads = 8;
constexpr uint32_t kQoHeads = 32;
constexpr uint32_t kHeadDim = 128;
constexpr uint32_t kPageTokens = 16;

struct Pages {
  PagedKv kv;
  std::vector<uint8_t> arena;
  std::vector<float> scales;
  std::vector<uint32_t> indptr, indices, last;

  Pages(Dtype dtype, uint32_t batch, uint32_t context) {
    kv = paged_kv_for(Geometry{1, kKvHeads, kHeadDim, dtype, kPageTokens});
    kv.frame_stride = (kv.page_bytes() + 4095) / 4096 * 4096;
    const uint32_t per_seq = (context + kPageTokens - 1) / kPageTokens;
    kv.num_frames = per_seq * batch;
    kv.batch = batch;
    arena.resize(static_cast<std::size_t>(kv.num_frames) * kv.frame_stride);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const std::size_t elems = kv.page_bytes() / dtype_size(dtype);
    for (uint32_t f = 0; f < kv.num_frames; ++f) {
      for (std::size_t i = 0; i < elems; i += 7) {  // sparse fill: timing does not need all values
        store_from_float(arena.data() + f * kv.frame_stride, dtype, i, dist(rng));
      }
    }
    indices.resize(kv.num_frames);
    std::iota(indices.begin(), indices.end(), 0u);
    std::shuffle(indices.begin(), indices.end(), rng);
    for (uint32_t b = 0; b <= batch; ++b) indptr.push_back(b * per_seq);
    last.assign(batch, context - (per_seq - 1) * kPageTokens);
    scales.assign(2 * kv.num_frames, 1.0f / 64);
    kv.arena = arena.data();
    kv.indptr = indptr.data();
    kv.indices = indices.data();
    kv.last_page_len = last.data();
    kv.scales = dtype == Dtype::kFP8E4M3 ? scales.data() : nullptr;
  }
  int64_t kv_bytes() const {
    return static_cast<int64_t>(2) * kv.batch * sequence_length(kv, 0) * kv.token_bytes();
  }
};

// Args: dtype, isa, batch, context.
void BM_DecodeAttention(benchmark::State& state) {
  const auto dtype = static_cast<Dtype>(state.range(0));
  cpu::CpuOptions options;
  options.isa = static_cast<cpu::Isa>(state.range(1));
  if (cpu::isa_kernels(options.isa) == nullptr) {
    state.SkipWithError("this CPU cannot run that ISA");
    return;
  }
  Pages pages(dtype, static_cast<uint32_t>(state.range(2)), static_cast<uint32_t>(state.range(3)));
  std::vector<float> q(pages.kv.batch * kQoHeads * kHeadDim, 0.01f), out(q.size());
  AttentionParams p;
  p.kv = pages.kv;
  p.num_qo_heads = kQoHeads;
  p.q = q.data();
  p.out = out.data();
  for (auto _ : state) {
    if (!cpu::decode_attention(p, options).ok()) {
      state.SkipWithError("decode_attention failed");
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * pages.kv_bytes());
  state.SetLabel(std::string(dtype_name(dtype)) + " " + cpu::isa_name(options.isa));
}

// The baseline of BM_DecodeAttention: the same frames read once with wide loads, same threads.
void BM_StreamReadPages(benchmark::State& state) {
  const auto dtype = static_cast<Dtype>(state.range(0));
  const cpu::IsaKernels* isa = cpu::isa_kernels(cpu::Isa::kAuto);
  Pages pages(dtype, static_cast<uint32_t>(state.range(2)), static_cast<uint32_t>(state.range(3)));
  const std::size_t bytes = pages.kv.page_bytes();
  std::vector<uint64_t> sums(pages.indices.size());
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, pages.indices.size(), 8),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          sums[i] = isa->stream_read(
                              pages.arena.data() +
                                  static_cast<uint64_t>(pages.indices[i]) * pages.kv.frame_stride,
                              bytes);
                        }
                      });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(pages.indices.size() * bytes));
  state.SetLabel("same frames, same threads");
}

void decode_args(benchmark::internal::Benchmark* b) {
  for (Dtype d : {Dtype::kBF16, Dtype::kFP8E4M3}) {
    b->Args({static_cast<int64_t>(d), static_cast<int64_t>(cpu::Isa::kAuto), 8, 4096});
  }
  b->Args({static_cast<int64_t>(Dtype::kBF16), static_cast<int64_t>(cpu::Isa::kAvx2), 8, 4096});
  b->Args({static_cast<int64_t>(Dtype::kBF16), static_cast<int64_t>(cpu::Isa::kScalar), 2, 1024});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_DecodeAttention)->Apply(decode_args);
BENCHMARK(BM_StreamReadPages)
    ->Args({static_cast<int64_t>(Dtype::kBF16), 0, 8, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Gather of scattered 64 KiB pages into staging, against one memcpy of the same total size.
void BM_GatherFrames(benchmark::State& state) {
  const uint32_t count = static_cast<uint32_t>(state.range(0));
  const uint64_t page = 64 * 1024;
  std::vector<uint8_t> arena(page * count * 2, 1), staging(page * count);
  std::vector<uint32_t> frames(count * 2);
  std::iota(frames.begin(), frames.end(), 0u);
  std::shuffle(frames.begin(), frames.end(), std::mt19937(3));
  frames.resize(count);
  FrameCopyParams p{arena.data(), page, count * 2, page, frames.data(), count, staging.data()};
  for (auto _ : state) {
    if (!cpu::gather_frames(p).ok()) state.SkipWithError("gather failed");
    benchmark::DoNotOptimize(staging.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(page * count));
}
BENCHMARK(BM_GatherFrames)->Arg(32)->Arg(512)->UseRealTime();

void BM_MemcpyBaseline(benchmark::State& state) {
  const uint64_t bytes = 64 * 1024 * static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> src(bytes, 1), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_MemcpyBaseline)->Arg(32)->Arg(512)->UseRealTime();

// `count` bf16 pages and their packed fp8 form with per-half scales, as the page codec moves them.
struct Fp8Frames {
  Fp8FramesParams p;
  std::vector<uint8_t> arena, staging;
  std::vector<uint32_t> frames;
  std::vector<float> scales;

  explicit Fp8Frames(uint32_t count) {
    p.dtype = Dtype::kBF16;
    p.page_tokens = kPageTokens;
    p.kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.frame_stride = p.wide_page_bytes();
    p.num_frames = count;
    arena.resize(p.frame_stride * count);
    for (std::size_t i = 0; i < arena.size() / 2; ++i) {
      store_from_float(arena.data(), Dtype::kBF16, i, static_cast<float>(i % 1000) * 1e-3f - 0.5f);
    }
    frames.resize(count);
    std::iota(frames.begin(), frames.end(), 0u);
    staging.resize(p.fp8_page_bytes() * count);
    scales.resize(2 * count);
    p.arena = arena.data();
    p.frames = frames.data();
    p.count = count;
    p.staging = staging.data();
    p.scales = scales.data();
  }
  int64_t wide_bytes() const { return static_cast<int64_t>(p.wide_page_bytes() * p.count); }
};

// bf16 pages -> packed fp8 with per-half scales (bytes counted on the wide side).
void BM_QuantizeFp8(benchmark::State& state) {
  Fp8Frames f(static_cast<uint32_t>(state.range(0)));
  for (auto _ : state) {
    if (!cpu::quantize_frames_fp8(f.p).ok()) state.SkipWithError("quantize failed");
    benchmark::DoNotOptimize(f.staging.data());
  }
  state.SetBytesProcessed(state.iterations() * f.wide_bytes());
}
BENCHMARK(BM_QuantizeFp8)->Arg(128)->UseRealTime();

// The way back: packed fp8 -> bf16 pages (bytes counted on the wide side).
void BM_DequantizeFp8(benchmark::State& state) {
  Fp8Frames f(static_cast<uint32_t>(state.range(0)));
  if (!cpu::quantize_frames_fp8(f.p).ok()) state.SkipWithError("quantize failed");
  for (auto _ : state) {
    if (!cpu::dequantize_frames_fp8(f.p).ok()) state.SkipWithError("dequantize failed");
    benchmark::DoNotOptimize(f.arena.data());
  }
  state.SetBytesProcessed(state.iterations() * f.wide_bytes());
}
BENCHMARK(BM_DequantizeFp8)->Arg(128)->UseRealTime();

}  // namespace
}  // namespace kvtier::kernels

BENCHMARK_MAIN();

// What the step contract costs the engine's thread when nothing has to move: decode steps of a
// batch whose KV is all resident in HBM, through the public Runtime (emulated HBM, so no GPU):
// begin_step, wait_layer and layer_table for every layer, end_step. This is time on the critical
// path of every step a serving engine takes, and it grows with the pages the batch reads
// (sequences x context / page_tokens x layers), so it is reported per page read.
//
// Beside it, in the same process, the baseline: the page table's own cost for the same pins, with
// no scheduler around it: block pins (PageTable::pin_blocks_ready + unpin_blocks over the same
// blocks, writing each block's frames, as a step that is not windowed pins them), and page pins
// (pin_layers + unpin_layers over the same pages, as page_table_bench measures them, what each
// page cost before block pins). The ratio to the first is what the scheduler adds: its
// bookkeeping, the loop hand-off and the block tables of every layer.
//
// Then the same contract when pages do move: a stream of prefills through an HBM too small to keep
// them (BM_PrefillStreamUnderPressure), where the watermark plans the engine's end_layer calls ask
// for run on the loop and their copies share the machine with it; reported as a distribution of
// step times. Once with no compute between the calls (the loop's work is then on the engine's
// path whoever runs it), once with the engine busy for each layer's compute, as it is in serving:
// what the scheduler leaves on the step is then the step's time beyond its compute. Each under
// write-back and under write-through (every completed block copied to host memory as its step
// ends, what `write_through` and `write_through_selective` configurations pay).
//
// And what one engine call onto the scheduler's loop costs by itself (begin_step, end_layer and
// end_step are each one): run_sync on an idle loop, which runs the call on the engine's thread,
// beside the baseline of handing it to the loop's own thread and waiting (two thread wake-ups).
//
// Geometry: 32 layers, 16-token pages (a serving engine's page size); the page's bytes do not
// matter (nothing is copied), so they are small. Arguments: sequences, context tokens each (and
// for the Runtime, 1 when the engine ends each layer as it is done, as a layer-pipelined engine
// does, instead of leaving it all to end_step).
// Run: build/bin/step_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/micro/page_table_setup.hpp"
#include "kvtier/kvtier.hpp"
#include "scheduler/asio_event_loop.hpp"
#include "scheduler/page_table.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {
namespace {

constexpr uint32_t kLayers = 32;
constexpr uint32_t kPageTokens = 16;

using bench_setup::die;
using bench_setup::must;

// HBM frames for a decode step of `sequences` x `context` tokens growing by `steps_ahead`: the
// pages it reads stay below 80 % of them, under the default watermarks (0.85 / 0.95). Above the
// high one the scheduler demotes cached pages, the batch's own among them between its steps, and
// the benchmark would measure that traffic instead of the step.
uint64_t frames_for(uint32_t sequences, uint32_t context, uint64_t steps_ahead) {
  const uint64_t blocks_each = (context + steps_ahead) / kPageTokens + 2;
  return (static_cast<uint64_t>(sequences) * blocks_each * 5 / 4 + 64) * kLayers;
}

// A runtime with `sequences` open sequences of `context` tokens each, prefilled and resident in
// HBM, and the batch that decodes one token of each.
struct DecodingBatch {
  std::filesystem::path dir;
  std::unique_ptr<Runtime> runtime;
  std::vector<StepItem> batch;

  DecodingBatch(uint32_t sequences, uint32_t context, uint64_t steps_ahead) {
    dir = std::filesystem::temp_directory_path() /
          ("kvtier-step-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    Config c;
    c.model.name = "step-bench";
    c.model.geometry =
        Geometry{kLayers, /*kv_heads=*/1, /*head_dim=*/64, Dtype::kBF16, kPageTokens};
    const uint64_t page_bytes = c.model.geometry.page_bytes();
    c.tiers.hbm.backend = HbmBackend::kEmulated;
    c.tiers.hbm.capacity_bytes = frames_for(sequences, context, steps_ahead) * page_bytes;
    c.tiers.host.capacity_bytes = 1024 * page_bytes;
    c.tiers.host.huge_pages = false;
    c.tiers.host.lock_memory = false;
    // NVMe holds every block of the batch: were it smaller, the blocks in use it could not take
    // would have to stay in memory, and the step would be windowed to leave them room.
    c.tiers.nvme.capacity_bytes = c.tiers.hbm.capacity_bytes;
    c.tiers.nvme.paths = {(dir / "store.kvs").string()};
    c.metrics.listen = "";
    RuntimeOptions options;
    options.persist_on_shutdown = false;
    auto rt = Runtime::open(c, options);
    if (!rt.ok()) die(rt.status(), "open the runtime");
    runtime = std::move(rt).value();
    // Distinct prompts, prefilled in one step each.
    for (uint32_t s = 0; s < sequences; ++s) {
      std::vector<uint32_t> tokens(context);
      for (uint32_t t = 0; t < context; ++t) tokens[t] = s * 1'000'003u + t;
      auto opened = runtime->open_sequence(runtime->block_keys(tokens));
      if (!opened.ok()) die(opened.status(), "open a sequence");
      const StepItem prefill{opened->id, context};
      step(std::span(&prefill, 1));
      batch.push_back(StepItem{opened->id, 1});
    }
  }
  ~DecodingBatch() {
    runtime.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // One step: begin, every layer waited for and its block table read (and, for an engine that
  // pipelines layers, ended as soon as it is done), end.
  void step(std::span<const StepItem> items, bool end_each_layer = false) {
    auto info = runtime->begin_step(items);
    if (!info.ok()) die(info.status(), "begin_step");
    for (uint32_t l = 0; l < info->layers; ++l) {
      must(runtime->wait_layer(info->id, l), "wait_layer");
      auto table = runtime->layer_table(info->id, l);
      if (!table.ok()) die(table.status(), "layer_table");
      benchmark::DoNotOptimize(table->indices.data());
      if (end_each_layer) must(runtime->end_layer(info->id, l), "end_layer");
    }
    must(runtime->end_step(info->id), "end_step");
  }
};

void BM_DecodeStepResident(benchmark::State& state) {
  const auto sequences = static_cast<uint32_t>(state.range(0));
  const auto context = static_cast<uint32_t>(state.range(1));
  const bool end_each_layer = state.range(2) != 0;
  // Room for the tokens the benchmark's fixed number of steps decodes (kDecodeSteps).
  constexpr uint64_t kStepsAhead = 256;
  DecodingBatch d(sequences, context, kStepsAhead);
  uint64_t pages = 0;
  uint64_t steps = 0;
  for (auto _ : state) {
    if (steps == kStepsAhead) {
      state.SkipWithError("more steps than the batch has room for");
      break;
    }
    d.step(d.batch, end_each_layer);
    ++steps;
    pages += static_cast<uint64_t>(sequences) *
             ((context + steps + kPageTokens - 1) / kPageTokens) * kLayers;
  }
  state.SetItemsProcessed(static_cast<int64_t>(pages));
  state.counters["pages_per_step"] =
      benchmark::Counter(static_cast<double>(pages) / static_cast<double>(steps));
  state.SetLabel(end_each_layer ? "pages read per second, through the Runtime, end_layer each"
                                : "pages read per second, through the Runtime");
}
// A fixed number of steps, so that the batch's room is known up front (each step adds a token).
constexpr int kDecodeSteps = 200;
BENCHMARK(BM_DecodeStepResident)
    ->Iterations(kDecodeSteps)
    ->Args({8, 1024, 0})
    ->Args({8, 1024, 1})
    ->Args({32, 4096, 0})
    ->Args({32, 4096, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// CPU time of the calling thread, or of the whole process, in microseconds.
double cpu_micros(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}
double thread_cpu_micros() { return cpu_micros(CLOCK_THREAD_CPUTIME_ID); }
double process_cpu_micros() { return cpu_micros(CLOCK_PROCESS_CPUTIME_ID); }

// Prefill steps of distinct prompts, one after another, each sequence closed after its step, with
// HBM holding `hbm_prompts` prompts and host memory twice that (no NVMe): once the cached blocks
// pass HBM's high watermark, the watermark plans end_layer asks for demote older prompts to
// host memory, whose own plans drop its oldest. The engine ends each layer as it is done, after
// computing it for `layer_compute_us` (a sleep: the engine's thread waits for the GPU). Each
// step is timed on its own: the median, p99 and longest step, and per step the wall time in
// begin_step, wait_layer and end_layer and the engine thread's CPU time in end_layer, show where
// the engine's thread waits and what runs on it — the mean alone hides a few long steps; with
// compute, `beyond_compute_us` is the mean step less the time measured in the sleeps;
// `process_cpu_us` is the CPU time of every thread per step (loop, copy engines, engine). With
// `write_through` set, each step's completed blocks are copied to host memory as the step ends,
// and HBM's plans drop pages that host memory already holds. Emulated HBM: the copies are memcpy
// on the copy engine's threads, which share this machine's cores.
void BM_PrefillStreamUnderPressure(benchmark::State& state) {
  const auto prompt = static_cast<uint32_t>(state.range(0));
  const auto hbm_prompts = static_cast<uint32_t>(state.range(1));
  const auto layer_compute = std::chrono::microseconds(state.range(2));
  const bool write_through = state.range(3) != 0;
  Config c;
  c.model.name = "step-bench-stream";
  c.model.geometry = Geometry{kLayers, /*kv_heads=*/1, /*head_dim=*/64, Dtype::kBF16, kPageTokens};
  const uint64_t prompt_pages = static_cast<uint64_t>(prompt / kPageTokens + 1) * kLayers;
  c.tiers.hbm.backend = HbmBackend::kEmulated;
  c.tiers.hbm.capacity_bytes = hbm_prompts * prompt_pages * c.model.geometry.page_bytes();
  // Small enough to be reused within the run: first touches of fresh host pages (the kernel
  // zeroing them) would otherwise dominate the steps that demote into them.
  c.tiers.host.capacity_bytes = 2 * c.tiers.hbm.capacity_bytes;
  c.tiers.host.huge_pages = false;
  c.tiers.host.lock_memory = false;
  c.tiers.nvme.enabled = false;
  c.policies.write = write_through ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack;
  c.metrics.listen = "";
  auto rt = Runtime::open(c, RuntimeOptions{});
  if (!rt.ok()) die(rt.status(), "open the runtime");
  Runtime& runtime = **rt;
  using Clock = std::chrono::steady_clock;
  const auto micros = [](Clock::time_point since) {
    return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
  };
  std::vector<double> step_us;
  double begin_us = 0;
  double wait_us = 0;
  double end_layer_us = 0;
  double end_layer_cpu_us = 0;
  double compute_us = 0;
  std::vector<uint32_t> tokens(prompt);
  const double process_cpu_start = process_cpu_micros();
  for (auto _ : state) {
    const auto n = static_cast<uint32_t>(step_us.size());
    for (uint32_t t = 0; t < prompt; ++t) tokens[t] = n * 1'000'003u + t;
    auto opened = runtime.open_sequence(runtime.block_keys(tokens));
    if (!opened.ok()) die(opened.status(), "open a sequence");
    const StepItem prefill{opened->id, prompt};
    const Clock::time_point start = Clock::now();
    auto info = runtime.begin_step(std::span(&prefill, 1));
    if (!info.ok()) die(info.status(), "begin_step");
    begin_us += micros(start);
    for (uint32_t l = 0; l < info->layers; ++l) {
      const Clock::time_point waited = Clock::now();
      must(runtime.wait_layer(info->id, l), "wait_layer");
      wait_us += micros(waited);
      auto table = runtime.layer_table(info->id, l);
      if (!table.ok()) die(table.status(), "layer_table");
      benchmark::DoNotOptimize(table->indices.data());
      if (layer_compute.count() > 0) {
        const Clock::time_point computing = Clock::now();
        std::this_thread::sleep_for(layer_compute);
        compute_us += micros(computing);
      }
      const Clock::time_point ended = Clock::now();
      const double cpu_before = thread_cpu_micros();
      must(runtime.end_layer(info->id, l), "end_layer");
      end_layer_cpu_us += thread_cpu_micros() - cpu_before;
      end_layer_us += micros(ended);
    }
    must(runtime.end_step(info->id), "end_step");
    step_us.push_back(micros(start));
    must(runtime.close_sequence(opened->id), "close_sequence");
  }
  const double process_cpu_us = process_cpu_micros() - process_cpu_start;
  const auto steps = static_cast<double>(step_us.size());
  std::sort(step_us.begin(), step_us.end());
  const auto at = [&](double q) { return step_us[static_cast<std::size_t>(q * (steps - 1))]; };
  state.counters["p50_us"] = at(0.5);
  state.counters["p99_us"] = at(0.99);
  state.counters["max_us"] = step_us.back();
  state.counters["begin_step_us"] = begin_us / steps;
  state.counters["wait_layer_us"] = wait_us / steps;
  state.counters["end_layer_us"] = end_layer_us / steps;
  state.counters["end_layer_cpu_us"] = end_layer_cpu_us / steps;
  state.counters["process_cpu_us"] = process_cpu_us / steps;
  if (layer_compute.count() > 0) {
    double total_us = 0;
    for (double us : step_us) total_us += us;
    state.counters["beyond_compute_us"] = (total_us - compute_us) / steps;
  }
  state.SetLabel(write_through ? "per step, through the Runtime, end_layer each, write_through"
                               : "per step, through the Runtime, end_layer each");
}
// 600 prompts of 1024 tokens through an HBM of 32: about 19 turnovers of HBM, 9 of host memory.
// Without compute, and with 250 us per layer (8 ms per prompt: a 1024-token prefill of a small
// model on one GPU); write-back, and write-through.
BENCHMARK(BM_PrefillStreamUnderPressure)
    ->Iterations(600)
    ->Args({1024, 32, 0, 0})
    ->Args({1024, 32, 250, 0})
    ->Args({1024, 32, 0, 1})
    ->Args({1024, 32, 250, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_DecodeStepBaselinePageTablePins(benchmark::State& state) {
  // The same blocks pinned and unpinned in a bare page table: the floor under the step.
  const auto sequences = static_cast<uint32_t>(state.range(0));
  const auto context = static_cast<uint32_t>(state.range(1));
  const bool block_pins = state.range(2) != 0;
  const uint32_t blocks_each = context / kPageTokens;
  auto hbm = FrameAllocator::create(static_cast<uint32_t>(frames_for(sequences, context, 0)));
  if (!hbm.ok()) die(hbm.status(), "hbm allocator");
  PageTableOptions options;
  options.layers = kLayers;
  options.expected_blocks = static_cast<uint64_t>(sequences) * blocks_each;
  auto t = PageTable::create(options, TierAllocators{hbm->get(), nullptr, nullptr});
  if (!t.ok()) die(t.status(), "page table");
  PageTable& table = **t;
  std::vector<std::vector<BlockKey>> chains;
  for (uint32_t s = 0; s < sequences; ++s) {
    chains.push_back(bench_setup::make_chain("step-bench-" + std::to_string(s), blocks_each));
    BlockKey parent;
    for (const BlockKey& key : chains.back()) {
      must(table.create_block(key, parent), "create_block");
      must(bench_setup::fill_hbm(table, key), "fill");
      parent = key;
    }
  }
  std::vector<uint32_t> frames(static_cast<std::size_t>(blocks_each) * kLayers);
  std::vector<uint8_t> pinned(blocks_each);
  std::vector<PageTable::PinnedEntries> where(chains.size());
  uint64_t pages = 0;
  for (auto _ : state) {
    for (std::size_t c = 0; c < chains.size(); ++c) {
      if (block_pins) {
        auto n = table.pin_blocks_ready(chains[c], frames, pinned, &where[c]);
        if (!n.ok()) die(n.status(), "pin_blocks_ready");
        if (*n != blocks_each) die(internal_error("a block was not resident"), "pin_blocks_ready");
      } else {
        must(table.pin_layers(chains[c], 0, kLayers, frames), "pin_layers");
      }
    }
    for (std::size_t c = 0; c < chains.size(); ++c) {
      must(block_pins ? table.unpin_blocks(where[c]) : table.unpin_layers(chains[c], 0, kLayers),
           "unpin");
    }
    pages += static_cast<uint64_t>(sequences) * blocks_each * kLayers;
  }
  state.SetItemsProcessed(static_cast<int64_t>(pages));
  state.SetLabel(block_pins ? "baseline: the page table's block pins alone"
                            : "baseline: the page table's page pins alone");
}
BENCHMARK(BM_DecodeStepBaselinePageTablePins)
    ->Args({8, 1024, 1})
    ->Args({8, 1024, 0})
    ->Args({32, 4096, 1})
    ->Args({32, 4096, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_LoopCall(benchmark::State& state) {
  const bool hand_off = state.range(0) != 0;
  auto loop = AsioEventLoop::create();
  if (!loop.ok()) die(loop.status(), "event loop");
  uint64_t calls = 0;
  auto call = [&calls] {
    ++calls;
    return ok_status();
  };
  for (auto _ : state) {
    must(hand_off ? (*loop)->run_on_loop_thread(call, kNanosPerSecond)
                  : (*loop)->run_sync(call, kNanosPerSecond),
         "loop call");
  }
  state.SetItemsProcessed(static_cast<int64_t>(calls));
  state.SetLabel(hand_off ? "baseline: handed to the loop's thread"
                          : "run_sync on an idle loop (the caller's thread)");
}
BENCHMARK(BM_LoopCall)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();

// Micro-benchmarks of the page table and the frame allocator, each beside a plain baseline run in
// the same process (figures are read as ratios; absolute numbers depend on the machine):
//   - match over 8k-block chains (block lookups/s), disjoint chains per thread and one hot chain
//     shared by all threads; baseline: std::unordered_map lookups with no lock at all;
//   - pin + unpin of one page, pin_layer/unpin_layer over an 8k-block chain, and pin_layers of
//     all 32 layers of it (pages/s);
//   - frame allocate + free pairs (pairs/s); baseline: a std::mutex-guarded free vector;
//   - the table's own memory per cached block at 32 layers, at 1e5 and 1e6 blocks (counters
//     table_bytes_per_block from the table's accounting, heap_bytes_per_block from malloc's).
// Run: build/bin/page_table_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "bench/micro/page_table_setup.hpp"
#include "kvtier/block_key.hpp"
#include "scheduler/page_table.hpp"
#include "tiers/extent_allocator.hpp"
#include "tiers/frame_allocator.hpp"

namespace kvtier {
namespace {

constexpr uint32_t kLayers = 32;
constexpr uint32_t kChainBlocks = 8192;
constexpr int kMaxThreads = 2;

using bench_setup::die;
using bench_setup::fill_hbm;
using bench_setup::make_chain;
using bench_setup::must;

// A table whose chains are cached with every page ready in HBM.
struct CachedChains {
  std::unique_ptr<FrameAllocator> hbm;
  std::unique_ptr<FrameAllocator> host;
  std::unique_ptr<PageTable> table;
  std::vector<std::vector<BlockKey>> chains;

  CachedChains(int n_chains, uint32_t blocks) {
    auto h = FrameAllocator::create(static_cast<uint32_t>(n_chains) * blocks * kLayers);
    if (!h.ok()) die(h.status(), "hbm allocator");
    hbm = std::move(h).value();
    auto o = FrameAllocator::create(1024);
    if (!o.ok()) die(o.status(), "host allocator");
    host = std::move(o).value();
    PageTableOptions options;
    options.layers = kLayers;
    options.expected_blocks = static_cast<uint64_t>(n_chains) * blocks;
    auto t = PageTable::create(options, TierAllocators{hbm.get(), host.get(), nullptr});
    if (!t.ok()) die(t.status(), "page table");
    table = std::move(t).value();
    for (int c = 0; c < n_chains; ++c) {
      chains.push_back(make_chain("bench-" + std::to_string(c), blocks));
      BlockKey parent;
      for (const BlockKey& k : chains.back()) {
        must(table->create_block(k, parent), "create_block");
        must(fill_hbm(*table, k), "fill");
        parent = k;
      }
    }
  }
};

CachedChains& shared_chains() {
  static CachedChains chains(kMaxThreads + 1, kChainBlocks);
  return chains;
}

// ---- match ----

void BM_MatchChain8k(benchmark::State& state) {
  CachedChains& c = shared_chains();
  const std::vector<BlockKey>& chain = c.chains[static_cast<std::size_t>(state.thread_index())];
  for (auto _ : state) {
    const MatchResult m = c.table->match(chain);
    if (m.blocks != chain.size()) state.SkipWithError("chain not fully cached");
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(chain.size()));
  state.SetLabel("disjoint chains");
}
BENCHMARK(BM_MatchChain8k)->Threads(1)->Threads(2)->UseRealTime();

void BM_MatchChain8kSharedPrefix(benchmark::State& state) {
  CachedChains& c = shared_chains();
  const std::vector<BlockKey>& chain = c.chains[kMaxThreads];
  for (auto _ : state) {
    const MatchResult m = c.table->match(chain);
    benchmark::DoNotOptimize(m);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(chain.size()));
  state.SetLabel("one chain, all threads");
}
BENCHMARK(BM_MatchChain8kSharedPrefix)->Threads(1)->Threads(2)->UseRealTime();

void BM_MatchBaselineUnorderedMap(benchmark::State& state) {
  // What a lock-free, statistics-free lookup of the same keys costs: the floor for match().
  static const auto* index = [] {
    auto* m = new std::unordered_map<BlockKey, uint32_t, BlockKeyHash>();
    for (const auto& chain : shared_chains().chains) {
      for (const BlockKey& k : chain) m->emplace(k, static_cast<uint32_t>(m->size()));
    }
    return m;
  }();
  const std::vector<BlockKey>& chain =
      shared_chains().chains[static_cast<std::size_t>(state.thread_index())];
  for (auto _ : state) {
    uint32_t n = 0;
    for (const BlockKey& k : chain) {
      if (index->find(k) == index->end()) break;
      ++n;
    }
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(chain.size()));
  state.SetLabel("baseline");
}
BENCHMARK(BM_MatchBaselineUnorderedMap)->Threads(1)->Threads(2)->UseRealTime();

// ---- pins ----

void BM_PinUnpin(benchmark::State& state) {
  CachedChains& c = shared_chains();
  const std::vector<BlockKey>& chain = c.chains[static_cast<std::size_t>(state.thread_index())];
  std::size_t i = 0;
  for (auto _ : state) {
    const BlockKey& k = chain[i++ & (kChainBlocks - 1)];
    Result<uint32_t> f = c.table->pin(k, 7);
    if (!f.ok()) state.SkipWithError("pin failed");
    Status s = c.table->unpin(k, 7);
    if (!s.ok()) state.SkipWithError("unpin failed");
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PinUnpin)->Threads(1)->Threads(2)->UseRealTime();

void BM_PinLayer8k(benchmark::State& state) {
  CachedChains& c = shared_chains();
  const std::vector<BlockKey>& chain = c.chains[static_cast<std::size_t>(state.thread_index())];
  std::vector<uint32_t> frames(chain.size());
  uint32_t layer = 0;
  for (auto _ : state) {
    layer = (layer + 1) % kLayers;
    Status p = c.table->pin_layer(chain, layer, frames);
    if (!p.ok()) state.SkipWithError("pin_layer failed");
    Status u = c.table->unpin_layer(chain, layer);
    if (!u.ok()) state.SkipWithError("unpin_layer failed");
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(chain.size()));
  state.SetLabel("pages pinned+unpinned");
}
BENCHMARK(BM_PinLayer8k)->Threads(1)->Threads(2)->UseRealTime();

void BM_PinAllLayers8k(benchmark::State& state) {
  // Every layer of every block at once (a step whose pages all fit in HBM).
  CachedChains& c = shared_chains();
  const std::vector<BlockKey>& chain = c.chains[static_cast<std::size_t>(state.thread_index())];
  std::vector<uint32_t> frames(chain.size() * kLayers);
  for (auto _ : state) {
    Status p = c.table->pin_layers(chain, 0, kLayers, frames);
    if (!p.ok()) state.SkipWithError("pin_layers failed");
    Status u = c.table->unpin_layers(chain, 0, kLayers);
    if (!u.ok()) state.SkipWithError("unpin_layers failed");
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(frames.size()));
  state.SetLabel("pages pinned+unpinned");
}
BENCHMARK(BM_PinAllLayers8k)->Threads(1)->Threads(2)->UseRealTime();

// ---- frame allocator ----

constexpr uint32_t kFrames = 1u << 20;

void BM_FrameAllocFree(benchmark::State& state) {
  static FrameAllocator* alloc = [] {
    auto a = FrameAllocator::create(kFrames);
    if (!a.ok()) die(a.status(), "frame allocator");
    return std::move(a).value().release();
  }();
  for (auto _ : state) {
    Result<uint32_t> f = alloc->allocate();
    if (!f.ok()) state.SkipWithError("allocate failed");
    benchmark::DoNotOptimize(*f);
    Status s = alloc->free(*f);
    if (!s.ok()) state.SkipWithError("free failed");
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("alloc+free pairs");
}
BENCHMARK(BM_FrameAllocFree)->Threads(1)->Threads(2)->UseRealTime();

void BM_FrameAllocFreeBatch64(benchmark::State& state) {
  // 64 allocations, then 64 frees: the stack goes deep instead of reusing its top frame.
  static FrameAllocator* alloc = [] {
    auto a = FrameAllocator::create(kFrames);
    if (!a.ok()) die(a.status(), "frame allocator");
    return std::move(a).value().release();
  }();
  uint32_t held[64];
  for (auto _ : state) {
    for (uint32_t& h : held) {
      Result<uint32_t> f = alloc->allocate();
      if (!f.ok()) state.SkipWithError("allocate failed");
      h = *f;
    }
    for (uint32_t h : held) {
      Status s = alloc->free(h);
      if (!s.ok()) state.SkipWithError("free failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * 64);
  state.SetLabel("alloc+free pairs");
}
BENCHMARK(BM_FrameAllocFreeBatch64)->Threads(1)->Threads(2)->UseRealTime();

void BM_FrameAllocFreeBaselineMutexVector(benchmark::State& state) {
  struct Baseline {
    std::mutex mu;
    std::vector<uint32_t> free;
  };
  static Baseline* b = [] {
    auto* p = new Baseline;
    for (uint32_t i = kFrames; i-- > 0;) p->free.push_back(i);
    return p;
  }();
  for (auto _ : state) {
    uint32_t f;
    {
      std::lock_guard<std::mutex> lock(b->mu);
      f = b->free.back();
      b->free.pop_back();
    }
    benchmark::DoNotOptimize(f);
    {
      std::lock_guard<std::mutex> lock(b->mu);
      b->free.push_back(f);
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("baseline");
}
BENCHMARK(BM_FrameAllocFreeBaselineMutexVector)->Threads(1)->Threads(2)->UseRealTime();

// ---- memory ----

void BM_MemoryPerCachedBlock(benchmark::State& state) {
  const auto blocks = static_cast<uint32_t>(state.range(0));
  for (auto _ : state) {
    auto h = FrameAllocator::create(blocks * kLayers);
    if (!h.ok()) die(h.status(), "hbm allocator");
    std::unique_ptr<FrameAllocator> hbm = std::move(h).value();
    malloc_trim(0);
    // In-use heap: small blocks from the arena plus large ones malloc maps on their own.
    const auto heap_in_use = [] {
      const struct mallinfo2 mi = mallinfo2();
      return mi.uordblks + mi.hblkhd;
    };
    const std::size_t heap_before = heap_in_use();
    PageTableOptions options;
    options.layers = kLayers;
    auto t = PageTable::create(options, TierAllocators{hbm.get(), nullptr, nullptr});
    if (!t.ok()) die(t.status(), "page table");
    std::unique_ptr<PageTable> table = std::move(t).value();
    const std::vector<BlockKey> keys = make_chain("memory", blocks);
    const std::size_t keys_bytes = keys.capacity() * sizeof(BlockKey);
    BlockKey parent;
    for (const BlockKey& k : keys) {
      must(table->create_block(k, parent), "create_block");
      must(fill_hbm(*table, k), "fill");
      parent = k;
    }
    const MatchResult m = table->match(keys, MatchOptions{.record_hits = false});
    if (m.blocks != blocks) state.SkipWithError("not every block is cached");
    const std::size_t heap_after = heap_in_use();
    state.counters["table_bytes_per_block"] = static_cast<double>(table->memory_bytes()) / blocks;
    state.counters["heap_bytes_per_block"] =
        static_cast<double>(heap_after - heap_before - keys_bytes) / blocks;
    state.counters["kv_bytes_per_block"] = static_cast<double>(Geometry{}.block_bytes());
  }
}
BENCHMARK(BM_MemoryPerCachedBlock)
    ->Arg(100000)
    ->Arg(1000000)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();

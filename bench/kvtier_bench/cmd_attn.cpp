// `kvtier-bench attn`: paged attention throughput, as bytes of KV read per second, against a plain
// streaming read of the same bytes on the same device, measured side by side in one run.
//
// CPU (default): decode attention over `batch` sequences of `context` tokens of one layer (the
// configuration's geometry, pages scattered over the arena in random order), against a SIMD sum
// over the same frames with the same oneTBB threads; runs alternate (A B A B ...) and the best
// round of each is reported, so machine noise hits both alike. Prefill: chunks of new tokens
// against the same kind of cache; it is compute bound, so its ratio is far below 1 and it also
// reports query tokens and GFLOP per second. CUDA (--device cuda): the same decode with the split-K
// kernel, against cudaMemcpy device-to-device of the same bytes (a copy also writes them, so a
// ratio above 1 is possible). --access-order adds the decode kernel's reads without its
// arithmetic, in its order and in address order (ordered_read), to tell what the order costs.
// Progress goes to stderr; the result to stdout (a table, or --json).
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <memory>
#include <new>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/kvtier_bench/command.hpp"
#include "kernels/attention_params.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/numeric_formats.hpp"
#if defined(KVTIER_HAVE_CUDA)
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_support.hpp"
#endif

namespace kvtier::bench {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct AttnOptions {
  bool json = false;
  std::string device = "cpu";
  std::string dtype;  // empty: the configuration's
  uint64_t batch = 32;
  uint64_t context = 4096;
  uint64_t qo_heads = 0;  // 0: 4 per KV head (Llama-3-8B's 32 over 8)
  uint64_t threads = 0;   // 0: every core
  uint64_t iters = 9;
  uint64_t prefill_batch = 4;
  uint64_t prefill_chunk = 256;
  bool skip_prefill = false;
  bool access_order = false;
};

// The fastest of the measured rounds: on a shared machine the slow rounds measure the neighbours,
// and both sides of a comparison get the same treatment.
double best(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Anonymous memory on 2 MiB pages where the kernel grants them, as the host pool allocates its
// frames (transparent huge pages, madvise mode); both the kernel and the baseline read it.
class HostArena {
 public:
  explicit HostArena(std::size_t bytes) {
    bytes_ = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes_, MADV_HUGEPAGE);  // a hint: 4 KiB pages if refused
    data_ = static_cast<uint8_t*>(p);
  }
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena() { munmap(data_, bytes_); }
  uint8_t* data() const { return data_; }

 private:
  static constexpr std::size_t kHuge = 2u << 20;
  uint8_t* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// One layer of paged KV for `batch` sequences of `context` tokens, frames in random order.
struct HostPages {
  kernels::PagedKv kv;
  HostArena arena;
  std::vector<float> scales;
  std::vector<uint32_t> indptr, indices, last_page_len;
  uint64_t kv_bytes = 0;  // K and V of every token, exactly what attention must read

  static uint64_t stride_for(const Geometry& g) {
    return (kernels::paged_kv_for(g).page_bytes() + 4095) / 4096 *
           4096;  // the host pool's rounding
  }

  HostPages(const Geometry& g, uint64_t batch, uint64_t context, uint32_t seed)
      : arena(stride_for(g) * batch * ((context + g.page_tokens - 1) / g.page_tokens)) {
    kv = kernels::paged_kv_for(g);
    kv.frame_stride = stride_for(g);
    const uint64_t pages_per_seq = (context + g.page_tokens - 1) / g.page_tokens;
    const uint64_t frames = pages_per_seq * batch;
    kv.num_frames = static_cast<uint32_t>(frames);
    kv.batch = static_cast<uint32_t>(batch);
    std::vector<uint32_t> perm(frames);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    indptr.push_back(0);
    for (uint64_t b = 0; b < batch; ++b) {
      indptr.push_back(static_cast<uint32_t>((b + 1) * pages_per_seq));
      last_page_len.push_back(static_cast<uint32_t>(context - (pages_per_seq - 1) * g.page_tokens));
    }
    indices = perm;
    scales.assign(2 * frames, 1.0f / 64.0f);
    const std::size_t elems = kv.page_bytes() / dtype_size(g.dtype);
    tbb::parallel_for(tbb::blocked_range<uint64_t>(0, frames), [&](const auto& r) {
      for (uint64_t f = r.begin(); f != r.end(); ++f) {
        uint32_t x = static_cast<uint32_t>(f * 2654435761u + 1);
        uint8_t* page = arena.data() + f * kv.frame_stride;
        for (std::size_t i = 0; i < elems; ++i) {
          x ^= x << 13;
          x ^= x >> 17;
          x ^= x << 5;
          const float v = static_cast<float>(static_cast<int32_t>(x)) * 0x1p-31f;  // [-1, 1)
          kernels::store_from_float(page, g.dtype, i, g.dtype == Dtype::kFP8E4M3 ? v * 64 : v);
        }
      }
    });
    kv.arena = arena.data();
    kv.scales = g.dtype == Dtype::kFP8E4M3 ? scales.data() : nullptr;
    kv.indptr = indptr.data();
    kv.indices = indices.data();
    kv.last_page_len = last_page_len.data();
    kv_bytes = 2 * batch * context * kv.token_bytes();
  }
};

struct SectionResult {
  double kv_bytes = 0;
  double kv_seconds = 0;
  double base_bytes = 0;
  double base_seconds = 0;
  double q_tokens = 0;
  double flops = 0;
  double kv_rate() const { return kv_bytes / kv_seconds; }
  double base_rate() const { return base_bytes / base_seconds; }
};

struct Report {
  std::string device;
  std::string isa;
  int threads = 0;
  Geometry geometry;
  uint32_t qo_heads = 0;
  AttnOptions options;
  SectionResult decode;
  SectionResult prefill;
  bool has_prefill = false;
  // --access-order: seconds of the decode kernel's reads without its arithmetic (ordered_read),
  // best of the same rounds, indexed by ReadOrder.
  bool has_order = false;
  double order_seconds[4] = {};
};

// Attention FLOPs: QK^T and PV, 2 per multiply-add, over the KV tokens each query row sees.
double attention_flops(uint64_t q_rows_tokens_visible, uint32_t qo_heads, uint32_t head_dim) {
  return 4.0 * static_cast<double>(q_rows_tokens_visible) * qo_heads * head_dim;
}

// The streaming baseline: every page of the table, read once with wide loads, in parallel.
double stream_pages(const kernels::cpu::IsaKernels& isa, const HostPages& pages,
                    std::atomic<uint64_t>& sink) {
  const double t0 = now_seconds();
  const std::size_t page_bytes = pages.kv.page_bytes() / 64 * 64;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, pages.indices.size(), 8), [&](const auto& r) {
        uint64_t acc = 0;
        for (std::size_t i = r.begin(); i != r.end(); ++i) {
          acc += isa.stream_read(
              pages.arena.data() + static_cast<uint64_t>(pages.indices[i]) * pages.kv.frame_stride,
              page_bytes);
        }
        sink.fetch_add(acc, std::memory_order_relaxed);
      });
  return now_seconds() - t0;
}

// How a decode kernel walks memory, without its arithmetic: the same items (a sequence cut into
// splits of the kernel's default 1024 tokens), on the same threads, tile by tile. kHead: within a
// tile head by head, the 16 K rows of a head then its 16 V rows (the kernel's order until it
// scored K in address order); kHeadPrefetch adds that kernel's prefetching (the next (tile, head)
// step's rows, one row's lines after each row read); kGrouped: 4 tokens at a time, every head of
// them, K then V (the order the kernel now scores K in); kAddress: token row by token row. Every
// row read with the same wide loads as the streaming read, in rows of one head.
enum class ReadOrder { kHead, kHeadPrefetch, kGrouped, kAddress };

inline void prefetch_row(const uint8_t* row, std::size_t bytes) {
  for (std::size_t off = 0; off < bytes; off += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(row[off]));
#else
    __builtin_prefetch(row + off, 0, 3);
#endif
  }
}

// One decode item's walk (see ordered_read), each row handed to `sum.add_row(row, bytes)`.
struct ItemWalk {
  const kernels::PagedKv* kv;
  std::size_t head_bytes;
  std::size_t token_bytes;
  std::size_t v_offset;
  uint32_t split;
  uint32_t splits_per_seq;
};

template <class Sum>
inline void walk_item(const ItemWalk& w, std::size_t item, ReadOrder order, Sum& sum) {
  constexpr uint32_t kTile = kernels::cpu::kTileTokens;
  const kernels::PagedKv& kv = *w.kv;
  const uint32_t heads = kv.kv_heads;
  const uint32_t seq = static_cast<uint32_t>(item / w.splits_per_seq);
  const uint32_t len = kernels::sequence_length(kv, seq);
  const uint32_t begin = static_cast<uint32_t>(item % w.splits_per_seq) * w.split;
  const uint32_t end = std::min(len, begin + w.split);
  const uint32_t* frames = kv.indices + kv.indptr[seq];
  // Token rows (K; V is v_offset further) of this tile and the next, as the kernel's locate_tile
  // keeps them.
  const uint8_t* rows[2][kTile];
  auto locate = [&](uint32_t tile, const uint8_t** out) {
    const uint32_t tokens = tile < end ? std::min(kTile, end - tile) : 0;
    for (uint32_t j = 0; j < tokens; ++j) {
      const uint32_t pos = tile + j;
      const uint32_t page = pos / kv.page_tokens;
      out[j] = kv.arena + static_cast<uint64_t>(frames[page]) * kv.frame_stride +
               (pos - page * kv.page_tokens) * w.token_bytes;
    }
    return tokens;
  };
  const std::size_t hb = w.head_bytes;
  int cur = 0;
  uint32_t tokens = locate(begin, rows[cur]);
  for (uint32_t tile = begin; tile < end; tile += kTile, cur ^= 1) {
    const uint32_t next_tokens = locate(tile + kTile, rows[cur ^ 1]);
    const uint8_t* const* row = rows[cur];
    if (order == ReadOrder::kAddress || order == ReadOrder::kGrouped) {
      const uint32_t group = order == ReadOrder::kAddress ? 1 : 4;
      for (std::size_t part = 0; part < 2 * w.v_offset; part += w.v_offset) {
        for (uint32_t j0 = 0; j0 < tokens; j0 += group) {
          const uint32_t j1 = std::min(tokens, j0 + group);
          for (uint32_t h = 0; h < heads; ++h) {
            for (uint32_t j = j0; j < j1; ++j) sum.add_row(row[j] + part + h * hb, hb);
          }
        }
      }
    } else {
      const bool pf = order == ReadOrder::kHeadPrefetch;
      for (uint32_t h = 0; h < heads; ++h) {
        // The next step: this tile's next head, or the next tile's first head.
        const bool last_head = h + 1 == heads;
        const uint8_t* const* next_row = last_head ? rows[cur ^ 1] : row;
        const uint32_t next_count = last_head ? next_tokens : tokens;
        const std::size_t next_head = last_head ? 0 : (h + 1) * hb;
        for (std::size_t part = 0; part < 2 * w.v_offset; part += w.v_offset) {
          for (uint32_t j = 0; j < tokens; ++j) {
            sum.add_row(row[j] + part + h * hb, hb);
            if (pf && j < next_count) prefetch_row(next_row[j] + part + next_head, hb);
          }
        }
      }
    }
    tokens = next_tokens;
  }
}

// Rows through the ISA table's streaming read: a call and a reduction per row, which costs about
// what a row takes to arrive, so this is used only where AVX-512 is missing.
struct CallSum {
  const kernels::cpu::IsaKernels* isa;
  uint64_t s = 0;
  void add_row(const uint8_t* p, std::size_t bytes) { s += isa->stream_read(p, bytes); }
};

uint64_t read_item_generic(const kernels::cpu::IsaKernels& isa, const ItemWalk& w, std::size_t item,
                           ReadOrder order) {
  CallSum sum{&isa};
  walk_item(w, item, order, sum);
  return sum.s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KVTIER_BENCH_AVX512 1
// The streaming read's loop (four 64-byte lanes of integer adds) inlined into the walk, so the
// only difference from the streaming read is the order. The walk is flattened into the
// AVX-512 function (this file is built for plain x86-64; the CPU is checked before the call),
// and it all has internal linkage, so no AVX-512 code can be lent to other callers.
struct Avx512Sum {
  __m512i s0, s1, s2, s3;
  __attribute__((target("avx512f"))) void add_row(const uint8_t* p, std::size_t bytes) {
    const auto* v = reinterpret_cast<const __m512i*>(p);
    for (std::size_t i = 0; i + 4 <= bytes / 64; i += 4) {
      s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(v + i));
      s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(v + i + 1));
      s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(v + i + 2));
      s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(v + i + 3));
    }
  }
};

__attribute__((target("avx512f"), flatten)) uint64_t read_item_avx512(const ItemWalk& w,
                                                                      std::size_t item,
                                                                      ReadOrder order) {
  Avx512Sum sum;
  sum.s0 = sum.s1 = sum.s2 = sum.s3 = _mm512_setzero_si512();
  walk_item(w, item, order, sum);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(
      lanes, _mm512_add_epi64(_mm512_add_epi64(sum.s0, sum.s1), _mm512_add_epi64(sum.s2, sum.s3)));
  uint64_t total = 0;
  for (uint64_t x : lanes) total += x;
  return total;
}
#endif

double ordered_read(const kernels::cpu::IsaKernels& isa, const HostPages& pages, ReadOrder order,
                    std::atomic<uint64_t>& sink) {
  ItemWalk w{};
  w.kv = &pages.kv;
  w.head_bytes = static_cast<std::size_t>(pages.kv.head_dim) * dtype_size(pages.kv.dtype);
  w.token_bytes = w.head_bytes * pages.kv.kv_heads;
  w.v_offset = w.token_bytes * pages.kv.page_tokens;
  w.split = 1024;  // attention.cpp's default split of a sequence into items
  // Every sequence has one length here.
  w.splits_per_seq = (kernels::sequence_length(pages.kv, 0) + w.split - 1) / w.split;
#if defined(KVTIER_BENCH_AVX512)
  const bool avx512 = __builtin_cpu_supports("avx512f") && w.head_bytes % 256 == 0;
#else
  const bool avx512 = false;
#endif
  const double t0 = now_seconds();
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, std::size_t{pages.kv.batch} * w.splits_per_seq, 1),
      [&](const auto& r) {
        uint64_t acc = 0;
        for (std::size_t item = r.begin(); item != r.end(); ++item) {
#if defined(KVTIER_BENCH_AVX512)
          if (avx512) {
            acc += read_item_avx512(w, item, order);
            continue;
          }
#endif
          acc += read_item_generic(isa, w, item, order);
        }
        sink.fetch_add(acc, std::memory_order_relaxed);
      });
  return now_seconds() - t0;
}

Status run_cpu(const Geometry& g, uint32_t qo_heads, const AttnOptions& o, std::ostream& err,
               Report& report) {
  const kernels::cpu::IsaKernels* isa = kernels::cpu::isa_kernels(kernels::cpu::Isa::kAuto);
  report.isa = isa->name;
  const int threads =
      o.threads != 0 ? static_cast<int>(o.threads) : tbb::this_task_arena::max_concurrency();
  report.threads = threads;
  tbb::task_arena arena(threads);
  Status status;
  arena.execute([&] {
    std::atomic<uint64_t> sink{0};
    // Decode.
    err << "kvtier-bench attn: building " << o.batch << " x " << o.context << " tokens of "
        << dtype_name(g.dtype) << " KV (" << std::fixed << std::setprecision(0)
        << 2.0 * o.batch * o.context * g.token_bytes() / (1 << 20) << " MiB)\n";
    HostPages pages(g, o.batch, o.context, 1);
    std::vector<float> q(o.batch * qo_heads * g.head_dim, 0.01f), out(q.size());
    kernels::AttentionParams p;
    p.kv = pages.kv;
    p.num_qo_heads = qo_heads;
    p.q = q.data();
    p.out = out.data();
    std::vector<double> t_attn, t_stream, t_order[4];
    for (uint64_t i = 0; i <= o.iters; ++i) {  // the first round warms up and is dropped
      const double t0 = now_seconds();
      status = kernels::cpu::decode_attention(p);
      const double t1 = now_seconds();
      if (!status.ok()) return;
      const double ts = stream_pages(*isa, pages, sink);
      if (i > 0) {
        t_attn.push_back(t1 - t0);
        t_stream.push_back(ts);
      }
      if (!o.access_order) continue;
      for (int k = 0; k < 4; ++k) {
        const double tk = ordered_read(*isa, pages, static_cast<ReadOrder>(k), sink);
        if (i > 0) t_order[k].push_back(tk);
      }
    }
    report.has_order = o.access_order;
    for (int k = 0; k < 4; ++k) report.order_seconds[k] = best(t_order[k]);
    report.decode.kv_bytes = static_cast<double>(pages.kv_bytes);
    report.decode.kv_seconds = best(t_attn);
    report.decode.base_bytes =
        static_cast<double>(pages.indices.size()) * (pages.kv.page_bytes() / 64 * 64);
    report.decode.base_seconds = best(t_stream);
    report.decode.q_tokens = static_cast<double>(o.batch);
    report.decode.flops = attention_flops(o.batch * o.context, qo_heads, g.head_dim);
    err << "kvtier-bench attn: decode " << report.decode.kv_seconds * 1e3 << " ms, stream "
        << report.decode.base_seconds * 1e3 << " ms (best of " << o.iters << ")\n";
    if (o.skip_prefill) return;

    // Prefill: a chunk of new tokens at the end of each sequence, causal.
    const uint64_t chunk = std::min(o.prefill_chunk, o.context);
    HostPages ppages(g, o.prefill_batch, o.context, 2);
    std::vector<uint32_t> q_indptr(o.prefill_batch + 1);
    for (uint64_t b = 0; b <= o.prefill_batch; ++b) q_indptr[b] = static_cast<uint32_t>(b * chunk);
    std::vector<float> pq(o.prefill_batch * chunk * qo_heads * g.head_dim, 0.01f), pout(pq.size());
    kernels::AttentionParams pp;
    pp.kv = ppages.kv;
    pp.num_qo_heads = qo_heads;
    pp.q_indptr = q_indptr.data();
    pp.q = pq.data();
    pp.out = pout.data();
    std::vector<double> t_pre, t_pstream;
    const uint64_t iters = std::max<uint64_t>(1, o.iters / 2);
    for (uint64_t i = 0; i <= iters; ++i) {
      const double t0 = now_seconds();
      status = kernels::cpu::prefill_attention(pp);
      const double t1 = now_seconds();
      if (!status.ok()) return;
      const double ts = stream_pages(*isa, ppages, sink);
      if (i > 0) {
        t_pre.push_back(t1 - t0);
        t_pstream.push_back(ts);
      }
    }
    report.has_prefill = true;
    report.prefill.kv_bytes = static_cast<double>(ppages.kv_bytes);
    report.prefill.kv_seconds = best(t_pre);
    report.prefill.base_bytes =
        static_cast<double>(ppages.indices.size()) * (ppages.kv.page_bytes() / 64 * 64);
    report.prefill.base_seconds = best(t_pstream);
    report.prefill.q_tokens = static_cast<double>(o.prefill_batch * chunk);
    // Query token i of the chunk sees context - chunk + i + 1 tokens.
    const uint64_t visible =
        o.prefill_batch * (chunk * (o.context - chunk) + chunk * (chunk + 1) / 2);
    report.prefill.flops = attention_flops(visible, qo_heads, g.head_dim);
    err << "kvtier-bench attn: prefill " << report.prefill.kv_seconds * 1e3 << " ms (sink "
        << (sink.load() & 1) << ")\n";
  });
  return status;
}

#if defined(KVTIER_HAVE_CUDA)
Status run_cuda(const Geometry& g, uint32_t qo_heads, const AttnOptions& o, std::ostream& err,
                Report& report) {
  namespace kc = kernels::cuda;
  KVTIER_RETURN_IF_ERROR(kc::gpu_available());
  report.isa = "cuda";
  KVTIER_ASSIGN_OR_RETURN(kc::CudaStream stream, kc::CudaStream::create());
  KVTIER_ASSIGN_OR_RETURN(int sms, kc::multiprocessor_count());
  KVTIER_ASSIGN_OR_RETURN(kc::CudaEvent start, kc::CudaEvent::create());
  KVTIER_ASSIGN_OR_RETURN(kc::CudaEvent stop, kc::CudaEvent::create());
  report.threads = sms;

  // Host-side table (values do not matter to the timing; the arena is filled on the device).
  kernels::PagedKv kv = kernels::paged_kv_for(g);
  kv.frame_stride = (kv.page_bytes() + 511) / 512 * 512;
  const uint64_t pages_per_seq = (o.context + g.page_tokens - 1) / g.page_tokens;
  const uint64_t frames = pages_per_seq * o.batch;
  std::vector<uint32_t> indptr, indices(frames), last;
  std::iota(indices.begin(), indices.end(), 0u);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(1));
  indptr.push_back(0);
  for (uint64_t b = 0; b < o.batch; ++b) {
    indptr.push_back(static_cast<uint32_t>((b + 1) * pages_per_seq));
    last.push_back(static_cast<uint32_t>(o.context - (pages_per_seq - 1) * g.page_tokens));
  }
  const uint64_t arena_bytes = frames * kv.frame_stride;
  const uint64_t kv_bytes = 2 * o.batch * o.context * kv.token_bytes();
  err << "kvtier-bench attn: " << arena_bytes / (1 << 20) << " MiB of " << dtype_name(g.dtype)
      << " KV on the device, " << sms << " SMs\n";
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_arena, kc::DeviceBuffer::allocate(arena_bytes));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_copy, kc::DeviceBuffer::allocate(kv_bytes));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_indptr, kc::DeviceBuffer::allocate(4 * indptr.size()));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_indices,
                          kc::DeviceBuffer::allocate(4 * indices.size()));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_last, kc::DeviceBuffer::allocate(4 * last.size()));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_scales, kc::DeviceBuffer::allocate(8 * frames));
  const std::size_t q_elems = o.batch * qo_heads * g.head_dim;
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_q, kc::DeviceBuffer::allocate(4 * q_elems));
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer d_out, kc::DeviceBuffer::allocate(4 * q_elems));
  // 0x3C bytes: bf16/f16 values near 0.01 or 1, fp8 1.5, scales 0.011: finite everywhere.
  KVTIER_RETURN_IF_ERROR(kc::cuda_status(
      cudaMemsetAsync(d_arena.get(), 0x3C, arena_bytes, stream.get()), "fill arena"));
  KVTIER_RETURN_IF_ERROR(
      kc::cuda_status(cudaMemsetAsync(d_q.get(), 0x3C, 4 * q_elems, stream.get()), "fill q"));
  KVTIER_RETURN_IF_ERROR(kc::cuda_status(
      cudaMemsetAsync(d_scales.get(), 0x3C, 8 * frames, stream.get()), "fill scales"));
  KVTIER_RETURN_IF_ERROR(
      kc::copy_to_device(d_indptr.get(), indptr.data(), 4 * indptr.size(), stream.get()));
  KVTIER_RETURN_IF_ERROR(
      kc::copy_to_device(d_indices.get(), indices.data(), 4 * indices.size(), stream.get()));
  KVTIER_RETURN_IF_ERROR(
      kc::copy_to_device(d_last.get(), last.data(), 4 * last.size(), stream.get()));

  kernels::AttentionParams p;
  p.kv = kv;
  p.kv.arena = d_arena.as<uint8_t>();
  p.kv.num_frames = static_cast<uint32_t>(frames);
  p.kv.batch = static_cast<uint32_t>(o.batch);
  p.kv.indptr = d_indptr.as<uint32_t>();
  p.kv.indices = d_indices.as<uint32_t>();
  p.kv.last_page_len = d_last.as<uint32_t>();
  p.kv.scales = d_scales.as<float>();
  p.num_qo_heads = qo_heads;
  p.q = d_q.as<float>();
  p.out = d_out.as<float>();
  const uint32_t splits =
      kc::choose_decode_splits(p.kv.batch, g.kv_heads, sms, static_cast<uint32_t>(o.context));
  const std::size_t ws_bytes = kc::decode_workspace_bytes(p.kv.batch, qo_heads, g.head_dim, splits);
  KVTIER_ASSIGN_OR_RETURN(kc::DeviceBuffer ws, kc::DeviceBuffer::allocate(ws_bytes));

  std::vector<double> t_attn, t_copy;
  for (uint64_t i = 0; i <= o.iters; ++i) {
    KVTIER_RETURN_IF_ERROR(start.record(stream.get()));
    const cudaError_t e = kc::launch_decode_attention(p, splits, ws.get(), ws_bytes, stream.get());
    if (e != cudaSuccess) {
      return kc::cuda_status(e, "decode launch " + kc::last_launch_error());
    }
    KVTIER_RETURN_IF_ERROR(stop.record(stream.get()));
    KVTIER_ASSIGN_OR_RETURN(float ms_attn, stop.elapsed_ms_since(start));
    KVTIER_RETURN_IF_ERROR(start.record(stream.get()));
    KVTIER_RETURN_IF_ERROR(kc::cuda_status(cudaMemcpyAsync(d_copy.get(), d_arena.get(), kv_bytes,
                                                           cudaMemcpyDeviceToDevice, stream.get()),
                                           "copy baseline"));
    KVTIER_RETURN_IF_ERROR(stop.record(stream.get()));
    KVTIER_ASSIGN_OR_RETURN(float ms_copy, stop.elapsed_ms_since(start));
    if (i > 0) {
      t_attn.push_back(ms_attn * 1e-3);
      t_copy.push_back(ms_copy * 1e-3);
    }
  }
  report.decode.kv_bytes = static_cast<double>(kv_bytes);
  report.decode.kv_seconds = best(t_attn);
  report.decode.base_bytes = static_cast<double>(kv_bytes);
  report.decode.base_seconds = best(t_copy);
  report.decode.q_tokens = static_cast<double>(o.batch);
  report.decode.flops = attention_flops(o.batch * o.context, qo_heads, g.head_dim);
  err << "kvtier-bench attn: decode " << report.decode.kv_seconds * 1e3 << " ms with " << splits
      << " splits, copy " << report.decode.base_seconds * 1e3 << " ms\n";
  return ok_status();
}
#endif

std::string number(double v) {
  std::ostringstream s;
  s << std::setprecision(6) << v;
  return s.str();
}

void print_json(const Report& r, std::ostream& out) {
  const bool cuda = r.device == "cuda";
  const char* base_key = cuda ? "copy" : "stream";
  auto section = [&](const SectionResult& s, bool prefill) {
    std::ostringstream o;
    // CPU figures in GiB/s (2^30), as the baseline; GPU figures in GB/s (1e9), as vendors quote.
    const double unit = cuda ? 1e9 : kGiB;
    const char* suffix = cuda ? "_gb_s" : "_gib_s";
    o << "{\"kv" << suffix << "\": " << number(s.kv_rate() / unit) << ", \"" << base_key << suffix
      << "\": " << number(s.base_rate() / unit)
      << ", \"ratio\": " << number(s.kv_rate() / s.base_rate())
      << ", \"ms\": " << number(s.kv_seconds * 1e3) << ", \"kv_bytes\": " << number(s.kv_bytes);
    if (prefill) {
      o << ", \"q_tokens_per_s\": " << number(s.q_tokens / s.kv_seconds)
        << ", \"gflop_s\": " << number(s.flops / s.kv_seconds / 1e9);
    }
    o << "}";
    return o.str();
  };
  out << "{\"device\": \"" << r.device << "\", \"isa\": \"" << r.isa
      << "\", \"threads\": " << r.threads
      << ", \"geometry\": {\"kv_heads\": " << r.geometry.kv_heads
      << ", \"qo_heads\": " << r.qo_heads << ", \"head_dim\": " << r.geometry.head_dim
      << ", \"dtype\": \"" << dtype_name(r.geometry.dtype)
      << "\", \"page_tokens\": " << r.geometry.page_tokens << "}, \"batch\": " << r.options.batch
      << ", \"context\": " << r.options.context << ", \"decode\": " << section(r.decode, false);
  if (r.has_order) {
    const char* keys[4] = {"head_order", "head_order_prefetch", "grouped_order", "address_order"};
    out << ", \"access_order\": {";
    for (int k = 0; k < 4; ++k) {
      out << (k > 0 ? ", " : "") << "\"" << keys[k]
          << "\": {\"read_gib_s\": " << number(r.decode.kv_bytes / r.order_seconds[k] / kGiB)
          << ", \"ratio\": "
          << number(r.decode.kv_bytes / r.order_seconds[k] / r.decode.base_rate()) << "}";
    }
    out << "}";
  }
  if (r.has_prefill) {
    out << ", \"prefill\": " << section(r.prefill, true)
        << ", \"prefill_batch\": " << r.options.prefill_batch
        << ", \"prefill_chunk\": " << std::min(r.options.prefill_chunk, r.options.context);
  }
  out << "}\n";
}

void print_table(const Report& r, std::ostream& out) {
  const bool cuda = r.device == "cuda";
  const double unit = cuda ? 1e9 : kGiB;
  const char* u = cuda ? "GB/s" : "GiB/s";
  out << "kvtier-bench attn: " << r.device << " (" << r.isa << ", " << r.threads
      << (cuda ? " SMs" : " threads") << "), KV " << dtype_name(r.geometry.dtype) << ", "
      << r.geometry.kv_heads << " KV heads x " << r.geometry.head_dim << ", " << r.qo_heads
      << " query heads, " << r.geometry.page_tokens << "-token pages\n\n";
  out << std::left << std::setw(10) << "phase" << std::right << std::setw(14) << "shape"
      << std::setw(12) << "ms" << std::setw(14) << (std::string("KV ") + u) << std::setw(16)
      << (std::string(cuda ? "copy " : "stream ") + u) << std::setw(9) << "ratio"
      << "\n";
  auto row = [&](const char* name, const SectionResult& s, const std::string& shape) {
    out << std::left << std::setw(10) << name << std::right << std::setw(14) << shape
        << std::setw(12) << std::fixed << std::setprecision(2) << s.kv_seconds * 1e3
        << std::setw(14) << s.kv_rate() / unit << std::setw(16) << s.base_rate() / unit
        << std::setw(9) << std::setprecision(3) << s.kv_rate() / s.base_rate() << "\n";
  };
  row("decode", r.decode,
      std::to_string(r.options.batch) + "x" + std::to_string(r.options.context));
  if (r.has_order) {
    const char* names[4] = {"read-head", "read-hpf", "read-grp4", "read-addr"};
    for (int k = 0; k < 4; ++k) {
      SectionResult s = r.decode;
      s.kv_seconds = r.order_seconds[k];
      row(names[k], s, "same bytes");
    }
    out << "\nread-*: the decode reads alone, no arithmetic. read-head: per tile, per head, K rows "
           "then V rows;\nread-hpf: the same, prefetching the next (tile, head) one step ahead; "
           "read-grp4: 4 tokens at a\ntime, every head of them (K then V); read-addr: token row "
           "by token row\n";
  }
  if (r.has_prefill) {
    row("prefill", r.prefill,
        std::to_string(r.options.prefill_batch) + "x" +
            std::to_string(std::min(r.options.prefill_chunk, r.options.context)) + "/" +
            std::to_string(r.options.context));
    out << "\nprefill: " << std::setprecision(0) << r.prefill.q_tokens / r.prefill.kv_seconds
        << " query tokens/s, " << std::setprecision(1)
        << r.prefill.flops / r.prefill.kv_seconds / 1e9
        << " GFLOP/s (compute bound: its ratio is not expected near 1)\n";
  }
}

class AttnCommand final : public Command {
 public:
  std::string_view name() const override { return "attn"; }
  std::string_view summary() const override {
    return "paged attention throughput (KV bytes/s) against a streaming read of the same bytes";
  }
  std::string_view description() const override {
    return "Decode attention over a batch of long sequences of one layer (the configuration's\n"
           "model geometry, pages scattered in the arena), and chunked prefill, measured side by\n"
           "side with a plain read of the same bytes on the same threads (CPU) or a device copy\n"
           "of them (--device cuda). Prints the KV bytes read per second, the baseline and their\n"
           "ratio; --json prints {\"decode\": {...}, \"prefill\": {...}}.";
  }
  void add_options(OptionParser& p) override {
    p.add_flag("json", "print JSON instead of a table", &o_.json);
    p.add_string("device", "cpu|cuda", "where attention runs (default cpu)", &o_.device);
    p.add_string("dtype", "NAME", "KV dtype f32|f16|bf16|fp8_e4m3 (default: the model's)",
                 &o_.dtype);
    p.add_uint("batch", "N", "decode sequences (default 32)", &o_.batch);
    p.add_uint("context", "TOKENS", "tokens per sequence (default 4096)", &o_.context);
    p.add_uint("qo-heads", "N", "query heads (default 4 per KV head)", &o_.qo_heads);
    p.add_uint("threads", "N", "CPU threads (default: all cores)", &o_.threads);
    p.add_uint("iters", "N", "measured rounds, after one warm-up (default 9)", &o_.iters);
    p.add_uint("prefill-batch", "N", "prefill sequences (default 4)", &o_.prefill_batch);
    p.add_uint("prefill-chunk", "TOKENS", "new tokens per prefill sequence (default 256)",
               &o_.prefill_chunk);
    p.add_flag("no-prefill", "measure decode only", &o_.skip_prefill);
    p.add_flag("access-order",
               "CPU: also time the decode kernel's reads alone, in its order (with and without its "
               "prefetches) and in address order",
               &o_.access_order);
  }

  int run(const CommandContext& ctx) override {
    Geometry g = ctx.config.model.geometry;
    if (!o_.dtype.empty()) {
      const auto d = parse_dtype(o_.dtype);
      if (!d) {
        ctx.err << "kvtier-bench attn: --dtype " << o_.dtype
                << " is not one of f32, f16, bf16, fp8_e4m3\n";
        return kExitUsage;
      }
      g.dtype = *d;
    }
    if (o_.batch == 0 || o_.context == 0 || o_.iters == 0 || o_.prefill_batch == 0 ||
        o_.prefill_chunk == 0 || o_.batch > (1u << 20) || o_.context > (1u << 26)) {
      ctx.err << "kvtier-bench attn: --batch, --context, --iters and the prefill sizes must be "
                 "positive (and sane)\n";
      return kExitUsage;
    }
    const uint32_t qo_heads =
        o_.qo_heads != 0 ? static_cast<uint32_t>(o_.qo_heads) : 4 * g.kv_heads;
    Report report;
    report.device = o_.device;
    report.geometry = g;
    report.qo_heads = qo_heads;
    report.options = o_;
    Status st;
    if (o_.device == "cpu") {
      try {
        st = run_cpu(g, qo_heads, o_, ctx.err, report);
      } catch (const std::bad_alloc&) {
        st = resource_exhausted("not enough memory for " + std::to_string(o_.batch) + " x " +
                                std::to_string(o_.context) + " tokens of KV; lower --batch");
      }
    } else if (o_.device == "cuda") {
#if defined(KVTIER_HAVE_CUDA)
      report.has_prefill = false;
      st = run_cuda(g, qo_heads, o_, ctx.err, report);
#else
      st = unavailable("this build has no CUDA (nvcc was not found at configure time)");
#endif
    } else {
      ctx.err << "kvtier-bench attn: --device " << o_.device << " is not cpu or cuda\n";
      return kExitUsage;
    }
    if (!st.ok()) {
      ctx.err << "kvtier-bench attn: " << st.to_string() << "\n";
      return kExitFailure;
    }
    if (o_.json) {
      print_json(report, ctx.out);
    } else {
      print_table(report, ctx.out);
    }
    return kExitOk;
  }

 private:
  AttnOptions o_;
};

}  // namespace

std::unique_ptr<Command> make_attn_command() { return std::make_unique<AttnCommand>(); }

}  // namespace kvtier::bench

#include "runtime/metrics_collector.hpp"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>

#include "kvtier/version.hpp"
#include "tiers/device_api.hpp"

namespace kvtier {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

double read(const std::atomic<uint64_t>& c) {
  return static_cast<double>(c.load(std::memory_order_relaxed));
}

MetricFamily make_family(std::string_view name, std::string_view help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

// Only ever holds the last family appended: the reference dies with the next append.
MetricFamily& add_family(std::vector<MetricFamily>& out, std::string_view name,
                         std::string_view help, MetricType type) {
  return out.emplace_back(make_family(name, help, type));
}

void add_value(MetricFamily& f, double value, Labels labels = {}) {
  ClientMetric& m = f.metric.emplace_back();
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
}

// A family with no labels and one value.
void add_single(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
                MetricType type, double value) {
  add_value(add_family(out, name, help, type), value);
}

// A family with one series per tier, read from a per-tier array of counters.
void add_per_tier(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
                  const std::array<std::atomic<uint64_t>, kNumTiers>& counters,
                  std::span<const Tier> tiers = kAllTiers) {
  MetricFamily& f = add_family(out, name, help, MetricType::Counter);
  for (const Tier t : tiers) {
    add_value(f, read(counters[tier_index(t)]), {{"tier", std::string(tier_name(t))}});
  }
}

Labels link_labels(Link l) {
  return {{"src", std::string(link_src(l))}, {"dst", std::string(link_dst(l))}};
}

Labels with(Labels labels, std::string name, std::string value) {
  labels.push_back({std::move(name), std::move(value)});
  return labels;
}

}  // namespace

MetricsCollector::MetricsCollector(MetricsSources sources, LatencyBucketMap latency)
    : sources_(std::move(sources)),
      latency_(std::move(latency)),
      version_(kvtier::version()),
      cuda_(cuda_compiled_in() ? "true" : "false"),
      start_time_seconds_(
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count()) {}

std::vector<MetricFamily> MetricsCollector::Collect() const {
  std::vector<MetricFamily> out;
  add_value(add_family(out, "kvtier_build_info",
                       "kvtier build: version, and whether CUDA support is compiled in (always 1)",
                       MetricType::Gauge),
            1.0, {{"cuda", cuda_}, {"version", version_}});
  add_single(out, "kvtier_start_time_seconds",
             "Unix time the runtime started; its counters count from then", MetricType::Gauge,
             start_time_seconds_);
  if (sources_.scheduler != nullptr) collect_scheduler(*sources_.scheduler, out);
  if (sources_.transfer != nullptr) collect_transfer(*sources_.transfer, out);
  collect_occupancy(out);
  return out;
}

void MetricsCollector::collect_scheduler(const SchedulerStats& s,
                                         std::vector<MetricFamily>& out) const {
  constexpr MetricType kCounter = MetricType::Counter;
  add_single(out, "kvtier_lookup_blocks_total",
             "Blocks of the prompts opened (open_sequence): every key of every prompt", kCounter,
             read(s.lookup_blocks));
  add_single(out, "kvtier_lookup_tokens_total", "Tokens of the prompts opened (open_sequence)",
             kCounter, read(s.lookup_tokens));
  add_per_tier(
      out, "kvtier_hit_blocks_total",
      "Blocks of the cached prefix found at open_sequence, by the slowest tier each is loaded "
      "from; hit rate = rate(hits) / rate(lookups)",
      s.hit_blocks);
  add_per_tier(
      out, "kvtier_hit_tokens_total",
      "Tokens of the cached prefix found at open_sequence, by the slowest tier each is loaded "
      "from; hit rate = rate(hits) / rate(lookups)",
      s.hit_tokens);
  add_per_tier(out, "kvtier_promotions_total", "Pages moved up toward HBM, by destination tier",
               s.promotions);
  add_per_tier(out, "kvtier_demotions_total", "Pages moved down, by destination tier", s.demotions);
  add_per_tier(out, "kvtier_evictions_total",
               "Copies given up to make room, by tier (pages in hbm and host, blocks in nvme)",
               s.evictions);
  add_per_tier(out, "kvtier_shadowed_evictions_total",
               "Of the evictions, copies a faster tier held in full, given up without a write "
               "(write_back); a block that leaves the faster tier later is written down again",
               s.shadowed_evictions);
  add_single(out, "kvtier_prefetches_total",
             "Prefetches into HBM, counted as they arrive or as a step needs them in flight",
             kCounter, read(s.prefetches));
  add_single(out, "kvtier_late_prefetches_total",
             "Prefetches still in flight when a step needed them", kCounter,
             read(s.late_prefetches));
  constexpr std::array<Tier, 2> kHintedTiers = {Tier::kHbm, Tier::kHost};
  add_per_tier(out, "kvtier_hinted_loads_total",
               "Blocks a waiting request's hint brought in before any sequence asked for them: "
               "pages loaded into hbm, or the block read from nvme into host",
               s.hinted_loads, kHintedTiers);
  add_per_tier(out, "kvtier_hinted_loads_reused_total",
               "Of the hinted loads, blocks a request reused while the hint's copies were still "
               "there; loads minus reuses is what prefetching on hints moved for nothing",
               s.hinted_loads_reused, kHintedTiers);
  add_single(out, "kvtier_stall_seconds_total",
             "Time engine threads waited on a layer that was not ready", kCounter,
             read(s.stall_nanos) * 1e-9);
  add_single(out, "kvtier_stalls_total", "Waits on a layer that was not ready", kCounter,
             read(s.stalls));
  add_single(out, "kvtier_deadline_misses_total",
             "Waits that ran out their deadline (the load became a miss)", kCounter,
             read(s.deadline_misses));
  add_single(out, "kvtier_recompute_blocks_total",
             "Cached blocks the planner chose to recompute because loading them was slower",
             kCounter, read(s.recompute_blocks));
  add_single(out, "kvtier_recompute_tokens_total",
             "Cached tokens the planner chose to recompute because loading them was slower",
             kCounter, read(s.recompute_tokens));
  add_single(out, "kvtier_failed_loads_total",
             "Loads that failed (I/O error, checksum) and became misses", kCounter,
             read(s.failed_loads));
  add_single(out, "kvtier_refused_demotions_total",
             "Copies a slower tier could not store (fp8 cannot encode NaN or inf, or an NVMe write "
             "failed); their blocks are dropped instead of sent down again",
             kCounter, read(s.refused_demotions));
  add_single(out, "kvtier_nvme_write_pauses_total",
             "Times failed NVMe writes in a row (tiers.nvme.pause_after_failed_writes) paused "
             "writing to NVMe",
             kCounter, read(s.nvme_write_pauses));
  add_single(out, "kvtier_nvme_writes_paused",
             "1 while writes to NVMe are paused after failing, else 0; copies there are still read",
             MetricType::Gauge, read(s.nvme_writes_paused));
  add_single(out, "kvtier_nvme_read_pauses_total",
             "Times failed NVMe reads in a row (tiers.nvme.pause_after_failed_reads) paused "
             "reading from NVMe",
             kCounter, read(s.nvme_read_pauses));
  add_single(out, "kvtier_nvme_reads_paused",
             "1 while reads from NVMe are paused after failing, else 0; prompts recompute what "
             "is cached only there",
             MetricType::Gauge, read(s.nvme_reads_paused));
  add_single(out, "kvtier_nvme_retired_extents",
             "NVMe extents retired after a read or write failed with a media error (bad "
             "sectors); the tier holds that many blocks fewer until a restart",
             MetricType::Gauge, read(s.nvme_retired_extents));
  add_single(out, "kvtier_host_frames_held",
             "Host frames failed NVMe reads still hold: a hung drive's reads, abandoned at "
             "tiers.nvme.io_timeout_ms, keep theirs out of use until it answers",
             MetricType::Gauge, read(s.host_frames_held));
  add_single(out, "kvtier_nvme_blocks_lost_total",
             "Blocks the NVMe tier lost with a drive taken out of service (misses from then on)",
             kCounter, read(s.nvme_blocks_lost));
  add_single(out, "kvtier_steps_total", "Engine steps (begin_step calls)", kCounter, read(s.steps));
  add_single(out, "kvtier_windowed_steps_total",
             "Steps that did not fit in HBM at once and ran layer by layer", kCounter,
             read(s.windowed_steps));
  add_single(out, "kvtier_sequences_opened_total", "Sequences opened", kCounter,
             read(s.sequences_opened));
  add_single(out, "kvtier_blocks_published_total", "Full blocks published (given a key)", kCounter,
             read(s.blocks_published));
  add_single(out, "kvtier_blocks_deduplicated_total",
             "Published blocks already cached under the same key: shared, not copied", kCounter,
             read(s.blocks_deduplicated));
  add_single(out, "kvtier_blocks_refilled_total",
             "Cached blocks recomputed into their existing entries (complete again, not published)",
             kCounter, read(s.blocks_refilled));
  add_single(out, "kvtier_open_sequences", "Sequences open now", MetricType::Gauge,
             read(s.open_sequences));
  add_single(out, "kvtier_pinned_prefix_blocks", "Distinct blocks held in HBM by prefix pins now",
             MetricType::Gauge, read(s.pinned_prefix_blocks));
  MetricFamily& queued = add_family(
      out, "kvtier_link_queued_bytes",
      "Bytes of copies queued on a link, not yet submitted, by priority: demand (a step waits), "
      "admitted (a sequence just opened), prefetch (ahead of need), write_back (a lower copy)",
      MetricType::Gauge);
  for (const Link l : kAllLinks) {
    for (int p = 0; p < SchedulerStats::kQueuePriorities; ++p) {
      add_value(queued, read(s.link_queued_bytes[static_cast<int>(l)][p]),
                with(link_labels(l), "priority", kQueuePriorityNames[p]));
    }
  }
  MetricFamily& inflight =
      add_family(out, "kvtier_link_inflight_bytes",
                 "Bytes of copies submitted on a link and not yet completed", MetricType::Gauge);
  for (const Link l : kAllLinks) {
    add_value(inflight, read(s.link_inflight_bytes[static_cast<int>(l)]), link_labels(l));
  }
}

void MetricsCollector::collect_transfer(const TransferStats& t,
                                        std::vector<MetricFamily>& out) const {
  constexpr MetricType kCounter = MetricType::Counter;
  MetricFamily bytes = make_family("kvtier_transfer_bytes_total",
                                   "Payload bytes of completed transfers, by link", kCounter);
  MetricFamily ops = make_family("kvtier_transfer_ops_total",
                                 "Transfers by link and result (ok, error, cancelled)", kCounter);
  for (const Link l : kAllLinks) {
    const LinkStats& s = t.link(l);
    add_value(bytes, read(s.bytes), link_labels(l));
    add_value(ops, read(s.ops), with(link_labels(l), "result", "ok"));
    add_value(ops, read(s.errors), with(link_labels(l), "result", "error"));
    add_value(ops, read(s.cancelled), with(link_labels(l), "result", "cancelled"));
  }
  out.push_back(std::move(bytes));
  out.push_back(std::move(ops));
  MetricFamily& latency = add_family(
      out, "kvtier_transfer_latency_seconds",
      "Submit-to-completion time of successful transfers, by link (re-binned from power-of-two "
      "microsecond buckets: counts at a bound never include a slower sample)",
      MetricType::Histogram);
  for (const Link l : kAllLinks) {
    const LatencyBuckets b = latency_.apply(t.link(l).latency);
    ClientMetric& m = latency.metric.emplace_back();
    m.label = link_labels(l);
    m.histogram.sample_count = b.count;
    m.histogram.sample_sum = b.sum_seconds;
    m.histogram.bucket.reserve(b.cumulative.size());
    for (std::size_t j = 0; j < b.cumulative.size(); ++j) {
      m.histogram.bucket.push_back({b.cumulative[j], latency_.bounds()[j]});
    }
  }
  MetricFamily& max =
      add_family(out, "kvtier_transfer_latency_max_seconds",
                 "Slowest successful transfer since start, by link", MetricType::Gauge);
  for (const Link l : kAllLinks) {
    add_value(max, read(t.link(l).latency.max_ns) * 1e-9, link_labels(l));
  }
  add_single(out, "kvtier_checksum_failures_total",
             "NVMe extents dropped because a checksum did not match", kCounter,
             read(t.checksum_failures));
  add_single(out, "kvtier_io_errors_total", "Failed NVMe system calls", kCounter,
             read(t.io_errors));
  add_single(out, "kvtier_io_requeued_total",
             "Short NVMe reads/writes and EAGAIN completions resubmitted", kCounter,
             read(t.io_requeued));
  add_single(out, "kvtier_io_sq_full_waits_total",
             "NVMe submissions held back because the submission queue was full", kCounter,
             read(t.sq_full_waits));
  add_single(out, "kvtier_recovered_blocks_total", "Blocks found on NVMe by the restart scan",
             kCounter, read(t.recovered_blocks));
  add_single(out, "kvtier_dropped_extents_total",
             "NVMe extents dropped at recovery (torn, foreign or duplicate)", kCounter,
             read(t.dropped_extents));
  add_single(out, "kvtier_nvme_files_out_of_service",
             "NVMe store files (drives) out of service after failed requests in a row; their "
             "blocks are dropped and their extents retired until a probe finds them answering "
             "again or a restart",
             MetricType::Gauge, read(t.files_out_of_service));
  add_single(out, "kvtier_nvme_probes_total",
             "Superblock reads of NVMe store files out of service, to see whether they answer "
             "again (tiers.nvme.readmit_after_ms)",
             kCounter, read(t.nvme_probes));
  add_single(out, "kvtier_nvme_files_readmitted_total",
             "NVMe store files put back in service, empty, after a probe read their superblock",
             kCounter, read(t.files_readmitted));
  add_single(out, "kvtier_nvme_files_replaced_total",
             "Blank NVMe store files or devices formatted in place of a lost one (a replaced "
             "drive), at open or when a probe finds one",
             kCounter, read(t.files_replaced));
  add_single(out, "kvtier_nvme_io_timeouts_total",
             "NVMe requests a drive left unanswered past tiers.nvme.io_timeout_ms (a hung drive)",
             kCounter, read(t.io_timeouts));
  add_single(out, "kvtier_nvme_requests_unanswered",
             "NVMe requests past their timeout that the drive has still not answered; their "
             "memory stays reserved, and requests to that drive fail at once, until it does",
             MetricType::Gauge, read(t.requests_unanswered));
  add_single(out, "kvtier_copy_segments_total",
             "Physical copies issued by the copy engines after batching pages", kCounter,
             read(t.copy_segments));
  add_single(out, "kvtier_copy_pages_total", "Pages carried by those copies", kCounter,
             read(t.copy_pages));
}

void MetricsCollector::collect_occupancy(std::vector<MetricFamily>& out) const {
  bool any = false;
  for (const OccupancyProbe& p : sources_.occupancy) any = any || static_cast<bool>(p);
  if (!any) return;
  MetricFamily used = make_family("kvtier_tier_used_bytes",
                                  "Bytes of frames (hbm, host) or extents (nvme) in use, by tier",
                                  MetricType::Gauge);
  MetricFamily capacity =
      make_family("kvtier_tier_capacity_bytes",
                  "Bytes of frames (hbm, host) or extents (nvme) the tier holds in all, by tier",
                  MetricType::Gauge);
  for (const Tier t : kAllTiers) {
    const OccupancyProbe& probe = sources_.occupancy[tier_index(t)];
    if (!probe) continue;
    const TierOccupancy o = probe();
    add_value(used, static_cast<double>(o.used_bytes), {{"tier", std::string(tier_name(t))}});
    add_value(capacity, static_cast<double>(o.capacity_bytes),
              {{"tier", std::string(tier_name(t))}});
  }
  out.push_back(std::move(used));
  out.push_back(std::move(capacity));
}

std::string MetricsCollector::scrape_text() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace kvtier

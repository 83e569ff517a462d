// LinkQueues: priorities and backpressure in front of the TransferPort.
//
// Each link (hbm->host, host->hbm, host->nvme, nvme->host) has four FIFO queues — demand loads
// (a step is waiting), reads for a sequence just opened (its first step comes next), prefetches
// (a waiting request or an open sequence will want it), write-backs (making a lower copy,
// watermarks) — and a cap on the bytes it may have in flight. A job is submitted only
// while the link is under its cap, highest priority first, so a burst of write-backs can never sit
// in front of a demand load in the device's queue. A job that is already queued can be promoted
// (a prefetch becomes a demand when a step needs it before it ran). The queues hold ids; a job
// lives in one map, so a promotion is O(1): it moves the job's priority and queues its id again,
// and the id left behind is skipped when it reaches the front. Loop thread only; the bytes queued
// per priority and in flight are also stored, after each change, into gauges other threads read
// (SchedulerStats::link_queued_bytes, link_inflight_bytes).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>

#include "kvtier/scheduler_stats.hpp"
#include "kvtier/status.hpp"
#include "kvtier/transfer_stats.hpp"

namespace kvtier {

enum class TransferPriority : uint8_t { kDemand = 0, kAdmitted = 1, kPrefetch = 2, kWriteBack = 3 };
constexpr int kNumPriorities = 4;
static_assert(kNumPriorities == SchedulerStats::kQueuePriorities);

using JobId = uint64_t;

// Submits the job to the port; `finished` must be called exactly once when the transfer completes
// (or at once, with the error, when the submit failed). Returns nothing: failures travel through
// `finished`.
using JobStart = std::function<void(std::function<void()> finished)>;

class LinkQueues {
 public:
  // 0 = no cap for that link. `gauges`, if given, must outlive this.
  explicit LinkQueues(const std::array<uint64_t, kNumLinks>& max_inflight_bytes,
                      SchedulerStats* gauges = nullptr);

  // Queues a job of `bytes` on `link`; starts it at once when the link has room.
  JobId enqueue(Link link, TransferPriority priority, uint64_t bytes, JobStart start);
  // Moves a queued job to a higher priority (behind the jobs queued there); false when it
  // already started or is unknown.
  bool promote(JobId id, TransferPriority priority);

  uint64_t inflight_bytes(Link link) const { return links_[static_cast<int>(link)].inflight; }
  uint64_t queued_bytes(Link link) const {
    return queued_bytes_ahead(link, TransferPriority::kWriteBack);
  }
  // Bytes queued on `link` at `priority` or above: what a job of that priority waits behind,
  // besides the bytes in flight (jobs queued below it start after it).
  uint64_t queued_bytes_ahead(Link link, TransferPriority priority) const;
  std::size_t queued_jobs(Link link) const;
  bool idle() const;

 private:
  struct Job {
    Link link;
    TransferPriority priority;
    uint64_t bytes;
    JobStart start;
  };
  struct LinkState {
    // Ids in order of arrival at each priority; an id whose job is gone or was promoted out of
    // that priority is stale.
    std::array<std::deque<JobId>, kNumPriorities> queues;
    std::array<std::size_t, kNumPriorities> live{};    // queued jobs per priority
    std::array<uint64_t, kNumPriorities> queued_at{};  // queued bytes per priority
    uint64_t inflight = 0;
    uint64_t cap = 0;
  };

  void pump();
  // Stores the link's queued and in-flight bytes into the gauges.
  void publish(int link) const;

  std::array<LinkState, kNumLinks> links_{};
  std::unordered_map<JobId, Job> jobs_;  // queued jobs only
  SchedulerStats* gauges_ = nullptr;
  JobId next_id_ = 0;
  bool pumping_ = false;
};

}  // namespace kvtier

#include "scheduler/link_queues.hpp"

#include <algorithm>
#include <utility>

namespace kvtier {

LinkQueues::LinkQueues(const std::array<uint64_t, kNumLinks>& max_inflight_bytes,
                       SchedulerStats* gauges)
    : gauges_(gauges) {
  for (int i = 0; i < kNumLinks; ++i) links_[i].cap = max_inflight_bytes[i];
}

void LinkQueues::publish(int link) const {
  if (gauges_ == nullptr) return;
  const LinkState& l = links_[link];
  for (int p = 0; p < kNumPriorities; ++p) {
    gauges_->link_queued_bytes[link][p].store(l.queued_at[p], std::memory_order_relaxed);
  }
  gauges_->link_inflight_bytes[link].store(l.inflight, std::memory_order_relaxed);
}

JobId LinkQueues::enqueue(Link link, TransferPriority priority, uint64_t bytes, JobStart start) {
  LinkState& l = links_[static_cast<int>(link)];
  const JobId id = ++next_id_;
  const int p = static_cast<int>(priority);
  jobs_.emplace(id, Job{link, priority, bytes, std::move(start)});
  l.queues[p].push_back(id);
  l.live[p] += 1;
  l.queued_at[p] += bytes;
  publish(static_cast<int>(link));
  pump();
  return id;
}

bool LinkQueues::promote(JobId id, TransferPriority priority) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  Job& job = it->second;
  if (static_cast<int>(priority) >= static_cast<int>(job.priority)) return true;
  LinkState& l = links_[static_cast<int>(job.link)];
  const int from = static_cast<int>(job.priority);
  const int to = static_cast<int>(priority);
  l.live[from] -= 1;
  l.queued_at[from] -= job.bytes;
  l.live[to] += 1;
  l.queued_at[to] += job.bytes;
  l.queues[to].push_back(id);  // the id left in `from` is stale now
  job.priority = priority;
  publish(static_cast<int>(job.link));
  pump();
  return true;
}

uint64_t LinkQueues::queued_bytes_ahead(Link link, TransferPriority priority) const {
  const LinkState& l = links_[static_cast<int>(link)];
  uint64_t bytes = 0;
  for (int p = 0; p <= static_cast<int>(priority); ++p) bytes += l.queued_at[p];
  return bytes;
}

std::size_t LinkQueues::queued_jobs(Link link) const {
  std::size_t n = 0;
  for (std::size_t live : links_[static_cast<int>(link)].live) n += live;
  return n;
}

bool LinkQueues::idle() const {
  if (!jobs_.empty()) return false;
  return std::ranges::all_of(links_, [](const LinkState& l) { return l.inflight == 0; });
}

void LinkQueues::pump() {
  // A job's start may complete synchronously (a submit error) and re-enter pump through finished;
  // the flag turns that re-entry into another turn of this loop instead of recursion.
  if (pumping_) return;
  pumping_ = true;
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int li = 0; li < kNumLinks; ++li) {
      LinkState& l = links_[li];
      for (int p = 0; p < kNumPriorities; ++p) {
        auto& q = l.queues[p];
        while (!q.empty()) {
          auto it = jobs_.find(q.front());
          if (it == jobs_.end() || static_cast<int>(it->second.priority) != p) {
            q.pop_front();  // stale: promoted out of this queue
            continue;
          }
          // An empty link always admits one job, so a job larger than the cap still runs.
          const uint64_t bytes = it->second.bytes;
          if (l.cap != 0 && l.inflight != 0 && l.inflight + bytes > l.cap) break;
          q.pop_front();
          JobStart start = std::move(it->second.start);
          jobs_.erase(it);
          l.live[p] -= 1;
          l.queued_at[p] -= bytes;
          l.inflight += bytes;
          publish(li);
          start([this, li, bytes] {
            links_[li].inflight -= bytes;
            publish(li);
            pump();
          });
          progressed = true;
        }
        if (l.live[p] != 0) break;  // a lower priority must not overtake a blocked higher one
      }
    }
  }
  pumping_ = false;
}

}  // namespace kvtier

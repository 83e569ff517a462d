#include "scheduler/link_queues.hpp"

#include <algorithm>
#include <utility>

namespace kvtier {

LinkQueues::LinkQueues(const std::array<uint64_t, kNumLinks>& max_inflight_bytes) {
  for (int i = 0; i < kNumLinks; ++i) links_[i].cap = max_inflight_bytes[i];
}

JobId LinkQueues::enqueue(Link link, TransferPriority priority, uint64_t bytes, JobStart start) {
  LinkState& l = links_[static_cast<int>(link)];
  const JobId id = ++next_id_;
  l.queues[static_cast<int>(priority)].push_back(Job{id, bytes, std::move(start)});
  l.queued += bytes;
  l.queued_at[static_cast<int>(priority)] += bytes;
  where_.emplace(id, std::make_pair(link, priority));
  pump();
  return id;
}

bool LinkQueues::promote(JobId id, TransferPriority priority) {
  auto it = where_.find(id);
  if (it == where_.end()) return false;
  const auto [link, current] = it->second;
  if (static_cast<int>(priority) >= static_cast<int>(current)) return true;
  auto& from = links_[static_cast<int>(link)].queues[static_cast<int>(current)];
  auto job = std::find_if(from.begin(), from.end(), [&](const Job& j) { return j.id == id; });
  if (job == from.end()) return false;
  LinkState& l = links_[static_cast<int>(link)];
  l.queued_at[static_cast<int>(current)] -= job->bytes;
  l.queued_at[static_cast<int>(priority)] += job->bytes;
  l.queues[static_cast<int>(priority)].push_back(std::move(*job));
  from.erase(job);
  it->second.second = priority;
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
  for (const auto& q : links_[static_cast<int>(link)].queues) n += q.size();
  return n;
}

bool LinkQueues::idle() const {
  for (const auto& l : links_) {
    if (l.inflight != 0 || l.queued != 0) return false;
  }
  return true;
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
        // An empty link always admits one job, so a job larger than the cap still runs.
        while (!q.empty() &&
               (l.cap == 0 || l.inflight == 0 || l.inflight + q.front().bytes <= l.cap)) {
          Job job = std::move(q.front());
          q.pop_front();
          where_.erase(job.id);
          l.queued -= job.bytes;
          l.queued_at[p] -= job.bytes;
          l.inflight += job.bytes;
          const uint64_t bytes = job.bytes;
          const Link this_link = static_cast<Link>(li);
          job.start([this, this_link, bytes] {
            links_[static_cast<int>(this_link)].inflight -= bytes;
            pump();
          });
          progressed = true;
        }
        if (!q.empty()) break;  // a lower priority must not overtake a blocked higher one
      }
    }
  }
  pumping_ = false;
}

}  // namespace kvtier

// CudaCopyEngine: HBM<->host copies on CUDA streams (see copy_engine.hpp for the contract).
//
// Per direction: one non-blocking stream, an issue thread and a completion thread. The issue thread
// takes jobs in seq order; for a job that depends on the other direction it makes the stream wait
// on that job's event (GPU-side, no host stall) once the other issue thread has recorded it; it
// also waits on the caller's event (e.g. "K/V written" on the compute stream); then it enqueues the
// job's segments as one batched copy (or, for a job that re-encodes pages for an fp8 host tier, the
// codec kernels, which read or write the pinned host frames through their device mapping), records
// a fresh event and publishes it on the transfer. The completion thread synchronizes those events
// in order (blocking-sync events: it sleeps, it does not spin) and completes the transfers, so
// callbacks run on a kvtier thread and may do anything a callback may do. No kvtier lock is held
// across a CUDA call.
//
// Events are owned by shared_ptr: the transfer state keeps its event alive for as long as its
// handle exists, and a dependent job holds the event it waits on, so no event is destroyed or
// reused under a caller. Rejected: cudaLaunchHostFunc for completion (its callbacks may not call
// CUDA, which would leak that restriction into every user callback), and one thread issuing both
// directions (a dependency wait on one direction would stall the other).
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "kvtier/log.hpp"
#include "tiers/copy_engine.hpp"

namespace kvtier {
namespace {

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(std::shared_ptr<DeviceApi> api, std::shared_ptr<TransferStats> stats)
      : api_(std::move(api)), stats_(std::move(stats)) {}

  Status start() {
    for (int d = 0; d < 2; ++d) {
      KVTIER_ASSIGN_OR_RETURN(dirs_[d].stream, DeviceStream::create(api_));
    }
    // A thread that cannot be created (EAGAIN) is a Status; the destructor stops and joins those
    // already started.
    for (int d = 0; d < 2; ++d) {
      try {
        dirs_[d].issuer = std::thread([this, d] { issue_loop(d); });
        dirs_[d].completer = std::thread([this, d] { complete_loop(d); });
      } catch (const std::system_error& e) {
        return resource_exhausted("CUDA copy engine: cannot start the " +
                                  std::string(link_name(copy_link(static_cast<CopyDirection>(d)))) +
                                  " threads: " + e.what());
      }
    }
    return Status();
  }

  ~CudaCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& d : dirs_) {
      if (d.issuer.joinable()) d.issuer.join();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      issuers_done_ = true;
    }
    cv_.notify_all();
    for (auto& d : dirs_) {
      if (d.completer.joinable()) d.completer.join();
    }
    for (auto& d : dirs_) {
      if (d.stream.get().raw != nullptr) api_->synchronize_stream(d.stream.get()).ignore();
    }
  }

  std::string_view name() const override { return "cuda-streams"; }

  Status submit(CopyJob job) override {
    job.state->expect_device_event();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return cancelled("copy engine is shutting down");
      dirs_[static_cast<int>(job.direction)].pending.push_back(std::move(job));
    }
    cv_.notify_all();
    return Status();
  }

  uint64_t completed(CopyDirection d) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return dirs_[static_cast<int>(d)].completed;
  }

 private:
  struct Issued {
    CopyJob job;
    std::shared_ptr<DeviceEvent> event;
    Status status;
  };
  struct Direction {
    DeviceStream stream;
    std::thread issuer;
    std::thread completer;
    std::deque<CopyJob> pending;                              // guarded by mu_
    std::deque<Issued> in_flight;                             // guarded by mu_
    std::map<uint64_t, std::shared_ptr<DeviceEvent>> events;  // seq -> event; guarded by mu_
    uint64_t issued = 0;                                      // guarded by mu_
    uint64_t completed = 0;                                   // guarded by mu_
  };

  void issue_loop(int d) {
    const int o = 1 - d;
    Direction& dir = dirs_[d];
    const CopyKind kind = d == static_cast<int>(CopyDirection::kHbmToHost)
                              ? CopyKind::kDeviceToHost
                              : CopyKind::kHostToDevice;
    while (true) {
      CopyJob job;
      std::shared_ptr<DeviceEvent> dependency;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          if (dir.pending.empty()) return stopping_;
          const uint64_t after = dir.pending.front().after_other_seq;
          return after <= dirs_[o].issued || after <= dirs_[o].completed;
        });
        if (dir.pending.empty()) return;
        job = std::move(dir.pending.front());
        dir.pending.pop_front();
        if (job.after_other_seq > dirs_[o].completed) {
          auto it = dirs_[o].events.find(job.after_other_seq);
          if (it != dirs_[o].events.end()) dependency = it->second;
        }
      }
      Issued issued = issue(dir, job, kind, dependency);
      if (issued.event) job.state->set_device_event(issued.event->get().raw, issued.event);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (issued.event) dir.events.emplace(job.seq, issued.event);
        dir.issued = job.seq;
        issued.job = std::move(job);
        dir.in_flight.push_back(std::move(issued));
      }
      cv_.notify_all();
    }
  }

  // Enqueues the job and records its completion event. The event is created first, so a failure
  // to create it leaves nothing of the job on the stream. A job that ends up without an event
  // (none could be created or recorded) is returned only once its stream has drained: nothing
  // would tell its completion thread, or a job of the other direction that depends on it, when
  // the DMA enqueued so far (its own or that of earlier jobs whose frames it took over) is done.
  Issued issue(Direction& dir, const CopyJob& job, CopyKind kind,
               const std::shared_ptr<DeviceEvent>& dependency) {
    const std::string what = "copy " + std::string(link_name(copy_link(job.direction)));
    Issued issued{CopyJob{}, nullptr, Status()};
    auto event = DeviceEvent::create(api_);
    if (!event.ok()) {
      issued.status =
          std::move(event).status().with_context(what + ": no completion event, nothing copied");
    } else if (job.state->cancel_requested()) {
      issued.status = cancelled(what + " cancelled before it started");
    } else {
      issued.status = enqueue(dir, job, kind, dependency);
    }
    if (event.ok()) {
      issued.event = std::make_shared<DeviceEvent>(std::move(event).value());
      Status r = api_->record_event(issued.event->get(), dir.stream.get());
      if (!r.ok()) {
        r = r.with_context(what + ": recording its completion event");
        if (issued.status.ok()) {
          issued.status = std::move(r);
        } else {
          r.ignore();
        }
        issued.event.reset();
      }
    }
    if (!issued.event) {
      Status drained = api_->synchronize_stream(dir.stream.get());
      if (!drained.ok()) {
        // Nothing more can be waited on; the stream is broken (a sticky device error).
        log(LogLevel::kError, what + ": synchronizing its stream: " + drained.to_string());
      }
    }
    return issued;
  }

  Status enqueue(Direction& dir, const CopyJob& job, CopyKind kind,
                 const std::shared_ptr<DeviceEvent>& dependency) {
    if (dependency) {
      KVTIER_RETURN_IF_ERROR(api_->stream_wait_event(dir.stream.get(), dependency->get()));
    }
    if (job.wait_device_event != nullptr) {
      KVTIER_RETURN_IF_ERROR(
          api_->stream_wait_event(dir.stream.get(), EventHandle{job.wait_device_event}));
    }
    if (job.host_format) {
      return kind == CopyKind::kDeviceToHost
                 ? api_->encode_pages_async(job.segments, *job.host_format, dir.stream.get())
                 : api_->decode_pages_async(job.segments, *job.host_format, dir.stream.get());
    }
    return api_->copy_async(job.segments, kind, dir.stream.get());
  }

  void complete_loop(int d) {
    Direction& dir = dirs_[d];
    while (true) {
      std::optional<Issued> next;  // constructed in place: its Status is never overwritten
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !dir.in_flight.empty() || issuers_done_; });
        if (dir.in_flight.empty()) return;
        next.emplace(std::move(dir.in_flight.front()));
        dir.in_flight.pop_front();
      }
      Issued& issued = *next;
      Status result = std::move(issued.status);
      if (issued.event) {
        Status s = api_->synchronize_event(issued.event->get());
        if (result.ok()) {
          result = std::move(s);
        } else {
          s.ignore();
        }
      }
      if (result.ok()) result = refused_pages_status(issued.job);  // host frames are final now
      if (result.ok() && stats_) {
        stats_->copy_segments.fetch_add(issued.job.segments.size(), std::memory_order_relaxed);
        stats_->copy_pages.fetch_add(issued.job.pages, std::memory_order_relaxed);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        dir.completed = issued.job.seq;
        dir.events.erase(issued.job.seq);
      }
      cv_.notify_all();
      issued.job.state->complete(result);
      result.ignore();
    }
  }

  const std::shared_ptr<DeviceApi> api_;
  const std::shared_ptr<TransferStats> stats_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;      // guarded by mu_
  bool issuers_done_ = false;  // guarded by mu_
  Direction dirs_[2];
};

}  // namespace

Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(std::shared_ptr<DeviceApi> device,
                                                          std::shared_ptr<TransferStats> stats) {
  if (!device) return invalid_argument("CUDA copy engine without a device");
  auto engine = std::make_unique<CudaCopyEngine>(std::move(device), std::move(stats));
  KVTIER_RETURN_IF_ERROR(engine->start());
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

}  // namespace kvtier

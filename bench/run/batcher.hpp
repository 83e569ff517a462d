// Batcher: the engine-side bookkeeping both clocks share — a continuous-batching server's queue,
// admission and iteration planning — independent of where time comes from and how a step runs.
//
//   arrivals   requests join the waiting queue at their arrival time;
//   admission  in arrival order while the running requests' full KV (prompt + output, pages of
//              every layer; a prompt block requests share counted once, see HeldBlocks) fits in
//              admit_fraction of the HBM frames and fewer than max_sequences run. A request whose
//              KV exceeds that runs alone (the scheduler streams it through
//              HBM a layer window at a time) when a host tier can hold it, and is rejected
//              otherwise. Opening the sequence with the prompt's keys (when the baseline reuses)
//              tells how much of the prompt is cached: prefill starts after it;
//   iterations each running request decodes one token, then prompts are chunked into what is
//              left of max_batched_tokens, oldest first. A prompt's last chunk yields the first
//              output token; a fully cached prompt gets it from its first decode pass. The plan
//              of a step is 1..max_iterations iterations: it stops at an arrival, and when a
//              request finishes while others wait;
//   holding  an engine may keep an admitted request out of steps until its reused prefix has
//              come up from NVMe (the prefetch open_sequence started), as serving engines load
//              remote KV asynchronously: the batch keeps decoding meanwhile instead of stalling on
//              a disk read. `ready` says when a holding request may run;
//   completion after end_step the step's token times are set from the iterations' ends, and
//              finished requests are closed and leave.
// It never calls the scheduler itself: the engines pass the calls in, so the same plan drives the
// simulated and the real runtime. Hit tokens per tier come from open_sequence (what was reused,
// by the tier it was found in), less what a late load made the engine recompute.
// Single-threaded.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "bench/run/held_blocks.hpp"
#include "bench/run/perf_model.hpp"
#include "bench/run/results.hpp"
#include "bench/run/workload.hpp"
#include "kvtier/status.hpp"
#include "kvtier/step_types.hpp"

namespace kvtier::bench::run {

struct BatcherConfig {
  uint32_t page_tokens = 16;
  uint32_t layers = 1;  // simulated layers (pages per block)
  uint64_t hbm_frames = 0;
  uint64_t host_frames = 0;  // 0: no host tier (no layer-window streaming)
  double admit_fraction = 0.95;
  uint32_t max_sequences = 256;
  uint32_t max_batched_tokens = 8192;
  bool reuse = true;       // give the scheduler content keys
  bool hold_nvme = false;  // keep requests out of steps while their prefix is on NVMe
};

// A request the engine has admitted.
struct LiveRequest {
  std::size_t index = 0;  // into the workload and the records
  const Request* req = nullptr;
  SequenceId seq = 0;
  uint64_t ctx = 0;  // tokens with K/V, as the scheduler counts them
  uint64_t prompt_left = 0;
  uint64_t out_done = 0;
  HeldBlocks::Share share;       // its part of the HBM frames the running requests take (admission)
  uint64_t computed_blocks = 0;  // prompt blocks whose prefill has ended (HeldBlocks::computed)
  uint32_t reused_blocks = 0;
  bool holding = false;  // waiting for its reused prefix to leave NVMe (see Batcher::hold)
  Nanos admitted = 0;
  // The step being planned.
  uint64_t step_new = 0;
  uint64_t ctx_before = 0;
  int first_iteration = -1;
  int last_iteration = -1;
  bool done = false;
};

struct StepPlan {
  std::vector<StepItem> items;
  std::vector<LiveRequest*> requests;  // per item
  std::vector<IterationWork> iterations;
  std::vector<Nanos> ends;  // modeled time at the end of each iteration, from the step's start
  Nanos model_time = 0;
  Nanos prefill_time = 0;  // modeled prefill GPU time of the step
  uint64_t prefill_tokens = 0;
};

using OpenFn = std::function<Result<OpenedSequence>(std::span<const BlockKey>)>;
using CostFn = std::function<Nanos(const IterationWork&)>;

class Batcher {
 public:
  Batcher(const Workload& workload, const BatcherConfig& config, BaselineResult& result,
          std::atomic<uint64_t>* progress);

  bool finished() const { return finished_ == workload_.requests.size(); }
  bool idle() const { return running_.empty(); }
  bool has_waiting() const { return !waiting_.empty(); }
  std::optional<Nanos> next_arrival() const;
  void take_arrivals(Nanos now);
  // `now` stamps the admission (for the hold's bound).
  Status admit(const OpenFn& open, Nanos now = 0);
  // Marks admitted requests as holding while `ready` is false for them, at most `max_hold` after
  // their admission; returns how many are runnable now.
  std::size_t hold(const std::function<bool(const LiveRequest&)>& ready, Nanos now, Nanos max_hold);

  // The first `window` waiting requests with their expected starts (after the prefill of those
  // before them at `prefill_tokens_per_s`); clears hints_dirty().
  std::vector<HintedRequest> hints(Nanos now, double prefill_tokens_per_s, std::size_t window);
  bool hints_dirty() const { return hints_dirty_; }

  // True when the running batch, one iteration on, would not fit in HBM all at once (prompt
  // blocks requests share counted once, as begin_step counts them).
  bool windowed_batch() const;
  // Plans the next step: up to `max_iterations` iterations, stopping before `next_arrival`
  // (modeled time from `now`); `cost` gives an iteration's modeled time (0 when unmodeled).
  StepPlan plan(Nanos now, uint32_t max_iterations, const CostFn& cost);
  // Checks begin_step's answer against the plan and counts prompt tokens the scheduler gave back
  // for recompute (prefetch.on_late = recompute); returns their work, to be computed first.
  Result<IterationWork> accept(const StepPlan& plan, const StepInfo& info);
  // Content keys of the blocks each item filled (for end_step).
  std::vector<StepCompletion> completions(const StepPlan& plan, const StepInfo& info) const;
  // After end_step at `end`: token times (iteration i ends at end - (model_time - ends[i]), or
  // at `end` when unmodeled), then closes finished requests with `close`.
  // `close` releases a finished request's sequence, given how many tokens it generated.
  Status complete(const StepPlan& plan, Nanos end,
                  const std::function<Status(SequenceId, uint64_t)>& close);

  const std::vector<LiveRequest>& running() const { return running_; }

 private:
  void finish_one();

  const Workload& workload_;
  BatcherConfig config_;
  BaselineResult& result_;
  std::atomic<uint64_t>* progress_;
  uint64_t budget_frames_ = 0;
  HeldBlocks held_;
  std::size_t next_ = 0;
  std::size_t finished_ = 0;
  std::deque<std::size_t> waiting_;
  std::vector<LiveRequest> running_;
  bool hints_dirty_ = true;
};

}  // namespace kvtier::bench::run

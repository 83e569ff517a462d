// The reference engine: a complete, small LLM serving loop over kvtier — continuous batching of
// several sequences, chunked prefill, greedy decode and prefix reuse — whose attention reads K/V
// only through the runtime's layer tables (bench/engine/paged_attention.hpp). It is the proof
// that the step contract (DESIGN.md, "How an engine uses it") carries a real model, and the
// subject of the end-to-end tests: outputs must not change, bit for bit, when the HBM tier is too
// small and pages travel through host and NVMe, or when a restarted runtime serves a prefix from
// NVMe instead of the engine recomputing it.
//
// One step() (on the caller's thread; the engine is not thread-safe, the runtime it drives is):
//  1. requests whose arrival step has come join the waiting queue (FIFO), and the runtime is
//     hinted with the waiting requests' keys so it can prefetch their cached prefixes;
//  2. while fewer than max_running sequences run, the queue's head is admitted: the keys of its
//     prompt's full blocks — without the prompt's last token, so at least one token is computed
//     and yields the first logits — open a sequence, and prefill starts at reused_tokens;
//  3. the batch: one decode token for each generating sequence, then prompt chunks (multiples of
//     page_tokens but for a prompt's tail, at most prefill_chunk per sequence, max_step_tokens in
//     all), in admission order; items are dropped from the end while one layer of the batch needs
//     more HBM frames than the arena has (and again if begin_step says resource_exhausted), so the
//     runtime is never asked for a step it cannot pin;
//  4. begin_step; per layer: norm and Q/K/V projections (before waiting, so they overlap the
//     layer's loads), wait_layer, K/V written into the table's frames, attention, end_layer, then
//     the output projection and the MLP;
//  5. greedy sampling for every item whose last row is the sequence's newest token; end_step with
//     the keys of the blocks the step filled (prompt and generated tokens alike), so they become
//     shareable; finished sequences are closed.
// A step whose layer fails to load is aborted (abort_step) and step() returns the error with the
// engine unchanged; calling it again retries. Any other error leaves the engine unusable.
//
// Determinism: the same requests give the same tokens and logits, bit for bit, whatever the HBM
// size, the batches that follows from it, the chunking, the thread count, and whether a prefix
// was loaded or computed (ops.hpp and paged_attention.hpp say how). One limit: K/V of a token is
// computed by prefill or by decode, and the two differ in their last bits; a prompt that contains
// earlier generated text reuses decode-computed blocks where a cold run would prefill them.
#pragma once

#include <tbb/task_arena.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "bench/engine/kv_shadow.hpp"
#include "bench/engine/model.hpp"
#include "bench/engine/paged_attention.hpp"
#include "kvtier/kvtier.hpp"

namespace kvtier::engine {

struct Request {
  uint64_t id = 0;
  std::vector<uint32_t> prompt;  // token ids below the vocabulary size; at least one
  uint32_t max_new_tokens = 1;   // tokens to generate (greedy), at least one
  uint64_t arrival_step = 0;     // the engine step at which it joins the waiting queue
};

struct RequestOutput {
  uint64_t id = 0;
  std::vector<uint32_t> tokens;     // generated token ids
  std::vector<float> final_logits;  // [vocab], the logits that chose the last token
  uint64_t prompt_tokens = 0;
  uint64_t reused_tokens = 0;     // prompt tokens whose K/V came from kvtier's cache
  uint64_t prefilled_tokens = 0;  // prompt tokens this engine computed
  std::array<uint32_t, kNumTiers> reused_by_tier{};  // reused blocks, by the tier they came from
  uint64_t admitted_step = 0;
  uint64_t finished_step = 0;
};

struct EngineOptions {
  uint32_t max_running = 4;        // sequences admitted at once
  uint32_t max_step_tokens = 256;  // decode tokens plus prompt tokens per step
  uint32_t prefill_chunk = 64;  // prompt tokens of one sequence per step; a multiple of page_tokens
  bool send_hints = true;       // tell the runtime about waiting requests
  uint32_t threads = 0;         // oneTBB workers for the model's arithmetic; 0 = all cores
  kernels::cpu::Isa isa = kernels::cpu::Isa::kAuto;
  // Checks every K/V row the attention reads against what was written or published (kv_shadow.hpp);
  // a wrong row fails the step with internal_error. Null: no checks. Engines may share one.
  std::shared_ptr<KvShadow> kv_shadow;
};

struct EngineStats {
  uint64_t steps = 0;
  uint64_t windowed_steps = 0;  // steps the runtime ran layer by layer (HBM too small for all)
  uint64_t shrunk_batches = 0;  // batch items deferred because HBM could not hold them
  uint64_t prompt_tokens = 0;   // of admitted requests
  uint64_t reused_tokens = 0;
  uint64_t prefilled_tokens = 0;   // prompt tokens computed (recomputed ones included)
  uint64_t recomputed_tokens = 0;  // reused tokens the runtime handed back (prefetch.on_late)
  uint64_t decode_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t finished_requests = 0;
};

class ReferenceEngine {
 public:
  // `runtime` must outlive the engine and be open with this model's geometry (emulated HBM).
  static Result<std::unique_ptr<ReferenceEngine>> create(Runtime& runtime,
                                                         std::shared_ptr<const Weights> weights,
                                                         EngineOptions options = {});
  // Closes the sequences still running (best effort).
  ~ReferenceEngine();
  ReferenceEngine(const ReferenceEngine&) = delete;
  ReferenceEngine& operator=(const ReferenceEngine&) = delete;

  // invalid_argument for an empty prompt, a token outside the vocabulary, zero max_new_tokens or
  // a repeated id; resource_exhausted when one layer of the request alone could never fit in HBM.
  Status submit(Request request);
  // One step (see above). OK and no work done when nothing is runnable yet.
  Status step();
  // Steps until every submitted request has finished; outputs in submission order.
  Result<std::vector<RequestOutput>> run_to_completion();
  bool done() const;

  const EngineStats& stats() const { return stats_; }
  const std::vector<RequestOutput>& outputs() const { return outputs_; }

 private:
  struct Running;
  struct Planned {
    Running* seq;
    uint32_t tokens;
    bool decode;
  };

  ReferenceEngine(Runtime& runtime, std::shared_ptr<const Weights> weights, EngineOptions options,
                  PagedAttention attention);
  Status admit_arrivals();
  std::vector<Planned> plan_batch();
  Status run_step(std::vector<Planned>& batch);
  Status forward(const StepInfo& info, const std::vector<Planned>& batch,
                 std::vector<StepSlice>& slices, std::vector<float>& logits_out,
                 std::vector<std::size_t>& sampled_items);
  Status finish_sequence(Running& seq);
  uint64_t pages_per_layer(const std::vector<Planned>& batch) const;

  Runtime& runtime_;
  std::shared_ptr<const Weights> weights_;
  EngineOptions options_;
  PagedAttention attention_;
  std::unique_ptr<tbb::task_arena> arena_;
  HbmView hbm_;

  std::deque<Request> pending_;                    // submitted, not yet arrived
  std::deque<Request> waiting_;                    // arrived, not yet admitted
  std::vector<std::unique_ptr<Running>> running_;  // in admission order
  std::vector<uint64_t> submitted_ids_;            // submission order, for the outputs
  std::vector<RequestOutput> outputs_;             // in finishing order
  bool hinted_nonempty_ = false;
  uint64_t step_no_ = 0;
  EngineStats stats_;
};

}  // namespace kvtier::engine

// KvShadow: the reference engine's own record of every K/V row it expects the runtime to hand
// back, checked against the HBM frames of each layer table before the engine writes into them and
// after its attention has read them. It turns "offloading changed the output" into an error that
// names the step, layer, sequence, block, frame and rows that came back wrong — at the read that
// went wrong, not thousands of tokens later in a diverged logit.
//
// What a row should hold:
//  - a row the sequence wrote itself: the bytes it wrote (recorded from the frame right after
//    write_kv; a transfer landing on the frame in between those two calls would go unseen);
//  - a row of a reused prefix block: the bytes of that block as first published (end_step with its
//    key), by any sequence of any engine that shares this shadow — so a shadow shared by a run
//    whose HBM holds everything and a run that offloads compares the two at every read. A reused
//    block this shadow never saw published (a store recovered from an earlier process) is learnt
//    from its first read and checked from then on.
//  - A key published twice with different bytes (prefill and decode differ in their last bits:
//    engine.hpp) is ambiguous: which copy the cache keeps is the runtime's choice, so its rows are
//    learnt again at the next read, by the sequence that published it second and by every
//    sequence that reuses it later.
// Bytes only: the shadow is meaningful when every tier stores pages as computed (no fp8 tier).
// Memory: a copy of each open sequence's K/V plus each published block's; for tests and
// diagnostics, not for production serving. Single-threaded, like the engine.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/kvtier.hpp"

namespace kvtier::engine {

struct StepSlice;

class KvShadow {
 public:
  explicit KvShadow(const Geometry& geometry);

  // A sequence opened with `reused_keys`, the keys of its reused prefix blocks, in order.
  void open(SequenceId sequence, std::span<const BlockKey> reused_keys);
  void close(SequenceId sequence);
  // Forgets the sequence's rows from `tokens` on (an aborted step, a prefix handed back for
  // recompute).
  void truncate(SequenceId sequence, uint64_t tokens);

  // Checks that the frames `table` lists for `layer` hold, for item i, the rows the shadow expects
  // of [0, slices[i].context) — or, with `with_new_rows`, of [0, context + tokens). internal_error
  // naming the first wrong rows.
  Status verify(const HbmView& hbm, const LayerTable& table, std::span<const SequenceId> sequences,
                std::span<const StepSlice> slices, uint32_t layer, bool with_new_rows);
  // Records, from the frames, the rows each item wrote this step in `layer`.
  void record(const HbmView& hbm, const LayerTable& table, std::span<const SequenceId> sequences,
              std::span<const StepSlice> slices, uint32_t layer);
  // Blocks [first_block, first_block + keys.size()) of the sequence became shareable under `keys`.
  void publish(SequenceId sequence, uint64_t first_block, std::span<const BlockKey> keys);

  const Geometry& geometry() const { return geometry_; }
  uint64_t verified_rows() const { return verified_rows_; }
  uint64_t learnt_blocks() const { return learnt_blocks_; }

 private:
  struct Sequence {
    std::vector<std::vector<uint8_t>> rows;  // per layer: [token][K row | V row]
    std::vector<BlockKey> reused;            // keys of the reused prefix blocks
    // Blocks whose rows are learnt from their next read, per layer (1: not yet): reused blocks
    // this shadow never saw published, and blocks the sequence published under a key that was
    // already published with other bytes (the runtime may hand it either copy).
    std::unordered_map<uint64_t, std::vector<uint8_t>> unlearnt;
  };
  std::size_t row_bytes() const { return 2 * geometry_.token_bytes(); }
  // Copies token `pos`'s K and V rows out of the frame into `dst`.
  void read_row(const HbmView& hbm, int32_t frame, uint64_t pos, uint8_t* dst) const;
  Status check_item(const HbmView& hbm, const int32_t* frames, SequenceId id, Sequence& seq,
                    uint32_t layer, uint64_t end);

  Geometry geometry_;
  std::unordered_map<SequenceId, Sequence> sequences_;
  // Published blocks: per layer, page_tokens rows.
  std::unordered_map<BlockKey, std::vector<uint8_t>, BlockKeyHash> published_;
  std::unordered_set<BlockKey, BlockKeyHash> ambiguous_;
  std::vector<uint8_t> scratch_;
  uint64_t verified_rows_ = 0;
  uint64_t learnt_blocks_ = 0;
};

}  // namespace kvtier::engine

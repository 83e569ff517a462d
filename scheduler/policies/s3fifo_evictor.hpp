// S3FifoEvictor (policies.eviction: s3fifo): S3-FIFO (Yang et al., SOSP'23) — a small FIFO that
// filters one-hit wonders, a main FIFO with a 2-bit use counter (lazy promotion: reinsert instead
// of moving on every hit), and a ghost FIFO that remembers what the small queue dropped.
//
//   insert: a key remembered by the ghost enters main, every other one enters small;
//   access: count = min(count + 1, 3), nothing moves;
//   evict:  while small holds at least 10 % of the tier, take its oldest: used more than once
//           since insertion -> moved to main (count reset), else it is the victim (and is
//           remembered by the ghost once it is gone); otherwise take main's oldest: count > 0 ->
//           count - 1 and back to main's front, else it is the victim.
// A victim keeps its place at the tail of its queue until the caller reports on_erase, as in
// every evictor: a later call offers it again first while it is unused, one used meanwhile is
// judged by its count like any other block, and a plan that was abandoned or asked for more than
// it used costs nothing. (Within a call, victims and refused blocks wait aside in two lists and
// go back when it returns.) A block the caller's filter refuses (pinned, in flight) is given a
// second trip through its queue, from the front, at most once per block per call; when every
// remaining block of the queue S3-FIFO picks was refused, the other queue serves the rest of the
// call, so victims run out only when every tracked block was refused.
// Sizes: small = max(1, capacity / 10); ghost = capacity - small entries, as in the paper.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/policies/evictor.hpp"
#include "scheduler/policies/ghost_history.hpp"
#include "scheduler/policies/key_index.hpp"

namespace kvtier {

class S3FifoEvictor final : public Evictor {
 public:
  explicit S3FifoEvictor(const EvictorOptions& options);

  std::string_view name() const override { return "s3fifo"; }
  void on_insert(const BlockFacts& block) override;
  void on_access(const BlockKey& key) override;
  void on_erase(const BlockKey& key) override;
  std::size_t select_victims(std::size_t count, KeyFilter skip,
                             std::vector<BlockKey>& out) override;
  bool contains(const BlockKey& key) const override { return index_.find(key) != KeyIndex::kNone; }
  std::size_t size() const override { return index_.size(); }
  std::size_t memory_bytes() const override;

  uint64_t small_size() const { return lists_.size(kSmall); }
  uint64_t main_size() const { return lists_.size(kMain); }

 private:
  // kLeaving and kRefused hold blocks only during select_victims.
  static constexpr uint32_t kSmall = 0, kMain = 1, kLeaving = 2, kRefused = 3;
  static constexpr uint8_t kFromSmall = 4;  // queue_ bit: a block set aside came from small

  void move(uint32_t slot, uint32_t to, bool front = true);
  // The queue a block set aside goes back to.
  uint32_t origin(uint32_t slot) const { return (queue_[slot] & kFromSmall) != 0 ? kSmall : kMain; }

  uint64_t small_target_;
  KeyIndex index_;
  SlotLists lists_{4};
  std::vector<uint8_t> count_;
  std::vector<uint8_t> queue_;  // list number | kFromSmall
  GhostHistory ghost_;
};

}  // namespace kvtier

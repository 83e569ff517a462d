// FlatKeyMap: one shard's index from block key to slab slot, open addressing with linear probing.
//
// A bucket is 8 bytes: the high 32 bits of the key's 64-bit hash (the tag, which also picks the
// home bucket) and the slot. The key itself is not stored: a tag match is confirmed by the caller's
// `is_key(slot)`, which reads the key from the entry it is about to use anyway, so a hit costs one
// probe line plus the entry line. Deletion shifts later members of the probe run back (no
// tombstones, so lookups never slow down with churn). Load factor stays <= 3/4; growth doubles and
// reinserts by tag alone, without touching the entries.
//
// Not thread-safe: the owning shard's mutex guards it. Rejected: std::unordered_map (a node
// allocation per block and ~40 bytes of overhead on top of the entry), and storing the full key in
// the bucket (24-byte buckets triple the probe footprint for no saved line on a hit).
#pragma once

#include <cstdint>
#include <memory>
#include <new>

namespace kvtier {

class FlatKeyMap {
 public:
  static constexpr uint32_t kNotFound = 0xFFFF'FFFFu;

  explicit FlatKeyMap(uint64_t expected_members = 0) {
    uint64_t want = 16;
    while (want * 3 < expected_members * 4 && want < kMaxBuckets) want *= 2;
    buckets_.reset(new Bucket[want]);
    mask_ = static_cast<uint32_t>(want - 1);
    clear_buckets(buckets_.get(), want);
  }
  FlatKeyMap(FlatKeyMap&&) noexcept = default;
  FlatKeyMap& operator=(FlatKeyMap&&) noexcept = default;

  // The slot stored under a key with this hash for which is_key(slot) holds, or kNotFound.
  template <typename IsKey>
  uint32_t find(uint64_t hash, IsKey&& is_key) const {
    const uint32_t tag = tag_of(hash);
    for (uint32_t i = tag & mask_;; i = (i + 1) & mask_) {
      const Bucket& b = buckets_[i];
      if (b.slot == kNotFound) return kNotFound;
      if (b.tag == tag && is_key(b.slot)) return b.slot;
    }
  }

  // Adds a key known to be absent. False only when growing the table failed for lack of memory.
  bool insert(uint64_t hash, uint32_t slot) {
    if ((static_cast<uint64_t>(size_) + 1) * 4 > (static_cast<uint64_t>(mask_) + 1) * 3) {
      if (!grow()) return false;
    }
    place(tag_of(hash), slot);
    ++size_;
    return true;
  }

  // Removes the key's bucket; false when it is not present.
  template <typename IsKey>
  bool erase(uint64_t hash, IsKey&& is_key) {
    const uint32_t tag = tag_of(hash);
    uint32_t i = tag & mask_;
    for (;; i = (i + 1) & mask_) {
      const Bucket& b = buckets_[i];
      if (b.slot == kNotFound) return false;
      if (b.tag == tag && is_key(b.slot)) break;
    }
    // Backward shift: pull each later member of the run into the hole unless its home bucket lies
    // cyclically in (hole, member], where it would then be unreachable.
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      const Bucket& b = buckets_[j];
      if (b.slot == kNotFound) break;
      const uint32_t home = b.tag & mask_;
      const bool stays = ((j - home) & mask_) < ((j - hole) & mask_);
      if (!stays) {
        buckets_[hole] = b;
        hole = j;
      }
    }
    buckets_[hole] = Bucket{0, kNotFound};
    --size_;
    return true;
  }

  // Calls fn(tag, slot) for every member (audit).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (uint64_t i = 0; i <= mask_; ++i) {
      if (buckets_[i].slot != kNotFound) fn(buckets_[i].tag, buckets_[i].slot);
    }
  }

  static uint32_t tag_of(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }
  uint32_t size() const { return size_; }
  uint64_t bucket_count() const { return static_cast<uint64_t>(mask_) + 1; }
  std::size_t memory_bytes() const { return bucket_count() * sizeof(Bucket); }

 private:
  struct Bucket {
    uint32_t tag;
    uint32_t slot;
  };
  static constexpr uint64_t kMaxBuckets = 1ull << 32;

  static void clear_buckets(Bucket* b, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) b[i] = Bucket{0, kNotFound};
  }

  void place(uint32_t tag, uint32_t slot) {
    uint32_t i = tag & mask_;
    while (buckets_[i].slot != kNotFound) i = (i + 1) & mask_;
    buckets_[i] = Bucket{tag, slot};
  }

  bool grow() {
    const uint64_t old_count = bucket_count();
    if (old_count >= kMaxBuckets) return false;
    const uint64_t new_count = old_count * 2;
    std::unique_ptr<Bucket[]> fresh(new (std::nothrow) Bucket[new_count]);
    if (!fresh) return false;
    clear_buckets(fresh.get(), new_count);
    std::unique_ptr<Bucket[]> old = std::move(buckets_);
    buckets_ = std::move(fresh);
    mask_ = static_cast<uint32_t>(new_count - 1);
    for (uint64_t i = 0; i < old_count; ++i) {
      if (old[i].slot != kNotFound) place(old[i].tag, old[i].slot);
    }
    return true;
  }

  std::unique_ptr<Bucket[]> buckets_;
  uint32_t mask_ = 0;
  uint32_t size_ = 0;
};

}  // namespace kvtier

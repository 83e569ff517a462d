// PageTable: blocks in sharded slabs, their lookups, copies, pins and publishing, and the scan
// that offers eviction candidates; the snapshot and the audit are in page_table_audit.cpp. See
// page_table.hpp.
#include "scheduler/page_table.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace kvtier {

// Locks the shards of two keys in ascending index order (the same shard once). Shards live in one
// array, so ascending index is ascending address.
class KVTIER_SCOPED_CAPABILITY PageTable::ShardPairLock {
 public:
  ShardPairLock(Shard& a, Shard& b) KVTIER_ACQUIRE(a.mu, b.mu) KVTIER_NO_THREAD_SAFETY_ANALYSIS
      : first_(&a < &b ? &a : &b),
        second_(&a < &b ? &b : &a) {
    first_->mu.lock();
    if (second_ != first_) second_->mu.lock();
  }
  ~ShardPairLock() KVTIER_RELEASE() KVTIER_NO_THREAD_SAFETY_ANALYSIS {
    if (second_ != first_) second_->mu.unlock();
    first_->mu.unlock();
  }
  ShardPairLock(const ShardPairLock&) = delete;
  ShardPairLock& operator=(const ShardPairLock&) = delete;

 private:
  Shard* first_;
  Shard* second_;
};

namespace {

constexpr uint32_t kScanSlotsPerLock = 256;
constexpr std::size_t kStackBackupBytes = 2048;

std::optional<Tier> header_match_tier(const BlockHeader& h, uint32_t layers) {
  if (h.hbm_ready == layers) return Tier::kHbm;
  if (h.mem_ready == layers) return Tier::kHost;
  if (static_cast<CopyState>(h.nvme_state) == CopyState::kReady) return Tier::kNvme;
  return std::nullopt;
}

bool in_flight(CopyState s) { return s == CopyState::kFilling || s == CopyState::kDraining; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction
// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<PageTable>> PageTable::create(const PageTableOptions& options,
                                                     const TierAllocators& allocators) {
  if (options.layers == 0 || options.layers > PageTableOptions::kMaxLayers) {
    return invalid_argument("page table layers must be in 1.." +
                            std::to_string(PageTableOptions::kMaxLayers) + " (got " +
                            std::to_string(options.layers) + ")");
  }
  if (options.shards == 0 || options.shards > PageTableOptions::kMaxShards ||
      (options.shards & (options.shards - 1)) != 0) {
    return invalid_argument("page table shards must be a power of two in 1.." +
                            std::to_string(PageTableOptions::kMaxShards) + " (got " +
                            std::to_string(options.shards) + ")");
  }
  return std::unique_ptr<PageTable>(new PageTable(options, allocators));
}

PageTable::PageTable(const PageTableOptions& options, const TierAllocators& allocators)
    : layout_(EntryLayout::for_layers(options.layers)),
      allocators_(allocators),
      shard_mask_(options.shards - 1),
      shards_(new Shard[options.shards]) {
  const uint64_t per_shard = options.expected_blocks / options.shards;
  for (uint32_t i = 0; i < options.shards; ++i) {
    MutexLock lock(shards_[i].mu);
    shards_[i].slab = EntrySlab(layout_.stride);
    if (per_shard > 0) shards_[i].map = FlatKeyMap(per_shard);
  }
}

PageTable::~PageTable() {
  for (uint32_t i = 0; i < shard_count(); ++i) {
    Shard& s = shards_[i];
    MutexLock lock(s.mu);
    for (uint32_t slot = 0; slot < s.slab.high_water(); ++slot) {
      const EntryRef e = entry_at(s, slot);
      if (!e.header().live()) continue;
      for (uint32_t l = 0; l < layers(); ++l) {
        if (e.hbm_frame(l) != FrameAllocator::kNoFrame) {
          free_tier_frame(allocators_, Tier::kHbm, e.hbm_frame(l)).ignore();
        }
        if (e.host_frame(l) != FrameAllocator::kNoFrame) {
          free_tier_frame(allocators_, Tier::kHost, e.host_frame(l)).ignore();
        }
      }
      if (e.header().nvme_extent != FrameAllocator::kNoFrame) {
        free_tier_frame(allocators_, Tier::kNvme, e.header().nvme_extent).ignore();
      }
    }
  }
  MutexLock lock(held_mu_);
  for (Tier t : kAllTiers) {
    for (uint32_t frame : held_[tier_index(t)]) free_tier_frame(allocators_, t, frame).ignore();
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

uint64_t PageTable::hash_key(const BlockKey& key) {
  // Content keys are already uniform, private keys are (sequence, index) counters: mix both halves
  // (murmur3's finaliser) so shards and home buckets spread either way.
  uint64_t x = key.lo ^ (key.hi * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

Result<uint32_t> PageTable::add_slot(Shard& shard, uint64_t hash, std::string_view verb,
                                     const BlockKey& key) {
  const auto exhausted = [&](std::string_view what) {
    return resource_exhausted("cannot " + std::string(verb) + " block " + to_string(key) +
                              ": no memory " + std::string(what));
  };
  const uint32_t slot = shard.slab.allocate();
  if (slot == EntrySlab::kNoSlot) return exhausted("for another page-table entry");
  if (!shard.map.insert(hash, slot)) {
    shard.slab.release(slot);
    return exhausted("to grow the page-table index");
  }
  return slot;
}

uint32_t PageTable::find_slot(const Shard& shard, uint64_t hash, const BlockKey& key) const {
  // The probe callback runs inside this call, under the same lock; lambdas are analysed on their
  // own, so it reaches the slab through a pointer taken here.
  const EntrySlab* slab = &shard.slab;
  return shard.map.find(hash, [slab, &key](uint32_t slot) {
    BlockKey stored;
    std::memcpy(&stored, slab->at(slot), sizeof(stored));
    return stored == key;
  });
}

Status PageTable::not_found_error(const BlockKey& key) const {
  return not_found("block " + to_string(key) + " is not in the page table");
}

BlockInfo PageTable::info_of(EntryRef entry) const {
  const EntryView v = make_view(entry, nullptr);
  BlockInfo info;
  info.key = v.key();
  info.parent = v.parent();
  info.refcount = v.refcount();
  info.cached_children = v.cached_children();
  info.linked = v.linked();
  info.checksum = v.checksum();
  info.stats = v.stats();
  info.nvme = v.state(CopyId::nvme());
  info.nvme_extent = v.frame(CopyId::nvme());
  info.nvme_generation = v.nvme_generation();
  info.dirty = v.dirty();
  info.match_tier = v.match_tier();
  info.block_pins = v.block_pins();
  info.hinted = v.hinted();
  info.pages.resize(layers());
  for (uint32_t l = 0; l < layers(); ++l) {
    PageInfo& p = info.pages[l];
    p.hbm = v.state(CopyId::hbm(l));
    p.host = v.state(CopyId::host(l));
    p.hbm_frame = v.frame(CopyId::hbm(l));
    p.host_frame = v.frame(CopyId::host(l));
    p.pins = v.pins(l);
  }
  return info;
}

template <typename Op>
auto PageTable::with_entry(const BlockKey& key, Op&& op)
    -> decltype(op(std::declval<EntryView&>())) {
  const uint64_t h = hash_key(key);
  Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  const uint32_t slot = find_slot(s, h, key);
  if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
  const EntryRef e = entry_at(s, slot);
  const uint32_t refs_before = e.header().refcount;
  EntryView view = make_view(e, nullptr);
  auto result = op(view);
  count_references(refs_before, e.header().refcount);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Blocks
// ---------------------------------------------------------------------------------------------

Status PageTable::create_block(const BlockKey& key, const BlockKey& parent, uint32_t initial_refs) {
  if (key.is_null()) return invalid_argument("cannot create a block with the null key");
  if (key == parent) {
    return invalid_argument("cannot create block " + to_string(key) + " as its own parent");
  }
  const uint64_t h = hash_key(key);
  const uint64_t ph = hash_key(parent);
  Shard& ks = shard_for(h);
  Shard& ps = parent.is_null() ? ks : shard_for(ph);
  ShardPairLock lock(ks, ps);
  if (find_slot(ks, h, key) != FlatKeyMap::kNotFound) {
    return already_exists("block " + to_string(key) + " is already in the page table");
  }
  KVTIER_ASSIGN_OR_RETURN(const uint32_t slot, add_slot(ks, h, "create", key));
  const EntryRef e = entry_at(ks, slot);
  e.initialize(key, parent, tick());
  e.header().refcount = initial_refs;
  if (!parent.is_null()) {
    const uint32_t pslot = find_slot(ps, ph, parent);
    if (pslot != FlatKeyMap::kNotFound) {
      ++entry_at(ps, pslot).header().cached_children;
      e.header().flags |= BlockHeader::kLinked;
    }
  }
  if (key.is_private()) private_blocks_.fetch_add(1, std::memory_order_relaxed);
  count_references(0, initial_refs);
  return ok_status();
}

bool PageTable::contains(const BlockKey& key) const {
  const uint64_t h = hash_key(key);
  const Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  return find_slot(s, h, key) != FlatKeyMap::kNotFound;
}

bool PageTable::referenced(const BlockKey& key) const {
  bool held = false;
  visit(key, [&](const EntryView& v) { held = v.refcount() > 0; }).ignore();
  return held;
}

Result<BlockInfo> PageTable::lookup(const BlockKey& key) const {
  const uint64_t h = hash_key(key);
  const Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  const uint32_t slot = find_slot(s, h, key);
  if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
  return info_of(entry_at(s, slot));
}

Status PageTable::erase(const BlockKey& key) {
  const uint64_t h = hash_key(key);
  Shard& ks = shard_for(h);
  // The parent's shard is known only after reading the entry; lock the pair and re-check that the
  // entry is the one read (it could have been erased and re-created with another parent).
  while (true) {
    BlockKey parent;
    bool linked = false;
    {
      MutexLock lock(ks.mu);
      const uint32_t slot = find_slot(ks, h, key);
      if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
      const BlockHeader& hd = entry_at(ks, slot).header();
      parent = hd.parent;
      linked = (hd.flags & BlockHeader::kLinked) != 0;
    }
    const uint64_t ph = hash_key(parent);
    Shard& ps = linked ? shard_for(ph) : ks;
    ShardPairLock lock(ks, ps);
    const uint32_t slot = find_slot(ks, h, key);
    if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
    const EntryRef e = entry_at(ks, slot);
    BlockHeader& hd = e.header();
    if (hd.parent != parent || ((hd.flags & BlockHeader::kLinked) != 0) != linked) continue;

    const std::string what = "cannot erase block " + to_string(key) + ": ";
    if (hd.refcount != 0) {
      return failed_precondition(what + "it has " + std::to_string(hd.refcount) + " references");
    }
    if (hd.pinned_pages != 0 || hd.block_pins != 0) {
      return failed_precondition(
          what + std::to_string(hd.block_pins != 0 ? layout_.layers : hd.pinned_pages) +
          " pages are pinned");
    }
    if (hd.cached_children != 0) {
      return failed_precondition(what + "it has " + std::to_string(hd.cached_children) +
                                 " cached children (erase them first)");
    }
    if (in_flight(static_cast<CopyState>(hd.nvme_state))) {
      return failed_precondition(
          what + "its nvme copy is " +
          std::string(copy_state_name(static_cast<CopyState>(hd.nvme_state))));
    }
    for (uint32_t l = 0; l < layers(); ++l) {
      const uint16_t m = e.meta(l);
      if (in_flight(meta_hbm_state(m)) || in_flight(meta_host_state(m))) {
        const bool hbm = in_flight(meta_hbm_state(m));
        return failed_precondition(
            what + "the " + (hbm ? "hbm" : "host") + " copy of layer " + std::to_string(l) +
            " is " + std::string(copy_state_name(hbm ? meta_hbm_state(m) : meta_host_state(m))));
      }
    }
    uint32_t pslot = FlatKeyMap::kNotFound;
    if (linked) {
      pslot = find_slot(ps, ph, parent);
      if (pslot == FlatKeyMap::kNotFound) {
        return internal_error(what + "its parent " + to_string(parent) +
                              " is gone although the block is counted as its child");
      }
    }

    // Legal: free the ready copies, uncount from the parent, remove.
    Status first_error;
    const auto free_one = [&](Tier t, uint32_t f) {
      if (f == FrameAllocator::kNoFrame) return;
      Status fs = free_tier_frame(allocators_, t, f);
      if (!fs.ok() && first_error.ok()) first_error = std::move(fs);
    };
    for (uint32_t l = 0; l < layers(); ++l) {
      free_one(Tier::kHbm, e.hbm_frame(l));
      free_one(Tier::kHost, e.host_frame(l));
    }
    free_one(Tier::kNvme, hd.nvme_extent);
    if (linked) --entry_at(ps, pslot).header().cached_children;
    ks.map.erase(h, [&](uint32_t s) { return s == slot; });
    hd.flags = 0;
    ks.slab.release(slot);
    if (key.is_private()) private_blocks_.fetch_sub(1, std::memory_order_relaxed);
    return first_error;
  }
}

Result<PublishOutcome> PageTable::publish(const BlockKey& private_key,
                                          const BlockKey& content_key) {
  if (!private_key.is_private()) {
    return invalid_argument("cannot publish block " + to_string(private_key) +
                            ": it is not a private key (namespace tag 0)");
  }
  if (content_key.is_private() || content_key.is_null()) {
    return invalid_argument("cannot publish block " + to_string(private_key) + " as " +
                            to_string(content_key) + ": that is not a content key");
  }
  const uint64_t ph = hash_key(private_key);
  const uint64_t ch = hash_key(content_key);
  Shard& from = shard_for(ph);
  Shard& to = shard_for(ch);
  ShardPairLock lock(from, to);
  const uint32_t slot = find_slot(from, ph, private_key);
  if (slot == FlatKeyMap::kNotFound) return not_found_error(private_key);
  if (find_slot(to, ch, content_key) != FlatKeyMap::kNotFound) {
    return PublishOutcome::kAlreadyCached;
  }
  const EntryRef e = entry_at(from, slot);
  if (e.header().cached_children != 0) {
    return failed_precondition("cannot publish block " + to_string(private_key) + ": it has " +
                               std::to_string(e.header().cached_children) +
                               " cached children, whose parent key would change");
  }
  const auto is_slot = [&](uint32_t s) { return s == slot; };
  if (&from == &to) {
    // Same shard: the entry stays in place and only the index changes. Insert first, so an
    // allocation failure leaves everything as it was.
    if (!to.map.insert(ch, slot)) {
      return resource_exhausted("cannot publish block " + to_string(private_key) +
                                ": no memory to grow the page-table index");
    }
    from.map.erase(ph, is_slot);
    e.header().key = content_key;
    private_blocks_.fetch_sub(1, std::memory_order_relaxed);
    return PublishOutcome::kPublished;
  }
  KVTIER_ASSIGN_OR_RETURN(const uint32_t dest, add_slot(to, ch, "publish", private_key));
  const EntryRef moved = entry_at(to, dest);
  std::memcpy(moved.bytes(), e.bytes(), layout_.stride);
  moved.header().key = content_key;
  from.map.erase(ph, is_slot);
  e.header().flags = 0;
  from.slab.release(slot);
  private_blocks_.fetch_sub(1, std::memory_order_relaxed);
  return PublishOutcome::kPublished;
}

std::size_t PageTable::size() const {
  std::size_t n = 0;
  for (uint32_t i = 0; i < shard_count(); ++i) {
    const Shard& s = shards_[i];
    MutexLock lock(s.mu);
    n += s.map.size();
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Match
// ---------------------------------------------------------------------------------------------

MatchResult PageTable::match(std::span<const BlockKey> keys, const MatchOptions& options) {
  MatchResult result;
  const uint64_t now = options.record_hits ? tick() : 0;
  const uint32_t n_layers = layers();
  for (const BlockKey& key : keys) {
    const uint64_t h = hash_key(key);
    Shard& s = shard_for(h);
    MutexLock lock(s.mu);
    const uint32_t slot = find_slot(s, h, key);
    if (slot == FlatKeyMap::kNotFound) break;
    BlockHeader& hd = entry_at(s, slot).header();
    const std::optional<Tier> tier = header_match_tier(hd, n_layers);
    if (!tier) break;
    if (options.acquire) {
      if (hd.refcount == std::numeric_limits<uint32_t>::max()) break;
      count_references(hd.refcount, hd.refcount + 1);
      ++hd.refcount;
    }
    if (options.record_hits) {
      hd.last_access = now;
      if (hd.hits != std::numeric_limits<uint32_t>::max()) ++hd.hits;
    }
    ++result.blocks;
    ++result.by_tier[static_cast<std::size_t>(tier_index(*tier))];
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// Single-entry operations
// ---------------------------------------------------------------------------------------------

Status PageTable::acquire(const BlockKey& key) {
  return with_entry(key, [](EntryView& v) { return v.acquire(); });
}
Result<HintedCopies> PageTable::acquire_for_reuse(const BlockKey& key) {
  return with_entry(key, [](EntryView& v) -> Result<HintedCopies> {
    KVTIER_RETURN_IF_ERROR(v.acquire());
    return v.take_hinted();
  });
}
Result<bool> PageTable::mark_hinted(const BlockKey& key, Tier tier) {
  return with_entry(key, [tier](EntryView& v) -> Result<bool> { return v.mark_hinted(tier); });
}
Result<uint32_t> PageTable::release(const BlockKey& key) {
  return with_entry(key, [](EntryView& v) { return v.release(); });
}
Status PageTable::touch(const BlockKey& key) {
  return with_entry(key, [](EntryView& v) {
    v.touch();
    return ok_status();
  });
}
Status PageTable::set_checksum(const BlockKey& key, uint64_t checksum) {
  return with_entry(key, [checksum](EntryView& v) {
    v.set_checksum(checksum);
    return ok_status();
  });
}
Result<uint32_t> PageTable::begin_fill(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.begin_fill(copy); });
}
Status PageTable::complete_fill(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.complete_fill(copy); });
}
Status PageTable::abort_fill(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.abort_fill(copy); });
}
Result<uint32_t> PageTable::abandon_fill(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) -> Result<uint32_t> {
    KVTIER_ASSIGN_OR_RETURN(const uint32_t frame, v.abandon_fill(copy));
    MutexLock lock(held_mu_);
    held_[tier_index(copy.tier)].push_back(frame);
    return frame;
  });
}

Status PageTable::release_held_frame(Tier tier, uint32_t frame) {
  {
    MutexLock lock(held_mu_);
    std::vector<uint32_t>& held = held_[tier_index(tier)];
    auto it = std::find(held.begin(), held.end(), frame);
    if (it == held.end()) {
      return failed_precondition("release_held_frame: " + std::string(tier_name(tier)) + " frame " +
                                 std::to_string(frame) + " is not held for an abandoned fill");
    }
    *it = held.back();
    held.pop_back();
  }
  return free_tier_frame(allocators_, tier, frame);
}

std::size_t PageTable::held_frames(Tier tier) const {
  MutexLock lock(held_mu_);
  return held_[tier_index(tier)].size();
}

Status PageTable::begin_drain(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.begin_drain(copy); });
}
Status PageTable::complete_drain(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.complete_drain(copy); });
}
Status PageTable::cancel_drain(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.cancel_drain(copy); });
}
Status PageTable::drop(const BlockKey& key, const CopyId& copy) {
  return with_entry(key, [&](EntryView& v) { return v.drop(copy); });
}
Result<uint32_t> PageTable::drop_all(const BlockKey& key, Tier tier) {
  return with_entry(key, [&](EntryView& v) { return v.drop_all(tier); });
}
Result<uint32_t> PageTable::pin(const BlockKey& key, uint32_t layer) {
  return with_entry(key, [&](EntryView& v) { return v.pin(layer); });
}
std::optional<uint32_t> PageTable::pin_ready(const BlockKey& key, uint32_t layer) {
  if (layer >= layers()) return std::nullopt;
  const uint64_t h = hash_key(key);
  Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  const uint32_t slot = find_slot(s, h, key);
  if (slot == FlatKeyMap::kNotFound) return std::nullopt;
  EntryView v = make_view(entry_at(s, slot), nullptr);
  uint32_t frame = 0;
  if (!v.pin_range(layer, 1, /*ready_only=*/true, &frame, 1)) return std::nullopt;
  return frame;
}

Status PageTable::unpin(const BlockKey& key, uint32_t layer) {
  return with_entry(key, [&](EntryView& v) { return v.unpin(layer); });
}

namespace {

Status no_block_pin(const BlockKey& key) {
  return failed_precondition("cannot unpin block " + to_string(key) +
                             ": it has no block pin (unpin below zero)");
}

// Unpins pages [first_layer, first_layer + count) of one entry; the first page that was not
// pinned, worded by unpin(), goes to `first_error` if that is still OK.
void unpin_pages(EntryView& v, uint32_t first_layer, uint32_t count, Status& first_error) {
  const uint32_t not_pinned = v.unpin_range(first_layer, count);
  // unpin() of a page that is not pinned changes nothing and says so.
  if (not_pinned < first_layer + count && first_error.ok()) first_error = v.unpin(not_pinned);
}

}  // namespace

// Batches lock each shard once for all of its keys instead of once per key: a step's block table
// for one layer is thousands of pins, and the lock round trip is most of a pin's cost.
void PageTable::group_by_shard(std::span<const BlockKey> keys, ShardGroups& g) const {
  const uint32_t shards = shard_count();
  g.hash.resize(keys.size());
  g.order.resize(keys.size());
  g.start.assign(shards + 1, 0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    g.hash[i] = hash_key(keys[i]);
    ++g.start[shard_index(g.hash[i]) + 1];
  }
  for (uint32_t s = 0; s < shards; ++s) g.start[s + 1] += g.start[s];
  std::vector<uint32_t>& fill = g.cursor;
  fill.assign(g.start.begin(), g.start.end() - 1);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    g.order[fill[shard_index(g.hash[i])]++] = static_cast<uint32_t>(i);
  }
}

PageTable::ShardGroups& PageTable::thread_scratch() {
  thread_local ShardGroups groups;
  return groups;
}

template <typename Fn>
std::size_t PageTable::for_each_by_shard(std::span<const BlockKey> keys, Fn&& fn) {
  ShardGroups& g = thread_scratch();
  group_by_shard(keys, g);
  std::size_t done = 0;
  for (uint32_t si = 0; si < shard_count(); ++si) {
    if (g.start[si] == g.start[si + 1]) continue;
    Shard& s = shards_[si];
    MutexLock lock(s.mu);
    for (std::size_t pos = g.start[si]; pos < g.start[si + 1]; ++pos) {
      const uint32_t i = g.order[pos];
      const uint32_t slot = find_slot(s, g.hash[i], keys[i]);
      bool go_on = false;
      if (slot == FlatKeyMap::kNotFound) {
        go_on = fn(i, nullptr, si, slot);
      } else {
        EntryView v = make_view(entry_at(s, slot), nullptr);
        go_on = fn(i, &v, si, slot);
      }
      if (!go_on) return done;
      ++done;
    }
  }
  return done;
}

Status PageTable::check_layer_range(const char* op, uint32_t first, uint32_t count) const {
  if (static_cast<uint64_t>(first) + count <= layers()) return ok_status();
  return invalid_argument(std::string(op) + " of layers [" + std::to_string(first) + ", " +
                          std::to_string(static_cast<uint64_t>(first) + count) +
                          "): the blocks have " + std::to_string(layers()) + " layers");
}

Status PageTable::pin_layers(std::span<const BlockKey> keys, uint32_t first_layer, uint32_t count,
                             std::span<uint32_t> frames) {
  KVTIER_RETURN_IF_ERROR(check_layer_range("pin_layers", first_layer, count));
  const auto what = [&] {
    return "pin_layers of layers [" + std::to_string(first_layer) + ", " +
           std::to_string(static_cast<uint64_t>(first_layer) + count) + ")";
  };
  if (frames.size() != keys.size() * count) {
    return invalid_argument(what() + ": " + std::to_string(keys.size()) + " keys x " +
                            std::to_string(count) + " layers but room for " +
                            std::to_string(frames.size()) + " frames");
  }
  const std::size_t n = keys.size();
  Status failure;
  failure.ignore();
  std::size_t failed_index = 0;
  const std::size_t done =
      for_each_by_shard(keys, [&](uint32_t i, EntryView* v, uint32_t, uint32_t) {
        if (v == nullptr) {
          failure = not_found_error(keys[i]);
        } else if (!v->pin_range(first_layer, count, /*ready_only=*/false,
                                 count == 0 ? nullptr : frames.data() + i, n)) {
          // Which page could not be pinned, in pin()'s words (pin_range changed nothing).
          uint32_t c = 0;
          for (; c < count && failure.ok(); ++c) {
            Result<uint32_t> r = v->pin(first_layer + c);
            if (!r.ok()) failure = std::move(r).status();
          }
          const uint32_t pinned_here = failure.ok() ? c : c - 1;
          for (uint32_t u = 0; u < pinned_here; ++u) v->unpin(first_layer + u).ignore();
          if (failure.ok()) {
            failure = internal_error("block " + to_string(keys[i]) +
                                     ": pin_range refused a page that pin() took");
          }
        }
        failed_index = i;
        return failure.ok();
      });
  if (failure.ok()) return failure;
  const std::vector<uint32_t>& order = thread_scratch().order;
  for (std::size_t pos = 0; pos < done; ++pos) {
    for (uint32_t c = 0; c < count; ++c) unpin(keys[order[pos]], first_layer + c).ignore();
  }
  return failure.with_context(what() + " (block " + std::to_string(failed_index) + " of " +
                              std::to_string(n) + "; the pins taken were released)");
}

Status PageTable::unpin_layers(std::span<const BlockKey> keys, uint32_t first_layer,
                               uint32_t count) {
  KVTIER_RETURN_IF_ERROR(check_layer_range("unpin_layers", first_layer, count));
  Status first_error;
  first_error.ignore();
  for_each_by_shard(keys, [&](uint32_t i, EntryView* v, uint32_t, uint32_t) {
    if (v == nullptr) {
      if (first_error.ok()) first_error = not_found_error(keys[i]);
      return true;
    }
    unpin_pages(*v, first_layer, count, first_error);
    return true;
  });
  return first_error;
}

template <typename Fn>
std::vector<BlockKey> PageTable::for_each_pinned_entry(const PinnedEntries& where, Fn&& fn) {
  std::vector<BlockKey> elsewhere;  // not in the slot they were pinned in
  const std::vector<PinnedEntries::Entry>& entries = where.entries;
  for (std::size_t pos = 0; pos < entries.size();) {
    Shard& s = shards_[entries[pos].shard & shard_mask_];  // masked: never past the shards
    MutexLock lock(s.mu);
    const uint32_t shard = entries[pos].shard;
    for (; pos < entries.size() && entries[pos].shard == shard; ++pos) {
      const PinnedEntries::Entry& e = entries[pos];
      if (!slot_holds(s, e.slot, e.key)) {
        elsewhere.push_back(e.key);
        continue;
      }
      EntryView v = make_view(entry_at(s, e.slot), nullptr);
      fn(v, e.key);
    }
  }
  return elsewhere;
}

Result<uint32_t> PageTable::pin_blocks_ready(std::span<const BlockKey> keys,
                                             std::span<uint32_t> frames, std::span<uint8_t> pinned,
                                             PinnedEntries* where) {
  const uint32_t layers = layout_.layers;
  if (frames.size() != keys.size() * layers || pinned.size() != keys.size()) {
    return invalid_argument("pin_blocks_ready: " + std::to_string(keys.size()) + " keys x " +
                            std::to_string(layers) + " layers but room for " +
                            std::to_string(frames.size()) + " frames and " +
                            std::to_string(pinned.size()) + " marks");
  }
  uint32_t blocks = 0;
  if (where != nullptr) {
    where->entries.clear();
    where->entries.reserve(keys.size());
  }
  for_each_by_shard(keys, [&](uint32_t i, EntryView* v, uint32_t shard, uint32_t slot) {
    pinned[i] = v != nullptr && v->pin_block(frames.data() + std::size_t{i} * layers);
    blocks += pinned[i];
    if (pinned[i] && where != nullptr) where->entries.push_back({shard, slot, keys[i]});
    return true;
  });
  return blocks;
}

Status PageTable::unpin_blocks(const PinnedEntries& where) {
  Status first_error;
  first_error.ignore();
  const auto unpin = [&](EntryView& v, const BlockKey& key) {
    if (!v.unpin_block() && first_error.ok()) first_error = no_block_pin(key);
  };
  const std::vector<BlockKey> elsewhere = for_each_pinned_entry(where, unpin);
  for_each_by_shard(elsewhere, [&](uint32_t i, EntryView* v, uint32_t, uint32_t) {
    if (v == nullptr) {
      if (first_error.ok()) first_error = not_found_error(elsewhere[i]);
    } else {
      unpin(*v, elsewhere[i]);
    }
    return true;
  });
  return first_error;
}

Result<std::vector<BlockKey>> PageTable::split_block_pins(std::span<const BlockKey> keys,
                                                          uint32_t first_layer, uint32_t count) {
  KVTIER_RETURN_IF_ERROR(check_layer_range("split_block_pins", first_layer, count));
  std::vector<uint8_t> whole(keys.size(), 0);
  for_each_by_shard(keys, [&](uint32_t i, EntryView* v, uint32_t, uint32_t) {
    whole[i] = v == nullptr || !v->split_block_pin(first_layer, count);
    return true;
  });
  std::vector<BlockKey> left;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (whole[i]) left.push_back(keys[i]);
  }
  return left;
}

bool PageTable::slot_holds(const Shard& shard, uint32_t slot, const BlockKey& key) const {
  if (slot >= shard.slab.high_water()) return false;
  const BlockHeader& h = entry_at(shard, slot).header();
  return h.live() && h.key == key;
}

Status PageTable::pin_layer(std::span<const BlockKey> keys, uint32_t layer,
                            std::span<uint32_t> frames) {
  return pin_layers(keys, layer, 1, frames);
}

Status PageTable::unpin_layer(std::span<const BlockKey> keys, uint32_t layer) {
  return unpin_layers(keys, layer, 1);
}

// ---------------------------------------------------------------------------------------------
// Compound updates
// ---------------------------------------------------------------------------------------------

Status PageTable::update_erased(const BlockKey& key, Status (*call)(void*, EntryView&), void* fn) {
  const uint64_t h = hash_key(key);
  Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  const uint32_t slot = find_slot(s, h, key);
  if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
  const EntryRef e = entry_at(s, slot);
  std::byte stack_backup[kStackBackupBytes];
  std::unique_ptr<std::byte[]> heap_backup;
  std::byte* backup = stack_backup;
  if (layout_.stride > kStackBackupBytes) {
    heap_backup.reset(new std::byte[layout_.stride]);
    backup = heap_backup.get();
  }
  std::memcpy(backup, e.bytes(), layout_.stride);
  const uint32_t refs_before = e.header().refcount;
  EntryView::Undo undo;
  Status result = [&] {
    EntryView view = make_view(e, &undo);
    return call(fn, view);
  }();
  if (!result.ok()) {
    std::memcpy(e.bytes(), backup, layout_.stride);
    for (const auto& a : undo.allocations) {
      Status fs = free_tier_frame(allocators_, a.tier, a.frame);
      if (!fs.ok()) return fs.with_context("rolling back an update of block " + to_string(key));
    }
    return result;
  }
  count_references(refs_before, e.header().refcount);
  Status first_error;
  for (const auto& f : undo.frees) {
    Status fs = free_tier_frame(allocators_, f.tier, f.frame);
    if (!fs.ok() && first_error.ok()) first_error = std::move(fs);
  }
  return first_error;
}

Status PageTable::visit_erased(const BlockKey& key, void (*call)(void*, const EntryView&),
                               void* fn) const {
  const uint64_t h = hash_key(key);
  const Shard& s = shard_for(h);
  MutexLock lock(s.mu);
  const uint32_t slot = find_slot(s, h, key);
  if (slot == FlatKeyMap::kNotFound) return not_found_error(key);
  const EntryView view = make_view(entry_at(s, slot), nullptr);
  call(fn, view);
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Eviction scans
// ---------------------------------------------------------------------------------------------

bool PageTable::scan_candidates(Tier tier, ScanCursor& cursor, std::size_t max,
                                std::vector<EvictionCandidate>& out) const {
  std::size_t added = 0;
  while (added < max) {
    if (cursor.shard >= shard_count()) {
      cursor = ScanCursor{};
      return true;
    }
    const Shard& s = shards_[cursor.shard];
    MutexLock lock(s.mu);
    const uint32_t end = s.slab.high_water();
    uint32_t budget = kScanSlotsPerLock;
    while (cursor.slot < end && budget > 0 && added < max) {
      const EntryRef e = entry_at(s, cursor.slot++);
      --budget;
      const BlockHeader& hd = e.header();
      if (!hd.live()) continue;
      uint32_t evictable = 0;
      switch (tier) {
        case Tier::kHbm:
          if (hd.hbm_ready == 0 || hd.block_pins != 0) break;
          for (uint32_t l = 0; l < layers(); ++l) {
            const uint16_t m = e.meta(l);
            evictable += meta_hbm_state(m) == CopyState::kReady && meta_pins(m) == 0;
          }
          break;
        case Tier::kHost:
          if (hd.host_copies == 0) break;
          for (uint32_t l = 0; l < layers(); ++l) {
            evictable += meta_host_state(e.meta(l)) == CopyState::kReady;
          }
          break;
        case Tier::kNvme:
          evictable = static_cast<CopyState>(hd.nvme_state) == CopyState::kReady ? 1 : 0;
          break;
      }
      if (evictable == 0) continue;
      EvictionCandidate c;
      c.key = hd.key;
      c.parent = hd.parent;
      c.stats = AccessStats{hd.last_access, hd.inserted, hd.hits};
      c.refcount = hd.refcount;
      c.cached_children = hd.cached_children;
      c.pinned_pages = hd.block_pins != 0 ? layers() : hd.pinned_pages;
      c.evictable = evictable;
      c.dirty = make_view(e, nullptr).dirty();
      out.push_back(c);
      ++added;
    }
    if (cursor.slot >= end) {
      ++cursor.shard;
      cursor.slot = 0;
    }
  }
  return false;
}

std::vector<EvictionCandidate> PageTable::eviction_candidates(Tier tier) const {
  std::vector<EvictionCandidate> out;
  ScanCursor cursor;
  while (!scan_candidates(tier, cursor, std::numeric_limits<std::size_t>::max(), out)) {
  }
  return out;
}

std::size_t PageTable::memory_bytes() const {
  std::size_t bytes = sizeof(*this) + sizeof(Shard) * shard_count();
  for (uint32_t i = 0; i < shard_count(); ++i) {
    const Shard& s = shards_[i];
    MutexLock lock(s.mu);
    bytes += s.map.memory_bytes() + s.slab.memory_bytes();
  }
  return bytes;
}

}  // namespace kvtier

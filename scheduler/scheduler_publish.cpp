// Scheduler: publishing — the full blocks a step filled get their content keys and become
// shareable: a private block is renamed, or, when its content is cached already, the sequence
// shares that copy and its own goes; blocks still busy wait in a pending list. The write policy
// runs on each newly published block. See scheduler.hpp.
#include <algorithm>
#include <string>

#include "scheduler/scheduler.hpp"
#include "scheduler/scheduler_internal.hpp"

namespace kvtier {

Status Scheduler::publish_full_blocks(Sequence& seq, uint64_t old_tokens,
                                      const StepCompletion* completion) {
  // The completion names the blocks this step filled, in order: full_block_keys[j] is block
  // first + j, where first is the block the step's first token went into. Blocks already known
  // by their content key (prompt blocks) must be given that key; a mismatch or a surplus is the
  // engine's error and publishes nothing, so no page is ever shared under a wrong name.
  const uint32_t pt = options_.geometry.page_tokens;
  const uint64_t first = old_tokens / pt;
  const uint64_t full = std::min<uint64_t>(seq.tokens / pt, seq.blocks.size());
  const std::span<const BlockKey> given =
      completion != nullptr ? std::span<const BlockKey>(completion->full_block_keys)
                            : std::span<const BlockKey>();
  const uint64_t filled = full > first ? full - first : 0;
  if (given.size() > filled) {
    return invalid_argument("end_step: sequence " + std::to_string(seq.id) + " was given " +
                            std::to_string(given.size()) + " full_block_keys but the step filled " +
                            std::to_string(filled) + " block(s) (from block " +
                            std::to_string(first) + "); the blocks stay private");
  }
  for (uint64_t j = 0; j < given.size(); ++j) {
    const BlockKey& known = seq.blocks[first + j];
    if (!known.is_private() && known != given[j]) {
      return invalid_argument("end_step: sequence " + std::to_string(seq.id) + " block " +
                              std::to_string(first + j) + " is " + to_string(known) +
                              " but full_block_keys[" + std::to_string(j) + "] names it " +
                              to_string(given[j]) + "; the blocks stay private");
    }
  }
  Status first_error;
  for (uint64_t b = first; b < full; ++b) {
    const BlockKey key = seq.blocks[b];
    if (!key.is_private()) continue;
    BlockKey content;
    if (b - first < given.size()) {
      content = given[b - first];
    } else if (b < seq.prompt_keys.size()) {
      content = seq.prompt_keys[b];
    } else {
      continue;  // no key known: the block stays private to this sequence
    }
    if (block_busy(key)) {
      // A transfer still names the block by its private key (a windowed step demoting the pages
      // it just wrote): publish once it is done, so no transfer outlives the key it was given.
      // A windowed decode moves some page of every block it reads nearly all the time, so its
      // generated blocks are mostly published when it closes. Nothing waits on them sooner:
      // prompt blocks are keyed as the prefill writes them, and a decode's own blocks are read
      // by the next turn, which starts after this sequence ends. (Publishing under a running
      // transfer would need every transfer to follow a renamed key.)
      pending_publish_.push_back(PendingPublish{seq.id, b, key, content});
      continue;
    }
    Status s = publish_block(seq, b, content);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  for (Tier t : {Tier::kHbm, Tier::kHost}) serve_frame_waiters(t);
  return first_error;
}

bool Scheduler::block_busy(const BlockKey& key) const {
  if (reading_.contains(key)) return true;
  for (uint32_t l = 0; l < options_.geometry.layers; ++l) {
    if (ops_.contains(PageKey{key, l, Tier::kHbm}) || ops_.contains(PageKey{key, l, Tier::kHost})) {
      return true;
    }
  }
  return ops_.contains(PageKey{key, CopyId::kWholeBlock, Tier::kNvme});
}

void Scheduler::publish_pending() {
  for (std::size_t i = 0; i < pending_publish_.size();) {
    const PendingPublish p = pending_publish_[i];
    if (p.orphaned) {
      if (block_busy(p.private_key)) {
        ++i;
        continue;
      }
      pending_publish_.erase(pending_publish_.begin() + static_cast<long>(i));
      publish_orphan(p.private_key, p.content);
      continue;
    }
    auto it = sequences_.find(p.sequence);
    if (it == sequences_.end() || p.index >= it->second->blocks.size() ||
        it->second->blocks[p.index] != p.private_key) {
      pending_publish_.erase(pending_publish_.begin() + static_cast<long>(i));
      continue;
    }
    Sequence& seq = *it->second;
    if (seq.active_step != 0 || block_busy(p.private_key)) {
      ++i;
      continue;
    }
    pending_publish_.erase(pending_publish_.begin() + static_cast<long>(i));
    publish_block(seq, p.index, p.content).ignore();
  }
}

void Scheduler::publish_orphan(const BlockKey& key, const BlockKey& content) {
  // Its sequence has closed: published as any full block (unless the content key is cached
  // already), and the reference the pending entry held is given up.
  auto now = publish_as(key, content, /*orphan=*/true);
  if (now.ok()) return;
  now.status().ignore();
  parts_.table->release(key).status().ignore();
  after_change(key);  // private and unreferenced: its copies are dropped
}

Status Scheduler::publish_block(Sequence& seq, uint64_t b, const BlockKey& content) {
  KVTIER_ASSIGN_OR_RETURN(const BlockKey now, publish_as(seq.blocks[b], content, /*orphan=*/false));
  seq.blocks[b] = now;
  return ok_status();
}

// Publishes private block `key` under `content`. The holder is a sequence (the block stays
// referenced, under the key returned), or, for an `orphan`, the pending entry of a sequence that
// closed (its reference is given up here). When `content` is cached already, a sequence shares
// that copy and an orphan is simply dropped; either way the private copies go. Published, the
// policies learn the block under its new key and the write policy applies to it.
Result<BlockKey> Scheduler::publish_as(const BlockKey& key, const BlockKey& content, bool orphan) {
  // An entry may exist under the content key without all of the data: a block evicted from every
  // tier whose entry stays because its children are cached, or one another engine thread is
  // still writing (its pages filling). Sharing it would share missing or unwritten pages — a
  // concurrent step read a layer before its writer had written it — so the sequence keeps its own
  // (private) copy instead. Complete: on NVMe, or every layer with a written copy in memory (one
  // draining still holds its data until its copy below is complete). (An orphan, which nobody
  // reads any more, is dropped below, as publish finds the key taken.)
  bool existing_whole = true;
  bool exists = false;
  Status v = parts_.table->visit(content, [&](const EntryView& e) {
    exists = true;
    if (e.state(CopyId::nvme()) == CopyState::kReady) return;
    const auto written = [](CopyState c) {
      return c == CopyState::kReady || c == CopyState::kDraining;
    };
    for (uint32_t l = 0; l < e.layers() && existing_whole; ++l) {
      existing_whole = written(e.state(CopyId::hbm(l))) || written(e.state(CopyId::host(l)));
    }
  });
  v.ignore();
  if (exists && !existing_whole && !orphan) return key;
  auto outcome = parts_.table->publish(key, content);
  if (!outcome.ok()) return outcome.status();
  facts_[content] = facts_of(key);
  facts_.erase(key);
  if (*outcome == PublishOutcome::kAlreadyCached) {
    // Another sequence computed the same block: share it (a sequence), drop ours.
    if (!orphan) KVTIER_RETURN_IF_ERROR(parts_.table->acquire(content));
    parts_.table->release(key).status().ignore();
    for (Tier t : {Tier::kHbm, Tier::kHost}) parts_.table->drop_all(key, t).status().ignore();
    after_change(key);
    stats_.blocks_deduplicated.fetch_add(1, std::memory_order_relaxed);
    return content;
  }
  stats_.blocks_published.fetch_add(1, std::memory_order_relaxed);
  for (Tier t : kAllTiers) {
    sync_membership(key, t);  // the policies knew it by its private key
    sync_membership(content, t);
  }
  apply_write_policy(content);
  if (orphan) {
    parts_.table->release(content).status().ignore();
    after_change(content);
  }
  return content;
}

void Scheduler::apply_write_policy(const BlockKey& content) {
  // Copy a completed block down now if the write strategy says so.
  auto info = parts_.table->lookup(content);
  if (!info.ok()) return;
  WriteContext ctx;
  ctx.hits = info->stats.hits;
  // A tier holds the block when it holds every page: one page on its way down (a watermark
  // demoted it as its layer ended) does not make host memory hold the block, and taking it for
  // the block left the other pages uncopied and the NVMe write, which reads them all from host
  // memory, never started.
  for (Tier t : kAllTiers) {
    const bool present =
        t == Tier::kNvme
            ? info->nvme != CopyState::kAbsent
            : std::all_of(info->pages.begin(), info->pages.end(), [&](const PageInfo& p) {
                return (t == Tier::kHbm ? p.hbm : p.host) != CopyState::kAbsent;
              });
    if (present) ctx.present = ctx.present.with(t);
  }
  if (parts_.host->capacity() > 0) ctx.available = ctx.available.with(Tier::kHost);
  if (nvme_writable() && parts_.nvme->in_service() > 0) {
    ctx.available = ctx.available.with(Tier::kNvme);
  }
  const TierMask to = write_->on_complete(ctx);
  if (!to.empty()) write_through(content, to);
}

}  // namespace kvtier

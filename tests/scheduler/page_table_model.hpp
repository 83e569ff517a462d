// A single-threaded reference model of the page table, and a harness that applies the same
// operation to the real table and to the model and reports the first divergence.
//
// The model is deliberately naive: a std::map from key to a BlockInfo whose fields it updates by
// the rules written out again here (legality of each transition, pins, references, parents,
// allocation limits, match). Frame numbers are the allocators' choice, so the model records the
// frame the table returned and checks it afterwards against snapshots; audit() checks that they are
// distinct and allocated. Operations are decoded from a byte stream, so the randomized model test
// (bytes from a seeded generator) and the fuzz target (bytes from libFuzzer) share one decoder.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "scheduler/page_table.hpp"
#include "tests/scheduler/page_table_test_util.hpp"

namespace kvtier::pt_test {

// ---------------------------------------------------------------------------------------------
// Operations and their decoding
// ---------------------------------------------------------------------------------------------

enum class OpKind : uint8_t {
  kCreate,
  kErase,
  kPublish,
  kAcquire,
  kRelease,
  kBeginFill,
  kCompleteFill,
  kAbortFill,
  kBeginDrain,
  kCompleteDrain,
  kCancelDrain,
  kDrop,
  kDropAll,
  kPin,
  kUnpin,
  kPinBlock,
  kUnpinBlock,
  kSplitBlockPin,  // one block pin into page pins of layers [0, layer)
  kMarkHinted,     // the copies in `tier` brought in by a hint
  kAcquireForReuse,
  kSetChecksum,
  kTouch,
  kMatch,
  kUpdate,
  kAudit,
};

constexpr int kOpKinds = static_cast<int>(OpKind::kAudit) + 1;

inline const char* op_kind_name(OpKind k) {
  static const char* const kNames[] = {
      "create",       "erase",         "publish",         "acquire",     "release",
      "begin_fill",   "complete_fill", "abort_fill",      "begin_drain", "complete_drain",
      "cancel_drain", "drop",          "drop_all",        "pin",         "unpin",
      "pin_block",    "unpin_block",   "split_block_pin", "mark_hinted", "acquire_for_reuse",
      "set_checksum", "touch",         "match",           "update",      "audit"};
  return kNames[static_cast<int>(k)];
}

// Key pool: kContentKeys content keys, then kPrivateKeys private ones.
constexpr uint32_t kContentKeys = 12;
constexpr uint32_t kPrivateKeys = 4;
constexpr uint32_t kPoolKeys = kContentKeys + kPrivateKeys;

inline BlockKey pool_key(uint32_t i) {
  return i < kContentKeys ? content_key(7000 + i) : private_block_key(1, i - kContentKeys);
}

struct Op {
  OpKind kind = OpKind::kAudit;
  uint32_t key = 0;    // pool index
  uint32_t other = 0;  // create: parent pool index (kPoolKeys = none); publish: content index
  Tier tier = Tier::kHbm;
  uint32_t layer = 0;           // may be == layers (an invalid layer, on purpose)
  uint8_t generation_mode = 0;  // NVMe: 0 any, 1 current, 2 a wrong one
  uint8_t match_flags = 0;      // bit 0 record hits, bit 1 acquire
  uint32_t refs = 0;
  uint32_t value = 0;   // checksum; match: chain start and length
  std::vector<Op> sub;  // update: the operations run inside one update
};

// Bytes from a buffer (fuzzing) or from a seeded generator (model test).
class ByteSource {
 public:
  explicit ByteSource(std::span<const uint8_t> data) : data_(data) {}
  explicit ByteSource(uint64_t seed) : rng_(std::make_unique<std::mt19937_64>(seed)) {}
  bool empty() const { return !rng_ && pos_ >= data_.size(); }
  uint8_t next() {
    if (rng_) return static_cast<uint8_t>((*rng_)());
    return pos_ < data_.size() ? data_[pos_++] : 0;
  }

 private:
  std::span<const uint8_t> data_;
  std::size_t pos_ = 0;
  std::unique_ptr<std::mt19937_64> rng_;
};

// Weighted: fills and pins are common, audits and updates less so.
// clang-format off
inline constexpr OpKind kKindTable[] = {
    OpKind::kCreate,      OpKind::kCreate,       OpKind::kCreate,       OpKind::kCreate,
    OpKind::kErase,       OpKind::kErase,        OpKind::kPublish,      OpKind::kAcquire,
    OpKind::kRelease,     OpKind::kBeginFill,    OpKind::kBeginFill,    OpKind::kBeginFill,
    OpKind::kBeginFill,   OpKind::kCompleteFill, OpKind::kCompleteFill, OpKind::kCompleteFill,
    OpKind::kAbortFill,   OpKind::kBeginDrain,   OpKind::kBeginDrain,   OpKind::kCompleteDrain,
    OpKind::kCancelDrain, OpKind::kDrop,         OpKind::kDrop,         OpKind::kDropAll,
    OpKind::kPin,         OpKind::kPin,          OpKind::kUnpin,        OpKind::kUnpin,
    OpKind::kPinBlock,    OpKind::kPinBlock,     OpKind::kUnpinBlock,   OpKind::kSplitBlockPin,
    OpKind::kMarkHinted,  OpKind::kMarkHinted,   OpKind::kAcquireForReuse,
    OpKind::kAcquireForReuse,
    OpKind::kSetChecksum, OpKind::kTouch,        OpKind::kMatch,        OpKind::kMatch,
    OpKind::kUpdate,      OpKind::kUpdate,       OpKind::kUpdate,       OpKind::kAudit};
// clang-format on

inline bool decode_op(ByteSource& src, uint32_t layers, Op& op, bool nested = false) {
  if (src.empty()) return false;
  const uint8_t b0 = src.next(), b1 = src.next(), b2 = src.next(), b3 = src.next();
  op = Op{};
  op.kind = kKindTable[b0 % std::size(kKindTable)];
  if (nested &&
      (op.kind == OpKind::kUpdate || op.kind == OpKind::kAudit || op.kind == OpKind::kCreate ||
       op.kind == OpKind::kErase || op.kind == OpKind::kPublish || op.kind == OpKind::kMatch)) {
    op.kind = OpKind::kBeginFill;  // only single-entry operations exist inside an update
  }
  op.key = b1 % kPoolKeys;
  op.tier = static_cast<Tier>(b2 % 3);
  const uint32_t l = (b2 >> 2) & 15;
  op.layer = l == 15 ? layers : l % layers;
  op.generation_mode = static_cast<uint8_t>((b2 >> 6) % 3);
  op.match_flags = static_cast<uint8_t>(b3 & 3);
  op.other = (b3 >> 2) % (kPoolKeys + 1);
  op.refs = b3 >> 6;
  op.value = b3;
  if (op.kind == OpKind::kUpdate) {
    const uint32_t n = 1 + b3 % 4;
    for (uint32_t i = 0; i < n; ++i) {
      Op s;
      if (!decode_op(src, layers, s, /*nested=*/true)) break;
      op.sub.push_back(std::move(s));
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

struct Model {
  uint32_t layers = 0;
  std::array<uint32_t, kNumTiers> capacity{};
  std::array<uint32_t, kNumTiers> used{};
  uint64_t clock = 0;
  uint64_t generations = 0;
  std::map<BlockKey, BlockInfo> blocks;

  // Inside an update: frees are deferred to commit.
  bool deferred = false;
  std::vector<Tier> pending_frees;

  static CopyState state_of(const BlockInfo& b, const CopyId& c) {
    if (c.tier == Tier::kNvme) return b.nvme;
    return c.tier == Tier::kHbm ? b.pages[c.layer].hbm : b.pages[c.layer].host;
  }
  static CopyState& state_ref(BlockInfo& b, const CopyId& c) {
    if (c.tier == Tier::kNvme) return b.nvme;
    return c.tier == Tier::kHbm ? b.pages[c.layer].hbm : b.pages[c.layer].host;
  }
  static uint32_t& frame_ref(BlockInfo& b, const CopyId& c) {
    if (c.tier == Tier::kNvme) return b.nvme_extent;
    return c.tier == Tier::kHbm ? b.pages[c.layer].hbm_frame : b.pages[c.layer].host_frame;
  }

  static std::optional<Tier> match_tier(const BlockInfo& b) {
    bool all_hbm = true, all_mem = true;
    for (const PageInfo& p : b.pages) {
      all_hbm = all_hbm && p.hbm == CopyState::kReady;
      all_mem = all_mem && (p.hbm == CopyState::kReady || p.host == CopyState::kReady);
    }
    if (all_hbm) return Tier::kHbm;
    if (all_mem) return Tier::kHost;
    if (b.nvme == CopyState::kReady) return Tier::kNvme;
    return std::nullopt;
  }
  static bool dirty(const BlockInfo& b) {
    if (b.nvme == CopyState::kReady) return false;
    for (const PageInfo& p : b.pages) {
      for (CopyState s : {p.hbm, p.host}) {
        if (s == CopyState::kReady || s == CopyState::kDraining) return true;
      }
    }
    return false;
  }

  CopyId copy_of(const Op& op, const BlockInfo* b) const {
    if (op.tier != Tier::kNvme) return CopyId::page(op.tier, op.layer);
    uint64_t g = CopyId::kAnyGeneration;
    if (b != nullptr && op.generation_mode == 1) g = b->nvme_generation;
    if (b != nullptr && op.generation_mode == 2) g = b->nvme_generation + 1;
    return CopyId::nvme(g);
  }

  // Expected code of a copy transition on block b.
  StatusCode check_copy_op(const BlockInfo& b, OpKind k, const CopyId& c) const {
    if (c.tier == Tier::kNvme) {
      if (c.layer != CopyId::kWholeBlock) return StatusCode::kInvalidArgument;
      if (k == OpKind::kBeginFill && c.generation != CopyId::kAnyGeneration) {
        return StatusCode::kInvalidArgument;
      }
    } else if (c.layer >= layers || c.generation != CopyId::kAnyGeneration) {
      return StatusCode::kInvalidArgument;
    }
    const CopyState s = state_of(b, c);
    CopyState from = CopyState::kAbsent;
    bool needs_unpinned = false;
    switch (k) {
      case OpKind::kBeginFill: from = CopyState::kAbsent; break;
      case OpKind::kCompleteFill: from = CopyState::kFilling; break;
      case OpKind::kAbortFill:
        from = CopyState::kFilling;
        needs_unpinned = true;
        break;
      case OpKind::kBeginDrain:
        from = CopyState::kReady;
        needs_unpinned = true;
        break;
      case OpKind::kCompleteDrain:
        from = CopyState::kDraining;
        needs_unpinned = true;
        break;
      case OpKind::kCancelDrain: from = CopyState::kDraining; break;
      case OpKind::kDrop:
        from = CopyState::kReady;
        needs_unpinned = true;
        break;
      default: return StatusCode::kInternal;
    }
    if (s != from) return StatusCode::kFailedPrecondition;
    if (c.tier == Tier::kNvme && c.generation != CopyId::kAnyGeneration &&
        c.generation != b.nvme_generation) {
      return StatusCode::kFailedPrecondition;
    }
    if (needs_unpinned && c.tier == Tier::kHbm && b.pages[c.layer].pins > 0) {
      return StatusCode::kFailedPrecondition;
    }
    if (k == OpKind::kBeginFill && used[tier_index(c.tier)] >= capacity[tier_index(c.tier)]) {
      return StatusCode::kResourceExhausted;
    }
    return StatusCode::kOk;
  }

  void free_copy(Tier t) {
    if (deferred) {
      pending_frees.push_back(t);
    } else {
      --used[tier_index(t)];
    }
  }

  // Applies a legal copy transition; `frame` is what the table returned for begin_fill.
  void apply_copy_op(BlockInfo& b, OpKind k, const CopyId& c, uint32_t frame) {
    CopyState& s = state_ref(b, c);
    uint32_t& f = frame_ref(b, c);
    switch (k) {
      case OpKind::kBeginFill:
        s = CopyState::kFilling;
        f = frame;
        ++used[tier_index(c.tier)];
        if (c.tier == Tier::kNvme) b.nvme_generation = ++generations;
        break;
      case OpKind::kCompleteFill: s = CopyState::kReady; break;
      case OpKind::kCancelDrain: s = CopyState::kReady; break;
      case OpKind::kBeginDrain: s = CopyState::kDraining; break;
      case OpKind::kAbortFill:
      case OpKind::kCompleteDrain:
      case OpKind::kDrop:
        s = CopyState::kAbsent;
        f = FrameAllocator::kNoFrame;
        free_copy(c.tier);
        forget_gone_hints(b);
        break;
      default: break;
    }
  }

  static bool any_copy(const BlockInfo& b, Tier t) {
    return std::any_of(b.pages.begin(), b.pages.end(), [t](const PageInfo& p) {
      return (t == Tier::kHbm ? p.hbm : p.host) != CopyState::kAbsent;
    });
  }
  // A hint's mark goes with the copies it marks: HBM's with the last HBM copy, host's with the
  // last copy in memory.
  static void forget_gone_hints(BlockInfo& b) {
    if (any_copy(b, Tier::kHbm)) return;
    b.hinted.hbm = false;
    if (!any_copy(b, Tier::kHost)) b.hinted.host = false;
  }
};

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

class Harness {
 public:
  static Result<std::unique_ptr<Harness>> create(uint32_t layers, uint32_t shards,
                                                 uint32_t hbm_frames, uint32_t host_frames,
                                                 uint32_t nvme_extents) {
    KVTIER_ASSIGN_OR_RETURN(TableRig rig,
                            TableRig::make(layers, shards, hbm_frames, host_frames, nvme_extents));
    auto h = std::unique_ptr<Harness>(new Harness(std::move(rig)));
    h->model_.layers = layers;
    h->model_.capacity = {hbm_frames, host_frames, nvme_extents};
    return h;
  }

  PageTable& table() { return *rig_.table; }
  const Model& model() const { return model_; }
  uint64_t ops_applied() const { return ops_; }
  // Operations the table accepted (the rest were refused, as the model expected).
  uint64_t ops_accepted() const { return accepted_; }
  uint64_t ops_accepted(OpKind kind) const { return accepted_by_kind_[static_cast<int>(kind)]; }

  // Applies op to the table and to the model; returns "" or a description of the divergence.
  std::string apply(const Op& op) {
    ++ops_;
    const uint64_t before = accepted_;
    std::string err = apply_one(op);
    accepted_by_kind_[static_cast<int>(op.kind)] += accepted_ - before;
    if (!err.empty())
      return "op " + std::to_string(ops_) + " " + op_kind_name(op.kind) + ": " + err;
    return "";
  }

  // Random operations on random copies are mostly illegal; a byte of the same stream per
  // operation (and per operation inside an update) turns three in four copy operations and unpins
  // into ones the model says are legal, so long sequences reach deep states. The rest stay raw, to
  // keep illegal transitions in the mix.
  void steer(Op& op, ByteSource& src) const {
    const bool decoded_update = op.kind == OpKind::kUpdate;
    steer_one(op, src.next(), /*nested=*/false);
    if (!decoded_update) return;  // an update steer_one made is legal as it is
    for (Op& sub : op.sub) steer_one(sub, src.next(), /*nested=*/true);
  }

  void steer_one(Op& op, uint8_t selector, bool nested) const {
    if (selector % 4 == 0) return;
    const auto it = model_.blocks.find(pool_key(op.key));
    if (it == model_.blocks.end()) return;
    const BlockInfo& b = it->second;
    const uint32_t pick = selector >> 2;
    // A full pool and references that pile up would leave only refusals: recycle blocks.
    if (op.kind == OpKind::kCreate) op.kind = OpKind::kErase;
    if (op.kind == OpKind::kAcquire && b.refcount > 1 && pick % 2) op.kind = OpKind::kRelease;
    if (op.kind == OpKind::kErase) {
      if (b.refcount > 0) {
        op.kind = OpKind::kRelease;
        return;
      }
      if (b.block_pins > 0) {
        op.kind = OpKind::kUnpinBlock;
        return;
      }
      for (uint32_t l = 0; l < model_.layers; ++l) {
        if (b.pages[l].pins > 0) {
          op.kind = OpKind::kUnpin;
          op.layer = l;
          return;
        }
      }
      return;
    }
    if ((op.kind == OpKind::kUnpinBlock || op.kind == OpKind::kSplitBlockPin) &&
        b.block_pins == 0) {
      op.kind = OpKind::kPinBlock;
      return;
    }
    if (op.kind == OpKind::kUnpin || op.kind == OpKind::kPin) {
      for (uint32_t i = 0; i < model_.layers; ++i) {
        const uint32_t l = (op.layer + i) % model_.layers;
        const bool pinned = own_pins(b, l) > 0;
        const bool pinnable =
            b.pages[l].hbm == CopyState::kFilling || b.pages[l].hbm == CopyState::kReady;
        if ((op.kind == OpKind::kUnpin && pinned) || (op.kind == OpKind::kPin && pinnable)) {
          op.layer = l;
          return;
        }
      }
      return;
    }
    if (op.kind == OpKind::kPinBlock && !nested) {
      // A block pin needs every page ready in HBM, rare among random copy operations: take a
      // block that has them, or make this one's ready and pin it in one update (which the table
      // rolls back, block pin and all, when HBM has too few frames).
      for (uint32_t i = 0; i < kPoolKeys; ++i) {
        const uint32_t k = (op.key + i) % kPoolKeys;
        const auto other = model_.blocks.find(pool_key(k));
        if (other == model_.blocks.end()) continue;
        const auto& pages = other->second.pages;
        if (std::all_of(pages.begin(), pages.end(),
                        [](const PageInfo& p) { return p.hbm == CopyState::kReady; })) {
          op.key = k;
          return;
        }
      }
      Op pin = op;
      op.kind = OpKind::kUpdate;
      op.sub.clear();
      for (uint32_t l = 0; l < model_.layers; ++l) {
        Op sub = pin;
        sub.tier = Tier::kHbm;
        sub.layer = l;
        const auto add = [&](OpKind k) {
          sub.kind = k;
          op.sub.push_back(sub);
        };
        switch (b.pages[l].hbm) {
          case CopyState::kAbsent:
            add(OpKind::kBeginFill);
            add(OpKind::kCompleteFill);
            break;
          case CopyState::kFilling: add(OpKind::kCompleteFill); break;
          case CopyState::kDraining: add(OpKind::kCancelDrain); break;
          case CopyState::kReady: break;
        }
      }
      op.sub.push_back(pin);
      return;
    }
    if (op.kind < OpKind::kBeginFill || op.kind > OpKind::kDrop) return;
    if (op.tier != Tier::kNvme && op.layer >= model_.layers) return;
    const CopyId c = op.tier == Tier::kNvme ? CopyId::nvme() : CopyId::page(op.tier, op.layer);
    op.generation_mode = static_cast<uint8_t>(op.tier == Tier::kNvme ? pick % 2 : 0);
    switch (Model::state_of(b, c)) {
      case CopyState::kAbsent:
        op.generation_mode = 0;
        op.kind = OpKind::kBeginFill;
        if (model_.used[tier_index(op.tier)] >= model_.capacity[tier_index(op.tier)] && pick % 2) {
          op.kind = OpKind::kDropAll;  // make room
        }
        break;
      case CopyState::kFilling:
        op.kind = pick % 4 ? OpKind::kCompleteFill : OpKind::kAbortFill;
        break;
      case CopyState::kReady: op.kind = pick % 3 ? OpKind::kBeginDrain : OpKind::kDrop; break;
      case CopyState::kDraining:
        op.kind = pick % 3 ? OpKind::kCompleteDrain : OpKind::kCancelDrain;
        break;
    }
  }

  // Full comparison of a snapshot with the model, plus the allocators' counts.
  std::string compare_all() {
    const std::map<BlockKey, BlockInfo> snap = table().snapshot();
    if (snap.size() != model_.blocks.size()) {
      return "table has " + std::to_string(snap.size()) + " blocks, model " +
             std::to_string(model_.blocks.size());
    }
    for (const auto& [key, mb] : model_.blocks) {
      const auto it = snap.find(key);
      if (it == snap.end()) return "block " + to_string(key) + " missing from the table";
      BlockInfo expected = mb;
      expected.dirty = Model::dirty(mb);
      expected.match_tier = Model::match_tier(mb);
      if (!(it->second == expected)) {
        return "block " + to_string(key) + " differs:\n  table " + describe(it->second) +
               "\n  model " + describe(expected);
      }
    }
    for (Tier t : kAllTiers) {
      if (rig_.used(t) != model_.used[tier_index(t)]) {
        return std::string(tier_name(t)) + " used " + std::to_string(rig_.used(t)) + ", model " +
               std::to_string(model_.used[tier_index(t)]);
      }
    }
    if (table().now() != model_.clock) {
      return "clock " + std::to_string(table().now()) + ", model " + std::to_string(model_.clock);
    }
    return "";
  }

  static std::string describe(const BlockInfo& b) {
    std::ostringstream o;
    o << "refs=" << b.refcount << " children=" << b.cached_children << " linked=" << b.linked
      << " sum=" << (b.checksum ? std::to_string(*b.checksum) : "-")
      << " stats=" << b.stats.last_access << "/" << b.stats.inserted << "/" << b.stats.hits
      << " nvme=" << copy_state_name(b.nvme) << ":" << b.nvme_extent << "@" << b.nvme_generation
      << " dirty=" << b.dirty
      << " tier=" << (b.match_tier ? std::string(tier_name(*b.match_tier)) : "-")
      << " block_pins=" << b.block_pins << " hinted=" << b.hinted.hbm << b.hinted.host << " pages=";
    for (const PageInfo& p : b.pages) {
      o << "[" << copy_state_name(p.hbm) << ":" << p.hbm_frame << " " << copy_state_name(p.host)
        << ":" << p.host_frame << " pins " << p.pins << "]";
    }
    return o.str();
  }

 private:
  explicit Harness(TableRig rig) : rig_(std::move(rig)) {}

  static std::string code_mismatch(StatusCode table, StatusCode model, const Status& s) {
    return std::string("table returned ") + std::string(status_code_name(table)) +
           " but the model expects " + std::string(status_code_name(model)) + " (" + s.to_string() +
           ")";
  }

  BlockInfo* find(const BlockKey& k) {
    auto it = model_.blocks.find(k);
    return it == model_.blocks.end() ? nullptr : &it->second;
  }

  // One single-entry operation as the model sees it, given what the table did (code and value).
  // Returns the model's expected code; when both agree on OK, the model is updated.
  StatusCode model_single(BlockInfo& b, const Op& op, const CopyId& c, StatusCode table_code,
                          uint64_t table_value, std::string& err) {
    StatusCode want = StatusCode::kOk;
    switch (op.kind) {
      case OpKind::kAcquire: break;
      case OpKind::kRelease:
        if (b.refcount == 0) want = StatusCode::kFailedPrecondition;
        break;
      case OpKind::kPin:
        if (op.layer >= model_.layers) {
          want = StatusCode::kInvalidArgument;
        } else if (b.pages[op.layer].hbm != CopyState::kFilling &&
                   b.pages[op.layer].hbm != CopyState::kReady) {
          want = StatusCode::kFailedPrecondition;
        } else if (own_pins(b, op.layer) == kMaxPins) {
          want = StatusCode::kResourceExhausted;
        }
        break;
      case OpKind::kUnpin:
        if (op.layer >= model_.layers) {
          want = StatusCode::kInvalidArgument;
        } else if (own_pins(b, op.layer) == 0) {
          want = StatusCode::kFailedPrecondition;
        }
        break;
      case OpKind::kPinBlock:
        for (const PageInfo& p : b.pages) {
          if (p.hbm != CopyState::kReady) want = StatusCode::kFailedPrecondition;
        }
        break;
      case OpKind::kUnpinBlock:
        if (b.block_pins == 0) want = StatusCode::kFailedPrecondition;
        break;
      case OpKind::kSplitBlockPin:
        if (b.block_pins == 0) want = StatusCode::kFailedPrecondition;
        for (uint32_t l = 0; l < op.layer && l < model_.layers; ++l) {
          if (own_pins(b, l) == kMaxPins) want = StatusCode::kFailedPrecondition;
        }
        break;
      case OpKind::kSetChecksum:
      case OpKind::kTouch:
      case OpKind::kMarkHinted:
      case OpKind::kAcquireForReuse:
      case OpKind::kDropAll: break;
      default: want = model_.check_copy_op(b, op.kind, c); break;
    }
    if (want != table_code || want != StatusCode::kOk) return want;
    ++accepted_;
    switch (op.kind) {
      case OpKind::kAcquire: ++b.refcount; break;
      case OpKind::kRelease:
        --b.refcount;
        if (table_value != b.refcount) err = "release returned " + std::to_string(table_value);
        break;
      case OpKind::kPin:
        ++b.pages[op.layer].pins;
        if (table_value != b.pages[op.layer].hbm_frame) {
          err = "pin returned frame " + std::to_string(table_value) + ", the page holds " +
                std::to_string(b.pages[op.layer].hbm_frame);
        }
        break;
      case OpKind::kUnpin: --b.pages[op.layer].pins; break;
      case OpKind::kPinBlock:
        ++b.block_pins;
        for (PageInfo& p : b.pages) ++p.pins;
        if (table_value != b.pages.back().hbm_frame) {
          err = "pin_block gave the last layer frame " + std::to_string(table_value) +
                ", the page holds " + std::to_string(b.pages.back().hbm_frame);
        }
        break;
      case OpKind::kUnpinBlock:
        --b.block_pins;
        for (PageInfo& p : b.pages) --p.pins;
        break;
      case OpKind::kSplitBlockPin:
        --b.block_pins;
        for (uint32_t l = op.layer; l < model_.layers; ++l) --b.pages[l].pins;
        break;
      case OpKind::kMarkHinted: {
        bool* mark = op.tier == Tier::kHbm    ? &b.hinted.hbm
                     : op.tier == Tier::kHost ? &b.hinted.host
                                              : nullptr;
        const bool marked =
            mark != nullptr && !*mark && Model::any_copy(b, op.tier) && b.refcount == 0;
        if (marked) *mark = true;
        if (table_value != marked) err = "mark_hinted returned " + std::to_string(table_value);
        break;
      }
      case OpKind::kAcquireForReuse: {
        ++b.refcount;
        const uint64_t marks = encode(b.hinted);
        b.hinted = HintedCopies{};
        if (table_value != marks) {
          err = "acquire_for_reuse returned marks " + std::to_string(table_value) + ", model " +
                std::to_string(marks);
        }
        break;
      }
      case OpKind::kSetChecksum: b.checksum = op.value; break;
      case OpKind::kTouch: b.stats.last_access = ++model_.clock; break;
      case OpKind::kDropAll: {
        uint32_t n = 0;
        if (op.tier == Tier::kNvme) {
          if (b.nvme == CopyState::kReady) {
            model_.apply_copy_op(b, OpKind::kDrop, CopyId::nvme(), 0);
            n = 1;
          }
        } else {
          for (uint32_t l = 0; l < model_.layers; ++l) {
            const CopyId pc = CopyId::page(op.tier, l);
            if (Model::state_ref(b, pc) != CopyState::kReady) continue;
            if (op.tier == Tier::kHbm && b.pages[l].pins > 0) continue;
            model_.apply_copy_op(b, OpKind::kDrop, pc, 0);
            ++n;
          }
        }
        if (table_value != n) err = "drop_all returned " + std::to_string(table_value);
        break;
      }
      default: model_.apply_copy_op(b, op.kind, c, static_cast<uint32_t>(table_value)); break;
    }
    return want;
  }

  // Runs a single-entry operation on a view (inside update) or on the table.
  struct Outcome {
    StatusCode code = StatusCode::kOk;
    uint64_t value = 0;
    std::string message;
  };
  template <typename Target>
  static Outcome run_single(Target& t, const Op& op, const CopyId& c) {
    Outcome o;
    const auto take = [&](const Status& s) {
      o.code = s.code();
      if (!s.ok()) o.message = s.to_string();
    };
    const auto take_r = [&](const auto& r) {
      take(r.status());
      if (r.ok()) o.value = *r;
    };
    switch (op.kind) {
      case OpKind::kAcquire: take(t.acquire()); break;
      case OpKind::kRelease: take_r(t.release()); break;
      case OpKind::kPin: take_r(t.pin(op.layer)); break;
      case OpKind::kUnpin: take(t.unpin(op.layer)); break;
      case OpKind::kPinBlock: take_r(pin_block(t)); break;
      case OpKind::kUnpinBlock: take(unpin_block(t)); break;
      case OpKind::kSplitBlockPin: take(split_block_pin(t, op.layer)); break;
      case OpKind::kMarkHinted: take_r(mark_hinted(t, op.tier)); break;
      case OpKind::kAcquireForReuse: take_r(acquire_for_reuse(t)); break;
      case OpKind::kSetChecksum: t.set_checksum(op.value); break;
      case OpKind::kTouch: t.touch(); break;
      case OpKind::kDropAll: take_r(t.drop_all(op.tier)); break;
      case OpKind::kBeginFill: take_r(t.begin_fill(c)); break;
      case OpKind::kCompleteFill: take(t.complete_fill(c)); break;
      case OpKind::kAbortFill: take(t.abort_fill(c)); break;
      case OpKind::kBeginDrain: take(t.begin_drain(c)); break;
      case OpKind::kCompleteDrain: take(t.complete_drain(c)); break;
      case OpKind::kCancelDrain: take(t.cancel_drain(c)); break;
      case OpKind::kDrop: take(t.drop(c)); break;
      default: o.code = StatusCode::kInternal; break;
    }
    if constexpr (requires { t.last_code; }) {
      if (op.kind == OpKind::kSetChecksum || op.kind == OpKind::kTouch) o.code = t.last_code;
    }
    return o;
  }

  // Hint marks as one value: bit 0 HBM, bit 1 host.
  static uint64_t encode(const HintedCopies& h) { return (h.hbm ? 1u : 0u) | (h.host ? 2u : 0u); }
  static Result<uint64_t> mark_hinted(EntryView& v, Tier t) { return v.mark_hinted(t) ? 1 : 0; }
  static Result<uint64_t> acquire_for_reuse(EntryView& v) {
    KVTIER_RETURN_IF_ERROR(v.acquire());
    return encode(v.take_hinted());
  }
  struct TableTarget;
  static Result<uint64_t> mark_hinted(TableTarget& t, Tier tier) {
    KVTIER_ASSIGN_OR_RETURN(const bool marked, t.pt.mark_hinted(t.key, tier));
    return marked ? 1 : 0;
  }
  static Result<uint64_t> acquire_for_reuse(TableTarget& t) {
    KVTIER_ASSIGN_OR_RETURN(const HintedCopies marks, t.pt.acquire_for_reuse(t.key));
    return encode(marks);
  }

  // A page's pins of its own: its pins less its block's.
  static uint32_t own_pins(const BlockInfo& b, uint32_t layer) {
    return b.pages[layer].pins - b.block_pins;
  }

  // Block pins on a view (returns the frame of the last layer) and on the table (its batched
  // calls over one key; unpin_blocks through an entry in no slot, so it looks the key up).
  static Result<uint32_t> pin_block(EntryView& v) {
    std::vector<uint32_t> frames(v.layers());
    if (!v.pin_block(frames.data())) return failed_precondition("pin_block refused");
    return frames.back();
  }
  static Status unpin_block(EntryView& v) {
    return v.unpin_block() ? ok_status() : failed_precondition("unpin_block refused");
  }
  static Status split_block_pin(EntryView& v, uint32_t count) {
    return v.split_block_pin(0, std::min(count, v.layers()))
               ? ok_status()
               : failed_precondition("split_block_pin refused");
  }
  static Result<uint32_t> pin_block(TableTarget& t) {
    const BlockKey keys[] = {t.key};
    std::vector<uint32_t> frames(t.pt.layers());
    uint8_t pinned = 0;
    KVTIER_ASSIGN_OR_RETURN(uint32_t n, t.pt.pin_blocks_ready(keys, frames, {&pinned, 1}));
    if (n == 1) return frames.back();
    return t.pt.contains(t.key) ? failed_precondition("pin_blocks_ready refused")
                                : not_found("no block");
  }
  static Status unpin_block(TableTarget& t) {
    PageTable::PinnedEntries where;
    where.entries.push_back({0, std::numeric_limits<uint32_t>::max(), t.key});
    return t.pt.unpin_blocks(where);
  }
  static Status split_block_pin(TableTarget& t, uint32_t count) {
    const BlockKey keys[] = {t.key};
    KVTIER_ASSIGN_OR_RETURN(auto left,
                            t.pt.split_block_pins(keys, 0, std::min(count, t.pt.layers())));
    if (left.empty()) return ok_status();
    return t.pt.contains(t.key) ? failed_precondition("split_block_pins refused")
                                : not_found("no block");
  }

  // The table's own single-entry methods, shaped like an EntryView for run_single.
  struct TableTarget {
    PageTable& pt;
    BlockKey key;
    Status acquire() { return pt.acquire(key); }
    Result<uint32_t> release() { return pt.release(key); }
    Result<uint32_t> pin(uint32_t l) { return pt.pin(key, l); }
    Status unpin(uint32_t l) { return pt.unpin(key, l); }
    // The view's forms return nothing; the table's report a missing block.
    StatusCode last_code = StatusCode::kOk;
    void set_checksum(uint64_t v) { last_code = pt.set_checksum(key, v).code(); }
    void touch() { last_code = pt.touch(key).code(); }
    Result<uint32_t> drop_all(Tier t) { return pt.drop_all(key, t); }
    Result<uint32_t> begin_fill(const CopyId& c) { return pt.begin_fill(key, c); }
    Status complete_fill(const CopyId& c) { return pt.complete_fill(key, c); }
    Status abort_fill(const CopyId& c) { return pt.abort_fill(key, c); }
    Status begin_drain(const CopyId& c) { return pt.begin_drain(key, c); }
    Status complete_drain(const CopyId& c) { return pt.complete_drain(key, c); }
    Status cancel_drain(const CopyId& c) { return pt.cancel_drain(key, c); }
    Status drop(const CopyId& c) { return pt.drop(key, c); }
  };

  std::string apply_one(const Op& op) {
    const BlockKey key = pool_key(op.key);
    BlockInfo* b = find(key);
    switch (op.kind) {
      case OpKind::kCreate: return do_create(op);
      case OpKind::kErase: return do_erase(key);
      case OpKind::kPublish: return do_publish(op);
      case OpKind::kMatch: return do_match(op);
      case OpKind::kUpdate: return do_update(op);
      case OpKind::kAudit: {
        Status s = table().audit();
        if (!s.ok()) return "audit: " + s.to_string();
        ++accepted_;
        return compare_all();
      }
      default: break;
    }
    const CopyId c = model_.copy_of(op, b);
    TableTarget target{table(), key};
    const Outcome o = run_single(target, op, c);
    if (b == nullptr) {
      if (o.code != StatusCode::kNotFound) {
        return code_mismatch(o.code, StatusCode::kNotFound, Status(o.code, o.message));
      }
      return "";
    }
    std::string err;
    const StatusCode want = model_single(*b, op, c, o.code, o.value, err);
    if (want != o.code) return code_mismatch(o.code, want, Status(o.code, o.message));
    return err;
  }

  std::string do_create(const Op& op) {
    const BlockKey key = pool_key(op.key);
    const BlockKey parent = op.other == kPoolKeys ? BlockKey{} : pool_key(op.other);
    Status s = table().create_block(key, parent, op.refs);
    StatusCode want = StatusCode::kOk;
    if (key == parent) {
      want = StatusCode::kInvalidArgument;
    } else if (find(key) != nullptr) {
      want = StatusCode::kAlreadyExists;
    }
    if (s.code() != want) return code_mismatch(s.code(), want, s);
    if (want != StatusCode::kOk) return "";
    ++accepted_;
    BlockInfo b;
    b.key = key;
    b.parent = parent;
    b.refcount = op.refs;
    b.stats.inserted = b.stats.last_access = ++model_.clock;
    b.pages.resize(model_.layers);
    if (BlockInfo* p = parent.is_null() ? nullptr : find(parent)) {
      ++p->cached_children;
      b.linked = true;
    }
    model_.blocks.emplace(key, std::move(b));
    return "";
  }

  std::string do_erase(const BlockKey& key) {
    Status s = table().erase(key);
    BlockInfo* b = find(key);
    StatusCode want = StatusCode::kOk;
    if (b == nullptr) {
      want = StatusCode::kNotFound;
    } else {
      bool busy = b->refcount > 0 || b->cached_children > 0 || b->nvme == CopyState::kFilling ||
                  b->nvme == CopyState::kDraining;
      for (const PageInfo& p : b->pages) {
        busy = busy || p.pins > 0 || p.hbm == CopyState::kFilling ||
               p.hbm == CopyState::kDraining || p.host == CopyState::kFilling ||
               p.host == CopyState::kDraining;
      }
      if (busy) want = StatusCode::kFailedPrecondition;
    }
    if (s.code() != want) return code_mismatch(s.code(), want, s);
    if (want != StatusCode::kOk) return "";
    ++accepted_;
    for (const PageInfo& p : b->pages) {
      if (p.hbm != CopyState::kAbsent) --model_.used[tier_index(Tier::kHbm)];
      if (p.host != CopyState::kAbsent) --model_.used[tier_index(Tier::kHost)];
    }
    if (b->nvme != CopyState::kAbsent) --model_.used[tier_index(Tier::kNvme)];
    if (b->linked) --find(b->parent)->cached_children;
    model_.blocks.erase(key);
    return "";
  }

  std::string do_publish(const Op& op) {
    const BlockKey from = pool_key(op.key);
    const BlockKey to = pool_key(op.other % kPoolKeys);
    Result<PublishOutcome> r = table().publish(from, to);
    StatusCode want = StatusCode::kOk;
    BlockInfo* b = find(from);
    const bool exists = find(to) != nullptr;
    if (!from.is_private() || to.is_private()) {
      want = StatusCode::kInvalidArgument;
    } else if (b == nullptr) {
      want = StatusCode::kNotFound;
    } else if (!exists && b->cached_children > 0) {
      want = StatusCode::kFailedPrecondition;
    }
    if (r.status().code() != want) return code_mismatch(r.status().code(), want, r.status());
    if (want != StatusCode::kOk) return "";
    const PublishOutcome expected =
        exists ? PublishOutcome::kAlreadyCached : PublishOutcome::kPublished;
    if (*r != expected) return "publish outcome differs";
    ++accepted_;
    if (!exists) {
      BlockInfo moved = *b;
      moved.key = to;
      model_.blocks.erase(from);
      model_.blocks.emplace(to, std::move(moved));
    }
    return "";
  }

  std::string do_match(const Op& op) {
    std::vector<BlockKey> chain;
    const uint32_t start = op.value % kPoolKeys;
    const uint32_t len = 1 + (op.value >> 4) % 6;
    for (uint32_t i = 0; i < len; ++i) chain.push_back(pool_key((start + i) % kPoolKeys));
    MatchOptions options;
    options.record_hits = (op.match_flags & 1) != 0;
    options.acquire = (op.match_flags & 2) != 0;
    const MatchResult got = table().match(chain, options);
    MatchResult want;
    const uint64_t now = options.record_hits ? ++model_.clock : 0;
    for (const BlockKey& k : chain) {
      BlockInfo* b = find(k);
      if (b == nullptr) break;
      const std::optional<Tier> t = Model::match_tier(*b);
      if (!t) break;
      if (options.acquire) ++b->refcount;
      if (options.record_hits) {
        b->stats.last_access = now;
        ++b->stats.hits;
      }
      ++want.blocks;
      ++want.by_tier[tier_index(*t)];
    }
    if (!(got == want)) {
      return "match: table " + std::to_string(got.blocks) + " blocks, model " +
             std::to_string(want.blocks) + " (or per-tier counts differ)";
    }
    ++accepted_;
    return "";
  }

  std::string do_update(const Op& op) {
    const BlockKey key = pool_key(op.key);
    std::vector<Outcome> outcomes;
    std::vector<CopyId> copies;
    // The view's generation must be read inside the callback (it may change between sub-ops).
    Status s = table().update(key, [&](EntryView& v) -> Status {
      for (const Op& sub : op.sub) {
        CopyId c = CopyId::page(sub.tier, sub.layer);
        if (sub.tier == Tier::kNvme) {
          uint64_t g = CopyId::kAnyGeneration;
          if (sub.generation_mode == 1) g = v.nvme_generation();
          if (sub.generation_mode == 2) g = v.nvme_generation() + 1;
          c = CopyId::nvme(g);
        }
        copies.push_back(c);
        outcomes.push_back(run_single(v, sub, c));
        if (outcomes.back().code != StatusCode::kOk) {
          return Status(outcomes.back().code, outcomes.back().message);
        }
      }
      return ok_status();
    });
    BlockInfo* b = find(key);
    if (b == nullptr) {
      if (s.code() != StatusCode::kNotFound || !outcomes.empty()) {
        return code_mismatch(s.code(), StatusCode::kNotFound, s);
      }
      return "";
    }
    // Replay on a copy of the block with deferred frees; commit or roll back like the table.
    BlockInfo trial = *b;
    const auto used_before = model_.used;
    model_.deferred = true;
    model_.pending_frees.clear();
    StatusCode final_code = StatusCode::kOk;
    std::string err;
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      const StatusCode want =
          model_single(trial, op.sub[i], copies[i], outcomes[i].code, outcomes[i].value, err);
      if (!err.empty()) break;
      if (want != outcomes[i].code) {
        err = "inside update, sub-op " + std::to_string(i) + " " + op_kind_name(op.sub[i].kind) +
              ": " +
              code_mismatch(outcomes[i].code, want, Status(outcomes[i].code, outcomes[i].message));
        break;
      }
      if (want != StatusCode::kOk) {
        final_code = want;
        break;
      }
    }
    model_.deferred = false;
    if (!err.empty()) return err;
    if (outcomes.size() < op.sub.size() && final_code == StatusCode::kOk) {
      return "update stopped after " + std::to_string(outcomes.size()) + " of " +
             std::to_string(op.sub.size()) + " sub-ops without an error";
    }
    if (s.code() != final_code) return code_mismatch(s.code(), final_code, s);
    if (final_code == StatusCode::kOk) {
      for (Tier t : model_.pending_frees) --model_.used[tier_index(t)];
      *b = std::move(trial);
    } else {
      model_.used = used_before;  // allocations returned; the block keeps its old bytes
    }
    return "";
  }

  TableRig rig_;
  Model model_;
  uint64_t ops_ = 0;
  uint64_t accepted_ = 0;
  std::array<uint64_t, kOpKinds> accepted_by_kind_{};
};

}  // namespace kvtier::pt_test

// Many threads drive one page table through every operation at once; at the end the invariants of
// DESIGN.md must hold: used + free = capacity in every tier, every frame owned once, no pinned page
// freed or moved while pinned, no reference or pin lost. Labelled `stress`, so `make tsan` also
// runs it under ThreadSanitizer (with fewer iterations, to stay within seconds on 2 cores).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/page_table.hpp"
#include "tests/scheduler/page_table_test_util.hpp"

#if defined(__SANITIZE_THREAD__)
#define KVTIER_STRESS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTIER_STRESS_UNDER_TSAN 1
#endif
#endif

namespace kvtier {
namespace {

using pt_test::content_key;
using pt_test::TableRig;

#ifdef KVTIER_STRESS_UNDER_TSAN
constexpr int kIterations = 40000;
#else
constexpr int kIterations = 150000;
#endif
constexpr int kThreads = 4;
constexpr uint32_t kLayers = 4;
constexpr uint32_t kPool = 48;

// Collects failures from worker threads (gtest assertions only abort the calling function).
class Failures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (messages_.size() < 20) messages_.push_back(what);
    ++count_;
  }
  int count() const { return count_.load(); }
  std::string report() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& m : messages_) out += m + "\n";
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> messages_;
  std::atomic<int> count_{0};
};

// Refusals are expected (another thread got there first); an internal error never is.
bool expected_code(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kResourceExhausted: return true;
    default: return false;
  }
}

// What the threads got done, so the test can tell a run that worked from one refused throughout.
struct Tally {
  std::atomic<uint64_t> fills{0}, pins{0}, published{0}, shared{0}, matched{0}, erased{0};
};

struct HeldPin {
  BlockKey key;
  uint32_t layer;
  uint32_t frame;
};

class Worker {
 public:
  Worker(PageTable& pt, Failures& failures, Tally& tally, int id)
      : pt_(pt), failures_(failures), tally_(tally), id_(id), rng_(1000 + id) {}

  void run() {
    for (int i = 0; i < kIterations; ++i) step(i);
    // Give back everything this thread holds.
    for (const HeldPin& p : pins_) check(pt_.unpin(p.key, p.layer), "final unpin", true);
    for (const BlockKey& k : refs_) check(pt_.release(k).status(), "final release", true);
    pins_.clear();
    refs_.clear();
  }

 private:
  BlockKey pool(uint32_t i) { return content_key(i % kPool); }
  BlockKey random_key() { return pool(static_cast<uint32_t>(rng_())); }
  CopyId random_copy() {
    switch (rng_() % 3) {
      case 0: return CopyId::hbm(rng_() % kLayers);
      case 1: return CopyId::host(rng_() % kLayers);
      default: return CopyId::nvme();
    }
  }
  void check(const Status& s, const char* what, bool must_succeed = false) {
    if (must_succeed ? s.ok() : expected_code(s.code())) return;
    failures_.add("thread " + std::to_string(id_) + " " + what + ": " + s.to_string());
  }

  // A pinned page must keep its frame and stay readable for as long as the pin is held.
  void verify_pins() {
    for (const HeldPin& p : pins_) {
      Status s = pt_.visit(p.key, [&](const EntryView& v) {
        const CopyState st = v.state(CopyId::hbm(p.layer));
        if (v.frame(CopyId::hbm(p.layer)) != p.frame || v.pins(p.layer) == 0 ||
            (st != CopyState::kFilling && st != CopyState::kReady)) {
          failures_.add("pinned page " + to_string(p.key) + " layer " + std::to_string(p.layer) +
                        " changed under its pin: frame " + std::to_string(p.frame) + " -> " +
                        std::to_string(v.frame(CopyId::hbm(p.layer))) + ", state " +
                        std::string(copy_state_name(st)));
        }
      });
      check(s, "visit of a pinned block", true);  // a pinned block cannot be erased
    }
  }

  void step(int i) {
    const BlockKey k = random_key();
    switch (rng_() % 16) {
      case 0: {
        const BlockKey parent = rng_() % 4 ? pool(static_cast<uint32_t>(rng_())) : BlockKey{};
        check(pt_.create_block(k, parent == k ? BlockKey{} : parent), "create");
        break;
      }
      case 1: {
        Status s = pt_.erase(k);
        if (s.ok()) ++tally_.erased;
        check(s, "erase");
        break;
      }
      case 2:
      case 3: {
        const CopyId c = random_copy();
        Result<uint32_t> f = pt_.begin_fill(k, c);
        check(f.status(), "begin_fill");
        if (f.ok()) ++tally_.fills;
        check(pt_.complete_fill(k, c), "complete_fill");
        break;
      }
      case 4: {
        const CopyId c = random_copy();
        switch (rng_() % 5) {
          case 0: check(pt_.abort_fill(k, c), "abort_fill"); break;
          case 1: check(pt_.begin_drain(k, c), "begin_drain"); break;
          case 2: check(pt_.complete_drain(k, c), "complete_drain"); break;
          case 3: check(pt_.cancel_drain(k, c), "cancel_drain"); break;
          default: check(pt_.drop(k, c), "drop"); break;
        }
        break;
      }
      case 5:
      case 6: {
        const uint32_t layer = rng_() % kLayers;
        Result<uint32_t> r = pt_.pin(k, layer);
        check(r.status(), "pin");
        if (r.ok()) {
          pins_.push_back(HeldPin{k, layer, *r});
          ++tally_.pins;
        }
        break;
      }
      case 7:
        if (!pins_.empty()) {
          const std::size_t j = rng_() % pins_.size();
          check(pt_.unpin(pins_[j].key, pins_[j].layer), "unpin of a held pin", true);
          pins_.erase(pins_.begin() + static_cast<long>(j));
        }
        break;
      case 8: {
        std::vector<BlockKey> chain;
        const uint32_t start = static_cast<uint32_t>(rng_());
        for (uint32_t j = 0; j < 8; ++j) chain.push_back(pool(start + j));
        const bool take = rng_() % 2;
        const MatchResult m = pt_.match(chain, MatchOptions{.record_hits = true, .acquire = take});
        if (take) refs_.insert(refs_.end(), chain.begin(), chain.begin() + m.blocks);
        tally_.matched += m.blocks;
        break;
      }
      case 9:
        if (!refs_.empty()) {
          check(pt_.release(refs_.back()).status(), "release of a held reference", true);
          refs_.pop_back();
        }
        break;
      case 10: {
        // A private block grows, fills and is published (or shared when already cached).
        const BlockKey priv = private_block_key(static_cast<uint64_t>(id_) + 1, i);
        check(pt_.create_block(priv, k, 1), "create private", true);
        for (uint32_t l = 0; l < kLayers; ++l) {
          Result<uint32_t> f = pt_.begin_fill(priv, CopyId::hbm(l));
          check(f.status(), "fill private");
          if (f.ok()) check(pt_.complete_fill(priv, CopyId::hbm(l)), "complete private", true);
        }
        const BlockKey content = random_key();
        Result<PublishOutcome> r = pt_.publish(priv, content);
        check(r.status(), "publish", true);
        const BlockKey held = r.ok() && *r == PublishOutcome::kPublished ? content : priv;
        ++(held == priv ? tally_.shared : tally_.published);
        check(pt_.release(held).status(), "release published", true);
        if (held == priv) {
          check(pt_.drop_all(priv, Tier::kHbm).status(), "drop private", true);
          check(pt_.erase(priv), "erase private", true);
        }
        break;
      }
      case 11: {
        Status s = pt_.update(k, [&](EntryView& v) -> Status {
          const uint32_t l = rng_() % kLayers;
          KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::host(l)).status());
          KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::host(l)));
          if (v.state(CopyId::hbm(l)) == CopyState::kReady && v.pins(l) == 0) {
            KVTIER_RETURN_IF_ERROR(v.drop(CopyId::hbm(l)));
          }
          v.touch();
          return ok_status();
        });
        check(s, "update");
        break;
      }
      case 12: {
        ScanCursor cursor{static_cast<uint32_t>(rng_() % pt_.shard_count()), 0};
        std::vector<EvictionCandidate> out;
        pt_.scan_candidates(Tier::kHbm, cursor, 4, out);
        for (const EvictionCandidate& c : out) {
          check(pt_.drop_all(c.key, Tier::kHbm).status(), "drop_all");
        }
        break;
      }
      case 13: {
        std::vector<BlockKey> keys;
        for (int j = 0; j < 4; ++j) keys.push_back(random_key());
        std::vector<uint32_t> frames(keys.size());
        const uint32_t layer = rng_() % kLayers;
        Status s = pt_.pin_layer(keys, layer, frames);
        check(s, "pin_layer");
        if (s.ok()) check(pt_.unpin_layer(keys, layer), "unpin_layer", true);
        break;
      }
      case 14: check(pt_.set_checksum(k, rng_()), "set_checksum"); break;
      default: verify_pins(); break;
    }
  }

  PageTable& pt_;
  Failures& failures_;
  Tally& tally_;
  int id_;
  std::mt19937_64 rng_;
  std::vector<HeldPin> pins_;
  std::vector<BlockKey> refs_;
};

TEST(PageTableStress, ConcurrentOperationsKeepEveryInvariant) {
  auto rig = TableRig::make(kLayers, /*shards=*/8, /*hbm=*/96, /*host=*/128, /*nvme=*/24);
  ASSERT_TRUE(rig.ok()) << rig.status().to_string();
  PageTable& pt = *rig->table;
  Failures failures;
  Tally tally;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.push_back(std::make_unique<Worker>(pt, failures, tally, t));
  }
  for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { workers[t]->run(); });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.count(), 0) << failures.report();
  std::printf(
      "fills %llu, pins %llu, published %llu, shared %llu, blocks matched %llu, erased %llu\n",
      static_cast<unsigned long long>(tally.fills.load()),
      static_cast<unsigned long long>(tally.pins.load()),
      static_cast<unsigned long long>(tally.published.load()),
      static_cast<unsigned long long>(tally.shared.load()),
      static_cast<unsigned long long>(tally.matched.load()),
      static_cast<unsigned long long>(tally.erased.load()));
  for (const uint64_t n : {tally.fills.load(), tally.pins.load(), tally.published.load(),
                           tally.shared.load(), tally.matched.load(), tally.erased.load()}) {
    EXPECT_GT(n, 0u) << "one kind of operation never succeeded: the run tested little";
  }

  Status audit = pt.audit();
  ASSERT_TRUE(audit.ok()) << audit.to_string();
  for (Tier t : kAllTiers) {
    const uint32_t capacity = t == Tier::kHbm    ? rig->hbm->capacity()
                              : t == Tier::kHost ? rig->host->capacity()
                                                 : rig->nvme->capacity();
    const uint32_t free = t == Tier::kHbm    ? rig->hbm->free_count()
                          : t == Tier::kHost ? rig->host->free_count()
                                             : rig->nvme->free_count();
    EXPECT_EQ(rig->used(t) + free, capacity) << tier_name(t);
  }
  // Every thread gave back what it held: no pin and no reference may be left over.
  uint64_t frames_owned = 0;
  for (const auto& [key, info] : pt.snapshot()) {
    EXPECT_EQ(info.refcount, 0u) << to_string(key);
    for (const PageInfo& p : info.pages) {
      EXPECT_EQ(p.pins, 0u) << to_string(key);
      frames_owned += (p.hbm != CopyState::kAbsent) + (p.host != CopyState::kAbsent);
    }
    frames_owned += info.nvme != CopyState::kAbsent;
  }
  EXPECT_EQ(frames_owned, rig->used(Tier::kHbm) + rig->used(Tier::kHost) + rig->used(Tier::kNvme));
  // The run did real work: blocks exist and frames were in use at the end.
  EXPECT_GT(pt.size(), 0u);
  EXPECT_GT(frames_owned, 0u);
  // Erasing everything bottom-up returns every frame.
  for (int pass = 0; pass < 64 && pt.size() > 0; ++pass) {
    for (const auto& [key, info] : pt.snapshot()) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        for (const CopyId c : {CopyId::hbm(l), CopyId::host(l)}) {
          const CopyState s = c.tier == Tier::kHbm ? info.pages[l].hbm : info.pages[l].host;
          if (s == CopyState::kFilling) pt.abort_fill(key, c).ignore();
          if (s == CopyState::kDraining) pt.complete_drain(key, c).ignore();
        }
      }
      if (info.nvme == CopyState::kFilling) pt.abort_fill(key, CopyId::nvme()).ignore();
      if (info.nvme == CopyState::kDraining) pt.complete_drain(key, CopyId::nvme()).ignore();
      pt.erase(key).ignore();
    }
  }
  EXPECT_EQ(pt.size(), 0u);
  EXPECT_EQ(rig->used(Tier::kHbm) + rig->used(Tier::kHost) + rig->used(Tier::kNvme), 0u);
  Status final_audit = pt.audit();
  EXPECT_TRUE(final_audit.ok()) << final_audit.to_string();
}

}  // namespace
}  // namespace kvtier

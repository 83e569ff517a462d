// Each eviction policy against a small, obviously-correct reference simulator on hand-made
// traces: the same requests through the evictor (policy_test_util.hpp's driver) and through a
// naive re-statement of the policy (linear scans over a map) must give identical hit counts.
// Plus the edge cases: capacity 0 and 1, everything refused by the filter, re-insertion, misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "scheduler/policies/chain_links.hpp"
#include "scheduler/policies/ghost_history.hpp"
#include "scheduler/policies/ghost_table.hpp"
#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/key_index.hpp"
#include "scheduler/policies/lfu_evictor.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/lru_evictor.hpp"
#include "scheduler/policies/prefix_aware_evictor.hpp"
#include "scheduler/policies/reuse_model.hpp"
#include "scheduler/policies/s3fifo_evictor.hpp"
#include "scheduler/policies/shadowed_first.hpp"
#include "scheduler/policies/write_strategy.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {
namespace {

// ---- Reference simulators -------------------------------------------------------------------

uint64_t ref_lru(uint64_t cap, const std::vector<Request>& reqs) {
  std::map<uint64_t, uint64_t> t;  // id -> last touch
  uint64_t now = 0, hits = 0;
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && t.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (!t.count(id)) {
        if (cap == 0) continue;
        if (t.size() >= cap) {
          auto v = std::min_element(t.begin(), t.end(),
                                    [](auto& a, auto& b) { return a.second < b.second; });
          t.erase(v);
        }
      }
      t[id] = ++now;
    }
  }
  return hits;
}

uint64_t ref_lfu(uint64_t cap, const std::vector<Request>& reqs) {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> m;  // id -> (count, last touch)
  uint64_t now = 0, hits = 0;
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && m.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (m.count(id)) {
        m[id] = {m[id].first + 1, ++now};
        continue;
      }
      if (cap == 0) continue;
      if (m.size() >= cap) {
        m.erase(std::min_element(m.begin(), m.end(), [](auto& a, auto& b) {
          return a.second < b.second;  // (count, time) lexicographic
        }));
      }
      m[id] = {1, ++now};
    }
  }
  return hits;
}

// S3-FIFO as in the paper, with deques (front = newest). The ghost queue holds (id, stamp); a
// popped entry forgets its id only if it is the id's current entry (a taken id that was put
// again owns a newer one), as GhostHistory's ring slots do.
uint64_t ref_s3fifo(uint64_t cap, const std::vector<Request>& reqs) {
  const uint64_t small_target = std::max<uint64_t>(1, cap / 10);
  const uint64_t ghost_cap = cap > small_target ? cap - small_target : 1;
  std::deque<uint64_t> S, M;
  std::deque<std::pair<uint64_t, uint64_t>> G;
  std::map<uint64_t, uint64_t> ghost;  // id -> stamp of its current G entry
  std::map<uint64_t, int> freq;
  uint64_t hits = 0, stamp = 0;
  const auto ghost_put = [&](uint64_t id) {
    if (ghost.count(id)) return;
    if (G.size() >= ghost_cap) {
      const auto [old, old_stamp] = G.back();
      if (ghost.count(old) && ghost[old] == old_stamp) ghost.erase(old);
      G.pop_back();
    }
    G.emplace_front(id, ++stamp);
    ghost[id] = stamp;
  };
  const auto evict = [&]() {
    while (true) {
      if (!S.empty() && (S.size() >= small_target || M.empty())) {
        const uint64_t t = S.back();
        S.pop_back();
        if (freq[t] > 1) {
          freq[t] = 0;
          M.push_front(t);
          continue;
        }
        ghost_put(t);
        freq.erase(t);
        return;
      }
      const uint64_t t = M.back();
      M.pop_back();
      if (freq[t] > 0) {
        --freq[t];
        M.push_front(t);
        continue;
      }
      freq.erase(t);
      return;
    }
  };
  for (const Request& r : reqs) {
    std::size_t k = 0;
    while (k < r.size() && freq.count(r[k])) ++k;
    hits += k;
    for (uint64_t id : r) {
      if (freq.count(id)) {
        freq[id] = std::min(3, freq[id] + 1);
        continue;
      }
      if (cap == 0) continue;
      if (S.size() + M.size() >= cap) evict();
      freq[id] = 0;
      if (ghost.count(id)) {
        ghost.erase(id);  // its ring slot stays, like GhostHistory's
        M.push_front(id);
      } else {
        S.push_front(id);
      }
    }
  }
  return hits;
}

// Prefix-aware: only leaves (no cached child) are victims; the oldest request first, and within a
// request the deepest block first.
uint64_t ref_prefix_aware(uint64_t cap, const std::vector<Request>& reqs) {
  struct B {
    uint64_t req;
    uint64_t depth;
    uint64_t parent;
    bool has_parent;
  };
  std::map<uint64_t, B> c;
  uint64_t hits = 0;
  for (uint64_t ri = 0; ri < reqs.size(); ++ri) {
    const Request& r = reqs[ri];
    std::size_t k = 0;
    while (k < r.size() && c.count(r[k])) ++k;
    hits += k;
    for (std::size_t j = 0; j < r.size(); ++j) {
      const B b{ri, j, j > 0 ? r[j - 1] : 0, j > 0};
      if (c.count(r[j])) {
        c[r[j]] = b;
        continue;
      }
      if (cap == 0) continue;
      if (c.size() >= cap) {
        std::set<uint64_t> parents;
        for (auto& [id, x] : c) {
          if (x.has_parent && c.count(x.parent)) parents.insert(x.parent);
        }
        uint64_t victim = 0;
        bool found = false;
        for (auto& [id, x] : c) {
          if (parents.count(id)) continue;
          if (!found || x.req < c[victim].req ||
              (x.req == c[victim].req && x.depth > c[victim].depth)) {
            victim = id;
            found = true;
          }
        }
        c.erase(victim);
      }
      c[r[j]] = b;
    }
  }
  return hits;
}

// Lookahead: a naive re-statement over maps. Ranks are run_start - G(list), run_start the time of
// the first reference of the run (references each the child of the one before) that last touched
// the block, G the truncated mean gap of ReuseModel's formula, recomputed here from plain per-class
// sums; list order is kept as (major, minor) pairs: a push to a list's front takes a new major, a
// child placed behind its parent takes the parent's major and the next minor, so a list's tail is
// its smallest major and, within it, its largest minor. Victims are the k-way merge of the lists by
// rank, as the policy walks them; an unhinted block with a child cached, met before the victim,
// is held (kHeld) until its last child leaves, then ranks by its rank time in its class's
// arrived list (kArrivedBase + class); held blocks are offered when no unhinted leaf is left, the
// one held longest first; hinted blocks reaching a tail move to a hinted list (kHinted) and are
// offered last, the one whose reader starts last among the 16 longest-hinted first. At a
// request's end its first uses move to the class of its output (output_of), deepest first.
struct LookaheadRef {
  // Classes 2 x kind + ended: kind 0 a first use whose request is open, 1-4 a first use whose
  // request generated < 16, < 64, < 256 or more tokens, 5-8 2-3, 4-7, 8-15, 16+ uses.
  static constexpr uint32_t kClasses = 18;
  static constexpr uint32_t kHinted = kClasses;
  static constexpr uint32_t kHeld = kClasses + 1;  // parents held while a child is cached
  static constexpr uint32_t kArrivedBase =
      kClasses + 2;  // released parents, by rank time, per class
  struct Block {
    uint64_t rank_time = 0, ref_time = 0, major = 0, held_seq = 0;
    uint32_t minor = 0, uses = 0, cls = 0, list = 0, held_cls = 0, depth = 0;
    std::optional<uint64_t> parent;
  };
  struct Ghost {
    uint64_t time = 0;
    uint32_t count = 0, tag = 0;
  };

  uint64_t cap = 0;
  const HintBoard* hints = nullptr;
  uint64_t now = 0, seq = 0, bypassed = 0;
  uint64_t horizon = 0, half_life = 0, next_decay = 0;
  std::map<uint64_t, Block> c;
  std::map<uint64_t, Ghost> ghost;
  struct Interval {
    uint64_t opened = 0;
    uint32_t cls = 0;
  };
  static constexpr uint32_t kMaxBuckets = ReuseModel::kAgeBuckets;
  uint64_t width = 1, buckets = 1;  // events per age bucket, age buckets over the horizon
  std::array<std::array<double, kMaxBuckets>, kClasses> at_risk{}, reuses{}, gaps{}, hazard{};
  std::array<double, kClasses> gap_of{};
  std::list<Interval> open;
  std::optional<uint64_t> last_placed, pending, last_ref;
  uint64_t run_start = 0;

  explicit LookaheadRef(uint64_t capacity, const HintBoard* board) : cap(capacity), hints(board) {
    horizon = LookaheadEvictor::kHorizonCapacities * std::max<uint64_t>(capacity, 1);
    half_life = LookaheadEvictor::kHalfLifeHorizons * horizon;
    next_decay = half_life;
    width = (horizon + kMaxBuckets - 1) / kMaxBuckets;
    buckets = (horizon + width - 1) / width;
    refresh();
  }

  static uint32_t cls_of(uint32_t uses, bool ended) {
    uint32_t b = 0;
    while (b < 4 && (uint64_t{1} << (b + 1)) <= uses) ++b;
    return 2 * (b == 0 ? 0 : 4 + b) + (ended ? 1 : 0);
  }
  static uint32_t shape_cls(uint64_t output, bool ended) {
    const uint32_t kind = output < 16 ? 1 : output < 64 ? 2 : output < 256 ? 3 : 4;
    return 2 * kind + (ended ? 1 : 0);
  }
  // The class whose estimate counts class k's intervals: every first use counts in kind 0's.
  static uint32_t pool_of(uint32_t k) { return k / 2 >= 1 && k / 2 <= 4 ? k % 2 : k; }
  // The class whose hazard k's pseudo-intervals follow: kinds 1-5 follow kind 0, the use buckets
  // above the one of half their uses.
  static std::optional<uint32_t> fallback_of(uint32_t k) {
    if (k / 2 == 0) return std::nullopt;
    return k / 2 <= 5 ? k % 2 : k - 2;
  }
  // The reuse model, restated per interval: ages in buckets of `width` events, an interval at risk
  // at each age it reaches open, hazards per (class, age) over the class's intervals and those
  // pooled into it, a class's pseudo-interval following its fallback's hazard (same ended flag);
  // gaps recomputed at each bucket boundary.
  double gap(uint32_t k) const { return gap_of[k]; }
  void refresh() {
    const double h = static_cast<double>(width * buckets);
    for (uint32_t k = 0; k < kClasses; ++k) {
      double survive = 1.0, g = 0.0;
      for (uint32_t a = 0; a < buckets; ++a) {
        double risk = 0.0, closed_here = 0.0, gap_sum = 0.0;
        for (uint32_t q = 0; q < kClasses; ++q) {
          if (q != k && pool_of(q) != k) continue;
          risk += at_risk[q][a];
          closed_here += reuses[q][a];
          gap_sum += gaps[q][a];
        }
        const auto fb = fallback_of(k);
        const double prior = fb ? 1.0 * hazard[*fb][a] : 0.0;
        const double closed = closed_here + prior;
        hazard[k][a] = std::min(1.0, closed / (risk + 1.0));
        if (closed <= 0.0) continue;
        const double mid = (static_cast<double>(a) + 0.5) * static_cast<double>(width);
        g += survive * hazard[k][a] * ((gap_sum + prior * mid) / closed);
        survive *= 1.0 - hazard[k][a];
      }
      gap_of[k] = g + survive * h;
    }
  }
  uint64_t age(const Interval& iv) const { return now / width - iv.opened / width; }
  void tick() {
    ++now;
    if (now % width == 0) {  // a bucket boundary: every open interval is a bucket older
      for (auto it = open.begin(); it != open.end();) {
        if (age(*it) >= buckets) {
          it = open.erase(it);
          continue;
        }
        at_risk[it->cls][age(*it)] += 1;
        ++it;
      }
    }
    while (now >= next_decay) {
      for (uint32_t k = 0; k < kClasses; ++k) {
        for (uint32_t a = 0; a < buckets; ++a) {
          at_risk[k][a] *= 0.5;
          reuses[k][a] *= 0.5;
          gaps[k][a] *= 0.5;
        }
      }
      next_decay += half_life;
    }
    if (now % width == 0) refresh();
  }
  void entered(uint32_t k) {
    open.push_back(Interval{now, k});
    at_risk[k][0] += 1;
  }
  // The open interval of class k opened in the bucket of time t, if any.
  std::list<Interval>::iterator find_open(uint32_t k, uint64_t t) {
    return std::find_if(open.begin(), open.end(), [&](const Interval& iv) {
      return iv.cls == k && iv.opened / width == t / width;
    });
  }
  void reused(uint32_t k, uint64_t g) {
    if (g > now) return;
    const auto it = find_open(k, now - g);
    if (it == open.end()) return;  // past the horizon, or not this class's
    reuses[k][age(*it)] += 1;
    gaps[k][age(*it)] += static_cast<double>(g);
    open.erase(it);
  }
  // The interval opened at `t` in `from` belongs to `to`, with the ages it was at risk for (all of
  // them once past the horizon).
  void moved(uint32_t from, uint32_t to, uint64_t t) {
    if (t > now) return;
    uint64_t reached = buckets;
    if (now / width - t / width < buckets) {
      const auto it = find_open(from, t);
      if (it == open.end()) return;
      reached = age(*it) + 1;
      it->cls = to;
    }
    for (uint64_t a = 0; a < reached; ++a) {
      if (at_risk[from][a] < 1.0) break;
      at_risk[from][a] -= 1.0;
      at_risk[to][a] += 1.0;
    }
  }
  bool hinted(uint64_t id) const { return hints && hints->contains(key_of(id)); }
  static uint32_t list_cls(const Block& b) {
    if (b.list == kHinted) return b.cls;
    if (b.list == kHeld) return b.held_cls;
    return b.list >= kArrivedBase ? b.list - kArrivedBase : b.list;
  }
  double rank(const Block& b) const { return static_cast<double>(b.rank_time) - gap(list_cls(b)); }
  const Block* parent_of(const Block& b) const {
    if (!b.parent) return nullptr;
    auto it = c.find(*b.parent);
    return it == c.end() ? nullptr : &it->second;
  }
  uint32_t list_for(uint32_t k, const Block* parent) const {
    return parent && parent->list != kHinted && gap(list_cls(*parent)) > gap(k) ? list_cls(*parent)
                                                                                : k;
  }
  void place(uint64_t id, uint64_t time) {
    Block& b = c[id];
    const Block* p = parent_of(b);
    b.list = list_for(b.cls, p);
    if (p && last_placed == *b.parent && p->list == b.list) {
      b.rank_time = p->rank_time;
      b.major = p->major;
      b.minor = p->minor + 1;
    } else {
      b.rank_time = time;
      b.major = ++seq;
      b.minor = 0;
    }
    last_placed = id;
  }
  // A cached block's interval moves to class `to`; it joins that class's list (at the front of a
  // class list, by its rank time in an arrived one) unless it waits in the hinted or held list.
  void reclass(Block& b, uint32_t to) {
    moved(b.cls, to, b.ref_time);
    b.cls = to;
    if (b.list == kHinted || b.list == kHeld) return;
    const uint32_t base = b.list >= kArrivedBase ? kArrivedBase : 0;
    const uint32_t l = list_for(b.cls, parent_of(b)) + base;
    if (l != b.list) {
      b.list = l;
      if (base == 0) {
        b.major = ++seq;
        b.minor = 0;
      }
    }
  }
  void settle(std::optional<uint64_t> parent) {
    if (!pending) return;
    const uint64_t prev = *pending;
    pending.reset();
    if (parent && *parent == prev) return;
    if (auto it = c.find(prev); it != c.end()) {
      if (!(it->second.cls & 1)) reclass(it->second, it->second.cls | 1);
      return;
    }
    if (auto g = ghost.find(prev); g != ghost.end() && !(g->second.tag & 1)) {
      moved(g->second.tag, g->second.tag | 1, g->second.time);
      g->second.tag |= 1;
    }
  }
  // The request's first uses (kind 0), deepest first, move to the class of its output.
  void request_end(const Request& r, uint64_t output) {
    for (auto id = r.rbegin(); id != r.rend(); ++id) {
      if (auto it = c.find(*id); it != c.end()) {
        Block& b = it->second;
        if (b.cls / 2 == 0) reclass(b, shape_cls(output, b.cls & 1));
        continue;
      }
      if (auto g = ghost.find(*id); g != ghost.end() && g->second.tag / 2 == 0) {
        const uint32_t to = shape_cls(output, g->second.tag & 1);
        moved(g->second.tag, to, g->second.time);
        g->second.tag = to;
      }
    }
  }
  // The oldest block of list l not yet walked past.
  std::optional<uint64_t> tail(uint32_t l, const std::set<uint64_t>& walked) const {
    std::optional<uint64_t> best;
    for (const auto& [id, b] : c) {
      if (b.list != l || walked.count(id)) continue;
      if (!best) {
        best = id;
        continue;
      }
      const Block& x = c.at(*best);
      if (l >= kArrivedBase) {  // the oldest rank time, then the deepest
        if (b.rank_time < x.rank_time || (b.rank_time == x.rank_time && b.depth > x.depth)) {
          best = id;
        }
      } else if (b.major < x.major || (b.major == x.major && b.minor > x.minor)) {
        best = id;
      }
    }
    return best;
  }
  // Among the 16 longest-hinted blocks, the one whose earliest reader starts last (oldest on ties).
  std::optional<uint64_t> last_resort() const {
    std::vector<uint64_t> order;
    for (const auto& [id, b] : c) {
      if (b.list == kHinted) order.push_back(id);
    }
    std::sort(order.begin(), order.end(), [&](uint64_t x, uint64_t y) {
      const Block& a = c.at(x);
      const Block& b = c.at(y);
      return a.major < b.major || (a.major == b.major && a.minor > b.minor);
    });
    std::optional<uint64_t> pick;
    uint64_t latest = 0;
    for (std::size_t i = 0; i < order.size() && i < 16; ++i) {
      const auto use = hints->find(key_of(order[i]));
      const uint64_t start = use ? use->earliest_start : 0;
      if (!pick || start > latest) {
        pick = order[i];
        latest = start;
      }
    }
    return pick;
  }
  std::optional<uint64_t> best_tail() {
    for (auto h = tail(kHinted, {}); h && !hinted(*h); h = tail(kHinted, {})) {
      Block& b = c[*h];
      b.list = list_for(b.cls, parent_of(b));
      b.rank_time = now;
      b.major = ++seq;
      b.minor = 0;
      if (last_placed == *h) last_placed.reset();
    }
    while (true) {
      std::optional<uint64_t> best;
      for (uint32_t l : ranked_lists()) {
        const auto t = tail(l, {});
        if (t && (!best || rank(c[*t]) < rank(c[*best]))) best = t;
      }
      if (!best) return last_resort();
      if (!hinted(*best)) {
        if (!has_child(*best)) return best;
        hold(*best);
        continue;
      }
      Block& b = c[*best];
      b.list = kHinted;
      b.major = ++seq;
      b.minor = 0;
      if (last_placed == *best) last_placed.reset();
    }
  }
  static std::vector<uint32_t> ranked_lists() {
    std::vector<uint32_t> ls;
    for (uint32_t l = 0; l < kClasses; ++l) ls.push_back(l);
    for (uint32_t l = 0; l < kClasses; ++l) ls.push_back(kArrivedBase + l);
    return ls;
  }
  void hold(uint64_t id) {
    Block& b = c[id];
    b.held_cls = list_cls(b);
    b.list = kHeld;
    b.held_seq = ++seq;
    if (last_placed == id) last_placed.reset();
  }
  // The block leaving: a held parent left without cached children is ranked again.
  void erase(uint64_t id) {
    const std::optional<uint64_t> parent = c[id].parent;
    c.erase(id);
    if (!parent) return;
    auto it = c.find(*parent);
    if (it == c.end() || it->second.list != kHeld || has_child(*parent)) return;
    it->second.list = kArrivedBase + it->second.held_cls;
  }
  bool has_child(uint64_t id) const {
    for (const auto& [other, b] : c) {
      if (b.parent == id) return true;
    }
    return false;
  }
  // In rank order, the first unhinted block with no child cached (a parent goes after its
  // children), else the first unhinted parent, else the first hinted one.
  uint64_t victim() {
    best_tail();
    std::set<uint64_t> walked;
    std::optional<uint64_t> first_hinted, leaf;
    std::vector<uint64_t> parents;
    while (!leaf) {
      std::optional<uint64_t> best;
      for (uint32_t l : ranked_lists()) {
        const auto t = tail(l, walked);
        if (t && (!best || rank(c[*t]) < rank(c[*best]))) best = t;
      }
      if (!best) break;
      walked.insert(*best);
      if (hinted(*best)) {
        if (!first_hinted) first_hinted = best;
      } else if (has_child(*best)) {
        parents.push_back(*best);
      } else {
        leaf = best;
      }
    }
    for (uint64_t p : parents) hold(p);
    if (leaf) return *leaf;
    std::optional<uint64_t> oldest_held;  // held longest
    for (const auto& [id, b] : c) {
      if (b.list == kHeld && (!oldest_held || b.held_seq < c.at(*oldest_held).held_seq)) {
        oldest_held = id;
      }
    }
    if (oldest_held) return *oldest_held;
    return first_hinted ? *first_hinted : *last_resort();
  }
  bool admit(uint64_t id, std::optional<uint64_t> parent) {
    if (hinted(id)) return true;
    const std::optional<uint64_t> v = best_tail();
    if (!v) return true;
    if (c[*v].list == kHinted) return false;
    const auto g = ghost.find(id);
    const uint32_t uses = std::max<uint32_t>(g == ghost.end() ? 0 : g->second.count, 1);
    const Block* p = parent && c.count(*parent) ? &c.at(*parent) : nullptr;
    const double mine = static_cast<double>(run_start) - gap(list_for(cls_of(uses, false), p));
    return mine > rank(c[*v]);
  }

  uint64_t run(const std::vector<Request>& reqs, const std::function<void(std::size_t)>& before) {
    uint64_t hits = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      before(i);
      const Request& r = reqs[i];
      std::size_t k = 0;
      while (k < r.size() && c.count(r[k])) ++k;
      hits += k;
      bool dropped = false;
      for (std::size_t j = 0; j < r.size(); ++j) {
        const uint64_t id = r[j];
        const std::optional<uint64_t> parent =
            j > 0 ? std::optional<uint64_t>(r[j - 1]) : std::nullopt;
        tick();
        if (!parent || last_ref != parent) run_start = now;
        last_ref = id;
        if (auto it = c.find(id); it != c.end()) {  // access
          Block& b = it->second;
          settle(b.parent);
          reused(b.cls, now - b.ref_time);
          b.uses = b.uses == UINT32_MAX ? b.uses : b.uses + 1;
          b.cls = cls_of(b.uses, false);
          entered(b.cls);
          b.ref_time = now;
          place(id, run_start);
          pending = id;
          continue;
        }
        settle(parent);  // miss
        uint32_t uses = 1;
        if (auto g = ghost.find(id); g != ghost.end()) {
          reused(g->second.tag, now - g->second.time);
          uses = g->second.count + 1;
        }
        entered(cls_of(uses, false));
        ghost[id] = Ghost{now, uses, cls_of(uses, false)};
        pending = id;
        if (dropped || cap == 0) continue;
        if (c.size() >= cap) {
          if (!admit(id, parent)) {
            ++bypassed;
            dropped = true;
            continue;
          }
          const uint64_t v = victim();
          const Block& vb = c[v];
          ghost[v] = Ghost{vb.ref_time, vb.uses, vb.cls};
          if (last_placed == v) last_placed.reset();
          erase(v);
        }
        const Ghost g = ghost[id];  // insert: takes the ghost entry of the miss
        ghost.erase(id);
        Block& b = c[id];
        b.parent = parent;
        b.depth = static_cast<uint32_t>(j);
        b.uses = std::max<uint32_t>(g.count, 1);
        b.cls = cls_of(b.uses, g.tag & 1);
        if (b.cls != g.tag) moved(g.tag, b.cls, g.time);
        b.ref_time = g.time;
        place(id, run_start);
      }
      request_end(r, output_of(i));
    }
    return hits;
  }
};

// ---- Traces ---------------------------------------------------------------------------------

std::vector<uint64_t> zipf_ids(uint64_t n, uint64_t universe, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(universe);
  for (uint64_t i = 0; i < universe; ++i) w[i] = 1.0 / std::pow(i + 1.0, 0.9);
  std::discrete_distribution<uint64_t> d(w.begin(), w.end());
  std::vector<uint64_t> out(n);
  for (auto& x : out) x = d(rng) + 1;
  return out;
}

// Chains: conversations that return with a longer prefix, and one-off chains.
std::vector<Request> chain_trace(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Request> convs(6);
  uint64_t next = 1;
  std::vector<Request> out;
  for (int i = 0; i < 120; ++i) {
    if (rng() % 3 == 0) {
      Request once;
      for (uint64_t n = 1 + rng() % 4; n > 0; --n) once.push_back(next++);
      out.push_back(once);
      continue;
    }
    Request& c = convs[rng() % convs.size()];
    for (uint64_t n = 1 + rng() % 2; n > 0; --n) c.push_back(next++);
    out.push_back(c);
  }
  return out;
}

template <typename E>
uint64_t run_policy(uint64_t cap, const std::vector<Request>& reqs) {
  EvictorOptions o;
  o.capacity_blocks = cap;
  E e(o);
  const uint64_t hits = drive(e, cap, reqs).hits;
  EXPECT_EQ(e.misuse(), 0u);
  EXPECT_LE(e.size(), cap);
  return hits;
}

// ---- Conformance with the references ----------------------------------------------------------

TEST(EvictorsVsReference, LruOnSinglesAndChains) {
  for (uint64_t cap : {1, 2, 5, 17, 40}) {
    const auto singles_trace = singles(zipf_ids(600, 60, cap));
    EXPECT_EQ(run_policy<LruEvictor>(cap, singles_trace), ref_lru(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap);
    EXPECT_EQ(run_policy<LruEvictor>(cap, chains), ref_lru(cap, chains)) << cap;
  }
}

TEST(EvictorsVsReference, LfuOnSinglesAndChains) {
  for (uint64_t cap : {1, 3, 8, 25}) {
    const auto singles_trace = singles(zipf_ids(150, 40, cap + 7));
    EXPECT_EQ(run_policy<LfuEvictor>(cap, singles_trace), ref_lfu(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap + 100);
    std::vector<Request> short_chains(chains.begin(), chains.begin() + 40);  // counts < 15
    EXPECT_EQ(run_policy<LfuEvictor>(cap, short_chains), ref_lfu(cap, short_chains)) << cap;
  }
}

TEST(EvictorsVsReference, S3FifoOnSinglesAndChains) {
  for (uint64_t cap : {1, 4, 10, 30}) {
    const auto singles_trace = singles(zipf_ids(800, 80, cap + 3));
    EXPECT_EQ(run_policy<S3FifoEvictor>(cap, singles_trace), ref_s3fifo(cap, singles_trace)) << cap;
    const auto chains = chain_trace(cap + 50);
    EXPECT_EQ(run_policy<S3FifoEvictor>(cap, chains), ref_s3fifo(cap, chains)) << cap;
  }
}

TEST(EvictorsVsReference, PrefixAwareOnChains) {
  // Capacities above the longest chain, so a request never evicts its own parent mid-way.
  for (uint64_t seed : {1, 2, 3}) {
    const auto chains = chain_trace(seed);
    std::size_t longest = 0;
    for (const auto& r : chains) longest = std::max(longest, r.size());
    for (uint64_t cap : {longest + 2, longest + 10, 3 * longest}) {
      EXPECT_EQ(run_policy<PrefixAwareEvictor>(cap, chains), ref_prefix_aware(cap, chains))
          << "seed " << seed << " cap " << cap;
    }
  }
}

// Hints for request i + 1 .. i + lookahead before request i, as the replay keeps its board.
std::function<void(std::size_t)> hinter(HintBoard& board, const std::vector<Request>& reqs,
                                        uint32_t lookahead) {
  return [&board, &reqs, lookahead](std::size_t i) {
    if (lookahead == 0) return;
    const auto add = [&](std::size_t j) {
      std::vector<BlockKey> keys;
      for (uint64_t id : reqs[j]) keys.push_back(key_of(id));
      ASSERT_TRUE(board.add(j, j, keys).ok());
    };
    if (i == 0) {
      for (std::size_t j = 1; j <= lookahead && j < reqs.size(); ++j) add(j);
      return;
    }
    ASSERT_TRUE(board.remove(i).ok());
    if (i + lookahead < reqs.size()) add(i + lookahead);
  };
}

void expect_lookahead_matches_reference(uint64_t cap, uint32_t lookahead,
                                        const std::vector<Request>& reqs, const std::string& what) {
  HintBoard board, ref_board;
  EvictorOptions o;
  o.capacity_blocks = cap;
  o.hints = lookahead ? &board : nullptr;
  LookaheadEvictor e(o);
  const DriveResult got = drive(e, cap, reqs, hinter(board, reqs, lookahead));
  LookaheadRef ref(cap, lookahead ? &ref_board : nullptr);
  const uint64_t want = ref.run(reqs, hinter(ref_board, reqs, lookahead));
  EXPECT_EQ(got.hits, want) << what << " cap " << cap << " lookahead " << lookahead;
  EXPECT_EQ(got.bypassed, ref.bypassed) << what << " cap " << cap << " lookahead " << lookahead;
  EXPECT_EQ(e.misuse(), 0u);
  EXPECT_LE(e.size(), cap);
  for (uint32_t k = 0; k < LookaheadRef::kClasses; ++k) {
    EXPECT_EQ(e.model().expected_gap(k), ref.gap(k)) << what << " class " << k;
  }
}

TEST(EvictorsVsReference, LookaheadOnlineAndWithHints) {
  for (uint64_t cap : {1, 4, 12}) {
    for (uint32_t lookahead : {0u, 3u}) {
      expect_lookahead_matches_reference(
          cap, lookahead, singles(zipf_ids(500, 50, cap * 10 + lookahead)), "singles");
    }
  }
}

TEST(EvictorsVsReference, LookaheadOnChains) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto chains = chain_trace(seed);
    for (uint64_t cap : {3, 8, 20, 40}) {  // 40: a horizon of 320, buckets of 2 events
      for (uint32_t lookahead : {0u, 2u}) {
        expect_lookahead_matches_reference(cap, lookahead, chains,
                                           "chains seed " + std::to_string(seed));
      }
    }
  }
}

// ---- Behaviour and edge cases ---------------------------------------------------------------

TEST(Evictors, CapacityZeroHoldsNothing) {
  const auto trace = singles({1, 2, 1, 2});
  EXPECT_EQ(run_policy<LruEvictor>(0, trace), 0u);
  EXPECT_EQ(run_policy<S3FifoEvictor>(0, trace), 0u);
  EXPECT_EQ(run_policy<LookaheadEvictor>(0, trace), 0u);
}

TEST(Evictors, CapacityOneKeepsTheLastBlock) {
  const auto trace = singles({1, 1, 2, 2, 1});
  EXPECT_EQ(run_policy<LruEvictor>(1, trace), 2u);
  EXPECT_EQ(run_policy<LfuEvictor>(1, trace), 2u);
  EXPECT_EQ(run_policy<PrefixAwareEvictor>(1, trace), 2u);
}

TEST(Evictors, EverythingRefusedByTheFilterYieldsNoVictim) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    EvictorOptions o;
    o.capacity_blocks = 4;
    auto e = make_evictor(p, o);
    for (uint64_t id = 1; id <= 4; ++id) e->on_insert(facts_of(id));
    std::vector<BlockKey> out;
    const auto pinned = [](const BlockKey&) { return true; };
    EXPECT_EQ(e->select_victims(3, KeyFilter(pinned), out), 0u) << eviction_policy_name(p);
    EXPECT_TRUE(out.empty());
    // Once one is free again, it is the only one offered.
    const auto only_three = [](const BlockKey& k) { return k.lo != 3; };
    EXPECT_EQ(e->select_victims(3, KeyFilter(only_three), out), 1u) << eviction_policy_name(p);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0], key_of(3));
    EXPECT_EQ(e->misuse(), 0u);
  }
}

TEST(Evictors, ReinsertionAfterEraseAndMisuseIsCounted) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    EvictorOptions o;
    o.capacity_blocks = 8;
    auto e = make_evictor(p, o);
    e->on_insert(facts_of(1));
    e->on_erase(key_of(1));
    EXPECT_FALSE(e->contains(key_of(1)));
    e->on_insert(facts_of(1));
    EXPECT_TRUE(e->contains(key_of(1)));
    EXPECT_EQ(e->size(), 1u);
    EXPECT_EQ(e->misuse(), 0u) << eviction_policy_name(p);
    e->on_insert(facts_of(1));  // already tracked
    e->on_access(key_of(9));    // never tracked
    e->on_erase(key_of(9));
    EXPECT_EQ(e->misuse(), 3u) << eviction_policy_name(p);
    EXPECT_EQ(e->size(), 1u);
  }
}

// Shadowed copies (a faster tier holds the block in full) go first, the longest-shadowed first,
// ahead of whatever the inner policy ranks first, each once; the rest comes from the inner policy
// in its order. Unshadowing or erasing a block takes it off the list; a newcomer is admitted while
// a shadowed copy can make room; marking an untracked key is misuse.
TEST(Evictors, ShadowedCopiesGoFirstOverAnyPolicy) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kS3Fifo,
                           EvictionPolicy::kPrefixAware, EvictionPolicy::kLookahead}) {
    SCOPED_TRACE(std::string(eviction_policy_name(p)));
    EvictorOptions o;
    o.capacity_blocks = 6;
    ShadowedFirstEvictor e(make_evictor(p, o));
    auto twin = make_evictor(p, o);  // the inner policy alone, told the same
    for (Evictor* x : {static_cast<Evictor*>(&e), twin.get()}) {
      for (uint64_t id = 1; id <= 6; ++id) x->on_insert(facts_of(id));
      for (uint64_t id : {1, 2, 3}) x->on_access(key_of(id));
    }
    std::vector<BlockKey> inner_order;
    twin->select_victims(6, KeyFilter::none(), inner_order);
    e.on_shadowed(key_of(5), true);
    e.on_shadowed(key_of(2), true);
    e.on_shadowed(key_of(5), true);  // again: no change
    e.on_shadowed(key_of(6), true);
    e.on_shadowed(key_of(6), false);
    EXPECT_EQ(e.shadowed(), 2u);
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
    EXPECT_EQ(out[0], key_of(5));
    EXPECT_EQ(out[1], key_of(2));
    std::vector<BlockKey> rest;
    for (const BlockKey& k : inner_order) {
      if (k != key_of(5) && k != key_of(2)) rest.push_back(k);
    }
    EXPECT_EQ(std::vector<BlockKey>(out.begin() + 2, out.end()), rest);
    // A refused shadowed block is passed over, and not offered by the inner policy either.
    out.clear();
    const auto refuse_five = [](const BlockKey& k) { return k == key_of(5); };
    ASSERT_EQ(e.select_victims(2, KeyFilter(refuse_five), out), 2u);
    EXPECT_EQ(out[0], key_of(2));
    EXPECT_NE(out[1], key_of(5));
    EXPECT_TRUE(e.admit(facts_of(99)));
    e.on_erase(key_of(5));
    e.on_erase(key_of(2));
    EXPECT_EQ(e.shadowed(), 0u);
    EXPECT_EQ(e.size(), 4u);
    e.on_shadowed(key_of(42), true);  // not tracked
    EXPECT_EQ(e.misuse(), 1u);
    EXPECT_EQ(e.shadowed(), 0u);
  }
  // Where the write strategy keeps copies below on purpose, nothing is wrapped.
  EvictorOptions o;
  auto lru = make_evictor(EvictionPolicy::kLru, o);
  Evictor* raw = lru.get();
  const auto write_through = make_write_strategy(WritePolicy::kWriteThrough, 2);
  EXPECT_EQ(shadowed_first(std::move(lru), Tier::kNvme, *write_through).get(), raw);
}

TEST(Evictors, PrefixAwareNeverEvictsAParentBeforeItsChildren) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  // Chain 1 -> 2 -> 3, then an unrelated newer block 9.
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2, 1, 1));
  e.on_insert(facts_of(3, 2, 2));
  e.on_insert(facts_of(9));
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  std::vector<BlockKey> out;
  // One walk gives up the whole chain, tail first, each parent right after its child.
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(3), key_of(2), key_of(1), key_of(9)}));
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(3));  // the chain's tail first
  // A child the walk's filter refuses (leaving in the same plan already) has left the walk: its
  // parent follows it.
  const auto tail_leaving = [](const BlockKey& k) { return k == key_of(3); };
  out.clear();
  ASSERT_EQ(e.select_victims(2, KeyFilter(tail_leaving), out), 2u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(2), key_of(1)}));
}

// A child that arrived before its parent (lower tiers receive chains leaf first, by demotion) is
// counted in the parent when it arrives: the parent, older in the walk, waits for its child.
TEST(Evictors, PrefixAwareParentArrivingAfterItsChildGoesAfterIt) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  e.on_insert(facts_of(2, 1, 1));  // the child, its parent not here yet
  e.on_insert(facts_of(1));
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  e.on_insert(facts_of(9));
  e.on_access(key_of(2));  // the child is now the newest: the walk meets its parent first
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(3, KeyFilter::none(), out), 3u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(9), key_of(2), key_of(1)}));
  e.on_erase(key_of(2));
  EXPECT_EQ(e.cached_children(key_of(1)), 0u);
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(e.misuse(), 0u);
}

// Tracks block `id` (child of `parent`) in `index` and attaches it to `links`; its slot.
uint32_t attach_block(KeyIndex& index, ChainLinks& links, uint64_t id, BlockKey parent) {
  const uint32_t slot = index.insert(key_of(id));
  links.reserve_slots(index.slot_limit());
  links.attach(index, slot, parent);
  return slot;
}

// A parent that left and came back into another slot whose per-slot generation matched the
// stale link's: the link must be recognised as stale and the child counted again.
TEST(Evictors, ChainLinksParentBackInAnotherSlotRecountsItsChild) {
  KeyIndex index;
  ChainLinks links;
  const auto add = [&](uint64_t id, BlockKey parent) {
    return attach_block(index, links, id, parent);
  };
  const uint32_t p = add(1, BlockKey{});
  const uint32_t c = add(2, key_of(1));
  EXPECT_EQ(links.parent_slot(index, c), p);
  EXPECT_EQ(links.children(p), 1u);
  links.detach(index, p);
  index.erase(p);
  EXPECT_EQ(add(3, BlockKey{}), p);  // the parent's old slot, now someone else's
  const uint32_t p2 = add(1, BlockKey{});
  ASSERT_NE(p2, p);
  EXPECT_EQ(links.parent_slot(index, c), p2);
  EXPECT_EQ(links.children(p2), 1u);
  links.detach(index, c);
  EXPECT_EQ(links.children(p2), 0u);
  EXPECT_EQ(links.children(p), 0u);
}

// A child that arrives before its parent waits for it and is counted the moment the parent
// arrives, with no walk asking for the child; a waiting child that leaves first is not counted.
TEST(Evictors, ChainLinksCountAChildThatArrivedFirstWhenItsParentArrives) {
  KeyIndex index;
  ChainLinks links;
  const auto add = [&](uint64_t id, BlockKey parent) {
    return attach_block(index, links, id, parent);
  };
  add(2, key_of(1));  // children of 1, before it
  add(3, key_of(1));
  const uint32_t gone = add(4, key_of(1));
  links.detach(index, gone);
  index.erase(gone);
  const uint32_t grandchild = add(5, key_of(2));  // linked at once: 2 is here
  EXPECT_EQ(links.children(index.find(key_of(2))), 1u);
  const uint32_t p = add(1, BlockKey{});
  EXPECT_EQ(links.children(p), 2u);
  EXPECT_EQ(links.parent_slot(index, index.find(key_of(2))), p);
  EXPECT_EQ(links.children(p), 2u);  // asking again counts nothing twice
  links.detach(index, index.find(key_of(3)));
  EXPECT_EQ(links.children(p), 1u);
  links.detach(index, grandchild);
  EXPECT_EQ(links.children(index.find(key_of(2))), 0u);
}

// Thousands of children waiting for one absent parent (a lower tier holding the branches of a
// shared prompt) leave in any order, each in O(1): the parent then counts exactly the ones
// left, and one that left never comes back through a reused slot.
TEST(Evictors, ChainLinksChildrenWaitingForOneParentLeaveInAnyOrder) {
  KeyIndex index;
  ChainLinks links;
  constexpr uint64_t kChildren = 4000;
  std::vector<uint32_t> slots;
  for (uint64_t id = 2; id < 2 + kChildren; ++id) {
    slots.push_back(attach_block(index, links, id, key_of(1)));
  }
  attach_block(index, links, 100000, key_of(900000));  // waits for another parent
  EXPECT_EQ(links.awaited_parents(), 2u);
  std::mt19937_64 rng(7);
  std::shuffle(slots.begin(), slots.end(), rng);
  const std::size_t leaving = kChildren / 2 + 1;
  for (std::size_t i = 0; i < leaving; ++i) {
    links.detach(index, slots[i]);
    index.erase(slots[i]);
  }
  // Reused slots, children of nobody here: not counted for 1.
  for (uint64_t id = 200000; id < 200010; ++id) attach_block(index, links, id, BlockKey{});
  const uint32_t p = attach_block(index, links, 1, BlockKey{});
  EXPECT_EQ(links.children(p), kChildren - leaving);
  EXPECT_EQ(links.awaited_parents(), 1u);
  for (std::size_t i = leaving; i < slots.size(); ++i) {
    EXPECT_EQ(links.parent_slot(index, slots[i]), p);
    links.detach(index, slots[i]);
  }
  EXPECT_EQ(links.children(p), 0u);
  // Every child of 1 left before 1 did: the last waiting list empties too.
  links.detach(index, index.find(key_of(100000)));
  EXPECT_EQ(links.awaited_parents(), 0u);
}

TEST(Evictors, PrefixAwareParentBackInAnotherSlotWaitsForItsChild) {
  EvictorOptions o;
  PrefixAwareEvictor e(o);
  e.on_insert(facts_of(1));        // slot 0
  e.on_insert(facts_of(2, 1, 1));  // slot 1, linked to 1
  e.on_erase(key_of(1));
  e.on_insert(facts_of(3));  // slot 0 again
  e.on_insert(facts_of(1));  // slot 2
  e.on_insert(facts_of(4));  // unrelated, touched last
  e.on_access(key_of(2));    // the newest: the walk meets its parent first
  EXPECT_EQ(e.cached_children(key_of(1)), 1u);
  std::vector<BlockKey> out;
  // Counted again, the parent waits for its child; taken as a leaf it would go second.
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out, (std::vector<BlockKey>{key_of(3), key_of(4), key_of(2), key_of(1)}));
  e.on_erase(key_of(2));
  EXPECT_EQ(e.cached_children(key_of(1)), 0u);
  EXPECT_EQ(e.misuse(), 0u);
}

// Random inserts (parents before or after their children), accesses, erases and refusals against
// a map of who is whose parent: a block is never offered before a tracked child of it that the
// filter allows, and every tracked block the filter allows is (up to the count asked: in chains,
// each parent follows its child within the walk).
TEST(Evictors, PrefixAwareRandomOpsOfferExactlyTheFreeLeaves) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    std::mt19937_64 rng(seed);
    EvictorOptions o;
    PrefixAwareEvictor e(o);
    // Chains of 6: id's parent is id - 1 unless id % 6 == 1.
    const auto parent_of = [](uint64_t id) { return id % 6 == 1 ? uint64_t{0} : id - 1; };
    std::set<uint64_t> tracked;
    for (int op = 0; op < 4000; ++op) {
      const uint64_t id = 1 + rng() % 60;
      switch (rng() % 4) {
        case 0:
        case 1:
          if (tracked.count(id)) {
            e.on_access(key_of(id));
          } else {
            const uint64_t p = parent_of(id);
            e.on_insert(p == 0 ? facts_of(id) : facts_of(id, p, 1));
            tracked.insert(id);
          }
          break;
        case 2:
          if (tracked.count(id)) {
            e.on_erase(key_of(id));
            tracked.erase(id);
          }
          break;
        default: {
          const uint64_t salt = rng();
          const auto refused = [salt](const BlockKey& k) {
            return policy_key_hash(BlockKey{k.lo ^ salt, k.hi}) % 4 == 0;
          };
          std::size_t allowed = 0;
          for (uint64_t t : tracked) allowed += refused(key_of(t)) ? 0 : 1;
          const std::size_t want = 1 + rng() % 8;
          std::vector<BlockKey> out;
          const std::size_t got = e.select_victims(want, KeyFilter(refused), out);
          ASSERT_EQ(got, std::min(want, allowed)) << "seed " << seed << " op " << op;
          std::set<uint64_t> offered;
          for (const BlockKey& k : out) {
            ASSERT_TRUE(tracked.count(k.lo));
            ASSERT_FALSE(refused(k));
            const uint64_t child = k.lo + 1;
            const bool child_first = !tracked.count(child) || parent_of(child) != k.lo ||
                                     refused(key_of(child)) || offered.count(child) != 0;
            ASSERT_TRUE(child_first) << "seed " << seed << " op " << op << ": offered " << k.lo
                                     << " before its cached child";
            offered.insert(k.lo);
          }
          // The caller evicts only some of what it was offered.
          for (const BlockKey& k : out) {
            if (rng() % 2 == 0) continue;
            e.on_erase(k);
            tracked.erase(k.lo);
          }
        }
      }
    }
    EXPECT_EQ(e.misuse(), 0u);
  }
}

// ---- S3-FIFO under refusals and over-fetching ---------------------------------------------------

// Capacity 100 (small target 10): blocks 1..`in_main` made to enter main (remembered by the
// ghost), then `in_small` newer ones in small.
std::unique_ptr<S3FifoEvictor> s3fifo_with(uint64_t in_main, uint64_t in_small) {
  EvictorOptions o;
  o.capacity_blocks = 100;
  auto e = std::make_unique<S3FifoEvictor>(o);
  for (uint64_t id = 1; id <= in_main; ++id) {
    e->on_insert(facts_of(id));
    e->on_erase(key_of(id));
    e->on_insert(facts_of(id));
  }
  for (uint64_t id = in_main + 1; id <= in_main + in_small; ++id) e->on_insert(facts_of(id));
  EXPECT_EQ(e->main_size(), in_main);
  EXPECT_EQ(e->small_size(), in_small);
  return e;
}

TEST(Evictors, S3FifoOffersMainWhenEverySmallBlockIsRefused) {
  auto e = s3fifo_with(90, 10);
  std::map<uint64_t, int> asked;
  const auto small_pinned = [&](const BlockKey& k) {
    ++asked[k.lo];
    return k.lo > 90;
  };
  std::vector<BlockKey> out;
  ASSERT_EQ(e->select_victims(1, KeyFilter(small_pinned), out), 1u);
  EXPECT_EQ(out[0], key_of(1));                             // main's oldest
  for (const auto& [id, n] : asked) EXPECT_LE(n, 1) << id;  // one second trip per call at most
  EXPECT_EQ(e->small_size(), 10u);
  EXPECT_EQ(e->main_size(), 90u);  // the victim stays tracked (and ranked) until erased
  // Everything refused: each block is asked once, nothing is offered.
  asked.clear();
  const auto all_pinned = [&](const BlockKey& k) {
    ++asked[k.lo];
    return true;
  };
  out.clear();
  EXPECT_EQ(e->select_victims(5, KeyFilter(all_pinned), out), 0u);
  EXPECT_EQ(asked.size(), 100u);
  for (const auto& [id, n] : asked) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(e->misuse(), 0u);
}

TEST(Evictors, S3FifoOffersSmallWhenEveryMainBlockIsRefused) {
  auto e = s3fifo_with(90, 5);  // small below its target: main goes first
  const auto main_pinned = [](const BlockKey& k) { return k.lo <= 90; };
  std::vector<BlockKey> out;
  ASSERT_EQ(e->select_victims(2, KeyFilter(main_pinned), out), 2u);
  EXPECT_EQ(out[0], key_of(91));  // small's oldest
  EXPECT_EQ(out[1], key_of(92));
  out.clear();
  ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));  // without the refusals, main's oldest as before
}

// Victims the caller did not erase (it asked for more than it used, or dropped the plan) keep
// their place: offered first again while unused, ranked again by S3-FIFO's rules once used.
TEST(Evictors, S3FifoVictimsNotErasedKeepTheirPlaceUntilUsed) {
  {
    auto e = s3fifo_with(5, 0);
    std::vector<BlockKey> out;
    ASSERT_EQ(e->select_victims(3, KeyFilter::none(), out), 3u);  // 1, 2, 3
    e->on_erase(key_of(1));
    out.clear();
    ASSERT_EQ(e->select_victims(2, KeyFilter::none(), out), 2u);
    EXPECT_EQ(out[0], key_of(2));  // not used since: still the next to go
    EXPECT_EQ(out[1], key_of(3));
    e->on_access(key_of(2));  // used again: a block of main with a use left
    out.clear();
    ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
    EXPECT_EQ(out[0], key_of(3));
    out.clear();
    ASSERT_EQ(e->select_victims(4, KeyFilter::none(), out), 4u);
    EXPECT_EQ(out[0], key_of(3));
    EXPECT_EQ(out[1], key_of(4));
    EXPECT_EQ(out[2], key_of(5));
    EXPECT_EQ(out[3], key_of(2));  // after one more trip through main
    EXPECT_EQ(e->main_size(), 4u);
  }
  {
    // From small: one used twice since it was offered moves to main; erased, one is remembered.
    auto e = s3fifo_with(0, 12);
    std::vector<BlockKey> out;
    ASSERT_EQ(e->select_victims(2, KeyFilter::none(), out), 2u);  // 1, 2
    e->on_access(key_of(1));
    e->on_access(key_of(1));
    out.clear();
    ASSERT_EQ(e->select_victims(1, KeyFilter::none(), out), 1u);
    EXPECT_EQ(out[0], key_of(2));
    EXPECT_EQ(e->main_size(), 1u);  // 1
    e->on_erase(key_of(2));
    e->on_insert(facts_of(2));  // the ghost remembers it: straight into main
    EXPECT_EQ(e->main_size(), 2u);
    EXPECT_EQ(e->small_size(), 10u);  // 3..12
    EXPECT_EQ(e->misuse(), 0u);
  }
}

// Random inserts, accesses, erases, refusals and over-fetching: S3-FIFO can evict any tracked
// block, so it runs out of victims only when every block it tracks is refused, and it asks the
// filter about a block at most once per call.
TEST(Evictors, S3FifoRandomOpsRunOutOfVictimsOnlyWhenAllAreRefused) {
  for (uint64_t cap : {10, 40, 100}) {
    std::mt19937_64 rng(cap);
    EvictorOptions o;
    o.capacity_blocks = cap;
    S3FifoEvictor e(o);
    std::set<uint64_t> tracked;
    for (int op = 0; op < 6000; ++op) {
      const uint64_t id = 1 + rng() % (2 * cap);
      switch (rng() % 4) {
        case 0:
          if (tracked.count(id)) {
            e.on_access(key_of(id));
          } else {
            e.on_insert(facts_of(id));
            tracked.insert(id);
          }
          break;
        case 1:
          if (tracked.count(id)) e.on_access(key_of(id));
          break;
        case 2:
          if (tracked.count(id)) {
            e.on_erase(key_of(id));
            tracked.erase(id);
          }
          break;
        default: {
          const uint64_t salt = rng();
          const uint64_t mode = rng() % 4;  // refused: none, a half, two thirds, all
          std::map<uint64_t, int> asked;
          const auto refused = [&](const BlockKey& k) {
            ++asked[k.lo];
            return mode == 3 || policy_key_hash(BlockKey{k.lo ^ salt, k.hi}) % (mode + 1) != 0;
          };
          std::size_t free = 0;
          for (uint64_t t : tracked) {
            free += refused(key_of(t)) ? 0 : 1;
          }
          asked.clear();
          const std::size_t want = 1 + rng() % 8;
          std::vector<BlockKey> out;
          const std::size_t got = e.select_victims(want, KeyFilter(refused), out);
          ASSERT_EQ(got, std::min(want, free)) << "cap " << cap << " op " << op;
          std::set<uint64_t> distinct;
          for (const BlockKey& k : out) {
            ASSERT_TRUE(tracked.count(k.lo));
            distinct.insert(k.lo);
          }
          ASSERT_EQ(distinct.size(), out.size());
          for (const auto& [k, n] : asked) ASSERT_LE(n, 1) << "cap " << cap << " op " << op;
          for (const BlockKey& k : out) {
            if (rng() % 2 == 0) continue;
            e.on_erase(k);
            tracked.erase(k.lo);
          }
        }
      }
      ASSERT_EQ(e.size(), tracked.size());
      ASSERT_EQ(e.small_size() + e.main_size(), tracked.size());
    }
    EXPECT_EQ(e.misuse(), 0u);
  }
}

TEST(Evictors, PlainLruEvictsAChainHeadFirst) {
  EvictorOptions o;
  LruEvictor e(o);
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2, 1, 1));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));
}

TEST(Evictors, LookaheadKeepsHintedBlocksAndReturningOnes) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 100;  // horizon: 800 references, 806 in whole buckets of 13
  o.hints = &board;
  LookaheadEvictor e(o);
  // Block 5 comes back every second reference; the one-off blocks between never do.
  e.on_miss(facts_of(5));
  e.on_insert(facts_of(5));
  for (uint64_t i = 0; i < 40; ++i) {
    e.on_miss(facts_of(1000 + i));
    e.on_access(key_of(5));
  }
  EXPECT_EQ(e.uses_of(key_of(5)), 41u);
  EXPECT_EQ(e.uses_of(key_of(1000)), 1u);
  // Every reference here ends its one-block request (settled by the next one). The gaps are as
  // of the last bucket boundary, the 78th reference. Once-used by then: 39 intervals, one closed
  // (5's first) after 2 references, in the first age bucket; none of the others is back.
  EXPECT_DOUBLE_EQ(e.model().expected_gap(LookaheadEvictor::class_of(1, true)),
                   2.0 / 40 + 806.0 * 39 / 40);
  // 5 at 16+ uses: 23 intervals closed after 2 references, one open; its prior is 8-15's hazard.
  const double frequent = e.model().expected_gap(LookaheadEvictor::class_of(41, true));
  EXPECT_GT(frequent, 2.0);
  EXPECT_LT(frequent, 2.0 + 806.0 / 20);
  e.on_insert(facts_of(1));
  e.on_insert(facts_of(2));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(1));  // the older newcomer; 5 is expected back far sooner
  const BlockKey hinted = key_of(1);
  ASSERT_TRUE(board.add(7, 0, std::span(&hinted, 1)).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(2));  // 1 is wanted by a waiting request
  // A hinted newcomer is always admitted; an unhinted new block is not worth 5's frame.
  EXPECT_TRUE(e.admit(facts_of(1)));
  e.on_erase(key_of(1));
  e.on_erase(key_of(2));
  e.on_miss(facts_of(2000));
  EXPECT_FALSE(e.admit(facts_of(2000)));
}

// When only hinted blocks can go, many victims at once are found in one walk of the hinted list:
// the filter is asked about each block once, and each pick is the block whose reader starts last
// among the kHintedScan oldest not taken yet (the first ones are refused).
TEST(Evictors, LookaheadManyHintedVictimsInOneWalk) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 4096;
  o.hints = &board;
  LookaheadEvictor e(o);
  constexpr uint64_t kBlocks = 2048;
  std::vector<BlockKey> keys;
  for (uint64_t id = 1; id <= kBlocks; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
    keys.push_back(key_of(id));
  }
  // Request r (expected to start at r) reads blocks 2r-1 and 2r: older blocks are read later
  // by requests numbered from the far end.
  for (uint64_t r = 1; r <= kBlocks / 2; ++r) {
    const BlockKey pair[2] = {key_of(kBlocks + 1 - 2 * r), key_of(kBlocks + 2 - 2 * r)};
    ASSERT_TRUE(board.add(r, r, pair).ok());
  }
  uint64_t asked = 0;
  const auto skip = [&](const BlockKey& k) {
    ++asked;
    return k == key_of(1) || k == key_of(2);
  };
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(kBlocks, KeyFilter(skip), out), kBlocks - 2);
  EXPECT_LE(asked, 2 * kBlocks) << "the hinted list was walked again for every victim";
  std::set<BlockKey> distinct(out.begin(), out.end());
  EXPECT_EQ(distinct.size(), out.size());
  EXPECT_EQ(distinct.count(key_of(1)) + distinct.count(key_of(2)), 0u);
  // Blocks 3 and 4 are read by the request that starts last of all the oldest ones.
  EXPECT_TRUE(out[0] == key_of(3) || out[0] == key_of(4)) << to_string(out[0]);
}

// What the last tier evicts leaves the cache: it measures its horizon in the whole cache. What a
// tier above evicts moves down and stays cached: it measures its horizon in its own frames.
TEST(Evictors, LookaheadMeasuresTheLastTiersHorizonInTheWholeCacheAndAnUpperTiersInItself) {
  EvictorOptions o;
  o.capacity_blocks = 16;
  EXPECT_EQ(LookaheadEvictor(o).model().horizon(), 8u * 16);
  o.cache_blocks = 4;  // never less than the tier itself
  EXPECT_EQ(LookaheadEvictor(o).model().horizon(), 8u * 16);
  std::array<std::optional<EvictorOptions>, 3> tiers;
  for (uint64_t t = 0; t < 3; ++t) {
    tiers[t].emplace().capacity_blocks = uint64_t{16} << (2 * t);  // 16, 64, 256 frames
    tiers[t]->cache_blocks = 336;
  }
  const auto cache = make_tier_evictors(EvictionPolicy::kLookahead, tiers);
  const auto horizon = [&](int t) {
    return static_cast<const LookaheadEvictor&>(*cache[t]).model().horizon();
  };
  EXPECT_EQ(horizon(0), 8u * 16);
  EXPECT_EQ(horizon(1), 8u * 64);
  EXPECT_EQ(horizon(2), 8u * 336);
  EXPECT_EQ(LookaheadEvictor(*tiers[0]).model().horizon(), 8u * 336);  // HBM as the last tier
}

// A toy hierarchy of three evictors, driven as the replay drives its tiers: every reference goes
// to every tier in order (an access where it holds the block, else a miss); a block missing from
// HBM is placed there, and each tier's victims go down to the next with their rank, the last
// tier's out of the cache; then the request ends. Returns, per request, the victims and every
// tier's use count and class of every key, so two hierarchies can be compared decision for
// decision.
std::vector<std::vector<uint64_t>> drive_hierarchy(std::array<std::unique_ptr<Evictor>, 3>& tiers,
                                                   const std::array<uint64_t, 3>& capacity,
                                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> log;
  std::function<void(std::size_t, const BlockFacts&)> place = [&](std::size_t t,
                                                                  const BlockFacts& block) {
    Evictor& e = *tiers[t];
    if (e.contains(block.key)) return;
    if (e.size() >= capacity[t]) {
      std::vector<BlockKey> victims;
      const auto keep = [&](const BlockKey& k) { return k == block.key; };
      ASSERT_EQ(e.select_victims(1, KeyFilter(keep), victims), 1u);
      // Ids are root * 10 + depth: a block's parent is the id before it, unless it is a root.
      const uint64_t id = victims[0].lo;
      BlockFacts down = id % 10 == 0 ? facts_of(id) : facts_of(id, id - 1, id % 10);
      e.describe(victims[0], down);
      down.demoted = true;
      log.back().push_back(victims[0].lo + 1000 * t);
      e.on_erase(victims[0]);
      if (t + 1 < tiers.size()) place(t + 1, down);
    }
    e.on_insert(block);
  };
  for (int request = 0; request < 3000; ++request) {
    log.emplace_back();
    // A chain of 1-6 blocks under one of 40 roots; ids root * 10 + depth.
    const uint64_t root = std::uniform_int_distribution<uint64_t>(1, 40)(rng);
    const uint32_t length = std::uniform_int_distribution<uint32_t>(1, 6)(rng);
    for (uint32_t depth = 0; depth < length; ++depth) {
      const uint64_t id = root * 10 + depth;
      const BlockFacts f = depth == 0 ? facts_of(id) : facts_of(id, id - 1, depth);
      for (auto& e : tiers) {
        if (e->contains(f.key)) {
          e->on_access(f.key);
        } else {
          e->on_miss(f);
        }
      }
      place(0, f);
    }
    // The request ends, having generated 0-400 tokens: its first uses take that output's class.
    std::vector<BlockKey> keys;
    for (uint32_t depth = 0; depth < length; ++depth) keys.push_back(key_of(root * 10 + depth));
    const uint64_t output = std::uniform_int_distribution<uint64_t>(0, 400)(rng);
    for (auto& e : tiers) e->on_request_end(keys, output);
    for (auto& e : tiers) {
      const auto& la = static_cast<const LookaheadEvictor&>(*e);
      for (uint64_t id = 10; id < 410; ++id) {
        const std::optional<GhostTable::Entry> known = la.recall(key_of(id));
        log.back().push_back(known ? known->count : 0);
        log.back().push_back(known ? known->tag : 0xff);
      }
    }
  }
  return log;
}

// The tiers of one cache share the last tier's history of blocks they do not hold instead of
// keeping a ghost each: the hierarchy decides exactly as three tiers with their own ghosts do,
// with one ghost in all.
TEST(Evictors, LookaheadTiersReadTheLastTiersHistoryAndDecideAsWithGhostsOfTheirOwn) {
  const std::array<uint64_t, 3> capacity = {6, 12, 30};
  std::array<std::optional<EvictorOptions>, 3> options;
  for (std::size_t t = 0; t < 3; ++t) {
    options[t].emplace();
    options[t]->capacity_blocks = capacity[t];
    options[t]->cache_blocks = 48;
  }
  for (uint64_t seed : {1, 2, 3}) {
    std::array<std::unique_ptr<Evictor>, 3> shared =
        make_tier_evictors(EvictionPolicy::kLookahead, options);
    // Each with its own ghost; a tier above the last measures its horizon in its own frames.
    std::array<std::unique_ptr<Evictor>, 3> own;
    for (std::size_t t = 0; t < 3; ++t) {
      EvictorOptions alone = *options[t];
      if (t < 2) alone.cache_blocks = 0;
      own[t] = make_evictor(EvictionPolicy::kLookahead, alone);
    }
    EXPECT_EQ(drive_hierarchy(shared, capacity, seed), drive_hierarchy(own, capacity, seed));
    for (std::size_t t = 0; t < 3; ++t) {
      EXPECT_EQ(shared[t]->misuse(), 0u);
      const auto& a = static_cast<const LookaheadEvictor&>(*shared[t]).model();
      const auto& b = static_cast<const LookaheadEvictor&>(*own[t]).model();
      for (uint32_t c = 0; c < LookaheadEvictor::kClasses; ++c) {
        EXPECT_EQ(a.expected_gap(c), b.expected_gap(c)) << "tier " << t << " class " << c;
      }
    }
    // The upper tiers hold no ghost (the smallest one has 65,536 entries of 16 bytes).
    for (std::size_t t = 0; t < 2; ++t) {
      EXPECT_LE(shared[t]->memory_bytes() + (1u << 20), own[t]->memory_bytes()) << "tier " << t;
    }
    EXPECT_EQ(shared[2]->memory_bytes(), own[2]->memory_bytes());
  }
  // A tier alone, or the policies without such a history, are what make_evictor builds.
  std::array<std::optional<EvictorOptions>, 3> hbm_only;
  hbm_only[0] = options[0];
  const auto alone = make_tier_evictors(EvictionPolicy::kLookahead, hbm_only);
  EXPECT_EQ(alone[0]->memory_bytes(),
            make_evictor(EvictionPolicy::kLookahead, *options[0])->memory_bytes());
  EXPECT_EQ(alone[1], nullptr);
  EXPECT_EQ(alone[2], nullptr);
  const auto lru = make_tier_evictors(EvictionPolicy::kLru, options);
  for (const auto& e : lru) EXPECT_EQ(e->name(), "lru");
}

// A request's end classes its first uses by what it generated, in every tier: a block HBM tracks,
// the last tier's memory of it, and the block once demoted (it keeps that class, not the one of a
// first use whose request is still open).
TEST(Evictors, LookaheadFirstUsesKeepTheirRequestsOutputClassDownTheTiers) {
  std::array<std::optional<EvictorOptions>, 3> options;
  options[0].emplace().capacity_blocks = 2;
  options[2].emplace().capacity_blocks = 8;
  options[0]->cache_blocks = options[2]->cache_blocks = 10;
  auto tiers = make_tier_evictors(EvictionPolicy::kLookahead, options);
  const auto& hbm = static_cast<const LookaheadEvictor&>(*tiers[0]);
  const auto& nvme = static_cast<const LookaheadEvictor&>(*tiers[2]);
  const uint32_t open = LookaheadEvictor::class_of(1, false);
  const uint32_t long_answer = LookaheadEvictor::first_use_class(300, false);
  ASSERT_NE(open, long_answer);
  EXPECT_EQ(LookaheadEvictor::first_use_class(15, false),
            LookaheadEvictor::first_use_class(0, false));
  EXPECT_NE(LookaheadEvictor::first_use_class(16, false),
            LookaheadEvictor::first_use_class(15, false));
  for (std::size_t t : {0, 2}) tiers[t]->on_miss(facts_of(1));
  tiers[0]->on_insert(facts_of(1));
  EXPECT_EQ(hbm.recall(key_of(1))->tag, open);
  const std::vector<BlockKey> keys = {key_of(1)};
  for (std::size_t t : {0, 2}) tiers[t]->on_request_end(keys, 300);
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);
  EXPECT_EQ(nvme.recall(key_of(1))->tag, long_answer);
  for (std::size_t t : {0, 2}) tiers[t]->on_request_end(keys, 3);  // once per request: kept
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);
  BlockFacts down = facts_of(1);
  tiers[0]->describe(key_of(1), down);
  down.demoted = true;
  tiers[0]->on_erase(key_of(1));
  tiers[2]->on_insert(down);
  EXPECT_EQ(nvme.recall(key_of(1))->tag, long_answer);
  EXPECT_EQ(hbm.recall(key_of(1))->tag, long_answer);  // read from the last tier
  EXPECT_EQ(hbm.misuse() + nvme.misuse(), 0u);
}

// A tier whose clock fell behind the last tier's (a caller that skipped it for some references)
// never reads a reference from its future: a block's last reference is at most its own clock.
TEST(Evictors, LookaheadTierBehindItsHistoryReadsNoFutureReference) {
  std::array<std::optional<EvictorOptions>, 3> options;
  options[0].emplace().capacity_blocks = 4;
  options[2].emplace().capacity_blocks = 4;
  auto tiers = make_tier_evictors(EvictionPolicy::kLookahead, options);
  EXPECT_EQ(tiers[1], nullptr);
  for (int i = 0; i < 5; ++i) tiers[2]->on_miss(facts_of(100 + i));  // HBM skipped
  tiers[2]->on_miss(facts_of(1));                                    // the last tier at 6
  tiers[0]->on_miss(facts_of(1));                                    // HBM at 1
  tiers[2]->on_miss(facts_of(1));
  const auto& hbm = static_cast<const LookaheadEvictor&>(*tiers[0]);
  const std::optional<GhostTable::Entry> seen = hbm.recall(key_of(1));
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->time, 1u);
  EXPECT_EQ(seen->count, 2u);
  tiers[0]->on_insert(facts_of(1));
  EXPECT_EQ(hbm.recall(key_of(1))->time, 1u);
  EXPECT_EQ(hbm.misuse(), 0u);
}

// A block an open sequence holds (EvictorOptions::in_use) is wanted now: it goes after every
// block no one is known to read, and after those a waiting request reads; when its sequence
// closes it ranks again as if touched then.
TEST(Evictors, LookaheadKeepsBlocksInUseLongestAndRanksThemAgainWhenReleased) {
  HintBoard board;
  std::set<uint64_t> held;
  EvictorOptions o;
  o.capacity_blocks = 4;
  o.hints = &board;
  o.in_use = [&](const BlockKey& k) { return held.count(k.lo) != 0; };
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 4; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
  }
  held = {1, 2};  // the two oldest: an open sequence's
  const std::vector<BlockKey> queued = {key_of(3)};
  ASSERT_TRUE(board.add(7, 1000, queued).ok());
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
  EXPECT_EQ(out[0], key_of(4));  // read by no one known
  EXPECT_EQ(out[1], key_of(3));  // read by a waiting request
  EXPECT_TRUE((out[2] == key_of(1) && out[3] == key_of(2)) ||
              (out[2] == key_of(2) && out[3] == key_of(1)));
  // The sequence closes and the request starts: 1, 2 and 3 rank again as if touched now, so the
  // oldest, 1, is no longer first; 4 is.
  held.clear();
  ASSERT_TRUE(board.remove(7).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(4));
  EXPECT_EQ(e.misuse(), 0u);
}

// A block whose sequence closed ranks again when the scheduler says so (on_released), not only
// once it reaches the back of the hinted list, where a longer-lived sequence's blocks wait (and
// where the last-resort scan, kHintedScan blocks deep, never reaches it).
TEST(Evictors, LookaheadRanksAReleasedBlockAgainWhereverItWaits) {
  std::set<uint64_t> held;
  EvictorOptions o;
  o.capacity_blocks = 40;
  o.in_use = [&](const BlockKey& k) { return held.count(k.lo) != 0; };
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 40; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
    if (id <= 30) held.insert(id);  // 1-20: a long decode; 21-30: sequences that close soon
  }
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(31));  // 1-30 wait in the hinted list, 1 at its back
  for (uint64_t id = 21; id <= 30; ++id) {
    held.erase(id);
    e.on_released(key_of(id));
  }
  e.on_released(key_of(1));  // still held: stays where it is
  out.clear();
  ASSERT_EQ(e.select_victims(20, KeyFilter::none(), out), 20u);
  std::set<uint64_t> ids;
  for (const BlockKey& k : out) ids.insert(k.lo);
  for (uint64_t id = 21; id <= 40; ++id) EXPECT_EQ(ids.count(id), 1u) << id;  // not 1-20
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadHintedBlocksLeaveTheRankingUntilTouchedOrUnhinted) {
  HintBoard board;
  EvictorOptions o;
  o.capacity_blocks = 3;
  o.hints = &board;
  LookaheadEvictor e(o);
  for (uint64_t id = 1; id <= 3; ++id) {
    e.on_miss(facts_of(id));
    e.on_insert(facts_of(id));
  }
  const std::vector<BlockKey> queued = {key_of(1), key_of(2), key_of(3)};
  ASSERT_TRUE(board.add(10, 0, queued).ok());
  // Everything held is wanted by the queue: an unhinted newcomer is refused, and victims are
  // offered only as a last resort, oldest first.
  e.on_miss(facts_of(4));
  EXPECT_FALSE(e.admit(facts_of(4)));
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(2));
  // The request starts and touches 3 only; 1 and 2 are ranked again, as if touched now (1 first,
  // it waited longest). 3 ranks by its new class.
  ASSERT_TRUE(board.remove(10).ok());
  e.on_access(key_of(3));
  out.clear();
  ASSERT_EQ(e.select_victims(3, KeyFilter::none(), out), 3u);
  const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
  EXPECT_LT(at(1), at(2));
  EXPECT_NE(at(3), out.end());
  // With a waiting request for 3 again, 3 is kept while 1 and 2 can go; a hinted newcomer enters.
  const BlockKey three = key_of(3);
  ASSERT_TRUE(board.add(11, 0, std::span(&three, 1)).ok());
  out.clear();
  ASSERT_EQ(e.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(2));
  const BlockKey five = key_of(5);
  ASSERT_TRUE(board.add(12, 0, std::span(&five, 1)).ok());
  EXPECT_TRUE(e.admit(facts_of(5)));
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadLearnsWhichEndsOfRequestsComeBack) {
  // Requests [P, Q, L_i]: the shared prefix P, Q comes back every request, each final block L_i
  // never does. The policy learns it from the order of references alone.
  EvictorOptions o;
  o.capacity_blocks = 4;  // horizon: 32 references
  LookaheadEvictor e(o);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 60; ++i) reqs.push_back({1, 2, 100 + i});
  const DriveResult r = drive(e, 4, reqs);
  EXPECT_EQ(r.hits, 2u * 59);  // P and Q are never evicted for a final block
  const ReuseModel& m = e.model();
  EXPECT_EQ(m.reuse_probability(LookaheadEvictor::class_of(1, true)), 0.0);
  EXPECT_GT(m.reuse_probability(LookaheadEvictor::class_of(16, false)), 0.9);
  EXPECT_DOUBLE_EQ(m.expected_gap(LookaheadEvictor::class_of(1, true)), 32.0);
  EXPECT_LT(m.expected_gap(LookaheadEvictor::class_of(16, false)), 8.0);
  // The cache holds P, Q and the last two final blocks; the older one, settled as a request's
  // end, goes first.
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(1, KeyFilter::none(), out), 1u);
  EXPECT_EQ(out[0], key_of(158));
  EXPECT_EQ(e.misuse(), 0u);
}

TEST(Evictors, LookaheadChildNeverRanksAboveItsParent) {
  EvictorOptions o;
  o.capacity_blocks = 16;
  LookaheadEvictor e(o);
  // Train: the chain X -> Y comes back every request, so X's continued classes learn a short gap.
  std::vector<Request> reqs(12, Request{50, 51});
  drive(e, 16, reqs);
  const uint32_t fresh = LookaheadEvictor::class_of(1, false);
  const uint32_t returning = LookaheadEvictor::class_of(6, false);
  ASSERT_LT(e.model().expected_gap(returning), e.model().expected_gap(fresh));
  // A new parent, and a child demoted with 5 past hits: the child's own class would rank above
  // the parent; it joins the parent's list, behind it.
  e.on_insert(facts_of(1));
  BlockFacts child = facts_of(2, 1, 1);
  child.hits = 5;
  e.on_insert(child);
  EXPECT_EQ(e.uses_of(key_of(2)), 6u);
  std::vector<BlockKey> out;
  const auto only_new = [](const BlockKey& k) { return k.lo != 1 && k.lo != 2; };
  ASSERT_EQ(e.select_victims(2, KeyFilter(only_new), out), 2u);
  EXPECT_EQ(out[0], key_of(2));
  EXPECT_EQ(out[1], key_of(1));
}

// Two lookahead tiers that hear every reference, as the scheduler's do: a block demoted with the
// upper tier's rank (describe()) ranks in the lower tier from that rank, so the tiers keep one
// order; without it, it would rank from its arrival, as fresh as a block referenced just now.
TEST(Evictors, LookaheadDemotedBlockKeepsTheRankOfTheTierAbove) {
  EvictorOptions o;
  o.capacity_blocks = 4;
  LookaheadEvictor upper(o);
  LookaheadEvictor lower(o);
  // References 1 and 2 (t = 1, 2) are held by the upper tier; 3 (t = 3) by the lower one.
  for (uint64_t id : {1, 2}) {
    upper.on_miss(facts_of(id));
    upper.on_insert(facts_of(id));
    lower.on_miss(facts_of(id));
  }
  upper.on_miss(facts_of(3));
  lower.on_miss(facts_of(3));
  lower.on_insert(facts_of(3));
  // 1 is demoted at t = 3: it brings its rank time 1, older than 3's.
  BlockFacts one = facts_of(1);
  upper.describe(key_of(1), one);
  ASSERT_TRUE(one.rank.has_value());
  EXPECT_EQ(one.rank->time, 1u);
  one.demoted = true;
  lower.on_insert(one);
  upper.on_erase(key_of(1));
  std::vector<BlockKey> out;
  ASSERT_EQ(lower.select_victims(2, KeyFilter::none(), out), 2u);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(3));
  // Admission compares the carried rank too: 2 ranks from t = 2, after 1 and before 3.
  BlockFacts two = facts_of(2);
  upper.describe(key_of(2), two);
  two.demoted = true;
  EXPECT_TRUE(lower.admit(two));
  lower.on_erase(key_of(1));
  for (uint64_t id : {50, 51}) {  // the clock moves on to t = 5
    upper.on_miss(facts_of(id));
    lower.on_miss(facts_of(id));
  }
  EXPECT_FALSE(lower.admit(two));  // 3, the victim now, ranks above it
  // Not demoted (a promotion), the same facts rank from now: above 3.
  two.demoted = false;
  EXPECT_TRUE(lower.admit(two));
  EXPECT_EQ(upper.misuse() + lower.misuse(), 0u);
}

// Demoted blocks that arrive out of rank order are put in order; a chain demoted from its tail
// (child first, same rank time) keeps its parent ahead; a block referenced here since ranks last.
TEST(Evictors, LookaheadOrdersDemotedArrivalsByTheirRank) {
  EvictorOptions o;
  o.capacity_blocks = 8;
  LookaheadEvictor e(o);
  for (int i = 0; i < 20; ++i) e.on_miss(facts_of(1000 + i));  // the clock reaches 20
  e.on_miss(facts_of(9));
  e.on_insert(facts_of(9));  // referenced at t = 21
  const auto demote = [&](BlockFacts f, uint64_t time) {
    f.demoted = true;
    f.rank = CarriedRank{time, static_cast<uint8_t>(LookaheadEvictor::class_of(1, false))};
    e.on_insert(f);
  };
  demote(facts_of(5), 12);
  demote(facts_of(4), 7);
  demote(facts_of(6), 15);
  demote(facts_of(8, 7, 1), 10);  // the chain 7 -> 8, child first
  demote(facts_of(7), 10);
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
  const std::vector<BlockKey> expected = {key_of(4), key_of(8), key_of(7),
                                          key_of(5), key_of(6), key_of(9)};
  EXPECT_EQ(out, expected);
  EXPECT_EQ(e.misuse(), 0u);
}

// Chains demoted with one rank time (one run) leave from their tails however their blocks
// arrive: a tier above may send a head down first (it ran out of room while the chain was still
// being computed), a tail first, or two chains' blocks alternately. Arriving head first between
// other blocks, each block used to go in front of those before it, so the head left first and
// stranded its children.
TEST(Evictors, LookaheadDemotedChainLeavesFromItsTailInAnyArrivalOrder) {
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  // Chains 1 -> 2 -> 3 and 21 -> 22 -> 23, one run (rank time 5).
  const auto facts = [](uint64_t id) {
    const uint64_t depth = id % 20 - 1;
    return depth == 0 ? facts_of(id) : facts_of(id, id - 1, static_cast<uint32_t>(depth));
  };
  for (const std::vector<uint64_t>& order :
       {std::vector<uint64_t>{1, 21, 2, 22, 3, 23}, std::vector<uint64_t>{3, 23, 2, 22, 1, 21},
        std::vector<uint64_t>{2, 21, 3, 1, 23, 22}}) {
    EvictorOptions o;
    o.capacity_blocks = 8;
    LookaheadEvictor e(o);
    for (uint64_t id : order) {
      BlockFacts f = facts(id);
      f.demoted = true;
      f.rank = CarriedRank{5, cls};
      e.on_insert(f);
    }
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(6, KeyFilter::none(), out), 6u);
    const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
    std::string arrival;
    for (uint64_t id : order) arrival += std::to_string(id) + " ";
    EXPECT_LT(at(3), at(2)) << "arrival order " << arrival;
    EXPECT_LT(at(2), at(1)) << "arrival order " << arrival;
    EXPECT_LT(at(23), at(22)) << "arrival order " << arrival;
    EXPECT_LT(at(22), at(21)) << "arrival order " << arrival;
    EXPECT_EQ(e.misuse(), 0u);
  }
}

// A parent goes after its children, whatever their ranks. Demoted with an older rank than its
// child's, in either order of arrival: met in the walk, it waits and goes right after its child;
// found at the ranking's tail, it is held out of the ranking (a child the caller refuses does not
// free it) until its last child leaves, and then ranks by its own rank time again.
TEST(Evictors, LookaheadParentGoesAfterItsChildrenWhateverTheirRanks) {
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  const auto demote = [&](LookaheadEvictor& e, BlockFacts f, uint64_t time) {
    f.demoted = true;
    f.rank = CarriedRank{time, cls};
    e.on_insert(f);
  };
  for (bool child_first : {true, false}) {
    const std::string order = child_first ? "child first" : "parent first";
    EvictorOptions o;
    o.capacity_blocks = 8;
    LookaheadEvictor e(o);
    for (int i = 0; i < 20; ++i) e.on_miss(facts_of(1000 + i));  // the clock reaches 20
    // Parent first, the child does not arrive right behind it (it would take the parent's time).
    if (child_first) demote(e, facts_of(2, 1, 1), 10);
    demote(e, facts_of(1), 5);
    demote(e, facts_of(7), 3);
    if (!child_first) demote(e, facts_of(2, 1, 1), 10);
    demote(e, facts_of(9), 12);
    std::vector<BlockKey> out;
    ASSERT_EQ(e.select_victims(4, KeyFilter::none(), out), 4u);
    const std::vector<BlockKey> expected = {key_of(7), key_of(2), key_of(1), key_of(9)};
    EXPECT_EQ(out, expected) << order;
    e.on_erase(key_of(7));
    const auto one = [&](KeyFilter skip) {
      std::vector<BlockKey> v;
      EXPECT_EQ(e.select_victims(1, skip, v), 1u) << order;
      return v.empty() ? BlockKey{} : v[0];
    };
    EXPECT_EQ(one(KeyFilter::none()), key_of(2)) << order;  // 1, at the tail now, is held
    const auto child_leaving = [](const BlockKey& k) { return k == key_of(2); };
    EXPECT_EQ(one(KeyFilter(child_leaving)), key_of(9)) << order;
    e.on_erase(key_of(2));
    EXPECT_EQ(one(KeyFilter::none()), key_of(1)) << order;  // ranked again, below 9
    EXPECT_EQ(e.misuse(), 0u);
  }
}

// A run of references (each the child of the one before) ranks from its first reference, also
// where this tier holds only part of it: a chain whose middle block is elsewhere keeps one rank
// time here, as it would in one cache of the tiers' summed size. describe() carries it on, with
// the block's depth.
TEST(Evictors, LookaheadARunRanksFromItsStartWhereThisTierHoldsPartOfIt) {
  EvictorOptions o;
  o.capacity_blocks = 8;
  LookaheadEvictor e(o);
  e.on_miss(facts_of(1));  // t = 1: the run starts
  e.on_insert(facts_of(1));
  e.on_miss(facts_of(2, 1, 1));  // t = 2: held by another tier
  e.on_miss(facts_of(3, 2, 2));  // t = 3
  e.on_insert(facts_of(3, 2, 2));
  e.on_miss(facts_of(10));  // t = 4: a new run
  e.on_insert(facts_of(10));
  BlockFacts three;  // as the placement fills it: key and parent
  three.key = key_of(3);
  three.parent = key_of(2);
  e.describe(key_of(3), three);
  ASSERT_TRUE(three.rank.has_value());
  EXPECT_EQ(three.rank->time, 1u);
  EXPECT_EQ(three.depth, 2u);
  BlockFacts ten = facts_of(10);
  e.describe(key_of(10), ten);
  ASSERT_TRUE(ten.rank.has_value());
  EXPECT_EQ(ten.rank->time, 4u);
  // Read again, 1 starts a run at t = 5, and 3 read after an unrelated block starts its own.
  e.on_access(key_of(1));
  e.on_access(key_of(10));
  e.on_access(key_of(3));
  BlockFacts one = facts_of(1);
  e.describe(key_of(1), one);
  e.describe(key_of(3), three);
  EXPECT_EQ(one.rank->time, 5u);
  EXPECT_EQ(three.rank->time, 7u);
  EXPECT_EQ(e.misuse(), 0u);
}

// An arrival however far out of order goes to its place: one older than 600 arrivals before it
// leaves first (the list's order is indexed, not walked).
TEST(Evictors, LookaheadArrivalFarOutOfOrderGoesToItsPlace) {
  constexpr uint32_t kNewer = 600;
  EvictorOptions o;
  o.capacity_blocks = kNewer + 1;
  LookaheadEvictor e(o);
  const uint8_t cls = static_cast<uint8_t>(LookaheadEvictor::class_of(1, false));
  for (uint64_t i = 0; i < kNewer; ++i) {
    BlockFacts f = facts_of(100 + i);
    f.demoted = true;
    f.rank = CarriedRank{10 + i, cls};
    e.on_insert(f);
  }
  BlockFacts late = facts_of(1);
  late.demoted = true;
  late.rank = CarriedRank{1, cls};
  e.on_insert(late);
  BlockFacts middle = facts_of(2);
  middle.demoted = true;
  middle.rank = CarriedRank{10 + kNewer / 2, cls};
  e.on_insert(middle);
  std::vector<BlockKey> out;
  ASSERT_EQ(e.select_victims(kNewer + 2, KeyFilter::none(), out), kNewer + 2);
  EXPECT_EQ(out[0], key_of(1));
  EXPECT_EQ(out[1], key_of(100));
  // 2 ties with 100 + kNewer / 2 (same time, same depth): either order, next to it.
  const auto at = [&](uint64_t id) { return std::find(out.begin(), out.end(), key_of(id)); };
  EXPECT_EQ(std::abs(at(2) - at(100 + kNewer / 2)), 1);
  EXPECT_EQ(e.misuse(), 0u);
}

// ---- The reuse model and the ghost history ----------------------------------------------------

TEST(ReuseModel, UnseenClassesRankAsNeverBack) {
  ReuseModel m(3, 64, 1000, {ReuseModel::kNoFallback, 0, 1});
  m.advance(10);
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_EQ(m.expected_gap(c), 64.0);
    EXPECT_EQ(m.reuse_probability(c), 0.0);
  }
}

// A horizon of 64 events: buckets of one event, so ages are exact.
TEST(ReuseModel, WithEveryIntervalSettledItIsTheTruncatedMean) {
  ReuseModel m(1, 64, 100000);
  for (int i = 0; i < 4; ++i) m.entered(0);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(0, 10);
  EXPECT_EQ(m.expected_gap(0), 64.0);  // gaps change at the next bucket boundary
  m.advance(100);                      // the fourth is past the horizon
  // Three gaps of 10 and one "not within H", against one pseudo-interval that never closes.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 3.0 / 5);
  // A reuse past the horizon is none.
  m.reused(0, 95);
  m.advance(101);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
}

TEST(ReuseModel, OpenIntervalsCountOnlyForTheAgesTheyReached) {
  ReuseModel m(1, 64, 100000);
  m.entered(0);
  m.entered(0);
  m.advance(30);
  m.reused(0, 30);  // one of the two is back at age 30
  m.advance(31);
  for (int i = 0; i < 10; ++i) m.entered(0);
  m.advance(40);
  // The ten young intervals have not reached age 30: one in three came back there (the pseudo-
  // interval is the third). Counted as "not within H" from the start, they would make it
  // (30 + 12 x 64) / 13.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 30.0 / 3 + 64 * 2.0 / 3);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 1.0 / 3);
}

TEST(ReuseModel, AClassWithLittleEvidenceFollowsItsFallback) {
  ReuseModel m(2, 64, 100000, {ReuseModel::kNoFallback, 0});
  for (int i = 0; i < 3; ++i) m.entered(0);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(0, 10);
  m.advance(11);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 0.75 * 10 + 0.25 * 64);
  // Class 1's pseudo-interval closes at class 0's hazard, at the middle of the bucket.
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.75 * 10.5 + 0.25 * 64);
  // Its own evidence outweighs the fallback: twenty intervals, none back by age 20.
  for (int i = 0; i < 20; ++i) m.entered(1);
  m.advance(31);
  EXPECT_GT(m.expected_gap(1), 60.0);
}

// Class 0 pools classes 1 and 2: its estimate counts their intervals (and its own), while each
// keeps an estimate of its own evidence.
TEST(ReuseModel, APoolCountsTheIntervalsOfItsMembers) {
  ReuseModel m(3, 64, 100000, {}, {ReuseModel::kNoFallback, 0, 0});
  for (int i = 0; i < 3; ++i) m.entered(1);
  m.entered(2);
  m.advance(10);
  for (int i = 0; i < 3; ++i) m.reused(1, 10);
  m.advance(100);  // class 2's interval is past the horizon
  // Class 1: three gaps of 10 and its pseudo-interval; class 2: nothing back.
  EXPECT_DOUBLE_EQ(m.expected_gap(1), (30.0 + 64) / 4);
  EXPECT_DOUBLE_EQ(m.expected_gap(2), 64.0);
  // Class 0: the four intervals of its members and its own pseudo-interval.
  EXPECT_DOUBLE_EQ(m.expected_gap(0), (30.0 + 2 * 64) / 5);
  EXPECT_DOUBLE_EQ(m.reuse_probability(0), 3.0 / 5);
  // A pool into a class that is pooled itself, or into itself, is ignored.
  ReuseModel chained(3, 64, 100000, {}, {1, 2, 2});
  chained.entered(0);
  chained.advance(10);
  chained.reused(0, 10);
  chained.advance(11);
  EXPECT_DOUBLE_EQ(chained.expected_gap(0), (10.0 + 64) / 2);
  EXPECT_DOUBLE_EQ(chained.expected_gap(1), 64.0);
}

TEST(ReuseModel, MovedIntervalsTakeTheAgesTheyReached) {
  ReuseModel m(2, 64, 100000);
  m.entered(0);
  m.entered(0);
  m.advance(5);
  m.moved(0, 1, 0);  // one of them is class 1's, at risk for ages 0-5 there
  m.advance(10);
  m.reused(1, 10);
  m.reused(0, 3);  // nothing of class 0 opened at 7: ignored
  m.advance(11);
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.5 * 10 + 0.5 * 64);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 64.0);
  m.moved(1, 0, 0);  // closed already: nothing to move
  m.moved(0, 1, 3);  // nothing opened at 3
  m.advance(12);
  EXPECT_DOUBLE_EQ(m.expected_gap(1), 0.5 * 10 + 0.5 * 64);

  // An interval moved once past the horizon brings "open at every age".
  ReuseModel s(2, 64, 100000);
  s.entered(0);
  s.entered(1);
  s.advance(10);
  s.reused(1, 10);
  s.advance(100);
  EXPECT_DOUBLE_EQ(s.expected_gap(1), 0.5 * 10 + 0.5 * 64);
  s.moved(0, 1, 0);
  s.advance(101);
  EXPECT_DOUBLE_EQ(s.expected_gap(1), 10.0 / 3 + 64 * 2.0 / 3);
}

TEST(ReuseModel, DecayHalvesOldEvidence) {
  ReuseModel d(1, 64, 1000);
  for (int i = 0; i < 4; ++i) d.entered(0);
  d.advance(10);
  for (int i = 0; i < 4; ++i) d.reused(0, 10);
  d.advance(11);
  EXPECT_DOUBLE_EQ(d.expected_gap(0), 0.8 * 10 + 0.2 * 64);  // 4 back of 4, with the prior
  d.advance(1000);  // a half-life: 2 of 2 against the prior
  EXPECT_DOUBLE_EQ(d.expected_gap(0), 10.0 * 2 / 3 + 64.0 / 3);
}

TEST(ReuseModel, AgesAreCutIntoBucketsOfTheHorizon) {
  ReuseModel m(1, 1000, 100000);
  EXPECT_EQ(m.bucket_events(), 16u);
  EXPECT_EQ(m.horizon(), 1008u);  // 63 buckets of 16 events
  m.entered(0);
  m.advance(5);
  m.reused(0, 5);
  EXPECT_EQ(m.expected_gap(0), 1008.0);
  m.advance(16);
  EXPECT_DOUBLE_EQ(m.expected_gap(0), 0.5 * 5 + 0.5 * 1008);
}

TEST(GhostTable, EntriesCarryTimeCountAndTag) {
  GhostTable g(64);
  EXPECT_EQ(g.capacity(), 64u);
  EXPECT_FALSE(g.find(key_of(1), 10).has_value());
  g.put(key_of(1), GhostTable::Entry{7, 3, 5}, 10);
  auto e = g.find(key_of(1), 10);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->time, 7u);
  EXPECT_EQ(e->count, 3u);
  EXPECT_EQ(e->tag, 5u);
  EXPECT_TRUE(g.set_tag(key_of(1), 6));
  EXPECT_FALSE(g.set_tag(key_of(2), 6));
  g.put(key_of(1), GhostTable::Entry{12, 100000, 6}, 12);  // replaces; the count saturates
  EXPECT_EQ(g.size(), 1u);
  e = g.take(key_of(1), 20);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->time, 12u);
  EXPECT_EQ(e->count, GhostTable::kMaxCount);
  EXPECT_EQ(e->tag, 6u);
  EXPECT_FALSE(g.find(key_of(1), 20).has_value());
  EXPECT_EQ(g.size(), 0u);
  // Times are kept modulo 2^40 and rebuilt against the owner's clock.
  const uint64_t late = (uint64_t{1} << 41) + 5;
  g.put(key_of(2), GhostTable::Entry{late - 3, 1, 0}, late);
  EXPECT_EQ(g.find(key_of(2), late)->time, late - 3);
  GhostTable none(0);
  none.put(key_of(1), GhostTable::Entry{1, 1, 0}, 1);
  EXPECT_FALSE(none.find(key_of(1), 1).has_value());
}

TEST(GhostTable, AFullBucketOfEqualCountsForgetsTheEntryReferencedLongestAgo) {
  GhostTable g(GhostTable::kWays);  // one bucket
  for (uint64_t id = 1; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{100 + id, 1, 0}, 100 + id);
  }
  g.put(key_of(1), GhostTable::Entry{200, 2, 0}, 200);  // 1 referenced again: now the newest
  g.put(key_of(99), GhostTable::Entry{201, 1, 0}, 201);
  EXPECT_TRUE(g.find(key_of(1), 201).has_value());
  EXPECT_FALSE(g.find(key_of(2), 201).has_value());  // the oldest reference
  EXPECT_TRUE(g.find(key_of(99), 201).has_value());
  EXPECT_EQ(g.size(), GhostTable::kWays);
  // A block evicted with an old last reference is the next to go.
  g.put(key_of(3), GhostTable::Entry{50, 1, 0}, 202);
  g.put(key_of(98), GhostTable::Entry{203, 1, 0}, 203);
  EXPECT_FALSE(g.find(key_of(3), 203).has_value());
  EXPECT_TRUE(g.find(key_of(4), 203).has_value());
}

TEST(GhostTable, AFullBucketKeepsAnEntryLongerPerReferenceItHad) {
  GhostTable g(GhostTable::kWays);  // one bucket
  // Block 1, referenced 4 times, last at 100; blocks 2..8 once each, later.
  g.put(key_of(1), GhostTable::Entry{100, 4, 0}, 100);
  for (uint64_t id = 2; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{200 + id, 1, 0}, 200 + id);
  }
  // At 300: block 1 is 200 old over 4 references (50 each), block 2 is 98 old over 1.
  g.put(key_of(99), GhostTable::Entry{300, 1, 0}, 300);
  EXPECT_TRUE(g.find(key_of(1), 300).has_value());
  EXPECT_FALSE(g.find(key_of(2), 300).has_value());
  // At 700: block 1 is 600 / 4 = 150 per reference; block 3 is 497, the stalest once-used one.
  g.put(key_of(98), GhostTable::Entry{700, 1, 0}, 700);
  EXPECT_TRUE(g.find(key_of(1), 700).has_value());
  EXPECT_FALSE(g.find(key_of(3), 700).has_value());
  // It still goes when it is the stalest per reference: the others referenced again at 2000.
  for (uint64_t id = 4; id <= GhostTable::kWays; ++id) {
    g.put(key_of(id), GhostTable::Entry{2000, 8, 0}, 2000);
  }
  g.put(key_of(99), GhostTable::Entry{2000, 8, 0}, 2000);
  g.put(key_of(98), GhostTable::Entry{2000, 8, 0}, 2000);
  // At 2001 block 1 has 1901 / 4 against 1 / 8 for each of the others.
  g.put(key_of(97), GhostTable::Entry{2001, 1, 0}, 2001);
  EXPECT_FALSE(g.find(key_of(1), 2001).has_value());
  EXPECT_EQ(g.size(), GhostTable::kWays);
}

TEST(GhostHistory, ASlotLeftByATakeNeverForgetsTheKeysNewerEntry) {
  GhostHistory g(3);
  g.put(key_of(1), 1);  // slot 0
  g.take(key_of(1));
  g.put(key_of(1), 2);  // slot 1
  g.put(key_of(2), 1);  // slot 2
  g.put(key_of(3), 1);  // reuses slot 0, which no longer owns 1
  EXPECT_EQ(g.count(key_of(1)), 2u);
  g.put(key_of(4), 1);  // reuses slot 1: now 1 goes
  EXPECT_FALSE(g.contains(key_of(1)));
  EXPECT_TRUE(g.contains(key_of(2)));
  EXPECT_TRUE(g.contains(key_of(3)));
  EXPECT_TRUE(g.contains(key_of(4)));
}

}  // namespace
}  // namespace kvtier::testing

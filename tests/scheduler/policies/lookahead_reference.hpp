// The lookahead policy as a naive re-statement over maps. Ranks are run_start - G(list), run_start
// the time of the first reference of the run (references each the child of the one before) that
// last touched the block, G the truncated mean gap of ReuseModel's formula, recomputed here from
// plain per-class sums; list order is kept as (major, minor) pairs: a push to a list's front takes
// a new major, a child placed behind its parent takes the parent's major and the next minor, so a
// list's tail is its smallest major and, within it, its largest minor. Victims are the k-way merge
// of the lists by rank, as the policy walks them; an unhinted block with a child cached, met before
// the victim, is held (kHeld) until its last child leaves, then ranks by its rank time in its
// class's arrived list (kArrivedBase + class); held blocks are offered when no unhinted leaf is
// left, the one held longest first; hinted blocks reaching a tail move to a hinted list (kHinted)
// and are offered last, the one whose reader starts last among the 16 longest-hinted first. At a
// request's end its first uses move to the class of its output (output_of), deepest first.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "scheduler/policies/hint_board.hpp"
#include "scheduler/policies/lookahead_evictor.hpp"
#include "scheduler/policies/reuse_model.hpp"
#include "tests/scheduler/policies/policy_test_util.hpp"

namespace kvtier::testing {

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

}  // namespace kvtier::testing

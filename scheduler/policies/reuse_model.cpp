#include "scheduler/policies/reuse_model.hpp"

#include <algorithm>

namespace kvtier {

ReuseModel::ReuseModel(uint32_t classes, uint64_t horizon, uint64_t half_life,
                       std::vector<uint32_t> fallback, std::vector<uint32_t> pooled_into)
    : classes_(classes),
      width_((std::max<uint64_t>(horizon, 1) + kAgeBuckets - 1) / kAgeBuckets),
      buckets_(static_cast<uint32_t>((std::max<uint64_t>(horizon, 1) + width_ - 1) / width_)),
      half_life_(std::max<uint64_t>(half_life, 1)),
      next_decay_(half_life_),
      fallback_(std::move(fallback)),
      pooled_into_(std::move(pooled_into)),
      at_risk_(std::size_t{classes} * buckets_, 0.0),
      reuses_(at_risk_.size(), 0.0),
      gap_sum_(at_risk_.size(), 0.0),
      open_(std::size_t{classes} * buckets_, 0),
      hazard_(at_risk_.size(), 0.0),
      gap_(classes, 0.0),
      back_(classes, 0.0) {
  fallback_.resize(classes, kNoFallback);
  pooled_into_.resize(classes, kNoFallback);
  for (uint32_t c = 0; c < classes; ++c) {
    if (fallback_[c] >= c) fallback_[c] = kNoFallback;
    const uint32_t p = pooled_into_[c];
    if (p >= classes || p == c || pooled_into_[p] != kNoFallback) pooled_into_[c] = kNoFallback;
  }
  refresh();
}

void ReuseModel::entered(uint32_t cls) {
  ++open_[open_at(bucket_, cls)];
  at_risk_[at(cls, 0)] += 1.0;
}

void ReuseModel::moved(uint32_t from, uint32_t to, uint64_t opened) {
  if (opened > now_) return;
  const uint64_t b = opened / width_;
  uint64_t reached = buckets_;  // ages it was counted at risk for: all, when settled
  if (age_of(b) < buckets_) {
    uint64_t& n = open_[open_at(b, from)];
    if (n == 0) return;  // closed already, or never opened in `from`
    --n;
    ++open_[open_at(b, to)];
    reached = age_of(b) + 1;
  }
  for (uint32_t a = 0; a < reached; ++a) {
    double& f = at_risk_[at(from, a)];
    if (f < 1.0) break;  // decayed away
    f -= 1.0;
    at_risk_[at(to, a)] += 1.0;
  }
}

void ReuseModel::reused(uint32_t cls, uint64_t gap) {
  if (gap > now_) return;
  const uint64_t b = (now_ - gap) / width_;
  if (age_of(b) >= buckets_) return;  // settled as open past the horizon
  uint64_t& n = open_[open_at(b, cls)];
  if (n == 0) return;  // not an interval of this class
  --n;
  const uint32_t a = static_cast<uint32_t>(age_of(b));
  reuses_[at(cls, a)] += 1.0;
  gap_sum_[at(cls, a)] += static_cast<double>(gap);
}

void ReuseModel::advance(uint64_t now) {
  if (now <= now_) return;
  now_ = now;
  bool changed = false;
  while (bucket_ < now_ / width_) {
    next_bucket();
    changed = true;
  }
  while (now_ >= next_decay_) {
    for (std::size_t i = 0; i < at_risk_.size(); ++i) {
      at_risk_[i] *= 0.5;
      reuses_[i] *= 0.5;
      gap_sum_[i] *= 0.5;
    }
    next_decay_ += half_life_;
  }
  if (changed) refresh();
}

void ReuseModel::next_bucket() {
  ++bucket_;
  // The intervals opened buckets_ buckets ago are past the horizon: they stay counted as at risk
  // at every age, which is what "not back within H" is. Their ring slot is this bucket's now.
  for (uint32_t c = 0; c < classes_; ++c) open_[open_at(bucket_, c)] = 0;
  for (uint32_t a = 1; a < buckets_; ++a) {
    const uint64_t opened = bucket_ - a;
    if (opened > bucket_) break;  // before the clock started
    for (uint32_t c = 0; c < classes_; ++c) {
      const uint64_t n = open_[open_at(opened, c)];
      if (n != 0) at_risk_[at(c, a)] += static_cast<double>(n);
    }
  }
}

void ReuseModel::refresh() {
  const double h = static_cast<double>(horizon());
  for (uint32_t c = 0; c < classes_; ++c) {
    const uint32_t fb = fallback_[c];
    double survive = 1.0;
    double gap = 0.0;
    for (uint32_t a = 0; a < buckets_; ++a) {
      const std::size_t i = at(c, a);
      double risk = at_risk_[i];
      double reuses = reuses_[i];
      double gaps = gap_sum_[i];
      for (uint32_t q = 0; q < classes_; ++q) {  // the classes pooled into c
        if (pooled_into_[q] != c) continue;
        risk += at_risk_[at(q, a)];
        reuses += reuses_[at(q, a)];
        gaps += gap_sum_[at(q, a)];
      }
      const double prior = fb == kNoFallback ? 0.0 : kPrior * hazard_[at(fb, a)];
      const double closed = reuses + prior;
      const double hazard = std::min(1.0, closed / (risk + kPrior));
      hazard_[i] = hazard;
      if (closed <= 0.0) continue;
      // The mean gap of the closings at this age; the prior's at the bucket's middle.
      const double mid = (static_cast<double>(a) + 0.5) * static_cast<double>(width_);
      const double mean = (gaps + prior * mid) / closed;
      gap += survive * hazard * mean;
      survive *= 1.0 - hazard;
    }
    gap_[c] = gap + survive * h;
    back_[c] = 1.0 - survive;
  }
}

std::size_t ReuseModel::memory_bytes() const {
  return (at_risk_.capacity() + reuses_.capacity() + gap_sum_.capacity() + hazard_.capacity() +
          gap_.capacity() + back_.capacity()) *
             sizeof(double) +
         open_.capacity() * sizeof(uint64_t) +
         (fallback_.capacity() + pooled_into_.capacity()) * sizeof(uint32_t);
}

}  // namespace kvtier

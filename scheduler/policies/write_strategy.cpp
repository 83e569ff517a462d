#include "scheduler/policies/write_strategy.hpp"

namespace kvtier {
namespace {

// Tiers below HBM that are configured and hold no copy yet.
TierMask missing_below(const WriteContext& block) {
  TierMask out;
  for (Tier t : {Tier::kHost, Tier::kNvme}) {
    if (block.available.has(t) && !block.present.has(t)) out = out.with(t);
  }
  return out;
}

class WriteThrough final : public WriteStrategy {
 public:
  std::string_view name() const override { return "write_through"; }
  TierMask on_complete(const WriteContext& block) const override { return missing_below(block); }
  TierMask on_hit(const WriteContext& block) const override { return TierMask(); }
};

class WriteBack final : public WriteStrategy {
 public:
  std::string_view name() const override { return "write_back"; }
  TierMask on_complete(const WriteContext&) const override { return TierMask(); }
  TierMask on_hit(const WriteContext&) const override { return TierMask(); }
  bool keeps_shadowed_copies() const override { return false; }
};

class WriteThroughSelective final : public WriteStrategy {
 public:
  explicit WriteThroughSelective(uint32_t hits) : hits_(hits) {}
  std::string_view name() const override { return "write_through_selective"; }
  TierMask on_complete(const WriteContext& block) const override {
    return block.hits >= hits_ ? missing_below(block) : TierMask();
  }
  TierMask on_hit(const WriteContext& block) const override {
    return block.hits >= hits_ ? missing_below(block) : TierMask();
  }

 private:
  uint32_t hits_;
};

}  // namespace

std::unique_ptr<WriteStrategy> make_write_strategy(WritePolicy policy, uint32_t selective_hits) {
  switch (policy) {
    case WritePolicy::kWriteThrough: return std::make_unique<WriteThrough>();
    case WritePolicy::kWriteBack: return std::make_unique<WriteBack>();
    case WritePolicy::kWriteThroughSelective:
      return std::make_unique<WriteThroughSelective>(selective_hits);
  }
  return std::make_unique<WriteBack>();
}

std::string_view write_policy_name(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteThrough: return "write_through";
    case WritePolicy::kWriteBack: return "write_back";
    case WritePolicy::kWriteThroughSelective: return "write_through_selective";
  }
  return "unknown";
}

}  // namespace kvtier

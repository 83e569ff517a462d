#include "scheduler/policies/hint_board.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace kvtier {

Status HintBoard::add(uint64_t request_id, uint64_t expected_start,
                      std::span<const BlockKey> keys) {
  if (requests_.count(request_id) != 0) {
    return already_exists("hinted request " + std::to_string(request_id) +
                          " is already on the hint board");
  }
  Request request;
  request.expected_start = expected_start;
  request.keys.reserve(keys.size());
  std::unordered_set<BlockKey, BlockKeyHash> distinct;
  distinct.reserve(keys.size());
  for (const BlockKey& k : keys) {
    if (!distinct.insert(k).second) continue;
    request.keys.push_back(k);
    uses_[k].readers.emplace_back(expected_start, request_id);
  }
  requests_.emplace(request_id, std::move(request));
  return ok_status();
}

Status HintBoard::remove(uint64_t request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return not_found("hinted request " + std::to_string(request_id) + " is not on the hint board");
  }
  for (const BlockKey& k : it->second.keys) {
    const auto u = uses_.find(k);
    if (u == uses_.end()) continue;
    auto& readers = u->second.readers;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](const auto& r) { return r.second == request_id; }),
                  readers.end());
    if (readers.empty()) uses_.erase(u);
  }
  requests_.erase(it);
  return ok_status();
}

void HintBoard::clear() {
  requests_.clear();
  uses_.clear();
}

std::optional<HintBoard::Use> HintBoard::find(const BlockKey& key) const {
  const auto u = uses_.find(key);
  if (u == uses_.end()) return std::nullopt;
  Use use;
  use.requests = static_cast<uint32_t>(u->second.readers.size());
  use.earliest_start = u->second.readers.front().first;
  for (const auto& r : u->second.readers)
    use.earliest_start = std::min(use.earliest_start, r.first);
  return use;
}

}  // namespace kvtier

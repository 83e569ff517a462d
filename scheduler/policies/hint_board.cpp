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
  request.keys.assign(keys.begin(), keys.end());
  std::unordered_set<BlockKey, BlockKeyHash> distinct;
  distinct.reserve(keys.size());
  for (const BlockKey& k : keys) {
    if (distinct.insert(k).second) uses_[k].readers.emplace_back(expected_start, request_id);
  }
  requests_.emplace(request_id, std::move(request));
  return ok_status();
}

Status HintBoard::update(uint64_t request_id, uint64_t expected_start,
                         std::span<const BlockKey> keys) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return add(request_id, expected_start, keys);
  Request& request = it->second;
  if (!std::ranges::equal(request.keys, keys)) {
    KVTIER_RETURN_IF_ERROR(remove(request_id));
    return add(request_id, expected_start, keys);
  }
  if (request.expected_start == expected_start) return ok_status();
  request.expected_start = expected_start;
  for (const BlockKey& k : request.keys) {
    const auto u = uses_.find(k);
    if (u == uses_.end()) continue;
    for (auto& reader : u->second.readers) {
      if (reader.second == request_id) reader.first = expected_start;
    }
  }
  return ok_status();
}

void HintBoard::retain(const std::function<bool(uint64_t request_id)>& keep) {
  std::vector<uint64_t> gone;
  for (const auto& [id, request] : requests_) {
    if (!keep(id)) gone.push_back(id);
  }
  for (uint64_t id : gone) remove(id).ignore();  // listed from requests_: present
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

#include "bench/engine/kv_shadow.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "bench/engine/paged_attention.hpp"

namespace kvtier::engine {

KvShadow::KvShadow(const Geometry& geometry) : geometry_(geometry) {}

void KvShadow::open(SequenceId sequence, std::span<const BlockKey> reused_keys) {
  const uint32_t pt = geometry_.page_tokens;
  const std::size_t block_layer_bytes = pt * row_bytes();
  Sequence seq;
  seq.rows.resize(geometry_.layers);
  seq.reused.assign(reused_keys.begin(), reused_keys.end());
  for (uint32_t l = 0; l < geometry_.layers; ++l) {
    seq.rows[l].assign(reused_keys.size() * block_layer_bytes, 0);
  }
  for (std::size_t b = 0; b < reused_keys.size(); ++b) {
    auto it = published_.find(reused_keys[b]);
    if (it == published_.end()) {
      seq.unlearnt[b].assign(geometry_.layers, 1);
      continue;
    }
    for (uint32_t l = 0; l < geometry_.layers; ++l) {
      std::memcpy(seq.rows[l].data() + b * block_layer_bytes,
                  it->second.data() + l * block_layer_bytes, block_layer_bytes);
    }
  }
  sequences_[sequence] = std::move(seq);
}

void KvShadow::close(SequenceId sequence) { sequences_.erase(sequence); }

void KvShadow::truncate(SequenceId sequence, uint64_t tokens) {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) return;
  Sequence& seq = it->second;
  for (auto& rows : seq.rows) rows.resize(std::min(rows.size(), tokens * row_bytes()));
  const std::size_t blocks =
      std::min<std::size_t>(seq.reused.size(), tokens / geometry_.page_tokens);
  seq.reused.resize(blocks);
  std::erase_if(seq.unlearnt,
                [&](const auto& entry) { return entry.first * geometry_.page_tokens >= tokens; });
}

void KvShadow::read_row(const HbmView& hbm, int32_t frame, uint64_t pos, uint8_t* dst) const {
  const std::size_t tb = geometry_.token_bytes();
  const uint32_t pt = geometry_.page_tokens;
  const auto* page =
      static_cast<const uint8_t*>(hbm.base) + static_cast<std::size_t>(frame) * hbm.frame_stride;
  std::memcpy(dst, page + (pos % pt) * tb, tb);
  std::memcpy(dst + tb, page + (pt + pos % pt) * tb, tb);
}

Status KvShadow::check_item(const HbmView& hbm, const int32_t* frames, SequenceId id, Sequence& seq,
                            uint32_t layer, uint64_t end) {
  const uint32_t pt = geometry_.page_tokens;
  const std::size_t rb = row_bytes();
  std::vector<uint8_t>& rows = seq.rows[layer];
  if (rows.size() < end * rb) {
    return internal_error("kv check: sequence " + std::to_string(id) + " layer " +
                          std::to_string(layer) + ": the shadow holds " +
                          std::to_string(rows.size() / rb) + " rows; the step reads " +
                          std::to_string(end));
  }
  scratch_.resize(rb);
  for (uint64_t block = 0; block * pt < end; ++block) {
    const int32_t frame = frames[block];
    const uint64_t first = block * pt;
    const uint64_t last = std::min<uint64_t>(first + pt, end);
    const bool reused = block < seq.reused.size();
    if (auto u = seq.unlearnt.find(block); u != seq.unlearnt.end() && u->second[layer] != 0) {
      // Never published to this shadow, or ambiguous: learnt from this read.
      for (uint64_t pos = first; pos < last; ++pos) {
        read_row(hbm, frame, pos, rows.data() + pos * rb);
      }
      u->second[layer] = 0;
      if (std::count(u->second.begin(), u->second.end(), 1) == 0) seq.unlearnt.erase(u);
      ++learnt_blocks_;
      continue;
    }
    uint64_t bad_first = last, bad_count = 0;
    for (uint64_t pos = first; pos < last; ++pos) {
      read_row(hbm, frame, pos, scratch_.data());
      if (std::memcmp(scratch_.data(), rows.data() + pos * rb, rb) != 0) {
        bad_first = std::min(bad_first, pos);
        ++bad_count;
      }
    }
    verified_rows_ += last - first;
    if (bad_count > 0) {
      std::string what = reused ? "as published under key " + to_string(seq.reused[block])
                                : std::string("as this sequence wrote them");
      return internal_error(
          "kv check: sequence " + std::to_string(id) + " layer " + std::to_string(layer) +
          " block " + std::to_string(block) + " (HBM frame " + std::to_string(frame) +
          "): " + std::to_string(bad_count) + " of rows " + std::to_string(first) + ".." +
          std::to_string(last - 1) + " differ, the first at row " + std::to_string(bad_first) +
          ", from the rows " + what);
    }
  }
  return ok_status();
}

Status KvShadow::verify(const HbmView& hbm, const LayerTable& table,
                        std::span<const SequenceId> sequences, std::span<const StepSlice> slices,
                        uint32_t layer, bool with_new_rows) {
  for (std::size_t i = 0; i < slices.size(); ++i) {
    auto it = sequences_.find(sequences[i]);
    if (it == sequences_.end()) {
      return internal_error("kv check: sequence " + std::to_string(sequences[i]) +
                            " was never opened in the shadow");
    }
    const uint64_t end = slices[i].context + (with_new_rows ? slices[i].tokens : 0);
    KVTIER_RETURN_IF_ERROR(check_item(hbm, table.indices.data() + table.indptr[i], sequences[i],
                                      it->second, layer, end));
  }
  return ok_status();
}

void KvShadow::record(const HbmView& hbm, const LayerTable& table,
                      std::span<const SequenceId> sequences, std::span<const StepSlice> slices,
                      uint32_t layer) {
  const uint32_t pt = geometry_.page_tokens;
  const std::size_t rb = row_bytes();
  for (std::size_t i = 0; i < slices.size(); ++i) {
    auto it = sequences_.find(sequences[i]);
    if (it == sequences_.end()) continue;  // verify reports it
    std::vector<uint8_t>& rows = it->second.rows[layer];
    const uint64_t end = slices[i].context + slices[i].tokens;
    rows.resize(end * rb);
    const int32_t* frames = table.indices.data() + table.indptr[i];
    for (uint64_t pos = slices[i].context; pos < end; ++pos) {
      read_row(hbm, frames[pos / pt], pos, rows.data() + pos * rb);
    }
  }
}

void KvShadow::publish(SequenceId sequence, uint64_t first_block, std::span<const BlockKey> keys) {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) return;
  Sequence& seq = it->second;
  const std::size_t block_layer_bytes = geometry_.page_tokens * row_bytes();
  for (std::size_t j = 0; j < keys.size(); ++j) {
    const uint64_t offset = (first_block + j) * block_layer_bytes;
    if (seq.rows[0].size() < offset + block_layer_bytes) continue;
    if (ambiguous_.contains(keys[j])) {
      seq.unlearnt[first_block + j].assign(geometry_.layers, 1);
      continue;
    }
    std::vector<uint8_t> bytes(block_layer_bytes * geometry_.layers);
    for (uint32_t l = 0; l < geometry_.layers; ++l) {
      std::memcpy(bytes.data() + l * block_layer_bytes, seq.rows[l].data() + offset,
                  block_layer_bytes);
    }
    auto [at, inserted] = published_.try_emplace(keys[j], std::move(bytes));
    if (!inserted && at->second != bytes) {
      published_.erase(at);
      ambiguous_.insert(keys[j]);
      seq.unlearnt[first_block + j].assign(geometry_.layers, 1);
    }
  }
}

}  // namespace kvtier::engine

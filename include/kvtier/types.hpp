// Vocabulary types shared by every part of kvtier: KV dtypes, tiers and the model's KV geometry.
//
// Plain values only; no dependency beyond the standard library, so kernels, tiers, the scheduler
// and embedders all speak the same words. The byte formulas here are the single source of truth
// for page, block and frame sizes (see DESIGN.md, "Vocabulary").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvtier {

enum class Dtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFP8E4M3 = 3 };

constexpr std::size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::kF32: return 4;
    case Dtype::kF16: return 2;
    case Dtype::kBF16: return 2;
    case Dtype::kFP8E4M3: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kF32: return "f32";
    case Dtype::kF16: return "f16";
    case Dtype::kBF16: return "bf16";
    case Dtype::kFP8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

constexpr std::array<Dtype, 4> kAllDtypes = {Dtype::kF32, Dtype::kF16, Dtype::kBF16,
                                             Dtype::kFP8E4M3};

constexpr std::optional<Dtype> parse_dtype(std::string_view name) {
  for (Dtype d : kAllDtypes) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

// Tiers, fastest first. The numeric order is the promotion order.
enum class Tier : uint8_t { kHbm = 0, kHost = 1, kNvme = 2 };
constexpr int kNumTiers = 3;
constexpr std::array<Tier, kNumTiers> kAllTiers = {Tier::kHbm, Tier::kHost, Tier::kNvme};

constexpr std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kHbm: return "hbm";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "unknown";
}

constexpr int tier_index(Tier t) { return static_cast<int>(t); }

// The model's KV shape. A page is the K and V of `page_tokens` tokens of ONE layer, laid out
// [K|V][page_tokens][kv_heads][head_dim] (K for all tokens, then V). A block is the `layers`
// pages of one token block, the unit of identity (its key) and of NVMe extents.
struct Geometry {
  uint32_t layers = 32;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  Dtype dtype = Dtype::kBF16;
  uint32_t page_tokens = 16;

  // Bytes of K (or V) of one token of one layer.
  constexpr std::size_t token_bytes() const {
    return static_cast<std::size_t>(kv_heads) * head_dim * dtype_size(dtype);
  }
  // Bytes of one page: 2 * page_tokens * kv_heads * head_dim * sizeof(dtype).
  constexpr std::size_t page_bytes() const { return 2 * page_tokens * token_bytes(); }
  // Bytes of one block's KV (all layers), excluding any on-disk header.
  constexpr std::size_t block_bytes() const { return page_bytes() * layers; }

  friend constexpr bool operator==(const Geometry&, const Geometry&) = default;
};

// How a tier below HBM stores a page: as computed (the model's dtype, byte for byte) or re-encoded
// in fp8 e4m3 to halve its bytes. An encoded page is [K fp8][V fp8] followed by a trailer of two
// f32 scales (K, V; value = fp8 * scale), so the page alone is enough to read it back — the
// NVMe store checksums and moves it like any other page, and a single layer can be read without
// its block. HBM always holds pages as computed: attention reads them there.
struct PageFormat {
  Geometry geometry;                  // the model's KV geometry
  Dtype stored_dtype = Dtype::kBF16;  // == geometry.dtype: stored as computed

  static constexpr std::size_t kScaleTrailerBytes = 2 * sizeof(float);

  static constexpr PageFormat as_computed(const Geometry& g) { return PageFormat{g, g.dtype}; }
  // fp8 e4m3 for a wider model dtype; as computed when the model's KV is already fp8.
  static constexpr PageFormat fp8(const Geometry& g) {
    return PageFormat{g, g.dtype == Dtype::kFP8E4M3 ? g.dtype : Dtype::kFP8E4M3};
  }

  constexpr bool encodes() const { return stored_dtype != geometry.dtype; }
  // K (or V) elements of one page.
  constexpr std::size_t half_elems() const {
    return static_cast<std::size_t>(geometry.page_tokens) * geometry.kv_heads * geometry.head_dim;
  }
  constexpr std::size_t page_bytes() const {
    return encodes() ? 2 * half_elems() * dtype_size(stored_dtype) + kScaleTrailerBytes
                     : geometry.page_bytes();
  }
  constexpr std::size_t block_bytes() const { return page_bytes() * geometry.layers; }
  // The geometry of the stored pages (the dtype replaced), as stores record it.
  constexpr Geometry stored_geometry() const {
    Geometry g = geometry;
    g.dtype = stored_dtype;
    return g;
  }

  friend constexpr bool operator==(const PageFormat&, const PageFormat&) = default;
};

}  // namespace kvtier

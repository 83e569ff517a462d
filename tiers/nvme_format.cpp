#include "tiers/nvme_format.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "tiers/checksum.hpp"

namespace kvtier {
namespace {

constexpr char kSuperMagic[8] = {'K', 'V', 'T', 'S', 'T', 'O', 'R', 'E'};
constexpr char kExtentMagic[8] = {'K', 'V', 'T', 'B', 'L', 'O', 'C', 'K'};
constexpr std::size_t kSuperChecksumAt = 104;
constexpr std::size_t kHeaderFixed = 64;

template <typename T>
void put(std::span<std::byte> out, std::size_t at, T v) {
  // Little-endian on every supported target (x86-64, aarch64); a big-endian port would swap here.
  static_assert(std::endian::native == std::endian::little);
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <typename T>
T get(std::span<const std::byte> in, std::size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

uint64_t geometry_fingerprint(const Geometry& g) {
  unsigned char buf[18 + 17] = "kvtier.geometry.v1";
  std::size_t at = 18;
  auto put32 = [&](uint32_t v) {
    std::memcpy(buf + at, &v, 4);
    at += 4;
  };
  put32(g.layers);
  put32(g.kv_heads);
  put32(g.head_dim);
  put32(g.page_tokens);
  buf[at++] = static_cast<unsigned char>(g.dtype);
  return xxh3_64(buf, at);
}

std::string describe_geometry(const Geometry& g) {
  return "{layers=" + std::to_string(g.layers) + ", kv_heads=" + std::to_string(g.kv_heads) +
         ", head_dim=" + std::to_string(g.head_dim) +
         ", dtype=" + std::string(dtype_name(g.dtype)) +
         ", page_tokens=" + std::to_string(g.page_tokens) + "}";
}

uint64_t store_fingerprint(const PageFormat& format) {
  const uint64_t base = geometry_fingerprint(format.stored_geometry());
  if (!format.encodes()) return base;
  unsigned char buf[32] = "kvtier.scaled_pages.v1";
  std::memcpy(buf + 24, &base, 8);
  return xxh3_64(buf, sizeof(buf));
}

std::string describe_page_format(const PageFormat& format) {
  std::string s = describe_geometry(format.stored_geometry());
  if (format.encodes()) {
    s +=
        " (quantized from " + std::string(dtype_name(format.geometry.dtype)) + ", per-page scales)";
  }
  return s;
}

Result<ExtentLayout> ExtentLayout::make(const PageFormat& format, uint32_t io_align) {
  const Geometry geometry = format.stored_geometry();
  if (io_align == 0 || (io_align & (io_align - 1)) != 0 || io_align > (1u << 20)) {
    return invalid_argument("I/O alignment " + std::to_string(io_align) +
                            " is not a power of two up to 1 MiB");
  }
  if (geometry.layers == 0 || format.page_bytes() == 0) {
    return invalid_argument("geometry " + describe_geometry(geometry) + " has no pages");
  }
  ExtentLayout l;
  l.io_align = io_align;
  l.layers = geometry.layers;
  l.page_bytes = format.page_bytes();
  const uint64_t stride = round_up(l.page_bytes, io_align);
  const uint64_t header =
      round_up(kHeaderFixed + 8ull * geometry.layers + 8, std::max(4096u, io_align));
  if (stride > UINT32_MAX / 2 || header > UINT32_MAX) {
    return invalid_argument("geometry " + describe_geometry(geometry) +
                            " has pages too large for one I/O");
  }
  l.page_stride = static_cast<uint32_t>(stride);
  l.header_bytes = static_cast<uint32_t>(header);
  l.extent_bytes = header + stride * geometry.layers;
  return l;
}

void encode_superblock(const Superblock& sb, std::span<std::byte> out) {
  std::memset(out.data(), 0, kSuperblockBytes);
  std::memcpy(out.data(), kSuperMagic, 8);
  put<uint32_t>(out, 8, sb.version);
  put<uint32_t>(out, 12, sb.file_index);
  put<uint32_t>(out, 16, sb.file_count);
  put<uint32_t>(out, 20, sb.layout.io_align);
  put<uint32_t>(out, 24, sb.layout.header_bytes);
  put<uint32_t>(out, 28, sb.layout.page_stride);
  put<uint64_t>(out, 32, sb.layout.page_bytes);
  put<uint64_t>(out, 40, sb.layout.extent_bytes);
  put<uint64_t>(out, 48, sb.extent_count);
  put<uint64_t>(out, 56, sb.first_offset);
  put<uint64_t>(out, 64, sb.store_id);
  put<uint64_t>(out, 72, sb.fingerprint);
  put<uint32_t>(out, 80, sb.geometry.layers);
  put<uint32_t>(out, 84, sb.geometry.kv_heads);
  put<uint32_t>(out, 88, sb.geometry.head_dim);
  put<uint32_t>(out, 92, sb.geometry.page_tokens);
  put<uint8_t>(out, 96, static_cast<uint8_t>(sb.geometry.dtype));
  put<uint64_t>(out, kSuperChecksumAt, xxh3_64(out.data(), kSuperChecksumAt));
}

bool blank_superblock(std::span<const std::byte> in) {
  return std::all_of(in.begin(), in.end(), [](std::byte b) { return b == std::byte{0}; });
}

Result<Superblock> decode_superblock(std::span<const std::byte> in, const std::string& path) {
  if (in.size() < kSuperblockBytes) return invalid_argument("superblock buffer too small");
  if (std::memcmp(in.data(), kSuperMagic, 8) != 0) {
    return not_found(path + " has no kvtier superblock");
  }
  if (get<uint64_t>(in, kSuperChecksumAt) != xxh3_64(in.data(), kSuperChecksumAt)) {
    return data_loss("superblock of " + path + " fails its checksum");
  }
  Superblock sb;
  sb.version = get<uint32_t>(in, 8);
  if (sb.version != kStoreFormatVersion) {
    return failed_precondition(path + " has store format version " + std::to_string(sb.version) +
                               "; this kvtier reads version " +
                               std::to_string(kStoreFormatVersion));
  }
  sb.file_index = get<uint32_t>(in, 12);
  sb.file_count = get<uint32_t>(in, 16);
  sb.layout.io_align = get<uint32_t>(in, 20);
  sb.layout.header_bytes = get<uint32_t>(in, 24);
  sb.layout.page_stride = get<uint32_t>(in, 28);
  sb.layout.page_bytes = get<uint64_t>(in, 32);
  sb.layout.extent_bytes = get<uint64_t>(in, 40);
  sb.extent_count = get<uint64_t>(in, 48);
  sb.first_offset = get<uint64_t>(in, 56);
  sb.store_id = get<uint64_t>(in, 64);
  sb.fingerprint = get<uint64_t>(in, 72);
  sb.geometry.layers = get<uint32_t>(in, 80);
  sb.geometry.kv_heads = get<uint32_t>(in, 84);
  sb.geometry.head_dim = get<uint32_t>(in, 88);
  sb.geometry.page_tokens = get<uint32_t>(in, 92);
  const auto dtype = get<uint8_t>(in, 96);
  if (dtype > static_cast<uint8_t>(Dtype::kFP8E4M3)) {
    return data_loss("superblock of " + path + " names an unknown dtype " + std::to_string(dtype));
  }
  sb.geometry.dtype = static_cast<Dtype>(dtype);
  sb.layout.layers = sb.geometry.layers;
  return sb;
}

void encode_extent_header(const ExtentHeader& h, std::span<std::byte> out) {
  const std::size_t sums_end = kHeaderFixed + 8 * std::size_t{h.layers};
  std::memset(out.data(), 0, out.size());
  std::memcpy(out.data(), kExtentMagic, 8);
  put<uint64_t>(out, 8, h.key.lo);
  put<uint64_t>(out, 16, h.key.hi);
  put<uint64_t>(out, 24, h.fingerprint);
  put<uint64_t>(out, 32, h.generation);
  put<uint64_t>(out, 40, h.store_id);
  put<uint32_t>(out, 48, h.layers);
  put<uint8_t>(out, 52, static_cast<uint8_t>(h.checksum_kind));
  put<uint32_t>(out, 56, h.page_bytes);
  for (uint32_t l = 0; l < h.layers; ++l) put<uint64_t>(out, kHeaderFixed + 8 * l, h.page_sums[l]);
  put<uint64_t>(out, sums_end, xxh3_64(out.data(), sums_end));
}

Result<ExtentHeader> decode_extent_header(std::span<const std::byte> in) {
  if (in.size() < kHeaderFixed + 8) return invalid_argument("extent header buffer too small");
  if (std::memcmp(in.data(), kExtentMagic, 8) != 0) return not_found("no extent header");
  ExtentHeader h;
  h.layers = get<uint32_t>(in, 48);
  const std::size_t sums_end = kHeaderFixed + 8 * std::size_t{h.layers};
  if (h.layers == 0 || sums_end + 8 > in.size()) {
    return data_loss("extent header claims " + std::to_string(h.layers) + " layers");
  }
  if (get<uint64_t>(in, sums_end) != xxh3_64(in.data(), sums_end)) {
    return data_loss("extent header fails its checksum");
  }
  h.key.lo = get<uint64_t>(in, 8);
  h.key.hi = get<uint64_t>(in, 16);
  h.fingerprint = get<uint64_t>(in, 24);
  h.generation = get<uint64_t>(in, 32);
  h.store_id = get<uint64_t>(in, 40);
  const auto kind = get<uint8_t>(in, 52);
  if (kind > static_cast<uint8_t>(ChecksumKind::kCrc32c)) {
    return data_loss("extent header names an unknown checksum kind " + std::to_string(kind));
  }
  h.checksum_kind = static_cast<ChecksumKind>(kind);
  h.page_bytes = get<uint32_t>(in, 56);
  h.page_sums.resize(h.layers);
  for (uint32_t l = 0; l < h.layers; ++l) h.page_sums[l] = get<uint64_t>(in, kHeaderFixed + 8 * l);
  return h;
}

}  // namespace kvtier

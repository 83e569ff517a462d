// On-disk format of the NVMe store: the superblock at the start of each file and the header at the
// start of each extent. Little-endian, fixed offsets, versioned; encode/decode are pure functions.
//
// File:    [superblock, first_offset bytes][extent 0][extent 1]...
// Extent:  [header, header_bytes][page of layer 0][page of layer 1]...[page of layer L-1]
//          each page at a `page_stride` (page_bytes rounded up to the I/O alignment) so a block is
//          one contiguous I/O and the page of one layer is an aligned sub-range.
//
// Superblock (offsets in bytes; checksum = XXH3-64 of bytes [0, 104)):
//    0 magic "KVTSTORE"   8 version u32   12 file_index u32   16 file_count u32   20 io_align u32
//   24 header_bytes u32  28 page_stride u32   32 page_bytes u64   40 extent_bytes u64
//   48 extent_count u64  56 first_offset u64  64 store_id u64     72 geometry fingerprint u64
//   80 layers u32  84 kv_heads u32  88 head_dim u32  92 page_tokens u32  96 dtype u8  104 checksum
//
// Extent header (checksum = XXH3-64 of bytes [0, 64 + 8 * layers)):
//    0 magic "KVTBLOCK"   8 key.lo u64   16 key.hi u64   24 geometry fingerprint u64
//   32 generation u64    40 store_id u64  48 layers u32   52 checksum kind u8   56 page_bytes u32
//   64 page checksums u64[layers] (XXH3-64 or CRC-32C of each page's page_bytes, seed 0)
//   64 + 8 * layers: header checksum u64
//
// The generation is a store-wide counter: when a crash leaves two extents with one key, the
// higher generation wins. The geometry fingerprint (XXH3-64 of "kvtier.geometry.v1" and the five
// geometry fields) makes a store of another geometry refuse to open and a foreign extent fail.
// Pages are in the store's PageFormat (kvtier/types.hpp): the superblock's geometry is the stored
// one (dtype fp8_e4m3 for pages quantized from a wider model dtype) and its page_bytes include
// the scale trailer; the fingerprint of such a format also covers the trailer, so a store of fp8
// pages with scales never opens as one of a natively fp8 model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

inline constexpr uint32_t kStoreFormatVersion = 1;
inline constexpr std::size_t kSuperblockBytes = 4096;

uint64_t geometry_fingerprint(const Geometry& geometry);
std::string describe_geometry(const Geometry& geometry);
// The fingerprint of a store of `format`: geometry_fingerprint of the stored geometry, mixed with
// the scale trailer when the pages are encoded.
uint64_t store_fingerprint(const PageFormat& format);
std::string describe_page_format(const PageFormat& format);

// Sizes derived from a geometry and the I/O alignment.
struct ExtentLayout {
  uint32_t io_align = 512;
  uint32_t header_bytes = 4096;
  uint32_t page_stride = 0;  // page_bytes rounded up to io_align
  uint64_t page_bytes = 0;
  uint32_t layers = 0;
  uint64_t extent_bytes = 0;  // header_bytes + layers * page_stride

  static Result<ExtentLayout> make(const PageFormat& format, uint32_t io_align);
  uint64_t page_offset(uint32_t layer) const {
    return header_bytes + uint64_t{layer} * page_stride;
  }
};

struct Superblock {
  uint32_t version = kStoreFormatVersion;
  uint32_t file_index = 0;
  uint32_t file_count = 1;
  ExtentLayout layout;
  uint64_t extent_count = 0;
  uint64_t first_offset = kSuperblockBytes;
  uint64_t store_id = 0;
  uint64_t fingerprint = 0;
  Geometry geometry;
};

// Writes the superblock into `out` (>= kSuperblockBytes, zero-filled beyond the fields).
void encode_superblock(const Superblock& sb, std::span<std::byte> out);
// kNotFound: no magic (a fresh or foreign file). kDataLoss: magic but a bad checksum.
// kFailedPrecondition: an unknown format version.
Result<Superblock> decode_superblock(std::span<const std::byte> in, const std::string& path);
// A superblock region that holds nothing: every byte zero (a new or discarded drive, a file just
// preallocated). Such a file may be formatted in place of a store's lost one.
bool blank_superblock(std::span<const std::byte> in);

struct ExtentHeader {
  BlockKey key;
  uint64_t fingerprint = 0;
  uint64_t generation = 0;
  uint64_t store_id = 0;
  uint32_t layers = 0;
  ChecksumKind checksum_kind = ChecksumKind::kXxh3;
  uint32_t page_bytes = 0;
  std::vector<uint64_t> page_sums;  // [layers]
};

// Writes the header into `out` (>= layout.header_bytes; bytes after the header are zeroed).
void encode_extent_header(const ExtentHeader& header, std::span<std::byte> out);
// kNotFound: no magic (never written). kDataLoss: torn or corrupt (bad checksum, impossible
// fields). Geometry/store checks are the caller's (it knows what to expect).
Result<ExtentHeader> decode_extent_header(std::span<const std::byte> in);

}  // namespace kvtier

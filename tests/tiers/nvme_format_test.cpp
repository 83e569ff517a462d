// On-disk format and checksums: encode/decode round trips, every corruption detected, and the
// CRC-32C hardware path equal to the portable one.
#include "tiers/nvme_format.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "tiers/checksum.hpp"

namespace kvtier {
namespace {

TEST(Checksum, Crc32cKnownVectorAndHardwareMatchesPortable) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(check, 9), 0xE3069283u);
  std::mt19937_64 rng(7);
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 4096u, 65537u}) {
    std::vector<unsigned char> buf(n);
    for (auto& b : buf) b = static_cast<unsigned char>(rng());
    EXPECT_EQ(crc32c(buf.data(), n), crc32c_portable(buf.data(), n)) << n;
  }
}

TEST(Checksum, KindsDiffer) {
  std::vector<unsigned char> buf(1000, 3);
  EXPECT_NE(checksum(ChecksumKind::kXxh3, buf.data(), buf.size()),
            checksum(ChecksumKind::kCrc32c, buf.data(), buf.size()));
  EXPECT_EQ(checksum(ChecksumKind::kCrc32c, buf.data(), buf.size()),
            uint64_t{crc32c(buf.data(), buf.size())});
}

Geometry geom() {
  Geometry g;
  g.layers = 32;
  g.kv_heads = 8;
  g.head_dim = 128;
  g.dtype = Dtype::kBF16;
  g.page_tokens = 16;
  return g;
}

TEST(NvmeFormat, LayoutOfTheDefaultGeometry) {
  auto l = ExtentLayout::make(PageFormat::as_computed(geom()), 512);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->page_stride, 65536u);
  EXPECT_EQ(l->header_bytes, 4096u);
  EXPECT_EQ(l->extent_bytes, 4096u + 32u * 65536u);
  EXPECT_EQ(l->page_offset(3), 4096u + 3u * 65536u);
  Geometry odd = geom();
  odd.head_dim = 100;  // 51200-byte pages
  auto m = ExtentLayout::make(PageFormat::as_computed(odd), 4096);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->page_stride, 53248u);
  EXPECT_EQ(ExtentLayout::make(PageFormat::as_computed(geom()), 1000).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(NvmeFormat, Fp8PagesCarryTheirScalesAndAFingerprintOfTheirOwn) {
  const PageFormat fp8 = PageFormat::fp8(geom());
  ASSERT_TRUE(fp8.encodes());
  auto l = ExtentLayout::make(fp8, 512);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->page_bytes, 32768u + 8u);  // fp8 K and V, then two f32 scales
  EXPECT_EQ(l->page_stride, 33280u);
  EXPECT_EQ(l->extent_bytes, 4096u + 32u * 33280u);
  // Not the store of a bf16 model, nor that of a model computing fp8 KV itself.
  Geometry native = geom();
  native.dtype = Dtype::kFP8E4M3;
  EXPECT_NE(store_fingerprint(fp8), store_fingerprint(PageFormat::as_computed(geom())));
  EXPECT_NE(store_fingerprint(fp8), store_fingerprint(PageFormat::as_computed(native)));
  EXPECT_EQ(store_fingerprint(PageFormat::as_computed(geom())), geometry_fingerprint(geom()));
  EXPECT_NE(describe_page_format(fp8).find("quantized from bf16"), std::string::npos);
}

TEST(NvmeFormat, FingerprintChangesWithEveryGeometryField) {
  const uint64_t base = geometry_fingerprint(geom());
  Geometry g = geom();
  g.layers = 31;
  EXPECT_NE(geometry_fingerprint(g), base);
  g = geom();
  g.kv_heads = 4;
  EXPECT_NE(geometry_fingerprint(g), base);
  g = geom();
  g.head_dim = 64;
  EXPECT_NE(geometry_fingerprint(g), base);
  g = geom();
  g.dtype = Dtype::kF16;  // same page bytes, other bytes
  EXPECT_NE(geometry_fingerprint(g), base);
  g = geom();
  g.page_tokens = 32;
  EXPECT_NE(geometry_fingerprint(g), base);
  EXPECT_EQ(geometry_fingerprint(geom()), base);
}

TEST(NvmeFormat, SuperblockRoundTripAndCorruption) {
  Superblock sb;
  sb.file_index = 1;
  sb.file_count = 2;
  sb.layout = *ExtentLayout::make(PageFormat::as_computed(geom()), 512);
  sb.extent_count = 77;
  sb.store_id = 0xABCDEF;
  sb.geometry = geom();
  sb.fingerprint = geometry_fingerprint(geom());
  std::vector<std::byte> buf(kSuperblockBytes);
  encode_superblock(sb, buf);
  auto d = decode_superblock(buf, "f");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->file_index, 1u);
  EXPECT_EQ(d->file_count, 2u);
  EXPECT_EQ(d->extent_count, 77u);
  EXPECT_EQ(d->store_id, 0xABCDEFu);
  EXPECT_EQ(d->geometry, geom());
  EXPECT_EQ(d->layout.extent_bytes, sb.layout.extent_bytes);
  buf[50] ^= std::byte{1};
  EXPECT_EQ(decode_superblock(buf, "f").status().code(), StatusCode::kDataLoss);
  std::vector<std::byte> zero(kSuperblockBytes);
  EXPECT_EQ(decode_superblock(zero, "f").status().code(), StatusCode::kNotFound);
}

// Only zeros are blank (a store's lost file may be formatted over them): not a superblock, and
// not one byte of anything else, anywhere in the region.
TEST(NvmeFormat, OnlyAllZerosIsABlankSuperblockRegion) {
  std::vector<std::byte> region(kSuperblockBytes);
  EXPECT_TRUE(blank_superblock(region));
  region.back() = std::byte{1};
  EXPECT_FALSE(blank_superblock(region));
  Superblock sb;
  sb.layout = *ExtentLayout::make(PageFormat::as_computed(geom()), 512);
  sb.geometry = geom();
  std::vector<std::byte> encoded(kSuperblockBytes);
  encode_superblock(sb, encoded);
  EXPECT_FALSE(blank_superblock(encoded));
}

TEST(NvmeFormat, ExtentHeaderRoundTripAndEveryByteProtected) {
  ExtentHeader h;
  h.key = BlockKey{0x1111, 0x2222};
  h.fingerprint = 5;
  h.generation = 9;
  h.store_id = 3;
  h.layers = 4;
  h.checksum_kind = ChecksumKind::kCrc32c;
  h.page_bytes = 8192;
  h.page_sums = {1, 2, 3, 4};
  std::vector<std::byte> buf(4096);
  encode_extent_header(h, buf);
  auto d = decode_extent_header(buf);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->key, h.key);
  EXPECT_EQ(d->generation, 9u);
  EXPECT_EQ(d->checksum_kind, ChecksumKind::kCrc32c);
  EXPECT_EQ(d->page_sums, h.page_sums);
  for (std::size_t i = 8; i < 64 + 8 * 4 + 8; ++i) {
    auto copy = buf;
    copy[i] ^= std::byte{0x10};
    EXPECT_EQ(decode_extent_header(copy).status().code(), StatusCode::kDataLoss) << "byte " << i;
  }
  std::vector<std::byte> zero(4096);
  EXPECT_EQ(decode_extent_header(zero).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtier

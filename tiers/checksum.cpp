#include "tiers/checksum.hpp"

#include <xxhash.h>

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvtier {
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPoly : 0u);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    }
  }
};
constexpr Crc32cTables kTables;

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t crc = 0xFFFFFFFFu;
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc = _mm_crc32_u64(crc, v);
    p += 8;
    size -= 8;
  }
  auto c = static_cast<uint32_t>(crc);
  while (size-- > 0) c = _mm_crc32_u8(c, *p++);
  return c ^ 0xFFFFFFFFu;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  while (size >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian: the running CRC folds into the first four bytes
    c = kTables.t[7][lo & 0xFF] ^ kTables.t[6][(lo >> 8) & 0xFF] ^ kTables.t[5][(lo >> 16) & 0xFF] ^
        kTables.t[4][lo >> 24] ^ kTables.t[3][hi & 0xFF] ^ kTables.t[2][(hi >> 8) & 0xFF] ^
        kTables.t[1][(hi >> 16) & 0xFF] ^ kTables.t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ kTables.t[0][(c ^ *p++) & 0xFFu];
  return c ^ 0xFFFFFFFFu;
}

uint32_t crc32c(const void* data, std::size_t size) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return crc32c_sse42(data, size);
#endif
  return crc32c_portable(data, size);
}

uint64_t xxh3_64(const void* data, std::size_t size) { return XXH3_64bits(data, size); }

uint64_t checksum(ChecksumKind kind, const void* data, std::size_t size) {
  switch (kind) {
    case ChecksumKind::kXxh3: return xxh3_64(data, size);
    case ChecksumKind::kCrc32c: return crc32c(data, size);
  }
  return xxh3_64(data, size);
}

}  // namespace kvtier

// AlignedBytes: an owned, zero-filled byte buffer at a given alignment, as O_DIRECT I/O needs.
//
// std::aligned_alloc with the size rounded up to the alignment; freed with std::free. A null
// result means the allocation failed, and the caller reports it (never aborts).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace kvtier {

struct AlignedFree {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte[], AlignedFree>;

inline AlignedBytes aligned_bytes(std::size_t align, std::size_t bytes) {
  const std::size_t size = (bytes + align - 1) / align * align;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, size));
  if (p != nullptr) std::memset(p, 0, size);
  return AlignedBytes(p);
}

}  // namespace kvtier

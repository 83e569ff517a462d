// Page checksums of the NVMe store: XXH3-64 (default) or CRC-32C.
//
// Both are computed over a page's payload bytes only (not the I/O padding after it), seed 0, and
// stored as 64-bit values (CRC-32C zero-extended), so the on-disk header has one layout for both.
// XXH3 comes from libxxhash; CRC-32C uses the SSE4.2 instruction when the CPU has it and a
// slicing-by-8 table otherwise (same result bit for bit; tests compare both). Pure functions, any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier/config.hpp"

namespace kvtier {

uint64_t checksum(ChecksumKind kind, const void* data, std::size_t size);

uint64_t xxh3_64(const void* data, std::size_t size);
uint32_t crc32c(const void* data, std::size_t size);
// The portable table-driven CRC-32C, exposed so tests can check the hardware path against it.
uint32_t crc32c_portable(const void* data, std::size_t size);

}  // namespace kvtier

// The fp8 page codec of the tiers below HBM: one page as computed (f32/f16/bf16) <-> one page in
// PageFormat's fp8 layout, [K e4m3][V e4m3][k_scale f32][v_scale f32].
//
// Shared by the two places that re-encode pages on the CPU: the ConvertingStore (host pages as
// computed, NVMe in fp8) and the host copy engine (emulated HBM, host tier in fp8). The GPU path
// runs the same arithmetic in kernels/cuda/page_codec.cu. Both calls run on the caller's thread
// with the best SIMD the CPU has; pages may be anywhere in host memory (no alignment needed).
#pragma once

#include <cstddef>
#include <string>

#include "kvtier/types.hpp"

namespace kvtier {

// Encodes the wide page at `wide` into `out` (format.page_bytes() bytes). False when the page
// holds NaN or inf, which e4m3 cannot keep; `out` then holds a NaN scale and zeros.
bool encode_page(const PageFormat& format, const std::byte* wide, std::byte* out);
// Decodes a page encoded by encode_page into `wide` (format.geometry.page_bytes() bytes).
void decode_page(const PageFormat& format, const std::byte* stored, std::byte* wide);
// True when the encoded page's trailer says it was refused (a NaN scale).
bool encoded_page_refused(const PageFormat& format, const std::byte* stored);

}  // namespace kvtier

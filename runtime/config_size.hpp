// Byte sizes as written in configuration: "512MiB", "64GiB", "1.5TB", "4096", "4096B".
//
// Grammar: DIGITS [ "." DIGITS ] [ UNIT ], nothing else — no sign, no space, no exponent. UNIT is
// one of B, KiB, MiB, GiB, TiB, PiB (powers of 1024) or KB, MB, GB, TB, PB (powers of 1000),
// spelled exactly so: "gb" or "Gib" is refused with a suggestion, because a wrong case is more
// often a bits/bytes mix-up than a typo worth guessing about. No unit means bytes. A fraction is
// allowed when the result is a whole number of bytes ("1.5KiB" = 1536; "0.3KiB" is refused), and
// the arithmetic is exact integer arithmetic, never floating point, so "1.5TB" is exactly 1.5e12.
// Rejected: exponents ("1e9B"): they read like a double and invite rounding; write "1GB".
// Pure functions, no state; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"

namespace kvtier {

// The bytes `text` denotes, or kInvalidArgument whose message says why, e.g.
// `"4 GB" is not a size: no space is allowed between number and unit (write 4GB)`.
Result<uint64_t> parse_size(std::string_view text);

// The shortest exact spelling that parse_size reads back: "64GiB", "1.5TB", "1536B", "0B".
std::string format_size(uint64_t bytes);

// A rounded, human form for summaries: "1.36 TiB", "64 KiB", "512 B".
std::string format_size_approx(uint64_t bytes);

}  // namespace kvtier

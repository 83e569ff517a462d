#include "runtime/config_size.hpp"

#include <array>
#include <cstdio>
#include <limits>

#include "runtime/config_suggest.hpp"

namespace kvtier {
namespace {

struct Unit {
  std::string_view name;
  uint64_t bytes;
};

constexpr uint64_t kKi = 1024;
constexpr uint64_t kK = 1000;

// Matched against the whole suffix after the number, so no unit shadows another.
constexpr std::array<Unit, 11> kUnits = {{
    {"B", 1},
    {"KiB", kKi},
    {"MiB", kKi* kKi},
    {"GiB", kKi* kKi* kKi},
    {"TiB", kKi* kKi* kKi* kKi},
    {"PiB", kKi* kKi* kKi* kKi* kKi},
    {"KB", kK},
    {"MB", kK* kK},
    {"GB", kK* kK* kK},
    {"TB", kK* kK* kK* kK},
    {"PB", kK* kK* kK* kK* kK},
}};

// 10^19 is the largest power of ten below 2^64.
constexpr int kMaxFractionDigits = 19;

// GCC and Clang both have it; -Wpedantic is told so once, here.
__extension__ using u128 = unsigned __int128;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string quoted(std::string_view text) {
  std::string out = "\"";
  out += text;
  out += '"';
  return out;
}

Status not_a_size(std::string_view text, std::string_view why) {
  return invalid_argument(quoted(text) + " is not a size: " + std::string(why));
}

std::string unit_list() {
  std::string out;
  for (const Unit& u : kUnits) {
    if (!out.empty()) out += ", ";
    out += u.name;
  }
  return out;
}

uint64_t gcd(uint64_t a, uint64_t b) {
  while (b != 0) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

}  // namespace

Result<uint64_t> parse_size(std::string_view text) {
  if (text.empty()) return not_a_size(text, "empty; write e.g. 512MiB, 64GiB or 1.5TB");
  if (text.front() == '-') return not_a_size(text, "sizes cannot be negative");
  if (text.front() == '+') return not_a_size(text, "write the number without a sign");

  std::size_t i = 0;
  while (i < text.size() && is_digit(text[i])) ++i;
  const std::string_view int_digits = text.substr(0, i);
  if (int_digits.empty()) {
    return not_a_size(text, "it must start with a number, e.g. 512MiB, 64GiB or 1.5TB");
  }
  std::string_view frac_digits;
  if (i < text.size() && text[i] == '.') {
    const std::size_t start = ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
    frac_digits = text.substr(start, i - start);
    if (frac_digits.empty()) return not_a_size(text, "a decimal point must be followed by digits");
  }
  const std::string_view unit_text = text.substr(i);
  if (!unit_text.empty() && (unit_text.front() == ' ' || unit_text.front() == '\t')) {
    std::string compact(text.substr(0, i));
    std::size_t u = 0;
    while (u < unit_text.size() && (unit_text[u] == ' ' || unit_text[u] == '\t')) ++u;
    compact += unit_text.substr(u);
    return not_a_size(text, "no space is allowed between number and unit (write " + compact + ")");
  }
  if (!unit_text.empty() && (unit_text.front() == 'e' || unit_text.front() == 'E') &&
      unit_text.size() > 1 &&
      (is_digit(unit_text[1]) || unit_text[1] == '-' || unit_text[1] == '+')) {
    return not_a_size(text, "exponents are not accepted; write the unit instead (e.g. 1GB)");
  }

  uint64_t multiplier = 0;
  if (unit_text.empty()) {
    multiplier = 1;
  } else {
    for (const Unit& u : kUnits) {
      if (u.name == unit_text) multiplier = u.bytes;
    }
    if (multiplier == 0) {
      std::array<std::string_view, kUnits.size()> names{};
      for (std::size_t k = 0; k < kUnits.size(); ++k) names[k] = kUnits[k].name;
      std::string why = "unknown unit " + quoted(unit_text);
      // Case mistakes ("gib", "Gb") are the common error; say which spelling is meant.
      for (const Unit& u : kUnits) {
        if (equal_ignoring_case(u.name, unit_text)) {
          why += " (units are case-sensitive; did you mean " + std::string(u.name) + "?)";
          return not_a_size(text, why + "; valid units: " + unit_list());
        }
      }
      if (auto near = closest_match(unit_text, names)) {
        why += " (did you mean " + std::string(*near) + "?)";
      }
      return not_a_size(text, why + "; valid units: " + unit_list());
    }
  }

  constexpr u128 kMax64 = std::numeric_limits<uint64_t>::max();

  // Trailing zeros of the fraction change nothing; dropping them keeps "1.50000GiB" exact.
  while (!frac_digits.empty() && frac_digits.back() == '0') frac_digits.remove_suffix(1);
  if (frac_digits.size() > static_cast<std::size_t>(kMaxFractionDigits)) {
    return not_a_size(text, "more than 19 decimal places");
  }

  u128 integer = 0;
  for (char c : int_digits) {
    integer = integer * 10 + static_cast<unsigned>(c - '0');
    if (integer > kMax64) return not_a_size(text, "larger than 2^64-1 bytes");
  }
  u128 pow10 = 1;
  u128 fraction = 0;
  for (char c : frac_digits) {
    pow10 *= 10;
    fraction = fraction * 10 + static_cast<unsigned>(c - '0');
  }
  // value = (integer * 10^f + fraction) * multiplier / 10^f, evaluated without overflow: reduce
  // multiplier / 10^f first; the result is whole exactly when the reduced denominator divides the
  // numerator, since the reduced pair is coprime.
  const u128 numerator = integer * pow10 + fraction;  // < 2^64 * 10^19 < 2^128
  const uint64_t p = static_cast<uint64_t>(pow10);    // 10^f <= 10^19 fits
  const uint64_t g = gcd(multiplier, p);
  const uint64_t mult = multiplier / g;
  const uint64_t den = p / g;
  if (numerator % den != 0) {
    return not_a_size(text, "not a whole number of bytes");
  }
  const u128 q = numerator / den;
  if (q > kMax64 || (mult != 0 && q > kMax64 / mult)) {
    return not_a_size(text, "larger than 2^64-1 bytes");
  }
  return static_cast<uint64_t>(q * mult);
}

std::string format_size(uint64_t bytes) {
  if (bytes == 0) return "0B";
  // Among the exact spellings with at most 3 decimals, the shortest; on a tie the binary unit, as
  // capacities are mostly powers of two.
  std::string best = std::to_string(bytes) + "B";
  for (const Unit& u : kUnits) {
    if (u.bytes == 1) continue;
    for (uint64_t scale : {uint64_t{1}, uint64_t{10}, uint64_t{100}, uint64_t{1000}}) {
      const u128 scaled = static_cast<u128>(bytes) * scale;
      if (scaled % u.bytes != 0) continue;
      const uint64_t whole_scaled = static_cast<uint64_t>(scaled / u.bytes);
      std::string digits = std::to_string(whole_scaled / scale);
      if (scale > 1) {
        std::string frac = std::to_string(whole_scaled % scale);
        const std::size_t width = scale == 10 ? 1 : scale == 100 ? 2 : 3;
        frac.insert(0, width - frac.size(), '0');
        digits += "." + frac;
      }
      std::string candidate = digits + std::string(u.name);
      if (candidate.size() < best.size()) best = candidate;
      break;
    }
  }
  return best;
}

std::string format_size_approx(uint64_t bytes) {
  static constexpr std::array<std::string_view, 6> kNames = {"B",   "KiB", "MiB",
                                                             "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buf[48];
  if (unit == 0 || value == static_cast<double>(static_cast<uint64_t>(value))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, std::string(kNames[unit]).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%.3g %s", value, std::string(kNames[unit]).c_str());
  }
  return buf;
}

}  // namespace kvtier

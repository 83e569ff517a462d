// The YAML spellings of the configuration's enums, one table per enum.
//
// The loader parses with these tables, describe_config and error messages print with them, and the
// README lists the same words, so a value has exactly one spelling everywhere. Tables are constexpr
// data; nothing here allocates or locks.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

#include "kvtier/config.hpp"
#include "kvtier/types.hpp"

namespace kvtier {

template <typename E>
struct EnumSpelling {
  std::string_view name;
  E value;
};

inline constexpr std::array<EnumSpelling<Dtype>, 4> kDtypeSpellings = {{
    {dtype_name(Dtype::kF32), Dtype::kF32},
    {dtype_name(Dtype::kF16), Dtype::kF16},
    {dtype_name(Dtype::kBF16), Dtype::kBF16},
    {dtype_name(Dtype::kFP8E4M3), Dtype::kFP8E4M3},
}};
inline constexpr std::array<EnumSpelling<HbmBackend>, 3> kHbmBackendSpellings = {{
    {"auto", HbmBackend::kAuto},
    {"cuda", HbmBackend::kCuda},
    {"emulated", HbmBackend::kEmulated},
}};
inline constexpr std::array<EnumSpelling<ChecksumKind>, 2> kChecksumSpellings = {{
    {"xxh3", ChecksumKind::kXxh3},
    {"crc32c", ChecksumKind::kCrc32c},
}};
inline constexpr std::array<EnumSpelling<TierKvDtype>, 2> kTierKvDtypeSpellings = {{
    {"model", TierKvDtype::kModel},
    {dtype_name(Dtype::kFP8E4M3), TierKvDtype::kFp8E4M3},
}};
inline constexpr std::array<EnumSpelling<EvictionPolicy>, 5> kEvictionSpellings = {{
    {"lru", EvictionPolicy::kLru},
    {"lfu", EvictionPolicy::kLfu},
    {"s3fifo", EvictionPolicy::kS3Fifo},
    {"prefix_aware", EvictionPolicy::kPrefixAware},
    {"lookahead", EvictionPolicy::kLookahead},
}};
inline constexpr std::array<EnumSpelling<WritePolicy>, 3> kWritePolicySpellings = {{
    {"write_through", WritePolicy::kWriteThrough},
    {"write_back", WritePolicy::kWriteBack},
    {"write_through_selective", WritePolicy::kWriteThroughSelective},
}};
inline constexpr std::array<EnumSpelling<LatePolicy>, 2> kLatePolicySpellings = {{
    {"stall", LatePolicy::kStall},
    {"recompute", LatePolicy::kRecompute},
}};

template <typename E>
constexpr std::span<const EnumSpelling<E>> enum_spellings() {
  if constexpr (std::is_same_v<E, Dtype>) return kDtypeSpellings;
  if constexpr (std::is_same_v<E, HbmBackend>) return kHbmBackendSpellings;
  if constexpr (std::is_same_v<E, ChecksumKind>) return kChecksumSpellings;
  if constexpr (std::is_same_v<E, TierKvDtype>) return kTierKvDtypeSpellings;
  if constexpr (std::is_same_v<E, EvictionPolicy>) return kEvictionSpellings;
  if constexpr (std::is_same_v<E, WritePolicy>) return kWritePolicySpellings;
  if constexpr (std::is_same_v<E, LatePolicy>) return kLatePolicySpellings;
}

// The YAML word for `value` ("write_back"); "unknown" for a value outside the enum.
template <typename E>
constexpr std::string_view enum_name(E value) {
  for (const auto& s : enum_spellings<E>()) {
    if (s.value == value) return s.name;
  }
  return "unknown";
}

// Exact, case-sensitive match, as YAML is.
template <typename E>
constexpr std::optional<E> parse_enum(std::string_view name) {
  for (const auto& s : enum_spellings<E>()) {
    if (s.name == name) return s.value;
  }
  return std::nullopt;
}

}  // namespace kvtier

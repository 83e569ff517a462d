// "Did you mean" for configuration errors: the closest of a set of valid words to a misspelt one.
//
// Distance is optimal-string-alignment (Levenshtein plus adjacent transpositions, so "capcaity"
// is one edit from "capacity"), compared case-insensitively. A suggestion is made only when the
// distance is small next to the word's length — a far-off guess misleads more than it helps.
// Pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

std::size_t edit_distance(std::string_view a, std::string_view b);

bool equal_ignoring_case(std::string_view a, std::string_view b);

// The candidate nearest `word`, when one is near enough; ties go to the earlier candidate.
std::optional<std::string_view> closest_match(std::string_view word,
                                              std::span<const std::string_view> candidates);

// "a, b, c" — for the "valid keys/values here" part of a message.
std::string join_words(std::span<const std::string_view> words);

}  // namespace kvtier

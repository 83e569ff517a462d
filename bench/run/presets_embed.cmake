# Writes OUTPUT, a C++ source defining kvtier::bench::run::embedded_preset(name) and
# embedded_preset_names() over the bytes of every file in INPUTS (a ;-list of configs/bench/*.yaml,
# passed as a |-list because the list crosses the command line). Run at build time
# (cmake -DINPUTS=... -DOUTPUT=... -P this file), so editing a preset is editing the program.
# Bytes, not raw string literals: any text embeds.
string(REPLACE "|" ";" inputs "${INPUTS}")
set(arrays "")
set(entries "")
set(index 0)
foreach(input IN LISTS inputs)
  get_filename_component(name "${input}" NAME_WE)
  # NAME_WE stops at the first dot ("llama-3" of "llama-3.1-8b.yaml"): strip only ".yaml".
  get_filename_component(file "${input}" NAME)
  string(REGEX REPLACE "\\.yaml$" "" name "${file}")
  file(READ "${input}" hex HEX)
  string(LENGTH "${hex}" hex_length)
  math(EXPR byte_count "${hex_length} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  set(b "0x[0-9a-f][0-9a-f],")
  string(REGEX REPLACE "(${b}${b}${b}${b}${b}${b}${b}${b}${b}${b}${b}${b})" "\\1\n    " bytes
         "${bytes}")
  string(APPEND arrays "const unsigned char kPreset${index}[] = {\n    ${bytes}0};\n")
  string(APPEND entries "    {\"${name}\", {reinterpret_cast<const char*>(kPreset${index}), ${byte_count}}},\n")
  math(EXPR index "${index} + 1")
endforeach()
file(WRITE "${OUTPUT}.tmp"
"// Generated from configs/bench/*.yaml by bench/run/presets_embed.cmake. Do not edit.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include \"bench/run/presets.hpp\"

namespace kvtier::bench::run {
namespace {
${arrays}
const std::pair<std::string_view, std::string_view> kPresets[] = {
${entries}};
}  // namespace

std::string_view embedded_preset(std::string_view name) {
  for (const auto& [n, text] : kPresets) {
    if (n == name) return text;
  }
  return {};
}

std::vector<std::string> embedded_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.first);
  return out;
}

}  // namespace kvtier::bench::run
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")

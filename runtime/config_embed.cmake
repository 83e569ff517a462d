# Writes OUTPUT, a C++ source defining kvtier::embedded_default_config() as the bytes of INPUT
# (configs/default.yaml). Run at build time (cmake -DINPUT=... -DOUTPUT=... -P this file), so
# editing the YAML file is editing the default. Bytes, not a raw string literal: any text embeds.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR byte_count "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# Twelve bytes per line (CMake regexes have no {n}).
set(b "0x[0-9a-f][0-9a-f],")
string(REGEX REPLACE "(${b}${b}${b}${b}${b}${b}${b}${b}${b}${b}${b}${b})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
"// Generated from configs/default.yaml by runtime/config_embed.cmake. Do not edit.
#include <string_view>

#include \"runtime/config_loader.hpp\"

namespace kvtier {
namespace {
// One trailing 0 keeps the array non-empty when the file is.
const unsigned char kDefaultConfig[] = {
    ${bytes}0};
}  // namespace

std::string_view embedded_default_config() {
  return {reinterpret_cast<const char*>(kDefaultConfig), ${byte_count}};
}

}  // namespace kvtier
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")

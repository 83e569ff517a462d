// A Config from YAML text plus "key.path=value" overrides: what kvt_runtime_open_yaml and the
// Python module's Runtime.open_yaml take. The text is the loader's file layer
// (ConfigSources::text), so the same rules and messages apply, its locations named "<yaml text>"
// ("<yaml text>:3:5: tiers.host.capcity: unknown key"). Stateless and thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier {

inline constexpr std::string_view kYamlTextName = "<yaml text>";

Result<Config> load_yaml_text(std::string_view text, std::vector<std::string> overrides,
                              bool use_environment);

}  // namespace kvtier

// A Config from YAML text plus "key.path=value" overrides: what kvt_runtime_open_yaml and the
// Python module's Runtime.open_yaml take, where runtime/config_loader.hpp reads its layers from a
// file. The text joins the loader's layers exactly as a file would (same rules, same messages),
// named "<yaml text>" in error locations ("<yaml text>:3:5: tiers.host.capcity: unknown key").
//
// The text goes through an anonymous in-memory file (memfd) handed to load_config, so there is one
// loader and one set of rules. Rejected: a second code path through parse_config (it takes no
// overrides and no environment). Stateless and thread-safe.
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

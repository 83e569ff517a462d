// The configuration's keys: one table row per YAML leaf key, with its type and how it is read.
//
// This table is the single list of keys. The loader walks YAML maps against it (a path that is a
// prefix of some row is a section and must be a map; any other unknown word is an error with a
// "did you mean" among the words valid at that level); `--set` and environment overrides resolve
// their paths through it; tests check that configs/default.yaml and the README name every row.
// Adding a key = a field in include/kvtier/config.hpp, a row here, a line in default.yaml and one
// in the README's reference.
//
// Value readers are strict, as a serving config should be: integers are plain decimal (a quoted
// "32" is a string, not a number), booleans are true/false (YAML 1.2; YAML 1.1's yes/no/on/off are
// refused because they surprise), numbers are finite. Their errors describe the value only; the
// loader adds file:line:col and the key path. Immutable after static initialisation; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace YAML {
class Node;
}

namespace kvtier {

struct ConfigKey {
  std::string_view path;  // "tiers.hbm.capacity"
  std::string_view type;  // how the value is written, for messages and the reference: "size", ...
  // Reads `value` into this key's field of `config`; on error the field is unchanged.
  Status (*apply)(Config& config, const YAML::Node& value);
};

// Every leaf key, in the order of configs/default.yaml.
std::span<const ConfigKey> config_keys();

const ConfigKey* find_config_key(std::string_view path);

// True for "" (the root) and every proper prefix of a key path at a dot: "tiers", "tiers.hbm", ...
bool is_config_section(std::string_view path);

// The words valid directly under a section, in table order: config_children("tiers.hbm") =
// capacity, backend, device, watermarks, link_gbps.
std::vector<std::string_view> config_children(std::string_view section);

// Nvme paths hold "${KVTIER_CACHE_DIR}", expanded to `cache_dir`; any other "${" is an error, so a
// misspelt variable is caught instead of creating a directory named after it.
Result<std::string> expand_cache_dir(std::string_view path, std::string_view cache_dir);

}  // namespace kvtier

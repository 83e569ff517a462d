// Loading a Config from YAML: the embedded default, a file, the environment and `--set` overrides.
//
// Layers, each overriding the one before (a layer names only the keys it changes):
//   1. the embedded default: the text of configs/default.yaml, compiled into the library;
//   2. one file: `ConfigSources::file` (--config PATH), else $KVTIER_CONFIG_FILE when set;
//   3. the environment: every variable KVTIER_<SECTION>__<KEY>[__<KEY>...]=value sets the key
//      path spelled by its name in lower case (KVTIER_TIERS__HOST__CAPACITY=8GiB sets
//      tiers.host.capacity); after KVTIER_ the name is A-Z, 0-9 and _ only, so a key has one
//      spelling, and two variables that set the same path, or a section and a key inside it, are
//      an error naming both, so their order never matters; variables without "__"
//      (KVTIER_CONFIG_FILE, KVTIER_CACHE_DIR, KVTIER_LOG_LEVEL) are not keys;
//   4. overrides: "key.path=value" (--set), in order, the last one winning.
// Override and environment values are read as YAML, as if written after "key: " in a file
// (`--set tiers.nvme.paths=[/a.kvs,/b.kvs]`, `--set tiers.hbm.watermarks={low: 0.5, high: 0.7}`),
// and are one YAML document, as a file is.
//
// Everywhere, a key is one non-empty word ("tiers.hbm.capacity:" as a YAML key is refused: it
// would be a second spelling of the nested key, beyond duplicate detection), and explicit YAML
// tags (!!str, !!int, !mine) are refused on keys and values alike. The file must be a regular
// file (a FIFO would block, a device need not end).
// Then "${KVTIER_CACHE_DIR}" in tiers.nvme.paths is replaced by $KVTIER_CACHE_DIR, or "./.kvtier"
// when unset, and the result is validated (runtime/config_validate.hpp).
//
// Errors are kInvalidArgument (kNotFound / kIoError for a file that cannot be read) and name where:
//   configs/x.yaml:12:5: tiers.host.capacity: "4 GB" is not a size: ...   (1-based line:col)
//   --set tiers.host.capacity=abc: tiers.host.capacity: "abc" is not a size: ...
//   environment KVTIER_TIERS__HOST__CAPACITY=abc: tiers.host.capacity: ...
// A rule that fails after loading points at the layer that last set one of the keys involved.
// Nothing throws: yaml-cpp's exceptions are caught here. Stateless; safe from any thread, except
// that reading the process environment races with a concurrent setenv, as getenv does.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier {

struct ConfigSources {
  std::optional<std::string> file;  // --config PATH; beats $KVTIER_CONFIG_FILE
  // YAML given as text (the C ABI, Python), in the file's place; named `text_name` in messages.
  std::optional<std::string> text;
  std::string text_name = "<yaml text>";
  std::vector<std::string> overrides;  // --set key.path=value, in order
  bool use_environment = true;         // KVTIER_CONFIG_FILE, KVTIER_CACHE_DIR, KVTIER_<A>__<B>
  // The environment to read instead of the process's (tests, embedders); used when
  // use_environment is true.
  std::optional<std::map<std::string, std::string>> environment;
};

// The name the embedded default goes by in messages.
inline constexpr std::string_view kEmbeddedConfigName = "configs/default.yaml (embedded)";
// Where "${KVTIER_CACHE_DIR}" points when the variable is unset or empty.
inline constexpr std::string_view kDefaultCacheDir = "./.kvtier";
// Larger inputs are refused before parsing; a configuration is a few kilobytes.
inline constexpr std::size_t kMaxConfigBytes = 1 << 20;

Result<Config> load_config(const ConfigSources& sources);

// `yaml_text` over the embedded default, with "${KVTIER_CACHE_DIR}" read as "./.kvtier" and no
// environment; validated. `source_name` prefixes error locations ("configs/x.yaml:3:5: ...").
Result<Config> parse_config(std::string_view yaml_text, std::string_view source_name);

// The text of configs/default.yaml, as compiled in.
std::string_view embedded_default_config();

}  // namespace kvtier

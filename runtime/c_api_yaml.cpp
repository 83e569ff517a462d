// YAML text + overrides -> Config through the one loader. See runtime/c_api_yaml.hpp.
#include "runtime/c_api_yaml.hpp"

#include "runtime/config_loader.hpp"

namespace kvtier {

Result<Config> load_yaml_text(std::string_view text, std::vector<std::string> overrides,
                              bool use_environment) {
  ConfigSources sources;
  sources.text = std::string(text);
  sources.text_name = std::string(kYamlTextName);
  sources.overrides = std::move(overrides);
  sources.use_environment = use_environment;
  return load_config(sources);
}

}  // namespace kvtier

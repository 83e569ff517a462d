// Fuzz target: arbitrary bytes as a configuration file. parse_config must return a Config or a
// Status for every input — never crash, hang, throw or leak (ASan/UBSan in the fuzz preset). When
// it accepts an input, the result must pass validation on its own: the loader may not hand out a
// Config that validate_config would refuse.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "runtime/config_loader.hpp"
#include "runtime/config_validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = kvtier::parse_config(text, "fuzz.yaml");
  if (config.ok()) {
    kvtier::Status valid = kvtier::validate_config(*config);
    if (!valid.ok()) {
      std::fprintf(stderr, "parse_config accepted a config that fails validation: %s\n",
                   valid.to_string().c_str());
      std::abort();
    }
  } else if (config.status().message().empty()) {
    std::fprintf(stderr, "an error without a message\n");
    std::abort();
  }
  return 0;
}

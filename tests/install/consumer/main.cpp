// Links against the installed package and uses the public API only.
#include <cstdio>
#include <kvtier/block_key.hpp>
#include <kvtier/status.hpp>
#include <kvtier/version.hpp>
#include <vector>

int main() {
  std::vector<uint32_t> tokens(64, 7);
  const auto keys = kvtier::chain_block_keys("consumer", tokens, 16);
  if (keys.size() != 4 || keys[0] == keys[1]) return 1;
  std::printf("kvtier %s: %zu block keys, first %s\n", std::string(kvtier::version()).c_str(),
              keys.size(), kvtier::to_string(keys[0]).c_str());
  return kvtier::version() == "" ? 1 : 0;
}

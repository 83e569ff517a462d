/* Links against the installed libkvtier.so (through CMake or pkg-config); uses the C ABI only. */
#include <kvtier/kvtier.h>
#include <stdio.h>

int main(void) {
  uint32_t tokens[64];
  for (int i = 0; i < 64; ++i) tokens[i] = 7;
  kvt_block_key keys[4];
  size_t n_keys = 0;
  if (kvt_chain_block_keys("consumer", tokens, 64, 16, keys, 4, &n_keys) != KVT_OK || n_keys != 4 ||
      (keys[0].lo == keys[1].lo && keys[0].hi == keys[1].hi)) {
    fprintf(stderr, "kvt_chain_block_keys: %s\n", kvt_last_error());
    return 1;
  }
  kvt_runtime_params params;
  kvt_runtime_default_params(&params);
  if (params.struct_size != sizeof params) {
    fprintf(stderr, "kvt_runtime_default_params: struct_size %u\n", params.struct_size);
    return 1;
  }
  char text[33];
  if (kvt_block_key_format(&keys[0], text, sizeof text) != KVT_OK) return 1;
  printf("kvtier %s (C): %zu block keys, first %s\n", kvt_version(), n_keys, text);
  return 0;
}

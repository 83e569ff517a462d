// What the page-table micro-benchmarks (page_table_bench, step_bench) share to set up their
// tables: a failed setup step ends the program naming what failed (a benchmark of a half-built
// table would measure nothing meaningful), chains of block keys, and blocks made resident in HBM.
#pragma once

#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kvtier/block_key.hpp"
#include "kvtier/status.hpp"
#include "scheduler/page_table.hpp"

namespace kvtier::bench_setup {

[[noreturn]] inline void die(const Status& s, const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, s.to_string().c_str());
  std::exit(1);
}
inline void must(const Status& s, const char* what) {
  if (!s.ok()) die(s, what);
}

// The keys of `blocks` full 16-token blocks chained from the namespace `ns` (distinct namespaces
// give distinct chains).
inline std::vector<BlockKey> make_chain(std::string_view ns, uint32_t blocks) {
  std::vector<BlockKey> keys;
  keys.reserve(blocks);
  BlockKey parent = namespace_root(ns);
  uint32_t tokens[16];
  for (uint32_t b = 0; b < blocks; ++b) {
    for (uint32_t t = 0; t < 16; ++t) tokens[t] = b * 16 + t;
    parent = chain_block_key(parent, tokens);
    keys.push_back(parent);
  }
  return keys;
}

// Every layer of the block filled and ready in HBM.
inline Status fill_hbm(PageTable& pt, const BlockKey& k) {
  return pt.update(k, [](EntryView& v) -> Status {
    for (uint32_t l = 0; l < v.layers(); ++l) {
      KVTIER_RETURN_IF_ERROR(v.begin_fill(CopyId::hbm(l)).status());
      KVTIER_RETURN_IF_ERROR(v.complete_fill(CopyId::hbm(l)));
    }
    return ok_status();
  });
}

}  // namespace kvtier::bench_setup

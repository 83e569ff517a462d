// Shared helpers of the trace-replay tests: a tiny hand-made trace (and its workload), one
// replay run with the given tiers, and a scratch directory for trace files.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

#include "bench/replay/replay.hpp"
#include "bench/replay/trace.hpp"
#include "bench/replay/workload.hpp"
#include "scheduler/policies/evictor.hpp"

namespace kvtier::replay {

// Four requests, a blank line and an unknown field: hash ids 1 and 2 reused, 3, 4 and 5 used once.
inline constexpr const char* kTiny =
    "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 10, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 100, \"input_length\": 1500, \"output_length\": 10, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 200, \"input_length\": 300, \"output_length\": 5, \"hash_ids\": [4]}\n"
    "\n"
    "{\"timestamp\": 300, \"input_length\": 1000, \"output_length\": 7, \"hash_ids\": [1, 5],"
    " \"extra\": {\"note\": \"ignored\", \"list\": [1, 2.5, true, null]}}\n";

inline ReplayWorkload tiny_workload(uint32_t block_tokens = 512) {
  auto trace = parse_trace(kTiny, "tiny");
  EXPECT_TRUE(trace.ok()) << trace.status().message();
  auto w = build_workload(*trace, block_tokens);
  EXPECT_TRUE(w.ok());
  return std::move(*w);
}

// One replay of `w` with `blocks` blocks per tier; fails the test when the run fails.
inline RunResult run(const ReplayWorkload& w, RunKind kind, EvictionPolicy p,
                     std::array<uint64_t, kNumTiers> blocks, RunOptions options = {}) {
  RunSpec spec;
  spec.kind = kind;
  spec.eviction = p;
  spec.capacity_blocks = blocks;
  auto r = run_replay(w, spec, options);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : RunResult{};
}

// A scratch directory, removed with what it holds.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvtier_replay_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Writes `text` to the file `name` in the directory; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

}  // namespace kvtier::replay

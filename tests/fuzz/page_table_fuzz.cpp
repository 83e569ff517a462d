// Fuzz target: the input bytes are a page-table operation sequence (decoded exactly as in
// tests/scheduler/page_table_model.hpp), applied to the real table and to the std::map model. After
// every operation the status codes and returned values must agree and a snapshot of the table must
// equal the model; at the end audit() must pass. Any divergence aborts with a description.
//
// Byte 0 picks the table's shape (layers, shards, how scarce each tier is), so the fuzzer explores
// exhaustion and sharding as well as operation order.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "tests/scheduler/page_table_model.hpp"

namespace {

constexpr int kMaxOps = 1500;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "page table diverged from the model: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::pt_test;
  if (size < 1) return 0;
  ByteSource src(std::span<const uint8_t>(data, size));
  const uint8_t shape = src.next();
  const uint32_t layers = 1 + shape % 4;
  const uint32_t shards = 1u << ((shape >> 2) % 4);
  const bool scarce = (shape & 0x10) != 0;
  const uint32_t hbm = scarce ? 2 + layers : 64;
  const uint32_t host = scarce ? 3 + layers : 64;
  const uint32_t nvme = (shape & 0x20) ? 1 : 8;
  auto h = Harness::create(layers, shards, hbm, host, nvme);
  if (!h.ok()) fail("cannot create the harness: " + h.status().to_string());
  Harness& harness = **h;
  Op op;
  for (int n = 0; n < kMaxOps && decode_op(src, layers, op); ++n) {
    harness.steer(op, src);
    std::string err = harness.apply(op);
    if (err.empty()) err = harness.compare_all();
    if (!err.empty()) fail(err);
  }
  Status audit = harness.table().audit();
  if (!audit.ok()) fail("audit: " + audit.to_string());
  return 0;
}

// FaultTest: an NVMe store over the fault-injecting I/O backend, with helpers that write and
// read back one block by id and check its bytes. Shared by the store's fault tests
// (fault_injection_test.cpp, nvme_hung_drive_test.cpp, nvme_readmit_test.cpp,
// nvme_replace_test.cpp). TearDown audits the store's accounting. FourDrivesTest spreads the store
// over four drives and takes one out.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/tiers/tier_test_support.hpp"
#include "tiers/fault_injection.hpp"
#include "tiers/nvme_store.hpp"

namespace kvtier {

using testing::AlignedPages;
using testing::eventually;
using testing::test_key;

inline const Geometry kGeom = testing::small_geometry(Dtype::kF32, 4, 8, 2, 64);  // 8 KiB pages

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    faults_ = std::make_shared<FaultInjectingIoBackend>();
    store_ = open();
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    if (store_) {
      Status a = store_->audit();
      EXPECT_TRUE(a.ok()) << a.to_string();
      EXPECT_EQ(store_->used_blocks(), store_->keys().size());
    }
  }

  NvmeStoreOptions options() {
    NvmeStoreOptions o;
    o.config.paths = {dir_.file("store0.kvs")};
    o.config.queue_depth = 4;
    o.config.capacity_bytes = 8 * (kGeom.block_bytes() + 4096);
    o.backend = faults_;
    return o;
  }
  std::unique_ptr<NvmeStore> open() { return open_with(options()); }
  std::unique_ptr<NvmeStore> open_with(const NvmeStoreOptions& o) {
    auto s = NvmeStore::create(kGeom, o);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  Status write(uint64_t id, uint64_t seed) {
    auto p = std::make_unique<AlignedPages>(kGeom.layers, store_->page_io_bytes());
    p->fill(seed, kGeom.page_bytes());
    KVTIER_ASSIGN_OR_RETURN(Transfer t, store_->write_block(test_key(id), p->const_pages()));
    Status s = t.wait();
    // A write abandoned at its timeout may still be read by the drive once it answers (see
    // nvme_store.hpp): its pages live as long as the test.
    if (s.code() == StatusCode::kDeadlineExceeded) abandoned_pages_.push_back(std::move(p));
    return s;
  }
  Status read(uint64_t id, uint64_t seed) {
    AlignedPages p(kGeom.layers, store_->page_io_bytes());
    p.scribble();
    KVTIER_ASSIGN_OR_RETURN(Transfer t, store_->read_block(test_key(id), p.pages()));
    KVTIER_RETURN_IF_ERROR(t.wait());
    if (!p.matches(seed, kGeom.page_bytes())) return internal_error("served wrong data");
    return Status();
  }
  const LinkStats& link(Link l) { return store_->stats().link(l); }

  // `o` spread over one file per name (a drive each), `extents` extents apiece.
  void spread_over(NvmeStoreOptions& o, const std::vector<std::string>& names, uint64_t extents) {
    o.config.paths.clear();
    for (const std::string& name : names) o.config.paths.push_back(dir_.file(name));
    o.config.capacity_bytes = names.size() * extents * (kGeom.block_bytes() + 4096);
  }
  // Whether block `id` lies in the file whose path ends with `name`.
  bool lies_on(uint64_t id, const std::string& name) const {
    auto place = store_->locate(test_key(id));
    return place.ok() && place->path.ends_with(name);
  }

  testing::TempDir dir_;
  std::shared_ptr<FaultInjectingIoBackend> faults_;
  // Declared before store_, so they outlive it (closing the store waits for the drive's answers).
  std::vector<std::unique_ptr<AlignedPages>> abandoned_pages_;
  std::unique_ptr<NvmeStore> store_;
};

inline constexpr uint32_t kReadmitAfterMs = 50;

// Four drives, one of which goes out: the readmission and replacement tests.
class FourDrivesTest : public FaultTest {
 protected:
  // Four drives of 32 extents, d0.kvs .. d3.kvs, probed 50 ms after one goes out.
  NvmeStoreOptions four_drives() {
    NvmeStoreOptions o = options();
    spread_over(o, {"d0.kvs", "d1.kvs", "d2.kvs", "d3.kvs"}, 32);
    o.config.readmit_after_ms = kReadmitAfterMs;
    o.config.io_timeout_ms = 200;
    return o;
  }
  // Four drives of 32 extents; 72 blocks fill d0 and d1 and 8 extents of d2, which then dies
  // (`hang`: stops answering) and is taken out by the writes that follow. Returns the blocks it
  // held.
  std::vector<BlockKey> take_out_d2(bool hang) {
    reopen(four_drives());
    std::vector<BlockKey> lost;
    if (store_ == nullptr) return lost;
    for (uint64_t id = 0; id < 72; ++id) {
      EXPECT_TRUE(write(id, id).ok());
      if (lies_on(id, "d2.kvs")) lost.push_back(test_key(id));
    }
    if (hang) {
      faults_->hang_file("d2.kvs");
    } else {
      faults_->fail_file("d2.kvs");
    }
    for (uint64_t id = 100; id < 130 && store_->stats().files_out_of_service.load() == 0; ++id) {
      write(id, id).ignore();
    }
    EXPECT_EQ(store_->stats().files_out_of_service.load(), 1u);
    EXPECT_EQ(store_->capacity_blocks(), 96u + (hang ? 1u : 0u));  // hung: one extent still held
    return lost;
  }
  // Closes the store and opens it again with `o`.
  void reopen(const NvmeStoreOptions& o) {
    store_.reset();
    store_ = open_with(o);
  }
  // Writes and erases block `id` until `done` (a probe is posted only when a write is), or 10 s.
  template <typename F>
  bool writing_until(uint64_t id, F done) {
    return eventually([&] {
      if (write(id, id).ok()) store_->erase(test_key(id)).ignore();
      return done();
    });
  }
  uint64_t probes() const { return store_->stats().nvme_probes.load(); }
  uint64_t readmitted() const { return store_->stats().files_readmitted.load(); }
  uint64_t out() const { return store_->stats().files_out_of_service.load(); }
};

}  // namespace kvtier

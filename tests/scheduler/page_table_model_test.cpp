// Randomized operation sequences applied to the page table and to a std::map model
// (page_table_model.hpp), compared after every operation and in full every few dozen.
#include "tests/scheduler/page_table_model.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace kvtier {
namespace {

using pt_test::ByteSource;
using pt_test::decode_op;
using pt_test::Harness;
using pt_test::Op;
using pt_test::OpKind;

struct Shape {
  uint32_t layers;
  uint32_t shards;
  uint32_t hbm, host, nvme;
};

class PageTableModelTest : public ::testing::TestWithParam<uint64_t> {};

void run_sequence(uint64_t seed, const Shape& shape, int steps) {
  auto h = Harness::create(shape.layers, shape.shards, shape.hbm, shape.host, shape.nvme);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ByteSource src(seed);
  std::array<int, pt_test::kOpKinds> seen{};
  for (int step = 0; step < steps; ++step) {
    Op op;
    ASSERT_TRUE(decode_op(src, shape.layers, op));
    (*h)->steer(op, src);
    ++seen[static_cast<int>(op.kind)];
    const std::string err = (*h)->apply(op);
    ASSERT_TRUE(err.empty()) << "seed " << seed << ": " << err;
    if (step % 64 == 63) {
      const std::string diff = (*h)->compare_all();
      ASSERT_TRUE(diff.empty()) << "seed " << seed << " step " << step << ": " << diff;
    }
  }
  const std::string diff = (*h)->compare_all();
  ASSERT_TRUE(diff.empty()) << "seed " << seed << ": " << diff;
  Status audit = (*h)->table().audit();
  ASSERT_TRUE(audit.ok()) << audit.to_string();
  // The sequence exercised every kind of operation, and the table was not trivially empty.
  for (int k = 0; k < pt_test::kOpKinds; ++k) {
    EXPECT_GT(seen[k], 0) << pt_test::op_kind_name(OpKind(k));
  }
  // Block pins were taken, split and released, and hint marks set and taken, not only refused.
  for (OpKind k : {OpKind::kPinBlock, OpKind::kUnpinBlock, OpKind::kSplitBlockPin,
                   OpKind::kMarkHinted, OpKind::kAcquireForReuse}) {
    EXPECT_GT((*h)->ops_accepted(k), 0u) << pt_test::op_kind_name(k);
  }
  // A sequence where the table refuses nearly everything would test little.
  EXPECT_GT((*h)->ops_accepted() * 5, (*h)->ops_applied() * 2)
      << (*h)->ops_accepted() << " of " << (*h)->ops_applied() << " operations accepted";
  std::printf("seed %llu: %llu of %llu operations accepted, %zu blocks at the end\n",
              static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>((*h)->ops_accepted()),
              static_cast<unsigned long long>((*h)->ops_applied()), (*h)->model().blocks.size());
}

TEST_P(PageTableModelTest, SmallTableWithScarceFrames) {
  run_sequence(GetParam(), Shape{3, 4, 10, 14, 4}, 20000);
}

TEST_P(PageTableModelTest, OneShardManyLayers) {
  run_sequence(GetParam() * 7919 + 1, Shape{9, 1, 40, 40, 6}, 12000);
}

TEST_P(PageTableModelTest, ManyShardsRoomyTiers) {
  run_sequence(GetParam() * 104729 + 3, Shape{2, 64, 64, 64, 32}, 12000);
}

INSTANTIATE_TEST_SUITE_P(Seeds, PageTableModelTest, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

// The model itself must be able to tell a wrong table from a right one: a harness whose table was
// changed behind the model's back reports the difference.
TEST(PageTableModel, DetectsADivergence) {
  auto h = Harness::create(2, 2, 8, 8, 2);
  ASSERT_TRUE(h.ok());
  Op create;
  create.kind = OpKind::kCreate;
  create.key = 0;
  create.other = pt_test::kPoolKeys;
  ASSERT_EQ((*h)->apply(create), "");
  ASSERT_EQ((*h)->compare_all(), "");
  ASSERT_TRUE((*h)->table().acquire(pt_test::pool_key(0)).ok());  // not told to the model
  EXPECT_NE((*h)->compare_all(), "");
  Op release;
  release.kind = OpKind::kRelease;
  release.key = 0;
  // The model holds no reference and expects an error; the table releases the hidden one.
  EXPECT_NE((*h)->apply(release), "");
}

}  // namespace
}  // namespace kvtier

#include "kvtier/status.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace kvtier {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}

Result<int> doubled(int v) {
  KVTIER_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b) {
  KVTIER_RETURN_IF_ERROR(parse_positive(a).status());
  KVTIER_RETURN_IF_ERROR(parse_positive(b).status());
  return ok_status();
}

TEST(Status, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.to_string(), "ok");
  Status err = io_error("open /x: No such file or directory (errno 2)");
  EXPECT_FALSE(err.ok());
  EXPECT_EQ(err.code(), StatusCode::kIoError);
  EXPECT_EQ(err.to_string(), "io_error: open /x: No such file or directory (errno 2)");
}

TEST(Status, WithContextKeepsCode) {
  Status s = not_found("key 12").with_context("tier nvme");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "tier nvme: key 12");
  EXPECT_TRUE(ok_status().with_context("anything").ok());
}

TEST(Result, ValueAndPropagation) {
  auto good = doubled(21);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 42);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "value -1 is not positive");
  EXPECT_EQ(bad.value_or(7), 7);
}

TEST(Result, ReturnIfError) {
  EXPECT_TRUE(check_both(1, 2).ok());
  Status s = check_both(1, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> r{Status()};
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(Result, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 5);
}

TEST(Status, CodeNamesAreStable) {
  EXPECT_EQ(status_code_name(StatusCode::kDataLoss), "data_loss");
  EXPECT_EQ(status_code_name(StatusCode::kFailedPrecondition), "failed_precondition");
}

}  // namespace
}  // namespace kvtier

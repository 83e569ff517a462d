// KVTIER_ASSERT_OK(expr): a gtest assertion that a Status expression is OK, printing the Status
// when it is not (the Status is checked either way, so it never aborts as unchecked).
#pragma once

#include <gtest/gtest.h>

#include "kvtier/status.hpp"

#define KVTIER_ASSERT_OK(expr)                \
  do {                                        \
    const ::kvtier::Status st_ = (expr);      \
    ASSERT_TRUE(st_.ok()) << st_.to_string(); \
  } while (false)

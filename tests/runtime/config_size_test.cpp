#include "runtime/config_size.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace kvtier {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;
constexpr uint64_t kTiB = kGiB * 1024;

struct Good {
  const char* text;
  uint64_t bytes;
};

TEST(ParseSize, AcceptsTheDocumentedForms) {
  const Good table[] = {
      {"0", 0},
      {"4096", 4096},
      {"4096B", 4096},
      {"1KiB", kKiB},
      {"512MiB", 512 * kMiB},
      {"64GiB", 64 * kGiB},
      {"2TiB", 2 * kTiB},
      {"1PiB", 1024 * kTiB},
      {"1KB", 1000},
      {"250MB", 250'000'000},
      {"7GB", 7'000'000'000},
      {"1.5TB", 1'500'000'000'000},
      {"1PB", 1'000'000'000'000'000},
      {"1.5KiB", 1536},
      {"0.5GiB", 512 * kMiB},
      {"1.25MiB", 1310720},
      {"1.50000000GiB", 1536 * kMiB},  // trailing zeros change nothing
      {"007GiB", 7 * kGiB},
      {"3.5TB", 3'500'000'000'000},
      {"18446744073709551615", UINT64_MAX},
      {"18446744073709551615B", UINT64_MAX},
      {"0.0009765625KiB", 1},  // 10 decimals, still exact
  };
  for (const Good& g : table) {
    auto r = parse_size(g.text);
    ASSERT_TRUE(r.ok()) << g.text << ": " << r.status().to_string();
    EXPECT_EQ(*r, g.bytes) << g.text;
  }
}

struct Bad {
  const char* text;
  const char* why;  // a fragment the message must contain
};

TEST(ParseSize, RefusesWithAReason) {
  const Bad table[] = {
      {"", "empty"},
      {"GiB", "must start with a number"},
      {"-1GiB", "cannot be negative"},
      {"+1GiB", "without a sign"},
      {"4 GB", "no space is allowed between number and unit (write 4GB)"},
      {"4\tGiB", "no space"},
      {"1e9", "exponents are not accepted"},
      {"1e9B", "exponents are not accepted"},
      {"4gb", "units are case-sensitive; did you mean GB?"},
      {"4Gib", "did you mean GiB?"},
      {"4GIB", "did you mean GiB?"},
      {"4Gb", "did you mean GB?"},
      {"4GiBs", "unknown unit \"GiBs\""},
      {"4xyz", "unknown unit"},
      {"1.", "followed by digits"},
      {".5GiB", "must start with a number"},
      {"1.3B", "not a whole number of bytes"},
      {"0.3KiB", "not a whole number of bytes"},
      {"1.5", "not a whole number of bytes"},
      {"18446744073709551616", "larger than 2^64-1"},
      {"16384PiB", "larger than 2^64-1"},
      {"18446744073709551.616KB", "larger than 2^64-1"},
      {"99999999999999999999999GiB", "larger than 2^64-1"},
      {"1.00000000000000000001GiB", "more than 19 decimal places"},
      {"1GiB ", "unknown unit"},
      {"1,5GiB", "unknown unit"},
  };
  for (const Bad& b : table) {
    auto r = parse_size(b.text);
    ASSERT_FALSE(r.ok()) << b.text << " parsed as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind("\"" + std::string(b.text) + "\" is not a size: ", 0), 0u) << m;
    EXPECT_NE(m.find(b.why), std::string::npos) << b.text << " -> " << m;
  }
}

TEST(FormatSize, ShortestExactSpellingThatParsesBack) {
  EXPECT_EQ(format_size(0), "0B");
  EXPECT_EQ(format_size(4096), "4KiB");
  EXPECT_EQ(format_size(64 * kGiB), "64GiB");
  EXPECT_EQ(format_size(1'500'000'000'000), "1.5TB");
  EXPECT_EQ(format_size(1536), "1536B");
  EXPECT_EQ(format_size(1000), "1KB");
  EXPECT_EQ(format_size(1537), "1537B");
  EXPECT_EQ(format_size(512 * kMiB), "512MiB");
  for (uint64_t v :
       {uint64_t{1}, uint64_t{999}, uint64_t{1} << 20, uint64_t{3} << 40, uint64_t{123456789},
        uint64_t{5} * 1000 * 1000 * 1000 * 1000, UINT64_MAX, uint64_t{15} << 60}) {
    auto back = parse_size(format_size(v));
    ASSERT_TRUE(back.ok()) << format_size(v);
    EXPECT_EQ(*back, v) << format_size(v);
  }
}

TEST(FormatSize, ApproximateFormIsRoundedForHumans) {
  EXPECT_EQ(format_size_approx(512), "512 B");
  EXPECT_EQ(format_size_approx(64 * kKiB), "64 KiB");
  EXPECT_EQ(format_size_approx(1'500'000'000'000), "1.36 TiB");
  EXPECT_EQ(format_size_approx(5 * kMiB + 4 * kKiB), "5 MiB");
}

}  // namespace
}  // namespace kvtier

// Helpers shared by the configuration tests: temporary files and error extraction.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"

namespace kvtier::testing {

// The repository root (ctest sets KVTIER_SOURCE_DIR; a direct run from the build tree falls back
// to the compile-time path).
inline std::filesystem::path source_dir() {
  if (const char* env = std::getenv("KVTIER_SOURCE_DIR"); env != nullptr && *env) return env;
  return KVTIER_TEST_SOURCE_DIR;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << p;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / "kvtier_config_XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  std::string write(const std::string& name, std::string_view text) const {
    const std::filesystem::path p = path_ / name;
    std::ofstream out(p, std::ios::binary);
    out << text;
    EXPECT_TRUE(out.good()) << "cannot write " << p;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

// The error message of a Result that must have failed ("" and a test failure if it did not).
template <typename T>
std::string error_of(const Result<T>& r) {
  EXPECT_FALSE(r.ok()) << "expected an error";
  return r.ok() ? std::string() : r.status().message();
}

}  // namespace kvtier::testing

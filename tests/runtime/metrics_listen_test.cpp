// metrics.listen parsing and resolution, and the errno a busy port reports.
#include "runtime/metrics_listen.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/runtime/metrics_test_util.hpp"

namespace kvtier {
namespace {

using ::testing::HasSubstr;

TEST(MetricsListen, ParsesHostAndPort) {
  auto a = parse_listen_address("127.0.0.1:9464");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9464);
  auto b = parse_listen_address("[::1]:0");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  auto c = parse_listen_address("localhost:65535");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->port, 65535);
}

TEST(MetricsListen, RejectsMalformedAddressesNamingThem) {
  for (const char* bad : {"", "9464", ":9464", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:9464s",
                          "127.0.0.1:1,127.0.0.1:2", "::1:9464", "[::1]9464", "host:123456"}) {
    auto r = parse_listen_address(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
  }
}

TEST(MetricsListen, ResolvesLiteralsAndLocalhostToNumericServerSpecs) {
  auto v4 = resolve_listen_address({"127.0.0.1", 9464});
  ASSERT_TRUE(v4.ok()) << v4.status().to_string();
  EXPECT_EQ(v4->server_spec, "127.0.0.1:9464");
  auto v6 = resolve_listen_address({"::1", 80});
  ASSERT_TRUE(v6.ok()) << v6.status().to_string();
  EXPECT_EQ(v6->server_spec, "[::1]:80");
  auto local = resolve_listen_address({"localhost", 1234});
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  EXPECT_THAT(local->server_spec, ::testing::AnyOf("127.0.0.1:1234", "[::1]:1234"));
}

TEST(MetricsListen, RejectsWhatIsNotAnAddress) {
  // 999 is not an octet; the HTTP server would bind something else if handed this literally.
  auto r = resolve_listen_address({"999.1.1.1", 80});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("999.1.1.1"));
}

TEST(MetricsListen, BindErrorNamesTheErrnoOfABusyPort) {
  testing::ListeningSocket busy;
  ASSERT_NE(busy.port(), 0);
  auto r = resolve_listen_address({"127.0.0.1", busy.port()});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(bind_error(*r), HasSubstr("errno " + std::to_string(EADDRINUSE)));
  auto free_port = resolve_listen_address({"127.0.0.1", 0});
  ASSERT_TRUE(free_port.ok());
  EXPECT_EQ(bind_error(*free_port), "");
}

}  // namespace
}  // namespace kvtier

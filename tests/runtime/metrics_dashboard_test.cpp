// configs/grafana/kvtier.json and configs/prometheus.yml: the dashboard is valid JSON with the
// $datasource and $instance variables, every query filters by $instance and names only families the
// exporter serves, the required panels are there, and promtool accepts the Prometheus config.
// (metrics_prometheus_test runs every dashboard query against a real Prometheus.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "runtime/metrics_exporter.hpp"
#include "tests/runtime/config_test_util.hpp"
#include "tests/runtime/metrics_test_util.hpp"

namespace kvtier {
namespace {

using ::kvtier::testing::Json;
using ::testing::Contains;
using ::testing::HasSubstr;

Json load_dashboard() {
  const std::string text =
      testing::read_text(testing::source_dir() / "configs/grafana/kvtier.json");
  std::string error;
  std::optional<Json> j = testing::JsonReader::parse(text, &error);
  EXPECT_TRUE(j.has_value()) << "configs/grafana/kvtier.json: " << error;
  return j.value_or(Json{});
}

struct Query {
  std::string panel;
  std::string expr;
};

std::vector<const Json*> graph_panels(const Json& dashboard) {
  std::vector<const Json*> out;
  const Json* panels = dashboard.get("panels");
  if (panels == nullptr) return out;
  for (const Json& p : panels->array) {
    if (p.str("type") != "row") out.push_back(&p);
  }
  return out;
}

std::vector<Query> dashboard_queries(const Json& dashboard) {
  std::vector<Query> out;
  for (const Json* p : graph_panels(dashboard)) {
    const Json* targets = p->get("targets");
    if (targets == nullptr) continue;
    for (const Json& t : targets->array) out.push_back({p->str("title"), t.str("expr")});
  }
  return out;
}

// Every family an exporter with all sources serves.
std::set<std::string> exported_families() {
  SchedulerStats scheduler;
  TransferStats transfer;
  MetricsSources s;
  s.scheduler = &scheduler;
  s.transfer = &transfer;
  for (auto& probe : s.occupancy) probe = [] { return TierOccupancy{1, 2}; };
  auto e = MetricsExporter::create(MetricsConfig{"", MetricsConfig{}.latency_buckets}, s);
  EXPECT_TRUE(e.ok());
  if (!e.ok()) return {};
  const std::vector<std::string> names = testing::family_names((*e)->scrape_text());
  return {names.begin(), names.end()};
}

TEST(MetricsDashboard, HasDatasourceAndInstanceVariables) {
  const Json d = load_dashboard();
  const Json* templating = d.get("templating");
  ASSERT_NE(templating, nullptr);
  const Json* list = templating->get("list");
  ASSERT_NE(list, nullptr);
  const Json* datasource = nullptr;
  const Json* instance = nullptr;
  for (const Json& v : list->array) {
    if (v.str("name") == "datasource") datasource = &v;
    if (v.str("name") == "instance") instance = &v;
  }
  ASSERT_NE(datasource, nullptr);
  EXPECT_EQ(datasource->str("type"), "datasource");
  EXPECT_EQ(datasource->str("query"), "prometheus");
  ASSERT_NE(instance, nullptr);
  EXPECT_EQ(instance->str("type"), "query");
  ASSERT_NE(instance->get("datasource"), nullptr);
  EXPECT_EQ(instance->get("datasource")->str("uid"), "${datasource}");
  EXPECT_THAT(instance->str("definition"), HasSubstr("kvtier_build_info"));
  // "All" must become a regex matching every instance, since queries use instance=~"$instance".
  EXPECT_EQ(instance->str("allValue"), ".*");
}

TEST(MetricsDashboard, EveryPanelUsesTheDatasourceVariableAndUniqueIds) {
  const Json d = load_dashboard();
  std::set<double> ids;
  const Json* panels = d.get("panels");
  ASSERT_NE(panels, nullptr);
  for (const Json& p : panels->array) {
    ASSERT_NE(p.get("id"), nullptr) << p.str("title");
    EXPECT_TRUE(ids.insert(p.get("id")->number).second) << "duplicate id in " << p.str("title");
    ASSERT_NE(p.get("gridPos"), nullptr) << p.str("title");
  }
  const std::vector<const Json*> graphs = graph_panels(d);
  ASSERT_FALSE(graphs.empty());
  for (const Json* p : graphs) {
    ASSERT_NE(p->get("datasource"), nullptr) << p->str("title");
    EXPECT_EQ(p->get("datasource")->str("uid"), "${datasource}") << p->str("title");
    ASSERT_NE(p->get("targets"), nullptr) << p->str("title");
    EXPECT_FALSE(p->get("targets")->array.empty()) << p->str("title");
  }
}

TEST(MetricsDashboard, QueriesFilterByInstanceAndNameOnlyExportedFamilies) {
  const std::set<std::string> families = exported_families();
  ASSERT_FALSE(families.empty());
  const std::regex metric(R"(kvtier_[a-z_]+)");
  const std::vector<Query> queries = dashboard_queries(load_dashboard());
  ASSERT_FALSE(queries.empty());
  for (const Query& q : queries) {
    EXPECT_THAT(q.expr, HasSubstr("instance=~\"$instance\"")) << q.panel;
    for (auto it = std::sregex_iterator(q.expr.begin(), q.expr.end(), metric);
         it != std::sregex_iterator(); ++it) {
      std::string name = it->str();
      for (const char* suffix : {"_bucket", "_count", "_sum"}) {
        const std::string base = name.substr(0, name.size() - std::strlen(suffix));
        if (name.ends_with(suffix) && families.count(base)) name = base;
      }
      EXPECT_THAT(families, Contains(name)) << q.panel << ": " << q.expr;
    }
  }
}

TEST(MetricsDashboard, HasTheRequiredPanels) {
  const std::vector<Query> queries = dashboard_queries(load_dashboard());
  auto any = [&](const std::string& needle) {
    for (const Query& q : queries) {
      if (q.expr.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  // Per-tier hit rate from counters, occupancy, bandwidth per link, p50/p99, stall, evictions,
  // the share of hinted loads reused.
  EXPECT_TRUE(any("sum by (tier) (rate(kvtier_hit_tokens_total"));
  EXPECT_TRUE(any("rate(kvtier_lookup_tokens_total"));
  EXPECT_TRUE(any("kvtier_tier_used_bytes"));
  EXPECT_TRUE(any("kvtier_tier_capacity_bytes"));
  EXPECT_TRUE(any("sum by (src, dst) (rate(kvtier_transfer_bytes_total"));
  EXPECT_TRUE(any("histogram_quantile(0.5, "));
  EXPECT_TRUE(any("histogram_quantile(0.99, "));
  EXPECT_TRUE(any("kvtier_stall_seconds_total"));
  EXPECT_TRUE(any("kvtier_evictions_total"));
  EXPECT_TRUE(any("sum by (tier) (rate(kvtier_hinted_loads_reused_total"));
}

TEST(MetricsDashboard, PromtoolAcceptsThePrometheusConfig) {
  const std::string promtool = testing::find_executable("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not found (Debian package prometheus)";
  testing::TempDir dir;
  const std::string log = (dir.path() / "promtool.log").string();
  testing::ChildProcess check(
      {promtool, "check", "config", (testing::source_dir() / "configs/prometheus.yml").string()},
      log);
  ASSERT_TRUE(check.started());
  EXPECT_EQ(check.wait_exit(std::chrono::seconds(60)), 0) << testing::read_text(log);
  // The default listen address is what it scrapes.
  EXPECT_THAT(testing::read_text(testing::source_dir() / "configs/prometheus.yml"),
              HasSubstr("\"" + MetricsConfig{}.listen + "\""));
}

}  // namespace
}  // namespace kvtier

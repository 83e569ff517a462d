// Workloads: keys made from segments share exactly the blocks their prompts share; generators are
// deterministic for a seed and have the shapes they promise; traces load with their arrivals.
#include "bench/run/workload.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvtier::bench::run {
namespace {

constexpr uint32_t kPage = 256;

std::size_t common_prefix(const std::vector<BlockKey>& a, const std::vector<BlockKey>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

TEST(SegmentStream, SharedSegmentsShareWholeBlocksOnly) {
  SegmentStream a("t", kPage);
  SegmentStream b("t", kPage);
  a.append(1, 1000);  // blocks 0..2 wholly inside segment 1, block 3 straddles
  b.append(1, 1000);
  SegmentStream a2 = a;
  a.append(2, 500);
  b.append(3, 500);
  EXPECT_EQ(a.tokens(), 1500u);
  ASSERT_EQ(a.keys().size(), 5u);
  EXPECT_EQ(common_prefix(a.keys(), b.keys()), 3u);
  // The same segments appended in pieces give the same keys.
  a2.append(2, 200);
  a2.append(2, 300);
  EXPECT_NE(a2.keys(), a.keys()) << "offsets within a segment restart per append";
  SegmentStream c("t", kPage);
  c.append(1, 1000);
  c.append(2, 500);
  EXPECT_EQ(c.keys(), a.keys());
  // Another namespace shares nothing.
  SegmentStream d("other", kPage);
  d.append(1, 1000);
  EXPECT_EQ(common_prefix(d.keys(), b.keys()), 0u);
}

TEST(Workloads, ChatTurnsExtendThePreviousTurnAndItsAnswer) {
  // One user: every request is the next turn of the same conversation.
  auto w = generate_workload("chat", {{"users", "1"}, {"turns", "8"}}, 5, kPage);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_GE(w->requests.size(), 2u) << "seed 5 should give a conversation of several turns";
  for (std::size_t i = 1; i < w->requests.size(); ++i) {
    const Request& prev = w->requests[i - 1];
    const Request& next = w->requests[i];
    EXPECT_GT(next.input_tokens, prev.input_tokens + prev.output_tokens);
    // Every full block of the previous prompt and answer is a prefix of the next prompt.
    EXPECT_EQ(common_prefix(prev.keys, next.keys), prev.keys.size()) << "turn " << i;
  }
  for (const Request& r : w->requests) {
    EXPECT_EQ(r.keys.size(), (r.input_tokens + r.output_tokens) / kPage);
    EXPECT_EQ(r.prompt_blocks(kPage), r.input_tokens / kPage);
  }
}

TEST(Workloads, AgentStepsAppendActionAndObservation) {
  auto w = generate_workload("agent", {{"agents", "1"}, {"steps", "6"}}, 2, kPage);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_GE(w->requests.size(), 2u);
  for (std::size_t i = 1; i < w->requests.size(); ++i) {
    EXPECT_EQ(common_prefix(w->requests[i - 1].keys, w->requests[i].keys),
              w->requests[i - 1].keys.size());
  }
  // Two agents share the system prompt and tools (12000 tokens: 46 whole blocks).
  auto two = generate_workload("agent", {{"agents", "2"}, {"steps", "1"}}, 2, kPage);
  ASSERT_TRUE(two.ok());
  ASSERT_GE(two->requests.size(), 2u);
  EXPECT_EQ(common_prefix(two->requests[0].keys, two->requests.back().keys), 12000u / kPage);
}

TEST(Workloads, DeterministicForASeed) {
  for (const char* name : {"mix", "chat", "agent", "docs", "long_context"}) {
    WorkloadParams p;
    if (std::string(name) == "long_context") p = {{"context", "5000"}};
    if (std::string(name) == "docs") p = {{"questions", "40"}, {"documents", "5"}};
    if (std::string(name) == "mix") {
      p = {{"chat.users", "5"},
           {"agent.agents", "3"},
           {"docs.questions", "10"},
           {"docs.documents", "3"}};
    }
    auto a = generate_workload(name, p, 11, kPage);
    auto b = generate_workload(name, p, 11, kPage);
    auto c = generate_workload(name, p, 12, kPage);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << name;
    ASSERT_EQ(a->requests.size(), b->requests.size()) << name;
    bool differs = a->requests.size() != c->requests.size();
    for (std::size_t i = 0; i < a->requests.size(); ++i) {
      EXPECT_EQ(a->requests[i].arrival, b->requests[i].arrival) << name;
      EXPECT_EQ(a->requests[i].keys, b->requests[i].keys) << name;
      EXPECT_EQ(a->requests[i].output_tokens, b->requests[i].output_tokens) << name;
      if (i > 0) {
        EXPECT_LE(a->requests[i - 1].arrival, a->requests[i].arrival) << name;
      }
      if (!differs && i < c->requests.size()) {
        differs = a->requests[i].arrival != c->requests[i].arrival ||
                  a->requests[i].input_tokens != c->requests[i].input_tokens;
      }
    }
    if (std::string(name) != "long_context") {
      EXPECT_TRUE(differs) << name << ": seed ignored";
    }
  }
}

TEST(Workloads, DocsShareTheirDocumentAndLongContextAsksForSmallHbm) {
  auto w = generate_workload(
      "docs", {{"documents", "1"}, {"questions", "4"}, {"doc_tokens", "5000"}}, 1, kPage);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->requests.size(), 4u);
  const std::size_t doc_blocks = w->requests[0].input_tokens / kPage;
  EXPECT_GE(common_prefix(w->requests[0].keys, w->requests[3].keys) + 1, doc_blocks);
  auto l = generate_workload("long_context", {{"context", "100000"}, {"questions", "3"}}, 1, kPage);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->requests.size(), 3u);
  EXPECT_EQ(l->requests[0].input_tokens, 100100u);
  EXPECT_DOUBLE_EQ(l->hbm_kv_fraction, 0.2);
  EXPECT_EQ(l->kinds, std::vector<std::string>{"long_context"});
}

TEST(Workloads, ParametersAreChecked) {
  auto unknown = generate_workload("chat", {{"userz", "3"}}, 1, kPage);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("did you mean users"), std::string::npos)
      << unknown.status().message();
  EXPECT_FALSE(generate_workload("chat", {{"users", "many"}}, 1, kPage).ok());
  EXPECT_FALSE(generate_workload("mix", {{"users", "3"}}, 1, kPage).ok());
  EXPECT_FALSE(generate_workload("chats", {}, 1, kPage).ok());
  auto p = parse_workload_params("users=3,turns=2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->at("turns"), "2");
  EXPECT_FALSE(parse_workload_params("users").ok());
  EXPECT_FALSE(parse_workload_params("=3").ok());
}

std::string error_of(std::string_view name, const WorkloadParams& p,
                     uint64_t max_bytes = kMaxWorkloadBytes) {
  auto w = generate_workload(name, p, 1, kPage, max_bytes);
  EXPECT_FALSE(w.ok()) << name << " was accepted";
  return w.ok() ? std::string() : w.status().message();
}

// Each parameter has bounds, and an error names the parameter, its value and the range: huge values
// used to be generated (users=1e99 grew without bound, llround(1e99) is undefined) and 0 silently
// became 1 under a message saying ">= 0".
TEST(Workloads, ParametersOutOfTheirBoundsAreErrorsThatNameThem) {
  using ::testing::HasSubstr;
  EXPECT_THAT(error_of("chat", {{"users", "1e99"}}),
              HasSubstr("workload chat: users=1e99 is out of range: it must be from 1 to 100000"));
  EXPECT_THAT(error_of("chat", {{"users", "0"}}),
              HasSubstr("users=0 is out of range: it must be from 1"));
  EXPECT_THAT(error_of("chat", {{"users", "-3"}}), HasSubstr("users=-3 is out of range"));
  EXPECT_THAT(error_of("chat", {{"users", "many"}}), HasSubstr("users=many is not a number"));
  EXPECT_THAT(error_of("chat", {{"rate", "0"}}),
              HasSubstr("rate=0 is out of range: it must be from 0.001"));
  EXPECT_THAT(error_of("chat", {{"turns", "1e9"}}), HasSubstr("turns=1e9 is out of range"));
  EXPECT_THAT(error_of("chat", {{"think_s", "-1"}}),
              HasSubstr("think_s=-1 is out of range: it must be from 0 to 3600"));
  EXPECT_THAT(error_of("chat", {{"system_tokens", "0"}}), HasSubstr("system_tokens=0"));
  EXPECT_THAT(error_of("agent", {{"agents", "1e6"}}), HasSubstr("agents=1e6"));
  EXPECT_THAT(error_of("agent", {{"steps", "0"}}), HasSubstr("steps=0"));
  EXPECT_THAT(error_of("docs", {{"documents", "1e99"}}), HasSubstr("documents=1e99"));
  EXPECT_THAT(error_of("docs", {{"questions", "1e7"}}), HasSubstr("questions=1e7"));
  EXPECT_THAT(error_of("docs", {{"zipf", "11"}}), HasSubstr("zipf=11"));
  EXPECT_THAT(error_of("long_context", {{"context", "1e99"}}),
              HasSubstr("context=1e99 is out of range"));
  EXPECT_THAT(error_of("long_context", {{"gap_s", "1e99"}}), HasSubstr("gap_s=1e99"));
  EXPECT_THAT(error_of("mix", {{"chat.users", "1e99"}}), HasSubstr("workload chat: users=1e99"));
  // The bounds themselves are accepted, and the defaults lie inside them.
  EXPECT_TRUE(
      generate_workload("chat", {{"users", "1"}, {"turns", "1"}, {"think_s", "0"}}, 1, kPage).ok());
  EXPECT_TRUE(
      generate_workload("docs", {{"documents", "1"}, {"questions", "1"}, {"zipf", "0"}}, 1, kPage)
          .ok());
}

// Within every bound, a combination can still ask for more memory than a benchmark needs: the
// generator stops at the bound with an error instead of growing until std::bad_alloc.
TEST(Workloads, AWorkloadLargerThanTheMemoryBoundIsRefused) {
  using ::testing::HasSubstr;
  const std::string e = error_of("docs", {{"documents", "100"}, {"doc_tokens", "100000"}}, 1 << 20);
  EXPECT_THAT(e, HasSubstr("workload docs: the requests would take more than 1 MiB of memory"));
  EXPECT_THAT(e, HasSubstr("--page-tokens"));
  EXPECT_THAT(error_of("chat", {{"users", "1000"}}, 1 << 20), HasSubstr("more than 1 MiB"));
  EXPECT_THAT(error_of("mix", {}, 1 << 20), HasSubstr("more than 1 MiB"));
  EXPECT_TRUE(generate_workload("chat", {{"users", "4"}}, 1, kPage, 1 << 20).ok());
}

TEST(Workloads, TraceKeepsArrivalsAndOnlyFullBlocksHaveKeys) {
  char path[] = "/tmp/kvtier_run_trace_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    out << R"({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]})"
        << "\n"
        << R"({"timestamp": 250, "input_length": 700, "output_length": 1, "hash_ids": [1, 9]})"
        << "\n";
  }
  auto w = load_trace_workload(path, 2.0, 0, kPage);
  std::remove(path);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->requests.size(), 2u);
  EXPECT_EQ(w->requests[1].arrival, 500 * kNanosPerMilli);
  EXPECT_EQ(w->requests[0].keys.size(), 1100u / kPage);  // 4 full 256-token blocks of 5
  EXPECT_EQ(w->requests[1].keys.size(), 700u / kPage);
  EXPECT_EQ(common_prefix(w->requests[0].keys, w->requests[1].keys), 2u);  // id 1 = 2 blocks
  EXPECT_FALSE(load_trace_workload("/nonexistent/trace.jsonl", 1.0, 0, kPage).ok());
  EXPECT_FALSE(load_trace_workload(path, 0.0, 0, kPage).ok());
  EXPECT_FALSE(load_trace_workload(path, 1e7, 0, kPage).ok());  // --time-scale above 1e6
}

}  // namespace
}  // namespace kvtier::bench::run

// Reading traces: the JSON-lines format (unknown fields skipped, JSON's number and string
// grammar), the inconsistent input it refuses with the line and column named, files that cannot
// hold requests, and generated traces that round-trip through the format.
#include "bench/replay/trace.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/synthetic_trace.hpp"
#include "tests/scheduler/policies/replay_test_util.hpp"

namespace kvtier::replay {
namespace {

TEST(Trace, ParsesAndSkipsUnknownFields) {
  auto t = parse_trace(kTiny, "tiny");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->requests.size(), 4u);
  EXPECT_EQ(t->requests[3].hash_ids, (std::vector<uint64_t>{1, 5}));
  EXPECT_EQ(t->total_input_tokens(), 3824u);
  auto round = parse_trace(format_trace_line(t->requests[1]), "again");
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->requests[0], t->requests[1]);
}

TEST(Trace, ErrorsNameLineAndColumn) {
  auto bad = parse_trace(
      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1,, 2]}\n",
      "bad.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2:"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(parse_trace("{\"hash_ids\": [1]}", "x").ok());  // no input_length
  EXPECT_FALSE(parse_trace("{\"input_length\": -1, \"hash_ids\": []}", "x").ok());
  EXPECT_FALSE(parse_trace("{\"input_length\": 1.5, \"hash_ids\": []}", "x").ok());
  EXPECT_FALSE(parse_trace("[1, 2]", "x").ok());
  EXPECT_FALSE(load_trace("/nonexistent/trace.jsonl").ok());
}

// Line 2 of a two-line trace whose second request carries `fields` (after "{"); the first line is
// valid, so an error must name line 2.
Result<Trace> parse_second_line(const std::string& fields) {
  return parse_trace(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n{" +
          fields + "}\n",
      "t.jsonl");
}

// Expects line 2 to be refused with a message naming the line and `field`.
void expect_refused(const std::string& fields, const std::string& field) {
  auto t = parse_second_line(fields);
  ASSERT_FALSE(t.ok()) << fields;
  const std::string& msg = t.status().message();
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("t.jsonl:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"" + field + "\""), std::string::npos) << msg;
}

TEST(Trace, RejectsHashIdsThatDisagreeWithInputLength) {
  const std::string head = "\"timestamp\": 5, \"output_length\": 1, ";
  ASSERT_TRUE(parse_second_line(head + "\"input_length\": 1024, \"hash_ids\": [1, 2]").ok());
  ASSERT_TRUE(parse_second_line(head + "\"input_length\": 1025, \"hash_ids\": [1, 2, 3]").ok());
  ASSERT_TRUE(parse_second_line(head + "\"input_length\": 1, \"hash_ids\": [7]").ok());
  expect_refused(head + "\"input_length\": 1024, \"hash_ids\": [1]", "hash_ids");
  expect_refused(head + "\"input_length\": 1024, \"hash_ids\": [1, 2, 3]", "hash_ids");
  expect_refused(head + "\"input_length\": 1025, \"hash_ids\": [1, 2]", "hash_ids");
  expect_refused(head + "\"hash_ids\": [], \"input_length\": 0", "input_length");
  expect_refused(head + "\"input_length\": 0, \"hash_ids\": [1]", "input_length");
}

TEST(Trace, RejectsTokenCountsThatCouldOverflowTotals) {
  const std::string head = "\"timestamp\": 5, \"hash_ids\": [1], ";
  expect_refused(head + "\"output_length\": 1, \"input_length\": 18446744073709551615",
                 "input_length");
  expect_refused(head + "\"output_length\": 1, \"input_length\": 1099511627777", "input_length");
  expect_refused(head + "\"input_length\": 10, \"output_length\": 18446744073709551615",
                 "output_length");
  expect_refused(
      "\"timestamp\": 18446744073709551615, \"input_length\": 10, \"output_length\": 1, "
      "\"hash_ids\": [1]",
      "timestamp");
  // Hash ids are opaque: any 64-bit value.
  EXPECT_TRUE(parse_second_line("\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, "
                                "\"hash_ids\": [18446744073709551615]")
                  .ok());
}

TEST(Trace, RejectsAFieldGivenTwice) {
  const std::string ok = "\"timestamp\": 5, \"input_length\": 1024, \"output_length\": 1";
  expect_refused(ok + ", \"hash_ids\": [1], \"hash_ids\": [2]", "hash_ids");
  expect_refused(ok + ", \"hash_ids\": [1, 2], \"timestamp\": 6", "timestamp");
  expect_refused(ok + ", \"hash_ids\": [1, 2], \"extra\": 1, \"extra\": 2", "extra");
  // Names inside a skipped value are not the request's fields.
  EXPECT_TRUE(parse_second_line(ok + ", \"hash_ids\": [1, 2], \"extra\": {\"hash_ids\": 1}").ok());
}

TEST(Trace, RequiresTimestampAndOutputLength) {
  expect_refused("\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]", "timestamp");
  expect_refused("\"timestamp\": 5, \"input_length\": 10, \"hash_ids\": [1]", "output_length");
}

TEST(Trace, SkippedNumbersFollowTheJsonGrammar) {
  const std::string ok =
      "\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1], \"x\": ";
  for (const char* n : {"0", "-0", "12", "-1.5e+3", "2.5E-2", "1e9", "0.0", "[1, -2.5, 3e1]"}) {
    EXPECT_TRUE(parse_second_line(ok + n).ok()) << n;
  }
  for (const char* n : {"--", "+e", "+1", "-", "1.2.3", "01", "-01", ".5", "1.", "1e", "1e+", "e5",
                        "1-2", "0x10", "[1, --]", "{\"y\": +e}"}) {
    auto t = parse_second_line(ok + n);
    ASSERT_FALSE(t.ok()) << n;
    EXPECT_NE(t.status().message().find("t.jsonl:2:"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("\"x\""), std::string::npos) << t.status().message();
  }
  // The known fields take plain integers only, in the same grammar: no leading zeros.
  expect_refused("\"timestamp\": 05, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]",
                 "timestamp");
}

// Every byte of a message is printable ASCII (input bytes are shown as \xNN).
bool printable_ascii(const std::string& s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7E) return false;
  }
  return true;
}

// Line 2 is refused with a message naming `where` (file:line:column) and `what`.
void expect_line2_refused(const std::string& fields, const std::string& where,
                          const std::string& what) {
  auto t = parse_second_line(fields);
  ASSERT_FALSE(t.ok()) << fields;
  const std::string& msg = t.status().message();
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find(where), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_TRUE(printable_ascii(msg)) << msg;
}

// A u escape takes exactly four hex digits (it consumed any four bytes); escapes decode, so an
// escaped field name is that field.
TEST(Trace, StringEscapesFollowJson) {
  const std::string ok =
      "\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, "
      "\"hash_ids\": [1], ";
  // Column 4 of {"x\u...: the backslash.
  expect_line2_refused("\"x\\uZZZZ\": 1, " + ok.substr(0, ok.size() - 2),
                       "t.jsonl:2:4:", "needs four hex digits but found 'Z'");
  expect_line2_refused("\"x\\u12g4\": 1, " + ok.substr(0, ok.size() - 2),
                       "t.jsonl:2:4:", "needs four hex digits but found 'g'");
  expect_line2_refused(ok + "\"x\\u12", "t.jsonl:2:", "needs four hex digits but found '}'");
  auto cut = parse_trace("{\"x\\u12", "cut.jsonl");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cut.jsonl:1:4: \\u escape \\u12 needs four hex digits "
                                        "but the line ended"),
            std::string::npos)
      << cut.status().message();
  expect_line2_refused(ok + "\"x\\ud83d\": 1", "t.jsonl:2:", "high surrogate");
  expect_line2_refused(ok + "\"x\\ude00\": 1", "t.jsonl:2:", "low surrogate");
  expect_line2_refused(ok + "\"x\\ud83d\\u0041\": 1", "t.jsonl:2:", "surrogate pair");
  expect_line2_refused(ok + "\"x\\q\": 1", "t.jsonl:2:", "invalid escape '\\q'");
  expect_line2_refused(ok + "\"x\ty\": 1", "t.jsonl:2:", "control character (\\x09)");
  for (const char* name :
       {"\\u00e9", "\\u00E9\\u4e2d", "\\ud83d\\ude00", "\\\"\\\\\\/\\b\\f\\n\\r\\t"}) {
    EXPECT_TRUE(parse_second_line(ok + "\"" + name + "\": 1").ok()) << name;
  }
  // "time\u0073tamp" is "timestamp": a second one is a repeat, and it is the field read.
  expect_refused(ok + "\"time\\u0073tamp\": 6", "timestamp");
  auto t = parse_second_line(
      "\"\\u0074imestamp\": 7, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->requests[1].timestamp_ms, 7u);
}

// The format is sorted by timestamp and the replay serves requests in file order: a request that
// arrived before the one above it is refused, naming its line, its column and the earlier line.
TEST(Trace, RequestsMustBeSortedByTimestamp) {
  const auto line = [](uint64_t ts) {
    return "{\"timestamp\": " + std::to_string(ts) +
           ", \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n";
  };
  auto sorted = parse_trace(line(0) + line(100) + line(100) + "\n" + line(250), "s.jsonl");
  ASSERT_TRUE(sorted.ok()) << sorted.status().message();  // equal timestamps are in order
  EXPECT_EQ(sorted->requests.size(), 4u);
  auto bad = parse_trace(line(0) + line(100) + "\n" + line(50), "u.jsonl");
  ASSERT_FALSE(bad.ok());
  const std::string& msg = bad.status().message();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("u.jsonl:4:15: \"timestamp\" of 50 ms is earlier than the 100 ms of the "
                     "request on line 2"),
            std::string::npos)
      << msg;
}

// Messages show the input's bytes other than printable ASCII as \xNN: a byte-order mark, 0xFF, a
// UTF-8 field name, never raw (they made messages that were not valid UTF-8).
TEST(Trace, MessagesEscapeBytesThatAreNotPrintableAscii) {
  const std::string req =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}";
  auto bom = parse_trace("\xEF\xBB\xBF" + req + "\n", "bom.jsonl");
  ASSERT_FALSE(bom.ok());
  EXPECT_NE(bom.status().message().find("bom.jsonl:1:1: expected '{' but found a UTF-8 byte order "
                                        "mark"),
            std::string::npos)
      << bom.status().message();
  EXPECT_TRUE(printable_ascii(bom.status().message())) << bom.status().message();
  const std::string ok =
      "\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, "
      "\"hash_ids\": [1], ";
  expect_line2_refused(ok + "\"x\": \xFF", "t.jsonl:2:", "but found '\\xff'");
  expect_line2_refused(ok + "\"x\": 1\xFF", "t.jsonl:2:", "holds 1\\xff, which is not");
  expect_line2_refused(ok + "\"\xC3\xA9\": 1, \"\xC3\xA9\": 2",
                       "t.jsonl:2:", "\"\\xc3\\xa9\" appears twice");
  expect_line2_refused(ok + "\"\xFF\": [1, --]", "t.jsonl:2:", "\"\\xff\" holds --");
  expect_line2_refused("\"timestamp\": \x01", "t.jsonl:2:", "but found '\\x01'");
}

// A text with no request is refused, not replayed as 0 requests with every hit rate 0.
TEST(Trace, ATraceHasRequests) {
  for (const char* text : {"", "\n", "  \n\t\r\n\n"}) {
    auto t = parse_trace(text, "none.jsonl");
    ASSERT_FALSE(t.ok()) << "[" << text << "]";
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), "none.jsonl: no requests");
  }
}

// load_trace reads regular files: a directory opened and read as 0 requests (the stream's failed
// read went unnoticed), an empty file too.
TEST(Trace, LoadsRegularFilesThatHoldRequests) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto d = load_trace(dir.path());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message(), "trace " + dir.path() + " is a directory, not a regular file");

  const std::string empty = dir.write("empty.jsonl", "");
  auto e = load_trace(empty);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), empty + ": no requests");
  auto blank = load_trace(dir.write("blank.jsonl", "\n\n"));
  ASSERT_FALSE(blank.ok());
  EXPECT_NE(blank.status().message().find(": no requests"), std::string::npos);

  auto missing = load_trace(dir.path() + "/missing.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_NE(missing.status().message().find("cannot open trace " + dir.path() +
                                            "/missing.jsonl: No such file or directory (errno 2)"),
            std::string::npos)
      << missing.status().message();

  auto good = load_trace(dir.write("tiny.jsonl", kTiny));
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(good->requests.size(), 4u);
}

// Generated traces, saved with format_trace_line (--write-trace), load back unchanged.
TEST(Trace, GeneratedTracesRoundTrip) {
  ChatTraceOptions chat;
  chat.requests = 500;
  AgentTraceOptions agent;
  agent.requests = 500;
  for (const Trace& t : {generate_chat_trace(chat), generate_agent_trace(agent)}) {
    std::string text;
    for (const TraceRequest& r : t.requests) text += format_trace_line(r) + "\n";
    auto back = parse_trace(text, t.source);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->requests, t.requests) << t.source;
  }
}

}  // namespace
}  // namespace kvtier::replay

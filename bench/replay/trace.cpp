#include "bench/replay/trace.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace kvtier::replay {
namespace {

// Largest token count or timestamp (ms) a request may carry: far above any real prompt (35 years
// of ms), and low enough that ceil(input_length / 512) cannot overflow and milliseconds scaled to
// nanoseconds fit in 64 bits. With one hash id per 512 tokens, a sum of input lengths past 2^64
// would need 2^55 ids in the text, so totals cannot overflow either.
constexpr uint64_t kMaxTraceValue = uint64_t{1} << 40;

// The JSON number grammar (RFC 8259): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
  std::size_t i = 0;
  const auto digits = [&] {
    const std::size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// A cursor over one line of JSON with error reporting by column.
class JsonLine {
 public:
  JsonLine(std::string_view text, const std::string& source, uint64_t line)
      : text_(text), source_(source), line_(line) {}

  Status error(const std::string& what) const { return error_at(pos_, what); }
  Status error_at(std::size_t pos, const std::string& what) const {
    return invalid_argument(source_ + ":" + std::to_string(line_) + ":" + std::to_string(pos + 1) +
                            ": " + what);
  }
  // The position of the next token.
  std::size_t here() {
    skip_ws();
    return pos_;
  }
  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n'))
      ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= text_.size();
  }
  bool consume(char c) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status expect(char c) {
    if (consume(c)) return ok_status();
    return error(std::string("expected '") + c + "'" + found());
  }
  std::string found() const {
    if (pos_ >= text_.size()) return " but the line ended";
    return std::string(" but found '") + text_[pos_] + "'";
  }

  Result<std::string> string() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a string" + found());
    ++pos_;
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (c == '\\') {
        if (pos_ >= text_.size()) break;
        const char e = text_[pos_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u':
            if (pos_ + 4 > text_.size()) return error("truncated \\u escape");
            pos_ += 4;  // field names here are ASCII; the code point itself is not needed
            c = '?';
            break;
          default: c = e; break;
        }
      }
      out.push_back(c);
    }
    if (pos_ >= text_.size()) return error("unterminated string");
    ++pos_;
    return out;
  }

  // A JSON number that must be a non-negative integer (a fraction or exponent is refused).
  Result<uint64_t> unsigned_integer(const std::string& field) {
    skip_ws();
    const std::size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(text_[pos_] - '0');
      if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
        return error("\"" + field + "\" does not fit in 64 bits");
      }
      v = v * 10 + d;
      ++pos_;
    }
    if (pos_ == start) {
      return error("\"" + field + "\" must be a non-negative integer" + found());
    }
    if (text_[start] == '0' && pos_ - start > 1) {
      return error_at(start, "\"" + field + "\" has a leading zero, which JSON does not allow");
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return error("\"" + field + "\" must be an integer, not a fraction");
    }
    return v;
  }

  // Skips any JSON value (unknown fields); errors name the request's `field` it belongs to.
  Status skip_value(const std::string& field, int depth = 0) {
    if (depth > 64) return error("nesting deeper than 64 levels");
    skip_ws();
    if (pos_ >= text_.size()) return error("expected a value but the line ended");
    const char c = text_[pos_];
    if (c == '"') return string().status();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (consume(close)) return ok_status();
      while (true) {
        if (c == '{') {
          KVTIER_RETURN_IF_ERROR(string().status());
          KVTIER_RETURN_IF_ERROR(expect(':'));
        }
        KVTIER_RETURN_IF_ERROR(skip_value(field, depth + 1));
        if (consume(close)) return ok_status();
        KVTIER_RETURN_IF_ERROR(expect(','));
      }
    }
    const std::size_t start = pos_;
    while (pos_ < text_.size() && std::strchr(",]} \t\r\n", text_[pos_]) == nullptr) ++pos_;
    const std::string_view word = text_.substr(start, pos_ - start);
    if (word == "true" || word == "false" || word == "null") return ok_status();
    if (is_json_number(word)) return ok_status();
    pos_ = start;
    if (!word.empty() && std::strchr("0123456789+-.eE", word.front()) != nullptr) {
      return error("\"" + field + "\" holds " + std::string(word) + ", which is not a JSON number");
    }
    return error("\"" + field + "\" holds no JSON value" + found());
  }

 private:
  std::string_view text_;
  const std::string& source_;
  uint64_t line_;
  std::size_t pos_ = 0;
};

// A token count or timestamp of the request, bounded by kMaxTraceValue.
Result<uint64_t> bounded_value(JsonLine& in, const std::string& field, const char* unit) {
  const std::size_t at = in.here();
  KVTIER_ASSIGN_OR_RETURN(uint64_t v, in.unsigned_integer(field));
  if (v > kMaxTraceValue) {
    return in.error_at(
        at, "\"" + field + "\" of " + std::to_string(v) + " " + unit + " is more than 2^40");
  }
  return v;
}

Result<TraceRequest> parse_request(JsonLine& in) {
  TraceRequest r;
  std::vector<std::string> seen;  // a repeated field would otherwise override or extend the first
  std::size_t input_at = 0;
  std::size_t ids_at = 0;
  KVTIER_RETURN_IF_ERROR(in.expect('{'));
  if (!in.consume('}')) {
    while (true) {
      const std::size_t name_at = in.here();
      KVTIER_ASSIGN_OR_RETURN(std::string name, in.string());
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        return in.error_at(name_at, "\"" + name + "\" appears twice in the request");
      }
      seen.push_back(name);
      KVTIER_RETURN_IF_ERROR(in.expect(':'));
      if (name == "timestamp") {
        KVTIER_ASSIGN_OR_RETURN(r.timestamp_ms, bounded_value(in, name, "ms"));
      } else if (name == "input_length") {
        input_at = in.here();
        KVTIER_ASSIGN_OR_RETURN(r.input_length, bounded_value(in, name, "tokens"));
      } else if (name == "output_length") {
        KVTIER_ASSIGN_OR_RETURN(r.output_length, bounded_value(in, name, "tokens"));
      } else if (name == "hash_ids") {
        ids_at = in.here();
        KVTIER_RETURN_IF_ERROR(in.expect('['));
        if (!in.consume(']')) {
          while (true) {
            KVTIER_ASSIGN_OR_RETURN(uint64_t id, in.unsigned_integer("hash_ids"));
            r.hash_ids.push_back(id);
            if (in.consume(']')) break;
            KVTIER_RETURN_IF_ERROR(in.expect(','));
          }
        }
      } else {
        KVTIER_RETURN_IF_ERROR(in.skip_value(name));
      }
      if (in.consume('}')) break;
      KVTIER_RETURN_IF_ERROR(in.expect(','));
    }
  }
  if (!in.at_end()) return in.error("unexpected text after the request object");
  for (const char* field : {"timestamp", "input_length", "output_length", "hash_ids"}) {
    if (std::find(seen.begin(), seen.end(), field) == seen.end()) {
      return in.error(std::string("the request has no \"") + field + "\"");
    }
  }
  if (r.input_length == 0) {
    return in.error_at(input_at, "\"input_length\" is 0: a request has at least one prompt token");
  }
  const uint64_t blocks =
      r.input_length / kTraceBlockTokens + (r.input_length % kTraceBlockTokens != 0 ? 1 : 0);
  if (r.hash_ids.size() != blocks) {
    return in.error_at(ids_at, "\"hash_ids\" has " + std::to_string(r.hash_ids.size()) +
                                   " ids but an \"input_length\" of " +
                                   std::to_string(r.input_length) + " tokens needs " +
                                   std::to_string(blocks) + ", one per " +
                                   std::to_string(kTraceBlockTokens) + "-token block");
  }
  return r;
}

}  // namespace

uint64_t Trace::total_input_tokens() const {
  uint64_t total = 0;
  for (const TraceRequest& r : requests) total += r.input_length;
  return total;
}

Result<Trace> parse_trace(std::string_view text, std::string source) {
  Trace trace;
  trace.source = std::move(source);
  uint64_t line_no = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    ++line_no;
    JsonLine in(line, trace.source, line_no);
    if (!in.at_end()) {
      KVTIER_ASSIGN_OR_RETURN(TraceRequest r, parse_request(in));
      trace.requests.push_back(std::move(r));
    }
    if (end == text.size()) break;
    start = end + 1;
  }
  return trace;
}

Result<Trace> load_trace(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return io_error("cannot open trace " + path + ": " + std::strerror(errno) + " (errno " +
                    std::to_string(errno) + ")");
  }
  std::ostringstream buffer;
  buffer << file.rdbuf();
  if (file.bad()) return io_error("cannot read trace " + path);
  return parse_trace(buffer.str(), path);
}

std::string format_trace_line(const TraceRequest& r) {
  std::string out = "{\"timestamp\": " + std::to_string(r.timestamp_ms) +
                    ", \"input_length\": " + std::to_string(r.input_length) +
                    ", \"output_length\": " + std::to_string(r.output_length) + ", \"hash_ids\": [";
  for (std::size_t i = 0; i < r.hash_ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(r.hash_ids[i]);
  }
  out += "]}";
  return out;
}

}  // namespace kvtier::replay

#include "bench/replay/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

namespace kvtier::replay {
namespace {

// Largest token count or timestamp (ms) a request may carry: far above any real prompt (35 years
// of ms), and low enough that ceil(input_length / 512) cannot overflow and milliseconds scaled to
// nanoseconds fit in 64 bits. With one hash id per 512 tokens, a sum of input lengths past 2^64
// would need 2^55 ids in the text, so totals cannot overflow either.
constexpr uint64_t kMaxTraceValue = uint64_t{1} << 40;

// Bytes of the input as messages show them: printable ASCII as is, anything else (control bytes,
// a byte-order mark, UTF-8 or stray 0xFF) as \xNN, so a message is always plain ASCII.
std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out.push_back(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

// A name from the input, quoted for a message.
std::string quoted(std::string_view name) { return "\"" + printable(name) + "\""; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

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
    if (text_.substr(pos_, 3) == "\xEF\xBB\xBF") return " but found a UTF-8 byte order mark";
    return " but found '" + printable(text_.substr(pos_, 1)) + "'";
  }

  // A JSON string with its escapes decoded (hex escapes to UTF-8, surrogate pairs joined).
  Result<std::string> string() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a string" + found());
    ++pos_;
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      const std::size_t at = pos_;
      const char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) {
        return error_at(at, "a control character (" + printable(std::string_view(&c, 1)) +
                                ") in a string must be escaped");
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/': out.push_back(e); break;
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'u': {
          KVTIER_ASSIGN_OR_RETURN(uint32_t cp, hex4(at));
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return error_at(at, "\\u escape " + printable(text_.substr(at, 6)) +
                                    " is a low surrogate without a high one before it");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            const std::size_t low_at = pos_;
            if (text_.substr(pos_, 2) != "\\u") {
              return error_at(at, "\\u escape " + printable(text_.substr(at, 6)) +
                                      " is a high surrogate without a low one after it");
            }
            pos_ += 2;
            KVTIER_ASSIGN_OR_RETURN(uint32_t low, hex4(low_at));
            if (low < 0xDC00 || low > 0xDFFF) {
              return error_at(low_at, "\\u escape " + printable(text_.substr(low_at, 6)) +
                                          " does not complete the surrogate pair before it");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return error_at(at,
                          "invalid escape '\\" + printable(std::string_view(&e, 1)) +
                              "' in a string (JSON has \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
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
      return error(quoted(field) + " holds " + printable(word) + ", which is not a JSON number");
    }
    return error(quoted(field) + " holds no JSON value" + found());
  }

 private:
  // The four hex digits of a hex escape, at `pos_` (the escape starts at `at`).
  Result<uint32_t> hex4(std::size_t at) {
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const int d = pos_ < text_.size() ? hex_digit(text_[pos_]) : -1;
      if (d < 0) {
        return error_at(at, "\\u escape " + printable(text_.substr(at, pos_ + 1 - at)) +
                                " needs four hex digits" + found());
      }
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    return cp;
  }

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

// `timestamp_at` receives the column of the timestamp, for the order check of the caller.
Result<TraceRequest> parse_request(JsonLine& in, std::size_t& timestamp_at) {
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
        return in.error_at(name_at, quoted(name) + " appears twice in the request");
      }
      seen.push_back(name);
      KVTIER_RETURN_IF_ERROR(in.expect(':'));
      if (name == "timestamp") {
        timestamp_at = in.here();
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

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Closes the trace's descriptor on every return.
class TraceFd {
 public:
  explicit TraceFd(int fd) : fd_(fd) {}
  TraceFd(const TraceFd&) = delete;
  TraceFd& operator=(const TraceFd&) = delete;
  ~TraceFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

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
  uint64_t previous_line = 0;  // of the last request
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    ++line_no;
    JsonLine in(line, trace.source, line_no);
    if (!in.at_end()) {
      std::size_t timestamp_at = 0;
      KVTIER_ASSIGN_OR_RETURN(TraceRequest r, parse_request(in, timestamp_at));
      // The format is sorted by arrival, and the replay serves requests in file order: a request
      // out of order would be served before ones that arrived earlier (and the lookahead policy
      // would see time run backwards), while `kvtier-bench run` sorts by arrival — two different
      // replays of one file. Equal timestamps are in order.
      if (!trace.requests.empty() && r.timestamp_ms < trace.requests.back().timestamp_ms) {
        return in.error_at(
            timestamp_at,
            "\"timestamp\" of " + std::to_string(r.timestamp_ms) + " ms is earlier than the " +
                std::to_string(trace.requests.back().timestamp_ms) + " ms of the request on line " +
                std::to_string(previous_line) + ": a trace is sorted by timestamp");
      }
      previous_line = line_no;
      trace.requests.push_back(std::move(r));
    }
    if (end == text.size()) break;
    start = end + 1;
  }
  if (trace.requests.empty()) return invalid_argument(trace.source + ": no requests");
  return trace;
}

// A regular file only, checked on the open descriptor: a directory opens (and a stream's read of
// it fails with EISDIR where nobody looks), and a FIFO or device would block or never end.
// O_NONBLOCK keeps open() itself from waiting for a FIFO's writer; it changes nothing for a
// regular file.
Result<Trace> load_trace(const std::string& path) {
  const TraceFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return io_error("cannot open trace " + path + ": " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return io_error("cannot stat trace " + path + ": " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("trace " + path + " is " + file_kind(st.st_mode) +
                            ", not a regular file");
  }
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("cannot read trace " + path + ": " + errno_text(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return parse_trace(text, path);
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

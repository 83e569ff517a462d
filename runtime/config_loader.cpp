#include "runtime/config_loader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "runtime/config_schema.hpp"
#include "runtime/config_suggest.hpp"
#include "runtime/config_validate.hpp"

extern "C" char** environ;

namespace kvtier {
namespace {

using Environment = std::map<std::string, std::string>;

constexpr std::string_view kEnvPrefix = "KVTIER_";
constexpr std::string_view kEnvSeparator = "__";

std::string join_path(std::string_view section, std::string_view word) {
  if (section.empty()) return std::string(word);
  std::string out(section);
  out += '.';
  out += word;
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) {
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  }
  if (s.size() > 80) out += "...";
  return out;
}

Status unknown_key(std::string_view section, std::string_view word) {
  const std::vector<std::string_view> valid = config_children(section);
  std::string message = join_path(section, printable(word)) + ": unknown key";
  if (auto near = closest_match(word, valid)) {
    message += "; did you mean \"" + std::string(*near) + "\"?";
  }
  message += " (valid keys ";
  message += section.empty() ? "at the top" : "under " + std::string(section);
  message += ": " + join_words(valid) + ")";
  return invalid_argument(std::move(message));
}

std::string env_label(std::string_view name, std::string_view value) {
  return "environment " + printable(name) + "=" + printable(value);
}

bool is_key_variable_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// " (KVTIER_TIERS__HBM__CAPACITY)" for "tiers__hbm.capacity": the spelling meant, when upper case
// and "__" for '.' give one; "" otherwise.
std::string suggest_key_variable(std::string_view rest) {
  std::string out;
  for (char c : rest) {
    if (c == '.') {
      out += kEnvSeparator;
    } else if (c >= 'a' && c <= 'z') {
      out += static_cast<char>(c - 'a' + 'A');
    } else if (is_key_variable_char(c)) {
      out += c;
    } else {
      return "";
    }
  }
  return " (" + std::string(kEnvPrefix) + out + ")";
}

// Records where each document starts and ignores the rest: counting documents is all it is for.
class DocumentStarts final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { last_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  YAML::Mark last() const { return last_; }

 private:
  YAML::Mark last_;
};

// A YAML text parsed as one document: its root, and where a second document starts if one does.
struct ParsedYaml {
  YAML::Node root;
  bool more_documents = false;
  YAML::Mark second_start;
};

// Throws YAML::Exception for malformed YAML.
ParsedYaml parse_yaml(const std::string& text) {
  ParsedYaml out;
  out.root = YAML::Load(text);
  // A second, bounded pass counts documents. Not YAML::LoadAll: yaml-cpp 0.7 never consumes a ','
  // at document level and LoadAll then appends empty documents until memory runs out.
  std::istringstream in{text};
  YAML::Parser parser(in);
  DocumentStarts starts;
  int documents = 0;
  while (documents < 2 && parser.HandleNextDocument(starts)) ++documents;
  out.more_documents = documents > 1;
  out.second_start = starts.last();
  return out;
}

// A tag the document wrote ("!!int", "!mine", "!<tag:...>"), not the non-specific ones yaml-cpp
// gives untagged nodes: "?" (plain), "!" (quoted, or a lone "!") and "" (null).
bool has_explicit_tag(const YAML::Node& n) {
  const std::string& tag = n.Tag();
  return !tag.empty() && tag != "?" && tag != "!";
}

// A tag as it would be written: yaml-cpp expands "!!int" to "tag:yaml.org,2002:int".
std::string written_tag(const std::string& tag) {
  constexpr std::string_view kCore = "tag:yaml.org,2002:";
  if (std::string_view(tag).starts_with(kCore)) return "!!" + tag.substr(kCore.size());
  if (!tag.empty() && tag.front() == '!') return tag;
  return "!<" + tag + ">";
}

// The first node under `n` (itself included) with an explicit tag, or an invalid node.
YAML::Node find_explicit_tag(const YAML::Node& n) {
  if (has_explicit_tag(n)) return n;
  if (n.IsSequence() || n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (n.IsSequence()) {
        YAML::Node found = find_explicit_tag(*it);
        if (found.IsDefined()) return found;
        continue;
      }
      for (const YAML::Node& part : {YAML::Node(it->first), YAML::Node(it->second)}) {
        YAML::Node found = find_explicit_tag(part);
        if (found.IsDefined()) return found;
      }
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// "tiers.hbm.capacity" as YAML nesting: "tiers: hbm: capacity:".
std::string nested_form(std::string_view path) {
  std::string out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    out += path.substr(start, dot == std::string_view::npos ? dot : dot - start);
    out += ':';
    if (dot == std::string_view::npos) return out;
    out += ' ';
    start = dot + 1;
  }
}

// Where a value came from, for messages: "file:line:col" inside a document, or the label of an
// override ("--set a.b=c", "environment KVTIER_A__B=c").
class Where {
 public:
  static Where document(std::string_view source) { return Where(std::string(source), true); }
  static Where label(std::string text) { return Where(std::move(text), false); }

  std::string at(const YAML::Mark& mark) const {
    if (!in_document_ || mark.is_null()) return name_;
    return name_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
  const std::string& name() const { return name_; }
  bool in_document() const { return in_document_; }

 private:
  Where(std::string name, bool in_document) : name_(std::move(name)), in_document_(in_document) {}
  std::string name_;
  bool in_document_;
};

// Applies layers to a Config and remembers which layer last set each key, so that validation can
// point at the line or the override to change.
class ConfigBuilder {
 public:
  // The embedded default, without recording origins: a rule broken by a default value is reported
  // against the key the user did set.
  Status apply_default() {
    Where where = Where::document(kEmbeddedConfigName);
    record_origins_ = false;
    Status s = apply_text(embedded_default_config(), where);
    record_origins_ = true;
    if (!s.ok()) return internal_error("the embedded default does not load: " + s.message());
    return s;
  }

  Status apply_document(std::string_view text, std::string_view source) {
    return apply_text(text, Where::document(source));
  }

  // "key.path=value" from --set, or an environment variable already turned into one.
  Status apply_assignment(std::string_view path, std::string_view value, const Where& where) {
    try {
      KVTIER_RETURN_IF_ERROR(check_path(path, where));
      ParsedYaml parsed;
      try {
        parsed = parse_yaml(std::string(value));
      } catch (const YAML::Exception& e) {
        return invalid_argument(where.name() + ": " + std::string(path) + ": value is not valid " +
                                "YAML (" + e.msg + "); quote it if it holds : # [ ] { } or ,");
      }
      if (parsed.more_documents) {
        return invalid_argument(where.name() + ": " + std::string(path) +
                                ": the value is more than one YAML document; quote it if it " +
                                "holds a line \"---\" or \"...\"");
      }
      return apply_node(path, parsed.root, YAML::Mark::null_mark(), where);
    } catch (const std::exception& e) {
      return invalid_argument(where.name() + ": " + e.what());
    }
  }

  Status apply_override(std::string_view assignment) {
    const Where where = Where::label("--set " + printable(assignment));
    const std::size_t eq = assignment.find('=');
    if (eq == std::string_view::npos) {
      return invalid_argument(where.name() + ": expected key.path=value (e.g. --set " +
                              "tiers.host.capacity=8GiB)");
    }
    return apply_assignment(assignment.substr(0, eq), assignment.substr(eq + 1), where);
  }

  // Every key variable is checked before any is applied: names are A-Z, 0-9 and _ (so each key
  // has one spelling), and no two variables set the same key or a section and a key inside it
  // (either would otherwise be settled silently by the order of their names).
  Status apply_environment(const Environment& env) {
    struct KeyVariable {
      const std::string* name;
      const std::string* value;
      std::string path;
    };
    std::vector<KeyVariable> keys;
    for (const auto& [name, value] : env) {
      if (!std::string_view(name).starts_with(kEnvPrefix)) continue;
      if (name.find(kEnvSeparator) == std::string::npos) continue;
      const std::string_view rest = std::string_view(name).substr(kEnvPrefix.size());
      if (!std::all_of(rest.begin(), rest.end(), is_key_variable_char)) {
        return invalid_argument(env_label(name, value) +
                                ": a key variable is spelled in upper case: A-Z, 0-9 and _ after " +
                                std::string(kEnvPrefix) + suggest_key_variable(rest));
      }
      std::string path;
      for (std::size_t i = 0; i < rest.size();) {
        if (rest.substr(i).starts_with(kEnvSeparator)) {
          path += '.';
          i += kEnvSeparator.size();
        } else {
          const char c = rest[i++];
          path += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
        }
      }
      keys.push_back({&name, &value, std::move(path)});
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const KeyVariable& outer = keys[i];
        const KeyVariable& inner = keys[j];
        if (i == j || !inner.path.starts_with(outer.path)) continue;
        if (inner.path.size() == outer.path.size() && i < j) {
          return invalid_argument("environment " + printable(*outer.name) + " and " +
                                  printable(*inner.name) + " both set " + printable(outer.path) +
                                  "; set it with one variable");
        }
        if (inner.path.size() > outer.path.size() && inner.path[outer.path.size()] == '.') {
          return invalid_argument("environment " + printable(*outer.name) + " (" +
                                  printable(outer.path) + ") and " + printable(*inner.name) + " (" +
                                  printable(inner.path) +
                                  ") overlap: the first sets the section that holds the second; " +
                                  "set each key with one variable");
        }
      }
    }
    for (const KeyVariable& k : keys) {
      KVTIER_RETURN_IF_ERROR(
          apply_assignment(k.path, *k.value, Where::label(env_label(*k.name, *k.value))));
    }
    return ok_status();
  }

  Status expand_paths(std::string_view cache_dir) {
    for (std::string& path : config_.tiers.nvme.paths) {
      auto expanded = expand_cache_dir(path, cache_dir);
      if (!expanded.ok()) return located(expanded.status(), {"tiers.nvme.paths"});
      path = std::move(expanded).value();
    }
    return ok_status();
  }

  Status validate() const {
    const std::vector<ConfigIssue> issues = find_config_issues(config_);
    if (issues.empty()) return ok_status();
    std::string message;
    for (const ConfigIssue& issue : issues) {
      if (!message.empty()) message += "; ";
      message += locate(issue.keys) + issue.message;
    }
    return invalid_argument(std::move(message));
  }

  Config take() { return std::move(config_); }

 private:
  // "origin: key: " for the first of `keys` that a layer set, else "key: " for the first.
  std::string locate(const std::vector<std::string>& keys) const {
    for (const std::string& key : keys) {
      auto it = origins_.find(key);
      if (it != origins_.end()) return it->second + ": " + key + ": ";
    }
    return keys.front() + ": ";
  }

  Status located(const Status& s, const std::vector<std::string>& keys) const {
    return Status(s.code(), locate(keys) + s.message());
  }

  Status apply_text(std::string_view text, const Where& where) {
    if (text.size() > kMaxConfigBytes) {
      return invalid_argument(where.name() + ": " + std::to_string(text.size()) +
                              " bytes is larger than the " + std::to_string(kMaxConfigBytes) +
                              "-byte limit for a configuration");
    }
    try {
      ParsedYaml parsed;
      try {
        parsed = parse_yaml(std::string(text));
      } catch (const YAML::DeepRecursion& e) {
        return invalid_argument(where.at(e.mark) + ": malformed YAML: nested too deeply");
      } catch (const YAML::Exception& e) {
        return invalid_argument(where.at(e.mark) + ": malformed YAML: " + e.msg);
      }
      if (parsed.more_documents) {
        return invalid_argument(where.at(parsed.second_start) +
                                ": a configuration is one YAML document; more follows here");
      }
      return apply_node("", parsed.root, parsed.root.Mark(), where);
    } catch (const std::exception& e) {
      return invalid_argument(where.name() + ": " + e.what());
    }
  }

  // Every segment of `path` but the last must be a section, and the whole a key or a section.
  Status check_path(std::string_view path, const Where& where) const {
    if (path.empty()) return invalid_argument(where.name() + ": the key path is empty");
    std::string section;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = path.find('.', start);
      const std::string_view word =
          path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
      const std::string child = join_path(section, word);
      if (word.empty() || (find_config_key(child) == nullptr && !is_config_section(child))) {
        return unknown_key(section, word).with_context(where.name());
      }
      if (dot == std::string_view::npos) return ok_status();
      if (!is_config_section(child)) {
        return invalid_argument(where.name() + ": " + child + " is a key, not a section");
      }
      section = child;
      start = dot + 1;
    }
  }

  // `value` for `path` (a key or a section); `key_mark` locates it when the value has no useful
  // mark of its own (an empty value's mark points past it).
  //
  // Explicit tags are refused on every node, keys included: the readers would honour some and
  // ignore others (`!!int lfu` read as an enum, `!!binary` as a string of base64).
  Status apply_node(std::string_view path, const YAML::Node& value, const YAML::Mark& key_mark,
                    const Where& where) {
    const YAML::Mark mark = value.IsNull() ? key_mark : value.Mark();
    const ConfigKey* key = find_config_key(path);
    // A key's whole value; a section's own node (its keys and values are checked one by one).
    const YAML::Node tagged = key != nullptr            ? find_explicit_tag(value)
                              : has_explicit_tag(value) ? value
                                                        : YAML::Node(YAML::NodeType::Undefined);
    if (tagged.IsDefined()) return refused_tag(path, tagged, where);
    if (key != nullptr) {
      Status s = key->apply(config_, value);
      if (!s.ok()) {
        return invalid_argument(where.at(mark) + ": " + std::string(path) + ": " + s.message());
      }
      if (record_origins_) origins_[std::string(path)] = where.at(mark);
      return ok_status();
    }
    // A section: a map of keys, or nothing ("tiers:" alone changes nothing).
    if (value.IsNull()) return ok_status();
    if (!value.IsMap()) {
      std::string message = where.at(mark) + ": ";
      if (!path.empty()) message += std::string(path) + ": ";
      message += "expected a map of keys (" + join_words(config_children(path)) + "), got ";
      message += value.IsSequence() ? "a list" : "a value";
      return invalid_argument(std::move(message));
    }
    std::map<std::string, YAML::Mark, std::less<>> seen;
    for (auto it = value.begin(); it != value.end(); ++it) {
      // Copies: the iterator yields a temporary pair, so references into it would dangle.
      const YAML::Node k = it->first;
      const YAML::Node v = it->second;
      if (!k.IsScalar()) {
        return invalid_argument(where.at(k.Mark()) + ": " +
                                (path.empty() ? std::string() : std::string(path) + ": ") +
                                "keys must be words, not a list or a map");
      }
      const std::string& word = k.Scalar();
      const std::string child = join_path(path, word);
      if (word.empty()) {
        // join_path would name the section itself, and the root's "" is the whole document.
        std::string message = where.at(k.Mark()) + ": ";
        if (!path.empty()) message += std::string(path) + ": ";
        message += "empty key (valid keys ";
        message += path.empty() ? "at the top" : "under " + std::string(path);
        return invalid_argument(message + ": " + join_words(config_children(path)) + ")");
      }
      if (word.find('.') != std::string::npos) {
        // Not a second spelling of the nested key: duplicates are found per map, by word.
        return invalid_argument(where.at(k.Mark()) + ": " + printable(child) +
                                ": a key is one word, not a dotted path; write it nested: " +
                                printable(nested_form(child)));
      }
      if (has_explicit_tag(k)) return refused_tag(child, k, where);
      if (find_config_key(child) == nullptr && !is_config_section(child)) {
        return unknown_key(path, word).with_context(where.at(k.Mark()));
      }
      auto [first, inserted] = seen.emplace(word, k.Mark());
      if (!inserted) {
        return invalid_argument(where.at(k.Mark()) + ": " + child + ": duplicate key (first at " +
                                where.at(first->second) + ")");
      }
      KVTIER_RETURN_IF_ERROR(apply_node(child, v, k.Mark(), where));
    }
    return ok_status();
  }

  static Status refused_tag(std::string_view path, const YAML::Node& node, const Where& where) {
    std::string message = where.at(node.Mark()) + ": ";
    if (!path.empty()) message += printable(path) + ": ";
    return invalid_argument(message + "the YAML tag " + printable(written_tag(node.Tag())) +
                            " is not accepted; write the value without a tag");
  }

  Config config_;
  std::map<std::string, std::string, std::less<>> origins_;
  bool record_origins_ = true;
};

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

Result<std::string> read_config_file(const std::string& path) {
  if (path.empty()) return invalid_argument("the configuration file name is empty");
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever if none comes.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int err = errno;
    const std::string message = path + ": cannot open: " + errno_text(err);
    return err == ENOENT ? not_found(message) : io_error(message);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error(path + ": cannot stat: " + errno_text(errno));
  // A directory is left to read(), which names it (EISDIR); a FIFO, socket or device is no file to
  // configure from (a FIFO or a terminal can block, a device can be endless).
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a file";
    return invalid_argument(path + ": not a regular file (" + kind +
                            "); a configuration is read from a regular file");
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  std::string text;
  char buf[16384];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": cannot read: " + errno_text(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigBytes) {
      return invalid_argument(path + ": larger than the " + std::to_string(kMaxConfigBytes) +
                              "-byte limit for a configuration");
    }
  }
  return text;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::string env_or_empty(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

// $KVTIER_CACHE_DIR without trailing slashes ("/" stays "/"), or the default.
std::string cache_dir_from(const Environment& env) {
  std::string dir = env_or_empty(env, "KVTIER_CACHE_DIR");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir.empty() ? std::string(kDefaultCacheDir) : dir;
}

}  // namespace

Result<Config> load_config(const ConfigSources& sources) {
  Environment env;
  if (sources.use_environment) {
    env = sources.environment ? *sources.environment : process_environment();
  }
  ConfigBuilder builder;
  KVTIER_RETURN_IF_ERROR(builder.apply_default());

  std::optional<std::string> file = sources.file;
  if (!file && !sources.text && !env_or_empty(env, "KVTIER_CONFIG_FILE").empty()) {
    file = env_or_empty(env, "KVTIER_CONFIG_FILE");
  }
  if (sources.file && sources.text) {
    return invalid_argument("a configuration comes from a file or from text, not both (file " +
                            *sources.file + ")");
  }
  if (sources.text) {
    if (sources.text->size() > kMaxConfigBytes) {
      return invalid_argument(sources.text_name + ": larger than the " +
                              std::to_string(kMaxConfigBytes) + "-byte limit for a configuration");
    }
    KVTIER_RETURN_IF_ERROR(builder.apply_document(*sources.text, sources.text_name));
  } else if (file) {
    auto text = read_config_file(*file);
    if (!text.ok()) return std::move(text).status();
    KVTIER_RETURN_IF_ERROR(builder.apply_document(*text, *file));
  }
  KVTIER_RETURN_IF_ERROR(builder.apply_environment(env));
  for (const std::string& assignment : sources.overrides) {
    KVTIER_RETURN_IF_ERROR(builder.apply_override(assignment));
  }
  KVTIER_RETURN_IF_ERROR(builder.expand_paths(cache_dir_from(env)));
  KVTIER_RETURN_IF_ERROR(builder.validate());
  return builder.take();
}

Result<Config> parse_config(std::string_view yaml_text, std::string_view source_name) {
  ConfigBuilder builder;
  KVTIER_RETURN_IF_ERROR(builder.apply_default());
  KVTIER_RETURN_IF_ERROR(builder.apply_document(yaml_text, source_name));
  KVTIER_RETURN_IF_ERROR(builder.expand_paths(kDefaultCacheDir));
  KVTIER_RETURN_IF_ERROR(builder.validate());
  return builder.take();
}

}  // namespace kvtier

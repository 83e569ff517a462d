#include "runtime/config_loader.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

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
      YAML::Node node;
      try {
        node = YAML::Load(std::string(value));
      } catch (const YAML::Exception& e) {
        return invalid_argument(where.name() + ": " + std::string(path) + ": value is not valid " +
                                "YAML (" + e.msg + "); quote it if it holds : # [ ] { } or ,");
      }
      return apply_node(path, node, YAML::Mark::null_mark(), where);
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

  Status apply_environment(const Environment& env) {
    for (const auto& [name, value] : env) {
      if (!std::string_view(name).starts_with(kEnvPrefix)) continue;
      if (name.find(kEnvSeparator) == std::string::npos) continue;
      std::string path;
      for (std::size_t i = kEnvPrefix.size(); i < name.size();) {
        if (std::string_view(name).substr(i).starts_with(kEnvSeparator)) {
          path += '.';
          i += kEnvSeparator.size();
        } else {
          const char c = name[i++];
          path += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
        }
      }
      const Where where = Where::label("environment " + printable(name) + "=" + printable(value));
      KVTIER_RETURN_IF_ERROR(apply_assignment(path, value, where));
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
      YAML::Node root;
      int documents = 0;
      YAML::Mark second_start;
      try {
        root = YAML::Load(std::string(text));
        // A second, bounded pass counts documents. Not YAML::LoadAll: yaml-cpp 0.7 never consumes
        // a ',' at document level and LoadAll then appends empty documents until memory runs out.
        std::istringstream in{std::string(text)};
        YAML::Parser parser(in);
        DocumentStarts starts;
        while (documents < 2 && parser.HandleNextDocument(starts)) ++documents;
        second_start = starts.last();
      } catch (const YAML::DeepRecursion& e) {
        return invalid_argument(where.at(e.mark) + ": malformed YAML: nested too deeply");
      } catch (const YAML::Exception& e) {
        return invalid_argument(where.at(e.mark) + ": malformed YAML: " + e.msg);
      }
      if (documents > 1) {
        return invalid_argument(where.at(second_start) +
                                ": a configuration is one YAML document; more follows here");
      }
      return apply_node("", root, root.Mark(), where);
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
  Status apply_node(std::string_view path, const YAML::Node& value, const YAML::Mark& key_mark,
                    const Where& where) {
    const YAML::Mark mark = value.IsNull() ? key_mark : value.Mark();
    if (const ConfigKey* key = find_config_key(path)) {
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
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    const std::string message = path + ": cannot open: " + errno_text(err);
    return err == ENOENT ? not_found(message) : io_error(message);
  }
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

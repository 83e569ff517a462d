#include "runtime/config_schema.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <limits>

#include "runtime/config_names.hpp"
#include "runtime/config_size.hpp"
#include "runtime/config_suggest.hpp"

namespace kvtier {
namespace {

constexpr std::string_view kCacheDirVariable = "${KVTIER_CACHE_DIR}";

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 80)) {
    // Keep messages on one line and printable whatever bytes a value holds.
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  if (s.size() > 80) out += "...";
  out += '"';
  return out;
}

// What a node is, for "expected X, got Y".
std::string describe_node(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar:
      return n.Tag() == "?" ? quote(n.Scalar()) : "the string " + quote(n.Scalar());
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "nothing";
}

Status expected(std::string_view what, const YAML::Node& n) {
  return invalid_argument("expected " + std::string(what) + ", got " + describe_node(n));
}

// A plain scalar: numbers and booleans must not be quoted or tagged, or "32" and 32 would be the
// same value in one place and different ones in another.
bool is_plain_scalar(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

Status read_string(const YAML::Node& n, std::string& out) {
  if (n.IsNull()) {
    out.clear();
    return ok_status();
  }
  if (!n.IsScalar()) return expected("a string", n);
  out = n.Scalar();
  return ok_status();
}

Result<uint64_t> parse_uint(const YAML::Node& n, uint64_t max, std::string_view what) {
  if (!is_plain_scalar(n)) return expected(what, n);
  const std::string& s = n.Scalar();
  if (!s.empty() && s.front() == '-') {
    return invalid_argument(quote(s) + " is negative; expected " + std::string(what));
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || end != s.data() + s.size()) return expected(what, n);
  if (ec == std::errc::result_out_of_range || v > max) {
    return invalid_argument(quote(s) + " is too large; the most is " + std::to_string(max));
  }
  if (ec != std::errc()) return expected(what, n);
  return v;
}

Status read_u32(const YAML::Node& n, uint32_t& out) {
  KVTIER_ASSIGN_OR_RETURN(const uint64_t v,
                          parse_uint(n, std::numeric_limits<uint32_t>::max(), "an integer >= 0"));
  out = static_cast<uint32_t>(v);
  return ok_status();
}

Status read_int(const YAML::Node& n, int& out) {
  KVTIER_ASSIGN_OR_RETURN(const uint64_t v,
                          parse_uint(n, std::numeric_limits<int>::max(), "an integer >= 0"));
  out = static_cast<int>(v);
  return ok_status();
}

Result<double> parse_number(const YAML::Node& n) {
  if (!is_plain_scalar(n)) return expected("a number", n);
  const std::string& s = n.Scalar();
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return expected("a number", n);
  if (!std::isfinite(v)) return invalid_argument(quote(s) + " is not a finite number");
  return v;
}

Status read_double(const YAML::Node& n, double& out) {
  KVTIER_ASSIGN_OR_RETURN(out, parse_number(n));
  return ok_status();
}

Status read_bool(const YAML::Node& n, bool& out) {
  if (is_plain_scalar(n)) {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
      out = true;
      return ok_status();
    }
    if (s == "false" || s == "False" || s == "FALSE") {
      out = false;
      return ok_status();
    }
    if (s == "yes" || s == "no" || s == "on" || s == "off" || s == "y" || s == "n") {
      return invalid_argument("expected true or false, got " + quote(s) +
                              " (YAML 1.1 words such as yes/no/on/off are not accepted)");
    }
  }
  return expected("true or false", n);
}

Status read_size(const YAML::Node& n, uint64_t& out) {
  if (!n.IsScalar()) return expected("a size such as 512MiB, 64GiB or 1.5TB", n);
  KVTIER_ASSIGN_OR_RETURN(out, parse_size(n.Scalar()));
  return ok_status();
}

template <typename E>
Status read_enum(const YAML::Node& n, E& out) {
  std::vector<std::string_view> names;
  for (const auto& s : enum_spellings<E>()) names.push_back(s.name);
  if (!n.IsScalar()) return expected("one of " + join_words(names), n);
  if (auto v = parse_enum<E>(n.Scalar())) {
    out = *v;
    return ok_status();
  }
  std::string message = "unknown value " + quote(n.Scalar());
  if (auto near = closest_match(n.Scalar(), names)) {
    message += "; did you mean " + quote(*near) + "?";
  }
  return invalid_argument(message + " (valid values: " + join_words(names) + ")");
}

// A list of scalars; a lone scalar is a list of one, so `--set tiers.nvme.paths=/mnt/a.kvs` works.
Status read_string_list(const YAML::Node& n, std::vector<std::string>& out) {
  std::vector<std::string> items;
  if (n.IsScalar()) {
    items.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (std::size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      if (!item.IsScalar()) {
        return invalid_argument("entry " + std::to_string(i) + ": expected a string, got " +
                                describe_node(item));
      }
      items.push_back(item.Scalar());
    }
  } else {
    return expected("a list of strings such as [/mnt/nvme0/kv.kvs]", n);
  }
  out = std::move(items);
  return ok_status();
}

Status read_number_list(const YAML::Node& n, std::vector<double>& out) {
  if (!n.IsSequence()) return expected("a list of numbers such as [0.001, 0.01, 0.1]", n);
  std::vector<double> items;
  for (std::size_t i = 0; i < n.size(); ++i) {
    auto v = parse_number(n[i]);
    if (!v.ok()) return v.status().with_context("entry " + std::to_string(i));
    items.push_back(*v);
  }
  out = std::move(items);
  return ok_status();
}

// `auto` or a node number.
Status read_numa(const YAML::Node& n, int& out) {
  if (n.IsScalar() && n.Scalar() == "auto") {
    out = -1;
    return ok_status();
  }
  if (!is_plain_scalar(n)) return expected("auto or a NUMA node number", n);
  auto v = parse_uint(n, std::numeric_limits<int>::max(), "auto or a NUMA node number");
  if (!v.ok()) return std::move(v).status();
  out = static_cast<int>(*v);
  return ok_status();
}

// host:port, or "" / off / nothing to disable metrics.
Status read_listen(const YAML::Node& n, std::string& out) {
  if (n.IsNull()) {
    out.clear();
    return ok_status();
  }
  if (!n.IsScalar()) return expected("host:port, or \"\" or off", n);
  out = n.Scalar() == "off" ? std::string() : n.Scalar();
  return ok_status();
}

// Rows in the order of configs/default.yaml. Each lambda names one field; the readers above do
// the rest.
const ConfigKey kKeys[] = {
    {"model.name", "string",
     [](Config& c, const YAML::Node& n) { return read_string(n, c.model.name); }},
    {"model.namespace", "string",
     [](Config& c, const YAML::Node& n) { return read_string(n, c.model.key_namespace); }},
    {"model.layers", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.model.geometry.layers); }},
    {"model.kv_heads", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.model.geometry.kv_heads); }},
    {"model.head_dim", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.model.geometry.head_dim); }},
    {"model.dtype", "f32|f16|bf16|fp8_e4m3",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.model.geometry.dtype); }},
    {"model.page_tokens", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.model.geometry.page_tokens); }},

    {"tiers.hbm.backend", "auto|cuda|emulated",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.tiers.hbm.backend); }},
    {"tiers.hbm.capacity", "size",
     [](Config& c, const YAML::Node& n) { return read_size(n, c.tiers.hbm.capacity_bytes); }},
    {"tiers.hbm.device", "integer",
     [](Config& c, const YAML::Node& n) { return read_int(n, c.tiers.hbm.device); }},
    {"tiers.hbm.watermarks.low", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.hbm.watermarks.low); }},
    {"tiers.hbm.watermarks.high", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.hbm.watermarks.high); }},
    {"tiers.hbm.link_gbps", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.hbm.link_gbps); }},

    {"tiers.host.capacity", "size",
     [](Config& c, const YAML::Node& n) { return read_size(n, c.tiers.host.capacity_bytes); }},
    {"tiers.host.numa", "auto|integer",
     [](Config& c, const YAML::Node& n) { return read_numa(n, c.tiers.host.numa_node); }},
    {"tiers.host.huge_pages", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.tiers.host.huge_pages); }},
    {"tiers.host.lock_memory", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.tiers.host.lock_memory); }},
    {"tiers.host.kv_dtype", "model|fp8_e4m3",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.tiers.host.kv_dtype); }},
    {"tiers.host.watermarks.low", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.host.watermarks.low); }},
    {"tiers.host.watermarks.high", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.host.watermarks.high); }},

    {"tiers.nvme.enabled", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.tiers.nvme.enabled); }},
    {"tiers.nvme.capacity", "size",
     [](Config& c, const YAML::Node& n) { return read_size(n, c.tiers.nvme.capacity_bytes); }},
    {"tiers.nvme.paths", "list of paths",
     [](Config& c, const YAML::Node& n) { return read_string_list(n, c.tiers.nvme.paths); }},
    {"tiers.nvme.queue_depth", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.tiers.nvme.queue_depth); }},
    {"tiers.nvme.io_threads", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.tiers.nvme.io_threads); }},
    {"tiers.nvme.direct_io", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.tiers.nvme.direct_io); }},
    {"tiers.nvme.sqpoll", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.tiers.nvme.sqpoll); }},
    {"tiers.nvme.checksum", "xxh3|crc32c",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.tiers.nvme.checksum); }},
    {"tiers.nvme.kv_dtype", "model|fp8_e4m3",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.tiers.nvme.kv_dtype); }},
    {"tiers.nvme.read_gbps", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.nvme.read_gbps); }},
    {"tiers.nvme.write_gbps", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.nvme.write_gbps); }},
    {"tiers.nvme.watermarks.low", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.nvme.watermarks.low); }},
    {"tiers.nvme.watermarks.high", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.tiers.nvme.watermarks.high); }},
    {"tiers.nvme.pause_after_failed_writes", "integer",
     [](Config& c, const YAML::Node& n) {
       return read_u32(n, c.tiers.nvme.pause_after_failed_writes);
     }},
    {"tiers.nvme.pause_after_failed_reads", "integer",
     [](Config& c, const YAML::Node& n) {
       return read_u32(n, c.tiers.nvme.pause_after_failed_reads);
     }},
    {"tiers.nvme.pause_ms", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.tiers.nvme.pause_ms); }},
    {"tiers.nvme.io_timeout_ms", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.tiers.nvme.io_timeout_ms); }},
    {"tiers.nvme.out_of_service_after_failures", "integer",
     [](Config& c, const YAML::Node& n) {
       return read_u32(n, c.tiers.nvme.out_of_service_after_failures);
     }},
    {"tiers.nvme.readmit_after_ms", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.tiers.nvme.readmit_after_ms); }},

    {"policies.eviction", "lru|lfu|s3fifo|prefix_aware|lookahead",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.policies.eviction); }},
    {"policies.write", "write_through|write_back|write_through_selective",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.policies.write); }},
    {"policies.write_selective_hits", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.policies.write_selective_hits); }},
    {"policies.admission.nvme_min_hits", "integer",
     [](Config& c,
        const YAML::Node& n) { return read_u32(n, c.policies.admission.nvme_min_hits); }},
    {"policies.prefetch.depth", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.policies.prefetch.depth); }},
    {"policies.prefetch.layerwise", "boolean",
     [](Config& c, const YAML::Node& n) { return read_bool(n, c.policies.prefetch.layerwise); }},
    {"policies.prefetch.layer_window", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.policies.prefetch.layer_window); }},
    {"policies.prefetch.deadline_ms", "integer",
     [](Config& c, const YAML::Node& n) { return read_u32(n, c.policies.prefetch.deadline_ms); }},
    {"policies.prefetch.on_late", "stall|recompute",
     [](Config& c, const YAML::Node& n) { return read_enum(n, c.policies.prefetch.on_late); }},
    {"policies.prefill_tokens_per_s", "number",
     [](Config& c,
        const YAML::Node& n) { return read_double(n, c.policies.prefill_tokens_per_s); }},
    {"policies.pin_quota", "number",
     [](Config& c, const YAML::Node& n) { return read_double(n, c.policies.pin_quota); }},

    {"metrics.listen", "host:port|off",
     [](Config& c, const YAML::Node& n) { return read_listen(n, c.metrics.listen); }},
    {"metrics.latency_buckets", "list of numbers",
     [](Config& c, const YAML::Node& n) { return read_number_list(n, c.metrics.latency_buckets); }},
};

}  // namespace

std::span<const ConfigKey> config_keys() { return kKeys; }

const ConfigKey* find_config_key(std::string_view path) {
  for (const ConfigKey& k : kKeys) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool is_config_section(std::string_view path) {
  if (path.empty()) return true;
  for (const ConfigKey& k : kKeys) {
    if (k.path.size() > path.size() && k.path.starts_with(path) && k.path[path.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string_view> config_children(std::string_view section) {
  std::vector<std::string_view> out;
  for (const ConfigKey& k : kKeys) {
    std::string_view rest = k.path;
    if (!section.empty()) {
      if (!(k.path.size() > section.size() && k.path.starts_with(section) &&
            k.path[section.size()] == '.')) {
        continue;
      }
      rest = k.path.substr(section.size() + 1);
    }
    const std::string_view word = rest.substr(0, rest.find('.'));
    bool seen = false;
    for (std::string_view w : out) seen = seen || w == word;
    if (!seen) out.push_back(word);
  }
  return out;
}

Result<std::string> expand_cache_dir(std::string_view path, std::string_view cache_dir) {
  std::string out;
  std::size_t i = 0;
  while (i < path.size()) {
    const std::size_t dollar = path.find("${", i);
    if (dollar == std::string_view::npos) {
      out += path.substr(i);
      break;
    }
    out += path.substr(i, dollar - i);
    if (path.substr(dollar).starts_with(kCacheDirVariable)) {
      out += cache_dir;
      i = dollar + kCacheDirVariable.size();
    } else {
      const std::size_t close = path.find('}', dollar);
      const std::string_view var = path.substr(
          dollar, close == std::string_view::npos ? std::string_view::npos : close - dollar + 1);
      return invalid_argument(quote(path) + ": " + quote(var) +
                              " is not expanded; only ${KVTIER_CACHE_DIR} is");
    }
  }
  return out;
}

}  // namespace kvtier

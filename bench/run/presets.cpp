// Presets: YAML -> GpuPreset / ModelPreset. See presets.hpp.
#include "bench/run/presets.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "runtime/config_size.hpp"
#include "runtime/config_suggest.hpp"

namespace kvtier::bench::run {
namespace {

constexpr std::string_view kGpuPresets[] = {"h100", "h200"};
constexpr std::string_view kModelPresets[] = {"llama-3.1-8b", "llama-3.1-70b"};

std::string where(std::string_view source, const YAML::Mark& mark) {
  std::string s(source);
  if (!mark.is_null()) {
    s += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
  return s;
}

// One typed field of a preset: its key path and how to store a scalar into the preset.
template <typename Preset>
struct Field {
  std::string_view path;  // "gpu.hbm"
  std::function<Status(Preset&, const std::string&)> set;
};

Status parse_number(const std::string& text, double* out) {
  std::istringstream in(text);
  double v = 0;
  in >> v;
  if (in.fail() || !in.eof()) return invalid_argument("\"" + text + "\" is not a number");
  if (!std::isfinite(v) || v < 0) {
    return invalid_argument("\"" + text + "\" must be a finite number >= 0");
  }
  *out = v;
  return ok_status();
}

template <typename Preset>
Field<Preset> number(std::string_view path, double Preset::*member) {
  return {path,
          [member](Preset& p, const std::string& t) { return parse_number(t, &(p.*member)); }};
}

template <typename Preset>
Field<Preset> fraction(std::string_view path, double Preset::*member) {
  return {path, [member](Preset& p, const std::string& t) {
            KVTIER_RETURN_IF_ERROR(parse_number(t, &(p.*member)));
            if (p.*member <= 0 || p.*member > 1) {
              return invalid_argument("\"" + t + "\" must be in (0, 1]");
            }
            return ok_status();
          }};
}

template <typename Preset>
Field<Preset> positive(std::string_view path, double Preset::*member) {
  return {path, [member](Preset& p, const std::string& t) {
            KVTIER_RETURN_IF_ERROR(parse_number(t, &(p.*member)));
            if (p.*member <= 0) return invalid_argument("\"" + t + "\" must be > 0");
            return ok_status();
          }};
}

template <typename Preset>
Field<Preset> size(std::string_view path, uint64_t Preset::*member) {
  return {path, [member](Preset& p, const std::string& t) -> Status {
            KVTIER_ASSIGN_OR_RETURN(p.*member, parse_size(t));
            return ok_status();
          }};
}

template <typename Preset>
Field<Preset> count(std::string_view path, uint32_t Preset::*member) {
  return {path, [member](Preset& p, const std::string& t) {
            double v = 0;
            KVTIER_RETURN_IF_ERROR(parse_number(t, &v));
            if (v < 1 || v > 1e9 || v != std::floor(v)) {
              return invalid_argument("\"" + t + "\" must be a whole number >= 1");
            }
            p.*member = static_cast<uint32_t>(v);
            return ok_status();
          }};
}

template <typename Preset>
Field<Preset> text(std::string_view path, std::string Preset::*member) {
  return {path, [member](Preset& p, const std::string& t) {
            if (t.empty()) return invalid_argument("must not be empty");
            p.*member = t;
            return ok_status();
          }};
}

// Walks the YAML mappings, assigning every leaf to its field; every field must be set once.
template <typename Preset>
Status apply_yaml(std::string_view yaml, std::string_view source,
                  const std::vector<Field<Preset>>& fields, Preset& out) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return invalid_argument(where(source, e.mark) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) return invalid_argument(std::string(source) + ": expected a mapping");
  std::map<std::string, bool, std::less<>> seen;
  std::vector<std::string_view> paths;
  for (const auto& f : fields) paths.push_back(f.path);
  std::function<Status(const YAML::Node&, const std::string&)> walk =
      [&](const YAML::Node& node, const std::string& prefix) -> Status {
    for (auto it = node.begin(); it != node.end(); ++it) {
      // Copies: the iterator yields a temporary pair, so references into it would dangle.
      const YAML::Node k = it->first;
      const YAML::Node value = it->second;
      if (!k.IsScalar()) {
        return invalid_argument(where(source, k.Mark()) + ": keys must be words");
      }
      const std::string key = k.Scalar();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (value.IsMap()) {
        KVTIER_RETURN_IF_ERROR(walk(value, path));
        continue;
      }
      auto f = std::find_if(fields.begin(), fields.end(),
                            [&](const Field<Preset>& x) { return x.path == path; });
      if (f == fields.end()) {
        std::string msg = where(source, k.Mark()) + ": unknown key " + path;
        if (auto near = closest_match(path, paths))
          msg += "; did you mean " + std::string(*near) + "?";
        return invalid_argument(msg);
      }
      if (!value.IsScalar()) {
        return invalid_argument(where(source, value.Mark()) + ": " + path + ": expected a value");
      }
      Status s = f->set(out, value.Scalar());
      if (!s.ok())
        return invalid_argument(where(source, value.Mark()) + ": " + path + ": " + s.message());
      seen[path] = true;
    }
    return ok_status();
  };
  try {
    KVTIER_RETURN_IF_ERROR(walk(root, ""));
  } catch (const YAML::Exception& e) {
    return invalid_argument(where(source, e.mark) + ": " + e.msg);
  }
  for (const auto& f : fields) {
    if (!seen.contains(f.path)) {
      return invalid_argument(std::string(source) + ": missing key " + std::string(f.path));
    }
  }
  return ok_status();
}

bool looks_like_path(std::string_view s) {
  return s.find('/') != std::string_view::npos ||
         (s.size() > 5 && s.substr(s.size() - 5) == ".yaml");
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open preset file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read preset file " + path);
  return ss.str();
}

template <typename Preset>
Result<Preset> load_preset(std::string_view name_or_path, std::span<const std::string_view> names,
                           std::string_view kind,
                           Result<Preset> (*parse)(std::string_view, std::string_view)) {
  if (looks_like_path(name_or_path)) {
    KVTIER_ASSIGN_OR_RETURN(std::string text, read_text(std::string(name_or_path)));
    return parse(text, name_or_path);
  }
  if (std::find(names.begin(), names.end(), name_or_path) != names.end()) {
    const std::string_view text = embedded_preset(name_or_path);
    if (!text.empty()) {
      return parse(text, "configs/bench/" + std::string(name_or_path) + ".yaml (embedded)");
    }
  }
  std::string msg = "no " + std::string(kind) + " preset named \"" + std::string(name_or_path) +
                    "\" (known: " + join_words(names) + "; or give a .yaml path)";
  if (auto near = closest_match(name_or_path, names)) {
    msg += "; did you mean " + std::string(*near) + "?";
  }
  return not_found(msg);
}

}  // namespace

std::vector<std::string> gpu_preset_names() {
  return {std::begin(kGpuPresets), std::end(kGpuPresets)};
}
std::vector<std::string> model_preset_names() {
  return {std::begin(kModelPresets), std::end(kModelPresets)};
}

Result<GpuPreset> parse_gpu_preset(std::string_view yaml, std::string_view source) {
  using G = GpuPreset;
  const std::vector<Field<G>> fields = {
      text("gpu.name", &G::name),
      size("gpu.hbm", &G::hbm_bytes),
      positive("gpu.hbm_bandwidth", &G::hbm_bandwidth),
      positive("gpu.bf16_flops", &G::bf16_flops),
      positive("gpu.fp8_flops", &G::fp8_flops),
      size("gpu.reserved", &G::reserved_bytes),
      positive("gpu.pcie_bandwidth", &G::pcie_bandwidth),
      number("gpu.pcie_latency_us", &G::pcie_latency_us),
      size("host.kv_capacity", &G::host_kv_bytes),
      size("nvme.capacity", &G::nvme_bytes),
      positive("nvme.read_bandwidth", &G::nvme_read_bandwidth),
      positive("nvme.write_bandwidth", &G::nvme_write_bandwidth),
      number("nvme.latency_us", &G::nvme_latency_us),
      fraction("efficiency.flops", &G::flops_efficiency),
      fraction("efficiency.hbm", &G::hbm_efficiency),
      fraction("efficiency.pcie", &G::pcie_efficiency),
      fraction("efficiency.nvme", &G::nvme_efficiency),
      number("efficiency.iteration_overhead_us", &G::iteration_overhead_us),
      count("engine.max_batched_tokens", &G::max_batched_tokens),
      count("engine.max_sequences", &G::max_sequences),
      count("engine.page_tokens", &G::page_tokens),
      count("engine.layer_group", &G::layer_group),
      count("engine.max_step_iterations", &G::max_step_iterations),
      fraction("engine.kv_admit_fraction", &G::kv_admit_fraction),
  };
  GpuPreset g;
  KVTIER_RETURN_IF_ERROR(apply_yaml(yaml, source, fields, g));
  g.source = std::string(source);
  if (g.reserved_bytes >= g.hbm_bytes) {
    return invalid_argument(std::string(source) + ": gpu.reserved (" +
                            format_size(g.reserved_bytes) + ") must be below gpu.hbm (" +
                            format_size(g.hbm_bytes) + ")");
  }
  return g;
}

Result<ModelPreset> parse_model_preset(std::string_view yaml, std::string_view source) {
  using M = ModelPreset;
  const std::vector<Field<M>> fields = {
      text("model.name", &M::name),
      positive("model.parameters", &M::parameters),
      count("model.layers", &M::layers),
      count("model.qo_heads", &M::qo_heads),
      count("model.kv_heads", &M::kv_heads),
      count("model.head_dim", &M::head_dim),
      {"model.kv_dtype",
       [](M& m, const std::string& t) {
         auto d = parse_dtype(t);
         if (!d) return invalid_argument("\"" + t + "\" is not a dtype (f32, f16, bf16, fp8_e4m3)");
         m.kv_dtype = *d;
         return ok_status();
       }},
      positive("model.weight_bytes", &M::weight_bytes),
      {"model.compute",
       [](M& m, const std::string& t) {
         if (t == "bf16") {
           m.compute = ComputeFormat::kBf16;
         } else if (t == "fp8") {
           m.compute = ComputeFormat::kFp8;
         } else {
           return invalid_argument("\"" + t + "\" is not a compute format (bf16, fp8)");
         }
         return ok_status();
       }},
  };
  ModelPreset m;
  KVTIER_RETURN_IF_ERROR(apply_yaml(yaml, source, fields, m));
  m.source = std::string(source);
  if (m.qo_heads % m.kv_heads != 0) {
    return invalid_argument(
        std::string(source) + ": model.qo_heads (" + std::to_string(m.qo_heads) +
        ") must be a multiple of model.kv_heads (" + std::to_string(m.kv_heads) + ")");
  }
  return m;
}

Result<GpuPreset> load_gpu_preset(std::string_view name_or_path) {
  return load_preset<GpuPreset>(name_or_path, kGpuPresets, "gpu", &parse_gpu_preset);
}

Result<ModelPreset> load_model_preset(std::string_view name_or_path) {
  return load_preset<ModelPreset>(name_or_path, kModelPresets, "model", &parse_model_preset);
}

}  // namespace kvtier::bench::run

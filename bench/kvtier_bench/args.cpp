#include "bench/kvtier_bench/args.hpp"

#include <charconv>
#include <cmath>

#include "runtime/config_size.hpp"
#include "runtime/config_suggest.hpp"

namespace kvtier::bench {
namespace {

// "--name=value" -> {"--name", "value"}; "--name" -> {"--name", nullopt}.
std::pair<std::string_view, std::optional<std::string_view>> split_equals(std::string_view arg) {
  const std::size_t eq = arg.find('=');
  if (eq == std::string_view::npos) return {arg, std::nullopt};
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

bool is_option(std::string_view arg) { return arg.size() > 1 && arg.front() == '-'; }

// The value of an option that takes one: after '=', else the next word.
Result<std::string> take_value(std::span<const std::string> args, std::size_t& i,
                               std::string_view name,
                               std::optional<std::string_view> inline_value) {
  if (inline_value) return std::string(*inline_value);
  if (i + 1 >= args.size())
    return invalid_argument("option " + std::string(name) + " needs a value");
  return args[++i];
}

constexpr std::string_view kCommonOptionNames[] = {"--config", "--set", "--help", "--version"};

}  // namespace

Result<SplitCommandLine> split_command_line(std::span<const std::string> args) {
  SplitCommandLine out;
  bool options_ended = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_ended) {
      if (!out.command) {
        out.command = arg;
      } else {
        out.command_args.push_back(arg);
      }
      continue;
    }
    if (arg == "--") {
      options_ended = true;
      if (out.command) out.command_args.push_back(arg);
      continue;
    }
    if (!is_option(arg)) {
      if (!out.command) {
        out.command = arg;
      } else {
        out.command_args.push_back(arg);
      }
      continue;
    }
    const auto [name, inline_value] = split_equals(arg);
    if (name == "--config") {
      KVTIER_ASSIGN_OR_RETURN(std::string v, take_value(args, i, name, inline_value));
      out.common.config_file = std::move(v);
    } else if (name == "--set") {
      KVTIER_ASSIGN_OR_RETURN(std::string v, take_value(args, i, name, inline_value));
      out.common.overrides.push_back(std::move(v));
    } else if ((name == "--help" || name == "-h") && !inline_value) {
      out.common.help = true;
    } else if (name == "--version" && !inline_value) {
      out.common.version = true;
    } else if (out.command) {
      out.command_args.push_back(arg);  // the command's own option; its parser judges it
    } else {
      std::string message = "unknown option " + std::string(name);
      if (auto near = closest_match(name, kCommonOptionNames)) {
        message += "; did you mean " + std::string(*near) + "?";
      }
      return invalid_argument(message + " (a command's own options go after the command name)");
    }
  }
  return out;
}

void OptionParser::add_flag(std::string name, std::string help, bool* out) {
  options_.push_back({"--" + name, "", std::move(help), Kind::kFlag, out});
}
void OptionParser::add_string(std::string name, std::string metavar, std::string help,
                              std::string* out) {
  options_.push_back({"--" + name, std::move(metavar), std::move(help), Kind::kString, out});
}
void OptionParser::add_uint(std::string name, std::string metavar, std::string help,
                            uint64_t* out) {
  options_.push_back({"--" + name, std::move(metavar), std::move(help), Kind::kUint, out});
}
void OptionParser::add_double(std::string name, std::string metavar, std::string help,
                              double* out) {
  options_.push_back({"--" + name, std::move(metavar), std::move(help), Kind::kDouble, out});
}
void OptionParser::add_size(std::string name, std::string metavar, std::string help,
                            uint64_t* out) {
  options_.push_back({"--" + name, std::move(metavar), std::move(help), Kind::kSize, out});
}
void OptionParser::allow_positionals(std::string metavar, std::string help,
                                     std::vector<std::string>* out) {
  positional_metavar_ = std::move(metavar);
  positional_help_ = std::move(help);
  positionals_ = out;
}

const OptionParser::Option* OptionParser::find(std::string_view name) const {
  for (const Option& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

Status OptionParser::assign(const Option& option, std::string_view value) {
  const std::string bad = option.name + " " + std::string(value) + ": ";
  switch (option.kind) {
    case Kind::kFlag: return internal_error(option.name + " takes no value");
    case Kind::kString: *static_cast<std::string*>(option.out) = std::string(value); break;
    case Kind::kUint: {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
        return invalid_argument(bad + "expected an integer >= 0");
      }
      *static_cast<uint64_t*>(option.out) = v;
      break;
    }
    case Kind::kDouble: {
      double v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() ||
          !std::isfinite(v)) {
        return invalid_argument(bad + "expected a number");
      }
      *static_cast<double*>(option.out) = v;
      break;
    }
    case Kind::kSize: {
      auto v = parse_size(value);
      if (!v.ok()) return v.status().with_context(option.name);
      *static_cast<uint64_t*>(option.out) = *v;
      break;
    }
  }
  return ok_status();
}

Status OptionParser::parse(std::span<const std::string> args) {
  bool options_ended = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!options_ended && arg == "--") {
      options_ended = true;
      continue;
    }
    if (options_ended || !is_option(arg)) {
      if (positionals_ == nullptr) {
        return invalid_argument("unexpected argument \"" + arg + "\" for " + program_);
      }
      positionals_->push_back(arg);
      continue;
    }
    const auto [name, inline_value] = split_equals(arg);
    const Option* option = find(name);
    if (option == nullptr) {
      std::vector<std::string_view> names;
      for (const Option& o : options_) names.push_back(o.name);
      for (std::string_view common : kCommonOptionNames) names.push_back(common);
      std::string message = "unknown option " + std::string(name) + " for " + program_;
      if (auto near = closest_match(name, names)) {
        message += "; did you mean " + std::string(*near) + "?";
      }
      return invalid_argument(message);
    }
    if (option->kind == Kind::kFlag) {
      if (inline_value) return invalid_argument(option->name + " takes no value");
      *static_cast<bool*>(option->out) = true;
      continue;
    }
    KVTIER_ASSIGN_OR_RETURN(std::string value, take_value(args, i, name, inline_value));
    KVTIER_RETURN_IF_ERROR(assign(*option, value));
  }
  return ok_status();
}

std::string OptionParser::options_help() const {
  std::string out;
  auto row = [&out](const std::string& left, const std::string& help) {
    std::string line = "  " + left;
    if (line.size() < 26) {
      line.resize(26, ' ');
    } else {
      line += "  ";
    }
    out += line + help + "\n";
  };
  for (const Option& o : options_) {
    row(o.metavar.empty() ? o.name : o.name + " " + o.metavar, o.help);
  }
  if (positional_metavar_) row(*positional_metavar_, positional_help_);
  return out;
}

std::string OptionParser::usage_suffix() const {
  std::string out;
  if (!options_.empty()) out += " [options]";
  if (positional_metavar_) out += " " + *positional_metavar_ + "...";
  return out;
}

}  // namespace kvtier::bench

// kvtier-bench: one program, many subcommands (command_list.inc). This file is the frame: common
// options, configuration loading, dispatch, exit codes (0 ok, 1 the run failed, 2 bad usage or bad
// configuration). Help and errors never need a valid configuration, and a configuration error is
// reported before a command starts any work.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench/kvtier_bench/args.hpp"
#include "bench/kvtier_bench/command.hpp"
#include "kvtier/version.hpp"
#include "runtime/config_loader.hpp"
#include "runtime/config_suggest.hpp"

namespace kvtier::bench {
namespace {

using CommandFactory = std::unique_ptr<Command> (*)();

const CommandFactory kCommands[] = {
#define KVTIER_BENCH_COMMAND(name) &make_##name##_command,
#include "bench/kvtier_bench/command_list.inc"
#undef KVTIER_BENCH_COMMAND
};

constexpr std::string_view kCommonHelp =
    "  --config PATH             YAML configuration over the embedded default\n"
    "                            (default: $KVTIER_CONFIG_FILE, else the embedded default)\n"
    "  --set KEY=VALUE           override one key, e.g. --set tiers.host.capacity=8GiB\n"
    "                            (repeatable; later wins; beats KVTIER_<SECTION>__<KEY> "
    "variables)\n"
    "  -h, --help                this help\n"
    "  --version                 print the kvtier version\n";

void print_main_help(std::ostream& os) {
  os << "usage: kvtier-bench [--config PATH] [--set KEY=VALUE]... <command> [options]\n\n"
        "kvtier's command-line tool: checks, benchmarks and trace replays of the tiered KV "
        "cache.\n\ncommands:\n";
  for (CommandFactory make : kCommands) {
    const auto cmd = make();
    std::string name(cmd->name());
    name.resize(std::max<std::size_t>(name.size(), 10), ' ');
    os << "  " << name << "  " << cmd->summary() << "\n";
  }
  os << "\ncommon options (before or after the command):\n"
     << kCommonHelp << "\n`kvtier-bench <command> --help` describes a command. Exit codes: 0 ok, "
     << "1 the run failed, 2 bad usage or configuration.\n";
}

void print_command_help(std::ostream& os, const Command& cmd, const OptionParser& parser) {
  os << "usage: kvtier-bench " << cmd.name() << parser.usage_suffix()
     << " [--config PATH] [--set KEY=VALUE]...\n\n"
     << cmd.description() << "\n";
  const std::string own = parser.options_help();
  if (!own.empty()) os << "\noptions:\n" << own;
  os << "\ncommon options:\n" << kCommonHelp;
}

std::string config_source(const CommonOptions& common) {
  std::string source;
  if (common.config_file) {
    source = *common.config_file;
  } else if (const char* env = std::getenv("KVTIER_CONFIG_FILE"); env != nullptr && *env) {
    source = std::string(env) + " (KVTIER_CONFIG_FILE)";
  } else {
    source = "embedded default";
  }
  if (!common.overrides.empty()) {
    source += " with " + std::to_string(common.overrides.size()) +
              (common.overrides.size() == 1 ? " override" : " overrides");
  }
  return source;
}

int usage_error(const std::string& message, std::string_view command) {
  std::cerr << "kvtier-bench: " << message << "\n"
            << "try `kvtier-bench " << (command.empty() ? "" : std::string(command) + " ")
            << "--help`\n";
  return kExitUsage;
}

int run_main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto split = split_command_line(args);
  if (!split.ok()) return usage_error(split.status().message(), "");
  const SplitCommandLine& line = *split;

  if (line.common.version) {
    std::cout << "kvtier-bench " << version() << "\n";
    return kExitOk;
  }
  if (!line.command) {
    if (line.common.help) {
      print_main_help(std::cout);
      return kExitOk;
    }
    print_main_help(std::cerr);
    return kExitUsage;
  }

  std::unique_ptr<Command> command;
  std::vector<std::string_view> names;
  std::vector<std::unique_ptr<Command>> all;
  for (CommandFactory make : kCommands) {
    all.push_back(make());
    names.push_back(all.back()->name());
    if (all.back()->name() == *line.command) command = std::move(all.back());
  }
  if (!command) {
    std::string message = "unknown command \"" + *line.command + "\"";
    if (auto near = closest_match(*line.command, names)) {
      message += "; did you mean \"" + std::string(*near) + "\"?";
    }
    return usage_error(message + " (commands: " + join_words(names) + ")", "");
  }

  OptionParser parser("kvtier-bench " + std::string(command->name()));
  command->add_options(parser);
  if (line.common.help) {
    print_command_help(std::cout, *command, parser);
    return kExitOk;
  }
  Status parsed = parser.parse(line.command_args);
  if (!parsed.ok()) return usage_error(parsed.message(), command->name());

  ConfigSources sources;
  sources.file = line.common.config_file;
  sources.overrides = line.common.overrides;
  auto config = load_config(sources);
  if (!config.ok()) {
    std::cerr << "kvtier-bench: configuration error: " << config.status().message() << "\n";
    return kExitUsage;
  }
  const CommandContext context{*config, config_source(line.common), std::cout, std::cerr};
  return command->run(context);
}

}  // namespace
}  // namespace kvtier::bench

// Commands report errors as Status; an exception escaping one (std::bad_alloc from a request
// too large for this machine) still ends in a message and exit code 1, never an abort.
int main(int argc, char** argv) {
  try {
    return kvtier::bench::run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "kvtier-bench: out of memory (std::bad_alloc); ask for less\n";
  } catch (const std::exception& e) {
    std::cerr << "kvtier-bench: " << e.what() << "\n";
  }
  return kvtier::bench::kExitFailure;
}

// A kvtier-bench subcommand, and the table that lists them all.
//
// The frame (main.cpp) parses common options, loads and validates the configuration (embedded
// default < --config or $KVTIER_CONFIG_FILE < KVTIER_<A>__<B> variables < --set), then runs the
// command with it. A command declares its own options on an OptionParser bound to its members,
// writes results to `out` (stdout: the table, or JSON) and progress and problems to `err`
// (stderr), and returns an exit code from args.hpp: 0 ok, 1 the run failed, 2 bad usage.
//
// Adding a command: a file cmd_<name>.cpp defining `std::unique_ptr<Command>
// make_<name>_command()`, one line `KVTIER_BENCH_COMMAND(<name>)` in command_list.inc, and the file
// in bench/CMakeLists.txt. Commands run on the main thread, one per process.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

#include "bench/kvtier_bench/args.hpp"
#include "kvtier/config.hpp"

namespace kvtier::bench {

struct CommandContext {
  const Config& config;
  std::string config_source;  // where the config came from, for the report's header
  std::ostream& out;
  std::ostream& err;
};

class Command {
 public:
  virtual ~Command() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;  // one line, for `kvtier-bench --help`
  // Longer text for `kvtier-bench <name> --help`, printed after the usage line.
  virtual std::string_view description() const { return summary(); }
  virtual void add_options(OptionParser& parser) {}
  virtual int run(const CommandContext& context) = 0;
};

#define KVTIER_BENCH_COMMAND(name) std::unique_ptr<Command> make_##name##_command();
#include "bench/kvtier_bench/command_list.inc"
#undef KVTIER_BENCH_COMMAND

}  // namespace kvtier::bench

// Command-line parsing for kvtier-bench: the options every subcommand shares, and a small
// declarative parser for each subcommand's own options.
//
// Shape of a command line: `kvtier-bench [common...] <command> [common or command options...]`.
// Common options (--config PATH, --set key=value repeatable, --help, --version) may stand before or
// after the command name; a command's own options go after its name, so the frame can find the
// name without knowing every command's options. Both `--opt value` and `--opt=value` work; `--`
// ends option parsing. Anything unknown is an error that names it (with a "did you mean"); the
// caller turns parse errors into exit code 2. Plain data, single-threaded use.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"

namespace kvtier::bench {

// The process exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the run itself failed
inline constexpr int kExitUsage = 2;    // bad command line or bad configuration

struct CommonOptions {
  std::optional<std::string> config_file;  // --config
  std::vector<std::string> overrides;      // --set, in order
  bool help = false;
  bool version = false;
};

struct SplitCommandLine {
  CommonOptions common;
  std::optional<std::string> command;     // the first word that is not an option
  std::vector<std::string> command_args;  // what follows the command, common options removed
};

// Separates common options from the command and its arguments. Errors name the offending word.
Result<SplitCommandLine> split_command_line(std::span<const std::string> args);

// A subcommand's own options, declared once and used both to parse and to print --help.
class OptionParser {
 public:
  explicit OptionParser(std::string program) : program_(std::move(program)) {}

  void add_flag(std::string name, std::string help, bool* out);
  void add_string(std::string name, std::string metavar, std::string help, std::string* out);
  void add_uint(std::string name, std::string metavar, std::string help, uint64_t* out);
  void add_double(std::string name, std::string metavar, std::string help, double* out);
  void add_size(std::string name, std::string metavar, std::string help, uint64_t* out);
  // Without this, a word that is not an option is an error.
  void allow_positionals(std::string metavar, std::string help, std::vector<std::string>* out);

  Status parse(std::span<const std::string> args);

  // "  --json            print JSON instead of a table" lines, one per option.
  std::string options_help() const;
  // " [options] FILE..." — what follows the program name in a usage line.
  std::string usage_suffix() const;

 private:
  enum class Kind { kFlag, kString, kUint, kDouble, kSize };
  struct Option {
    std::string name;  // with the leading "--"
    std::string metavar;
    std::string help;
    Kind kind;
    void* out;
  };
  Status assign(const Option& option, std::string_view value);
  const Option* find(std::string_view name) const;

  std::string program_;
  std::vector<Option> options_;
  std::optional<std::string> positional_metavar_;
  std::string positional_help_;
  std::vector<std::string>* positionals_ = nullptr;
};

}  // namespace kvtier::bench

// Running a helper program (gnuplot for `run --plot`, fio for `io`) without a shell.
//
// The program is started with posix_spawnp and an argument vector, so no argument is ever parsed
// by a shell: a file name with a quote, a space or a `;` is passed as it is. Its standard input is
// `input`, its standard output is captured or sent to /dev/null (never this process's stdout,
// which carries the tool's JSON), and its standard error is captured for the error message.
// Rejected: popen — it goes through /bin/sh (quoting bugs, injection) and shares our stdout.
// Input and outputs go through anonymous in-memory files (memfd), not pipes, so neither side can
// block on a full pipe and no SIGPIPE can reach this process; helpers' outputs are small.
// Blocking; callable from any thread (the spawned process gets only fds 0, 1 and 2).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.hpp"

namespace kvtier::bench::run {

struct ProgramResult {
  int exit_code = -1;  // WEXITSTATUS, or -1 when killed by a signal
  int signal = 0;      // the signal that killed it, or 0
  std::string out;     // stdout, when captured
  std::string err;     // stderr

  bool ok() const { return exit_code == 0; }
  // "exit status 1" / "killed by signal 9", then up to `limit` characters of stderr.
  std::string describe(std::size_t limit = 2000) const;
};

// Runs argv[0], looked up on $PATH. kNotFound when it is not installed (no such executable),
// kUnavailable when it cannot be started; a program that runs and fails is an ok Result whose
// exit_code says so.
Result<ProgramResult> run_program(const std::vector<std::string>& argv, std::string_view input,
                                  bool capture_stdout);

// True when `name` is an executable file in a directory of $PATH.
bool program_on_path(std::string_view name);

}  // namespace kvtier::bench::run

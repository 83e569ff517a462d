// Runs a program as a child process the way a user or a script meets it, for tests of command-line
// tools: stdout and stderr captured in full (through files, so a chatty child never blocks on a
// pipe), an environment without KVTIER_* variables unless the test sets them, and optional limits
// (working directory, address space, a timeout by SIGALRM so a hang fails instead of blocking
// ctest). A child that dies by a signal, or cannot be executed, is a test failure.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <system_error>
#include <vector>

extern "C" char** environ;

namespace kvtier::testing {

struct ChildOptions {
  std::map<std::string, std::string> env;  // added to (or replacing in) the environment
  std::string cwd;                         // "" = this process's
  uint64_t address_space = 0;              // RLIMIT_AS of the child, 0 = unlimited
  unsigned timeout_s = 120;                // SIGALRM
};

struct ChildRun {
  int exit_code = -1;
  int signal = 0;
  std::string out;
  std::string err;
};

namespace child_detail {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every string's buffer, then a null: what execve takes.
inline std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace child_detail

inline ChildRun run_child(const std::string& program, const std::vector<std::string>& args,
                          const ChildOptions& o = {}) {
  namespace fs = std::filesystem;
  std::string dir = (fs::path(::testing::TempDir()) / "kvtier_child_XXXXXX").string();
  ChildRun run;
  EXPECT_NE(::mkdtemp(dir.data()), nullptr) << dir;
  const std::string out_path = (fs::path(dir) / "out").string();
  const std::string err_path = (fs::path(dir) / "err").string();

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("KVTIER_", 0) == 0) continue;
    if (o.env.count(kv.substr(0, kv.find('='))) != 0) continue;
    env_strings.push_back(kv);
  }
  for (const auto& [k, v] : o.env) env_strings.push_back(k + "=" + v);
  std::vector<std::string> argv_strings = {program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> envp = child_detail::c_strings(env_strings);
  std::vector<char*> argv = child_detail::c_strings(argv_strings);

  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) ::_exit(126);
    if (o.address_space > 0) {
      const rlimit rl{o.address_space, o.address_space};
      if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(126);
    }
    ::alarm(o.timeout_s);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  EXPECT_GT(pid, 0) << "fork failed";
  if (pid > 0) {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    run.out = child_detail::read_file(out_path);
    run.err = child_detail::read_file(err_path);
    EXPECT_EQ(run.signal, 0) << program << " was killed by signal " << run.signal
                             << (run.signal == SIGALRM ? " (timed out)" : "") << "; stderr:\n"
                             << run.err;
    EXPECT_NE(run.exit_code, 127) << "could not execute " << program;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return run;
}

}  // namespace kvtier::testing

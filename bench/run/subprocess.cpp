// Helper programs without a shell. See subprocess.hpp.
#include "bench/run/subprocess.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

extern "C" char** environ;

namespace kvtier::bench::run {
namespace {

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(int e) { return std::strerror(e); }

Status write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error("writing a helper program's input: " + errno_text(errno));
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return ok_status();
}

std::string read_all(int fd) {
  std::string out;
  char buf[8192];
  off_t at = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  return out;
}

class SpawnActions {
 public:
  SpawnActions() { ok_ = ::posix_spawn_file_actions_init(&actions_) == 0; }
  ~SpawnActions() {
    if (ok_) ::posix_spawn_file_actions_destroy(&actions_);
  }
  SpawnActions(const SpawnActions&) = delete;
  SpawnActions& operator=(const SpawnActions&) = delete;
  bool ok() const { return ok_; }
  posix_spawn_file_actions_t* get() { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
  bool ok_ = false;
};

}  // namespace

std::string ProgramResult::describe(std::size_t limit) const {
  std::string s = signal != 0 ? "killed by signal " + std::to_string(signal)
                              : "exit status " + std::to_string(exit_code);
  std::string text = err;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.size() > limit) text = text.substr(0, limit) + " ...";
  if (!text.empty()) s += ": " + text;
  return s;
}

bool program_on_path(std::string_view name) {
  if (name.find('/') != std::string_view::npos) {
    return ::access(std::string(name).c_str(), X_OK) == 0;
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    dirs.remove_prefix(colon + 1);
  }
}

Result<ProgramResult> run_program(const std::vector<std::string>& argv, std::string_view input,
                                  bool capture_stdout) {
  if (argv.empty()) return invalid_argument("run_program: no program");
  const std::string& program = argv.front();
  if (!program_on_path(program)) return not_found(program + " is not installed (not on $PATH)");

  const ScopedFd in(::memfd_create("kvtier-helper-stdin", MFD_CLOEXEC));
  const ScopedFd out(::memfd_create("kvtier-helper-stdout", MFD_CLOEXEC));
  const ScopedFd err(::memfd_create("kvtier-helper-stderr", MFD_CLOEXEC));
  if (in.get() < 0 || out.get() < 0 || err.get() < 0) {
    return unavailable("cannot start " + program + ": memfd_create: " + errno_text(errno));
  }
  KVTIER_RETURN_IF_ERROR(write_all(in.get(), input));
  if (::lseek(in.get(), 0, SEEK_SET) != 0) {
    return unavailable("cannot start " + program + ": lseek: " + errno_text(errno));
  }

  SpawnActions actions;
  if (!actions.ok() || ::posix_spawn_file_actions_adddup2(actions.get(), in.get(), 0) != 0 ||
      (capture_stdout
           ? ::posix_spawn_file_actions_adddup2(actions.get(), out.get(), 1)
           : ::posix_spawn_file_actions_addopen(actions.get(), 1, "/dev/null", O_WRONLY, 0)) != 0 ||
      ::posix_spawn_file_actions_adddup2(actions.get(), err.get(), 2) != 0) {
    return unavailable("cannot start " + program + ": posix_spawn_file_actions failed");
  }
  std::vector<char*> args;
  std::vector<std::string> copies = argv;
  for (std::string& a : copies) args.push_back(a.data());
  args.push_back(nullptr);

  pid_t pid = -1;
  const int rc =
      ::posix_spawnp(&pid, program.c_str(), actions.get(), nullptr, args.data(), environ);
  if (rc == ENOENT) return not_found(program + " is not installed (not on $PATH)");
  if (rc != 0) return unavailable("cannot start " + program + ": " + errno_text(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return unavailable("waiting for " + program + ": " + errno_text(errno));
  }
  ProgramResult r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  if (capture_stdout) r.out = read_all(out.get());
  r.err = read_all(err.get());
  return r;
}

}  // namespace kvtier::bench::run

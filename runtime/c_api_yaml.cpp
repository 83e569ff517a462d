// YAML text + overrides -> Config through the file loader. See runtime/c_api_yaml.hpp.
#include "runtime/c_api_yaml.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/config_loader.hpp"

namespace kvtier {
namespace {

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

}  // namespace

Result<Config> load_yaml_text(std::string_view text, std::vector<std::string> overrides,
                              bool use_environment) {
  if (text.size() > kMaxConfigBytes) {
    return invalid_argument(std::string(kYamlTextName) + ": larger than the " +
                            std::to_string(kMaxConfigBytes) + "-byte limit for a configuration");
  }
  ScopedFd fd(::memfd_create("kvtier-yaml", MFD_CLOEXEC));
  if (fd.get() < 0) return io_error("memfd_create for the YAML text: " + errno_text(errno));
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("writing the YAML text to its memfd: " + errno_text(errno));
    }
    written += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd.get());
  ConfigSources sources;
  sources.file = path;
  sources.overrides = std::move(overrides);
  sources.use_environment = use_environment;
  auto config = load_config(sources);
  if (config.ok()) return config;
  std::string message = config.status().message();
  for (std::size_t at = message.find(path); at != std::string::npos;
       at = message.find(path, at + kYamlTextName.size())) {
    message.replace(at, path.size(), kYamlTextName);
  }
  return Status(config.status().code(), std::move(message));
}

}  // namespace kvtier

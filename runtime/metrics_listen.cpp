#include "runtime/metrics_listen.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tiers/scoped_fd.hpp"

namespace kvtier {
namespace {

Status bad_listen(std::string_view listen, std::string_view why) {
  return invalid_argument("metrics.listen \"" + std::string(listen) + "\": " + std::string(why) +
                          "; write host:port (e.g. 127.0.0.1:9464 or [::1]:9464)");
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

// The port a socket of `family` is bound to, or -1 when it is not such a socket.
int bound_port(int fd, int family) {
  sockaddr_storage address{};
  socklen_t len = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) return -1;
  if (address.ss_family != family) return -1;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return -1;
}

}  // namespace

Result<ListenAddress> parse_listen_address(std::string_view listen) {
  std::string_view host;
  std::string_view port;
  if (!listen.empty() && listen.front() == '[') {
    const std::size_t close = listen.find("]:");
    if (close == std::string_view::npos) return bad_listen(listen, "no \"]:port\" after [host");
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const std::size_t colon = listen.rfind(':');
    if (colon == std::string_view::npos) return bad_listen(listen, "no port");
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad_listen(listen, "an IPv6 host must be in brackets");
    }
  }
  if (host.empty()) return bad_listen(listen, "no host");
  if (port.empty() || port.size() > 5) return bad_listen(listen, "the port is not 0..65535");
  uint32_t value = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') return bad_listen(listen, "the port is not a number");
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return bad_listen(listen, "the port is above 65535");
  return ListenAddress{std::string(host), static_cast<uint16_t>(value)};
}

Result<ResolvedListen> resolve_listen_address(const ListenAddress& listen) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  // A host of digits and dots is an IPv4 literal (valid or not) and one with a colon an IPv6
  // literal: never send either to DNS, where a bad literal would only time out.
  if (listen.host.find_first_not_of("0123456789.") == std::string::npos ||
      listen.host.find(':') != std::string::npos) {
    hints.ai_flags |= AI_NUMERICHOST;
  }
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(listen.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return invalid_argument("metrics.listen host \"" + listen.host +
                            "\" does not resolve: " + ::gai_strerror(rc));
  }
  ResolvedListen out;
  std::memcpy(&out.address, found->ai_addr, found->ai_addrlen);
  out.address_len = found->ai_addrlen;
  ::freeaddrinfo(found);

  char text[INET6_ADDRSTRLEN] = {};
  const std::string port = std::to_string(listen.port);
  if (out.address.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&out.address);
    v4->sin_port = htons(listen.port);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    out.server_spec = std::string(text) + ":" + port;
  } else if (out.address.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.address);
    v6->sin6_port = htons(listen.port);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    out.server_spec = "[" + std::string(text) + "]:" + port;
  } else {
    return invalid_argument("metrics.listen host \"" + listen.host +
                            "\" resolves to neither an IPv4 nor an IPv6 address");
  }
  return out;
}

std::string bind_error(const ResolvedListen& listen) {
  const ScopedFd fd(::socket(listen.address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return "socket: " + errno_text(errno);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&listen.address), listen.address_len) !=
      0) {
    return errno_text(errno);
  }
  return {};
}

bool is_listening_on(int fd, int family, uint16_t port) {
  int accepting = 0;
  socklen_t len = sizeof accepting;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting == 0) {
    return false;
  }
  return bound_port(fd, family) == port;
}

int find_listening_socket(int family, uint16_t port) {
  const std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc/self/fd"), &::closedir);
  if (!dir) return -1;
  const int dir_fd = ::dirfd(dir.get());
  while (const dirent* entry = ::readdir(dir.get())) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd != dir_fd && is_listening_on(fd, family, port)) return fd;
  }
  return -1;
}

}  // namespace kvtier

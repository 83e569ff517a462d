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

// Whether two socket addresses are the same IPv4 or IPv6 address and port (and IPv6 scope). The
// port alone is not enough: another socket of this process may listen on the same port of another
// address (127.0.0.2:P next to 127.0.0.1:P).
bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && x.sin6_scope_id == y.sin6_scope_id &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

}  // namespace

std::string listen_address_problem(std::string_view listen, ListenAddress* parsed) {
  std::string_view host;
  std::string_view port;
  if (!listen.empty() && listen.front() == '[') {
    const std::size_t close = listen.find("]:");
    if (close == std::string_view::npos) return "no \"]:port\" after [host";
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const std::size_t colon = listen.rfind(':');
    if (colon == std::string_view::npos) return "no port";
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return "an IPv6 host must be in brackets";
  }
  if (host.empty()) return "no host";
  if (port.empty() || port.size() > 5) return "the port is not 0..65535";
  uint32_t value = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') return "the port is not a number";
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return "the port is above 65535";
  if (parsed != nullptr) *parsed = ListenAddress{std::string(host), static_cast<uint16_t>(value)};
  return {};
}

Result<ListenAddress> parse_listen_address(std::string_view listen) {
  ListenAddress parsed;
  const std::string why = listen_address_problem(listen, &parsed);
  if (!why.empty()) return bad_listen(listen, why);
  return parsed;
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

sockaddr_storage with_port(const sockaddr_storage& address, uint16_t port) {
  sockaddr_storage out = address;
  if (out.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(out).sin_port = htons(port);
  if (out.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(out).sin6_port = htons(port);
  return out;
}

bool is_listening_on(int fd, const sockaddr_storage& address) {
  int accepting = 0;
  socklen_t len = sizeof accepting;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting == 0) {
    return false;
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) return false;
  return same_address(bound, address);
}

int find_listening_socket(const sockaddr_storage& address) {
  const std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc/self/fd"), &::closedir);
  if (!dir) return -1;
  const int dir_fd = ::dirfd(dir.get());
  while (const dirent* entry = ::readdir(dir.get())) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd != dir_fd && is_listening_on(fd, address)) return fd;
  }
  return -1;
}

}  // namespace kvtier

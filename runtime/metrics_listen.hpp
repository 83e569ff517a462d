// Listen addresses of the metrics endpoint: "host:port" from metrics.listen, checked and resolved
// here before the HTTP server sees them.
//
// The embedded HTTP server (civetweb, under prometheus-cpp's Exposer) reads its own mini-language
// in the port string ("8080s" = TLS, "a,b" = two ports, "+8080" = dual stack) and accepts some
// malformed IPv4 literals by binding somewhere else, so the runtime resolves the host itself
// (numeric literals, then names through the resolver, e.g. "localhost") and hands the server only
// "a.b.c.d:port" or "[v6]:port". Port 0 asks the kernel for a free port. When the server still
// cannot listen, `bind_error` binds the same address itself to name the errno (the server reports
// only that it failed).
//
// Stopping: the server's accept thread polls its listening socket with a 2 s quantum (the Debian
// build of civetweb), so a stop waits up to 2 s for that poll to return. Shutting the listening
// socket down first ends the poll at once (and refuses new connections), so the exporter finds the
// server's listening socket after start (`find_listening_socket`) and shuts it down just before
// stopping the server. Rejected: waking the poll with a connection of our own (the server queues it
// and never closes it once stopping, leaking a descriptor per stop).
//
// All functions are safe from any thread.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.hpp"

namespace kvtier {

struct ListenAddress {
  std::string host;  // as written, without IPv6 brackets
  uint16_t port = 0;
};

struct ResolvedListen {
  std::string server_spec;  // "127.0.0.1:9464" or "[::1]:9464", for the HTTP server
  sockaddr_storage address{};
  socklen_t address_len = 0;
};

// "host:port" or "[v6]:port", port 0..65535 in digits. kInvalidArgument naming the text otherwise.
Result<ListenAddress> parse_listen_address(std::string_view listen);

// The same rules, for the config validator: why `listen` is not such an address ("an IPv6 host
// must be in brackets"), or "" when it is one (then stored in `parsed` unless that is null). One
// parser for both, so a metrics.listen that validates is one the exporter can listen on.
std::string listen_address_problem(std::string_view listen, ListenAddress* parsed = nullptr);

// The first address `host` resolves to (IPv4 preferred, as the resolver orders them).
// kInvalidArgument naming the host and the resolver's message when it resolves to nothing.
Result<ResolvedListen> resolve_listen_address(const ListenAddress& listen);

// Why binding `listen` fails right now ("Address already in use (errno 98)"), or "" when a bind
// with the HTTP server's options (SO_REUSEADDR) would succeed.
std::string bind_error(const ResolvedListen& listen);

// `address` (IPv4 or IPv6) with its port set to `port` (e.g. the one the kernel chose for port 0).
sockaddr_storage with_port(const sockaddr_storage& address, uint16_t port);

// The descriptor of this process's listening socket bound to exactly `address` (family, IP address
// and port, as getsockname reports them), or -1 when there is none (scans /proc/self/fd). Another
// socket on the same port of a different address is not it.
int find_listening_socket(const sockaddr_storage& address);

// Whether `fd` is a listening socket bound to exactly `address` (re-checked before acting on a
// descriptor found earlier).
bool is_listening_on(int fd, const sockaddr_storage& address);

}  // namespace kvtier

// MetricsExporter: the Prometheus endpoint a Runtime owns — a MetricsCollector (families built from
// kvtier's counters at scrape time) served over HTTP on `metrics.listen` by prometheus-cpp's pull
// exposer. GET of exactly /metrics (any query) is the scrape; HEAD /metrics answers its headers;
// another method is a 405 and another path a 404 (routed in civetweb's begin_request callback,
// ahead of the exposer's prefix match).
//
// Failure model: metrics never take the runtime down. Invalid latency buckets are a Status from
// create() (a config error the embedder must fix). A listen address that cannot be served — a
// port already in use, a host that does not resolve, an address not on this machine — is ONE
// error log line naming the address and the errno, and the exporter runs without HTTP: collection
// and scrape_text() keep working, serving() is false. prometheus-cpp reports bind failures by
// throwing from its constructor; the exception stops here. Empty `listen` means metrics off (no
// server, no log line). Port 0 binds a free port; port() tells which.
//
// Threading: the HTTP server runs its own threads (eight workers; a client that has not sent a
// whole request within 2 s is dropped, see metrics_exporter.cpp); each scrape calls Collect() on
// one of them. The destructor stops the server first — waiting for a scrape in progress — so the
// sources (metrics_sources.hpp) only need to outlive the exporter. The runtime creates it after
// the scheduler and the tier stack and destroys it before them. Nothing else is locked or shared.
//
// Rejected: registering prometheus::Counter objects in a Registry (the hot path would write
// doubles through the library, see metrics_collector.hpp); a hand-written HTTP server (the
// exposer already parses HTTP, compresses when asked and serves concurrent scrapes); throwing or
// failing create() on a busy port (a monitoring port must not decide whether an engine serves
// traffic).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/config.hpp"
#include "kvtier/status.hpp"
#include "runtime/metrics_sources.hpp"

namespace prometheus {
class Exposer;
}

namespace kvtier {

class MetricsCollector;

class MetricsExporter {
 public:
  // kInvalidArgument for invalid config.latency_buckets. Any listen problem is logged, not
  // returned (see above).
  static Result<std::unique_ptr<MetricsExporter>> create(const MetricsConfig& config,
                                                         MetricsSources sources);
  ~MetricsExporter();

  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Whether the HTTP endpoint is up.
  bool serving() const { return port_ != 0; }
  // The bound TCP port (the kernel's choice when listen asked for port 0); 0 when not serving.
  uint16_t port() const { return port_; }
  // "http://127.0.0.1:9464/metrics" when serving, "" otherwise.
  std::string url() const;

  // What a scrape of /metrics returns, without the HTTP server's own exposer_* families.
  std::string scrape_text() const;

 private:
  MetricsExporter() = default;
  void start_server(const std::string& listen);

  std::shared_ptr<MetricsCollector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // null when not serving
  std::string host_;                              // as served: "127.0.0.1" or "[::1]"
  uint16_t port_ = 0;
  // The server's listening socket (owned by the server), shut down to stop it promptly; -1: not
  // found (stopping then takes up to the server's 2 s poll quantum).
  int listen_fd_ = -1;
  sockaddr_storage listen_address_{};  // its full address: the port alone may be another's too
};

}  // namespace kvtier

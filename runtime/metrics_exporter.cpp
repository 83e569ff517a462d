#include "runtime/metrics_exporter.hpp"

#include <prometheus/exposer.h>
#include <sys/socket.h>

#include <exception>
#include <utility>
#include <vector>

#include "kvtier/log.hpp"
#include "runtime/metrics_collector.hpp"
#include "runtime/metrics_latency.hpp"
#include "runtime/metrics_listen.hpp"

namespace kvtier {
namespace {

// Two workers: one scrape at a time is the norm; the second keeps a slow client from blocking
// Prometheus. The timeout frees a worker from a client that connects and never sends.
constexpr const char* kServerThreads = "2";
constexpr const char* kRequestTimeoutMs = "10000";

void log_not_served(const std::string& listen, const std::string& why) {
  log(LogLevel::kError, "metrics: cannot serve on " + listen + ": " + why +
                            "; metrics are still collected but not exported over HTTP");
}

}  // namespace

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::create(const MetricsConfig& config,
                                                                 MetricsSources sources) {
  KVTIER_ASSIGN_OR_RETURN(LatencyBucketMap latency,
                          LatencyBucketMap::create(config.latency_buckets));
  std::unique_ptr<MetricsExporter> exporter(new MetricsExporter());
  exporter->collector_ = std::make_shared<MetricsCollector>(std::move(sources), std::move(latency));
  if (!config.listen.empty()) exporter->start_server(config.listen);
  return exporter;
}

MetricsExporter::~MetricsExporter() {
  // Stop the server (it waits for a scrape in progress) before anything a scrape reads goes away.
  // Shutting its listening socket down first ends its accept poll now rather than at the next 2 s
  // quantum (see metrics_listen.hpp); the descriptor is re-checked, as it belongs to the server.
  if (exposer_ && listen_fd_ >= 0 && is_listening_on(listen_fd_, listen_address_)) {
    ::shutdown(listen_fd_, SHUT_RDWR);
  }
  exposer_.reset();
}

void MetricsExporter::start_server(const std::string& listen) {
  Result<ListenAddress> parsed = parse_listen_address(listen);
  if (!parsed.ok()) {
    log_not_served(listen, parsed.status().message());
    return;
  }
  Result<ResolvedListen> resolved = resolve_listen_address(*parsed);
  if (!resolved.ok()) {
    log_not_served(listen, resolved.status().message());
    return;
  }
  const std::string& spec = resolved->server_spec;
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", spec, "num_threads", kServerThreads,
                                 "request_timeout_ms", kRequestTimeoutMs});
    exposer->RegisterCollectable(collector_);
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty() || ports.front() <= 0 || ports.front() > 65535) {
      log_not_served(listen, "the HTTP server reports no listening port");
      return;
    }
    port_ = static_cast<uint16_t>(ports.front());
    listen_address_ = with_port(resolved->address, port_);
    listen_fd_ = find_listening_socket(listen_address_);
    exposer_ = std::move(exposer);
  } catch (const std::exception& e) {
    // The exposer says only that the server did not start; binding the address ourselves names
    // the reason (typically EADDRINUSE or EADDRNOTAVAIL).
    const std::string why = bind_error(*resolved);
    log_not_served(
        spec == listen ? listen : listen + " (" + spec + ")",
        why.empty() ? std::string("the HTTP server did not start (") + e.what() + ")" : why);
    return;
  } catch (...) {
    log_not_served(listen, "the HTTP server did not start (unknown error)");
    return;
  }
  host_ = spec.substr(0, spec.rfind(':'));
  log(LogLevel::kInfo, "metrics: serving " + url());
}

std::string MetricsExporter::url() const {
  if (!serving()) return {};
  return "http://" + host_ + ":" + std::to_string(port_) + "/metrics";
}

std::string MetricsExporter::scrape_text() const { return collector_->scrape_text(); }

}  // namespace kvtier

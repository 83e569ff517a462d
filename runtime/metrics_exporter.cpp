#include "runtime/metrics_exporter.hpp"

#include <CivetServer.h>
#include <civetweb.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>

#include <exception>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/log.hpp"
#include "runtime/metrics_collector.hpp"
#include "runtime/metrics_latency.hpp"
#include "runtime/metrics_listen.hpp"

namespace kvtier {
namespace {

// civetweb hands each connection to one worker until the request is answered, and a client that
// connects and sends nothing (a health checker, a port scanner) holds its worker until the request
// timeout, which civetweb counts from the connection's start over the whole header read, however
// slowly the bytes trickle in. With the 2 workers and 10 s of before, two such clients made the
// next scrape wait 10 s and four made every scrape miss Prometheus' scrape timeout (at most its
// scrape interval: 5 s in configs/prometheus.yml). Eight workers leave room for a few of them
// beside the one or two scrapes that are the norm; 2 s frees a worker well within any scrape
// timeout and is still ample for a real client on the loopback or a LAN. A determined client can
// still occupy every worker: the endpoint belongs on the loopback or behind a proxy (README).
constexpr const char* kServerThreads = "8";
constexpr const char* kRequestTimeoutMs = "2000";

constexpr std::string_view kMetricsPath = "/metrics";

// Writes a whole response without a body of metrics; returns `status` for civetweb's log.
int reply(mg_connection* conn, int status, std::string_view reason, std::string_view headers,
          std::string_view body) {
  mg_printf(conn,
            "HTTP/1.1 %d %.*s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\n%.*sConnection: close\r\n\r\n",
            status, static_cast<int>(reason.size()), reason.data(), body.size(),
            static_cast<int>(headers.size()), headers.data());
  if (!body.empty()) mg_write(conn, body.data(), body.size());
  return status;
}

// Runs before civetweb's own routing, which matches a handler's path as a prefix ("/metricsfoo"
// and "/metrics/x" were answered with metrics) and which prometheus-cpp's handler answers for GET
// only (HEAD was a 404). 0 lets the exposer answer a GET of exactly /metrics; anything else is
// answered here.
int route_request(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const char* uri = info != nullptr ? info->local_uri : nullptr;
  if (uri == nullptr || std::string_view(uri) != kMetricsPath) {
    return reply(conn, 404, "Not Found", "", "Not found: kvtier serves /metrics only\n");
  }
  const std::string_view method = info->request_method != nullptr ? info->request_method : "";
  if (method == "GET") return 0;
  if (method == "HEAD") {
    // The headers of a GET; the length is left out, as the body would be built only to count it.
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Connection: close\r\n\r\n");
    return 200;
  }
  return reply(conn, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
               "Method not allowed: /metrics answers GET and HEAD\n");
}

const CivetCallbacks& server_callbacks() {
  static const CivetCallbacks callbacks = [] {
    CivetCallbacks c;
    c.begin_request = route_request;
    return c;
  }();
  return callbacks;
}

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
                                 "request_timeout_ms", kRequestTimeoutMs},
        &server_callbacks());
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

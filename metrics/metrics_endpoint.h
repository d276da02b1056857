// The read-only HTTP endpoint a rank's metrics are scraped from: GET /metrics answers with
// the Prometheus text format, every other request with an error status.
//
// Why not prometheus-cpp's Exposer: its web server (civetweb) starts its threads with a fixed
// 100 KiB stack, and glibc places every loaded library's static TLS on each thread's stack.
// cuBLASLt alone has 94 KiB of it, so in a build with the CUDA backend the Exposer's threads
// fail to start (pthread_create: EINVAL). This endpoint serves from one std::thread with the
// default stack: it reads the requests of up to 64 connections at once (a client that sends
// nothing costs the others no wait) and answers each whole one in turn, which is all a scraper
// needs.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "core/unique_fd.h"

namespace mantissa::metrics {

class MetricsEndpoint {
 public:
  // Listens on bind_address:port (port 0: any free port); `render` produces the body of
  // GET /metrics. Throws core::Error naming the address when it cannot listen.
  MetricsEndpoint(const std::string& bind_address, int port, std::function<std::string()> render);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  void answer(int connection, const std::string& request);

  std::function<std::string()> render_;
  core::UniqueFd listen_fd_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace mantissa::metrics

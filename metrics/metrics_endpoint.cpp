#include "metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mantissa::metrics {
namespace {

// How often the serving thread looks at stopping_, how long one client may take to send its
// request, and how long it may stop taking the answer: a scraper sends at once and reads as
// it receives; a stuck client (a half-open connection, a process stopped mid-read) must not
// hold the endpoint, nor the process's exit, which joins this thread.
constexpr int kPollMs = 200;
constexpr int kRequestTimeoutMs = 2000;
constexpr int kSendStallSeconds = 5;
constexpr size_t kMaxRequestBytes = 8192;

void send_all(int fd, const std::string& data) {
  const timeval stall{kSendStallSeconds, 0};
  // Without the bound a stuck client would hold this thread (see above).
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof stall) != 0) return;
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the scraper went away or stalled; nothing to report to anyone
    sent += static_cast<size_t>(n);
  }
}

std::string response(const char* status, const std::string& content_type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(const std::string& bind_address, int port,
                                 std::function<std::string()> render)
    : render_(std::move(render)) {
  const std::string where = bind_address + ":" + std::to_string(port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  MANTISSA_REQUIRE(
      inet_pton(AF_INET, bind_address.c_str(), &addr.sin_addr) == 1, kConfig,
      "cannot listen on " << where << ": \"" << bind_address << "\" is not an IPv4 address");
  listen_fd_ = core::UniqueFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  MANTISSA_REQUIRE(listen_fd_.valid(), kFailure,
                   "cannot listen on " << where << ": socket: " << std::strerror(errno));
  const int one = 1;
  MANTISSA_REQUIRE(setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0,
                   kFailure,
                   "cannot listen on " << where << ": setsockopt: " << std::strerror(errno));
  if (bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listen_fd_.get(), 16) != 0) {
    const int error = errno;
    // A port another process holds may be free at the next start (another job on the node):
    // a runtime failure. An address this machine does not have is a setting to fix.
    core::throw_error_of_kind(
        error == EADDRINUSE ? core::ErrorKind::kFailure : core::ErrorKind::kConfig,
        "cannot listen on " + where + ": " + std::strerror(error));
  }
  socklen_t length = sizeof addr;
  MANTISSA_REQUIRE(
      getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0, kFailure,
      "cannot tell the port of " << where << ": getsockname: " << std::strerror(errno));
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stopping_ = true;
  thread_.join();
}

void MetricsEndpoint::serve() {
  while (!stopping_) {
    pollfd waiting{listen_fd_.get(), POLLIN, 0};
    if (poll(&waiting, 1, kPollMs) <= 0) continue;
    const core::UniqueFd connection(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    answer(connection.get());
  }
}

void MetricsEndpoint::answer(int connection) {
  // Read the request head (up to the blank line); the body, if any, is ignored.
  std::string request;
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd readable{connection, POLLIN, 0};
    if (poll(&readable, 1, kRequestTimeoutMs) <= 0) return;
    const ssize_t n = recv(connection, buffer, sizeof buffer, 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  if (line.rfind("GET ", 0) != 0) {
    send_all(connection,
             response("405 Method Not Allowed", "text/plain", "read-only: GET /metrics\n"));
  } else if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics") {
    send_all(connection, response("200 OK", "text/plain; version=0.0.4", render_()));
  } else {
    send_all(connection, response("404 Not Found", "text/plain", "GET /metrics\n"));
  }
}

}  // namespace mantissa::metrics

#include "metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace mantissa::metrics {
namespace {

using Clock = std::chrono::steady_clock;

// How often the serving thread looks at stopping_, how long one client may take to send its
// whole request, and how long to take the answer (stalled, or in all): a scraper sends at once
// and reads as it receives; a stuck or slow client (a half-open connection, a process stopped
// mid-read, one that trickles a byte at a time) must not hold the endpoint, nor the process's
// exit, which joins this thread. The bounds are on the whole exchange, not on one read or
// write, which a trickle would renew for ever.
constexpr int kPollMs = 200;
constexpr auto kRequestLimit = std::chrono::seconds(2);
constexpr auto kAnswerStall = std::chrono::seconds(5);
constexpr auto kAnswerLimit = std::chrono::seconds(30);
constexpr size_t kMaxRequestBytes = 8192;
// Connections whose request has not come whole yet, at most (each holds a descriptor).
constexpr size_t kMaxPendingConnections = 64;

// Milliseconds from now to `deadline`, 0 once it has passed.
int ms_until(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until `fd` is ready for `events` or `deadline` passes; whether it is ready.
bool ready_before(int fd, short events, Clock::time_point deadline) {
  pollfd ready{fd, events, 0};
  const int left = ms_until(deadline);
  return left > 0 && poll(&ready, 1, left) > 0;
}

void send_all(int fd, const std::string& data) {
  const Clock::time_point deadline = Clock::now() + kAnswerLimit;
  size_t sent = 0;
  while (sent < data.size()) {
    // A reader that takes nothing for kAnswerStall, or too long in all, is dropped.
    if (!ready_before(fd, POLLOUT, std::min(deadline, Clock::now() + kAnswerStall))) return;
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) return;  // the scraper went away; nothing to report to anyone
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
      listen(listen_fd_.get(), 128) != 0) {
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
  // Connections whose request is still coming, each with its own deadline: many at once, so
  // that clients that connect and send nothing (or trickle) cost a scraper no wait.
  struct Pending {
    core::UniqueFd fd;
    std::string request;
    Clock::time_point deadline;
  };
  std::vector<Pending> pending;
  std::vector<pollfd> polled;
  while (!stopping_) {
    polled.assign(1, pollfd{listen_fd_.get(), POLLIN, 0});
    Clock::time_point wake = Clock::now() + std::chrono::milliseconds(kPollMs);
    for (const Pending& c : pending) {
      polled.push_back(pollfd{c.fd.get(), POLLIN, 0});
      wake = std::min(wake, c.deadline);
    }
    if (poll(polled.data(), polled.size(), std::max(ms_until(wake), 1)) < 0) continue;
    // Read what came (a connection past its deadline, closed, or failing goes unanswered),
    // then answer each whole request, oldest first.
    std::vector<Pending> waiting;
    for (size_t k = 0; k < pending.size(); ++k) {
      Pending& c = pending[k];
      if ((polled[k + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        char buffer[1024];
        const ssize_t n = recv(c.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) continue;
        if (n > 0) c.request.append(buffer, static_cast<size_t>(n));
      }
      if (c.request.find("\r\n\r\n") != std::string::npos || c.request.size() >= kMaxRequestBytes) {
        answer(c.fd.get(), c.request);
      } else if (Clock::now() < c.deadline) {
        waiting.push_back(std::move(c));
      }
    }
    pending = std::move(waiting);
    if ((polled[0].revents & POLLIN) != 0) {
      // The oldest connection gives way when too many wait: a flood cannot grow this list.
      core::UniqueFd connection(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (connection.valid()) {
        if (pending.size() >= kMaxPendingConnections) pending.erase(pending.begin());
        pending.push_back({std::move(connection), {}, Clock::now() + kRequestLimit});
      }
    }
  }
}

void MetricsEndpoint::answer(int connection, const std::string& request) {
  // The request line decides; headers and any body are ignored.
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

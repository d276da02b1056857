// metrics.pushgateway_url's one rule, used where the config is checked (before anything runs)
// and where the push client is made. Header-only so that the config library, which does not
// link prometheus-cpp, checks the same rule.
#pragma once

#include <string>
#include <utility>

namespace mantissa::metrics {

struct PushgatewayUrl {
  std::string host;     // scheme and host, as prometheus::Gateway wants it
  std::string port;     // 9091, the Pushgateway's, unless the URL names one
  std::string problem;  // empty when the URL is one; else what is wrong with it
};

// "http[s]://host[:port][/]" → {"http[s]://host", "port"}. A path is refused:
// prometheus::Gateway appends its own; so are spaces and control characters, and a port
// outside [1, 65535].
inline PushgatewayUrl parse_pushgateway_url(const std::string& url) {
  const auto refused = [](std::string problem) {
    return PushgatewayUrl{"", "", std::move(problem)};
  };
  const auto scheme_end = url.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end + 3);
  if (scheme != "http://" && scheme != "https://") {
    return refused("must start with http:// or https://");
  }
  std::string rest = url.substr(scheme.size());
  for (const char c : rest) {
    if (static_cast<unsigned char>(c) <= ' ') return refused("must hold no spaces or controls");
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos) {
    return refused("must be " + scheme + "host[:port], without a path");
  }
  // The last ':' separates the port unless it belongs to a bracketed IPv6 address.
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || rest.find(']', colon) != std::string::npos) {
    return {scheme + rest, "9091", ""};
  }
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) {
    return refused("has a port that is not a number");
  }
  if (port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return refused("has a port outside [1, 65535]");
  }
  return {scheme + rest.substr(0, colon), port, ""};
}

}  // namespace mantissa::metrics

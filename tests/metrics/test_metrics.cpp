// The metrics exporter seen from outside: a real HTTP scrape of the endpoint a rank serves,
// checked for the contract's names, the rank label on every series, and the values recorded.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "metrics/metrics.h"
#include "metrics/metrics_endpoint.h"
#include "metrics/pushgateway_url.h"

namespace mantissa::metrics {
namespace {

// A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A socket connected to 127.0.0.1:port, or -1.
int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One HTTP/1.0 request to 127.0.0.1:port; returns the status code and the body.
std::pair<int, std::string> http(int port, const std::string& method, const std::string& path) {
  const int fd = connect_to(port);
  if (fd < 0) return {0, "connect failed"};
  const std::string request =
      method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n";
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, n);
  close(fd);
  int status = 0;
  std::istringstream(response.substr(response.find(' ') + 1)) >> status;
  const auto body = response.find("\r\n\r\n");
  return {status, body == std::string::npos ? "" : response.substr(body + 4)};
}

// The text exposition format as a map from "name{labels}" (exactly as served) to value.
std::map<std::string, double> parse_exposition(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

std::optional<double> sample(const std::map<std::string, double>& samples, const std::string& key) {
  const auto it = samples.find(key);
  if (it == samples.end()) return std::nullopt;
  return it->second;
}

StepRecord step_record(std::int64_t step, bool overflow) {
  StepRecord r;
  r.report.step = step;
  r.report.loss = 5.5 - 0.5 * static_cast<double>(step);
  r.report.loss_scale = overflow ? 32768 : 65536;
  r.report.skipped = overflow;
  r.report.grad_norm = 0.25 * static_cast<double>(step);
  r.report.lr = 1e-3;
  r.report.tokens = 1024;
  r.step_seconds = 0.5;
  r.allreduce_seconds = 0.002;
  r.allreduce_bytes = 4'000'000;
  r.epoch = 0.125 * static_cast<double>(step + 1);
  r.fp8 = {{"h0.mlp.fc.weight", 1.5, 298.0}, {"h0.mlp.fc.input", 12.0, 37.0}};
  return r;
}

// The value of `name`{rank="0"} that the exporter on `port` serves now.
std::optional<double> rank0_sample(int port, const std::string& name) {
  return sample(parse_exposition(http(port, "GET", "/metrics").second), name + R"({rank="0"})");
}

// The validation gauges appear with the first evaluation (a 0 before it would read as a
// loss), and mantissa_val_loss_rises counts the evaluations in a row whose loss rose.
TEST(Metrics, ValidationLossAndItsRisesInARow) {
  MetricsOptions options;
  options.port = free_port();
  Metrics metrics(options);
  const auto scrape = [&](const std::string& name) { return rank0_sample(options.port, name); };
  metrics.record_step(step_record(1, false));
  EXPECT_FALSE(scrape("mantissa_val_loss"));
  EXPECT_FALSE(scrape("mantissa_val_loss_rises"));

  const double losses[] = {3.0, 2.5, 2.6, 2.7, 2.7, 2.8, 2.1};
  const double rises[] = {0, 0, 1, 2, 0, 1, 0};  // an equal loss is no rise
  for (int i = 0; i < 7; ++i) {
    StepRecord record = step_record(2 + i, false);
    record.val_loss = losses[i];
    metrics.record_step(record);
    EXPECT_EQ(scrape("mantissa_val_loss"), losses[i]) << "evaluation " << i;
    EXPECT_EQ(scrape("mantissa_val_loss_rises"), rises[i]) << "evaluation " << i;
  }
  // Steps without an evaluation leave both as they were.
  metrics.record_step(step_record(9, false));
  EXPECT_EQ(scrape("mantissa_val_loss"), 2.1);
}

// A requeued run goes on counting from its checkpoint's trend: two rises before the requeue and
// one after are three in a row, which MantissaValidationLossRising waits for.
TEST(Metrics, TheRisesInARowGoOnAcrossAResume) {
  ValLossTrend saved;
  {
    MetricsOptions options;
    Metrics before(options);
    EXPECT_FALSE(before.val_loss_trend()) << "no evaluation yet";
    for (const double loss : {2.5, 2.6, 2.7}) {
      StepRecord record = step_record(1, false);
      record.val_loss = loss;
      before.record_step(record);
    }
    ASSERT_TRUE(before.val_loss_trend());
    saved = *before.val_loss_trend();
  }
  EXPECT_EQ(saved.last_val_loss, 2.7);
  EXPECT_EQ(saved.rises, 2);

  MetricsOptions options;
  options.port = free_port();
  Metrics after(options);
  const auto scrape = [&](const std::string& name) { return rank0_sample(options.port, name); };
  after.record_resumed_val_loss(saved);
  EXPECT_EQ(scrape("mantissa_val_loss"), 2.7);
  EXPECT_EQ(scrape("mantissa_val_loss_rises"), 2);
  StepRecord record = step_record(2, false);
  record.val_loss = 2.8;
  after.record_step(record);
  EXPECT_EQ(scrape("mantissa_val_loss_rises"), 3);
}

// What the stall alert reads: the last progress (the start, a step, an evaluation's
// micro-batch, a checkpoint save's end) and whether a save is under way, during which no step
// ends.
TEST(Metrics, ProgressTimeAndTheSaveInProgress) {
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  MetricsOptions options;
  options.port = free_port();
  const double before_start = now();
  Metrics metrics(options);
  const auto scrape = [&](const std::string& name) {
    return rank0_sample(options.port, name).value_or(-1);
  };
  const double started = scrape("mantissa_progress_timestamp_seconds");
  EXPECT_GE(started, before_start);
  EXPECT_LE(started, now());
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 0);

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  metrics.record_step(step_record(1, false));
  const double stepped = scrape("mantissa_progress_timestamp_seconds");
  EXPECT_GT(stepped, started);
  metrics.record_checkpoint_start();
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 1);
  // A save's start counts: the alerts time the save from it.
  EXPECT_GE(scrape("mantissa_progress_timestamp_seconds"), stepped);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  metrics.record_checkpoint(1, 0.02, now());
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 0);
  EXPECT_GT(scrape("mantissa_progress_timestamp_seconds"), stepped);
  // A load is under way the same way, and ends as progress.
  metrics.record_checkpoint_start();
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 1);
  const double saved = scrape("mantissa_progress_timestamp_seconds");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  metrics.record_checkpoint_loaded();
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 0);
  const double loaded = scrape("mantissa_progress_timestamp_seconds");
  EXPECT_GT(loaded, saved);
  // Each micro-batch of an evaluation is progress: one longer than the alert's wait is no stall.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  metrics.record_evaluating();
  EXPECT_GT(scrape("mantissa_progress_timestamp_seconds"), loaded);
  // A save that failed (its exception ends the process) leaves no save in progress behind:
  // the final push carries 0.
  metrics.record_checkpoint_start();
  metrics.finish();
  EXPECT_EQ(scrape("mantissa_checkpoint_in_progress"), 0);
}

TEST(Metrics, ScrapeShowsContractNamesLabelsAndValues) {
  MetricsOptions options;
  options.port = free_port();
  options.rank = 3;
  options.peak_flops = 1e12;
  options.loss_scale_min = 1;
  options.build_labels = {{"revision", "0af4188c1a2b"}, {"version", "0.2.0"}};
  options.run_steps = 100;
  Metrics metrics(options);
  ASSERT_EQ(metrics.listening_port(), options.port);

  // During the start, before the model is built: the counters and the build, no peak yet.
  auto starting = parse_exposition(http(options.port, "GET", "/metrics").second);
  EXPECT_EQ(sample(starting, R"(mantissa_steps_total{rank="3"})"), 0.0);
  EXPECT_FALSE(sample(starting, R"(mantissa_peak_flops{rank="3"})"));
  EXPECT_FALSE(sample(starting, R"(mantissa_step{rank="3"})")) << "a resume's start is no step 0";
  metrics.set_model_flops(1e6);
  metrics.record_first_step(0);

  // Before any checkpoint or step the checkpoint and last-step gauges are absent (a 0 would
  // read as a collapsed loss scale, a perfect loss) but the counters exist at 0, so that
  // increase() sees the first overflow.
  auto before = parse_exposition(http(options.port, "GET", "/metrics").second);
  EXPECT_EQ(sample(before, R"(mantissa_overflow_steps_total{rank="3"})"), 0.0);
  EXPECT_EQ(sample(before, R"(mantissa_run_finished{rank="3"})"), 0.0);
  EXPECT_EQ(sample(before, R"(mantissa_peak_flops{rank="3"})"), 1e12);
  EXPECT_EQ(sample(before, R"(mantissa_step{rank="3"})"), 0.0) << "a fresh run begins at 0";
  for (const char* name : {"mantissa_last_checkpoint_step", "mantissa_loss_scale", "mantissa_loss",
                           "mantissa_grad_norm", "mantissa_learning_rate", "mantissa_mfu_ratio",
                           "mantissa_data_epoch"}) {
    EXPECT_FALSE(sample(before, std::string(name) + R"({rank="3"})")) << name;
  }

  metrics.record_step(step_record(1, false));
  metrics.record_step(step_record(2, true));
  metrics.record_step(step_record(3, false));
  metrics.record_checkpoint(3, 0.75, 1.7e9);

  const auto [status, body] = http(options.port, "GET", "/metrics");
  ASSERT_EQ(status, 200);
  const auto s = parse_exposition(body);
  const auto at = [&](const std::string& name, const std::string& extra = "") {
    return sample(s, name + "{rank=\"3\"" + extra + "}");
  };
  EXPECT_EQ(at("mantissa_loss_scale"), 65536.0);
  EXPECT_EQ(at("mantissa_loss_scale_min"), 1.0);
  EXPECT_EQ(at("mantissa_overflow_steps_total"), 1.0);
  EXPECT_EQ(at("mantissa_steps_total"), 3.0);
  EXPECT_EQ(at("mantissa_tokens_total"), 3072.0);
  EXPECT_EQ(at("mantissa_loss"), 4.0);
  EXPECT_EQ(at("mantissa_grad_norm"), 0.75);
  EXPECT_EQ(at("mantissa_learning_rate"), 1e-3);
  EXPECT_EQ(at("mantissa_data_epoch"), 0.5);
  // 1024 tokens in 0.5 s × 1e6 FLOPs/token over a 1e12 peak.
  ASSERT_TRUE(at("mantissa_mfu_ratio"));
  EXPECT_DOUBLE_EQ(*at("mantissa_mfu_ratio"), 2048.0 * 1e6 / 1e12);
  EXPECT_EQ(at("mantissa_step_seconds_count"), 3.0);
  EXPECT_EQ(at("mantissa_step_seconds_sum"), 1.5);
  EXPECT_EQ(at("mantissa_step_seconds_bucket", ",le=\"0.5\""), 3.0);
  EXPECT_EQ(at("mantissa_step_seconds_bucket", ",le=\"0.4\""), 0.0);  // ten bounds a decade
  EXPECT_EQ(at("mantissa_allreduce_seconds_count"), 3.0);
  EXPECT_EQ(at("mantissa_allreduce_bytes_total"), 12e6);
  EXPECT_EQ(at("mantissa_fp8_amax", ",tensor=\"h0.mlp.fc.weight\""), 1.5);
  EXPECT_EQ(at("mantissa_fp8_scale", ",tensor=\"h0.mlp.fc.weight\""), 298.0);
  EXPECT_EQ(at("mantissa_fp8_amax", ",tensor=\"h0.mlp.fc.input\""), 12.0);
  EXPECT_EQ(at("mantissa_last_checkpoint_step"), 3.0);
  EXPECT_EQ(at("mantissa_last_checkpoint_timestamp_seconds"), 1.7e9);
  EXPECT_EQ(at("mantissa_checkpoint_seconds_count"), 1.0);
  EXPECT_EQ(at("mantissa_build_info", R"(,revision="0af4188c1a2b",version="0.2.0")"), 1.0);
  // report.step is 0-based: the record of step 3 makes 4 steps done.
  EXPECT_EQ(at("mantissa_step"), 4.0);
  EXPECT_EQ(at("mantissa_run_steps"), 100.0);

  // Every series of ours carries the rank label (histogram buckets add le after it).
  for (const auto& [key, value] : s) {
    if (key.rfind("mantissa_", 0) == 0) {
      EXPECT_NE(key.find("{rank=\"3\""), std::string::npos) << key;
    }
  }

  // Read-only: no method other than GET changes what is served.
  // (The exposer's own exposer_* statistics count requests, so only ours are compared.)
  const auto ours = [](std::map<std::string, double> samples) {
    std::erase_if(samples, [](const auto& kv) { return kv.first.rfind("mantissa_", 0) != 0; });
    return samples;
  };
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    EXPECT_NE(http(options.port, method, "/metrics").first, 200) << method;
  }
  EXPECT_EQ(ours(parse_exposition(http(options.port, "GET", "/metrics").second)), ours(s));
}

// A skipped step's gradient norm (of non-finite gradients) is not shown: the gauge keeps the
// last finite one. A run that ends by itself says so.
TEST(Metrics, SkippedStepsKeepTheGradientNormAndTheEndIsShown) {
  MetricsOptions options;
  options.port = free_port();
  Metrics metrics(options);
  const auto scrape = [&](const std::string& name) { return rank0_sample(options.port, name); };
  metrics.record_step(step_record(3, false));
  StepRecord skipped = step_record(4, true);
  skipped.report.grad_norm = 0;
  metrics.record_step(skipped);
  EXPECT_EQ(scrape("mantissa_grad_norm"), 0.75);
  EXPECT_EQ(scrape("mantissa_loss_scale"), 32768.0);
  EXPECT_EQ(scrape("mantissa_run_finished"), 0.0);
  metrics.record_finished();
  EXPECT_EQ(scrape("mantissa_run_finished"), 1.0);
}

// After a resume the checkpoint gauges show the checkpoint resumed from until the run saves
// one, and mantissa_step counts on from its step (absent until the load has ended).
TEST(Metrics, ResumedCheckpointShowsUntilTheNextSave) {
  for (const double saved_at : {1.7e9, 0.0}) {
    MetricsOptions options;
    options.port = free_port();
    Metrics metrics(options);
    const auto scrape = [&](const std::string& name) { return rank0_sample(options.port, name); };
    EXPECT_FALSE(scrape("mantissa_step"));
    metrics.record_resumed_checkpoint(50, saved_at);
    metrics.record_first_step(50);
    EXPECT_EQ(scrape("mantissa_last_checkpoint_step"), 50.0);
    EXPECT_EQ(scrape("mantissa_step"), 50.0);
    EXPECT_EQ(scrape("mantissa_checkpoint_seconds_count"), 0.0) << "no save was timed";
    if (saved_at > 0) {
      EXPECT_EQ(scrape("mantissa_last_checkpoint_timestamp_seconds"), saved_at);
    } else {
      EXPECT_FALSE(scrape("mantissa_last_checkpoint_timestamp_seconds")) << "unknown: absent";
    }
    metrics.record_step(step_record(50, false));
    EXPECT_EQ(scrape("mantissa_step"), 51.0);
    metrics.record_checkpoint(51, 0.5, 1.8e9);
    EXPECT_EQ(scrape("mantissa_last_checkpoint_step"), 51.0);
    EXPECT_EQ(scrape("mantissa_last_checkpoint_timestamp_seconds"), 1.8e9);
    // A 25-minute save, which MantissaCheckpointSlow tolerates, has a bucket of its own: the
    // dashboard's p95 does not read it as the last bound.
    metrics.record_checkpoint(52, 1500.0, 1.9e9);
    const auto saves = parse_exposition(http(options.port, "GET", "/metrics").second);
    EXPECT_EQ(sample(saves, R"(mantissa_checkpoint_seconds_bucket{rank="0",le="1200"})"), 1.0);
    EXPECT_EQ(sample(saves, R"(mantissa_checkpoint_seconds_bucket{rank="0",le="1800"})"), 2.0);
  }
}

TEST(Metrics, PortZeroOpensNoSocket) {
  Metrics metrics(MetricsOptions{});
  EXPECT_EQ(metrics.listening_port(), 0);
  metrics.record_step(step_record(1, false));
}

TEST(Metrics, BusyPortIsReportedWithTheAddress) {
  MetricsOptions options;
  options.port = free_port();
  Metrics first(options);
  try {
    Metrics second(options);
    FAIL() << "a second exporter on the same port started";
  } catch (const core::Error& e) {
    // A runtime failure (another process holds the port; a later start may find it free), in
    // one message without a source location (the endpoint's is wrapped, not appended to).
    EXPECT_EQ(e.kind(), core::ErrorKind::kFailure);
    EXPECT_EQ(std::string(e.what()),
              "metrics: cannot listen on 127.0.0.1:" + std::to_string(options.port) +
                  ": Address already in use (metrics.bind_address, "
                  "metrics.port + local rank)");
  }
  options.bind_address = "localhost";
  try {
    Metrics named(options);
    FAIL() << "a bind address that is no IPv4 address was accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"localhost\" is not an IPv4 address"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find(".cpp:"), std::string::npos) << e.what();
  }
  options.bind_address = "127.0.0.1";
  options.port = 65536;
  EXPECT_THROW(Metrics past(options), core::ConfigError);
}

// A client that asks and then stops reading (a half-open connection, a scraper stopped
// mid-read) is dropped once the answer stalls, so later scrapes are answered and the endpoint
// (which the process's exit waits for) stops. The body is far larger than the socket buffers.
TEST(MetricsEndpoint, AClientThatStopsReadingDoesNotHoldIt) {
  const std::string body(64 << 20, 'x');
  auto endpoint = std::make_unique<MetricsEndpoint>("127.0.0.1", 0, [&] { return body; });
  const int stalled = connect_to(endpoint->port());
  ASSERT_GE(stalled, 0);
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(stalled, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));

  const auto [status, answer] = http(endpoint->port(), "GET", "/metrics");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(answer.size(), body.size());
  endpoint.reset();  // returns: the serving thread is not stuck in the stalled send
  close(stalled);
}

// A client that sends its request a byte at a time, each within a read's patience, is dropped
// once the request as a whole takes too long (2 s): a good scrape is answered while it still
// trickles (it would trickle for 60 s), and the endpoint stops.
TEST(MetricsEndpoint, AClientThatTricklesItsRequestDoesNotHoldIt) {
  auto endpoint = std::make_unique<MetricsEndpoint>("127.0.0.1", 0, [] { return "x 1\n"; });
  const int slow = connect_to(endpoint->port());
  ASSERT_GE(slow, 0);
  std::atomic<bool> dropped{false};
  std::thread trickle([&] {
    for (int i = 0; i < 200; ++i) {  // 60 s at most
      if (send(slow, "G", 1, MSG_NOSIGNAL) != 1) break;
      pollfd closed{slow, POLLIN, 0};
      if (poll(&closed, 1, 300) > 0) {  // the endpoint closed the connection
        dropped = true;
        break;
      }
    }
  });
  const auto [status, answer] = http(endpoint->port(), "GET", "/metrics");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(answer, "x 1\n");
  trickle.join();
  EXPECT_TRUE(dropped) << "the trickling client was never dropped";
  endpoint.reset();
  close(slow);
}

// Clients that connect and send nothing (a TCP health check that holds its connection, a
// flood) wait beside a scrape, not in front of it: the scrape is answered while the newest of
// them are still open (each is dropped 2 s after it connected, the oldest at once when more
// than the 64 the endpoint holds are pending). A server that took one connection at a time,
// or refused new ones once full, would answer the scrape only after dropping every one.
TEST(MetricsEndpoint, IdleConnectionsDoNotQueueAScrapeBehindThem) {
  auto endpoint = std::make_unique<MetricsEndpoint>("127.0.0.1", 0, [] { return "x 1\n"; });
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(connect_to(endpoint->port()));
    ASSERT_GE(idle.back(), 0);
  }
  const auto [status, answer] = http(endpoint->port(), "GET", "/metrics");
  EXPECT_EQ(status, 200);
  int still_open = 0;
  for (int fd : idle) {
    pollfd closed{fd, POLLIN, 0};
    still_open += poll(&closed, 1, 0) == 0;
  }
  EXPECT_GT(still_open, 0) << "the scrape waited until every idle connection was dropped";
  endpoint.reset();
  for (int fd : idle) close(fd);
}

TEST(Metrics, BadPushgatewayUrlNamesTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"ftp://host:9091", "must start with http:// or https://"},
      {"host:9091", "must start with http:// or https://"},
      {"http://host:port", "has a port that is not a number"},
      {"http://127.0.0.1:99999", "has a port outside [1, 65535]"},
      {"http://host:0", "has a port outside [1, 65535]"},
      {"http://a b:9091", "must hold no spaces or controls"},
      {"http://gateway\n:9091", "must hold no spaces or controls"},
      {"https://host:9091/extra/path", "must be https://host[:port], without a path"}};
  for (const auto& [url, problem] : cases) {
    MetricsOptions options;
    options.pushgateway_url = url;
    try {
      Metrics metrics(options);
      FAIL() << url << " was accepted";
    } catch (const core::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()),
                "metrics.pushgateway_url = '" + std::string(url) + "': " + problem);
    }
  }
}

TEST(Metrics, PushgatewayUrlSplitsIntoHostAndPort) {
  const PushgatewayUrl plain = parse_pushgateway_url("http://gateway.example/");
  EXPECT_EQ(plain.host, "http://gateway.example");
  EXPECT_EQ(plain.port, "9091");
  const PushgatewayUrl tls = parse_pushgateway_url("https://[::1]:9443");
  EXPECT_EQ(tls.host, "https://[::1]");
  EXPECT_EQ(tls.port, "9443");
  EXPECT_TRUE(tls.problem.empty());
  EXPECT_EQ(parse_pushgateway_url("http://[::1]").port, "9091");
}

TEST(Metrics, UnreachablePushgatewayNeverFailsTraining) {
  MetricsOptions options;
  options.pushgateway_url = "http://127.0.0.1:" + std::to_string(free_port());
  options.push_every = 1;
  testing::internal::CaptureStderr();
  {
    Metrics metrics(options);
    for (int step = 1; step <= 5; ++step) metrics.record_step(step_record(step, false));
    metrics.finish();
    metrics.finish();  // idempotent
  }
  // Said once, with libcurl's words for its error.
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "metrics: rank 0: push to " + options.pushgateway_url +
                     " failed (Couldn't connect to server (curl error 7)); training continues\n");
}

// A Pushgateway that accepts the connection and never answers (here a socket that listens and
// never accepts): the end of the run gives up its final push after 10 s instead of waiting for
// ever (the client sets no HTTP timeout).
TEST(Metrics, AGatewayThatNeverAnswersDoesNotHoldTheExit) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t length = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  MetricsOptions options;
  options.pushgateway_url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  options.push_every = 1;
  testing::internal::CaptureStderr();
  {
    Metrics metrics(options);
    metrics.record_step(step_record(1, false));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("metrics: rank 0: the last push to " + options.pushgateway_url +
                     " has not finished after 10 s; exiting without it"),
            std::string::npos)
      << err;
  close(listener);  // resets the waiting connection: the push left behind ends
}

// Needs a real Pushgateway: tests/integration/test_pushgateway.py starts one on 127.0.0.1 and
// runs this test with MANTISSA_TEST_PUSHGATEWAY_PORT set; a plain run of this binary skips it.
TEST(Metrics, PushReplacesTheGroupOfJobAndRank) {
  const char* port_env = std::getenv("MANTISSA_TEST_PUSHGATEWAY_PORT");
  if (port_env == nullptr) GTEST_SKIP() << "MANTISSA_TEST_PUSHGATEWAY_PORT not set";
  const int port = std::stoi(port_env);
  const auto pushed = [&] { return parse_exposition(http(port, "GET", "/metrics").second); };
  const std::string group = R"({instance="",job="mantissa_push_test",rank="1"})";

  MetricsOptions options;
  options.rank = 1;
  options.job = "mantissa_push_test";
  options.pushgateway_url = "http://127.0.0.1:" + std::string(port_env);
  options.push_every = 2;
  {
    Metrics metrics(options);
    metrics.record_step(step_record(1, false));
    metrics.record_step(step_record(2, true));  // push_every reached: pushed in the background
    metrics.record_step(step_record(3, false));
    metrics.finish();  // the final push, waited for
    const auto s = pushed();
    EXPECT_EQ(sample(s, "mantissa_steps_total" + group), 3.0);
    EXPECT_EQ(sample(s, "mantissa_overflow_steps_total" + group), 1.0);
    EXPECT_EQ(sample(s, "mantissa_loss_scale" + group), 65536.0);
    EXPECT_TRUE(sample(s, R"(mantissa_fp8_amax{instance="",job="mantissa_push_test",rank="1",)"
                          R"(tensor="h0.mlp.fc.weight"})"));
  }
  // A later run of the same job and rank that reports no FP8 tensors replaces the whole group
  // (HTTP PUT): nothing of the earlier run is left behind.
  Metrics again(options);
  StepRecord record = step_record(1, false);
  record.fp8.clear();
  again.record_step(record);
  again.finish();
  const auto s = pushed();
  EXPECT_EQ(sample(s, "mantissa_steps_total" + group), 1.0);
  for (const auto& [key, value] : s) {
    EXPECT_EQ(key.find("mantissa_fp8_amax"), std::string::npos) << key;
  }
  // A start that fails before its first step (it recorded nothing) pushes nothing: the group
  // keeps the earlier run's values rather than zeros.
  Metrics failed_start(options);
  failed_start.finish();
  EXPECT_EQ(sample(pushed(), "mantissa_steps_total" + group), 1.0);
}

}  // namespace
}  // namespace mantissa::metrics

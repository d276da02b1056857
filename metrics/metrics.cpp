#include "metrics/metrics.h"

#include <curl/curl.h>
#include <prometheus/counter.h>
#include <prometheus/gateway.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"
#include "metrics/metrics_endpoint.h"
#include "metrics/pushgateway_url.h"

namespace mantissa::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// Bucket bounds in seconds. Steps run from milliseconds (tiny CPU models) to a minute (large
// models with accumulation); all-reduce from tens of microseconds (NVLink, small buckets) to
// seconds; checkpoints from milliseconds to many minutes.
//
// Steps get ten bounds a decade, the R10 preferred numbers (each about 1.26x the last), from
// 1 ms to 100 s: the dashboard's p50/p95 read within 26% of the true time, where bounds of
// 1, 2.5, 5 a decade allowed 2x (0.49 s for steps of exactly 0.43 s). Each bound is an exact
// integer over 10^5, so that its `le` label prints as the decimal it is.
Histogram::BucketBoundaries step_buckets() {
  constexpr int kR10[] = {100, 125, 160, 200, 250, 315, 400, 500, 630, 800};
  Histogram::BucketBoundaries bounds;
  for (int scale = 1; scale <= 10000; scale *= 10) {
    for (int r : kR10) bounds.push_back(static_cast<double>(r * scale) / 1e5);
  }
  bounds.push_back(100);
  return bounds;
}
const Histogram::BucketBoundaries kAllreduceBuckets = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};
// Up to 2 hours: MantissaCheckpointSlow warns at 30 minutes, and the dashboard's p95 of saves
// that long must not read as the last bound.
const Histogram::BucketBoundaries kCheckpointBuckets = {
    0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 7200};

// A rank's gauge that appears when first set: before it, a 0 would read as a value (a loss
// scale of 0 is a collapsed one, a loss of 0 a perfect model, a checkpoint of step 0 a save).
class LateGauge {
 public:
  LateGauge(prometheus::Family<Gauge>& family, Labels labels)
      : family_(&family), labels_(std::move(labels)) {}
  bool shown() const { return gauge_ != nullptr; }
  void set(double value) {
    if (gauge_ == nullptr) gauge_ = &family_->Add(labels_);
    gauge_->Set(value);
  }

 private:
  prometheus::Family<Gauge>* family_;
  Labels labels_;
  Gauge* gauge_ = nullptr;
};

prometheus::Family<Gauge>& gauge_family(prometheus::Registry& registry, const std::string& name,
                                        const std::string& help) {
  return BuildGauge().Name(name).Help(help).Register(registry);
}

}  // namespace

struct Metrics::State {
  MetricsOptions options;
  Labels rank_labels;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  // The last step's values appear with the first step.
  std::optional<LateGauge> loss_scale, loss, grad_norm, learning_rate, mfu, data_epoch;
  Counter* overflow_steps = nullptr;
  Counter* steps = nullptr;
  Counter* tokens = nullptr;
  // The steps done appear once known: a resume's until its checkpoint is loaded is not 0.
  std::optional<LateGauge> step;
  Gauge* run_finished = nullptr;
  Gauge* progress_time = nullptr;  // mantissa_progress_timestamp_seconds
  Gauge* checkpoint_in_progress = nullptr;
  Histogram* step_seconds = nullptr;
  Histogram* allreduce_seconds = nullptr;
  Counter* allreduce_bytes = nullptr;
  prometheus::Family<Gauge>* fp8_amax_family = nullptr;
  prometheus::Family<Gauge>* fp8_scale_family = nullptr;
  std::map<std::string, std::pair<Gauge*, Gauge*>, std::less<>> fp8;  // tensor → amax, scale
  // The newest checkpoint appears with the first written or resumed from.
  std::optional<LateGauge> last_checkpoint_step, last_checkpoint_time;
  Histogram* checkpoint_seconds = nullptr;
  // The held-out loss appears with the first evaluation.
  std::optional<LateGauge> val_loss, val_loss_rises;
  double last_val_loss = 0;
  int rises = 0;  // evaluations in a row whose loss rose above the one before

  std::unique_ptr<MetricsEndpoint> endpoint;

  // Pushing runs on its own thread so that a slow or unreachable Pushgateway (the client sets
  // no HTTP timeout) never stalls a training step. Requests coalesce: if a push is still in
  // flight when the next is due, one push follows it with the newest values.
  std::unique_ptr<prometheus::Gateway> gateway;
  PushgatewayUrl gateway_address;
  std::vector<int> ranks_to_forget;  // forget_ranks's, for the push thread
  std::thread pusher;
  std::mutex push_mutex;
  std::condition_variable push_wanted;
  bool push_pending = false;
  bool stopping = false;
  bool push_failing = false;  // only state changes are logged, not every failed push
  std::condition_variable push_loop_ended;
  bool pusher_done = false;
  std::int64_t steps_since_push = 0;
  std::chrono::steady_clock::time_point last_push_request{};
  bool reported = false;  // a step, a checkpoint or the run's end: something to push at the end
  bool finished = false;
  double flops_per_token = 0;

  void push_loop();
  void push_once();
  void forget_group(int rank);
  void request_push();
  // request_push when the last request is kPushAtLeastEvery old.
  void push_if_stale();
  void show_checkpoint(std::int64_t step, double saved_unix_time);
  void show_progress();
  // A save or load has ended: no checkpoint I/O in progress, progress, pushed.
  void end_checkpoint_io();
};

namespace {

// Why a Pushgateway request failed ("HTTP 500", libcurl's words for its error, what it threw);
// nullopt when it succeeded (2xx).
std::optional<std::string> gateway_failure(const std::function<int()>& request) {
  try {
    const int status = request();
    if (status >= 200 && status < 300) return std::nullopt;
    // Negative statuses are libcurl error codes (connection refused, DNS, ...).
    if (status < 0) {
      return std::string(curl_easy_strerror(static_cast<CURLcode>(-status))) + " (curl error " +
             std::to_string(-status) + ")";
    }
    return "HTTP " + std::to_string(status);
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

}  // namespace

// How long the end of a run waits for its final push. The client sets no HTTP timeout, so a
// Pushgateway that accepted the connection and never answers (hung, or a network that drops
// an established connection's packets) would otherwise hold the process's exit, and with it
// the job's GPUs and its requeue, until the job's time limit.
constexpr auto kFinalPushWait = std::chrono::seconds(10);
// The longest a step ends without a push (with push_every > 0).
constexpr auto kPushAtLeastEvery = std::chrono::seconds(30);

void Metrics::State::push_once() {
  // prometheus-cpp's PushAdd() sends PUT, which the Pushgateway treats as "replace every
  // metric of this group" — what we want, so a metric the run stopped reporting does not
  // linger. (Its Push() sends POST, which would only replace same-named metrics.)
  const std::optional<std::string> failure = gateway_failure([this] { return gateway->PushAdd(); });
  const bool ok = !failure;
  if (ok == push_failing) {
    std::cerr << "metrics: rank " << options.rank << ": "
              << (ok ? "pushes to " + options.pushgateway_url + " succeed again"
                     : "push to " + options.pushgateway_url + " failed (" + *failure +
                           "); training continues")
              << "\n";
    push_failing = !ok;
  }
}

void Metrics::State::forget_group(int rank) {
  const std::optional<std::string> failure = gateway_failure([&] {
    prometheus::Gateway group(gateway_address.host, gateway_address.port, options.job,
                              {{"rank", std::to_string(rank)}});
    return group.DeleteForInstance();  // Delete() would take the group of {job} alone
  });
  if (failure) {
    std::cerr << "metrics: rank " << options.rank << ": cannot delete the Pushgateway group of "
              << "rank " << rank << " of an earlier attempt on more ranks (" << *failure
              << "); delete it by hand: curl -X DELETE " << options.pushgateway_url
              << "/metrics/job/" << options.job << "/rank/" << rank << "\n";
  }
}

void Metrics::State::push_loop() {
  std::unique_lock lock(push_mutex);
  for (;;) {
    push_wanted.wait(lock, [this] { return push_pending || stopping || !ranks_to_forget.empty(); });
    const bool last = stopping;
    const bool push = push_pending || (last && reported);  // finish() locked after the last record
    push_pending = false;
    const std::vector<int> forget = std::exchange(ranks_to_forget, {});
    lock.unlock();
    for (const int rank : forget) forget_group(rank);
    if (push) push_once();
    lock.lock();
    if (last) {
      pusher_done = true;
      push_loop_ended.notify_one();
      return;
    }
  }
}

Metrics::Metrics(MetricsOptions options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.options = std::move(options);
  s.rank_labels = {{"rank", std::to_string(s.options.rank)}};
  auto& reg = *s.registry;
  const Labels& r = s.rank_labels;

  if (!s.options.build_labels.empty()) {
    Labels labels = r;
    labels.insert(s.options.build_labels.begin(), s.options.build_labels.end());
    gauge_family(reg, "mantissa_build_info", "Always 1; its labels name the build this rank runs")
        .Add(labels)
        .Set(1);
  }
  s.loss_scale.emplace(gauge_family(reg, "mantissa_loss_scale", "Loss scale of the last step"), r);
  if (s.options.loss_scale_min > 0) {
    gauge_family(reg, "mantissa_loss_scale_min", "Floor of the dynamic loss scale")
        .Add(r)
        .Set(s.options.loss_scale_min);
  }
  s.overflow_steps = &BuildCounter()
                          .Name("mantissa_overflow_steps_total")
                          .Help("Steps skipped because gradients were not finite")
                          .Register(reg)
                          .Add(r);
  s.steps = &BuildCounter()
                 .Name("mantissa_steps_total")
                 .Help("Optimizer steps taken, skipped ones included")
                 .Register(reg)
                 .Add(r);
  s.step.emplace(
      gauge_family(reg, "mantissa_step", "Steps the run has done, those before a resume included"),
      r);
  gauge_family(reg, "mantissa_run_steps", "Steps the run is configured to do (run.steps)")
      .Add(r)
      .Set(static_cast<double>(s.options.run_steps));
  s.tokens = &BuildCounter()
                  .Name("mantissa_tokens_total")
                  .Help("Tokens this rank trained on")
                  .Register(reg)
                  .Add(r);
  s.progress_time = &gauge_family(reg, "mantissa_progress_timestamp_seconds",
                                  "Unix time this process last made progress: its start, the end "
                                  "of a step or of an evaluation's micro-batch, the start and end "
                                  "of a checkpoint save or load, a resume")
                         .Add(r);
  s.show_progress();
  s.checkpoint_in_progress = &gauge_family(reg, "mantissa_checkpoint_in_progress",
                                           "1 while a checkpoint is written or read, else 0")
                                  .Add(r);
  s.run_finished =
      &gauge_family(reg, "mantissa_run_finished",
                    "1 once the run has ended by itself (done, or stopped by a signal, with a "
                    "checkpoint or before its first step), else 0")
           .Add(r);
  s.loss.emplace(gauge_family(reg, "mantissa_loss", "Loss of the last step"), r);
  s.grad_norm.emplace(gauge_family(reg, "mantissa_grad_norm",
                                   "Global gradient norm (unscaled) of the last step not skipped"),
                      r);
  s.learning_rate.emplace(
      gauge_family(reg, "mantissa_learning_rate", "Learning rate of the last step"), r);
  s.data_epoch.emplace(gauge_family(reg, "mantissa_data_epoch",
                                    "Epochs of training data read by the end of the last step: "
                                    "windows handed out since the data's first epoch began over "
                                    "the windows that hold the data once"),
                       r);
  s.step_seconds = &BuildHistogram()
                        .Name("mantissa_step_seconds")
                        .Help("Wall time of one optimizer step")
                        .Register(reg)
                        .Add(r, step_buckets());
  s.allreduce_seconds = &BuildHistogram()
                             .Name("mantissa_allreduce_seconds")
                             .Help(
                                 "Time a step waited on its collectives (the gradient "
                                 "all-reduce where backward does not hide it, and the step's "
                                 "scalar all-reduces)")
                             .Register(reg)
                             .Add(r, kAllreduceBuckets);
  s.allreduce_bytes = &BuildCounter()
                           .Name("mantissa_allreduce_bytes_total")
                           .Help("Bytes this rank handed to the collectives of its steps")
                           .Register(reg)
                           .Add(r);
  s.fp8_amax_family =
      &gauge_family(reg, "mantissa_fp8_amax", "Amax of the tensor at the last step");
  s.fp8_scale_family = &gauge_family(reg, "mantissa_fp8_scale", "Current FP8 scale of the tensor");
  s.val_loss.emplace(gauge_family(reg, "mantissa_val_loss",
                                  "Loss on the held-out validation set at the last evaluation"),
                     r);
  s.val_loss_rises.emplace(gauge_family(reg, "mantissa_val_loss_rises",
                                        "Evaluations in a row whose validation loss rose"),
                           r);
  s.last_checkpoint_step.emplace(
      gauge_family(reg, "mantissa_last_checkpoint_step", "Step of the newest checkpoint written"),
      r);
  s.last_checkpoint_time.emplace(gauge_family(reg, "mantissa_last_checkpoint_timestamp_seconds",
                                              "Unix time the save of the newest checkpoint began"),
                                 r);
  s.checkpoint_seconds = &BuildHistogram()
                              .Name("mantissa_checkpoint_seconds")
                              .Help("Time to write one checkpoint")
                              .Register(reg)
                              .Add(r, kCheckpointBuckets);

  if (s.options.port != 0) {
    MANTISSA_REQUIRE(s.options.port > 0 && s.options.port < 65536, kConfig,
                     "metrics.port: " << s.options.port << " (plus local rank) is not a TCP port");
    const std::string address = s.options.bind_address + ":" + std::to_string(s.options.port);
    std::shared_ptr<prometheus::Registry> registry = s.registry;
    try {
      s.endpoint = std::make_unique<MetricsEndpoint>(
          s.options.bind_address, s.options.port,
          [registry] { return prometheus::TextSerializer().Serialize(registry->Collect()); });
    } catch (const core::Error& e) {
      core::throw_error_of_kind(e.kind(), std::string("metrics: ") + e.what() +
                                              " (metrics.bind_address, metrics.port + local "
                                              "rank)");
    }
  }

  if (!s.options.pushgateway_url.empty()) {
    const PushgatewayUrl address = parse_pushgateway_url(s.options.pushgateway_url);
    MANTISSA_REQUIRE(
        address.problem.empty(), kConfig,
        "metrics.pushgateway_url = '" << s.options.pushgateway_url << "': " << address.problem);
    s.gateway = std::make_unique<prometheus::Gateway>(address.host, address.port, s.options.job,
                                                      s.rank_labels);
    s.gateway_address = address;
    s.gateway->RegisterCollectable(s.registry);
    s.pusher = std::thread([&s] { s.push_loop(); });
  }
}

Metrics::State& Metrics::state() const {
  MANTISSA_CHECK(state_ != nullptr, "metrics: used after finish() left its final push behind");
  return *state_;
}

Metrics::~Metrics() {
  finish();
}

void Metrics::finish() {
  if (state_ == nullptr) return;  // left to a final push that did not finish
  State& s = *state_;
  if (s.finished) return;
  s.finished = true;
  // A process that ends writes no checkpoint (a save that failed left it at 1): the final push
  // must not leave a Pushgateway holding a save in progress, which the stall alert passes over.
  s.checkpoint_in_progress->Set(0);
  if (!s.pusher.joinable()) return;
  std::unique_lock lock(s.push_mutex);
  s.stopping = true;
  s.push_wanted.notify_one();
  if (s.push_loop_ended.wait_for(lock, kFinalPushWait, [&s] { return s.pusher_done; })) {
    lock.unlock();
    s.pusher.join();
    return;
  }
  lock.unlock();
  std::cerr << "metrics: rank " << s.options.rank << ": the last push to "
            << s.options.pushgateway_url << " has not finished after " << kFinalPushWait.count()
            << " s; exiting without it\n";
  // The push thread still uses the gateway and the registry: it and what it uses are left to
  // the process's exit, which ends it (a State destroyed under it would be used after free).
  s.endpoint.reset();
  s.pusher.detach();
  static_cast<void>(state_.release());
}

void Metrics::set_model_flops(double flops_per_token) {
  State& s = state();
  s.flops_per_token = flops_per_token;
  if (s.mfu || s.options.peak_flops <= 0 || flops_per_token <= 0) return;
  s.mfu.emplace(
      gauge_family(*s.registry, "mantissa_mfu_ratio",
                   "Model FLOPs utilisation of the last step, a fraction of mantissa_peak_flops"),
      s.rank_labels);
  gauge_family(*s.registry, "mantissa_peak_flops",
               "Peak FLOP/s of one rank that mantissa_mfu_ratio is measured against")
      .Add(s.rank_labels)
      .Set(s.options.peak_flops);
}

void Metrics::record_step(const StepRecord& record) {
  State& s = state();
  s.reported = true;
  const train::StepReport& report = record.report;
  s.loss_scale->set(report.loss_scale);
  if (report.skipped) s.overflow_steps->Increment();
  s.steps->Increment();
  s.step->set(static_cast<double>(report.step + 1));
  s.tokens->Increment(static_cast<double>(report.tokens));
  s.data_epoch->set(record.epoch);
  s.loss->set(report.loss);
  // A skipped step's gradients were not finite: its norm says nothing.
  if (!report.skipped) s.grad_norm->set(report.grad_norm);
  s.learning_rate->set(report.lr);
  if (s.mfu && record.step_seconds > 0) {
    s.mfu->set(record.tokens_per_s() * s.flops_per_token / s.options.peak_flops);
  }
  s.step_seconds->Observe(record.step_seconds);
  s.allreduce_seconds->Observe(record.allreduce_seconds);
  s.allreduce_bytes->Increment(static_cast<double>(record.allreduce_bytes));
  if (record.val_loss) {
    if (s.val_loss->shown()) s.rises = *record.val_loss > s.last_val_loss ? s.rises + 1 : 0;
    s.last_val_loss = *record.val_loss;
    s.val_loss->set(*record.val_loss);
    s.val_loss_rises->set(s.rises);
  }
  for (const Fp8TensorStat& stat : record.fp8) {
    auto it = s.fp8.find(stat.tensor);
    if (it == s.fp8.end()) {
      Labels labels = s.rank_labels;
      labels.emplace("tensor", stat.tensor);
      it = s.fp8
               .emplace(stat.tensor, std::pair{&s.fp8_amax_family->Add(labels),
                                               &s.fp8_scale_family->Add(labels)})
               .first;
    }
    it->second.first->Set(stat.amax);
    it->second.second->Set(stat.scale);
  }

  s.show_progress();

  // Every push_every steps, and also after a step that ends kPushAtLeastEvery after the last
  // push: the alerts read mantissa_progress_timestamp_seconds from the Pushgateway, which steps
  // of a minute and push_every 10 would leave 10 minutes old at times.
  ++s.steps_since_push;
  if (s.steps_since_push >= s.options.push_every) {
    s.request_push();
  } else {
    s.push_if_stale();
  }
}

void Metrics::record_evaluating() {
  State& s = state();
  s.show_progress();
  s.push_if_stale();
}

void Metrics::State::push_if_stale() {
  if (std::chrono::steady_clock::now() - last_push_request >= kPushAtLeastEvery) request_push();
}

void Metrics::State::request_push() {
  // Pushes between a run's start and its end only with push_every > 0, and none before it
  // recorded something (see finish()).
  if (gateway == nullptr || options.push_every <= 0 || !reported) return;
  steps_since_push = 0;
  last_push_request = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(push_mutex);
    push_pending = true;
  }
  push_wanted.notify_one();
}

void Metrics::State::show_progress() {
  progress_time->Set(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void Metrics::State::show_checkpoint(std::int64_t step, double saved_unix_time) {
  last_checkpoint_step->set(static_cast<double>(step));
  if (saved_unix_time > 0) last_checkpoint_time->set(saved_unix_time);
}

void Metrics::record_started() {
  State& s = state();
  s.reported = true;
  s.request_push();
}

void Metrics::record_first_step(std::int64_t steps_done) {
  State& s = state();
  s.step->set(static_cast<double>(steps_done));
  s.request_push();
}

void Metrics::record_checkpoint_start() {
  State& s = state();
  // From here the alerts time the save or load (a resume's follows the whole setup).
  s.show_progress();
  s.checkpoint_in_progress->Set(1);
  s.request_push();
}

void Metrics::State::end_checkpoint_io() {
  checkpoint_in_progress->Set(0);
  show_progress();
  request_push();
}

void Metrics::record_checkpoint_loaded() {
  state().end_checkpoint_io();
}

void Metrics::record_checkpoint(std::int64_t step, double seconds, double saved_unix_time) {
  State& s = state();
  s.reported = true;
  s.show_checkpoint(step, saved_unix_time);
  s.checkpoint_seconds->Observe(seconds);
  s.end_checkpoint_io();
}

void Metrics::record_resumed_checkpoint(std::int64_t step, double saved_unix_time) {
  State& s = state();
  s.reported = true;
  s.show_checkpoint(step, saved_unix_time);
  s.show_progress();
  s.request_push();
}

std::optional<ValLossTrend> Metrics::val_loss_trend() const {
  if (!state().val_loss->shown()) return std::nullopt;
  return ValLossTrend{state().last_val_loss, state().rises};
}

void Metrics::record_resumed_val_loss(const ValLossTrend& trend) {
  State& s = state();
  s.reported = true;
  s.last_val_loss = trend.last_val_loss;
  s.rises = trend.rises;
  s.val_loss->set(trend.last_val_loss);
  s.val_loss_rises->set(trend.rises);
}

void Metrics::record_finished() {
  state().reported = true;
  state().run_finished->Set(1);
}

void Metrics::forget_ranks(const std::vector<int>& ranks) {
  State& s = state();
  if (s.gateway == nullptr || ranks.empty()) return;
  {
    std::lock_guard lock(s.push_mutex);
    s.ranks_to_forget.insert(s.ranks_to_forget.end(), ranks.begin(), ranks.end());
  }
  s.push_wanted.notify_one();
}

int Metrics::listening_port() const {
  return state().endpoint ? state().endpoint->port() : 0;
}

}  // namespace mantissa::metrics

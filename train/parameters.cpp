#include "train/parameters.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "core/error.h"
#include "core/int_math.h"

namespace mantissa::train {
namespace {

// FP32 elements per staging chunk when weights pass from the host to the store (4 MiB).
constexpr int64_t kStagingElements = int64_t{1} << 20;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Standard normal from two counter-based uniforms (Box-Muller), random_u32(stream, 2i) and
// (stream, 2i + 1), so element i of a parameter gets the same value however the parameters
// are laid out. `random` is a RandomStream over `stream` (its key is derived once per run of
// indices, not per call).
float normal_sample(core::RandomStream& random, int64_t i) {
  const auto index = static_cast<uint64_t>(i);
  const double u1 = (random(2 * index) + 1.0) / 4294967297.0;  // (0, 1)
  const double u2 = random(2 * index + 1) / 4294967296.0;      // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// out[i] = the initial value of element first + i of the parameter, for i < count.
void fill_initial(const ParameterSpec& spec, uint64_t seed, int64_t first, int64_t count,
                  float* out) {
  switch (spec.init) {
    case Init::kZeros: std::fill(out, out + count, 0.0f); break;
    case Init::kOnes: std::fill(out, out + count, 1.0f); break;
    case Init::kNormal: {
      // A logarithm and a cosine an element: GPT-2's 124M parameters took 11 s on one core.
      // Each value depends only on its index, so the threads change nothing; short pieces
      // (biases, norms) stay on the calling thread.
      const uint64_t stream = core::mix64(seed) ^ fnv1a(spec.name);
#pragma omp parallel if (count >= (1 << 16))
      {
        core::RandomStream random(stream);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; ++i) {
          out[i] = spec.init_std * normal_sample(random, first + i);
        }
      }
      break;
    }
  }
}

}  // namespace

std::vector<int64_t> split_aligned(int64_t n, int parts) {
  MANTISSA_CHECK(n >= 0 && parts > 0,
                 "split_aligned: cannot split " << n << " elements into " << parts << " parts");
  const int64_t per_part = core::ceil_div(n, parts);
  const int64_t base = core::round_up(per_part, kParameterAlignment);
  std::vector<int64_t> counts;
  for (int r = 0; r < parts; ++r) counts.push_back(std::clamp<int64_t>(n - r * base, 0, base));
  return counts;
}

int ParameterStore::add(ParameterSpec spec) {
  MANTISSA_CHECK(!masters_.defined(),
                 "ParameterStore::add(" << spec.name << "): parameters are already allocated");
  MANTISSA_CHECK(names_.insert(spec.name).second,
                 "ParameterStore::add: duplicate parameter name " << spec.name);
  Parameter p;
  p.offset = flat_numel_;
  p.spec = std::move(spec);
  const int64_t n = p.numel();
  flat_numel_ += core::round_up(n, kParameterAlignment);
  params_.push_back(std::move(p));
  return size() - 1;
}

void ParameterStore::allocate(core::Backend& backend, core::DType compute_dtype, uint64_t seed,
                              MasterShard shard) {
  MANTISSA_CHECK(!masters_.defined(), "ParameterStore::allocate: called twice");
  MANTISSA_CHECK(shard.world > 0 && shard.rank >= 0 && shard.rank < shard.world,
                 "ParameterStore::allocate: rank " << shard.rank << " of a world of " << shard.world
                                                   << " has no shard");
  const core::Device device = backend.device();
  const std::vector<int64_t> counts = split_aligned(flat_numel_, shard.world);
  const auto rank = static_cast<size_t>(shard.rank);
  masters_begin_ = std::accumulate(counts.begin(), counts.begin() + shard.rank, int64_t{0});
  masters_ = core::Tensor::empty(core::Shape{counts[rank]}, core::DType::kF32, device);
  grads_ = core::Tensor::empty(core::Shape{flat_numel_}, core::DType::kF32, device);
  compute_ = core::Tensor::empty(core::Shape{flat_numel_}, compute_dtype, device);
  for (Parameter& p : params_) {
    if (keeps_all_masters()) p.master = masters_.view(p.offset, p.spec.shape);
    p.grad = grads_.view(p.offset, p.spec.shape);
    p.compute = compute_.view(p.offset, p.spec.shape);
  }
  zero_grad(backend);

  // The initial values, one chunk at a time: generated on the host (zero in the padding),
  // staged to the device when the store lives elsewhere, and set.
  const core::Shape chunk_shape{std::min(kStagingElements, flat_numel_)};
  core::Tensor host = core::Tensor::empty(chunk_shape, core::DType::kF32);
  core::Tensor staged =
      device.is_cpu() ? host : core::Tensor::empty(chunk_shape, core::DType::kF32, device);
  for (int64_t begin = 0; begin < flat_numel_; begin += kStagingElements) {
    const int64_t n = std::min(kStagingElements, flat_numel_ - begin);
    float* values = host.data_as<float>();
    std::fill(values, values + n, 0.0f);
    for (const Parameter& p : params_) {
      const int64_t lo = std::max(begin, p.offset);
      const int64_t hi = std::min(begin + n, p.offset + p.numel());
      if (lo < hi) fill_initial(p.spec, seed, lo - p.offset, hi - lo, values + (lo - begin));
    }
    const core::Shape shape{n};
    core::Tensor chunk = staged.view(0, shape);
    if (!device.is_cpu()) backend.copy(host.view(0, shape), chunk);
    set_range(backend, chunk, begin);
    backend.synchronize();  // the host chunk is refilled next
  }
}

void ParameterStore::keep_masters(core::Backend& backend, int64_t begin, int64_t end) {
  MANTISSA_CHECK(keeps_all_masters(),
                 "ParameterStore::keep_masters: already keeps only the masters ["
                     << masters_begin_ << ", " << masters_begin_ + masters_.numel() << ")");
  MANTISSA_CHECK(0 <= begin && begin <= end && end <= flat_numel_,
                 "ParameterStore::keep_masters: [" << begin << ", " << end
                                                   << ") is not a range of the " << flat_numel_
                                                   << " flat elements");
  core::Tensor kept =
      core::Tensor::empty(core::Shape{end - begin}, core::DType::kF32, backend.device());
  backend.copy(masters_.view(begin, kept.shape()), kept);
  backend.synchronize();  // the copy is done before the full buffer is freed
  for (Parameter& p : params_) p.master = core::Tensor();
  masters_ = std::move(kept);
  masters_begin_ = begin;
}

void ParameterStore::require_all_masters(const std::string& who) const {
  MANTISSA_CHECK(keeps_all_masters(), who << ": the parameter store keeps only the masters ["
                                          << masters_begin_ << ", "
                                          << masters_begin_ + masters_.numel() << ") of "
                                          << flat_numel_ << " (one ZeRO-1 shard)");
}

void ParameterStore::set_weights(core::Backend& backend, const core::Tensor& weights) {
  MANTISSA_CHECK(weights.dtype() == core::DType::kF32 && weights.numel() == flat_numel_,
                 "ParameterStore::set_weights: expects f32[" << flat_numel_ << "], got "
                                                             << weights.describe());
  const core::Tensor flat = weights.reshape(core::Shape{flat_numel_});
  if (weights.device() == backend.device()) {
    set_range(backend, flat, 0);
  } else {
    // Through a device chunk, so that no second full FP32 copy of the weights is made there.
    core::Tensor staged = core::Tensor::empty(core::Shape{std::min(kStagingElements, flat_numel_)},
                                              core::DType::kF32, backend.device());
    for (int64_t begin = 0; begin < flat_numel_; begin += kStagingElements) {
      const core::Shape shape{std::min(kStagingElements, flat_numel_ - begin)};
      core::Tensor chunk = staged.view(0, shape);
      backend.copy(flat.view(begin, shape), chunk);
      set_range(backend, chunk, begin);
    }
  }
  backend.synchronize();  // `weights` and the staging chunk may go away after the return
}

void ParameterStore::set_range(core::Backend& backend, const core::Tensor& values, int64_t begin) {
  const int64_t end = begin + values.numel();
  const int64_t lo = std::max(begin, masters_begin_);
  const int64_t hi = std::min(end, masters_begin_ + masters_.numel());
  if (lo < hi) {
    core::Tensor kept = masters_.view(lo - masters_begin_, core::Shape{hi - lo});
    backend.copy(values.view(lo - begin, kept.shape()), kept);
  }
  core::Tensor compute = compute_.view(begin, values.shape());
  backend.cast(values, compute, core::CastParams{});
}

void ParameterStore::refresh_compute_copy(core::Backend& backend) {
  core::Tensor range = compute_.view(masters_begin_, masters_.shape());
  backend.cast(masters_, range, core::CastParams{});
}

void ParameterStore::zero_grad(core::Backend& backend) {
  backend.fill(grads_, 0.0f);
}

int64_t ParameterStore::parameter_count() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.numel();
  return n;
}

int ParameterStore::find_by_flat_index(int64_t index) const {
  for (int i = 0; i < size(); ++i) {
    const Parameter& p = params_[static_cast<size_t>(i)];
    if (index >= p.offset && index < p.offset + p.numel()) return i;
  }
  return -1;
}

void ParameterStore::zero_from(core::Backend& backend, int index, int64_t first) {
  const Parameter& p = (*this)[index];
  if (first == p.numel()) return;
  core::Tensor compute = p.compute.view(first, core::Shape{p.numel() - first});
  backend.fill(compute, 0.0f);
  const int64_t begin = std::max(p.offset + first, masters_begin_);
  const int64_t end = std::min(p.offset + p.numel(), masters_begin_ + masters_.numel());
  if (begin < end) {
    core::Tensor kept = masters_.view(begin - masters_begin_, core::Shape{end - begin});
    backend.fill(kept, 0.0f);
  }
}

const Parameter& ParameterStore::named(const std::string& name) const {
  for (const Parameter& p : params_) {
    if (p.spec.name == name) return p;
  }
  MANTISSA_FAIL("the model has no parameter '" << name << "'");
}

}  // namespace mantissa::train

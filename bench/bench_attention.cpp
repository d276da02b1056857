// Causal self-attention, forward and backward, timed on each backend next to an anchor
// measured in the same run. Nothing here passes or fails on time; a way whose attention is
// not the op's (the composed routine, flash attention) fails, after the figures (exit 1).
//
//   bench_attention [cpu [B T C H [repeats]]]   default: the reference config's attention
//                                               (B 8, T 256, C 384, H 6), 9 repeats
//   bench_attention gpu [B T C H [repeats]]     default: GPT-2 124M's (B 16, T 1024, C 768,
//                                               H 12), 20 repeats; "no CUDA device" without one
//
// CPU: the composed routine (core/ops/attention.h: split_heads, batched gemm, causal softmax,
// merge_heads) and flash attention (the CPU's reference loops, which a CPU run uses only with
// MANTISSA_FLASH_ATTENTION=1) next to the CPU backend's attention op, in BF16 and FP32, run in
// turn, repeat by repeat, so that load from other processes hits both alike, and the median,
// minimum and maximum of the repeats are printed (their spread is the noise).
// GPU: the attention op (the composed routine) in BF16 next to its six batched GEMMs alone on
// the same operands, which are the part tensor cores run: the rest (permutations, softmax) is
// what the difference costs; then flash attention (cuda_flash_attention.cu) on the same
// operands, where the device has its kernels. TFLOP/s count the full T x T products the
// composed GEMMs compute (2 B H T^2 D per product, twice forward, four times backward) for
// every row, flash included, so the rates compare as times do (flash skips the tiles above
// the diagonal, and its backward recomputes S and dP for dQ).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_main.h"
#include "core/error.h"
#include "core/ops/attention.h"
#include "core/ops/backend.h"
#include "core/ops/cpu_switches.h"

namespace mantissa::core {
namespace {

struct Shape4 {
  int64_t B, T, C, H;
};

struct Stats {
  double median, min, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

double seconds(Backend& be, const std::function<void()>& op) {
  be.synchronize();
  const auto start = std::chrono::steady_clock::now();
  op();
  be.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Random operands on the host, copied to the backend's device.
Tensor random_tensor(Backend& be, const Shape& shape, DType dtype, std::mt19937_64& rng) {
  Tensor f32 = Tensor::empty(shape, DType::kF32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data_as<float>()[i] = normal(rng);
  Tensor host = Tensor::empty(shape, dtype);
  make_cpu_backend()->cast(f32, host, {});
  Tensor t = Tensor::empty(shape, dtype, be.device());
  be.copy(host, t);
  return t;
}

struct Operands {
  Tensor qkv, out, att, dout, dqkv;
};

Operands operands(Backend& be, const Shape4& s, DType dtype, std::mt19937_64& rng) {
  const Device dev = be.device();
  return {random_tensor(be, Shape{s.B, s.T, 3 * s.C}, dtype, rng),
          Tensor::empty(Shape{s.B, s.T, s.C}, dtype, dev),
          Tensor::empty(Shape{s.B, s.H, s.T, s.T}, dtype, dev),
          random_tensor(be, Shape{s.B, s.T, s.C}, dtype, rng),
          Tensor::empty(Shape{s.B, s.T, 3 * s.C}, dtype, dev)};
}

void print(const char* what, const Stats& s) {
  std::printf("  %-28s median %9.2f ms   (min %9.2f, max %9.2f)\n", what, s.median * 1e3,
              s.min * 1e3, s.max * 1e3);
}

// Two measures of how far x lies from ref (host tensors of one shape, read as floats):
//  - normwise, |x - ref| / |ref| over the whole tensor: a scale off by a few % shows;
//  - elementwise, the largest |x - ref| / (|ref| + rms of ref's row): one wrong element among
//    millions shows, relative to its row's scale (a token's early rows average few values,
//    its late rows many) where the element itself is near 0.
struct Difference {
  double normwise = 0;
  double elementwise = 0;
};

Difference difference(const Tensor& x, const Tensor& ref) {
  const auto floats = [](const Tensor& t) {
    Tensor f = Tensor::empty(t.shape(), DType::kF32);
    make_cpu_backend()->cast(t, f, {});
    return f;
  };
  const Tensor a = floats(x), b = floats(ref);
  const int64_t width = b.shape()[-1];
  Difference d;
  double all_errors = 0, all_squares = 0;
  for (int64_t row = 0; row < b.numel(); row += width) {
    const float* got = a.data_as<float>() + row;
    const float* want = b.data_as<float>() + row;
    double squares = 0;
    for (int64_t i = 0; i < width; ++i) squares += static_cast<double>(want[i]) * want[i];
    all_squares += squares;
    const double rms = std::sqrt(squares / static_cast<double>(width));
    for (int64_t i = 0; i < width; ++i) {
      const double error = std::abs(static_cast<double>(got[i]) - want[i]);
      all_errors += error * error;
      // A NaN stays (max would drop it); a zero row gives 0 or inf.
      const double relative = error == 0 ? 0 : error / (std::abs(want[i]) + rms);
      d.elementwise = std::isnan(relative) ? relative : std::max(d.elementwise, relative);
    }
  }
  d.normwise = std::sqrt(all_errors / all_squares);
  return d;
}

// The composed routine and flash attention (where it runs) compute the op's attention, forward
// and backward: a way that computed something else must not be timed as a fast one. They
// round differently, by about the compute dtype's precision: in 16 bits the op and the
// composed routine round the scores q.k before the softmax and flash does not, which moves a
// scaled score z by up to 2^-9 |z| (|z| reaches about 5 on these unit Gaussian operands), a
// probability by about 1%, and an output or a gradient by a few % of its row's rms (at most
// 0.064 elementwise measured on the CPU at T 256 to 2048, forward and backward; 0.005
// normwise). A wrong element is off by order 1; a wrong scale moves the whole tensor.
void check_ways_agree(Backend& be, Operands& o, int n_head, Tensor& lse, bool flash) {
  const bool f32 = o.qkv.dtype() == DType::kF32;
  const Difference bound = {f32 ? 1e-4 : 2e-2, f32 ? 1e-4 : 0.25};
  const auto on_host = [&](const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    be.copy(t, h);
    be.synchronize();
    return h;
  };
  be.attention_forward(o.qkv, o.out, o.att, n_head);
  be.attention_backward(o.dout, o.qkv, o.att, o.dqkv, n_head);
  const Tensor out = on_host(o.out), dqkv = on_host(o.dqkv);
  Difference worst;
  const auto compare = [&](const char* way) {
    for (const auto& [what, x, ref] :
         {std::tuple{"forward", &o.out, &out}, std::tuple{"backward", &o.dqkv, &dqkv}}) {
      const Difference d = difference(on_host(*x), *ref);
      worst = {std::max(worst.normwise, d.normwise), std::max(worst.elementwise, d.elementwise)};
      if (!(d.normwise <= bound.normwise && d.elementwise <= bound.elementwise)) {
        throw Error(std::string("the ") + way + " " + what + " differs from the op's by " +
                    std::to_string(d.normwise) + " normwise (bound " +
                    std::to_string(bound.normwise) + "), " + std::to_string(d.elementwise) +
                    " elementwise (bound " + std::to_string(bound.elementwise) + ")");
      }
    }
  };
  composed_attention_forward(be, o.qkv, o.out, o.att, n_head);
  composed_attention_backward(be, o.dout, o.qkv, o.att, o.dqkv, n_head);
  compare("composed");
  if (flash) {
    be.flash_attention_forward(o.qkv, o.out, lse, n_head);
    be.flash_attention_backward(o.dout, o.qkv, o.out, lse, o.dqkv, n_head);
    compare("flash");
  }
  std::printf("  composed%s against the op: difference at most %.1e normwise, %.1e elementwise\n",
              flash ? " and flash" : "", worst.normwise, worst.elementwise);
}

int run_cpu(const Shape4& s, int repeats) {
  std::printf("%s\n", cpu_paths_description().c_str());
  std::printf("CPU attention, B %lld T %lld C %lld H %lld, %d repeats\n",
              static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.C),
              static_cast<long long>(s.H), repeats);
  auto be = make_cpu_backend();
  std::mt19937_64 rng(1);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    Operands o = operands(*be, s, dtype, rng);
    const int n_head = static_cast<int>(s.H);
    Tensor lse = Tensor::empty(Shape{s.B, s.H, s.T}, DType::kF32);
    std::vector<double> op_fwd, op_bwd, comp_fwd, comp_bwd, flash_fwd, flash_bwd;
    for (int r = 0; r <= repeats; ++r) {  // repeat 0 warms up and is not counted
      const double a = seconds(*be, [&] { be->attention_forward(o.qkv, o.out, o.att, n_head); });
      const double b =
          seconds(*be, [&] { be->attention_backward(o.dout, o.qkv, o.att, o.dqkv, n_head); });
      const double c =
          seconds(*be, [&] { composed_attention_forward(*be, o.qkv, o.out, o.att, n_head); });
      const double d = seconds(
          *be, [&] { composed_attention_backward(*be, o.dout, o.qkv, o.att, o.dqkv, n_head); });
      const double e =
          seconds(*be, [&] { be->flash_attention_forward(o.qkv, o.out, lse, n_head); });
      const double f = seconds(
          *be, [&] { be->flash_attention_backward(o.dout, o.qkv, o.out, lse, o.dqkv, n_head); });
      if (r == 0) continue;
      op_fwd.push_back(a);
      op_bwd.push_back(b);
      comp_fwd.push_back(c);
      comp_bwd.push_back(d);
      flash_fwd.push_back(e);
      flash_bwd.push_back(f);
    }
    std::printf("%s:\n", dtype_name(dtype));
    print("attention op forward", stats(op_fwd));
    print("composed forward", stats(comp_fwd));
    print("attention op backward", stats(op_bwd));
    print("composed backward", stats(comp_bwd));
    print("flash forward", stats(flash_fwd));
    print("flash backward", stats(flash_bwd));
    for (const auto& [name, fwd, bwd] : {std::tuple{"composed", &comp_fwd, &comp_bwd},
                                         std::tuple{"flash", &flash_fwd, &flash_bwd}}) {
      std::vector<double> ratio;
      for (size_t i = 0; i < op_fwd.size(); ++i) {
        ratio.push_back(((*fwd)[i] + (*bwd)[i]) / (op_fwd[i] + op_bwd[i]));
      }
      const Stats rs = stats(ratio);
      std::printf("  %s / op, forward + backward: median %.2f (min %.2f, max %.2f)\n", name,
                  rs.median, rs.min, rs.max);
    }
    check_ways_agree(*be, o, n_head, lse, true);
  }
  return 0;
}

int run_gpu(const Shape4& s, int repeats) {
  if (!cuda_device_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  auto be = make_cuda_backend(0);
  const int64_t N = s.B * s.H, T = s.T, D = s.C / s.H;
  std::printf("GPU attention, B %lld T %lld C %lld H %lld, BF16, %d repeats\n",
              static_cast<long long>(s.B), static_cast<long long>(T), static_cast<long long>(s.C),
              static_cast<long long>(s.H), repeats);
  std::mt19937_64 rng(1);
  Operands o = operands(*be, s, DType::kBF16, rng);
  const int n_head = static_cast<int>(s.H);
  // The GEMM operands of the composed routine: q, k, v, dy, dq, dk, dv [N, T, D], and the
  // [N, T, T] scores and their gradient.
  const Device dev = be->device();
  std::vector<Tensor> heads;
  for (int i = 0; i < 7; ++i)
    heads.push_back(random_tensor(*be, Shape{N, T, D}, DType::kBF16, rng));
  Tensor scores = Tensor::empty(Shape{N, T, T}, DType::kBF16, dev);
  Tensor dscores = random_tensor(*be, Shape{N, T, T}, DType::kBF16, rng);
  GemmParams nt, tn;
  nt.trans_b = true;
  tn.trans_a = true;
  auto gemms_forward = [&] {
    be->gemm(heads[0], heads[1], scores, nt);
    be->gemm(dscores, heads[2], heads[4], {});
  };
  auto gemms_backward = [&] {
    be->gemm(heads[3], heads[2], scores, nt);
    be->gemm(dscores, heads[3], heads[6], tn);
    be->gemm(dscores, heads[1], heads[4], {});
    be->gemm(dscores, heads[0], heads[5], tn);
  };
  const double flops = 2.0 * static_cast<double>(N) * static_cast<double>(T * T * D);
  struct Row {
    const char* name;
    std::function<void()> op;
    double products;
  };
  const Row rows[] = {
      {"attention forward", [&] { be->attention_forward(o.qkv, o.out, o.att, n_head); }, 2},
      {"its two GEMMs alone", gemms_forward, 2},
      {"attention backward", [&] { be->attention_backward(o.dout, o.qkv, o.att, o.dqkv, n_head); },
       4},
      {"its four GEMMs alone", gemms_backward, 4},
  };
  Tensor lse = Tensor::empty(Shape{s.B, s.H, s.T}, DType::kF32, dev);
  const std::string no_flash = be->unsupported_flash_attention(DType::kBF16, D);
  std::vector<Row> all(std::begin(rows), std::end(rows));
  if (no_flash.empty()) {
    all.push_back(
        {"flash forward", [&] { be->flash_attention_forward(o.qkv, o.out, lse, n_head); }, 2});
    all.push_back({"flash backward",
                   [&] { be->flash_attention_backward(o.dout, o.qkv, o.out, lse, o.dqkv, n_head); },
                   4});
  } else {
    std::printf("  flash attention: not run: %s\n", no_flash.c_str());
  }
  for (const Row& row : all) {
    std::vector<double> t;
    for (int r = 0; r <= repeats; ++r) {
      const double x = seconds(*be, row.op);
      if (r > 0) t.push_back(x);
    }
    const Stats st = stats(t);
    std::printf("  %-24s median %8.3f ms (min %8.3f, max %8.3f) %7.1f TFLOP/s\n", row.name,
                st.median * 1e3, st.min * 1e3, st.max * 1e3,
                row.products * flops / st.median / 1e12);
  }
  check_ways_agree(*be, o, n_head, lse, no_flash.empty());
  return 0;
}

}  // namespace
}  // namespace mantissa::core

static int benchmark_main(int argc, char** argv) {
  using namespace mantissa::core;
  const mantissa::bench::Arguments args(
      argc, argv, "bench_attention [cpu|gpu [B T C H [repeats]]] (each >= 1, C a multiple of H)");
  args.expect_count_in({0, 1, 5, 6});
  const bool gpu = args.word(1, "cpu", {"cpu", "gpu"}) == "gpu";
  const Shape4 fallback = gpu ? Shape4{16, 1024, 768, 12} : Shape4{8, 256, 384, 6};
  const Shape4 s = {args.whole<int64_t>(2, fallback.B, 1), args.whole<int64_t>(3, fallback.T, 1),
                    args.whole<int64_t>(4, fallback.C, 1), args.whole<int64_t>(5, fallback.H, 1)};
  const int repeats = args.whole<int>(6, gpu ? 20 : 9, 1);
  if (s.C % s.H != 0) args.fail();
  return gpu ? run_gpu(s, repeats) : run_cpu(s, repeats);
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_attention",
                                         [&] { return benchmark_main(argc, argv); });
}

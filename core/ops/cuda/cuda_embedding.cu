// Token and position embeddings on the GPU; the CPU backend's twin is cpu_embedding.cpp.
// Operands are read and written as cuda_layer_io.cuh describes.
//
// Token ids are not checked against the table here: reading them back would synchronise the
// host at every call. An id outside [0, V) reads and writes nothing out of bounds: its output
// row is NaN (so the loss is, and the training step's non-finite check skips the step) and its
// gradient is dropped. The data loaders check every token on the host (train/data/corpus.h).
//
// Determinism: no kernel here uses floating-point atomics. dwpe and dwte are summed in
// position order, exactly as the CPU backend adds them, so both are bit-identical to the
// CPU's.
#include <cub/device/device_radix_sort.cuh>

#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarpSize;

// A token the tables have a row for; any other (the CPU backend throws for it) gives NaN in
// the forward and no gradient (backend.h).
__device__ __forceinline__ bool in_vocab(int64_t token, int64_t V) {
  return token >= 0 && token < V;
}

// out[b, t, c] = wte[tokens[b, t], c] + wpe[t, c] (wte alone when wpe.data is null), one
// thread per element; NaN for a token outside [0, V).
__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens, FloatIn wte,
                                         FloatIn wpe, FloatOut y, int64_t BT, int64_t T, int64_t V,
                                         int64_t C) {
  for (int64_t i = global_thread_index(); i < BT * C; i += grid_stride()) {
    const int64_t bt = i / C;
    const int64_t c = i % C;
    const int64_t token = tokens[bt];
    if (!in_vocab(token, V)) {
      store(y, i, NAN);
      continue;
    }
    const float e = load(wte, token * C + c);
    store(y, i, wpe.data == nullptr ? e : e + load(wpe, (bt % T) * C + c));
  }
}

// dwpe[t, c] += dout[0, t, c] + dout[1, t, c] + ..., one thread per (t, c), added into the
// gradient one batch row at a time as the CPU backend does. A position whose token lies
// outside [0, V) adds nothing (backend.h: its gradient is dropped, as dwte's).
__global__ void embedding_backward_wpe_kernel(FloatIn dout, const int32_t* __restrict__ tokens,
                                              float* __restrict__ dwpe, int64_t B, int64_t T,
                                              int64_t V, int64_t C) {
  for (int64_t i = global_thread_index(); i < T * C; i += grid_stride()) {
    const int64_t t = i / C;
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) {
      if (in_vocab(tokens[b * T + t], V)) acc += load(dout, b * T * C + i);
    }
    dwpe[i] = acc;
  }
}

// The (token, position) pairs to sort: keys are the tokens, with any id outside [0, V)
// replaced by V, so that the sort's bits cover every key and such positions form one run of
// their own, which the dwte kernel skips.
__global__ void sort_pairs_kernel(const int32_t* __restrict__ tokens, int32_t* __restrict__ keys,
                                  int32_t* __restrict__ positions, int64_t n, int32_t V) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int32_t token = tokens[i];
    keys[i] = in_vocab(token, V) ? token : V;
    positions[i] = static_cast<int32_t>(i);
  }
}

// dwte[token] += dout[position] for every position of every token. The (token, position)
// pairs arrive sorted by token, positions ascending within a token (a stable radix sort), so
// the positions of one token form a contiguous run. The warps at the start of each run own
// that dwte row, blockIdx.y choosing which 32 W of its columns (lane l takes
// the W consecutive columns at l W, one 16-byte load of a BF16 dout when W = 8): no two warps
// write the same element (no atomics) and each element receives its contributions in
// position order, like the CPU backend's loop. A token repeated r times (a few hundred for
// ",", " the" in a batch of 16K tokens) is one serial chain of r additions per column, so a
// warp loads the run's positions 32 at a time (one per lane, passed round with shuffles) and
// kWteRowsInFlight rows of dout before adding them in order: one memory latency per that
// many rows, not one per row and per column.
constexpr int kWteRowsInFlight = 8;

template <int W>
__global__ void embedding_backward_wte_kernel(FloatIn dout,
                                              const int32_t* __restrict__ sorted_tokens,
                                              const int32_t* __restrict__ sorted_positions,
                                              float* __restrict__ dwte, int64_t BT, int64_t V,
                                              int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= BT) return;
  const int32_t token = sorted_tokens[i];
  if (token >= V) return;                              // ids outside the table: dropped
  if (i > 0 && sorted_tokens[i - 1] == token) return;  // not the start of a run
  // The run's end, 32 entries per step: the entries equal to `token` are a prefix of any
  // window starting inside the run, so the first lane that differs marks the end.
  int64_t run_end = i + 1;
  for (;;) {
    const int64_t j = run_end + lane;
    const unsigned same = __ballot_sync(0xFFFFFFFFu, j < BT && sorted_tokens[j] == token);
    if (same != 0xFFFFFFFFu) {
      run_end += __ffs(~same) - 1;
      break;
    }
    run_end += kWarpSize;
  }

  const int64_t c = static_cast<int64_t>(blockIdx.y) * kWarpSize * W + lane * W;
  const bool active = c < C;  // every lane stays for the shuffles below
  float* row = dwte + static_cast<int64_t>(token) * C + c;
  float acc[W];
  if (active) load_as_float<W>(row, acc);
  for (int64_t j0 = i; j0 < run_end; j0 += kWarpSize) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kWarpSize), run_end - j0));
    const int32_t own_position = lane < count ? sorted_positions[j0 + lane] : 0;
    for (int u0 = 0; u0 < count; u0 += kWteRowsInFlight) {
      float v[kWteRowsInFlight][W];
#pragma unroll
      for (int u = 0; u < kWteRowsInFlight; ++u) {
        const int64_t position = __shfl_sync(0xFFFFFFFFu, own_position, u0 + u);
        if (active && u0 + u < count) load_chunk<W>(dout, position * C + c, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kWteRowsInFlight; ++u) {
        if (u0 + u < count) {
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] += v[u][k];
        }
      }
    }
  }
  if (active) store_from_float<W>(row, acc);
}

}  // namespace

void CudaBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                    Tensor& out) {
  const auto [B, T, V, C] = check_embedding_forward(tokens, wte, wpe, out, device());
  if (B * T * C == 0) return;

  embedding_forward_kernel<<<grid_size(B * T * C, kBlock, multiprocessor_count_), kBlock, 0,
                             stream()>>>(tokens.data_as<const int32_t>(), as_in(wte),
                                         wpe.defined() ? as_in(wpe) : FloatIn{nullptr, DType::kF32},
                                         as_out(out), B * T, T, V, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                                     Tensor& dwpe) {
  const auto [B, T, V, C] = check_embedding_backward(dout, tokens, dwte, dwpe, device());
  const int64_t BT = B * T;
  if (BT * C == 0) return;

  if (dwpe.defined()) {
    embedding_backward_wpe_kernel<<<grid_size(T * C, kBlock, multiprocessor_count_), kBlock, 0,
                                    stream()>>>(as_in(dout), tokens.data_as<const int32_t>(),
                                                dwpe.data_as<float>(), B, T, V, C);
    MANTISSA_CUDA_CHECK_LAUNCH();
  }

  // Group positions by token: a stable radix sort of (key, position) pairs over just the bits
  // a key in [0, V] uses. Temporaries are freed when this function returns (the allocator's
  // reuse is ordered on this stream).
  Tensor unsorted = Tensor::empty(Shape{2, BT}, DType::kI32, device());
  Tensor sorted = Tensor::empty(Shape{2, BT}, DType::kI32, device());
  int32_t* keys = unsorted.data_as<int32_t>();
  int32_t* positions = keys + BT;
  int32_t* sorted_tokens = sorted.data_as<int32_t>();
  int32_t* sorted_positions = sorted_tokens + BT;
  sort_pairs_kernel<<<grid_size(BT, kBlock, multiprocessor_count_), kBlock, 0, stream()>>>(
      tokens.data_as<const int32_t>(), keys, positions, BT, static_cast<int32_t>(V));
  MANTISSA_CUDA_CHECK_LAUNCH();
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= V) ++end_bit;
  const int num_items = static_cast<int>(BT);
  size_t temp_bytes = 0;
  MANTISSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_tokens,
                                                      positions, sorted_positions, num_items, 0,
                                                      end_bit, stream()));
  Tensor temp = Tensor::empty(Shape{static_cast<int64_t>(temp_bytes)}, DType::kU8, device());
  MANTISSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys, sorted_tokens,
                                                      positions, sorted_positions, num_items, 0,
                                                      end_bit, stream()));

  // 8 columns per lane when every dout and dwte row starts 16-byte aligned.
  const bool vectorised = C % 8 == 0 && aligned16(dout.data()) && aligned16(dwte.data());
  const int width = vectorised ? 8 : 1;
  const dim3 grid(static_cast<unsigned>(ceil_div(BT, kWarpsPerBlock)),
                  static_cast<unsigned>(ceil_div(C, kWarpSize * width)));
  if (vectorised) {
    embedding_backward_wte_kernel<8><<<grid, kBlock, 0, stream()>>>(
        as_in(dout), sorted_tokens, sorted_positions, dwte.data_as<float>(), BT, V, C);
  } else {
    embedding_backward_wte_kernel<1><<<grid, kBlock, 0, stream()>>>(
        as_in(dout), sorted_tokens, sorted_positions, dwte.data_as<float>(), BT, V, C);
  }
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core

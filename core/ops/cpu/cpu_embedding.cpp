// Token and position embeddings on the CPU, out[b, t] = wte[tokens[b, t]] + wpe[t] (the math
// follows llm.c's train_gpt2.c), or wte[tokens[b, t]] alone when there is no wpe. Operands are read
// and written as cpu_layer_io.h describes.
#include <algorithm>
#include <vector>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

void CpuBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                   Tensor& out) {
  const auto [B, T, V, C] = check_embedding_forward(tokens, wte, wpe, out, device());
  check_indices("embedding_forward", "token", tokens, V);

  const int32_t* tok = tokens.data_as<const int32_t>();
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(2 * C));
    float* e = buffer.data();
    float* p = e + C;
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      load(wte, tok[bt] * C, C, e);
      if (wpe.defined()) {
        load(wpe, (bt % T) * C, C, p);
        for (int64_t c = 0; c < C; ++c) e[c] += p[c];
      }
      store(e, C, out, bt * C);
    }
  }
}

// dwte[tokens[b, t]] += dout[b, t] and dwpe[t] += sum_b dout[b, t]. A token may appear at many
// positions, so rows of dwte receive many contributions: the work is split by channel blocks
// and each block walks the positions in order, which is race-free and deterministic.
void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                                    Tensor& dwpe) {
  const auto [B, T, V, C] = check_embedding_backward(dout, tokens, dwte, dwpe, device());
  check_indices("embedding_backward", "token", tokens, V);

  const int32_t* tok = tokens.data_as<const int32_t>();
  float* dte = dwte.data_as<float>();
  float* dpe = dwpe.defined() ? dwpe.data_as<float>() : nullptr;
  const int64_t blocks = ceil_div(C, kChannelBlock);
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kChannelBlock;
    const int64_t width = std::min(kChannelBlock, C - c0);
    float dy[kChannelBlock];
    for (int64_t bt = 0; bt < B * T; ++bt) {
      load(dout, bt * C + c0, width, dy);
      float* te = dte + tok[bt] * C + c0;
      for (int64_t c = 0; c < width; ++c) te[c] += dy[c];
      if (dpe == nullptr) continue;
      float* pe = dpe + (bt % T) * C + c0;
      for (int64_t c = 0; c < width; ++c) pe[c] += dy[c];
    }
  }
}

}  // namespace mantissa::core

// AlgorithmChoice: which of a GEMM plan's candidate algorithms runs (cuda_gemm.cu).
//
// cuBLASLt's heuristic returns several algorithms, best first, but one it returns may still
// refuse to run the problem (NVIDIA's FP8 sample warns that the first may not). So a plan
// keeps all of them and tries them in order until one runs; the one that ran is remembered
// and tried first on every later call of the same plan, and a plan none of whose candidates
// ran is remembered as such (the caller then takes its fallback, or reports the failure)
// without trying them all again. Nothing here knows CUDA, so the CPU tests check it.
#pragma once

namespace mantissa::core {

class AlgorithmChoice {
 public:
  explicit AlgorithmChoice(int candidates) : count_(candidates), exhausted_(candidates <= 0) {}

  // The candidate tried first: the one that ran last, 0 until one has.
  int preferred() const { return preferred_; }
  // True once every candidate has failed (or there were none).
  bool exhausted() const { return exhausted_; }

  // Calls attempt(i) (true: candidate i ran) for the preferred candidate, then for the others
  // in the heuristic's order, until one runs; returns its index, which becomes the preferred
  // one. Returns -1 when none runs, now or on an earlier call. An attempt throws for a failure
  // that is not a refusal; that leaves the choice as it was.
  template <class Attempt>
  int run(Attempt&& attempt) {
    if (exhausted_) return -1;
    for (int k = 0; k < count_; ++k) {
      // k = 0 is the preferred candidate; k = 1, 2, ... walk the others in order.
      const int i = k == 0 ? preferred_ : (k - 1 < preferred_ ? k - 1 : k);
      if (attempt(i)) {
        preferred_ = i;
        return i;
      }
    }
    exhausted_ = true;
    return -1;
  }

 private:
  int count_;
  int preferred_ = 0;
  bool exhausted_;
};

}  // namespace mantissa::core

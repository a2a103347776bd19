// Log-softmax of logit rows: y[r, c] = x[r, c] - max_r - log(sum_c exp(x[r, c] - max_r)).
// x, y: [rows, vocab] f32. Launch: grid = rows, block = 512. Fixed reductions (block_max /
// block_sum): a row's result does not depend on how many rows share the launch.
#include "common.cuh"

#define LSM_THREADS 512

extern "C" __global__ void __launch_bounds__(LSM_THREADS)
    log_softmax_f32(const float* __restrict__ x, float* __restrict__ y, int vocab) {
  __shared__ float scratch[32];
  const float* xr = x + (size_t)blockIdx.x * vocab;
  float* yr = y + (size_t)blockIdx.x * vocab;
  float m = SPECMLA_NEG_INF;
  for (int c = threadIdx.x; c < vocab; c += LSM_THREADS) m = fmaxf(m, xr[c]);
  m = block_max(m, scratch, LSM_THREADS);
  float s = 0.f;
  for (int c = threadIdx.x; c < vocab; c += LSM_THREADS) s += __expf(xr[c] - m);
  s = block_sum(s, scratch, LSM_THREADS);
  const float lse = m + __logf(s);
  for (int c = threadIdx.x; c < vocab; c += LSM_THREADS) yr[c] = xr[c] - lse;
}

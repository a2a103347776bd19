// Small-n GEMMs over f32 weights: the MoE router (kept f32, as transformers keeps it), f16
// weights widened to f32 at upload (exact), and the absorbed per-head MLA matrices (W_UK^T,
// W_UV, dequantised to f32 at upload).
// `gemm_f32_smalln`: y[t, r] = sum_k W[r, k] x[t, k], t < n <= 16; W: [rows, cols] f32; x: [n,
//   cols]; y: [n, rows]. grid = ceil(rows / 8), block = 256 (one warp per row).
// `gemm_grouped_f32`: y[a, r] = W[g[a]][r, :] . x[a, :] for every item a (one row of x per
//   item: a token's head, with g[a] its head); W: [G, rows, cols]; x: [A, cols]; y: [A, rows].
//   grid = (ceil(rows / 8), A), block = 256.
// Both: lane l accumulates k = l, l + 32, ... in increasing order, then the fixed warp butterfly
// adds the lanes — an element depends only on its weight row and its x row (batch invariant).
#include "common.cuh"

#define GEMM_F32_MAX_N 16

__device__ __forceinline__ float row_dot_f32(const float* __restrict__ w, const float* __restrict__ x,
                                             int cols, int lane) {
  float s = 0.f;
  for (int k = lane; k < cols; k += SPECMLA_WARP) s = fmaf(__ldg(w + k), x[k], s);
  return warp_sum(s);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    gemm_f32_smalln(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                    int rows, int cols, int n) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (r >= rows) return;
  const float* wr = w + (size_t)r * cols;
  float acc[GEMM_F32_MAX_N];
#pragma unroll
  for (int t = 0; t < GEMM_F32_MAX_N; t++) acc[t] = 0.f;
  for (int k = lane; k < cols; k += SPECMLA_WARP) {
    const float wk = __ldg(wr + k);
#pragma unroll
    for (int t = 0; t < GEMM_F32_MAX_N; t++)
      if (t < n) acc[t] = fmaf(wk, x[(size_t)t * cols + k], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < GEMM_F32_MAX_N; t++) {
    if (t < n) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) y[(size_t)t * rows + r] = s;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256)
    gemm_grouped_f32(const float* __restrict__ w, const float* __restrict__ x,
                     const int* __restrict__ g, float* __restrict__ y, int rows, int cols) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int a = blockIdx.y;
  if (r >= rows) return;
  const float* wr = w + ((size_t)g[a] * rows + r) * cols;
  const float s = row_dot_f32(wr, x + (size_t)a * cols, cols, lane);
  if (lane == 0) y[(size_t)a * rows + r] = s;
}

// Small-n GEMM over a bf16 weight: y[t, r] = sum_k W[r, k] * x[t, k] for t < n (n <= 16: a
// decode batch or the k + 1 tokens of a verification).
// W: [rows, cols] bf16 row-major (cols % 8 == 0); x: [n, cols] f32; y: [n, rows] f32.
// Launch: grid = ceil(rows / 8), block = 256 (one warp per row).
// Batch invariant by construction: lane l accumulates k = 8 l + 256 i + j (j < 8) in increasing
// i, j, for every t with the same code, then the fixed warp butterfly adds the lanes — so y[t, r]
// depends only on W[r, :] and x[t, :], never on n. Each weight row is read once per launch for
// all n columns (the memory-bound regime reads the weights once per step).
#include "common.cuh"

#define GEMM_MAX_N 16

// (256, 2): up to 128 registers a thread — ptxas would otherwise aim at 64 on sm_100 and spill
// the 16 accumulators.
extern "C" __global__ void __launch_bounds__(256, 2)
    gemm_bf16_smalln(const bf16_t* __restrict__ w, const float* __restrict__ x,
                     float* __restrict__ y, int rows, int cols, int n) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (r >= rows) return;
  float acc[GEMM_MAX_N];
#pragma unroll
  for (int t = 0; t < GEMM_MAX_N; t++) acc[t] = 0.f;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)r * cols);
  const int vecs = cols / 8;
  for (int v = lane; v < vecs; v += SPECMLA_WARP) {
    float wf[8];
    bf16x8(__ldg(wr + v), wf);
#pragma unroll
    for (int t = 0; t < GEMM_MAX_N; t++) {
      if (t < n) {
        const float4* xv = reinterpret_cast<const float4*>(x + (size_t)t * cols + 8 * v);
        const float4 a = xv[0], b = xv[1];
        float s = acc[t];
        s = fmaf(wf[0], a.x, s); s = fmaf(wf[1], a.y, s);
        s = fmaf(wf[2], a.z, s); s = fmaf(wf[3], a.w, s);
        s = fmaf(wf[4], b.x, s); s = fmaf(wf[5], b.y, s);
        s = fmaf(wf[6], b.z, s); s = fmaf(wf[7], b.w, s);
        acc[t] = s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < GEMM_MAX_N; t++) {
    if (t < n) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) y[(size_t)t * rows + r] = s;
    }
  }
}

// Small-n GEMM over an fp8 e4m3 weight with 128 x 128 block scales (DeepSeek's checkpoint
// format, the weight stays fp8 on the device): y[t, r] = sum_b scale[r / 128, b] *
// sum_{k in block b} W[r, k] x[t, k].
// W: [rows, cols] e4m3 bytes (cols % 128 == 0); scale: [ceil(rows / 128), cols / 128] f32;
// x: [n, cols] f32 (n <= 16); y: [n, rows] f32. Launch: grid = ceil(rows / 8), block = 256.
// Lane l reads 16 weight bytes at k = 16 l + 512 i: they sit in block (16 l + 512 i) / 128, so
// each lane keeps one partial per 16 bytes, scales it and accumulates in increasing i; the
// fixed butterfly adds the lanes. Batch invariant as gemm_bf16.cu.
#include "common.cuh"

#define GEMM_MAX_N 16

__device__ __forceinline__ void fp8x16(const uint4 u, float* f) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 16; i++) f[i] = fp8_e4m3_to_f32((unsigned char)(w[i / 4] >> (8 * (i % 4))));
}

// (256, 2): up to 128 registers a thread — ptxas would otherwise aim at 64 on sm_100 and spill
// the 16 accumulators.
extern "C" __global__ void __launch_bounds__(256, 2)
    gemm_fp8_block_smalln(const unsigned char* __restrict__ w, const float* __restrict__ scale,
                          const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                          int n) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int sblocks = cols / 128;
  const float* srow = scale + (size_t)(r / 128) * sblocks;
  float acc[GEMM_MAX_N];
#pragma unroll
  for (int t = 0; t < GEMM_MAX_N; t++) acc[t] = 0.f;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)r * cols);
  const int vecs = cols / 16;
  for (int v = lane; v < vecs; v += SPECMLA_WARP) {
    float wf[16];
    fp8x16(__ldg(wr + v), wf);
    const float sc = srow[(16 * v) / 128];
#pragma unroll
    for (int t = 0; t < GEMM_MAX_N; t++) {
      if (t < n) {
        const float* xv = x + (size_t)t * cols + 16 * v;
        float p = 0.f;
#pragma unroll
        for (int j = 0; j < 16; j++) p = fmaf(wf[j], xv[j], p);
        acc[t] = fmaf(p, sc, acc[t]);
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

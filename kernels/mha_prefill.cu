// Decompressed-MHA causal attention for prompt tokens (the MLA prefill path): per query token t
// of a sequence and head h, softmax over the keys j <= pos[t] of scale * q[t, h] . k[j, h], then
// out[t, h] = sum_j p_j v[j, h]. q: [n_q, H, DQK] f32 (nope | rope), k: [n_k, H, DQK] f32,
// v: [n_k, H, DV] f32 (kv_b_proj applied by the caller), pos: [n_q] i32 (a query sees keys
// 0..=pos), out: [n_q, H, DV] f32. DQK <= 256, DV <= 256.
// Launch: grid = (n_q, H), block = 128. Keys are visited in tiles of 64 in increasing order with
// an online softmax (running max / sum rescaled per tile), every query with the same code: a
// query's result depends only on its own keys, never on the other queries of the launch.
#include "common.cuh"

#define MHA_TILE 64
#define MHA_THREADS 128

extern "C" __global__ void __launch_bounds__(MHA_THREADS)
    mha_prefill_f32(const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ v, const int* __restrict__ pos,
                    float* __restrict__ out, int heads, int dqk, int dv, float scale) {
  __shared__ float qs[256];
  __shared__ float p[MHA_TILE];
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_keys = pos[t] + 1;
  for (int d = threadIdx.x; d < dqk; d += MHA_THREADS) qs[d] = q[((size_t)t * heads + h) * dqk + d];
  __syncthreads();
  float m = SPECMLA_NEG_INF, l = 0.f;
  const int d0 = threadIdx.x, d1 = threadIdx.x + MHA_THREADS;  // this thread's output dims
  float acc0 = 0.f, acc1 = 0.f;
  for (int k0 = 0; k0 < n_keys; k0 += MHA_TILE) {
    const int kn = min(MHA_TILE, n_keys - k0);
    for (int j = warp; j < kn; j += MHA_THREADS / 32) {
      const float* kr = k + ((size_t)(k0 + j) * heads + h) * dqk;
      float s = 0.f;
      for (int d = lane; d < dqk; d += 32) s = fmaf(qs[d], kr[d], s);
      s = warp_sum(s);
      if (lane == 0) p[j] = s * scale;
    }
    __syncthreads();
    float tm = SPECMLA_NEG_INF;
    for (int j = threadIdx.x; j < kn; j += MHA_THREADS) tm = fmaxf(tm, p[j]);
    tm = block_max(tm, scratch, MHA_THREADS);
    const float nm = fmaxf(m, tm);
    const float corr = __expf(m - nm);  // 0 on the first tile (m = -inf)
    __syncthreads();
    for (int j = threadIdx.x; j < kn; j += MHA_THREADS) p[j] = __expf(p[j] - nm);
    __syncthreads();
    float ts = 0.f;
    for (int j = threadIdx.x; j < kn; j += MHA_THREADS) ts += p[j];
    ts = block_sum(ts, scratch, MHA_THREADS);
    l = l * corr + ts;
    m = nm;
    acc0 *= corr;
    acc1 *= corr;
    const float* vt = v + ((size_t)k0 * heads + h) * dv;
    const size_t vstride = (size_t)heads * dv;
    for (int j = 0; j < kn; j++) {
      if (d0 < dv) acc0 = fmaf(p[j], vt[j * vstride + d0], acc0);
      if (d1 < dv) acc1 = fmaf(p[j], vt[j * vstride + d1], acc1);
    }
    __syncthreads();
  }
  float* o = out + ((size_t)t * heads + h) * dv;
  if (d0 < dv) o[d0] = acc0 / l;
  if (d1 < dv) o[d1] = acc1 / l;
}

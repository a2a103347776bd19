// Absorbed MLA decode / verification attention over the paged latent cache, split-KV.
//
// Per query token t (a decode token, or one of up to 16 verification tokens of a sequence) and
// head h: scores s_j = scale * (q_lat[t, h] . c_kv[j] + q_pe[t, h] . k_pe[j]) over the keys
// j <= pos[t] of the token's sequence, softmax, out[t, h] = sum_j p_j c_kv[j] (the latent
// context; the caller applies W_UV and o_proj).
// lat / rope: the latent and rope widths (at most 512 / 64: DeepSeek V2 / V3 use exactly that);
// cache: [num_blocks, block_size, lat + rope] bf16 ([c_kv | k_pe] per slot);
// block_table: [n_seqs, max_blocks] i32; q_seq: [n_q] i32 (the token's sequence); q_pos: [n_q]
// i32 (its position: it sees keys 0..=pos); q_lat: [n_q, H, lat] f32; q_pe: [n_q, H, rope] f32.
//
// Pass 1 (`mla_decode_split`): grid = (n_q, H, n_splits), block = 128; split s covers keys
// [s * SPLIT, (s + 1) * SPLIT): the split size is a constant, so how a token's keys are split
// depends only on its own position — never on the batch. Each block writes its split's max m,
// sum l = sum exp(s_j - m) and acc[512] = sum exp(s_j - m) c_kv[j] (keys in increasing order).
// Pass 2 (`mla_decode_combine`): grid = (n_q, H), block = 128: splits merged in increasing
// order. Partials: part_ml [n_q, H, n_splits, 2], part_acc [n_q, H, n_splits, lat] f32.
// Reads: pass 1 reads each key row once for the scores and once (from L1 / L2) for the values.
#include "common.cuh"

#define MLA_LAT 512
#define MLA_ROPE 64
#define MLA_ROW 576
#define MLA_SPLIT 256
#define MLA_THREADS 128

extern "C" __global__ void __launch_bounds__(MLA_THREADS)
    mla_decode_split(const bf16_t* __restrict__ cache, const int* __restrict__ block_table,
                     int max_blocks, int block_size, const int* __restrict__ q_seq,
                     const int* __restrict__ q_pos, const float* __restrict__ q_lat,
                     const float* __restrict__ q_pe, float scale, int heads, int n_splits,
                     int lat, int rope, float* __restrict__ part_ml, float* __restrict__ part_acc) {
  __shared__ float q[MLA_ROW];
  __shared__ float p[MLA_SPLIT];
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seq = q_seq[t];
  const int n_keys = q_pos[t] + 1;
  const int k0 = sp * MLA_SPLIT;
  const int k1 = min(n_keys, k0 + MLA_SPLIT);
  const size_t part = ((size_t)t * heads + h) * n_splits + sp;
  if (k0 >= k1) {  // this split is past the token's keys: an empty partial
    if (threadIdx.x == 0) {
      part_ml[2 * part] = SPECMLA_NEG_INF;
      part_ml[2 * part + 1] = 0.f;
    }
    for (int d = threadIdx.x; d < lat; d += MLA_THREADS) part_acc[part * lat + d] = 0.f;
    return;
  }
  const int row_w = lat + rope;
  const float* ql = q_lat + ((size_t)t * heads + h) * lat;
  const float* qp = q_pe + ((size_t)t * heads + h) * rope;
  for (int d = threadIdx.x; d < row_w; d += MLA_THREADS) q[d] = d < lat ? ql[d] : qp[d - lat];
  __syncthreads();
  const int* bt = block_table + (size_t)seq * max_blocks;
  // scores: warp w takes keys k0 + w, k0 + w + 4, ...; lane l the dims l, l + 32, ... of a row
  for (int j = k0 + warp; j < k1; j += MLA_THREADS / 32) {
    const bf16_t* row = cache + ((size_t)bt[j / block_size] * block_size + j % block_size) * row_w;
    float s = 0.f;
    for (int d = lane; d < row_w; d += 32) s = fmaf(q[d], bf16_to_f32(row[d]), s);
    s = warp_sum(s);
    if (lane == 0) p[j - k0] = s * scale;
  }
  __syncthreads();
  float m = SPECMLA_NEG_INF;
  for (int j = threadIdx.x; j < k1 - k0; j += MLA_THREADS) m = fmaxf(m, p[j]);
  m = block_max(m, scratch, MLA_THREADS);
  __syncthreads();
  for (int j = threadIdx.x; j < k1 - k0; j += MLA_THREADS) p[j] = __expf(p[j] - m);
  __syncthreads();
  float l = 0.f;
  for (int j = threadIdx.x; j < k1 - k0; j += MLA_THREADS) l += p[j];
  l = block_sum(l, scratch, MLA_THREADS);
  // values: thread d owns latent dims d, d + 128, d + 256, d + 384; keys in increasing order
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j = k0; j < k1; j++) {
    const bf16_t* row = cache + ((size_t)bt[j / block_size] * block_size + j % block_size) * row_w;
    const float pj = p[j - k0];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int d = threadIdx.x + i * MLA_THREADS;
      if (d < lat) acc[i] = fmaf(pj, bf16_to_f32(row[d]), acc[i]);
    }
  }
  if (threadIdx.x == 0) {
    part_ml[2 * part] = m;
    part_ml[2 * part + 1] = l;
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int d = threadIdx.x + i * MLA_THREADS;
    if (d < lat) part_acc[part * lat + d] = acc[i];
  }
}

extern "C" __global__ void __launch_bounds__(MLA_THREADS)
    mla_decode_combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                       int heads, int n_splits, int lat, float* __restrict__ out) {
  const int t = blockIdx.x, h = blockIdx.y;
  const size_t base = ((size_t)t * heads + h) * n_splits;
  float mx = SPECMLA_NEG_INF;
  for (int s = 0; s < n_splits; s++) mx = fmaxf(mx, part_ml[2 * (base + s)]);
  float l = 0.f;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s = 0; s < n_splits; s++) {
    const float m = part_ml[2 * (base + s)];
    if (m == SPECMLA_NEG_INF) continue;
    const float f = __expf(m - mx);
    l = fmaf(part_ml[2 * (base + s) + 1], f, l);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int d = threadIdx.x + i * MLA_THREADS;
      if (d < lat) acc[i] = fmaf(part_acc[(base + s) * lat + d], f, acc[i]);
    }
  }
  float* o = out + ((size_t)t * heads + h) * lat;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int d = threadIdx.x + i * MLA_THREADS;
    if (d < lat) o[d] = acc[i] * inv;
  }
}

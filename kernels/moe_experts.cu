// Routed-expert SwiGLU over bf16 expert weights, grouped: every (token, expert) assignment of a
// step in one launch per stage.
// Stage 1 `moe_gate_up_bf16`: for assignment a (token tok[a], expert ex[a]):
//   hid[a, i] = silu(G_e x_t . ) * (U_e x_t)_i   — G, U: [E, inter, hidden] bf16, x: [n, hidden]
// grid = (ceil(inter / 8), n_assign), block = 256: one warp per (a, i), both dot products with the
// lane-fixed order of gemm_bf16.cu.
// Stage 2 `moe_down_bf16`: y[a, r] = D_e hid[a] — D: [E, hidden, inter]; grid = (ceil(hidden / 8),
// n_assign).
// Stage 3 `moe_combine`: out[t, r] = sum over t's assignments in slot order of w[a] y[a, r]
// (assignments listed token-major, `top_k` per token); grid = n, block = 256.
// Each assignment's result depends only on its token and expert (batch invariant); the weights of
// an expert are read once per assignment (decode batches route few tokens per expert).
#include "common.cuh"

__device__ __forceinline__ float row_dot_bf16(const bf16_t* __restrict__ w, const float* __restrict__ x,
                                              int cols, int lane) {
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  float s = 0.f;
  for (int v = lane; v < cols / 8; v += 32) {
    float wf[8];
    bf16x8(__ldg(wr + v), wf);
    const float4* xv = reinterpret_cast<const float4*>(x + 8 * v);
    const float4 a = xv[0], b = xv[1];
    s = fmaf(wf[0], a.x, s); s = fmaf(wf[1], a.y, s);
    s = fmaf(wf[2], a.z, s); s = fmaf(wf[3], a.w, s);
    s = fmaf(wf[4], b.x, s); s = fmaf(wf[5], b.y, s);
    s = fmaf(wf[6], b.z, s); s = fmaf(wf[7], b.w, s);
  }
  return warp_sum(s);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_gate_up_bf16(const bf16_t* __restrict__ gate, const bf16_t* __restrict__ up,
                     const float* __restrict__ x, const int* __restrict__ tok,
                     const int* __restrict__ ex, float* __restrict__ hid, int hidden, int inter) {
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int a = blockIdx.y;
  if (i >= inter) return;
  const size_t row = ((size_t)ex[a] * inter + i) * hidden;
  const float* xt = x + (size_t)tok[a] * hidden;
  const float g = row_dot_bf16(gate + row, xt, hidden, lane);
  const float u = row_dot_bf16(up + row, xt, hidden, lane);
  if (lane == 0) hid[(size_t)a * inter + i] = g / (1.f + __expf(-g)) * u;
}

extern "C" __global__ void __launch_bounds__(256)
    moe_down_bf16(const bf16_t* __restrict__ down, const float* __restrict__ hid,
                  const int* __restrict__ ex, float* __restrict__ y, int hidden, int inter) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int a = blockIdx.y;
  if (r >= hidden) return;
  const float s = row_dot_bf16(down + ((size_t)ex[a] * hidden + r) * inter, hid + (size_t)a * inter, inter, lane);
  if (lane == 0) y[(size_t)a * hidden + r] = s;
}

extern "C" __global__ void __launch_bounds__(256)
    moe_combine(const float* __restrict__ y, const float* __restrict__ w, float* __restrict__ out,
                int hidden, int top_k) {
  const int t = blockIdx.x;
  for (int r = threadIdx.x; r < hidden; r += blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < top_k; k++) s = fmaf(w[t * top_k + k], y[((size_t)t * top_k + k) * hidden + r], s);
    out[(size_t)t * hidden + r] = s;
  }
}

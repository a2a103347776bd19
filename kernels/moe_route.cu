// DeepSeek-V3 `noaux_tc` routing with group limits, one warp per token:
// scores = sigmoid(logits) [E]; choice = scores + bias; group score = sum of the 2 largest
// choices of each of `n_group` groups; keep the `topk_group` best groups; the `top_k` largest
// choices among their experts are the token's experts; weights = their scores / sum * scale.
// logits: [n, E] f32 (E <= 256, E % n_group == 0, n_group <= 32, top_k <= 32); bias: [E];
// out_idx: [n, top_k] i32 (in selection order); out_w: [n, top_k] f32.
// Launch: grid = ceil(n / 4), block = 128 (one warp per token).
// Ties go to the lower index (group and expert), every step a fixed warp arg-max.
#include "common.cuh"

#define ROUTE_MAX_E 256

// Arg-max over the warp of (v, i), ties to the lower i.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

extern "C" __global__ void __launch_bounds__(128)
    moe_route_noaux_tc(const float* __restrict__ logits, const float* __restrict__ bias, int n,
                       int n_experts, int n_group, int topk_group, int top_k, float scale,
                       int* __restrict__ out_idx, float* __restrict__ out_w) {
  __shared__ float score_s[4][ROUTE_MAX_E];
  __shared__ float choice_s[4][ROUTE_MAX_E];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int t = blockIdx.x * 4 + w;
  if (t >= n) return;
  float* score = score_s[w];
  float* choice = choice_s[w];
  const float* lg = logits + (size_t)t * n_experts;
  for (int e = lane; e < n_experts; e += 32) {
    score[e] = 1.f / (1.f + __expf(-lg[e]));
    choice[e] = score[e] + bias[e];
  }
  __syncwarp();
  const int per_group = n_experts / n_group;
  // group score (sum of its 2 largest choices): lane g scans group g
  float gscore = SPECMLA_NEG_INF;
  if (lane < n_group) {
    float b1 = SPECMLA_NEG_INF, b2 = SPECMLA_NEG_INF;
    for (int e = lane * per_group; e < (lane + 1) * per_group; e++) {
      const float c = choice[e];
      if (c > b1) {
        b2 = b1;
        b1 = c;
      } else if (c > b2) {
        b2 = c;
      }
    }
    gscore = b1 + (per_group > 1 ? b2 : 0.f);
  }
  // keep the topk_group best groups
  unsigned keep = 0;
  for (int k = 0; k < topk_group; k++) {
    float v = lane < n_group && !((keep >> lane) & 1u) ? gscore : SPECMLA_NEG_INF;
    int i = lane;
    warp_argmax(v, i);
    keep |= 1u << i;
  }
  // top_k experts among the kept groups, one warp arg-max each
  float wsum = 0.f;
  for (int k = 0; k < top_k; k++) {
    float v = SPECMLA_NEG_INF;
    int i = 1 << 30;
    for (int e = lane; e < n_experts; e += 32) {
      if (((keep >> (e / per_group)) & 1u) && choice[e] > v) {  // increasing e: ties keep the lower
        v = choice[e];
        i = e;
      }
    }
    warp_argmax(v, i);
    if (i >= n_experts) break;  // fewer selectable experts than top_k (a bad config)
    const float s = score[i];
    __syncwarp();
    if (lane == 0) {
      choice[i] = SPECMLA_NEG_INF;
      out_idx[(size_t)t * top_k + k] = i;
      out_w[(size_t)t * top_k + k] = s;
    }
    __syncwarp();
    wsum += s;
  }
  __syncwarp();
  if (lane < top_k) out_w[(size_t)t * top_k + lane] = out_w[(size_t)t * top_k + lane] / (wsum + 1e-20f) * scale;
}

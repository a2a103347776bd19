// Rotary embedding (interleaved pairs, as DeepSeek's checkpoints use it) on `rope_dim` dims of
// every head, starting at dim `offset` of each head: for pair i,
//   (a, b) <- (a cos - b sin, a sin + b cos), cos / sin = table[pos, i].
// x: [n, heads, head_dim] f32 in place; pos: [n] i32; cos_t, sin_t: [max_pos, rope_dim / 2] f32
// precomputed on the host by the CPU backend's `Rope` (YaRN included), so both backends rotate
// by the same values. Launch: grid = n, block = 128.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128)
    rope_interleaved_f32(float* __restrict__ x, const int* __restrict__ pos,
                         const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                         int heads, int head_dim, int offset, int rope_dim, int max_pos) {
  const int t = blockIdx.x;
  const int p = pos[t];
  if (p < 0 || p >= max_pos) return;
  const int half = rope_dim / 2;
  const float* c = cos_t + (size_t)p * half;
  const float* s = sin_t + (size_t)p * half;
  float* xt = x + (size_t)t * heads * head_dim;
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    float* q = xt + (size_t)h * head_dim + offset + 2 * i;
    const float a = q[0], b = q[1];
    q[0] = a * c[i] - b * s[i];
    q[1] = a * s[i] + b * c[i];
  }
}

// Shared helpers of specmla's CUDA kernels (prepended to every kernel source before NVRTC
// compiles it; see src/cuda/kernels.rs). No CUDA header is needed: bf16 and fp8 e4m3 are
// converted here bit by bit, exactly as the CPU backend converts them (bf16: round to nearest
// even; e4m3: round to nearest even, saturating at +-448), so NVRTC alone compiles the kernels.
// Every reduction has ONE order: lanes in a fixed butterfly, warps in index order — so a value
// never depends on how many rows, tokens or sequences share the launch (batch invariance), only
// on its own inputs.
#pragma once

#define SPECMLA_WARP 32
#define SPECMLA_NEG_INF __int_as_float(0xff800000)

typedef unsigned short bf16_t;

__device__ __forceinline__ float bf16_to_f32(bf16_t b) { return __uint_as_float(((unsigned)b) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16_rn(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

// e4m3 (fn: no infinities, 0x7f / 0xff NaN) to f32.
__device__ __forceinline__ float fp8_e4m3_to_f32(unsigned char b) {
  const unsigned s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15u && m == 7u) v = __int_as_float(0x7fc00000);
  else if (e == 0u) v = (float)m * 0.001953125f;  // m * 2^-9
  else v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  return s ? -v : v;
}

// f32 to e4m3, round to nearest even, saturating to +-448 (NaN -> 0x7f).
__device__ __forceinline__ unsigned char f32_to_fp8_e4m3(float x) {
  const unsigned u = __float_as_uint(x);
  const unsigned char sign = (unsigned char)((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned char)(sign | 0x7f);
  const float a = fabsf(x);
  if (a >= 464.f) return (unsigned char)(sign | 0x7e);  // beyond the rounding midpoint of 448
  if (a < 0.015625f) {                                  // subnormal: multiples of 2^-9
    const unsigned q = (unsigned)rintf(a * 512.f);      // 0..8 (8 = the smallest normal)
    return (unsigned char)(sign | q);
  }
  int k;
  const float f = frexpf(a, &k);  // a = f 2^k, f in [0.5, 1)
  int e = k - 1;
  unsigned q = (unsigned)rintf((f * 2.f - 1.f) * 8.f);
  if (q == 8u) {
    q = 0u;
    e += 1;
  }
  if (e + 7 > 15 || (e + 7 == 15 && q == 7u)) return (unsigned char)(sign | 0x7e);
  return (unsigned char)(sign | ((unsigned)(e + 7) << 3) | q);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of `nthreads` (a multiple of 32, <= 1024); every thread gets the result.
// `scratch`: >= 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch, int nthreads) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = nthreads >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; i++) t += scratch[i];  // warps in index order
  return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch, int nthreads) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = nthreads >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = SPECMLA_NEG_INF;
  for (int i = 0; i < nw; i++) t = fmaxf(t, scratch[i]);
  return t;
}

// 8 bf16 values (one 16-byte load) widened to f32.
__device__ __forceinline__ void bf16x8(const uint4 u, float* f) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Latent KV writes into the paged cache: row i of `src` ([n, width] f32: [c_kv | k_pe]) goes to
// slot slots[i] (= block * block_size + offset) of `cache` ([num_slots, width]).
// `kv_write_bf16`: round to nearest even, as the CPU backend's bf16 cache stores it.
// `kv_write_fp8`: e4m3 with one f32 scale per group of 128 values, c_kv and k_pe grouped
// separately (rope_dim values form their own groups): entry = [e4m3 x width | f32 scales], the
// CPU backend's fp8 layout. Launch: grid = n, block = 128.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128)
    kv_write_bf16(const float* __restrict__ src, const long long* __restrict__ slots,
                  bf16_t* __restrict__ cache, int width) {
  const float* s = src + (size_t)blockIdx.x * width;
  bf16_t* d = cache + (size_t)slots[blockIdx.x] * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = f32_to_bf16_rn(s[c]);
}

// One warp per 128-value group: absmax -> scale = absmax / 448 (1 when the group is all 0).
extern "C" __global__ void __launch_bounds__(128)
    kv_write_fp8(const float* __restrict__ src, const long long* __restrict__ slots,
                 unsigned char* __restrict__ cache, int lat_dim, int rope_dim, int entry_bytes) {
  const int width = lat_dim + rope_dim;
  const float* s = src + (size_t)blockIdx.x * width;
  unsigned char* d = cache + (size_t)slots[blockIdx.x] * entry_bytes;
  float* scales = reinterpret_cast<float*>(d + width);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g_lat = (lat_dim + 127) / 128, g_rope = (rope_dim + 127) / 128;
  for (int g = warp; g < g_lat + g_rope; g += blockDim.x / 32) {
    const int start = g < g_lat ? g * 128 : lat_dim + (g - g_lat) * 128;
    const int end = g < g_lat ? min(lat_dim, start + 128) : min(width, start + 128);
    float a = 0.f;
    for (int c = start + lane; c < end; c += 32) a = fmaxf(a, fabsf(s[c]));
    a = warp_max(a);
    const float sc = a > 0.f ? a / 448.f : 1.f;
    for (int c = start + lane; c < end; c += 32) {
      d[c] = f32_to_fp8_e4m3(s[c] / sc);
    }
    if (lane == 0) scales[g] = sc;
  }
}

// RMSNorm of rows: y[r, c] = x[r, c] * rsqrt(mean_c(x[r, c]^2) + eps) * w[c].
// x, y: [rows, cols] f32; w: [cols] f32. Launch: grid = rows, block = 256.
// Each thread sums a fixed strided subset in index order, then block_sum's fixed tree: a row's
// result does not depend on the number of rows.
#include "common.cuh"

#define RMS_THREADS 256

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                 float* __restrict__ y, int cols, float eps) {
  __shared__ float scratch[32];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* yr = y + (size_t)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += RMS_THREADS) s = fmaf(xr[c], xr[c], s);
  s = block_sum(s, scratch, RMS_THREADS);
  const float inv = rsqrtf(s / (float)cols + eps);
  for (int c = threadIdx.x; c < cols; c += RMS_THREADS) yr[c] = xr[c] * inv * w[c];
}

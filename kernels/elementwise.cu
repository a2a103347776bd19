// The small glue kernels of the CUDA forward (`src/cuda/backend.rs`): residual add, strided
// column copies (split / join of [c | k_pe] and per-head q slices), row gathers (the logits
// rows), SiLU-and-multiply (dense MLP / shared experts). No reductions: every output element is
// one operation on its inputs, so all are batch invariant.
#include "common.cuh"

// x[i] += y[i], i < n. grid = ceil(n / 256), block = 256.
extern "C" __global__ void __launch_bounds__(256)
    add_inplace_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// dst[r * dst_stride + dst_off + c] = src[r * src_stride + src_off + c], c < width.
// grid = rows, block = 128.
extern "C" __global__ void __launch_bounds__(128)
    copy_cols_f32(const float* __restrict__ src, int src_stride, int src_off,
                  float* __restrict__ dst, int dst_stride, int dst_off, int width) {
  const size_t r = blockIdx.x;
  for (int c = threadIdx.x; c < width; c += 128)
    dst[r * dst_stride + dst_off + c] = src[r * src_stride + src_off + c];
}

// dst[i, :] = src[idx[i], :] (width columns). grid = n_rows, block = 128.
extern "C" __global__ void __launch_bounds__(128)
    gather_rows_f32(const float* __restrict__ src, const int* __restrict__ idx,
                    float* __restrict__ dst, int width) {
  const size_t i = blockIdx.x;
  const float* s = src + (size_t)idx[i] * width;
  for (int c = threadIdx.x; c < width; c += 128) dst[i * width + c] = s[c];
}

// out[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, i < n. grid = ceil(n / 256), block = 256.
extern "C" __global__ void __launch_bounds__(256)
    silu_mul_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                 int n) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < n) {
    const float a = g[i];
    out[i] = a / (1.f + expf(-a)) * u[i];
  }
}

// out[idx[i], :] += w[i] * y[i, :] for the rows of one expert's tokens (distinct idx within a
// launch, so no two threads write one element); experts are added one launch after another in
// ascending id, so each token's sum keeps the router's slot order. grid = n_rows, block = 128.
extern "C" __global__ void __launch_bounds__(128)
    axpy_rows_f32(float* __restrict__ out, const float* __restrict__ y, const int* __restrict__ idx,
                  const float* __restrict__ w, int width) {
  const size_t i = blockIdx.x;
  float* o = out + (size_t)idx[i] * width;
  const float wi = w[i];
  for (int c = threadIdx.x; c < width; c += 128) o[c] = fmaf(wi, y[i * width + c], o[c]);
}

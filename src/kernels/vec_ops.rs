//! Vector kernels used around the matmuls: attention dot products and value accumulation,
//! RMSNorm, softmax / log-softmax (sampling and committed log-probs), SwiGLU, embedding lookup.
//!
//! Guarantee: every reduction (dot, sum of squares, softmax sum) uses the fixed lane order of
//! `lanes.rs` (dot on AVX2 reproduces it exactly), so results depend only on the input values;
//! element-wise steps are plain IEEE operations in a fixed expression order.

use super::gemm::WRef;
use super::lanes::{self, LANES};
use super::{Isa, Matrix};

/// Fixed-order dot product (same lane scheme as matmul: `dot(w_row, x)` equals that matmul
/// element bitwise for f32 weights). Panics if the lengths differ (internal invariant).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(Isa::current(), a, b)
}

pub(crate) fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if isa.simd() {
        // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
        return unsafe { dot_simd(a, b) };
    }
    let _ = isa;
    lanes::dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_simd(a: &[f32], b: &[f32]) -> f32 {
    use super::simd::{hsum8, tile};
    use std::arch::x86_64::_mm256_setzero_ps;
    let nch = a.len() / LANES;
    let mut acc = [[_mm256_setzero_ps(); 1]; 1];
    tile::<f32, 1, 1, false>(a.as_ptr(), 0, b.as_ptr(), 0, nch, &mut acc);
    let full = nch * LANES;
    lanes::fma_tail(hsum8(acc[0][0]), &a[full..], &b[full..])
}

/// Many fixed-order dot products against one vector: `out[r] = dot(rows[r * stride..][..x.len()], x)`
/// for r in 0..out.len(), each bitwise equal to [`dot`] (the same per-element lane sequence).
/// On AVX2 four rows run interleaved so the FMA latency chains overlap (attention scores over
/// consecutive keys). Panics if `rows` is too short (internal invariant).
pub fn dot_rows(rows: &[f32], stride: usize, x: &[f32], out: &mut [f32]) {
    dot_rows_with(Isa::current(), rows, stride, x, out)
}

pub(crate) fn dot_rows_with(isa: Isa, rows: &[f32], stride: usize, x: &[f32], out: &mut [f32]) {
    let len = x.len();
    if let Some(last) = out.len().checked_sub(1) {
        assert!(
            rows.len() >= last * stride + len,
            "dot_rows: rows too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if isa.simd() {
        // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected; the assert
        // above keeps every row inside `rows`.
        unsafe { dot_rows_simd(rows, stride, x, out) };
        return;
    }
    let _ = isa;
    for (r, o) in out.iter_mut().enumerate() {
        *o = lanes::dot_lanes(&rows[r * stride..r * stride + len], x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_rows_simd(rows: &[f32], stride: usize, x: &[f32], out: &mut [f32]) {
    use super::simd::{hsum8, tile};
    use std::arch::x86_64::_mm256_setzero_ps;
    const G: usize = 4;
    let len = x.len();
    let nch = len / LANES;
    let full = nch * LANES;
    let n = out.len();
    let mut r = 0;
    while r + G <= n {
        let mut acc = [[_mm256_setzero_ps(); 1]; G];
        tile::<f32, G, 1, false>(
            rows.as_ptr().add(r * stride),
            stride,
            x.as_ptr(),
            0,
            nch,
            &mut acc,
        );
        for (g, a) in acc.iter().enumerate() {
            let row = &rows[(r + g) * stride..(r + g) * stride + len];
            out[r + g] = lanes::fma_tail(hsum8(a[0]), &row[full..], &x[full..]);
        }
        r += G;
    }
    for (rr, o) in out.iter_mut().enumerate().skip(r) {
        let row = &rows[rr * stride..rr * stride + len];
        let mut acc = [[_mm256_setzero_ps(); 1]; 1];
        tile::<f32, 1, 1, false>(row.as_ptr(), 0, x.as_ptr(), 0, nch, &mut acc);
        *o = lanes::fma_tail(hsum8(acc[0][0]), &row[full..], &x[full..]);
    }
}

/// y += alpha * x (element-wise; a multiply then an add, two roundings).
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * *xi;
    }
}

/// RMSNorm of one row: out[i] = x[i] * (1 / sqrt(mean(x^2) + eps)) * w[i], with the sum of squares
/// in the fixed dot order.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let mean = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(w) {
        *o = *xi * inv * *wi;
    }
}

fn max_of(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// In-place numerically stable softmax: exp(x - max) / sum, the sum in the fixed lane order;
/// exp is `exp::exp_f32` (the same bits on every ISA level, vectorised where it has lanes).
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let m = max_of(x);
    super::exp::exp_shifted_with(Isa::current(), x, m);
    let sum = lanes::sum_lanes(x);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// out[i] = (x[i] - max) - ln(sum_j exp(x[j] - max)), the sum in the fixed lane order.
pub fn log_softmax(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "log_softmax: length mismatch");
    if x.is_empty() {
        return;
    }
    let m = max_of(x);
    for (o, v) in out.iter_mut().zip(x) {
        *o = (*v - m).exp();
    }
    let lse = lanes::sum_lanes(out).ln();
    for (o, v) in out.iter_mut().zip(x) {
        *o = (*v - m) - lse;
    }
}

/// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) with `exp::exp_f32` (the same
/// bits on every ISA level; vectorised where the level has lanes).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "silu_mul: length mismatch"
    );
    // Elementwise, so splitting among the pool's workers changes no bit; worth it from a few
    // tokens of a wide MLP (16 x 12288 exps were ~2 % of a batch-16 step on one core while
    // the other waited).
    const CHUNK: usize = 4096;
    let isa = Isa::current();
    let serial = |out: &mut [f32], gate: &[f32], up: &[f32]| {
        super::exp::silu_mul_with(isa, gate, up, out);
    };
    if out.len() >= 2 * CHUNK && super::worth_parallel(8 * out.len()) {
        use rayon::prelude::*;
        out.par_chunks_mut(CHUNK)
            .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
            .for_each(|(o, (g, u))| serial(o, g, u));
    } else {
        serial(out, gate, up);
    }
}

/// Row r of a weight matrix converted to f32 (embedding lookup). fp8 rows are dequantised as
/// f32(fp8 * scale_inv) (one rounding), the value the matmul tail uses.
pub fn matrix_row_f32(w: &Matrix, r: usize, out: &mut [f32]) {
    let cols = w.cols;
    assert!(
        r < w.rows && out.len() == cols,
        "matrix_row_f32: row {r} / out len {}",
        out.len()
    );
    match WRef::of(w) {
        WRef::F32(d) => out.copy_from_slice(&d[r * cols..(r + 1) * cols]),
        WRef::Bf16(d) => {
            for (o, b) in out.iter_mut().zip(&d[r * cols..(r + 1) * cols]) {
                *o = lanes::bf16_to_f32(*b);
            }
        }
        WRef::Bf16Strips(d) => {
            for (c, o) in out.iter_mut().enumerate() {
                *o = lanes::bf16_to_f32(super::gemm::strips_at(d, cols, r, c));
            }
        }
        WRef::F16(d) => {
            for (o, b) in out.iter_mut().zip(&d[r * cols..(r + 1) * cols]) {
                *o = b.to_f32();
            }
        }
        WRef::Fp8 {
            data,
            scale_inv,
            block_rows,
            block_cols,
        } => {
            let srow = &scale_inv[r / block_rows * cols.div_ceil(block_cols)..];
            for (k, (o, b)) in out
                .iter_mut()
                .zip(&data[r * cols..(r + 1) * cols])
                .enumerate()
            {
                *o = lanes::fp8_unscaled(*b) * (srow[k / block_cols] * lanes::FP8_UNSCALE);
            }
        }
    }
}

//! The fixed per-element reduction order, written out in portable Rust.
//!
//! Sits under every reduction in `kernels` (matmul, dot, norms, softmax). It *defines* the order
//! that the AVX2 path in `simd.rs` reproduces instruction for instruction, and it is the portable
//! fallback on machines without AVX2+FMA. Guarantee: for an output element
//! y = sum_k w[k] x[k] over `len` terms the operations are, always and only:
//!
//! 1. eight lane accumulators `acc[l]`, zero-initialised; for each full chunk c of 8 columns,
//!    `acc[l] = fma(w[8c + l], x[8c + l], acc[l])` in increasing c (one rounding per step);
//! 2. the horizontal sum tree `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))` ([`hsum8`]);
//! 3. the scalar tail `s = fma(w[k], x[k], s)` for the remaining k in increasing order.
//!
//! fp8 block-scaled weights use the same lanes per column block (see [`fp8_row_dot`]).
//! Because the order depends only on `len` (never on the batch, the thread count, or the tile a
//! row lands in), results are bitwise batch-invariant.

/// Lanes of one accumulator (one AVX2 register of f32).
pub(crate) const LANES: usize = 8;

/// 2^8: an e4m3 byte decoded through the f16 bit trick is the e4m3 value times 2^-8, so block
/// scales are multiplied by this (exactly) before use.
pub(crate) const FP8_UNSCALE: f32 = 256.0;

/// The fixed horizontal-sum tree over one 8-lane accumulator.
#[inline(always)]
pub(crate) fn hsum8(a: &[f32; LANES]) -> f32 {
    let s4 = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// bf16 bit pattern to f32 (exact).
#[inline(always)]
pub(crate) fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// e4m3fn byte to f32 *times 2^-8*, via the f16 bit pattern `(b & 0x7f) << 7 | (b & 0x80) << 8`
/// (exact for every finite e4m3 value, subnormals included). The NaN encodings 0x7f / 0xff
/// decode to the finite value ±480 (times 2^-8): checkpoints never store NaN weights, and a
/// finite stand-in keeps one bad byte from poisoning a whole output row.
#[inline(always)]
pub(crate) fn fp8_unscaled(b: u8) -> f32 {
    let b = b as u16;
    half::f16::from_bits(((b & 0x7f) << 7) | ((b & 0x80) << 8)).to_f32()
}

/// Accumulate full 8-column chunks into `acc` (step 1). `w.len() == x.len()`, a multiple of 8.
#[inline]
pub(crate) fn fma_chunks(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    debug_assert_eq!(w.len(), x.len());
    for (wc, xc) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = wc[l].mul_add(xc[l], acc[l]);
        }
    }
}

/// Scalar tail (step 3), continuing from `s`.
#[inline]
pub(crate) fn fma_tail(mut s: f32, w: &[f32], x: &[f32]) -> f32 {
    for (a, b) in w.iter().zip(x) {
        s = a.mul_add(*b, s);
    }
    s
}

/// The whole fixed-order dot product of two f32 slices of equal length.
pub(crate) fn dot_lanes(w: &[f32], x: &[f32]) -> f32 {
    let full = w.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    fma_chunks(&mut acc, &w[..full], &x[..full]);
    fma_tail(hsum8(&acc), &w[full..], &x[full..])
}

/// Fixed-order sum of a slice (lane adds, the same tree, scalar tail). Used by softmax.
pub(crate) fn sum_lanes(v: &[f32]) -> f32 {
    let full = v.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in v[..full].chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let mut s = hsum8(&acc);
    for &t in &v[full..] {
        s += t;
    }
    s
}

/// The fixed fp8 order for one row (block_cols a multiple of 8). `wu` is the row decoded with
/// [`fp8_unscaled`]; `scales` are this row's block scales already multiplied by [`FP8_UNSCALE`].
///
/// Per column block b holding full chunks: a fresh 8-lane `blk` accumulated as in step 1, then
/// `total[l] = fma(scales[b], blk[l], total[l])` in block order; then [`hsum8`] of `total`; then
/// the tail `s = fma(wu[k] * scales[k / block_cols], x[k], s)`.
pub(crate) fn fp8_row_dot(wu: &[f32], scales: &[f32], block_cols: usize, x: &[f32]) -> f32 {
    let cols = wu.len();
    let nfull = cols / LANES;
    let chunks_per_block = block_cols / LANES;
    let mut total = [0.0f32; LANES];
    for (b, &s) in scales.iter().enumerate() {
        let c0 = b * chunks_per_block;
        let c1 = ((b + 1) * chunks_per_block).min(nfull);
        if c0 >= c1 {
            break;
        }
        let mut blk = [0.0f32; LANES];
        fma_chunks(
            &mut blk,
            &wu[c0 * LANES..c1 * LANES],
            &x[c0 * LANES..c1 * LANES],
        );
        for l in 0..LANES {
            total[l] = s.mul_add(blk[l], total[l]);
        }
    }
    let mut acc = hsum8(&total);
    for k in nfull * LANES..cols {
        acc = (wu[k] * scales[k / block_cols]).mul_add(x[k], acc);
    }
    acc
}

//! The `avx512bf16` level's row-block path of `gemm` for f16 weights with a multiple of 64
//! columns, at EVERY token count (n = 1 included, so batch invariance holds: one code path per
//! element whatever n).
//!
//! Why its own order: the shared 8-lane order of `lanes.rs` gives a one-token f16 row one chain
//! of 8-lane FMAs, latency-bound at ~16 bytes of weights per FMA latency, so the exact levels
//! stream several rows at once (4-row tiles: four weight streams per thread); on AMD Zen 5
//! several streams per thread read DRAM 10-20 % slower than one (BENCHMARKS.md "One weight
//! stream per thread"). Here an element owns 64 lanes — four 16-lane chains — so ONE row per
//! tile streams at memory speed: the bf16-dot path's one-stream layout (`bf16dot.rs`) for f16.
//! The products stay exact f32 (f16 widens exactly, the activations are not rounded); only
//! the summation order differs from the exact levels (the kernel tests bound it like the AMX
//! path's: 1e-6 of sum |w x|).
//!
//! Order (fixed per element, independent of n, the token's position, the row split and the
//! thread): 64 f32 lane accumulators a[0..64]; for each 64-column chunk c in increasing order,
//! `a[l] = fma(w[64c + l], x[64c + l], a[l])`; then the fixed tree s[l] = (a[l] + a[l + 32]) +
//! (a[l + 16] + a[l + 48]) for l < 16, the 16-lane tree of `bf16dot.rs` (lanes l + (l + 8),
//! then `hsum8`). Tiles (rows x tokens per register block: 1 x 1 for one token, 1 x 2..=6 for
//! few tokens whose activations fit L1, 4 x 6 quarter-pass tiles ([`tile_q`]) otherwise) change
//! only which elements are computed together. [`reference`] is the order in portable Rust
//! (tests compare bitwise).
//!
//! Cost against the exact levels' f16 path (BENCHMARKS.md "f16 weights in a 64-lane order"):
//! one-token decode streams f16 rows as fast as the bf16-dot path streams bf16 ones (the point);
//! products of many tokens (prefill) run at ~0.85-0.9x of the exact levels' f16 panel GEMM,
//! whose f32 panels amortise the widening over 48 tokens.

use std::arch::x86_64::*;

use super::{Job, WRef};
use crate::kernels::prefetch::{prefetch_line, prefetch_to_l2};
use crate::kernels::simd::hsum8;

/// Columns per chunk: four 16-lane registers of f32 accumulators.
const K_CHUNK: usize = 64;
/// Tokens per tile of the one-row tiles (4 x 6 accumulators of the 32 zmm registers).
const NT1: usize = 6;
/// Rows x tokens of the quarter-pass tiles used when the activations do not fit L1 ([`tile_q`]).
const MR2: usize = 4;
const NT2: usize = 6;
/// L1 bytes a product's activations ([n, cols] f32) may take for it to run on one-row tiles,
/// which re-read every token's chunk for each row (as `bf16dot::ROW1_X_BYTES`).
const ROW1_X_BYTES: usize = 24 * 1024;
/// Chunks per column block of the quarter passes (2048 columns): the four passes over a block
/// find its weights (4 rows x 4 KB) in L1 and its activations (6 tokens x 8 KB) in L1 / L2;
/// measured on Zen 5 against 16 and 64 (BENCHMARKS.md).
const Q_BLOCK: usize = 32;
/// L2 bytes of activations per token block of the quarter-pass tiles: a row tile's weights stay
/// in L1 / L2 across the block's token tiles, the block's x in L2 across the row tiles (96 KB
/// and 1 MB measured slower in the engine's prefill).
const BLOCK_X_BYTES: usize = 256 * 1024;

/// Whether an f16 matmul of these weights runs on this path at this ISA.
pub(super) fn applies(isa: crate::kernels::Isa, w: WRef<'_>, cols: usize) -> bool {
    isa.bf16_dot() && matches!(w, WRef::F16(_)) && cols > 0 && cols.is_multiple_of(K_CHUNK)
}

/// Whether a product of `n` tokens over `cols` columns runs on the quarter-pass tiles
/// ([`tile_q`]) and so reads its activations packed by [`pack_quarters`].
pub(super) fn packs_x(n: usize, cols: usize) -> bool {
    n > 1 && n * cols * 4 > ROW1_X_BYTES
}

/// x: [n, cols] packed for the quarter passes, by token tiles of [`NT2`] (the last one `w` =
/// n - t0 < NT2 wide): token t = t0 + j of the tile starting at t0 (a multiple of NT2) has
/// `out[(q * n + t0) * nk * 16 + (c * w + j) * 16 + l] = x[t * cols + 64c + 16q + l]`, so pass q
/// of a tile reads chunk c of all its tokens as one contiguous run (one pointer in the loop).
pub(super) fn pack_quarters(x: &[f32], n: usize, cols: usize, out: &mut [f32]) {
    let nk = cols / K_CHUNK;
    debug_assert!(x.len() == n * cols && out.len() == n * cols);
    for q in 0..4 {
        for t in 0..n {
            let (t0, j) = (t / NT2 * NT2, t % NT2);
            let w = NT2.min(n - t0); // tokens of t's tile
            let base = (q * n + t0) * nk * 16;
            let src = &x[t * cols..(t + 1) * cols];
            for c in 0..nk {
                let d = base + (c * w + j) * 16;
                out[d..d + 16]
                    .copy_from_slice(&src[c * K_CHUNK + 16 * q..c * K_CHUNK + 16 * q + 16]);
            }
        }
    }
}

/// The order above in portable Rust, for one element (tests: the kernel gives these bits).
#[cfg(test)]
pub(crate) fn reference(w: &[half::f16], x: &[f32]) -> f32 {
    assert!(w.len() == x.len() && w.len().is_multiple_of(K_CHUNK));
    let mut a = [0.0f32; K_CHUNK];
    for (wc, xc) in w.chunks_exact(K_CHUNK).zip(x.chunks_exact(K_CHUNK)) {
        for l in 0..K_CHUNK {
            a[l] = wc[l].to_f32().mul_add(xc[l], a[l]);
        }
    }
    let s16: [f32; 16] = std::array::from_fn(|l| (a[l] + a[l + 32]) + (a[l + 16] + a[l + 48]));
    let s8: [f32; 8] = std::array::from_fn(|l| s16[l] + s16[l + 8]);
    crate::kernels::lanes::hsum8(&s8)
}

/// The fixed tree of one element's four 16-lane accumulators (see the module docs).
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn hsum64(a: &[__m512; 4]) -> f32 {
    let s = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
    hsum8(_mm256_add_ps(
        _mm512_castps512_ps256(s),
        _mm512_extractf32x8_ps::<1>(s),
    ))
}

/// One row `w` times tokens `x + j * xs` (j < T), all `nk` chunks, into `out[j * ts]`, each
/// element's four chains in registers (one pass over the row: the one-stream tile). With `pf`
/// non-null, also prefetches the row there at the same columns (the next row, streamed while
/// this one is read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<const T: usize>(
    w: *const half::f16,
    x: *const f32,
    xs: usize,
    nk: usize,
    out: *mut f32,
    ts: usize,
    pf: *const half::f16,
) {
    // As the bf16-dot tiles: the process-wide hint for one token, the L1 for several.
    let l2 = T == 1 && prefetch_to_l2();
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    for c in 0..nk {
        let off = c * K_CHUNK;
        if !pf.is_null() {
            prefetch_line(pf.wrapping_add(off) as *const i8, l2);
            prefetch_line(pf.wrapping_add(off + 32) as *const i8, l2);
        }
        for q in 0..4 {
            let o = off + 16 * q;
            let wv = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(o) as *const __m256i));
            for j in 0..T {
                let xv = _mm512_loadu_ps(x.add(j * xs + o));
                acc[j][q] = _mm512_fmadd_ps(wv, xv, acc[j][q]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        *out.add(j * ts) = hsum64(a);
    }
}

/// One register tile of several tokens computed a quarter of the lanes at a time (x: the
/// tile's first token in the [`pack_quarters`] layout, `qs` floats between passes): the four
/// 16-lane chains of an element are independent until the final tree, so pass q (0..4) runs
/// the chains of lanes 16q..16q + 16 over all chunks (columns 64c + 16q..) for every element of
/// the tile, and keeps the result for the tree (a store and reload is exact: the bits of
/// [`tile`]'s one pass with all four chains). One accumulator per element per pass instead of
/// four: 4 x 6 elements fit the registers, so each converted weight register serves 6 tokens and
/// each token's chunk 4 rows.
/// The chunks go by column blocks of [`Q_BLOCK`] (all four passes over one block, then the
/// next: each lane's chunks still in increasing order). Pass 0 prefetches `pf_rows` rows from
/// `pf` (both lines of each chunk).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile_q<const R: usize, const T: usize>(
    w: *const half::f16,
    ws: usize,
    x: *const f32,
    qs: usize,
    nk: usize,
    out: *mut f32,
    (rs, ts): (usize, usize),
    pf: *const half::f16,
    pf_rows: usize,
) {
    let mut part = [[[_mm512_setzero_ps(); 4]; T]; R];
    for k0 in (0..nk).step_by(Q_BLOCK) {
        let k1 = (k0 + Q_BLOCK).min(nk);
        for q in 0..4 {
            let mut acc = [[_mm512_setzero_ps(); T]; R];
            for i in 0..R {
                for j in 0..T {
                    acc[i][j] = part[i][j][q];
                }
            }
            for c in k0..k1 {
                let o = c * K_CHUNK + 16 * q;
                if q == 0 {
                    for r in 0..pf_rows {
                        prefetch_line(pf.wrapping_add(r * ws + o) as *const i8, false);
                        prefetch_line(pf.wrapping_add(r * ws + o + 32) as *const i8, false);
                    }
                }
                let mut wv = [_mm512_setzero_ps(); R];
                for (i, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(i * ws + o) as *const __m256i));
                }
                let xq = x.add(q * qs + c * T * 16);
                for j in 0..T {
                    let xv = _mm512_loadu_ps(xq.add(j * 16));
                    for i in 0..R {
                        acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
                    }
                }
            }
            for i in 0..R {
                for j in 0..T {
                    part[i][j][q] = acc[i][j];
                }
            }
        }
    }
    for (i, pi) in part.iter().enumerate() {
        for (j, a) in pi.iter().enumerate() {
            *out.add(i * rs + j * ts) = hsum64(a);
        }
    }
}

impl Job<'_> {
    /// Rows [wr0, wr0 + out.len() / n) for all tokens into out: [block rows, n].
    ///
    /// # Safety
    /// Only after `IsaLevel::Avx512Bf16.supported()` (AVX-512 F/BW/DQ/VL, F16C), with
    /// `applies(..)` true.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn row_block_f16x64(&self, wr0: usize, out: &mut [f32]) {
        let nrows = out.len() / self.n;
        self.row_block_f16x64_at(wr0, nrows, out.as_mut_ptr(), (self.n, 1));
    }

    /// Rows [wr0, wr0 + nrows) for all tokens, element (row i of the block, token t) written
    /// at `o[i * rs + t * ts]` ((n, 1): a [block rows, n] buffer; (1, rows): the token-major y).
    ///
    /// # Safety
    /// As [`Self::row_block_f16x64`]; every written element must be inside the allocation
    /// behind `o` and written by no other thread meanwhile.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn row_block_f16x64_at(
        &self,
        wr0: usize,
        nrows: usize,
        o: *mut f32,
        (rs, ts): (usize, usize),
    ) {
        let WRef::F16(d) = self.w else {
            unreachable!("the f16x64 path takes f16 weights")
        };
        let (n, cols) = (self.n, self.cols);
        let nk = cols / K_CHUNK;
        let x = self.x.as_ptr();
        let w0 = d.as_ptr().add(wr0 * cols);
        // rows of this matrix after row i of the block (prefetches stay inside the matrix)
        let left = |i: usize| self.rows_total.saturating_sub(wr0 + i);
        if !packs_x(n, cols) {
            // One row at a time, the next (contiguous) row prefetched beside it: ONE weight
            // stream per thread; the tokens' chunks come from L1.
            for i0 in 0..nrows {
                let w = w0.add(i0 * cols);
                let next = if left(i0 + 1) > 0 {
                    w.add(cols)
                } else {
                    std::ptr::null()
                };
                let mut t0 = 0;
                while t0 < n {
                    let nt = NT1.min(n - t0);
                    let pf = if t0 == 0 { next } else { std::ptr::null() };
                    let (xp, op) = (x.add(t0 * cols), o.add(i0 * rs + t0 * ts));
                    macro_rules! go {
                        ($($t:literal),*) => {
                            match nt {
                                $($t => tile::<$t>(w, xp, cols, nk, op, ts, pf),)*
                                _ => unreachable!("f16x64 tile 1x{nt}"),
                            }
                        };
                    }
                    go!(1, 2, 3, 4, 5, 6);
                    t0 += nt;
                }
            }
            return;
        }
        // Token blocks whose activations stay in L2; quarter-pass tiles over the packed x.
        debug_assert_eq!(self.xpack.len(), n * cols);
        let xq = self.xpack.as_ptr();
        let tb = (BLOCK_X_BYTES / (cols * 4) / NT2 * NT2).max(NT2);
        for tb0 in (0..n).step_by(tb) {
            let tb1 = (tb0 + tb).min(n);
            let mut i0 = 0;
            while i0 < nrows {
                let m = if nrows - i0 >= MR2 { MR2 } else { 1 };
                let w = w0.add(i0 * cols);
                let pf_rows = if tb0 == 0 { left(i0 + m).min(m) } else { 0 };
                let mut t0 = tb0;
                while t0 < tb1 {
                    let nt = NT2.min(tb1 - t0);
                    let pf = if t0 == tb0 { pf_rows } else { 0 };
                    let (xp, op) = (xq.add(t0 * cols / 4), o.add(i0 * rs + t0 * ts));
                    macro_rules! go {
                        ($($r:literal, $t:literal);*) => {
                            match (m, nt) {
                                $(($r, $t) => tile_q::<$r, $t>(w, cols, xp, n * cols / 4, nk, op, (rs, ts), w.add(m * cols), pf),)*
                                _ => unreachable!("f16x64 tile {m}x{nt}"),
                            }
                        };
                    }
                    go!(4, 6; 4, 5; 4, 4; 4, 3; 4, 2; 4, 1; 1, 6; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1);
                    t0 += nt;
                }
                i0 += m;
            }
        }
    }
}

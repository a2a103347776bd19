//! bf16 weights in row strips (`MatrixData::Bf16Strips`, the `avx2` level's layout): the
//! outer-product kernels and their portable reference.
//!
//! Why: an AVX2 core multiplies bf16 weights in f32 FMAs, so from ~5 tokens on a verification
//! step is bound by its multiply-adds, not its bytes. The row-major kernels (`avx2.rs`) sum each
//! element in 8 lanes over its columns and decode every weight chunk per row tile and token tile;
//! they reach 0.68-0.82 of the FMA peak with the weights in L2. Here 16 rows are interleaved per
//! column (`[rows / 16][cols][16]`), so one 32-byte load decodes — one shift, one AND — into
//! the weights of 16 rows at one column, and each token's activation at that column is one
//! broadcast: a 16-row x 6-token tile is 12 FMAs per column on 12 accumulators with 2 decodes
//! (0.98-0.99 of the FMA peak in L2 at 4-16 tokens in a C prototype on Zen 3, against 0.68-0.82;
//! 0.92-0.94 here, `cargo bench --bench kernels -- l2-tiles`), and a matrix is one sequential
//! stream per strip. The first token tile over a strip (group) prefetches the next one's lines:
//! without it a 3-4-token walk over DRAM-resident strips cost its bytes' time plus its
//! multiply-adds' (docs/BENCHMARKS.md "bf16 strips").
//!
//! Order (the guarantee): every element y[t][r] is the sequential chain
//! `acc = fma(w[r][c], x[t][c], acc)` for c = 0, 1, ..., cols - 1 from acc = 0 — whatever n, the
//! tile, the token's position, the row block or the thread. The portable path
//! ([`row_block_portable`]) computes that chain element by element with `f32::mul_add`, so a
//! strips matrix gives the same bits on every level. It is not the `lanes.rs` order of row-major
//! matrices: the layout, fixed when the matrix is built, fixes the order.
//!
//! Within a strip, the 16 words of column c hold rows (2k -> k, 2k + 1 -> 8 + k), k = 0..8: a
//! 32-bit lane's low word is row k, its high word row 8 + k, so `lane << 16` gives rows 0..8 and
//! `lane & 0xffff0000` rows 8..16 as f32, each in row order.

use crate::kernels::lanes;

/// Rows per strip.
pub(crate) const STRIP: usize = 16;
/// Tokens per token block (x rows re-read from L2 by every strip of the row block).
const TOKEN_BLOCK: usize = 48;
/// Most tokens per register tile (16 rows x 6 tokens = 12 accumulators).
const MAX_NT: usize = 6;

/// Whether models loaded in this process store their bf16 matrices in strips: on a CPU whose
/// best default level is `avx2` (AVX2 without AVX-512: the levels above multiply bf16 on their
/// own paths), unless `SPECMLA_BF16_STRIPS` says `0` (row-major, the `lanes.rs` order) or `1`.
/// Read once per process; the layout is fixed when a matrix is built.
pub fn strips_by_default() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("SPECMLA_BF16_STRIPS").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => crate::kernels::Isa::detect().level() == crate::kernels::IsaLevel::Avx2,
    })
}

/// Word index within a strip column of row `k` (0..16) of the strip.
#[inline]
pub(crate) fn word_of_row(k: usize) -> usize {
    if k < 8 {
        2 * k
    } else {
        2 * (k - 8) + 1
    }
}

/// Pack row-major bf16 `w: [rows, cols]` (rows a multiple of [`STRIP`]) into strips:
/// `out: [rows / 16, cols, 16]`.
pub(crate) fn pack(w: &[u16], rows: usize, cols: usize, out: &mut [u16]) {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(STRIP) && w.len() == rows * cols && out.len() == w.len());
    if cols == 0 {
        return;
    }
    // strips in parallel on the pool: the pack is most of a strips model's load
    out.par_chunks_exact_mut(STRIP * cols)
        .enumerate()
        .for_each(|(s, strip)| {
            for k in 0..STRIP {
                let row = &w[(s * STRIP + k) * cols..(s * STRIP + k + 1) * cols];
                let e = word_of_row(k);
                for (c, &v) in row.iter().enumerate() {
                    strip[c * STRIP + e] = v;
                }
            }
        });
}

/// Unpack strips `w: [rows / 16, cols, 16]` into row-major `out: [rows, cols]` ([`pack`]'s
/// inverse).
pub(crate) fn unpack(w: &[u16], rows: usize, cols: usize, out: &mut [u16]) {
    assert!(rows.is_multiple_of(STRIP) && w.len() == rows * cols && out.len() == w.len());
    if cols == 0 {
        return;
    }
    for (s, strip) in w.chunks_exact(STRIP * cols).enumerate() {
        for k in 0..STRIP {
            let row = &mut out[(s * STRIP + k) * cols..(s * STRIP + k + 1) * cols];
            let e = word_of_row(k);
            for (c, v) in row.iter_mut().enumerate() {
                *v = strip[c * STRIP + e];
            }
        }
    }
}

/// Element (r, c) of a strips matrix with `cols` columns.
#[inline]
pub(crate) fn at(w: &[u16], cols: usize, r: usize, c: usize) -> u16 {
    w[(r / STRIP) * STRIP * cols + c * STRIP + word_of_row(r % STRIP)]
}

/// Token tiles of a block of `nb` tokens: as few tiles of at most [`MAX_NT`] as cover it, sizes
/// as even as possible (9 -> 5 + 4), larger first.
fn tile_sizes(nb: usize) -> impl Iterator<Item = usize> {
    let tiles = nb.div_ceil(MAX_NT).max(1);
    let (base, extra) = (nb / tiles, nb % tiles);
    (0..tiles).map(move |i| base + usize::from(i < extra))
}

/// Row block: rows [r0, r0 + out.len() / n) of strips matrix `w` for the n tokens of
/// `x: [n, cols]` into `out: [block rows, n]` on `isa` — the AVX2 tiles wherever AVX2 runs, else
/// [`row_block_portable`]; the same bits either way. r0 and the block's rows are multiples of 16.
pub(crate) fn row_block(
    isa: crate::kernels::Isa,
    w: &[u16],
    cols: usize,
    x: &[f32],
    n: usize,
    r0: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.simd() {
        // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected; the row
        // block's bounds are asserted inside.
        unsafe { simd::row_block_avx2(w, cols, x, n, r0, out) };
        return;
    }
    let _ = isa; // only the x86_64 tiles read it
    row_block_portable(w, cols, x, n, r0, out);
}

/// Portable row block: rows [r0, r0 + out.len() / n) of strips matrix `w` ([rows / 16, cols, 16])
/// for the n tokens of `x: [n, cols]` into `out: [block rows, n]`, each element the sequential
/// chain of the module doc.
fn row_block_portable(w: &[u16], cols: usize, x: &[f32], n: usize, r0: usize, out: &mut [f32]) {
    for (i, orow) in out.chunks_exact_mut(n).enumerate() {
        let r = r0 + i;
        let strip = &w[(r / STRIP) * STRIP * cols..][..STRIP * cols];
        let e = word_of_row(r % STRIP);
        for (t, o) in orow.iter_mut().enumerate() {
            let xt = &x[t * cols..(t + 1) * cols];
            let mut acc = 0f32;
            for (c, &xv) in xt.iter().enumerate() {
                acc = lanes::bf16_to_f32(strip[c * STRIP + e]).mul_add(xv, acc);
            }
            *o = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{tile_sizes, MAX_NT, STRIP, TOKEN_BLOCK};
    use crate::kernels::prefetch::{prefetch_line, prefetch_to_l2};
    use std::arch::x86_64::*;

    /// S strips x NT tokens over all `cols` columns, written to `out[(s * 16 + k) * on + j]`
    /// (row k of strip s, token j). Strip s starts at `w + s * ss`; token j's row at `x + j * xs`.
    /// Accumulators: rows 0..8 and 8..16 of strip s for token j, in registers throughout.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn tile<const S: usize, const NT: usize>(
        w: *const u16,
        ss: usize,
        x: *const f32,
        xs: usize,
        cols: usize,
        out: *mut f32,
        on: usize,
        pf: Option<bool>,
    ) {
        let hi_mask = _mm256_set1_epi32(0xffff_0000u32 as i32);
        let mut a = [[[_mm256_setzero_ps(); 2]; NT]; S];
        for c in 0..cols {
            // the next S strips, one 64-byte line (two columns) per strip every other column
            if let Some(l2) = pf {
                if c % 2 == 0 {
                    for s in 0..S {
                        let p = w.wrapping_add((S + s) * ss + c * STRIP);
                        prefetch_line(p as *const i8, l2);
                    }
                }
            }
            // strip by strip: its two decoded halves live at a time, so 2 x S x NT
            // accumulators up to 12 never spill
            // (several strips: at most 2 tokens, whose broadcasts are loaded once)
            let mut bs = [_mm256_setzero_ps(); NT];
            if S > 1 {
                for (j, b) in bs.iter_mut().enumerate() {
                    *b = _mm256_broadcast_ss(&*x.add(j * xs + c));
                }
            }
            for s in 0..S {
                let v = _mm256_loadu_si256(w.add(s * ss + c * STRIP) as *const __m256i);
                let lo = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                let hi = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
                for j in 0..NT {
                    let b = if S > 1 {
                        bs[j]
                    } else {
                        _mm256_broadcast_ss(&*x.add(j * xs + c))
                    };
                    a[s][j][0] = _mm256_fmadd_ps(lo, b, a[s][j][0]);
                    a[s][j][1] = _mm256_fmadd_ps(hi, b, a[s][j][1]);
                }
            }
        }
        let mut buf = [0f32; STRIP];
        for (s, as_) in a.iter().enumerate() {
            for (j, aj) in as_.iter().enumerate() {
                _mm256_storeu_ps(buf.as_mut_ptr(), aj[0]);
                _mm256_storeu_ps(buf.as_mut_ptr().add(8), aj[1]);
                for (k, v) in buf.iter().enumerate() {
                    *out.add((s * STRIP + k) * on + j) = *v;
                }
            }
        }
    }

    /// Strips per register tile for a token tile of `nt` (2 x S x NT accumulators; the rest of
    /// the 16 ymm registers: a strip's two decoded halves and the broadcasts). One token: 4
    /// strips (8 dot chains, enough to hide the FMA latency); two: 2; three or more: 1 (a 2 x 3
    /// tile spilled: 0.43 of the FMA peak in `l2-tiles` against 0.70 for 1 x 3, Zen 3).
    fn strips_per_tile(nt: usize) -> usize {
        match nt {
            1 => 4,
            2 => 2,
            _ => 1,
        }
    }

    /// Row block of a strips matrix on the `avx2` level (and above): as
    /// [`super::row_block_portable`], bitwise.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `w` is a strips matrix with `cols` columns holding rows
    /// [r0, r0 + out.len() / n), r0 and the block's rows multiples of 16; `x: [n, cols]`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn row_block_avx2(
        w: &[u16],
        cols: usize,
        x: &[f32],
        n: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        let nrows = out.len() / n;
        assert!(r0.is_multiple_of(STRIP) && nrows.is_multiple_of(STRIP));
        assert!(w.len() >= (r0 + nrows) * cols && x.len() == n * cols);
        let ss = STRIP * cols;
        let strips = nrows / STRIP;
        let (wp, xp, o) = (w.as_ptr().add(r0 * cols), x.as_ptr(), out.as_mut_ptr());
        // strips in the whole matrix: the next group may be prefetched while it exists
        let total = w.len() / ss.max(1);
        let l2 = prefetch_to_l2();
        for tb0 in (0..n).step_by(TOKEN_BLOCK) {
            let nb = TOKEN_BLOCK.min(n - tb0);
            // a block of up to 3 tokens is one tile over several strips at once; else one strip
            // at a time, every token tile over it while it is in cache
            let group = if nb <= 3 { strips_per_tile(nb) } else { 1 };
            let mut s0 = 0;
            while s0 < strips {
                let g = if strips - s0 >= group { group } else { 1 };
                let mut t0 = tb0;
                // The first token tile over these strips prefetches the next group's.
                let next_ok = r0 / STRIP + s0 + 2 * g <= total;
                for nt in tile_sizes(nb) {
                    debug_assert!(nt <= MAX_NT);
                    let (wt, xt, ot) = (
                        wp.add(s0 * ss),
                        xp.add(t0 * cols),
                        o.add(s0 * STRIP * n + t0),
                    );
                    let pf = (t0 == tb0 && next_ok).then_some(l2);
                    match (g, nt) {
                        (4, 1) => tile::<4, 1>(wt, ss, xt, cols, cols, ot, n, pf),
                        (2, 2) => tile::<2, 2>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 1) => tile::<1, 1>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 2) => tile::<1, 2>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 3) => tile::<1, 3>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 4) => tile::<1, 4>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 5) => tile::<1, 5>(wt, ss, xt, cols, cols, ot, n, pf),
                        (1, 6) => tile::<1, 6>(wt, ss, xt, cols, cols, ot, n, pf),
                        _ => unreachable!("strips tile {g} x {nt}"),
                    }
                    t0 += nt;
                }
                s0 += g;
            }
        }
    }
}

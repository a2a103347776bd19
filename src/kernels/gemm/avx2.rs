//! The AVX2 + FMA + F16C row-block paths of `gemm` (the `avx2` level, and the one-token GEMV and
//! non-bf16 weights of the levels above it): direct register tiles for few tokens, decoded f32
//! panels for many (`simd.rs` tiles). Bitwise equal to the portable path (each element keeps the
//! `lanes.rs` sequence; tiles only choose which elements are computed together).

use super::*;

impl Job<'_> {
    /// Decode weight rows [wr0, wr0 + nrows) x chunks [c0, c0 + nc) into `panel` (f32, row
    /// stride nc * 8); f32 weights are read in place. Returns (first row, row stride).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn decode_panel(
        &self,
        wr0: usize,
        c0: usize,
        nrows: usize,
        nc: usize,
        panel: &mut [f32],
    ) -> (*const f32, usize) {
        use crate::kernels::simd::to_panel;
        let cols = self.cols;
        let off = wr0 * cols + c0 * LANES;
        match self.w {
            WRef::F32(d) => return (d.as_ptr().add(off), cols),
            WRef::Bf16(d) => to_panel::<u16>(d.as_ptr().add(off), cols, nrows, nc, panel),
            WRef::F16(d) => to_panel::<half::f16>(d.as_ptr().add(off), cols, nrows, nc, panel),
            WRef::Fp8 { data, .. } => {
                to_panel::<u8>(data.as_ptr().add(off), cols, nrows, nc, panel)
            }
            WRef::Bf16Strips(_) => unreachable!("strips matrices take strips.rs"),
        }
        (panel.as_ptr(), nc * LANES)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_block_simd(
        &self,
        wr0: usize,
        r0: usize,
        out: &mut [f32],
        s: &mut Scratch,
    ) {
        if self.n <= DIRECT_MAX_TOKENS {
            self.direct_simd(wr0, r0, out, s)
        } else {
            self.gemm_simd(wr0, r0, out, s)
        }
    }

    /// Few tokens (memory-bound): decode weights on the fly into register tiles that hold their
    /// accumulators over the whole row — n = 1: 8 rows (bf16, f16, fp8: 4); else 4 rows x 3 tokens
    /// (fp8: 2 x 3), or 3 rows x 4 tokens where [`four_token_tiles`] says. A row tile's weights
    /// are re-read from cache for each token tile.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn direct_simd(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        use crate::kernels::simd::{direct, direct_fp8};
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        let nch = cols / LANES;
        let x = self.x.as_ptr();
        let o = out.as_mut_ptr();
        let fp8 = matches!(self.w, WRef::Fp8 { .. });
        // f16 / bf16 one-token rows in 4-row tiles: fewer concurrent weight streams per thread;
        // measured on Zen 5 (BENCHMARKS.md "One weight stream per thread"): the widened target's
        // decode +8-15 % in f16, +1-15 % in bf16 on the avx512 level (3 of 3 pairs) and the avx2
        // level (2 of 3) over 8-row tiles. f32 weights keep 8 (not re-measured).
        let halfw = matches!(self.w, WRef::F16(_) | WRef::Bf16(_));
        let mr_max = match (n, fp8) {
            (1, false) if halfw => 4,
            (1, false) => 8,
            (1, true) => 4,
            (_, false) => 4,
            (_, true) => 2,
        };
        for tb0 in (0..n).step_by(DIRECT_TOKEN_BLOCK) {
            let tb1 = (tb0 + DIRECT_TOKEN_BLOCK).min(n);
            // 3 rows x 4 tokens where the block splits into such tiles and at most one of 3
            // tokens (see [`four_token_tiles`]); else 4 rows x 3 tokens.
            let fours = !fp8 && four_token_tiles(tb1 - tb0);
            let (mr_max, nr_max) = if fours { (3, 4) } else { (mr_max, NR) };
            let mut i0 = 0;
            while i0 < nrows {
                let mr = if nrows - i0 >= mr_max { mr_max } else { 1 };
                let mut t0 = tb0;
                while t0 < tb1 {
                    let nr = nr_max.min(tb1 - t0);
                    let xp = x.add(t0 * cols);
                    let op = o.add(i0 * n + t0);
                    macro_rules! go {
                    ($p:expr, $ty:ty; $($m:literal, $t:literal);*) => {
                        match (mr, nr) {
                            $(($m, $t) if t0 == tb0 => direct::<$ty, $m, $t, true>($p, cols, xp, cols, nch, op, n),)*
                            $(($m, $t) => direct::<$ty, $m, $t, false>($p, cols, xp, cols, nch, op, n),)*
                            _ => unreachable!("direct tile {mr}x{nr}"),
                        }
                    };
                }
                    match self.w {
                        // One token, full 8-row tiles: the prefetching GEMV tile.
                        WRef::F32(d) if n == 1 && mr == 8 => {
                            crate::kernels::simd::gemv_prefetch::<f32, 8>(
                                d.as_ptr().add((wr0 + i0) * cols),
                                cols,
                                xp,
                                nch,
                                op,
                            )
                        }
                        WRef::Bf16(d) if n == 1 && mr == 4 => {
                            crate::kernels::simd::gemv_prefetch::<u16, 4>(
                                d.as_ptr().add((wr0 + i0) * cols),
                                cols,
                                xp,
                                nch,
                                op,
                            )
                        }
                        WRef::F16(d) if n == 1 && mr == 4 => {
                            crate::kernels::simd::gemv_prefetch::<half::f16, 4>(
                                d.as_ptr().add((wr0 + i0) * cols),
                                cols,
                                xp,
                                nch,
                                op,
                            )
                        }
                        WRef::F32(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, f32; 8, 1; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::Bf16(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, u16; 8, 1; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::F16(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, half::f16; 8, 1; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        // One token, 4-row tiles, AVX512-VBMI: two rows per register.
                        WRef::Fp8 {
                            data, block_cols, ..
                        } if n == 1 && mr == 4 && self.isa.vbmi() => {
                            let p = data.as_ptr().add((wr0 + i0) * cols);
                            let ncb = cols.div_ceil(block_cols);
                            let sp = s.s256.as_ptr().add(i0 * ncb);
                            // SAFETY: Isa::vbmi() is true only after AVX-512 and VBMI were detected.
                            crate::kernels::simd512::gemv_fp8_vbmi4(
                                p,
                                cols,
                                xp,
                                nch,
                                block_cols / LANES,
                                sp,
                                ncb,
                                op,
                            )
                        }
                        WRef::Fp8 {
                            data, block_cols, ..
                        } => {
                            let p = data.as_ptr().add((wr0 + i0) * cols);
                            let bch = block_cols / LANES;
                            let ncb = cols.div_ceil(block_cols);
                            let sp = s.s256.as_ptr().add(i0 * ncb);
                            macro_rules! go8 {
                            ($($m:literal, $t:literal);*) => {
                                match (mr, nr) {
                                    $(($m, $t) => direct_fp8::<$m, $t>(p, cols, xp, cols, nch, bch, sp, ncb, op, n),)*
                                    _ => unreachable!("direct fp8 tile {mr}x{nr}"),
                                }
                            };
                        }
                            go8!(4, 1; 2, 3; 2, 2; 2, 1; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::Bf16Strips(_) => unreachable!("strips matrices take strips.rs"),
                    }
                    t0 += nr;
                }
                i0 += mr;
            }
        }
        self.finish_tails(wr0, r0, out, s);
    }

    /// Many tokens (compute-bound): per token block and column block, decode an f32 panel and
    /// sweep MR x NR register tiles over it with accumulators in `s.acc`; then lane-sum and tail
    /// every element.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemm_simd(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        let nch = cols / LANES;
        let (kc, fp8) = match self.w {
            WRef::Fp8 { block_cols, .. } => (block_cols / LANES, true),
            _ => (KC_CHUNKS, false),
        };
        let plen = nrows * kc * LANES; // panel: [nrows, kc * 8]
        let x = self.x.as_ptr();
        let mut tb0 = 0;
        while tb0 < n {
            let nb = TOKEN_BLOCK.min(n - tb0);
            let acc = s.acc.zeroed(nrows * nb * LANES).as_mut_ptr(); // [nrows, nb, 8]
            let mut c0 = 0;
            let mut b = 0;
            while c0 < nch {
                let nc = kc.min(nch - c0);
                let (wp, ws) = self.decode_panel(wr0, c0, nrows, nc, s.panel.reuse(plen));
                // Row tile outer: its KC-wide weights stay in L1 while the token tiles of the
                // block (x slice [nb, KC], also L1-sized) sweep past.
                let mut i0 = 0;
                while i0 < nrows {
                    let mr = MR.min(nrows - i0);
                    let mut sc = [0.0f32; MR];
                    if fp8 {
                        for (ii, v) in sc.iter_mut().enumerate().take(mr) {
                            *v = self.fp8_scales(&s.s256, r0, r0 + i0 + ii)[b];
                        }
                    }
                    let scales = if fp8 { Some(&sc[..]) } else { None };
                    let mut t0 = 0;
                    while t0 < nb {
                        let nr = NR.min(nb - t0);
                        let xp = x.add((tb0 + t0) * cols + c0 * LANES);
                        let m = acc.add((i0 * nb + t0) * LANES);
                        tile_dyn(mr, nr, wp.add(i0 * ws), ws, xp, cols, nc, m, nb, scales);
                        t0 += nr;
                    }
                    i0 += mr;
                }
                c0 += nc;
                b += 1;
            }
            self.finish_block(s.acc.as_slice(), nb, wr0, r0, tb0, nb, out, &s.s256);
            tb0 += nb;
        }
    }
}

/// Runtime (rows, tokens) tile size to the monomorphised register tile.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dyn(
    mr: usize,
    nr: usize,
    w: *const f32,
    ws: usize,
    x: *const f32,
    xs: usize,
    nc: usize,
    mem: *mut f32,
    n: usize,
    scales: Option<&[f32]>,
) {
    use crate::kernels::simd::tile_mem;
    macro_rules! go {
        ($($m:literal, $t:literal);*) => {
            match (mr, nr) {
                $(($m, $t) => tile_mem::<$m, $t>(w, ws, x, xs, nc, mem, n, scales),)*
                _ => unreachable!("tile size {mr}x{nr}"),
            }
        };
    }
    go!(4, 3; 4, 2; 4, 1; 3, 3; 3, 2; 3, 1; 2, 3; 2, 2; 2, 1; 1, 3; 1, 2; 1, 1)
}

/// Whether a direct-path token block of `nb` tokens (f32 / bf16 / f16 weights) runs in tiles of
/// 3 rows x 4 tokens (the rows' decoded chunks held in registers, each token's chunk loaded once
/// for the three rows: `simd::tile` with MR < NR) instead of 4 rows x 3 tokens: where the block
/// is 4 or more tokens and splits into 4-token tiles and at most one 3-token tile (n mod 4 = 0
/// or 3). Measured on AMD EPYC Zen 3 (AVX2, no AVX-512; docs/BENCHMARKS.md "An AVX2-only
/// CPU"), alternated in one process on seven of the widened target's shapes: 3 x 4 won 8-9 of
/// 9 rounds at n = 4 (1.03-1.50x of one token's time against 1.18-1.81x), 6-9 of 9 at n = 7, 8
/// and 16, and lost at n = 5, 6 and 9, where it leaves a 1- or 2-token tile of three rows (0-4
/// of 9). The same bits either way: tiles only choose which elements are computed together.
/// [`set_avx2_token_tiles`] overrides the rule for the whole process.
fn four_token_tiles(nb: usize) -> bool {
    use std::sync::atomic::Ordering;
    match TOKEN_TILES.load(Ordering::Relaxed) {
        TILES_THREES => false,
        TILES_FOURS => nb >= 4,
        _ => nb >= 4 && matches!(nb % 4, 0 | 3),
    }
}

const TILES_AUTO: u8 = 0;
const TILES_THREES: u8 = 1;
const TILES_FOURS: u8 = 2;
static TOKEN_TILES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(TILES_AUTO);

/// Choose the AVX2 direct path's token tiles for the whole process: `None` the measured rule
/// ([`four_token_tiles`]), `Some(false)` always 4 rows x 3 tokens, `Some(true)` 3 rows x 4 tokens
/// at every block of 4 or more tokens. Results are the same either way; only speed changes.
pub fn set_avx2_token_tiles(fours: Option<bool>) {
    let v = match fours {
        None => TILES_AUTO,
        Some(false) => TILES_THREES,
        Some(true) => TILES_FOURS,
    };
    TOKEN_TILES.store(v, std::sync::atomic::Ordering::Relaxed);
}

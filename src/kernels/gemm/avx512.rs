//! The AVX-512 row-block paths of `gemm` (n > 1 tokens): the same two regimes as the AVX2 code
//! beside it — direct register tiles for few tokens, decoded f32 panels for many — with the
//! two-tokens-per-register tiles of `simd512.rs`. Bitwise equal to the AVX2 and portable paths
//! (each element keeps the `lanes.rs` sequence; only the packing differs).

use super::{Job, Scratch, WRef, DIRECT_MAX_TOKENS, DIRECT_TOKEN_BLOCK, LANES, ROW_BLOCK_GEMM};
use crate::kernels::simd512::{direct2, direct2_fp8, pair_stride, tile2_mem};

/// Row tile x pair tile of the direct path (pairs: two tokens each): non-fp8 / fp8. Five pairs
/// cover a k = 8 verification (9 tokens) in one pass over each row tile's weights.
const D_MR: usize = 4;
const D_NP: usize = 5;
const D_MR_FP8: usize = 2;
/// Row tile x pair tile of the panel GEMM.
const G_MR: usize = 4;
const G_NP: usize = 4;
/// 8-column chunks per column block of the panel GEMM (non-fp8 weights).
const G_KC_CHUNKS: usize = 32;
/// Tokens per panel-GEMM token block (even): each decoded panel serves this many tokens.
const G_TOKEN_BLOCK: usize = 48;

impl Job<'_> {
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn row_block_avx512(
        &self,
        wr0: usize,
        r0: usize,
        out: &mut [f32],
        s: &mut Scratch,
    ) {
        if self.n <= DIRECT_MAX_TOKENS {
            self.direct_avx512(wr0, r0, out, s)
        } else {
            self.gemm_avx512(wr0, r0, out, s)
        }
    }

    /// Few tokens: weights decoded on the fly into MR rows x NP pairs tiles (accumulators in
    /// registers over the whole row), token blocks of `DIRECT_TOKEN_BLOCK` (even).
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn direct_avx512(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        let nch = cols / LANES;
        let xps = pair_stride(nch);
        let o = out.as_mut_ptr();
        let fp8 = matches!(self.w, WRef::Fp8 { .. });
        let mr_max = if fp8 { D_MR_FP8 } else { D_MR };
        debug_assert!(DIRECT_TOKEN_BLOCK.is_multiple_of(2));
        for tb0 in (0..n).step_by(DIRECT_TOKEN_BLOCK) {
            let tb1 = (tb0 + DIRECT_TOKEN_BLOCK).min(n);
            let mut i0 = 0;
            while i0 < nrows {
                let mr = if nrows - i0 >= mr_max { mr_max } else { 1 };
                let mut t0 = tb0;
                while t0 < tb1 {
                    let nt = (2 * D_NP).min(tb1 - t0);
                    let np = nt.div_ceil(2);
                    let xp = self.xpack.as_ptr().add(t0 / 2 * xps);
                    let op = o.add(i0 * n + t0);
                    macro_rules! go {
                        ($p:expr, $ty:ty; $($m:literal, $q:literal);*) => {
                            match (mr, np) {
                                $(($m, $q) => direct2::<$ty, $m, $q>($p, cols, xp, xps, nch, op, n, nt),)*
                                _ => unreachable!("direct2 tile {mr}x{np}"),
                            }
                        };
                    }
                    match self.w {
                        WRef::F32(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, f32; 4, 5; 4, 4; 4, 3; 4, 2; 4, 1; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::Bf16(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, u16; 4, 5; 4, 4; 4, 3; 4, 2; 4, 1; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::F16(d) => {
                            let p = d.as_ptr().add((wr0 + i0) * cols);
                            go!(p, half::f16; 4, 5; 4, 4; 4, 3; 4, 2; 4, 1; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::Fp8 {
                            data, block_cols, ..
                        } => {
                            let p = data.as_ptr().add((wr0 + i0) * cols);
                            let bch = block_cols / LANES;
                            let ncb = cols.div_ceil(block_cols);
                            let sp = s.s256.as_ptr().add(i0 * ncb);
                            macro_rules! go8 {
                                ($($m:literal, $q:literal);*) => {
                                    match (mr, np) {
                                        $(($m, $q) => direct2_fp8::<$m, $q>(p, cols, xp, xps, nch, bch, sp, ncb, op, n, nt),)*
                                        _ => unreachable!("direct2 fp8 tile {mr}x{np}"),
                                    }
                                };
                            }
                            go8!(2, 5; 2, 4; 2, 3; 2, 2; 2, 1; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1)
                        }
                        WRef::Bf16Strips(_) => unreachable!("strips matrices take strips.rs"),
                    }
                    t0 += nt;
                }
                i0 += mr;
            }
        }
        self.finish_tails(wr0, r0, out, s);
    }

    /// Many tokens: per token block and column block, decode an f32 panel and sweep MR x NP
    /// pair tiles over it with accumulators in `s.acc` ([rows, even tokens, 8]); then lane-sum
    /// and tail every element.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn gemm_avx512(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        debug_assert!(nrows <= ROW_BLOCK_GEMM && G_TOKEN_BLOCK.is_multiple_of(2));
        let nch = cols / LANES;
        let xps = pair_stride(nch);
        let (kc, fp8) = match self.w {
            WRef::Fp8 { block_cols, .. } => (block_cols / LANES, true),
            _ => (G_KC_CHUNKS, false),
        };
        let plen = nrows * kc * LANES; // panel: [nrows, kc * 8]
        let mut tb0 = 0;
        while tb0 < n {
            let nb = G_TOKEN_BLOCK.min(n - tb0);
            let ne = nb.next_multiple_of(2);
            let acc = s.acc.zeroed(nrows * ne * LANES).as_mut_ptr(); // [nrows, ne, 8]
            let mut c0 = 0;
            let mut b = 0;
            while c0 < nch {
                let nc = kc.min(nch - c0);
                let (wp, ws) = self.decode_panel(wr0, c0, nrows, nc, s.panel.reuse(plen));
                // Pair tile outer: its packed activations ([NP pairs, nc chunks, 16], 8 KiB)
                // stay in L1 while the row tiles stream the decoded panel from L2.
                let mut p0 = 0;
                while p0 < ne / 2 {
                    let np = G_NP.min(ne / 2 - p0);
                    let xp = self.xpack.as_ptr().add((tb0 / 2 + p0) * xps + c0 * 16);
                    let mut i0 = 0;
                    while i0 < nrows {
                        let mr = G_MR.min(nrows - i0);
                        let mut sc = [0.0f32; G_MR];
                        if fp8 {
                            for (ii, v) in sc.iter_mut().enumerate().take(mr) {
                                *v = self.fp8_scales(&s.s256, r0, r0 + i0 + ii)[b];
                            }
                        }
                        let scales = if fp8 { Some(&sc[..]) } else { None };
                        let m = acc.add((i0 * ne + 2 * p0) * LANES);
                        let w = wp.add(i0 * ws);
                        macro_rules! go {
                            ($($a:literal, $q:literal);*) => {
                                match (mr, np) {
                                    $(($a, $q) => tile2_mem::<$a, $q>(w, ws, xp, xps, nc, m, ne, scales),)*
                                    _ => unreachable!("tile2 {mr}x{np}"),
                                }
                            };
                        }
                        go!(4, 4; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 2, 4; 2, 3; 2, 2; 2, 1; 1, 4; 1, 3; 1, 2; 1, 1);
                        i0 += mr;
                    }
                    p0 += np;
                }
                c0 += nc;
                b += 1;
            }
            self.finish_block(s.acc.as_slice(), ne, wr0, r0, tb0, nb, out, &s.s256);
            tb0 += nb;
        }
    }
}

//! The AMX-BF16 row-block path of `gemm`: bf16 weights with a multiple of 32 columns, on the
//! `amx` ISA level, for EVERY token count (n = 1 included, so batch invariance holds on this
//! level: one code path per element whatever n).
//!
//! Operands: the A tile is 16 weight rows x 32 columns read in place from the (mmapped) matrix
//! — no repacking; the B tiles are the activations, packed once per call by [`pack_splits`] as
//! bf16 pairs (`[k pair][token][2]`, the layout `tdpbf16ps` reads) in an exact three-way split
//! x = hi + mid + lo (each a bf16; the f32 significand's 24 bits are 8 + 8 + 8), so every
//! product w * part is exact in f32 and only the f32 accumulation rounds. The C tile holds 16
//! rows x up to 16 tokens and is stored straight into the transposed output `[rows, n]`.
//!
//! Order (fixed per element, independent of n, the token's position, the row split and the
//! thread): for each 32-column k-tile in increasing order, C += A·B_hi, then A·B_mid, then
//! A·B_lo, each `tdpbf16ps` adding its 16 pair-products to the element in the hardware's fixed
//! order. It is NOT the `lanes.rs` order of the other levels: results differ from them by f32
//! rounding (the kernel tests state the tolerance), never across n on this level.

use super::{Job, WRef};
use crate::kernels::amx::{self, TileCfg};

/// bf16 columns per A-tile row (64 bytes) = 16 k pairs.
pub(super) const K_TILE: usize = 32;
/// Rows per A / C tile, tokens per B / C tile.
const M_TILE: usize = 16;
const N_TILE: usize = 16;

/// Whether a matmul of these weights runs on the AMX path at this ISA.
pub(super) fn applies(isa: crate::kernels::Isa, w: WRef<'_>, cols: usize) -> bool {
    isa.amx() && matches!(w, WRef::Bf16(_)) && cols > 0 && cols.is_multiple_of(K_TILE)
}

/// Bytes of the packed activations before token tile j (every earlier tile is full).
fn tile_offset(cols: usize, j: usize) -> usize {
    j * 3 * cols * N_TILE * 2
}

/// Three-way bf16 split of the activations x: [n, cols] into `out`, one contiguous block per
/// 16-token tile: [tile][3 parts][cols / 2 pairs][tile tokens][2] (part 0 = hi, 1 = mid,
/// 2 = lo; hi + mid + lo == x exactly for every finite x whose parts stay above the bf16
/// subnormal range). A tile's block stays in L2 while the row tiles of a block sweep it.
pub(super) fn pack_splits(x: &[f32], cols: usize, n: usize, out: &mut [u16]) {
    debug_assert_eq!(out.len(), 3 * cols * n);
    for (t, xt) in x.chunks_exact(cols).enumerate() {
        let (j, tt) = (t / N_TILE, t % N_TILE);
        let nt = (n - j * N_TILE).min(N_TILE);
        let base = tile_offset(cols, j) / 2; // in u16
        let part = cols * nt;
        for (c, &v) in xt.iter().enumerate() {
            let hi = f32::from_bits(v.to_bits() & 0xffff_0000);
            let r = v - hi; // exact: the low 16 significand bits of v
            let mid = f32::from_bits(r.to_bits() & 0xffff_0000);
            let lo = r - mid; // exact, and at most 8 significant bits: a bf16
            let i = base + (c / 2) * 2 * nt + 2 * tt + (c & 1);
            out[i] = (hi.to_bits() >> 16) as u16;
            out[part + i] = (mid.to_bits() >> 16) as u16;
            out[2 * part + i] = (lo.to_bits() >> 16) as u16;
        }
    }
}

impl Job<'_> {
    /// Rows [wr0, wr0 + out.len() / n) for all tokens into out: [block rows, n].
    ///
    /// # Safety
    /// Only after `IsaLevel::Amx.supported()`, with `applies(..)` true and `self.bpack` the
    /// [`pack_splits`] of `self.x`.
    pub(super) unsafe fn row_block_amx(&self, wr0: usize, out: &mut [f32]) {
        let WRef::Bf16(d) = self.w else {
            unreachable!("the AMX path takes bf16 weights")
        };
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        debug_assert_eq!(self.bpack.len(), 3 * cols * n);
        let nkt = cols / K_TILE;
        let astride = cols * 2; // bytes between weight rows
        let o = out.as_mut_ptr() as *mut u8;
        let mut cfg_of = None;
        let mut cfg = TileCfg::new();
        // Token tiles outer: a tile's packed activations stay in L2 for all row tiles of the
        // block, the block's weight rows too (the first token tile streams them in).
        for (j, t0) in (0..n).step_by(N_TILE).enumerate() {
            let nt = (n - t0).min(N_TILE);
            let bstride = nt * 4; // bytes between k pairs of the packed activations
            let part = cols * nt * 2; // bytes between the hi / mid / lo parts
            let ktb = K_TILE / 2 * bstride; // bytes per k-tile of one part
            let b = (self.bpack.as_ptr() as *const u8).add(tile_offset(cols, j));
            for i0 in (0..nrows).step_by(2 * M_TILE) {
                let m = (nrows - i0).min(2 * M_TILE);
                let (m0, m1) = if m > M_TILE {
                    (M_TILE, m - M_TILE)
                } else {
                    (m, 0)
                };
                let a0 = d.as_ptr().add((wr0 + i0) * cols) as *const u8;
                if cfg_of != Some((m0, m1, nt)) {
                    cfg.set(0, m0, 64);
                    cfg.set(5, m0, nt * 4);
                    if m1 > 0 {
                        cfg.set(1, m1, 64);
                        cfg.set(6, m1, nt * 4);
                    }
                    for b in 2..5 {
                        cfg.set(b, K_TILE / 2, nt * 4);
                    }
                    cfg.load();
                    cfg_of = Some((m0, m1, nt));
                }
                let c0 = o.add((i0 * n + t0) * 4);
                // bytes between output rows ([rows, n])
                let cs = n * 4;
                // The first token tile streams the next rows into cache (up to 32 of them,
                // within this matrix) while its own rows are read.
                let next = if t0 == 0 {
                    (self.rows_total - (wr0 + i0 + m)).min(2 * M_TILE)
                } else {
                    0
                };
                let pf = a0.add(m * astride);
                if m1 > 0 {
                    tiles::<true>(a0, astride, b, bstride, part, ktb, nkt, pf, next);
                    amx::store::<5>(c0, cs);
                    amx::store::<6>(o.add(((i0 + M_TILE) * n + t0) * 4), cs);
                } else {
                    tiles::<false>(a0, astride, b, bstride, part, ktb, nkt, pf, next);
                    amx::store::<5>(c0, cs);
                }
            }
        }
        amx::release();
    }
}

/// Prefetch the 64 bytes at column byte offset `off` of `rows` rows from `pf` on.
#[inline(always)]
unsafe fn prefetch_rows(pf: *const u8, astride: usize, rows: usize, off: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for r in 0..rows {
        _mm_prefetch::<_MM_HINT_T0>(pf.add(r * astride + off) as *const i8);
    }
}

/// The full k sweep of one token tile: tmm5 = rows a.. and, with TWO, tmm6 = rows
/// a + 16 * astride..; prefetches `pf_rows` rows from `pf` at the same columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<const TWO: bool>(
    a: *const u8,
    astride: usize,
    b: *const u8,
    bstride: usize,
    part: usize,
    ktb: usize,
    nkt: usize,
    pf: *const u8,
    pf_rows: usize,
) {
    amx::zero::<5>();
    if TWO {
        amx::zero::<6>();
    }
    let a1 = a.add(M_TILE * astride);
    for kt in 0..nkt {
        prefetch_rows(pf, astride, pf_rows, kt * 64);
        amx::load::<0>(a.add(kt * 64), astride);
        if TWO {
            amx::load::<1>(a1.add(kt * 64), astride);
        }
        let bk = b.add(kt * ktb);
        amx::load::<2>(bk, bstride);
        amx::load::<3>(bk.add(part), bstride);
        amx::load::<4>(bk.add(2 * part), bstride);
        amx::dp::<5, 0, 2>();
        if TWO {
            amx::dp::<6, 1, 2>();
        }
        amx::dp::<5, 0, 3>();
        if TWO {
            amx::dp::<6, 1, 3>();
        }
        amx::dp::<5, 0, 4>();
        if TWO {
            amx::dp::<6, 1, 4>();
        }
    }
}

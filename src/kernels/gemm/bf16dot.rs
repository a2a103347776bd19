//! The AVX512-BF16 row-block path of `gemm`: bf16 weights with a multiple of 32 columns — and,
//! where the CPU also has AVX512-VBMI, block-scaled fp8 e4m3 weights with columns and block
//! columns a multiple of 64 — on the `avx512bf16` ISA level, for EVERY token count (n = 1
//! included, so batch invariance holds on this level: one code path per element whatever n).
//!
//! Contract (the one llama.cpp runs on such CPUs; `exact` avoids it): the activations
//! are rounded to bf16 (round to nearest even) once per call, so each product w * x is exact in
//! f32 but x carries a relative error up to 2^-9; a matmul output differs from the exact-f32
//! levels by at most 2^-9 x sum |w * x| plus f32 rounding (the kernel tests state it). In exchange the
//! `vdpbf16ps` instruction does 32 multiply-adds per 512-bit instruction — twice the f32 FMA —
//! and the weights are used as stored, with no widening: compute-bound products (prefill,
//! batched decode, speculative verification) run up to 2x faster.
//!
//! Order (fixed per element, independent of n, the token's position, the row split and the
//! thread): 16 f32 lane accumulators; for each 32-column chunk c in increasing order, lane l
//! adds the pair (w[32c + 2l] x[32c + 2l], w[32c + 2l + 1] x[32c + 2l + 1]) by one `vdpbf16ps`
//! (the hardware's fixed pair order); then the fixed tree: lanes l and l + 8 added, then the
//! 8-lane tree of `lanes.rs`. Tiles (rows x tokens per register block: 1 x 1 for one token, 8 x 1
//! for one token of fp8; 1 x n for 2..=6 tokens whose activations fit L1;
//! 3 x 7, 2 x 8 or 2 x 9 in one pass where the tokens fit L1 beside the weights, and — with the
//! L1 tile prefetch hint — the same tiles span by span over longer rows, each tile's
//! accumulators stashed between its column spans; 4 x 6 passes otherwise) change only which
//! elements are computed together.
//!
//! fp8 (`tile_fp8`, `convert_fp8_rows`): every e4m3 value is exact in bf16, so a 64-byte group
//! of weights becomes two registers of bf16 by two 128-entry byte lookups (`vpermi2b`: the high
//! and low byte of the magnitude's bf16 bits; e4m3 subnormals map to normal bf16), the sign
//! OR-ed in, and two byte unpacks — no widening to f32, so a one-token product streams the
//! weights at memory speed instead of being bound by the decode (the exact levels' fp8 GEMV).
//! The block scale goes into the activations: for the rows of one scale block row, x times the
//! scale of each column block, rounded to bf16 once (the same 2^-9 relative bound per product
//! as rounding x alone), so an element is one dot product of bf16 pairs in the order above over
//! the whole row — one path whatever n: one token converts each group in registers, several
//! convert a tile's rows once per token block into a bf16 panel that the bf16 tiles sweep. The
//! unpacks interleave within 128-bit lanes, so weights and activations are both taken in that
//! order ([`FP8_ORDER`], [`pack_bf16_fp8`]): a permutation of each 64-column group.

use std::arch::x86_64::*;

use super::{Job, WRef};
use crate::kernels::prefetch::{prefetch_line, prefetch_to_l2, tile_prefetch_to_l2};
use crate::kernels::simd::hsum8;

/// bf16 columns per `vdpbf16ps` (one 512-bit register of weights).
pub(super) const K_CHUNK: usize = 32;
/// Register tile of the multi-token path: rows x tokens (24 accumulators).
const MR: usize = 4;
const NT: usize = 6;
/// Rows per register tile of the one-token bf16 path: one, so each thread reads ONE sequential
/// stream of weights (the row after this one is the next in memory). Measured on an AMD Zen 5
/// (2 threads, weights from DRAM; BENCHMARKS.md "One weight stream per thread"): 1-row tiles
/// streamed 7-30 % more GB/s than 8-row tiles (eight streams 1.5-24 KB apart) on every shape of
/// the widened target, and its batch-1 decode went 77-100 -> 99-115 tok/s; on Zen 4 the two
/// layouts had tied. A row's `vdpbf16ps` chain is latency-bound at ~64 bytes per 5-6 cycles,
/// well above one core's share of the memory bandwidth.
const MR1: usize = 1;
/// Rows per register tile of the one-token bf16 path when the weights are expected in the
/// caches (`Matrix::cache_resident`: a draft model, re-read every ~60 us from the L2 / L3).
/// There the one-row tile's single `vdpbf16ps` chain per row, not the memory, sets the pace;
/// eight rows give eight independent chains (each row's order unchanged: same bits). Measured
/// on Zen 5 (the bundled draft's one-token forward at context 64, 8 forwards per round, 380
/// rounds, three alternated runs): 87 -> 65 us per token on one thread, 68 -> 56 on two; on
/// cache-resident kernel calls 768 x 192 4.6 -> 3.4 us, 192 x 768 4.6 -> 3.0 (one thread),
/// 4 rows per tile in between. Not for weights streamed from DRAM: 4-row tiles streamed the
/// widened target's 1536 x 512 and 1536 x 256 matrices 10-20 % slower than one-row tiles. The
/// software prefetch of the next tile made the resident walk slower (79 vs 65 us per token
/// on one thread), so these tiles prefetch nothing. For the same reason 2..6 tokens over
/// resident weights take the 4 x n tiles instead of one-row tiles (rounds of a 2-token
/// catch-up and 7 one-token drafts, one thread, three alternated runs: 78-79 -> 69-71 us per
/// token).
const MR1_RESIDENT: usize = 8;
/// Rows per register tile of the one-token fp8 path (its conversion hides the chain latency;
/// not re-measured with one row).
const MR1_FP8: usize = 8;
/// Tokens per token block: a block's packed activations ([48, cols] bf16) stay in L2 while
/// the row tiles of a row block sweep them.
const TOKEN_BLOCK: usize = 48;

/// Rows per register tile of the single-pass path at `n` tokens: every token's chunk held in a
/// register beside the rows' accumulators (3 x 7 + 7 + 1, 2 x 8 + 8 + 1, 2 x 9 + 9 + 1 of the 32
/// zmm registers), so a weight line is loaded once and each token's chunk once per row tile.
const fn mr_sp(n: usize) -> usize {
    if n == 7 {
        3
    } else {
        2
    }
}

/// Token counts of the single-pass path: a 9-token verification (k = 8) and its neighbours,
/// which the two-pass 4 x 6 tiles split into a 6-token and a 1..3-token pass.
const SP_TOKENS: std::ops::RangeInclusive<usize> = 7..=9;
/// L1 bytes the single-pass path's packed activations ([n, cols] bf16) may take: every row tile
/// reads every token's chunk again, so they must stay in the 32 KB L1 with the weights.
const SP_X_BYTES: usize = 27 * 1024;

/// Whether `n` tokens over `cols` columns take the single-pass tiles ([`mr_sp`] x n): 7..=9
/// tokens, activations within [`SP_X_BYTES`], rows of at least 1024 columns (measured: shorter
/// rows streamed slower single-pass than in the 4 x 6 + 4 x 3 passes; BENCHMARKS.md). Why one
/// pass: the 4 x 6 tiles take 9 tokens in two passes over a row tile, and during the second
/// (3 tokens, weights from L1/L2) no weights stream from memory, so a 9-token product overlapped
/// its multiply-adds with the stream only in part. Why the tokens in registers: with each
/// token's chunk a memory operand of its `vdpbf16ps` (the first single-pass tiles, 3 x 9), a
/// weight line cost 10 loads per 9 multiply-adds and the load ports, not the dot unit, set the
/// pace; 2 x 9 takes 11 loads per 18.
fn single_pass(n: usize, cols: usize) -> bool {
    SP_TOKENS.contains(&n) && cols >= 1024 && n * cols * 2 <= SP_X_BYTES
}

/// Whether `n` tokens over `cols` columns take the single-pass tiles over column spans: 7..=9
/// tokens whose activations do NOT fit [`SP_X_BYTES`] (the widened target's 6144- and
/// 12288-column down projections at a k = 8 verification: 110 and 221 KB). Each row tile then
/// runs span by span (each span's activations in L1), its accumulators stashed between spans
/// ([`Carry`]), the rows of a sub-block of [`SP_SUB_TILES`] tiles taken span by span. Why not
/// the two-pass 4 x 6 + 4 x 3 tiles: during their second pass no weights stream from memory
/// (Zen 5, 2 threads, walks of 1536 x 6144 at 8 / 9 tokens, three alternated rounds: 31-37 GB/s
/// of weights on two passes, 42-50 on spans); why not the whole row in one pass with the
/// activations in the L2: slower still (22-27 GB/s; each weight line waits on 7-9 L2 loads).
/// BENCHMARKS.md "Long rows at a k = 8 verification". Only with the L1 tile prefetch hint
/// (`tiles_l2` false): the spans were measured against the two passes with L1 prefetches, and
/// where the tiles prefetch into the L2 (Zen 4) the two passes streamed those walks 1.3-1.6x
/// faster than the spans (n = 8 / 9 over 1536 x 6144 and 1536 x 12288, three alternated
/// rounds: 24-31 vs 17-24 GB/s; BENCHMARKS.md "Zen 4: several-token tiles prefetch into the L2").
fn single_pass_spans(n: usize, cols: usize, tiles_l2: bool) -> bool {
    !tiles_l2 && SP_TOKENS.contains(&n) && n * cols * 2 > SP_X_BYTES
}

/// Row tiles per sub-block of [`single_pass_spans`]: their stashed accumulators (at most
/// 8 x 21 registers, 10.5 KB) stay in L1 beside a span's activations (<= 27 KB).
const SP_SUB_TILES: usize = 8;
/// Registers the stash of one sub-block needs: the largest [`mr_sp`] x n over [`SP_TOKENS`].
const SP_STASH: usize = SP_SUB_TILES * 21;

/// Chunks per column span of [`single_pass_spans`] over `nk` chunks: as many as keep the span's
/// activations within [`SP_X_BYTES`], evened out over the spans.
fn span_chunks(n: usize, nk: usize) -> usize {
    let max = (SP_X_BYTES / (n * K_CHUNK * 2)).max(1);
    nk.div_ceil(nk.div_ceil(max))
}

/// How many row tiles ahead the single-pass tiles prefetch (the other paths: the next one). A
/// 2 x 9 tile over 1536 columns spends ~900 `vdpbf16ps` (~0.2 us) per row tile, about one
/// loaded DRAM latency, so the next tile's lines arrived late; three tiles ahead streamed the
/// widened target's 1536-column matrices 8-27 % faster at 8 and 9 tokens in two checks and
/// within +-10 % (6 of 9 faster) in a third (Zen 5, 2 threads, alternated rounds with the caches
/// flushed between; BENCHMARKS.md "Kernel walks re-checked with the caches flushed"). Only when
/// bytes arrive changes, never a result.
const SP_PF_TILES: usize = 3;

/// L1 bytes the activations ([n, cols] bf16) of a few-token product may take for it to run on
/// one-row tiles (1 x n), which re-read every token's chunk for each row: room beside the
/// streamed weights in a 32 KB L1 (Zen 4; Zen 5 has 48 KB). Every shape measured (the widened
/// target's 768- to 6144-column rows at n <= 6, up to 24 KB) is inside it.
const ROW1_X_BYTES: usize = 24 * 1024;

/// Whether `n` tokens over `cols` columns take one-row tiles (1 x n, one token tile) instead of
/// 4 x n: up to [`NT`] tokens whose activations stay in L1. Like the one-token path (`MR1`),
/// each thread then reads ONE sequential weight stream, and the n accumulators are n
/// independent chains. Measured on Zen 5 (BENCHMARKS.md "One weight stream per thread"): the
/// widened target's expert matrices at n = 2 / 3 streamed 20-45 % more GB/s than on 4 x n
/// tiles; rows of 12288 columns (activations beyond L1) were 25 % slower at n = 3, so they keep
/// 4 x n.
fn one_row_tiles(n: usize, cols: usize) -> bool {
    n <= NT && n * cols * 2 <= ROW1_X_BYTES
}

/// fp8 columns per group (one 64-byte load, two `vdpbf16ps`).
pub(super) const FP8_GROUP: usize = 64;
/// Up to this many tokens an fp8 product converts each weight group in registers for all its
/// tokens; above, a row tile is converted once per token block into a bf16 panel.
const FP8_REGISTER_TOKENS: usize = 4;

/// Whether a bf16 matmul of these weights runs on this path at this ISA.
pub(super) fn applies(isa: crate::kernels::Isa, w: WRef<'_>, cols: usize) -> bool {
    isa.bf16_dot() && matches!(w, WRef::Bf16(_)) && cols > 0 && cols.is_multiple_of(K_CHUNK)
}

/// Whether an fp8 matmul runs on this path: the level, AVX512-VBMI (the byte lookups), and
/// 64-column groups that never straddle a scale block.
pub(super) fn applies_fp8(isa: crate::kernels::Isa, w: WRef<'_>, cols: usize) -> bool {
    isa.bf16_dot()
        && isa.vbmi()
        && matches!(w, WRef::Fp8 { block_cols, .. } if block_cols.is_multiple_of(FP8_GROUP))
        && cols > 0
        && cols.is_multiple_of(FP8_GROUP)
}

/// bf16 bits of the e4m3fn magnitude `m` (0..=127; 127 is NaN): exact for every finite value
/// (3 mantissa bits, exponents 2^-9 ..= 2^8), subnormals included (they become normal bf16).
const fn e4m3_magnitude_bf16(m: u8) -> u16 {
    let (e, f) = ((m >> 3) as i32, (m & 7) as i32);
    if m == 0x7f {
        0x7fc0
    } else if e > 0 {
        (((e - 7 + 127) << 7) | (f << 4)) as u16
    } else if f == 0 {
        0
    } else {
        // f x 2^-9 with f in 1..=7: top bit p, fraction bits below it
        let p = if f >= 4 {
            2
        } else if f >= 2 {
            1
        } else {
            0
        };
        (((p - 9 + 127) << 7) | ((f - (1 << p)) << (7 - p))) as u16
    }
}

/// The lookup tables of `tile_fp8`: high bytes, then low bytes, of [`e4m3_magnitude_bf16`].
const FP8_BF16_TABLES: [[u8; 128]; 2] = {
    let mut t = [[0u8; 128]; 2];
    let mut m = 0;
    while m < 128 {
        let v = e4m3_magnitude_bf16(m as u8);
        t[0][m] = (v >> 8) as u8;
        t[1][m] = v as u8;
        m += 1;
    }
    t
};

/// Word `i` of a packed 64-column group holds column `FP8_ORDER[i]` of the group: the order the
/// byte unpacks of `tile_fp8` leave the weights in (lane L of the low unpack: columns
/// 16L..16L+8; of the high one: 16L+8..16L+16).
const FP8_ORDER: [u16; 64] = {
    let mut o = [0u16; 64];
    let mut i = 0;
    while i < 64 {
        let (half, l, j) = (i / 32, (i % 32) / 8, i % 8);
        o[i] = (16 * l + 8 * half + j) as u16;
        i += 1;
    }
    o
};

/// x: [n, cols] rounded to bf16 like [`pack_bf16`], each 64-column group in [`FP8_ORDER`]
/// (cols a multiple of 64), into `out`: [n, cols].
///
/// # Safety
/// Only where the CPU has AVX512-BF16 (`IsaLevel::Avx512Bf16.supported()`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_bf16_fp8(x: &[f32], out: &mut [u16]) {
    assert!(
        x.len().is_multiple_of(FP8_GROUP),
        "pack_bf16_fp8: not whole groups"
    );
    pack_bf16(x, out);
    let ia = _mm512_loadu_si512(FP8_ORDER.as_ptr() as *const _);
    let ib = _mm512_loadu_si512(FP8_ORDER.as_ptr().add(32) as *const _);
    for g in out.chunks_exact_mut(FP8_GROUP) {
        let p = g.as_mut_ptr();
        let lo = _mm512_loadu_si512(p as *const _);
        let hi = _mm512_loadu_si512(p.add(32) as *const _);
        _mm512_storeu_si512(p as *mut _, _mm512_permutex2var_epi16(lo, ia, hi));
        _mm512_storeu_si512(p.add(32) as *mut _, _mm512_permutex2var_epi16(lo, ib, hi));
    }
}

/// The activations x: [n, cols] rounded to bf16 into `out`: [n, cols], by `vcvtneps2bf16`
/// (round to nearest even; like `vdpbf16ps` itself it treats f32 subnormals as zero), 16 at a
/// time — every value of a call goes through the same instruction, tail included (masked).
///
/// # Safety
/// Only where the CPU has AVX512-BF16 (`IsaLevel::Avx512Bf16.supported()`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_bf16(x: &[f32], out: &mut [u16]) {
    assert_eq!(out.len(), x.len(), "pack_bf16: lengths");
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= x.len() {
        let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(xp.add(i))));
        _mm256_storeu_si256(op.add(i) as *mut __m256i, v);
        i += 16;
    }
    if i < x.len() {
        let k: __mmask16 = (1u32 << (x.len() - i)) as u16 - 1;
        let v: __m256i =
            std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, xp.add(i))));
        _mm256_mask_storeu_epi16(op.add(i) as *mut i16, k, v);
    }
}

/// The fixed 16-lane tree: lanes l + (l + 8), then `hsum8`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn hsum16(v: __m512) -> f32 {
    let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    hsum8(s)
}

/// One register tile: rows `w + i * ws` (i < R) times tokens `x + j * xs` (j < T), all
/// `nk` chunks, into `out[i * rs + j * ts]`. With `pf_rows` > 0, also prefetches that many rows
/// from `pf` at the same columns (the next row tile, streamed while this one is read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const T: usize>(
    w: *const u16,
    ws: usize,
    x: *const u16,
    xs: usize,
    nk: usize,
    out: *mut f32,
    (rs, ts): (usize, usize),
    pf: *const u16,
    pf_rows: usize,
) {
    tile_span::<R, T>(w, ws, x, xs, nk, out, (rs, ts), (pf, pf_rows, nk), None)
}

/// Where a tile computed over one column span of its rows ([`single_pass_spans`]) takes its
/// accumulators from and leaves them: `stash` holds the R x T registers between spans (row
/// major). `first`: start from zero instead of the stash; `last`: reduce into the outputs
/// instead of stashing. Spans taken in increasing column order continue every lane's chain
/// exactly as one pass over the whole row does, so the result is the same bits.
#[derive(Clone, Copy)]
struct Carry {
    stash: *mut __m512,
    first: bool,
    last: bool,
}

/// [`tile`] over `nk` chunks from `w` and `x` (already offset to the span's first column),
/// carrying its accumulators through `carry` (None: one span, the whole row); prefetches
/// `pf.1` rows from `pf.0` for the first `pf.2` chunks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_span<const R: usize, const T: usize>(
    w: *const u16,
    ws: usize,
    x: *const u16,
    xs: usize,
    nk: usize,
    out: *mut f32,
    (rs, ts): (usize, usize),
    (pf, pf_rows, pf_nk): (*const u16, usize, usize),
    carry: Option<Carry>,
) {
    // One token: the process-wide hint (the L2 on AMD, where a pure stream measured faster so).
    // Several tokens: the tiles' own hint (`prefetch::tile_prefetch_hint`). Their tiles spend
    // longer on each line: on Zen 5 a line left in the L2 cost its L2-to-L1 latency in the
    // middle of the dot work (the L1 hint streamed 1-38 % more in 32 of 37 cache-flushed walks;
    // BENCHMARKS.md "Kernel walks re-checked"), while on Zen 4, whose `vdpbf16ps` runs at half
    // the rate, 7..9-token walks streamed 1.6-1.8x faster with L2 prefetches than with L1
    // prefetches at the same distance (BENCHMARKS.md "Zen 4: several-token tiles prefetch
    // into the L2").
    let l2 = if T == 1 {
        prefetch_to_l2()
    } else {
        tile_prefetch_to_l2()
    };
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    if let Some(c) = carry.filter(|c| !c.first) {
        for (i, ai) in acc.iter_mut().enumerate() {
            for (j, v) in ai.iter_mut().enumerate() {
                *v = *c.stash.add(i * T + j);
            }
        }
    }
    for c in 0..nk {
        let off = c * K_CHUNK;
        if c < pf_nk {
            for r in 0..pf_rows {
                prefetch_line(pf.wrapping_add(r * ws + off) as *const i8, l2);
            }
        }
        let mut xv = [_mm512_setzero_si512(); T];
        for (j, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(x.add(j * xs + off) as *const _);
        }
        for (i, ai) in acc.iter_mut().enumerate() {
            let wv: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(w.add(i * ws + off) as *const _));
            for j in 0..T {
                ai[j] =
                    _mm512_dpbf16_ps(ai[j], wv, std::mem::transmute::<__m512i, __m512bh>(xv[j]));
            }
        }
    }
    if let Some(c) = carry.filter(|c| !c.last) {
        for (i, ai) in acc.iter().enumerate() {
            for (j, v) in ai.iter().enumerate() {
                *c.stash.add(i * T + j) = *v;
            }
        }
        return;
    }
    for (i, ai) in acc.iter().enumerate() {
        for (j, v) in ai.iter().enumerate() {
            *out.add(i * rs + j * ts) = hsum16(*v);
        }
    }
}

/// `Job::row_block_bf16dot_at` on the single-pass tiles over column spans
/// ([`single_pass_spans`]): rows `w0 + i * cols` (i < nrows) times the n packed tokens `x`,
/// element (i, t) into `o[i * rs + t * ts]`; `left(i)`: the matrix's rows from row i of the block
/// on (the prefetch stays inside the matrix). Sub-blocks of [`SP_SUB_TILES`] row tiles, each
/// taken span by span in increasing column order, every tile's accumulators stashed between its
/// spans. The prefetch runs [`SP_PF_TILES`] tiles ahead in that order (into the sub-block's next
/// span, then the next sub-block's first span).
///
/// # Safety
/// As `Job::row_block_bf16dot_at`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn span_tiles(
    w0: *const u16,
    x: *const u16,
    (n, cols): (usize, usize),
    nrows: usize,
    left: impl Fn(usize) -> usize,
    o: *mut f32,
    (rs, ts): (usize, usize),
) {
    let nk = cols / K_CHUNK;
    let span = span_chunks(n, nk);
    let mr = mr_sp(n);
    let sub = SP_SUB_TILES * mr;
    debug_assert!(sub * n <= SP_STASH);
    let mut stash = [_mm512_setzero_ps(); SP_STASH];
    for s0 in (0..nrows).step_by(sub) {
        let s1 = (s0 + sub).min(nrows);
        for c0 in (0..nk).step_by(span) {
            let c1 = (c0 + span).min(nk);
            let (first, last) = (c0 == 0, c1 == nk);
            let (mut i0, mut slot) = (s0, 0);
            while i0 < s1 {
                let m = if s1 - i0 >= mr { mr } else { 1 };
                // the tile SP_PF_TILES on: this span, else the next span of this sub-block,
                // else the first span of the next sub-block (rows, first chunk, chunks)
                let t = i0 + SP_PF_TILES * m;
                let (pr, pc, pn) = if t < s1 {
                    (t, c0, c1 - c0)
                } else if !last {
                    (s0 + (t - s1), c1, span.min(nk - c1))
                } else {
                    (t, 0, span.min(nk))
                };
                let pf_rows = if pr < s1 || !last {
                    m.min(s1.saturating_sub(pr))
                } else {
                    left(pr).min(m)
                };
                let pf = w0.wrapping_add(pr * cols + pc * K_CHUNK);
                let carry = Some(Carry {
                    stash: stash.as_mut_ptr().add(slot),
                    first,
                    last,
                });
                let (w, xp, op) = (
                    w0.add(i0 * cols + c0 * K_CHUNK),
                    x.add(c0 * K_CHUNK),
                    o.add(i0 * rs),
                );
                let pfa = (pf, pf_rows, pn.min(c1 - c0));
                macro_rules! go {
                    ($($r:literal, $t:literal);*) => {
                        match (m, n) {
                            $(($r, $t) => tile_span::<$r, $t>(w, cols, xp, cols, c1 - c0, op, (rs, ts), pfa, carry),)*
                            _ => unreachable!("bf16-dot span tile {m}x{n}"),
                        }
                    };
                }
                go!(3, 7; 2, 8; 2, 9; 1, 7; 1, 8; 1, 9);
                slot += m * n;
                i0 += m;
            }
        }
    }
}

/// The token tiles [tb0, tb1) of one row tile (`m` rows, 4 or 1, from `w` with row stride
/// `cols`; x: the packed tokens, `out`: the tile's first output, element (row i, token t) at
/// `out[i * rs + t * ts]`): one `tile` per
/// NT tokens; the first of them prefetches `pf_rows` rows from `pf` (0: none).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn token_tiles(
    w: *const u16,
    m: usize,
    cols: usize,
    x: *const u16,
    (tb0, tb1): (usize, usize),
    out: *mut f32,
    (rs, ts): (usize, usize),
    pf: *const u16,
    pf_rows: usize,
) {
    let nk = cols / K_CHUNK;
    let mut t0 = tb0;
    while t0 < tb1 {
        let nt = NT.min(tb1 - t0);
        let pf_rows = if t0 == tb0 { pf_rows } else { 0 };
        let (xp, op) = (x.add(t0 * cols), out.add(t0 * ts));
        macro_rules! go {
            ($($r:literal, $t:literal);*) => {
                match (m, nt) {
                    $(($r, $t) => tile::<$r, $t>(w, cols, xp, cols, nk, op, (rs, ts), pf, pf_rows),)*
                    _ => unreachable!("bf16-dot tile {m}x{nt}"),
                }
            };
        }
        go!(4, 6; 4, 5; 4, 4; 4, 3; 4, 2; 4, 1; 1, 6; 1, 5; 1, 4; 1, 3; 1, 2; 1, 1);
        t0 += nt;
    }
}

/// The 16 bf16 words of one 64-byte fp8 group `b` (any bytes; e4m3fn), as two registers in
/// [`FP8_ORDER`]: the low unpack and the high unpack.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn fp8_group_to_bf16(b: __m512i, t: &[__m512i; 5]) -> (__m512i, __m512i) {
    let hi = _mm512_permutex2var_epi8(t[0], b, t[1]);
    let lo = _mm512_permutex2var_epi8(t[2], b, t[3]);
    let hi = _mm512_ternarylogic_epi32::<0xF8>(hi, b, t[4]); // hi | (b & 0x80)
    (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi))
}

/// The lookup tables (high bytes 0..64, 64..128, low bytes 0..64, 64..128) and the sign mask.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fp8_tables() -> [__m512i; 5] {
    let t = &FP8_BF16_TABLES;
    [
        _mm512_loadu_si512(t[0].as_ptr() as *const _),
        _mm512_loadu_si512(t[0].as_ptr().add(64) as *const _),
        _mm512_loadu_si512(t[1].as_ptr() as *const _),
        _mm512_loadu_si512(t[1].as_ptr().add(64) as *const _),
        _mm512_set1_epi8(0x80u8 as i8),
    ]
}

/// fp8 register tile for a few tokens: rows `w + i * ws` (bytes, i < R) times the packed,
/// scaled tokens `x + j * xs` ([`pack_scaled_fp8`], j < T), all `ng` groups, into
/// `out[i * on + j]`, converting each group in registers; prefetches `pf_rows` rows from `pf`.
/// Same bits as the bf16 tile over [`convert_fp8_rows`]' panel.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_fp8<const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    x: *const u16,
    xs: usize,
    ng: usize,
    out: *mut f32,
    on: usize,
    pf: *const u8,
    pf_rows: usize,
) {
    let l2 = prefetch_to_l2();
    let t = fp8_tables();
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for g in 0..ng {
        let off = g * FP8_GROUP;
        for r in 0..pf_rows {
            prefetch_line(pf.wrapping_add(r * ws + off) as *const i8, l2);
        }
        for (i, ai) in acc.iter_mut().enumerate() {
            let (wa, wb) =
                fp8_group_to_bf16(_mm512_loadu_si512(w.add(i * ws + off) as *const _), &t);
            let wa = std::mem::transmute::<__m512i, __m512bh>(wa);
            let wb = std::mem::transmute::<__m512i, __m512bh>(wb);
            for (j, a) in ai.iter_mut().enumerate() {
                let xp = x.add(j * xs + off);
                let xa: __m512bh = std::mem::transmute(_mm512_loadu_si512(xp as *const _));
                let xb: __m512bh = std::mem::transmute(_mm512_loadu_si512(xp.add(32) as *const _));
                *a = _mm512_dpbf16_ps(*a, wa, xa);
                *a = _mm512_dpbf16_ps(*a, wb, xb);
            }
        }
    }
    for (i, ai) in acc.iter().enumerate() {
        for (j, a) in ai.iter().enumerate() {
            *out.add(i * on + j) = hsum16(*a);
        }
    }
}

/// `m` fp8 rows `w + i * cols` (bytes) into the bf16 panel `out`: [m, cols] in [`FP8_ORDER`];
/// prefetches `pf_rows` rows from `pf`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn convert_fp8_rows(
    w: *const u8,
    cols: usize,
    m: usize,
    out: *mut u16,
    pf: *const u8,
    pf_rows: usize,
) {
    let l2 = prefetch_to_l2();
    let t = fp8_tables();
    for i in 0..m {
        for g in 0..cols / FP8_GROUP {
            let off = g * FP8_GROUP;
            if i < pf_rows {
                prefetch_line(pf.wrapping_add(i * cols + off) as *const i8, l2);
            }
            let (wa, wb) =
                fp8_group_to_bf16(_mm512_loadu_si512(w.add(i * cols + off) as *const _), &t);
            _mm512_storeu_si512(out.add(i * cols + off) as *mut _, wa);
            _mm512_storeu_si512(out.add(i * cols + off + 32) as *mut _, wb);
        }
    }
}

/// x: [n, cols] times the block scales of one scale block row (`srow[k / block_cols]` for
/// column k), rounded to bf16 and permuted like [`pack_bf16_fp8`], into `out`: [n, cols];
/// `tmp` holds the scaled f32 copy.
///
/// # Safety
/// Only where the CPU has AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_scaled_fp8(
    x: &[f32],
    cols: usize,
    srow: &[f32],
    block_cols: usize,
    tmp: &mut Vec<f32>,
    out: &mut [u16],
) {
    tmp.clear();
    for xt in x.chunks_exact(cols) {
        for (cb, xc) in xt.chunks(block_cols).enumerate() {
            let sc = srow[cb];
            tmp.extend(xc.iter().map(|v| v * sc));
        }
    }
    pack_bf16_fp8(tmp, out);
}

impl Job<'_> {
    /// fp8 rows [wr0, wr0 + out.len() / n) for all tokens into out: [block rows, n], run by
    /// scale block rows (each packs its scaled activations into `s`).
    ///
    /// # Safety
    /// Only with `applies_fp8(..)` true (AVX-512, AVX512-BF16 and AVX512-VBMI present).
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vbmi,avx2,fma")]
    pub(super) unsafe fn row_block_bf16dot_fp8(
        &self,
        wr0: usize,
        out: &mut [f32],
        s: &mut super::Scratch,
    ) {
        let WRef::Fp8 {
            data,
            scale_inv,
            block_rows,
            block_cols,
        } = self.w
        else {
            unreachable!("the fp8 bf16-dot path takes fp8 weights")
        };
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        let ng = cols / FP8_GROUP;
        let ncb = cols.div_ceil(block_cols);
        let o = out.as_mut_ptr();
        let left = |i: usize| self.rows_total.saturating_sub(wr0 + i);
        let mut a = 0;
        while a < nrows {
            // rows [a, b) share one scale block row
            let sr = (wr0 + a) / block_rows;
            let b = nrows.min((sr + 1) * block_rows - wr0);
            let xb = s.acc.reuse_u16(n * cols);
            pack_scaled_fp8(
                self.x,
                cols,
                &scale_inv[sr * ncb..][..ncb],
                block_cols,
                &mut s.deq,
                xb,
            );
            let x = xb.as_ptr();
            if n <= FP8_REGISTER_TOKENS {
                // a few tokens: each group converted in registers, all tokens per row tile
                let mut i0 = a;
                while i0 < b {
                    let m = if n == 1 && b - i0 >= MR1_FP8 {
                        MR1_FP8
                    } else if n > 1 && b - i0 >= MR {
                        MR
                    } else {
                        1
                    };
                    let pf_rows = left(i0 + m).min(m);
                    let w = data.as_ptr().add((wr0 + i0) * cols);
                    let (pf, op) = (w.add(m * cols), o.add(i0 * n));
                    macro_rules! go {
                        ($($r:literal, $t:literal);*) => {
                            match (m, n) {
                                $(($r, $t) => tile_fp8::<$r, $t>(w, cols, x, cols, ng, op, n, pf, pf_rows),)*
                                _ => unreachable!("fp8 register tile {m}x{n}"),
                            }
                        };
                    }
                    go!(8, 1; 1, 1; 4, 2; 4, 3; 4, 4; 1, 2; 1, 3; 1, 4);
                    i0 += m;
                }
                a = b;
                continue;
            }
            let panel = s.panel.reuse_u16(MR * cols).as_mut_ptr();
            for tb0 in (0..n).step_by(TOKEN_BLOCK) {
                let tb1 = (tb0 + TOKEN_BLOCK).min(n);
                let mut i0 = a;
                while i0 < b {
                    let m = if b - i0 >= MR { MR } else { 1 };
                    let w = data.as_ptr().add((wr0 + i0) * cols);
                    // the first token block streams the next rows in while converting
                    let pf_rows = if tb0 == 0 { left(i0 + m).min(m) } else { 0 };
                    convert_fp8_rows(w, cols, m, panel, w.add(m * cols), pf_rows);
                    let none = std::ptr::null();
                    token_tiles(
                        panel,
                        m,
                        cols,
                        x,
                        (tb0, tb1),
                        o.add(i0 * n),
                        (n, 1),
                        none,
                        0,
                    );
                    i0 += m;
                }
            }
            a = b;
        }
    }

    /// Rows [wr0, wr0 + out.len() / n) for all tokens into out: [block rows, n].
    ///
    /// # Safety
    /// Only after `IsaLevel::Avx512Bf16.supported()`, with `applies(..)` true and `self.bpack`
    /// the [`pack_bf16`] of `self.x`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
    pub(super) unsafe fn row_block_bf16dot(&self, wr0: usize, out: &mut [f32]) {
        let nrows = out.len() / self.n;
        self.row_block_bf16dot_at(wr0, nrows, out.as_mut_ptr(), (self.n, 1));
    }

    /// Rows [wr0, wr0 + nrows) for all tokens, element (row i of the block, token t) written
    /// at `o[i * rs + t * ts]`: (n, 1) is a [block rows, n] buffer, (1, rows) the token-major
    /// y of the whole product (`Job::run_token_major`, which then needs no transposition).
    ///
    /// # Safety
    /// As [`Self::row_block_bf16dot`]; every written element must be inside the allocation
    /// behind `o` and written by no other thread meanwhile.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")]
    pub(super) unsafe fn row_block_bf16dot_at(
        &self,
        wr0: usize,
        nrows: usize,
        o: *mut f32,
        (rs, ts): (usize, usize),
    ) {
        let WRef::Bf16(d) = self.w else {
            unreachable!("the bf16-dot path takes bf16 weights")
        };
        let (n, cols) = (self.n, self.cols);
        debug_assert_eq!(self.bpack.len(), cols * n);
        let nk = cols / K_CHUNK;
        let x = self.bpack.as_ptr();
        let w0 = d.as_ptr().add(wr0 * cols);
        // rows of this matrix after row i0 + m of the block (prefetch stays inside the matrix)
        let left = |i: usize| self.rows_total.saturating_sub(wr0 + i);
        if n == 1 {
            if self.resident {
                // weights in the caches: MR1_RESIDENT independent dot chains per tile, no
                // software prefetch (the lines come from the L2 / L3, not DRAM)
                let mut i0 = 0;
                while i0 < nrows {
                    let (w, op) = (w0.add(i0 * cols), o.add(i0 * rs));
                    if nrows - i0 >= MR1_RESIDENT {
                        tile::<MR1_RESIDENT, 1>(w, cols, x, cols, nk, op, (rs, ts), w, 0);
                        i0 += MR1_RESIDENT;
                    } else {
                        tile::<1, 1>(w, cols, x, cols, nk, op, (rs, ts), w, 0);
                        i0 += 1;
                    }
                }
                return;
            }
            // one row at a time ([`MR1`]); the next row (contiguous) prefetched beside it
            for i0 in 0..nrows {
                let pf_rows = left(i0 + 1).min(1);
                let w = w0.add(i0 * cols);
                tile::<MR1, 1>(
                    w,
                    cols,
                    x,
                    cols,
                    nk,
                    o.add(i0 * rs),
                    (rs, ts),
                    w.add(cols),
                    pf_rows,
                );
            }
            return;
        }
        if single_pass(n, cols) {
            let mut i0 = 0;
            while i0 < nrows {
                let m = if nrows - i0 >= mr_sp(n) { mr_sp(n) } else { 1 };
                // the rows SP_PF_TILES tiles on (the prefetch stays inside the matrix)
                let pf_rows = left(i0 + SP_PF_TILES * m).min(m);
                let (w, op) = (w0.add(i0 * cols), o.add(i0 * rs));
                let pf = w.wrapping_add(SP_PF_TILES * m * cols);
                macro_rules! go {
                    ($($r:literal, $t:literal);*) => {
                        match (m, n) {
                            $(($r, $t) => tile::<$r, $t>(w, cols, x, cols, nk, op, (rs, ts), pf, pf_rows),)*
                            _ => unreachable!("bf16-dot single-pass tile {m}x{n}"),
                        }
                    };
                }
                go!(3, 7; 2, 8; 2, 9; 1, 7; 1, 8; 1, 9);
                i0 += m;
            }
            return;
        }
        if single_pass_spans(n, cols, tile_prefetch_to_l2()) {
            span_tiles(w0, x, (n, cols), nrows, left, o, (rs, ts));
            return;
        }
        for tb0 in (0..n).step_by(TOKEN_BLOCK) {
            let tb1 = (tb0 + TOKEN_BLOCK).min(n);
            let mut i0 = 0;
            // cache-resident weights (a draft model's catch-up) take 4 x n tiles whatever the
            // row: no DRAM stream to keep single, and four times the independent chains
            let mr = if one_row_tiles(n, cols) && !self.resident {
                1
            } else {
                MR
            };
            while i0 < nrows {
                let m = if nrows - i0 >= mr { mr } else { 1 };
                let w = w0.add(i0 * cols);
                // the first token tile of the first block streams the next rows in
                let pf_rows = if tb0 == 0 { left(i0 + m).min(m) } else { 0 };
                let op = o.add(i0 * rs);
                token_tiles(
                    w,
                    m,
                    cols,
                    x,
                    (tb0, tb1),
                    op,
                    (rs, ts),
                    w.add(m * cols),
                    pf_rows,
                );
                i0 += m;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::IsaLevel;

    /// Every finite e4m3fn magnitude's bf16 bits give its exact value (from the format
    /// definition: 4 exponent bits, bias 7, subnormals at exponent 0), 0x7f is a NaN; the
    /// unpack order is a permutation of the 64 columns.
    #[test]
    fn fp8_bf16_table_is_exact() {
        for m in 0u8..128 {
            let v = f32::from_bits((super::e4m3_magnitude_bf16(m) as u32) << 16);
            if m == 0x7f {
                assert!(v.is_nan());
                continue;
            }
            let (e, f) = ((m >> 3) as i32, (m & 7) as f64);
            let want = if e == 0 {
                f / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + f / 8.0) * 2f64.powi(e - 7)
            };
            assert_eq!(v as f64, want, "magnitude {m:#x}");
            let t = &super::FP8_BF16_TABLES;
            assert_eq!(
                ((t[0][m as usize] as u16) << 8) | t[1][m as usize] as u16,
                super::e4m3_magnitude_bf16(m)
            );
        }
        let mut seen = [false; 64];
        for c in super::FP8_ORDER {
            assert!(!seen[c as usize]);
            seen[c as usize] = true;
        }
    }

    /// The vector pack rounds like `half::bf16::from_f32` (nearest even) for every normal
    /// value, ties included, at every tail length.
    #[test]
    fn pack_rounds_to_nearest_even_at_every_length() {
        if !IsaLevel::Avx512Bf16.supported() {
            eprintln!("no AVX512-BF16 here: nothing to check");
            return;
        }
        let mut s: u64 = 0x2545_f491_4f6c_dd1d;
        let mut vals: Vec<f32> = (0..200)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                f32::from_bits(((s >> 32) as u32 & 0x807f_ffff) | 0x3c00_0000)
            })
            .collect();
        // exact ties: low halves 0x8000 with even and odd kept bits
        vals.extend([
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            -1.0,
            0.0,
            65504.0,
        ]);
        for len in [1, 15, 16, 17, 31, 33, vals.len()] {
            let x = &vals[..len];
            let mut got = vec![0u16; len];
            // SAFETY: AVX512-BF16 checked above.
            unsafe { super::pack_bf16(x, &mut got) };
            let want: Vec<u16> = x
                .iter()
                .map(|v| half::bf16::from_f32(*v).to_bits())
                .collect();
            assert_eq!(got, want, "len {len}");
        }
    }
}

//! AVX-512 register kernels: the multi-token inner loops of `gemm.rs` on CPUs that have them.
//!
//! Same order as `lanes.rs` / `simd.rs`, bit for bit: an output element still owns one 8-lane
//! accumulator that receives `fma(w[8c + l], x[8c + l], acc[l])` for its chunks c in increasing
//! order. What changes is the packing: one 512-bit register holds the accumulators of TWO
//! tokens of the same weight row (lanes 0-7: token 2p, lanes 8-15: token 2p + 1). The 8 weights
//! of a chunk are loaded once into both halves, and the activations are pre-packed in pairs
//! ([`pack_pairs`]: `[pair][chunk][16]`), so one FMA does the work of two AVX2 FMAs and the
//! element sequence is unchanged. Horizontal sums use `simd::hsum8` on each half.
//!
//! All functions are `unsafe` and must only run after `IsaLevel::Avx512.supported()`.

use std::arch::x86_64::*;

use super::aligned::AlignedBuf;
use super::prefetch::{prefetch_line, prefetch_to_l2};
use super::simd::hsum8;

/// A weight element type that can be loaded 8 at a time into both 256-bit halves of a zmm.
pub(crate) trait WLoad2: Copy {
    /// Load 8 consecutive weights at `p` (unaligned) as f32, duplicated: lanes l and 8 + l.
    unsafe fn load8x2(p: *const Self) -> __m512;
}

impl WLoad2 for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load8x2(p: *const f32) -> __m512 {
        _mm512_broadcast_f32x8(_mm256_loadu_ps(p))
    }
}

impl WLoad2 for u16 {
    /// bf16: the 8 halves broadcast into both 128-bit lanes, zero-extended, shifted up (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load8x2(p: *const u16) -> __m512 {
        let h = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

impl WLoad2 for half::f16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load8x2(p: *const half::f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(
            p as *const __m128i,
        )))
    }
}

impl WLoad2 for u8 {
    /// e4m3 -> f32 times 2^-8 through the f16 bit trick of `lanes::fp8_unscaled` (as `simd.rs`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load8x2(p: *const u8) -> __m512 {
        let b = _mm_set1_epi64x(std::ptr::read_unaligned(p as *const i64)); // [b0..b7, b0..b7]
        let hi = _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(b));
        let h = _mm256_and_si256(
            _mm256_srai_epi16::<1>(hi),
            _mm256_set1_epi16(0xBFFFu16 as i16),
        );
        _mm512_cvtph_ps(h)
    }
}

/// Floats between consecutive packed pairs: `nch` chunks of 16, plus one spare chunk so pairs
/// do not sit a multiple of 4 KiB apart (a GEMM tile reads several pairs at once; 4 KiB-aligned
/// streams would all land in the same L1 sets).
pub(crate) fn pair_stride(nch: usize) -> usize {
    nch * 16 + 16
}

/// Pack `ntok` token rows of `x` (row stride `xs`, first `nch` 8-column chunks) in pairs:
/// `out[p * pair_stride(nch) + c * 16 + h * 8 + l] = x[(2p + h) * xs + 8c + l]`; an odd last
/// token is paired with zeros.
pub(crate) fn pack_pairs(x: &[f32], xs: usize, ntok: usize, nch: usize, buf: &mut AlignedBuf) {
    let np = ntok.div_ceil(2);
    let ps = pair_stride(nch);
    let out = buf.zeroed(np * ps); // [pairs, pair_stride]
    for t in 0..ntok {
        let (p, h) = (t / 2, t % 2);
        let row = &x[t * xs..t * xs + nch * 8];
        for c in 0..nch {
            let d = p * ps + c * 16 + h * 8;
            out[d..d + 8].copy_from_slice(&row[c * 8..c * 8 + 8]);
        }
    }
}

/// Register tile: MR weight rows x NP token pairs over `nchunks` chunks, accumulating into
/// `acc[i][p]`. Row i of the weights starts at `w + i * ws`; pair p's packed chunks at
/// `xp + p * xps` (16 floats per chunk).
///
/// With `PF` (weights streamed from memory: the direct paths) it also prefetches the next MR
/// rows, as `simd::tile` does.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn tile2<T: WLoad2, const MR: usize, const NP: usize, const PF: bool>(
    w: *const T,
    ws: usize,
    xp: *const f32,
    xps: usize,
    nchunks: usize,
    acc: &mut [[__m512; NP]; MR],
) {
    let mut a = *acc;
    let line_chunks = (64 / (8 * std::mem::size_of::<T>())).max(1);
    let l2 = PF && prefetch_to_l2();
    for c in 0..nchunks {
        if PF && c % line_chunks == 0 {
            for i in 0..MR {
                prefetch_line(w.wrapping_add((MR + i) * ws + c * 8) as *const i8, l2);
            }
        }
        let mut xv = [_mm512_setzero_ps(); NP];
        for (p, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(xp.add(p * xps + c * 16));
        }
        for (i, ai) in a.iter_mut().enumerate() {
            let wv = T::load8x2(w.add(i * ws + c * 8));
            for p in 0..NP {
                ai[p] = _mm512_fmadd_ps(wv, xv[p], ai[p]);
            }
        }
    }
    *acc = a;
}

/// Store the two lane-summed halves of `v` (tokens 2p, 2p + 1) to `o[0]` and `o[1]`; the second
/// only when `both`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn store_pair(v: __m512, o: *mut f32, both: bool) {
    *o = hsum8(_mm512_castps512_ps256(v));
    if both {
        *o.add(1) = hsum8(_mm512_extractf32x8_ps::<1>(v));
    }
}

/// Direct tile (weights decoded on the fly, accumulators in registers over all `nchunks`): MR
/// rows x NP pairs holding `nt` (<= 2 NP) valid tokens. Writes each element's lane-summed value
/// to `out[i * on + t]`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct2<T: WLoad2, const MR: usize, const NP: usize>(
    w: *const T,
    ws: usize,
    xp: *const f32,
    xps: usize,
    nchunks: usize,
    out: *mut f32,
    on: usize,
    nt: usize,
) {
    let mut a = [[_mm512_setzero_ps(); NP]; MR];
    tile2::<T, MR, NP, true>(w, ws, xp, xps, nchunks, &mut a);
    for (i, ai) in a.iter().enumerate() {
        for (p, v) in ai.iter().enumerate() {
            store_pair(*v, out.add(i * on + 2 * p), 2 * p + 1 < nt);
        }
    }
}

/// [`direct2`] over fp8 weights with `block_chunks` chunks per column block: per block a fresh
/// register tile folded in as `total = fma(scale, blk, total)` with row i's scale
/// `scales[i * ss + b]` (already times 2^8), exactly as `simd::direct_fp8`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct2_fp8<const MR: usize, const NP: usize>(
    w: *const u8,
    ws: usize,
    xp: *const f32,
    xps: usize,
    nchunks: usize,
    block_chunks: usize,
    scales: *const f32,
    ss: usize,
    out: *mut f32,
    on: usize,
    nt: usize,
) {
    let mut total = [[_mm512_setzero_ps(); NP]; MR];
    let mut c0 = 0;
    let mut b = 0;
    while c0 < nchunks {
        let c1 = (c0 + block_chunks).min(nchunks);
        let mut blk = [[_mm512_setzero_ps(); NP]; MR];
        tile2::<u8, MR, NP, true>(w.add(c0 * 8), ws, xp.add(c0 * 16), xps, c1 - c0, &mut blk);
        for i in 0..MR {
            let s = _mm512_set1_ps(*scales.add(i * ss + b));
            for p in 0..NP {
                total[i][p] = _mm512_fmadd_ps(s, blk[i][p], total[i][p]);
            }
        }
        c0 = c1;
        b += 1;
    }
    for (i, ti) in total.iter().enumerate() {
        for (p, v) in ti.iter().enumerate() {
            store_pair(*v, out.add(i * on + 2 * p), 2 * p + 1 < nt);
        }
    }
}

/// Memory-resident accumulator tile over a decoded f32 panel: load `acc[i][p]` from
/// `mem + (i * ne + 2p) * 8` (16 floats: both tokens), run [`tile2`], store back. With `scales`
/// (fp8) the tile starts from zero and is folded in as `mem = fma(scales[i], tile, mem)`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile2_mem<const MR: usize, const NP: usize>(
    w: *const f32,
    ws: usize,
    xp: *const f32,
    xps: usize,
    nchunks: usize,
    mem: *mut f32,
    ne: usize,
    scales: Option<&[f32]>,
) {
    let mut a = [[_mm512_setzero_ps(); NP]; MR];
    if scales.is_none() {
        for (i, ai) in a.iter_mut().enumerate() {
            for (p, v) in ai.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(mem.add((i * ne + 2 * p) * 8));
            }
        }
    }
    tile2::<f32, MR, NP, false>(w, ws, xp, xps, nchunks, &mut a);
    for (i, ai) in a.iter().enumerate() {
        for (p, v) in ai.iter().enumerate() {
            let q = mem.add((i * ne + 2 * p) * 8);
            let out = match scales {
                None => *v,
                Some(s) => _mm512_fmadd_ps(_mm512_set1_ps(s[i]), *v, _mm512_loadu_ps(q)),
            };
            _mm512_storeu_ps(q, out);
        }
    }
}

/// One-token fp8 GEMV tile of 4 rows with AVX512-VBMI: each zmm accumulator holds two rows'
/// 8-lane accumulators ([row i | row i + 1]); 32 weight bytes (2 rows x 2 chunks) become 32 f16
/// words with ONE masked `vpermb`, then the f16 bit trick of `lanes::fp8_unscaled` and two
/// 16-lane converts — half the shuffle work per byte of `simd::direct_fp8`. Every row keeps
/// that function's sequence exactly (per column block a fresh accumulator over its chunks in
/// order, folded as total = fma(scale, blk, total); `hsum8` at the end), so the bits are the
/// same. Also prefetches the next 4 rows. Writes the 4 lane sums to `out[0..4]`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemv_fp8_vbmi4(
    w: *const u8,
    ws: usize,
    x: *const f32,
    nchunks: usize,
    block_chunks: usize,
    scales: *const f32,
    ss: usize,
    out: *mut f32,
) {
    // Byte 2w + 1 (the high byte of word w) takes source byte: words 0-7 row i chunk c (bytes
    // 0-7), 8-15 row i + 1 chunk c (16-23), 16-23 row i chunk c + 1 (8-15), 24-31 row i + 1
    // chunk c + 1 (24-31); the low bytes are zeroed by the mask.
    let mut idx = [0u8; 64];
    for wd in 0..32 {
        let src = match wd / 8 {
            0 => wd,
            1 => 16 + wd - 8,
            2 => 8 + wd - 16,
            _ => 24 + wd - 24,
        };
        idx[2 * wd + 1] = src as u8;
    }
    let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
    let hi_bytes: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
    let l2 = prefetch_to_l2();
    let clear14 = _mm512_set1_epi16(0xBFFFu16 as i16);
    let rows = [w, w.add(ws), w.add(2 * ws), w.add(3 * ws)];
    let mut total = [_mm512_setzero_ps(); 2];
    let mut c0 = 0;
    let mut b = 0;
    while c0 < nchunks {
        let c1 = (c0 + block_chunks).min(nchunks);
        let mut blk = [_mm512_setzero_ps(); 2];
        let mut c = c0;
        while c + 2 <= c1 {
            if c % 8 == 0 {
                for r in 0..4 {
                    prefetch_line(w.wrapping_add((4 + r) * ws + c * 8) as *const i8, l2);
                }
            }
            let xa = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.add(c * 8)));
            let xb = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.add(c * 8 + 8)));
            for (p, bp) in blk.iter_mut().enumerate() {
                let lo = _mm_loadu_si128(rows[2 * p].add(c * 8) as *const __m128i);
                let hi = _mm_loadu_si128(rows[2 * p + 1].add(c * 8) as *const __m128i);
                let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
                let words = _mm512_maskz_permutexvar_epi8(hi_bytes, idx, _mm512_castsi256_si512(v));
                let f16 = _mm512_and_si512(_mm512_srai_epi16::<1>(words), clear14);
                let a = _mm512_cvtph_ps(_mm512_castsi512_si256(f16));
                let bb = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(f16));
                *bp = _mm512_fmadd_ps(a, xa, *bp);
                *bp = _mm512_fmadd_ps(bb, xb, *bp);
            }
            c += 2;
        }
        if c < c1 {
            // an odd chunk at the end of the block: the 8-lane decode per row
            let xa = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.add(c * 8)));
            for (p, bp) in blk.iter_mut().enumerate() {
                let a0 = <u8 as super::simd::WLoad>::load8(rows[2 * p].add(c * 8));
                let a1 = <u8 as super::simd::WLoad>::load8(rows[2 * p + 1].add(c * 8));
                let a = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(a0), a1);
                *bp = _mm512_fmadd_ps(a, xa, *bp);
            }
        }
        for (p, tp) in total.iter_mut().enumerate() {
            let s0 = _mm256_set1_ps(*scales.add(2 * p * ss + b));
            let s1 = _mm256_set1_ps(*scales.add((2 * p + 1) * ss + b));
            let sv = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(s0), s1);
            *tp = _mm512_fmadd_ps(sv, blk[p], *tp);
        }
        c0 = c1;
        b += 1;
    }
    for (p, tp) in total.iter().enumerate() {
        *out.add(2 * p) = hsum8(_mm512_castps512_ps256(*tp));
        *out.add(2 * p + 1) = hsum8(_mm512_extractf32x8_ps::<1>(*tp));
    }
}

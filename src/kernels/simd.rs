//! AVX2 + FMA + F16C register kernels: the inner loops of `gemm.rs`.
//!
//! Every function here performs exactly the operations that `lanes.rs` defines (one 8-lane
//! accumulator per output element, FMA per 8-column chunk in increasing order); tiles only change
//! *which* elements are computed together, never the per-element sequence. All functions are
//! `unsafe` and must only run after [`super::Isa::detect`] found avx2, fma and f16c.

use std::arch::x86_64::*;

use super::prefetch::{prefetch_line, prefetch_to_l2};

/// A weight element type the kernels can load 8 of as 8 f32 lanes.
pub(crate) trait WLoad: Copy {
    /// Load 8 consecutive weights at `p` (unaligned) as f32 lanes.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl WLoad for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

/// `vpshufb` control of the bf16 decode: the 16 bytes of 8 bf16 values, broadcast to both
/// 128-bit halves, become 8 f32 lanes with each value in the high half of its lane (low half
/// zero): lanes 0-3 from the low half's bytes 0-7, lanes 4-7 from the high half's bytes 8-15.
#[repr(align(32))]
struct ShufCtl([i8; 32]);
static BF16_TO_F32: ShufCtl = ShufCtl([
    -1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, //
    -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15,
]);

impl WLoad for u16 {
    /// bf16 -> f32 (exact): a 128-bit broadcast load and one in-lane `vpshufb` that moves each
    /// value into the high half of its lane — one vector op per 8 weights where `vpmovzxwd` +
    /// `vpslld` are two (on Zen 3 both share ports with the FMAs; docs/BENCHMARKS.md "Aligned
    /// activations and a one-op bf16 decode"). The shuffle is inline assembly so that its
    /// control stays a memory operand: as an intrinsic LLVM hoists the constant into a
    /// register, a 17th one in the 4 x 3 tile, and spills accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u16) -> __m256 {
        let mut v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        // SAFETY: reads the 32-byte control only; AVX2 is enabled for this function.
        std::arch::asm!(
            "vpshufb {v}, {v}, ymmword ptr [{c}]",
            v = inout(ymm_reg) v,
            c = in(reg) BF16_TO_F32.0.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
        _mm256_castsi256_ps(v)
    }
}

impl WLoad for half::f16 {
    /// f16 -> f32 with F16C (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

impl WLoad for u8 {
    /// e4m3 -> f32 times 2^-8 (see `lanes::fp8_unscaled`): byte into the high half of a u16,
    /// arithmetic shift right by one, clear bit 14, convert as f16.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        let b = _mm_loadl_epi64(p as *const __m128i);
        let hi = _mm_unpacklo_epi8(_mm_setzero_si128(), b);
        let h = _mm_and_si128(_mm_srai_epi16::<1>(hi), _mm_set1_epi16(0xBFFFu16 as i16));
        _mm256_cvtph_ps(h)
    }
}

/// The fixed horizontal-sum tree of `lanes::hsum8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum8(a: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2)))
}

/// Register tile: MR weight rows x NR token rows, `nchunks` 8-column chunks, accumulating into
/// `acc[i][j]` (row i, token j); the operand with fewer registers' worth is the one held (the
/// MR decoded rows where MR < NR, else the NR token chunks), so 16 ymm registers hold 4 x 3 and
/// 3 x 4 without spilling. Row i of the weights starts at `w + i * ws`, token j at
/// `x + j * xs`. With `PF` (weights streamed from memory: the direct paths) it also prefetches
/// the NEXT MR rows at the same column offsets, one line per row per 64 bytes, as
/// [`gemv_prefetch`] does; prefetches never change results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<T: WLoad, const MR: usize, const NR: usize, const PF: bool>(
    w: *const T,
    ws: usize,
    x: *const f32,
    xs: usize,
    nchunks: usize,
    acc: &mut [[__m256; NR]; MR],
) {
    let mut a = *acc;
    let line_chunks = (64 / (8 * std::mem::size_of::<T>())).max(1);
    let l2 = PF && prefetch_to_l2();
    for c in 0..nchunks {
        let off = c * 8;
        if PF && c % line_chunks == 0 {
            for i in 0..MR {
                prefetch_line(w.wrapping_add((MR + i) * ws + off) as *const i8, l2);
            }
        }
        if MR < NR {
            // More tokens than rows (3 x 4): the decoded rows stay in registers and each
            // token's chunk is loaded once and used at once by every row (MR x NR + MR + 1
            // registers); else the tokens' chunks stay and each row is decoded once.
            let mut wv = [_mm256_setzero_ps(); MR];
            for (i, v) in wv.iter_mut().enumerate() {
                *v = T::load8(w.add(i * ws + off));
            }
            for j in 0..NR {
                let xv = _mm256_loadu_ps(x.add(j * xs + off));
                for (ai, wi) in a.iter_mut().zip(&wv) {
                    ai[j] = _mm256_fmadd_ps(*wi, xv, ai[j]);
                }
            }
            continue;
        }
        let mut xv = [_mm256_setzero_ps(); NR];
        for (j, v) in xv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.add(j * xs + off));
        }
        for (i, ai) in a.iter_mut().enumerate() {
            let wv = T::load8(w.add(i * ws + off));
            for j in 0..NR {
                ai[j] = _mm256_fmadd_ps(wv, xv[j], ai[j]);
            }
        }
    }
    *acc = a;
}

/// Memory-resident accumulator tile: load `acc[i][j]` from `mem + (i * n + j) * 8`, run [`tile`],
/// store back. If `scales` is given (fp8), the tile instead starts from zero and the result is
/// folded in as `mem = fma(scales[i], tile, mem)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_mem<const MR: usize, const NR: usize>(
    w: *const f32,
    ws: usize,
    x: *const f32,
    xs: usize,
    nchunks: usize,
    mem: *mut f32,
    n: usize,
    scales: Option<&[f32]>,
) {
    let mut a = [[_mm256_setzero_ps(); NR]; MR];
    if scales.is_none() {
        for (i, ai) in a.iter_mut().enumerate() {
            for (j, v) in ai.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(mem.add((i * n + j) * 8));
            }
        }
    }
    tile::<f32, MR, NR, false>(w, ws, x, xs, nchunks, &mut a);
    for (i, ai) in a.iter().enumerate() {
        for (j, v) in ai.iter().enumerate() {
            let p = mem.add((i * n + j) * 8);
            let out = match scales {
                None => *v,
                Some(s) => _mm256_fmadd_ps(_mm256_set1_ps(s[i]), *v, _mm256_loadu_ps(p)),
            };
            _mm256_storeu_ps(p, out);
        }
    }
}

/// Direct tile (weights decoded on the fly, accumulators kept in registers over all `nchunks`):
/// MR rows x NR tokens of f32 / bf16 weights. Writes each element's lane-summed (pre-tail) value
/// to `out[i * on + j]`. With `PF` it prefetches the next MR rows ([`tile`]): the first token
/// tile over these rows does, the later ones find those lines already requested.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct<T: WLoad, const MR: usize, const NR: usize, const PF: bool>(
    w: *const T,
    ws: usize,
    x: *const f32,
    xs: usize,
    nchunks: usize,
    out: *mut f32,
    on: usize,
) {
    let mut a = [[_mm256_setzero_ps(); NR]; MR];
    tile::<T, MR, NR, PF>(w, ws, x, xs, nchunks, &mut a);
    for (i, ai) in a.iter().enumerate() {
        for (j, v) in ai.iter().enumerate() {
            *out.add(i * on + j) = hsum8(*v);
        }
    }
}

/// One-token direct tile (GEMV) of MR rows, as [`direct`] with NR = 1, that also prefetches the
/// NEXT MR rows at the same column offset (one line per row per 64 bytes of weights), so the
/// next tile's streams are in cache when it starts: rows of a few KiB each would otherwise
/// restart the hardware prefetcher at every page. Prefetches never change results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemv_prefetch<T: WLoad, const MR: usize>(
    w: *const T,
    ws: usize,
    x: *const f32,
    nchunks: usize,
    out: *mut f32,
) {
    let line_chunks = (64 / (8 * std::mem::size_of::<T>())).max(1);
    let mut a = [_mm256_setzero_ps(); MR];
    let l2 = prefetch_to_l2();
    for c in 0..nchunks {
        let off = c * 8;
        if c % line_chunks == 0 {
            for i in 0..MR {
                prefetch_line(w.wrapping_add((MR + i) * ws + off) as *const i8, l2);
            }
        }
        let xv = _mm256_loadu_ps(x.add(off));
        for (i, ai) in a.iter_mut().enumerate() {
            *ai = _mm256_fmadd_ps(T::load8(w.add(i * ws + off)), xv, *ai);
        }
    }
    for (i, v) in a.iter().enumerate() {
        *out.add(i) = hsum8(*v);
    }
}

/// Direct tile over fp8 weights with `block_chunks` chunks per column block: per block a fresh
/// register tile, folded in as `total = fma(scale, blk, total)` with row i's scale
/// `scales[i * ss + b]` (already times 2^8). Output as in [`direct`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct_fp8<const MR: usize, const NR: usize>(
    w: *const u8,
    ws: usize,
    x: *const f32,
    xs: usize,
    nchunks: usize,
    block_chunks: usize,
    scales: *const f32,
    ss: usize,
    out: *mut f32,
    on: usize,
) {
    let mut total = [[_mm256_setzero_ps(); NR]; MR];
    let mut c0 = 0;
    let mut b = 0;
    while c0 < nchunks {
        let c1 = (c0 + block_chunks).min(nchunks);
        let mut blk = [[_mm256_setzero_ps(); NR]; MR];
        tile::<u8, MR, NR, true>(w.add(c0 * 8), ws, x.add(c0 * 8), xs, c1 - c0, &mut blk);
        for i in 0..MR {
            let s = _mm256_set1_ps(*scales.add(i * ss + b));
            for j in 0..NR {
                total[i][j] = _mm256_fmadd_ps(s, blk[i][j], total[i][j]);
            }
        }
        c0 = c1;
        b += 1;
    }
    for (i, ti) in total.iter().enumerate() {
        for (j, v) in ti.iter().enumerate() {
            *out.add(i * on + j) = hsum8(*v);
        }
    }
}

/// Convert `rows` x `nchunks * 8` weights (row stride `ws`) into a dense f32 panel (row stride
/// `nchunks * 8`), using the same per-type decode as the kernels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn to_panel<T: WLoad>(
    w: *const T,
    ws: usize,
    rows: usize,
    nchunks: usize,
    panel: &mut [f32],
) {
    let kc = nchunks * 8;
    assert!(panel.len() >= rows * kc, "panel too small");
    let p = panel.as_mut_ptr();
    for r in 0..rows {
        for c in 0..nchunks {
            _mm256_storeu_ps(p.add(r * kc + c * 8), T::load8(w.add(r * ws + c * 8)));
        }
    }
}

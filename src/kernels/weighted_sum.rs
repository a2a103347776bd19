//! Attention's value pass: `out[r] = sum_{t < lens[r]} p[r][t] * vals[t]` for many rows at
//! once (MHA heads' query blocks, all heads of an absorbed decode step).
//!
//! Guarantee: for every output element the operations are exactly those of
//! `o = 0; for t in 0..len { o = o + p[t] * v[t] }` (one rounding for the product, one for the
//! sum, t increasing) — the per-query `axpy` loop — on every ISA, so results are bitwise
//! independent of how rows and columns are blocked and of the ISA. The SIMD paths keep a block
//! of 4 rows x 4 vectors of columns in registers over the key loop, so each value row is read
//! once per row block instead of once per row, and visit the keys in tiles of 64 with every row
//! block inside a tile, so a tile's value rows are read from memory once and then from L1.

use super::{Isa, Rows};

/// A value type the kernels widen exactly to f32: f32, bf16 bits (u16), f16.
pub(crate) trait Val: Copy {
    fn f32(self) -> f32;
    /// 16 consecutive values at `p` as f32 lanes (AVX-512F).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// 8 consecutive values at `p` as f32 lanes (AVX2 + F16C).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Val for f32 {
    #[inline]
    fn f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl Val for u16 {
    /// bf16 bits: shifted into the high half of an f32 (exact).
    #[inline]
    fn f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

impl Val for half::f16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(p: *const half::f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const half::f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Rows per register block.
const RB: usize = 4;
/// Keys per tile of the blocked kernels.
const KEY_TILE: usize = 64;

/// See the module doc. `p`: [rows, ps]; row t of the values at `vals[t * vs..][..width]`;
/// `out`: [rows, width] (overwritten).
pub fn weighted_sum_rows(
    p: &[f32],
    ps: usize,
    lens: &[usize],
    vals: &[f32],
    vs: usize,
    width: usize,
    out: &mut [f32],
) {
    weighted_sum_rows_with(Isa::current(), p, ps, lens, vals, vs, width, out, false)
}

/// As [`weighted_sum_rows`], but adding onto `out` instead of overwriting it, over values in
/// their storage precision (a KV cache span read in place gives the bits of the same call over
/// its f32 copy). A sum over keys split into consecutive ranges (attention streaming the cache
/// span by span) gets exactly the operations of one call over all the keys, when the ranges are
/// visited in increasing order (row r of the range starting at key k0 passes `p` from column k0
/// and `lens[r] - k0` keys, clamped to the range).
pub fn weighted_sum_rows_acc(
    p: &[f32],
    ps: usize,
    lens: &[usize],
    vals: Rows<'_>,
    vs: usize,
    width: usize,
    out: &mut [f32],
) {
    let isa = Isa::current();
    match vals {
        Rows::F32(v) => weighted_sum_rows_with(isa, p, ps, lens, v, vs, width, out, true),
        Rows::Bf16(v) => weighted_sum_rows_with(isa, p, ps, lens, v, vs, width, out, true),
        Rows::F16(v) => weighted_sum_rows_with(isa, p, ps, lens, v, vs, width, out, true),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum_rows_with<V: Val>(
    isa: Isa,
    p: &[f32],
    ps: usize,
    lens: &[usize],
    vals: &[V],
    vs: usize,
    width: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    let rows = lens.len();
    assert_eq!(
        out.len(),
        rows * width,
        "weighted_sum_rows: out is not [rows, width]"
    );
    for (r, &len) in lens.iter().enumerate() {
        assert!(
            len <= ps && r * ps + len <= p.len(),
            "weighted_sum_rows: row {r} past p"
        );
        if len > 0 {
            assert!(
                (len - 1) * vs + width <= vals.len(),
                "weighted_sum_rows: row {r} past vals"
            );
        }
    }
    if !accumulate {
        out.fill(0.0);
    }
    if width == 0 {
        return;
    }
    // Row blocks of RB rows: (first row, rows, keys every row of the block has).
    let blocks: Vec<(usize, usize, usize)> = (0..rows)
        .step_by(RB)
        .map(|r0| {
            let nr = RB.min(rows - r0);
            (r0, nr, lens[r0..r0 + nr].iter().copied().min().unwrap_or(0))
        })
        .collect();
    // A full block's common keys are summed by the register kernels, key tile by key tile with
    // every row block inside a tile (the tile's value rows stay in L1 while all row blocks sweep
    // them; accumulators round-trip through `out` exactly between tiles); then each row's own
    // remaining keys. Per element the keys are still visited in increasing order.
    let simd_block = |nr: usize, common: usize| isa.simd() && nr == RB && common > 0;
    #[cfg(target_arch = "x86_64")]
    {
        let reach = blocks
            .iter()
            .filter(|&&(_, nr, c)| simd_block(nr, c))
            .map(|b| b.2)
            .max()
            .unwrap_or(0);
        for t0 in (0..reach).step_by(KEY_TILE) {
            for &(r0, nr, common) in &blocks {
                if !simd_block(nr, common) || common <= t0 {
                    continue;
                }
                let t1 = (t0 + KEY_TILE).min(common);
                let ob = &mut out[r0 * width..(r0 + nr) * width];
                let pb = &p[r0 * ps..];
                // SAFETY: the ISA's features were detected (Isa invariant); bounds checked above.
                unsafe {
                    if isa.avx512() {
                        block_avx512(pb, ps, t0, t1, vals, vs, width, ob);
                    } else {
                        block_avx2(pb, ps, t0, t1, vals, vs, width, ob);
                    }
                }
            }
        }
    }
    for &(r0, nr, common) in &blocks {
        let from = if cfg!(target_arch = "x86_64") && simd_block(nr, common) {
            common
        } else {
            0
        };
        let ob = &mut out[r0 * width..(r0 + nr) * width];
        let pb = &p[r0 * ps..];
        for (i, o) in ob.chunks_exact_mut(width).enumerate() {
            for t in from..lens[r0 + i] {
                let a = pb[i * ps + t];
                for (oi, vi) in o.iter_mut().zip(&vals[t * vs..t * vs + width]) {
                    *oi += a * vi.f32();
                }
            }
        }
    }
}

/// RB rows, keys t0..t1 (accumulating onto `out`), all columns: up to 4 vectors of 16 columns per register block, then
/// the column tail one element at a time (same operations).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx512<V: Val>(
    p: &[f32],
    ps: usize,
    t0: usize,
    t1: usize,
    vals: &[V],
    vs: usize,
    width: usize,
    out: &mut [f32],
) {
    let (pp, vp, op) = (p.as_ptr(), vals.as_ptr(), out.as_mut_ptr());
    let mut c0 = 0;
    while c0 + 16 <= width {
        let nc = 4.min((width - c0) / 16);
        match nc {
            4 => cols_avx512::<V, 4>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
            3 => cols_avx512::<V, 3>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
            2 => cols_avx512::<V, 2>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
            _ => cols_avx512::<V, 1>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
        }
        c0 += 16 * nc;
    }
    tail_columns(p, ps, t0, t1, vals, vs, width, c0, out);
}

/// RB rows x NC vectors of 16 columns (at `v` / `o`), accumulators in registers over the keys.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn cols_avx512<V: Val, const NC: usize>(
    p: *const f32,
    ps: usize,
    t0: usize,
    t1: usize,
    v: *const V,
    vs: usize,
    o: *mut f32,
    os: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); NC]; RB];
    for (i, ai) in acc.iter_mut().enumerate() {
        for (j, aj) in ai.iter_mut().enumerate() {
            *aj = _mm512_loadu_ps(o.add(i * os + 16 * j));
        }
    }
    for t in t0..t1 {
        let mut vv = [_mm512_setzero_ps(); NC];
        for (j, x) in vv.iter_mut().enumerate() {
            *x = V::load16(v.add(t * vs + 16 * j));
        }
        for (i, ai) in acc.iter_mut().enumerate() {
            let a = _mm512_set1_ps(*p.add(i * ps + t));
            for j in 0..NC {
                ai[j] = _mm512_add_ps(ai[j], _mm512_mul_ps(a, vv[j]));
            }
        }
    }
    for (i, ai) in acc.iter().enumerate() {
        for (j, aj) in ai.iter().enumerate() {
            _mm512_storeu_ps(o.add(i * os + 16 * j), *aj);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx2<V: Val>(
    p: &[f32],
    ps: usize,
    t0: usize,
    t1: usize,
    vals: &[V],
    vs: usize,
    width: usize,
    out: &mut [f32],
) {
    let (pp, vp, op) = (p.as_ptr(), vals.as_ptr(), out.as_mut_ptr());
    let mut c0 = 0;
    while c0 + 8 <= width {
        let nc = 3.min((width - c0) / 8);
        match nc {
            3 => cols_avx2::<V, 3>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
            2 => cols_avx2::<V, 2>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
            _ => cols_avx2::<V, 1>(pp, ps, t0, t1, vp.add(c0), vs, op.add(c0), width),
        }
        c0 += 8 * nc;
    }
    tail_columns(p, ps, t0, t1, vals, vs, width, c0, out);
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn cols_avx2<V: Val, const NC: usize>(
    p: *const f32,
    ps: usize,
    t0: usize,
    t1: usize,
    v: *const V,
    vs: usize,
    o: *mut f32,
    os: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); NC]; RB];
    for (i, ai) in acc.iter_mut().enumerate() {
        for (j, aj) in ai.iter_mut().enumerate() {
            *aj = _mm256_loadu_ps(o.add(i * os + 8 * j));
        }
    }
    for t in t0..t1 {
        let mut vv = [_mm256_setzero_ps(); NC];
        for (j, x) in vv.iter_mut().enumerate() {
            *x = V::load8(v.add(t * vs + 8 * j));
        }
        for (i, ai) in acc.iter_mut().enumerate() {
            let a = _mm256_set1_ps(*p.add(i * ps + t));
            for j in 0..NC {
                ai[j] = _mm256_add_ps(ai[j], _mm256_mul_ps(a, vv[j]));
            }
        }
    }
    for (i, ai) in acc.iter().enumerate() {
        for (j, aj) in ai.iter().enumerate() {
            _mm256_storeu_ps(o.add(i * os + 8 * j), *aj);
        }
    }
}

/// Columns c0..width of the RB rows, keys t0..t1, element by element.
#[allow(clippy::too_many_arguments)]
fn tail_columns<V: Val>(
    p: &[f32],
    ps: usize,
    t0: usize,
    t1: usize,
    vals: &[V],
    vs: usize,
    width: usize,
    c0: usize,
    out: &mut [f32],
) {
    if c0 == width {
        return;
    }
    for i in 0..RB {
        for t in t0..t1 {
            let a = p[i * ps + t];
            for c in c0..width {
                out[i * width + c] += a * vals[t * vs + c].f32();
            }
        }
    }
}

//! exp(x) in f32 with the same bits on every ISA level, and SwiGLU's SiLU built on it.
//!
//! Sits under `vec_ops::silu_mul` (the MLPs' activation: tens of millions of exps per long
//! prompt, which libm's scalar `expf` spent ~6 % of a 2048-token prefill on). The function is
//! Cephes' `expf`: n = round-to-nearest-even(x log2 e), r = x - n ln 2 in two fused steps, a
//! degree-5 polynomial times r^2 plus r plus 1, scaled by 2^n through the exponent bits. Every
//! step is an IEEE operation with one rounding (fma included), so the scalar twin (portable
//! level, tails) and the AVX2 / AVX-512 lanes give the same bits for every input — the
//! contract the exact ISA levels keep. Accuracy: within 2 ulp of the exact exp on [-87, 88]
//! (unit test against f64); above 88 it returns +inf, below -87 zero (libm would still give
//! values up to 3.4e38 and subnormals there), NaN stays NaN.

/// Above this, +inf; below [`LO`], 0 (so 2^n always has a normal exponent).
const HI: f32 = 88.0;
const LO: f32 = -87.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts (the first exact in few bits, so n x LN2_HI is exact for |n| < 2^9).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes expf polynomial, highest degree first.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // Cephes 5.0000001201e-1, the nearest f32
];

/// exp(x) (see the module doc).
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let xc = x.clamp(LO, HI);
    let n = (xc * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, xc);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = P[0];
    for &c in &P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    let v = y * scale;
    if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        v
    }
}

/// SiLU(g) x u = g / (1 + exp(-g)) x u, in that order.
#[inline]
pub fn silu_mul_one(g: f32, u: f32) -> f32 {
    g / (1.0 + exp_f32(-g)) * u
}

/// `out[i] = silu_mul_one(gate[i], up[i])` on the widest lanes `isa` allows (same bits).
pub(crate) fn silu_mul_with(isa: super::Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            // SAFETY: Isa::avx512() is true only after AVX-512F/DQ/BW/VL were detected.
            done = unsafe { x86::silu_mul_avx512(gate, up, out) };
        } else if isa.simd() {
            // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
            done = unsafe { x86::silu_mul_avx2(gate, up, out) };
        }
    }
    let _ = isa;
    for ((o, g), u) in out[done..].iter_mut().zip(&gate[done..]).zip(&up[done..]) {
        *o = silu_mul_one(*g, *u);
    }
}

/// `x[i] = exp_f32(x[i] - m)` on the widest lanes `isa` allows (same bits): softmax's
/// numerator (attention scores: causal prefill over 2048 tokens is 33M of them per layer).
pub(crate) fn exp_shifted_with(isa: super::Isa, x: &mut [f32], m: f32) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            // SAFETY: Isa::avx512() is true only after AVX-512F/DQ/BW/VL were detected.
            done = unsafe { x86::exp_shifted_avx512(x, m) };
        } else if isa.simd() {
            // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
            done = unsafe { x86::exp_shifted_avx2(x, m) };
        }
    }
    let _ = isa;
    for v in &mut x[done..] {
        *v = exp_f32(*v - m);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{HI, LN2_HI, LN2_LO, LO, LOG2E, P};
    use std::arch::x86_64::*;

    /// The lanes of [`super::exp_f32`] (same operations, same order).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let v = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        let v = _mm256_blendv_ps(
            v,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HI)),
        );
        let v = _mm256_blendv_ps(
            v,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO)),
        );
        _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// The lanes of [`super::exp_f32`] (same operations, same order).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LO)), _mm512_set1_ps(HI));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        let v = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
        let v = _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(HI)),
            _mm512_set1_ps(f32::INFINITY),
        );
        let v = _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(LO)),
            _mm512_setzero_ps(),
        );
        _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x)
    }

    /// The 8-lane part of `exp_shifted_with`; returns how many elements it wrote.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted_avx2(x: &mut [f32], m: f32) -> usize {
        let n = x.len() / 8 * 8;
        let mv = _mm256_set1_ps(m);
        for i in (0..n).step_by(8) {
            let p = x.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), mv)));
        }
        n
    }

    /// The 16-lane part of `exp_shifted_with`; returns how many elements it wrote.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_avx512(x: &mut [f32], m: f32) -> usize {
        let n = x.len() / 16 * 16;
        let mv = _mm512_set1_ps(m);
        for i in (0..n).step_by(16) {
            let p = x.as_mut_ptr().add(i);
            _mm512_storeu_ps(p, exp16(_mm512_sub_ps(_mm512_loadu_ps(p), mv)));
        }
        n
    }

    /// The 8-lane part of `silu_mul_with`; returns how many elements it wrote.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let n = out.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..n).step_by(8) {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), s);
        }
        n
    }

    /// The 16-lane part of `silu_mul_with`; returns how many elements it wrote.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let n = out.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..n).step_by(16) {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let s = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
            _mm512_storeu_ps(out.as_mut_ptr().add(i), s);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, IsaLevel};

    /// Within 2 ulp of the exact exp over [-87, 88] (a dense sweep and every power of two
    /// step), the documented ends outside, NaN through.
    #[test]
    fn exp_is_within_two_ulp_and_ends_are_defined() {
        let mut worst = 0f64;
        let mut x = LO;
        while x <= HI {
            let got = exp_f32(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits();
            let ulp = (f32::from_bits(ulp + 1) - f32::from_bits(ulp)) as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(88.5), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(-90.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    /// Softmax numerators: every ISA level gives the scalar twin's bits, tails included.
    #[test]
    fn exp_shifted_lanes_match_the_scalar_twin_bitwise() {
        let x: Vec<f32> = (0..1027)
            .map(|i| ((i * 7919) % 2000) as f32 * -0.061 + 3.0)
            .collect();
        let m = 3.0;
        let want: Vec<u32> = x.iter().map(|v| exp_f32(v - m).to_bits()).collect();
        for level in IsaLevel::ALL {
            let Some(isa) = Isa::new(level) else { continue };
            let mut got = x.clone();
            exp_shifted_with(isa, &mut got, m);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{level:?}");
        }
    }

    /// Every ISA level this CPU has gives the scalar twin's bits, tails included.
    #[test]
    fn silu_mul_lanes_match_the_scalar_twin_bitwise() {
        let mut s = 0x1234_5678u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 240.0 // [-120, 120)
        };
        let mut gate: Vec<f32> = (0..4099).map(|_| next()).collect();
        let up: Vec<f32> = (0..4099).map(|_| next() / 60.0).collect();
        gate[7] = f32::NAN;
        gate[8] = f32::INFINITY;
        gate[9] = f32::NEG_INFINITY;
        gate[10] = 87.5;
        gate[11] = -88.5;
        gate[12] = 0.0;
        let want: Vec<u32> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| silu_mul_one(*g, *u).to_bits())
            .collect();
        for level in IsaLevel::ALL {
            let Some(isa) = Isa::new(level) else {
                continue; // not on this CPU
            };
            let mut out = vec![0f32; gate.len()];
            silu_mul_with(isa, &gate, &up, &mut out);
            for (i, (o, w)) in out.iter().zip(&want).enumerate() {
                assert_eq!(o.to_bits(), *w, "{level:?} element {i} (gate {})", gate[i]);
            }
        }
    }
}

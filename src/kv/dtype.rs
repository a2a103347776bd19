//! KV cache element types and the (de)quantisation of one latent slot.
//!
//! Where it sits: `model::forward` produces one latent slot per token per layer,
//! `[c_kv (kv_lora_rank, RMS-normalised) | k_pe (qk_rope_head_dim, roped)]` in f32; `KvCache::write_slot`
//! quantises it with the functions here, and `KvCache::read_range` dequantises runs of slots for
//! attention.
//!
//! Guarantees:
//! - Deterministic: the same f32 slot always encodes to the same stored bits (no data-dependent
//!   branching other than on the values themselves, no randomness).
//! - `f32`: exact. `bf16`: round-to-nearest-even (error <= half an ulp of bf16). `f16`: `half`'s
//!   round-to-nearest-even (error <= half an ulp of f16 in its normal range).
//! - `fp8` (e4m3fn, bias 7, max 448, no infinities): round-to-nearest-even, saturating at +-448.
//!   Values are grouped (c_kv in groups of up to [`FP8_GROUP`] values, k_pe separately in groups of
//!   up to [`FP8_GROUP`]); each group stores one f32 scale = amax / 448 (1 when amax is 0), and
//!   each value stores e4m3(x / scale). Decoding is `FP8_TABLE[byte] * scale`. Error bound: for
//!   every value, |x - decode| <= amax_group / 16 (3 mantissa bits give relative error <= 2^-4 in the
//!   normal range; sub-normal codes are at most 2^-10 * scale off, far below amax / 16).
//!
//! Fp8 slot byte layout (`slot_bytes = kv_lora_rank + rope_dim + 4 * n_scales`):
//! `[c_kv e4m3 (kv_lora_rank bytes) | k_pe e4m3 (rope_dim bytes) | scales f32 little-endian:
//!   ceil(kv_lora_rank / 128) c_kv group scales, then ceil(rope_dim / 128) k_pe group scales]`.
//! For DeepSeek-V3 (512 + 64) that is 512 + 64 + 4 * (4 + 1) = 596 bytes per token per layer.

use crate::error::{Error, Result};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Values per fp8 scale group (c_kv and k_pe are grouped separately).
pub const FP8_GROUP: usize = 128;
/// Largest finite e4m3fn magnitude.
pub const FP8_MAX: f32 = 448.0;

/// Element type the latent cache stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    Bf16,
    F16,
    /// e4m3fn with per-group f32 scales (see the module docs for the layout).
    Fp8E4M3,
}

impl KvDtype {
    /// Parse a dtype name: "f32", "bf16", "f16", "fp8", "fp8_e4m3" (case-insensitive; "float32",
    /// "bfloat16", "float16" also accepted).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(KvDtype::F32),
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "f16" | "float16" | "fp16" => Ok(KvDtype::F16),
            "fp8" | "fp8_e4m3" | "fp8e4m3" | "e4m3" => Ok(KvDtype::Fp8E4M3),
            _ => Err(Error::InvalidArgument(format!(
                "unknown KV cache dtype `{s}` (expected f32, bf16, f16, fp8 or fp8_e4m3)"
            ))),
        }
    }

    /// Canonical name (round-trips through [`KvDtype::parse`]).
    pub fn name(&self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
            KvDtype::F16 => "f16",
            KvDtype::Fp8E4M3 => "fp8_e4m3",
        }
    }

    /// Bytes per stored value (scales not included).
    pub fn elem_bytes(&self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 | KvDtype::F16 => 2,
            KvDtype::Fp8E4M3 => 1,
        }
    }
}

/// Number of f32 scales an fp8 slot carries for `n` values (groups of up to [`FP8_GROUP`]).
pub fn fp8_groups(n: usize) -> usize {
    n.div_ceil(FP8_GROUP)
}

/// Bytes of one slot of `kv_lora_rank + rope_dim` values in `dtype`, scales included.
pub fn slot_bytes(dtype: KvDtype, kv_lora_rank: usize, rope_dim: usize) -> usize {
    let vals = (kv_lora_rank + rope_dim) * dtype.elem_bytes();
    match dtype {
        KvDtype::Fp8E4M3 => vals + 4 * (fp8_groups(kv_lora_rank) + fp8_groups(rope_dim)),
        _ => vals,
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 / f16

/// f32 -> bf16 bits, round-to-nearest-even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16; // keep sign and payload top, force a quiet NaN
    }
    // Add the rounding bias (0x7fff plus the lowest kept bit) and truncate: nearest-even.
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// bf16 bits -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Encode `src` into bf16 bits. `dst.len() == src.len()`.
pub fn encode_bf16(src: &[f32], dst: &mut [u16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(s);
    }
}

/// Decode bf16 bits into f32 by a 16-bit shift (auto-vectorises). `dst.len() == src.len()`.
#[inline]
pub fn decode_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

/// Encode `src` into f16 bits (round-to-nearest-even via `half`).
pub fn encode_f16(src: &[f32], dst: &mut [u16]) {
    let dst: &mut [half::f16] = dst.reinterpret_cast_mut();
    dst.convert_from_f32_slice(src);
}

/// Decode f16 bits into f32 (via `half`, which uses F16C where available).
#[inline]
pub fn decode_f16(src: &[u16], dst: &mut [f32]) {
    let src: &[half::f16] = src.reinterpret_cast();
    src.convert_to_f32_slice(dst);
}

// ---------------------------------------------------------------------------------------------
// fp8 e4m3fn

/// Decode table: e4m3fn byte -> f32 (0x7f / 0xff are NaN).
pub static FP8_TABLE: [f32; 256] = build_fp8_table();

const fn build_fp8_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        let sign = if i & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
        let e = ((i >> 3) & 0xf) as i32;
        let m = (i & 0x7) as f32;
        let v = if e == 0xf && (i & 0x7) == 0x7 {
            f32::NAN
        } else if e == 0 {
            // sub-normal: m/8 * 2^-6 = m * 2^-9
            m * (1.0 / 512.0)
        } else {
            let mut p = 1.0f32;
            let mut k = e - 7;
            while k > 0 {
                p *= 2.0;
                k -= 1;
            }
            while k < 0 {
                p *= 0.5;
                k += 1;
            }
            (1.0 + m / 8.0) * p
        };
        t[i] = sign * v;
        i += 1;
    }
    t
}

/// f32 -> e4m3fn byte, round-to-nearest-even, saturating at +-448; NaN -> 0x7f (NaN).
#[inline]
pub fn f32_to_fp8(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    let a = f32::from_bits(abs);
    // Normal range (a >= 2^-6): round the f32 mantissa to 3 bits, nearest-even, by adding the
    // rounding bias below bit 20; a carry into the exponent is the correct rounding. Rebias the
    // exponent from 127 to 7. Saturation (and +-inf) is the final min().
    let normal = ((abs + 0x7_ffff + ((abs >> 20) & 1)) >> 20).wrapping_sub(120 << 3);
    // Sub-normal range (below 2^-6): code = round_even(a / 2^-9); adding 2^23 rounds with the
    // FPU's round-to-nearest-even. Code 8 is the smallest normal, which the layout also encodes as 8.
    let sub = ((a * 512.0 + 8_388_608.0) - 8_388_608.0) as u32;
    let code = if a < 1.0 / 64.0 { sub } else { normal };
    sign | code.min(0x7e) as u8
}

/// Scale for a group: amax / 448, or 1 when the group is all zeros (or amax is not finite-positive).
#[inline]
pub fn fp8_scale(vals: &[f32]) -> f32 {
    let amax = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 && amax.is_finite() {
        amax / FP8_MAX
    } else {
        1.0
    }
}

/// Quantise `src` into e4m3 bytes in groups of [`FP8_GROUP`]; writes one scale per group into
/// `scales` (`scales.len() == fp8_groups(src.len())`).
pub fn encode_fp8(src: &[f32], dst: &mut [u8], scales: &mut [f32]) {
    for ((s, d), sc) in src
        .chunks(FP8_GROUP)
        .zip(dst.chunks_mut(FP8_GROUP))
        .zip(scales.iter_mut())
    {
        let scale = fp8_scale(s);
        *sc = scale;
        for (o, &v) in d.iter_mut().zip(s) {
            *o = f32_to_fp8(v / scale);
        }
    }
}

/// Dequantise e4m3 bytes with per-group scales.
#[inline]
pub fn decode_fp8(src: &[u8], scales: &[f32], dst: &mut [f32]) {
    for ((s, d), &sc) in src
        .chunks(FP8_GROUP)
        .zip(dst.chunks_mut(FP8_GROUP))
        .zip(scales)
    {
        for (o, &b) in d.iter_mut().zip(s) {
            *o = FP8_TABLE[b as usize] * sc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn parse_and_name_round_trip() {
        for d in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
            assert_eq!(KvDtype::parse(d.name()).unwrap(), d);
        }
        assert_eq!(KvDtype::parse("fp8").unwrap(), KvDtype::Fp8E4M3);
        assert_eq!(KvDtype::parse("BF16").unwrap(), KvDtype::Bf16);
        let e = KvDtype::parse("int4").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("int4")),
            "{e}"
        );
    }

    #[test]
    fn fp8_table_matches_known_values() {
        assert_eq!(FP8_TABLE[0x00], 0.0);
        assert_eq!(FP8_TABLE[0x01], 1.0 / 512.0); // smallest sub-normal
        assert_eq!(FP8_TABLE[0x08], 1.0 / 64.0); // smallest normal
        assert_eq!(FP8_TABLE[0x38], 1.0);
        assert_eq!(FP8_TABLE[0x7e], 448.0);
        assert_eq!(FP8_TABLE[0xfe], -448.0);
        assert!(FP8_TABLE[0x7f].is_nan() && FP8_TABLE[0xff].is_nan());
    }

    #[test]
    fn fp8_encode_is_exact_on_representable_and_round_trips_table() {
        for b in 0u16..256 {
            let b = b as u8;
            if b & 0x7f == 0x7f {
                continue;
            }
            let v = FP8_TABLE[b as usize];
            let enc = f32_to_fp8(v);
            // -0.0 encodes to 0x80, which decodes to -0.0: compare values.
            assert_eq!(FP8_TABLE[enc as usize], v, "byte {b:#x}");
        }
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates() {
        // 1.0 = 0x38, next 1.125 = 0x39; midpoint 1.0625 ties to even (0x38).
        assert_eq!(f32_to_fp8(1.0625), 0x38);
        // midpoint between 1.125 (0x39) and 1.25 (0x3a) ties to even 0x3a.
        assert_eq!(f32_to_fp8(1.1875), 0x3a);
        assert_eq!(f32_to_fp8(1.07), 0x39);
        // carry into the exponent: 1.9375 is the midpoint of 1.875 (0x3f) and 2.0 (0x40) -> 0x40
        assert_eq!(f32_to_fp8(1.9375), 0x40);
        assert_eq!(f32_to_fp8(1000.0), 0x7e);
        assert_eq!(f32_to_fp8(-1e9), 0xfe);
        assert_eq!(f32_to_fp8(f32::INFINITY), 0x7e);
        // sub-normal midpoint: 0.5 * 2^-9 ties to 0.
        assert_eq!(f32_to_fp8(0.5 / 512.0), 0x00);
        assert_eq!(f32_to_fp8(1.5 / 512.0), 0x02);
        // 464 is the midpoint of 448 and (non-existent) 480: saturates rather than NaN.
        assert_eq!(f32_to_fp8(464.0), 0x7e);
    }

    #[test]
    fn fp8_encode_matches_brute_force_nearest_even() {
        // Reference: the nearest finite e4m3 magnitude, ties to the even code, saturating.
        let reference = |x: f32| -> u8 {
            let a = x.abs();
            let mut best = 0u8;
            for c in 1u8..=0x7e {
                let (d, db) = (
                    (FP8_TABLE[c as usize] - a).abs(),
                    (FP8_TABLE[best as usize] - a).abs(),
                );
                if d < db || (d == db && c % 2 == 0) {
                    best = c;
                }
            }
            best | if x.is_sign_negative() { 0x80 } else { 0 }
        };
        let mut seed = 3u64;
        for i in 0..20000 {
            let e = (i % 40) - 30; // magnitudes 2^-30 .. 2^9
            let x = lcg(&mut seed) * 2f32.powi(e);
            assert_eq!(f32_to_fp8(x), reference(x), "x = {x:e}");
        }
        // every midpoint between neighbouring codes
        for c in 0u8..0x7e {
            let mid = (FP8_TABLE[c as usize] + FP8_TABLE[c as usize + 1]) / 2.0;
            assert_eq!(f32_to_fp8(mid), reference(mid), "midpoint after {c:#x}");
            assert_eq!(f32_to_fp8(-mid), reference(-mid));
        }
    }

    #[test]
    fn fp8_group_round_trip_error_bound() {
        // Stated bound: |x - decode(encode(x))| <= amax_group / 16.
        let mut seed = 7u64;
        for trial in 0..50 {
            let n = 1 + (trial * 37) % 300;
            let mag = [1e-6f32, 1e-2, 1.0, 30.0, 1e4][trial % 5];
            let x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * mag).collect();
            let mut q = vec![0u8; n];
            let mut sc = vec![0f32; fp8_groups(n)];
            encode_fp8(&x, &mut q, &mut sc);
            let mut y = vec![0f32; n];
            decode_fp8(&q, &sc, &mut y);
            for (g, (xs, ys)) in x.chunks(FP8_GROUP).zip(y.chunks(FP8_GROUP)).enumerate() {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in xs.iter().zip(ys) {
                    let err = (a - b).abs();
                    assert!(
                        err <= amax / 16.0 * 1.0001,
                        "group {g}: {a} vs {b}, amax {amax}"
                    );
                    // tighter: relative 1/16 of the value plus the sub-normal step
                    assert!(
                        err <= a.abs() / 16.0 * 1.0001 + sc[g] / 1024.0 * 1.0001,
                        "{a} vs {b}"
                    );
                }
            }
        }
        // all-zero group: scale 1, exact zeros
        let mut q = [9u8; 4];
        let mut sc = [0f32; 1];
        encode_fp8(&[0.0; 4], &mut q, &mut sc);
        assert_eq!(sc[0], 1.0);
        assert_eq!(q, [0u8; 4]);
    }

    #[test]
    fn bf16_and_f16_round_trip_within_half_ulp() {
        let mut seed = 11u64;
        let x: Vec<f32> = (0..2000)
            .map(|i| lcg(&mut seed) * [1e-3f32, 1.0, 100.0][i % 3])
            .collect();
        let mut b = vec![0u16; x.len()];
        let mut y = vec![0f32; x.len()];
        encode_bf16(&x, &mut b);
        for (&v, &bits) in x.iter().zip(&b) {
            assert_eq!(
                bits,
                half::bf16::from_f32(v).to_bits(),
                "agrees with half's RNE for {v}"
            );
        }
        decode_bf16(&b, &mut y);
        for (a, r) in x.iter().zip(&y) {
            // bf16 has 8 significant bits: half-ulp <= 2^-8 relative.
            assert!((a - r).abs() <= a.abs() * (1.0 / 256.0), "bf16 {a} vs {r}");
        }
        // round-to-nearest-even at a tie: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.0
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
            1.0 + 4.0 / 256.0
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(f32_to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(
            bf16_to_f32(f32_to_bf16(f32::MAX)),
            f32::INFINITY,
            "rounds past the largest bf16"
        );
        encode_f16(&x, &mut b);
        decode_f16(&b, &mut y);
        for (a, r) in x.iter().zip(&y) {
            // f16 has 11 significant bits: half-ulp <= 2^-11 relative (normal range; |x| >= 6.1e-5
            // here except the smallest values, which get the sub-normal absolute step 2^-25).
            assert!(
                (a - r).abs() <= a.abs() * (1.0 / 2048.0) + 2f32.powi(-25),
                "f16 {a} vs {r}"
            );
        }
    }

    #[test]
    fn slot_bytes_per_dtype() {
        assert_eq!(slot_bytes(KvDtype::F32, 512, 64), 576 * 4);
        assert_eq!(slot_bytes(KvDtype::Bf16, 512, 64), 576 * 2);
        assert_eq!(slot_bytes(KvDtype::F16, 512, 64), 576 * 2);
        assert_eq!(slot_bytes(KvDtype::Fp8E4M3, 512, 64), 576 + 4 * 5);
        assert_eq!(slot_bytes(KvDtype::Fp8E4M3, 200, 16), 216 + 4 * 3);
    }
}

//! Element types of checkpoint tensors and their exact conversions to f32.
//!
//! Sits under `weights::loader`: every tensor byte the engine reads from a safetensors file goes
//! through these decoders. Guarantees: bf16 / f16 / fp8-e4m3fn decoding is exact (every input value
//! is representable in f32); fp8 goes through a 256-entry table built at compile time; `f32_to_bf16`
//! rounds to nearest-even and keeps NaN a NaN. Data is read with `from_le_bytes`, so no alignment is
//! assumed.

use std::fmt;

/// Element type of a stored tensor. Types the engine cannot use as weights are kept as
/// `Other("i64")` (safetensors' name, lower-cased) so the loader can name them in its refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// fp8 e4m3fn (no infinities, NaN = 0x7F / 0xFF, max 448).
    F8E4M3,
    Other(String),
}

impl DType {
    pub(crate) fn from_safetensors(d: safetensors::Dtype) -> Self {
        match d {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F8_E4M3 => DType::F8E4M3,
            other => DType::Other(other.to_string().to_lowercase()),
        }
    }

    /// Bytes per element (`None` for `Other`).
    pub fn size_bytes(&self) -> Option<usize> {
        match self {
            DType::F32 => Some(4),
            DType::F16 | DType::BF16 => Some(2),
            DType::F8E4M3 => Some(1),
            DType::Other(_) => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::F16 => f.write_str("f16"),
            DType::BF16 => f.write_str("bf16"),
            DType::F8E4M3 => f.write_str("f8_e4m3"),
            DType::Other(s) => f.write_str(s),
        }
    }
}

/// f32 bit patterns of all 256 fp8 e4m3fn values (sign 1, exponent 4 with bias 7, mantissa 3).
const FP8_E4M3_BITS: [u32; 256] = build_fp8_e4m3_table();

const fn build_fp8_e4m3_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut b = 0usize;
    while b < 256 {
        let sign = ((b as u32) >> 7) << 31;
        let exp = ((b >> 3) & 0xF) as u32;
        let man = (b & 0x7) as u32;
        t[b] = if exp == 0xF && man == 0x7 {
            sign | 0x7FC0_0000 // NaN
        } else if exp == 0 && man == 0 {
            sign // +-0
        } else if exp == 0 {
            // subnormal: man * 2^-9; normalise so the leading bit (position p) becomes implicit
            let p = if man >= 4 {
                2
            } else if man >= 2 {
                1
            } else {
                0
            };
            let f32_exp = (p + 127 - 9) as u32;
            let frac = (man - (1 << p)) << (23 - p);
            sign | (f32_exp << 23) | frac
        } else {
            sign | ((exp + 120) << 23) | (man << 20)
        };
        b += 1;
    }
    t
}

/// Decode one fp8 e4m3fn byte.
#[inline]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(FP8_E4M3_BITS[b as usize])
}

/// Decode one bf16 bit pattern (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Encode f32 as bf16, rounding to nearest-even; NaN stays (quiet) NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let bias = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// Decode one IEEE half bit pattern (exact).
#[inline]
pub fn f16_to_f32(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// Decode little-endian raw elements of a float dtype into f32 (fp8 without any scale).
/// Returns `None` for `DType::Other`. `bytes.len()` must be a multiple of the element size.
pub(crate) fn decode_to_f32(dtype: &DType, bytes: &[u8]) -> Option<Vec<f32>> {
    let out = match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F8E4M3 => bytes.iter().map(|&b| fp8_e4m3_to_f32(b)).collect(),
        DType::Other(_) => return None,
    };
    Some(out)
}

/// Raw little-endian u16 elements (bf16 / f16 bit patterns), copied without alignment needs.
pub(crate) fn copy_u16(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference e4m3fn decode by formula.
    fn fp8_ref(b: u8) -> f32 {
        let s = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let e = ((b >> 3) & 0xF) as i32;
        let m = (b & 7) as f64;
        if e == 15 && m == 7.0 {
            return f32::NAN;
        }
        let v = if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        (s * v) as f32
    }

    #[test]
    fn fp8_table_matches_formula() {
        for b in 0..=255u8 {
            let (got, want) = (fp8_e4m3_to_f32(b), fp8_ref(b));
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{b:#x}: {got} vs {want}");
            }
        }
        assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0xFE), -448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is exactly half-way between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
        // 1 + 3*2^-8 is half-way between 1.0078125 (odd) and 1.015625 (even): rounds up.
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80); // overflows to inf under RNE
        for bits in (0..=0xFFFFu16).filter(|b| !bf16_to_f32(*b).is_nan()) {
            assert_eq!(f32_to_bf16(bf16_to_f32(bits)), bits);
        }
    }

    #[test]
    fn decode_unaligned() {
        let mut buf = vec![0u8; 1];
        buf.extend_from_slice(&1.5f32.to_le_bytes());
        buf.extend_from_slice(&(-2.0f32).to_le_bytes());
        assert_eq!(
            decode_to_f32(&DType::F32, &buf[1..]).unwrap(),
            vec![1.5, -2.0]
        );
        let h = half::f16::from_f32(0.333).to_bits().to_le_bytes();
        assert_eq!(
            decode_to_f32(&DType::F16, &h).unwrap(),
            vec![half::f16::from_f32(0.333).to_f32()]
        );
        assert!(decode_to_f32(&DType::Other("i64".into()), &[0; 8]).is_none());
    }
}

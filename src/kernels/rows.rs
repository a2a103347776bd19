//! Borrowed dense rows in their storage precision: a span of the KV cache read in place by
//! attention (`matmul_rows_serial` scores it, `weighted_sum_rows_acc` sums it) instead of
//! being widened into an f32 copy first.
//!
//! Guarantee: every kernel widens each stored value exactly (bf16 and f16 are subsets of f32),
//! so a computation over `Rows::Bf16(b)` gives the bits of the same computation over the f32
//! copy of `b`.

/// `[n, stride]` values, row-major, in one of the exactly-widening precisions.
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    /// bf16 bits.
    Bf16(&'a [u16]),
    F16(&'a [half::f16]),
}

impl<'a> Rows<'a> {
    /// The values from element `off` on (a column offset into the first row).
    pub fn skip(self, off: usize) -> Rows<'a> {
        match self {
            Rows::F32(v) => Rows::F32(&v[off..]),
            Rows::Bf16(v) => Rows::Bf16(&v[off..]),
            Rows::F16(v) => Rows::F16(&v[off..]),
        }
    }

    /// Number of stored values.
    pub fn len(&self) -> usize {
        match self {
            Rows::F32(v) => v.len(),
            Rows::Bf16(v) => v.len(),
            Rows::F16(v) => v.len(),
        }
    }

    /// True when no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

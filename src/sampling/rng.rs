//! The per-request random number generator. Each request owns one, seeded from its
//! `SamplingParams::seed`; `sampling` and the speculative verifier draw from it in a fixed order,
//! so a request's output depends only on (model, prompt, params) and never on batch composition
//! or thread timing.
//!
//! Guarantees: xoshiro256** (Blackman & Vigna) with its 256-bit state filled by splitmix64 from
//! the 64-bit seed, exactly as the reference code; `next_f64` is uniform on [0, 1) with 53 bits.

/// xoshiro256** generator (not cryptographic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4], // [4] xoshiro256 state, never all zero
}

/// One splitmix64 step: advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// Seed the state with four splitmix64 outputs of `seed` (never all zero: splitmix64 is a
    /// bijection of distinct counter values, so at most one output can be zero).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Rng { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform double in [0, 1): the top 53 bits of `next_u64` times 2^-53.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // splitmix64 seeded with 1234567 (published test vector; cross-checked independently).
        let mut s = 1234567u64;
        assert_eq!(splitmix64(&mut s), 6457827717110365317);
        assert_eq!(splitmix64(&mut s), 3203168211198807973);
    }

    #[test]
    fn xoshiro_reference_values() {
        // xoshiro256** from state [1, 2, 3, 4], computed by hand / an independent implementation.
        let mut r = Rng { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(got, vec![11520, 0, 1509978240, 1215971899390074240]);
    }

    #[test]
    fn seeded_streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(43);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn next_f64_in_unit_interval_with_right_mean() {
        let mut r = Rng::new(7);
        let n = 200_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        // Mean of U[0,1) has sd 1/sqrt(12 n) ~ 0.00065; 6 sd bound.
        assert!((sum / n as f64 - 0.5).abs() < 0.004);
    }
}

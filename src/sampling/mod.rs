//! Token selection. Sits after `model::forward`: a request's logits row becomes its next token
//! here (non-speculative steps); the speculative verifier in `spec` reuses [`processed_probs`],
//! [`sample_from`] and [`Rng`] so both paths sample the same distribution with the same RNG.
//! Text-side stopping ([`StopMatcher`]) runs on the detokenised stream.
//!
//! Guarantees: every function is deterministic given (logits, params, RNG state); a greedy step
//! draws no random number and a stochastic step draws exactly one, so a request's RNG stream is
//! independent of batching. Nothing here panics on bad numeric input.
//!
//! Files: `params` (SamplingParams, validation), `rng` (xoshiro256**), `logits_process`
//! (argmax, temperature/top-k/top-p, log-softmax), `stop` (stop strings).

mod logits_process;
mod params;
mod rng;
mod stop;

pub use logits_process::{argmax, log_softmax, processed_probs};
pub use params::{is_greedy, SamplingParams};
pub use rng::Rng;
pub use stop::{StopMatcher, StopResult};

/// Inverse-CDF sample from a distribution over ids. Draws exactly one `next_f64`, scales it by the
/// total mass (so slightly unnormalised input is fine), accumulates in ascending id order in f64
/// and returns the first id with positive mass whose cumulative sum exceeds the draw; if rounding
/// leaves the draw above the last sum, the last id with positive mass. Negative, NaN and infinite
/// entries count as zero mass; a row with no mass gives id 0.
pub fn sample_from(probs: &[f32], rng: &mut Rng) -> u32 {
    let mass = |p: f32| {
        if p > 0.0 && p.is_finite() {
            p as f64
        } else {
            0.0
        }
    };
    let u = rng.next_f64();
    let total: f64 = probs.iter().map(|&p| mass(p)).sum();
    if total.is_nan() || total <= 0.0 {
        return 0;
    }
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last_nonzero = 0u32;
    for (i, &p) in probs.iter().enumerate() {
        let w = mass(p);
        if w > 0.0 {
            cum += w;
            last_nonzero = i as u32;
            if target < cum {
                return i as u32;
            }
        }
    }
    last_nonzero
}

/// One complete non-speculative sampling step: greedy parameters -> [`argmax`] (no RNG draw);
/// otherwise [`processed_probs`] then [`sample_from`].
pub fn sample_token(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    if is_greedy(p) {
        argmax(logits)
    } else {
        sample_from(&processed_probs(logits, p), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_from_edges() {
        let mut r = Rng::new(1);
        assert_eq!(sample_from(&[], &mut r), 0);
        assert_eq!(sample_from(&[0.0, -1.0, f32::NAN], &mut r), 0);
        for _ in 0..100 {
            assert_eq!(sample_from(&[0.0, 0.0, 1.0, 0.0], &mut r), 2);
            let id = sample_from(&[0.0, f32::NAN, 0.5, -3.0, 0.5], &mut r);
            assert!(id == 2 || id == 4);
        }
    }

    #[test]
    fn sample_from_boundaries_follow_the_cdf() {
        // A generator whose first draw is known lets us check the inverse CDF exactly.
        let mut probe = Rng::new(99);
        let u = probe.next_f64();
        let probs = [u as f32 * 0.5, 0.0, 1.0 - u as f32 * 0.5];
        // target = u * total ~ u > cum after id 0 (u/2) -> id 2.
        assert_eq!(sample_from(&probs, &mut Rng::new(99)), 2);
        let probs = [(u as f32 + 1.0) * 0.5, 0.0, (1.0 - u as f32) * 0.5];
        assert_eq!(sample_from(&probs, &mut Rng::new(99)), 0);
    }

    #[test]
    fn greedy_draws_no_random_numbers_stochastic_draws_one() {
        let logits = [0.1f32, 0.3, 0.2];
        let mut r = Rng::new(5);
        assert_eq!(sample_token(&logits, &SamplingParams::default(), &mut r), 1);
        assert_eq!(r, Rng::new(5));
        let p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        sample_token(&logits, &p, &mut r);
        let mut once = Rng::new(5);
        once.next_u64();
        assert_eq!(r, once);
    }
}

//! Verification of draft tokens against the target (Leviathan et al. 2023), one position at a
//! time so the scheduler can interleave budget forcing and stop checks per committed token.
//!
//! Greedy (temperature 0): the committed token is argmax p_i; the draft is accepted iff it equals
//! it — output identical to non-speculative greedy decoding. Stochastic: accept d_i with probability
//! min(1, p_i(d_i) / q_i(d_i)); on rejection sample the normalised residual max(0, p_i - q_i);
//! with no draft left (bonus) sample p. p and q are both `processed_probs` (temperature, top-k,
//! top-p) of the same request's params. Drafters without distributions use q = one-hot(d_i).

use crate::sampling::{
    argmax, is_greedy, processed_probs, sample_from, sample_token, Rng, SamplingParams,
};

/// What happened at one position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token was accepted.
    Accepted,
    /// The draft token was rejected; the committed token is the replacement.
    Recovered,
    /// No draft at this position (all drafts accepted, or no speculation): a plain target sample.
    Bonus,
}

/// Decide the token committed at one position.
/// `logits`: target logits at this position [vocab]; `draft`: the draft token with its q
/// (None = one-hot) if a draft exists here.
pub fn verify_position(
    logits: &[f32],
    draft: Option<(u32, Option<&[f32]>)>,
    params: &SamplingParams,
    rng: &mut Rng,
) -> (u32, Verdict) {
    let Some((d, q)) = draft else {
        return (sample_token(logits, params, rng), Verdict::Bonus);
    };
    if is_greedy(params) {
        let t = argmax(logits);
        return if t == d {
            (t, Verdict::Accepted)
        } else {
            (t, Verdict::Recovered)
        };
    }
    let p = processed_probs(logits, params); // [vocab]
    let pd = p[d as usize] as f64;
    let qd = q.map_or(1.0, |q| q[d as usize] as f64);
    let u = rng.next_f64();
    if qd > 0.0 && u < (pd / qd).min(1.0) {
        return (d, Verdict::Accepted);
    }
    // residual max(0, p - q)
    let r: Vec<f32> = match q {
        Some(q) => p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect(),
        None => {
            let mut r = p.clone();
            r[d as usize] = 0.0;
            r
        }
    };
    let s: f64 = r.iter().map(|&x| x as f64).sum();
    if s <= 0.0 {
        // p == q exactly (rejection then has probability 0 in exact arithmetic): sample p.
        return (sample_from(&p, rng), Verdict::Recovered);
    }
    // sample_from scales by the total mass, so the residual needs no explicit normalisation
    (sample_from(&r, rng), Verdict::Recovered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_accepts_only_the_argmax() {
        let params = SamplingParams::default();
        let mut rng = Rng::new(0);
        let logits = [0.1, 3.0, 0.2];
        assert_eq!(
            verify_position(&logits, Some((1, None)), &params, &mut rng),
            (1, Verdict::Accepted)
        );
        assert_eq!(
            verify_position(&logits, Some((2, None)), &params, &mut rng),
            (1, Verdict::Recovered)
        );
        assert_eq!(
            verify_position(&logits, None, &params, &mut rng),
            (1, Verdict::Bonus)
        );
    }

    #[test]
    fn stochastic_never_emits_outside_support() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            ..SamplingParams::default()
        };
        let mut rng = Rng::new(7);
        let logits = [2.0, 1.0, -5.0, -6.0];
        for _ in 0..2000 {
            let (t, _) = verify_position(&logits, Some((3, None)), &params, &mut rng);
            assert!(t < 2, "token {t} outside top-k support");
        }
    }
}

//! Logits -> distributions. Sits between `model::forward` (raw logits, one row per position) and
//! the samplers: the non-speculative step in `sampling` and the speculative verifier in `spec`,
//! which calls [`processed_probs`] for the target p and the draft q alike.
//!
//! Guarantees:
//! - Every function here is a pure, deterministic function of its inputs: fixed summation orders
//!   (ascending id for normalisers, rank order for the top-p prefix), f64 accumulation, a total
//!   order for ranking (higher logit first, lower id on ties). Same inputs give bit-identical
//!   outputs on every run and thread count.
//! - No panics on odd input: NaN logits count as -inf, +inf logits as the largest finite value,
//!   an empty row gives an empty result (and id 0 from [`argmax`]).

use super::params::{is_greedy, SamplingParams};

/// Index of the largest logit, ties broken toward the lowest id; NaN entries are never chosen
/// (0 for an empty or all-NaN row).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Logit made total-orderable: NaN -> -inf, +inf -> f32::MAX, -0.0 -> +0.0.
fn sanitize(l: f32) -> f64 {
    if l.is_nan() {
        f64::NEG_INFINITY
    } else if l == f32::INFINITY {
        f32::MAX as f64 + 0.0
    } else {
        l as f64 + 0.0
    }
}

/// The processed target distribution over the full vocabulary (zeros outside the kept set):
/// 1. temperature: z = logit / temperature (f64);
/// 2. top-k (k > 0): keep the k highest z, lower id first on ties;
/// 3. softmax over the kept set;
/// 4. top-p (< 1): keep the smallest rank-ordered prefix whose mass is >= top_p;
/// 5. renormalise over what is kept (sum in ascending id order), cast to f32.
///
/// Greedy parameters ([`is_greedy`], or a temperature that is not a positive number) give
/// one-hot(argmax), as does a row whose kept logits are all -inf.
pub fn processed_probs(logits: &[f32], p: &SamplingParams) -> Vec<f32> {
    let n = logits.len();
    let mut out = vec![0.0f32; n]; // [vocab]
    if n == 0 {
        return out;
    }
    if is_greedy(p) || p.temperature.is_nan() || p.temperature <= 0.0 {
        out[argmax(logits) as usize] = 1.0;
        return out;
    }
    let t = p.temperature as f64;
    let z: Vec<f64> = logits.iter().map(|&l| sanitize(l) / t + 0.0).collect(); // [vocab]
                                                                               // Rank order: higher z first, then lower id.
    let by_rank = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));

    let mut kept: Vec<u32> = (0..n as u32).collect(); // [n_kept] candidate ids
    if p.top_k > 0 && p.top_k < n {
        kept.select_nth_unstable_by(p.top_k - 1, by_rank);
        kept.truncate(p.top_k);
    }
    let m = kept
        .iter()
        .map(|&i| z[i as usize])
        .fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        out[argmax(logits) as usize] = 1.0;
        return out;
    }
    let mut e = vec![0.0f64; n]; // [vocab] unnormalised weights of kept ids
    kept.sort_unstable();
    let mut sum = 0.0f64;
    for &i in &kept {
        let w = (z[i as usize] - m).exp();
        e[i as usize] = w;
        sum += w;
    }

    let top_p = if p.top_p.is_nan() {
        1.0
    } else {
        p.top_p as f64
    };
    if top_p < 1.0 {
        let cut = top_p_prefix_len(&mut kept, &e, sum, top_p, by_rank);
        kept.truncate(cut);
        kept.sort_unstable();
        sum = kept.iter().map(|&i| e[i as usize]).sum();
    }
    for &i in &kept {
        out[i as usize] = (e[i as usize] / sum) as f32;
    }
    out
}

/// Reorder `ids` so its first r entries are the top-r in rank order, sorted, where r is the
/// smallest count whose probability mass (e / sum, accumulated in rank order) reaches `top_p`;
/// returns r (all ids if rounding never reaches it). Sorts only as much as needed: chunks of
/// 64, 128, 256... are selected and sorted in turn, so a peaked distribution costs O(vocab).
fn top_p_prefix_len(
    ids: &mut [u32], // [n_kept]
    e: &[f64],       // [vocab]
    sum: f64,
    top_p: f64,
    by_rank: impl Fn(&u32, &u32) -> std::cmp::Ordering + Copy,
) -> usize {
    let n = ids.len();
    let (mut sorted, mut chunk, mut cum) = (0usize, 64usize, 0.0f64);
    while sorted < n {
        let end = (sorted + chunk).min(n);
        if end < n {
            ids[sorted..].select_nth_unstable_by(end - sorted - 1, by_rank);
        }
        ids[sorted..end].sort_unstable_by(by_rank);
        for (j, &i) in ids[sorted..end].iter().enumerate() {
            cum += e[i as usize] / sum;
            if cum >= top_p {
                return sorted + j + 1;
            }
        }
        sorted = end;
        chunk = chunk.saturating_mul(2);
    }
    n
}

/// log-softmax of raw logits (no temperature), accumulated in f64 in ascending id order, returned
/// as f32. NaN logits count as -inf. If some logits are +inf they share all the mass; if all are
/// -inf the result is -inf everywhere.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let x: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l.is_nan() {
                f64::NEG_INFINITY
            } else {
                l as f64
            }
        })
        .collect(); // [vocab]
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return vec![f32::NEG_INFINITY; logits.len()];
    }
    if m == f64::INFINITY {
        let c = x.iter().filter(|&&v| v == f64::INFINITY).count() as f64;
        let lp = -c.ln() as f32;
        return x
            .iter()
            .map(|&v| {
                if v == f64::INFINITY {
                    lp
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
    }
    let sum: f64 = x.iter().map(|&v| (v - m).exp()).sum();
    let lse = m + sum.ln();
    x.iter().map(|&v| (v - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    fn assert_close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!((x as f64 - y).abs() <= tol, "index {i}: {x} vs {y}");
        }
    }

    #[test]
    fn argmax_ties_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[0.0, f32::INFINITY, f32::INFINITY]), 1);
    }

    #[test]
    fn plain_softmax_with_temperature() {
        let logits = [1.0f32, 2.0, 3.0];
        let got = processed_probs(&logits, &params(2.0, 0, 1.0));
        let w: Vec<f64> = logits.iter().map(|&l| (l as f64 / 2.0).exp()).collect();
        let s: f64 = w.iter().sum();
        assert_close(&got, &w.iter().map(|v| v / s).collect::<Vec<_>>(), 1e-7);
    }

    #[test]
    fn greedy_and_k1_are_one_hot_argmax() {
        let logits = [0.5f32, 2.0, 2.0, -1.0];
        let want = vec![0.0, 1.0, 0.0, 0.0];
        assert_eq!(processed_probs(&logits, &params(0.0, 0, 1.0)), want);
        assert_eq!(processed_probs(&logits, &params(1.3, 1, 0.9)), want);
    }

    #[test]
    fn top_k_ties_keep_lower_ids() {
        // ids 1,2,3 tie; k = 2 keeps the max (0) and the lowest tied id (1).
        let logits = [5.0f32, 1.0, 1.0, 1.0];
        let got = processed_probs(&logits, &params(1.0, 2, 1.0));
        let (a, b) = (1.0f64, (-4.0f64).exp());
        assert_close(&got, &[a / (a + b), b / (a + b), 0.0, 0.0], 1e-7);
    }

    #[test]
    fn top_p_smallest_prefix_and_ties() {
        // probs 0.5, 0.25, 0.125, 0.125 (logits are their logs).
        let logits: Vec<f32> = [0.5f64, 0.25, 0.125, 0.125]
            .iter()
            .map(|p| p.ln() as f32)
            .collect();
        let got = processed_probs(&logits, &params(1.0, 0, 0.75));
        assert_close(&got, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], 1e-6);
        // 0.8 needs a third token; ids 2 and 3 tie, the lower id wins.
        let got = processed_probs(&logits, &params(1.0, 0, 0.8));
        assert_close(&got, &[0.5 / 0.875, 0.25 / 0.875, 0.125 / 0.875, 0.0], 1e-6);
        // Tiny top_p keeps only the argmax.
        let got = processed_probs(&logits, &params(1.0, 0, 1e-9));
        assert_eq!(got, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn top_k_then_top_p_renormalises_within_k() {
        let logits: Vec<f32> = [0.4f64, 0.3, 0.2, 0.1]
            .iter()
            .map(|p| p.ln() as f32)
            .collect();
        // After k = 2: 4/7, 3/7. top_p = 0.5 -> only id 0 (4/7 >= 0.5).
        let got = processed_probs(&logits, &params(1.0, 2, 0.5));
        assert_eq!(got, vec![1.0, 0.0, 0.0, 0.0]);
        // top_p = 0.6 -> both kept.
        let got = processed_probs(&logits, &params(1.0, 2, 0.6));
        assert_close(&got, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0], 1e-6);
    }

    #[test]
    fn top_p_large_vocab_matches_full_sort() {
        // Exercise the chunked selection past several chunk sizes against a naive full sort.
        let n = 5000usize;
        let logits: Vec<f32> = (0..n)
            .map(|i| (((i * 7919) % 1000) as f32) * 0.003)
            .collect();
        for &top_p in &[0.05f32, 0.3, 0.9, 0.999] {
            let got = processed_probs(&logits, &params(0.7, 0, top_p));
            let z: Vec<f64> = logits.iter().map(|&l| l as f64 / 0.7f32 as f64).collect();
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| z[b].total_cmp(&z[a]).then(a.cmp(&b)));
            let mut cum = 0.0;
            let mut keep = vec![false; n];
            for &i in &order {
                keep[i] = true;
                cum += e[i] / s;
                if cum >= top_p as f64 {
                    break;
                }
            }
            let ks: f64 = (0..n).filter(|&i| keep[i]).map(|i| e[i]).sum();
            let want: Vec<f64> = (0..n)
                .map(|i| if keep[i] { e[i] / ks } else { 0.0 })
                .collect();
            assert_close(&got, &want, 1e-7);
            let nz = got.iter().filter(|&&v| v > 0.0).count();
            assert_eq!(nz, keep.iter().filter(|&&k| k).count(), "top_p {top_p}");
        }
    }

    #[test]
    fn odd_logits_do_not_panic() {
        let p = params(1.0, 0, 0.9);
        assert!(processed_probs(&[], &p).is_empty());
        assert_eq!(
            processed_probs(&[f32::NAN, f32::NEG_INFINITY], &p),
            vec![0.0, 1.0]
        );
        assert_eq!(
            processed_probs(&[1.0, f32::INFINITY, 2.0], &p),
            vec![0.0, 1.0, 0.0]
        );
        let two_inf = processed_probs(&[f32::INFINITY, 0.0, f32::INFINITY], &params(1.0, 0, 1.0));
        assert_eq!(two_inf, vec![0.5, 0.0, 0.5]);
        // Invalid temperature (not validated) falls back to greedy instead of panicking.
        assert_eq!(
            processed_probs(&[0.0, 1.0], &params(f32::NAN, 0, 1.0)),
            vec![0.0, 1.0]
        );
        assert_eq!(
            processed_probs(&[0.0, 1.0], &params(-1.0, 0, 1.0)),
            vec![0.0, 1.0]
        );
    }

    #[test]
    fn log_softmax_values() {
        let got = log_softmax(&[1.0, 2.0, 3.0]);
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert_close(&got, &[1.0 - lse, 2.0 - lse, 3.0 - lse], 1e-6);
        // Large logits do not overflow.
        let got = log_softmax(&[1000.0, 1000.0]);
        assert_close(&got, &[-(2f64.ln()), -(2f64.ln())], 1e-6);
        assert_eq!(
            log_softmax(&[f32::NEG_INFINITY; 2]),
            vec![f32::NEG_INFINITY; 2]
        );
        let inf = log_softmax(&[f32::INFINITY, 0.0]);
        assert_eq!(inf, vec![0.0, f32::NEG_INFINITY]);
        assert!(log_softmax(&[]).is_empty());
    }
}

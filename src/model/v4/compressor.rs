//! V4's compressed branches: pooling one window of cached compressor inputs into an entry, and
//! CSA's lightning-indexer selection over the entries.
//!
//! Entry `w` of rate `m` pools the tokens `[w*m, (w+1)*m)`: per channel, a softmax over the
//! window's slots of `gate + ape` weights the slots' `kv` (CSA: `2m` slots — the previous
//! window's first series `[..D]` then this window's second series `[D..2D]`; window 0 has only
//! the second), then RMSNorm and RoPE (`compress`) on the last rotary dims at position `w*m`.
//! As transformers' `DeepseekV4{HCA,CSA}Compressor` / `DeepseekV4Indexer`.

use crate::kernels::{dot, rms_norm};
use crate::model::rope::Rope;

use super::Compressor;

/// Pool entry `w` from the input rows of its window (`cur: [m, stride]`) and, for an
/// overlapping compressor with `w >= 1`, of the previous window (`prev: [m, stride]`). In each
/// row the compressor's kv starts at `kv_off`, its gate at `gate_off` (each `k * D` wide).
/// -> [D]
#[allow(clippy::too_many_arguments)]
pub(super) fn pool_entry(
    c: &Compressor,
    rope: &Rope,
    rope_dim: usize,
    eps: f32,
    w: usize,
    cur: &[f32],
    prev: Option<&[f32]>,
    stride: usize,
    kv_off: usize,
    gate_off: usize,
) -> Vec<f32> {
    let d = c.dim;
    let k = if c.overlap { 2 } else { 1 };
    let m = c.ape.len() / (k * d);
    let mut pooled = vec![0f32; d]; // [D]
    let mut logits = Vec::with_capacity(2 * m);
    let mut vals = Vec::with_capacity(2 * m);
    for ch in 0..d {
        logits.clear();
        vals.clear();
        if let Some(prev) = prev.filter(|_| c.overlap) {
            for j in 0..m {
                let row = &prev[j * stride..(j + 1) * stride];
                logits.push(row[gate_off + ch] + c.ape[j * k * d + ch]);
                vals.push(row[kv_off + ch]);
            }
        }
        let second = if c.overlap { d } else { 0 };
        for j in 0..m {
            let row = &cur[j * stride..(j + 1) * stride];
            logits.push(row[gate_off + second + ch] + c.ape[j * k * d + second + ch]);
            vals.push(row[kv_off + second + ch]);
        }
        let mx = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f32;
        for l in logits.iter_mut() {
            *l = (*l - mx).exp();
            sum += *l;
        }
        pooled[ch] = logits
            .iter()
            .zip(&vals)
            .fold(0f32, |acc, (p, v)| acc + v * (p / sum));
    }
    let mut out = vec![0f32; d]; // [D]
    rms_norm(&pooled, &c.norm, eps, &mut out);
    rope.apply(&mut out[d - rope_dim..], w * m);
    out
}

/// CSA selection for one query: the top `topk` of `n` entries by index score (ties to the lower
/// entry), returned in ascending entry order. `q: [H_I, D_I]` (roped), `weights: [H_I]`
/// (already x H_I^-1/2), `keys: [n, stride]` with the index key at `key_off`.
#[allow(clippy::too_many_arguments)]
pub(super) fn select(
    q: &[f32],
    weights: &[f32],
    keys: &[f32],
    n: usize,
    stride: usize,
    key_off: usize,
    di: usize,
    topk: usize,
) -> Vec<usize> {
    if n <= topk {
        return (0..n).collect();
    }
    let scale = (di as f32).powf(-0.5);
    let scores: Vec<f32> = (0..n)
        .map(|s| {
            let k = &keys[s * stride + key_off..s * stride + key_off + di];
            weights.iter().enumerate().fold(0f32, |acc, (h, &wt)| {
                acc + dot(&q[h * di..(h + 1) * di], k).max(0.0) * scale * wt
            })
        })
        .collect();
    let mut sel = crate::model::moe::top_k_desc(&scores, topk);
    sel.sort_unstable();
    sel
}

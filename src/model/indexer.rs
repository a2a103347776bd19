//! DeepSeek-V3.2's lightning indexer: for every query token, the `index_topk` earlier tokens its
//! sparse MLA attends to (DeepSeek Sparse Attention).
//!
//! Where it sits: inside `attention::mla_attention`, after the layer's q latent and latent KV are
//! formed and before attention reads the cache. It writes this step's index keys into the cache's
//! `index_key` group, reads every earlier key back from the cache (so all paths see the same,
//! possibly quantised, keys) and returns one [`Selection`] per token, which both attention paths
//! (decompressed MHA for prompt tokens, absorbed for generated ones) apply.
//!
//! What it computes (transformers 5.24 `DeepseekV32Indexer`, models/golden/V32.md):
//! `k[s] = RoPE_half(LayerNorm(wk h[s]))` (LayerNorm with weight and bias, eps 1e-6; RoPE on the
//! first `qk_rope_head_dim` dims, half-split, the MLA frequencies and cos/sin factor), `q[t, j] =
//! RoPE_half((wq_b qr[t])_j)` from the normalised q latent, `w[t, j] = (weights_proj h[t])_j *
//! H_I^-1/2`, `I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s] * D^-1/2)` for `s <= t`; the
//! selection is the `index_topk` largest I(t, s), or every `s <= t` when there are no more.
//! When the key group is stored below f32, q and k are first rotated by a (block) Walsh-Hadamard
//! transform — orthogonal, so the scores are unchanged up to rounding, but it spreads outliers
//! before the keys are rounded, as DeepSeek's reference does before its fp8 index cache.
//!
//! Guarantees: a token's scores and selection depend only on its own sequence (each score is a
//! fixed-order dot product, heads summed in order), never on the batch or the chunking; ties are
//! broken by position (lower position first), so the selection is deterministic where
//! `torch.topk` is not (V32.md, "Surprises" 5).

use crate::config::IndexerConfig;
use crate::kernels::{map_indices, matmul, matmul_f32};
use crate::kv::{KvCache, KvDtype};

use super::attention::LatentScratch;
use super::batch::SeqChunk;
use super::rope::Rope;
use super::weights::Indexer;

/// The keys one query attends to: `None` = every earlier token (and itself); `Some(positions)`
/// = exactly these, ascending (`index_topk` of them).
pub(crate) type Selection = Option<Vec<u32>>;

/// The indexer's LayerNorm eps (hard-coded in the reference).
const LN_EPS: f32 = 1e-6;
/// Query tokens scored against the keys by one matmul.
const QUERY_BLOCK: usize = 16;

/// Write this step's index keys and select every token's keys. `xn`: [n, hidden] (attention
/// input); `qn`: [n, q_lora] (normalised q latent); `pos`: [n]; chunks cover the n tokens.
#[allow(clippy::too_many_arguments)]
pub(super) fn select(
    ix: &IndexerConfig,
    rope: &Rope,
    w: &Indexer,
    layer: usize,
    xn: &[f32],
    qn: &[f32],
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
) -> Vec<Selection> {
    let n = pos.len();
    let (nh, d) = (ix.n_heads, ix.head_dim);
    let group = kv
        .group_of("index_key")
        .expect("checked by forward: a V3.2 cache has an index_key group");
    let rotate = kv.config().groups[group].dtype != KvDtype::F32;

    // Keys: [n, D] = RoPE_half(LayerNorm(wk xn)), Hadamard-rotated when rounded for storage.
    let mut k = vec![0f32; n * d];
    matmul(&w.wk, xn, n, &mut k);
    for (t, row) in k.chunks_exact_mut(d).enumerate() {
        layer_norm(row, &w.k_norm_w, &w.k_norm_b);
        rope.apply_half(row, pos[t]);
        if rotate {
            hadamard(row);
        }
    }
    let mut t0 = 0;
    for ch in chunks {
        for i in 0..ch.tokens.len() {
            let row = &k[(t0 + i) * d..(t0 + i + 1) * d];
            kv.write_entry(group, layer, ch.kv, ch.start + i, &[row]);
        }
        t0 += ch.tokens.len();
    }
    let mut out: Vec<Selection> = vec![None; n];
    if pos.iter().all(|&p| p < ix.topk) {
        return out; // every query attends to all of its keys: nothing to score
    }

    // Queries: [n, H_I, D]; per-head weights: [n, H_I].
    let mut q = vec![0f32; n * nh * d];
    matmul(&w.wq_b, qn, n, &mut q);
    for (r, head) in q.chunks_exact_mut(d).enumerate() {
        rope.apply_half(head, pos[r / nh]);
        if rotate {
            hadamard(head);
        }
    }
    let mut wts = vec![0f32; n * nh];
    matmul(&w.weights_proj, xn, n, &mut wts);
    let wscale = (nh as f32).powf(-0.5);
    wts.iter_mut().for_each(|v| *v *= wscale);
    let scale = (d as f32).powf(-0.5);

    let kv = &*kv;
    let mut t0 = 0;
    for ch in chunks {
        let len = ch.tokens.len();
        // Tokens at positions < topk keep every key; the rest (a suffix of the chunk) are scored.
        let first = ix.topk.saturating_sub(ch.start).min(len);
        if first < len {
            let end = ch.start + len;
            // This thread's reusable buffer (a fresh multi-megabyte vector per layer and step
            // costs page faults that grow with the context).
            let mut scratch = LatentScratch::take(end * d);
            let keys = scratch.buf(); // [end, D]
            kv.read_group_range(group, layer, ch.kv, 0, end, keys);
            let keys = &*keys;
            let m = len - first;
            let nb = m.div_ceil(QUERY_BLOCK);
            let work = m * nh * end * d;
            let sels: Vec<Vec<Vec<u32>>> = map_indices(nb, work, |b| {
                let i0 = first + b * QUERY_BLOCK;
                let mb = QUERY_BLOCK.min(len - i0);
                let kb = ch.start + i0 + mb; // keys 0..kb cover the block
                let qb = &q[(t0 + i0) * nh * d..(t0 + i0 + mb) * nh * d]; // [mb * H_I, D]
                let mut s = vec![0f32; mb * nh * kb]; // [mb, H_I, kb]
                matmul_f32(&keys[..kb * d], kb, d, qb, mb * nh, &mut s);
                (0..mb)
                    .map(|i| {
                        let p = ch.start + i0 + i;
                        let wt = &wts[(t0 + i0 + i) * nh..(t0 + i0 + i + 1) * nh]; // [H_I]
                        let mut score = vec![0f32; p + 1]; // [p + 1]
                        for (j, &wj) in wt.iter().enumerate() {
                            let sj = &s[(i * nh + j) * kb..(i * nh + j) * kb + p + 1];
                            for (acc, &v) in score.iter_mut().zip(sj) {
                                *acc += wj * (v * scale).max(0.0);
                            }
                        }
                        top_k_positions(&score, ix.topk)
                    })
                    .collect()
            });
            for (b, block) in sels.into_iter().enumerate() {
                for (i, sel) in block.into_iter().enumerate() {
                    out[t0 + first + b * QUERY_BLOCK + i] = Some(sel);
                }
            }
        }
        t0 += len;
    }
    out
}

/// The positions of the `k` largest scores (ties: lower position first), ascending. `scores`:
/// [keys]; every position when there are at most `k`.
pub(crate) fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    if k < idx.len() {
        // Strict total order: higher score first, then lower position. `+ 0.0` makes -0 == +0.
        let key = |i: u32| scores[i as usize] + 0.0;
        idx.select_nth_unstable_by(k - 1, |&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_unstable();
    }
    idx
}

/// LayerNorm in place: (x - mean) / sqrt(var + eps) * w + b, biased variance. x: [D].
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32]) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + LN_EPS).sqrt();
    for ((v, wi), bi) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * wi + bi;
    }
}

/// Orthonormal Walsh-Hadamard transform in place, per block of the largest power of two (at most
/// 128) dividing the length; the identity on odd lengths. x: [D].
pub(crate) fn hadamard(x: &mut [f32]) {
    let bs = (1usize << x.len().trailing_zeros()).min(128);
    if bs < 2 {
        return;
    }
    let norm = (bs as f32).powf(-0.5);
    for blk in x.chunks_exact_mut(bs) {
        let mut h = 1;
        while h < bs {
            for i in (0..bs).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (blk[j], blk[j + h]);
                    blk[j] = a + b;
                    blk[j + h] = a - b;
                }
            }
            h *= 2;
        }
        blk.iter_mut().for_each(|v| *v *= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_breaks_ties_by_position() {
        assert_eq!(top_k_positions(&[0.0; 5], 2), vec![0, 1]);
        assert_eq!(top_k_positions(&[0.0; 12], 3), vec![0, 1, 2]);
        assert_eq!(top_k_positions(&[1.0, 3.0, 2.0, 3.0], 2), vec![1, 3]);
        assert_eq!(top_k_positions(&[1.0, 3.0, 2.0, 3.0], 3), vec![1, 2, 3]);
        // -0 and +0 tie; the lower position wins.
        assert_eq!(top_k_positions(&[1.0, 0.0, -0.0, 0.0], 2), vec![0, 1]);
        assert_eq!(top_k_positions(&[-1.0, 0.0, -0.0, 0.0], 2), vec![1, 2]);
        // No more keys than k: all of them.
        assert_eq!(top_k_positions(&[5.0, 1.0], 4), vec![0, 1]);
    }

    #[test]
    fn top_k_is_a_function_of_the_scores_only() {
        // The same scores at the same positions select the same keys whatever the row length
        // beyond them (torch.topk's tie choice depends on the row length; this must not).
        let s: Vec<f32> = (0..40).map(|i| ((i * 7) % 5) as f32).collect();
        let a = top_k_positions(&s, 9);
        let b = top_k_positions(&s, 9);
        assert_eq!(a, b);
        assert_eq!(a.len(), 9);
        let min_kept = a.iter().map(|&i| s[i as usize]).fold(f32::MAX, f32::min);
        for i in 0..40u32 {
            if !a.contains(&i) {
                assert!(s[i as usize] <= min_kept);
            }
        }
    }

    #[test]
    fn hadamard_is_orthonormal() {
        for len in [16usize, 20, 128, 256, 7] {
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let y: Vec<f32> = (0..len).map(|i| (i as f32 * 0.91).cos()).collect();
            let (mut hx, mut hy) = (x.clone(), y.clone());
            hadamard(&mut hx);
            hadamard(&mut hy);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
            assert!((dot(&x, &y) - dot(&hx, &hy)).abs() < 1e-4, "len {len}");
            if len % 2 == 0 {
                assert_ne!(x, hx, "len {len}: rotated");
            }
        }
    }
}

//! Absorbed attention head by head, for a short cache: the whole per-head computation of
//! `attention::absorbed` — q_lat = W_UK^h^T q_nope, scores against the latent rows, softmax,
//! ctx = sum_t p_t c_t, o = W_UV^h ctx — as ONE parallel task per head.
//!
//! Sits beside `attention.rs`, which calls it for the m > 1 absorbed tokens of a chunk (a
//! speculative verification, a draft catching up) whose keys (cache rows 0..start + m) number at
//! most [`BY_HEAD_MAX_KEYS`]; longer caches take the streamed path there (each latent row read
//! once per step for all heads). Why: at a short context the streamed path's parallel regions
//! (the heads' absorption, the score and value passes, the heads' value projections) and its
//! serial softmax over every head's rows cost more than the work inside them — on the widened
//! bench target, 2 threads, a 9-token verification's absorbed attention took ~140 us per layer
//! (absorption 26, scores 37, softmax 29, values 24, value projections 25), against a few us of
//! multiply-adds; head by head its whole attention went from ~245 to ~190 us per layer
//! (docs/BENCHMARKS.md "Long rows at a k = 8 verification"). Here each head reads the latent
//! rows again (at most 256 rows: L2). One query keeps the streamed path: its absorption and value
//! projections are one batched GEMV pass each there, and head by head measured no faster on the
//! target and ~30 % slower on the 4-head draft model (per-head calls and buffers).
//!
//! Guarantee: the same bits as the streamed path for every element. The per-head products are
//! the same `matmul` calls (one token: `matmul` with n = 1 gives `matmul_many`'s bits); scores
//! are `matmul_rows_serial` over the rows in place or their f32 copy (its element order does not
//! depend on which query rows share the call); softmax per row is the same call; the value sum
//! over all keys at once is the order of the streamed span-by-span sum (`weighted_sum_rows_acc`
//! over ranges visited in increasing order) and does not depend on the column split.

use crate::config::ModelConfig;
use crate::kernels::{
    map_indices, matmul, matmul_rows_serial, softmax_inplace, weighted_sum_rows_acc, Rows,
};
use crate::kv::{KvCache, SeqKv};

use super::attention::{head_q_lat, kv_width, put_head_q_abs, rows_or_copy, scatter_heads, SPAN};
use super::weights::Attention;

/// Most keys for which [`absorbed_by_head`] is taken: one span of the streamed path, so each
/// head's re-read of the latent rows (<= 256 x (kv_lora + rope) values) stays in the L2.
pub(super) const BY_HEAD_MAX_KEYS: usize = SPAN;

/// `attention::absorbed` for queries q: [m, H, nope + rope] at positions start..start + m of the
/// sequence `seq` (start + m <= [`BY_HEAD_MAX_KEYS`]; any m, though the caller passes m > 1),
/// out: [m, H, v].
pub(super) fn absorbed_by_head(
    cfg: &ModelConfig,
    a: &Attention,
    scale: f32,
    (kv, layer, seq): (&KvCache, usize, &SeqKv),
    start: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let nh = cfg.num_attention_heads;
    let (nope, rdim, kvl, vdim) = (
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.kv_lora_rank,
        cfg.v_head_dim,
    );
    let (qk, kvd) = (nope + rdim, kv_width(kv));
    let m = q.len() / (nh * qk);
    let keys = start + m;
    debug_assert!(keys <= BY_HEAD_MAX_KEYS);
    let mut scratch = None;
    let view = kv.latent_span(layer, seq, (0, keys));
    let lat = rows_or_copy(view, (kv, layer, seq), (0, keys), &mut scratch); // [keys, kv_lora + rope]
    let o_heads: Vec<Vec<f32>> = map_indices(nh, nh * m * keys * kvd, |h| {
        let ql = head_q_lat(cfg, a, q, h); // [m, kv_lora]
        let mut qa = vec![0f32; m * kvd]; // [m, kv_lora + rope]
        put_head_q_abs(cfg, q, h, &ql, &mut qa, kvd);
        let ctx = head_context(lat, keys, kvl, scale, start, &qa); // [m, kv_lora]
        let mut oh = vec![0f32; m * vdim]; // [m, v]
        matmul(&a.w_uv[h], &ctx, m, &mut oh);
        oh
    });
    scatter_heads(&o_heads, vdim, out);
}

/// One head's context: `qa: [m, kv_lora + rope]` (its absorbed queries at positions
/// start..start + m) against the latent rows `lat: [keys, kv_lora + rope]` -> ctx: [m, kv_lora] =
/// sum_t softmax_t(scale qa . lat_t) c_t over keys 0..=p, on the calling thread.
fn head_context(
    lat: Rows<'_>,
    keys: usize,
    kvl: usize,
    scale: f32,
    start: usize,
    qa: &[f32],
) -> Vec<f32> {
    let kvd = lat.len() / keys.max(1);
    let m = qa.len() / kvd;
    let mut s = vec![0f32; m * keys]; // [m, keys]
    matmul_rows_serial(lat, keys, kvd, qa, m, &mut s);
    let lens: Vec<usize> = (0..m).map(|i| start + i + 1).collect();
    for (i, &len) in lens.iter().enumerate() {
        let row = &mut s[i * keys..i * keys + len];
        row.iter_mut().for_each(|v| *v *= scale);
        softmax_inplace(row);
    }
    let mut ctx = vec![0f32; m * kvl]; // [m, kv_lora]
    weighted_sum_rows_acc(&s, keys, &lens, lat, kvd, kvl, &mut ctx);
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::tests::{filled_cache, whole_cache};

    /// Every head's context equals the rows of that head in the whole-cache computation (the
    /// streamed path's reference), bit for bit, for caches read in place and through a copy.
    #[test]
    fn head_context_is_the_whole_cache_computation() {
        for (dtype, kvl, rope, nh, len, m) in [
            (
                crate::kv::KvDtype::Bf16,
                48usize,
                16usize,
                4usize,
                256usize,
                9usize,
            ),
            (crate::kv::KvDtype::F32, 40, 8, 3, 100, 1),
            (crate::kv::KvDtype::F16, 8, 4, 2, 5, 2),
            (crate::kv::KvDtype::Fp8E4M3, 48, 16, 4, 70, 7),
        ] {
            let (kv, seq, q_abs) = filled_cache(dtype, kvl, rope, nh, len, m);
            let kvd = kvl + rope;
            let start = len - m;
            let want = whole_cache((&kv, 1, &seq), kvl, nh, 0.3, start, &q_abs); // [m, H, kvl]
            let mut copy = vec![0f32; len * kvd];
            kv.read_range(1, &seq, 0, len, &mut copy);
            let views = [kv.latent_span(1, &seq, (0, len)), Some(Rows::F32(&copy))];
            for lat in views.into_iter().flatten() {
                for h in 0..nh {
                    let mut qa = vec![0f32; m * kvd]; // [m, kvd]
                    for i in 0..m {
                        qa[i * kvd..(i + 1) * kvd]
                            .copy_from_slice(&q_abs[(i * nh + h) * kvd..(i * nh + h + 1) * kvd]);
                    }
                    let got = head_context(lat, len, kvl, 0.3, start, &qa);
                    for i in 0..m {
                        let w = &want[(i * nh + h) * kvl..(i * nh + h + 1) * kvl];
                        let g = &got[i * kvl..(i + 1) * kvl];
                        assert_eq!(
                            g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{dtype:?} kv_lora {kvl} head {h} of {nh} keys {len} query {i} of {m}"
                        );
                    }
                }
            }
        }
    }
}

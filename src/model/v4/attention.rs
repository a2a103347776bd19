//! V4 attention of one layer over a ragged batch: q from the q-LoRA path (per-head unweighted
//! RMSNorm, RoPE on the last rotary dims), one shared K=V row per token (RMSNorm, RoPE) written to
//! the cache, compressor inputs written and entries closed, then per token a softmax over
//! [window rows (last `sliding_window` positions) | compressed entries (HCA: all closed ones; CSA:
//! the indexer's top-k of them) | the head's sink], values = keys, the output's rotary part
//! un-rotated at the query position, and the grouped low-rank output projection.

use crate::config::{ModelConfig, V4Attn, V4Config};
use crate::kernels::{dot, for_each_row, matmul, rms_norm};
use crate::kv::KvCache;
use crate::model::batch::SeqChunk;
use crate::model::forward::norm_rows;
use crate::model::rope::Rope;

use super::compressor::{pool_entry, select};
use super::{V4Layer, V4Model};

/// Per-head unweighted RMSNorm then RoPE on each head's last `r` dims. x: [n, heads * d].
fn norm_rope_heads(
    x: &mut [f32],
    d: usize,
    r: usize,
    eps: f32,
    ones: &[f32],
    rope: &Rope,
    pos: &[usize],
) {
    let row = x.len() / pos.len().max(1);
    for_each_row(x, row, x.len(), |t, xr| {
        for h in xr.chunks_exact_mut(d) {
            if !ones.is_empty() {
                let src = h.to_vec();
                rms_norm(&src, ones, eps, h);
            }
            rope.apply(&mut h[d - r..], pos[t]);
        }
    });
}

/// Attention output of one layer for every token. xn: [n, hidden] (normed collapsed streams).
/// -> [n, hidden]
#[allow(clippy::too_many_arguments)]
pub(super) fn v4_attention(
    cfg: &ModelConfig,
    model: &V4Model,
    layer: &V4Layer,
    li: usize,
    xn: &[f32],
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
) -> Vec<f32> {
    let v: &V4Config = cfg.v4.as_ref().expect("V4 config");
    let a = &layer.attn;
    let n = pos.len();
    let (heads, d, r) = (cfg.num_attention_heads, v.head_dim, v.rope_dim);
    let eps = cfg.rms_norm_eps;
    let kind = v.layer_types[li];
    let rope = if kind == V4Attn::Sliding {
        &model.rope_main
    } else {
        &model.rope_compress
    };
    let ql = v.q_lora_rank;
    let mut qa = vec![0f32; n * ql]; // [n, q_lora]
    matmul(&a.wq_a, xn, n, &mut qa);
    let mut qr = vec![0f32; n * ql]; // [n, q_lora]
    norm_rows(&qa, &a.q_norm, eps, &mut qr);
    let mut q = vec![0f32; n * heads * d]; // [n, H * D]
    matmul(&a.wq_b, &qr, n, &mut q);
    let ones = vec![1f32; d]; // [D]
    norm_rope_heads(&mut q, d, r, eps, &ones, rope, pos);
    let mut kvr = vec![0f32; n * d]; // [n, D]
    matmul(&a.wkv, xn, n, &mut kvr);
    let mut kvn = vec![0f32; n * d]; // [n, D]
    norm_rows(&kvr, &a.kv_norm, eps, &mut kvn);
    norm_rope_heads(&mut kvn, d, r, eps, &[], rope, pos);

    // Token -> chunk index.
    let mut owner = Vec::with_capacity(n);
    for (ci, ch) in chunks.iter().enumerate() {
        owner.extend(std::iter::repeat_n(ci, ch.tokens.len()));
    }
    for t in 0..n {
        let ch = &chunks[owner[t]];
        kv.write_entry(0, li, ch.kv, pos[t], &[&kvn[t * d..(t + 1) * d]]);
    }

    // Compressor inputs, then the entries whose window closes in this batch.
    let lk = v.index_in_kind(li);
    let (input_g, entry_g, rate) = match kind {
        V4Attn::Sliding => (None, None, 0),
        V4Attn::Csa => (
            kv.group_of("csa_input"),
            kv.group_of("csa_entry"),
            v.csa_rate,
        ),
        V4Attn::Hca => (
            kv.group_of("hca_input"),
            kv.group_of("hca_entry"),
            v.hca_rate,
        ),
    };
    let di = v.index_head_dim;
    let mut iq = Vec::new(); // [n, H_I * D_I]
    let mut iw = Vec::new(); // [n, H_I]
    if let (Some(c), Some(ig), Some(eg)) = (&a.compressor, input_g, entry_g) {
        let k = if c.overlap { 2 } else { 1 };
        let mut ckv = vec![0f32; n * k * d]; // [n, k * D]
        let mut cg = vec![0f32; n * k * d]; // [n, k * D]
        matmul(&c.wkv, xn, n, &mut ckv);
        matmul(&c.wgate, xn, n, &mut cg);
        let (mut ikv, mut igt) = (Vec::new(), Vec::new()); // [n, 2 * D_I] each
        if let Some(ix) = &a.indexer {
            ikv = vec![0f32; n * 2 * di];
            igt = vec![0f32; n * 2 * di];
            matmul(&ix.comp.wkv, xn, n, &mut ikv);
            matmul(&ix.comp.wgate, xn, n, &mut igt);
            let hi = v.index_n_heads;
            iq = vec![0f32; n * hi * di];
            matmul(&ix.wq_b, &qr, n, &mut iq);
            norm_rope_heads(&mut iq, di, r, eps, &[], &model.rope_compress, pos);
            iw = vec![0f32; n * hi];
            matmul(&ix.weights_proj, xn, n, &mut iw);
            let s = (hi as f32).powf(-0.5);
            iw.iter_mut().for_each(|x| *x *= s);
        }
        let kd = k * d;
        for t in 0..n {
            let ch = &chunks[owner[t]];
            let (a1, a2) = (&ckv[t * kd..(t + 1) * kd], &cg[t * kd..(t + 1) * kd]);
            if a.indexer.is_some() {
                let (b1, b2) = (
                    &ikv[t * 2 * di..(t + 1) * 2 * di],
                    &igt[t * 2 * di..(t + 1) * 2 * di],
                );
                kv.write_entry(ig, lk, ch.kv, pos[t], &[a1, a2, b1, b2]);
            } else {
                kv.write_entry(ig, lk, ch.kv, pos[t], &[a1, a2]);
            }
        }
        let stride = kv.config().groups[ig].kind.width();
        for t in 0..n {
            let p = pos[t];
            if !(p + 1).is_multiple_of(rate) {
                continue;
            }
            let ch = &chunks[owner[t]];
            let w = (p + 1) / rate - 1;
            let first = if c.overlap && w >= 1 { w - 1 } else { w };
            let mut rows = vec![0f32; (w + 1 - first) * rate * stride]; // [windows * m, stride]
            kv.read_group_range(ig, lk, ch.kv, first * rate, (w + 1) * rate, &mut rows);
            let split = (w - first) * rate * stride;
            let (prev, cur) = rows.split_at(split);
            let prev = (w > first).then_some(prev);
            let e = pool_entry(c, &model.rope_compress, r, eps, w, cur, prev, stride, 0, kd);
            if let Some(ix) = &a.indexer {
                let ie = pool_entry(
                    &ix.comp,
                    &model.rope_compress,
                    r,
                    eps,
                    w,
                    cur,
                    prev,
                    stride,
                    2 * kd,
                    2 * kd + 2 * di,
                );
                kv.write_compressed(eg, lk, ch.kv, w, &[&e, &ie]);
            } else {
                kv.write_compressed(eg, lk, ch.kv, w, &[&e]);
            }
        }
    }

    // Attention per token.
    let kv: &KvCache = kv;
    let hd = heads * d;
    let mut o = vec![0f32; n * hd]; // [n, H * D]
    let win = v.sliding_window;
    let scale = (d as f32).powf(-0.5);
    for_each_row(&mut o, hd, n * hd * (win + 8), |t, out| {
        let ch = &chunks[owner[t]];
        let p = pos[t];
        let lo = (p + 1).saturating_sub(win);
        let nw = p + 1 - lo;
        let mut keys = vec![0f32; nw * d]; // [nw, D]
        kv.read_group_range(0, li, ch.kv, lo, p + 1, &mut keys);
        if let (Some(eg), true) = (entry_g, rate > 0) {
            let nv = (p + 1) / rate;
            let ew = kv.config().groups[eg].kind.width();
            let mut ents = vec![0f32; nv * ew]; // [nv, entry width]
            kv.read_compressed(eg, lk, ch.kv, 0, nv, &mut ents);
            let sel: Vec<usize> = if kind == V4Attn::Csa {
                let hi = v.index_n_heads;
                select(
                    &iq[t * hi * di..(t + 1) * hi * di],
                    &iw[t * hi..(t + 1) * hi],
                    &ents,
                    nv,
                    ew,
                    d,
                    di,
                    v.index_topk,
                )
            } else {
                (0..nv).collect()
            };
            for s in sel {
                keys.extend_from_slice(&ents[s * ew..s * ew + d]);
            }
        }
        let nk = keys.len() / d;
        let mut logits = vec![0f32; nk + 1]; // [keys + sink]
        for h in 0..heads {
            let qh = &q[t * hd + h * d..t * hd + (h + 1) * d];
            for (j, l) in logits[..nk].iter_mut().enumerate() {
                *l = dot(qh, &keys[j * d..(j + 1) * d]) * scale;
            }
            logits[nk] = a.sinks[h];
            let mx = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let mut sum = 0f32;
            for l in logits.iter_mut() {
                *l = (*l - mx).exp();
                sum += *l;
            }
            let oh = &mut out[h * d..(h + 1) * d];
            for j in 0..nk {
                let pj = logits[j] / sum;
                for (o, k) in oh.iter_mut().zip(&keys[j * d..(j + 1) * d]) {
                    *o += pj * k;
                }
            }
            rope.apply_inverse(&mut oh[d - r..], p);
        }
    });

    // Grouped low-rank output projection.
    let (g, ol) = (v.o_groups, v.o_lora_rank);
    let gw = hd / g;
    let mut mid = vec![0f32; n * g * ol]; // [n, g * o_lora]
    let mut part = vec![0f32; n * gw]; // [n, H * D / g]
    let mut pout = vec![0f32; n * ol]; // [n, o_lora]
    for (gi, wa) in a.wo_a.iter().enumerate() {
        for t in 0..n {
            part[t * gw..(t + 1) * gw]
                .copy_from_slice(&o[t * hd + gi * gw..t * hd + (gi + 1) * gw]);
        }
        matmul(wa, &part, n, &mut pout);
        for t in 0..n {
            mid[t * g * ol + gi * ol..t * g * ol + (gi + 1) * ol]
                .copy_from_slice(&pout[t * ol..(t + 1) * ol]);
        }
    }
    let h = cfg.hidden_size;
    let mut y = vec![0f32; n * h]; // [n, hidden]
    matmul(&a.wo_b, &mid, n, &mut y);
    y
}

//! The V4 forward over a ragged batch: embed -> hc_mult copies of each token (the residual
//! streams) -> per layer [attn hyper-connection (collapse) -> attn_norm -> attention -> expand +
//! mix; ffn hyper-connection -> ffn_norm -> MoE (hash or top-k routing, clamped SwiGLU) ->
//! expand + mix] -> hyper head (collapse) -> norm -> lm_head.

use crate::config::{ModelConfig, V4Scoring};
use crate::error::{Error, Result};
use crate::kernels::{for_each_row, matmul, matmul_f32, matrix_row_f32, rms_norm, Matrix};
use crate::kv::KvCache;
use crate::model::batch::SeqChunk;
use crate::model::forward::{flatten, logit_rows, norm_rows, ForwardOut};
use crate::model::weights::{Expert, Model};

use super::attention::v4_attention;
use super::{HcHead, HyperConn, V4Ffn, V4Layer, V4Model};

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's softplus (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Unweighted RMSNorm of every row of `x` (row width `w`), flattened streams. -> [n, w]
fn unweighted_norm(x: &[f32], w: usize, eps: f32) -> Vec<f32> {
    let ones = vec![1f32; w];
    let mut out = vec![0f32; x.len()];
    for_each_row(&mut out, w, x.len(), |i, o| {
        rms_norm(&x[i * w..(i + 1) * w], &ones, eps, o)
    });
    out
}

/// One hyper-connection: returns (post [n, N], comb [n, N, N] (comb[j][k] mixes input stream j
/// into output stream k), collapsed [n, hidden]). x: [n, N, hidden].
#[allow(clippy::too_many_arguments)]
fn hyper(
    hc: &HyperConn,
    x: &[f32],
    n: usize,
    nh: usize,
    h: usize,
    iters: usize,
    hc_eps: f32,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let m = (2 + nh) * nh;
    let flat = unweighted_norm(x, nh * h, eps); // [n, N * hidden]
    let mut mixes = vec![0f32; n * m]; // [n, (2 + N) * N]
    matmul_f32(&hc.fn_w, m, nh * h, &flat, n, &mut mixes);
    let mut post = vec![0f32; n * nh];
    let mut comb = vec![0f32; n * nh * nh];
    let mut collapsed = vec![0f32; n * h];
    for t in 0..n {
        let mx = &mixes[t * m..(t + 1) * m];
        let pre: Vec<f32> = (0..nh)
            .map(|j| sigmoid(mx[j] * hc.scale[0] + hc.base[j]) + hc_eps)
            .collect();
        for k in 0..nh {
            post[t * nh + k] = 2.0 * sigmoid(mx[nh + k] * hc.scale[1] + hc.base[nh + k]);
        }
        let c = &mut comb[t * nh * nh..(t + 1) * nh * nh];
        for j in 0..nh {
            let row = &mut c[j * nh..(j + 1) * nh];
            for (k, v) in row.iter_mut().enumerate() {
                *v = mx[2 * nh + j * nh + k] * hc.scale[2] + hc.base[2 * nh + j * nh + k];
            }
            let rmax = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut s = 0f32;
            for v in row.iter_mut() {
                *v = (*v - rmax).exp();
                s += *v;
            }
            for v in row.iter_mut() {
                *v = *v / s + hc_eps;
            }
        }
        let col_norm = |c: &mut [f32]| {
            for k in 0..nh {
                let s: f32 = (0..nh).map(|j| c[j * nh + k]).sum::<f32>() + hc_eps;
                (0..nh).for_each(|j| c[j * nh + k] /= s);
            }
        };
        let row_norm = |c: &mut [f32]| {
            for j in 0..nh {
                let s: f32 = c[j * nh..(j + 1) * nh].iter().sum::<f32>() + hc_eps;
                c[j * nh..(j + 1) * nh].iter_mut().for_each(|v| *v /= s);
            }
        };
        col_norm(c);
        for _ in 1..iters {
            row_norm(c);
            col_norm(c);
        }
        let out = &mut collapsed[t * h..(t + 1) * h];
        for (j, p) in pre.iter().enumerate() {
            let xs = &x[(t * nh + j) * h..(t * nh + j + 1) * h];
            out.iter_mut().zip(xs).for_each(|(o, v)| *o += p * v);
        }
    }
    (post, comb, collapsed)
}

/// x[t, k] <- post[t, k] * y[t] + sum_j comb[t, j, k] * x[t, j].
fn mix(x: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize, nh: usize, h: usize) {
    for t in 0..n {
        let old = x[t * nh * h..(t + 1) * nh * h].to_vec(); // [N, hidden]
        for k in 0..nh {
            let o = &mut x[(t * nh + k) * h..(t * nh + k + 1) * h];
            let pk = post[t * nh + k];
            for (d, v) in o.iter_mut().enumerate() {
                let mut acc = pk * y[t * h + d];
                for j in 0..nh {
                    acc += comb[t * nh * nh + j * nh + k] * old[j * h + d];
                }
                *v = acc;
            }
        }
    }
}

/// SwiGLU with V4's clamp: down(silu(min(gate, l)) * clamp(up, -l, l)). x: [m, hidden] -> [m, hidden]
fn clamped_mlp(e: &Expert, x: &[f32], m: usize, limit: f32) -> Vec<f32> {
    let inter = e.gate.rows;
    let mut g = vec![0f32; m * inter];
    let mut u = vec![0f32; m * inter];
    matmul(&e.gate, x, m, &mut g);
    matmul(&e.up, x, m, &mut u);
    for (gv, uv) in g.iter_mut().zip(&u) {
        let gc = gv.min(limit);
        let uc = uv.clamp(-limit, limit);
        *gv = gc * sigmoid(gc) * uc;
    }
    let mut y = vec![0f32; m * e.down.rows];
    matmul(&e.down, &g, m, &mut y);
    y
}

/// V4 MoE over the batch. x: [n, hidden], tokens: [n] -> ([n, hidden], routed weight bytes read)
fn v4_moe(cfg: &ModelConfig, f: &V4Ffn, x: &[f32], tokens: &[u32]) -> (Vec<f32>, usize) {
    let v = cfg.v4.as_ref().expect("V4 config");
    let (n, h, e, k) = (
        tokens.len(),
        cfg.hidden_size,
        v.n_routed_experts,
        v.num_experts_per_tok,
    );
    let mut logits = vec![0f32; n * e]; // [n, E]
    matmul_f32(&f.gate, e, h, x, n, &mut logits);
    let mut chosen: Vec<Vec<(usize, f32)>> = Vec::with_capacity(n); // per token (expert, weight)
    for t in 0..n {
        let scores: Vec<f32> = logits[t * e..(t + 1) * e]
            .iter()
            .map(|&l| match v.scoring {
                V4Scoring::SqrtSoftplus => softplus(l).sqrt(),
                V4Scoring::Sigmoid => sigmoid(l),
            })
            .collect();
        let idx: Vec<usize> = match (&f.tid2eid, &f.bias) {
            (Some(tab), _) => tab[tokens[t] as usize * k..(tokens[t] as usize + 1) * k]
                .iter()
                .map(|&i| i as usize)
                .collect(),
            (None, bias) => {
                let choice: Vec<f32> = scores
                    .iter()
                    .enumerate()
                    .map(|(i, s)| s + bias.as_ref().map_or(0.0, |b| b[i]))
                    .collect();
                crate::model::moe::top_k_desc(&choice, k)
            }
        };
        let den: f32 = idx.iter().map(|&i| scores[i]).sum::<f32>() + 1e-20;
        let mut c: Vec<(usize, f32)> = idx
            .iter()
            .map(|&i| (i, scores[i] / den * v.routed_scaling_factor))
            .collect();
        c.sort_by_key(|&(i, _)| i);
        chosen.push(c);
    }
    let mut y = vec![0f32; n * h]; // [n, hidden]
    let mut bytes = 0;
    for ex in 0..e {
        let users: Vec<(usize, f32)> = chosen
            .iter()
            .enumerate()
            .flat_map(|(t, c)| {
                c.iter()
                    .filter(|(i, _)| *i == ex)
                    .map(move |&(_, w)| (t, w))
            })
            .collect();
        if users.is_empty() {
            continue;
        }
        bytes += f.experts[ex].nbytes();
        let mut xin = Vec::with_capacity(users.len() * h);
        for &(t, _) in &users {
            xin.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        let out = clamped_mlp(&f.experts[ex], &xin, users.len(), v.swiglu_limit);
        for (j, &(t, w)) in users.iter().enumerate() {
            y[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&out[j * h..(j + 1) * h])
                .for_each(|(a, b)| *a += b * w);
        }
    }
    let shared = clamped_mlp(&f.shared, x, n, v.swiglu_limit);
    y.iter_mut().zip(&shared).for_each(|(a, b)| *a += b);
    (y, bytes)
}

/// The V4 forward (see the module doc); same contract as `Model::forward_out`.
pub(crate) fn v4_forward(
    model: &Model,
    v4: &V4Model,
    kv: &mut KvCache,
    chunks: &[SeqChunk],
    want_hidden: bool,
) -> Result<ForwardOut> {
    let cfg = &model.config;
    let v = cfg.v4.as_ref().expect("V4 config");
    let (h, vocab, nh) = (cfg.hidden_size, cfg.vocab_size, v.hc_mult);
    let eps = cfg.rms_norm_eps;
    let (tokens, pos) = flatten(chunks, vocab)?; // [n], [n]
    let n = tokens.len();
    if n == 0 {
        return Ok(ForwardOut::empty());
    }
    let mut bytes = model.embedding_bytes(n);
    let mut x = vec![0f32; n * nh * h]; // [n, N, hidden]
    for_each_row(&mut x, nh * h, n * h, |i, row| {
        matrix_row_f32(&model.embed, tokens[i] as usize, &mut row[..h]);
        let (first, rest) = row.split_at_mut(h);
        for s in rest.chunks_exact_mut(h) {
            s.copy_from_slice(first);
        }
    });
    let mut xn = vec![0f32; n * h]; // [n, hidden]
    for (li, layer) in v4.layers.iter().enumerate() {
        bytes += block(
            cfg, v4, layer, li, &mut x, &mut xn, &tokens, &pos, chunks, kv,
        ) as u64;
    }
    bytes += v4.decode_bytes_per_token(0) as u64;
    // Hyper head: collapse the streams, then the model norm.
    let col = collapse(&v4.hc_head, &x, n, nh, h, v.hc_eps, eps); // [n, hidden]
    let logits = head_logits(model.lm_head(), &model.norm, &col, chunks, h, vocab, eps);
    if !logits.is_empty() {
        bytes += model.lm_head().nbytes() as u64;
    }
    Ok(ForwardOut {
        logits,
        // The MTP layer's input: the residual streams before the hyper head.
        hidden: if want_hidden { x } else { Vec::new() },
        weight_bytes: bytes,
    })
}

/// One decoder block over the streams `x` [n, N, hidden] in place (xn: [n, hidden] scratch):
/// attn hyper-connection -> attn_norm -> attention (layer `li` of `cfg`'s cache layout) ->
/// expand + mix; ffn hyper-connection -> ffn_norm -> MoE -> expand + mix. Returns the routed
/// expert bytes read.
#[allow(clippy::too_many_arguments)]
fn block(
    cfg: &ModelConfig,
    v4: &V4Model,
    layer: &V4Layer,
    li: usize,
    x: &mut [f32],
    xn: &mut [f32],
    tokens: &[u32],
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
) -> usize {
    let v = cfg.v4.as_ref().expect("V4 config");
    let (n, h, nh) = (pos.len(), cfg.hidden_size, v.hc_mult);
    let (iters, hc_eps, eps) = (v.hc_sinkhorn_iters, v.hc_eps, cfg.rms_norm_eps);
    let (post, comb, col) = hyper(&layer.attn_hc, x, n, nh, h, iters, hc_eps, eps);
    norm_rows(&col, &layer.attn_norm, eps, xn);
    let a = v4_attention(cfg, v4, layer, li, xn, pos, chunks, kv);
    mix(x, &a, &post, &comb, n, nh, h);
    let (post, comb, col) = hyper(&layer.ffn_hc, x, n, nh, h, iters, hc_eps, eps);
    norm_rows(&col, &layer.ffn_norm, eps, xn);
    let (y, b) = v4_moe(cfg, &layer.ffn, xn, tokens);
    mix(x, &y, &post, &comb, n, nh, h);
    b
}

/// A hyper head: the streams x [n, N, hidden] collapsed by sigmoid weights. -> [n, hidden]
fn collapse(
    hh: &HcHead,
    x: &[f32],
    n: usize,
    nh: usize,
    h: usize,
    hc_eps: f32,
    eps: f32,
) -> Vec<f32> {
    let flat = unweighted_norm(x, nh * h, eps); // [n, N * hidden]
    let mut mixes = vec![0f32; n * nh]; // [n, N]
    matmul_f32(&hh.fn_w, nh, nh * h, &flat, n, &mut mixes);
    let mut col = vec![0f32; n * h]; // [n, hidden]
    for t in 0..n {
        for j in 0..nh {
            let p = sigmoid(mixes[t * nh + j] * hh.scale + hh.base[j]) + hc_eps;
            let xs = &x[(t * nh + j) * h..(t * nh + j + 1) * h];
            col[t * h..(t + 1) * h]
                .iter_mut()
                .zip(xs)
                .for_each(|(o, v)| *o += p * v);
        }
    }
    col
}

/// Logits of the rows the chunks ask for: head(norm(col[row])). col: [n, hidden] ->
/// [n_rows, vocab]
fn head_logits(
    head: &Matrix,
    norm: &[f32],
    col: &[f32],
    chunks: &[SeqChunk],
    h: usize,
    vocab: usize,
    eps: f32,
) -> Vec<f32> {
    let rows = logit_rows(chunks);
    let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
    for_each_row(&mut hs, h, rows.len() * h, |i, o| {
        rms_norm(&col[rows[i] * h..(rows[i] + 1) * h], norm, eps, o)
    });
    let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
    if !rows.is_empty() {
        matmul(head, &hs, rows.len(), &mut logits);
    }
    logits
}

/// V4 MTP layer `m` over a ragged batch (see `V4Mtp`): `chunks[i].tokens` are t_{j+1} at
/// positions j = start.., `prev` the matching residual streams h_j [n, N * hidden] (the target's,
/// or this layer's own output when chaining). Writes the layer's one-layer cache (laid out by
/// `KvConfig::for_mtp`) and returns (logits of the rows the chunks ask for [n_rows, vocab], every
/// row's output streams [n, N * hidden]). `zero_embed[i]`: row i sits at the absolute position
/// 0 (its embedding is zeroed; see `Model::mtp_forward_counted`).
pub(crate) fn v4_mtp_forward(
    model: &Model,
    v4: &V4Model,
    m: usize,
    kv: &mut KvCache,
    chunks: &[SeqChunk],
    prev: &[f32],
    zero_embed: &[bool],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mtp = v4
        .mtp
        .get(m)
        .ok_or_else(|| Error::InvalidArgument(format!("model has no MTP layer {m}")))?;
    let cfg = model.config.mtp_view(m);
    let v = cfg.v4.as_ref().expect("V4 config");
    let (h, vocab, nh, eps) = (cfg.hidden_size, cfg.vocab_size, v.hc_mult, cfg.rms_norm_eps);
    if !kv.config().matches(&cfg, 1) {
        return Err(Error::InvalidArgument(
            "MTP KV cache layout does not match the model's MTP layer".into(),
        ));
    }
    let (tokens, pos) = flatten(chunks, vocab)?; // [n], [n]
    let n = tokens.len();
    if prev.len() != n * nh * h {
        return Err(Error::InvalidArgument(format!(
            "MTP forward: {} hidden values for {n} tokens of {nh} streams of width {h}",
            prev.len()
        )));
    }
    if n == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut en = vec![0f32; n * h]; // [n, hidden]: enorm(embed(t)), zero embedding at position 0
    for_each_row(&mut en, h, n * h, |i, o| {
        let mut e = vec![0f32; h]; // [hidden]
        if !zero_embed[i] {
            matrix_row_f32(&model.embed, tokens[i] as usize, &mut e);
        }
        rms_norm(&e, &mtp.enorm, eps, o)
    });
    let mut ep = vec![0f32; n * h]; // [n, hidden]
    matmul(&mtp.e_proj, &en, n, &mut ep);
    let mut hn = vec![0f32; n * nh * h]; // [n * N, hidden]: hnorm of every stream
    norm_rows(prev, &mtp.hnorm, eps, &mut hn);
    let mut x = vec![0f32; n * nh * h]; // [n, N, hidden]
    matmul(&mtp.h_proj, &hn, n * nh, &mut x);
    for (t, xt) in x.chunks_exact_mut(nh * h).enumerate() {
        for s in xt.chunks_exact_mut(h) {
            s.iter_mut()
                .zip(&ep[t * h..(t + 1) * h])
                .for_each(|(a, b)| *a += b);
        }
    }
    let mut xn = vec![0f32; n * h]; // [n, hidden] scratch
    block(
        &cfg, v4, &mtp.block, 0, &mut x, &mut xn, &tokens, &pos, chunks, kv,
    );
    let col = collapse(&mtp.hc_head, &x, n, nh, h, v.hc_eps, eps); // [n, hidden]
    let head = mtp.head.as_ref().unwrap_or(model.lm_head());
    let logits = head_logits(head, &mtp.norm, &col, chunks, h, vocab, eps);
    Ok((logits, x))
}

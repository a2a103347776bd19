//! The V4 forward over a ragged batch: embed -> hc_mult copies of each token (the residual
//! streams) -> per layer [attn hyper-connection (collapse) -> attn_norm -> attention -> expand +
//! mix; ffn hyper-connection -> ffn_norm -> MoE (hash or top-k routing, clamped SwiGLU) ->
//! expand + mix] -> hyper head (collapse) -> norm -> lm_head.

use crate::config::{ModelConfig, V4Scoring};
use crate::error::Result;
use crate::kernels::{for_each_row, matmul, matmul_f32, matrix_row_f32, rms_norm};
use crate::kv::KvCache;
use crate::model::batch::SeqChunk;
use crate::model::forward::{flatten, logit_rows, norm_rows, ForwardOut};
use crate::model::weights::{Expert, Model};

use super::attention::v4_attention;
use super::{HyperConn, V4Ffn, V4Model};

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
    let mut bytes = (n * model.embed.nbytes() / model.embed.rows.max(1)) as u64;
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
        let (post, comb, col) = hyper(
            &layer.attn_hc,
            &x,
            n,
            nh,
            h,
            v.hc_sinkhorn_iters,
            v.hc_eps,
            eps,
        );
        norm_rows(&col, &layer.attn_norm, eps, &mut xn);
        let a = v4_attention(cfg, v4, layer, li, &xn, &pos, chunks, kv);
        mix(&mut x, &a, &post, &comb, n, nh, h);
        let (post, comb, col) = hyper(
            &layer.ffn_hc,
            &x,
            n,
            nh,
            h,
            v.hc_sinkhorn_iters,
            v.hc_eps,
            eps,
        );
        norm_rows(&col, &layer.ffn_norm, eps, &mut xn);
        let (y, b) = v4_moe(cfg, &layer.ffn, &xn, &tokens);
        bytes += b as u64;
        mix(&mut x, &y, &post, &comb, n, nh, h);
    }
    bytes += v4.decode_bytes_per_token(0) as u64;
    // Hyper head: collapse the streams, then the model norm.
    let hh = &v4.hc_head;
    let flat = unweighted_norm(&x, nh * h, eps); // [n, N * hidden]
    let mut mixes = vec![0f32; n * nh]; // [n, N]
    matmul_f32(&hh.fn_w, nh, nh * h, &flat, n, &mut mixes);
    let mut col = vec![0f32; n * h]; // [n, hidden]
    for t in 0..n {
        for j in 0..nh {
            let p = sigmoid(mixes[t * nh + j] * hh.scale + hh.base[j]) + v.hc_eps;
            let xs = &x[(t * nh + j) * h..(t * nh + j + 1) * h];
            col[t * h..(t + 1) * h]
                .iter_mut()
                .zip(xs)
                .for_each(|(o, v)| *o += p * v);
        }
    }
    let mut hidden = vec![0f32; n * h]; // [n, hidden]
    norm_rows(&col, &model.norm, eps, &mut hidden);
    let rows = logit_rows(chunks);
    let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
    for (i, &r) in rows.iter().enumerate() {
        hs[i * h..(i + 1) * h].copy_from_slice(&hidden[r * h..(r + 1) * h]);
    }
    let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
    if !rows.is_empty() {
        matmul(model.lm_head(), &hs, rows.len(), &mut logits);
        bytes += model.lm_head().nbytes() as u64;
    }
    Ok(ForwardOut {
        logits,
        hidden: if want_hidden { hidden } else { Vec::new() },
        weight_bytes: bytes,
    })
}

//! Feed-forward blocks: the dense SwiGLU MLP and the mixture of experts with shared experts.
//!
//! Router (per token, f32): scores = softmax or sigmoid(x W_g^T); selection on scores + bias
//! (noaux_tc) with group limiting (noaux_tc: group score = sum of the top-2; group_limited_greedy:
//! max), top-k with ties to the lower expert id; weights = unbiased scores of the chosen experts,
//! normalised / scaled as the reference does (V3: normalise if norm_topk_prob, then
//! x routed_scaling_factor; V2: normalise if norm_topk_prob and k > 1, else x routed_scaling_factor).
//! y = shared(x) + sum over the chosen experts in ascending expert id of w_e expert_e(x).
//! Per token, every sum has a fixed order, so the result does not depend on which other tokens
//! were routed to the same experts.

use crate::config::{ModelType, MoeConfig, ScoringFunc, TopkMethod};
use crate::kernels::{
    map_indices, matmul, matmul_f32, matmul_many, silu_mul, with_thread_scratch, worth_parallel,
};

use super::weights::{Expert, Moe};

/// down(silu(gate(x)) * up(x)). x: [n, hidden] -> [n, hidden].
/// Tokens per pass of an MLP: its [n, inter] intermediates stay bounded for long prompts.
const MLP_TOKEN_CHUNK: usize = 512;

pub(crate) fn mlp(e: &Expert, x: &[f32], n: usize) -> Vec<f32> {
    if n > MLP_TOKEN_CHUNK {
        // Long prompts: bounded intermediates (rows are independent, so the bits are the same).
        let h = e.gate.cols;
        let mut y = Vec::with_capacity(n * e.down.rows); // [n, hidden]
        for t0 in (0..n).step_by(MLP_TOKEN_CHUNK) {
            let m = MLP_TOKEN_CHUNK.min(n - t0);
            y.extend(mlp(e, &x[t0 * h..(t0 + m) * h], m));
        }
        return y;
    }
    let mut y = vec![0f32; n * e.down.rows]; // [n, hidden]
    let mut run = |s: &mut MlpScratch| {
        let len = n * e.gate.rows;
        s.grow(len);
        let (g, u, act) = (&mut s.g[..len], &mut s.u[..len], &mut s.act[..len]); // [n, inter] each
        if n == 1 {
            // one token: gate and up in one parallel pass (one fork-join; same bits)
            matmul_many(vec![(&e.gate, x, g), (&e.up, x, u)]);
        } else {
            matmul(&e.gate, x, n, g);
            matmul(&e.up, x, n, u);
        }
        silu_mul(g, u, act);
        matmul(&e.down, act, n, &mut y);
    };
    if n * e.gate.rows > MLP_SCRATCH_KEEP {
        // past the cap: fresh buffers, so no thread keeps hundreds of MB after a prefill
        run(&mut MlpScratch::default());
        return y;
    }
    with_thread_scratch(&MLP_SCRATCH, run);
    y
}

/// Largest [n, inter] a thread keeps in its [`MlpScratch`] (floats per buffer: 64 MB, so at most
/// 192 MB per thread that runs forwards): a whole prompt chunk ([`MLP_TOKEN_CHUNK`] tokens) of
/// an MLP up to 32K wide. Fresh buffers per chunk (the cap was 4 MB) cost the widened target's
/// prefill 188 MB of newly faulted, kernel-zeroed pages per 512 tokens (`clear_page_erms` was
/// the second-largest symbol of a prefill profile); kept, prefill measured 1.06-1.11x at 512
/// tokens and 1.05-1.09x at 2048 (four alternated pairs; BENCHMARKS.md "Prefill: the MLP
/// scratch kept"), peak RSS +32 MB in the bench, +67 MB generating after a 512-token prompt.
const MLP_SCRATCH_KEEP: usize = 1 << 24;

/// Per-thread intermediates of [`mlp`] ([n, inter] gate, up and activation), kept for the
/// next call: a wide MLP's are hundreds of KB to tens of MB (16 x 12288 floats at batch 16,
/// 512 x 12288 per prompt chunk), which fresh vectors got from the OS as zeroed pages every
/// call (page faults and fills were ~2 % of a batch-16 step). Never read before written.
#[derive(Default)]
struct MlpScratch {
    g: Vec<f32>,
    u: Vec<f32>,
    act: Vec<f32>,
}

impl MlpScratch {
    fn grow(&mut self, len: usize) {
        for v in [&mut self.g, &mut self.u, &mut self.act] {
            if v.len() < len {
                v.resize(len, 0.0);
            }
        }
    }
}

thread_local! {
    static MLP_SCRATCH: std::cell::RefCell<MlpScratch> = std::cell::RefCell::new(MlpScratch::default());
}

/// Expert choice of one token: (expert ids ascending, weights).
pub(crate) fn route(
    cfg: &MoeConfig,
    model_type: ModelType,
    logits: &[f32],
    bias: Option<&[f32]>,
) -> Vec<(usize, f32)> {
    let ne = logits.len();
    let scores: Vec<f32> = match cfg.scoring_func {
        ScoringFunc::Sigmoid => logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
        ScoringFunc::Softmax => {
            let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&l| (l - mx).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
    };
    let mut choice: Vec<f32> = match (cfg.topk_method, bias) {
        (TopkMethod::NoauxTc, Some(b)) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        _ => scores.clone(),
    };
    let ng = cfg.n_group.max(1);
    if !matches!(cfg.topk_method, TopkMethod::Greedy) && ng > 1 {
        let per = ne / ng;
        let gscore: Vec<f32> = (0..ng)
            .map(|g| {
                let grp = &choice[g * per..(g + 1) * per];
                match cfg.topk_method {
                    TopkMethod::NoauxTc => {
                        let top = top_k_desc(grp, 2.min(per));
                        top.iter().map(|&i| grp[i]).sum()
                    }
                    _ => grp.iter().cloned().fold(f32::NEG_INFINITY, f32::max),
                }
            })
            .collect();
        let keep = top_k_desc(&gscore, cfg.topk_group.min(ng));
        for g in 0..ng {
            if !keep.contains(&g) {
                choice[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
            }
        }
    }
    let mut idx = top_k_desc(&choice, cfg.num_experts_per_tok);
    idx.sort_unstable();
    let mut w: Vec<f32> = idx.iter().map(|&i| scores[i]).collect();
    let k = idx.len();
    let normalise = match model_type {
        ModelType::DeepseekV3 | ModelType::DeepseekV32 | ModelType::DeepseekV4 => {
            cfg.norm_topk_prob
        }
        ModelType::DeepseekV2 => cfg.norm_topk_prob && k > 1,
    };
    if normalise {
        let den: f32 = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| *x /= den);
    }
    if model_type.is_v3_family() || !normalise {
        w.iter_mut().for_each(|x| *x *= cfg.routed_scaling_factor);
    }
    idx.into_iter().zip(w).collect()
}

/// Indices of the k largest values, largest first, ties to the lower index (also V4's router
/// and CSA indexer selection).
pub(super) fn top_k_desc(v: &[f32], k: usize) -> Vec<usize> {
    // NaN (a corrupted router weight or activation) ranks below every number: `partial_cmp`
    // with NaN is no total order, and the standard sort panics on one (found by fuzzing).
    // For numbers the order is unchanged.
    let key = |i: usize| {
        if v[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            v[i]
        }
    };
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        key(b)
            .partial_cmp(&key(a))
            .expect("no NaN keys")
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

/// MoE block. x: [n, hidden] -> ([n, hidden], weight bytes read: router, shared experts and
/// the union of the routed experts the tokens selected — each read once for all its tokens).
pub(crate) fn moe(
    m: &Moe,
    cfg: &MoeConfig,
    model_type: ModelType,
    x: &[f32],
    n: usize,
) -> (Vec<f32>, usize) {
    let ne = m.experts.len();
    let h = x.len() / n.max(1);
    let mut logits = vec![0f32; n * ne]; // [n, n_routed]
    matmul_f32(&m.gate, ne, h, x, n, &mut logits);
    let routes: Vec<Vec<(usize, f32)>> = (0..n)
        .map(|t| {
            route(
                cfg,
                model_type,
                &logits[t * ne..(t + 1) * ne],
                m.bias.as_deref(),
            )
        })
        .collect();
    // tokens per expert: (token, slot)
    let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
    for (t, r) in routes.iter().enumerate() {
        for (s, &(e, _)) in r.iter().enumerate() {
            per_expert[e].push((t, s));
        }
    }
    let k = cfg.num_experts_per_tok;
    let active: Vec<usize> = (0..ne).filter(|&e| !per_expert[e].is_empty()).collect();
    let bytes = weight_bytes(m, &active);
    if n == 1 {
        return (moe_one_token(m, &routes[0], x), bytes);
    }
    let work = n * k * 3 * h * cfg.moe_intermediate_size; // multiply-adds of all routed experts
    let routed_experts = || {
        map_indices(active.len(), work, |ai| {
            let toks = &per_expert[active[ai]];
            let mut xe = vec![0f32; toks.len() * h]; // [n_e, hidden]
            for (i, &(t, _)) in toks.iter().enumerate() {
                xe[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
            }
            mlp(&m.experts[active[ai]], &xe, toks.len())
        })
    };
    // The shared experts beside the routed ones: with several tokens the shared experts'
    // products are compute-bound (every token through one wide MLP) while each routed expert
    // sees a few tokens and streams its weights, so running them side by side keeps the memory
    // busy while the other core multiplies. Each product is computed as it would be alone
    // (thread- and batch-invariant kernels), and they are summed below in the fixed order.
    // outs: per active expert [n_e, hidden]; shared: [n, hidden]
    let (outs, shared): (Vec<Vec<f32>>, Option<Vec<f32>>) = match &m.shared {
        Some(sh) if worth_parallel(work) => {
            let (o, s) = rayon::join(routed_experts, || mlp(sh, x, n));
            (o, Some(s))
        }
        Some(sh) => (routed_experts(), Some(mlp(sh, x, n))),
        None => (routed_experts(), None),
    };
    let mut slots = vec![0f32; n * k * h]; // [n, k, hidden]
    for (ai, &e) in active.iter().enumerate() {
        for (i, &(t, s)) in per_expert[e].iter().enumerate() {
            slots[(t * k + s) * h..(t * k + s + 1) * h]
                .copy_from_slice(&outs[ai][i * h..(i + 1) * h]);
        }
    }
    // Reference order: routed sum first, then + shared.
    let mut y = shared.unwrap_or_else(|| vec![0f32; n * h]); // [n, hidden]
    let mut routed = vec![0f32; h]; // [hidden]
    for t in 0..n {
        routed.fill(0.0);
        for (s, &(_, w)) in routes[t].iter().enumerate() {
            let o = &slots[(t * k + s) * h..(t * k + s + 1) * h];
            for (r, v) in routed.iter_mut().zip(o) {
                *r += w * v;
            }
        }
        for (yv, r) in y[t * h..(t + 1) * h].iter_mut().zip(&routed) {
            *yv += r;
        }
    }
    (y, bytes)
}

/// Weight bytes a MoE block reads for tokens that selected the `active` experts: the router,
/// the shared experts and each active routed expert once (every backend counts it so).
pub(crate) fn weight_bytes(m: &Moe, active: &[usize]) -> usize {
    m.gate.len() * 4
        + m.shared.as_ref().map_or(0, Expert::nbytes)
        + active.iter().map(|&e| m.experts[e].nbytes()).sum::<usize>()
}

/// `moe` for one token (decode): the routed and shared experts' gate and up projections run as
/// one batched GEMV pass, then their down projections as another (same kernels, same bits as
/// `mlp` per expert); the outputs combine in the same order as the general path.
fn moe_one_token(m: &Moe, route: &[(usize, f32)], x: &[f32]) -> Vec<f32> {
    let h = x.len();
    let experts: Vec<&Expert> = route
        .iter()
        .map(|&(e, _)| &m.experts[e])
        .chain(m.shared.as_ref())
        .collect();
    let mut gates: Vec<Vec<f32>> = experts.iter().map(|e| vec![0f32; e.gate.rows]).collect(); // [inter] each
    let mut ups: Vec<Vec<f32>> = experts.iter().map(|e| vec![0f32; e.up.rows]).collect(); // [inter] each
    let mut items = Vec::with_capacity(2 * experts.len());
    for ((e, g), u) in experts.iter().zip(gates.iter_mut()).zip(ups.iter_mut()) {
        items.push((&e.gate, x, &mut g[..]));
        items.push((&e.up, x, &mut u[..]));
    }
    matmul_many(items);
    let acts: Vec<Vec<f32>> = gates
        .iter()
        .zip(&ups)
        .map(|(g, u)| {
            let mut a = vec![0f32; g.len()]; // [inter]
            silu_mul(g, u, &mut a);
            a
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = experts.iter().map(|_| vec![0f32; h]).collect(); // [hidden] each
    matmul_many(
        experts
            .iter()
            .zip(&acts)
            .zip(outs.iter_mut())
            .map(|((e, a), o)| (&e.down, &a[..], &mut o[..]))
            .collect(),
    );
    let mut y = if m.shared.is_some() {
        outs.pop().expect("shared output")
    } else {
        vec![0f32; h]
    };
    // Reference order: routed sum first, then + shared.
    let mut routed = vec![0f32; h]; // [hidden]
    for (o, &(_, w)) in outs.iter().zip(route) {
        for (r, v) in routed.iter_mut().zip(o) {
            *r += w * v;
        }
    }
    for (yv, r) in y.iter_mut().zip(&routed) {
        *yv += r;
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(
        method: TopkMethod,
        scoring: ScoringFunc,
        ng: usize,
        tg: usize,
        k: usize,
        norm: bool,
    ) -> MoeConfig {
        MoeConfig {
            n_routed_experts: 8,
            n_shared_experts: 1,
            num_experts_per_tok: k,
            n_group: ng,
            topk_group: tg,
            topk_method: method,
            scoring_func: scoring,
            norm_topk_prob: norm,
            routed_scaling_factor: 2.5,
            moe_intermediate_size: 4,
            first_k_dense_replace: 0,
            moe_layer_freq: 1,
        }
    }

    #[test]
    fn noaux_tc_bias_changes_selection_but_not_weights() {
        let c = cfg(TopkMethod::NoauxTc, ScoringFunc::Sigmoid, 1, 1, 2, true);
        let logits = [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0];
        let r = route(&c, ModelType::DeepseekV3, &logits, None);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        let mut bias = [0f32; 8];
        bias[7] = 10.0;
        let r = route(&c, ModelType::DeepseekV3, &logits, Some(&bias));
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 7]);
        // weights from unbiased sigmoid, normalised, times 2.5
        let s0 = 1.0 / (1.0 + (-3.0f32).exp());
        let s7 = 1.0 / (1.0 + 4.0f32.exp());
        assert!((r[0].1 - 2.5 * s0 / (s0 + s7)).abs() < 1e-6);
        assert!((r[0].1 + r[1].1 - 2.5).abs() < 1e-5);
    }

    #[test]
    fn group_limits_exclude_groups() {
        // 4 groups of 2; group 0 has the single best expert but group 1 has the best pair.
        let c = cfg(TopkMethod::NoauxTc, ScoringFunc::Sigmoid, 4, 1, 2, false);
        let logits = [5.0, -5.0, 4.0, 4.0, 0.0, 0.0, -1.0, -1.0];
        let r = route(&c, ModelType::DeepseekV3, &logits, None);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 3]);
        // group_limited_greedy uses the max per group: group 0 wins
        let c = cfg(
            TopkMethod::GroupLimitedGreedy,
            ScoringFunc::Softmax,
            4,
            1,
            2,
            false,
        );
        let r = route(&c, ModelType::DeepseekV2, &logits, None);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn v2_greedy_scales_without_normalising() {
        let c = cfg(TopkMethod::Greedy, ScoringFunc::Softmax, 1, 1, 2, false);
        let logits = [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let r = route(&c, ModelType::DeepseekV2, &logits, None);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert_eq!(r[0].0, 0);
        assert!((r[0].1 - 2.5 * 1f32.exp() / z).abs() < 1e-6);
        assert!((r[1].1 - 2.5 * 2f32.exp() / z).abs() < 1e-6);
    }
}

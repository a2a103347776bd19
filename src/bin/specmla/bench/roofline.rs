//! The decode steps' roofline counting FLOPs as well as bytes, for the speculation bench.
//!
//! The bench's first roofline (the formula) charges a step its weight bytes only: right
//! while every product streams its weights faster than the cores multiply them. A product of
//! n tokens over bf16 weights does n FLOP per byte read; past the machine's balance (peak FLOP/s
//! over read bytes/s: ~12 tokens on a 2-core Zen 4, 467 GFLOP/s of `vdpbf16ps` over ~37 GB/s)
//! it is bound by the multiply-adds. A batch-16 step's dense MLP and shared experts are past it
//! (16 tokens; 32 with one draft each), its routed experts (a few tokens each) are not. Here each
//! part of a step is charged max(bytes / bandwidth, FLOPs / peak) — per step for the products
//! every token goes through (their n is the step's), summed over the run for the routed experts
//! and the drafter (few tokens per weight: bound by the bytes either way) — with the machine's
//! bandwidth and peak measured by the kernels' probes (`kernels::measure_read_bandwidth`,
//! `kernels::measure_peak_dot_flops`). The attention over the context (scores and the weighted
//! sum: the KV bytes and their FLOPs) is left out, as in the bytes-only roofline: at the bench's
//! ~100-token contexts it is a few percent of a step.
//!
//! Guarantee: counts and probes only; nothing here changes what the engine computes.

use specmla::engine::{DecodeSteps, EngineStats};
use specmla::model::{Ffn, Model, TokenWork};

/// What the machine streams and multiplies with the engine's thread count.
#[derive(Clone, Copy, Debug)]
pub(super) struct Machine {
    /// Streaming-read bandwidth, bytes/s.
    pub read_bytes_s: f64,
    /// Peak FLOP/s of the bf16 matmuls' multiply-adds.
    pub dot_flop_s: f64,
}

impl Machine {
    /// Tokens per bf16 weight at which a product is as much bound by its multiply-adds as by
    /// its bytes (2 FLOP per multiply-add over 2 bytes per weight).
    pub fn balance_tokens(&self) -> f64 {
        self.dot_flop_s / self.read_bytes_s.max(1.0)
    }
}

/// The drafter's side of a run's decode steps: its counted weight bytes, the tokens it drafted
/// and one token's work through it (`None`: no model, as the n-gram drafter).
pub(super) struct DraftSide<'a> {
    pub weight_bytes: u64,
    pub tokens: f64,
    pub work: Option<&'a TokenWork>,
}

/// Ideal seconds of a run's decode-only steps on machine `m`: per step, the target's
/// every-token products at max(bytes / bandwidth, 2 n macs / peak) for the step's n tokens; the
/// rest of the target's counted bytes (the routed experts the tokens selected, embedding rows)
/// and the drafter's at max(bytes / bandwidth, FLOPs / peak) over the run.
pub(super) fn ideal_decode_s(
    d: &DecodeSteps,
    target: &TokenWork,
    draft: &DraftSide,
    m: &Machine,
) -> f64 {
    let (bw, peak) = (m.read_bytes_s.max(1.0), m.dot_flop_s.max(1.0));
    let e = target.every_token;
    let mut t = 0.0;
    let mut tokens = 0.0;
    let mut every_bytes = 0.0;
    for (n, &steps) in d.steps_by_tokens.iter().enumerate() {
        let s = steps as f64;
        let stream = e.bytes as f64 / bw;
        let multiply = 2.0 * n as f64 * e.macs as f64 / peak;
        t += s * stream.max(multiply);
        tokens += s * n as f64;
        every_bytes += s * e.bytes as f64;
    }
    let rest = (d.weight_bytes as f64 - every_bytes).max(0.0);
    t += (rest / bw).max(2.0 * tokens * target.routed.macs as f64 / peak);
    let draft_macs = draft
        .work
        .map_or(0.0, |w| (w.every_token.macs + w.routed.macs) as f64);
    t += (draft.weight_bytes as f64 / bw).max(2.0 * draft.tokens * draft_macs / peak);
    t
}

/// The decode-step roofline speedup with FLOPs — committed decode tokens per ideal second of
/// the speculative run over the plain run's — and the plain run's ideal decode time over its
/// measured one. The drafter's decode-step tokens: its drafted tokens in the share of its bytes
/// the decode-only steps counted.
pub(super) fn decode_roofline_with_flops(
    spec: &EngineStats,
    plain: &EngineStats,
    target: &TokenWork,
    draft: Option<&TokenWork>,
    m: &Machine,
) -> (f64, f64) {
    let share = spec.decode.draft_weight_bytes as f64 / spec.draft_weight_bytes.max(1) as f64;
    let side = DraftSide {
        weight_bytes: spec.decode.draft_weight_bytes,
        tokens: spec.totals.drafted_tokens as f64 * share.min(1.0),
        work: draft,
    };
    let none = DraftSide {
        weight_bytes: 0,
        tokens: 0.0,
        work: None,
    };
    let ideal_spec = ideal_decode_s(&spec.decode, target, &side, m).max(1e-12);
    let ideal_plain = ideal_decode_s(&plain.decode, target, &none, m).max(1e-12);
    let rate = |s: &EngineStats, ideal: f64| s.decode.committed_tokens as f64 / ideal;
    (
        rate(spec, ideal_spec) / rate(plain, ideal_plain).max(1e-12),
        ideal_plain / plain.decode.seconds.max(1e-12),
    )
}

/// One token's work through the MTP layer (its bytes: what a batch-1 MTP step reads): eh_proj,
/// the absorbed attention, router + shared experts + top-k routed experts, the head.
pub(super) fn mtp_step_work(m: &Model) -> TokenWork {
    let mut w = TokenWork::default();
    let Some(l) = m.mtp.first() else { return w };
    let k = m.config.moe.as_ref().map_or(0, |c| c.num_experts_per_tok);
    let e = &mut w.every_token;
    e.matrix(&l.eh_proj);
    e.add(l.layer.attn_work(false, true));
    e.matrix(l.head.as_ref().unwrap_or(m.lm_head()));
    match &l.layer.ffn {
        Ffn::Dense(x) => e.expert(x),
        Ffn::Moe(mo) => {
            e.floats(mo.gate.len());
            if let Some(x) = &mo.shared {
                e.expert(x);
            }
            if let Some(x) = mo.experts.first() {
                (0..k).for_each(|_| w.routed.expert(x));
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmla::model::Work;

    fn work(every: (usize, usize), routed: (usize, usize)) -> TokenWork {
        TokenWork {
            every_token: Work {
                bytes: every.0,
                macs: every.1,
            },
            routed: Work {
                bytes: routed.0,
                macs: routed.1,
            },
        }
    }

    fn steps(by_tokens: &[(usize, u64)], weight_bytes: u64) -> DecodeSteps {
        let mut d = DecodeSteps {
            weight_bytes,
            ..Default::default()
        };
        for &(n, s) in by_tokens {
            if d.steps_by_tokens.len() <= n {
                d.steps_by_tokens.resize(n + 1, 0);
            }
            d.steps_by_tokens[n] += s;
        }
        d
    }

    const M: Machine = Machine {
        read_bytes_s: 1e9,
        dot_flop_s: 1e10,
    };
    const NO_DRAFT: DraftSide = DraftSide {
        weight_bytes: 0,
        tokens: 0.0,
        work: None,
    };

    /// Below the balance (10 tokens per bf16 weight here) a step costs its bytes; above it the
    /// every-token part costs its multiply-adds, while routed bytes stay bytes-bound.
    #[test]
    fn every_token_products_turn_compute_bound_past_the_balance() {
        assert!((M.balance_tokens() - 10.0).abs() < 1e-12);
        // 1 MB every-token (0.5 M macs), routed 0.2 MB per token
        let w = work((1_000_000, 500_000), (200_000, 100_000));
        // 4 steps of 1 token: bytes only, 1.2 MB each
        let d = steps(&[(1, 4)], 4 * 1_200_000);
        let t = ideal_decode_s(&d, &w, &NO_DRAFT, &M);
        assert!((t - 4.0 * 1.2e-3).abs() < 1e-12, "{t}");
        // 2 steps of 40 tokens: every-token part 2 * 40 * 0.5 M / 1e10 = 4 ms per step (not
        // 1 ms of bytes); routed bytes 2 * 2 MB at 1 GB/s = 4 ms (their FLOPs: 2 * 80 * 0.1 M
        // / 1e10 = 1.6 ms, less)
        let d = steps(&[(40, 2)], 2 * (1_000_000 + 2_000_000));
        let t = ideal_decode_s(&d, &w, &NO_DRAFT, &M);
        assert!((t - (2.0 * 4e-3 + 4e-3)).abs() < 1e-12, "{t}");
        // a drafter: 3 MB counted and 100 tokens of 1 M macs -> max(3 ms, 20 ms)
        let dw = work((2_000_000, 1_000_000), (0, 0));
        let side = DraftSide {
            weight_bytes: 3_000_000,
            tokens: 100.0,
            work: Some(&dw),
        };
        let t2 = ideal_decode_s(&d, &w, &side, &M);
        assert!((t2 - t - 20e-3).abs() < 1e-12, "{t2} {t}");
    }
}

//! One cell of the speculation bench's matrix: a drafter at one k (or adaptive) against one
//! (budget, batch)'s plain baseline — its runs ([`measure`]), the figures derived from them
//! ([`Figures`]: speedups, acceptance, the rooflines and how close the runs come), and the
//! cell's table row and JSON entry. Sits under `spec_bench::run_target`, which walks the matrix
//! and owns the baselines; the runs themselves are `spec_runs`'.
//!
//! Guarantee: measures and derives only; every run serves the baseline's workload, and every
//! output is compared with the baseline's.

use std::path::Path;

use serde_json::{json, Value};

use specmla::engine::EngineConfig;
use specmla::model::TokenWork;
use specmla::spec::SpecMode;
use specmla::Result;

use super::roofline::{decode_roofline_with_flops, Machine};
use super::spec_bench::Drafter;
use super::spec_runs::{ideal_spec_s, run_interleaved, run_once, run_plain, Run, Workload};

/// A (budget, batch)'s plain baseline: the faster of two plain runs (speedups are not inflated
/// by one slow plain run on a noisy host), both rates, and the interleaved plain A/A ratios.
pub(super) struct Baseline {
    pub(super) plain: Run,
    /// tok/s of both plain runs
    pub(super) rates: Vec<f64>,
    /// spec-engine tok/s over plain-engine tok/s of `--interleaved` runs of two plain engines
    pub(super) aa_inter: Vec<f64>,
}

impl Baseline {
    /// Target weight bytes per plain step.
    fn step_bytes(&self) -> f64 {
        self.plain.stats.target_weight_bytes as f64 / self.plain.stats.steps.max(1) as f64
    }
}

/// Where a cell runs: the target, its engine config, the workload at one batch, the baseline,
/// and what the rooflines need.
pub(super) struct CellCtx<'a> {
    pub(super) target: &'a Path,
    pub(super) base: &'a EngineConfig,
    pub(super) work: Workload<'a>,
    pub(super) batch: usize,
    pub(super) baseline: &'a Baseline,
    pub(super) target_work: &'a TokenWork,
    pub(super) machine: &'a Machine,
    /// `--paired` and `--interleaved` repetitions
    pub(super) paired: usize,
    pub(super) interleaved: usize,
}

/// A cell's runs: the separate speculative run, then `--paired` (plain, spec) pairs back to
/// back and `--interleaved` runs of a plain and a speculative engine stepping in turn.
pub(super) struct CellRuns {
    pub(super) spec: Run,
    paired: Vec<f64>,
    /// every plain run of this row: their slowest over their fastest is the host's run-to-run
    /// noise (an A/A ratio) next to which the speedups are read
    plain_seen: Vec<f64>,
    interleaved: Vec<f64>,
    interleaved_decode: Vec<f64>,
    /// (plain wall, plain decode-only, spec wall) seconds per interleaved run, for the
    /// end-to-end fraction with prefill as plain measured it
    interleaved_parts: Vec<(f64, f64, f64)>,
    interleaved_runs: Vec<Value>,
    /// whether every run's outputs (the separate spec run's and the extra runs' both engines)
    /// equal the baseline's
    pub(super) identical_all: bool,
}

/// Run drafter `d` in `mode` at the context's batch.
pub(super) fn measure(cx: &CellCtx, d: &Drafter, mode: SpecMode) -> Result<CellRuns> {
    let plain = &cx.baseline.plain;
    let run_spec = || run_once(cx.target, d.src.clone(), cx.base, mode, cx.batch, cx.work);
    let spec = run_spec()?;
    let mut identical_all = spec.tokens == plain.tokens;
    // --paired R: R more (plain, this run) pairs back to back; the median of the pairs'
    // ratios compares runs taken in the same host phase.
    let mut paired = Vec::new();
    let mut plain_seen = cx.baseline.rates.clone();
    for _ in 0..cx.paired {
        let p = run_plain(cx.target, cx.base, cx.batch, cx.work)?;
        let q = run_spec()?;
        identical_all &= q.tokens == plain.tokens && p.tokens == plain.tokens;
        paired.push(q.tps() / p.tps());
        plain_seen.push(p.tps());
    }
    // --interleaved R: R runs with the plain and the speculative engine stepping in turn
    // (each timed over its own steps)
    let (mut interleaved, mut interleaved_decode) = (Vec::new(), Vec::new());
    let (mut interleaved_parts, mut interleaved_runs) = (Vec::new(), Vec::new());
    for _ in 0..cx.interleaved {
        let (p, q) = run_interleaved(cx.target, d.src.clone(), cx.base, mode, cx.batch, cx.work)?;
        identical_all &= q.tokens == plain.tokens && p.tokens == plain.tokens;
        interleaved.push(q.tps() / p.tps());
        interleaved_decode.push(q.decode_tps() / p.decode_tps());
        interleaved_parts.push((p.wall_s, p.stats.decode.seconds, q.wall_s));
        interleaved_runs.push(json!({
            "plain_s": p.wall_s, "spec_s": q.wall_s,
            "plain_steps": p.stats.steps, "spec_steps": q.stats.steps,
            "drafted_tokens": q.stats.totals.drafted_tokens,
            "accepted_tokens": q.stats.totals.accepted_tokens,
        }));
    }
    Ok(CellRuns {
        spec,
        paired,
        plain_seen,
        interleaved,
        interleaved_decode,
        interleaved_parts,
        interleaved_runs,
        identical_all,
    })
}

/// What a cell's runs say, against its baseline.
pub(super) struct Figures {
    /// spec tok/s over plain tok/s, separate runs
    pub(super) speedup: f64,
    /// the separate spec run's outputs equal the baseline's
    pub(super) identical: bool,
    /// accepted / drafted
    pub(super) acc: f64,
    plain_aa: f64,
    paired_median: Option<f64>,
    interleaved_median: Option<f64>,
    interleaved_decode_median: Option<f64>,
    verify_bytes: f64,
    draft_bytes_step: f64,
    bytes_ratio: f64,
    roof: f64,
    cost: f64,
    dec_speedup: f64,
    dec_bytes_ratio: f64,
    dec_roof: f64,
    dec_roof_flops: f64,
    plain_dec_of_ideal: f64,
    roof_pf: f64,
    frac_pf: f64,
    inter_frac_pf: Vec<f64>,
    /// what this acceptance would give on a 61-layer DeepSeek-V3 with its one MTP layer
    pub(super) roof61: f64,
    draft_ms_tok: Option<f64>,
    target_ms: f64,
}

impl Figures {
    pub(super) fn of(cx: &CellCtx, d: &Drafter, r: &CellRuns) -> Figures {
        let (plain, spec) = (&cx.baseline.plain, &r.spec);
        let median = |v: &[f64]| (!v.is_empty()).then(|| super::percentile(v, 50.0));
        let (slowest, fastest) = super::min_max(&r.plain_seen);
        let acc = spec.acceptance();
        // Roofline: expected tokens per verification over the bytes a spec step reads
        // (its verification + k draft steps) relative to a plain step.
        let steps = spec.stats.steps.max(1) as f64;
        let verify_bytes = spec.stats.target_weight_bytes as f64 / steps;
        let draft_steps = spec.stats.totals.drafted_tokens as f64 / steps; // per engine step
        let k_eff = (spec.stats.totals.drafted_tokens as f64
            / spec.stats.totals.draft_steps.max(1) as f64)
            .max(0.0);
        // Draft bytes per step: what the drafter's forwards counted (a batched draft forward
        // reads its dense weights once for all requests, a catch-up forward the experts its
        // tokens select); without a count (n-gram: none), the batch-1 estimate per drafted
        // token. Before the count, the estimate charged every drafted token a whole draft
        // step, so at batch 4 / 16 the roofline's denominator grew with the batch (MTP k = 4
        // at batch 4 read measured / roofline 1.07-1.18).
        let counted = spec.stats.draft_weight_bytes > 0;
        let draft_bytes_step = if counted {
            spec.stats.draft_weight_bytes as f64 / steps
        } else {
            draft_steps * d.step_bytes
        };
        let bytes_ratio = (verify_bytes + draft_bytes_step) / cx.baseline.step_bytes().max(1.0);
        // Tokens a step commits, relative to plain, measured: with acceptance a = accepted /
        // drafted, a verification of k_eff drafts commits 1 + a k_eff on average — E(a, k) for
        // the measured per-position acceptances. (The closed form (1 - a^(k+1)) / (1 - a)
        // treats a as an independent per-position rate and undercounts at high acceptance and
        // large k: 6.4 instead of 8.3 tokens for the draft at k = 8 and 91 %, which had read as
        // meas/roof ~1.0.) Steps without drafts (adaptive) count as one token each, so mixed k
        // needs no correction.
        let tokens_ratio = spec.tokens_per_step() / plain.tokens_per_step().max(1e-12);
        let roof = tokens_ratio / bytes_ratio.max(1e-9);
        // The same over decode-only steps: measured committed tokens/s of those steps vs
        // plain's, and the roofline from their bytes (drafts happen only there). Prefill is
        // identical work in both runs and bytes-blind (a prompt chunk is compute-bound), so
        // the end-to-end ratio above mixes it in.
        let dsteps = spec.stats.decode.steps.max(1) as f64;
        let dec_draft_bytes = if counted {
            spec.stats.decode.draft_weight_bytes as f64 / dsteps
        } else {
            spec.stats.totals.drafted_tokens as f64 / dsteps * d.step_bytes
        };
        let dec_bytes_ratio =
            (spec.decode_step_bytes() + dec_draft_bytes) / plain.decode_step_bytes().max(1.0);
        let dec_tokens_ratio =
            spec.decode_tokens_per_step() / plain.decode_tokens_per_step().max(1e-12);
        let dec_roof = dec_tokens_ratio / dec_bytes_ratio.max(1e-9);
        // The same with FLOPs counted too (`roofline`), and how close plain decoding itself is
        // to the machine's roofline.
        let (dec_roof_flops, plain_dec_of_ideal) = decode_roofline_with_flops(
            &spec.stats,
            &plain.stats,
            cx.target_work,
            d.work.as_ref(),
            cx.machine,
        );
        // End to end with prefill as plain measured it (see [`Run::ideal_spec_s`]): the
        // roofline speedup, and the ideal time over the measured one.
        let plain_ideal = plain.ideal_spec_s(dec_roof);
        let inter_frac_pf = r
            .interleaved_parts
            .iter()
            .map(|&(pw, pd, qw)| ideal_spec_s(pw, pd, dec_roof) / qw.max(1e-12))
            .collect();
        Figures {
            speedup: spec.tps() / plain.tps(),
            identical: plain.tokens == spec.tokens,
            acc,
            plain_aa: slowest / fastest.max(1e-12),
            paired_median: median(&r.paired),
            interleaved_median: median(&r.interleaved),
            interleaved_decode_median: median(&r.interleaved_decode),
            verify_bytes,
            draft_bytes_step,
            bytes_ratio,
            roof,
            cost: spec.step_cost() / plain.step_cost(),
            dec_speedup: spec.decode_tps() / plain.decode_tps(),
            dec_bytes_ratio,
            dec_roof,
            dec_roof_flops,
            plain_dec_of_ideal,
            roof_pf: plain.wall_s / plain_ideal.max(1e-12),
            frac_pf: plain_ideal / spec.wall_s.max(1e-12),
            inter_frac_pf,
            // a draft step = 1/61 of a target step, a verification reading what one step
            // reads: E(a, k) / (1 + k / 61)
            roof61: (1.0 + acc * k_eff) / (1.0 + k_eff / 61.0),
            // none when the run drafted nothing (a drafter can still spend time then: an MTP
            // layer or draft model catching up)
            draft_ms_tok: (spec.stats.totals.drafted_tokens > 0)
                .then(|| 1e3 * spec.stats.time_draft_s / spec.stats.totals.drafted_tokens as f64),
            target_ms: 1e3 * plain.stats.time_target_forward_s / plain.stats.steps.max(1) as f64,
        }
    }

    /// The cell's row of the target's table (columns of `spec_bench::COLUMNS`).
    pub(super) fn row(&self, cx: &CellCtx, r: &CellRuns, cell: [&str; 3]) -> Vec<String> {
        let [bname, dname, kname] = cell;
        let (plain, spec) = (&cx.baseline.plain, &r.spec);
        vec![
            bname.to_string(),
            cx.batch.to_string(),
            dname.to_string(),
            kname.to_string(),
            format!("{:.1}", plain.tps()),
            format!("{:.1}", spec.tps()),
            format!("{:.2}x", self.speedup),
            format!("{:.1}%", 100.0 * self.acc),
            spec.per_position()
                .iter()
                .map(|p| format!("{:.0}", 100.0 * p))
                .collect::<Vec<_>>()
                .join("/"),
            format!("{:.2}", self.cost),
            format!("{:.2}", self.bytes_ratio),
            format!("{:.2}x", self.roof),
            format!("{:.2}", self.speedup / self.roof),
            format!("{:.2}x", self.dec_speedup),
            format!("{:.1}", spec.decode_tps()),
            format!("{:.2}x", self.dec_roof),
            format!("{:.2}", self.dec_speedup / self.dec_roof),
            format!(
                "{:.2}x / {:.2}",
                self.dec_roof_flops,
                self.interleaved_decode_median.unwrap_or(self.dec_speedup) / self.dec_roof_flops
            ),
            format!("{:.2}x / {:.2}", self.roof_pf, self.frac_pf),
            match self.draft_ms_tok {
                Some(ms) => format!("{ms:.2}/{:.2}", self.target_ms),
                None => format!("-/{:.2}", self.target_ms),
            },
            if self.identical {
                "yes".into()
            } else {
                "NO".into()
            },
            match self.paired_median {
                Some(m) => {
                    let (lo, hi) = super::min_max(&r.paired);
                    format!("{m:.2}x ({lo:.2}-{hi:.2})")
                }
                None => "-".into(),
            },
            match (self.interleaved_median, self.interleaved_decode_median) {
                (Some(m), Some(dm)) => {
                    let (lo, hi) = super::min_max(&r.interleaved);
                    format!(
                        "{m:.2}x ({lo:.2}-{hi:.2}), decode {dm:.2}x; meas/roof {:.2}, decode {:.2}, prefill as plain {:.2}",
                        m / self.roof,
                        dm / self.dec_roof,
                        super::percentile(&self.inter_frac_pf, 50.0)
                    )
                }
                _ => "-".into(),
            },
            format!("{:.2}", self.plain_aa),
        ]
    }

    /// The cell's entry of the JSON `runs` array.
    pub(super) fn json(&self, cx: &CellCtx, d: &Drafter, r: &CellRuns, cell: [&str; 3]) -> Value {
        let [tname, bname, kname] = cell;
        let (plain, spec) = (&cx.baseline.plain, &r.spec);
        let mut v = json!({
            "target": tname, "drafter": d.name, "k": kname, "batch": cx.batch, "budget": bname,
            "plain_tok_s": plain.tps(), "plain_tok_s_runs": cx.baseline.rates, "spec_tok_s": spec.tps(), "speedup": self.speedup,
            "acceptance": self.acc, "acceptance_per_position": spec.per_position(),
            "mean_acceptance_length": spec.stats.mean_acceptance_length,
            "identical": self.identical, "cost_ratio_step_over_plain": self.cost,
            "plain_aa_ratio": self.plain_aa,
            "bytes_ratio_step_over_plain": self.bytes_ratio, "roofline_speedup": self.roof,
            "measured_over_roofline": self.speedup / self.roof,
            "decode_speedup": self.dec_speedup, "decode_roofline_speedup": self.dec_roof,
            "plain_decode_tok_s": plain.decode_tps(), "spec_decode_tok_s": spec.decode_tps(),
            "decode_measured_over_roofline": self.dec_speedup / self.dec_roof,
            "decode_bytes_ratio_step_over_plain": self.dec_bytes_ratio,
            "roofline_61_layer_target": self.roof61,
            "plain_step_weight_bytes": cx.baseline.step_bytes(), "spec_step_verify_weight_bytes": self.verify_bytes,
            "draft_step_weight_bytes": d.step_bytes, "draft_ms_per_token": self.draft_ms_tok,
            "draft_weight_bytes_per_step": self.draft_bytes_step,
            "plain_target_step_ms": self.target_ms, "steps": spec.stats.steps,
            "counters": spec.stats.totals,
            "paired_speedups": r.paired, "paired_speedup_median": self.paired_median,
            "interleaved_speedups": r.interleaved, "interleaved_speedup_median": self.interleaved_median,
            "interleaved_runs": r.interleaved_runs,
            "interleaved_decode_speedups": r.interleaved_decode,
            // the roofline fraction from the interleaved runs (same host phases for both
            // engines; the roofline is counts only, the same in every run)
            "interleaved_measured_over_roofline": self.interleaved_median.map(|m| m / self.roof),
            "interleaved_decode_measured_over_roofline": self.interleaved_decode_median.map(|m| m / self.dec_roof),
        });
        // (outside the macro: its recursion limit)
        // end to end with prefill as plain measured it
        v["roofline_speedup_prefill_as_plain"] = json!(self.roof_pf);
        v["measured_over_roofline_prefill_as_plain"] = json!(self.frac_pf);
        v["interleaved_plain_aa"] = json!(cx.baseline.aa_inter);
        v["decode_roofline_speedup_with_flops"] = json!(self.dec_roof_flops);
        v["decode_measured_over_roofline_with_flops"] =
            json!(self.dec_speedup / self.dec_roof_flops);
        v["interleaved_decode_measured_over_roofline_with_flops"] = json!(self
            .interleaved_decode_median
            .map(|m| m / self.dec_roof_flops));
        v["plain_decode_ideal_over_measured"] = json!(self.plain_dec_of_ideal);
        v["plain_weights_huge_page_fraction"] = json!(plain
            .pages
            .filter(|p| p.mappings > 0)
            .map(|p| p.huge_fraction()));
        v["plain_anon_huge_bytes"] = json!(plain.anon_huge);
        v["interleaved_measured_over_roofline_prefill_as_plain"] =
            json!((!self.inter_frac_pf.is_empty())
                .then(|| super::percentile(&self.inter_frac_pf, 50.0)));
        v
    }
}

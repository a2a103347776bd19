//! Speculation bench: the same workload through the engine without a drafter and with every
//! drafter (draft model, weak draft model, the target's MTP layer, n-gram) at every k of `--ks`
//! and adaptively, at each batch size (max concurrent requests) and reasoning budget (none, and
//! 50% of each prompt's natural thinking length), on the bundled target and on its widened,
//! memory-bound copy (`make-bench-model`, written to a scratch dir and removed afterwards).
//!
//! Reported per run: committed tokens/s (all generated tokens / wall time, prefill included),
//! speedup over the plain run, acceptance (accepted / drafted) overall and per draft position,
//! wall cost per step and counted weight bytes per step relative to plain, the roofline speedup
//! (end to end, and over decode-only steps: prefill is the same work in both runs): committed
//! tokens per step relative to plain — 1 + a k per verification for the measured acceptance a —
//! over counted bytes per step relative to plain, so measured / roofline says whether a step
//! costs what it reads; the decode roofline with FLOPs counted too (`roofline`: past ~12 tokens
//! per bf16 weight a product is bound by its multiply-adds, as a batch-16 step's dense and
//! shared-expert products are on 2 cores), with the machine's probed bandwidth and multiply-add
//! peak; draft time per drafted token, answer
//! accuracy, and whether every request's committed tokens equal the plain run's.

use std::path::Path;

use serde_json::{json, Value};

use specmla::engine::{DraftSource, EngineConfig};
use specmla::kernels::{measure_peak_dot_flops, measure_read_bandwidth};
use specmla::model::{Model, TokenWork};
use specmla::spec::SpecMode;
use specmla::{Error, Result};

use super::roofline::{decode_roofline_with_flops, mtp_step_work, Machine};
use super::spec_runs::{ideal_spec_s, run_interleaved, run_once, Run, Workload};
use super::workload::{is_correct, load_workload, WorkItem};
use super::{progress, table, BenchArgs, Section};

/// A drafter of the matrix.
#[derive(Clone)]
struct Drafter {
    name: String,
    src: DraftSource,
    /// Weight bytes one draft step reads for one request (0 for n-gram).
    step_bytes: f64,
    /// One token's work through the drafter (`None` for n-gram).
    work: Option<TokenWork>,
}

/// The drafters `--drafters` names that this target can use (MTP only with an MTP layer).
fn drafters(
    a: &BenchArgs,
    draft: &Path,
    target: &Model,
    notes: &mut Vec<String>,
) -> Result<Vec<Drafter>> {
    let mut v = Vec::new();
    for name in a
        .drafters
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (src, work) = match name {
            "draft" | "draft-weak" => {
                let dir = if name == "draft" {
                    draft.to_path_buf()
                } else {
                    draft.with_file_name("draft-weak")
                };
                if !dir.join("config.json").is_file() {
                    notes.push(format!(
                        "drafter {name}: {} not found, skipped",
                        dir.display()
                    ));
                    continue;
                }
                let m = Model::load_dir(&dir)?;
                (DraftSource::Dir(dir), Some(m.decode_work_per_token()))
            }
            "mtp" => {
                if target.mtp.is_empty() {
                    notes.push("drafter mtp: the target has no MTP layer, skipped".into());
                    continue;
                }
                (DraftSource::Mtp, Some(mtp_step_work(target)))
            }
            "ngram" => (DraftSource::Ngram { min_n: 1, max_n: 4 }, None),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "--drafters: unknown drafter {other} (draft, draft-weak, mtp, ngram)"
                )))
            }
        };
        v.push(Drafter {
            name: name.to_string(),
            src,
            step_bytes: work.map_or(0.0, |w| w.bytes() as f64),
            work,
        });
    }
    Ok(v)
}

pub fn run(a: &BenchArgs, target: &Path, draft: &Path, batches: &[usize]) -> Result<Section> {
    let mut targets: Vec<(String, std::path::PathBuf, bool)> =
        vec![("bundled".into(), target.to_path_buf(), false)];
    if !a.no_wide {
        let dir = a
            .work_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("specmla-bench-wide-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        progress(&format!(
            "spec bench: writing the widened target (make-bench-model) to {}",
            dir.display()
        ));
        specmla::weights::widen_dir(target, &dir, specmla::weights::WidenFactors::default())?;
        targets.push(("wide".into(), dir, true));
    }
    // The machine's bandwidth and multiply-add peak with the engines' thread count, for the
    // roofline with FLOPs (`roofline`).
    progress("spec bench: probing the machine's read bandwidth and bf16 multiply-add peak");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.max(1))
        .build()
        .map_err(|e| Error::Engine(format!("thread pool: {e}")))?;
    let machine = Machine {
        read_bytes_s: pool.install(|| measure_read_bandwidth(512 << 20, 5)),
        dot_flop_s: pool.install(|| measure_peak_dot_flops(3)),
    };
    drop(pool);
    let mut out_text = format!(
        "machine ({} threads): read {:.1} GB/s, bf16 multiply-add peak {:.0} GFLOP/s: a product over bf16 weights is bound by its multiply-adds past {:.1} tokens per weight\n",
        a.threads.max(1),
        machine.read_bytes_s / 1e9,
        machine.dot_flop_s / 1e9,
        machine.balance_tokens()
    );
    let mut out_runs = Vec::new();
    let mut all_identical = true;
    let mut result = Ok(());
    for (tname, tdir, scratch) in &targets {
        match run_target(a, tname, tdir, draft, batches, &machine) {
            Ok((text, runs, ident)) => {
                out_text += &text;
                out_runs.extend(runs);
                all_identical &= ident;
            }
            Err(e) => result = Err(e),
        }
        if *scratch {
            let _ = std::fs::remove_dir_all(tdir);
        }
        if result.is_err() {
            break;
        }
    }
    result?;
    Ok(Section {
        name: "speculation",
        json: json!({"runs": out_runs, "greedy_identical": all_identical, "draft_p_min": a.draft_p_min, "stagger_steps": a.stagger,
            "machine_read_gb_s": machine.read_bytes_s / 1e9, "machine_bf16_peak_gflop_s": machine.dot_flop_s / 1e9}),
        text: out_text,
    })
}

/// The matrix for one target: per budget and batch one plain run, then every drafter at every k
/// and adaptive. Returns (text, runs, all outputs identical to plain).
fn run_target(
    a: &BenchArgs,
    tname: &str,
    target: &Path,
    draft: &Path,
    batches: &[usize],
    machine: &Machine,
) -> Result<(String, Vec<Value>, bool)> {
    let tmodel = Model::load_dir(target)?;
    let target_cfg = tmodel.config.clone();
    let n = a.prompts.unwrap_or(if a.quick { 8 } else { 16 });
    let (items, wl_label) = load_workload(&a.workload, n, target_cfg.vocab_size, a.seed)?;
    let tok = super::tokenizer_of(target)?;
    let think_end = tok.as_ref().and_then(|t| t.token_to_id("</think>"));
    let ks: Vec<usize> = super::parse_batches(&a.ks)?;
    let kmax = ks.iter().copied().max().unwrap_or(4);
    let mut notes = Vec::new();
    let drafters = drafters(a, draft, &tmodel, &mut notes)?;
    let plain_bytes_model = tmodel.decode_bytes_per_token() as f64;
    let target_work = tmodel.decode_work_per_token();
    drop(tmodel);
    let max_prompt = items
        .iter()
        .map(|it| it.prompt_token_ids.as_ref().map_or(512, Vec::len))
        .max()
        .unwrap_or(16);
    let block_size = 16;
    let per_req = (max_prompt + a.max_tokens + kmax + 2).div_ceil(block_size);
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let base = EngineConfig {
        threads: a.threads.max(1),
        kv_dtype: super::kv_dtype(a)?,
        draft_kv_dtype: None,
        index_kv_dtype: None,
        block_size,
        num_blocks: per_req * max_batch + 8,
        draft_num_blocks: per_req * max_batch + 8,
        kv_window_blocks: None,
        max_batch_tokens: 512,
        max_running: max_batch,
        prefix_cache: true,
        spec: SpecMode::Fixed(0),
        draft_p_min: a.draft_p_min,
        isa: crate::generate::parse_isa(&a.isa)?,
        kv_offload: None,
        device: Default::default(),
        huge_page_weights: false, // the bench's --huge-pages is process-wide
    };
    let mut budget_sets: Vec<(String, Vec<Option<usize>>)> =
        vec![("none".into(), vec![None; items.len()])];
    let natural: Option<Vec<usize>> = items.iter().map(|it| it.natural_thinking_tokens).collect();
    if let (Some(nat), Some(_)) = (natural, think_end) {
        budget_sets.push(("50%".into(), nat.iter().map(|&x| Some(x / 2)).collect()));
    }
    // Warm-up (untimed): page in the mapped weights and the pools, so the first measured run
    // (a plain one) is not the one that pays for the first touch.
    progress(&format!("spec bench: {tname}: warm-up"));
    let warm: Vec<WorkItem> = items.iter().take(2).cloned().collect();
    let warm_work = Workload {
        items: &warm,
        budgets: &[None, None],
        max_tokens: 32,
        stagger: 0,
    };
    run_once(
        target,
        DraftSource::None,
        &base,
        SpecMode::Fixed(0),
        1,
        warm_work,
    )?;
    let mut rows = Vec::new();
    let mut runs_json = Vec::new();
    let mut all_identical = true;
    let mut acc_lines = Vec::new();
    let mut mtp_lines: Vec<String> = Vec::new();
    let mut aa_lines: Vec<String> = Vec::new();
    // the target weights' page sizes after each (budget, batch)'s kept plain run
    let mut page_lines: Vec<String> = Vec::new();
    for (bname, budgets) in &budget_sets {
        for &b in batches {
            progress(&format!(
                "spec bench: {tname}, budget {bname}, batch {b}: plain"
            ));
            // Plain twice, the faster counts (speedups are not inflated by one slow plain run
            // on a noisy host); both rates go to the JSON.
            let work = Workload {
                items: &items,
                budgets,
                max_tokens: a.max_tokens,
                stagger: a.stagger,
            };
            let run_plain = || {
                run_once(
                    target,
                    DraftSource::None,
                    &base,
                    SpecMode::Fixed(0),
                    b,
                    work,
                )
            };
            let mut plains = Vec::new();
            for _ in 0..2 {
                plains.push(run_plain()?);
            }
            let plain_rates: Vec<f64> = plains.iter().map(Run::tps).collect();
            let plain = if plain_rates[1] > plain_rates[0] {
                plains.pop()
            } else {
                plains.into_iter().next()
            }
            .expect("two plain runs");
            let plain_step_bytes =
                plain.stats.target_weight_bytes as f64 / plain.stats.steps.max(1) as f64;
            if let Some(p) = plain.pages.filter(|p| p.mappings > 0) {
                page_lines.push(format!(
                    "weights, budget {bname}, batch {b}: {:.2} GB of the mapped target resident after the plain run, {:.1}% of it in 2 MB pages",
                    p.resident_bytes as f64 / 1e9,
                    100.0 * p.huge_fraction()
                ));
            }
            // --interleaved R: R interleaved runs of two plain engines too — the method's own
            // A/A spread, the floor under which an interleaved speedup is not resolved (an
            // adaptive row that drafts almost nothing is such a pair).
            let mut aa_inter = Vec::new();
            if a.interleaved > 0 {
                progress(&format!(
                    "spec bench: {tname}, budget {bname}, batch {b}: interleaved plain A/A"
                ));
            }
            for _ in 0..a.interleaved {
                let (p, q) = run_interleaved(
                    target,
                    DraftSource::None,
                    &base,
                    SpecMode::Fixed(0),
                    b,
                    work,
                )?;
                all_identical &= p.tokens == plain.tokens && q.tokens == plain.tokens;
                aa_inter.push(q.tps() / p.tps());
            }
            if !aa_inter.is_empty() {
                let (lo, hi) = super::min_max(&aa_inter);
                aa_lines.push(format!(
                    "interleaved plain A/A, budget {bname}, batch {b}: {} (min {lo:.3}, max {hi:.3})",
                    aa_inter
                        .iter()
                        .map(|x| format!("{x:.3}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if b == batches[0] {
                if let (Some(t), Some(te)) = (tok.as_ref(), think_end) {
                    let correct: Vec<bool> = plain
                        .tokens
                        .iter()
                        .zip(&items)
                        .filter_map(|(x, it)| is_correct(t, te, x, it))
                        .collect();
                    if !correct.is_empty() {
                        let ok = correct.iter().filter(|&&x| x).count();
                        acc_lines.push(format!(
                            "answer accuracy (budget {bname}): {ok}/{} = {:.1}%, mean reasoning tokens {:.1}",
                            correct.len(),
                            100.0 * ok as f64 / correct.len() as f64,
                            plain.stats.totals.reasoning_tokens as f64 / items.len() as f64
                        ));
                    }
                }
            }
            for d in &drafters {
                let mut modes: Vec<(String, SpecMode)> = ks
                    .iter()
                    .map(|&k| (k.to_string(), SpecMode::Fixed(k)))
                    .collect();
                modes.push(("adaptive".into(), SpecMode::Adaptive { k_max: kmax }));
                for (kname, mode) in modes {
                    progress(&format!(
                        "spec bench: {tname}, budget {bname}, batch {b}: {} k={kname}",
                        d.name
                    ));
                    let run_spec = || run_once(target, d.src.clone(), &base, mode, b, work);
                    let spec = run_spec()?;
                    let identical = plain.tokens == spec.tokens;
                    all_identical &= identical;
                    let speedup = spec.tps() / plain.tps();
                    // --paired R: R more (plain, this run) pairs back to back; the median of the
                    // pairs' ratios compares runs taken in the same host phase.
                    let mut paired = Vec::new();
                    // every plain run of this row: their slowest over their fastest is the host's
                    // run-to-run noise (an A/A ratio) next to which the speedups are read
                    let mut plain_seen = plain_rates.clone();
                    for _ in 0..a.paired {
                        let p = run_plain()?;
                        let q = run_spec()?;
                        all_identical &= q.tokens == plain.tokens && p.tokens == plain.tokens;
                        paired.push(q.tps() / p.tps());
                        plain_seen.push(p.tps());
                    }
                    // --interleaved R: R runs with the plain and the speculative engine
                    // stepping in turn (each timed over its own steps)
                    let mut interleaved = Vec::new();
                    let mut interleaved_runs = Vec::new();
                    let mut interleaved_decode = Vec::new();
                    // (plain wall, plain decode-only, spec wall) seconds per run, for the
                    // end-to-end fraction with prefill as plain measured it (its decode roofline
                    // is computed below)
                    let mut interleaved_parts = Vec::new();
                    for _ in 0..a.interleaved {
                        let (p, q) = run_interleaved(target, d.src.clone(), &base, mode, b, work)?;
                        all_identical &= q.tokens == plain.tokens && p.tokens == plain.tokens;
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
                    let interleaved_median =
                        (!interleaved.is_empty()).then(|| super::percentile(&interleaved, 50.0));
                    let (slowest, fastest) = super::min_max(&plain_seen);
                    let plain_aa = slowest / fastest.max(1e-12);
                    let paired_median =
                        (!paired.is_empty()).then(|| super::percentile(&paired, 50.0));
                    let acc = spec.acceptance();
                    // Roofline: expected tokens per verification over the bytes a spec step reads
                    // (its verification + k draft steps) relative to a plain step.
                    let steps = spec.stats.steps.max(1) as f64;
                    let verify_bytes = spec.stats.target_weight_bytes as f64 / steps;
                    let draft_steps = spec.stats.totals.drafted_tokens as f64 / steps; // per engine step
                    let k_eff = (spec.stats.totals.drafted_tokens as f64
                        / spec.stats.totals.draft_steps.max(1) as f64)
                        .max(0.0);
                    // Draft bytes per step: what the drafter's forwards counted (a batched
                    // draft forward reads its dense weights once for all requests, a catch-up
                    // forward the experts its tokens select); without a count (n-gram: none),
                    // the batch-1 estimate per drafted token. Before the count, the estimate
                    // charged every drafted token a whole draft step, so at batch 4 / 16 the
                    // roofline's denominator grew with the batch (MTP k = 4 at batch 4 read
                    // measured / roofline 1.07-1.18).
                    let counted = spec.stats.draft_weight_bytes > 0;
                    let draft_bytes_step = if counted {
                        spec.stats.draft_weight_bytes as f64 / steps
                    } else {
                        draft_steps * d.step_bytes
                    };
                    let bytes_ratio = (verify_bytes + draft_bytes_step) / plain_step_bytes.max(1.0);
                    // Tokens a step commits, relative to plain, measured: with acceptance a =
                    // accepted / drafted, a verification of k_eff drafts commits 1 + a k_eff on
                    // average — E(a, k) for the measured per-position acceptances. (The closed
                    // form (1 - a^(k+1)) / (1 - a) treats a as an independent per-position rate and
                    // undercounts at high acceptance and large k: 6.4 instead of 8.3 tokens for the
                    // draft at k = 8 and 91 %, which had read as meas/roof ~1.0.) Steps without
                    // drafts (adaptive) count as one token each, so mixed k needs no correction.
                    let tokens_ratio = spec.tokens_per_step() / plain.tokens_per_step().max(1e-12);
                    let roof = tokens_ratio / bytes_ratio.max(1e-9);
                    let cost = spec.step_cost() / plain.step_cost();
                    // The same over decode-only steps: measured committed tokens/s of those
                    // steps vs plain's, and the roofline from their bytes (drafts happen only
                    // there). Prefill is identical work in both runs and bytes-blind (a prompt
                    // chunk is compute-bound), so the end-to-end ratio above mixes it in.
                    let dsteps = spec.stats.decode.steps.max(1) as f64;
                    let dec_speedup = spec.decode_tps() / plain.decode_tps();
                    let dec_draft_bytes = if counted {
                        spec.stats.decode.draft_weight_bytes as f64 / dsteps
                    } else {
                        spec.stats.totals.drafted_tokens as f64 / dsteps * d.step_bytes
                    };
                    let dec_bytes_ratio = (spec.decode_step_bytes() + dec_draft_bytes)
                        / plain.decode_step_bytes().max(1.0);
                    let dec_tokens_ratio =
                        spec.decode_tokens_per_step() / plain.decode_tokens_per_step().max(1e-12);
                    let dec_roof = dec_tokens_ratio / dec_bytes_ratio.max(1e-9);
                    // The same with FLOPs counted too (`roofline`), and how close plain
                    // decoding itself is to the machine's roofline.
                    let (dec_roof_flops, plain_dec_of_ideal) = decode_roofline_with_flops(
                        &spec.stats,
                        &plain.stats,
                        &target_work,
                        d.work.as_ref(),
                        machine,
                    );
                    // End to end with prefill as plain measured it (see [`Run::ideal_spec_s`]):
                    // the roofline speedup, and the ideal time over the measured one.
                    let plain_ideal = plain.ideal_spec_s(dec_roof);
                    let roof_pf = plain.wall_s / plain_ideal.max(1e-12);
                    let frac_pf = plain_ideal / spec.wall_s.max(1e-12);
                    let inter_frac_pf: Vec<f64> = interleaved_parts
                        .iter()
                        .map(|&(pw, pd, qw)| ideal_spec_s(pw, pd, dec_roof) / qw.max(1e-12))
                        .collect();
                    // What this acceptance would give on a 61-layer DeepSeek-V3 with its one MTP
                    // layer (a draft step = 1/61 of a target step, a verification reading what
                    // one step reads): E(a, k) / (1 + k / 61).
                    let roof61 = (1.0 + acc * k_eff) / (1.0 + k_eff / 61.0);
                    if d.name == "mtp" && bname == "none" && b == batches[0] {
                        mtp_lines.push(format!(
                            "mtp k={kname}: acceptance {:.1}% -> roofline on a 61-layer target (MTP = 1/61 of a step, verification = one step): {roof61:.2}x",
                            100.0 * acc
                        ));
                    }
                    // Draft time per drafted token; none when the run drafted nothing (a drafter
                    // can still spend time then: an MTP layer or draft model catching up).
                    let draft_ms_tok = (spec.stats.totals.drafted_tokens > 0).then(|| {
                        1e3 * spec.stats.time_draft_s / spec.stats.totals.drafted_tokens as f64
                    });
                    let target_ms =
                        1e3 * plain.stats.time_target_forward_s / plain.stats.steps.max(1) as f64;
                    rows.push(vec![
                        bname.clone(),
                        b.to_string(),
                        d.name.clone(),
                        kname.clone(),
                        format!("{:.1}", plain.tps()),
                        format!("{:.1}", spec.tps()),
                        format!("{speedup:.2}x"),
                        format!("{:.1}%", 100.0 * acc),
                        spec.per_position()
                            .iter()
                            .map(|p| format!("{:.0}", 100.0 * p))
                            .collect::<Vec<_>>()
                            .join("/"),
                        format!("{cost:.2}"),
                        format!("{bytes_ratio:.2}"),
                        format!("{roof:.2}x"),
                        format!("{:.2}", speedup / roof),
                        format!("{dec_speedup:.2}x"),
                        format!("{:.1}", spec.decode_tps()),
                        format!("{dec_roof:.2}x"),
                        format!("{:.2}", dec_speedup / dec_roof),
                        format!(
                            "{dec_roof_flops:.2}x / {:.2}",
                            if interleaved_decode.is_empty() {
                                dec_speedup
                            } else {
                                super::percentile(&interleaved_decode, 50.0)
                            } / dec_roof_flops
                        ),
                        format!("{roof_pf:.2}x / {frac_pf:.2}"),
                        match draft_ms_tok {
                            Some(ms) => format!("{ms:.2}/{target_ms:.2}"),
                            None => format!("-/{target_ms:.2}"),
                        },
                        if identical { "yes".into() } else { "NO".into() },
                        match paired_median {
                            Some(m) => {
                                let (lo, hi) = super::min_max(&paired);
                                format!("{m:.2}x ({lo:.2}-{hi:.2})")
                            }
                            None => "-".into(),
                        },
                        match interleaved_median {
                            Some(m) => {
                                let (lo, hi) = super::min_max(&interleaved);
                                let dm = super::percentile(&interleaved_decode, 50.0);
                                format!(
                                    "{m:.2}x ({lo:.2}-{hi:.2}), decode {dm:.2}x; meas/roof {:.2}, decode {:.2}, prefill as plain {:.2}",
                                    m / roof,
                                    dm / dec_roof,
                                    super::percentile(&inter_frac_pf, 50.0)
                                )
                            }
                            None => "-".into(),
                        },
                        format!("{plain_aa:.2}"),
                    ]);
                    let mut run_json = json!({
                        "target": tname, "drafter": d.name, "k": kname, "batch": b, "budget": bname,
                        "plain_tok_s": plain.tps(), "plain_tok_s_runs": plain_rates, "spec_tok_s": spec.tps(), "speedup": speedup,
                        "acceptance": acc, "acceptance_per_position": spec.per_position(),
                        "mean_acceptance_length": spec.stats.mean_acceptance_length,
                        "identical": identical, "cost_ratio_step_over_plain": cost,
                        "plain_aa_ratio": plain_aa,
                        "bytes_ratio_step_over_plain": bytes_ratio, "roofline_speedup": roof,
                        "measured_over_roofline": speedup / roof,
                        "decode_speedup": dec_speedup, "decode_roofline_speedup": dec_roof,
                        "plain_decode_tok_s": plain.decode_tps(), "spec_decode_tok_s": spec.decode_tps(),
                        "decode_measured_over_roofline": dec_speedup / dec_roof,
                        "decode_bytes_ratio_step_over_plain": dec_bytes_ratio,
                        "roofline_61_layer_target": roof61,
                        "plain_step_weight_bytes": plain_step_bytes, "spec_step_verify_weight_bytes": verify_bytes,
                        "draft_step_weight_bytes": d.step_bytes, "draft_ms_per_token": draft_ms_tok,
                        "draft_weight_bytes_per_step": draft_bytes_step,
                        "plain_target_step_ms": target_ms, "steps": spec.stats.steps,
                        "counters": spec.stats.totals,
                        "paired_speedups": paired, "paired_speedup_median": paired_median,
                        "interleaved_speedups": interleaved, "interleaved_speedup_median": interleaved_median,
                        "interleaved_runs": interleaved_runs,
                        "interleaved_decode_speedups": interleaved_decode,
                        // the roofline fraction from the interleaved runs (same host phases for
                        // both engines; the roofline is counts only, the same in every run)
                        "interleaved_measured_over_roofline": interleaved_median.map(|m| m / roof),
                        "interleaved_decode_measured_over_roofline": (!interleaved_decode.is_empty())
                            .then(|| super::percentile(&interleaved_decode, 50.0) / dec_roof),
                    });
                    // end to end with prefill as plain measured it (outside the macro: its
                    // recursion limit)
                    run_json["roofline_speedup_prefill_as_plain"] = json!(roof_pf);
                    run_json["measured_over_roofline_prefill_as_plain"] = json!(frac_pf);
                    run_json["interleaved_plain_aa"] = json!(aa_inter);
                    run_json["decode_roofline_speedup_with_flops"] = json!(dec_roof_flops);
                    run_json["decode_measured_over_roofline_with_flops"] =
                        json!(dec_speedup / dec_roof_flops);
                    run_json["interleaved_decode_measured_over_roofline_with_flops"] =
                        json!((!interleaved_decode.is_empty()).then(|| {
                            super::percentile(&interleaved_decode, 50.0) / dec_roof_flops
                        }));
                    run_json["plain_decode_ideal_over_measured"] = json!(plain_dec_of_ideal);
                    run_json["plain_weights_huge_page_fraction"] = json!(plain
                        .pages
                        .filter(|p| p.mappings > 0)
                        .map(|p| p.huge_fraction()));
                    run_json["interleaved_measured_over_roofline_prefill_as_plain"] =
                        json!((!inter_frac_pf.is_empty())
                            .then(|| super::percentile(&inter_frac_pf, 50.0)));
                    runs_json.push(run_json);
                }
            }
        }
    }
    let mut text = format!(
        "-- target {tname}: {} ({:.1} MB read per batch-1 decode token), workload: {wl_label}, max_tokens {}, {} threads, KV {}, draft confidence cut {}\n",
        target.display(),
        plain_bytes_model / 1e6,
        a.max_tokens,
        a.threads,
        a.kv_dtype,
        a.draft_p_min
    );
    for n in &notes {
        text += &format!("note: {n}\n");
    }
    text += &table(
        &[
            "budget",
            "batch",
            "drafter",
            "k",
            "plain tok/s",
            "spec tok/s",
            "speedup",
            "accept",
            "accept/pos %",
            "cost/step",
            "bytes/step",
            "roofline",
            "meas/roof",
            "decode speedup",
            "spec decode tok/s",
            "decode roofline",
            "dec meas/roof",
            "dec roofline w/ FLOPs / meas/roof",
            "roofline / meas/roof, prefill as plain",
            "draft ms/tok / step ms",
            "identical",
            "paired speedup",
            "interleaved speedup",
            "plain A/A",
        ],
        &rows,
    );
    for l in acc_lines
        .iter()
        .chain(&mtp_lines)
        .chain(&aa_lines)
        .chain(&page_lines)
    {
        text += l;
        text += "\n";
    }
    text += &format!(
        "greedy outputs identical to plain decoding in every run: {}\n",
        if all_identical { "YES" } else { "NO" }
    );
    text += "roofline = E(a, k) / ((verify bytes + draft bytes) / plain step bytes), E = committed tokens per step vs plain's (measured:\n  1 + a k per verification, a = accepted / drafted), so meas/roof = bytes ratio / cost ratio: does a step cost what it reads,\n  bytes = weights the engine counted per step (dense + union of selected experts), the drafter's forwards counted the same way\n  (one batched draft forward reads its weights once for all requests); cost/step = wall time per step vs plain.\n  decode columns: the same over decode-only steps (prefill steps, identical work in both runs, left out);\n  spec decode tok/s = tokens those steps committed / their wall time (what llama-speculative reports as decode speed).\n  prefill as plain: end to end, the time the run would take with its decode steps at the decode roofline and its prefill\n  steps as long as plain's (identical work, not bytes-bound like a decode step), over the time it took.\n  draft ms/tok / step ms = the drafter's time per drafted token (- when it drafted none) / plain's target forward per step.\n";
    if a.paired > 0 {
        text += &format!(
            "paired speedup = median (min-max) of {} more (plain, spec) pairs run back to back.\n",
            a.paired
        );
    }
    if a.interleaved > 0 {
        text += &format!(
            "interleaved speedup = median (min-max) of {} runs with a plain and a speculative engine serving the workload at once,\n  the engine with fewer committed tokens stepping next, each engine's tok/s over its own steps' time (both see the same host phases);\n  decode = the same over decode-only steps (the prefill steps, the same work in both, left out);\n  meas/roof = those medians over the row's roofline (counts only, the same in every run): the roofline fraction\n  with the host's phase changes cancelled, where the separate plain and spec runs of the meas/roof column are not.\n  interleaved plain A/A = the same with two plain engines: the method's own spread, per batch and budget.\n",
            a.interleaved
        );
    }
    text += "plain A/A = the row's slowest plain run over its fastest (the same work): the host's run-to-run noise;\n  a speedup closer to 1 than that is not resolved by these runs.\n";
    Ok((text, runs_json, all_identical))
}

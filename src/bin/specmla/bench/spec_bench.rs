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

use super::roofline::{mtp_step_work, Machine};
use super::spec_cell::{measure, Baseline, CellCtx, Figures};
use super::spec_runs::{run_interleaved, run_plain, Run, Workload};
use super::workload::{is_correct, load_workload, WorkItem};
use super::{progress, table, BenchArgs, Section};

/// A drafter of the matrix.
#[derive(Clone)]
pub(super) struct Drafter {
    pub(super) name: String,
    pub(super) src: DraftSource,
    /// Weight bytes one draft step reads for one request (0 for n-gram).
    pub(super) step_bytes: f64,
    /// One token's work through the drafter (`None` for n-gram).
    pub(super) work: Option<TokenWork>,
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

/// The table's columns (one row per cell: `spec_cell::Figures::row`).
const COLUMNS: [&str; 24] = [
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
];

/// What one target's matrix shares: its workload, drafters, engine config and budget sets.
struct TargetSetup {
    items: Vec<WorkItem>,
    wl_label: String,
    tok: Option<std::sync::Arc<specmla::tokenizer::Tokenizer>>,
    think_end: Option<u32>,
    ks: Vec<usize>,
    kmax: usize,
    notes: Vec<String>,
    drafters: Vec<Drafter>,
    /// weight bytes of a batch-1 decode token
    plain_bytes_model: f64,
    target_work: TokenWork,
    base: EngineConfig,
    /// (name, per-item reasoning budget): none, and 50 % of each item's natural thinking
    budget_sets: Vec<(String, Vec<Option<usize>>)>,
}

/// Load what the matrix for `target` needs and size its engines for the largest batch.
fn setup_target(
    a: &BenchArgs,
    target: &Path,
    draft: &Path,
    batches: &[usize],
) -> Result<TargetSetup> {
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
    Ok(TargetSetup {
        items,
        wl_label,
        tok,
        think_end,
        ks,
        kmax,
        notes,
        drafters,
        plain_bytes_model,
        target_work,
        base,
        budget_sets,
    })
}

/// A (budget, batch)'s plain baseline: plain twice (the faster counts; both rates go to the
/// JSON), then `--interleaved` runs of two plain engines — the method's own A/A spread, the
/// floor under which an interleaved speedup is not resolved (an adaptive row that drafts almost
/// nothing is such a pair). Returns the baseline and whether the A/A runs' outputs equal it.
fn plain_baseline(
    a: &BenchArgs,
    target: &Path,
    base: &EngineConfig,
    work: Workload,
    b: usize,
    label: &str,
) -> Result<(Baseline, bool)> {
    progress(&format!("spec bench: {label}: plain"));
    let mut plains = vec![
        run_plain(target, base, b, work)?,
        run_plain(target, base, b, work)?,
    ];
    let rates: Vec<f64> = plains.iter().map(Run::tps).collect();
    let plain = if rates[1] > rates[0] {
        plains.swap_remove(1)
    } else {
        plains.swap_remove(0)
    };
    if a.interleaved > 0 {
        progress(&format!("spec bench: {label}: interleaved plain A/A"));
    }
    let mut aa_inter = Vec::new();
    let mut identical = true;
    for _ in 0..a.interleaved {
        let (p, q) = run_interleaved(target, DraftSource::None, base, SpecMode::Fixed(0), b, work)?;
        identical &= p.tokens == plain.tokens && q.tokens == plain.tokens;
        aa_inter.push(q.tps() / p.tps());
    }
    Ok((
        Baseline {
            plain,
            rates,
            aa_inter,
        },
        identical,
    ))
}

/// The matrix for one target: per budget and batch one plain baseline, then every drafter at
/// every k and adaptive. Returns (text, runs, all outputs identical to plain).
fn run_target(
    a: &BenchArgs,
    tname: &str,
    target: &Path,
    draft: &Path,
    batches: &[usize],
    machine: &Machine,
) -> Result<(String, Vec<Value>, bool)> {
    let st = setup_target(a, target, draft, batches)?;
    // Warm-up (untimed): page in the mapped weights and the pools, so the first measured run
    // (a plain one) is not the one that pays for the first touch.
    progress(&format!("spec bench: {tname}: warm-up"));
    let warm: Vec<WorkItem> = st.items.iter().take(2).cloned().collect();
    let warm_work = Workload {
        items: &warm,
        budgets: &[None, None],
        max_tokens: 32,
        stagger: 0,
    };
    run_plain(target, &st.base, 1, warm_work)?;
    let mut rows = Vec::new();
    let mut runs_json = Vec::new();
    let mut all_identical = true;
    let mut acc_lines = Vec::new();
    let mut mtp_lines: Vec<String> = Vec::new();
    let mut aa_lines: Vec<String> = Vec::new();
    // the target weights' page sizes after each (budget, batch)'s kept plain run
    let mut page_lines: Vec<String> = Vec::new();
    for (bname, budgets) in &st.budget_sets {
        for &b in batches {
            let work = Workload {
                items: &st.items,
                budgets,
                max_tokens: a.max_tokens,
                stagger: a.stagger,
            };
            let label = format!("{tname}, budget {bname}, batch {b}");
            let (baseline, aa_identical) = plain_baseline(a, target, &st.base, work, b, &label)?;
            all_identical &= aa_identical;
            let plain = &baseline.plain;
            // the mapped files' pages and the anonymous 2 MB pages, each where known
            let mut parts = Vec::new();
            if let Some(p) = plain.pages.filter(|p| p.mappings > 0) {
                parts.push(format!(
                    "{:.2} GB of the mapped target resident after the plain run, {:.1}% of it in 2 MB pages",
                    p.resident_bytes as f64 / 1e9,
                    100.0 * p.huge_fraction()
                ));
            }
            if let Some(h) = plain.anon_huge {
                parts.push(format!(
                    "{:.2} GB of anonymous 2 MB pages (packed bf16 strips)",
                    h as f64 / 1e9
                ));
            }
            if !parts.is_empty() {
                page_lines.push(format!(
                    "weights, budget {bname}, batch {b}: {}",
                    parts.join("; ")
                ));
            }
            if !baseline.aa_inter.is_empty() {
                let (lo, hi) = super::min_max(&baseline.aa_inter);
                aa_lines.push(format!(
                    "interleaved plain A/A, budget {bname}, batch {b}: {} (min {lo:.3}, max {hi:.3})",
                    baseline
                        .aa_inter
                        .iter()
                        .map(|x| format!("{x:.3}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if b == batches[0] {
                if let Some(line) = accuracy_line(&st, plain, bname) {
                    acc_lines.push(line);
                }
            }
            let cx = CellCtx {
                target,
                base: &st.base,
                work,
                batch: b,
                baseline: &baseline,
                target_work: &st.target_work,
                machine,
                paired: a.paired,
                interleaved: a.interleaved,
            };
            for d in &st.drafters {
                let mut modes: Vec<(String, SpecMode)> = st
                    .ks
                    .iter()
                    .map(|&k| (k.to_string(), SpecMode::Fixed(k)))
                    .collect();
                modes.push(("adaptive".into(), SpecMode::Adaptive { k_max: st.kmax }));
                for (kname, mode) in modes {
                    progress(&format!("spec bench: {label}: {} k={kname}", d.name));
                    let runs = measure(&cx, d, mode)?;
                    all_identical &= runs.identical_all;
                    let f = Figures::of(&cx, d, &runs);
                    if d.name == "mtp" && bname == "none" && b == batches[0] {
                        mtp_lines.push(format!(
                            "mtp k={kname}: acceptance {:.1}% -> roofline on a 61-layer target (MTP = 1/61 of a step, verification = one step): {:.2}x",
                            100.0 * f.acc,
                            f.roof61
                        ));
                    }
                    rows.push(f.row(&cx, &runs, [bname, &d.name, &kname]));
                    runs_json.push(f.json(&cx, d, &runs, [tname, bname, &kname]));
                }
            }
        }
    }
    let mut text = format!(
        "-- target {tname}: {} ({:.1} MB read per batch-1 decode token), workload: {}, max_tokens {}, {} threads, KV {}, draft confidence cut {}\n",
        target.display(),
        st.plain_bytes_model / 1e6,
        st.wl_label,
        a.max_tokens,
        a.threads,
        a.kv_dtype,
        a.draft_p_min
    );
    for n in &st.notes {
        text += &format!("note: {n}\n");
    }
    text += &table(&COLUMNS, &rows);
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
    text += &legend(a);
    Ok((text, runs_json, all_identical))
}

/// The plain run's answer accuracy under budget `bname`, where the workload has answers.
fn accuracy_line(st: &TargetSetup, plain: &Run, bname: &str) -> Option<String> {
    let (t, te) = (st.tok.as_ref()?, st.think_end?);
    let correct: Vec<bool> = plain
        .tokens
        .iter()
        .zip(&st.items)
        .filter_map(|(x, it)| is_correct(t, te, x, it))
        .collect();
    if correct.is_empty() {
        return None;
    }
    let ok = correct.iter().filter(|&&x| x).count();
    Some(format!(
        "answer accuracy (budget {bname}): {ok}/{} = {:.1}%, mean reasoning tokens {:.1}",
        correct.len(),
        100.0 * ok as f64 / correct.len() as f64,
        plain.stats.totals.reasoning_tokens as f64 / st.items.len() as f64
    ))
}

/// What the table's columns mean.
fn legend(a: &BenchArgs) -> String {
    let mut text = String::from("roofline = E(a, k) / ((verify bytes + draft bytes) / plain step bytes), E = committed tokens per step vs plain's (measured:\n  1 + a k per verification, a = accepted / drafted), so meas/roof = bytes ratio / cost ratio: does a step cost what it reads,\n  bytes = weights the engine counted per step (dense + union of selected experts), the drafter's forwards counted the same way\n  (one batched draft forward reads its weights once for all requests); cost/step = wall time per step vs plain.\n  decode columns: the same over decode-only steps (prefill steps, identical work in both runs, left out);\n  spec decode tok/s = tokens those steps committed / their wall time (what llama-speculative reports as decode speed).\n  prefill as plain: end to end, the time the run would take with its decode steps at the decode roofline and its prefill\n  steps as long as plain's (identical work, not bytes-bound like a decode step), over the time it took.\n  draft ms/tok / step ms = the drafter's time per drafted token (- when it drafted none) / plain's target forward per step.\n");
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
    text
}

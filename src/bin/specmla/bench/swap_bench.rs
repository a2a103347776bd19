//! Draft-swap bench: what a run-time draft swap costs the serving loop.
//!
//! Measured: (1) load + validate time of a draft on the calling thread
//! (`set_draft_weights_blocking`) and the time until the engine applies it; (2) with the load on
//! the engine's background thread (`set_draft_weights`) while requests keep decoding: step latency
//! p50/p99 of normal steps vs steps while the draft loads vs the first steps after the swap (the
//! new drafter starts with an empty draft KV and re-prefills every context); (3) KV bytes per
//! token of target and draft for each cache dtype; (4) acceptance and committed tokens/s with an
//! fp8_e4m3 draft KV vs a bf16 one (outputs must be identical: the target decides).

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use specmla::engine::{DraftSource, Engine, EngineConfig, FinishReason, SwapStatus};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;
use specmla::{Error, Result};

use super::workload::{load_workload, WorkItem};
use super::{percentile, progress, table, BenchArgs, Section};

/// Keeps `batch` requests running by resubmitting workload prompts round-robin.
struct Feeder<'a> {
    engine: &'a Engine,
    items: &'a [WorkItem],
    next: usize,
    running: usize,
    batch: usize,
    max_tokens: usize,
}

impl Feeder<'_> {
    fn top_up(&mut self) -> Result<()> {
        while self.running < self.batch {
            self.engine
                .submit(self.items[self.next % self.items.len()].request(self.max_tokens))?;
            self.next += 1;
            self.running += 1;
        }
        Ok(())
    }
    /// One step; returns its duration in seconds.
    fn step(&mut self) -> Result<f64> {
        self.top_up()?;
        let t = Instant::now();
        let evs = self.engine.step()?;
        let s = t.elapsed().as_secs_f64();
        for ev in evs {
            if let Some(f) = ev.finish {
                if let FinishReason::Error(m) = f {
                    return Err(Error::Engine(format!("bench request failed: {m}")));
                }
                self.running -= 1;
            }
        }
        Ok(s)
    }
}

fn ms_stats(xs: &[f64]) -> (f64, f64) {
    (1e3 * percentile(xs, 50.0), 1e3 * percentile(xs, 99.0))
}

pub fn run(a: &BenchArgs, target: &Path, draft: &Path) -> Result<Section> {
    let target_cfg = specmla::config::ModelConfig::from_file(&target.join("config.json"))?;
    let n = a.prompts.unwrap_or(if a.quick { 8 } else { 32 });
    let (items, wl_label) = load_workload(&a.workload, n, target_cfg.vocab_size, a.seed)?;
    let k = a.num_draft_tokens.max(1);
    let batch = 4;
    let max_prompt = items
        .iter()
        .map(|it| it.prompt_token_ids.as_ref().map_or(512, Vec::len))
        .max()
        .unwrap_or(16);
    let block_size = 16;
    let blocks = (max_prompt + a.max_tokens + k + 2).div_ceil(block_size) * (batch + 1) + 8;
    let base = EngineConfig {
        threads: a.threads.max(1),
        kv_dtype: super::kv_dtype(a)?,
        draft_kv_dtype: None,
        index_kv_dtype: None,
        block_size,
        num_blocks: blocks,
        draft_num_blocks: blocks,
        kv_window_blocks: None,
        max_batch_tokens: 512,
        max_running: batch,
        prefix_cache: true,
        spec: SpecMode::Fixed(k),
        draft_p_min: a.draft_p_min,
        isa: crate::generate::parse_isa(&a.isa)?,
        kv_offload: None,
        device: Default::default(),
        huge_page_weights: false, // the bench's --huge-pages is process-wide
    };
    let src = || DraftSource::Dir(draft.to_path_buf());
    let engine = Engine::new(target, src(), base.clone())?;
    let mut feed = Feeder {
        engine: &engine,
        items: &items,
        next: 0,
        running: 0,
        batch,
        max_tokens: a.max_tokens,
    };
    let normal_steps = if a.quick { 20 } else { 60 };
    let swaps = if a.quick { 3 } else { 10 };
    let after = 3;

    // ---- (1) blocking load + validate, then applied at the next step
    progress("swap bench: blocking loads");
    for _ in 0..3 {
        feed.step()?;
    }
    let mut load_s = Vec::new();
    let mut apply_s = Vec::new();
    for _ in 0..swaps {
        let t = Instant::now();
        let ticket = engine.set_draft_weights_blocking(src())?;
        load_s.push(t.elapsed().as_secs_f64());
        feed.step()?;
        match engine.swap_status(ticket) {
            SwapStatus::Applied { .. } => apply_s.push(t.elapsed().as_secs_f64()),
            s => {
                return Err(Error::Engine(format!(
                    "blocking swap not applied after a step: {s:?}"
                )))
            }
        }
    }

    // ---- (2) background loads during decoding
    progress(&format!(
        "swap bench: {normal_steps} normal steps, then {swaps} background swaps"
    ));
    let mut normal = Vec::new();
    for _ in 0..normal_steps {
        normal.push(feed.step()?);
    }
    let mut during = Vec::new();
    let mut first_after = Vec::new();
    let mut later_after = Vec::new();
    let mut bg_apply_s = Vec::new();
    let mut steps_to_apply = Vec::new();
    for _ in 0..swaps {
        let t = Instant::now();
        let ticket = engine.set_draft_weights(src());
        let mut nsteps = 0;
        loop {
            let pending_before = engine.swap_status(ticket) == SwapStatus::Pending;
            let s = feed.step()?;
            nsteps += 1;
            match engine.swap_status(ticket) {
                SwapStatus::Applied { .. } => {
                    // this step installed the drafter at its start: it ran with the new, empty draft KV
                    first_after.push(s);
                    bg_apply_s.push(t.elapsed().as_secs_f64());
                    break;
                }
                SwapStatus::Pending if pending_before => during.push(s),
                SwapStatus::Failed(m) => {
                    return Err(Error::Draft(format!("background swap failed: {m}")))
                }
                other => return Err(Error::Engine(format!("unexpected swap status {other:?}"))),
            }
            if nsteps > 100_000 {
                return Err(Error::Engine("swap never applied".into()));
            }
        }
        steps_to_apply.push(nsteps);
        for _ in 0..after {
            later_after.push(feed.step()?);
        }
    }
    while engine.has_work() {
        engine.step()?;
    }
    let stats = engine.stats();
    drop(engine);

    // ---- (3) KV bytes per token for each dtype
    progress("swap bench: KV bytes per token per dtype");
    let dtypes = [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3];
    let mut kv_rows = Vec::new();
    let mut kv_json = Vec::new();
    for d in dtypes {
        let cfg = EngineConfig {
            kv_dtype: d,
            draft_kv_dtype: None,
            index_kv_dtype: None,
            num_blocks: 4,
            draft_num_blocks: 4,
            ..base.clone()
        };
        let e = Engine::new(target, src(), cfg)?;
        let s = e.stats();
        kv_rows.push(vec![
            d.name().to_string(),
            s.target_kv_bytes_per_token.to_string(),
            s.draft_kv_bytes_per_token.to_string(),
        ]);
        kv_json.push(json!({"dtype": d.name(), "target": s.target_kv_bytes_per_token, "draft": s.draft_kv_bytes_per_token}));
    }

    // ---- (4) fp8 vs bf16 draft KV
    let mut dkv_rows = Vec::new();
    let mut dkv_json = Vec::new();
    let mut outputs: Vec<Vec<Vec<u32>>> = Vec::new();
    for d in [KvDtype::Bf16, KvDtype::Fp8E4M3] {
        progress(&format!("swap bench: workload with {} draft KV", d.name()));
        let cfg = EngineConfig {
            draft_kv_dtype: Some(d),
            index_kv_dtype: None,
            ..base.clone()
        };
        let e = Engine::new(target, src(), cfg)?;
        let reqs = items.iter().map(|it| it.request(a.max_tokens)).collect();
        let res = super::run_to_completion(&e, reqs)?;
        let s = e.stats();
        let gen: usize = res.tokens.iter().map(Vec::len).sum();
        let acc = if s.totals.drafted_tokens == 0 {
            0.0
        } else {
            s.totals.accepted_tokens as f64 / s.totals.drafted_tokens as f64
        };
        dkv_rows.push(vec![
            d.name().to_string(),
            format!("{:.1}%", 100.0 * acc),
            format!("{:.2}", s.mean_acceptance_length),
            format!("{:.1}", gen as f64 / res.wall_s),
            s.draft_kv_bytes_per_token.to_string(),
        ]);
        dkv_json.push(json!({
            "draft_kv_dtype": d.name(), "acceptance": acc, "mean_acceptance_length": s.mean_acceptance_length,
            "tokens_per_s": gen as f64 / res.wall_s, "tokens": gen, "wall_s": res.wall_s,
            "draft_kv_bytes_per_token": s.draft_kv_bytes_per_token,
        }));
        outputs.push(res.tokens);
    }
    let same = outputs.windows(2).all(|w| w[0] == w[1]);

    // ---- report
    let (n50, n99) = ms_stats(&normal);
    let (d50, d99) = ms_stats(&during);
    let (f50, f99) = ms_stats(&first_after);
    let (l50, l99) = ms_stats(&later_after);
    let mut text = format!(
        "target {}, draft {}, k = {k}, batch {batch} (kept full from {wl_label}), {} threads\n",
        target.display(),
        draft.display(),
        a.threads
    );
    text += &format!(
        "load + validate on the caller (set_draft_weights_blocking): p50 {:.1} ms, max {:.1} ms over {swaps}; applied by the next step: p50 {:.1} ms after the call\n",
        1e3 * percentile(&load_s, 50.0),
        1e3 * percentile(&load_s, 100.0),
        1e3 * percentile(&apply_s, 50.0)
    );
    text += &format!(
        "background load (set_draft_weights): applied p50 {:.1} ms / max {:.1} ms after the call, after {:.1} steps on average\n",
        1e3 * percentile(&bg_apply_s, 50.0),
        1e3 * percentile(&bg_apply_s, 100.0),
        steps_to_apply.iter().sum::<usize>() as f64 / steps_to_apply.len().max(1) as f64
    );
    text += &table(
        &["steps", "count", "p50 ms", "p99 ms"],
        &[
            vec![
                "normal".into(),
                normal.len().to_string(),
                format!("{n50:.2}"),
                format!("{n99:.2}"),
            ],
            vec![
                "while loading".into(),
                during.len().to_string(),
                format!("{d50:.2}"),
                format!("{d99:.2}"),
            ],
            vec![
                "swap step".into(),
                first_after.len().to_string(),
                format!("{f50:.2}"),
                format!("{f99:.2}"),
            ],
            vec![
                format!("next {after} after"),
                later_after.len().to_string(),
                format!("{l50:.2}"),
                format!("{l99:.2}"),
            ],
        ],
    );
    text += &format!(
        "draft generation after the bench: {} (drafter {})\n\n",
        stats.draft_generation, stats.drafter
    );
    text += "KV bytes per token (all layers, scales included):\n";
    text += &table(&["dtype", "target", "draft"], &kv_rows);
    text += &format!(
        "\ndraft KV dtype (target KV {}), {} prompts, batch {batch}:\n",
        a.kv_dtype,
        items.len()
    );
    text += &table(
        &[
            "draft KV",
            "accept",
            "mean len",
            "tok/s",
            "draft KV B/token",
        ],
        &dkv_rows,
    );
    text += &format!(
        "outputs identical with fp8 and bf16 draft KV: {}\n",
        if same { "YES" } else { "NO" }
    );
    let json = json!({
        "target": target.display().to_string(), "draft": draft.display().to_string(), "k": k, "batch": batch,
        "blocking_load_ms": load_s.iter().map(|x| 1e3 * x).collect::<Vec<_>>(),
        "blocking_applied_ms": apply_s.iter().map(|x| 1e3 * x).collect::<Vec<_>>(),
        "background_applied_ms": bg_apply_s.iter().map(|x| 1e3 * x).collect::<Vec<_>>(),
        "steps_to_apply": steps_to_apply,
        "step_ms": {
            "normal": {"count": normal.len(), "p50": n50, "p99": n99},
            "while_loading": {"count": during.len(), "p50": d50, "p99": d99},
            "swap_step": {"count": first_after.len(), "p50": f50, "p99": f99},
            "after": {"count": later_after.len(), "p50": l50, "p99": l99},
        },
        "kv_bytes_per_token": kv_json,
        "draft_kv": dkv_json,
        "draft_kv_outputs_identical": same,
    });
    Ok(Section {
        name: "draft_swap",
        json,
        text,
    })
}

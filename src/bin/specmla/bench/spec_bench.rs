//! Speculation bench: the same workload through the engine without a drafter, with a draft model
//! at a fixed k, and with the adaptive policy, at each batch size (max concurrent requests) and
//! reasoning budget (none, and 50% of each prompt's natural thinking length).
//!
//! Reported per run: committed tokens/s (all generated tokens / wall time of the run, prefill
//! included), speedup over the plain run, acceptance rate (accepted / drafted) overall and per
//! draft position, mean acceptance length (1 + accepted / verification rounds), answer accuracy
//! (text after `</think>` parsed for "The answer is N."), and the break-even acceptance of the
//! fixed-k run from measured step costs. The greedy identity check compares every request's
//! committed tokens of every speculative run with the plain run of the same budget.

use std::path::Path;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{json, Value};

use specmla::engine::{DraftSource, Engine, EngineConfig, EngineStats, Prompt, Request};
use specmla::spec::policy::expected_tokens;
use specmla::spec::SpecMode;
use specmla::tokenizer::Tokenizer;
use specmla::{Error, Result};

use super::{progress, random_tokens, table, BenchArgs, Section};

/// One workload line (tools/train writes these; unknown fields are ignored).
#[derive(Clone, Debug, Deserialize)]
pub struct WorkItem {
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub answer: Option<Value>,
    #[serde(default)]
    pub natural_thinking_tokens: Option<usize>,
}

impl WorkItem {
    /// A greedy request for this prompt (token ids when the line has them).
    pub fn request(&self, max_tokens: usize) -> Request {
        let p = match (&self.prompt_token_ids, &self.prompt) {
            (Some(ids), _) => Prompt::Tokens(ids.clone()),
            (None, Some(t)) => Prompt::Text(t.clone()),
            (None, None) => Prompt::Tokens(vec![0]),
        };
        let mut r = Request::new(p);
        r.sampling.max_tokens = max_tokens;
        r
    }
}

/// Load up to `n` workload items; a missing file gives `n` random 16-token prompts (ids >= 3).
pub fn load_workload(
    path: &Path,
    n: usize,
    vocab: usize,
    seed: u64,
) -> Result<(Vec<WorkItem>, String)> {
    if !path.is_file() {
        let items = (0..n)
            .map(|i| WorkItem {
                prompt: None,
                prompt_token_ids: Some(random_tokens(
                    16,
                    vocab,
                    3.min(vocab as u32 - 1),
                    seed + i as u64,
                )),
                answer: None,
                natural_thinking_tokens: None,
            })
            .collect();
        return Ok((
            items,
            format!("{n} random 16-token prompts ({} not found)", path.display()),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut items = Vec::new();
    for (i, line) in text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .enumerate()
    {
        let it: WorkItem = serde_json::from_str(line).map_err(|e| {
            Error::InvalidArgument(format!("{} line {}: {e}", path.display(), i + 1))
        })?;
        if it.prompt.is_none() && it.prompt_token_ids.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{} line {}: no prompt",
                path.display(),
                i + 1
            )));
        }
        items.push(it);
    }
    let label = format!("{} prompts of {}", items.len(), path.display());
    Ok((items, label))
}

/// The number in "The answer is N." of `text`, if present.
pub fn parse_answer(text: &str) -> Option<String> {
    let rest = &text[text.find("The answer is ")? + "The answer is ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    (!digits.is_empty() && rest[digits.len()..].starts_with('.')).then_some(digits)
}

/// Whether `tokens` answer `item` correctly: decode what follows the first `</think>`.
fn is_correct(tok: &Tokenizer, think_end: u32, tokens: &[u32], item: &WorkItem) -> Option<bool> {
    let want = match item.answer.as_ref()? {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let Some(pos) = tokens.iter().position(|&t| t == think_end) else {
        return Some(false);
    };
    let text = tok.decode(&tokens[pos + 1..], true).ok()?;
    Some(parse_answer(&text).as_deref() == Some(want.as_str()))
}

/// The acceptance a at which speculation breaks even: E(k; a) = cost_k / cost_0, E(k; a) =
/// (1 - a^(k+1)) / (1 - a) expected committed tokens per verification. None when even a = 1
/// does not pay (cost ratio > k + 1).
pub fn break_even_acceptance(k: usize, cost_ratio: f64) -> Option<f64> {
    if cost_ratio <= 1.0 {
        return Some(0.0);
    }
    if cost_ratio > (k + 1) as f64 {
        return None;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if expected_tokens(mid, k) < cost_ratio {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(0.5 * (lo + hi))
}

/// One engine run of the workload.
struct Run {
    tokens: Vec<Vec<u32>>,
    wall_s: f64,
    stats: EngineStats,
}

impl Run {
    fn generated(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }
    fn tps(&self) -> f64 {
        self.generated() as f64 / self.wall_s
    }
    fn acceptance(&self) -> f64 {
        let t = &self.stats.totals;
        if t.drafted_tokens == 0 {
            0.0
        } else {
            t.accepted_tokens as f64 / t.drafted_tokens as f64
        }
    }
    fn per_position(&self) -> Vec<f64> {
        let t = &self.stats.totals;
        t.drafted_per_position
            .iter()
            .zip(t.accepted_per_position.iter().chain(std::iter::repeat(&0)))
            .map(|(&d, &a)| if d == 0 { 0.0 } else { a as f64 / d as f64 })
            .collect()
    }
    /// Wall seconds per engine step.
    fn step_cost(&self) -> f64 {
        self.wall_s / self.stats.steps.max(1) as f64
    }
}

#[allow(clippy::too_many_arguments)]
fn run_once(
    target: &Path,
    draft: DraftSource,
    base: &EngineConfig,
    spec: SpecMode,
    batch: usize,
    items: &[WorkItem],
    budgets: &[Option<usize>],
    max_tokens: usize,
) -> Result<Run> {
    let cfg = EngineConfig {
        spec,
        max_running: batch,
        ..base.clone()
    };
    let engine = Engine::new(target, draft, cfg)?;
    let reqs: Vec<Request> = items
        .iter()
        .zip(budgets)
        .map(|(it, b)| {
            let mut r = it.request(max_tokens);
            r.reasoning_budget = *b;
            r
        })
        .collect();
    let t = Instant::now();
    let res = super::run_to_completion(&engine, reqs)?;
    let wall_s = t.elapsed().as_secs_f64();
    Ok(Run {
        tokens: res.tokens,
        wall_s,
        stats: engine.stats(),
    })
}

pub fn run(a: &BenchArgs, target: &Path, draft: &Path, batches: &[usize]) -> Result<Section> {
    let target_cfg = specmla::config::ModelConfig::from_file(&target.join("config.json"))?;
    let n = a.prompts.unwrap_or(if a.quick { 8 } else { 32 });
    let (items, wl_label) = load_workload(&a.workload, n, target_cfg.vocab_size, a.seed)?;
    let tok = super::tokenizer_of(target)?;
    let think_end = tok.as_ref().and_then(|t| t.token_to_id("</think>"));
    let k = a.num_draft_tokens.max(1);
    let max_prompt = items
        .iter()
        .map(|it| it.prompt_token_ids.as_ref().map_or(512, Vec::len))
        .max()
        .unwrap_or(16);
    let block_size = 16;
    let per_req = (max_prompt + a.max_tokens + k + 2).div_ceil(block_size);
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let base = EngineConfig {
        threads: a.threads.max(1),
        kv_dtype: super::kv_dtype(a)?,
        draft_kv_dtype: None,
        block_size,
        num_blocks: per_req * max_batch + 8,
        draft_num_blocks: per_req * max_batch + 8,
        max_batch_tokens: 512,
        max_running: max_batch,
        prefix_cache: true,
        spec: SpecMode::Fixed(0),
        isa: crate::generate::parse_isa(&a.isa)?,
    };
    // budgets: none, and half the natural thinking length when the workload and tokenizer allow it
    let mut budget_sets: Vec<(String, Vec<Option<usize>>)> =
        vec![("none".into(), vec![None; items.len()])];
    let natural: Option<Vec<usize>> = items.iter().map(|it| it.natural_thinking_tokens).collect();
    if let (Some(nat), Some(_)) = (natural, think_end) {
        budget_sets.push((
            "50% natural".into(),
            nat.iter().map(|&x| Some(x / 2)).collect(),
        ));
    }
    let dsrc = || DraftSource::Dir(draft.to_path_buf());
    let mut rows = Vec::new();
    let mut runs_json = Vec::new();
    let mut identical = 0usize;
    let mut compared = 0usize;
    let mut acc_rows = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None; // plain, budget none, first batch
    let mut across_batches = true;
    for (bname, budgets) in &budget_sets {
        let mut first_plain: Option<Vec<Vec<u32>>> = None;
        for &b in batches {
            progress(&format!(
                "spec bench: budget {bname}, batch {b}: plain / k={k} / adaptive"
            ));
            let plain = run_once(
                target,
                DraftSource::None,
                &base,
                SpecMode::Fixed(0),
                b,
                &items,
                budgets,
                a.max_tokens,
            )?;
            let spec = run_once(
                target,
                dsrc(),
                &base,
                SpecMode::Fixed(k),
                b,
                &items,
                budgets,
                a.max_tokens,
            )?;
            let adaptive = run_once(
                target,
                dsrc(),
                &base,
                SpecMode::Adaptive { k_max: k },
                b,
                &items,
                budgets,
                a.max_tokens,
            )?;
            for other in [&spec, &adaptive] {
                for (x, y) in plain.tokens.iter().zip(&other.tokens) {
                    compared += 1;
                    identical += usize::from(x == y);
                }
            }
            match &first_plain {
                None => first_plain = Some(plain.tokens.clone()),
                Some(f) => across_batches &= *f == plain.tokens,
            }
            if bname == "none" && reference.is_none() {
                reference = Some(plain.tokens.clone());
            }
            // break-even from measured per-step costs of this batch size
            let ratio = spec.step_cost() / plain.step_cost();
            let be = break_even_acceptance(k, ratio);
            let draft_ms = 1e3 * spec.stats.time_draft_s / spec.stats.steps.max(1) as f64;
            let verify_ms = 1e3 * spec.stats.time_target_forward_s / spec.stats.steps.max(1) as f64;
            let target_ms =
                1e3 * plain.stats.time_target_forward_s / plain.stats.steps.max(1) as f64;
            rows.push(vec![
                bname.clone(),
                b.to_string(),
                format!("{:.1}", plain.tps()),
                format!("{:.1}", spec.tps()),
                format!("{:.2}x", spec.tps() / plain.tps()),
                format!("{:.1}", adaptive.tps()),
                format!("{:.2}x", adaptive.tps() / plain.tps()),
                format!("{:.1}%", 100.0 * spec.acceptance()),
                format!("{:.2}", spec.stats.mean_acceptance_length),
                spec.per_position()
                    .iter()
                    .map(|p| format!("{:.0}", 100.0 * p))
                    .collect::<Vec<_>>()
                    .join("/"),
                format!("{:.2}", ratio),
                be.map_or("none".into(), |x| format!("{:.1}%", 100.0 * x)),
            ]);
            let run_json = |r: &Run| {
                json!({
                    "tokens": r.generated(), "wall_s": r.wall_s, "tokens_per_s": r.tps(), "steps": r.stats.steps,
                    "acceptance": r.acceptance(), "acceptance_per_position": r.per_position(),
                    "mean_acceptance_length": r.stats.mean_acceptance_length,
                    "time_target_forward_s": r.stats.time_target_forward_s, "time_draft_s": r.stats.time_draft_s,
                    "counters": r.stats.totals,
                })
            };
            runs_json.push(json!({
                "budget": bname, "batch": b, "k": k,
                "plain": run_json(&plain), "spec": run_json(&spec), "adaptive": run_json(&adaptive),
                "speedup": spec.tps() / plain.tps(), "adaptive_speedup": adaptive.tps() / plain.tps(),
                "cost_ratio_k_over_0": ratio, "break_even_acceptance": be,
                "target_step_ms": target_ms, "verify_step_ms": verify_ms, "draft_ms_per_step": draft_ms,
            }));
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
                        let reasoning =
                            plain.stats.totals.reasoning_tokens as f64 / items.len() as f64;
                        acc_rows.push((bname.clone(), ok, correct.len(), reasoning));
                    }
                }
            }
        }
    }
    let mut text = format!(
        "target {}, draft {}, k = {k}, workload: {wl_label}, max_tokens {}, {} threads, KV {}\n",
        target.display(),
        draft.display(),
        a.max_tokens,
        a.threads,
        a.kv_dtype
    );
    text += &table(
        &[
            "budget",
            "batch",
            "plain tok/s",
            "k tok/s",
            "speedup",
            "adapt tok/s",
            "adapt x",
            "accept",
            "mean len",
            "accept/pos %",
            "cost k/0",
            "break-even a",
        ],
        &rows,
    );
    text += &format!(
        "greedy outputs identical with and without speculation: {} ({identical}/{compared} requests); plain outputs identical across batch sizes: {}\n",
        if identical == compared { "YES" } else { "NO" },
        if across_batches { "YES" } else { "NO" }
    );
    text += "break-even a: the per-token acceptance at which E(k) = (1 - a^(k+1)) / (1 - a) equals cost(k) / cost(0),\n  cost = measured wall time per engine step of the k-draft run and of the plain run (same batch, same workload).\n";
    let mut acc_json = Vec::new();
    for (bname, ok, n, reasoning) in &acc_rows {
        text += &format!(
            "answer accuracy (budget {bname}): {ok}/{n} = {:.1}% (mean reasoning tokens {reasoning:.1})\n",
            100.0 * *ok as f64 / *n as f64
        );
        acc_json.push(
            json!({"budget": bname, "correct": ok, "total": n, "mean_reasoning_tokens": reasoning}),
        );
    }
    if acc_rows.is_empty() {
        text += "answer accuracy: n/a (no tokenizer with </think> or no answers in the workload)\n";
    }
    let json = json!({
        "target": target.display().to_string(), "draft": draft.display().to_string(), "k": k,
        "workload": wl_label, "max_tokens": a.max_tokens, "runs": runs_json,
        "greedy_identical": identical == compared, "identical_requests": identical, "compared_requests": compared,
        "plain_identical_across_batches": across_batches, "answer_accuracy": acc_json,
    });
    Ok(Section {
        name: "speculation",
        json,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_answer_sentence() {
        assert_eq!(parse_answer("The answer is 7."), Some("7".into()));
        assert_eq!(parse_answer("xx The answer is 12.<eos>"), Some("12".into()));
        assert_eq!(parse_answer("The answer is 7"), None);
        assert_eq!(parse_answer("The answer is ."), None);
        assert_eq!(parse_answer("no answer"), None);
    }

    #[test]
    fn break_even_solves_expected_tokens() {
        for (k, ratio) in [(1usize, 1.5f64), (4, 2.0), (4, 1.2), (8, 3.0)] {
            let a = break_even_acceptance(k, ratio).unwrap();
            assert!(
                (expected_tokens(a, k) - ratio).abs() < 1e-9,
                "k={k} ratio={ratio} a={a}"
            );
        }
        assert_eq!(break_even_acceptance(4, 0.9), Some(0.0));
        assert_eq!(
            break_even_acceptance(2, 3.5),
            None,
            "cost above k+1 never pays"
        );
    }

    #[test]
    fn missing_workload_gives_random_prompts() {
        let (items, label) =
            load_workload(Path::new("/nonexistent/prompts.jsonl"), 5, 100, 1).unwrap();
        assert_eq!(items.len(), 5);
        assert!(items.iter().all(|it| it
            .prompt_token_ids
            .as_ref()
            .unwrap()
            .iter()
            .all(|&t| t < 100)));
        assert!(label.contains("random"));
    }
}

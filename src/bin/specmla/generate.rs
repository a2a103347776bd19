//! `specmla generate`: one prompt streamed, or a prompts file run as one continuous batch.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use specmla::engine::{DraftSource, Engine, EngineConfig, Prompt, Request};
use specmla::kv::KvDtype;
use specmla::sampling::SamplingParams;
use specmla::spec::SpecMode;
use specmla::{Error, Result};

#[derive(Args, Clone)]
pub struct GenerateArgs {
    /// Target model directory (config.json + safetensors [+ tokenizer.json]).
    #[arg(long, default_value = "models/target")]
    pub model: PathBuf,
    /// Draft model directory (speculative decoding).
    #[arg(long, conflicts_with = "ngram")]
    pub draft: Option<PathBuf>,
    /// Use the n-gram (prompt lookup) proposer instead of a draft model.
    #[arg(long, conflicts_with = "mtp")]
    pub ngram: bool,
    /// Draft with the target's own multi-token-prediction layer (DeepSeek-V3 or V4 MTP).
    #[arg(long, conflicts_with = "draft")]
    pub mtp: bool,
    /// Live A/B of two drafters, A,B[:SHARE_B] (each a draft model directory, `mtp`, `ngram` or
    /// `none`; SHARE_B of the prompts go to B, default 0.5): prints each arm's acceptance and
    /// tokens/s at the end.
    #[arg(long, conflicts_with_all = ["draft", "ngram", "mtp"])]
    pub ab: Option<String>,
    /// Draft tokens per step (the maximum with --adaptive).
    #[arg(long, default_value_t = 4)]
    pub num_draft_tokens: usize,
    /// Choose the draft length per request per step from measured acceptance and costs.
    #[arg(long)]
    pub adaptive: bool,
    /// Confidence cut of a draft model / MTP drafter: stop drafting for the step after a token
    /// the drafter gave a probability below this (0 = off; outputs unchanged).
    #[arg(long, default_value_t = specmla::engine::DEFAULT_DRAFT_P_MIN)]
    pub draft_p_min: f32,
    /// Maximum committed thinking tokens (omit for unlimited).
    #[arg(long, allow_negative_numbers = true)]
    pub reasoning_budget: Option<i64>,
    /// Prompt text (repeatable).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// File with one prompt per line.
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    pub token_ids: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Stop token id (repeatable).
    #[arg(long)]
    pub stop_token_id: Vec<u32>,
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object per prompt instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Include target log-probs of the committed tokens in the JSON.
    #[arg(long)]
    pub logprobs: bool,
    /// Workload label of every prompt (counters are also aggregated per label in the metrics).
    #[arg(long)]
    pub label: Option<String>,
    /// Second KV tier on disk: evicted prefix blocks (and every published prompt block) are kept
    /// in a file in DIR, which a later run of the same model and cache layout restores from.
    #[arg(long)]
    pub kv_offload_dir: Option<PathBuf>,
    /// Host-memory budget of the second KV tier in MiB (0 with no --kv-offload-dir: no tier).
    #[arg(long, default_value_t = 0)]
    pub kv_offload_mem_mb: usize,
    /// Write the engine's metrics (Prometheus text format) to FILE at exit.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Target KV cache dtype: f32, bf16, f16, fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Draft KV cache dtype (auto = the target's).
    #[arg(long, default_value = "auto")]
    pub draft_kv_dtype: String,
    /// V3.2 index-key cache dtype (auto = the target's KV dtype): f32, bf16, f16, fp8_e4m3.
    #[arg(long, default_value = "auto")]
    pub index_kv_dtype: String,
    /// Kernel instruction set: auto (the fastest this CPU has: avx512bf16 where present — bf16
    /// matmuls by vdpbf16ps, activations rounded to bf16), exact (the best level bitwise equal to
    /// portable: f32 results), portable, avx2, avx512, avx512bf16; opt-in only: amx.
    #[arg(long, default_value = "auto")]
    pub isa: String,
    /// Read the weights into huge pages instead of mapping the files (Linux transparent huge
    /// pages; a slower load for fewer TLB misses while decoding; same results).
    #[arg(long)]
    pub huge_pages: bool,
    /// Time every weight matmul by shape and print the sums to stderr at the end (calls,
    /// milliseconds, GB/s of weights): per-call evidence that whole-run timings on a noisy host
    /// cannot give. Same results; off by default.
    #[arg(long)]
    pub profile_matmuls: bool,
    /// Weight prefetch hint of the one-token streaming kernels: auto (L2 on AMD, L1
    /// elsewhere), l1, l2. Process-wide; never changes results.
    #[arg(long, default_value = "auto")]
    pub prefetch: String,
    /// Weight prefetch hint of the AVX512-BF16 tiles of several tokens (prefill, batches,
    /// verification): auto (L2 on AMD up to Zen 4, L1 on Zen 5 and elsewhere), l1, l2.
    /// Process-wide; never changes results.
    #[arg(long, default_value = "auto")]
    pub prefetch_tiles: String,
    /// Device of the target's forward: cpu, cuda or cuda:N (the CUDA backend: V2 / V3 targets,
    /// bf16 KV, bf16 routed experts; no prefix cache or KV tier there).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV pool size in blocks (target; the draft gets the same).
    #[arg(long, default_value_t = 4096)]
    pub num_blocks: usize,
    /// Per-step token budget (prefill chunking).
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Swap the drafter after N engine steps: N=DIR (DIR may be `none`, `ngram` or `mtp`); repeatable.
    #[arg(long)]
    pub swap_draft_after: Vec<String>,
    /// Acceptance guard on every --swap-draft-after swap: MIN:RATE (swap back when the new
    /// drafter's acceptance over its first MIN drafted tokens is below RATE) or MIN:Fx (below F
    /// times the previous drafter's acceptance).
    #[arg(long)]
    pub swap_guard: Option<String>,
}

/// `--swap-guard MIN:RATE` or `MIN:Fx`.
fn parse_guard(s: &str) -> Result<specmla::engine::SwapGuard> {
    use specmla::engine::{GuardThreshold, SwapGuard};
    let bad =
        || Error::InvalidArgument(format!("--swap-guard wants MIN:RATE or MIN:Fx, got `{s}`"));
    let (n, t) = s.split_once(':').ok_or_else(bad)?;
    let min_drafts = n.parse::<u64>().map_err(|_| bad())?;
    let threshold = match t.strip_suffix('x') {
        Some(f) => GuardThreshold::Relative(f.parse().map_err(|_| bad())?),
        None => GuardThreshold::Absolute(t.parse().map_err(|_| bad())?),
    };
    Ok(SwapGuard {
        min_drafts,
        threshold,
    })
}

pub fn draft_source(s: &str) -> DraftSource {
    match s {
        "none" => DraftSource::None,
        "ngram" => DraftSource::Ngram { min_n: 1, max_n: 4 },
        "mtp" => DraftSource::Mtp,
        d => DraftSource::Dir(PathBuf::from(d)),
    }
}

/// `--isa` value to an engine setting (None = best available); unknown names are an error.
pub fn parse_isa(s: &str) -> Result<Option<specmla::kernels::IsaLevel>> {
    specmla::kernels::IsaLevel::parse(s).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "--isa: unknown `{s}` (auto, exact, portable, avx2, avx512, avx512bf16, amx)"
        ))
    })
}

/// A prefetch hint option's value (`flag` names it in the error; None = this CPU's default).
fn parse_prefetch(flag: &str, s: &str) -> Result<Option<specmla::kernels::PrefetchHint>> {
    specmla::kernels::PrefetchHint::parse(s)
        .ok_or_else(|| Error::InvalidArgument(format!("{flag}: unknown `{s}` (auto, l1, l2)")))
}

/// `--prefetch` and `--prefetch-tiles` (generate and bench): both process-wide hints set, or
/// an error naming the option, before anything is set.
pub fn set_prefetch_hints(prefetch: &str, prefetch_tiles: &str) -> Result<()> {
    let one = parse_prefetch("--prefetch", prefetch)?;
    let tiles = parse_prefetch("--prefetch-tiles", prefetch_tiles)?;
    specmla::kernels::set_prefetch_hint(one);
    specmla::kernels::set_tile_prefetch_hint(tiles);
    Ok(())
}

pub fn engine_config(a: &GenerateArgs) -> Result<EngineConfig> {
    let kv_dtype = KvDtype::parse(&a.kv_dtype)?;
    let draft_kv_dtype = if a.draft_kv_dtype == "auto" {
        None
    } else {
        Some(KvDtype::parse(&a.draft_kv_dtype)?)
    };
    Ok(EngineConfig {
        threads: a.threads,
        kv_dtype,
        draft_kv_dtype,
        index_kv_dtype: if a.index_kv_dtype == "auto" {
            None
        } else {
            Some(KvDtype::parse(&a.index_kv_dtype)?)
        },
        block_size: a.block_size,
        num_blocks: a.num_blocks,
        draft_num_blocks: a.num_blocks,
        kv_window_blocks: None,
        max_batch_tokens: a.max_batch_tokens,
        max_running: a.max_running,
        prefix_cache: !a.no_prefix_cache,
        spec: if a.adaptive {
            SpecMode::Adaptive {
                k_max: a.num_draft_tokens,
            }
        } else {
            SpecMode::Fixed(a.num_draft_tokens)
        },
        draft_p_min: a.draft_p_min,
        isa: parse_isa(&a.isa)?,
        device: specmla::backend::Device::parse(&a.device)?,
        huge_page_weights: a.huge_pages,
        kv_offload: match (&a.kv_offload_dir, a.kv_offload_mem_mb) {
            (None, 0) => None,
            (dir, mb) => Some(specmla::kv::TierConfig {
                mem_bytes: mb << 20,
                dir: dir.clone(),
                ..Default::default()
            }),
        },
    })
}

pub fn build_requests(a: &GenerateArgs) -> Result<Vec<Request>> {
    let budget = match a.reasoning_budget {
        Some(b) if b < 0 => {
            return Err(Error::InvalidArgument(format!(
                "--reasoning-budget must be >= 0, got {b}"
            )))
        }
        b => b.map(|b| b as usize),
    };
    let mut prompts: Vec<Prompt> = a.prompt.iter().map(|p| Prompt::Text(p.clone())).collect();
    if let Some(f) = &a.prompts_file {
        let text = std::fs::read_to_string(f).map_err(|e| Error::Io {
            path: f.clone(),
            source: e,
        })?;
        prompts.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| Prompt::Text(l.to_string())),
        );
    }
    if let Some(ids) = &a.token_ids {
        let ids = ids
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| Error::InvalidArgument(format!("bad token id `{s}`")))
            })
            .collect::<Result<Vec<_>>>()?;
        prompts.push(Prompt::Tokens(ids));
    }
    if prompts.is_empty() {
        return Err(Error::InvalidArgument(
            "give --prompt, --prompts-file or --token-ids".into(),
        ));
    }
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        max_tokens: a.max_tokens,
        stop_token_ids: a.stop_token_id.clone(),
        stop_strings: a.stop.clone(),
        ignore_eos: a.ignore_eos,
    };
    Ok(prompts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = Request::new(p);
            r.sampling = SamplingParams {
                seed: sampling.seed.wrapping_add(i as u64),
                ..sampling.clone()
            };
            r.reasoning_budget = budget;
            r.logprobs = a.logprobs;
            r.label = a.label.clone();
            r
        })
        .collect())
}

fn parse_swaps(a: &GenerateArgs) -> Result<Vec<(u64, DraftSource)>> {
    let mut v = a
        .swap_draft_after
        .iter()
        .map(|s| {
            let (n, d) = s.split_once('=').ok_or_else(|| {
                Error::InvalidArgument(format!("--swap-draft-after wants N=DIR, got `{s}`"))
            })?;
            let n = n
                .parse::<u64>()
                .map_err(|_| Error::InvalidArgument(format!("bad step count in `{s}`")))?;
            Ok((n, draft_source(d)))
        })
        .collect::<Result<Vec<_>>>()?;
    v.sort_by_key(|x| x.0);
    Ok(v)
}

/// `--ab A,B[:SHARE_B]` to an A/B drafter.
pub fn parse_ab(s: &str) -> Result<DraftSource> {
    let bad = || Error::InvalidArgument(format!("--ab: expected A,B[:SHARE_B], found `{s}`"));
    let (arms, share) = match s.rsplit_once(':') {
        Some((arms, r)) => (
            arms,
            r.parse::<f64>()
                .ok()
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(bad)?,
        ),
        None => (s, 0.5),
    };
    let (x, y) = arms.split_once(',').ok_or_else(bad)?;
    if x.is_empty() || y.is_empty() {
        return Err(bad());
    }
    Ok(DraftSource::Ab {
        a: Box::new(draft_source(x)),
        b: Box::new(draft_source(y)),
        ratio_b: share,
    })
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let cfg = engine_config(&a)?;
    let draft = match (&a.draft, a.ngram, a.mtp, &a.ab) {
        (_, _, _, Some(s)) => parse_ab(s)?,
        (Some(d), _, _, _) => DraftSource::Dir(d.clone()),
        (None, true, _, _) => DraftSource::Ngram { min_n: 1, max_n: 4 },
        (None, false, true, _) => DraftSource::Mtp,
        _ => DraftSource::None,
    };
    let reqs = build_requests(&a)?;
    specmla::kernels::set_matmul_profiling(a.profile_matmuls);
    set_prefetch_hints(&a.prefetch, &a.prefetch_tiles)?;
    let mut swaps = parse_swaps(&a)?;
    swaps.reverse();
    let engine = Engine::new(&a.model, draft, cfg)?;
    let stream = !a.json && reqs.len() == 1;
    let n = reqs.len();
    let mut ids = Vec::with_capacity(n);
    for r in reqs {
        ids.push(engine.submit(r)?);
    }
    let mut outs: Vec<(String, Vec<u32>, Vec<f32>, String)> = vec![Default::default(); n];
    let guard = a.swap_guard.as_deref().map(parse_guard).transpose()?;
    let mut open = n;
    let mut steps = 0u64;
    let stdout = std::io::stdout();
    while open > 0 {
        while let Some((at, _)) = swaps.last() {
            if *at > steps {
                break;
            }
            let (_, src) = swaps.pop().expect("swap");
            let swapped = match &guard {
                Some(g) => engine.set_draft_weights_blocking_guarded(src, *g),
                None => engine.set_draft_weights_blocking(src),
            };
            match swapped {
                Ok(_) => {}
                Err(e) => eprintln!("specmla: draft swap refused (old draft keeps serving): {e}"),
            }
        }
        for ev in engine.step()? {
            let i = ids.iter().position(|&x| x == ev.id).expect("own request");
            let o = &mut outs[i];
            o.0.push_str(&ev.text);
            o.1.extend_from_slice(&ev.tokens);
            o.2.extend_from_slice(&ev.logprobs);
            if stream {
                let mut lock = stdout.lock();
                let _ = lock.write_all(ev.text.as_bytes());
                let _ = lock.flush();
            }
            if let Some(f) = ev.finish {
                if let specmla::engine::FinishReason::Error(m) = &f {
                    eprintln!("specmla: request {} failed: {m}", ev.id);
                }
                o.3 = f.as_str().to_string();
                open -= 1;
            }
        }
        steps += 1;
    }
    if stream {
        println!();
    }
    let stats = engine.stats();
    for (i, id) in ids.iter().enumerate() {
        let c = engine.request_counters(*id)?;
        let (text, toks, lps, fin) = &outs[i];
        if a.json {
            let mut v =
                json!({"text": text, "token_ids": toks, "finish_reason": fin, "counters": c});
            if a.logprobs {
                v["logprobs"] = json!(lps);
            }
            println!("{v}");
        } else if !stream {
            println!("{text}");
        }
        if !a.json {
            eprintln!(
                "[{}] {} tokens, finish={}, reasoning={} answer={} drafted={} accepted={} forced_end={} saved={}",
                id, toks.len(), fin, c.reasoning_tokens, c.answer_tokens, c.drafted_tokens, c.accepted_tokens,
                c.forced_end_of_think, c.draft_tokens_saved
            );
        }
    }
    if !a.json {
        eprintln!(
            "steps={} drafter={} generation={} mean_acceptance_length={:.2} target_forward={:.3}s draft={:.3}s",
            stats.steps, stats.drafter, stats.draft_generation, stats.mean_acceptance_length,
            stats.time_target_forward_s, stats.time_draft_s
        );
    }
    if a.profile_matmuls {
        print_matmul_profile();
    }
    for (arm, c, tpot) in engine.arm_stats() {
        let line = json!({
            "arm": arm,
            "drafted_tokens": c.drafted_tokens,
            "accepted_tokens": c.accepted_tokens,
            "acceptance": c.accepted_tokens as f64 / c.drafted_tokens.max(1) as f64,
            "generated_tokens": c.reasoning_tokens + c.answer_tokens + c.forced_tokens,
            // a request's decode rate: 1 / (time per output token), averaged over the arm
            "tokens_per_s": tpot.map(|t| 1.0 / t),
        });
        if a.json {
            println!("{}", json!({ "ab_arm": line }));
        } else {
            eprintln!(
                "ab arm {arm}: acceptance {:.3} ({} of {} drafts), {} tokens, {} tok/s per request",
                line["acceptance"].as_f64().unwrap_or(0.0),
                c.accepted_tokens,
                c.drafted_tokens,
                line["generated_tokens"],
                tpot.map_or("-".into(), |t| format!("{:.1}", 1.0 / t))
            );
        }
    }
    if let Some(path) = &a.metrics {
        std::fs::write(path, engine.metrics_text()).map_err(|e| Error::Io {
            path: path.clone(),
            source: e,
        })?;
    }
    let failed = outs.iter().filter(|o| o.3 == "error").count();
    if failed > 0 {
        return Err(Error::Engine(format!(
            "{failed} of {n} requests failed (reasons above)"
        )));
    }
    Ok(())
}

/// `--profile-matmuls`: the per-shape sums, the 30 longest first, then what the rest took
/// (`many`: one-token passes through several matrices at once, rows summed). Calls that run
/// side by side (an MoE layer's experts on both threads, the shared experts beside them) each
/// show their own wall time, so their GB/s is a per-call rate, not the machine's.
fn print_matmul_profile() {
    const SHOWN: usize = 30;
    let all = specmla::kernels::matmul_profile();
    eprintln!("matmul profile: rows x cols, tokens, calls, ms, weight GB/s");
    for s in all.iter().take(SHOWN) {
        let k = s.shape;
        eprintln!(
            "  {:6} x {:6} n={:<4}{} calls={:<7} ms={:9.2} GB/s={:6.1}",
            k.rows,
            k.cols,
            k.tokens,
            if k.many { " (many)" } else { "       " },
            s.calls,
            s.seconds * 1e3,
            s.weight_gb_s()
        );
    }
    if all.len() > SHOWN {
        let rest: f64 = all[SHOWN..].iter().map(|s| s.seconds).sum();
        eprintln!(
            "  ... {} more shapes, {:.2} ms",
            all.len() - SHOWN,
            rest * 1e3
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ab_specs_parse() {
        let DraftSource::Ab { a, b, ratio_b } = parse_ab("models/draft,mtp:0.25").unwrap() else {
            panic!("an A/B source");
        };
        assert!(matches!(*a, DraftSource::Dir(_)));
        assert!(matches!(*b, DraftSource::Mtp));
        assert_eq!(ratio_b, 0.25);
        let DraftSource::Ab { ratio_b, .. } = parse_ab("none,ngram").unwrap() else {
            panic!("an A/B source");
        };
        assert_eq!(ratio_b, 0.5);
        for bad in ["mtp", "mtp,", ",mtp", "a,b:1.5", "a,b:x"] {
            assert!(parse_ab(bad).is_err(), "{bad}");
        }
    }
}

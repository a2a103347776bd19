//! `specmla bench`: measured throughput of the real engine path, as ratios and roofline fractions.
//!
//! Modes (see docs/BENCHMARKS.md for results and method):
//! - engine (default; `--engine` forces it next to the others): the machine's read bandwidth and
//!   peak FLOP/s, prefill tokens/s and fraction of the compute bound, decode tokens/s at several
//!   batch sizes and the batch-1 fraction of the bandwidth roofline (`engine_bench.rs`), on a
//!   random V2-Lite-shaped checkpoint written by the bench (`random_model.rs`) or `--model DIR`.
//! - speculation (`--draft DIR`, or `--spec` for the default pair / next to `--swap`): committed tokens/s with and without a draft model, acceptance,
//!   break-even acceptance, reasoning budgets, answer accuracy, and the greedy identity check
//!   (`spec_bench.rs`).
//! - V3.2 indexer (`--v32`): decode cost of the lightning indexer and the savings of sparse
//!   attention at long context, a V3.2-shaped random model against its V3 twin (`v32_bench.rs`).
//! - V4 (`--v4`): decode tokens/s and KV bytes per token of a V4-shaped random model against a
//!   V3-shaped one of the same hidden size (`v4_bench.rs`).
//! - second KV tier (`--ttft`): time to first token of a long shared prefix restored from the
//!   tier (disk after a restart, host memory after an eviction) against recomputed
//!   (`ttft_bench.rs`).
//! - draft swaps (`--swap`): load/apply times, step latency around swaps, KV bytes per token per
//!   dtype, fp8 vs bf16 draft KV (`swap_bench.rs`).
//!
//! Every mode drives `Engine` through its public API only (submit / step / stats /
//! request_counters / set_draft_weights / swap_status). Output: a table on stdout, or one JSON
//! object with `--json` (progress goes to stderr either way).

mod engine_bench;
mod pairwise;
mod random_model;
mod roofline;
mod spec_bench;
mod spec_cell;
mod spec_runs;
mod swap_bench;
mod ttft_bench;
mod v32_bench;
mod v4_bench;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use serde_json::{json, Map, Value};

use specmla::engine::{Engine, Event, FinishReason, Request};
use specmla::kv::KvDtype;
use specmla::{Error, Result};

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Target model directory (default: a random V2-Lite-shaped benchmark model for the engine
    /// bench; models/target for --draft / --swap).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft model directory: run the speculation bench.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Run the draft-swap bench (draft: --draft or models/draft); alone unless --spec / --engine.
    #[arg(long)]
    pub swap: bool,
    /// Also run the engine bench when --draft or --swap is given.
    #[arg(long)]
    pub engine: bool,
    /// Run the speculation bench (implied by --draft unless --swap is given; default pair
    /// models/target + models/draft).
    #[arg(long)]
    pub spec: bool,
    /// Workload for the speculation and swap benches (JSON lines: prompt_token_ids or prompt,
    /// answer, natural_thinking_tokens). Missing file: random token-id prompts.
    #[arg(long, default_value = "models/workload/prompts.jsonl")]
    pub workload: PathBuf,
    /// Kernel instruction set: auto (the fastest this CPU has: avx512bf16 where present — bf16
    /// matmuls by vdpbf16ps, activations rounded to bf16), exact (the best level bitwise equal to
    /// portable: f32 results), portable, avx2, avx512, avx512bf16; opt-in only: amx.
    #[arg(long, default_value = "auto")]
    pub isa: String,
    /// Weight prefetch hint of the one-token streaming kernels: auto (L2 on AMD, L1
    /// elsewhere), l1, l2. Process-wide; never changes results.
    #[arg(long, default_value = "auto")]
    pub prefetch: String,
    /// Weight prefetch hint of the AVX512-BF16 tiles of several tokens (prefill, batches,
    /// verification): auto (L2 on AMD up to Zen 4, L1 on Zen 5 and elsewhere), l1, l2.
    /// Process-wide; never changes results.
    #[arg(long, default_value = "auto")]
    pub prefetch_tiles: String,
    /// Read the weights into huge pages instead of mapping the files (`generate --huge-pages`).
    #[arg(long)]
    pub huge_pages: bool,
    /// Worker threads of the engine and of the machine probes.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// ~30 s smoke run: smaller model and fewer steps and prompts.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Target KV cache dtype: f32, bf16, f16, fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Draft tokens per step (k) for fixed speculation; k_max for adaptive.
    #[arg(long, default_value_t = 4)]
    pub num_draft_tokens: usize,
    /// Speculation / swap benches: confidence cut of the model drafters (`generate
    /// --draft-p-min`; 0 = off).
    #[arg(long, default_value_t = specmla::engine::DEFAULT_DRAFT_P_MIN)]
    pub draft_p_min: f32,
    /// Batch sizes (concurrent requests), comma-separated.
    #[arg(long, default_value = "1,4,16")]
    pub batches: String,
    /// Prompt length of the prefill measurement (default 512; 128 with --quick).
    #[arg(long)]
    pub prefill_len: Option<usize>,
    /// Further prefill lengths measured after the first (default 2048; none with --quick).
    #[arg(long)]
    pub prefill_lens: Option<String>,
    /// Context lengths of the batch-1 long-context decode measurement (default 2048,8192;
    /// none with --quick; `none` to skip).
    #[arg(long)]
    pub long_contexts: Option<String>,
    /// Measured decode steps per batch size (default 24; 6 with --quick).
    #[arg(long)]
    pub decode_steps: Option<usize>,
    /// Measured decode steps per --long-contexts length (default 8; 4 with --quick): more steps
    /// average out a noisy machine (each costs one step at that context).
    #[arg(long)]
    pub long_steps: Option<usize>,
    /// Engine bench: sampling temperature of the batched decode measurement (0 = greedy).
    /// Greedy continuations and the random token per sequence and step that
    /// `llama-batched-bench` feeds reach different numbers of distinct experts (on the widened
    /// target greedy reaches more); a high temperature (e.g. 100: near-uniform over the
    /// vocabulary) makes the two token streams alike (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 0.0)]
    pub decode_temperature: f32,
    /// Rounds of the interleaved batch-1 roofline measurement (default 5; 2 with --quick; 0 to
    /// skip): each round probes the read bandwidth, then times decode steps right after it, so
    /// the bandwidth fraction compares the two under the same host conditions.
    #[arg(long)]
    pub roofline_rounds: Option<usize>,
    /// Workload prompts per speculation run (default 32; 8 with --quick).
    #[arg(long)]
    pub prompts: Option<usize>,
    /// Max generated tokens per request in speculation / swap runs.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Where the random benchmark model is written (removed afterwards).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Speculation bench drafters, comma-separated: draft, draft-weak, mtp, ngram.
    #[arg(long, default_value = "draft,draft-weak,mtp,ngram")]
    pub drafters: String,
    /// Speculation bench draft lengths k (adaptive always runs too, with k_max = the largest).
    #[arg(long, default_value = "1,2,4,8")]
    pub ks: String,
    /// Speculation bench: R more (plain, spec) pairs per run, back to back, and the median of
    /// their ratios (a noisy host changes speed between runs a minute apart; 0 = off).
    #[arg(long, default_value_t = 0)]
    pub paired: usize,
    /// Speculation bench: R interleaved (plain, spec) runs per row: both engines serve the
    /// workload at once, the one with fewer committed tokens stepping next (so they pass
    /// through the workload together), each engine timed over its own steps only, so a change
    /// of the host's speed (seconds to minutes here) hits both alike; reports the median of the
    /// R ratios (0 = off).
    #[arg(long, default_value_t = 0)]
    pub interleaved: usize,
    /// Speculation bench: the requests arrive one every S engine steps (the plain and the
    /// speculative engine alike; 0 = all at once). All at once, the bundled workload's requests
    /// (one template) decode in lockstep and their tokens of one step share experts: at batch
    /// 16 on the widened target a plain step read ~28 experts' weights against ~55 with
    /// staggered arrivals, and one accepted draft moved a request out of step and cost the
    /// speculative engine ~4 % per step (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 1)]
    pub stagger: usize,
    /// Speculation bench: skip the widened (memory-bound) copy of the target.
    #[arg(long)]
    pub no_wide: bool,
    /// Run the V3.2 indexer bench: a V3.2-shaped random model vs its V3 twin, batch-1 decode at
    /// the --long-contexts lengths (default 2048,8192); alone unless --engine / --spec / --swap.
    #[arg(long)]
    pub v32: bool,
    /// Run the V4 bench: a V4-shaped random model vs a V3-shaped one of the same hidden size,
    /// batch-1 decode tokens/s and KV bytes per token at the --long-contexts lengths.
    #[arg(long)]
    pub v4: bool,
    /// Run the second-KV-tier bench: time to first token of a --prefill-len-token shared prefix
    /// restored (from the offload file after a restart, from host memory after an eviction) vs
    /// recomputed.
    #[arg(long)]
    pub ttft: bool,
}

/// Submit a `ctx`-token random prompt wanting `1 + warmup + steps` tokens and step `engine` until
/// its first token (the prefill), then `warmup` more steps: the next `steps` steps are decode
/// steps at context ~`ctx` (the long-context benches time them).
pub(crate) fn prefill_then_warm(
    engine: &specmla::engine::Engine,
    vocab: usize,
    ctx: usize,
    warmup: usize,
    steps: usize,
    seed: u64,
) -> Result<()> {
    let mut r = specmla::engine::Request::new(specmla::engine::Prompt::Tokens(random_tokens(
        ctx, vocab, 3, seed,
    )));
    r.sampling.max_tokens = 1 + warmup + steps;
    r.sampling.ignore_eos = true;
    engine.submit(r)?;
    let (mut got, mut guard) = (0, 0);
    while got == 0 {
        got += engine.step()?.iter().map(|e| e.tokens.len()).sum::<usize>();
        guard += 1;
        if guard > 10_000 {
            return Err(specmla::Error::Engine(
                "bench: prefill did not finish".into(),
            ));
        }
    }
    for _ in 0..warmup {
        engine.step()?;
    }
    Ok(())
}

/// One bench section: JSON for machines, lines for people.
pub struct Section {
    pub name: &'static str,
    pub json: Value,
    pub text: String,
}

/// Progress line on stderr.
pub fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}

pub fn parse_batches(s: &str) -> Result<Vec<usize>> {
    let v = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| Error::InvalidArgument(format!("--batches: bad number `{x}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    if v.is_empty() || v.contains(&0) {
        return Err(Error::InvalidArgument(
            "--batches wants positive numbers".into(),
        ));
    }
    Ok(v)
}

/// A comma-separated list of lengths, or `none` (empty); `default` when absent.
pub fn parse_lengths(s: Option<&str>, default: &[usize], what: &str) -> Result<Vec<usize>> {
    match s {
        None => Ok(default.to_vec()),
        Some(t) if t.trim() == "none" || t.trim().is_empty() => Ok(Vec::new()),
        Some(t) => t
            .split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(v) if v > 0 => Ok(v),
                _ => Err(Error::InvalidArgument(format!(
                    "--{what}: bad length `{x}`"
                ))),
            })
            .collect(),
    }
}

/// Peak and current resident set size of this process in bytes (`VmHWM`, `VmRSS` from
/// /proc/self/status; None where that file does not exist).
pub fn rss_bytes() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    Some((kb_field(&s, "VmHWM:")?, kb_field(&s, "VmRSS:")?))
}

/// This process's anonymous memory in 2 MB pages (`AnonHugePages`: weights packed into bf16
/// strips, files copied by `--huge-pages`), where Linux reports it.
pub fn anon_huge_bytes() -> Option<u64> {
    kb_field(
        &std::fs::read_to_string("/proc/self/smaps_rollup").ok()?,
        "AnonHugePages:",
    )
}

/// The value in bytes of the `name  N kB` line of a /proc file's text.
fn kb_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// The q-th percentile (0..=100, nearest rank) of `xs`; 0 for an empty slice.
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// (smallest, largest) of `xs` ((inf, -inf) when empty).
pub fn min_max(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// A plain-text table with right-aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.len());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:>1$}", c, w[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    out.push_str(
        &w.iter()
            .map(|n| "-".repeat(*n))
            .collect::<Vec<_>>()
            .join("  "),
    );
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out.push('\n');
    out
}

/// Outcome of driving a set of requests to completion.
pub struct RunResult {
    /// Per request, in submission order: committed token ids.
    pub tokens: Vec<Vec<u32>>,
    pub wall_s: f64,
}

/// Submit every request, step until all finish; a request failing is an error.
pub fn run_to_completion(engine: &Engine, reqs: Vec<Request>) -> Result<RunResult> {
    run_staggered(engine, reqs, 0)
}

/// [`run_to_completion`] with the requests arriving one every `every` steps
/// ([`Submitted::staggered`]).
pub fn run_staggered(engine: &Engine, reqs: Vec<Request>, every: usize) -> Result<RunResult> {
    let t0 = Instant::now();
    let mut run = Submitted::staggered(engine, reqs, every)?;
    while !run.done() {
        run.absorb(engine.step()?)?;
        run.arrive(engine)?;
    }
    Ok(RunResult {
        tokens: run.tokens,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// Requests submitted to one engine and what their steps committed so far (the drivers of
/// `run_to_completion` and the spec bench's runs), all at once or arriving one every few
/// engine steps ([`Submitted::staggered`]).
pub struct Submitted {
    ids: Vec<u64>,
    /// Per request, in submission order: committed token ids.
    pub tokens: Vec<Vec<u32>>,
    open: usize,
    /// Requests still to arrive, in order.
    pending: std::collections::VecDeque<Request>,
    /// Engine steps between two arrivals (0: every request at once).
    every: usize,
    /// Steps absorbed so far.
    steps: usize,
}

impl Submitted {
    /// The first request now, then one every `every` engine steps (0: all now); the driver
    /// calls [`Self::arrive`] after each step it absorbs.
    pub fn staggered(engine: &Engine, reqs: Vec<Request>, every: usize) -> Result<Self> {
        let n = reqs.len();
        let mut s = Submitted {
            ids: Vec::with_capacity(n),
            tokens: vec![Vec::new(); n],
            open: n,
            pending: reqs.into(),
            every,
            steps: 0,
        };
        s.arrive(engine)?;
        Ok(s)
    }

    /// Submit the requests due before the next step.
    pub fn arrive(&mut self, engine: &Engine) -> Result<()> {
        while !self.pending.is_empty()
            && (self.every == 0 || self.steps >= self.ids.len() * self.every)
        {
            let r = self.pending.pop_front().expect("not empty");
            self.ids.push(engine.submit(r)?);
        }
        Ok(())
    }

    /// Tokens committed so far, all requests together.
    pub fn committed(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }

    /// Whether every request has finished.
    pub fn done(&self) -> bool {
        self.open == 0
    }

    /// Take one step's events; a request that failed is an error.
    pub fn absorb(&mut self, events: Vec<Event>) -> Result<()> {
        self.steps += 1;
        for ev in events {
            let Some(i) = self.ids.iter().position(|&x| x == ev.id) else {
                continue;
            };
            self.tokens[i].extend_from_slice(&ev.tokens);
            if let Some(f) = ev.finish {
                if let FinishReason::Error(m) = f {
                    return Err(Error::Engine(format!(
                        "bench request {} failed: {m}",
                        ev.id
                    )));
                }
                self.open -= 1;
            }
        }
        Ok(())
    }
}

/// Deterministic random token ids in [lo, vocab).
pub fn random_tokens(n: usize, vocab: usize, lo: u32, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let span = (vocab as u64).saturating_sub(lo as u64).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x % span) as u32
        })
        .collect()
}

fn default_dir(p: &Option<PathBuf>, d: &str) -> PathBuf {
    p.clone().unwrap_or_else(|| PathBuf::from(d))
}

fn machine_load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn kv_dtype(a: &BenchArgs) -> Result<KvDtype> {
    KvDtype::parse(&a.kv_dtype)
}

pub fn run(a: BenchArgs) -> Result<()> {
    let batches = parse_batches(&a.batches)?;
    crate::generate::set_prefetch_hints(&a.prefetch, &a.prefetch_tiles)?;
    specmla::weights::set_huge_page_weights(a.huge_pages);
    let run_spec = a.spec || (a.draft.is_some() && !a.swap);
    let run_engine = a.engine || (!run_spec && !a.swap && !a.v32 && !a.v4 && !a.ttft);
    let mut sections: Vec<Section> = Vec::new();
    let t0 = Instant::now();
    let load_before = machine_load();
    if run_engine {
        let scratch_base = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        sections.push(engine_bench::run(
            &a,
            a.model.as_deref(),
            &scratch_base,
            &batches,
        )?);
    }
    if run_spec {
        let target = default_dir(&a.model, "models/target");
        let draft = default_dir(&a.draft, "models/draft");
        sections.push(spec_bench::run(&a, &target, &draft, &batches)?);
    }
    if a.swap {
        let target = default_dir(&a.model, "models/target");
        let draft = default_dir(&a.draft, "models/draft");
        sections.push(swap_bench::run(&a, &target, &draft)?);
    }
    if a.v32 {
        let scratch_base = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        sections.push(v32_bench::run(&a, &scratch_base)?);
    }
    if a.v4 {
        let scratch_base = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        sections.push(v4_bench::run(&a, &scratch_base)?);
    }
    if a.ttft {
        let scratch_base = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        sections.push(ttft_bench::run(&a, &scratch_base)?);
    }
    let load_after = machine_load();
    if a.json {
        let mut m = Map::new();
        m.insert("loadavg_before".into(), json!(load_before));
        m.insert("loadavg_after".into(), json!(load_after));
        m.insert("threads".into(), json!(a.threads));
        m.insert("quick".into(), json!(a.quick));
        m.insert("wall_s".into(), json!(t0.elapsed().as_secs_f64()));
        for s in &sections {
            m.insert(s.name.into(), s.json.clone());
        }
        println!("{}", Value::Object(m));
    } else {
        println!("machine load (1/5/15-min loadavg): before {load_before}; after {load_after}");
        for s in &sections {
            println!("\n== {} ==\n{}", s.name, s.text);
        }
        println!("bench wall time {:.1} s", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Open a model's tokenizer (None when the directory has no tokenizer.json).
pub fn tokenizer_of(dir: &Path) -> Result<Option<Arc<specmla::tokenizer::Tokenizer>>> {
    Ok(specmla::tokenizer::Tokenizer::from_model_dir(dir)?.map(Arc::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn batches_parse_and_refuse_zero() {
        assert_eq!(parse_batches("1, 4,16").unwrap(), vec![1, 4, 16]);
        assert!(parse_batches("1,0").is_err());
        assert!(parse_batches("x").is_err());
    }

    #[test]
    fn random_tokens_stay_in_range() {
        let t = random_tokens(1000, 50, 3, 9);
        assert!(t.iter().all(|&x| (3..50).contains(&x)));
        assert_eq!(t, random_tokens(1000, 50, 3, 9));
        assert_ne!(t, random_tokens(1000, 50, 3, 10));
    }

    /// Staggered arrivals: request i reaches the engine only after i x `every` steps (its first
    /// token comes no earlier), all at once they start together, and the arrival pattern never
    /// changes what a request generates.
    #[test]
    fn staggered_requests_arrive_one_every_few_steps() {
        use specmla::engine::{DraftSource, EngineConfig, Prompt};
        let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/target");
        let reqs = || -> Vec<Request> {
            (0..3)
                .map(|i| {
                    let mut r = Request::new(Prompt::Tokens(random_tokens(6, 100, 5, 7 + i)));
                    r.sampling.max_tokens = 12;
                    r.sampling.ignore_eos = true;
                    r
                })
                .collect()
        };
        // (the step after which each request got its first token, what each generated)
        let drive = |every: usize| -> (Vec<usize>, Vec<Vec<u32>>) {
            let engine = Engine::new(&target, DraftSource::None, EngineConfig::default())
                .expect("bundled target");
            let mut run = Submitted::staggered(&engine, reqs(), every).expect("submit");
            let mut first = vec![0usize; 3];
            while !run.done() {
                run.absorb(engine.step().expect("step")).expect("absorb");
                for (f, t) in first.iter_mut().zip(&run.tokens) {
                    if *f == 0 && !t.is_empty() {
                        *f = run.steps;
                    }
                }
                run.arrive(&engine).expect("arrive");
                assert!(run.steps < 1000, "never finished");
            }
            (first, run.tokens)
        };
        let (first0, tokens0) = drive(0);
        assert_eq!(first0, vec![1, 1, 1], "all at once: one prefill step");
        let (first3, tokens3) = drive(3);
        for (i, &f) in first3.iter().enumerate() {
            assert!(f > 3 * i, "request {i} answered after step {f}: {first3:?}");
        }
        assert!(first3[2] > first3[0], "{first3:?}");
        assert_eq!(tokens3, tokens0);
        assert!(tokens0.iter().all(|t| t.len() == 12), "{tokens0:?}");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&["a", "bbb"], &[vec!["1234".into(), "x".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "   a  bbb");
        assert_eq!(lines[2], "1234    x");
    }
}

//! What a decode step costs as drafted tokens are added to it:
//! `cargo bench --bench step_cost -- [MODEL_DIR] [BATCH] [REPS] [K]` (default models/target, 16,
//! 40, 1).
//!
//! Why: the adaptive policy (`spec::policy`) prices a drafted token from timed engine steps,
//! whose drafts it chose itself, on a host whose speed swings by 5-30 % within minutes. This
//! bench takes the policy out: BATCH sequences of the bundled workload (prompts in
//! `models/workload/prompts.jsonl`, each cut K + 1 tokens short) decode one step each, and `d` of
//! them also verify K drafted tokens (the prompt's next tokens), for d in 0, 1, 2, 3, 4, 6, 8,
//! 12, 16 (up to BATCH); the d values rotate within each repetition, so the host's changes hit
//! every d alike. Prints, per d, the median step time, its excess over d = 0 and the excess
//! per drafted token, and the weight bytes the step needed (the engine's count): the shape of
//! the step's cost in d, which the policy's price model must follow.
//!
//! Same threads as the engine (2 by default, `SPECMLA_BENCH_THREADS`), the default ISA level,
//! weights warm (one untimed round first).

use std::path::PathBuf;
use std::time::Instant;

use specmla::kernels::{pin_thread, Isa};
use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let dir = PathBuf::from(args.first().map_or("models/target", |s| s.as_str()));
    let batch: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(40);
    // drafted tokens per drafting request
    let k: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let threads: usize = std::env::var("SPECMLA_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let isa = Isa::detect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| pin_thread(Some(isa)))
        .build()
        .expect("rayon pool");
    let model = Model::load_dir(&dir).expect("model");
    let prompts = workload_prompts(batch);
    let cfg = &model.config;
    let blocks = prompts.iter().map(|p| p.len() / 16 + 2).sum::<usize>() + 8;
    let mut kv = KvCache::new(KvConfig::for_model(cfg, 16, blocks, KvDtype::Bf16)).expect("kv");
    // Each sequence holds its prompt but the last K + 1 tokens: [len - K - 1] cached.
    let mut seqs: Vec<SeqKv> = Vec::new();
    for p in &prompts {
        let mut s = SeqKv::new();
        let plan = kv.plan_grow(&s, p.len()).expect("kv plan");
        kv.commit_grow(&mut s, plan);
        seqs.push(s);
    }
    pool.install(|| {
        for (s, p) in seqs.iter().zip(&prompts) {
            let n = p.len() - k - 1;
            let chunk = SeqChunk {
                kv: s,
                start: 0,
                tokens: &p[..n],
                mha_until: n,
                logits: LogitsMode::Last,
            };
            model.forward(&mut kv, &[chunk]).expect("prefill");
        }
    });
    let ds: Vec<usize> = [0, 1, 2, 3, 4, 6, 8, 12, 16]
        .into_iter()
        .filter(|&d| d <= batch)
        .collect();
    // One decode step with d drafted tokens -> (seconds, weight bytes).
    let mut step = |d: usize| -> (f64, u64) {
        // the drafting requests: d of them, spread over the batch
        let drafting = |r: usize| d > 0 && (r * d) % batch < d;
        let chunks: Vec<SeqChunk> = seqs
            .iter()
            .zip(&prompts)
            .enumerate()
            .map(|(r, (s, p))| {
                let n = p.len() - k - 1;
                let extra = if drafting(r) { k } else { 0 };
                SeqChunk {
                    kv: s,
                    start: n,
                    tokens: &p[n..n + 1 + extra], // [1 + extra]
                    mha_until: n,
                    logits: if extra > 0 {
                        LogitsMode::All
                    } else {
                        LogitsMode::Last
                    },
                }
            })
            .collect();
        let t0 = Instant::now();
        let out = pool
            .install(|| model.forward_out(&mut kv, &chunks, false))
            .expect("step");
        (t0.elapsed().as_secs_f64(), out.weight_bytes)
    };
    // [d index] -> step seconds per repetition; weight bytes per d
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); ds.len()];
    let mut bytes = vec![0u64; ds.len()];
    for rep in 0..=reps {
        for j in 0..ds.len() {
            let i = (j + rep) % ds.len();
            let (dt, b) = step(ds[i]);
            if rep > 0 {
                times[i].push(dt);
            }
            bytes[i] = b;
        }
    }
    println!(
        "decode step of {batch} sequences, d of them verifying {k} drafted tokens, {} ({threads} threads, {isa:?}), \
         medians of {reps}:",
        dir.display()
    );
    println!("   d   step ms   excess ms   ms/draft   weight MB   MB/draft   (draft = one request's {k} tokens)");
    let meds: Vec<f64> = times.iter_mut().map(|t| median(t)).collect(); // [d index] seconds
    for (i, &d) in ds.iter().enumerate() {
        let m = meds[i];
        let ex = (m - meds[0]) * 1e3;
        let mb = bytes[i] as f64 / 1e6;
        let mb_ex = (bytes[i] as f64 - bytes[0] as f64) / 1e6;
        if d == 0 {
            println!(
                "{d:4} {:9.2} {:>11} {:>10} {mb:11.1} {:>10}",
                m * 1e3,
                "-",
                "-",
                "-"
            );
        } else {
            println!(
                "{d:4} {:9.2} {ex:11.2} {:10.2} {mb:11.1} {:10.1}",
                m * 1e3,
                ex / d as f64,
                mb_ex / d as f64
            );
        }
    }
    if std::env::var_os("SPECMLA_STEP_PROFILE").is_some() {
        let pick: Vec<usize> = [0, 1, 3, 16].into_iter().filter(|&d| d <= batch).collect();
        let moe_inter = model
            .config
            .moe
            .as_ref()
            .map_or(0, |m| m.moe_intermediate_size);
        let expert = (moe_inter, model.config.hidden_size);
        profile_by_family(&mut |d| step(d).0, &pick, reps.max(1), expert);
    }
}

/// Per-call matmul sums by matrix family for `steps` steps of each d (`SPECMLA_STEP_PROFILE=1`):
/// where a drafted token's time goes. A routed expert's products ([inter, hidden] and [hidden,
/// inter], `expert`) are one family; its one-token gate + up passes show as `many`. Calls that run
/// side by side (an MoE layer's experts on both threads) each count their own wall time.
fn profile_by_family(
    run: &mut dyn FnMut(usize) -> f64,
    ds: &[usize],
    steps: usize,
    expert: (usize, usize),
) {
    use specmla::kernels::{matmul_profile, reset_matmul_profile, set_matmul_profiling};
    println!("per step, ms: step, matmul sums by family (rows x cols)");
    for &d in ds {
        reset_matmul_profile();
        set_matmul_profiling(true);
        let mut wall = 0.0;
        for _ in 0..steps {
            wall += run(d);
        }
        set_matmul_profiling(false);
        let mut fam: std::collections::BTreeMap<String, f64> = Default::default();
        for s in matmul_profile() {
            let k = s.shape;
            let (inter, hidden) = expert;
            let routed = inter > 0
                && ((k.rows, k.cols) == (inter, hidden) || (k.rows, k.cols) == (hidden, inter));
            let name = match (k.rows, k.cols) {
                _ if routed && !k.many => "routed experts".to_string(),
                (r, c) => format!("{r}x{c}{}", if k.many { " many" } else { "" }),
            };
            *fam.entry(name).or_default() += s.seconds;
        }
        let total: f64 = fam.values().sum();
        let parts: Vec<String> = fam
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", v * 1e3 / steps as f64))
            .collect();
        println!(
            "d={d:3}: step {:.2}, matmuls {:.2}: {}",
            wall * 1e3 / steps as f64,
            total * 1e3 / steps as f64,
            parts.join(", ")
        );
    }
}

/// The median of `v` (sorted in place; not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The first `n` workload prompts' token ids (cycled when the workload has fewer).
fn workload_prompts(n: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string("models/workload/prompts.jsonl").expect("workload");
    let all: Vec<Vec<u32>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("workload line");
            v["prompt_token_ids"]
                .as_array()
                .expect("prompt_token_ids")
                .iter()
                .map(|t| t.as_u64().expect("token id") as u32)
                .collect()
        })
        .collect();
    (0..n).map(|i| all[i % all.len()].clone()).collect()
}

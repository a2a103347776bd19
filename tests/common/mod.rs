//! Shared helpers for integration tests: golden fixtures, KV caches, single-sequence forwards.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Request};
use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};
use specmla::spec::SpecMode;
use specmla::weights::{WeightSource, WeightStore};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("models/golden"))
        .expect("models/golden")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    v.sort();
    v
}

/// Reference prompts (token ids) and full-forward logits [len, vocab] of a golden fixture.
pub fn golden_reference(dir: &Path) -> Vec<(Vec<u32>, Vec<f32>)> {
    reference_cases(&dir.join("reference.safetensors"), "logits_full")
}

/// Cases `prompt_{i}` (i64 token ids) + `{values}_{i}` (f32) of a reference safetensors file.
pub fn reference_cases(path: &Path, values: &str) -> Vec<(Vec<u32>, Vec<f32>)> {
    let st = WeightStore::open(WeightSource::File(path.to_path_buf())).expect("reference");
    let mut out = Vec::new();
    for i in 0.. {
        let Some(p) = st.get(&format!("prompt_{i}")) else {
            break;
        };
        let ids: Vec<u32> = p
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect();
        let l = st.get(&format!("{values}_{i}")).expect("reference values");
        let logits: Vec<f32> = l
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        out.push((ids, logits));
    }
    out
}

/// The config.json of `dir` edited by `edit`, parsed.
pub fn config_with(
    dir: &Path,
    edit: impl Fn(&mut serde_json::Value),
) -> specmla::Result<specmla::config::ModelConfig> {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    specmla::config::ModelConfig::from_json_str(&v.to_string())
}

/// One full forward of `ids` (f32 KV): the hidden states it hands the MTP drafter.
/// -> [len, Model::hidden_state_width()]
pub fn target_hidden(model: &Model, ids: &[u32], block_size: usize) -> Vec<f32> {
    let n = ids.len();
    let mut kv = KvCache::new(KvConfig::for_model(
        &model.config,
        block_size,
        n.div_ceil(block_size) + 1,
        KvDtype::F32,
    ))
    .unwrap();
    let mut seq = SeqKv::new();
    let plan = kv.plan_grow(&seq, n).unwrap();
    kv.commit_grow(&mut seq, plan);
    let chunk = SeqChunk {
        kv: &seq,
        start: 0,
        tokens: ids,
        mha_until: n,
        logits: LogitsMode::None,
    };
    let out = model.forward_out(&mut kv, &[chunk], true).unwrap();
    assert_eq!(out.hidden.len(), n * model.hidden_state_width());
    out.hidden
}

pub fn kv_for(model: &Model, dtype: KvDtype, num_blocks: usize) -> KvCache {
    let c = &model.config;
    KvCache::new(KvConfig::for_model(c, 16, num_blocks, dtype)).unwrap()
}

/// Run `tokens` through the model in chunks of the given sizes (all through the path chosen by
/// `mha_until`), returning the logits of every position [len, vocab].
pub fn run_chunked(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    chunk: usize,
    mha_until: usize,
) -> Vec<f32> {
    let mut seq = SeqKv::new();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < tokens.len() {
        let end = (pos + chunk).min(tokens.len());
        let plan = kv.plan_grow(&seq, end).unwrap();
        kv.commit_grow(&mut seq, plan);
        let l = model
            .forward(
                kv,
                &[SeqChunk {
                    kv: &seq,
                    start: pos,
                    tokens: &tokens[pos..end],
                    mha_until,
                    logits: LogitsMode::All,
                }],
            )
            .unwrap();
        out.extend_from_slice(&l);
        kv.set_len(&mut seq, end);
        pos = end;
    }
    kv.free(&mut seq);
    out
}

/// Output `a` drafted exactly what `b` drafted: drafted and accepted tokens per draft position
/// (e.g. a drafter whose state was restored from a cache against one that recomputed it).
pub fn assert_same_drafts(label: &str, a: &Output, b: &Output) {
    assert_eq!(
        (
            &a.counters.drafted_per_position,
            &a.counters.accepted_per_position
        ),
        (
            &b.counters.drafted_per_position,
            &b.counters.accepted_per_position
        ),
        "{label}: drafted / accepted per position differ"
    );
}

/// The prompt token ids of the first `n` bundled workload prompts (models/workload/prompts.jsonl).
pub fn workload_prompt_ids(n: usize) -> Vec<Vec<u32>> {
    let text =
        std::fs::read_to_string(repo().join("models/workload/prompts.jsonl")).expect("workload");
    text.lines()
        .take(n)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["prompt_token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// All `prompts` in ONE forward call (a ragged batch; prompt 0 through the decompressed path,
/// the others through the absorbed one) on the current rayon pool: the logits of every position
/// of every prompt, prompt after prompt. The sequences are freed afterwards.
pub fn ragged_forward(model: &Model, kv: &mut KvCache, prompts: &[&[u32]]) -> Vec<f32> {
    let mut seqs: Vec<SeqKv> = prompts.iter().map(|_| SeqKv::new()).collect();
    for (s, ids) in seqs.iter_mut().zip(prompts) {
        let p = kv.plan_grow(s, ids.len()).unwrap();
        kv.commit_grow(s, p);
    }
    let chunks: Vec<SeqChunk> = seqs
        .iter()
        .zip(prompts)
        .enumerate()
        .map(|(i, (s, ids))| SeqChunk {
            kv: s,
            start: 0,
            tokens: ids,
            mha_until: if i == 0 { ids.len() } else { 0 },
            logits: LogitsMode::All,
        })
        .collect();
    let got = model.forward(kv, &chunks).unwrap();
    drop(chunks);
    for s in seqs.iter_mut() {
        kv.free(s);
    }
    got
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Per-row comparison of logits [rows, vocab] with a reference: (median of the rows' max |diff|,
/// rows whose argmax agrees).
pub fn median_row_error_and_agreement(
    got: &[f32],
    reference: &[f32],
    vocab: usize,
) -> (f32, usize) {
    let mut rows: Vec<f32> = got
        .chunks(vocab)
        .zip(reference.chunks(vocab))
        .map(|(a, b)| max_abs_diff(a, b))
        .collect();
    let agree = got
        .chunks(vocab)
        .zip(reference.chunks(vocab))
        .filter(|(a, b)| specmla::sampling::argmax(a) == specmla::sampling::argmax(b))
        .count();
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (rows[rows.len() / 2], agree)
}

/// A pool whose workers run the best exact ISA level (`IsaLevel::best_exact`: bitwise equal to
/// the portable kernels), for tests held to an f32 reference within f32 rounding. The engine's
/// default (`auto`) may be `avx512bf16` (bf16-rounded activations in bf16 matmuls), whose own,
/// looser bound against the same references tests/isa_variants.rs checks.
pub fn pool(threads: usize) -> rayon::ThreadPool {
    let isa = specmla::kernels::Isa::new(specmla::kernels::IsaLevel::best_exact()).unwrap();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| specmla::kernels::pin_thread(Some(isa)))
        .build()
        .unwrap()
}

/// Run `f` on the exact level (see [`pool`]): every kernel it reaches, nested parallel work
/// included, runs on a pinned worker.
pub fn exact<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool(2).install(f)
}

/// Run all requests as one continuous batch, applying `swaps` (step -> drafter) and checking
/// the engine's invariants after every step; outputs in submission order with counters.
pub fn run_checked(
    engine: &Engine,
    reqs: Vec<Request>,
    swaps: &[(u64, DraftSource)],
) -> Vec<Output> {
    let mut ids = Vec::new();
    for r in reqs {
        ids.push(engine.submit(r).unwrap());
    }
    let mut outs: Vec<Output> = ids
        .iter()
        .map(|&id| Output {
            id,
            text: String::new(),
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: String::new(),
            counters: Default::default(),
        })
        .collect();
    let mut open = ids.len();
    let mut step = 0u64;
    while open > 0 {
        for (at, src) in swaps {
            if *at == step {
                engine.set_draft_weights_blocking(src.clone()).unwrap();
            }
        }
        for ev in engine.step().unwrap() {
            let o = outs.iter_mut().find(|o| o.id == ev.id).unwrap();
            o.token_ids.extend(&ev.tokens);
            o.logprobs.extend(&ev.logprobs);
            if let Some(f) = ev.finish {
                o.finish_reason = f.as_str().into();
                open -= 1;
            }
        }
        engine
            .check_invariants()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        step += 1;
        assert!(step < 20_000, "no progress");
    }
    for o in &mut outs {
        o.counters = engine.request_counters(o.id).unwrap();
    }
    outs
}

/// Speculative outputs equal the plain ones: tokens, finish reason, committed log-probs bitwise,
/// reasoning counts and forced end-of-think; the reasoning count never exceeds the budget.
pub fn assert_same_outputs(label: &str, base: &[Output], got: &[Output], reqs: &[Request]) {
    for ((b, g), r) in base.iter().zip(got).zip(reqs) {
        assert_eq!(b.token_ids, g.token_ids, "{label}: tokens differ");
        assert_eq!(b.finish_reason, g.finish_reason, "{label}: finish differs");
        let bb: Vec<u32> = b.logprobs.iter().map(|x| x.to_bits()).collect();
        let gb: Vec<u32> = g.logprobs.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bb, gb, "{label}: committed log-probs not bitwise equal");
        if let Some(bud) = r.reasoning_budget {
            assert!(
                g.counters.reasoning_tokens <= bud as u64,
                "{label}: reasoning over budget"
            );
        }
        assert_eq!(
            b.counters.reasoning_tokens, g.counters.reasoning_tokens,
            "{label}: reasoning count differs"
        );
        assert_eq!(
            b.counters.forced_end_of_think,
            g.counters.forced_end_of_think
        );
    }
}

/// Engine config of the speculation tests: f32 KV, 2 threads, 512-block pools.
/// Plain decoding (no drafter, the test config) of `reqs` on `target`: the reference outputs.
pub fn plain_outputs(target: &Path, reqs: &[Request]) -> Vec<Output> {
    let e = Engine::new(target, DraftSource::None, spec_test_cfg(SpecMode::Fixed(0))).unwrap();
    run_checked(&e, reqs.to_vec(), &[])
}

pub fn spec_test_cfg(spec: SpecMode) -> EngineConfig {
    EngineConfig {
        kv_dtype: KvDtype::F32,
        spec,
        threads: 2,
        num_blocks: 512,
        draft_num_blocks: 512,
        ..EngineConfig::default()
    }
}

/// `n` requests with random prompts (3 + up to `extra_len` tokens from 13..128), two in three
/// ending inside thinking (`start`), 10..40 new tokens, budgets cycling None / 0 / 1 / 3 / 7 /
/// 100, log-probs on: the speculation tests' workload.
pub fn budget_requests(
    n: usize,
    seed: u64,
    extra_len: u64,
    start: u32,
    end: &[u32],
) -> Vec<Request> {
    let mut x: u64 = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let len = 3 + (next() % extra_len) as usize;
            let mut toks: Vec<u32> = (0..len).map(|_| 13 + (next() % 115) as u32).collect();
            if i % 3 != 0 {
                toks.push(start);
            }
            let mut r = Request::new(specmla::engine::Prompt::Tokens(toks));
            r.sampling.max_tokens = 10 + (next() % 30) as usize;
            r.think_start = Some(vec![start]);
            r.think_end = Some(end.to_vec());
            r.reasoning_budget = [None, Some(0), Some(1), Some(3), Some(7), Some(100)][i % 6];
            r.logprobs = true;
            r
        })
        .collect()
}

/// A fresh, empty directory `<prefix>-<pid>` for a fixture that lives as long as this test
/// process (held in a `OnceLock`, so nothing removes it at exit): under the temp directory,
/// after removing the `<prefix>-<pid>` directories of processes that have ended (earlier runs'
/// copies would otherwise pile up there, a few MB each).
pub fn process_fixture_dir(prefix: &str) -> std::path::PathBuf {
    let root = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('-'))
                .and_then(|r| r.parse::<u32>().ok());
            if let Some(pid) = pid {
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let d = root.join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// models/draft with every weight replaced by deterministic noise (same names, shapes, bf16).
pub fn random_draft() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let src = repo().join("models/draft");
        let d = process_fixture_dir("specmla-random-draft");
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut owned = Vec::new();
        for (name, t) in st.tensors() {
            let data: Vec<u8> = t
                .data()
                .chunks_exact(2)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2; // [-0.1, 0.1)
                    ((v.to_bits() >> 16) as u16).to_le_bytes()
                })
                .collect();
            owned.push((name.clone(), t.dtype(), t.shape().to_vec(), data));
        }
        let views: Vec<_> = owned
            .iter()
            .map(|(n, dt, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap(),
                )
            })
            .collect();
        std::fs::write(
            d.join("model.safetensors"),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        d
    })
    .clone()
}

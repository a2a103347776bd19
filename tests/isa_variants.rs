//! The engine's guarantees on EVERY instruction-set level this CPU runs (`Isa::available()`:
//! portable always, then avx2, avx512 and amx where present), not only on the level picked by
//! default. The kernel tests (`src/kernels/tests.rs`) check each level's matmuls for batch
//! invariance; these tests check what a user sees through the model and the engine, with the
//! level pinned on every worker (`EngineConfig::isa`, or `pin_thread` on a test pool):
//! - golden logits: every fixture in models/golden against transformers' fp32 reference, through
//!   the decompressed (one-chunk prompt) and absorbed (token by token) paths, same tolerance as
//!   tests/golden.rs (1e-4 x max(1, max |logit|));
//! - batch invariance: chunked prefill bitwise equal to one chunk; all of a fixture's prompts in
//!   one ragged forward on 2 threads bitwise equal to each prompt alone on 1 thread; in the engine,
//!   each request decoded alone bitwise equal to the same request in a continuous batch;
//! - lossless speculation: a draft model (k 3, own fp8 KV), n-gram, adaptive, and the trained MTP
//!   layer of models/target with the bundled draft on the bundled workload, budgets included —
//!   token ids and log-probs bitwise equal to plain decoding on the same level;
//! - across levels: portable, avx2 and avx512 give bitwise the same logits and outputs (they share
//!   one reduction order per matrix layout: `kernels/lanes.rs` for row-major matrices, one
//!   sequential chain for the bf16 strips a model loads as where the best level is avx2); amx runs bf16 matmuls with exact products in another
//!   f32 accumulation order, so its logits are held to the golden tolerance of portable's;
//!   avx512bf16 rounds the activations of bf16 matmuls to bf16 (llama.cpp's contract), so on
//!   fixtures with bf16 weights its logits are held to a rounding-sized bound instead
//!   ([`rounded_close`]: median row error <= 2e-2 x max(1, max |logit|), argmax equal on >= 90 %
//!   of the rows; seen on v3_bf16: 0.04-0.05 against logits up to 7.5, 66 of 67 rows agreeing,
//!   the other a routing flip) — f32 fixtures never take its path and stay within 1e-4.

mod common;

use common::*;
use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Prompt, Request};
use specmla::kernels::{pin_thread, Isa, IsaLevel};
use specmla::kv::KvDtype;
use specmla::model::Model;
use specmla::spec::SpecMode;

const START: u32 = 10;
const END: [u32; 2] = [11, 12];

fn tol(reference: &[f32]) -> f32 {
    1e-4 * reference.iter().fold(1.0f32, |m, x| m.max(x.abs()))
}

/// A pool whose workers run `isa`'s kernels.
fn pinned_pool(isa: Isa, threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| pin_thread(Some(isa)))
        .build()
        .unwrap()
}

/// True for the levels that share the portable reduction order bit for bit.
fn same_order_as_portable(isa: Isa) -> bool {
    isa.level().exact()
}

/// The bound for logits computed with bf16-rounded activations (avx512bf16) against a
/// reference: median row max-diff <= 2e-2 x max(1, max |logit|), argmax agreeing on >= 90 % of
/// rows. A wrong kernel (layout, pairing, scale) misses it by orders of magnitude.
fn rounded_close(label: &str, got: &[f32], reference: &[f32], vocab: usize) {
    let scale = reference.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let (median, agree) = median_row_error_and_agreement(got, reference, vocab);
    let rows = reference.len() / vocab;
    assert!(
        median <= 2e-2 * scale,
        "{label}: median row error {median} (scale {scale})"
    );
    assert!(
        agree * 10 >= rows * 9,
        "{label}: argmax agrees on {agree}/{rows} rows"
    );
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_available_level_is_listed_and_portable_is_one() {
    let levels = Isa::available();
    assert_eq!(levels[0].level(), IsaLevel::Portable);
    assert!(
        levels.contains(&Isa::detect()),
        "auto picks an available level"
    );
    eprintln!(
        "ISA levels tested here: {:?}",
        levels.iter().map(|i| i.to_string()).collect::<Vec<_>>()
    );
}

/// Golden logits, chunking and ragged-batch invariance per level; logits across levels.
#[test]
fn golden_logits_and_batch_invariance_on_every_isa() {
    // per fixture: the portable run's logits of every reference prompt (absorbed path)
    let mut portable: Vec<Vec<Vec<f32>>> = Vec::new();
    for isa in Isa::available() {
        let one = pinned_pool(isa, 1);
        let two = pinned_pool(isa, 2);
        for (f, dir) in golden_dirs().into_iter().enumerate() {
            let name = format!("{isa} {}", dir.file_name().unwrap().to_string_lossy());
            let model = Model::load_dir(&dir).unwrap();
            let refs = golden_reference(&dir);
            let mut kv = kv_for(&model, KvDtype::F32, 64);
            // each prompt alone, 1 thread: prompt 0 through the decompressed path in one chunk,
            // the others token by token through the absorbed path
            let alone: Vec<Vec<f32>> = refs
                .iter()
                .enumerate()
                .map(|(i, (ids, reference))| {
                    let (chunk, mha) = if i == 0 {
                        (ids.len(), ids.len())
                    } else {
                        (1, 0)
                    };
                    let got = one.install(|| run_chunked(&model, &mut kv, ids, chunk, mha));
                    let d = max_abs_diff(&got, reference);
                    if isa.bf16_dot() && d > tol(reference) {
                        let vocab = model.config.vocab_size;
                        rounded_close(&format!("{name}: prompt {i}"), &got, reference, vocab);
                    } else {
                        assert!(d <= tol(reference), "{name}: prompt {i} max diff {d}");
                    }
                    got
                })
                .collect();
            // chunked prefill (5-token chunks) bitwise equal to one chunk, on 2 threads
            let (ids0, _) = &refs[0];
            let c5 = two.install(|| run_chunked(&model, &mut kv, ids0, 5, ids0.len()));
            assert_eq!(
                bits(&c5),
                bits(&alone[0]),
                "{name}: chunked prefill changed bits"
            );
            // all prompts in one ragged forward on 2 threads: bitwise each prompt alone
            let prompts: Vec<&[u32]> = refs.iter().map(|(ids, _)| &ids[..]).collect();
            let got = two.install(|| ragged_forward(&model, &mut kv, &prompts));
            let mut off = 0;
            for (i, a) in alone.iter().enumerate() {
                assert_eq!(
                    bits(&got[off..off + a.len()]),
                    bits(a),
                    "{name}: prompt {i} in a ragged batch on 2 threads changed bits"
                );
                off += a.len();
            }
            // across levels
            if isa.level() == IsaLevel::Portable {
                portable.push(alone);
            } else {
                for (i, (a, p)) in alone.iter().zip(&portable[f]).enumerate() {
                    let d = max_abs_diff(a, p);
                    if same_order_as_portable(isa) {
                        assert_eq!(bits(a), bits(p), "{name}: prompt {i} differs from portable");
                    } else if isa.bf16_dot() && d > tol(p) {
                        let label = format!("{name}: prompt {i} vs portable");
                        rounded_close(&label, a, p, model.config.vocab_size);
                    } else {
                        assert!(d <= tol(p), "{name}: prompt {i} {d} from portable");
                    }
                }
            }
        }
    }
}

fn cfg(isa: Isa, spec: SpecMode) -> EngineConfig {
    EngineConfig {
        isa: Some(isa.level()),
        ..spec_test_cfg(spec)
    }
}

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

/// Outputs are equal to `base`: token ids, finish reasons and log-probs bitwise.
fn assert_bitwise(label: &str, base: &[Output], got: &[Output]) {
    assert_eq!(base.len(), got.len());
    for (i, (b, g)) in base.iter().zip(got).enumerate() {
        assert_eq!(
            b.token_ids, g.token_ids,
            "{label}: request {i} tokens differ"
        );
        assert_eq!(b.finish_reason, g.finish_reason, "{label}: request {i}");
        assert_eq!(
            bits(&b.logprobs),
            bits(&g.logprobs),
            "{label}: request {i} log-probs differ"
        );
    }
}

/// The first level's (portable's) outputs are kept; every later level that shares its order
/// must give them bitwise (the opt-in levels are checked for losslessness on their own).
fn against_portable(isa: Isa, portable: &mut Option<Vec<Output>>, base: Vec<Output>) {
    match portable {
        None => *portable = Some(base),
        Some(p) if same_order_as_portable(isa) => {
            assert_bitwise(&format!("{isa} vs portable"), p, &base)
        }
        Some(_) => {}
    }
}

/// Engine on v3_yarn per level: plain decoding alone vs batched, then a draft model (own fp8 KV),
/// n-gram and adaptive speculation, each bitwise equal to plain; plain equal across levels.
#[test]
fn engine_batch_invariance_and_lossless_speculation_on_every_isa() {
    let reqs = budget_requests(12, 0x05ee_d15a, 24, START, &END);
    let mut portable: Option<Vec<Output>> = None;
    for isa in Isa::available() {
        let target = golden("v3_yarn");
        let plain = Engine::new(&target, DraftSource::None, cfg(isa, SpecMode::Fixed(0))).unwrap();
        let base = run_checked(&plain, reqs.clone(), &[]);
        assert!(
            base.iter().any(|o| o.counters.forced_end_of_think == 1),
            "{isa}: some budget was enforced"
        );
        // each request alone on a fresh engine (no prefix cache hits, nothing batched with it)
        for (i, r) in reqs.iter().enumerate().step_by(3) {
            let e = Engine::new(&target, DraftSource::None, cfg(isa, SpecMode::Fixed(0))).unwrap();
            let alone = run_checked(&e, vec![r.clone()], &[]);
            assert_bitwise(
                &format!("{isa}: request {i} alone vs batched"),
                &base[i..=i],
                &alone,
            );
        }
        let mut fp8_draft = cfg(isa, SpecMode::Fixed(3));
        fp8_draft.draft_kv_dtype = Some(KvDtype::Fp8E4M3);
        for (label, draft, c) in [
            (
                "draft k=3, fp8 draft KV",
                DraftSource::Dir(golden("v3_bf16")),
                fp8_draft,
            ),
            (
                "ngram k=4",
                DraftSource::Ngram { min_n: 1, max_n: 3 },
                cfg(isa, SpecMode::Fixed(4)),
            ),
            (
                "adaptive",
                DraftSource::Dir(golden("v3_bf16")),
                cfg(isa, SpecMode::Adaptive { k_max: 6 }),
            ),
        ] {
            let e = Engine::new(&target, draft, c).unwrap();
            let got = run_checked(&e, reqs.clone(), &[]);
            assert_same_outputs(&format!("{isa}: {label}"), &base, &got, &reqs);
            if label.starts_with("draft") {
                assert!(
                    e.stats().totals.accepted_tokens > 0,
                    "{isa}: drafts accepted"
                );
            }
        }
        against_portable(isa, &mut portable, base);
    }
}

/// The main job on every level: the bundled target with the bundled draft (k 4) and with its own
/// MTP layer (k 2), on workload prompts with a full and a tight thinking budget; bitwise equal to
/// plain decoding on the same level, and plain equal across the levels that share one order.
#[test]
fn bundled_pair_and_mtp_with_budgets_on_every_isa() {
    let target = repo().join("models/target");
    let draft = repo().join("models/draft");
    let prompts = workload_prompt_ids(4);
    let reqs: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            let mut r = Request::new(Prompt::Tokens(ids.clone()));
            r.reasoning_budget = Some(if i % 2 == 0 { 96 } else { 16 });
            r.sampling.max_tokens = 120;
            r.logprobs = true;
            r
        })
        .collect();
    let mut portable: Option<Vec<Output>> = None;
    for isa in Isa::available() {
        let plain = Engine::new(&target, DraftSource::None, cfg(isa, SpecMode::Fixed(0))).unwrap();
        let base = run_checked(&plain, reqs.clone(), &[]);
        assert!(
            base.iter().any(|o| o.counters.forced_end_of_think == 1),
            "{isa}: the 16-token budget forced an end of thinking"
        );
        for (label, src, k) in [
            ("draft k=4", DraftSource::Dir(draft.clone()), 4),
            ("mtp k=2", DraftSource::Mtp, 2),
        ] {
            let e = Engine::new(&target, src, cfg(isa, SpecMode::Fixed(k))).unwrap();
            let got = run_checked(&e, reqs.clone(), &[]);
            assert_same_outputs(&format!("{isa}: {label}"), &base, &got, &reqs);
            assert!(
                e.stats().totals.accepted_tokens > 0,
                "{isa}: {label} accepted nothing"
            );
        }
        against_portable(isa, &mut portable, base);
    }
}

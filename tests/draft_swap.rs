//! Draft swaps at run time: greedy output stays byte-identical across many swaps in the middle of
//! generation (good draft -> random-weight draft -> other checkpoint -> none -> good), with
//! requests in flight and prefix-cache hits; acceptance moves as expected; target KV and prefix
//! cache survive; bad weights are refused with their own error while the old draft keeps serving;
//! a stress test swaps from another thread while steps run.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::repo;
use specmla::engine::{DraftSource, Engine, EngineConfig, Prompt, Request, SwapStatus};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;
use specmla::weights::{WeightSource, WeightStore};

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

fn cfg() -> EngineConfig {
    EngineConfig {
        kv_dtype: KvDtype::F32,
        spec: SpecMode::Fixed(3),
        threads: 2,
        num_blocks: 512,
        draft_num_blocks: 512,
        ..EngineConfig::default()
    }
}

fn requests(n: usize, max_tokens: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            // shared 32-token prefix -> prefix-cache hits across requests
            let mut t: Vec<u32> = (40..72).collect();
            t.extend([(i % 50) as u32 + 20, (i % 7) as u32 + 80]);
            let mut r = Request::new(Prompt::Tokens(t));
            r.sampling.max_tokens = max_tokens;
            r.sampling.ignore_eos = true;
            r
        })
        .collect()
}

/// Safetensors bytes with the same names/shapes/dtypes as `dir`'s weights but random values.
fn random_weights_like(dir: &std::path::Path, seed: u64) -> Vec<u8> {
    let store = WeightStore::open(WeightSource::Dir(dir.to_path_buf())).unwrap();
    let mut x = seed | 1;
    let mut names: Vec<String> = store.names().map(String::from).collect();
    names.sort();
    let mut bufs: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for n in names {
        let t = store.get(&n).unwrap();
        let numel: usize = t.shape.iter().product();
        let (dtype, bytes): (safetensors::Dtype, Vec<u8>) = match t.dtype {
            specmla::weights::DType::BF16 => (
                safetensors::Dtype::BF16,
                (0..numel)
                    .flat_map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4;
                        ((v.to_bits() >> 16) as u16).to_le_bytes()
                    })
                    .collect(),
            ),
            _ => (
                safetensors::Dtype::F32,
                (0..numel)
                    .flat_map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4).to_le_bytes()
                    })
                    .collect(),
            ),
        };
        bufs.push((n, dtype, t.shape.to_vec(), bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = bufs
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// Run requests, applying `swaps` (step -> source) in the middle; returns outputs by submit order
/// and acceptance per draft generation.
fn run_with_swaps(
    e: &Engine,
    reqs: Vec<Request>,
    swaps: &[(u64, DraftSource)],
    stagger: bool,
) -> Vec<Vec<u32>> {
    let mut ids = Vec::new();
    let mut pending: Vec<Request> = reqs;
    pending.reverse();
    let mut outs: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut step = 0u64;
    loop {
        // stagger submissions so swaps hit requests in every phase
        let admit = if stagger { 2 } else { pending.len() };
        for _ in 0..admit {
            if let Some(r) = pending.pop() {
                ids.push(e.submit(r).unwrap());
            }
        }
        for (at, src) in swaps {
            if *at == step {
                let t = e.set_draft_weights_blocking(src.clone()).unwrap();
                assert_eq!(e.swap_status(t), SwapStatus::Pending);
            }
        }
        for ev in e.step().unwrap() {
            outs.entry(ev.id).or_default().extend(ev.tokens);
        }
        e.check_invariants().unwrap();
        step += 1;
        if pending.is_empty() && !e.has_work() {
            break;
        }
        assert!(step < 5000);
    }
    ids.iter()
        .map(|id| outs.remove(id).unwrap_or_default())
        .collect()
}

#[test]
fn greedy_output_is_identical_across_many_swaps() {
    let reqs = requests(16, 24);
    let base_engine = Engine::new(&golden("v3_yarn"), DraftSource::None, cfg()).unwrap();
    let base = run_with_swaps(&base_engine, reqs.clone(), &[], true);

    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::Dir(golden("v3_bf16")),
        cfg(),
    )
    .unwrap();
    let random = random_weights_like(&golden("v3_bf16"), 7);
    let swaps = vec![
        (3, DraftSource::Bytes(random)), // same architecture, random weights (in place)
        (7, DraftSource::Dir(golden("v3_dense3"))), // a whole other drafter (own config)
        (11, DraftSource::None),         // speculation off
        (14, DraftSource::Ngram { min_n: 1, max_n: 3 }), // n-gram
        (17, DraftSource::Dir(golden("v3_bf16"))), // back to the good draft
        (
            19,
            DraftSource::File(golden("v3_yarn").join("model.safetensors")),
        ), // f32 weights, same arch
    ];
    let got = run_with_swaps(&e, reqs, &swaps, true);
    assert_eq!(base, got, "greedy output changed across swaps");
    let st = e.stats();
    assert_eq!(st.draft_generation, 6);
    assert!(st.totals.accepted_tokens > 0);
    assert!(
        st.kv.prefix_hit_tokens > 0,
        "prefix cache served hits across swaps"
    );
    assert_eq!(st.totals.preemptions, 0, "swaps never touch target KV");
}

#[test]
fn acceptance_moves_with_the_draft() {
    let reqs = requests(4, 40);
    let acc = |src: DraftSource| {
        let e = Engine::new(
            &golden("v3_yarn"),
            DraftSource::Dir(golden("v3_bf16")),
            cfg(),
        )
        .unwrap();
        e.set_draft_weights_blocking(src).unwrap();
        run_with_swaps(&e, reqs.clone(), &[], false);
        let t = e.stats().totals;
        t.accepted_tokens as f64 / t.drafted_tokens.max(1) as f64
    };
    let good = acc(DraftSource::Dir(golden("v3_bf16")));
    let random = acc(DraftSource::Bytes(random_weights_like(
        &golden("v3_bf16"),
        99,
    )));
    assert!(good > 0.8, "bf16 copy of the target: acceptance {good}");
    assert!(random < 0.2, "random draft: acceptance {random}");
}

#[test]
fn bad_weights_are_refused_and_the_old_draft_keeps_serving() {
    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::Dir(golden("v3_bf16")),
        cfg(),
    )
    .unwrap();
    let tmp = std::env::temp_dir().join(format!("specmla-swap-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // vocab mismatch: same weights, config says another vocab
    let vdir = tmp.join("vocab");
    std::fs::create_dir_all(&vdir).unwrap();
    std::fs::copy(
        golden("v3_bf16").join("model.safetensors"),
        vdir.join("model.safetensors"),
    )
    .unwrap();
    let cfgtxt = std::fs::read_to_string(golden("v3_bf16").join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&cfgtxt).unwrap();
    v["vocab_size"] = 64.into();
    std::fs::write(vdir.join("config.json"), v.to_string()).unwrap();
    // truncated file
    let full = std::fs::read(golden("v3_bf16").join("model.safetensors")).unwrap();
    let trunc = tmp.join("trunc.safetensors");
    std::fs::write(&trunc, &full[..full.len() / 2]).unwrap();
    let cases: Vec<(DraftSource, &str)> = vec![
        (DraftSource::Dir(vdir), "vocabulary mismatch"),
        (DraftSource::Dir(tmp.join("nope")), "config.json"),
        (
            DraftSource::File(golden("v3_fp8").join("model.safetensors")),
            "tensor",
        ), // other shapes
        (
            DraftSource::Bytes(b"garbage, not safetensors".to_vec()),
            "safetensors",
        ),
        (DraftSource::File(trunc), "safetensors"),
    ];
    let mut r = Request::new(Prompt::Tokens((40..60).collect()));
    r.sampling.max_tokens = 30;
    r.sampling.ignore_eos = true;
    let id = e.submit(r).unwrap();
    e.step().unwrap();
    for (src, want) in cases {
        // synchronous path returns the error
        let err = e
            .set_draft_weights_blocking(src.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.to_lowercase().contains(want),
            "error `{err}` should mention `{want}`"
        );
        // asynchronous path reports it through the ticket
        let t = e.set_draft_weights(src);
        let t0 = Instant::now();
        let st = loop {
            match e.swap_status(t) {
                SwapStatus::Pending if t0.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                s => break s,
            }
        };
        assert!(
            matches!(&st, SwapStatus::Failed(m) if m.to_lowercase().contains(want)),
            "{st:?}"
        );
        e.step().unwrap();
    }
    while e.has_work() {
        e.step().unwrap();
    }
    let st = e.stats();
    assert_eq!(st.draft_generation, 0, "no bad swap was applied");
    assert!(st.drafter.contains("v3_bf16"));
    let c = e.request_counters(id).unwrap();
    assert!(c.accepted_tokens > 0, "old draft kept serving");
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn stress_swaps_from_another_thread_while_stepping() {
    let reqs = requests(12, 32);
    let base_engine = Engine::new(&golden("v3_yarn"), DraftSource::None, cfg()).unwrap();
    let base = run_with_swaps(&base_engine, reqs.clone(), &[], true);
    let e = Arc::new(
        Engine::new(
            &golden("v3_yarn"),
            DraftSource::Dir(golden("v3_bf16")),
            cfg(),
        )
        .unwrap(),
    );
    let random = random_weights_like(&golden("v3_bf16"), 3);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let e = Arc::clone(&e);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let srcs = [
                DraftSource::Bytes(random),
                DraftSource::Dir(golden("v3_dense3")),
                DraftSource::None,
                DraftSource::Bytes(b"bad".to_vec()),
                DraftSource::Dir(golden("v3_bf16")),
            ];
            let t0 = Instant::now();
            let mut n = 0;
            // bounded in count and time
            while n < 40
                && t0.elapsed() < Duration::from_secs(20)
                && !stop.load(std::sync::atomic::Ordering::Relaxed)
            {
                e.set_draft_weights(srcs[n % srcs.len()].clone());
                n += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            n
        })
    };
    let got = run_with_swaps(&e, reqs, &[], true);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = swapper.join().unwrap();
    assert!(n > 0);
    assert_eq!(base, got, "output changed under concurrent swaps");
}

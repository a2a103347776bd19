//! DeepSeek-V4's MTP layer (`mtp.0.*`) as a drafter, on models/golden/v4_mixed_official (the
//! weights of v4_mixed under the official naming, plus a random MTP layer in a second shard,
//! written by tools/golden/make_golden_v4.py):
//! - its logits equal the torch reference (DeepSeek's `MTPBlock` as vLLM's deepseek_v4_mtp.py
//!   runs it, over transformers' own V4 decoder block) within 1e-4 x max(1, max |logit|), fed the
//!   target's residual streams before its hyper head;
//! - greedy speculation with it is bitwise lossless (tokens and committed log-probs) for k = 1..3,
//!   across reasoning budgets, chunked prefill that splits compression windows, its own fp8 KV,
//!   preemption with recompute, adaptive k, and swaps to and from it mid-generation;
//! - configs: the official per-layer lists with the MTP layer's entry appended are read (the
//!   tail is the MTP layer's kind), a longer list or a hash-routed MTP layer is refused with the
//!   field named; a V4 target without MTP tensors refuses the MTP drafter.

mod common;

use std::path::PathBuf;

use common::{
    assert_same_outputs, reference_cases, repo, run_checked, spec_test_cfg, target_hidden,
};
use specmla::config::{ModelConfig, V4Attn};
use specmla::engine::{DraftSource, Engine, Output, Request};
use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};
use specmla::spec::SpecMode;

const START: u32 = 10;
const END: [u32; 2] = [11, 12];

fn golden(name: &str) -> PathBuf {
    repo().join("models/golden").join(name)
}

fn target() -> PathBuf {
    golden("v4_mixed_official")
}

fn requests(n: usize) -> Vec<Request> {
    common::budget_requests(n, 0x51ed_2702, 40, START, &END)
}

fn run(e: &Engine, reqs: &[Request], swaps: &[(u64, DraftSource)]) -> Vec<Output> {
    run_checked(e, reqs.to_vec(), swaps)
}

fn baseline(reqs: &[Request]) -> Vec<Output> {
    common::plain_outputs(&target(), reqs)
}

#[test]
fn v4_mtp_logits_match_the_torch_reference() {
    let model = Model::load_dir(&target()).unwrap();
    assert_eq!(model.num_mtp_layers(), 1);
    let c = &model.config;
    let v = c.v4.as_ref().unwrap();
    assert_eq!(v.mtp_layer_types, [V4Attn::Sliding]);
    let width = model.hidden_state_width();
    assert_eq!(width, v.hc_mult * c.hidden_size);
    let path = target().join("mtp_reference.safetensors");
    let refs = reference_cases(&path, "mtp_logits");
    let streams = reference_cases(&path, "mtp_streams");
    assert_eq!(refs.len(), 3);
    for (i, ((ids, want), (_, want_x))) in refs.into_iter().zip(streams).enumerate() {
        let n = ids.len();
        let hidden = target_hidden(&model, &ids, 4); // [n, N * hidden]
                                                     // MTP positions 0..n-2 (token j+1, streams j), in two chunks split inside the window.
        let mut mkv = KvCache::new(KvConfig::for_mtp(c, 4, 64, KvDtype::F32)).unwrap();
        let mut mseq = SeqKv::new();
        let plan = mkv.plan_grow(&mseq, n - 1).unwrap();
        mkv.commit_grow(&mut mseq, plan);
        let cut = (n - 1).min(5);
        let (mut logits, mut xs) = (Vec::new(), Vec::new());
        for (lo, hi) in [(0, cut), (cut, n - 1)] {
            if lo == hi {
                continue;
            }
            let chunk = SeqChunk {
                kv: &mseq,
                start: lo,
                tokens: &ids[lo + 1..hi + 1],
                mha_until: n,
                logits: LogitsMode::All,
            };
            let (l, x) = model
                .mtp_forward(0, &mut mkv, &[chunk], &hidden[lo * width..hi * width])
                .unwrap();
            logits.extend(l);
            xs.extend(x);
        }
        // logits, and the output streams a chained draft feeds back
        for (what, got, want) in [("logits", &logits, &want), ("streams", &xs, &want_x)] {
            assert_eq!(got.len(), want.len(), "{what}");
            let scale = want.iter().fold(1f32, |a, &b| a.max(b.abs()));
            let worst = got
                .iter()
                .zip(want.iter())
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(
                worst <= 1e-4 * scale,
                "prompt {i}: MTP {what} differ from torch by {worst} (max |value| {scale})"
            );
        }
    }
    // a wrong hidden width is an error, not a panic
    let mut mkv = KvCache::new(KvConfig::for_mtp(c, 4, 64, KvDtype::F32)).unwrap();
    let mut mseq = SeqKv::new();
    let plan = mkv.plan_grow(&mseq, 2).unwrap();
    mkv.commit_grow(&mut mseq, plan);
    let chunk = SeqChunk {
        kv: &mseq,
        start: 0,
        tokens: &[3, 4],
        mha_until: 2,
        logits: LogitsMode::All,
    };
    let err = model
        .mtp_forward(0, &mut mkv, &[chunk], &vec![0.0; 2 * c.hidden_size])
        .unwrap_err();
    assert!(err.to_string().contains("streams"), "{err}");
}

#[test]
fn v4_mtp_greedy_is_bitwise_lossless() {
    let reqs = requests(18);
    let base = baseline(&reqs);
    for k in 1..=3 {
        let e = Engine::new(
            &target(),
            DraftSource::Mtp,
            spec_test_cfg(SpecMode::Fixed(k)),
        )
        .unwrap();
        let got = run(&e, &reqs, &[]);
        assert_same_outputs(&format!("v4 mtp k={k}"), &base, &got, &reqs);
        let t = e.stats().totals;
        // a random MTP layer: drafts mostly rejected (rollback), a few accepted
        assert!(
            t.accepted_tokens > 0 && t.accepted_tokens < t.drafted_tokens,
            "k={k}: {t:?}"
        );
    }
    // chunks of 5 split compression windows; the MTP cache in fp8
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.max_batch_tokens = 5;
    c.draft_kv_dtype = Some(KvDtype::Fp8E4M3);
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    assert_same_outputs("v4 mtp chunked + fp8", &base, &run(&e, &reqs, &[]), &reqs);
    // a small pool: preemption and recompute
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.num_blocks = 12;
    c.block_size = 8;
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    let got = run(&e, &reqs, &[]);
    assert_same_outputs("v4 mtp preemption", &base, &got, &reqs);
    assert!(got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0);
    let e = Engine::new(
        &target(),
        DraftSource::Mtp,
        spec_test_cfg(SpecMode::Adaptive { k_max: 3 }),
    )
    .unwrap();
    assert_same_outputs("v4 mtp adaptive", &base, &run(&e, &reqs, &[]), &reqs);
}

/// Prefix caching with the V4 MTP drafter (sliding-window and compressed caches on both
/// sides): requests sharing a 40-token prefix, one at a time, reuse the cached blocks, keep
/// plain outputs, and draft exactly what an engine without prefix caching drafts.
#[test]
fn v4_prefix_cache_hits_restore_the_mtp_kv() {
    let shared: Vec<u32> = (0..40u32).map(|i| 13 + (i * 37) % 110).collect();
    let reqs: Vec<Request> = requests(5)
        .into_iter()
        .map(|mut r| {
            if let specmla::engine::Prompt::Tokens(t) = &mut r.prompt {
                let mut p = shared.clone();
                p.extend_from_slice(t);
                *t = p;
            }
            r
        })
        .collect();
    let base = baseline(&reqs);
    let mut runs = Vec::new();
    for prefix_cache in [true, false] {
        let mut c = spec_test_cfg(SpecMode::Fixed(2));
        c.prefix_cache = prefix_cache;
        let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
        let got: Vec<Output> = reqs
            .iter()
            .flat_map(|r| run(&e, std::slice::from_ref(r), &[]))
            .collect();
        assert_same_outputs(&format!("v4 mtp prefix {prefix_cache}"), &base, &got, &reqs);
        runs.push(got);
    }
    for (i, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        if i > 0 {
            assert!(
                a.counters.cached_prompt_tokens >= 16,
                "request {i}: {:?}",
                a.counters
            );
        }
        common::assert_same_drafts(&format!("request {i}"), a, b);
    }
}

#[test]
fn swaps_to_and_from_the_v4_mtp_drafter_keep_outputs() {
    let reqs = requests(12);
    let base = baseline(&reqs);
    let e = Engine::new(
        &target(),
        DraftSource::Dir(golden("v4_sliding")),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    let swaps = vec![
        (3, DraftSource::Mtp),
        (12, DraftSource::None),
        (16, DraftSource::Mtp),
        (30, DraftSource::Dir(golden("v4_sliding"))),
        (40, DraftSource::Mtp),
    ];
    let got = run(&e, &reqs, &swaps);
    assert_same_outputs("v4 swaps", &base, &got, &reqs);
    assert!(e.stats().totals.drafted_tokens > 0);
    // a V4 target without MTP tensors refuses the MTP drafter, at creation and as a swap
    let err = Engine::new(
        &golden("v4_mixed"),
        DraftSource::Mtp,
        spec_test_cfg(SpecMode::Fixed(2)),
    )
    .err()
    .expect("no MTP layer")
    .to_string();
    assert!(err.contains("mtp.0.e_proj.weight"), "{err}");
}

fn config_with(edit: impl Fn(&mut serde_json::Value)) -> specmla::Result<ModelConfig> {
    common::config_with(&target(), edit)
}

#[test]
fn per_layer_lists_may_carry_the_mtp_layers_entries() {
    // the official spelling: compress_ratios with one entry per layer + one for the MTP block
    let c = config_with(|v| {
        let o = v.as_object_mut().unwrap();
        o.remove("layer_types");
        o.insert(
            "compress_ratios".into(),
            serde_json::json!([128, 4, 0, 4, 4]),
        );
    })
    .unwrap();
    let v4 = c.v4.as_ref().unwrap();
    assert_eq!(v4.layer_types.len(), 4);
    assert_eq!(v4.mtp_layer_types, [V4Attn::Csa]);
    // the MTP layer's own cache has the groups of its kind, one layer each
    let kc = KvConfig::for_mtp(&c, 4, 8, KvDtype::F32);
    let kinds: Vec<&str> = kc.groups.iter().map(|g| g.kind.name()).collect();
    assert_eq!(kinds, ["swa_kv", "csa_input", "csa_entry"]);
    assert!(kc.groups.iter().all(|g| g.num_layers == 1));
    let c = config_with(|v| {
        v["layer_types"]
            .as_array_mut()
            .unwrap()
            .push("heavily_compressed_attention".into());
        v["mlp_layer_types"]
            .as_array_mut()
            .unwrap()
            .push("moe".into());
    })
    .unwrap();
    assert_eq!(c.v4.as_ref().unwrap().mtp_layer_types, [V4Attn::Hca]);
    // without a tail entry the MTP layer is sliding (the official release's last entry is 0)
    let c = config_with(|_| {}).unwrap();
    assert_eq!(c.v4.as_ref().unwrap().mtp_layer_types, [V4Attn::Sliding]);
    let refused: Vec<ConfigEdit> = vec![
        (
            "layer_types",
            Box::new(|v| {
                let a = v["layer_types"].as_array_mut().unwrap();
                a.push("sliding_attention".into());
                a.push("sliding_attention".into());
            }),
        ),
        (
            "mlp_layer_types",
            Box::new(|v| {
                v["mlp_layer_types"]
                    .as_array_mut()
                    .unwrap()
                    .push("hash_moe".into())
            }),
        ),
        (
            "compress_ratios",
            Box::new(|v| {
                let o = v.as_object_mut().unwrap();
                o.remove("layer_types");
                o.insert("num_nextn_predict_layers".into(), 0.into());
                o.insert(
                    "compress_ratios".into(),
                    serde_json::json!([128, 4, 0, 4, 0]),
                );
            }),
        ),
    ];
    for (field, edit) in refused {
        let err = config_with(edit).expect_err(field).to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}

/// A named edit of a config.json (a case of a refusal test).
type ConfigEdit = (&'static str, Box<dyn Fn(&mut serde_json::Value)>);

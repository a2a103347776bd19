//! DeepSeek-V3.2 through the engine: greedy speculation (a V3.2 draft with its own index-key
//! cache, a dense V3 draft, n-gram lookup) is bitwise equal to plain decoding, budgets included,
//! also with chunked prefill, preemption (recompute) and prefix-cache hits; every request of a
//! batch gets the bits it gets alone. The target `v32_topk_small` attends to 8 keys per query, so
//! almost every generated token takes the sparse paths.

mod common;

use common::{assert_same_outputs, repo, run_checked, spec_test_cfg};
use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Prompt, Request};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;

const START: u32 = 10;
const END: [u32; 2] = [11, 12];

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

fn target() -> std::path::PathBuf {
    golden("v32_topk_small")
}

/// An fp8 block-quantised copy of the target: a V3.2 draft that mostly agrees with it.
fn fp8_draft() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = common::process_fixture_dir("specmla-v32-draft");
        specmla::weights::quantize_dir(&target(), &d, 16).unwrap();
        d
    })
    .clone()
}

fn requests(n: usize) -> Vec<Request> {
    common::budget_requests(n, 0x9e37_79b9, 30, START, &END)
}

fn run(e: &Engine, reqs: &[Request]) -> Vec<Output> {
    run_checked(e, reqs.to_vec(), &[])
}

fn baseline(reqs: &[Request]) -> Vec<Output> {
    common::plain_outputs(&target(), reqs)
}

#[test]
fn v32_greedy_speculation_is_bitwise_lossless() {
    let reqs = requests(24);
    let base = baseline(&reqs);
    assert!(base.iter().any(|o| o.counters.forced_end_of_think == 1));
    for (label, draft, k) in [
        ("v3.2 fp8 draft", DraftSource::Dir(fp8_draft()), 3),
        ("v3.2 fp8 draft k=6", DraftSource::Dir(fp8_draft()), 6),
        ("dense v3 draft", DraftSource::Dir(golden("v3_yarn")), 2),
        ("ngram", DraftSource::Ngram { min_n: 1, max_n: 3 }, 4),
    ] {
        let e = Engine::new(&target(), draft, spec_test_cfg(SpecMode::Fixed(k))).unwrap();
        let got = run(&e, &reqs);
        assert_same_outputs(label, &base, &got, &reqs);
        let st = e.stats();
        if label.starts_with("v3.2") {
            assert!(st.totals.accepted_tokens > 0, "{label}: drafts accepted");
            // the draft's cache has index keys too: more bytes than the latent alone
            let dkv = st.draft_kv.expect("draft kv");
            assert_eq!(dkv.groups.len(), 2, "{label}: draft cache groups");
        }
        assert_eq!(st.kv.groups.len(), 2);
        assert_eq!(st.kv.groups[1].kind, "index_key");
    }
}

#[test]
fn v32_chunking_preemption_prefix_cache_and_index_dtype() {
    let reqs = requests(18);
    let base = baseline(&reqs);
    // prefill in 5-token chunks (the indexer of a chunk sees the earlier chunks' keys)
    let mut c = spec_test_cfg(SpecMode::Fixed(3));
    c.max_batch_tokens = 5;
    let e = Engine::new(&target(), DraftSource::Dir(fp8_draft()), c).unwrap();
    assert_same_outputs("chunked prefill", &base, &run(&e, &reqs), &reqs);
    // a small pool: preempted requests are recomputed, index keys included
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.num_blocks = 10;
    c.block_size = 8;
    let e = Engine::new(&target(), DraftSource::Ngram { min_n: 1, max_n: 3 }, c).unwrap();
    let got = run(&e, &reqs);
    assert_same_outputs("preemption", &base, &got, &reqs);
    assert!(got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0);
    // prefix-cache hits restore the index keys with the latent
    let shared: Vec<u32> = (20..60).collect();
    let mk = |tail: u32| {
        let mut t = shared.clone();
        t.push(tail);
        let mut r = Request::new(Prompt::Tokens(t));
        r.sampling.max_tokens = 12;
        r.logprobs = true;
        r
    };
    let pre: Vec<Request> = (0..4).map(|i| mk(70 + i)).collect();
    let alone: Vec<Output> = pre
        .iter()
        .map(|r| baseline(std::slice::from_ref(r)).remove(0))
        .collect();
    let e = Engine::new(
        &target(),
        DraftSource::Dir(fp8_draft()),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    let first = run(&e, &pre[..1]);
    let rest = run(&e, &pre[1..]);
    let got: Vec<Output> = first.into_iter().chain(rest).collect();
    assert_same_outputs("prefix cache", &alone, &got, &pre);
    assert!(got[1..]
        .iter()
        .all(|o| o.counters.cached_prompt_tokens >= 32));
    // index keys in bf16 (own dtype): speculation stays lossless against the same setting
    let cfg = |spec| EngineConfig {
        index_kv_dtype: Some(KvDtype::Bf16),
        ..spec_test_cfg(spec)
    };
    let plain = Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap();
    let b16 = run(&plain, &reqs);
    let st = plain.stats();
    assert_eq!(st.kv.groups[1].dtype, KvDtype::Bf16);
    assert_eq!(
        st.target_kv_bytes_per_token,
        st.kv.groups[0].bytes_per_token + st.kv.groups[1].bytes_per_token
    );
    let e = Engine::new(
        &target(),
        DraftSource::Dir(fp8_draft()),
        cfg(SpecMode::Fixed(4)),
    )
    .unwrap();
    assert_same_outputs("bf16 index keys", &b16, &run(&e, &reqs), &reqs);
}

/// The target with a synthetic MTP layer (`model.layers.2`): a copy of decoder layer 1 (its
/// indexer included) plus random eh_proj and unit norms — the shape of DeepSeek-V3.2's MTP
/// module. The decoder layers are untouched, so plain decoding is the target's.
fn target_with_mtp() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use specmla::weights::{WeightSource, WeightStore};
        let src = target();
        let dst = common::process_fixture_dir("specmla-v32-mtp");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        cfg["num_nextn_predict_layers"] = serde_json::json!(1);
        std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
        let h = cfg["hidden_size"].as_u64().unwrap() as usize;
        let st = WeightStore::open(WeightSource::Dir(src.clone())).unwrap();
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut names: Vec<String> = st.names().map(str::to_string).collect();
        names.sort();
        for n in &names {
            let t = st.get(n).unwrap();
            assert_eq!(t.dtype.to_string().to_uppercase(), "F32", "{n}");
            tensors.push((n.clone(), t.shape.to_vec(), t.data.to_vec()));
            if let Some(rest) = n.strip_prefix("model.layers.1.") {
                tensors.push((format!("model.layers.2.{rest}"), t.shape.to_vec(), t.data.to_vec()));
            }
        }
        let mut x: u32 = 12345;
        let eh: Vec<f32> = (0..h * 2 * h)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        tensors.push(("model.layers.2.eh_proj.weight".into(), vec![h, 2 * h], f32_bytes(&eh)));
        for norm in ["enorm", "hnorm", "shared_head.norm"] {
            tensors.push((
                format!("model.layers.2.{norm}.weight"),
                vec![h],
                f32_bytes(&vec![1.0; h]),
            ));
        }
        // safetensors: u64 header length, JSON header, data
        let mut header = serde_json::Map::new();
        let mut off = 0usize;
        for (n, shape, data) in &tensors {
            header.insert(
                n.clone(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [off, off + data.len()]}),
            );
            off += data.len();
        }
        let mut hb = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        while !hb.len().is_multiple_of(8) {
            hb.push(b' ');
        }
        let mut file = (hb.len() as u64).to_le_bytes().to_vec();
        file.extend(hb);
        for (_, _, data) in &tensors {
            file.extend(data);
        }
        std::fs::write(dst.join("model.safetensors"), file).unwrap();
        dst
    })
    .clone()
}

#[test]
fn v32_mtp_drafter_is_bitwise_lossless() {
    let reqs = requests(12);
    let base = baseline(&reqs);
    for k in [1, 3] {
        let e = Engine::new(
            &target_with_mtp(),
            DraftSource::Mtp,
            spec_test_cfg(SpecMode::Fixed(k)),
        )
        .unwrap();
        let got = run(&e, &reqs);
        assert_same_outputs(&format!("v3.2 mtp k={k}"), &base, &got, &reqs);
        let st = e.stats();
        assert!(st.totals.drafted_tokens > 0, "the MTP layer drafted");
        let dkv = st.draft_kv.expect("MTP cache");
        assert_eq!(
            dkv.groups.len(),
            2,
            "the MTP layer's cache has index keys too"
        );
        assert_eq!(dkv.groups[1].num_layers, 1);
    }
}

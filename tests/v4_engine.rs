//! DeepSeek-V4 through the engine: greedy speculation (a sliding-window-only V4 draft — the
//! hybrid SWA drafter shape —, the same weights under the official naming, a V3 MLA draft of the
//! same vocabulary, n-gram lookup) is bitwise equal to plain decoding, reasoning budgets
//! included; so are chunked prefill (chunks of 5 split compression windows), preemption with
//! recompute, and prefix-cache hits whose blocks end inside a compression window. Rejected drafts
//! are truncated away, including compressed entries they closed. Bad V4 configs are refused with
//! the field named. Target: models/golden/v4_mixed (HCA rate 8, CSA rate 4 with index_topk 3,
//! sliding window 8, hash + top-k MoE, 2 hyper-connection streams).

mod common;

use common::{assert_same_outputs, repo, run_checked, spec_test_cfg};
use specmla::config::ModelConfig;
use specmla::engine::{DraftSource, Engine, Output, Prompt, Request};
use specmla::spec::SpecMode;

const START: u32 = 10;
const END: [u32; 2] = [11, 12];

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

fn target() -> std::path::PathBuf {
    golden("v4_mixed")
}

fn requests(n: usize) -> Vec<Request> {
    common::budget_requests(n, 0x51ed_2701, 40, START, &END)
}

fn run(e: &Engine, reqs: &[Request]) -> Vec<Output> {
    run_checked(e, reqs.to_vec(), &[])
}

fn baseline(reqs: &[Request]) -> Vec<Output> {
    common::plain_outputs(&target(), reqs)
}

#[test]
fn v4_greedy_speculation_is_bitwise_lossless() {
    let reqs = requests(18);
    let base = baseline(&reqs);
    for (label, draft, k) in [
        (
            "v4 sliding-window draft",
            DraftSource::Dir(golden("v4_sliding")),
            3,
        ),
        (
            "v4 same weights, official naming",
            DraftSource::Dir(golden("v4_mixed_official")),
            5,
        ),
        ("v3 mla draft", DraftSource::Dir(golden("v3_yarn")), 2),
        ("ngram", DraftSource::Ngram { min_n: 1, max_n: 3 }, 4),
    ] {
        let e = Engine::new(&target(), draft, spec_test_cfg(SpecMode::Fixed(k))).unwrap();
        let got = run(&e, &reqs);
        assert_same_outputs(label, &base, &got, &reqs);
        let c = e.stats().totals;
        assert!(c.drafted_tokens > 0, "{label}: nothing drafted");
        if label.starts_with("v4 same") {
            // identical weights: only drafts past a budget-forced end of thinking are rejected
            assert!(
                c.accepted_tokens * 10 > c.drafted_tokens * 9,
                "{label}: {c:?}"
            );
        } else if label.starts_with("v4 sliding") {
            assert!(
                c.accepted_tokens < c.drafted_tokens,
                "{label}: no rejection to roll back"
            );
        }
    }
}

#[test]
fn v4_chunking_preemption_prefix_cache_and_exhaustion() {
    let reqs = requests(18);
    let base = baseline(&reqs);
    let mut c = spec_test_cfg(SpecMode::Fixed(3));
    c.max_batch_tokens = 5;
    let e = Engine::new(&target(), DraftSource::Dir(golden("v4_sliding")), c).unwrap();
    assert_same_outputs("chunked prefill", &base, &run(&e, &reqs), &reqs);
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.num_blocks = 12;
    c.block_size = 8;
    let e = Engine::new(&target(), DraftSource::Ngram { min_n: 1, max_n: 3 }, c).unwrap();
    let got = run(&e, &reqs);
    assert_same_outputs("preemption", &base, &got, &reqs);
    assert!(got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0);
    // 42-token shared prefix: the cached blocks (32 tokens) end inside no window of rate 4 / 8,
    // the request's own tokens then close the next entries from cached compressor inputs.
    let shared: Vec<u32> = (20..62).collect();
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
        DraftSource::Dir(golden("v4_sliding")),
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
    // KV groups and their byte accounting
    let st = e.stats();
    let kinds: Vec<&str> = st.kv.groups.iter().map(|g| g.kind).collect();
    assert_eq!(
        kinds,
        ["swa_kv", "csa_input", "csa_entry", "hca_input", "hca_entry"]
    );
    assert_eq!(
        st.target_kv_bytes_per_token,
        st.kv
            .groups
            .iter()
            .map(|g| g.bytes_per_token)
            .sum::<usize>()
    );
    // a prompt the pool can never hold is refused, the engine keeps serving
    let mut c = spec_test_cfg(SpecMode::Fixed(0));
    c.num_blocks = 4;
    let e = Engine::new(&target(), DraftSource::None, c).unwrap();
    let mut big = Request::new(Prompt::Tokens((0..100).map(|i| 13 + i % 100).collect()));
    big.sampling.max_tokens = 4;
    assert!(e.submit(big).is_err());
    assert_same_outputs(
        "after refusal",
        &base[..2],
        &run(&e, &reqs[..2]),
        &reqs[..2],
    );
}

fn v4_config_with(edit: impl Fn(&mut serde_json::Value)) -> specmla::Result<ModelConfig> {
    common::config_with(&target(), edit)
}

#[test]
fn bad_v4_configs_are_refused_with_the_field_named() {
    assert!(v4_config_with(|_| {}).is_ok());
    let cases: Vec<ConfigEdit> = vec![
        (
            "layer_types",
            Box::new(|v| v["layer_types"][1] = "global_attention".into()),
        ),
        (
            "layer_types",
            Box::new(|v| {
                v["layer_types"].as_array_mut().unwrap().pop();
            }),
        ),
        (
            "compressed_sparse_attention",
            Box::new(|v| v["compress_rates"]["compressed_sparse_attention"] = 0.into()),
        ),
        (
            "compress_rates",
            Box::new(|v| v["compress_rates"]["sliding_attention"] = 4.into()),
        ),
        (
            "mlp_layer_types",
            Box::new(|v| v["mlp_layer_types"][0] = "dense".into()),
        ),
        (
            "num_key_value_heads",
            Box::new(|v| v["num_key_value_heads"] = 2.into()),
        ),
        ("o_groups", Box::new(|v| v["o_groups"] = 3.into())),
        (
            "index_head_dim",
            Box::new(|v| v["index_head_dim"] = 4.into()),
        ),
        (
            "scoring_func",
            Box::new(|v| v["scoring_func"] = "softmax".into()),
        ),
        (
            "qk_rope_head_dim",
            Box::new(|v| v["qk_rope_head_dim"] = 6.into()),
        ),
        (
            "compress_ratios",
            Box::new(|v| {
                let o = v.as_object_mut().unwrap();
                o.remove("layer_types");
                o.insert("compress_ratios".into(), serde_json::json!([4, 0, 8, 4]));
            }),
        ),
    ];
    for (field, edit) in cases {
        let err = v4_config_with(edit).expect_err(field).to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    // a KV block size that neither divides nor is a multiple of a rate is refused
    let model = ModelConfig::from_file(&target().join("config.json")).unwrap();
    let cfg = specmla::kv::KvConfig::for_model(&model, 6, 8, specmla::kv::KvDtype::F32);
    let err = specmla::kv::KvCache::new(cfg).unwrap_err().to_string();
    assert!(err.contains("block_size"), "{err}");
}

/// Sliding-window release at the KV level: prefill in chunks of 3 over 4-token blocks, then
/// decode; after every commit the sequence holds only the window blocks of its lookback, and
/// every logit is bitwise the one a cache keeping every token gives (and matches transformers).
#[test]
fn window_blocks_are_released_and_change_no_bit() {
    use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
    use specmla::model::{LogitsMode, Model, SeqChunk};
    let model = Model::load_dir(&target()).unwrap();
    let (ids, reference) = common::golden_reference(&target()).remove(0);
    assert_eq!(ids.len(), 64);
    let bs = 4;
    let full = KvConfig::for_model(&model.config, bs, 64, KvDtype::F32);
    let r0 = full.window.expect("V4 has a window class");
    assert_eq!(r0, 7); // max(sliding_window - 1, 2 * csa_rate - 1, hca_rate - 1)
    let run = |kc: KvConfig, chunk: usize| {
        let mut kv = KvCache::new(kc).unwrap();
        let mut seq = SeqKv::new();
        let (mut out, mut pos, mut held_max) = (Vec::new(), 0, 0);
        while pos < ids.len() {
            let end = (pos + chunk).min(ids.len());
            let plan = kv.plan_grow(&seq, end).unwrap();
            kv.commit_grow(&mut seq, plan);
            let chunks = [SeqChunk {
                kv: &seq,
                start: pos,
                tokens: &ids[pos..end],
                mha_until: 0,
                logits: LogitsMode::All,
            }];
            out.extend(model.forward(&mut kv, &chunks).unwrap());
            kv.set_len(&mut seq, end);
            kv.check_invariants(&[&seq]).unwrap();
            held_max = held_max.max(seq.window_table().1.len());
            pos = end;
        }
        kv.free(&mut seq);
        kv.check_invariants(&[]).unwrap();
        let st = kv.stats();
        assert_eq!(st.window_free_blocks, st.window_blocks);
        (out, held_max)
    };
    let (kept, _) = run(full.clone().without_window(), 3);
    for chunk in [1, 3, 5] {
        let (got, held) = run(full.clone().with_window_blocks(8), chunk);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&kept),
            "chunk {chunk}: window release changed logits"
        );
        assert!(
            held <= (r0 + chunk).div_ceil(bs) + 1,
            "chunk {chunk}: {held} window blocks held"
        );
        let tol = 1e-4 * reference.iter().fold(1f32, |m, x| m.max(x.abs()));
        assert!(common::max_abs_diff(&got, &reference) <= tol);
    }
}

/// A window pool too small for every running request at once: requests are preempted and
/// recomputed, outputs stay bitwise the same.
#[test]
fn a_small_window_pool_preempts_without_changing_outputs() {
    let reqs = requests(12);
    let base = baseline(&reqs);
    let mut c = spec_test_cfg(SpecMode::Fixed(3));
    c.kv_window_blocks = Some(8);
    c.block_size = 4;
    c.max_batch_tokens = 8;
    let e = Engine::new(&target(), DraftSource::Dir(golden("v4_sliding")), c.clone()).unwrap();
    let got = run(&e, &reqs);
    assert_same_outputs("small window pool", &base, &got, &reqs);
    assert!(got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0);
    assert_eq!(e.stats().kv.window_blocks, 8);
    // a pool that cannot hold one step of one request is refused, naming the field
    c.kv_window_blocks = Some(4);
    let err = Engine::new(&target(), DraftSource::None, c)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("kv_window_blocks"), "{err}");
}

/// The official checkpoint's storage (models/golden/v4_official_fp8: fp8 e4m3 block linears and
/// fp4 e2m1 experts, ue8m0 scales named `<module>.scale`) loads in its formats (fp8 kept fp8,
/// fp4 decoded exactly to bf16); the golden tests check its logits. A missing or corrupt scale
/// is refused with the tensor named.
#[test]
fn official_fp8_fp4_checkpoint_loads_and_bad_scales_are_refused() {
    use specmla::weights::{WeightSource, WeightStore};
    let dir = golden("v4_official_fp8");
    let model = specmla::model::Model::load_dir(&dir).unwrap();
    let fp8 = model
        .matrices()
        .iter()
        .filter(|m| m.dtype_name() == "fp8_e4m3")
        .count();
    assert!(fp8 >= 30, "fp8 linears kept in fp8: {fp8}");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rebuild = |edit: &TensorEdit<'_>| {
        let mut owned: Vec<OwnedTensor> = Vec::new();
        for (name, t) in st.tensors() {
            if let Some(data) = edit(&name, t.data()) {
                owned.push((name.clone(), t.dtype(), t.shape().to_vec(), data));
            }
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = owned
            .iter()
            .map(|(n, d, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    };
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let load = |b: Vec<u8>| {
        let store = WeightStore::open(WeightSource::Bytes(b)).unwrap();
        specmla::model::Model::load(cfg.clone(), &store)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(load(rebuild(&|_, d| Some(d.to_vec()))), None);
    let gone = "layers.1.attn.wq_b.scale";
    let err = load(rebuild(&|n, d| (n != gone).then(|| d.to_vec()))).expect("refused");
    assert!(err.contains("layers.1.attn.wq_b"), "{err}");
    // an e8m0 scale byte of 255 is NaN
    let err = load(rebuild(&|n, d| {
        Some(if n == "layers.2.ffn.experts.3.w1.scale" {
            vec![255; d.len()]
        } else {
            d.to_vec()
        })
    }))
    .expect("refused");
    assert!(err.contains("experts.3.w1.scale"), "{err}");
}

/// A named edit of a config.json (a case of a refusal test).
type ConfigEdit = (&'static str, Box<dyn Fn(&mut serde_json::Value)>);

/// A tensor to write back: name, dtype, shape, bytes.
type OwnedTensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A rewrite of one tensor's bytes by name (None: keep it).
type TensorEdit<'a> = dyn Fn(&str, &[u8]) -> Option<Vec<u8>> + 'a;

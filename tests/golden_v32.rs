//! DeepSeek-V3.2 specifics on top of tests/golden.rs (which runs every fixture, the V3.2 ones
//! included, through full prompt, token-by-token decode, chunked prefill and mixed batches):
//! the indexer keys the cache holds equal transformers' cache, the selection really matters
//! (attending to every key instead moves the logits far outside the tolerance), quantised index
//! keys stay close, and bad indexer configs are refused with the field named.

mod common;

use common::*;
use specmla::config::ModelConfig;
use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};
use specmla::weights::{WeightSource, WeightStore};

const FIXTURES: [&str; 3] = ["v32_topk_small", "v32_topk_large", "v32_odd"];

fn tol(reference: &[f32]) -> f32 {
    1e-4 * reference.iter().fold(1.0f32, |m, x| m.max(x.abs()))
}

fn f32s(st: &WeightStore, name: &str) -> Vec<f32> {
    st.get(name)
        .unwrap_or_else(|| panic!("reference tensor {name}"))
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn v32_fixtures_are_in_the_golden_set() {
    let dirs = golden_dirs();
    for f in FIXTURES {
        assert!(
            dirs.iter().any(|d| d.ends_with(f)),
            "{f} missing from models/golden"
        );
        let m = Model::load_dir(&repo().join("models/golden").join(f)).unwrap();
        assert!(m.config.indexer.is_some(), "{f}: indexer parsed");
        assert!(m.layers.iter().all(|l| l.attn.indexer.is_some()));
    }
}

/// After a prefill of prompt 0, the cache's index_key group holds exactly what transformers'
/// DynamicIndexedLayer holds (LayerNorm'd, roped keys), layer by layer.
#[test]
fn cached_index_keys_match_transformers_cache() {
    for f in FIXTURES {
        let dir = repo().join("models/golden").join(f);
        let model = Model::load_dir(&dir).unwrap();
        let st = WeightStore::open(WeightSource::File(dir.join("reference.safetensors"))).unwrap();
        let want = f32s(&st, "index_keys_0"); // [L, T0, D]
        let (ids, _) = golden_reference(&dir).remove(0);
        let mut kv = kv_for(&model, KvDtype::F32, 64);
        let group = kv.group_of("index_key").expect("V3.2 cache has index keys");
        let mut seq = SeqKv::new();
        let plan = kv.plan_grow(&seq, ids.len()).unwrap();
        kv.commit_grow(&mut seq, plan);
        model
            .forward(
                &mut kv,
                &[SeqChunk {
                    kv: &seq,
                    start: 0,
                    tokens: &ids,
                    mha_until: ids.len(),
                    logits: LogitsMode::Last,
                }],
            )
            .unwrap();
        kv.set_len(&mut seq, ids.len());
        let d = model.config.indexer.unwrap().head_dim;
        let t = ids.len();
        for l in 0..model.config.num_hidden_layers {
            let mut got = vec![0f32; t * d]; // [T0, D]
            kv.read_group_range(group, l, &seq, 0, t, &mut got);
            let diff = max_abs_diff(&got, &want[l * t * d..(l + 1) * t * d]);
            assert!(diff <= 1e-5, "{f} layer {l}: index keys differ by {diff}");
        }
        kv.free(&mut seq);
    }
}

/// The same weights with an index_topk that keeps every key (dense MLA): on the fixtures whose
/// selection drops keys the logits move far outside the tolerance (so the golden match proves the
/// selection is transformers'); where nothing is dropped they are bitwise the same.
#[test]
fn the_selection_matters_and_a_large_topk_is_dense_mla() {
    for f in FIXTURES {
        let dir = repo().join("models/golden").join(f);
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["index_topk"] = serde_json::json!(100_000);
        let dense_cfg = ModelConfig::from_json_str(&v.to_string()).unwrap();
        let store = WeightStore::open(WeightSource::Dir(dir.clone())).unwrap();
        let dense = Model::load(dense_cfg, &store).unwrap();
        let sparse = Model::load_dir(&dir).unwrap();
        let (ids, reference) = golden_reference(&dir).remove(0);
        for mha_until in [ids.len(), 0] {
            let mut kv = kv_for(&sparse, KvDtype::F32, 64);
            let s = run_chunked(&sparse, &mut kv, &ids, 4, mha_until);
            let d = run_chunked(&dense, &mut kv, &ids, 4, mha_until);
            assert!(max_abs_diff(&s, &reference) <= tol(&reference), "{f}");
            let moved = max_abs_diff(&d, &reference);
            if f == "v32_topk_large" {
                assert!(
                    s.iter().zip(&d).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{f}: topk >= context must be dense MLA bit for bit"
                );
            } else {
                assert!(
                    moved > 100.0 * tol(&reference),
                    "{f}: dense attention only moved the logits by {moved}"
                );
            }
        }
    }
}

/// Index keys stored in bf16 / fp8 (Hadamard-rotated first) keep the outputs close: the median
/// row error is small and the argmax agrees on most rows (a rounding can flip a close selection,
/// as a KV rounding can flip an expert choice).
#[test]
fn quantised_index_keys_stay_close() {
    let dir = repo().join("models/golden/v32_topk_small");
    let model = Model::load_dir(&dir).unwrap();
    let vocab = model.config.vocab_size;
    let (ids, reference) = golden_reference(&dir).remove(0);
    for (dt, bound) in [(KvDtype::Bf16, 0.1f32), (KvDtype::Fp8E4M3, 1.0)] {
        let cfg = KvConfig::for_model(&model.config, 16, 64, KvDtype::F32).with_index_dtype(dt);
        let mut kv = KvCache::new(cfg).unwrap();
        let s = kv.stats();
        assert_eq!(s.groups[1].kind, "index_key");
        assert_eq!(s.groups[1].dtype, dt);
        let got = run_chunked(&model, &mut kv, &ids, 1, 0);
        let (median, agree) = median_row_error_and_agreement(&got, &reference, vocab);
        assert!(median < bound, "{dt:?}: median row error {median}");
        assert!(
            agree * 10 >= ids.len() * 7,
            "{dt:?}: argmax agrees on {agree}/{}",
            ids.len()
        );
    }
}

#[test]
fn bad_indexer_configs_are_refused_with_the_field_named() {
    let base =
        std::fs::read_to_string(repo().join("models/golden/v32_topk_small/config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&base).unwrap();
    let set = |k: &str, val: serde_json::Value| {
        let mut c = v.clone();
        c[k] = val;
        c.to_string()
    };
    let cases = [
        (set("index_topk", serde_json::json!(0)), "index_topk"),
        (
            set("index_head_dim", serde_json::json!(4)),
            "index_head_dim",
        ), // < qk_rope_head_dim 8
        (
            set("index_head_dim", serde_json::json!(0)),
            "index_head_dim",
        ),
        (set("index_n_heads", serde_json::json!(0)), "index_n_heads"),
        (
            set("index_n_heads", serde_json::json!(1u64 << 40)),
            "index_n_heads",
        ),
        (set("q_lora_rank", serde_json::Value::Null), "q_lora_rank"),
        (
            set("layer_types", serde_json::json!(["indexed_attention"])),
            "layer_types",
        ),
        (
            set(
                "layer_types",
                serde_json::json!(["indexed_attention", "sliding_attention"]),
            ),
            "layer_types",
        ),
        (
            set("mlp_layer_types", serde_json::json!(["sparse", "dense"])),
            "mlp_layer_types",
        ),
        (
            set("model_type", serde_json::json!("deepseek_v3")),
            "index_",
        ),
    ];
    for (text, field) in cases {
        match ModelConfig::from_json_str(&text) {
            Err(specmla::Error::Config { field: f, .. }) => {
                assert!(f.starts_with(field), "expected {field}, got {f}")
            }
            other => panic!("{field}: expected a config error, got {other:?}"),
        }
    }
    // Defaults are transformers': index_topk 2048, index_head_dim 128, index_n_heads 64.
    let mut c = v.clone();
    for k in ["index_topk", "index_head_dim", "index_n_heads"] {
        c.as_object_mut().unwrap().remove(k);
    }
    let cfg = ModelConfig::from_json_str(&c.to_string()).unwrap();
    let ix = cfg.indexer.unwrap();
    assert_eq!((ix.topk, ix.head_dim, ix.n_heads), (2048, 128, 64));
}

/// Ties everywhere: with every index head weight zero all index scores are exactly 0, so every
/// query beyond index_topk keeps the lowest positions (torch.topk would pick by row length and
/// disagree with itself between decode and full forward). Our selection is the same in every
/// chunking and both paths' results are bitwise chunking-invariant; and it is really the lowest
/// positions: equal to a model whose keys beyond them do not exist for the last query.
#[test]
fn ties_are_broken_by_position_in_every_chunking() {
    let dir = repo().join("models/golden/v32_topk_small");
    let mut model = Model::load_dir(&dir).unwrap();
    let ix = model.config.indexer.unwrap();
    let h = model.config.hidden_size;
    for l in &mut model.layers {
        let w = l.attn.indexer.as_mut().unwrap();
        w.weights_proj =
            specmla::kernels::Matrix::from_f32(ix.n_heads, h, vec![0f32; ix.n_heads * h]);
    }
    let (ids, _) = golden_reference(&dir).remove(0);
    assert!(ids.len() > 2 * ix.topk);
    let mut kv = kv_for(&model, KvDtype::F32, 64);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let whole = run_chunked(&model, &mut kv, &ids, ids.len(), ids.len());
    for chunk in [1, 3, 8] {
        let got = run_chunked(&model, &mut kv, &ids, chunk, ids.len());
        assert_eq!(bits(&got), bits(&whole), "MHA chunk {chunk}");
    }
    let a1 = run_chunked(&model, &mut kv, &ids, 1, 0);
    for chunk in [2, 5, ids.len()] {
        let got = run_chunked(&model, &mut kv, &ids, chunk, 0);
        assert_eq!(bits(&got), bits(&a1), "absorbed chunk {chunk}");
    }
    // The first index_topk tokens are what every later query sees: the prompt's first topk
    // tokens followed by one query token gives, for that token, logits that depend only on the
    // first topk keys — so replacing the tokens between them and the query changes nothing.
    let vocab = model.config.vocab_size;
    let t = ids.len();
    let mut other = ids.clone();
    for x in &mut other[ix.topk..t - 1] {
        *x = (*x + 1) % vocab as u32;
    }
    let a = run_chunked(&model, &mut kv, &ids, 1, 0);
    let b = run_chunked(&model, &mut kv, &other, 1, 0);
    // (only attention is restricted; the last token's own residual stream is the same)
    assert_eq!(
        bits(&a[(t - 1) * vocab..]),
        bits(&b[(t - 1) * vocab..]),
        "the last query attends only to the lowest positions"
    );
}

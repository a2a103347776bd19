//! Integration tests for `config` (config.json parsing, defaults, refusals) and `weights`
//! (safetensors store, checked loader, tensor-set check). Safetensors files are written by a tiny
//! writer below (8-byte LE header length + JSON header + data) into per-test temp directories.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use specmla::config::{ModelConfig, ModelType, ScoringFunc, TopkMethod};
use specmla::kernels::MatrixData;
use specmla::weights::{
    bf16_to_f32, check_tensor_set, expected_tensor_names, expected_tensor_shapes, f32_to_bf16,
    fp8_e4m3_to_f32, DType, Loader, WeightSource, WeightStore,
};
use specmla::Error;

// ---------------------------------------------------------------- helpers

/// A temp directory removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("specmla-cw-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One tensor to write: name, safetensors dtype string, shape, raw little-endian data.
struct T {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn t(name: &str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> T {
    T {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn t_f32(name: &str, shape: &[usize], v: &[f32]) -> T {
    t(name, "F32", shape, f32s(v))
}

/// Serialise tensors as a safetensors file (header padded with spaces to 8 bytes).
fn st_bytes(ts: &[T]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for x in ts {
        header.insert(
            x.name.clone(),
            json!({"dtype": x.dtype, "shape": x.shape, "data_offsets": [off, off + x.data.len()]}),
        );
        off += x.data.len();
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut h = serde_json::to_string(&Value::Object(header))
        .unwrap()
        .into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    raw_file(
        &h,
        &ts.iter().flat_map(|x| x.data.clone()).collect::<Vec<_>>(),
    )
}

fn raw_file(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn st_err(r: Result<WeightStore, Error>) -> (String, String) {
    match r {
        Err(Error::Safetensors { path, msg }) => (path, msg),
        Err(e) => panic!("expected Error::Safetensors, got {e:?}"),
        Ok(s) => panic!("expected an error, got {s:?}"),
    }
}

#[track_caller]
fn tensor_err<T: std::fmt::Debug>(r: Result<T, Error>) -> (String, String) {
    match r {
        Err(Error::Tensor { name, msg }) => (name, msg),
        other => panic!("expected Error::Tensor, got {other:?}"),
    }
}

fn config_field(r: Result<ModelConfig, Error>) -> String {
    match r {
        Err(Error::Config { field, .. }) => field,
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

/// The DeepSeek-V3 hub config.json (as published, abridged to the fields that matter).
fn v3_hub() -> Value {
    serde_json::from_str(
        r#"{
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
        "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
        "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
        "v_head_dim": 128, "vocab_size": 129280
    }"#,
    )
    .unwrap()
}

/// The DeepSeek-V2-Lite hub config.json (q_lora_rank null, greedy softmax routing).
fn v2_lite() -> Value {
    serde_json::from_str(
        r#"{
        "model_type": "deepseek_v2", "bos_token_id": 100000, "eos_token_id": 100001,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
        "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
        "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
        "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
        "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
        "v_head_dim": 128, "vocab_size": 102400
    }"#,
    )
    .unwrap()
}

fn parse(v: &Value) -> Result<ModelConfig, Error> {
    ModelConfig::from_json_str(&v.to_string())
}

fn with(mut v: Value, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    f(v.as_object_mut().unwrap());
    v
}

// ---------------------------------------------------------------- config

#[test]
fn v3_hub_config_resolves() {
    let c = parse(&v3_hub()).unwrap();
    assert_eq!(c.model_type, ModelType::DeepseekV3);
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
        (7168, 61, 128)
    );
    assert_eq!(c.q_lora_rank, Some(1536));
    assert_eq!((c.qk_head_dim(), c.kv_cache_dim()), (192, 576));
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.n_routed_experts,
            m.n_shared_experts,
            m.num_experts_per_tok
        ),
        (256, 1, 8)
    );
    assert_eq!((m.n_group, m.topk_group), (8, 4));
    assert_eq!(
        (m.topk_method, m.scoring_func),
        (TopkMethod::NoauxTc, ScoringFunc::Sigmoid)
    );
    assert!(m.norm_topk_prob);
    assert_eq!(m.routed_scaling_factor, 2.5);
    assert!(!c.is_moe_layer(2) && c.is_moe_layer(3) && c.is_moe_layer(60));
    let q = c.quantization.unwrap();
    assert_eq!((q.block_rows, q.block_cols), (128, 128));
    assert_eq!(c.num_nextn_predict_layers, 1);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
    let y = c.rope_scaling.as_ref().unwrap();
    assert_eq!(
        (
            y.factor,
            y.mscale_all_dim,
            y.original_max_position_embeddings
        ),
        (40.0, 1.0, 4096)
    );
    assert_eq!(y.cos_sin_mscale(), 1.0);
    // softmax scale = 192^-0.5 * (0.1 ln 40 + 1)^2
    let mm = 0.1 * 40f64.ln() + 1.0;
    let want = (192f64.powf(-0.5) * mm * mm) as f32;
    assert!(
        (c.softmax_scale() - want).abs() < 1e-7,
        "{} vs {want}",
        c.softmax_scale()
    );
    assert!((c.softmax_scale() - 0.135_234).abs() < 1e-4);
    let s = c.to_summary_json();
    assert_eq!(s["model_type"], "deepseek_v3");
    assert_eq!(s["kv_cache_dim"], 576);
    assert_eq!(s["num_moe_layers"], 58);
    assert_eq!(s["moe"]["topk_method"], "noaux_tc");
    assert_eq!(s["quantization"]["weight_block_size"], json!([128, 128]));
}

#[test]
fn transformers5_spelling_equals_hub_spelling() {
    // transformers 5 save_pretrained: rope_parameters with rope_theta inside, rope_interleave,
    // no topk_method / scoring_func (defaults noaux_tc + sigmoid), floats for beta/factor.
    let t5 = with(v3_hub(), |m| {
        for k in [
            "rope_scaling",
            "rope_theta",
            "topk_method",
            "scoring_func",
            "moe_layer_freq",
        ] {
            m.remove(k);
        }
        m.insert("rope_interleave".into(), json!(true));
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096}),
        );
    });
    assert_eq!(parse(&t5).unwrap(), parse(&v3_hub()).unwrap());
    // rope_type "default" or absent scaling: no YaRN, theta from rope_parameters.
    let plain = with(t5, |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 50000.0}),
        );
    });
    let c = parse(&plain).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling.is_none()), (50000.0, true));
    assert!((c.softmax_scale() - 192f32.powf(-0.5)).abs() < 1e-8);
    // hub spelling with `rope_type` key instead of `type`, and top-level theta.
    let hub_rt = with(v3_hub(), |m| {
        let rs = m.get_mut("rope_scaling").unwrap().as_object_mut().unwrap();
        let ty = rs.remove("type").unwrap();
        rs.insert("rope_type".into(), ty);
    });
    assert_eq!(parse(&hub_rt).unwrap(), parse(&v3_hub()).unwrap());
}

#[test]
fn v2_lite_and_v2_defaults() {
    let c = parse(&v2_lite()).unwrap();
    assert_eq!(c.model_type, ModelType::DeepseekV2);
    assert_eq!(c.q_lora_rank, None);
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1));
    assert_eq!(c.eos_token_ids, vec![100001]);
    // mscale_all_dim 0.707: m = 0.1*0.707*ln 40 + 1
    let mm = 0.1 * 0.707 * 40f64.ln() + 1.0;
    assert!((c.softmax_scale() as f64 - 192f64.powf(-0.5) * mm * mm).abs() < 1e-7);

    let bare = with(v2_lite(), |m| {
        for k in [
            "topk_method",
            "scoring_func",
            "norm_topk_prob",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "moe_layer_freq",
            "first_k_dense_replace",
            "rms_norm_eps",
            "tie_word_embeddings",
            "hidden_act",
            "rope_theta",
            "bos_token_id",
            "eos_token_id",
        ] {
            m.remove(k);
        }
        let rs = m.get_mut("rope_scaling").unwrap().as_object_mut().unwrap();
        for k in ["beta_fast", "beta_slow", "mscale", "mscale_all_dim"] {
            rs.remove(k);
        }
    });
    let c = parse(&bare).unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.topk_method, m.scoring_func),
        (TopkMethod::Greedy, ScoringFunc::Softmax)
    );
    assert!(!m.norm_topk_prob);
    assert_eq!(
        (m.routed_scaling_factor, m.n_group, m.topk_group),
        (1.0, 1, 1)
    );
    assert_eq!((m.moe_layer_freq, m.first_k_dense_replace), (1, 0));
    assert_eq!(
        (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings),
        (10000.0, 1e-6, false)
    );
    assert_eq!((c.bos_token_id, c.eos_token_ids.len()), (None, 0));
    let y = c.rope_scaling.clone().unwrap();
    assert_eq!(
        (y.beta_fast, y.beta_slow, y.mscale, y.mscale_all_dim),
        (32.0, 1.0, 1.0, 0.0)
    );
    // mscale_all_dim 0 => no attention-scale correction; cos/sin get m(factor, 1).
    assert!((c.softmax_scale() - 192f32.powf(-0.5)).abs() < 1e-8);
    assert!((y.cos_sin_mscale() - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-12);

    // dense model: n_routed_experts null
    let dense = with(v2_lite(), |m| {
        m.insert("n_routed_experts".into(), Value::Null);
    });
    let c = parse(&dense).unwrap();
    assert!(c.moe.is_none() && !c.is_moe_layer(5));
}

#[test]
fn v3_defaults_and_layer_rule() {
    let c = parse(&with(v3_hub(), |m| {
        for k in [
            "topk_method",
            "scoring_func",
            "norm_topk_prob",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "first_k_dense_replace",
            "num_nextn_predict_layers",
        ] {
            m.remove(k);
        }
    }))
    .unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.topk_method, m.scoring_func, m.norm_topk_prob),
        (TopkMethod::NoauxTc, ScoringFunc::Sigmoid, true)
    );
    assert_eq!(
        (
            m.routed_scaling_factor,
            m.n_group,
            m.topk_group,
            m.first_k_dense_replace
        ),
        (2.5, 8, 4, 3)
    );
    assert_eq!(c.num_nextn_predict_layers, 0);

    let c = parse(&with(v3_hub(), |m| {
        m.insert("moe_layer_freq".into(), json!(2));
        m.insert("first_k_dense_replace".into(), json!(1));
        m.insert("eos_token_id".into(), json!([1, 7]));
    }))
    .unwrap();
    let moe: Vec<bool> = (0..6).map(|l| c.is_moe_layer(l)).collect();
    assert_eq!(moe, vec![false, false, true, false, true, false]);
    assert_eq!(c.eos_token_ids, vec![1, 7]);
}

/// Config variants transformers 5.24 loads and runs, read the way it reads them.
#[test]
fn transformers_compatible_variants() {
    let yarn = |v: &Value| parse(v).unwrap().rope_scaling.unwrap();
    // YaRN `factor` is used as given, also when max_position_embeddings is lowered to cap memory.
    let capped = with(v3_hub(), |m| {
        m.insert("max_position_embeddings".into(), json!(8192));
    });
    let y = yarn(&capped);
    assert_eq!((y.factor, y.original_max_position_embeddings), (40.0, 4096));
    assert_eq!(parse(&capped).unwrap().max_position_embeddings, 8192);
    assert_eq!(
        parse(&capped).unwrap().softmax_scale(),
        parse(&v3_hub()).unwrap().softmax_scale()
    );
    // `factor: null` -> max_position_embeddings / original_max_position_embeddings.
    let null_factor = with(v3_hub(), |m| {
        m["rope_scaling"]["factor"] = Value::Null;
        m.insert("max_position_embeddings".into(), json!(32768));
    });
    assert_eq!(yarn(&null_factor).factor, 8.0);
    // A top-level original_max_position_embeddings wins over the one in rope_scaling.
    let top = with(v3_hub(), |m| {
        m.insert("original_max_position_embeddings".into(), json!(2048));
    });
    assert_eq!(yarn(&top).original_max_position_embeddings, 2048);
    // Explicit attention_factor (cos/sin multiplier) and truncate: false.
    let af = with(v3_hub(), |m| {
        m["rope_scaling"]["attention_factor"] = json!(1.25);
        m["rope_scaling"]["truncate"] = json!(false);
    });
    let y = yarn(&af);
    assert_eq!((y.cos_sin_mscale(), y.truncate), (1.25, false));
    assert!(yarn(&v3_hub()).truncate);
    assert_eq!(yarn(&v3_hub()).cos_sin_mscale(), 1.0);

    // MoE fields are not read where no layer (MTP layers included) is MoE.
    let garbage = |m: &mut serde_json::Map<String, Value>| {
        m.insert("n_group".into(), json!(7));
        m.insert("num_experts_per_tok".into(), json!(300));
        m.insert("topk_method".into(), json!("random"));
        m.insert("moe_intermediate_size".into(), json!(0));
        m.remove("n_shared_experts");
    };
    let dense = with(v3_hub(), |m| {
        garbage(m);
        m.insert("first_k_dense_replace".into(), json!(62)); // 61 layers + 1 MTP layer
    });
    let c = parse(&dense).unwrap();
    assert!(c.moe.is_none() && c.num_moe_layers() == 0);
    // ... but the MTP layer (index 61) is MoE when first_k_dense_replace = 61.
    let mtp_moe = with(v3_hub(), |m| {
        garbage(m);
        m.insert("first_k_dense_replace".into(), json!(61));
    });
    assert!(parse(&mtp_moe).is_err());
    // moe_layer_freq with no multiple among the layers: dense too.
    let sparse = with(v2_lite(), |m| {
        garbage(m);
        m.insert("first_k_dense_replace".into(), json!(1));
        m.insert("moe_layer_freq".into(), json!(64));
    });
    assert!(parse(&sparse).unwrap().moe.is_none());

    // num_mtp_layers is transformers' alias of num_nextn_predict_layers.
    let alias = with(v3_hub(), |m| {
        m.remove("num_nextn_predict_layers");
        m.insert("num_mtp_layers".into(), json!(2));
    });
    assert_eq!(parse(&alias).unwrap().num_nextn_predict_layers, 2);
    let clash = with(v3_hub(), |m| {
        m.insert("num_mtp_layers".into(), json!(2));
    });
    assert_eq!(config_field(parse(&clash)), "num_mtp_layers");

    // fp8 with modules_to_not_convert (a list of module names) is accepted.
    let partial = with(v3_hub(), |m| {
        m["quantization_config"]["modules_to_not_convert"] =
            json!(["lm_head", "model.layers.0.self_attn"]);
    });
    assert!(parse(&partial).unwrap().quantization.is_some());
}

#[test]
fn refusals_name_their_field() {
    type Edit = Box<dyn Fn(&mut serde_json::Map<String, Value>)>;
    fn set(k: &'static str, v: Value) -> Edit {
        Box::new(move |m| {
            m.insert(k.into(), v.clone());
        })
    }
    fn del(k: &'static str) -> Edit {
        Box::new(move |m| {
            m.remove(k);
        })
    }
    let cases: Vec<(Edit, &str)> = vec![
        (set("model_type", json!("llama")), "model_type"),
        (del("model_type"), "model_type"),
        (
            set("rope_scaling", json!({"type": "linear", "factor": 2.0})),
            "rope_scaling.type",
        ),
        (
            Box::new(|m| {
                m.remove("rope_scaling");
                m.insert(
                    "rope_parameters".into(),
                    json!({"rope_type": "dynamic", "factor": 2.0}),
                );
            }),
            "rope_parameters.rope_type",
        ),
        (set("index_topk", json!(2048)), "index_topk"),
        (set("index_n_heads", json!(64)), "index_n_heads"),
        (set("index_head_dim", json!(128)), "index_head_dim"),
        (
            set(
                "quantization_config",
                json!({"quant_method": "gptq", "bits": 4}),
            ),
            "quantization_config.quant_method",
        ),
        (
            set(
                "quantization_config",
                json!({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}),
            ),
            "quantization_config.fmt",
        ),
        (
            set("quantization_config", json!({"quant_method": "fp8"})),
            "quantization_config.weight_block_size",
        ),
        (
            set("num_experts_per_tok", json!(300)),
            "num_experts_per_tok",
        ),
        (set("topk_group", json!(9)), "topk_group"),
        (set("n_group", json!(7)), "n_group"),
        (set("hidden_size", json!(0)), "hidden_size"),
        (set("v_head_dim", json!(0)), "v_head_dim"),
        (set("scoring_func", json!("tanh")), "scoring_func"),
        (set("topk_method", json!("random")), "topk_method"),
        (set("hidden_act", json!("gelu")), "hidden_act"),
        (del("kv_lora_rank"), "kv_lora_rank"),
        (del("q_lora_rank"), "q_lora_rank"),
        (del("vocab_size"), "vocab_size"),
        (set("rope_interleave", json!(false)), "rope_interleave"),
        (set("eos_token_id", json!("</s>")), "eos_token_id"),
        (set("attention_bias", json!(true)), "attention_bias"),
        (set("qk_rope_head_dim", json!(63)), "qk_rope_head_dim"),
        (set("hidden_size", json!(-4)), "hidden_size"),
        (set("moe_layer_freq", json!(0)), "moe_layer_freq"),
        (del("moe_intermediate_size"), "moe_intermediate_size"),
        (
            set("num_hidden_layers", json!(1u64 << 40)),
            "num_hidden_layers",
        ),
        (set("vocab_size", json!(1e15)), "vocab_size"),
        (
            set("max_position_embeddings", json!(1u64 << 40)),
            "max_position_embeddings",
        ),
        (
            set("num_attention_heads", json!(1 << 20)),
            "num_attention_heads",
        ),
        // Found by fuzzing: overflowed qk_head_dim before the bounds ran (debug builds panicked).
        (
            set("qk_nope_head_dim", json!(18446744073709551614u64)),
            "qk_nope_head_dim",
        ),
        // Found by fuzzing: 61 layers x 16384 experts listed ~3e6 expected tensors first.
        (set("n_routed_experts", json!(16384)), "n_routed_experts"),
        (
            set(
                "quantization_config",
                json!({"quant_method": "fp8", "weight_block_size": [128, 128],
                       "modules_to_not_convert": "lm_head"}),
            ),
            "quantization_config.modules_to_not_convert",
        ),
        (
            set(
                "rope_scaling",
                json!({"type": "yarn", "factor": 40, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096}),
            ),
            "rope_scaling.mscale",
        ),
        (
            set(
                "rope_scaling",
                json!({"type": "yarn", "mscale": 1.0, "original_max_position_embeddings": 4096}),
            ),
            "rope_scaling.factor",
        ),
    ];
    for (i, (edit, field)) in cases.iter().enumerate() {
        let mut v = v3_hub();
        edit(v.as_object_mut().unwrap());
        assert_eq!(config_field(parse(&v)), *field, "case {i}");
    }
    assert_eq!(
        config_field(ModelConfig::from_json_str("{not json")),
        "(document)"
    );
    assert_eq!(
        config_field(ModelConfig::from_json_str("[1]")),
        "(document)"
    );
    let msg = parse(&with(v3_hub(), |m| {
        m.insert("num_experts_per_tok".into(), json!(300));
    }))
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("num_experts_per_tok") && msg.contains("300"),
        "{msg}"
    );
}

#[test]
fn config_from_file() {
    let d = TempDir::new("cfgfile");
    let p = write(d.path(), "config.json", v2_lite().to_string().as_bytes());
    assert_eq!(
        ModelConfig::from_file(&p).unwrap(),
        parse(&v2_lite()).unwrap()
    );
    assert!(matches!(
        ModelConfig::from_file(&d.path().join("nope.json")),
        Err(Error::Io { .. })
    ));
}

// ---------------------------------------------------------------- dtypes

#[test]
fn fp8_table_all_256_values() {
    for b in 0..=255u8 {
        let s = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
        let got = fp8_e4m3_to_f32(b);
        if e == 15 && m == 7.0 {
            assert!(got.is_nan(), "{b:#04x}");
            continue;
        }
        let want = s * if e == 0 {
            m * 2f64.powi(-9)
        } else {
            (8.0 + m) * 2f64.powi(e - 10)
        };
        assert_eq!(got as f64, want, "{b:#04x}");
    }
    assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
    let max = (0..=255u8)
        .map(fp8_e4m3_to_f32)
        .filter(|x| !x.is_nan())
        .fold(f32::MIN, f32::max);
    assert_eq!(max, 448.0);
}

#[test]
fn bf16_round_trip() {
    for x in [
        0.0f32,
        -0.0,
        1.0,
        -3.5,
        2f32.powi(-100),
        65280.0,
        f32::INFINITY,
        -f32::INFINITY,
    ] {
        assert_eq!(bf16_to_f32(f32_to_bf16(x)), x);
    }
    // 1 + 2^-9 is below the half-way point: rounds down; 1 + 2^-7 + 2^-9 rounds up past a tie.
    assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 2f32.powi(-9))), 1.0);
    assert_eq!(
        bf16_to_f32(f32_to_bf16(1.0 + 2f32.powi(-7) + 2f32.powi(-9))),
        1.0 + 2f32.powi(-7)
    );
    let x = 0.123_456_79f32;
    assert!((bf16_to_f32(f32_to_bf16(x)) - x).abs() <= x * 2f32.powi(-8));
}

// ---------------------------------------------------------------- store

#[test]
fn single_file_and_bytes() {
    let d = TempDir::new("single");
    let ts = vec![
        t_f32("a", &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
        t(
            "b",
            "BF16",
            &[3],
            [1.0f32, -2.0, 0.5]
                .iter()
                .flat_map(|x| f32_to_bf16(*x).to_le_bytes())
                .collect(),
        ),
        t("c", "I64", &[1], 7i64.to_le_bytes().to_vec()),
    ];
    let bytes = st_bytes(&ts);
    let p = write(d.path(), "w.safetensors", &bytes);
    for s in [
        WeightStore::open(WeightSource::File(p.clone())).unwrap(),
        WeightStore::open(WeightSource::Bytes(bytes.clone())).unwrap(),
    ] {
        assert_eq!(s.names().collect::<Vec<_>>(), vec!["a", "b", "c"]);
        assert_eq!(s.total_bytes(), 16 + 6 + 8);
        let a = s.get("a").unwrap();
        assert_eq!(
            (a.name, a.dtype.clone(), a.shape),
            ("a", DType::F32, &[2usize, 2][..])
        );
        assert_eq!(a.data, &f32s(&[1.0, 2.0, 3.0, 4.0])[..]);
        assert_eq!(s.get("c").unwrap().dtype, DType::Other("i64".into()));
        assert!(s.get("zz").is_none());
        let l = Loader::new(&s, None);
        assert_eq!(l.vector_f32("b", 3).unwrap(), vec![1.0, -2.0, 0.5]);
        assert!(l.has("a") && !l.has("zz"));
    }
    // Dir with model.safetensors
    write(d.path(), "model.safetensors", &bytes);
    let s = WeightStore::open_dir(d.path()).unwrap();
    assert_eq!(s.names().count(), 3);
}

#[test]
fn sharded_index_two_shards() {
    let d = TempDir::new("sharded");
    let s1 = st_bytes(&[
        t_f32("x.weight", &[2], &[1.0, 2.0]),
        t_f32("y.weight", &[1], &[3.0]),
    ]);
    let s2 = st_bytes(&[t_f32("z.weight", &[1], &[4.0])]);
    write(d.path(), "model-00001-of-00002.safetensors", &s1);
    write(d.path(), "model-00002-of-00002.safetensors", &s2);
    let index = json!({"metadata": {"total_size": 16}, "weight_map": {
        "x.weight": "model-00001-of-00002.safetensors", "y.weight": "model-00001-of-00002.safetensors",
        "z.weight": "model-00002-of-00002.safetensors"}});
    write(
        d.path(),
        "model.safetensors.index.json",
        index.to_string().as_bytes(),
    );
    let s = WeightStore::open(WeightSource::Dir(d.path().to_path_buf())).unwrap();
    assert_eq!(
        s.names().collect::<Vec<_>>(),
        vec!["x.weight", "y.weight", "z.weight"]
    );
    let l = Loader::new(&s, None);
    assert_eq!(l.vector_f32("z.weight", 1).unwrap(), vec![4.0]);
    assert_eq!(s.total_bytes(), 16);

    // a tensor the index places in a shard that does not hold it
    let bad = json!({"weight_map": {"x.weight": "model-00002-of-00002.safetensors",
                                     "z.weight": "model-00002-of-00002.safetensors"}});
    write(
        d.path(),
        "model.safetensors.index.json",
        bad.to_string().as_bytes(),
    );
    let (path, msg) = st_err(WeightStore::open_dir(d.path()));
    assert!(
        path.ends_with("model-00002-of-00002.safetensors") && msg.contains("x.weight"),
        "{path}: {msg}"
    );

    // missing shard
    let missing = json!({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
                                         "w.weight": "model-00003-of-00003.safetensors"}});
    write(
        d.path(),
        "model.safetensors.index.json",
        missing.to_string().as_bytes(),
    );
    let (path, msg) = st_err(WeightStore::open_dir(d.path()));
    assert!(path.ends_with("model.safetensors.index.json"), "{path}");
    assert!(
        msg.contains("model-00003-of-00003.safetensors") && msg.contains("does not exist"),
        "{msg}"
    );

    // escaping the directory is refused
    let escape = json!({"weight_map": {"x.weight": "../x.safetensors"}});
    write(
        d.path(),
        "model.safetensors.index.json",
        escape.to_string().as_bytes(),
    );
    assert!(st_err(WeightStore::open_dir(d.path()))
        .1
        .contains("plain file name"));

    // no index: all *.safetensors in name order, duplicates across files refused
    std::fs::remove_file(d.path().join("model.safetensors.index.json")).unwrap();
    assert_eq!(WeightStore::open_dir(d.path()).unwrap().names().count(), 3);
    write(d.path(), "model-00003.safetensors", &s2);
    assert!(st_err(WeightStore::open_dir(d.path()))
        .1
        .contains("z.weight"));

    let empty = TempDir::new("emptydir");
    st_err(WeightStore::open_dir(empty.path()));
    assert!(matches!(
        WeightStore::open_dir(&empty.path().join("nope")),
        Err(Error::Io { .. })
    ));
}

#[test]
fn malformed_files_are_errors() {
    let good = st_bytes(&[t_f32("a", &[2], &[1.0, 2.0]), t_f32("b", &[1], &[3.0])]);
    let open = |b: Vec<u8>| WeightStore::open(WeightSource::Bytes(b));
    // shorter than the 8-byte length
    assert!(st_err(open(vec![1, 2, 3])).1.contains("truncated"));
    assert!(st_err(open(vec![])).1.contains("truncated"));
    // header length past EOF
    let mut b = good.clone();
    b[..8].copy_from_slice(&(10_000u64).to_le_bytes());
    assert!(st_err(open(b)).1.contains("past the end"));
    let mut b = good.clone();
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(st_err(open(b)).1.contains("past the end"));
    // bad JSON
    assert!(st_err(open(raw_file(b"{\"a\": [", &[]))).1.contains("JSON"));
    assert!(st_err(open(raw_file(&[0xFF, 0xFE], &[])))
        .1
        .contains("UTF-8"));
    // data section truncated
    assert!(!st_err(open(good[..good.len() - 3].to_vec())).1.is_empty());
    // trailing bytes
    let mut b = good.clone();
    b.push(0);
    st_err(open(b));
    // offsets out of range
    let h = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8000]}}"#;
    st_err(open(raw_file(h, &[0; 8])));
    // byte size does not match shape * dtype
    let h = br#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    assert!(st_err(open(raw_file(h, &[0; 8]))).1.contains("byte size"));
    // overlapping tensors
    let h = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    assert!(st_err(open(raw_file(h, &[0; 8]))).1.contains("overlap"));
    // unknown dtype string
    let h = br#"{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}"#;
    st_err(open(raw_file(h, &[0])));
    // the file path is named in the error
    let d = TempDir::new("malformed");
    let p = write(d.path(), "bad.safetensors", &[1, 2]);
    let (path, _) = st_err(WeightStore::open(WeightSource::File(p)));
    assert!(path.ends_with("bad.safetensors"));
    let mut b = good;
    b.push(0);
    assert!(open(b).is_err());
}

// ---------------------------------------------------------------- loader

#[test]
fn loader_checks_and_conversions() {
    let f16: Vec<u8> = [0.5f32, -1.25]
        .iter()
        .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
        .collect();
    let bf: Vec<u16> = (0..6).map(|i| f32_to_bf16(i as f32 * 0.25 - 0.5)).collect();
    let store = WeightStore::open(WeightSource::Bytes(st_bytes(&[
        t("odd", "U8", &[1], vec![9]), // puts the following data at an odd offset
        t_f32("w32", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        t(
            "wbf",
            "BF16",
            &[2, 3],
            bf.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        t("wf16", "F16", &[1, 2], f16),
        t("big", "F32", &[64, 127], vec![0; 64 * 127 * 4]),
        t("i", "I64", &[2, 3], vec![0; 48]),
    ])))
    .unwrap();
    let l = Loader::new(&store, None);
    let m = l.matrix("w32", 2, 3).unwrap();
    assert!(matches!(&m.data, MatrixData::F32(v) if v[..] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let m = l.matrix("wbf", 2, 3).unwrap();
    assert!(matches!(&m.data, MatrixData::Bf16(v) if v[..] == bf[..]));
    let m = l.matrix("wf16", 1, 2).unwrap();
    assert!(
        matches!(&m.data, MatrixData::F16(v) if v.iter().map(|x| x.to_f32()).collect::<Vec<_>>() == [0.5, -1.25])
    );
    assert_eq!(
        l.matrix_f32("wbf", 2, 3).unwrap(),
        vec![-0.5, -0.25, 0.0, 0.25, 0.5, 0.75]
    );

    assert_eq!(
        tensor_err(l.matrix("big", 64, 128)),
        (
            "big".to_string(),
            "expected shape [64, 128], found [64, 127]".to_string()
        )
    );
    assert_eq!(
        tensor_err(l.matrix("i", 2, 3)),
        (
            "i".to_string(),
            "expected dtype one of f32/bf16/f16/f8_e4m3, found i64".to_string()
        )
    );
    assert_eq!(
        tensor_err(l.matrix("nope", 1, 1)),
        ("nope".to_string(), "missing".to_string())
    );
    assert_eq!(
        tensor_err(l.vector_f32("w32", 6)).1,
        "expected shape [6], found [2, 3]"
    );
    let e = l.matrix("big", 64, 128).unwrap_err().to_string();
    assert!(e.contains("`big`") && e.contains("[64, 127]"), "{e}");
}

#[test]
fn fp8_matrix_with_partial_blocks() {
    // [5, 7] weights with 2x4 blocks -> scales [3, 2] (last block row and column are partial).
    let (rows, cols, br, bc) = (5usize, 7usize, 2usize, 4usize);
    let q: Vec<u8> = (0..rows * cols)
        .map(|i| ((i * 37 + 11) % 256) as u8)
        .map(|b| if b & 0x7F == 0x7F { 0x38 } else { b })
        .collect();
    let scales: Vec<f32> = (0..6).map(|i| 0.5 + i as f32).collect(); // [3, 2]
    let store = WeightStore::open(WeightSource::Bytes(st_bytes(&[
        t("p.weight", "F8_E4M3", &[rows, cols], q.clone()),
        t_f32("p.weight_scale_inv", &[3, 2], &scales),
        t("r.weight", "F8_E4M3", &[rows, cols], q.clone()),
        t_f32("r.weight_scale_inv", &[2, 2], &[1.0; 4]),
        t("s.weight", "F8_E4M3", &[rows, cols], q.clone()),
    ])))
    .unwrap();
    let quant = Some(specmla::config::Fp8Quant {
        block_rows: br,
        block_cols: bc,
    });
    let l = Loader::new(&store, quant);
    let m = l.matrix("p.weight", rows, cols).unwrap();
    let MatrixData::Fp8 {
        data,
        scale_inv,
        block_rows,
        block_cols,
    } = &m.data
    else {
        panic!("not fp8")
    };
    assert_eq!(
        (&data[..], &scale_inv[..], *block_rows, *block_cols),
        (&q[..], &scales[..], br, bc)
    );
    let deq = l.matrix_f32("p.weight", rows, cols).unwrap();
    for i in 0..rows {
        for j in 0..cols {
            let want = fp8_e4m3_to_f32(q[i * cols + j]) * scales[(i / br) * 2 + j / bc];
            assert_eq!(deq[i * cols + j], want, "({i}, {j})");
        }
    }
    // scale of the wrong shape / missing scale / no quantization_config
    let (name, msg) = tensor_err(l.matrix("r.weight", rows, cols));
    assert_eq!(
        (name.as_str(), msg.as_str()),
        ("r.weight_scale_inv", "expected shape [3, 2], found [2, 2]")
    );
    assert_eq!(
        tensor_err(l.matrix("s.weight", rows, cols)),
        ("s.weight_scale_inv".into(), "missing".into())
    );
    let l0 = Loader::new(&store, None);
    assert!(tensor_err(l0.matrix("p.weight", rows, cols))
        .1
        .contains("quantization_config"));
    assert!(tensor_err(l.vector_f32("p.weight", rows * cols))
        .1
        .contains("found [5, 7]"));
}

// ---------------------------------------------------------------- tensor set

fn tiny_v3(extra: Value) -> ModelConfig {
    let mut v = json!({
        "model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 8,
        "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "max_position_embeddings": 64,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
        "topk_group": 1, "moe_intermediate_size": 8, "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    parse(&v).unwrap()
}

fn store_of(tensors: &[(String, Vec<usize>)]) -> WeightStore {
    let ts: Vec<T> = tensors
        .iter()
        .map(|(n, shape)| t_f32(n, shape, &vec![0.0; shape.iter().product()]))
        .collect();
    WeightStore::open(WeightSource::Bytes(st_bytes(&ts))).unwrap()
}

/// Like `store_of`, but every weight with a `_scale_inv` sibling in the list is stored as fp8,
/// except those named in `keep_f32` (which are stored f32 and lose their scale); tensors named in
/// `drop` are left out.
fn store_of_fp8(tensors: &[(String, Vec<usize>)], keep_f32: &[&str], drop: &[&str]) -> WeightStore {
    let has = |n: &str| tensors.iter().any(|(m, _)| m == n);
    let ts: Vec<T> = tensors
        .iter()
        .filter(|(n, _)| !drop.contains(&n.as_str()))
        .filter_map(|(n, shape)| {
            let numel: usize = shape.iter().product();
            if let Some(w) = n.strip_suffix("_scale_inv") {
                if keep_f32.contains(&w) {
                    return None;
                }
            } else if has(&format!("{n}_scale_inv")) && !keep_f32.contains(&n.as_str()) {
                return Some(t(n, "F8_E4M3", shape, vec![0u8; numel]));
            }
            Some(t_f32(n, shape, &vec![0.0; numel]))
        })
        .collect();
    WeightStore::open(WeightSource::Bytes(st_bytes(&ts))).unwrap()
}

#[test]
fn tensor_set_check() {
    let c = tiny_v3(json!({}));
    let mut ts = expected_tensor_shapes(&c);
    assert_eq!(
        ts.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        expected_tensor_names(&c)
    );
    let shape_of =
        |ts: &[(String, Vec<usize>)], n: &str| ts.iter().find(|(m, _)| m == n).unwrap().1.clone();
    // hidden 16, heads 2, q_lora 8, kv_lora 8, nope 4, rope 2, v 4, 4 experts of width 8, 1 shared
    assert_eq!(
        shape_of(&ts, "model.layers.0.self_attn.q_b_proj.weight"),
        vec![12, 8]
    );
    assert_eq!(
        shape_of(&ts, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"),
        vec![10, 16]
    );
    assert_eq!(
        shape_of(&ts, "model.layers.0.self_attn.kv_b_proj.weight"),
        vec![16, 8]
    );
    assert_eq!(
        shape_of(&ts, "model.layers.0.self_attn.o_proj.weight"),
        vec![16, 8]
    );
    assert_eq!(
        shape_of(&ts, "model.layers.0.mlp.down_proj.weight"),
        vec![16, 24]
    );
    assert_eq!(
        shape_of(&ts, "model.layers.1.mlp.experts.3.gate_proj.weight"),
        vec![8, 16]
    );
    assert_eq!(shape_of(&ts, "model.layers.1.mlp.gate.weight"), vec![4, 16]);
    assert_eq!(
        shape_of(&ts, "model.layers.1.mlp.gate.e_score_correction_bias"),
        vec![4]
    );
    assert_eq!(
        check_tensor_set(&c, &store_of(&ts)).unwrap(),
        Vec::<String>::new()
    );

    // MTP layer 2 tensors are recognised and returned; inv_freq is ignored
    let mtp = [
        "model.layers.2.eh_proj.weight",
        "model.layers.2.enorm.weight",
        "model.layers.2.mlp.experts.0.up_proj.weight",
        "model.layers.2.shared_head.head.weight",
    ];
    ts.extend(mtp.iter().map(|s| (s.to_string(), vec![1])));
    ts.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        vec![1],
    ));
    let got = check_tensor_set(&c, &store_of(&ts)).unwrap();
    let mut want: Vec<String> = mtp.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(got, want);

    // an unexpected tensor (layer past the MTP range, or a stray name) is refused by name
    for stray in [
        "model.layers.3.enorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "extra.bias",
    ] {
        let mut n = ts.clone();
        n.push((stray.into(), vec![1]));
        let (name, msg) = tensor_err(check_tensor_set(&c, &store_of(&n)));
        assert_eq!(name, stray);
        assert!(msg.contains("unexpected"), "{msg}");
    }
    // a missing expected tensor is refused by name
    let bias = "model.layers.1.mlp.gate.e_score_correction_bias";
    let n: Vec<_> = ts.iter().filter(|(s, _)| s != bias).cloned().collect();
    assert_eq!(
        tensor_err(check_tensor_set(&c, &store_of(&n))),
        (bias.to_string(), "missing".to_string())
    );
    // a wrong shape is refused by name
    let n: Vec<_> = ts
        .iter()
        .map(|(s, sh)| (s.clone(), if s == bias { vec![5] } else { sh.clone() }))
        .collect();
    assert_eq!(
        tensor_err(check_tensor_set(&c, &store_of(&n))),
        (
            bias.to_string(),
            "expected shape [4], found [5]".to_string()
        )
    );
    // without MTP layers configured, layer-2 tensors are unexpected
    let c0 = tiny_v3(json!({"num_nextn_predict_layers": 0}));
    assert!(tensor_err(check_tensor_set(&c0, &store_of(&ts)))
        .1
        .contains("unexpected"));

    // fp8 config expects _scale_inv siblings; tied embeddings drop lm_head; q_proj when no q-LoRA
    let cq = tiny_v3(
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [4, 4]},
                            "tie_word_embeddings": true, "q_lora_rank": null}),
    );
    let tq = expected_tensor_shapes(&cq);
    assert_eq!(
        shape_of(&tq, "model.layers.0.self_attn.q_proj.weight"),
        vec![12, 16]
    );
    assert_eq!(
        shape_of(&tq, "model.layers.0.self_attn.q_proj.weight_scale_inv"),
        vec![3, 4]
    );
    assert_eq!(
        shape_of(
            &tq,
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"
        ),
        vec![3, 4]
    );
    assert!(!tq
        .iter()
        .any(|(s, _)| s.contains("q_a_proj") || s == "lm_head.weight"));
    let (name, _) = tensor_err(check_tensor_set(&cq, &store_of_fp8(&ts, &[], &[])));
    assert!(name.starts_with("model.layers.0."), "{name}");
    assert!(check_tensor_set(&cq, &store_of_fp8(&tq, &[], &[])).is_ok());
    // Linears left unquantised (modules_to_not_convert, or just stored in full precision) need
    // no scale; an fp8 weight without its scale, or a scale beside a non-fp8 weight, is refused.
    let kept = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.experts.0.down_proj.weight",
    ];
    assert!(check_tensor_set(&cq, &store_of_fp8(&tq, &kept, &[])).is_ok());
    let no_scale = ["model.layers.0.self_attn.o_proj.weight_scale_inv"];
    let (name, msg) = tensor_err(check_tensor_set(&cq, &store_of_fp8(&tq, &[], &no_scale)));
    assert_eq!(name, "model.layers.0.self_attn.o_proj.weight_scale_inv");
    assert_eq!(msg, "missing");
    // f32 weights everywhere but all the scales still there: the scales are unexpected.
    let (name, msg) = tensor_err(check_tensor_set(&cq, &store_of(&tq)));
    assert!(
        name.ends_with("_scale_inv") && msg.contains("unexpected"),
        "{name}: {msg}"
    );
    // num_hidden_layers larger than the checkpoint: refused before the expected list is built.
    let huge = tiny_v3(json!({"num_hidden_layers": 4000, "num_nextn_predict_layers": 0}));
    let (name, msg) = tensor_err(check_tensor_set(&huge, &store_of(&ts)));
    assert_eq!(name, "model.layers.3999.input_layernorm.weight");
    assert!(msg.contains("num_hidden_layers"), "{msg}");
}

/// Golden checkpoints written by the reference implementation (models/golden/*), when present.
#[test]
fn golden_checkpoints_pass_tensor_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/golden");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        eprintln!("no {} — golden tensor-set check skipped", root.display());
        return;
    };
    let mut checked = 0;
    for d in dirs {
        let d = d.unwrap().path();
        let cfg_path = d.join("config.json");
        if !cfg_path.is_file() {
            continue;
        }
        let cfg =
            ModelConfig::from_file(&cfg_path).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        let store = WeightStore::open_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        check_tensor_set(&cfg, &store).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        let l = Loader::new(&store, cfg.quantization);
        for (name, shape) in expected_tensor_shapes(&cfg) {
            let r = match shape[..] {
                [n] => l.vector_f32(&name, n).map(|_| ()),
                [r, c] if !name.ends_with("_scale_inv") => l.matrix(&name, r, c).map(|_| ()),
                _ => Ok(()),
            };
            r.unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        }
        checked += 1;
    }
    assert!(checked > 0, "{} holds no checkpoint", root.display());
}

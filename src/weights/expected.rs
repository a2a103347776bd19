//! The tensor set a configuration implies, and the check of a checkpoint against it.
//!
//! Data flow: `ModelConfig` -> [`expected_tensor_shapes`]; (`ModelConfig`, `WeightStore`) ->
//! [`check_tensor_set`] before any `model` is built. Guarantees: a store that passes has every
//! expected tensor and nothing unexplained — the only extra tensors allowed are multi-token-prediction
//! layers (`model.layers.{L}.*` with `num_hidden_layers <= L < num_hidden_layers +
//! num_nextn_predict_layers`), which are returned, and known-ignorable buffers (`*.rotary_emb.inv_freq`).
//! Shapes of expected tensors are checked too; dtypes are checked tensor by tensor by the `Loader`.
//! In an fp8 checkpoint a projection's `_scale_inv` is expected exactly when the projection is
//! stored as fp8 (unquantised linears, as `modules_to_not_convert` leaves them, need none).

use super::dtype::DType;
use super::loader::scale_inv_name;
use super::safetensors_store::WeightStore;
use crate::config::{ModelConfig, TopkMethod};
use crate::error::{Error, Result};

/// One expected tensor: name, shape, and whether block-fp8 checkpoints quantise it (norms, the
/// router gate and its bias, embeddings and `lm_head` are never quantised).
struct Spec {
    name: String,
    shape: Vec<usize>,
    quantised: bool,
}

/// One decoder layer's tensors (shapes follow `nn.Linear.weight` = [out_features, in_features]).
fn layer_tensors(cfg: &ModelConfig, layer: usize) -> Vec<Spec> {
    let p = format!("model.layers.{layer}.");
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let mut v: Vec<Spec> = Vec::new();
    let mut add = |s: &str, shape: &[usize], quantised: bool| {
        v.push(Spec {
            name: format!("{p}{s}"),
            shape: shape.to_vec(),
            quantised,
        })
    };
    add("input_layernorm.weight", &[h], false);
    add("post_attention_layernorm.weight", &[h], false);
    let q_out = heads * cfg.qk_head_dim();
    match cfg.q_lora_rank {
        Some(r) => {
            add("self_attn.q_a_proj.weight", &[r, h], true);
            add("self_attn.q_a_layernorm.weight", &[r], false);
            add("self_attn.q_b_proj.weight", &[q_out, r], true);
        }
        None => add("self_attn.q_proj.weight", &[q_out, h], true),
    }
    add(
        "self_attn.kv_a_proj_with_mqa.weight",
        &[cfg.kv_cache_dim(), h],
        true,
    );
    add(
        "self_attn.kv_a_layernorm.weight",
        &[cfg.kv_lora_rank],
        false,
    );
    add(
        "self_attn.kv_b_proj.weight",
        &[
            heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
            cfg.kv_lora_rank,
        ],
        true,
    );
    add(
        "self_attn.o_proj.weight",
        &[h, heads * cfg.v_head_dim],
        true,
    );
    if let (Some(ix), Some(r)) = (cfg.indexer, cfg.q_lora_rank) {
        // V3.2's lightning indexer (transformers' `DeepseekV32Indexer`, DeepSeek's `Indexer`):
        // the projections are fp8 in the official checkpoint, the norm and weights_proj are not.
        let d = ix.head_dim;
        add("self_attn.indexer.wq_b.weight", &[ix.n_heads * d, r], true);
        add("self_attn.indexer.wk.weight", &[d, h], true);
        add("self_attn.indexer.k_norm.weight", &[d], false);
        add("self_attn.indexer.k_norm.bias", &[d], false);
        add(
            "self_attn.indexer.weights_proj.weight",
            &[ix.n_heads, h],
            false,
        );
    }
    match (&cfg.moe, cfg.is_moe_layer(layer)) {
        (Some(m), true) => {
            add("mlp.gate.weight", &[m.n_routed_experts, h], false);
            if m.topk_method == TopkMethod::NoauxTc {
                add(
                    "mlp.gate.e_score_correction_bias",
                    &[m.n_routed_experts],
                    false,
                );
            }
            let i = m.moe_intermediate_size;
            for e in 0..m.n_routed_experts {
                add(&format!("mlp.experts.{e}.gate_proj.weight"), &[i, h], true);
                add(&format!("mlp.experts.{e}.up_proj.weight"), &[i, h], true);
                add(&format!("mlp.experts.{e}.down_proj.weight"), &[h, i], true);
            }
            if m.n_shared_experts > 0 {
                let i = i * m.n_shared_experts; // shared experts are one MLP of n_shared x width
                add("mlp.shared_experts.gate_proj.weight", &[i, h], true);
                add("mlp.shared_experts.up_proj.weight", &[i, h], true);
                add("mlp.shared_experts.down_proj.weight", &[h, i], true);
            }
        }
        _ => {
            let i = cfg.intermediate_size;
            add("mlp.gate_proj.weight", &[i, h], true);
            add("mlp.up_proj.weight", &[i, h], true);
            add("mlp.down_proj.weight", &[h, i], true);
        }
    }
    v
}

/// Every tensor the model expects for this config, with its shape: embeddings, final norm,
/// `lm_head` unless tied, decoder layers `0..num_hidden_layers` (MoE or dense per
/// `is_moe_layer`, `q_proj` or the q-LoRA pair), and `<name>_scale_inv`
/// ([ceil(rows / block_rows), ceil(cols / block_cols)]) before each quantised projection when the
/// config is fp8. MTP layers are not included (they are optional for serving).
pub fn expected_tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    if cfg.v4.is_some() {
        // V4 has two namings; `model::v4`'s loader checks every tensor by name and shape.
        return Vec::new();
    }
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![v, h]));
    }
    for layer in 0..cfg.num_hidden_layers {
        for spec in layer_tensors(cfg, layer) {
            if let (true, Some(q)) = (spec.quantised, cfg.quantization) {
                let s = vec![
                    spec.shape[0].div_ceil(q.block_rows),
                    spec.shape[1].div_ceil(q.block_cols),
                ];
                out.push((scale_inv_name(&spec.name), s));
            }
            out.push((spec.name, spec.shape));
        }
    }
    out
}

/// The names of [`expected_tensor_shapes`], in the same order.
pub fn expected_tensor_names(cfg: &ModelConfig) -> Vec<String> {
    expected_tensor_shapes(cfg)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// Buffers some exporters write that carry no weights.
fn ignorable(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

/// The decoder-layer index of `model.layers.{L}.…`, if the name has that form.
fn layer_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// Check a store against the config: `Err(Error::Tensor)` for the first expected tensor that is
/// missing or has another shape (in `expected_tensor_shapes` order), else for the first (sorted) unexpected tensor that is
/// neither an MTP-layer tensor nor ignorable. On success returns the MTP tensor names, sorted.
pub fn check_tensor_set(cfg: &ModelConfig, store: &WeightStore) -> Result<Vec<String>> {
    if cfg.v4.is_some() {
        // The V4 loader checks every tensor (either naming) and refuses unexpected ones.
        crate::model::Model::load(cfg.clone(), store)?;
        let mut mtp: Vec<String> = store
            .names()
            .filter(|n| n.starts_with("mtp."))
            .map(str::to_string)
            .collect();
        mtp.sort();
        return Ok(mtp);
    }
    // The layer count sizes the list below: check the last layer is there before building it,
    // so an absurd `num_hidden_layers` costs one lookup, not an allocation it names.
    let last = format!(
        "model.layers.{}.input_layernorm.weight",
        cfg.num_hidden_layers - 1
    );
    if store.get(&last).is_none() {
        return Err(Error::tensor(
            last,
            format!(
                "missing (num_hidden_layers = {} but the checkpoint has no such layer)",
                cfg.num_hidden_layers
            ),
        ));
    }
    let mut expected = expected_tensor_shapes(cfg);
    // fp8 checkpoints may keep some linears unquantised (`modules_to_not_convert`, or simply
    // stored in bf16 / f16 / f32 without a scale): a block scale is expected exactly for the
    // weights stored as fp8.
    if cfg.quantization.is_some() {
        expected.retain(|(n, _)| match n.strip_suffix("_scale_inv") {
            Some(w) => store.get(w).is_none_or(|t| t.dtype == DType::F8E4M3),
            None => true,
        });
    }
    for (n, shape) in &expected {
        match store.get(n) {
            None => return Err(Error::tensor(n.as_str(), "missing")),
            Some(t) if t.shape != &shape[..] => {
                return Err(Error::tensor(
                    n.as_str(),
                    format!("expected shape {shape:?}, found {:?}", t.shape),
                ))
            }
            Some(_) => {}
        }
    }
    let expected: std::collections::HashSet<&str> =
        expected.iter().map(|(s, _)| s.as_str()).collect();
    let mtp = cfg.num_hidden_layers..cfg.num_hidden_layers + cfg.num_nextn_predict_layers;
    let mut mtp_names = Vec::new();
    for n in store.names() {
        if expected.contains(n) || ignorable(n) {
            continue;
        }
        match layer_index(n) {
            Some(l) if mtp.contains(&l) => mtp_names.push(n.to_string()),
            _ => {
                return Err(Error::tensor(
                    n,
                    "unexpected tensor: not part of the model this config.json describes",
                ))
            }
        }
    }
    Ok(mtp_names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> ModelConfig {
        let s = format!(
            r#"{{"model_type":"deepseek_v3","vocab_size":32,"hidden_size":16,"intermediate_size":24,
            "num_hidden_layers":3,"num_attention_heads":2,"q_lora_rank":8,"kv_lora_rank":8,
            "qk_nope_head_dim":4,"qk_rope_head_dim":2,"v_head_dim":4,"max_position_embeddings":64,
            "n_routed_experts":4,"n_shared_experts":1,"num_experts_per_tok":2,"n_group":2,"topk_group":1,
            "moe_intermediate_size":8,"first_k_dense_replace":1{extra}}}"#
        );
        ModelConfig::from_json_str(&s).unwrap()
    }

    #[test]
    fn names_follow_moe_rule_and_quant() {
        let c = cfg("");
        let n = expected_tensor_names(&c);
        assert!(n.contains(&"model.layers.0.mlp.gate_proj.weight".to_string()));
        assert!(!n
            .iter()
            .any(|x| x.starts_with("model.layers.0.mlp.experts")));
        assert!(n.contains(&"model.layers.1.mlp.experts.3.down_proj.weight".to_string()));
        assert!(n.contains(&"model.layers.2.mlp.gate.e_score_correction_bias".to_string()));
        assert!(n.contains(&"lm_head.weight".to_string()));
        assert!(!n.iter().any(|x| x.ends_with("_scale_inv")));
        // embed + norm + lm_head; per layer 2 norms + 3 q + 4 kv/o = 9, then dense MLP 3 or
        // MoE gate + bias + 4 experts x 3 + 3 shared = 17
        assert_eq!(n.len(), 3 + (9 + 3) + 2 * (9 + 17));

        let q = cfg(
            r#","quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[4,4]},"tie_word_embeddings":true"#,
        );
        let n = expected_tensor_names(&q);
        assert!(!n.contains(&"lm_head.weight".to_string()));
        assert!(n.contains(&"model.layers.1.self_attn.kv_b_proj.weight_scale_inv".to_string()));
        assert!(n.contains(&"model.layers.1.mlp.experts.0.up_proj.weight_scale_inv".to_string()));
        assert!(!n.contains(&"model.layers.1.mlp.gate.weight_scale_inv".to_string()));
        assert!(!n.contains(&"model.layers.1.input_layernorm.weight_scale_inv".to_string()));
    }

    #[test]
    fn layer_index_parses() {
        assert_eq!(layer_index("model.layers.12.mlp.gate.weight"), Some(12));
        assert_eq!(layer_index("model.layers.x.y"), None);
        assert_eq!(layer_index("model.norm.weight"), None);
    }
}

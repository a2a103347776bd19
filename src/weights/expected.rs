//! The tensor set a configuration implies, and the check of a checkpoint against it.
//!
//! Data flow: `ModelConfig` -> [`expected_tensor_names`]; (`ModelConfig`, `WeightStore`) ->
//! [`check_tensor_set`] before any `model` is built. Guarantees: a store that passes has every
//! expected tensor and nothing unexplained — the only extra tensors allowed are multi-token-prediction
//! layers (`model.layers.{L}.*` with `num_hidden_layers <= L < num_hidden_layers +
//! num_nextn_predict_layers`), which are returned, and known-ignorable buffers (`*.rotary_emb.inv_freq`).
//! Shapes and dtypes are checked later, tensor by tensor, by the `Loader`.

use super::loader::scale_inv_name;
use super::safetensors_store::WeightStore;
use crate::config::{ModelConfig, TopkMethod};
use crate::error::{Error, Result};

/// Names of one decoder layer's tensors, with whether each is a projection that block-fp8
/// checkpoints quantise (norms, the router gate and its bias are never quantised).
fn layer_tensors(cfg: &ModelConfig, layer: usize) -> Vec<(String, bool)> {
    let p = format!("model.layers.{layer}.");
    let mut v: Vec<(String, bool)> = Vec::new();
    let mut add = |s: String, q: bool| v.push((format!("{p}{s}"), q));
    add("input_layernorm.weight".into(), false);
    add("post_attention_layernorm.weight".into(), false);
    if cfg.q_lora_rank.is_some() {
        add("self_attn.q_a_proj.weight".into(), true);
        add("self_attn.q_a_layernorm.weight".into(), false);
        add("self_attn.q_b_proj.weight".into(), true);
    } else {
        add("self_attn.q_proj.weight".into(), true);
    }
    add("self_attn.kv_a_proj_with_mqa.weight".into(), true);
    add("self_attn.kv_a_layernorm.weight".into(), false);
    add("self_attn.kv_b_proj.weight".into(), true);
    add("self_attn.o_proj.weight".into(), true);
    match (&cfg.moe, cfg.is_moe_layer(layer)) {
        (Some(m), true) => {
            add("mlp.gate.weight".into(), false);
            if m.topk_method == TopkMethod::NoauxTc {
                add("mlp.gate.e_score_correction_bias".into(), false);
            }
            for e in 0..m.n_routed_experts {
                for w in ["gate_proj", "up_proj", "down_proj"] {
                    add(format!("mlp.experts.{e}.{w}.weight"), true);
                }
            }
            if m.n_shared_experts > 0 {
                for w in ["gate_proj", "up_proj", "down_proj"] {
                    add(format!("mlp.shared_experts.{w}.weight"), true);
                }
            }
        }
        _ => {
            for w in ["gate_proj", "up_proj", "down_proj"] {
                add(format!("mlp.{w}.weight"), true);
            }
        }
    }
    v
}

/// Every tensor name the model expects for this config: embeddings, final norm, `lm_head` unless
/// tied, decoder layers `0..num_hidden_layers` (MoE or dense per `is_moe_layer`, `q_proj` or the
/// q-LoRA pair), and `<name>_scale_inv` for each quantised projection when the config is fp8.
/// MTP layers are not included (they are optional for serving).
pub fn expected_tensor_names(cfg: &ModelConfig) -> Vec<String> {
    let mut names = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".to_string()];
    if !cfg.tie_word_embeddings {
        names.push("lm_head.weight".into());
    }
    for layer in 0..cfg.num_hidden_layers {
        for (n, quantised) in layer_tensors(cfg, layer) {
            if quantised && cfg.quantization.is_some() {
                names.push(scale_inv_name(&n));
            }
            names.push(n);
        }
    }
    names
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

/// Check a store against the config: `Err(Error::Tensor)` for the first missing expected tensor
/// (in `expected_tensor_names` order), else for the first (sorted) unexpected tensor that is
/// neither an MTP-layer tensor nor ignorable. On success returns the MTP tensor names, sorted.
pub fn check_tensor_set(cfg: &ModelConfig, store: &WeightStore) -> Result<Vec<String>> {
    let expected = expected_tensor_names(cfg);
    for n in &expected {
        if store.get(n).is_none() {
            return Err(Error::tensor(n.as_str(), "missing"));
        }
    }
    let expected: std::collections::HashSet<&str> = expected.iter().map(|s| s.as_str()).collect();
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
        assert!(!n.iter().any(|x| x.starts_with("model.layers.0.mlp.experts")));
        assert!(n.contains(&"model.layers.1.mlp.experts.3.down_proj.weight".to_string()));
        assert!(n.contains(&"model.layers.2.mlp.gate.e_score_correction_bias".to_string()));
        assert!(n.contains(&"lm_head.weight".to_string()));
        assert!(!n.iter().any(|x| x.ends_with("_scale_inv")));
        // embed + norm + lm_head; per layer 2 norms + 3 q + 4 kv/o = 9, then dense MLP 3 or
        // MoE gate + bias + 4 experts x 3 + 3 shared = 17
        assert_eq!(n.len(), 3 + (9 + 3) + 2 * (9 + 17));

        let q = cfg(r#","quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[4,4]},"tie_word_embeddings":true"#);
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

//! The resolved model configuration: HF `config.json` of a DeepSeek-V2 / V3 / V3.2 checkpoint parsed into
//! one plain struct with every default applied.
//!
//! Data flow: `config.json` -> [`ModelConfig::from_file`] -> `weights` (which tensors to expect),
//! `model` (layer shapes, MoE/dense rule, attention scale), `kv` (latent cache width), and the
//! `specmla info` summary.
//! Guarantees: a returned config is internally consistent (all dimensions > 0, MoE routing valid,
//! RoPE scaling understood); anything the engine cannot run exactly — another architecture, another
//! activation, biases, indexer fields under a non-V3.2 model_type, non-fp8 quantisation — is refused with
//! `Error::Config { field, .. }` naming the JSON key, never silently ignored.

use std::path::Path;

use serde_json::{json, Value};

use super::indexer::{self, IndexerConfig};
use super::json::{as_usize, Obj};
use super::moe::{parse_moe, MoeConfig};
use super::rope_scaling::{parse_rope, yarn_get_mscale, YarnScaling};
use super::v4::V4Config;
use crate::error::{Error, Result};

/// Which HF architecture the checkpoint declares (`model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    DeepseekV2,
    DeepseekV3,
    /// V3 plus DeepSeek Sparse Attention (the lightning indexer, [`IndexerConfig`]).
    DeepseekV32,
    /// Not MLA: shared K=V head, sliding window + compressed branches, hyper-connections
    /// ([`V4Config`]).
    DeepseekV4,
}

impl ModelType {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelType::DeepseekV2 => "deepseek_v2",
            ModelType::DeepseekV3 => "deepseek_v3",
            ModelType::DeepseekV32 => "deepseek_v32",
            ModelType::DeepseekV4 => "deepseek_v4",
        }
    }

    /// V3 and V3.2: the V3 router semantics (sigmoid scores, `norm_topk_prob` also for k = 1)
    /// and V3 defaults.
    pub fn is_v3_family(self) -> bool {
        matches!(self, ModelType::DeepseekV3 | ModelType::DeepseekV32)
    }
}

/// Block-wise fp8 (e4m3fn) weight quantisation: `W[i, j] = fp8[i, j] * scale_inv[i / block_rows,
/// j / block_cols]` (`quantization_config.weight_block_size = [block_rows, block_cols]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Quant {
    pub block_rows: usize,
    pub block_cols: usize,
}

/// A DeepSeek-V2/V3 model configuration with all defaults resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub model_type: ModelType,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Hidden size of the dense MLP layers.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None` => plain `q_proj` (V2-Lite); `Some(r)` => `q_a_proj` [r, hidden] + `q_b_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<YarnScaling>,
    pub max_position_embeddings: usize,
    /// `None` => every layer is a dense MLP.
    pub moe: Option<MoeConfig>,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation (`eos_token_id` may be an int or a list); may be empty.
    pub eos_token_ids: Vec<u32>,
    /// Number of multi-token-prediction layers stored after the decoder layers (V3: 1).
    pub num_nextn_predict_layers: usize,
    pub quantization: Option<Fp8Quant>,
    /// V3.2's lightning indexer (sparse attention in every layer); `None` for V2 / V3.
    pub indexer: Option<IndexerConfig>,
    /// DeepSeek-V4's own fields; `None` for the MLA models. For V4 the MLA fields describe
    /// its shared K=V head: `kv_lora_rank = v_head_dim = head_dim`, `qk_rope_head_dim` its
    /// rotary part, `qk_nope_head_dim` the rest; `moe` is `None` (V4's MoE lives here).
    pub v4: Option<V4Config>,
}

/// Keys of the V3.2 indexer: refused under `deepseek_v2` / `deepseek_v3` (running such a
/// checkpoint as dense MLA would silently change its outputs).
const INDEXER_KEYS: &[&str] = &["index_n_heads", "index_head_dim", "index_topk"];

impl ModelConfig {
    /// Read and parse `config.json`. I/O failures -> `Error::Io`; content -> `Error::Config`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_json_str(&text)
    }

    /// Parse the text of a `config.json`.
    pub fn from_json_str(s: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(s)
            .map_err(|e| Error::config("(document)", format!("invalid JSON: {e}")))?;
        let Value::Object(map) = &value else {
            return Err(Error::config(
                "(document)",
                "config.json must be a JSON object",
            ));
        };
        let o = Obj::new(map, "");
        let model_type = match o.opt_str("model_type")? {
            Some("deepseek_v2") => ModelType::DeepseekV2,
            Some("deepseek_v3") => ModelType::DeepseekV3,
            Some("deepseek_v32") => ModelType::DeepseekV32,
            Some("deepseek_v4") => return Self::from_v4(&o),
            Some(other) => {
                return Err(o.err(
                    "model_type",
                    format!(
                        "{other:?} is not supported (deepseek_v2, deepseek_v3, deepseek_v32 or \
                         deepseek_v4)"
                    ),
                ))
            }
            None => return Err(o.err("model_type", "required field is missing")),
        };
        let v32 = model_type == ModelType::DeepseekV32;
        if !v32 {
            if let Some(key) = INDEXER_KEYS.iter().find(|k| o.has(k)) {
                return Err(o.err(
                    key,
                    format!(
                        "a sparse-attention indexer field: model_type must be deepseek_v32, not {}",
                        model_type.as_str()
                    ),
                ));
            }
        }
        check_act_and_biases(&o)?;
        let max_position_embeddings = o.req_dim("max_position_embeddings")?;
        let (rope_theta, rope_scaling) = parse_rope(&o, max_position_embeddings)?;
        let qk_rope_head_dim = o.req_dim("qk_rope_head_dim")?;
        if qk_rope_head_dim % 2 != 0 {
            return Err(o.err(
                "qk_rope_head_dim",
                format!("must be even (rotary pairs), found {qk_rope_head_dim}"),
            ));
        }
        if !o.has_key("q_lora_rank") {
            return Err(o.err(
                "q_lora_rank",
                "required field is missing (null for a plain q_proj)",
            ));
        }
        let q_lora_rank = match o.opt_usize("q_lora_rank")? {
            Some(0) => return Err(o.err("q_lora_rank", "must be > 0 or null")),
            None if v32 => {
                return Err(o.err(
                    "q_lora_rank",
                    "deepseek_v32 needs the q-LoRA path (the indexer reads the q latent)",
                ))
            }
            r => r,
        };
        let rms_norm_eps = rms_eps(&o)?;
        let num_hidden_layers = o.req_dim("num_hidden_layers")?;
        // transformers 5 also reads `num_mtp_layers` (an alias of the same attribute).
        let num_nextn_predict_layers = match (
            o.opt_usize("num_nextn_predict_layers")?,
            o.opt_usize("num_mtp_layers")?,
        ) {
            (Some(a), Some(b)) if a != b => {
                return Err(o.err(
                    "num_mtp_layers",
                    format!("{b} disagrees with num_nextn_predict_layers = {a}"),
                ))
            }
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => 0,
        };
        let all_layers = num_hidden_layers.saturating_add(num_nextn_predict_layers);
        let (indexer, leading_dense) = if v32 {
            indexer::check_layer_types(&o, num_hidden_layers)?;
            (
                Some(indexer::parse_indexer(&o, qk_rope_head_dim)?),
                indexer::leading_dense_layers(&o, num_hidden_layers)?,
            )
        } else {
            (None, None)
        };
        let cfg = ModelConfig {
            model_type,
            vocab_size: o.req_dim("vocab_size")?,
            hidden_size: o.req_dim("hidden_size")?,
            intermediate_size: o.req_dim("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads: o.req_dim("num_attention_heads")?,
            q_lora_rank,
            kv_lora_rank: o.req_dim("kv_lora_rank")?,
            qk_nope_head_dim: o.req_dim("qk_nope_head_dim")?,
            qk_rope_head_dim,
            v_head_dim: o.req_dim("v_head_dim")?,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            moe: parse_moe(&o, model_type, all_layers, leading_dense)?,
            rms_norm_eps: rms_norm_eps as f32,
            tie_word_embeddings: o.bool_or("tie_word_embeddings", false)?,
            bos_token_id: token_id(&o, "bos_token_id")?,
            eos_token_ids: eos_ids(&o)?,
            num_nextn_predict_layers,
            quantization: parse_quant(&o)?,
            indexer,
            v4: None,
        };
        check_bounds(&o, &cfg)?;
        Ok(cfg)
    }

    /// A `deepseek_v4` config (see `config::v4`).
    fn from_v4(o: &Obj<'_>) -> Result<Self> {
        check_act_and_biases(o)?;
        let rms_norm_eps = rms_eps(o)?;
        let num_hidden_layers = o.req_dim("num_hidden_layers")?;
        if num_hidden_layers > MAX_LAYERS {
            return Err(o.err("num_hidden_layers", format!("exceeds {MAX_LAYERS}")));
        }
        let heads = o.req_dim("num_attention_heads")?;
        let max_position_embeddings = o.usize_or("max_position_embeddings", 1 << 20)?;
        let num_nextn_predict_layers = o.usize_or("num_nextn_predict_layers", 1)?;
        if num_nextn_predict_layers > 64 {
            return Err(o.err("num_nextn_predict_layers", "exceeds 64"));
        }
        let v = super::v4::parse_v4(
            o,
            num_hidden_layers,
            num_nextn_predict_layers,
            heads,
            max_position_embeddings,
        )?;
        let cfg = ModelConfig {
            model_type: ModelType::DeepseekV4,
            vocab_size: o.req_dim("vocab_size")?,
            hidden_size: o.req_dim("hidden_size")?,
            intermediate_size: v.moe_intermediate_size,
            num_hidden_layers,
            num_attention_heads: heads,
            q_lora_rank: Some(v.q_lora_rank),
            kv_lora_rank: v.head_dim,
            qk_nope_head_dim: v.head_dim - v.rope_dim,
            qk_rope_head_dim: v.rope_dim,
            v_head_dim: v.head_dim,
            rope_theta: v.main_theta,
            rope_scaling: None,
            max_position_embeddings,
            moe: None,
            rms_norm_eps: rms_norm_eps as f32,
            tie_word_embeddings: o.bool_or("tie_word_embeddings", false)?,
            bos_token_id: token_id(o, "bos_token_id")?,
            eos_token_ids: eos_ids(o)?,
            num_nextn_predict_layers,
            quantization: parse_quant(o)?,
            indexer: None,
            v4: Some(v),
        };
        check_bounds(o, &cfg)?;
        Ok(cfg)
    }

    /// A V4 model's configuration as its MTP layer `m` runs it: one decoder layer
    /// ([`V4Config::mtp_view`](super::V4Config::mtp_view)), no MTP layers of its own. Other
    /// models: unchanged.
    pub fn mtp_view(&self, m: usize) -> ModelConfig {
        let mut c = self.clone();
        if let Some(v) = &self.v4 {
            c.v4 = Some(v.mtp_view(m));
            c.num_hidden_layers = 1;
            c.num_nextn_predict_layers = 0;
        }
        c
    }

    /// Whether decoder layer `layer` uses the MoE block (else the dense MLP).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match &self.moe {
            Some(m) => layer >= m.first_k_dense_replace && layer.is_multiple_of(m.moe_layer_freq),
            None => false,
        }
    }

    /// Per-head query/key width: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Attention softmax scale: `qk_head_dim^-0.5 * m^2`, with `m = 0.1 * mscale_all_dim *
    /// ln(factor) + 1` under YaRN with `factor > 1` and `mscale_all_dim != 0`, else `m = 1`.
    pub fn softmax_scale(&self) -> f32 {
        let mut scale = (self.qk_head_dim() as f64).powf(-0.5);
        if let Some(y) = &self.rope_scaling {
            if y.mscale_all_dim != 0.0 {
                let m = yarn_get_mscale(y.factor, y.mscale_all_dim);
                scale *= m * m;
            }
        }
        scale as f32
    }

    /// Width of one token's latent cache entry per layer: `[c_kv (kv_lora_rank) | k_pe (rope)]`.
    pub fn kv_cache_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Number of decoder layers that use the MoE block.
    pub fn num_moe_layers(&self) -> usize {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_moe_layer(l))
            .count()
    }

    /// A JSON summary of the resolved configuration (for `specmla info`).
    pub fn to_summary_json(&self) -> Value {
        let rope_scaling = self.rope_scaling.as_ref().map(|y| {
            json!({
                "type": "yarn",
                "factor": y.factor,
                "mscale": y.mscale,
                "mscale_all_dim": y.mscale_all_dim,
                "original_max_position_embeddings": y.original_max_position_embeddings,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow,
                "attention_factor": y.cos_sin_mscale(),
                "truncate": y.truncate,
            })
        });
        let moe = self.moe.as_ref().map(|m| {
            json!({
                "n_routed_experts": m.n_routed_experts,
                "n_shared_experts": m.n_shared_experts,
                "num_experts_per_tok": m.num_experts_per_tok,
                "n_group": m.n_group,
                "topk_group": m.topk_group,
                "topk_method": m.topk_method.as_str(),
                "scoring_func": m.scoring_func.as_str(),
                "norm_topk_prob": m.norm_topk_prob,
                "routed_scaling_factor": m.routed_scaling_factor,
                "moe_intermediate_size": m.moe_intermediate_size,
                "first_k_dense_replace": m.first_k_dense_replace,
                "moe_layer_freq": m.moe_layer_freq,
            })
        });
        let quantization = self.quantization.map(|q| {
            json!({ "method": "fp8", "fmt": "e4m3", "weight_block_size": [q.block_rows, q.block_cols] })
        });
        let v4 = self.v4.as_ref().map(|v| {
            json!({
                "head_dim": v.head_dim,
                "rope_dim": v.rope_dim,
                "layer_types": v.layer_types.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                "hash_layers": v.hash_layers,
                "compress_rates": {"compressed_sparse_attention": v.csa_rate, "heavily_compressed_attention": v.hca_rate},
                "sliding_window": v.sliding_window,
                "index_n_heads": v.index_n_heads,
                "index_head_dim": v.index_head_dim,
                "index_topk": v.index_topk,
                "hc_mult": v.hc_mult,
                "hc_sinkhorn_iters": v.hc_sinkhorn_iters,
                "o_groups": v.o_groups,
                "o_lora_rank": v.o_lora_rank,
                "n_routed_experts": v.n_routed_experts,
                "num_experts_per_tok": v.num_experts_per_tok,
                "moe_intermediate_size": v.moe_intermediate_size,
                "scoring_func": match v.scoring { crate::config::V4Scoring::SqrtSoftplus => "sqrtsoftplus", crate::config::V4Scoring::Sigmoid => "sigmoid" },
                "swiglu_limit": v.swiglu_limit,
                "routed_scaling_factor": v.routed_scaling_factor,
                "rope_theta_main": v.main_theta,
                "rope_theta_compress": v.compress_theta,
                "compress_yarn": v.compress_yarn.as_ref().map(|y| y.factor),
            })
        });
        json!({
            "v4": v4,
            "model_type": self.model_type.as_str(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_moe_layers": self.num_moe_layers(),
            "num_attention_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_head_dim": self.qk_head_dim(),
            "v_head_dim": self.v_head_dim,
            "kv_cache_dim": self.kv_cache_dim(),
            "softmax_scale": self.softmax_scale(),
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "moe": moe,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_ids": self.eos_token_ids,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "quantization": quantization,
            "indexer": self.indexer.map(|i| json!({
                "index_n_heads": i.n_heads,
                "index_head_dim": i.head_dim,
                "index_topk": i.topk,
            })),
        })
    }
}

/// Only SiLU, no biases (every DeepSeek release).
fn check_act_and_biases(o: &Obj<'_>) -> Result<()> {
    if let Some(act) = o.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(o.err(
                "hidden_act",
                format!("{act:?} is not supported (only silu)"),
            ));
        }
    }
    for key in ["attention_bias", "mlp_bias"] {
        if o.bool_or(key, false)? {
            return Err(o.err(key, "biases are not supported"));
        }
    }
    Ok(())
}

/// `rms_norm_eps` (default 1e-6), in (0, 1].
fn rms_eps(o: &Obj<'_>) -> Result<f64> {
    let eps = o.f64_or("rms_norm_eps", 1e-6)?;
    if eps <= 0.0 || eps > 1.0 {
        return Err(o.err("rms_norm_eps", format!("must be in (0, 1], found {eps}")));
    }
    Ok(eps)
}

fn value_to_id(v: &Value) -> Option<u32> {
    as_usize(v).and_then(|u| u32::try_from(u).ok())
}

fn token_id(o: &Obj<'_>, key: &str) -> Result<Option<u32>> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => value_to_id(v)
            .map(Some)
            .ok_or_else(|| o.err(key, format!("expected a token id, found {v}"))),
    }
}

fn eos_ids(o: &Obj<'_>) -> Result<Vec<u32>> {
    match o.get("eos_token_id") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                value_to_id(v)
                    .ok_or_else(|| o.err("eos_token_id", format!("expected a token id, found {v}")))
            })
            .collect(),
        Some(_) => Ok(vec![token_id(o, "eos_token_id")?.expect("present")]),
    }
}

/// Upper bounds on the sizes a config may declare. Far above any DeepSeek release (V3: hidden
/// 7168, 61 layers, 256 experts, vocab 129280, 163840 positions), they keep every product the
/// engine forms from them inside `usize` and turn a corrupted field into a named error before
/// anything is sized by it.
const MAX_DIM: usize = 1 << 20;
const MAX_VOCAB: usize = 1 << 24;
const MAX_LAYERS: usize = 1 << 12;
const MAX_EXPERTS: usize = 1 << 14;
const MAX_POSITIONS: usize = 1 << 26;

fn check_bounds(o: &Obj<'_>, cfg: &ModelConfig) -> Result<()> {
    let mut dims = vec![
        ("hidden_size", cfg.hidden_size, MAX_DIM),
        ("intermediate_size", cfg.intermediate_size, MAX_DIM),
        ("num_attention_heads", cfg.num_attention_heads, 1 << 12),
        ("kv_lora_rank", cfg.kv_lora_rank, MAX_DIM),
        ("qk_nope_head_dim", cfg.qk_nope_head_dim, 1 << 14),
        ("qk_rope_head_dim", cfg.qk_rope_head_dim, 1 << 14),
        ("v_head_dim", cfg.v_head_dim, 1 << 14),
        ("vocab_size", cfg.vocab_size, MAX_VOCAB),
        ("num_hidden_layers", cfg.num_hidden_layers, MAX_LAYERS),
        ("num_nextn_predict_layers", cfg.num_nextn_predict_layers, 64),
        (
            "max_position_embeddings",
            cfg.max_position_embeddings,
            MAX_POSITIONS,
        ),
    ];
    if let Some(r) = cfg.q_lora_rank {
        dims.push(("q_lora_rank", r, MAX_DIM));
    }
    if let Some(m) = &cfg.moe {
        dims.push(("n_routed_experts", m.n_routed_experts, MAX_EXPERTS));
        dims.push(("n_shared_experts", m.n_shared_experts, 1 << 8));
        dims.push(("moe_intermediate_size", m.moe_intermediate_size, MAX_DIM));
    }
    if let Some(y) = &cfg.rope_scaling {
        dims.push((
            "original_max_position_embeddings",
            y.original_max_position_embeddings,
            MAX_POSITIONS,
        ));
    }
    for (key, v, max) in dims {
        if v > max {
            return Err(o.err(key, format!("{v} exceeds the supported maximum {max}")));
        }
    }
    // The largest matrices are products of two bounded dims; keep each under 2^40 elements.
    let heads = cfg.num_attention_heads;
    let products = [
        ("vocab_size", cfg.vocab_size * cfg.hidden_size),
        (
            "num_attention_heads",
            heads * cfg.qk_head_dim() * cfg.hidden_size.max(cfg.q_lora_rank.unwrap_or(0)),
        ),
        ("intermediate_size", cfg.intermediate_size * cfg.hidden_size),
    ];
    for (key, n) in products {
        if n > 1 << 40 {
            return Err(o.err(key, format!("implies a matrix of {n} elements (over 2^40)")));
        }
    }
    // The tensor-set check lists every expected tensor: keep that list bounded too.
    let per_layer = 16 + cfg.moe.as_ref().map_or(0, |m| 3 * m.n_routed_experts + 3);
    let layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers;
    if layers * per_layer > 1 << 20 {
        let key = if cfg.moe.is_some() {
            "n_routed_experts"
        } else {
            "num_hidden_layers"
        };
        return Err(o.err(
            key,
            format!(
                "{layers} layers of {per_layer} tensors exceed the supported 2^20 tensors \
                 (DeepSeek-V3: ~48K)"
            ),
        ));
    }
    // The attention scales derived from the RoPE fields must be usable f32 numbers.
    let scale = cfg.softmax_scale();
    let cos_sin = cfg
        .rope_scaling
        .as_ref()
        .map_or(1.0, |y| y.cos_sin_mscale());
    if !(scale.is_finite() && scale > 0.0 && cos_sin.is_finite() && cos_sin != 0.0) {
        let key = if cfg.rope_scaling.is_some() {
            "rope_scaling"
        } else {
            "qk_rope_head_dim"
        };
        return Err(o.err(
            key,
            format!("gives a softmax scale {scale} and a cos/sin factor {cos_sin}: not usable"),
        ));
    }
    if let Some(m) = &cfg.moe {
        if !(m.routed_scaling_factor.is_finite() && m.routed_scaling_factor <= 1e6) {
            return Err(o.err(
                "routed_scaling_factor",
                format!("{} is out of range (<= 1e6)", m.routed_scaling_factor),
            ));
        }
    }

    Ok(())
}

fn parse_quant(o: &Obj<'_>) -> Result<Option<Fp8Quant>> {
    let Some(q) = o.opt_obj("quantization_config")? else {
        return Ok(None);
    };
    match q.opt_str("quant_method")? {
        Some("fp8") => {}
        Some(other) => {
            return Err(q.err(
                "quant_method",
                format!("{other:?} is not supported (only fp8)"),
            ))
        }
        None => return Err(q.err("quant_method", "required field is missing")),
    }
    if let Some(fmt) = q.opt_str("fmt")? {
        if fmt != "e4m3" {
            return Err(q.err("fmt", format!("{fmt:?} is not supported (only e4m3)")));
        }
    }
    if let Some(a) = q.opt_str("activation_scheme")? {
        if a != "dynamic" {
            return Err(q.err(
                "activation_scheme",
                format!("{a:?} is not supported (only dynamic)"),
            ));
        }
    }
    match q.get("modules_to_not_convert") {
        None => {}
        Some(Value::Array(v)) if v.iter().all(Value::is_string) => {}
        Some(v) => {
            return Err(q.err(
                "modules_to_not_convert",
                format!("expected a list of module names, found {v}"),
            ))
        }
    }
    let block = match q.get("weight_block_size") {
        Some(Value::Array(v)) if v.len() == 2 => (as_usize(&v[0]), as_usize(&v[1])),
        Some(v) => {
            return Err(q.err(
                "weight_block_size",
                format!("expected [rows, cols], found {v}"),
            ))
        }
        None => {
            return Err(q.err(
                "weight_block_size",
                "required field is missing (per-tensor fp8 is not supported)",
            ))
        }
    };
    match block {
        (Some(r), Some(c)) if r > 0 && c > 0 => Ok(Some(Fp8Quant {
            block_rows: r,
            block_cols: c,
        })),
        _ => Err(q.err("weight_block_size", "block sizes must be positive integers")),
    }
}

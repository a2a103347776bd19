//! DeepSeek-V4 (`model_type: deepseek_v4`) fields -> [`V4Config`], read as transformers 5.24's
//! `DeepseekV4Config` reads them (its `__post_init__` included).
//!
//! Where it sits: `ModelConfig::from_json_str` hands a V4 config here; the result fills the
//! common `ModelConfig` fields (vocab, hidden, layers, heads, q-LoRA, norms, token ids) and the
//! V4-only ones below (`ModelConfig::v4`), which `model::v4` and `kv::KvConfig::for_model` read.
//!
//! Spellings accepted (both as transformers accepts them): `layer_types` or the legacy per-layer
//! `compress_ratios` (0 / 4 / 128 = sliding / CSA / HCA); `compress_rates` or the legacy
//! `compress_rate_csa` / `compress_rate_hca`; `mlp_layer_types` or `num_hash_layers` (default 3);
//! `partial_rotary_factor` or the legacy `qk_rope_head_dim`; `rope_parameters {main, compress}`
//! (as save_pretrained writes it) or a flat `rope_parameters` / `rope_scaling` whose YaRN part
//! applies to the compressed branches only (attention_factor 1.0 unless given).
//!
//! Refused with the field named: an unknown layer or MLP type, list lengths that disagree with
//! `num_hidden_layers`, zero or inconsistent rates (a rate that is neither a divisor nor a
//! multiple of 2^k block sizes is fine here; the KV cache checks it against its block size),
//! `num_key_value_heads != 1`, a rotary part that is odd or wider than `head_dim`,
//! `index_head_dim < qk_rope_head_dim`, `o_groups` not dividing the heads, scoring functions other
//! than `sqrtsoftplus` / `sigmoid` (transformers has no other), biases.

use super::json::Obj;
use super::rope_scaling::{check_theta, parse_yarn, YarnScaling};
use crate::error::Result;

/// Attention kind of one V4 layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Attn {
    /// Sliding window only (`sliding_attention`).
    Sliding,
    /// Compressed sparse attention: overlapping-window compression + indexer top-k.
    Csa,
    /// Heavily compressed attention: dense over non-overlapping compressed windows.
    Hca,
}

impl V4Attn {
    pub fn as_str(self) -> &'static str {
        match self {
            V4Attn::Sliding => "sliding_attention",
            V4Attn::Csa => "compressed_sparse_attention",
            V4Attn::Hca => "heavily_compressed_attention",
        }
    }
}

/// Router score function of V4's top-k MoE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Scoring {
    /// sqrt(softplus(x)) (the release default).
    SqrtSoftplus,
    Sigmoid,
}

/// The V4-only part of a model configuration, every default applied.
#[derive(Clone, Debug, PartialEq)]
pub struct V4Config {
    /// Width of the one shared K=V head (and of each query head).
    pub head_dim: usize,
    /// Rotary dims: the LAST `rope_dim` of each head (interleaved pairs).
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    pub layer_types: Vec<V4Attn>,
    /// Attention of each MTP layer (`num_nextn_predict_layers` entries).
    pub mtp_layer_types: Vec<V4Attn>,
    /// Per layer: `hash_moe` (true) or `moe`.
    pub hash_layers: Vec<bool>,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub swiglu_limit: f32,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub scoring: V4Scoring,
    pub routed_scaling_factor: f32,
    /// RoPE base of sliding layers (`main`).
    pub main_theta: f64,
    /// RoPE base of CSA / HCA layers and their compressors / indexer (`compress`).
    pub compress_theta: f64,
    /// YaRN of the `compress` rope (none on `main`).
    pub compress_yarn: Option<YarnScaling>,
}

impl V4Config {
    /// Compression rate of a layer kind (0 for sliding).
    pub fn rate(&self, kind: V4Attn) -> usize {
        match kind {
            V4Attn::Sliding => 0,
            V4Attn::Csa => self.csa_rate,
            V4Attn::Hca => self.hca_rate,
        }
    }

    /// Layers of `kind`, and each layer's index among them.
    pub fn layers_of(&self, kind: V4Attn) -> usize {
        self.layer_types.iter().filter(|&&k| k == kind).count()
    }

    /// The configuration MTP layer `m` runs under: one decoder layer of its attention kind with
    /// top-k routing (its own one-layer KV cache is laid out for this view).
    pub fn mtp_view(&self, m: usize) -> V4Config {
        let kind = self
            .mtp_layer_types
            .get(m)
            .copied()
            .unwrap_or(V4Attn::Sliding);
        V4Config {
            layer_types: vec![kind],
            mtp_layer_types: Vec::new(),
            hash_layers: vec![false],
            ..self.clone()
        }
    }

    /// Index of `layer` among the layers of its own kind.
    pub fn index_in_kind(&self, layer: usize) -> usize {
        let k = self.layer_types[layer];
        self.layer_types[..layer]
            .iter()
            .filter(|&&x| x == k)
            .count()
    }
}

const LAYER_TYPES: [V4Attn; 3] = [V4Attn::Sliding, V4Attn::Csa, V4Attn::Hca];

fn str_list<'a>(o: &Obj<'a>, key: &str) -> Result<Option<Vec<&'a str>>> {
    match o.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| o.err(key, format!("expected a list of strings, found {v}")))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(v) => Err(o.err(key, format!("expected a list, found {v}"))),
    }
}

/// A per-layer list has one entry per decoder layer, optionally followed by one per MTP layer
/// (the official config's `compress_ratios` lists 43 + 1 entries; transformers keeps the first
/// `num_hidden_layers`). Returns how many MTP entries it carries.
fn check_len(o: &Obj<'_>, key: &str, got: usize, layers: usize, nextn: usize) -> Result<usize> {
    if got != layers && got != layers + nextn {
        let with = if nextn > 0 {
            format!(" (or {} with the MTP layers)", layers + nextn)
        } else {
            String::new()
        };
        return Err(o.err(
            key,
            format!("has {got} entries but num_hidden_layers is {layers}{with}"),
        ));
    }
    Ok(got - layers)
}

/// Parse the V4 fields of `o`. `hidden` and `heads` are the common fields already read.
pub(crate) fn parse_v4(
    o: &Obj<'_>,
    layers: usize,
    nextn: usize,
    heads: usize,
    max_position_embeddings: usize,
) -> Result<V4Config> {
    if o.usize_or("num_key_value_heads", 1)? != 1 {
        return Err(o.err(
            "num_key_value_heads",
            "DeepSeek-V4 has one shared K=V head (must be 1)",
        ));
    }
    let head_dim = o.usize_or("head_dim", 512)?;
    if head_dim == 0 || head_dim > 1 << 14 {
        return Err(o.err(
            "head_dim",
            format!("must be in 1..=16384, found {head_dim}"),
        ));
    }
    // Rotary width: partial_rotary_factor * head_dim, or the legacy qk_rope_head_dim (which
    // save_pretrained also writes as a runtime attribute: both must then agree).
    let from_factor = match o.opt_f64("partial_rotary_factor")? {
        Some(f) if !(f > 0.0 && f <= 1.0) => {
            return Err(o.err(
                "partial_rotary_factor",
                format!("must be in (0, 1], found {f}"),
            ))
        }
        Some(f) => Some((head_dim as f64 * f) as usize),
        None => None,
    };
    let legacy = o.opt_usize("qk_rope_head_dim")?;
    let rope_dim = match (from_factor, legacy) {
        (Some(a), Some(b)) if a != b => {
            return Err(o.err(
                "qk_rope_head_dim",
                format!("{b} disagrees with partial_rotary_factor x head_dim = {a}"),
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => head_dim / 8,
    };
    if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
        return Err(o.err(
            "qk_rope_head_dim",
            format!("rotary dims must be even and in 2..=head_dim ({head_dim}), found {rope_dim}"),
        ));
    }
    let q_lora_rank = match o.opt_usize("q_lora_rank")? {
        Some(r) if r > 0 => r,
        _ => return Err(o.err("q_lora_rank", "DeepSeek-V4 needs q_lora_rank > 0")),
    };
    let o_groups = o.usize_or("o_groups", 8)?;
    if o_groups == 0 || !heads.is_multiple_of(o_groups) {
        return Err(o.err(
            "o_groups",
            format!("must divide num_attention_heads ({heads}), found {o_groups}"),
        ));
    }
    let o_lora_rank = o.usize_or("o_lora_rank", 1024)?;
    let sliding_window = o.usize_or("sliding_window", 128)?;
    for (k, v) in [
        ("o_lora_rank", o_lora_rank),
        ("sliding_window", sliding_window),
    ] {
        if v == 0 || v > 1 << 20 {
            return Err(o.err(k, format!("must be in 1..=2^20, found {v}")));
        }
    }

    // layer_types > legacy compress_ratios > the V4-Pro default (2 HCA, then CSA/HCA alternating).
    let mut layer_types: Vec<V4Attn> = if let Some(list) = str_list(o, "layer_types")? {
        check_len(o, "layer_types", list.len(), layers, nextn)?;
        list.iter()
            .map(|s| {
                LAYER_TYPES
                    .iter()
                    .copied()
                    .find(|k| k.as_str() == *s)
                    .ok_or_else(|| {
                        o.err(
                            "layer_types",
                            format!(
                                "unknown layer type {s:?} (sliding_attention, \
                             compressed_sparse_attention or heavily_compressed_attention)"
                            ),
                        )
                    })
            })
            .collect::<Result<_>>()?
    } else if let Some(v) = o.get("compress_ratios").filter(|v| !v.is_null()) {
        let a = v
            .as_array()
            .ok_or_else(|| o.err("compress_ratios", "expected a list of 0 / 4 / 128"))?;
        check_len(o, "compress_ratios", a.len(), layers, nextn)?;
        a.iter()
            .map(|r| match r.as_u64() {
                Some(0) => Ok(V4Attn::Sliding),
                Some(4) => Ok(V4Attn::Csa),
                Some(128) => Ok(V4Attn::Hca),
                _ => Err(o.err(
                    "compress_ratios",
                    format!("entries must be 0, 4 or 128 (layer kinds), found {r}"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        (0..layers)
            .map(|i| match i {
                0 | 1 => V4Attn::Hca,
                i if (i - 2) % 2 == 1 => V4Attn::Csa,
                _ => V4Attn::Hca,
            })
            .collect()
    };
    // The MTP layers' attention: the list's tail when it has one, else sliding (as the official
    // checkpoint's compress_ratios ends: layer 43, the MTP block, is 0).
    let mtp_layer_types: Vec<V4Attn> = if layer_types.len() > layers {
        layer_types.split_off(layers)
    } else {
        vec![V4Attn::Sliding; nextn]
    };
    let mut hash_layers: Vec<bool> = if let Some(list) = str_list(o, "mlp_layer_types")? {
        check_len(o, "mlp_layer_types", list.len(), layers, nextn)?;
        list.iter()
            .map(|s| match *s {
                "hash_moe" => Ok(true),
                "moe" => Ok(false),
                other => Err(o.err(
                    "mlp_layer_types",
                    format!("unknown MLP type {other:?} (hash_moe or moe)"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        let n = o.usize_or("num_hash_layers", 3)?;
        (0..layers).map(|i| i < n).collect()
    };
    // MTP blocks route by top-k: their input has no token ids to hash (vLLM runs them with
    // input_ids = None).
    if hash_layers
        .split_off(layers.min(hash_layers.len()))
        .contains(&true)
    {
        return Err(o.err(
            "mlp_layer_types",
            "an MTP layer's entry is hash_moe; MTP layers route by top-k (moe)",
        ));
    }

    // compress_rates (dict) with the legacy scalar overrides folded in, as __post_init__ does.
    let (mut csa_rate, mut hca_rate) = (4usize, 128usize);
    if let Some(r) = o.opt_obj("compress_rates")? {
        for (k, _) in r.values() {
            if !LAYER_TYPES[1..].iter().any(|t| t.as_str() == k) {
                return Err(r.err(k, "unknown compressed layer type"));
            }
        }
        csa_rate = r.usize_or("compressed_sparse_attention", csa_rate)?;
        hca_rate = r.usize_or("heavily_compressed_attention", hca_rate)?;
    }
    csa_rate = o.usize_or("compress_rate_csa", csa_rate)?;
    hca_rate = o.usize_or("compress_rate_hca", hca_rate)?;
    for (k, v, kind) in [
        (
            "compress_rates.compressed_sparse_attention",
            csa_rate,
            V4Attn::Csa,
        ),
        (
            "compress_rates.heavily_compressed_attention",
            hca_rate,
            V4Attn::Hca,
        ),
    ] {
        let used = layer_types.contains(&kind) || mtp_layer_types.contains(&kind);
        if used && (v == 0 || v > 1 << 16) {
            return Err(o.err(k, format!("must be in 1..=65536, found {v}")));
        }
    }

    let index_n_heads = o.usize_or("index_n_heads", 64)?;
    let index_head_dim = o.usize_or("index_head_dim", 128)?;
    let index_topk = o.usize_or("index_topk", 512)?;
    if layer_types.contains(&V4Attn::Csa) || mtp_layer_types.contains(&V4Attn::Csa) {
        for (k, v) in [
            ("index_n_heads", index_n_heads),
            ("index_head_dim", index_head_dim),
            ("index_topk", index_topk),
        ] {
            if v == 0 || v > 1 << 16 {
                return Err(o.err(k, format!("must be in 1..=65536, found {v}")));
            }
        }
        if index_head_dim < rope_dim {
            return Err(o.err(
                "index_head_dim",
                format!("{index_head_dim} is smaller than the rotary dims ({rope_dim})"),
            ));
        }
    }
    let hc_mult = o.usize_or("hc_mult", 4)?;
    let hc_sinkhorn_iters = o.usize_or("hc_sinkhorn_iters", 20)?;
    if hc_mult == 0 || hc_mult > 64 {
        return Err(o.err("hc_mult", format!("must be in 1..=64, found {hc_mult}")));
    }
    if hc_sinkhorn_iters == 0 || hc_sinkhorn_iters > 1000 {
        return Err(o.err(
            "hc_sinkhorn_iters",
            format!("must be in 1..=1000, found {hc_sinkhorn_iters}"),
        ));
    }
    let hc_eps = o.f64_or("hc_eps", 1e-6)?;
    let swiglu_limit = o.f64_or("swiglu_limit", 10.0)?;
    if !(0.0..1.0).contains(&hc_eps) {
        return Err(o.err("hc_eps", format!("must be in [0, 1), found {hc_eps}")));
    }
    if !(swiglu_limit > 0.0 && swiglu_limit.is_finite()) {
        return Err(o.err("swiglu_limit", format!("must be > 0, found {swiglu_limit}")));
    }
    let n_routed_experts = o.usize_or("n_routed_experts", 256)?;
    let num_experts_per_tok = o.usize_or("num_experts_per_tok", 6)?;
    if n_routed_experts == 0 || n_routed_experts > 1 << 14 {
        return Err(o.err(
            "n_routed_experts",
            format!("must be in 1..=16384, found {n_routed_experts}"),
        ));
    }
    if num_experts_per_tok == 0 || num_experts_per_tok > n_routed_experts {
        return Err(o.err(
            "num_experts_per_tok",
            format!(
                "must be in 1..=n_routed_experts ({n_routed_experts}), found {num_experts_per_tok}"
            ),
        ));
    }
    let moe_intermediate_size = o.usize_or("moe_intermediate_size", 2048)?;
    if moe_intermediate_size == 0 || moe_intermediate_size > 1 << 20 {
        return Err(o.err("moe_intermediate_size", "must be in 1..=2^20"));
    }
    let scoring = match o.opt_str("scoring_func")?.unwrap_or("sqrtsoftplus") {
        "sqrtsoftplus" => V4Scoring::SqrtSoftplus,
        "sigmoid" => V4Scoring::Sigmoid,
        other => {
            return Err(o.err(
                "scoring_func",
                format!("{other:?} is not supported for deepseek_v4 (sqrtsoftplus or sigmoid)"),
            ))
        }
    };
    let routed_scaling_factor = o.f64_or("routed_scaling_factor", 1.5)?;
    if !(routed_scaling_factor.is_finite() && routed_scaling_factor.abs() < 1e6) {
        return Err(o.err("routed_scaling_factor", "out of range"));
    }

    // RoPE: main = rope_theta, default type; compress = compress_rope_theta + the YaRN part.
    let main_theta = check_theta(o, "rope_theta", o.f64_or("rope_theta", 10000.0)?)?;
    let mut compress_theta = check_theta(
        o,
        "compress_rope_theta",
        o.f64_or("compress_rope_theta", 160000.0)?,
    )?;
    let params = match o.opt_obj("rope_scaling")? {
        Some(p) => Some(p),
        None => o.opt_obj("rope_parameters")?,
    };
    let mut compress_yarn = None;
    let mut main_theta = main_theta;
    if let Some(p) = params {
        let nested = p.opt_obj("compress")?;
        if let Some(m) = p.opt_obj("main")? {
            if let Some(t) = m.opt_f64("rope_theta")? {
                main_theta = check_theta(&m, "rope_theta", t)?;
            }
            if !matches!(m.opt_str("rope_type")?, None | Some("default")) {
                return Err(m.err("rope_type", "the main rope of deepseek_v4 must be default"));
            }
        }
        let is_nested = nested.is_some();
        let c = nested.unwrap_or(p);
        if is_nested {
            if let Some(t) = c.opt_f64("rope_theta")? {
                compress_theta = check_theta(&c, "rope_theta", t)?;
            }
        }
        let kind = match (c.opt_str("type")?, c.opt_str("rope_type")?) {
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => "default",
        };
        match kind {
            "default" => {}
            "yarn" => {
                let mut y = parse_yarn(o, &c, max_position_embeddings, true)?;
                // transformers forces attention_factor 1.0 on V4's compress yarn.
                y.attention_factor.get_or_insert(1.0);
                compress_yarn = Some(y);
            }
            other => {
                return Err(c.err(
                    "rope_type",
                    format!("RoPE type {other:?} is not supported (default or yarn)"),
                ))
            }
        }
    }
    Ok(V4Config {
        head_dim,
        rope_dim,
        q_lora_rank,
        o_groups,
        o_lora_rank,
        sliding_window,
        layer_types,
        mtp_layer_types,
        hash_layers,
        csa_rate,
        hca_rate,
        index_n_heads,
        index_head_dim,
        index_topk,
        hc_mult,
        hc_sinkhorn_iters,
        hc_eps: hc_eps as f32,
        swiglu_limit: swiglu_limit as f32,
        n_routed_experts,
        num_experts_per_tok,
        moe_intermediate_size,
        scoring,
        routed_scaling_factor: routed_scaling_factor as f32,
        main_theta,
        compress_theta,
        compress_yarn,
    })
}

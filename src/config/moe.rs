//! Mixture-of-experts routing parameters from `config.json`.
//!
//! Data flow: `config.json` -> [`parse_moe`] -> `ModelConfig::moe` -> the model's MoE layers
//! (router gate, top-k selection, expert weights) and `weights::expected_tensor_names`.
//! Guarantees: a returned [`MoeConfig`] is internally consistent — `num_experts_per_tok <=
//! n_routed_experts`, `n_group` divides `n_routed_experts`, `topk_group <= n_group`, the kept
//! groups hold at least `num_experts_per_tok` experts, all counts > 0. Absent routing fields take
//! the defaults of transformers' config class for the model type (V2: greedy / softmax /
//! no renormalisation / scale 1.0 / 1 group; V3: noaux_tc / sigmoid / renormalised / scale 2.5 /
//! 8 groups, top-4 groups).

use super::json::Obj;
use super::ModelType;
use crate::error::Result;

/// How the router selects experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkMethod {
    /// Plain top-k over all experts (V2).
    Greedy,
    /// Keep the `topk_group` groups with the highest max score, then top-k (V2 236B).
    GroupLimitedGreedy,
    /// V3: selection on `score + e_score_correction_bias`, group score = sum of top-2.
    NoauxTc,
}

/// How router logits become scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoringFunc {
    Softmax,
    Sigmoid,
}

impl TopkMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            TopkMethod::Greedy => "greedy",
            TopkMethod::GroupLimitedGreedy => "group_limited_greedy",
            TopkMethod::NoauxTc => "noaux_tc",
        }
    }
}

impl ScoringFunc {
    pub fn as_str(self) -> &'static str {
        match self {
            ScoringFunc::Softmax => "softmax",
            ScoringFunc::Sigmoid => "sigmoid",
        }
    }
}

/// Resolved MoE parameters (present only when `n_routed_experts` is set).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_routed_experts: usize,
    /// Always-active experts summed into every MoE layer's output (0 = none).
    pub n_shared_experts: usize,
    /// Experts per token (top-k).
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub topk_method: TopkMethod,
    pub scoring_func: ScoringFunc,
    /// Renormalise the selected weights to sum to 1 (before `routed_scaling_factor`).
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    /// Hidden size of each routed / shared expert.
    pub moe_intermediate_size: usize,
    /// Layers `0..first_k_dense_replace` use the dense MLP.
    pub first_k_dense_replace: usize,
    /// Among the remaining layers, those with `layer % moe_layer_freq == 0` are MoE.
    pub moe_layer_freq: usize,
}

/// `Ok(None)` for a dense model: `n_routed_experts` absent or null, or no layer among the
/// `layers` (decoder + MTP layers) that `first_k_dense_replace` / `moe_layer_freq` make MoE. In the
/// latter case the other MoE fields are not read at all — transformers builds such a model
/// whatever they hold, so they cannot make a loadable checkpoint fail here either.
pub(crate) fn parse_moe(
    o: &Obj<'_>,
    model_type: ModelType,
    layers: usize,
    leading_dense: Option<usize>,
) -> Result<Option<MoeConfig>> {
    let Some(n_routed_experts) = o.opt_usize("n_routed_experts")? else {
        return Ok(None);
    };
    let v3 = model_type.is_v3_family();
    // V3.2 (transformers' DeepseekV32Config): `mlp_layer_types` when given, else
    // first_k_dense_replace; moe_layer_freq, topk_method and scoring_func are not read (the
    // router is always noaux_tc + sigmoid).
    let v32 = model_type == ModelType::DeepseekV32;
    let first_k_dense_replace = match leading_dense {
        Some(d) => d,
        None => o.usize_or("first_k_dense_replace", if v3 { 3 } else { 0 })?,
    };
    if first_k_dense_replace >= layers {
        return Ok(None);
    }
    let moe_layer_freq = if v32 {
        1
    } else {
        o.usize_or("moe_layer_freq", 1)?
    };
    if moe_layer_freq == 0 {
        return Err(o.err("moe_layer_freq", "must be > 0"));
    }
    // The first MoE layer is the first multiple of moe_layer_freq at or after first_k_dense_replace.
    let first_moe = first_k_dense_replace
        .div_ceil(moe_layer_freq)
        .checked_mul(moe_layer_freq);
    if first_moe.is_none_or(|l| l >= layers) {
        return Ok(None);
    }
    if n_routed_experts == 0 {
        return Err(o.err(
            "n_routed_experts",
            "must be > 0 (use null for a dense model)",
        ));
    }
    let num_experts_per_tok = o.req_dim("num_experts_per_tok")?;
    if num_experts_per_tok > n_routed_experts {
        return Err(o.err(
            "num_experts_per_tok",
            format!("{num_experts_per_tok} exceeds n_routed_experts = {n_routed_experts}"),
        ));
    }
    // null means "no shared experts" in the reference code; an absent key is ambiguous.
    let n_shared_experts = if o.has_key("n_shared_experts") {
        o.opt_usize("n_shared_experts")?.unwrap_or(0)
    } else {
        return Err(o.err(
            "n_shared_experts",
            "required field is missing (use 0 or null for none)",
        ));
    };
    let moe_intermediate_size = o.req_dim("moe_intermediate_size")?;
    let n_group = o.usize_or("n_group", if v3 { 8 } else { 1 })?;
    let topk_group = o.usize_or("topk_group", if v3 { 4 } else { 1 })?;
    if n_group == 0 {
        return Err(o.err("n_group", "must be > 0"));
    }
    if topk_group == 0 {
        return Err(o.err("topk_group", "must be > 0"));
    }
    if n_routed_experts % n_group != 0 {
        return Err(o.err(
            "n_group",
            format!("{n_group} does not divide n_routed_experts = {n_routed_experts}"),
        ));
    }
    if topk_group > n_group {
        return Err(o.err(
            "topk_group",
            format!("{topk_group} exceeds n_group = {n_group}"),
        ));
    }
    let topk_method = match o.opt_str("topk_method")? {
        _ if v32 => TopkMethod::NoauxTc,
        None => {
            if v3 {
                TopkMethod::NoauxTc
            } else {
                TopkMethod::Greedy
            }
        }
        Some("greedy") => TopkMethod::Greedy,
        Some("group_limited_greedy") => TopkMethod::GroupLimitedGreedy,
        Some("noaux_tc") => TopkMethod::NoauxTc,
        Some(other) => return Err(o.err("topk_method", format!("{other:?} is not supported"))),
    };
    let scoring_func = match o.opt_str("scoring_func")? {
        _ if v32 => ScoringFunc::Sigmoid,
        None => {
            if v3 {
                ScoringFunc::Sigmoid
            } else {
                ScoringFunc::Softmax
            }
        }
        Some("softmax") => ScoringFunc::Softmax,
        Some("sigmoid") => ScoringFunc::Sigmoid,
        Some(other) => return Err(o.err("scoring_func", format!("{other:?} is not supported"))),
    };
    let group_size = n_routed_experts / n_group;
    if topk_method != TopkMethod::Greedy && topk_group * group_size < num_experts_per_tok {
        return Err(o.err(
            "topk_group",
            format!(
                "{topk_group} groups of {group_size} experts cannot supply num_experts_per_tok = {num_experts_per_tok}"
            ),
        ));
    }
    if topk_method == TopkMethod::NoauxTc && group_size < 2 {
        return Err(o.err(
            "n_group",
            "noaux_tc scores a group by its top-2 experts; groups need >= 2 experts",
        ));
    }
    let norm_topk_prob = o.bool_or("norm_topk_prob", v3)?;
    let routed_scaling_factor = o.f64_or("routed_scaling_factor", if v3 { 2.5 } else { 1.0 })?;
    if routed_scaling_factor <= 0.0 {
        return Err(o.err(
            "routed_scaling_factor",
            format!("must be > 0, found {routed_scaling_factor}"),
        ));
    }
    Ok(Some(MoeConfig {
        n_routed_experts,
        n_shared_experts,
        num_experts_per_tok,
        n_group,
        topk_group,
        topk_method,
        scoring_func,
        norm_topk_prob,
        routed_scaling_factor: routed_scaling_factor as f32,
        moe_intermediate_size,
        first_k_dense_replace,
        moe_layer_freq,
    }))
}

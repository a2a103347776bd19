//! RoPE base and YaRN scaling, read from either spelling of `config.json`.
//!
//! Data flow: `config.json` -> [`parse_rope`] -> `ModelConfig::{rope_theta, rope_scaling}` ->
//! the model's rotary tables and `ModelConfig::softmax_scale`.
//! Guarantees: the two spellings found in the wild give the same result — hub checkpoints
//! (top-level `rope_theta` + `rope_scaling {type|rope_type: "yarn", ...}`) and transformers-5
//! `save_pretrained` (`rope_parameters {rope_theta, rope_type, factor, ...}`). Only `yarn` (or no
//! scaling: absent, null, or `rope_type: "default"`) is accepted; every other type, and every YaRN
//! variant whose meaning differs between reference implementations, is refused with an error
//! naming the field.

use super::json::Obj;
use crate::error::Result;

/// YaRN RoPE scaling parameters (DeepSeek-V2/V3 style), fully resolved (defaults applied).
#[derive(Clone, Debug, PartialEq)]
pub struct YarnScaling {
    /// Context extension factor (`factor`, >= 1).
    pub factor: f64,
    /// `mscale` (default 1): numerator of the cos/sin magnitude correction.
    pub mscale: f64,
    /// `mscale_all_dim` (default 0): enters the attention softmax scale (see `softmax_scale`).
    pub mscale_all_dim: f64,
    /// Pre-training context length the correction range is computed against.
    pub original_max_position_embeddings: usize,
    /// Rotations where extrapolation ends (default 32).
    pub beta_fast: f64,
    /// Rotations where interpolation begins (default 1).
    pub beta_slow: f64,
    /// Explicit cos/sin multiplier (`attention_factor`); `None` derives it from the mscales.
    pub attention_factor: Option<f64>,
    /// Round the correction range outwards to whole dimensions (`truncate`, default true).
    pub truncate: bool,
}

/// YaRN magnitude correction `0.1 * mscale * ln(factor) + 1` (1 when `factor <= 1`).
pub fn yarn_get_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl YarnScaling {
    /// Factor the cos/sin tables are multiplied by: `attention_factor` when given, else: `m(factor, mscale) / m(factor, mscale_all_dim)` when both are non-zero, else
    /// `m(factor, 1)`. Equals 1.0 for the official V2/V3 configs (mscale == mscale_all_dim).
    pub fn cos_sin_mscale(&self) -> f64 {
        if let Some(a) = self.attention_factor {
            return a;
        }
        if self.mscale != 0.0 && self.mscale_all_dim != 0.0 {
            yarn_get_mscale(self.factor, self.mscale)
                / yarn_get_mscale(self.factor, self.mscale_all_dim)
        } else {
            yarn_get_mscale(self.factor, 1.0)
        }
    }
}

/// Resolve `(rope_theta, rope_scaling)` from the root object of `config.json`.
/// `max_position_embeddings` is the fallback for a missing `original_max_position_embeddings`.
pub(crate) fn parse_rope(
    root: &Obj<'_>,
    max_position_embeddings: usize,
) -> Result<(f64, Option<YarnScaling>)> {
    // rope_interleave: checkpoints store q_pe / k_pe rows in interleaved pair order; `false`
    // would mean a non-interleaved (rotate_half) layout that this engine does not implement.
    if root.opt_bool("rope_interleave")? == Some(false) {
        return Err(root.err(
            "rope_interleave",
            "false (non-interleaved rotary layout) is not supported; only interleaved pairs (true or absent)",
        ));
    }
    // transformers gives a non-null `rope_scaling` precedence over `rope_parameters`.
    let params = match root.opt_obj("rope_scaling")? {
        Some(p) => Some(p),
        None => root.opt_obj("rope_parameters")?,
    };
    let top_theta = root.opt_f64("rope_theta")?;
    let Some(p) = params else {
        return Ok((
            check_theta(root, "rope_theta", top_theta.unwrap_or(10000.0))?,
            None,
        ));
    };
    for (k, v) in p.values() {
        if v.is_object() {
            return Err(p.err(k, "per-layer-type RoPE parameters are not supported"));
        }
    }
    let theta = match p.opt_f64("rope_theta")? {
        Some(t) => check_theta(&p, "rope_theta", t)?,
        None => check_theta(root, "rope_theta", top_theta.unwrap_or(10000.0))?,
    };
    let ty = p.opt_str("type")?;
    let rty = p.opt_str("rope_type")?;
    let (kind, kind_key) = match (ty, rty) {
        (Some(a), Some(b)) if a != b => {
            return Err(p.err(
                "rope_type",
                format!("`type` is {a:?} but `rope_type` is {b:?}"),
            ))
        }
        (Some(a), _) => (a, "type"),
        (None, Some(b)) => (b, "rope_type"),
        (None, None) => ("default", "rope_type"),
    };
    match kind {
        "default" => Ok((theta, None)),
        "yarn" => Ok((
            theta,
            Some(parse_yarn(root, &p, max_position_embeddings, false)?),
        )),
        other => Err(p.err(
            kind_key,
            format!("RoPE scaling type {other:?} is not supported (only yarn)"),
        )),
    }
}

pub(crate) fn check_theta(o: &Obj<'_>, key: &str, t: f64) -> Result<f64> {
    if t <= 0.0 || t > 1e12 {
        return Err(o.err(key, format!("must be in (0, 1e12], found {t}")));
    }
    Ok(t)
}

/// YaRN parameters from `p` (`root` supplies a top-level `original_max_position_embeddings`).
/// `partial_ok`: the caller sizes the rotary dims itself (V4's partial rotary), so a
/// `partial_rotary_factor` key is not refused here.
pub(crate) fn parse_yarn(
    root: &Obj<'_>,
    p: &Obj<'_>,
    max_position_embeddings: usize,
    partial_ok: bool,
) -> Result<YarnScaling> {
    if let Some(f) = p.opt_f64("partial_rotary_factor")? {
        if f != 1.0 && !partial_ok {
            return Err(p.err(
                "partial_rotary_factor",
                format!("only 1.0 is supported, found {f}"),
            ));
        }
    }
    // transformers (`standardize_rope_params`): a top-level `original_max_position_embeddings`
    // wins over the one inside the RoPE parameters; absent in both -> max_position_embeddings.
    let original = match root.opt_usize("original_max_position_embeddings")? {
        Some(o) => Some((o, root)),
        None => p
            .opt_usize("original_max_position_embeddings")?
            .map(|o| (o, p)),
    };
    let original = match original {
        Some((0, o)) => return Err(o.err("original_max_position_embeddings", "must be > 0")),
        Some((o, _)) => o,
        None => max_position_embeddings,
    };
    // `factor` is used as given (transformers `_compute_yarn_parameters`, vLLM): users lower
    // `max_position_embeddings` to cap memory without touching it. Only an explicit `null`
    // falls back to max_position_embeddings / original_max_position_embeddings (transformers).
    if !p.has_key("factor") {
        return Err(p.err("factor", "required field is missing"));
    }
    let factor = match p.opt_f64("factor")? {
        Some(f) => f,
        None => max_position_embeddings as f64 / original as f64,
    };
    if factor < 1.0 {
        return Err(p.err("factor", format!("must be >= 1, found {factor}")));
    }
    let attention_factor = p.opt_f64("attention_factor")?;
    if let Some(a) = attention_factor {
        if a <= 0.0 {
            return Err(p.err("attention_factor", format!("must be > 0, found {a}")));
        }
    }
    let truncate = p.bool_or("truncate", true)?;
    let beta_fast = nonzero_or(p, "beta_fast", 32.0)?;
    let beta_slow = nonzero_or(p, "beta_slow", 1.0)?;
    if beta_fast < 0.0 || beta_slow < 0.0 {
        return Err(p.err("beta_fast", "beta_fast and beta_slow must be > 0"));
    }
    let mscale_all_dim = p.f64_or("mscale_all_dim", 0.0)?;
    // An absent `mscale` means m(factor, 1) for cos/sin in transformers but
    // m(factor, 1) / m(factor, mscale_all_dim) in vLLM: the two disagree as soon as
    // mscale_all_dim != 0, so that combination is refused rather than guessed.
    if !p.has("mscale") && mscale_all_dim != 0.0 && attention_factor.is_none() {
        return Err(p.err(
            "mscale",
            "missing while mscale_all_dim is set: transformers and vLLM scale cos/sin differently \
             then; give mscale explicitly",
        ));
    }
    let mscale = p.f64_or("mscale", 1.0)?;
    // Far outside any release (DeepSeek: factor 40, mscale 0.707 / 1), these keep the cos/sin
    // factor and the softmax scale finite in f32 instead of turning every logit into NaN.
    for (key, v, max) in [
        ("factor", factor, 1e6),
        ("mscale", mscale, 1e3),
        ("mscale_all_dim", mscale_all_dim, 1e3),
        ("attention_factor", attention_factor.unwrap_or(1.0), 1e3),
        ("beta_fast", beta_fast, 1e6),
        ("beta_slow", beta_slow, 1e6),
    ] {
        if v.abs() > max {
            return Err(p.err(key, format!("{v} is out of range (|value| <= {max})")));
        }
    }
    Ok(YarnScaling {
        factor,
        mscale,
        mscale_all_dim,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate,
    })
}

/// transformers reads these with `get(..) or default`, so 0 also means the default.
fn nonzero_or(p: &Obj<'_>, key: &str, default: f64) -> Result<f64> {
    Ok(match p.opt_f64(key)? {
        Some(x) if x != 0.0 => x,
        _ => default,
    })
}

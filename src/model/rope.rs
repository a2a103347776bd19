//! Rotary position embedding with YaRN scaling (`apply_half`: V3.2's indexer, half-split), in the INTERLEAVED pair convention of the DeepSeek
//! checkpoints: pairs (x[2i], x[2i+1]) are rotated by angle pos * inv_freq[i]. (transformers
//! de-interleaves q_pe/k_pe and uses rotate_half; the scores are the same.) The cache stores k_pe
//! in this interleaved, already-rotated form.
//!
//! Frequencies follow transformers' `_compute_yarn_parameters` (base inv_i = theta^(-2i/d),
//! correction range from beta_fast/beta_slow against original_max_position_embeddings, linear ramp
//! blend of inv/factor and inv; `truncate: false` keeps the range unrounded) and cos/sin are
//! multiplied by `YarnScaling::cos_sin_mscale` (the explicit `attention_factor`, else
//! m(factor, mscale) / m(factor, mscale_all_dim)).

use crate::config::{ModelConfig, YarnScaling};

/// Precomputed per-pair inverse frequencies and the cos/sin multiplier.
#[derive(Clone, Debug)]
pub struct Rope {
    /// [rope_dim / 2]
    inv_freq: Vec<f64>,
    attention_factor: f64,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Self {
        Self::from_parts(
            cfg.qk_rope_head_dim,
            cfg.rope_theta,
            cfg.rope_scaling.as_ref(),
        )
    }

    /// Frequencies for `dim` rotary dims of base `base`, with optional YaRN (V4 builds one per
    /// rope type: `main` and `compress`).
    pub fn from_parts(dim: usize, base: f64, scaling: Option<&YarnScaling>) -> Self {
        let half = dim / 2;
        let pos_freqs: Vec<f64> = (0..half)
            .map(|i| base.powf((2 * i) as f64 / dim as f64))
            .collect();
        let Some(y) = scaling else {
            return Rope {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                attention_factor: 1.0,
            };
        };
        let factor = y.factor;
        let attention_factor = y.cos_sin_mscale();
        let orig = y.original_max_position_embeddings as f64;
        let corr_dim = |rot: f64| {
            (dim as f64 * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
        };
        let (low, high) = (corr_dim(y.beta_fast), corr_dim(y.beta_slow));
        let (low, high) = if y.truncate {
            (low.floor(), high.ceil())
        } else {
            (low, high)
        };
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001;
        }
        let inv_freq = (0..half)
            .map(|i| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                let inv_extra = 1.0 / pos_freqs[i];
                let inv_inter = 1.0 / (factor * pos_freqs[i]);
                inv_inter * (1.0 - extrapolation_factor) + inv_extra * extrapolation_factor
            })
            .collect();
        Rope {
            inv_freq,
            attention_factor,
        }
    }

    /// (cos, sin) of the pair with inverse frequency `f` at position `pos`, times the cos/sin
    /// factor (transformers computes freqs = pos * inv_freq in f32, then cos/sin in f32).
    #[inline]
    fn cos_sin(&self, f: f64, pos: usize) -> (f32, f32) {
        let (s, c) = ((pos as f32) * (f as f32)).sin_cos();
        (
            (c as f64 * self.attention_factor) as f32,
            (s as f64 * self.attention_factor) as f32,
        )
    }

    /// Rotate one interleaved rope vector in place at absolute position `pos`. // x: [rope_dim]
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (c, s) = self.cos_sin(f, pos);
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = b * c + a * s;
        }
    }

    /// The inverse rotation of [`Rope::apply`] (angle -pos * inv_freq): V4 un-rotates the rope
    /// slice of its attention output at the query position. // x: [rope_dim]
    pub fn apply_inverse(&self, x: &mut [f32], pos: usize) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (c, s) = self.cos_sin(f, pos);
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * c + b * s;
            x[2 * i + 1] = b * c - a * s;
        }
    }

    /// Rotate the first `rope_dim` values of `x` in the HALF-SPLIT convention (`rotate_half`:
    /// pair (x[i], x[i + rope_dim/2]) by angle pos * inv_freq[i]), the values after them pass
    /// through: V3.2's indexer ropes its q heads and key this way, with the same frequencies and
    /// cos/sin factor as MLA. // x: [>= rope_dim]
    pub fn apply_half(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (c, s) = self.cos_sin(f, pos);
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }
}

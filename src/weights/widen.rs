//! `specmla make-bench-model`: a function-preserving widening of a DeepSeek checkpoint
//! (Net2Net-style), so a tiny trained model becomes a memory-bound benchmark target that still
//! solves its task.
//!
//! Where it sits: beside `quantize` (it reads a `WeightStore` and writes new safetensors shards
//! plus an index); the result is an ordinary checkpoint that every loader (specmla,
//! transformers, llama.cpp's converter) reads.
//!
//! The mapping, with `r` = hidden factor, `s` = MLP / expert intermediate factor, `g` = head
//! factor (each a power of two, so dividing a bf16 weight by it is exact):
//! - a hidden vector h becomes h' = repeat_interleave(h, r) (entry j*r+u holds h[j]); RMSNorm of
//!   h' is the repeated RMSNorm of h (mean of squares unchanged), so norm weights repeat;
//! - a matrix that READS the hidden stream (q_a / q / kv_a projections, MLP and expert gate / up,
//!   router gate, lm_head, MTP eh_proj) repeats its columns and divides them by r: W'h' = Wh;
//!   one that WRITES it (embeddings, o_proj, down projections, eh_proj rows) repeats its rows;
//! - MLP / expert units repeat s times (gate and up rows), down_proj columns repeat and divide
//!   by s; attention heads repeat g times (q_b / q and kv_b rows per head, o_proj columns per
//!   head divided by g) — head dims are unchanged, so softmax scale and RoPE are too;
//! - the router sees the same scores, so every token selects the same experts.
//!
//! Outputs equal the original's up to f32 summation order (tested in `tests/widen.rs`). The MTP
//! layers (`model.layers.{num_hidden_layers}..`) are widened by the same rules. Quantised (fp8)
//! checkpoints and tensors this module does not know are refused: widening them blindly would
//! silently change the function.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::dtype::{decode_to_f32, f32_to_bf16, DType};
use super::files::{copy_non_weight_files, io, read_config_json, write_safetensors, OutTensor};
use super::safetensors_store::{WeightSource, WeightStore};
use crate::error::{Error, Result};

/// Widening factors (powers of two, >= 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WidenFactors {
    /// Hidden size multiplier (r).
    pub hidden: usize,
    /// Routed-expert intermediate multiplier (s).
    pub intermediate: usize,
    /// Attention head multiplier (g).
    pub heads: usize,
    /// Dense-MLP and shared-expert unit multiplier (u >= s): the weights EVERY token reads. The
    /// shared experts' fused width grows u times (`n_shared_experts` x u / s, since
    /// `moe_intermediate_size` grows s times); u = s is the plain widening.
    pub shared: usize,
}

impl Default for WidenFactors {
    /// The benchmark target of the speculation bench: hidden x8, experts x4, heads x4 (the
    /// bundled 66 MB target becomes ~2.1 GB of bf16, ~166 MB read per decode token).
    fn default() -> Self {
        WidenFactors {
            hidden: 8,
            intermediate: 4,
            heads: 4,
            shared: 4,
        }
    }
}

impl WidenFactors {
    /// Hidden, intermediate and heads widened by the same factor for dense and routed weights.
    pub fn uniform(hidden: usize, intermediate: usize, heads: usize) -> Self {
        WidenFactors {
            hidden,
            intermediate,
            heads,
            shared: intermediate,
        }
    }
}

/// What `widen_dir` wrote.
#[derive(Clone, Debug, Default)]
pub struct WidenReport {
    pub tensors: usize,
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub shards: usize,
}

/// How one axis of a tensor maps new indices to old ones.
#[derive(Clone, Copy, Debug)]
enum Axis {
    Keep,
    /// Entry j*f+u <- j (hidden stream or MLP units).
    Repeat(usize),
    /// Blocks of `per` entries (one head) repeated f times: block b' <- b'/f.
    Heads {
        per: usize,
        f: usize,
    },
    /// Two hidden-sized halves [e | h] (MTP eh_proj input), each repeated f times.
    TwoHidden {
        half: usize,
        f: usize,
    },
}

impl Axis {
    fn factor(self) -> usize {
        match self {
            Axis::Keep => 1,
            Axis::Repeat(f) | Axis::Heads { f, .. } | Axis::TwoHidden { f, .. } => f,
        }
    }

    /// New length -> old index, for an axis of old length `n`.
    fn map(self, n: usize) -> Result<Vec<usize>> {
        let bad = |what: &str| Err(Error::InvalidArgument(format!("widen: {what}")));
        Ok(match self {
            Axis::Keep => (0..n).collect(),
            Axis::Repeat(f) => (0..n * f).map(|i| i / f).collect(),
            Axis::Heads { per, f } => {
                if per == 0 || !n.is_multiple_of(per) {
                    return bad(&format!("axis of {n} is not whole heads of {per}"));
                }
                (0..n * f).map(|i| (i / per / f) * per + i % per).collect()
            }
            Axis::TwoHidden { half, f } => {
                if n != 2 * half {
                    return bad(&format!("eh_proj input of {n} is not 2 x hidden {half}"));
                }
                let h2 = half * f;
                (0..n * f).map(|i| (i / h2) * half + (i % h2) / f).collect()
            }
        })
    }
}

/// The dims the rules need, from config.json.
struct Dims {
    hidden: usize,
    /// Rows of one head in q_b / q: qk_nope + qk_rope.
    qk_head: usize,
    /// Rows of one head in kv_b: qk_nope + v.
    kv_b_head: usize,
    v_head: usize,
}

/// (row axis, column axis, divide columns by their factor) for tensor `name`; None for a
/// tensor the rules do not know (refused).
fn rule(name: &str, d: &Dims, f: WidenFactors) -> Option<(Axis, Axis, bool)> {
    let (r, s, g) = (f.hidden, f.intermediate, f.heads);
    let hid = Axis::Repeat(r);
    let ends = |suffix: &str| name.ends_with(suffix);
    // 1-D norms over the hidden stream (repeated) or over a LoRA rank (kept).
    if ends("q_a_layernorm.weight") || ends("kv_a_layernorm.weight") {
        return Some((Axis::Keep, Axis::Keep, false));
    }
    if ends("norm.weight") {
        return Some((hid, Axis::Keep, false));
    }
    if ends("e_score_correction_bias") {
        return Some((Axis::Keep, Axis::Keep, false));
    }
    if ends("embed_tokens.weight") {
        return Some((Axis::Keep, hid, false));
    }
    if ends("lm_head.weight") || ends("shared_head.head.weight") || ends("mlp.gate.weight") {
        return Some((Axis::Keep, hid, true));
    }
    if ends("q_a_proj.weight") || ends("kv_a_proj_with_mqa.weight") {
        return Some((Axis::Keep, hid, true));
    }
    if ends("q_b_proj.weight") {
        return Some((
            Axis::Heads {
                per: d.qk_head,
                f: g,
            },
            Axis::Keep,
            false,
        ));
    }
    if ends("self_attn.q_proj.weight") {
        return Some((
            Axis::Heads {
                per: d.qk_head,
                f: g,
            },
            hid,
            true,
        ));
    }
    if ends("kv_b_proj.weight") {
        return Some((
            Axis::Heads {
                per: d.kv_b_head,
                f: g,
            },
            Axis::Keep,
            false,
        ));
    }
    if ends("o_proj.weight") {
        return Some((
            hid,
            Axis::Heads {
                per: d.v_head,
                f: g,
            },
            true,
        ));
    }
    // routed experts widen by s; dense MLPs and shared experts (read by every token) by u
    let units = if name.contains(".experts.") {
        s
    } else {
        f.shared
    };
    if ends("gate_proj.weight") || ends("up_proj.weight") {
        return Some((Axis::Repeat(units), hid, true));
    }
    if ends("down_proj.weight") {
        return Some((hid, Axis::Repeat(units), true));
    }
    if ends("eh_proj.weight") {
        return Some((
            hid,
            Axis::TwoHidden {
                half: d.hidden,
                f: r,
            },
            true,
        ));
    }
    None
}

fn cfg_usize(cfg: &Value, key: &str) -> Result<usize> {
    cfg.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| Error::Config {
            field: key.into(),
            msg: "missing or not a non-negative integer (make-bench-model needs it)".into(),
        })
}

/// Widen the float checkpoint in `src` into a new directory `dst` (one shard per decoder layer
/// plus one for the rest, and an index).
pub fn widen_dir(src: &Path, dst: &Path, f: WidenFactors) -> Result<WidenReport> {
    for (what, v) in [
        ("hidden", f.hidden),
        ("intermediate", f.intermediate),
        ("heads", f.heads),
        ("shared", f.shared),
    ] {
        if v == 0 || !v.is_power_of_two() || v > 64 {
            return Err(Error::InvalidArgument(format!(
                "make-bench-model: {what} factor {v} must be a power of two in 1..=64"
            )));
        }
    }
    if f.shared < f.intermediate {
        return Err(Error::InvalidArgument(format!(
            "make-bench-model: the shared / dense factor {} must be >= the expert factor {} \
             (n_shared_experts grows by their ratio)",
            f.shared, f.intermediate
        )));
    }
    let mut cfg: Value = read_config_json(src)?;

    if cfg.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return Err(Error::InvalidArgument(format!(
            "make-bench-model: {} is quantised; widen the float checkpoint, then quantise",
            src.display()
        )));
    }
    if src.canonicalize().ok() == dst.canonicalize().ok() && dst.exists() {
        return Err(Error::InvalidArgument(
            "make-bench-model: --out must differ from --from".into(),
        ));
    }
    let nope = cfg_usize(&cfg, "qk_nope_head_dim")?;
    let v_head = cfg_usize(&cfg, "v_head_dim")?;
    let d = Dims {
        hidden: cfg_usize(&cfg, "hidden_size")?,
        qk_head: nope + cfg_usize(&cfg, "qk_rope_head_dim")?,
        kv_b_head: nope + v_head,
        v_head,
    };
    let store = WeightStore::open(WeightSource::Dir(src.to_path_buf()))?;
    std::fs::create_dir_all(dst).map_err(|e| io(dst, e))?;
    // Shard by decoder layer: bounded memory while writing (the widened experts of one layer
    // are ~0.7 GB at the default factors).
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for name in store.names() {
        let key = match name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
        {
            Some(l) => format!("layer{:04}", l.parse::<usize>().unwrap_or(9999)),
            None => "other".to_string(),
        };
        groups.entry(key).or_default().push(name);
    }
    let mut report = WidenReport::default();
    let mut weight_map = BTreeMap::new();
    let n_shards = groups.len();
    for (i, names) in groups.values().enumerate() {
        let fname = format!("model-{:05}-of-{:05}.safetensors", i + 1, n_shards);
        let mut out: Vec<OutTensor> = Vec::with_capacity(names.len());
        for &name in names {
            let t = store.get(name).expect("listed");
            if name.ends_with("weight_scale_inv") || t.dtype == DType::F8E4M3 {
                return Err(Error::InvalidArgument(format!(
                    "make-bench-model: tensor `{name}` is fp8; widen a float checkpoint"
                )));
            }
            let (ra, ca, div) = rule(name, &d, f).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "make-bench-model: no widening rule for tensor `{name}`"
                ))
            })?;
            let (rows, cols) = match t.shape {
                [n] => (*n, 1),
                [r, c] => (*r, *c),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "make-bench-model: tensor `{name}` has shape {:?}",
                        t.shape
                    )))
                }
            };
            let w = decode_to_f32(&t.dtype, t.data).ok_or_else(|| {
                Error::InvalidArgument(format!("make-bench-model: tensor `{name}` is not float"))
            })?; // [rows, cols]
            let rmap = ra.map(rows)?;
            let cmap = ca.map(cols)?;
            let scale = if div { 1.0 / ca.factor() as f32 } else { 1.0 };
            let mut nw = Vec::with_capacity(rmap.len() * cmap.len()); // [rows', cols']
            for &r in &rmap {
                let row = &w[r * cols..(r + 1) * cols];
                nw.extend(cmap.iter().map(|&c| row[c] * scale));
            }
            let shape = if t.shape.len() == 1 {
                vec![rmap.len()]
            } else {
                vec![rmap.len(), cmap.len()]
            };
            let bytes = encode(&t.dtype, &nw, name)?;
            report.bytes_in += t.data.len();
            report.bytes_out += bytes.len();
            report.tensors += 1;
            weight_map.insert(name.to_string(), fname.clone());
            out.push((name.to_string(), t.dtype.clone(), shape, bytes));
        }
        write_safetensors(&dst.join(&fname), &out)?;
        report.shards += 1;
    }
    let idx = json!({"metadata": {"total_size": report.bytes_out}, "weight_map": weight_map});
    let p = dst.join("model.safetensors.index.json");
    std::fs::write(&p, serde_json::to_string_pretty(&idx).expect("json")).map_err(|e| io(&p, e))?;
    // config.json with the widened dims.
    let mul = |cfg: &mut Value, key: &str, by: usize| {
        if let Some(v) = cfg.get(key).and_then(Value::as_u64) {
            cfg[key] = json!(v as usize * by);
        }
    };
    mul(&mut cfg, "hidden_size", f.hidden);
    mul(&mut cfg, "intermediate_size", f.shared);
    mul(&mut cfg, "moe_intermediate_size", f.intermediate);
    mul(&mut cfg, "n_shared_experts", f.shared / f.intermediate);
    mul(&mut cfg, "num_attention_heads", f.heads);
    mul(&mut cfg, "num_key_value_heads", f.heads);
    let p = dst.join("config.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).expect("json")).map_err(|e| io(&p, e))?;
    // Tokenizer, generation config and the rest as they are (not the old weights).
    copy_non_weight_files(src, dst)?;
    Ok(report)
}

/// f32 values back to the tensor's stored dtype (exact for the repeated / power-of-two-divided
/// values of a bf16 / f16 / f32 tensor).
fn encode(dt: &DType, v: &[f32], name: &str) -> Result<Vec<u8>> {
    Ok(match dt {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|x| f32_to_bf16(*x).to_le_bytes())
            .collect(),
        DType::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
            .collect(),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "make-bench-model: tensor `{name}` has dtype {dt:?}"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::bf16_to_f32;

    #[test]
    fn axis_maps() {
        assert_eq!(Axis::Repeat(2).map(3).unwrap(), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(
            Axis::Heads { per: 2, f: 2 }.map(4).unwrap(),
            vec![0, 1, 0, 1, 2, 3, 2, 3]
        );
        assert_eq!(
            Axis::TwoHidden { half: 2, f: 2 }.map(4).unwrap(),
            vec![0, 0, 1, 1, 2, 2, 3, 3]
        );
        assert!(Axis::Heads { per: 3, f: 2 }.map(4).is_err());
        assert!(Axis::TwoHidden { half: 3, f: 2 }.map(4).is_err());
    }

    #[test]
    fn bf16_round_trip_is_exact_for_power_of_two_division() {
        // normal values (a weight near the bottom of the range would lose bits when divided)
        for b in [0x3f80u16, 0xbe4c, 0x0d01, 0x7f00] {
            let x = bf16_to_f32(b);
            assert_eq!(bf16_to_f32(f32_to_bf16(x / 8.0)) * 8.0, x);
        }
    }
}

//! Building a `Model` from a checked `WeightStore`: every expected tensor by name, shape and dtype
//! (errors name the tensor), plus the absorbed per-head W_UK^T / W_UV matrices derived from
//! kv_b_proj in the same precision (bf16 stays bf16; fp8 is dequantised exactly to f32).

use std::path::Path;

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{matrix_row_f32, Matrix, MatrixData};
use crate::weights::{check_tensor_set, Loader, WeightSource, WeightStore};

use super::rope::Rope;
use super::weights::{Attention, DecoderLayer, Expert, Ffn, Model, Moe};

impl Model {
    /// Load config.json and the safetensors weights of a model directory.
    pub fn load_dir(dir: &Path) -> Result<Model> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open(WeightSource::Dir(dir.to_path_buf()))?;
        Model::load(config, &store)
    }

    /// Build the model for `config` from `store`; every expected tensor is checked.
    pub fn load(config: ModelConfig, store: &WeightStore) -> Result<Model> {
        let mtp_tensors = check_tensor_set(&config, store)?;
        let ld = Loader { store, quant: config.quantization.clone() };
        let c = &config;
        let h = c.hidden_size;
        let embed = ld.matrix("model.embed_tokens.weight", c.vocab_size, h)?;
        let lm_head = if c.tie_word_embeddings && !ld.has("lm_head.weight") {
            None
        } else {
            Some(ld.matrix("lm_head.weight", c.vocab_size, h)?)
        };
        let norm = ld.vector_f32("model.norm.weight", h)?;
        let layers = (0..c.num_hidden_layers)
            .into_par_iter()
            .map(|i| load_layer(&ld, c, i))
            .collect::<Result<Vec<_>>>()?;
        let rope = Rope::new(c);
        Ok(Model { config, embed, layers, norm, lm_head, rope, mtp_tensors })
    }
}

fn load_mlp(ld: &Loader, p: &str, inter: usize, hidden: usize) -> Result<Expert> {
    Ok(Expert {
        gate: ld.matrix(&format!("{p}.gate_proj.weight"), inter, hidden)?,
        up: ld.matrix(&format!("{p}.up_proj.weight"), inter, hidden)?,
        down: ld.matrix(&format!("{p}.down_proj.weight"), hidden, inter)?,
    })
}

fn load_layer(ld: &Loader, c: &ModelConfig, i: usize) -> Result<DecoderLayer> {
    let p = format!("model.layers.{i}");
    let h = c.hidden_size;
    let nh = c.num_attention_heads;
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    let (q_lora, q_proj) = match c.q_lora_rank {
        Some(r) => (
            Some((
                ld.matrix(&format!("{p}.self_attn.q_a_proj.weight"), r, h)?,
                ld.vector_f32(&format!("{p}.self_attn.q_a_layernorm.weight"), r)?,
                ld.matrix(&format!("{p}.self_attn.q_b_proj.weight"), nh * qk, r)?,
            )),
            None,
        ),
        None => (None, Some(ld.matrix(&format!("{p}.self_attn.q_proj.weight"), nh * qk, h)?)),
    };
    let kv_b_proj = ld.matrix(
        &format!("{p}.self_attn.kv_b_proj.weight"),
        nh * (c.qk_nope_head_dim + c.v_head_dim),
        c.kv_lora_rank,
    )?;
    let (w_uk_t, w_uv) = absorb(&kv_b_proj, nh, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    let attn = Attention {
        q_lora,
        q_proj,
        kv_a_proj: ld.matrix(
            &format!("{p}.self_attn.kv_a_proj_with_mqa.weight"),
            c.kv_lora_rank + c.qk_rope_head_dim,
            h,
        )?,
        kv_a_norm: ld.vector_f32(&format!("{p}.self_attn.kv_a_layernorm.weight"), c.kv_lora_rank)?,
        kv_b_proj,
        w_uk_t,
        w_uv,
        o_proj: ld.matrix(&format!("{p}.self_attn.o_proj.weight"), h, nh * c.v_head_dim)?,
    };
    let ffn = match (&c.moe, c.is_moe_layer(i)) {
        (Some(m), true) => {
            let n = m.n_routed_experts;
            let gate = ld.matrix_f32(&format!("{p}.mlp.gate.weight"), n, h)?;
            let bias = if matches!(m.topk_method, crate::config::TopkMethod::NoauxTc) {
                Some(ld.vector_f32(&format!("{p}.mlp.gate.e_score_correction_bias"), n)?)
            } else {
                None
            };
            let experts = (0..n)
                .map(|e| load_mlp(ld, &format!("{p}.mlp.experts.{e}"), m.moe_intermediate_size, h))
                .collect::<Result<Vec<_>>>()?;
            let shared = if m.n_shared_experts > 0 {
                Some(load_mlp(
                    ld,
                    &format!("{p}.mlp.shared_experts"),
                    m.moe_intermediate_size * m.n_shared_experts,
                    h,
                )?)
            } else {
                None
            };
            Ffn::Moe(Moe { gate, bias, experts, shared })
        }
        _ => Ffn::Dense(load_mlp(ld, &format!("{p}.mlp"), c.intermediate_size, h)?),
    };
    Ok(DecoderLayer {
        input_norm: ld.vector_f32(&format!("{p}.input_layernorm.weight"), h)?,
        attn,
        post_norm: ld.vector_f32(&format!("{p}.post_attention_layernorm.weight"), h)?,
        ffn,
    })
}

/// Split kv_b_proj [H*(nope+v), kv_lora] into per-head W_UK^T [kv_lora, nope] and W_UV [v, kv_lora],
/// keeping bf16 as bf16 (exact) and everything else as exact f32.
fn absorb(kv_b: &Matrix, nh: usize, nope: usize, v: usize, kv_lora: usize) -> (Vec<Matrix>, Vec<Matrix>) {
    let keep_bf16 = matches!(kv_b.data, MatrixData::Bf16(_));
    let mut full = vec![0f32; kv_b.rows * kv_b.cols]; // [H*(nope+v), kv_lora]
    for r in 0..kv_b.rows {
        matrix_row_f32(kv_b, r, &mut full[r * kv_lora..(r + 1) * kv_lora]);
    }
    let make = |rows: usize, cols: usize, data: Vec<f32>| {
        if keep_bf16 {
            // Values came from bf16, so truncating the low half is exact.
            Matrix::from_bf16(rows, cols, data.iter().map(|x| (x.to_bits() >> 16) as u16).collect())
        } else {
            Matrix::from_f32(rows, cols, data)
        }
    };
    let mut uk = Vec::with_capacity(nh);
    let mut uv = Vec::with_capacity(nh);
    for hd in 0..nh {
        let base = hd * (nope + v);
        let mut t = vec![0f32; kv_lora * nope]; // [kv_lora, nope]
        for n in 0..nope {
            for c in 0..kv_lora {
                t[c * nope + n] = full[(base + n) * kv_lora + c];
            }
        }
        uk.push(make(kv_lora, nope, t));
        let w = full[(base + nope) * kv_lora..(base + nope + v) * kv_lora].to_vec(); // [v, kv_lora]
        uv.push(make(v, kv_lora, w));
    }
    (uk, uv)
}

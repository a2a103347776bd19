//! Building a `Model` from a checked `WeightStore`: every expected tensor by name, shape and dtype
//! (errors name the tensor), plus the absorbed per-head W_UK^T / W_UV matrices derived from
//! kv_b_proj in the same precision (W_UV borrows kv_b_proj's rows; W_UK^T is a transposed copy).
//! Weights borrow from the mapped checkpoint (see `weights::loader`): the model keeps the
//! mapping alive, so nothing is loaded twice.

use std::path::Path;

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{matrix_row_f32, Matrix, MatrixData};
use crate::weights::{check_tensor_set, Loader, WeightSource, WeightStore};

use super::rope::Rope;
use super::weights::{Attention, DecoderLayer, Expert, Ffn, Indexer, Model, Moe, MtpLayer};

impl Model {
    /// Load config.json and the safetensors weights of a model directory (files mapped, or
    /// read into huge pages where the process-wide setting asks for it).
    pub fn load_dir(dir: &Path) -> Result<Model> {
        Model::load_dir_with(dir, crate::weights::huge_page_weights())
    }

    /// [`Model::load_dir`], its files read into huge pages when `huge_pages`, else mapped
    /// (`WeightStore::open_with`).
    pub fn load_dir_with(dir: &Path, huge_pages: bool) -> Result<Model> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let store = WeightStore::open_with(WeightSource::Dir(dir.to_path_buf()), huge_pages)?;
        Model::load(config, &store)
    }

    /// Build the model for `config` from `store`; every expected tensor is checked.
    pub fn load(config: ModelConfig, store: &WeightStore) -> Result<Model> {
        if config.v4.is_some() {
            let (embed, lm_head, norm, v4) = super::v4::load_v4(&config, store)?;
            let mtp_tensors: Vec<String> = store
                .names()
                .filter(|n| n.starts_with("mtp."))
                .map(str::to_string)
                .collect();
            let rope = Rope::new(&config);
            return Ok(Model {
                config,
                embed,
                layers: Vec::new(),
                norm,
                lm_head,
                rope,
                mtp_tensors,
                mtp: Vec::new(),
                v4: Some(Box::new(v4)),
            });
        }
        let mtp_tensors = check_tensor_set(&config, store)?;
        let ld = Loader {
            store,
            quant: config.quantization,
            resident: crate::kernels::stays_cached(store.total_bytes() as u64),
        };
        let c = &config;
        let h = c.hidden_size;
        let embed = ld.table("model.embed_tokens.weight", c.vocab_size, h)?; // read by rows
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
        // MTP layers: loaded when the checkpoint has them (converted checkpoints often drop
        // them although the config still counts them).
        let mut mtp = Vec::new();
        for i in c.num_hidden_layers..c.num_hidden_layers + c.num_nextn_predict_layers {
            let p = format!("model.layers.{i}");
            if !ld.has(&format!("{p}.eh_proj.weight")) {
                break;
            }
            let head_name = format!("{p}.shared_head.head.weight");
            mtp.push(MtpLayer {
                enorm: ld.vector_f32(&format!("{p}.enorm.weight"), h)?,
                hnorm: ld.vector_f32(&format!("{p}.hnorm.weight"), h)?,
                eh_proj: ld.matrix(&format!("{p}.eh_proj.weight"), h, 2 * h)?,
                layer: load_layer(&ld, c, i)?,
                head_norm: ld.vector_f32(&format!("{p}.shared_head.norm.weight"), h)?,
                head: if ld.has(&head_name) {
                    Some(ld.matrix(&head_name, c.vocab_size, h)?)
                } else {
                    None
                },
            });
        }
        let rope = Rope::new(c);
        Ok(Model {
            config,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            mtp_tensors,
            mtp,
            v4: None,
        })
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
        None => (
            None,
            Some(ld.matrix(&format!("{p}.self_attn.q_proj.weight"), nh * qk, h)?),
        ),
    };
    let kv_b_proj = ld.matrix(
        &format!("{p}.self_attn.kv_b_proj.weight"),
        nh * (c.qk_nope_head_dim + c.v_head_dim),
        c.kv_lora_rank,
    )?;
    let (w_uk_t, w_uv) = absorb(
        &kv_b_proj,
        nh,
        c.qk_nope_head_dim,
        c.v_head_dim,
        c.kv_lora_rank,
    );
    let attn = Attention {
        q_lora,
        q_proj,
        kv_a_proj: ld.matrix(
            &format!("{p}.self_attn.kv_a_proj_with_mqa.weight"),
            c.kv_lora_rank + c.qk_rope_head_dim,
            h,
        )?,
        kv_a_norm: ld.vector_f32(
            &format!("{p}.self_attn.kv_a_layernorm.weight"),
            c.kv_lora_rank,
        )?,
        kv_b_proj,
        w_uk_t,
        w_uv,
        o_proj: ld.matrix(
            &format!("{p}.self_attn.o_proj.weight"),
            h,
            nh * c.v_head_dim,
        )?,
        indexer: match (c.indexer, c.q_lora_rank) {
            (Some(ix), Some(r)) => {
                let q = format!("{p}.self_attn.indexer");
                let d = ix.head_dim;
                Some(Indexer {
                    wq_b: ld.matrix(&format!("{q}.wq_b.weight"), ix.n_heads * d, r)?,
                    wk: ld.matrix(&format!("{q}.wk.weight"), d, h)?,
                    k_norm_w: ld.vector_f32(&format!("{q}.k_norm.weight"), d)?,
                    k_norm_b: ld.vector_f32(&format!("{q}.k_norm.bias"), d)?,
                    weights_proj: Matrix::from_f32(
                        ix.n_heads,
                        h,
                        ld.matrix_f32(&format!("{q}.weights_proj.weight"), ix.n_heads, h)?,
                    ),
                })
            }
            _ => None,
        },
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
                .map(|e| {
                    load_mlp(
                        ld,
                        &format!("{p}.mlp.experts.{e}"),
                        m.moe_intermediate_size,
                        h,
                    )
                })
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
            Ffn::Moe(Moe {
                gate,
                bias,
                experts,
                shared,
            })
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

/// Per-head absorbed matrices from kv_b_proj [H*(nope+v), kv_lora]: W_UV^h [v, kv_lora] is a
/// zero-copy row view of kv_b_proj; W_UK^h^T [kv_lora, nope] is a transposed copy in the same
/// precision (exact: f32 / bf16 / f16 elements move; fp8 bytes move with their block grid
/// transposed). fp8 heads that do not start on a scale-block boundary fall back to exact f32.
fn absorb(
    kv_b: &Matrix,
    nh: usize,
    nope: usize,
    v: usize,
    kv_lora: usize,
) -> (Vec<Matrix>, Vec<Matrix>) {
    // strips (the avx2 level's layout) are absorbed from a row-major copy; the per-head
    // matrices stay row-major
    let row_major = kv_b.row_major();
    let kv_b = &row_major;
    let mut uk = Vec::with_capacity(nh);
    let mut uv = Vec::with_capacity(nh);
    for hd in 0..nh {
        let base = hd * (nope + v);
        let (k, u) = match &kv_b.data {
            MatrixData::F32(d) => (
                Matrix::from_f32(
                    kv_lora,
                    nope,
                    transpose(&d[base * kv_lora..], nope, kv_lora),
                ),
                None,
            ),
            MatrixData::Bf16(d) => (
                Matrix::from_bf16(
                    kv_lora,
                    nope,
                    transpose(&d[base * kv_lora..], nope, kv_lora),
                ),
                None,
            ),
            MatrixData::F16(d) => (
                Matrix::from_f16(
                    kv_lora,
                    nope,
                    transpose(&d[base * kv_lora..], nope, kv_lora),
                ),
                None,
            ),
            MatrixData::Fp8 {
                data,
                scale_inv,
                block_rows: br,
                block_cols: bc,
            } if base.is_multiple_of(*br) && (base + nope).is_multiple_of(*br) => {
                let t = transpose(&data[base * kv_lora..], nope, kv_lora); // [kv_lora, nope]
                let ncb = kv_lora.div_ceil(*bc);
                let (sr, sc) = (kv_lora.div_ceil(*bc), nope.div_ceil(*br)); // transposed grid
                let mut ts = vec![0f32; sr * sc]; // [ceil(kv_lora / bc), ceil(nope / br)]
                for i in 0..sr {
                    for j in 0..sc {
                        ts[i * sc + j] = scale_inv[(base / br + j) * ncb + i];
                    }
                }
                (Matrix::from_fp8(kv_lora, nope, t, ts, *bc, *br), None)
            }
            MatrixData::Fp8 { .. } => {
                let mut full = vec![0f32; (nope + v) * kv_lora]; // [nope + v, kv_lora]
                for r in 0..nope + v {
                    matrix_row_f32(kv_b, base + r, &mut full[r * kv_lora..(r + 1) * kv_lora]);
                }
                let t = transpose(&full, nope, kv_lora);
                let w = full[nope * kv_lora..].to_vec(); // [v, kv_lora]
                (
                    Matrix::from_f32(kv_lora, nope, t),
                    Some(Matrix::from_f32(v, kv_lora, w)),
                )
            }
            MatrixData::Bf16Strips(_) => unreachable!("absorbed from the row-major copy"),
        };
        uk.push(k.with_cache_resident(kv_b.cache_resident()));
        uv.push(u.unwrap_or_else(|| kv_b.rows_view(base + nope, v)));
    }
    (uk, uv)
}

/// The first `rows` rows of `src` ([rows, cols] row-major) transposed: [cols, rows].
fn transpose<T: Copy + Default>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::default(); rows * cols]; // [cols, rows]
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = src[r * cols + c];
        }
    }
    t
}

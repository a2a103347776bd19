//! Fuzz entry points `safetensors` and `sharded`: checkpoint bytes -> `WeightStore` (header
//! validation) -> every tensor view -> `check_tensor_set` against a fixed tiny config ->
//! `Model::load` -> one forward over three tokens (two on the MHA path, one absorbed). Also the
//! generator of the seed checkpoints the corpus starts from (`seed_checkpoint`, `seed_index`).
//!
//! Input layout: byte 0 picks the fixed config (low 7 bits modulo [`FIXED_CONFIGS`]: 0 = V2-style
//! dense with `q_proj`, tied embeddings, f32 / bf16 / f16 weights; 1 = V3 MoE (noaux_tc) with
//! q-LoRA, 2x2 block-fp8 weights, YaRN and one MTP layer; 2 = V3 MoE (group-limited softmax
//! routing, no shared expert) with `q_proj`, tied embeddings and 4x3 fp8 blocks that split a head
//! of `kv_b_proj`; 3 = V3 MoE with 32 experts in 4 groups; 4 = V3.2 with the lightning indexer
//! and index_topk 1, so both attention paths run sparse; 5 = DeepSeek-V4 with every layer type,
//! hash + top-k MoE and hyper-connections); the rest is one `model.safetensors` (`safetensors`), or a
//! `model.safetensors.index.json` followed by shards, each introduced by [`SHARD_SEPARATOR`] and
//! named `model-0000{i}.safetensors` from 1 (`sharded`).

use std::collections::HashSet;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::dtype::f32_to_fp8;
use crate::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use crate::model::{LogitsMode, Model, SeqChunk};
use crate::weights::{
    check_tensor_set, expected_tensor_shapes, quantize_blocks, scale_inv_name, WeightSource,
    WeightStore,
};

/// Separates the index and the shards of a `sharded` input.
pub const SHARD_SEPARATOR: &[u8] = b"\n--shard--\n";

const DENSE_CONFIG: &str = r#"{"model_type":"deepseek_v2","vocab_size":8,"hidden_size":4,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":1,"q_lora_rank":null,
"kv_lora_rank":2,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2,
"max_position_embeddings":16,"tie_word_embeddings":true,"eos_token_id":1}"#;

const MOE_FP8_CONFIG: &str = r#"{"model_type":"deepseek_v3","vocab_size":8,"hidden_size":4,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":2,"q_lora_rank":2,
"kv_lora_rank":2,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2,
"max_position_embeddings":16,"n_routed_experts":2,"n_shared_experts":1,"num_experts_per_tok":1,
"n_group":1,"topk_group":1,"moe_intermediate_size":2,"first_k_dense_replace":0,
"num_nextn_predict_layers":1,"rope_scaling":{"type":"yarn","factor":2.0,
"original_max_position_embeddings":8,"mscale":1.0,"mscale_all_dim":1.0},
"quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[2,2]}}"#;

const MOE_ODD_FP8_CONFIG: &str = r#"{"model_type":"deepseek_v3","vocab_size":8,"hidden_size":4,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":2,"q_lora_rank":null,
"kv_lora_rank":2,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2,
"max_position_embeddings":16,"n_routed_experts":4,"n_shared_experts":0,"num_experts_per_tok":2,
"n_group":2,"topk_group":1,"topk_method":"group_limited_greedy","scoring_func":"softmax",
"moe_intermediate_size":2,"first_k_dense_replace":0,"tie_word_embeddings":true,
"quantization_config":{"quant_method":"fp8","fmt":"e4m3","weight_block_size":[4,3]}}"#;

const MOE_32_CONFIG: &str = r#"{"model_type":"deepseek_v3","vocab_size":8,"hidden_size":4,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":1,"q_lora_rank":2,
"kv_lora_rank":2,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2,
"max_position_embeddings":16,"n_routed_experts":32,"n_shared_experts":1,"num_experts_per_tok":4,
"n_group":4,"topk_group":2,"moe_intermediate_size":2,"first_k_dense_replace":0}"#;

/// DeepSeek-V3.2 with an index_topk of 1: of the forward's three tokens the last two attend to
/// one key each, on both the MHA and the absorbed path (index keys and selection fuzzed too).
const V32_CONFIG: &str = r#"{"model_type":"deepseek_v32","vocab_size":8,"hidden_size":4,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":1,"q_lora_rank":2,
"kv_lora_rank":2,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2,
"max_position_embeddings":16,"index_n_heads":2,"index_head_dim":2,"index_topk":1}"#;

/// DeepSeek-V4 with every layer type (CSA rate 2 with index_topk 1, HCA rate 4, sliding window
/// 2), hash + top-k MoE and two hyper-connection streams: the V4 loader (tid2eid, both namings'
/// lookups, compressors) and its forward fuzzed too.
const V4_CONFIG: &str = r#"{"model_type":"deepseek_v4","vocab_size":8,"hidden_size":4,
"moe_intermediate_size":2,"num_hidden_layers":3,"num_attention_heads":2,"head_dim":4,
"partial_rotary_factor":0.5,"q_lora_rank":2,"o_groups":2,"o_lora_rank":2,"sliding_window":2,
"layer_types":["compressed_sparse_attention","heavily_compressed_attention","sliding_attention"],
"compress_rates":{"compressed_sparse_attention":2,"heavily_compressed_attention":4},
"mlp_layer_types":["hash_moe","moe","moe"],"index_n_heads":2,"index_head_dim":2,"index_topk":1,
"hc_mult":2,"n_routed_experts":2,"num_experts_per_tok":1,"max_position_embeddings":16,
"num_nextn_predict_layers":0}"#;

/// Number of fixed configs (`selector % FIXED_CONFIGS`).
pub const FIXED_CONFIGS: u8 = 6;

/// The fixed config byte `selector` picks (see the module doc).
fn fixed_config(selector: u8) -> ModelConfig {
    let text = match (selector & 0x7F) % FIXED_CONFIGS {
        0 => DENSE_CONFIG,
        1 => MOE_FP8_CONFIG,
        2 => MOE_ODD_FP8_CONFIG,
        3 => MOE_32_CONFIG,
        4 => V32_CONFIG,
        _ => V4_CONFIG,
    };
    ModelConfig::from_json_str(text).expect("the fuzz harness's fixed configs are valid")
}

fn split_selector(data: &[u8]) -> Result<(ModelConfig, &[u8])> {
    match data.split_first() {
        Some((&sel, rest)) => Ok((fixed_config(sel), rest)),
        None => Err(Error::InvalidArgument("empty fuzz input".into())),
    }
}

/// See the module doc.
pub fn safetensors(data: &[u8]) -> Result<()> {
    let (cfg, rest) = split_selector(data)?;
    let bytes = if data[0] & 0x80 != 0 {
        edit_seed(data[0], rest)?
    } else {
        rest.to_vec()
    };
    let store = WeightStore::open(WeightSource::Bytes(bytes))?;
    exercise_store(cfg, &store)
}

/// Values an edit writes into a tensor (each converted to the tensor's dtype, saturating for
/// fp8): NaN, infinities, the f32 extremes, a subnormal, zeros, fp8's largest, a big activation.
const SPECIAL_VALUES: [f32; 10] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::MIN,
    1e-40,
    0.0,
    -0.0,
    448.0,
    1e4,
];

/// Bounds of an edit script: edits applied, elements of a resized tensor (the seeds' largest
/// tensor has 32).
const MAX_EDITS: usize = 64;
const MAX_EDIT_NUMEL: usize = 1 << 12;

/// The seed checkpoint of config `selector` with the edits of `script` applied, serialised.
/// Each edit is 4 bytes `[op, tensor, arg, pos]` (tensor and pos taken modulo what exists; at
/// most [`MAX_EDITS`], shapes of at most [`MAX_EDIT_NUMEL`] elements):
/// 0 re-encode in another float dtype, 1 relabel as an integer / bool dtype of the same width,
/// 2 resize one dimension (new values), 3 add or drop a dimension, 4 delete the tensor,
/// 5 copy it under a related name (another layer, an MTP layer, a `_scale_inv` sibling, an
/// ignorable buffer), 6 write a special value at one element, 7 fill it with a special value.
pub fn edit_seed(selector: u8, script: &[u8]) -> Result<Vec<u8>> {
    let mut tensors = seed_tensors(selector);
    for e in script.chunks(4).take(MAX_EDITS) {
        let [op, t, arg, pos] = [0, 1, 2, 3].map(|i| e.get(i).copied().unwrap_or(0));
        if tensors.is_empty() {
            break;
        }
        let i = t as usize % tensors.len();
        let (name, dt, shape, bytes) = &mut tensors[i];
        match op % 8 {
            0 => {
                let vals = decode(*dt, bytes);
                *dt = FLOATS[arg as usize % FLOATS.len()];
                *bytes = encode(*dt, &vals);
            }
            1 => {
                use safetensors::Dtype as D;
                *dt = match (dt.bitsize(), arg % 2) {
                    (32, 0) => D::I32,
                    (32, _) => D::U32,
                    (16, 0) => D::I16,
                    (16, _) => D::U16,
                    (8, 0) => D::U8,
                    (8, _) => D::BOOL,
                    _ => *dt,
                };
                if *dt == D::BOOL {
                    bytes.iter_mut().for_each(|b| *b &= 1);
                }
            }
            2 | 3 => {
                let mut new_shape = shape.clone();
                if op % 8 == 2 && !new_shape.is_empty() {
                    let d = arg as usize % new_shape.len();
                    new_shape[d] = pos as usize % 9;
                } else if arg % 2 == 0 {
                    new_shape.push(1 + pos as usize % 3);
                } else {
                    new_shape.pop();
                }
                let numel = new_shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if let Some(numel) = numel.filter(|&n| n <= MAX_EDIT_NUMEL) {
                    *shape = new_shape;
                    *bytes = encode(*dt, &weight_values(numel, pos as usize));
                }
            }
            4 => {
                tensors.remove(i);
            }
            5 => {
                let new_name = related_name(name, arg);
                let copy = (new_name, *dt, shape.clone(), bytes.clone());
                tensors.retain(|x| x.0 != copy.0);
                tensors.push(copy);
            }
            _ => {
                let mut vals = decode(*dt, bytes);
                let v = SPECIAL_VALUES[arg as usize % SPECIAL_VALUES.len()];
                if op % 8 == 6 {
                    let at = pos as usize % vals.len().max(1);
                    if let Some(x) = vals.get_mut(at) {
                        *x = v;
                    }
                } else {
                    vals.iter_mut().for_each(|x| *x = v);
                }
                if FLOATS.contains(dt) {
                    *bytes = encode(*dt, &vals);
                }
            }
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    serialize(&tensors).map_err(|e| Error::InvalidArgument(format!("edited seed: {e}")))
}

const FLOATS: [safetensors::Dtype; 4] = [
    safetensors::Dtype::F32,
    safetensors::Dtype::BF16,
    safetensors::Dtype::F16,
    safetensors::Dtype::F8_E4M3,
];

/// A name near `name`: another layer index, the MTP layer, a scale sibling, an ignorable
/// buffer, a name outside the model.
fn related_name(name: &str, arg: u8) -> String {
    match arg % 6 {
        0 => name.replacen("layers.0.", "layers.1.", 1),
        1 => name.replacen("layers.0.", "layers.7.", 1),
        2 => scale_inv_name(name),
        3 => format!("{name}.rotary_emb.inv_freq"),
        4 => name.replacen(".weight", ".bias", 1),
        _ => format!("extra.{name}"),
    }
}

/// Values of raw little-endian tensor bytes (non-float dtypes: their bytes as small numbers).
fn decode(dt: safetensors::Dtype, bytes: &[u8]) -> Vec<f32> {
    use safetensors::Dtype as D;
    match dt {
        D::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        D::BF16 => bytes
            .chunks_exact(2)
            .map(|b| crate::weights::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        D::F16 => bytes
            .chunks_exact(2)
            .map(|b| crate::weights::f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        D::F8_E4M3 => bytes
            .iter()
            .map(|&b| crate::weights::fp8_e4m3_to_f32(b))
            .collect(),
        _ => bytes.iter().map(|&b| b as f32).collect(),
    }
}

/// Little-endian bytes of `vals` in float dtype `dt` (other dtypes: one byte per value).
fn encode(dt: safetensors::Dtype, vals: &[f32]) -> Vec<u8> {
    use safetensors::Dtype as D;
    match dt {
        D::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        D::BF16 => vals
            .iter()
            .flat_map(|&x| crate::weights::f32_to_bf16(x).to_le_bytes())
            .collect(),
        D::F16 => vals
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
            .collect(),
        D::F8_E4M3 => vals.iter().map(|&x| f32_to_fp8(x)).collect(),
        _ => vals.iter().map(|&x| x as u8).collect(),
    }
}

/// See the module doc.
pub fn sharded(data: &[u8]) -> Result<()> {
    let (cfg, rest) = split_selector(data)?;
    let mut parts = split(rest, SHARD_SEPARATOR).into_iter();
    let index = parts.next().unwrap_or_default();
    let shards = parts
        .enumerate()
        .map(|(i, b)| (format!("model-{:05}.safetensors", i + 1), b.to_vec()))
        .collect();
    let store = WeightStore::open_index_bytes(index, shards)?;
    exercise_store(cfg, &store)
}

fn split<'a>(mut data: &'a [u8], sep: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    while let Some(i) = data.windows(sep.len()).position(|w| w == sep) {
        out.push(&data[..i]);
        data = &data[i + sep.len()..];
    }
    out.push(data);
    out
}

/// Views, tensor-set check, model build and one forward (every step must fail typed or pass).
fn exercise_store(cfg: ModelConfig, store: &WeightStore) -> Result<()> {
    let mut total = 0;
    for name in store.names() {
        let v = store.get(name).expect("a listed name has a view");
        if let Some(size) = v.dtype.size_bytes() {
            let numel: usize = v.shape.iter().product();
            assert_eq!(v.data.len(), numel * size, "tensor `{name}`: byte size");
        }
        total += v.data.len();
    }
    assert_eq!(total, store.total_bytes());
    check_tensor_set(&cfg, store)?;
    let model = Model::load(cfg, store)?;
    let c = &model.config;
    let mut kv = KvCache::new(KvConfig::for_model(c, 4, 2, KvDtype::F32))?;
    let mut seq = SeqKv::new();
    let tokens = [0, c.vocab_size as u32 - 1, 1];
    let plan = kv.plan_grow(&seq, tokens.len())?;
    kv.commit_grow(&mut seq, plan);
    let logits = model.forward(
        &mut kv,
        &[SeqChunk {
            kv: &seq,
            start: 0,
            tokens: &tokens,
            mha_until: 2,
            logits: LogitsMode::All,
        }],
    );
    kv.free(&mut seq);
    assert_eq!(logits?.len(), tokens.len() * c.vocab_size); // [3, vocab]
    Ok(())
}

/// Deterministic small weights: [-0.5, 0.5) in steps of 1/16.
fn weight_values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + salt * 11) % 17) as f32 / 16.0 - 0.5)
        .collect()
}

/// One tensor to write: (name, dtype, shape, little-endian bytes).
type SeedTensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Every tensor of a valid checkpoint for fixed config `selector` (its MTP layer included), in
/// name order.
fn seed_tensors(selector: u8) -> Vec<SeedTensor> {
    use safetensors::Dtype as D;
    let cfg = fixed_config(selector);
    if let Some(v) = &cfg.v4 {
        let mut out: Vec<SeedTensor> = crate::model::v4_tensor_shapes(&cfg)
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let numel: usize = shape.iter().product();
                if name.ends_with("tid2eid") {
                    let ids =
                        (0..numel).flat_map(|j| ((j % v.n_routed_experts) as i64).to_le_bytes());
                    return (name, D::I64, shape, ids.collect());
                }
                let w = if name.contains("norm") {
                    vec![1.0; numel]
                } else {
                    weight_values(numel, i)
                };
                let dt = FLOATS[i % 3];
                let bytes = encode(dt, &w);
                (name, dt, shape, bytes)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        return out;
    }
    let mut shapes = expected_tensor_shapes(&cfg);
    if cfg.num_nextn_predict_layers > 0 {
        let (l, h, v) = (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size);
        let mut two = cfg.clone();
        two.num_hidden_layers = l + 1;
        let p = format!("model.layers.{l}.");
        shapes.extend(
            expected_tensor_shapes(&two)
                .into_iter()
                .filter(|(n, _)| n.starts_with(&p)),
        );
        for (n, s) in [
            ("enorm.weight", vec![h]),
            ("hnorm.weight", vec![h]),
            ("eh_proj.weight", vec![h, 2 * h]),
            ("shared_head.norm.weight", vec![h]),
            ("shared_head.head.weight", vec![v, h]),
        ] {
            shapes.push((format!("{p}{n}"), s));
        }
    }
    let names: HashSet<String> = shapes.iter().map(|(n, _)| n.clone()).collect();
    let mut out = Vec::new();
    for (i, (name, shape)) in shapes.iter().enumerate() {
        if name.ends_with("_scale_inv") {
            continue; // written with their weight
        }
        let numel: usize = shape.iter().product();
        let w = if name.contains("norm") {
            vec![1.0; numel]
        } else {
            weight_values(numel, i)
        };
        let (q, dims) = (cfg.quantization, shape.as_slice());
        match (q, dims) {
            (Some(q), &[rows, cols]) if names.contains(&scale_inv_name(name)) => {
                let (bytes, scales) = if q.block_rows == q.block_cols {
                    quantize_blocks(&w, rows, cols, q.block_rows)
                } else {
                    let n = rows.div_ceil(q.block_rows) * cols.div_ceil(q.block_cols);
                    (w.iter().map(|&x| f32_to_fp8(x)).collect(), vec![1.0; n])
                };
                out.push((name.clone(), D::F8_E4M3, shape.clone(), bytes));
                let sshape = vec![rows.div_ceil(q.block_rows), cols.div_ceil(q.block_cols)];
                let sbytes = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
                out.push((scale_inv_name(name), D::F32, sshape, sbytes));
            }
            _ => {
                // Spread the float dtypes over the tensors so each decoder is reached.
                let dt = FLOATS[i % 3];
                out.push((name.clone(), dt, shape.clone(), encode(dt, &w)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn serialize(tensors: &[SeedTensor]) -> std::result::Result<Vec<u8>, safetensors::SafeTensorError> {
    let mut views = Vec::with_capacity(tensors.len());
    for (n, dt, shape, bytes) in tensors {
        views.push((
            n.clone(),
            safetensors::tensor::TensorView::new(*dt, shape.clone(), bytes)?,
        ));
    }
    safetensors::serialize(views, None)
}

/// A valid `model.safetensors` for fixed config `selector` (the `safetensors` seed is
/// `[selector] + this`).
pub fn seed_checkpoint(selector: u8) -> Vec<u8> {
    serialize(&seed_tensors(selector)).expect("seed checkpoint serialises")
}

/// A valid `sharded` input for fixed config `selector` with `n_shards` shards (the tensors dealt
/// round-robin).
pub fn seed_index(selector: u8, n_shards: usize) -> Vec<u8> {
    let n_shards = n_shards.max(1);
    let tensors = seed_tensors(selector);
    let mut shards: Vec<Vec<SeedTensor>> = vec![Vec::new(); n_shards];
    let mut map = serde_json::Map::new();
    for (i, t) in tensors.into_iter().enumerate() {
        let file = format!("model-{:05}.safetensors", i % n_shards + 1);
        map.insert(t.0.clone(), serde_json::Value::String(file));
        shards[i % n_shards].push(t);
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    let mut out = vec![selector];
    out.extend_from_slice(index.to_string().as_bytes());
    for s in &shards {
        out.extend_from_slice(SHARD_SEPARATOR);
        out.extend_from_slice(&serialize(s).expect("seed shard serialises"));
    }
    out
}

//! The benchmark model: a DeepSeek-V2-Lite-shaped MLA + MoE checkpoint with random bf16 weights,
//! written by the bench itself as a real `config.json` + `model.safetensors` into a scratch
//! directory and then loaded like any checkpoint (`Model::load_dir`), so the bench measures the
//! real load and forward paths.
//!
//! Also: the config-derived cost model the bench reports against (active parameters per token,
//! prefill FLOPs, decode weight bytes), independent of `Model`'s own byte count so the two can be
//! compared.
//!
//! Guarantees: the safetensors header is complete and contiguous (tensors in
//! `expected_tensor_shapes` order), the weights are a deterministic function of the seed, and the
//! whole file is streamed (never held in memory at once).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use specmla::config::ModelConfig;
use specmla::weights::expected_tensor_shapes;
use specmla::{Error, Result};

/// Shape of the random benchmark model (attention dims are V2-Lite's and fixed).
#[derive(Clone, Copy, Debug)]
pub struct BenchModelSpec {
    pub vocab_size: usize,
    /// Layer 0 is dense (intermediate 10944), the rest MoE.
    pub num_layers: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub intermediate_size: usize,
}

impl BenchModelSpec {
    /// Default bench model: 3 layers (1 dense + 2 MoE with 16 routed experts, top-6, 2 shared),
    /// vocab 8192: about 450M parameters, about 0.9 GB of bf16 weights.
    pub fn standard() -> Self {
        BenchModelSpec {
            vocab_size: 8192,
            num_layers: 3,
            n_routed_experts: 16,
            num_experts_per_tok: 6,
            n_shared_experts: 2,
            moe_intermediate_size: 1408,
            intermediate_size: 10944,
        }
    }

    /// `--quick`: 2 layers (1 dense + 1 MoE): about 280M parameters, 0.56 GB.
    pub fn quick() -> Self {
        BenchModelSpec {
            num_layers: 2,
            ..Self::standard()
        }
    }

    /// The config.json of this model (DeepSeek-V2-Lite attention: hidden 2048, 16 heads,
    /// kv_lora_rank 512, rope 64, nope 128, v 128, q_lora_rank null).
    pub fn config_json(&self) -> Value {
        json!({
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "vocab_size": self.vocab_size,
            "hidden_size": 2048,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "q_lora_rank": null,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "topk_method": "greedy",
            "scoring_func": "softmax",
            "norm_topk_prob": false,
            "routed_scaling_factor": 1.0,
            "n_group": 1,
            "topk_group": 1,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16"
        })
    }
}

impl BenchModelSpec {
    /// A DeepSeek-V3.2-shaped config (`indexer`) or its V3 twin without the indexer: V3.2's
    /// attention per layer (128 heads, q_lora_rank 1536, kv_lora_rank 512, rope 64, nope 128,
    /// v 128) and indexer (64 index heads of 128 dims, index_topk 2048) at their real sizes, so
    /// the indexer's share of a decode step is V3.2's; hidden 2048 and the small MoE above;
    /// V3's router (noaux_tc, sigmoid); 16384 positions.
    pub fn v32_config_json(&self, indexer: bool) -> Value {
        let mut c = self.config_json();
        c["architectures"] = json!([if indexer {
            "DeepseekV32ForCausalLM"
        } else {
            "DeepseekV3ForCausalLM"
        }]);
        c["model_type"] = json!(if indexer {
            "deepseek_v32"
        } else {
            "deepseek_v3"
        });
        c["q_lora_rank"] = json!(1536);
        c["num_attention_heads"] = json!(128);
        c["num_key_value_heads"] = json!(128);
        c["max_position_embeddings"] = json!(16384);
        c["topk_method"] = json!("noaux_tc");
        c["scoring_func"] = json!("sigmoid");
        c["norm_topk_prob"] = json!(true);
        c["routed_scaling_factor"] = json!(2.5);
        if indexer {
            c["index_n_heads"] = json!(64);
            c["index_head_dim"] = json!(128);
            c["index_topk"] = json!(2048);
        }
        c
    }
}

impl BenchModelSpec {
    /// A DeepSeek-V4-shaped config of the same hidden size (2048) and MoE sizes as the V3 / V3.2
    /// bench models: V4-Flash attention per layer at its real widths (32 heads of 512 with one
    /// shared K=V head, rope 64, q_lora_rank 1024, o_groups 4 x o_lora_rank 1024, sliding window
    /// 128, attention sinks), layers alternating CSA (rate 4, 64 index heads x 128, index_topk
    /// 512) and HCA (rate 128), hc_mult 4, the first layer hash-routed, sqrtsoftplus scores.
    pub fn v4_config_json(&self) -> Value {
        let layers = self.num_layers;
        json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab_size,
            "hidden_size": 2048,
            "num_hidden_layers": layers,
            "num_attention_heads": 32,
            "num_key_value_heads": 1,
            "head_dim": 512,
            "partial_rotary_factor": 0.125,
            "q_lora_rank": 1024,
            "o_groups": 4,
            "o_lora_rank": 1024,
            "sliding_window": 128,
            "layer_types": (0..layers).map(|i| if i % 2 == 0 {
                "compressed_sparse_attention"
            } else {
                "heavily_compressed_attention"
            }).collect::<Vec<_>>(),
            "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            "mlp_layer_types": (0..layers).map(|i| if i == 0 { "hash_moe" } else { "moe" }).collect::<Vec<_>>(),
            "index_n_heads": 64,
            "index_head_dim": 128,
            "index_topk": 512,
            "hc_mult": 4,
            "hc_sinkhorn_iters": 20,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "scoring_func": "sqrtsoftplus",
            "routed_scaling_factor": 1.5,
            "swiglu_limit": 10.0,
            "max_position_embeddings": 1048576,
            "rope_theta": 10000.0,
            "compress_rope_theta": 160000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16"
        })
    }
}

/// Cheap deterministic generator (xorshift64*): four bf16 weights per draw.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// bf16 bits from 16 random bits: random sign and 7-bit mantissa, exponent in 2^-8..2^-5, so
/// |w| lies in [0.004, 0.0625) with mean about 0.02.
fn random_bf16(r: u16) -> u16 {
    let sign = r & 0x8000;
    let mant = r & 0x7f;
    let exp = 119 + ((r >> 7) & 3);
    sign | (exp << 7) | mant
}

const BF16_ONE: u16 = 0x3f80;

/// Write config.json + model.safetensors for `config` into `dir` (created); returns bytes written.
/// Norm weights are 1, everything else random bf16 from `seed`.
pub fn write_random_checkpoint(dir: &Path, config: &Value, seed: u64) -> Result<usize> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| Error::Io {
            path: p.clone(),
            source: e,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cfg_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| Error::InvalidArgument(format!("config: {e}")))?;
    std::fs::write(&cfg_path, text).map_err(io(&cfg_path))?;
    let cfg = ModelConfig::from_file(&cfg_path)?;
    let tensors = if cfg.v4.is_some() {
        specmla::model::v4_tensor_shapes(&cfg)
    } else {
        expected_tensor_shapes(&cfg) // [(name, shape)] in load order
    };
    let is_index = |name: &str| name.ends_with("tid2eid");
    // Header: contiguous data_offsets in the same order.
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for (name, shape) in &tensors {
        let (dtype, width) = if is_index(name) {
            ("I64", 8)
        } else {
            ("BF16", 2)
        };
        let bytes = shape.iter().product::<usize>() * width;
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + bytes]}),
        );
        off += bytes;
    }
    let mut hbytes = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| Error::InvalidArgument(format!("header: {e}")))?;
    while hbytes.len() % 8 != 0 {
        hbytes.push(b' ');
    }
    let st_path = dir.join("model.safetensors");
    let file = File::create(&st_path).map_err(io(&st_path))?;
    let mut w = BufWriter::with_capacity(1 << 23, file);
    w.write_all(&(hbytes.len() as u64).to_le_bytes())
        .map_err(io(&st_path))?;
    w.write_all(&hbytes).map_err(io(&st_path))?;
    let mut rng = XorShift(seed | 1);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 22); // [chunk_values * 2] bf16 bytes
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        if is_index(name) {
            // hash routing table [vocab, k]: k distinct experts per token
            let (k, experts) = (shape[1], cfg.v4.as_ref().map_or(1, |v| v.n_routed_experts));
            buf.clear();
            for t in 0..shape[0] {
                for j in 0..k {
                    buf.extend_from_slice(
                        &(((t * 7 + j * (experts / k).max(1)) % experts) as i64).to_le_bytes(),
                    );
                }
            }
            w.write_all(&buf).map_err(io(&st_path))?;
            continue;
        }
        let is_norm = name.ends_with("layernorm.weight")
            || name.ends_with("k_norm.weight")
            || name.ends_with("norm.weight")
            || name == "model.norm.weight";
        let mut left = n;
        while left > 0 {
            let m = left.min(1 << 21);
            buf.clear();
            if is_norm {
                for _ in 0..m {
                    buf.extend_from_slice(&BF16_ONE.to_le_bytes());
                }
            } else {
                let mut i = 0;
                while i < m {
                    let r = rng.next();
                    for j in 0..4.min(m - i) {
                        buf.extend_from_slice(&random_bf16((r >> (16 * j)) as u16).to_le_bytes());
                    }
                    i += 4;
                }
            }
            w.write_all(&buf).map_err(io(&st_path))?;
            left -= m;
        }
    }
    w.flush().map_err(io(&st_path))?;
    Ok(8 + hbytes.len() + off)
}

/// A scratch directory that is removed when dropped.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    /// `<base>/specmla-bench-<pid>-<tag>`.
    pub fn new(base: &Path, tag: &str) -> Self {
        ScratchDir(base.join(format!("specmla-bench-{}-{tag}", std::process::id())))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Config-derived costs of one token (counts of weights; bytes assume `weight_bytes` per weight,
/// routers and norms f32 as the engine holds them).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenCosts {
    /// Every stored parameter.
    pub total_params: usize,
    /// Parameters one decode token multiplies by (top-k + shared experts, lm_head, no embedding).
    pub active_params: usize,
    /// The lm_head part of `active_params`.
    pub lm_head_params: usize,
    /// Weight bytes one batch-1 decode step reads.
    pub decode_weight_bytes: usize,
}

/// Attention weights of one layer (q or q-LoRA, kv_a, kv_b, o). The absorbed decode path reads
/// W_UK^T and W_UV instead of kv_b: the same number of weights.
fn attn_params(c: &ModelConfig) -> usize {
    let (h, nh) = (c.hidden_size, c.num_attention_heads);
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    let q = match c.q_lora_rank {
        Some(r) => r * h + nh * qk * r,
        None => nh * qk * h,
    };
    q + (c.kv_lora_rank + c.qk_rope_head_dim) * h
        + nh * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank
        + h * nh * c.v_head_dim
}

/// V3.2 indexer matrices of one layer: (wq_b + wk in the stored precision, weights_proj kept f32).
fn indexer_params(c: &ModelConfig) -> (usize, usize) {
    match (c.indexer, c.q_lora_rank) {
        (Some(ix), Some(r)) => (
            ix.n_heads * ix.head_dim * r + ix.head_dim * c.hidden_size,
            ix.n_heads * c.hidden_size,
        ),
        _ => (0, 0),
    }
}

/// Costs of a token from the config alone.
pub fn token_costs(c: &ModelConfig, weight_bytes: usize) -> TokenCosts {
    let h = c.hidden_size;
    let lm = c.vocab_size * h;
    let mut total = c.vocab_size * h + h + if c.tie_word_embeddings { 0 } else { lm };
    let mut active = lm;
    let mut bytes = lm * weight_bytes + h * 4;
    for layer in 0..c.num_hidden_layers {
        let a = attn_params(c);
        let q_norm = c.q_lora_rank.unwrap_or(0);
        let (ix_mat, ix_f32) = indexer_params(c);
        let ix_norm = c.indexer.map_or(0, |i| 2 * i.head_dim);
        total += a + 2 * h + c.kv_lora_rank + q_norm + ix_mat + ix_f32 + ix_norm;
        active += a + ix_mat + ix_f32;
        bytes += (a + ix_mat) * weight_bytes + ix_f32 * 4;
        match (&c.moe, c.is_moe_layer(layer)) {
            (Some(m), true) => {
                let e = 3 * h * m.moe_intermediate_size;
                let router = m.n_routed_experts * h;
                let bias = if matches!(m.topk_method, specmla::config::TopkMethod::NoauxTc) {
                    m.n_routed_experts
                } else {
                    0
                };
                total += e * (m.n_routed_experts + m.n_shared_experts) + router + bias;
                active += e * (m.num_experts_per_tok + m.n_shared_experts) + router;
                bytes +=
                    e * (m.num_experts_per_tok + m.n_shared_experts) * weight_bytes + router * 4;
            }
            _ => {
                let d = 3 * h * c.intermediate_size;
                total += d;
                active += d;
                bytes += d * weight_bytes;
            }
        }
    }
    TokenCosts {
        total_params: total,
        active_params: active,
        lm_head_params: lm,
        decode_weight_bytes: bytes,
    }
}

/// Model FLOPs of prefilling `len` tokens in one chunk: 2 x (active params without lm_head) per
/// token, lm_head for the last token only, and causal attention (q.k over rope+nope, p.v) per
/// head per layer: 2 x (qk + v) x len (len + 1) / 2.
pub fn prefill_flops(c: &ModelConfig, costs: &TokenCosts, len: usize) -> f64 {
    let per_tok = 2.0 * (costs.active_params - costs.lm_head_params) as f64;
    let qk = (c.qk_nope_head_dim + c.qk_rope_head_dim) as f64;
    let attn = c.num_hidden_layers as f64
        * c.num_attention_heads as f64
        * 2.0
        * (qk + c.v_head_dim as f64)
        * (len * (len + 1) / 2) as f64;
    per_tok * len as f64 + 2.0 * costs.lm_head_params as f64 + attn
}

#[cfg(test)]
mod tests {
    use super::*;
    use specmla::model::Model;

    fn tiny() -> BenchModelSpec {
        BenchModelSpec {
            vocab_size: 64,
            num_layers: 2,
            n_routed_experts: 4,
            num_experts_per_tok: 2,
            n_shared_experts: 1,
            moe_intermediate_size: 16,
            intermediate_size: 48,
        }
    }

    #[test]
    fn random_bf16_stays_in_range() {
        for r in [0u16, 1, 0x7f, 0x8000, 0xffff, 0x1234, 0xabcd] {
            let v = f32::from_bits((random_bf16(r) as u32) << 16).abs();
            assert!((0.0039..0.0625).contains(&v), "{r:#x} -> {v}");
        }
    }

    #[test]
    fn written_checkpoint_loads_and_matches_the_cost_model() {
        let dir = ScratchDir::new(&std::env::temp_dir(), "unit-test-model");
        let mut cfg = tiny().config_json();
        // keep V2-Lite's attention shape but small
        cfg["hidden_size"] = json!(64);
        cfg["num_attention_heads"] = json!(2);
        cfg["num_key_value_heads"] = json!(2);
        cfg["kv_lora_rank"] = json!(32);
        cfg["qk_nope_head_dim"] = json!(16);
        cfg["qk_rope_head_dim"] = json!(8);
        cfg["v_head_dim"] = json!(16);
        let bytes = write_random_checkpoint(&dir.0, &cfg, 7).unwrap();
        let model = Model::load_dir(&dir.0).unwrap();
        let costs = token_costs(&model.config, 2);
        assert_eq!(costs.total_params, model.num_params());
        assert_eq!(costs.decode_weight_bytes, model.decode_bytes_per_token());
        // One token's work split for the roofline with FLOPs: every active parameter is one
        // multiply-add (the final norm's weights one each too); the routed part is the top-k
        // experts of the MoE layers, two bytes per bf16 weight.
        let w = model.decode_work_per_token();
        let c = &model.config;
        assert_eq!(w.bytes(), model.decode_bytes_per_token());
        assert_eq!(
            w.every_token.macs + w.routed.macs,
            costs.active_params + c.hidden_size
        );
        let m = c.moe.as_ref().expect("MoE config");
        let moe_layers = (0..c.num_hidden_layers)
            .filter(|&l| c.is_moe_layer(l))
            .count();
        assert!(moe_layers > 0);
        let expert = 3 * c.hidden_size * m.moe_intermediate_size;
        assert_eq!(w.routed.macs, moe_layers * m.num_experts_per_tok * expert);
        assert_eq!(w.routed.bytes, 2 * w.routed.macs);
        // file = 8-byte length + header + 2 bytes per parameter
        assert!(bytes > model.num_params() * 2 && bytes < model.num_params() * 2 + 65536);
        // the same seed gives the same file
        let first = std::fs::read(dir.0.join("model.safetensors")).unwrap();
        write_random_checkpoint(&dir.0, &cfg, 7).unwrap();
        assert_eq!(
            first,
            std::fs::read(dir.0.join("model.safetensors")).unwrap()
        );
    }

    #[test]
    fn v32_checkpoint_loads_and_counts_the_indexer() {
        let dir = ScratchDir::new(&std::env::temp_dir(), "unit-test-v32");
        let mut cfg = tiny().v32_config_json(true);
        cfg["hidden_size"] = json!(64);
        cfg["num_attention_heads"] = json!(2);
        cfg["num_key_value_heads"] = json!(2);
        cfg["q_lora_rank"] = json!(24);
        cfg["kv_lora_rank"] = json!(32);
        cfg["qk_nope_head_dim"] = json!(16);
        cfg["qk_rope_head_dim"] = json!(8);
        cfg["v_head_dim"] = json!(16);
        cfg["index_n_heads"] = json!(3);
        cfg["index_head_dim"] = json!(16);
        cfg["index_topk"] = json!(4);
        write_random_checkpoint(&dir.0, &cfg, 3).unwrap();
        let model = Model::load_dir(&dir.0).unwrap();
        assert!(model.config.indexer.is_some());
        let costs = token_costs(&model.config, 2);
        assert_eq!(costs.total_params, model.num_params());
        assert_eq!(costs.decode_weight_bytes, model.decode_bytes_per_token());
        // the twin without the indexer has exactly the indexer's parameters fewer
        let twin = ModelConfig::from_json_str(&{
            let mut c = cfg.clone();
            c["model_type"] = json!("deepseek_v3");
            for k in ["index_n_heads", "index_head_dim", "index_topk"] {
                c.as_object_mut().unwrap().remove(k);
            }
            c.to_string()
        })
        .unwrap();
        let ix = 2 * (3 * 16 * 24 + 16 * 64 + 3 * 64 + 2 * 16); // per layer, 2 layers
        assert_eq!(token_costs(&twin, 2).total_params + ix, costs.total_params);
    }

    #[test]
    fn standard_bench_model_is_in_the_asked_range() {
        let cfg = ModelConfig::from_json_str(&BenchModelSpec::standard().config_json().to_string())
            .unwrap();
        let c = token_costs(&cfg, 2);
        assert!(
            (150_000_000..=460_000_000).contains(&c.total_params),
            "{}",
            c.total_params
        );
        assert!(c.total_params * 2 < 1 << 30 && c.total_params * 2 > 8 * (32 << 20));
        assert!(c.active_params < c.total_params);
        let q =
            ModelConfig::from_json_str(&BenchModelSpec::quick().config_json().to_string()).unwrap();
        assert!(token_costs(&q, 2).total_params > 150_000_000);
    }

    #[test]
    fn prefill_flops_counts_causal_attention() {
        let cfg =
            ModelConfig::from_json_str(&BenchModelSpec::quick().config_json().to_string()).unwrap();
        let c = token_costs(&cfg, 2);
        let f1 = prefill_flops(&cfg, &c, 1);
        let f2 = prefill_flops(&cfg, &c, 2);
        // second token: one more token of matmuls and 2 more keys of attention per head per layer
        let per_tok = 2.0 * (c.active_params - c.lm_head_params) as f64;
        let attn_key = 2.0 * 16.0 * 2.0 * (192.0 + 128.0) * (3.0 - 1.0); // layers x heads x 2(qk+v) x (3 - 1) keys
        assert!(
            (f2 - f1 - per_tok - attn_key).abs() < 1.0,
            "{} vs {}",
            f2 - f1,
            per_tok + attn_key
        );
    }
}

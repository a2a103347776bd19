//! `specmla quantize`: write an fp8 e4m3 copy of a checkpoint with 2-D block scales in the
//! official DeepSeek-V3 layout, so any bf16 / f16 / f32 checkpoint can be shrunk to ~1 byte per
//! weight.
//!
//! Where it sits: beside the loader (it reads a `WeightStore` shard by shard and writes new
//! safetensors files); the result loads through the normal path (`config` sees the
//! `quantization_config`, `weights::loader` the `weight_scale_inv` siblings).
//!
//! What is quantised: every 2-D `*.weight` of a linear layer (attention projections, MLP and
//! expert gate/up/down). Kept as stored: embeddings, lm_head, norms, the MoE router
//! (`mlp.gate.weight`) and its bias, and anything that is not a 2-D float tensor. Per block of
//! `block x block` weights: `scale_inv = amax / 448` (1 for an all-zero block) and
//! `q = e4m3(w / scale_inv)`, round-to-nearest-even, saturating; `weight_scale_inv` is f32
//! `[ceil(rows / block), ceil(cols / block)]`. Shards keep their names; a sharded index is
//! rewritten with the scale tensors added. Other files of the directory (tokenizer, generation
//! config) are copied. An already quantised checkpoint is refused.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::dtype::{decode_to_f32, DType};
use super::files::{copy_non_weight_files, io, read_config_json, shard_files, write_safetensors};
use super::safetensors_store::{WeightSource, WeightStore};
use crate::error::{Error, Result};
use crate::kv::dtype::f32_to_fp8;

/// Largest finite e4m3fn magnitude.
const FP8_MAX: f32 = 448.0;

/// What `quantize_dir` did.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    /// Tensors written as fp8 (+ scale).
    pub quantized: usize,
    /// Tensors copied as stored.
    pub kept: usize,
    /// Data bytes in and out (headers excluded).
    pub bytes_in: usize,
    pub bytes_out: usize,
}

/// Whether tensor `name` (2-D) is a linear weight that the official fp8 layout quantises.
pub fn is_quantizable(name: &str) -> bool {
    // V3.2's indexer keeps `weights_proj` unquantised (DeepSeek's checkpoint stores it in bf16;
    // transformers keeps it in f32); its `k_norm` is a norm.
    const KEEP: [&str; 5] = [
        "embed_tokens",
        "lm_head",
        "norm",
        "mlp.gate.weight",
        "indexer.weights_proj",
    ];
    name.ends_with(".weight") && !KEEP.iter().any(|k| name.contains(k))
}

/// Quantise the checkpoint in `src` into a new directory `dst` (created; must not be `src`).
pub fn quantize_dir(src: &Path, dst: &Path, block: usize) -> Result<QuantizeReport> {
    if block == 0 || !block.is_multiple_of(8) {
        return Err(Error::InvalidArgument(format!(
            "quantize: block size {block} must be a positive multiple of 8"
        )));
    }
    let mut cfg: Value = read_config_json(src)?;

    if cfg.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return Err(Error::InvalidArgument(format!(
            "quantize: {} is already quantised",
            src.display()
        )));
    }
    if src.canonicalize().ok() == dst.canonicalize().ok() && dst.exists() {
        return Err(Error::InvalidArgument(
            "quantize: --out must differ from --model".into(),
        ));
    }
    std::fs::create_dir_all(dst).map_err(|e| io(dst, e))?;
    let shards = shard_files(src)?;
    let mut report = QuantizeReport::default();
    let mut weight_map = BTreeMap::new(); // tensor -> shard file name
    for shard in &shards {
        let fname = shard
            .file_name()
            .expect("file")
            .to_string_lossy()
            .to_string();
        let store = WeightStore::open(WeightSource::File(shard.clone()))?;
        let mut out: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
        for name in store.names() {
            let v = store.get(name).expect("listed");
            report.bytes_in += v.data.len();
            let float = matches!(v.dtype, DType::F32 | DType::BF16 | DType::F16);
            if v.shape.len() == 2 && float && is_quantizable(name) {
                let (rows, cols) = (v.shape[0], v.shape[1]);
                let w = decode_to_f32(&v.dtype, v.data).expect("float"); // [rows, cols]
                let (q, s) = quantize_blocks(&w, rows, cols, block);
                let sname = super::scale_inv_name(name);
                let sb: Vec<u8> = s.iter().flat_map(|x| x.to_le_bytes()).collect();
                out.push((name.to_string(), DType::F8E4M3, vec![rows, cols], q));
                out.push((
                    sname,
                    DType::F32,
                    vec![rows.div_ceil(block), cols.div_ceil(block)],
                    sb,
                ));
                report.quantized += 1;
            } else {
                out.push((
                    name.to_string(),
                    v.dtype.clone(),
                    v.shape.to_vec(),
                    v.data.to_vec(),
                ));
                report.kept += 1;
            }
        }
        drop(store);
        for (n, _, _, d) in &out {
            report.bytes_out += d.len();
            weight_map.insert(n.clone(), fname.clone());
        }
        write_safetensors(&dst.join(&fname), &out)?;
    }
    if src.join("model.safetensors.index.json").is_file() {
        let total: usize = report.bytes_out;
        let idx = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let p = dst.join("model.safetensors.index.json");
        std::fs::write(&p, serde_json::to_string_pretty(&idx).expect("json"))
            .map_err(|e| io(&p, e))?;
    }
    // config.json with the quantization_config transformers / vLLM read for DeepSeek-V3 fp8.
    cfg["quantization_config"] = json!({
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
    });
    let p = dst.join("config.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).expect("json")).map_err(|e| io(&p, e))?;
    // Everything else (tokenizer, generation config, model card) as it is.
    copy_non_weight_files(src, dst)?;
    Ok(report)
}

/// Block-quantise `w` [rows, cols]: (e4m3 bytes [rows, cols], scale_inv [ceil(rows/b), ceil(cols/b)]).
pub fn quantize_blocks(w: &[f32], rows: usize, cols: usize, b: usize) -> (Vec<u8>, Vec<f32>) {
    let (sr, sc) = (rows.div_ceil(b), cols.div_ceil(b));
    let mut scales = vec![1f32; sr * sc];
    let mut q = vec![0u8; rows * cols];
    for bi in 0..sr {
        for bj in 0..sc {
            let (r0, r1, c0, c1) = (
                bi * b,
                ((bi + 1) * b).min(rows),
                bj * b,
                ((bj + 1) * b).min(cols),
            );
            let mut amax = 0f32;
            for r in r0..r1 {
                for &x in &w[r * cols + c0..r * cols + c1] {
                    amax = amax.max(x.abs());
                }
            }
            let s = if amax > 0.0 && amax.is_finite() {
                amax / FP8_MAX
            } else {
                1.0
            };
            scales[bi * sc + bj] = s;
            for r in r0..r1 {
                for c in c0..c1 {
                    q[r * cols + c] = f32_to_fp8(w[r * cols + c] / s);
                }
            }
        }
    }
    (q, scales)
}

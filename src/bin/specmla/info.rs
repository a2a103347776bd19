//! `specmla info`: model summary, parameter count, weight bytes per dtype, the kernels (ISA) in
//! use, KV bytes per token per cache dtype and per cache group (MLA latent; V3.2 index keys), and
//! the resident KV bytes of one sequence at 8k and 128k tokens.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use specmla::kv::{KvCache, KvConfig, KvDtype};
use specmla::model::Model;
use specmla::Result;

#[derive(Args)]
pub struct InfoArgs {
    #[arg(long, default_value = "models/target")]
    pub model: PathBuf,
    /// Kernel instruction set to report: auto (the best this CPU has), portable, avx2, avx512.
    #[arg(long, default_value = "auto")]
    pub isa: String,
}

pub fn run(a: InfoArgs) -> Result<()> {
    let isa = specmla::engine::resolve_isa(crate::generate::parse_isa(&a.isa)?)?;
    let model = Model::load_dir(&a.model)?;
    let mut dtypes = std::collections::BTreeMap::<&str, usize>::new();
    for m in model.matrices() {
        *dtypes.entry(m.dtype_name()).or_default() += m.nbytes();
    }
    let c = &model.config;
    let mut kv = serde_json::Map::new();
    for dt in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
        let cache = KvCache::new(KvConfig::for_model(c, 16, 1, dt))?;
        let st = cache.stats();
        let groups: Vec<_> = st
            .groups
            .iter()
            .map(|g| {
                json!({
                    "kind": g.kind,
                    "dtype": g.dtype.name(),
                    "layers": g.num_layers,
                    "values_per_token_per_layer": g.width,
                    "bytes_per_token_per_layer": g.bytes_per_token_per_layer,
                    "bytes_per_token": g.bytes_per_token,
                })
            })
            .collect();
        let per_token = cache.bytes_per_token();
        kv.insert(
            dt.name().into(),
            json!({
                "bytes_per_token_per_layer": cache.bytes_per_token_per_layer(),
                "bytes_per_token": per_token,
                "groups": groups,
                "resident_bytes_8k": per_token * 8192,
                "resident_bytes_128k": per_token * 131072,
            }),
        );
    }
    let v = json!({
        "model_dir": a.model,
        "config": c.to_summary_json(),
        "parameters": model.num_params(),
        "kernels": {
            "isa": isa.to_string(),
            "description": isa.describe(),
            "available": specmla::kernels::Isa::available().iter().map(|i| i.to_string()).collect::<Vec<_>>(),
        },
        "weight_bytes_by_dtype": dtypes,
        "decode_weight_bytes_per_token": model.decode_bytes_per_token(),
        "mtp_tensors": model.mtp_tensors.len(),
        "mtp_layers": model.mtp.len(),
        "kv_cache": kv,
        "mla_latent_values_per_token_per_layer": c.kv_lora_rank + c.qk_rope_head_dim,
        "mha_equivalent_values_per_token_per_layer": c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim),
    });
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    Ok(())
}

//! `specmla info`: model summary, parameter count, weight bytes per dtype, the kernels (ISA) in
//! use, KV bytes per token per cache dtype and per cache group (MLA latent; V3.2 index keys), and
//! the resident KV bytes of one sequence at 8k, 128k and 1M tokens (V4: per layer type too, with
//! the sliding-window rows counted over their lookback only).

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
    /// Kernel instruction set to report: auto (the best this CPU has), portable, avx2, avx512,
    /// avx512bf16, amx.
    #[arg(long, default_value = "auto")]
    pub isa: String,
}

/// V4: per layer type, the layers of that type and one layer's resident KV bytes per token at
/// 8k / 128k / 1M context (window rows counted over the lookback only, compressed entries for the
/// whole context).
fn layer_types(kc: &KvConfig, v4: &specmla::config::V4Config) -> serde_json::Value {
    use specmla::config::V4Attn;
    let mut out = serde_json::Map::new();
    for (kind, groups) in [
        (V4Attn::Sliding, &["swa_kv"][..]),
        (V4Attn::Csa, &["swa_kv", "csa_input", "csa_entry"][..]),
        (V4Attn::Hca, &["swa_kv", "hca_input", "hca_entry"][..]),
    ] {
        let layers = v4.layers_of(kind);
        if layers == 0 {
            continue;
        }
        let mut one = kc.clone();
        one.groups.retain(|g| groups.contains(&g.kind.name()));
        one.groups.iter_mut().for_each(|g| g.num_layers = 1);
        let per_token = |ctx: usize| one.resident_bytes(ctx) as f64 / ctx as f64;
        out.insert(
            kind.as_str().into(),
            json!({
                "layers": layers,
                "compress_rate": v4.rate(kind),
                "bytes_per_token_per_layer_8k": per_token(8192),
                "bytes_per_token_per_layer_128k": per_token(131072),
                "bytes_per_token_per_layer_1m": per_token(1 << 20),
            }),
        );
    }
    serde_json::Value::Object(out)
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
        let kc = cache.config();
        let mut entry = json!({
            "bytes_per_token_per_layer": cache.bytes_per_token_per_layer(),
            "bytes_per_token": per_token,
            "groups": groups,
            "resident_bytes_8k": kc.resident_bytes(8192),
            "resident_bytes_128k": kc.resident_bytes(131072),
            "resident_bytes_1m": kc.resident_bytes(1 << 20),
        });
        if let (Some(v4), Some(r0)) = (&c.v4, kc.window) {
            entry["sliding_window_lookback_tokens"] = json!(r0);
            entry["per_layer_type"] = layer_types(kc, v4);
        }
        kv.insert(dt.name().into(), entry);
    }
    let v = json!({
        "model_dir": a.model,
        "config": c.to_summary_json(),
        "parameters": model.num_params(),
        "kernels": {
            "isa": isa.to_string(),
            "description": isa.describe(),
            "available": specmla::kernels::Isa::available().iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            "weight_prefetch": specmla::kernels::prefetch_hint().name(),
            "weight_prefetch_tiles": specmla::kernels::tile_prefetch_hint().name(),
        },
        "cuda": {
            "driver_loadable": specmla::cuda::device::driver_present(),
            "nvrtc_loadable": specmla::cuda::available(),
            "this_model_on_the_cuda_backend": match specmla::cuda::CudaBackend::check_model(&model) {
                Ok(()) => "supported (with --device cuda[:N] --kv-dtype bf16)".to_string(),
                Err(e) => e.to_string(),
            },
        },
        "weight_bytes_by_dtype": dtypes,
        "decode_weight_bytes_per_token": model.decode_bytes_per_token(),
        "mtp_tensors": model.mtp_tensors.len(),
        "mtp_layers": model.num_mtp_layers(),
        "kv_cache": kv,
        "mla_latent_values_per_token_per_layer": c.kv_lora_rank + c.qk_rope_head_dim,
        "mha_equivalent_values_per_token_per_layer": c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim),
    });
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    Ok(())
}

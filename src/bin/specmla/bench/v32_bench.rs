//! `specmla bench --v32`: what DeepSeek-V3.2's lightning indexer costs in decode, and what its
//! sparse attention saves, at long context — a V3.2-shaped random checkpoint against its V3 twin
//! (the same shapes without the indexer, dense MLA), both written by the bench itself.
//!
//! Per context length (default 2048 and 8192; `--long-contexts`): both models prefill a prompt of
//! that length, then their batch-1 decode steps alternate (one of each, repeated, so the host's
//! slow spells hit both); reported: ms/step (p50) of each model, their ratio, and the KV bytes a step reads per kind: the V3 twin
//! reads every latent row; V3.2 reads every index key (the indexer scores them all) plus the
//! latent rows of its `index_topk` selection. At 2048 the selection keeps (almost) every key, so
//! the difference is the indexer's own cost; at 8192 sparse attention reads a quarter of the
//! latent rows.

use std::path::Path;

use serde_json::json;

use specmla::{Error, Result};

use super::pairwise::{arms, interleaved_decode};
use super::random_model::BenchModelSpec;
use super::{table, BenchArgs, Section};

pub fn run(a: &BenchArgs, scratch_base: &Path) -> Result<Section> {
    let contexts = super::parse_lengths(
        a.long_contexts.as_deref(),
        if a.quick {
            &[1024, 2560]
        } else {
            &[2048, 8192]
        },
        "long-contexts",
    )?;
    if contexts.is_empty() {
        return Err(Error::InvalidArgument(
            "--v32 needs at least one --long-contexts length".into(),
        ));
    }
    // One decoder layer (dense MLP): the attention is V3.2's, the prefill half the cost.
    let spec = BenchModelSpec {
        num_layers: 1,
        ..BenchModelSpec::quick()
    };
    let (warmup, steps) = if a.quick { (1, 4) } else { (2, 12) };
    let longest = contexts.iter().copied().max().unwrap_or(0);
    let (_dirs, arms) = arms(
        a,
        scratch_base,
        [
            ("v32", "V3.2", spec.v32_config_json(true)),
            ("v3-twin", "V3 twin", spec.v32_config_json(false)),
        ],
        longest,
        1 + warmup + steps,
    )?;
    // Per context: both prompts prefilled, then the two engines' decode steps alternate (so a
    // slow spell of the host hits both alike); p50 of each.
    let measured = interleaved_decode(&arms, &contexts, warmup, steps, a.seed)?; // [V3.2, V3]
    let (v32, v3) = (&arms[0], &arms[1]);
    let topk = 2048usize;
    let (lat, idx) = (
        v32.group_bytes_per_token("mla_latent"),
        v32.group_bytes_per_token("index_key"),
    );
    let mut rows = Vec::new();
    let mut js = Vec::new();
    for (m, &ctx) in measured.iter().zip(&contexts) {
        let (ms32, ms3) = (m[0], m[1]);
        // the measured steps attend to ctx .. ctx + steps keys: their mean
        let c = ctx as f64 + warmup as f64 + (steps as f64 + 1.0) / 2.0;
        let kv3 = c * lat as f64;
        let kv32 = c * idx as f64 + c.min(topk as f64) * lat as f64;
        rows.push(vec![
            ctx.to_string(),
            format!("{:.0}", c),
            format!("{ms3:.1}"),
            format!("{ms32:.1}"),
            format!("{:.2}x", ms32 / ms3),
            format!("{:.1}", 1e3 / ms3),
            format!("{:.1}", 1e3 / ms32),
            format!("{:.2}", kv3 / 1e6),
            format!("{:.2}", kv32 / 1e6),
        ]);
        js.push(json!({
            "context": ctx, "mean_context": c, "steps": steps,
            "v3_ms_per_step_p50": ms3, "v32_ms_per_step_p50": ms32,
            "v32_over_v3_step_time": ms32 / ms3,
            "v3_kv_bytes_read_per_step": kv3, "v32_kv_bytes_read_per_step": kv32,
        }));
    }
    let mut text = format!(
        "V3.2-shaped random model ({} params; 128 heads, 64 index heads x 128, index_topk {topk}) \
         vs its V3 twin ({} params, dense MLA); batch-1 decode, {} threads, KV {}\nKV bytes per token: \
         latent {lat}, index keys {idx} (V3.2 total {})\n",
        v32.params,
        v3.params,
        a.threads,
        a.kv_dtype,
        lat + idx
    );
    text += &table(
        &[
            "context",
            "mean ctx",
            "V3 ms/step",
            "V3.2 ms/step",
            "V3.2/V3",
            "V3 tok/s (p50)",
            "V3.2 tok/s (p50)",
            "V3 KV MB/step",
            "V3.2 KV MB/step",
        ],
        &rows,
    );
    Ok(Section {
        name: "v32_indexer",
        json: json!({
            "index_topk": topk, "index_n_heads": 64, "index_head_dim": 128,
            "v32_params": v32.params, "v3_params": v3.params,
            "kv_bytes_per_token": {"mla_latent": lat, "index_key": idx},
            "kv_dtype": a.kv_dtype,
            "contexts": js,
        }),
        text,
    })
}

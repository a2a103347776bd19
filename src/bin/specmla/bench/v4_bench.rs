//! `specmla bench --v4`: DeepSeek-V4 decode against a V3-shaped model of the same hidden size —
//! tokens/s and KV bytes per token — both random checkpoints written by the bench itself.
//!
//! The V4 model (`BenchModelSpec::v4_config_json`: V4-Flash attention widths, CSA / HCA
//! alternating, hc_mult 4) and the V3 model (`v32_config_json(false)`: 128 heads of MLA,
//! kv_lora_rank 512) share hidden size 2048, the vocabulary and the MoE sizes. Per context length
//! (default 2048 and 8192; `--long-contexts`) both prefill a prompt of that length, then their
//! batch-1 decode steps alternate (so a slow spell of the host hits both); reported per context:
//! ms/step (p50), tokens/s, the KV bytes per token each model stores (pool bytes per token) and
//! holds resident for one sequence at that context (V4: the sliding-window rows of its lookback
//! only, plus every compressed entry).

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
            "--v4 needs at least one --long-contexts length".into(),
        ));
    }
    // Two layers each: V4 one CSA + one HCA layer (both MoE, the first hash-routed); V3 one
    // dense + one MoE layer.
    let spec = BenchModelSpec {
        num_layers: 2,
        ..BenchModelSpec::quick()
    };
    let (warmup, steps) = if a.quick { (1, 4) } else { (2, 12) };
    let longest = contexts.iter().copied().max().unwrap_or(0);
    let (_dirs, arms) = arms(
        a,
        scratch_base,
        [
            ("v4", "V4", spec.v4_config_json()),
            ("v3", "V3", spec.v32_config_json(false)),
        ],
        longest,
        1 + warmup + steps,
    )?;
    let measured = interleaved_decode(&arms, &contexts, warmup, steps, a.seed)?; // [V4, V3]
    let (v4, v3) = (&arms[0], &arms[1]);
    let (s4, s3) = (v4.kv.bytes_per_token(), v3.kv.bytes_per_token());
    let mut rows = Vec::new();
    let mut js = Vec::new();
    for (m, &ctx) in measured.iter().zip(&contexts) {
        let (ms4, ms3) = (m[0], m[1]);
        let (r4, r3) = (v4.kv.resident_bytes(ctx), v3.kv.resident_bytes(ctx));
        rows.push(vec![
            ctx.to_string(),
            format!("{ms3:.1}"),
            format!("{ms4:.1}"),
            format!("{:.1}", 1e3 / ms3),
            format!("{:.1}", 1e3 / ms4),
            format!("{:.2}x", ms3 / ms4),
            format!("{:.0}", r3 as f64 / ctx as f64),
            format!("{:.0}", r4 as f64 / ctx as f64),
            format!("{:.2}x", r3 as f64 / r4 as f64),
        ]);
        js.push(json!({
            "context": ctx, "steps": steps,
            "v3_ms_per_step_p50": ms3, "v4_ms_per_step_p50": ms4,
            "v3_tok_s": 1e3 / ms3, "v4_tok_s": 1e3 / ms4,
            "v3_resident_kv_bytes": r3, "v4_resident_kv_bytes": r4,
        }));
    }
    let mut text = format!(
        "V4-shaped random model ({} params; 32 heads x 512 shared K=V, CSA rate 4 + HCA rate 128, \
         window 128, hc_mult 4) vs a V3-shaped one ({} params; 128 heads MLA), hidden 2048 both; \
         batch-1 decode, {} threads, KV {}\nKV bytes per token stored in the pool: V3 {s3}, V4 {s4} \
         (V4 holds its window rows only over the last {} tokens)\n",
        v4.params,
        v3.params,
        a.threads,
        a.kv_dtype,
        v4.kv.window.unwrap_or(0) + 1,
    );
    text += &table(
        &[
            "context",
            "V3 ms/step",
            "V4 ms/step",
            "V3 tok/s",
            "V4 tok/s",
            "V4 speed vs V3",
            "V3 KV B/token resident",
            "V4 KV B/token resident",
            "V3/V4 KV",
        ],
        &rows,
    );
    Ok(Section {
        name: "v4_vs_v3",
        json: json!({
            "v4_params": v4.params, "v3_params": v3.params,
            "kv_bytes_per_token_stored": {"v3": s3, "v4": s4},
            "kv_dtype": a.kv_dtype,
            "contexts": js,
        }),
        text,
    })
}

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
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use specmla::engine::{Engine, EngineConfig};
use specmla::kv::KvConfig;
use specmla::model::Model;
use specmla::spec::SpecMode;
use specmla::{Error, Result};

use super::random_model::{write_random_checkpoint, BenchModelSpec, ScratchDir};
use super::{progress, table, BenchArgs, Section};

struct Arm {
    engine: Engine,
    vocab: usize,
    params: usize,
    kv: KvConfig,
}

fn arm(a: &BenchArgs, dir: &Path, longest: usize, extra: usize) -> Result<Arm> {
    let model = Arc::new(Model::load_dir(dir)?);
    let block_size = 16;
    let dtype = super::kv_dtype(a)?;
    let num_blocks = (longest + extra + 4).div_ceil(block_size) + 8;
    let cfg = EngineConfig {
        threads: a.threads.max(1),
        kv_dtype: dtype,
        block_size,
        num_blocks,
        draft_num_blocks: 1,
        max_batch_tokens: 2048,
        max_running: 1,
        prefix_cache: false,
        spec: SpecMode::Fixed(0),
        isa: crate::generate::parse_isa(&a.isa)?,
        ..EngineConfig::default()
    };
    let engine = Engine::from_model(Arc::clone(&model), None, cfg)?;
    Ok(Arm {
        engine,
        vocab: model.config.vocab_size,
        params: model.num_params(),
        kv: KvConfig::for_model(&model.config, block_size, num_blocks, dtype),
    })
}

fn prefill(arm: &Arm, ctx: usize, warmup: usize, steps: usize, seed: u64) -> Result<()> {
    super::prefill_then_warm(&arm.engine, arm.vocab, ctx, warmup, steps, seed)
}

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
    let mut dirs = Vec::new();
    let mut arms = Vec::new();
    for (tag, cfg) in [
        ("v4", spec.v4_config_json()),
        ("v3", spec.v32_config_json(false)),
    ] {
        let s = ScratchDir::new(scratch_base, tag);
        progress(&format!(
            "writing the random {tag} benchmark model to {}",
            s.0.display()
        ));
        write_random_checkpoint(&s.0, &cfg, a.seed)?;
        arms.push(arm(a, &s.0, longest, 1 + warmup + steps)?);
        dirs.push(s);
    }
    let mut measured: Vec<[f64; 2]> = Vec::new(); // [V4, V3] ms/step p50 per context
    for (i, &ctx) in contexts.iter().enumerate() {
        for (j, arm) in arms.iter().enumerate() {
            progress(&format!("{}: prefill {ctx} tokens", ["V4", "V3"][j]));
            prefill(arm, ctx, warmup, steps, a.seed + 7 * i as u64)?;
        }
        progress(&format!(
            "{steps} interleaved decode steps at context {ctx}"
        ));
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..steps {
            for (j, arm) in arms.iter().enumerate() {
                let t = Instant::now();
                arm.engine.step()?;
                times[j].push(t.elapsed().as_secs_f64());
            }
        }
        for arm in &arms {
            while arm.engine.has_work() {
                arm.engine.step()?;
            }
        }
        measured.push([
            1e3 * super::percentile(&times[0], 50.0),
            1e3 * super::percentile(&times[1], 50.0),
        ]);
    }
    let (v4, v3) = (&arms[0], &arms[1]);
    let (s4, s3) = (v4.kv.bytes_per_token(), v3.kv.bytes_per_token());
    let mut rows = Vec::new();
    let mut js = Vec::new();
    for (&[ms4, ms3], &ctx) in measured.iter().zip(&contexts) {
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

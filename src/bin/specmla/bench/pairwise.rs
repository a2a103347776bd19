//! Two random checkpoints decoded side by side at long context — the harness of the V3.2
//! (`--v32`) and V4 (`--v4`) benches: both models are written to scratch directories, get a
//! one-request engine each, prefill a random prompt of every context length, then their batch-1
//! decode steps alternate (one of each, repeated) so a slow spell of the host hits both alike.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use specmla::engine::{Engine, EngineConfig};
use specmla::kv::KvConfig;
use specmla::model::Model;
use specmla::spec::SpecMode;
use specmla::Result;

use super::random_model::{write_random_checkpoint, ScratchDir};
use super::{progress, BenchArgs};

/// One model's engine and what the tables report about it.
pub struct Arm {
    pub label: &'static str,
    pub engine: Engine,
    pub vocab: usize,
    pub params: usize,
    /// The engine's KV layout (bytes per token per group, resident bytes per context).
    pub kv: KvConfig,
}

impl Arm {
    /// Stored bytes per token of the group of `kind` (0 without one).
    pub fn group_bytes_per_token(&self, kind: &str) -> usize {
        let bs = self.kv.block_size;
        self.kv
            .groups
            .iter()
            .find(|g| g.kind.name() == kind)
            .map_or(0, |g| g.bytes_per_block(bs) / bs)
    }
}

/// Write each (scratch tag, label, config.json) as a random checkpoint and build its engine,
/// sized for `longest + extra` tokens. The scratch directories live as long as the result.
pub fn arms(
    a: &BenchArgs,
    scratch_base: &Path,
    models: [(&str, &'static str, Value); 2],
    longest: usize,
    extra: usize,
) -> Result<(Vec<ScratchDir>, Vec<Arm>)> {
    let (mut dirs, mut arms) = (Vec::new(), Vec::new());
    for (tag, label, cfg) in models {
        let s = ScratchDir::new(scratch_base, tag);
        progress(&format!(
            "writing the random {label} benchmark model to {}",
            s.0.display()
        ));
        write_random_checkpoint(&s.0, &cfg, a.seed)?;
        let model = Arc::new(Model::load_dir(&s.0)?);
        let block_size = 16;
        let dtype = super::kv_dtype(a)?;
        let num_blocks = (longest + extra + 4).div_ceil(block_size) + 8;
        let ecfg = EngineConfig {
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
        let engine = Engine::from_model(Arc::clone(&model), None, ecfg)?;
        arms.push(Arm {
            label,
            engine,
            vocab: model.config.vocab_size,
            params: model.num_params(),
            kv: KvConfig::for_model(&model.config, block_size, num_blocks, dtype),
        });
        dirs.push(s);
    }
    Ok((dirs, arms))
}

/// Per context: both arms prefill a `ctx`-token prompt (+ `warmup` steps), then `steps`
/// decode steps alternate between them; returns each arm's p50 ms/step per context.
pub fn interleaved_decode(
    arms: &[Arm],
    contexts: &[usize],
    warmup: usize,
    steps: usize,
    seed: u64,
) -> Result<Vec<Vec<f64>>> {
    let mut measured = Vec::new();
    for (i, &ctx) in contexts.iter().enumerate() {
        for arm in arms {
            progress(&format!("{}: prefill {ctx} tokens", arm.label));
            super::prefill_then_warm(
                &arm.engine,
                arm.vocab,
                ctx,
                warmup,
                steps,
                seed + 7 * i as u64,
            )?;
        }
        progress(&format!(
            "{steps} interleaved decode steps at context {ctx}"
        ));
        let mut times = vec![Vec::new(); arms.len()];
        for _ in 0..steps {
            for (j, arm) in arms.iter().enumerate() {
                let t = Instant::now();
                arm.engine.step()?;
                times[j].push(t.elapsed().as_secs_f64());
            }
        }
        for arm in arms {
            while arm.engine.has_work() {
                arm.engine.step()?;
            }
        }
        measured.push(
            times
                .iter()
                .map(|t| 1e3 * super::percentile(t, 50.0))
                .collect(),
        );
    }
    Ok(measured)
}

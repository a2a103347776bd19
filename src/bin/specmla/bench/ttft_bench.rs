//! `specmla bench --ttft`: time to first token for a long shared prompt prefix, with the second
//! KV tier restoring it against recomputing it.
//!
//! On a random V2-Lite-shaped checkpoint written by the bench (or `--model DIR`): a prompt of
//! `--prefill-len` tokens (default 2048; 512 with `--quick`) plus one varying last token. Three
//! arms, alternated over rounds so a slow spell of the host hits all of them:
//! - recomputed: a fresh engine without the tier (nothing cached) prefills the whole prompt;
//! - disk: a fresh engine on an offload directory a previous engine filled (a restart: every
//!   full block of the prefix comes from the file);
//! - memory: one engine whose pool is too small to keep the prefix while another long prompt
//!   runs, so its blocks are evicted into the host-memory tier and restored from it.
//!
//! Each arm checks its first token against the recomputed one (the restored KV is the same
//! bytes). Reported: TTFT p50 per arm, speedup over recomputing, blocks restored.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use specmla::engine::{Engine, EngineConfig, Prompt, Request};
use specmla::kv::TierConfig;
use specmla::model::Model;
use specmla::spec::SpecMode;
use specmla::{Error, Result};

use super::random_model::{write_random_checkpoint, BenchModelSpec, ScratchDir};
use super::{percentile, progress, random_tokens, table, BenchArgs, Section};

/// Submit `prompt` for one token; returns (seconds to the first token, that token, prompt
/// tokens served from the prefix cache).
fn ttft(e: &Engine, prompt: &[u32]) -> Result<(f64, u32, u64)> {
    let mut r = Request::new(Prompt::Tokens(prompt.to_vec()));
    r.sampling.max_tokens = 1;
    r.sampling.ignore_eos = true;
    let t0 = Instant::now();
    let id = e.submit(r)?;
    loop {
        for ev in e.step()? {
            if ev.id == id && !ev.tokens.is_empty() {
                let dt = t0.elapsed().as_secs_f64();
                while e.has_work() {
                    e.step()?;
                }
                let cached = e.request_counters(id)?.cached_prompt_tokens;
                return Ok((dt, ev.tokens[0], cached));
            }
        }
    }
}

pub fn run(a: &BenchArgs, scratch_base: &Path) -> Result<Section> {
    let len = a.prefill_len.unwrap_or(if a.quick { 512 } else { 2048 });
    let rounds = if a.quick { 2 } else { 3 };
    let scratch = ScratchDir::new(scratch_base, "ttft");
    let model_dir = match &a.model {
        Some(d) => d.clone(),
        None => {
            let spec = if a.quick {
                BenchModelSpec::quick()
            } else {
                BenchModelSpec::standard()
            };
            let d = scratch.0.join("model");
            progress(&format!(
                "writing the random benchmark model to {}",
                d.display()
            ));
            write_random_checkpoint(&d, &spec.config_json(), a.seed)?;
            d
        }
    };
    let model = Arc::new(Model::load_dir(&model_dir)?);
    let vocab = model.config.vocab_size;
    if len + 2 > model.config.max_position_embeddings {
        return Err(Error::InvalidArgument(format!(
            "--prefill-len {len} exceeds the model's max_position_embeddings {}",
            model.config.max_position_embeddings
        )));
    }
    let bs = 16;
    let base = EngineConfig {
        threads: a.threads.max(1),
        kv_dtype: super::kv_dtype(a)?,
        block_size: bs,
        num_blocks: (len + 8).div_ceil(bs) * 2 + 8,
        max_batch_tokens: 512,
        max_running: 1,
        spec: SpecMode::Fixed(0),
        isa: crate::generate::parse_isa(&a.isa)?,
        ..EngineConfig::default()
    };
    let engine = |cfg: EngineConfig| Engine::from_model(Arc::clone(&model), None, cfg);
    let prefix = random_tokens(len, vocab, 3, a.seed ^ 0x77);
    let with_tail = |t: u32| {
        let mut p = prefix.clone();
        p.push(3 + t % (vocab as u32 - 3));
        p
    };
    let dir = scratch.0.join("tier");
    let disk_cfg = EngineConfig {
        kv_offload: Some(TierConfig {
            mem_bytes: 0,
            dir: Some(dir.clone()),
            ..Default::default()
        }),
        ..base.clone()
    };
    progress("filling the offload directory");
    ttft(&engine(disk_cfg.clone())?, &with_tail(0))?;
    // memory arm: a pool holding one long prompt; a second one evicts the first into the tier
    let mem_cfg = EngineConfig {
        num_blocks: (len + 8).div_ceil(bs) + 4,
        kv_offload: Some(TierConfig {
            mem_bytes: 1 << 30,
            dir: None,
            ..Default::default()
        }),
        ..base.clone()
    };
    let mem_engine = engine(mem_cfg)?;
    let other = random_tokens(len, vocab, 3, a.seed ^ 0x99);
    ttft(&mem_engine, &with_tail(0))?;
    let (mut t_re, mut t_disk, mut t_mem) = (Vec::new(), Vec::new(), Vec::new());
    let (mut c_disk, mut c_mem) = (0, 0);
    for r in 0..rounds {
        let p = with_tail(r as u32 + 1);
        progress(&format!(
            "round {}/{rounds}: recomputed, disk, memory",
            r + 1
        ));
        let (t, want, _) = ttft(&engine(base.clone())?, &p)?;
        t_re.push(t);
        let (t, got, c) = ttft(&engine(disk_cfg.clone())?, &p)?;
        if got != want {
            return Err(Error::Engine(format!(
                "ttft bench: restored-from-disk first token {got} != recomputed {want}"
            )));
        }
        t_disk.push(t);
        c_disk = c;
        ttft(&mem_engine, &other)?; // evicts the shared prefix into the memory tier
        let (t, got, c) = ttft(&mem_engine, &p)?;
        if got != want {
            return Err(Error::Engine(format!(
                "ttft bench: restored-from-memory first token {got} != recomputed {want}"
            )));
        }
        t_mem.push(t);
        c_mem = c;
    }
    let tier = mem_engine.stats().kv.tier.unwrap_or_default();
    let (re, disk, mem) = (
        percentile(&t_re, 50.0),
        percentile(&t_disk, 50.0),
        percentile(&t_mem, 50.0),
    );
    let rows = vec![
        vec![
            "recomputed".into(),
            format!("{:.1}", re * 1e3),
            "1.00x".into(),
            "0".into(),
        ],
        vec![
            "restored from disk (new engine)".into(),
            format!("{:.1}", disk * 1e3),
            format!("{:.2}x", re / disk),
            c_disk.to_string(),
        ],
        vec![
            "restored from host memory".into(),
            format!("{:.1}", mem * 1e3),
            format!("{:.2}x", re / mem),
            c_mem.to_string(),
        ],
    ];
    let text = format!(
        "prompt {} tokens ({len}-token shared prefix), {rounds} rounds, p50; memory tier: {} \
         blocks offloaded, {} restored\n{}",
        len + 1,
        tier.offloaded_blocks,
        tier.restored_blocks,
        table(
            &["arm", "TTFT ms", "speedup", "cached prompt tokens"],
            &rows
        )
    );
    Ok(Section {
        name: "ttft",
        json: json!({
            "prompt_tokens": len + 1,
            "rounds": rounds,
            "ttft_recomputed_s": t_re,
            "ttft_disk_s": t_disk,
            "ttft_memory_s": t_mem,
            "speedup_disk": re / disk,
            "speedup_memory": re / mem,
            "cached_prompt_tokens_disk": c_disk,
            "cached_prompt_tokens_memory": c_mem,
        }),
        text,
    })
}

//! Engine-core bench: the machine's roofline (streaming read bandwidth, peak FMA FLOP/s with the
//! bench's thread count), then prefill and decode through the real `Engine` path (`SpecMode::Fixed(0)`,
//! no drafter, prefix cache off so every prompt is really computed).
//!
//! Reported: prefill tokens/s for one long prompt and its fraction of the compute bound
//! (model FLOPs from the config / time / peak); decode tokens/s at each batch size over
//! steady-state steps (every request decoding, after prefill and warm-up steps); KV bytes per
//! token; and at batch 1 the bandwidth-roofline fraction: (weight bytes read per step +
//! latent-KV bytes read per step) / step time / measured bandwidth.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use specmla::engine::{Engine, EngineConfig, Prompt, Request};
use specmla::kernels::{measure_peak_flops, measure_read_bandwidth};
use specmla::model::Model;
use specmla::spec::SpecMode;
use specmla::{Error, Result};

use super::random_model::{
    prefill_flops, token_costs, write_random_checkpoint, BenchModelSpec, ScratchDir,
};
use super::{progress, random_tokens, table, tokenizer_of, BenchArgs, Section};

/// Decode measurement of one batch size.
struct DecodeResult {
    batch: usize,
    steps: usize,
    tokens: usize,
    secs: f64,
    step_p50_s: f64,
    /// Mean context length (tokens in the latent cache) over the measured steps.
    mean_ctx: f64,
    /// Weight bytes the measured steps needed, per step (dense once, the union of the routed
    /// experts the step's tokens selected): how many distinct experts a batch's tokens reach.
    weight_bytes_per_step: f64,
}

fn bytes_per_weight(m: &Model) -> usize {
    m.lm_head().bytes_per_weight()
}

pub fn run(
    a: &BenchArgs,
    model_dir: Option<&Path>,
    scratch_base: &Path,
    batches: &[usize],
) -> Result<Section> {
    let threads = a.threads.max(1);
    let prefill_len = a.prefill_len.unwrap_or(if a.quick { 128 } else { 512 });
    let decode_steps = a.decode_steps.unwrap_or(if a.quick { 6 } else { 24 });
    let warmup = if a.quick { 1 } else { 3 };
    let prefill_reps = if a.quick { 1 } else { 2 };
    let decode_prompt_len = if a.quick { 16 } else { 64 };
    let more_prefills = super::parse_lengths(
        a.prefill_lens.as_deref(),
        if a.quick { &[] } else { &[2048] },
        "prefill-lens",
    )?;
    let long_ctx = super::parse_lengths(
        a.long_contexts.as_deref(),
        if a.quick { &[] } else { &[2048, 8192] },
        "long-contexts",
    )?;
    let long_steps = a.long_steps.unwrap_or(if a.quick { 4 } else { 8 }).max(1);
    let isa_level = crate::generate::parse_isa(&a.isa)?;
    let isa = specmla::engine::resolve_isa(isa_level)?;

    // ---- machine probes (same pool size as the engine)
    progress(&format!("probing the machine with {threads} threads"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Engine(format!("thread pool: {e}")))?;
    let probe_bytes = if a.quick { 256 << 20 } else { 512 << 20 };
    let bw = pool.install(|| measure_read_bandwidth(probe_bytes, if a.quick { 3 } else { 5 }));
    let peak = pool.install(|| measure_peak_flops(3));
    // (kept for the interleaved roofline rounds; its threads sleep while the engine runs)

    // ---- the model
    let t = Instant::now();
    let (scratch, dir) = match model_dir {
        Some(d) => (None, d.to_path_buf()),
        None => {
            let spec = if a.quick {
                BenchModelSpec::quick()
            } else {
                BenchModelSpec::standard()
            };
            let s = ScratchDir::new(scratch_base, "model");
            progress(&format!(
                "writing the random benchmark model to {}",
                s.0.display()
            ));
            write_random_checkpoint(&s.0, &spec.config_json(), a.seed)?;
            let d = s.0.clone();
            (Some(s), d)
        }
    };
    let write_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let model = Arc::new(Model::load_dir(&dir)?);
    let load_s = t.elapsed().as_secs_f64();
    let tokenizer = tokenizer_of(&dir)?;
    drop(scratch); // the weights are copied into the model; the file is no longer needed
    let c = model.config.clone();
    let wb = bytes_per_weight(&model);
    let costs = token_costs(&c, wb);
    let model_bytes = model.decode_bytes_per_token();
    progress(&format!(
        "model: {} params ({} active/token), written in {write_s:.1} s, loaded in {load_s:.1} s",
        model.num_params(),
        costs.active_params
    ));

    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let block_size = 16;
    let per_req = decode_prompt_len + 1 + warmup + decode_steps + 2;
    let longest = more_prefills
        .iter()
        .chain(&long_ctx)
        .copied()
        .chain([prefill_len])
        .max()
        .unwrap_or(prefill_len);
    let num_blocks = (max_batch * per_req.div_ceil(block_size) + 8)
        .max((longest + 2 + warmup + long_steps).div_ceil(block_size) + 8);
    // One chunk per measured prefill; long-context prompts in chunks of at most 2048.
    let max_prefill = more_prefills
        .iter()
        .copied()
        .chain([prefill_len])
        .chain(long_ctx.iter().map(|&c| c.min(2048)))
        .max()
        .unwrap_or(prefill_len);
    let cfg = EngineConfig {
        threads,
        kv_dtype: super::kv_dtype(a)?,
        draft_kv_dtype: None,
        index_kv_dtype: None,
        block_size,
        num_blocks,
        draft_num_blocks: 1,
        kv_window_blocks: None,
        max_batch_tokens: max_prefill.max(max_batch * decode_prompt_len),
        max_running: max_batch.max(1),
        prefix_cache: false,
        spec: SpecMode::Fixed(0),
        draft_p_min: 0.0,
        isa: isa_level,
        kv_offload: None,
        device: Default::default(),
        huge_page_weights: false, // the bench's --huge-pages is process-wide
    };
    let engine = Engine::from_model(Arc::clone(&model), tokenizer, cfg)?;
    let vocab = c.vocab_size;
    let lo = 3.min(vocab as u32 - 1);

    // ---- prefill: one prompt per length in one chunk (max_tokens 1), best of prefill_reps
    let prefill_best_of = |len: usize, seed: u64| -> Result<f64> {
        let mut best = f64::INFINITY;
        for rep in 0..prefill_reps {
            progress(&format!("prefill {len} tokens (rep {})", rep + 1));
            let mut r = Request::new(Prompt::Tokens(random_tokens(
                len,
                vocab,
                lo,
                seed + rep as u64,
            )));
            r.sampling.max_tokens = 1;
            r.sampling.ignore_eos = true;
            best = best.min(super::run_to_completion(&engine, vec![r])?.wall_s);
        }
        Ok(best)
    };
    let prefill_best = prefill_best_of(prefill_len, a.seed + 100)?;
    let pf_flops = prefill_flops(&c, &costs, prefill_len);
    let prefill_tps = prefill_len as f64 / prefill_best;
    let prefill_frac = pf_flops / prefill_best / peak;
    let long_prefills = more_prefills
        .iter()
        .map(|&len| Ok((len, prefill_best_of(len, a.seed + 200)?)))
        .collect::<Result<Vec<(usize, f64)>>>()?; // (len, best seconds)

    // ---- decode at each batch size
    let kv_bpt = engine.stats().target_kv_bytes_per_token;
    let mut decodes = Vec::new();
    for (bi, &b) in batches.iter().enumerate() {
        progress(&format!("decode batch {b}: {decode_steps} steps"));
        decodes.push(decode(
            &engine,
            b,
            decode_prompt_len,
            warmup,
            decode_steps,
            vocab,
            lo,
            a.seed + 1000 * (bi as u64 + 1),
            a.decode_temperature,
        )?);
    }

    // ---- batch-1 decode at long context (one request, prompt of that length)
    let mut long_decodes = Vec::new();
    for (i, &ctx) in long_ctx.iter().enumerate() {
        progress(&format!(
            "decode at context {ctx}: prefill, then {long_steps} steps"
        ));
        long_decodes.push(decode(
            &engine,
            1,
            ctx,
            1,
            long_steps,
            vocab,
            lo,
            a.seed + 77_000 + i as u64,
            0.0,
        )?);
    }
    let rss = super::rss_bytes();
    // How the weights are mapped (2 MB pages or not) after the runs above touched them: a
    // comparison with another engine on the same files should state both sides' page sizes.
    // (--huge-pages copies the files unless the loader packs most of their bytes, whose packed
    // copies are in anonymous 2 MB pages either way: both counted by `anon_huge`.)
    let pages = specmla::weights::mapped_pages_under(&dir).filter(|p| p.mappings > 0);
    let anon_huge = super::anon_huge_bytes();

    // ---- interleaved roofline: [bandwidth probe, batch-1 decode] per round, after the RSS
    // reading (the probe's buffer is not part of the engine's footprint). A noisy host changes
    // its bandwidth from one minute to the next; the probe right before each decode run is
    // the bandwidth that run had.
    let rounds = a.roofline_rounds.unwrap_or(if a.quick { 2 } else { 5 });
    let mut interleaved = Vec::new(); // (probe bytes/s, step seconds, mean context)
    for r in 0..rounds {
        progress(&format!(
            "roofline round {}/{rounds}: probe, then {decode_steps} decode steps",
            r + 1
        ));
        let bw_r = pool.install(|| measure_read_bandwidth(probe_bytes, 3));
        let d = decode(
            &engine,
            1,
            decode_prompt_len,
            warmup,
            decode_steps,
            vocab,
            lo,
            a.seed + 5000 + r as u64,
            0.0,
        )?;
        interleaved.push((bw_r, d.secs / d.steps as f64, d.mean_ctx));
    }

    // ---- report
    let b1 = decodes.iter().find(|d| d.batch == 1);
    let roof = b1.map(|d| {
        let step = d.secs / d.steps as f64;
        let kv_read = d.mean_ctx * kv_bpt as f64;
        let bytes = model_bytes as f64 + kv_read;
        (bytes, kv_read, bytes / step / bw)
    });
    let mut text = String::new();
    text += &format!(
        "machine: {threads} threads, read bandwidth {:.1} GB/s, peak {:.1} GFLOP/s (f32 FMA)\n",
        bw / 1e9,
        peak / 1e9
    );
    text += &format!(
        "model: {} ({}), {} layers, {:.1}M params, {:.1}M active/token, {} bytes/weight; {}\n",
        if model_dir.is_some() {
            dir.display().to_string()
        } else {
            "random benchmark model".into()
        },
        c.model_type.as_str(),
        c.num_hidden_layers,
        model.num_params() as f64 / 1e6,
        costs.active_params as f64 / 1e6,
        wb,
        if model_dir.is_some() {
            format!("loaded in {load_s:.1} s")
        } else {
            format!("written in {write_s:.1} s, loaded in {load_s:.1} s")
        }
    );
    text += &format!(
        "decode weight bytes/token: Model::decode_bytes_per_token {:.1} MB, config estimate {:.1} MB ({})\n",
        model_bytes as f64 / 1e6,
        costs.decode_weight_bytes as f64 / 1e6,
        if model_bytes == costs.decode_weight_bytes { "equal".to_string() } else {
            format!("differ by {:.2}%", 100.0 * (model_bytes as f64 - costs.decode_weight_bytes as f64) / costs.decode_weight_bytes as f64)
        }
    );
    text += &format!("KV bytes/token ({}, all layers): {kv_bpt}\n", a.kv_dtype);
    text += &format!(
        "kernels: {}; weight prefetch into {}{}\n\n",
        isa.describe(),
        specmla::kernels::prefetch_hint().name().to_uppercase(),
        if isa.bf16_dot() {
            format!(
                " (bf16-dot tiles of several tokens: {})",
                specmla::kernels::tile_prefetch_hint().name().to_uppercase()
            )
        } else {
            String::new()
        }
    );
    text += &format!(
        "prefill {prefill_len} tokens: {:.3} s (best of {prefill_reps}) = {:.1} tokens/s; {:.1} GFLOP -> {:.1} GFLOP/s = {:.1}% of peak\n\n",
        prefill_best,
        prefill_tps,
        pf_flops / 1e9,
        pf_flops / prefill_best / 1e9,
        100.0 * prefill_frac
    );
    for (len, best) in &long_prefills {
        let f = prefill_flops(&c, &costs, *len);
        text += &format!(
            "prefill {len} tokens: {best:.3} s (best of {prefill_reps}) = {:.1} tokens/s; {:.1} GFLOP -> {:.1} GFLOP/s = {:.1}% of peak\n",
            *len as f64 / best,
            f / 1e9,
            f / best / 1e9,
            100.0 * f / best / peak
        );
    }
    if !long_prefills.is_empty() {
        text += "\n";
    }
    let rows: Vec<Vec<String>> = decodes
        .iter()
        .chain(&long_decodes)
        .map(|d| {
            vec![
                d.batch.to_string(),
                format!("{:.1}", d.tokens as f64 / d.secs),
                format!("{:.1}", 1e3 * d.secs / d.steps as f64),
                format!("{:.1}", 1e3 * d.step_p50_s),
                format!("{:.0}", d.mean_ctx),
                d.steps.to_string(),
                format!("{:.1}", d.weight_bytes_per_step / 1e6),
            ]
        })
        .collect();
    text += &table(
        &[
            "batch",
            "decode tok/s",
            "ms/step mean",
            "ms/step p50",
            "context",
            "steps",
            "weight MB/step",
        ],
        &rows,
    );
    if let Some((bytes, kv_read, frac)) = roof {
        let d = b1.expect("batch 1");
        let step = d.secs / d.steps as f64;
        text += &format!(
            "batch-1 roofline: {:.1} MB weights + {:.2} MB KV per step / {:.1} ms = {:.1} GB/s = {:.1}% of measured bandwidth\n",
            model_bytes as f64 / 1e6,
            kv_read / 1e6,
            1e3 * step,
            bytes / step / 1e9,
            100.0 * frac
        );
    }
    for d in &long_decodes {
        let step = d.secs / d.steps as f64;
        let kv_read = d.mean_ctx * kv_bpt as f64;
        text += &format!(
            "batch-1 decode at context {:.0}: {:.1} tok/s; {:.1} MB weights + {:.1} MB KV per step = {:.1}% of measured bandwidth\n",
            d.mean_ctx,
            d.tokens as f64 / d.secs,
            model_bytes as f64 / 1e6,
            kv_read / 1e6,
            100.0 * (model_bytes as f64 + kv_read) / step / bw
        );
    }
    let inter_fracs: Vec<f64> = interleaved
        .iter()
        .map(|&(bw_r, step, ctx)| (model_bytes as f64 + ctx * kv_bpt as f64) / step / bw_r)
        .collect();
    if !interleaved.is_empty() {
        let cells: Vec<String> = interleaved
            .iter()
            .zip(&inter_fracs)
            .map(|(&(bw_r, step, _), f)| {
                format!(
                    "{:.1} GB/s {:.1} ms {:.1}%",
                    bw_r / 1e9,
                    1e3 * step,
                    100.0 * f
                )
            })
            .collect();
        text += &format!(
            "batch-1 roofline, interleaved ({} rounds of probe + {decode_steps} steps): median {:.1}% of the bandwidth probed just before (min {:.1}%, max {:.1}%): {}\n",
            interleaved.len(),
            100.0 * super::percentile(&inter_fracs, 50.0),
            100.0 * super::min_max(&inter_fracs).0,
            100.0 * super::min_max(&inter_fracs).1,
            cells.join("; ")
        );
    }
    if let Some((hwm, now)) = rss {
        text += &format!(
            "memory: peak RSS {:.2} GB, RSS now {:.2} GB; weights {:.2} GB, KV pool {:.2} GB\n",
            hwm as f64 / 1e9,
            now as f64 / 1e9,
            model.matrices().iter().map(|m| m.nbytes()).sum::<usize>() as f64 / 1e9,
            (num_blocks * block_size * kv_bpt) as f64 / 1e9
        );
    }
    if let Some(p) = pages {
        text += &format!(
            "weights: {:.2} GB of the mapped files resident, {:.1}% of it in 2 MB pages\n",
            p.resident_bytes as f64 / 1e9,
            100.0 * p.huge_fraction()
        );
    }
    if let Some(h) = anon_huge {
        text += &format!(
            "anonymous 2 MB pages (packed bf16 strips; file copies of --huge-pages): {:.2} GB\n",
            h as f64 / 1e9
        );
    }
    let json = json!({
        "isa": isa.to_string(),
        "weights_pages": json!({
            "huge_pages_asked": a.huge_pages,
            "anon_huge_bytes": anon_huge,
            "mapped_resident_bytes": pages.map(|p| p.resident_bytes),
            "mapped_huge_bytes": pages.map(|p| p.huge_bytes),
            "mapped_huge_fraction": pages.map(|p| p.huge_fraction()),
        }),
        "peak_rss_bytes": rss.map(|r| r.0),
        "prefill_long": long_prefills.iter().map(|(len, best)| json!({"tokens": len, "seconds_best": best, "tokens_per_s": *len as f64 / best})).collect::<Vec<_>>(),
        "decode_long_context": long_decodes.iter().map(|d| json!({
            "context": d.mean_ctx, "steps": d.steps, "tokens_per_s": d.tokens as f64 / d.secs,
            "ms_per_step_p50": 1e3 * d.step_p50_s,
        })).collect::<Vec<_>>(),
        "threads": threads,
        "read_bandwidth_bytes_per_s": bw,
        "peak_flops": peak,
        "model": {
            "path": if model_dir.is_some() { dir.display().to_string() } else { "random".into() },
            "num_params": model.num_params(),
            "active_params_per_token": costs.active_params,
            "bytes_per_weight": wb,
            "decode_bytes_per_token_model": model_bytes,
            "decode_bytes_per_token_config": costs.decode_weight_bytes,
            "write_s": write_s,
            "load_s": load_s,
        },
        "kv_dtype": a.kv_dtype,
        "decode_temperature": a.decode_temperature,
        "kv_bytes_per_token": kv_bpt,
        "prefill": {
            "tokens": prefill_len, "seconds_best": prefill_best, "tokens_per_s": prefill_tps,
            "flops": pf_flops, "compute_bound_fraction": prefill_frac, "reps": prefill_reps,
        },
        "decode": decodes.iter().map(|d| json!({
            "batch": d.batch, "steps": d.steps, "tokens": d.tokens, "seconds": d.secs,
            "tokens_per_s": d.tokens as f64 / d.secs, "ms_per_step_mean": 1e3 * d.secs / d.steps as f64,
            "ms_per_step_p50": 1e3 * d.step_p50_s, "mean_context": d.mean_ctx,
            "weight_bytes_per_step": d.weight_bytes_per_step,
        })).collect::<Vec<_>>(),
        "batch1_roofline_interleaved": interleaved.iter().zip(&inter_fracs).map(|(&(bw_r, step, ctx), f)| json!({
            "read_bandwidth_bytes_per_s": bw_r, "step_s": step, "mean_context": ctx, "bandwidth_fraction": f,
        })).collect::<Vec<_>>(),
        "batch1_roofline_interleaved_median": (!inter_fracs.is_empty()).then(|| super::percentile(&inter_fracs, 50.0)),
        "batch1_roofline": roof.map(|(bytes, kv_read, frac)| json!({
            "bytes_per_step": bytes, "kv_bytes_per_step": kv_read, "bandwidth_fraction": frac,
        })),
    });
    Ok(Section {
        name: "engine",
        json,
        text,
    })
}

/// Run `b` requests to steady-state decode and time `steps` steps in which all of them decode
/// (random `prompt_len`-token prompts; `temperature` 0 decodes greedily, above 0 samples,
/// seeded per request).
#[allow(clippy::too_many_arguments)]
fn decode(
    engine: &Engine,
    b: usize,
    prompt_len: usize,
    warmup: usize,
    steps: usize,
    vocab: usize,
    lo: u32,
    seed: u64,
    temperature: f32,
) -> Result<DecodeResult> {
    let mut ids = Vec::with_capacity(b);
    for i in 0..b {
        let mut r = Request::new(Prompt::Tokens(random_tokens(
            prompt_len,
            vocab,
            lo,
            seed + i as u64,
        )));
        r.sampling.max_tokens = 1 + warmup + steps;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = temperature;
        r.sampling.seed = seed + i as u64;
        ids.push(engine.submit(r)?);
    }
    let mut got = vec![0usize; b];
    let step = |got: &mut Vec<usize>| -> Result<usize> {
        let mut n = 0;
        for ev in engine.step()? {
            if let Some(i) = ids.iter().position(|&x| x == ev.id) {
                got[i] += ev.tokens.len();
                n += ev.tokens.len();
            }
        }
        Ok(n)
    };
    // prefill until every request has its first token, then warm up
    let mut guard = 0;
    while got.contains(&0) {
        step(&mut got)?;
        guard += 1;
        if guard > 10_000 {
            return Err(Error::Engine("bench: prefill did not finish".into()));
        }
    }
    for _ in 0..warmup {
        step(&mut got)?;
    }
    let ctx0 = prompt_len + got.iter().sum::<usize>() / b;
    let mut times = Vec::with_capacity(steps);
    let mut tokens = 0;
    let before = engine.stats().target_weight_bytes;
    let t0 = Instant::now();
    for _ in 0..steps {
        let t = Instant::now();
        tokens += step(&mut got)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let secs = t0.elapsed().as_secs_f64();
    let weight_bytes = engine.stats().target_weight_bytes - before;
    while engine.has_work() {
        engine.step()?;
    }
    Ok(DecodeResult {
        batch: b,
        steps,
        tokens,
        secs,
        step_p50_s: super::percentile(&times, 50.0),
        // the step at context L reads L cached tokens (prompt + generated - 1, plus the new one)
        mean_ctx: ctx0 as f64 + (steps as f64 - 1.0) / 2.0,
        weight_bytes_per_step: weight_bytes as f64 / steps.max(1) as f64,
    })
}

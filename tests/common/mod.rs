//! Shared helpers for integration tests: golden fixtures, KV caches, single-sequence forwards.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};
use specmla::weights::{WeightSource, WeightStore};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("models/golden"))
        .expect("models/golden")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    v.sort();
    v
}

/// Reference prompts (token ids) and full-forward logits [len, vocab] of a golden fixture.
pub fn golden_reference(dir: &Path) -> Vec<(Vec<u32>, Vec<f32>)> {
    let st = WeightStore::open(WeightSource::File(dir.join("reference.safetensors")))
        .expect("reference");
    let mut out = Vec::new();
    for i in 0.. {
        let Some(p) = st.get(&format!("prompt_{i}")) else {
            break;
        };
        let ids: Vec<u32> = p
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect();
        let l = st.get(&format!("logits_full_{i}")).expect("logits");
        let logits: Vec<f32> = l
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        out.push((ids, logits));
    }
    out
}

pub fn kv_for(model: &Model, dtype: KvDtype, num_blocks: usize) -> KvCache {
    let c = &model.config;
    KvCache::new(KvConfig::for_model(c, 16, num_blocks, dtype)).unwrap()
}

/// Run `tokens` through the model in chunks of the given sizes (all through the path chosen by
/// `mha_until`), returning the logits of every position [len, vocab].
pub fn run_chunked(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    chunk: usize,
    mha_until: usize,
) -> Vec<f32> {
    let mut seq = SeqKv::new();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < tokens.len() {
        let end = (pos + chunk).min(tokens.len());
        let plan = kv.plan_grow(&seq, end).unwrap();
        kv.commit_grow(&mut seq, plan);
        let l = model
            .forward(
                kv,
                &[SeqChunk {
                    kv: &seq,
                    start: pos,
                    tokens: &tokens[pos..end],
                    mha_until,
                    logits: LogitsMode::All,
                }],
            )
            .unwrap();
        out.extend_from_slice(&l);
        kv.set_len(&mut seq, end);
        pos = end;
    }
    kv.free(&mut seq);
    out
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

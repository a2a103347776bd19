//! The second KV tier (`EngineConfig::kv_offload`, `specmla generate --kv-offload-dir`):
//! - in one engine, prefix blocks evicted from a small pool come back from host memory on a later
//!   prefix hit (cached prompt tokens > 0, blocks restored), outputs bitwise the ones of an engine
//!   without the tier (tokens and log-probs);
//! - two processes in a row with the same offload directory: the second reports cached prompt
//!   tokens for the shared prompts and produces identical outputs; a truncated file, and a file
//!   written for another model put in its place, are ignored (counted in the metrics), never
//!   trusted, and outputs stay identical;
//! - the MTP drafter's cache has its own tier file: a second engine restores prompt blocks in
//!   both caches and drafts exactly what the first drafted;
//! - a V4 target (sliding-window class): records carry the window-class rows, restored prefix
//!   hits get their lookback, outputs bitwise equal across engines and after evictions.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_same_outputs, repo, run_checked, spec_test_cfg};
use serde_json::Value;
use specmla::engine::{DraftSource, Engine, Prompt, Request};
use specmla::kv::TierConfig;
use specmla::spec::SpecMode;

fn target() -> PathBuf {
    repo().join("models/target")
}

fn workload(n: usize) -> Vec<Vec<u32>> {
    common::workload_prompt_ids(n)
}

fn req(ids: &[u32]) -> Request {
    let mut r = Request::new(Prompt::Tokens(ids.to_vec()));
    r.sampling.max_tokens = 24;
    r.logprobs = true;
    r
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("specmla-kvtier-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn evicted_prefix_blocks_come_back_from_host_memory() {
    let prompts = workload(12);
    let reqs: Vec<Request> = prompts.iter().map(|p| req(p)).collect();
    let mut c = spec_test_cfg(SpecMode::Fixed(3));
    c.block_size = 8;
    c.num_blocks = 40; // a few prompts' worth: later prompts evict earlier prompts' blocks
    c.max_running = 2;
    let plain = Engine::new(&target(), DraftSource::None, c.clone()).unwrap();
    let base = run_checked(&plain, reqs.clone(), &[]);
    c.kv_offload = Some(TierConfig {
        mem_bytes: 64 << 20,
        dir: None,
        ..Default::default()
    });
    let e = Engine::new(&target(), DraftSource::Dir(repo().join("models/draft")), c).unwrap();
    // every prompt once (filling and evicting the pool), then all of them again
    let first = run_checked(&e, reqs.clone(), &[]);
    assert_same_outputs("first pass", &base, &first, &reqs);
    let again = run_checked(&e, reqs.clone(), &[]);
    assert_same_outputs("restored pass", &base, &again, &reqs);
    let t = e.stats().kv.tier.expect("tier stats");
    assert!(t.offloaded_blocks > 0 && t.restored_blocks > 0, "{t:?}");
    let cached: u64 = again.iter().map(|o| o.counters.cached_prompt_tokens).sum();
    let pool_only = e.stats().kv.prefix_hit_tokens;
    assert!(cached > 0 && pool_only > 0, "cached {cached}");
    // the early prompts' blocks were evicted from the pool by the later ones: their hits are
    // the tier's
    assert!(
        again[0].counters.cached_prompt_tokens > 0,
        "{:?}",
        again[0].counters
    );
    let m = e.metrics_text();
    assert!(
        m.contains("specmla_kv_tier_blocks_total{event=\"restored\"}"),
        "{m}"
    );
}

/// The MTP drafter's cache has a tier of its own (the target reuses no more of a prefix than
/// the MTP restores, and the MTP needs the target's hidden states of every position it did not
/// restore): a second engine on the same directory reuses the first one's prompt blocks in
/// both caches, keeps plain outputs, and drafts exactly what the first engine drafted.
#[test]
fn a_second_engine_restores_the_mtp_cache_from_its_tier() {
    let d = tmp("mtp");
    let reqs: Vec<Request> = workload(6).iter().map(|p| req(p)).collect();
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    let plain = Engine::new(&target(), DraftSource::None, c.clone()).unwrap();
    let base = run_checked(&plain, reqs.clone(), &[]);
    c.kv_offload = Some(TierConfig {
        mem_bytes: 0,
        dir: Some(d.clone()),
        ..Default::default()
    });
    let one_by_one = |e: &Engine| -> Vec<specmla::engine::Output> {
        reqs.iter()
            .flat_map(|r| run_checked(e, vec![r.clone()], &[]))
            .collect()
    };
    let first = one_by_one(&Engine::new(&target(), DraftSource::Mtp, c.clone()).unwrap());
    assert_same_outputs("mtp, first engine", &base, &first, &reqs);
    let files = std::fs::read_dir(&d).unwrap().count();
    assert_eq!(files, 2, "the target's tier file and the MTP's");
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    let second = one_by_one(&e);
    assert_same_outputs("mtp, second engine", &base, &second, &reqs);
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        assert!(
            b.counters.cached_prompt_tokens >= 16,
            "prompt {i}: {:?}",
            b.counters
        );
        assert!(a.counters.drafted_tokens > 0, "prompt {i} drafted");
        common::assert_same_drafts(
            &format!("prompt {i}: drafts from a restored MTP cache"),
            a,
            b,
        );
    }
    let mtp_tier = e
        .stats()
        .draft_kv
        .and_then(|k| k.tier)
        .expect("MTP tier stats");
    assert!(mtp_tier.restored_blocks > 0, "{mtp_tier:?}");
    let _ = std::fs::remove_dir_all(&d);
}

fn cli(dir: &Path, prompts: &Path, metrics: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_specmla"))
        .args(["generate", "--json", "--logprobs", "--max-tokens", "16"])
        .args(["--draft", "models/draft", "--threads", "2"])
        .arg("--kv-offload-dir")
        .arg(dir)
        .arg("--prompts-file")
        .arg(prompts)
        .arg("--metrics")
        .arg(metrics)
        .current_dir(repo())
        .output()
        .expect("run specmla");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn same(label: &str, a: &[Value], b: &[Value]) {
    assert_eq!(a.len(), b.len(), "{label}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x["token_ids"], y["token_ids"], "{label}: prompt {i} tokens");
        assert_eq!(
            x["logprobs"], y["logprobs"],
            "{label}: prompt {i} log-probs"
        );
    }
}

fn cached(v: &[Value]) -> u64 {
    v.iter()
        .map(|o| o["counters"]["cached_prompt_tokens"].as_u64().unwrap())
        .sum()
}

fn metric(path: &Path, line_start: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{line_start}` in the metrics"))
}

#[test]
fn the_prefix_cache_outlives_the_process_and_bad_files_are_ignored() {
    let d = tmp("restart");
    std::fs::create_dir_all(&d).unwrap();
    let prompts = d.join("prompts.txt");
    let text = std::fs::read_to_string(repo().join("models/workload/prompts.txt")).unwrap();
    std::fs::write(
        &prompts,
        text.lines().take(6).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let tier = d.join("tier");
    let metrics = d.join("metrics.txt");
    let first = cli(&tier, &prompts, &metrics);
    assert_eq!(
        metric(&metrics, "specmla_kv_tier_blocks_total{event=\"restored\"}"),
        0
    );
    assert!(
        metric(
            &metrics,
            "specmla_kv_tier_blocks_total{event=\"persisted\"}"
        ) > 0
    );
    let second = cli(&tier, &prompts, &metrics);
    same("restart", &first, &second);
    assert!(
        cached(&second) > cached(&first),
        "the second process restored prompt blocks"
    );
    assert!(metric(&metrics, "specmla_kv_tier_blocks_total{event=\"restored\"}") > 0);
    // a truncated file: its cut record is dropped, the rest still serves, outputs identical
    let file = std::fs::read_dir(&tier)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .expect("tier file");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let third = cli(&tier, &prompts, &metrics);
    same("truncated file", &first, &third);
    assert_eq!(
        metric(&metrics, "specmla_kv_tier_rejected_total{what=\"record\"}"),
        1
    );
    // a file of another model under this model's name: ignored, outputs identical
    let other = d.join("other");
    let out = Command::new(env!("CARGO_BIN_EXE_specmla"))
        .args(["generate", "--max-tokens", "4", "--model", "models/draft"])
        .arg("--kv-offload-dir")
        .arg(&other)
        .arg("--prompts-file")
        .arg(&prompts)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let foreign = std::fs::read_dir(&other)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .expect("other model's tier file");
    std::fs::copy(&foreign, &file).unwrap();
    let fourth = cli(&tier, &prompts, &metrics);
    same("foreign file", &first, &fourth);
    assert_eq!(
        cached(&fourth),
        cached(&first),
        "nothing from a foreign file is trusted"
    );
    assert_eq!(
        metric(&metrics, "specmla_kv_tier_rejected_total{what=\"file\"}"),
        1
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// DeepSeek-V4 (sliding-window class): a record carries the block's window-class rows too, so
/// a prefix hit restored from the tier also gets its lookback; a second engine on the same
/// directory, and one engine whose small pools evict, both match plain decoding bitwise.
#[test]
fn a_v4_target_restores_prefixes_and_their_window_rows() {
    let v4 = repo().join("models/golden/v4_mixed");
    // prompts of 40-70 tokens: several 8-token blocks, windows (8) and compression blocks (4, 8)
    let reqs: Vec<Request> = common::budget_requests(10, 0x7a3, 40, 10, &[11, 12])
        .into_iter()
        .map(|mut r| {
            if let Prompt::Tokens(t) = &mut r.prompt {
                let extra: Vec<u32> = t.iter().map(|&x| 13 + (x * 7) % 115).collect();
                t.splice(0..0, extra.into_iter().chain((0..24).map(|i| 13 + i)));
            }
            r
        })
        .collect();
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.block_size = 8;
    let base = common::plain_outputs(&v4, &reqs);
    let d = tmp("v4");
    c.kv_offload = Some(TierConfig {
        mem_bytes: 0,
        dir: Some(d.clone()),
        ..Default::default()
    });
    let first = Engine::new(&v4, DraftSource::Ngram { min_n: 1, max_n: 3 }, c.clone()).unwrap();
    assert_same_outputs(
        "v4 first engine",
        &base,
        &run_checked(&first, reqs.clone(), &[]),
        &reqs,
    );
    drop(first);
    let second = Engine::new(&v4, DraftSource::Ngram { min_n: 1, max_n: 3 }, c.clone()).unwrap();
    let got = run_checked(&second, reqs.clone(), &[]);
    assert_same_outputs("v4 restored from the file", &base, &got, &reqs);
    let t = second.stats().kv.tier.expect("tier");
    let cached: u64 = got.iter().map(|o| o.counters.cached_prompt_tokens).sum();
    assert!(
        t.restored_blocks > 0 && cached > 0,
        "{t:?}, cached {cached}"
    );
    // memory tier with pools small enough to evict between the two passes
    c.kv_offload = Some(TierConfig {
        mem_bytes: 64 << 20,
        dir: None,
        ..Default::default()
    });
    c.num_blocks = 48;
    c.max_batch_tokens = 64;
    c.max_running = 2;
    let e = Engine::new(&v4, DraftSource::None, c).unwrap();
    assert_same_outputs(
        "v4 memory, pass 1",
        &base,
        &run_checked(&e, reqs.clone(), &[]),
        &reqs,
    );
    assert_same_outputs(
        "v4 memory, pass 2",
        &base,
        &run_checked(&e, reqs.clone(), &[]),
        &reqs,
    );
    let t = e.stats().kv.tier.expect("tier");
    assert!(t.offloaded_blocks > 0 && t.restored_blocks > 0, "{t:?}");
    let _ = std::fs::remove_dir_all(&d);
}

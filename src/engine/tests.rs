//! Unit tests of engine state the public API does not show (the bundled models; run from the
//! repository root like the integration tests).

use std::path::PathBuf;

use super::*;
use crate::kv::KvDtype;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Token ids of the first `n` prompts of the bundled workload.
fn workload_prompts(n: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(repo().join("models/workload/prompts.jsonl"))
        .expect("bundled workload");
    text.lines()
        .take(n)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("workload line");
            v["prompt_token_ids"]
                .as_array()
                .expect("prompt_token_ids")
                .iter()
                .map(|x| x.as_u64().expect("token id") as u32)
                .collect()
        })
        .collect()
}

/// One thread, f32 KV, prefix caching, adaptive drafting up to 4 tokens.
fn adaptive_cfg() -> EngineConfig {
    EngineConfig {
        kv_dtype: KvDtype::F32,
        spec: SpecMode::Adaptive { k_max: 4 },
        threads: 1,
        num_blocks: 256,
        draft_num_blocks: 256,
        prefix_cache: true,
        ..EngineConfig::default()
    }
}

/// A request admitted over a reused prompt prefix owes its drafter only the rest of its
/// context: the draft model restored the prefix from its own cache (here all of it), the MTP
/// layer skips it. Counting the whole context (as before) made the adaptive policy price a
/// catch-up over the prefix that never runs.
#[test]
fn a_reused_prefix_is_not_part_of_the_drafters_lag() {
    let prompts = workload_prompts(2);
    for draft in [
        DraftSource::Dir(repo().join("models/draft")),
        DraftSource::Mtp,
    ] {
        let label = format!("{draft:?}");
        let e = Engine::new(&repo().join("models/target"), draft, adaptive_cfg()).expect("engine");
        let mut first = Request::new(Prompt::Tokens(prompts[0].clone()));
        first.sampling.max_tokens = 4;
        e.generate(vec![first]).expect("first request");
        // the same prompt, then another: its first blocks are in the prefix cache
        let mut ids = prompts[0].clone();
        ids.extend(&prompts[1][1..]);
        let id = e.submit(Request::new(Prompt::Tokens(ids))).expect("submit");
        e.step().expect("admission and prefill");
        let core = lock(&e.core);
        let r = core.running.iter().find(|r| r.id == id).expect("running");
        let cached = r.counters.cached_prompt_tokens as usize;
        assert!(cached >= 16, "{label}: {cached} prompt tokens reused");
        assert!(
            r.tokens.len() > r.prompt_len,
            "{label}: prefilled in one step"
        );
        assert_eq!(
            r.drafter_lag(),
            r.tokens.len() - cached,
            "{label}: the drafter's lag after a reuse of {cached} tokens"
        );
    }
}

/// A drafter installed beside a running request: a draft model replays the whole context it
/// has not seen (its lag is the request's length), the MTP layer skips it — it has no hidden
/// states for what the target computed before the swap — and owes nothing of it.
#[test]
fn a_drafter_swapped_in_mid_request_owes_only_what_it_replays() {
    let prompts = workload_prompts(1);
    for (draft, replays) in [
        (DraftSource::Dir(repo().join("models/draft")), true),
        (DraftSource::Mtp, false),
    ] {
        let label = format!("{draft:?}");
        let target = repo().join("models/target");
        let e = Engine::new(&target, DraftSource::None, adaptive_cfg()).expect("engine");
        let mut req = Request::new(Prompt::Tokens(prompts[0].clone()));
        req.sampling.max_tokens = 32;
        let id = e.submit(req).expect("submit");
        for _ in 0..4 {
            e.step().expect("prefill and three plain steps");
        }
        e.set_draft_weights_blocking(draft).expect("swap");
        let mut core = lock(&e.core);
        e.swaps.apply_ready(&mut core);
        let r = core.running.iter().find(|r| r.id == id).expect("running");
        assert!(r.tokens.len() > r.prompt_len + 2, "{label}: decoding");
        let want = if replays { r.tokens.len() } else { 0 };
        assert_eq!(r.drafter_lag(), want, "{label}: the lag at the swap");
    }
}

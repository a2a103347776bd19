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

/// A draft model whose own cache holds less of a reused prompt prefix than the target's (a
/// smaller draft cache evicted part of the prefix's blocks while the target kept them all) catches up from
/// what it holds: its lag counts the context it has not fed, not the target's reused length, and
/// the request's output is bitwise the plain engine's (tokens and log-probs) while it still
/// drafts and accepts.
#[test]
fn a_draft_model_holding_less_of_a_prefix_catches_up_from_what_it_holds() {
    let prompts = workload_prompts(6);
    let mut ids = prompts[0].clone();
    ids.extend(&prompts[1][1..]);
    let target = repo().join("models/target");
    let cfg = EngineConfig {
        spec: SpecMode::Fixed(3),
        // 192 tokens: the long request below needs every block of it
        draft_num_blocks: 12,
        ..adaptive_cfg()
    };
    let e = Engine::new(
        &target,
        DraftSource::Dir(repo().join("models/draft")),
        cfg.clone(),
    )
    .expect("engine");
    let mut first = Request::new(Prompt::Tokens(prompts[0].clone()));
    first.sampling.max_tokens = 4;
    e.generate(vec![first]).expect("first request");
    // ~160 prompt tokens + 24 generated: the draft cache evicts some of the first prompt's
    // cached blocks (here the second of two), the target's (256 blocks) keeps them
    let mut long: Vec<u32> = prompts[2].clone();
    for p in &prompts[3..6] {
        long.extend(&p[1..]);
    }
    let mut evicting = Request::new(Prompt::Tokens(long));
    evicting.sampling.max_tokens = 24;
    e.generate(vec![evicting]).expect("evicting request");
    let mut req = Request::new(Prompt::Tokens(ids.clone()));
    req.sampling.max_tokens = 40;
    let id = e.submit(req).expect("submit");
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    let mut take = |events: Vec<Event>| {
        let mut done = false;
        for ev in events.into_iter().filter(|ev| ev.id == id) {
            tokens.extend_from_slice(&ev.tokens);
            logprobs.extend_from_slice(&ev.logprobs);
            done |= ev.finish.is_some();
        }
        done
    };
    let mut done = take(e.step().expect("admission and prefill"));
    {
        let core = lock(&e.core);
        let r = core.running.iter().find(|r| r.id == id).expect("running");
        let cached = r.counters.cached_prompt_tokens as usize;
        assert!(cached >= 16, "the target reused {cached} prompt tokens");
        // the draft model restored whole blocks of the prefix, fewer than the target reused
        let held = r.tokens.len() - r.drafter_lag();
        assert!(
            held < cached,
            "the draft model holds {held} of the {cached} reused tokens"
        );
        assert!(
            held > 0,
            "a partial hold (the eviction left the first block)"
        );
        assert_eq!(held % cfg.block_size, 0, "whole blocks restored: {held}");
    }
    while !done {
        done = take(e.step().expect("step"));
    }
    let counters = e.request_counters(id).expect("counters");
    assert!(counters.drafted_tokens > 0, "the request drafted");
    assert!(counters.accepted_tokens > 0, "and accepted drafts");

    let plain = Engine::new(
        &target,
        DraftSource::None,
        EngineConfig {
            spec: SpecMode::Fixed(0),
            prefix_cache: false,
            ..cfg
        },
    )
    .expect("plain engine");
    let mut req = Request::new(Prompt::Tokens(ids));
    req.sampling.max_tokens = 40;
    let want = plain.generate(vec![req]).expect("plain").remove(0);
    assert_eq!(tokens, want.token_ids, "tokens");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&logprobs), bits(&want.logprobs), "log-probs");
}

/// A request that starts drafting from a lag is priced at the decode batch of the steps that
/// will pay its catch-up back, not at the step it starts in: with costs under which one drafted
/// token per request pays at 3 decode requests and not at 4, a lagging request starts where
/// the batch stays at 3, and not in a step with a fourth request waiting to be admitted (the
/// same 3 decode requests in it). Priced at this step's 3, the MTP layer caught up on 58
/// positions in such a step on the widened target and stopped drafting in the next.
#[test]
fn a_start_is_priced_at_the_batch_ahead() {
    let prompts = workload_prompts(4);
    let cfg = EngineConfig {
        spec: SpecMode::Adaptive { k_max: 1 },
        ..adaptive_cfg()
    };
    let starts = |waiting: bool| {
        let e = Engine::new(&repo().join("models/target"), DraftSource::Mtp, cfg.clone())
            .expect("engine");
        for p in &prompts[..3] {
            let mut req = Request::new(Prompt::Tokens(p.clone()));
            req.sampling.max_tokens = 200;
            e.submit(req).expect("submit");
        }
        for _ in 0..2 {
            e.step().expect("prefill, then a decode step");
        }
        if waiting {
            let mut req = Request::new(Prompt::Tokens(prompts[3].clone()));
            req.sampling.max_tokens = 200;
            e.submit(req).expect("submit the fourth");
        }
        let mut core = lock(&e.core);
        for cmd in e.rx.try_iter() {
            if let Command::Submit(r) = cmd {
                core.waiting.push_back(*r); // what the next step's start does
            }
        }
        assert_eq!(core.waiting.len(), usize::from(waiting));
        assert_eq!(core.n_decode(), 3, "three requests decoding");
        // plain steps: 30 ms at 3 requests, 30.5 ms at 4 (a memory-bound step); a drafted
        // token costs 4 ms to verify and 1 ms to draft; 62 % of drafts accepted, well known
        let mut target = crate::spec::policy::TargetCost::default();
        for _ in 0..50 {
            target.observe(3, 3, 0.030);
            target.observe(4, 4, 0.0305);
        }
        for _ in 0..50 {
            target.observe(3, 4, 0.034);
            target.observe(4, 5, 0.0345);
        }
        let mut draft = crate::spec::policy::LinearCost::default();
        for n in [1, 2, 3, 4, 1, 2, 3, 4] {
            draft.observe(n, 0.001 * n as f64);
        }
        core.target_cost = target;
        core.draft_cost = draft;
        core.pos_alpha = vec![0.62];
        core.pos_obs = vec![10_000];
        core.drafter_alpha = 0.62;
        core.drafter_obs = 10_000;
        core.idle_draft_steps = 0;
        core.catch_up_s_per_row = Some(1e-7);
        for r in core.running.iter_mut() {
            r.drafted_at = None; // the drafter lags the whole context
        }
        assert!(core.policy_informed());
        let plan = core.schedule(crate::spec::StepKind::Free);
        plan.iter().filter(|p| p.decode && p.k_model > 0).count()
    };
    assert!(
        starts(false) > 0,
        "at 3 decode requests, drafting pays: it starts"
    );
    assert_eq!(
        starts(true),
        0,
        "with a fourth arriving it would not pay: no start"
    );
}

/// Before the policy has its cost fits, one request explores: the one whose drafter has the
/// least to catch up on (here the shortest prompt, admitted second), not the first admitted.
#[test]
fn the_uninformed_explorer_is_the_cheapest_catch_up() {
    let prompts = workload_prompts(8);
    let mut by_len: Vec<&Vec<u32>> = prompts.iter().collect();
    by_len.sort_by_key(|p| p.len());
    let (short, long) = (by_len[0], by_len[by_len.len() - 1]);
    assert!(long.len() > short.len() + 8, "prompts of different lengths");
    let e = Engine::new(
        &repo().join("models/target"),
        DraftSource::Mtp,
        adaptive_cfg(),
    )
    .expect("engine");
    let mut ids = Vec::new();
    for p in [long, short, long] {
        let mut req = Request::new(Prompt::Tokens(p.clone()));
        req.sampling.max_tokens = 64;
        ids.push(e.submit(req).expect("submit"));
    }
    e.step().expect("admission and prefill");
    let mut core = lock(&e.core);
    assert_eq!(core.n_decode(), 3, "three requests decoding");
    assert!(!core.policy_informed(), "no decode step timed yet");
    let plan = core.schedule(crate::spec::StepKind::Free);
    let drafting: Vec<u64> = plan
        .iter()
        .filter(|p| p.decode && p.k_model > 0)
        .map(|p| core.running[p.idx].id)
        .collect();
    assert_eq!(
        drafting,
        vec![ids[1]],
        "the shortest context explores, alone"
    );
}

//! The MTP drafter (the target's own DeepSeek-V3 multi-token-prediction layer, stored in
//! models/target as the second shard mtp.safetensors and trained by tools/train/train_mtp.py):
//! - its log-probs equal the torch reference (tools/train/train_mtp.py --reference, fp32 compute
//!   over the same bf16 weights) to 1e-4;
//! - greedy speculation with it is bitwise lossless (tokens and committed log-probs) for k = 1..4,
//!   across reasoning budgets (none / 0 / 1 / < k / half), chunked prefill, preemption with
//!   recompute and its own fp8 KV cache, and swaps to and from it mid-generation;
//! - prefix caching keeps working with it: its own KV of a cached prompt prefix is restored
//!   (drafts exactly as without prefix caching), also under eviction, preemption, chunked
//!   prefill and swaps; what it does not hold of a prefix the target reuses it skips (partial
//!   context), as it does the positions before it was swapped in mid-request, and it still
//!   drafts there;
//! - it gets drafts accepted (it was trained for this target), and a target without an MTP layer
//!   refuses it with a clear error;
//! - in adaptive mode, until the policy has its cost fits, one request at a time explores.

mod common;

use std::path::PathBuf;

use common::{
    assert_same_outputs, exact, reference_cases, repo, run_checked, spec_test_cfg, target_hidden,
};
use serde_json::Value;
use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Prompt, Request};
use specmla::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use specmla::model::{LogitsMode, Model, SeqChunk};
use specmla::sampling::log_softmax;
use specmla::spec::SpecMode;

fn target() -> PathBuf {
    repo().join("models/target")
}

fn cfg(spec: SpecMode) -> EngineConfig {
    spec_test_cfg(spec)
}

/// Workload prompts with budget edge cases.
fn requests(n: usize) -> Vec<Request> {
    let text =
        std::fs::read_to_string(repo().join("models/workload/prompts.jsonl")).expect("workload");
    text.lines()
        .take(n)
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).unwrap();
            let ids: Vec<u32> = v["prompt_token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let natural = v["natural_thinking_tokens"].as_u64().unwrap_or(40) as usize;
            let mut r = Request::new(Prompt::Tokens(ids));
            r.sampling.max_tokens = 96;
            r.reasoning_budget = match i % 6 {
                0 | 1 => None,
                2 => Some(0),
                3 => Some(1),
                4 => Some(3),
                _ => Some(natural / 2),
            };
            r.logprobs = true;
            r
        })
        .collect()
}

fn run(engine: &Engine, reqs: Vec<Request>, swaps: &[(u64, DraftSource)]) -> Vec<Output> {
    run_checked(engine, reqs, swaps)
}

/// Each request run alone, one after the other (each finds the previous ones' blocks cached).
fn one_at_a_time(engine: &Engine, reqs: &[Request]) -> Vec<Output> {
    reqs.iter()
        .flat_map(|r| run(engine, vec![r.clone()], &[]))
        .collect()
}

fn assert_same(label: &str, base: &[Output], got: &[Output], reqs: &[Request]) {
    assert_same_outputs(label, base, got, reqs)
}

#[test]
fn mtp_log_probs_match_the_torch_reference() {
    exact(mtp_log_probs_match_the_torch_reference_on_exact_level)
}

fn mtp_log_probs_match_the_torch_reference_on_exact_level() {
    let model = Model::load_dir(&target()).unwrap();
    assert_eq!(model.mtp.len(), 1, "models/target holds one MTP layer");
    let c = &model.config;
    let mut cases = 0;
    let refs = reference_cases(
        &repo().join("models/golden/mtp_reference.safetensors"),
        "mtp_log_probs",
    );
    for (i, (ids, want)) in refs.into_iter().enumerate() {
        let n = ids.len();
        // Target forward: final-norm hidden states of every position.
        let hidden = target_hidden(&model, &ids, 16); // [n, hidden]
                                                      // MTP over positions 0..n-2: token j+1 with hidden j.
        let mut mkv =
            { KvCache::new(KvConfig::for_model(c, 16, 64, KvDtype::F32).with_layers(1)).unwrap() };
        let mut mseq = SeqKv::new();
        let plan = mkv.plan_grow(&mseq, n - 1).unwrap();
        mkv.commit_grow(&mut mseq, plan);
        let chunk = SeqChunk {
            kv: &mseq,
            start: 0,
            tokens: &ids[1..],
            mha_until: n,
            logits: LogitsMode::All,
        };
        let (logits, _) = model
            .mtp_forward(0, &mut mkv, &[chunk], &hidden[..(n - 1) * c.hidden_size])
            .unwrap();
        let v = c.vocab_size;
        let mut worst = 0f32;
        for j in 0..n - 1 {
            let lp = log_softmax(&logits[j * v..(j + 1) * v]);
            for (a, b) in lp.iter().zip(&want[j * v..(j + 1) * v]) {
                worst = worst.max((a - b).abs());
            }
        }
        assert!(
            worst < 1e-4,
            "case {i}: MTP log-probs differ from torch by {worst}"
        );
        cases += 1;
    }
    assert!(cases > 0, "reference cases");
}

#[test]
fn mtp_greedy_is_bitwise_lossless_for_every_k_budget_and_cache_layout() {
    let reqs = requests(18);
    let base = run(
        &Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap(),
        reqs.clone(),
        &[],
    );
    for k in 1..=4 {
        let e = Engine::new(&target(), DraftSource::Mtp, cfg(SpecMode::Fixed(k))).unwrap();
        let got = run(&e, reqs.clone(), &[]);
        assert_same(&format!("mtp k={k}"), &base, &got, &reqs);
        let t = e.stats().totals;
        assert!(t.accepted_tokens > 0 && t.drafted_tokens >= t.accepted_tokens);
        if k == 1 {
            let a = t.accepted_tokens as f64 / t.drafted_tokens as f64;
            assert!(a > 0.3, "trained MTP layer: k=1 acceptance {a}");
        }
    }
    // the confidence cut shortens MTP drafts only
    let mut c = cfg(SpecMode::Fixed(4));
    c.draft_p_min = 0.6;
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    assert_same(
        "mtp k=4 p_min=0.6",
        &base,
        &run(&e, reqs.clone(), &[]),
        &reqs,
    );
    // chunked prefill + fp8 MTP KV; a small pool forcing preemption and recompute
    let mut c = cfg(SpecMode::Fixed(3));
    c.max_batch_tokens = 7;
    c.draft_kv_dtype = Some(KvDtype::Fp8E4M3);
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    assert_same(
        "mtp chunked + fp8 kv",
        &base,
        &run(&e, reqs.clone(), &[]),
        &reqs,
    );
    let mut c = cfg(SpecMode::Fixed(2));
    c.num_blocks = 24;
    c.block_size = 8;
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    let got = run(&e, reqs.clone(), &[]);
    assert_same("mtp preemption", &base, &got, &reqs);
    assert!(
        got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0,
        "pool was meant to force preemption"
    );
    // adaptive
    let e = Engine::new(
        &target(),
        DraftSource::Mtp,
        cfg(SpecMode::Adaptive { k_max: 4 }),
    )
    .unwrap();
    assert_same("mtp adaptive", &base, &run(&e, reqs.clone(), &[]), &reqs);
}

#[test]
fn swaps_to_and_from_mtp_keep_outputs() {
    let reqs = requests(12);
    let base = run(
        &Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap(),
        reqs.clone(),
        &[],
    );
    let e = Engine::new(
        &target(),
        DraftSource::Dir(repo().join("models/draft")),
        cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    let swaps = vec![
        (4, DraftSource::Mtp),
        (20, DraftSource::Dir(repo().join("models/draft-weak"))),
        (30, DraftSource::Mtp),
        (45, DraftSource::None),
        (50, DraftSource::Mtp),
    ];
    let got = run(&e, reqs.clone(), &swaps);
    assert_same("swaps", &base, &got, &reqs);
    assert_eq!(e.stats().draft_generation, 5);
    assert_eq!(e.stats().drafter, "mtp");
}

/// Swapped in mid-generation, the MTP drafter drafts for the requests already running: it has
/// none of their hidden states before the swap, so it drafts over their context from the swap
/// on (partial context) instead of leaving them to decode plainly to the end. Outputs equal
/// plain decoding.
#[test]
fn the_mtp_drafter_swapped_in_mid_request_drafts_for_running_requests() {
    let reqs = requests(4);
    let plain = Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap();
    let base = run(&plain, reqs.clone(), &[]);
    let e = Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(2))).unwrap();
    let got = run(&e, reqs.clone(), &[(3, DraftSource::Mtp)]);
    assert_same("swap to mtp", &base, &got, &reqs);
    assert_eq!(e.stats().drafter, "mtp");
    let drafted: u64 = got.iter().map(|o| o.counters.drafted_tokens).sum();
    let accepted: u64 = got.iter().map(|o| o.counters.accepted_tokens).sum();
    assert!(
        got.iter()
            .all(|o| o.counters.cached_prompt_tokens == 0 && o.token_ids.len() > 8),
        "every request was prefilled before the swap and ran on past it"
    );
    assert!(
        drafted > 0 && accepted > 0,
        "{accepted} of {drafted} drafts accepted"
    );
}

/// Prefix caching with the MTP drafter: a request whose prompt shares a cached prefix reuses
/// the target's KV of it AND the MTP layer's own KV of it (the MTP needs the target's hidden
/// states of every position, which a reused prefix does not recompute). Outputs equal plain
/// decoding, and where the MTP held the whole reused prefix the drafts are exactly those of an
/// engine without prefix caching (same drafted and accepted counts per position, request by
/// request): the restored MTP KV is the one a full recompute writes. Where it held a block less
/// (the last request) the target still reuses its whole prefix and the MTP skips the block.
#[test]
fn prefix_cache_hits_restore_the_mtp_kv_and_keep_outputs_and_drafts() {
    let prompts = common::workload_prompt_ids(9);
    let mut system = prompts[7].clone(); // a shared "system" prefix (without its <think>)
    system.pop();
    assert!(
        system.len() >= 33,
        "shared prefix of {} tokens",
        system.len()
    );
    let mut reqs = requests(7);
    for (i, r) in reqs.iter_mut().enumerate() {
        // the last one shares exactly two blocks of tokens: the MTP's second block reads the
        // first token after them, so the MTP holds one block of the two the target reuses
        let mut p = if i == 6 {
            system[..32].to_vec()
        } else {
            system.clone()
        };
        p.extend(&prompts[i]);
        r.prompt = Prompt::Tokens(p);
    }
    let plain = Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap();
    let base = one_at_a_time(&plain, &reqs);
    let mut runs = Vec::new();
    for prefix_cache in [true, false] {
        let mut c = cfg(SpecMode::Fixed(3));
        c.prefix_cache = prefix_cache;
        let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
        let got = one_at_a_time(&e, &reqs);
        assert_same(&format!("prefix cache {prefix_cache}"), &base, &got, &reqs);
        runs.push((got, e.stats()));
    }
    let ((on, st_on), (off, _)) = (&runs[0], &runs[1]);
    // Whole 16-position blocks both caches hold: the target's keyed by t_0..t_{n-1}, the MTP's
    // by t_1..t_n (position j reads t_{j+1}).
    let full = ((system.len() - 1) / 16 * 16) as u64;
    for (i, (a, b)) in on.iter().zip(off).enumerate() {
        let want = match i {
            0 => 0,
            6 => 32,
            _ => full,
        };
        assert_eq!(
            a.counters.cached_prompt_tokens, want,
            "request {i}: {} prompt tokens reused",
            a.counters.cached_prompt_tokens
        );
        assert_eq!(b.counters.cached_prompt_tokens, 0);
        assert!(a.counters.drafted_tokens > 0, "request {i} drafted");
        assert!(
            a.counters.accepted_tokens > 0,
            "request {i} had drafts accepted"
        );
        if i == 6 {
            continue; // drafted over the skipped block: its drafts may differ
        }
        common::assert_same_drafts(
            &format!("request {i}: drafts with a restored MTP KV differ from a recomputed one"),
            a,
            b,
        );
    }
    let mtp_kv = st_on.draft_kv.as_ref().expect("MTP KV stats");
    assert!(
        mtp_kv.prefix_hit_tokens >= 5 * full + 16,
        "MTP prefix hits: {}",
        mtp_kv.prefix_hit_tokens
    );
}

/// The MTP drafter never makes the target recompute a cached prefix it does not hold: the
/// first request does not speculate (the MTP layer never sees its prompt), so the next ones,
/// sharing its prompt's prefix, find the target's blocks cached and the MTP's not (the second)
/// or only in part (the third: the second's prompt, one block short by the one-token-on keys).
/// The target reuses the whole cached prefix, the MTP skips what it lacks, and the requests
/// still draft and get at least 3/4 of the drafts accepted that an engine without prefix
/// caching (whole context recomputed) gets; outputs equal plain decoding, fixed k and adaptive.
#[test]
fn the_mtp_drafter_skips_a_cached_prefix_it_does_not_hold() {
    let prompts = common::workload_prompt_ids(4);
    let mut system = prompts[3].clone();
    system.pop();
    let full = ((system.len() - 1) / 16 * 16) as u64; // whole blocks of the shared prefix
    assert!(full >= 32, "shared prefix of {} tokens", system.len());
    let mut reqs = requests(3);
    for (i, r) in reqs.iter_mut().enumerate() {
        let mut p = system.clone();
        p.extend(&prompts[(i + 1) % 3]); // the first answers at length (34 tokens)
        r.prompt = Prompt::Tokens(p);
        r.speculate = i > 0;
        r.reasoning_budget = None;
    }
    let plain = Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap();
    let base = one_at_a_time(&plain, &reqs);
    for spec in [SpecMode::Fixed(2), SpecMode::Adaptive { k_max: 4 }] {
        let mut c = cfg(spec);
        c.prefix_cache = true;
        let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
        let got = one_at_a_time(&e, &reqs);
        assert_same(&format!("{spec:?}"), &base, &got, &reqs);
        for (i, o) in got.iter().enumerate().skip(1) {
            let reused = o.counters.cached_prompt_tokens;
            assert_eq!(reused, full, "{spec:?} request {i}: whole prefix reused");
            if let SpecMode::Fixed(_) = spec {
                assert!(
                    o.counters.drafted_tokens > 0,
                    "{spec:?} request {i} drafted"
                );
                assert!(
                    o.counters.accepted_tokens > 0,
                    "{spec:?} request {i}: none accepted"
                );
            }
        }
        if let SpecMode::Fixed(_) = spec {
            // Drafting over the skipped prefix keeps most of what the whole context gets.
            let mut c = cfg(spec);
            c.prefix_cache = false;
            let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
            let whole = one_at_a_time(&e, &reqs);
            let accepted = |outs: &[Output]| -> u64 {
                outs.iter()
                    .skip(1)
                    .map(|o| o.counters.accepted_tokens)
                    .sum()
            };
            let (skipped, recomputed) = (accepted(&got), accepted(&whole));
            assert!(
                4 * skipped >= 3 * recomputed,
                "{spec:?}: {skipped} drafts accepted over skipped prefixes, {recomputed} over \
                 recomputed ones"
            );
        }
    }
}

/// The MTP drafter over a partial context: with no state for a request (swapped in after its
/// prefill) it cannot draft until the target hands it hidden states; once it has them — from
/// position 0 (its own prefill), from past a prefix the target reused beyond what it restored,
/// or from the middle of a request (swapped in mid-request) — it drafts k tokens, its KV never
/// runs past the committed context, and releasing the request forgets it.
#[test]
fn the_mtp_drafter_drafts_over_a_partial_context() {
    use specmla::sampling::SamplingParams;
    use specmla::spec::{MtpProposer, ProposeRequest, Proposer};
    let model = std::sync::Arc::new(Model::load_dir(&target()).unwrap());
    let h = model.hidden_state_width();
    let prompt: Vec<u32> = common::workload_prompt_ids(1)[0].clone();
    let n = prompt.len();
    assert!(n > 24, "prompt of {n} tokens");
    let hidden = target_hidden(&model, &prompt, 16); // [n, hidden]
    let mut p = MtpProposer::new(model, KvDtype::F32, 64, 16).unwrap();
    assert!(
        !p.can_draft(1),
        "a request it holds nothing for (swapped in after its prefill)"
    );
    // the MTP cache holds nothing: the target may reuse all it holds; the MTP skips it
    assert_eq!(p.match_prefix(2, &prompt, n - 1), n - 1);
    p.settle_prefix(2, 16);
    assert!(
        p.can_draft(2),
        "target reused 16 positions the MTP lacks: skipped"
    );
    p.on_target_hidden(2, 16, &prompt[16..], &hidden[16 * h..]);
    // mid-request swap: the first hidden rows start at position 8
    p.on_target_hidden(3, 8, &prompt[8..], &hidden[8 * h..]);
    assert!(p.can_draft(3));
    // its own prefill: rows from position 0
    p.on_target_hidden(4, 0, &prompt, &hidden);
    let params = SamplingParams::default();
    let ask = |id| ProposeRequest {
        id,
        context: &prompt,
        prompt_len: n,
        k: 2,
        params: &params,
        arm: None,
        p_min: 0.0,
    };
    let props = p.propose(&[ask(2), ask(3), ask(4)]).unwrap();
    for (id, q) in [2, 3, 4].iter().zip(&props) {
        assert_eq!(q.tokens.len(), 2, "request {id} drafted k tokens");
        assert!(p.check(*id, &prompt).is_ok(), "{:?}", p.check(*id, &prompt));
    }
    p.release(4);
    assert!(!p.can_draft(4), "released");
}

/// The MTP layer's recorded held-out acceptance (the adaptive policy's prior for it) is read
/// from the checkpoint's mtp_stats.json; a missing, malformed or thin record gives None (the
/// generic prior), never an error.
#[test]
fn the_recorded_mtp_acceptance_is_read_only_when_trustworthy() {
    use specmla::spec::mtp::recorded_acceptance;
    let a = recorded_acceptance(&target()).expect("models/target records its MTP acceptance");
    let stats: Value =
        serde_json::from_str(&std::fs::read_to_string(target().join("mtp_stats.json")).unwrap())
            .unwrap();
    assert_eq!(a, stats["heldout_acceptance_k1"].as_f64().unwrap());
    let dir = std::env::temp_dir().join(format!("specmla-mtp-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(recorded_acceptance(&dir), None, "no file");
    for (body, why) in [
        ("{ not json", "malformed"),
        (
            r#"{"heldout_acceptance_k1": 0.8, "heldout_positions": 20}"#,
            "too few positions",
        ),
        (
            r#"{"heldout_acceptance_k1": 1.5, "heldout_positions": 4000}"#,
            "not a fraction",
        ),
        (
            r#"{"heldout_acceptance_k1": "0.8", "heldout_positions": 4000}"#,
            "not a number",
        ),
        (r#"{"heldout_positions": 4000}"#, "absent"),
    ] {
        std::fs::write(dir.join("mtp_stats.json"), body).unwrap();
        assert_eq!(recorded_acceptance(&dir), None, "{why}");
    }
    std::fs::write(
        dir.join("mtp_stats.json"),
        r#"{"heldout_acceptance_k1": 0.61, "heldout_positions": 900}"#,
    )
    .unwrap();
    assert_eq!(recorded_acceptance(&dir), Some(0.61));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Prefix hits with the MTP drafter under pressure, checked every step (the engine's and the
/// drafter's KV invariants): requests sharing prefixes of different lengths submitted together
/// and in waves, small pools that evict cached blocks of either cache and preempt requests
/// (readmitted onto whatever prefix is still cached), prefill in chunks, a swap away
/// from MTP and back mid-run. Outputs stay those of plain decoding.
#[test]
fn mtp_prefix_hits_under_eviction_preemption_and_swaps_keep_outputs() {
    let prompts = common::workload_prompt_ids(12);
    let system: Vec<u32> = prompts[11].clone();
    let mut reqs = requests(10);
    for (i, r) in reqs.iter_mut().enumerate() {
        // shares 0, 8, 20, 33 or all tokens of `system`, then its own question
        let share = [0, 8, 20, 33, system.len()][i % 5];
        let mut p = system[..share].to_vec();
        p.extend(&prompts[i]);
        r.prompt = Prompt::Tokens(p);
        r.sampling.max_tokens = 40;
        r.sampling.ignore_eos = true; // lengths that fill the small pool
    }
    let base = run(
        &Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap(),
        reqs.clone(),
        &[],
    );
    let mut c = cfg(SpecMode::Fixed(3));
    c.block_size = 8;
    c.num_blocks = 20; // one request's whole length fits; several preempt each other
    c.draft_num_blocks = 24;
    c.max_batch_tokens = 11; // prefill in chunks
    let e = Engine::new(&target(), DraftSource::Mtp, c.clone()).unwrap();
    let mut got = run(&e, reqs[..5].to_vec(), &[]);
    got.extend(run(&e, reqs[5..].to_vec(), &[]));
    assert_same("mtp prefix, small pools", &base, &got, &reqs);
    assert!(got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0);
    assert!(
        got.iter()
            .map(|o| o.counters.cached_prompt_tokens)
            .sum::<u64>()
            > 0
    );
    c.max_batch_tokens = 512;
    c.num_blocks = 512;
    let e = Engine::new(&target(), DraftSource::Mtp, c).unwrap();
    let swaps = vec![
        (3, DraftSource::Dir(repo().join("models/draft"))),
        (9, DraftSource::Mtp),
    ];
    let mut got = run(&e, reqs[..5].to_vec(), &swaps);
    got.extend(run(&e, reqs[5..].to_vec(), &swaps));
    assert_same("mtp prefix, swaps", &base, &got, &reqs);
}

#[test]
fn a_target_without_mtp_refuses_the_mtp_drafter() {
    let no_mtp = repo().join("models/golden/v3_dense3");
    let e = Engine::new(&no_mtp, DraftSource::Mtp, cfg(SpecMode::Fixed(2)));
    let msg = e.err().expect("refused").to_string();
    assert!(msg.contains("MTP"), "{msg}");
    let e = Engine::new(&no_mtp, DraftSource::None, cfg(SpecMode::Fixed(2))).unwrap();
    assert!(e.set_draft_weights_blocking(DraftSource::Mtp).is_err());
    assert_eq!(e.stats().drafter, "none");
}

#[test]
fn a_random_mtp_layer_is_lossless_too() {
    // v3_yarn's golden checkpoint carries a random MTP layer: acceptance ~0, outputs unchanged.
    let g = repo().join("models/golden/v3_yarn");
    let reqs: Vec<Request> = (0..8)
        .map(|i| {
            let mut r = Request::new(Prompt::Tokens(
                (0..5 + i).map(|t| 13 + (t * 7 + i) as u32 % 100).collect(),
            ));
            r.sampling.max_tokens = 20;
            r.logprobs = true;
            r
        })
        .collect();
    let base = run(
        &Engine::new(&g, DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap(),
        reqs.clone(),
        &[],
    );
    let e = Engine::new(&g, DraftSource::Mtp, cfg(SpecMode::Fixed(3))).unwrap();
    assert_same("random mtp", &base, &run(&e, reqs.clone(), &[]), &reqs);
    assert!(e.stats().totals.drafted_tokens > 0);
}

/// Workload requests without budgets, their plain outputs, and an engine with `drafter` and
/// `spec` that the test steps by hand (`Stepped`).
fn stepped(n: usize, drafter: DraftSource, spec: SpecMode) -> (Vec<Request>, Vec<Output>, Stepped) {
    let (reqs, plain) = unbudgeted(n);
    let mut s = Stepped::new(Engine::new(&target(), drafter, cfg(spec)).unwrap());
    for (r, p) in reqs.iter().zip(&plain) {
        s.submit(r, p);
    }
    (reqs, plain, s)
}

/// `n` workload requests without budgets and their plain outputs.
fn unbudgeted(n: usize) -> (Vec<Request>, Vec<Output>) {
    let reqs: Vec<Request> = requests(n)
        .into_iter()
        .map(|mut r| {
            r.reasoning_budget = None;
            r
        })
        .collect();
    let plain = run(
        &Engine::new(&target(), DraftSource::None, cfg(SpecMode::Fixed(0))).unwrap(),
        reqs.clone(),
        &[],
    );
    (reqs, plain)
}

/// An engine stepped one step at a time, its requests' outputs collected from the events.
struct Stepped {
    e: Engine,
    ids: Vec<u64>,
    got: Vec<Output>,
}

impl Stepped {
    fn new(e: Engine) -> Self {
        Stepped {
            e,
            ids: Vec::new(),
            got: Vec::new(),
        }
    }
    /// Submit `r`, its output collected from empty, its other fields (counters) from `plain`.
    fn submit(&mut self, r: &Request, plain: &Output) {
        let id = self.e.submit(r.clone()).unwrap();
        self.ids.push(id);
        self.got.push(Output {
            id,
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: String::new(),
            ..plain.clone()
        });
    }
    fn step(&mut self) {
        for ev in self.e.step().unwrap() {
            let o = self.got.iter_mut().find(|o| o.id == ev.id).unwrap();
            o.token_ids.extend(&ev.tokens);
            o.logprobs.extend(&ev.logprobs);
            if let Some(f) = ev.finish {
                o.finish_reason = f.as_str().into();
            }
        }
    }
    /// Requests that have drafted at least once (counters are unknown until a request's first
    /// step: none).
    fn drafting(&self) -> usize {
        self.ids
            .iter()
            .filter(|&&id| self.e.request_counters(id).is_ok_and(|c| c.draft_steps > 0))
            .count()
    }
    /// Drafting steps of all requests so far.
    fn draft_steps(&self) -> u64 {
        self.ids
            .iter()
            .filter_map(|&id| self.e.request_counters(id).ok())
            .map(|c| c.draft_steps)
            .sum()
    }
    /// Step until every request has committed its first token (the prompts are prefilled),
    /// checking `each` after every step.
    fn prefill(&mut self, mut each: impl FnMut(&Self)) {
        let answered = |s: &Self| {
            s.ids.iter().all(|&id| {
                s.e.request_counters(id)
                    .is_ok_and(|c| c.reasoning_tokens + c.answer_tokens > 0)
            })
        };
        while !answered(self) {
            self.step();
            each(self);
        }
    }
    /// Step to the end; the outputs with their counters.
    fn finish(mut self) -> Vec<Output> {
        let mut n = 0;
        while self.e.has_work() {
            self.step();
            n += 1;
            assert!(n < 20_000, "no progress");
        }
        for o in &mut self.got {
            o.counters = self.e.request_counters(o.id).unwrap();
        }
        self.got
    }
}

/// Adaptive mode explores with one request at a time: until the policy has its cost fits (and a
/// measured catch-up cost), at most one request per step starts drafting, because a drafter's
/// first round for a request runs it over the whole prompt (for sixteen requests at once that
/// was ~9 plain steps on the widened target), and the step after the first exploring step is
/// plain (the target's cost at a second token count). The outputs stay those of plain decoding.
#[test]
fn adaptive_mode_explores_with_one_request_at_a_time() {
    let (reqs, plain, mut s) = stepped(4, DraftSource::Mtp, SpecMode::Adaptive { k_max: 4 });
    // prefill (all four prompts fit one step's token budget): nobody drafts more than one
    s.prefill(|s| {
        assert!(
            s.drafting() <= 1,
            "more than one request explored during prefill"
        )
    });
    // the first decode steps: no cost fit yet, so one explorer (the oldest request)
    s.step();
    assert_eq!(
        s.drafting(),
        1,
        "exactly one request explores the first decode step"
    );
    // the next step drafts nothing: the target's step cost has been seen at one token count
    // (the explorer's verification) and a plain step gives the second, the cost of a verified
    // token, before the policy chooses k for everyone
    let drafted = s.draft_steps();
    s.step();
    assert_eq!(
        s.draft_steps(),
        drafted,
        "the step after the first exploring step is plain"
    );
    assert_eq!(s.drafting(), 1, "still one request has drafted");
    let got = s.finish();
    assert_same("adaptive mtp, one explorer", &plain, &got, &reqs);
}

/// Steps that also prefill are not timed for the adaptive policy's cost model, so while requests
/// keep arriving (one per step: every step prefills) the uninformed policy explores there only
/// to learn the drafter's acceptance: a draft model with no recorded acceptance until it has as
/// many verifications as the guess's weight (not in every other step as before: an MTP forward
/// each, for a fraction of a token, at batch 16), and the MTP layer, whose acceptance
/// `mtp_stats.json` records, not at all. The outputs stay those of plain decoding.
#[test]
fn adaptive_mode_stops_exploring_arrival_steps_once_acceptance_is_learned() {
    let (reqs, plain) = unbudgeted(14);
    let arrivals = |source: DraftSource| {
        let mut s = Stepped::new(
            Engine::new(&target(), source, cfg(SpecMode::Adaptive { k_max: 2 })).unwrap(),
        );
        for (r, p) in reqs.iter().zip(&plain) {
            s.submit(r, p);
            s.step();
        }
        let explored = s.draft_steps();
        let got = s.finish();
        assert_same("adaptive, arrivals", &plain, &got, &reqs);
        explored
    };
    let model = arrivals(DraftSource::Dir(repo().join("models/draft")));
    assert!(model >= 1, "the policy never explored the draft model");
    assert!(
        model as f64 <= specmla::spec::policy::ACCEPT_PRIOR_WEIGHT,
        "{model} exploring steps in {} arrival steps",
        reqs.len()
    );
    assert_eq!(
        arrivals(DraftSource::Mtp),
        0,
        "the MTP layer's acceptance is recorded: no exploring in untimed steps"
    );
}

/// A burst of new prompts does not stall a step: the MTP layer's catch-up over the prompts is
/// bounded per round (whole prompts while they fit 128 positions, then a part, the rest
/// waiting), so after the first decode step of eight ~40-token prompts only some requests have
/// drafted, later every one has, and the outputs equal plain decoding bitwise.
#[test]
fn mtp_catch_up_of_a_prompt_burst_is_bounded_per_round() {
    let (reqs, plain, mut s) = stepped(8, DraftSource::Mtp, SpecMode::Fixed(2));
    let lens: Vec<usize> = reqs
        .iter()
        .map(|r| match &r.prompt {
            Prompt::Tokens(t) => t.len(),
            _ => unreachable!(),
        })
        .collect();
    assert!(lens.iter().all(|&n| n > 17) && lens.iter().sum::<usize>() > 2 * 128);
    s.prefill(|_| {});
    s.step(); // the first decode step: the prompts' catch-up
    let drafted = s.drafting();
    assert!(
        (1..reqs.len()).contains(&drafted),
        "{drafted} of {} requests drafted in the burst's first round",
        reqs.len()
    );
    let got = s.finish();
    assert_same("mtp bounded catch-up", &plain, &got, &reqs);
    let late = got.iter().filter(|o| o.counters.draft_steps > 0).count();
    assert_eq!(late, reqs.len(), "every request drafts once caught up");
}

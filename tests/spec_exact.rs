//! Greedy speculation is lossless, bitwise: with a draft model (good or bad, any k, its own KV
//! dtype), with n-gram lookup and with the adaptive policy, every request's committed tokens AND
//! their target log-probs equal decoding without speculation — batched with other requests,
//! across reasoning-budget edge cases (none / 0 / 1 / < k / large, multi-token end marker, prompt
//! inside thinking, max_tokens inside thinking), stop tokens, chunked prefill, prefix-cache hits
//! and preemption. Engine invariants (KV lengths = committed lengths, budget never exceeded, draft
//! KV a prefix of the committed context) are checked after every step.

mod common;

use common::{assert_same_outputs, repo, run_checked, spec_test_cfg};
use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Prompt, Request};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;

const START: u32 = 10;
const END: [u32; 2] = [11, 12];

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

fn cfg(spec: SpecMode) -> EngineConfig {
    spec_test_cfg(spec)
}

/// Deterministic prompts + budget edge cases.
fn requests(n: usize) -> Vec<Request> {
    let mut x: u64 = 0x1234_5678;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v = Vec::new();
    for i in 0..n {
        let len = 3 + (next() % 28) as usize;
        let mut toks: Vec<u32> = (0..len).map(|_| 13 + (next() % 115) as u32).collect();
        let inside_thinking = i % 3 != 0;
        if inside_thinking {
            toks.push(START);
        }
        let mut r = Request::new(Prompt::Tokens(toks));
        r.sampling.max_tokens = 8 + (next() % 40) as usize;
        r.think_start = Some(vec![START]);
        r.think_end = Some(END.to_vec());
        r.reasoning_budget = match i % 7 {
            0 => None,
            1 => Some(0),
            2 => Some(1),
            3 => Some(2),
            4 => Some(5),
            5 => Some(1000),
            _ => Some(9),
        };
        if i % 11 == 4 {
            r.sampling.max_tokens = 4; // max_tokens hit inside thinking
            r.reasoning_budget = Some(50);
        }
        if i % 13 == 5 {
            r.sampling.stop_token_ids = vec![13 + (i as u32 % 100)];
        }
        r.logprobs = true;
        v.push(r);
    }
    v
}

/// Run all requests as one continuous batch, checking invariants after every step.
fn run(engine: &Engine, reqs: Vec<Request>) -> Vec<Output> {
    run_checked(engine, reqs, &[])
}

fn assert_same(label: &str, base: &[Output], got: &[Output], reqs: &[Request]) {
    assert_same_outputs(label, base, got, reqs)
}

fn baseline(reqs: &[Request]) -> Vec<Output> {
    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::None,
        cfg(SpecMode::Fixed(0)),
    )
    .unwrap();
    run(&e, reqs.to_vec())
}

#[test]
fn draft_model_greedy_is_bitwise_lossless_for_every_k() {
    let reqs = requests(40);
    let base = baseline(&reqs);
    // budgets were enforced: some request had its thinking forced to end
    assert!(base.iter().any(|o| o.counters.forced_end_of_think == 1));
    let mut accepted_any = false;
    for k in 1..=8 {
        let e = Engine::new(
            &golden("v3_yarn"),
            DraftSource::Dir(golden("v3_bf16")),
            cfg(SpecMode::Fixed(k)),
        )
        .unwrap();
        let got = run(&e, reqs.clone());
        assert_same(&format!("draft k={k}"), &base, &got, &reqs);
        let st = e.stats();
        accepted_any |= st.totals.accepted_tokens > 0;
        assert!(st.totals.drafted_tokens >= st.totals.accepted_tokens);
        assert_eq!(
            st.totals.accepted_tokens,
            st.totals.accepted_per_position.iter().sum::<u64>()
        );
    }
    assert!(
        accepted_any,
        "the bf16 copy of the target must get drafts accepted"
    );
}

#[test]
fn bad_draft_ngram_and_adaptive_are_lossless() {
    let reqs = requests(30);
    let base = baseline(&reqs);
    for (label, draft, spec) in [
        (
            "bad draft",
            DraftSource::Dir(golden("v3_tied")),
            SpecMode::Fixed(3),
        ),
        (
            "ngram",
            DraftSource::Ngram { min_n: 1, max_n: 3 },
            SpecMode::Fixed(4),
        ),
        (
            "adaptive",
            DraftSource::Dir(golden("v3_bf16")),
            SpecMode::Adaptive { k_max: 6 },
        ),
    ] {
        let e = Engine::new(&golden("v3_yarn"), draft, cfg(spec)).unwrap();
        let got = run(&e, reqs.clone());
        assert_same(label, &base, &got, &reqs);
    }
}

/// The drafters' confidence cut (`EngineConfig::draft_p_min`) only shortens drafts: outputs
/// stay bitwise those of plain decoding (budgets included: a request with forced end-of-think
/// tokens to draft is not cut), and a poor drafter drafts fewer tokens per verified token.
#[test]
fn confidence_cut_is_lossless_and_drafts_less() {
    let reqs = requests(30);
    let base = baseline(&reqs);
    let drafted_per_accepted = |draft: &str, k: usize, p_min: f32| {
        let mut c = cfg(SpecMode::Fixed(k));
        c.draft_p_min = p_min;
        let e = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden(draft)), c).unwrap();
        let got = run(&e, reqs.clone());
        assert_same(&format!("{draft} k={k} p_min={p_min}"), &base, &got, &reqs);
        let t = e.stats().totals;
        (t.drafted_tokens, t.accepted_tokens)
    };
    // the random-weights draft (v3_tied): its tokens are rarely confident or right
    let (d0, a0) = drafted_per_accepted("v3_tied", 4, 0.0);
    let (d1, a1) = drafted_per_accepted("v3_tied", 4, 0.3);
    assert!(d1 < d0, "cut at 0.3: {d1} drafted vs {d0} without");
    assert!(a1 <= a0);
    // the bf16 copy of the target: confident and right, the cut changes little
    let (d2, a2) = drafted_per_accepted("v3_bf16", 6, 0.3);
    assert!(a2 > 0 && d2 >= a2);
    // an out-of-range cut is refused with a clear error
    for bad in [-0.1f32, 1.5, f32::NAN] {
        let mut c = cfg(SpecMode::Fixed(2));
        c.draft_p_min = bad;
        let err = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden("v3_tied")), c)
            .err()
            .expect("out-of-range draft_p_min must be refused");
        assert!(err.to_string().contains("draft_p_min"), "{err}");
    }
}

#[test]
fn kv_dtypes_chunking_prefix_cache_and_preemption_keep_outputs() {
    let reqs = requests(24);
    let base = baseline(&reqs);
    // draft with its own fp8 KV cache: target output unchanged
    let mut c = cfg(SpecMode::Fixed(4));
    c.draft_kv_dtype = Some(KvDtype::Fp8E4M3);
    let e = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden("v3_bf16")), c).unwrap();
    assert_same("fp8 draft kv", &base, &run(&e, reqs.clone()), &reqs);
    let st = e.stats();
    assert!(st.draft_kv_bytes_per_token < st.target_kv_bytes_per_token);
    // tiny step budget: prefill chunked in 5-token pieces
    let mut c = cfg(SpecMode::Fixed(3));
    c.max_batch_tokens = 5;
    let e = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden("v3_bf16")), c).unwrap();
    assert_same("chunked prefill", &base, &run(&e, reqs.clone()), &reqs);
    // small pool: requests get preempted and recomputed
    let mut c = cfg(SpecMode::Fixed(2));
    c.num_blocks = 12;
    c.block_size = 8;
    let e = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden("v3_bf16")), c).unwrap();
    let got = run(&e, reqs.clone());
    assert_same("preemption", &base, &got, &reqs);
    assert!(
        got.iter().map(|o| o.counters.preemptions).sum::<u64>() > 0,
        "pool was meant to force preemption"
    );
}

#[test]
fn prefix_cache_hits_keep_outputs() {
    let shared: Vec<u32> = (20..60).collect();
    let mk = |tail: u32| {
        let mut t = shared.clone();
        t.push(tail);
        let mut r = Request::new(Prompt::Tokens(t));
        r.sampling.max_tokens = 10;
        r.logprobs = true;
        r
    };
    let reqs: Vec<Request> = (0..6).map(|i| mk(70 + i)).collect();
    let alone: Vec<Output> = reqs
        .iter()
        .map(|r| {
            let e = Engine::new(
                &golden("v3_yarn"),
                DraftSource::None,
                cfg(SpecMode::Fixed(0)),
            )
            .unwrap();
            run(&e, vec![r.clone()]).remove(0)
        })
        .collect();
    let mut runs = Vec::new();
    for prefix_cache in [true, false] {
        let mut c = cfg(SpecMode::Fixed(3));
        c.prefix_cache = prefix_cache;
        let e = Engine::new(&golden("v3_yarn"), DraftSource::Dir(golden("v3_bf16")), c).unwrap();
        let first = run(&e, vec![reqs[0].clone()]);
        let rest = run(&e, reqs[1..].to_vec());
        let got: Vec<Output> = first.into_iter().chain(rest).collect();
        assert_same("prefix cache", &alone, &got, &reqs);
        // one at a time too: then each request's drafts do not depend on how the round's
        // catch-up budget was shared (which differs with and without prefix hits)
        let one: Vec<Output> = reqs.iter().flat_map(|r| run(&e, vec![r.clone()])).collect();
        assert_same("prefix cache, one at a time", &alone, &one, &reqs);
        runs.push((got, e.stats(), one));
    }
    let ((got, st, one), (_, _, off)) = (&runs[0], &runs[1]);
    assert!(
        got[1..]
            .iter()
            .all(|o| o.counters.cached_prompt_tokens >= 32),
        "prefix blocks were reused"
    );
    assert!(st.kv.prefix_hit_tokens >= 5 * 32);
    // the draft model restores its own KV of the shared prefix, and drafts exactly what it
    // drafts without prefix caching
    let draft_kv = st.draft_kv.as_ref().expect("draft KV stats");
    assert!(
        draft_kv.prefix_hit_tokens >= 5 * 32,
        "draft prefix hits: {}",
        draft_kv.prefix_hit_tokens
    );
    for (i, (a, b)) in one.iter().zip(off).enumerate() {
        common::assert_same_drafts(&format!("request {i}"), a, b);
    }
}

#[test]
fn budget_clipping_saves_draft_tokens_and_counts_only_committed() {
    let mut r = Request::new(Prompt::Tokens(vec![30, 31, 32, START]));
    r.think_start = Some(vec![START]);
    r.think_end = Some(END.to_vec());
    r.reasoning_budget = Some(3);
    r.sampling.max_tokens = 20;
    let base = baseline(&[r.clone()]);
    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::Dir(golden("v3_bf16")),
        cfg(SpecMode::Fixed(8)),
    )
    .unwrap();
    let got = run(&e, vec![r.clone()]);
    assert_same("clipped", &base, &got, &[r]);
    let c = &got[0].counters;
    assert_eq!(c.reasoning_tokens, 3);
    assert_eq!(c.forced_end_of_think, 1);
    assert_eq!(c.forced_tokens, 2, "two-token end marker forced");
    assert!(
        c.draft_tokens_saved >= 5,
        "k=8 with 3 thinking tokens left saves >= 5 draft positions, got {}",
        c.draft_tokens_saved
    );
    // the forced marker follows exactly the 3 reasoning tokens
    assert_eq!(&got[0].token_ids[3..5], &END);
}

#[test]
fn bad_requests_get_clear_errors_and_the_engine_keeps_serving() {
    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::None,
        cfg(SpecMode::Fixed(0)),
    )
    .unwrap();
    let err = e
        .submit(Request::new(Prompt::Tokens(vec![])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty prompt"), "{err}");
    let err = e
        .submit(Request::new(Prompt::Tokens(vec![1, 5000])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("5000"), "{err}");
    let err = e
        .submit(Request::new(Prompt::Text("hi".into())))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer"), "{err}");
    let mut r = Request::new(Prompt::Tokens(vec![1, 2]));
    r.sampling.max_tokens = 1_000_000;
    let err = e.submit(r).unwrap_err().to_string();
    assert!(err.contains("KV cache exhausted"), "{err}");
    let mut r = Request::new(Prompt::Tokens(vec![1, 2]));
    r.reasoning_budget = Some(3); // golden models have no tokenizer, so no </think> known
    assert!(e.submit(r).unwrap_err().to_string().contains("think-end"));
    assert!(e.cancel(999).is_err());
    // still serving
    let mut ok = Request::new(Prompt::Tokens(vec![1, 2, 3]));
    ok.sampling.max_tokens = 3;
    let id = e.submit(ok).unwrap();
    let mut toks = 0;
    while e.has_work() {
        toks += e
            .step()
            .unwrap()
            .iter()
            .filter(|ev| ev.id == id)
            .map(|ev| ev.tokens.len())
            .sum::<usize>();
    }
    assert_eq!(toks, 3);
}

#[test]
fn cancel_mid_generation() {
    let e = Engine::new(
        &golden("v3_yarn"),
        DraftSource::Dir(golden("v3_bf16")),
        cfg(SpecMode::Fixed(2)),
    )
    .unwrap();
    let mut r = Request::new(Prompt::Tokens(vec![1, 2, 3]));
    r.sampling.max_tokens = 40;
    r.sampling.ignore_eos = true;
    let id = e.submit(r).unwrap();
    e.step().unwrap();
    e.step().unwrap();
    e.cancel(id).unwrap();
    let evs = e.step().unwrap();
    assert!(evs
        .iter()
        .any(|ev| ev.id == id && ev.finish == Some(specmla::engine::FinishReason::Cancelled)));
    assert!(!e.has_work());
    e.check_invariants().unwrap();
    assert_eq!(e.stats().kv.used_blocks, 0, "cancel released the KV blocks");
}

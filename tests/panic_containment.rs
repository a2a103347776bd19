//! Panic containment with an injected fault (`Request::fault`): a request whose step panics fails
//! with an error event while the engine keeps serving the others, whose outputs (tokens and
//! log-probs) stay bit-identical to a run without the fault; a request that panicked once (a
//! transient fault) finishes with its normal output; the engine stays usable afterwards.

mod common;

use std::collections::HashMap;

use common::repo;
use specmla::engine::{
    DraftSource, Engine, EngineConfig, Event, Fault, FaultSite, FinishReason, Prompt, Request,
};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;

fn request(i: u32) -> Request {
    let mut r = Request::new(Prompt::Tokens(vec![
        3 + i * 7 % 90,
        17,
        29 + i % 50,
        41,
        5 + i,
    ]));
    r.sampling.max_tokens = 10;
    r.sampling.ignore_eos = true;
    r.logprobs = true;
    r
}

#[derive(Default, Debug, Clone)]
struct Out {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
    finishes: usize,
}

/// Submit all, step until every request has finished; every request must finish exactly once.
fn run(e: &Engine, reqs: Vec<Request>) -> Vec<Out> {
    let ids: Vec<u64> = reqs.into_iter().map(|r| e.submit(r).unwrap()).collect();
    let mut outs: HashMap<u64, Out> = ids.iter().map(|&id| (id, Out::default())).collect();
    let mut steps = 0;
    while outs.values().any(|o| o.finish.is_none()) {
        steps += 1;
        assert!(steps < 10_000, "no progress");
        for Event {
            id,
            tokens,
            logprobs,
            finish,
            ..
        } in e.step().expect("a contained panic is not a step error")
        {
            let o = outs.get_mut(&id).expect("event for a submitted request");
            assert!(
                o.finish.is_none(),
                "request {id}: event after its final event"
            );
            o.tokens.extend(tokens);
            o.logprobs.extend(logprobs);
            if let Some(f) = finish {
                o.finishes += 1;
                o.finish = Some(f);
            }
        }
    }
    assert!(!e.has_work());
    ids.iter().map(|id| outs.remove(id).unwrap()).collect()
}

fn engine(draft: bool) -> Engine {
    let g = repo().join("models/golden");
    let cfg = EngineConfig {
        kv_dtype: KvDtype::F32,
        spec: SpecMode::Fixed(3),
        threads: 2,
        ..EngineConfig::default()
    };
    let d = if draft {
        DraftSource::Dir(g.join("v3_bf16"))
    } else {
        DraftSource::None
    };
    Engine::new(&g.join("v3_yarn"), d, cfg).unwrap()
}

fn faulty(i: u32, at_generated: usize, times: u32) -> Request {
    let mut r = request(i);
    r.fault = Some(Fault {
        at_generated,
        times,
        ..Fault::default()
    });
    r
}

#[test]
fn a_panicking_request_fails_alone_and_the_others_are_unchanged() {
    for draft in [false, true] {
        let e = engine(draft);
        let base = run(&e, (0..4).map(request).collect());
        for o in &base {
            assert_eq!(o.finish, Some(FinishReason::Length));
        }
        let e = engine(draft);
        // Request 1 panics every time once it has 3 tokens; the others share its batches.
        let reqs = vec![request(0), faulty(1, 3, u32::MAX), request(2), request(3)];
        let got = run(&e, reqs);
        for (i, (g, b)) in got.iter().zip(&base).enumerate() {
            assert_eq!(g.finishes, 1, "draft {draft}, request {i}");
            if i == 1 {
                match &g.finish {
                    Some(FinishReason::Error(m)) => {
                        assert!(m.contains("injected fault"), "{m}")
                    }
                    other => panic!("draft {draft}: the faulty request ended {other:?}"),
                }
                // What it committed before the fault is a prefix of its normal output.
                assert!(g.tokens.len() >= 3 && b.tokens.starts_with(&g.tokens));
                continue;
            }
            assert_eq!(
                g.tokens, b.tokens,
                "draft {draft}, request {i}: tokens changed"
            );
            let same = g
                .logprobs
                .iter()
                .zip(&b.logprobs)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same && g.logprobs.len() == b.logprobs.len(),
                "request {i}: log-probs changed"
            );
        }
        let st = e.stats();
        assert_eq!(st.panics_contained, 2, "one in the batch, one alone");
        // The engine keeps serving: a fresh batch gives the reference outputs.
        let again = run(&e, (0..4).map(request).collect());
        for (g, b) in again.iter().zip(&base) {
            assert_eq!(g.tokens, b.tokens);
        }
    }
}

#[test]
fn a_transient_panic_loses_nothing() {
    let e = engine(true);
    let base = run(&e, (0..3).map(request).collect());
    let e = engine(true);
    // Request 0 panics once (at 5 tokens): all three are rerun alone, nobody fails.
    let got = run(&e, vec![faulty(0, 5, 1), request(1), request(2)]);
    for (i, (g, b)) in got.iter().zip(&base).enumerate() {
        assert_eq!(g.finish, Some(FinishReason::Length), "request {i}");
        assert_eq!(g.tokens, b.tokens, "request {i}");
        assert_eq!(g.logprobs.len(), b.logprobs.len());
        assert!(g
            .logprobs
            .iter()
            .zip(&b.logprobs)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    assert_eq!(e.stats().panics_contained, 1);
}

#[test]
fn a_lone_panicking_request_fails_at_once() {
    let e = engine(false);
    let got = run(&e, vec![faulty(0, 0, u32::MAX)]);
    assert!(matches!(got[0].finish, Some(FinishReason::Error(_))));
    assert!(got[0].tokens.is_empty());
    assert_eq!(e.stats().panics_contained, 1);
    // Counters and stats stay readable; the next request runs normally.
    let ok = run(&e, vec![request(0)]);
    assert_eq!(ok[0].finish, Some(FinishReason::Length));
    assert_eq!(ok[0].tokens.len(), 10);
}

/// A request dropped by the unwinding while it sits in no queue (a panic during its admission,
/// after its prefix-cache match and block reservation) takes its block table with it; after
/// containment those references are given back: the pool's refcounts match the live tables,
/// nothing stays in use once every request has finished, and the engine keeps serving.
#[test]
fn a_request_dropped_mid_admission_leaks_no_kv_blocks() {
    for draft in [false, true] {
        let e = engine(draft);
        let shared: Vec<u32> = (20..60).collect();
        let mk = |tail: u32| {
            let mut t = shared.clone();
            t.push(tail);
            let mut r = Request::new(Prompt::Tokens(t));
            r.sampling.max_tokens = 6;
            r.sampling.ignore_eos = true;
            r
        };
        let first = run(&e, vec![mk(70)]); // publishes the shared prompt blocks
        assert_eq!(first[0].finish, Some(FinishReason::Length));
        let mut bad = mk(71);
        bad.fault = Some(Fault {
            at_generated: 0,
            times: 1,
            site: FaultSite::Admission,
        });
        let got = run(&e, vec![bad, mk(72)]);
        match &got[0].finish {
            Some(FinishReason::Error(m)) => assert!(m.contains("panic"), "{m}"),
            other => panic!("draft {draft}: the dropped request ended {other:?}"),
        }
        assert_eq!(got[1].finish, Some(FinishReason::Length), "draft {draft}");
        let st = e.stats();
        assert_eq!(st.panics_contained, 1);
        assert!(
            st.kv_blocks_reclaimed >= 2,
            "draft {draft}: the prefix blocks and the reserved tail came back ({})",
            st.kv_blocks_reclaimed
        );
        e.check_invariants().unwrap();
        assert_eq!(st.kv.used_blocks, 0, "draft {draft}: blocks still in use");
        // still serving, with prefix hits
        let again = run(&e, vec![mk(73)]);
        assert_eq!(again[0].finish, Some(FinishReason::Length));
        e.check_invariants().unwrap();
        assert_eq!(e.stats().kv.used_blocks, 0);
    }
}

/// A panic inside the drafter fails nobody: drafting is switched off (plain decoding, so every
/// request's tokens and log-probs are bitwise those without a drafter), the stats say why, and
/// a later swap brings drafting back.
#[test]
fn a_panicking_drafter_is_switched_off_and_outputs_stay_the_same() {
    let base = run(&engine(false), (0..4).map(request).collect());
    let e = engine(true);
    let mut reqs: Vec<Request> = (0..4).map(request).collect();
    reqs[2].fault = Some(Fault {
        at_generated: 2,
        times: 1,
        site: FaultSite::Draft,
    });
    let got = run(&e, reqs);
    for (i, (g, b)) in got.iter().zip(&base).enumerate() {
        assert_eq!(g.finish, Some(FinishReason::Length), "request {i}");
        assert_eq!(g.tokens, b.tokens, "request {i}: tokens changed");
        assert!(
            g.logprobs
                .iter()
                .zip(&b.logprobs)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "request {i}: log-probs changed"
        );
    }
    let st = e.stats();
    assert_eq!(st.drafter_panics, 1);
    assert_eq!(st.panics_contained, 0, "nothing failed");
    assert_eq!(st.drafter, "none");
    assert!(st
        .drafter_disabled
        .as_deref()
        .is_some_and(|m| m.contains("injected fault")));
    e.check_invariants().unwrap();
    // a swap installs a drafter again
    e.set_draft_weights_blocking(DraftSource::Dir(repo().join("models/golden/v3_bf16")))
        .unwrap();
    let again = run(&e, (4..6).map(request).collect());
    assert!(again.iter().all(|o| o.finish == Some(FinishReason::Length)));
    let st = e.stats();
    assert!(st.drafter_disabled.is_none());
    assert_ne!(st.drafter, "none");
    assert!(st.totals.accepted_tokens > 0, "drafting resumed");
}

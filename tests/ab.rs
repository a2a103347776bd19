//! Live A/B of two drafters (`DraftSource::Ab`): every arm is lossless (greedy outputs and
//! log-probs equal plain decoding, budgets included); a good draft (models/draft) and a
//! random-weight one split the traffic and their measured acceptance is told apart per arm, in
//! `Engine::arm_stats` and in the metrics text (parsed with a real text-format parser); per-arm
//! counters add up to the engine totals; a request's explicit arm is honoured; MTP, n-gram and
//! a no-speculation control arm work as arms; swapping to and from an A/B drafter mid-generation
//! keeps outputs; bad A/B setups are refused; with prefix caching only a request's own arm
//! restores a cached prefix.

mod common;

use common::{
    assert_same_outputs, budget_requests, random_draft, repo, run_checked, spec_test_cfg,
};
use prometheus_parse::{Scrape, Value};
use specmla::engine::{DraftSource, Engine, Output, Request};
use specmla::spec::{Counters, SpecMode};

fn target() -> std::path::PathBuf {
    repo().join("models/target")
}

fn requests(n: usize) -> Vec<Request> {
    budget_requests(n, 0xab_0001, 20, 10, &[11, 12])
}

fn plain(reqs: &[Request]) -> Vec<Output> {
    common::plain_outputs(&target(), reqs)
}

fn ab(a: DraftSource, b: DraftSource, ratio_b: f64) -> DraftSource {
    DraftSource::Ab {
        a: Box::new(a),
        b: Box::new(b),
        ratio_b,
    }
}

/// The target's MTP layer in arm A, an n-gram drafter in arm B.
fn mtp_and_ngram(ratio_b: f64) -> DraftSource {
    ab(
        DraftSource::Mtp,
        DraftSource::Ngram { min_n: 1, max_n: 3 },
        ratio_b,
    )
}

fn acceptance(c: &Counters) -> f64 {
    c.accepted_tokens as f64 / c.drafted_tokens.max(1) as f64
}

#[test]
fn a_good_and_a_random_draft_are_told_apart_and_both_lossless() {
    let reqs = requests(16);
    let base = plain(&reqs);
    let e = Engine::new(
        &target(),
        ab(
            DraftSource::Dir(repo().join("models/draft")),
            DraftSource::Dir(random_draft()),
            0.5,
        ),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    assert!(e.stats().drafter.starts_with("ab(a=draft:draft, b=draft:"));
    let got = run_checked(&e, reqs.clone(), &[]);
    assert_same_outputs("ab good/random", &base, &got, &reqs);
    let arms = e.arm_stats();
    let names: Vec<&str> = arms.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(names, ["a", "b"], "both arms served");
    let (ca, cb) = (&arms[0].1, &arms[1].1);
    assert!(ca.drafted_tokens > 0 && cb.drafted_tokens > 0);
    let (aa, ab_) = (acceptance(ca), acceptance(cb));
    assert!(
        aa > 0.6 && ab_ < aa / 2.0,
        "good draft {aa:.3} vs random draft {ab_:.3}"
    );
    assert!(arms
        .iter()
        .all(|(_, _, tpot)| tpot.is_some_and(|t| t > 0.0)));
    // the arms add up to the engine totals
    let t = e.stats().totals;
    let mut sum = ca.clone();
    sum.add(cb);
    for (what, x, y) in [
        ("drafted", sum.drafted_tokens, t.drafted_tokens),
        ("accepted", sum.accepted_tokens, t.accepted_tokens),
        ("reasoning", sum.reasoning_tokens, t.reasoning_tokens),
        ("answer", sum.answer_tokens, t.answer_tokens),
        ("prompt", sum.prompt_tokens, t.prompt_tokens),
    ] {
        assert_eq!(x, y, "{what}: arms {x} vs totals {y}");
    }
    // the metrics text carries the arms and parses
    let text = e.metrics_text();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
    for (arm, want) in [("a", ca.accepted_tokens), ("b", cb.accepted_tokens)] {
        let got: f64 = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "specmla_spec_decode_num_accepted_tokens_total"
                    && s.labels.get("arm") == Some(arm)
            })
            .map(|s| match s.value {
                Value::Counter(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum();
        assert_eq!(got, want as f64, "arm {arm} accepted tokens in the metrics");
    }
    assert!(scrape.samples.iter().any(|s| s
        .metric
        .starts_with("specmla_time_per_output_token_seconds")
        && s.labels.get("arm") == Some("b")));
}

#[test]
fn explicit_arms_mtp_ngram_and_a_control_arm() {
    let reqs = requests(12);
    let base = plain(&reqs);
    // every request asks for arm B: arm A serves nobody
    let e = Engine::new(
        &target(),
        mtp_and_ngram(0.0),
        spec_test_cfg(SpecMode::Fixed(2)),
    )
    .unwrap();
    let to_b: Vec<Request> = reqs
        .iter()
        .cloned()
        .map(|mut r| {
            r.draft_arm = Some(1);
            r
        })
        .collect();
    assert_same_outputs(
        "explicit arm b",
        &base,
        &run_checked(&e, to_b.clone(), &[]),
        &to_b,
    );
    let arms = e.arm_stats();
    assert_eq!(arms.len(), 1, "{arms:?}");
    assert_eq!(arms[0].0, "b");
    // ratio split: MTP (needs the target's hidden states) in one arm, n-gram in the other
    let e = Engine::new(
        &target(),
        mtp_and_ngram(0.5),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    assert_same_outputs(
        "mtp / ngram",
        &base,
        &run_checked(&e, reqs.clone(), &[]),
        &reqs,
    );
    let arms = e.arm_stats();
    assert_eq!(arms.len(), 2);
    assert!(
        arms[0].1.accepted_tokens > 0,
        "the MTP arm drafted: {arms:?}"
    );
    // a no-speculation control arm next to the draft model
    let e = Engine::new(
        &target(),
        ab(
            DraftSource::None,
            DraftSource::Dir(repo().join("models/draft")),
            0.5,
        ),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    assert_same_outputs(
        "control arm",
        &base,
        &run_checked(&e, reqs.clone(), &[]),
        &reqs,
    );
    let arms = e.arm_stats();
    assert_eq!(arms.len(), 2);
    assert_eq!(
        arms[0].1.drafted_tokens, 0,
        "the control arm drafts nothing"
    );
    assert!(arms[1].1.drafted_tokens > 0);
    assert!(arms[0].1.reasoning_tokens + arms[0].1.answer_tokens > 0);
}

#[test]
fn swaps_to_and_from_ab_keep_outputs_and_bad_setups_are_refused() {
    let reqs = requests(10);
    let base = plain(&reqs);
    let e = Engine::new(
        &target(),
        DraftSource::Dir(repo().join("models/draft")),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    let swaps = vec![
        (
            3,
            ab(
                DraftSource::Dir(repo().join("models/draft-weak")),
                DraftSource::Mtp,
                0.5,
            ),
        ),
        (20, DraftSource::Ngram { min_n: 1, max_n: 3 }),
        (
            30,
            ab(
                DraftSource::Dir(repo().join("models/draft")),
                DraftSource::None,
                0.3,
            ),
        ),
    ];
    assert_same_outputs(
        "swaps with ab",
        &base,
        &run_checked(&e, reqs.clone(), &swaps),
        &reqs,
    );
    for (what, src) in [
        ("ratio", ab(DraftSource::None, DraftSource::Mtp, 1.5)),
        (
            "itself an A/B",
            ab(
                DraftSource::Mtp,
                ab(DraftSource::None, DraftSource::Mtp, 0.5),
                0.5,
            ),
        ),
        (
            "arm b",
            ab(
                DraftSource::Mtp,
                DraftSource::Dir(repo().join("models/no-such-draft")),
                0.5,
            ),
        ),
    ] {
        let err = e.set_draft_weights_blocking(src).unwrap_err().to_string();
        assert!(err.contains(what), "{what}: {err}");
    }
    let mut r = reqs[0].clone();
    r.draft_arm = Some(2);
    let err = e.submit(r).unwrap_err().to_string();
    assert!(err.contains("draft_arm"), "{err}");
    // the engine keeps serving
    assert_same_outputs(
        "after refusals",
        &base[..2],
        &run_checked(&e, reqs[..2].to_vec(), &[]),
        &reqs[..2],
    );
}

/// With prefix caching, a request's arm is fixed at admission, so only that arm restores a
/// cached prefix: requests sent to an n-gram arm reuse the target's whole cached prefix even
/// though the MTP arm beside it holds none of it (before, both arms restored and the target
/// kept what both could use: nothing), and the MTP arm's cache is never queried.
#[test]
fn only_the_chosen_arm_restores_a_cached_prefix() {
    let prompts = common::workload_prompt_ids(5);
    let mut system = prompts[4].clone(); // a shared "system" prefix (without its <think>)
    system.pop();
    let full = (system.len() / 16 * 16) as u64;
    assert!(full >= 32, "shared prefix of {} tokens", system.len());
    let reqs: Vec<Request> = requests(4)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let mut p = system.clone();
            p.extend(&prompts[i]);
            r.prompt = specmla::engine::Prompt::Tokens(p);
            r.draft_arm = Some(1);
            r
        })
        .collect();
    let base = plain(&reqs);
    let mut c = spec_test_cfg(SpecMode::Fixed(2));
    c.prefix_cache = true;
    let e = Engine::new(&target(), mtp_and_ngram(0.0), c).unwrap();
    // one request at a time: each finds the previous ones' prompt blocks cached
    let got: Vec<Output> = reqs
        .iter()
        .flat_map(|r| run_checked(&e, vec![r.clone()], &[]))
        .collect();
    assert_same_outputs("arm b, prefix cache", &base, &got, &reqs);
    for (i, o) in got.iter().enumerate().skip(1) {
        assert!(
            o.counters.cached_prompt_tokens >= full,
            "request {i} reused {} of {full} cached prompt tokens",
            o.counters.cached_prompt_tokens
        );
    }
    let mtp_kv = e.stats().draft_kv.expect("draft KV stats");
    assert_eq!(mtp_kv.prefix_query_tokens, 0, "the MTP arm was queried");
}

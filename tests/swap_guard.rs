//! The acceptance guard on draft swaps: a random-weight draft swapped in under a guard is rolled
//! back to the previous (good) drafter once it has the guard's number of verified drafts, with the
//! measured acceptance in the swap status; a good draft under the same guard stays. Greedy outputs
//! are the plain-decoding ones throughout (speculation is lossless whatever the drafter).

mod common;

use common::{
    assert_same_outputs, budget_requests, random_draft, repo, run_checked, spec_test_cfg,
};
use specmla::engine::{DraftSource, Engine, GuardThreshold, SwapGuard, SwapStatus};
use specmla::spec::SpecMode;

fn guard() -> SwapGuard {
    SwapGuard {
        min_drafts: 40,
        threshold: GuardThreshold::Relative(0.5),
    }
}

#[test]
fn a_random_draft_is_rolled_back_and_a_good_one_kept() {
    let target = repo().join("models/target");
    let reqs = budget_requests(12, 0xfeed, 20, 10, &[11, 12]);
    let plain = Engine::new(
        &target,
        DraftSource::None,
        spec_test_cfg(SpecMode::Fixed(0)),
    )
    .unwrap();
    let base = run_checked(&plain, reqs.clone(), &[]);

    let e = Engine::new(
        &target,
        DraftSource::Dir(repo().join("models/draft")),
        spec_test_cfg(SpecMode::Fixed(4)),
    )
    .unwrap();
    let (a, b) = reqs.split_at(4);
    assert_same_outputs(
        "good draft",
        &base[..4],
        &run_checked(&e, a.to_vec(), &[]),
        a,
    );
    let bad = e
        .set_draft_weights_blocking_guarded(DraftSource::Dir(random_draft()), guard())
        .unwrap();
    let got = run_checked(&e, b.to_vec(), &[]);
    assert_same_outputs("random draft, rolled back", &base[4..], &got, b);
    let st = e.stats();
    match e.swap_status(bad) {
        SwapStatus::RolledBack { generation, reason } => {
            assert_eq!(generation, 2, "{reason}");
            assert_eq!(st.draft_generation, 2);
            assert!(reason.contains("acceptance"), "{reason}");
        }
        other => panic!("the random draft was not rolled back: {other:?}"),
    }
    assert!(
        st.drafter.contains("draft"),
        "the good drafter serves again: {}",
        st.drafter
    );
    // the rejected generation drafted at least the guard's count, and its acceptance was low
    let per_gen: Vec<(u64, u64, u64)> = e
        .label_counters()
        .into_iter()
        .map(|(_, g, c)| (g, c.drafted_tokens, c.accepted_tokens))
        .collect();
    let (_, d1, a1) = per_gen.iter().copied().find(|x| x.0 == 1).unwrap();
    let (_, d0, a0) = per_gen.iter().copied().find(|x| x.0 == 0).unwrap();
    assert!(d1 >= 40 && (a1 as f64 / d1 as f64) < 0.5 * (a0 as f64 / d0 as f64));

    // a good drafter under the same guard stays
    let good = e
        .set_draft_weights_blocking_guarded(DraftSource::Dir(repo().join("models/draft")), guard())
        .unwrap();
    let got = run_checked(&e, reqs.clone(), &[]);
    assert_same_outputs("good draft, guarded", &base, &got, &reqs);
    assert_eq!(e.swap_status(good), SwapStatus::Applied { generation: 3 });
    assert_eq!(e.stats().draft_generation, 3);
    // a guard that is no rate is refused
    let bad_guard = SwapGuard {
        min_drafts: 0,
        threshold: GuardThreshold::Absolute(0.5),
    };
    assert!(e
        .set_draft_weights_guarded(DraftSource::None, bad_guard)
        .is_err());
}

//! Unit tests of the adaptive policy's pure functions.

use super::*;

/// One blind start per step; the first priced start whatever its cost, later ones only
/// within what is left of one plain step; steady drafting is never limited.
#[test]
fn catch_up_budget_bounds_each_step() {
    // (binary fractions of a second, so the sums are exact)
    let mut b = CatchUpBudget::new(0.5);
    assert!(b.admits(Start::Steady));
    // the first priced start is admitted even above the allowance
    assert!(b.admits(Start::Priced(2.0)));
    b.charge(Start::Priced(0.25));
    assert!(b.admits(Start::Priced(0.25)), "0.25 s of 0.25 s left");
    assert!(!b.admits(Start::Priced(0.375)), "0.375 s of 0.25 s left");
    b.charge(Start::Priced(0.25));
    assert!(!b.admits(Start::Priced(0.125)), "nothing left");
    // blind starts are counted apart from priced ones
    assert!(b.admits(Start::Blind));
    b.charge(Start::Blind);
    assert!(!b.admits(Start::Blind), "one blind start per step");
    b.charge(Start::Steady);
    assert!(b.admits(Start::Steady));
    // a fresh step starts over; an unknown plain step still admits one priced start
    let mut b = CatchUpBudget::new(0.0);
    assert!(b.admits(Start::Priced(0.050)));
    b.charge(Start::Priced(0.050));
    assert!(!b.admits(Start::Priced(0.0001)));
    // unpaced (the starters' dry run): every start admitted, however many
    let mut b = CatchUpBudget::unlimited();
    for _ in 0..64 {
        assert!(b.admits(Start::Blind) && b.admits(Start::Priced(1.0)));
        b.charge(Start::Blind);
        b.charge(Start::Priced(1.0));
    }
}

/// The shared count falls to the requests that draft when priced over it: one starter
/// among 15 requests that never draft, drafting only if the forward is shared by at least
/// two, settles at 1 (it then prices itself out); ten requests that draft when shared by
/// at least five settle at 10; nobody drafting gives 1.
#[test]
fn sharing_settles_on_the_requests_that_would_draft() {
    let lone = |s: usize| usize::from(s >= 2);
    assert_eq!(sharing_fixed_point(16, lone), 1);
    let ten = |s: usize| if s >= 5 { 10 } else { 0 };
    assert_eq!(sharing_fixed_point(16, ten), 10);
    assert_eq!(sharing_fixed_point(16, |_| 0), 1);
    assert_eq!(sharing_fixed_point(0, |_| 3), 1);
    // a chain: 16 -> 12 -> 9 -> 9
    let chain = |s: usize| match s {
        16 => 12,
        12 | 9 => 9,
        _ => 0,
    };
    assert_eq!(sharing_fixed_point(16, chain), 9);
}

fn model(base: f64, per: f64) -> LinearCost {
    let mut c = LinearCost::default();
    for n in [1, 2, 4, 8, 16, 32] {
        c.observe(n, base + per * n as f64);
    }
    c
}

/// Plain steps price a request's share per batch class; drafting steps price a drafted
/// token beyond the plain line, per class: a small batch whose drafts are dear is not
/// priced by a large one's cheap requests.
#[test]
fn target_cost_prices_requests_and_drafts_per_class() {
    let mut t = TargetCost::default();
    assert_eq!(t.price(16), None);
    // batches 9-16: 10 ms + 0.5 ms per request without drafts, + 1 ms per drafted token
    for b in [16, 13, 10, 9, 16, 12] {
        t.observe(b, b, 0.010 + 0.0005 * b as f64);
    }
    t.observe(9, 9 + 7, 0.010 + 0.0005 * 9.0 + 0.007);
    let p = t.price(16).unwrap();
    let share16 = 0.010 / 16.0 + 0.0005;
    assert!((p.share - share16).abs() < 1e-9, "{p:?}");
    // seven drafts of 1 ms against the prior (DRAFT_PRIOR_WEIGHT drafts at its price: half a
    // share at batches of 9 or more)
    let w = DRAFT_PRIOR_WEIGHT;
    let want = (0.007 * 7.0 + w * DRAFT_PRIOR_SHARE_LARGE * share16) / (49.0 + w);
    assert!((p.per_draft - want).abs() < 1e-12, "{p:?}");
    assert!((p.per_draft - 0.001).abs() < 1e-4, "{p:?}");
    assert!(t.has_slope());
    // batch 1: its own plain steps; its drafts priced by its prior (a quarter of its step),
    // not by batch 16's cheap ones, until it drafts itself
    t.observe(1, 1, 0.0065);
    t.observe(1, 1, 0.0065);
    let p1 = t.price(1).unwrap();
    assert!((p1.share - 0.0065).abs() < 1e-9, "{p1:?}");
    assert!(
        (p1.per_draft - DRAFT_PRIOR_SHARE * 0.0065).abs() < 1e-9,
        "{p1:?}"
    );
    // three 2-token verifications at batch 1 cost 2 ms more each: drawn from the prior
    // towards its own price
    for _ in 0..3 {
        t.observe(1, 2, 0.0085);
    }
    let p1 = t.price(1).unwrap();
    assert!((p1.per_draft - 0.002).abs() < 0.0004, "{p1:?}");
    // so one draft at 25 % acceptance pays at neither batch (break-even ~28 % at batch 1),
    // at 95 % at both, at 40 % at batch 1 only (break-even ~84 % at batch 16)
    let free = LinearCost::default();
    let p16 = t.price(16);
    for (a, at1, at16) in [(0.25, 0, 0), (0.4, 1, 0), (0.95, 1, 1)] {
        assert_eq!(
            choose_k_rates(&[a], 1, 1, Some(p1), &free).0,
            at1,
            "{a} at 1"
        );
        assert_eq!(choose_k_rates(&[a], 1, 16, p16, &free).0, at16, "{a} at 16");
    }
}

/// A drafting step's time beyond the plain line counts for at most a request's share per
/// drafted token: one noisy small drafting step at batch 16 cannot price drafting out.
#[test]
fn draft_price_counts_at_most_a_share_per_draft() {
    let mut t = TargetCost::default();
    // batch 16: 32 ms plain steps (a 2 ms share)
    for _ in 0..3 {
        t.observe(16, 16, 0.032);
    }
    // three drafts timed 30 ms beyond the plain line: counted as 3 x 2 ms
    t.observe(16, 19, 0.062);
    let share = 0.002;
    let w = DRAFT_PRIOR_WEIGHT;
    let want =
        (3.0 * DRAFT_MAX_SHARE * 3.0 * share + w * DRAFT_PRIOR_SHARE_LARGE * share) / (9.0 + w);
    let p = t.price(16).unwrap();
    assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
    assert!(p.per_draft <= share, "{p:?}");
    // below the cap a step counts as measured
    t.observe(16, 32, 0.032 + 16.0 * 0.0012);
    let p = t.price(16).unwrap();
    let d = LinearCost::DECAY;
    let sxy = (3.0 * 0.006) * d + 16.0 * 16.0 * 0.0012;
    let sxx = 9.0 * d + 256.0;
    let want = (sxy + w * DRAFT_PRIOR_SHARE_LARGE * share) / (sxx + w);
    assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
}

/// Before a class drafts, its drafted token is priced at a quarter of a request's share up to
/// batch 8 and at half a share from batch 9 (where a drafted token measured 0.5-0.65 of a share).
#[test]
fn draft_prior_is_half_a_share_from_batch_nine() {
    let mut t = TargetCost::default();
    for b in [4, 8, 9, 16] {
        t.observe(b, b, 0.020 + 0.001 * b as f64);
    }
    for (b, prior) in [(4, 0.25), (8, 0.25), (9, 0.5), (16, 0.5), (40, 0.5)] {
        let p = t.price(b).unwrap();
        assert!(
            (p.per_draft - prior * p.share).abs() < 1e-12,
            "batch {b}: {p:?}"
        );
    }
}

/// A drafting step timed below the plain line counts as a zero extra cost, not a negative one:
/// at batch 16 one such step (noise: plain steps swing by more than a drafted token costs) must
/// not pull the class's price below what its other drafting steps and the prior say.
#[test]
fn draft_price_never_counts_a_step_below_the_plain_line() {
    let mut t = TargetCost::default();
    // batch 16: 32 ms plain steps (a 2 ms share)
    for _ in 0..3 {
        t.observe(16, 16, 0.032);
    }
    let share = 0.002;
    let w = DRAFT_PRIOR_WEIGHT;
    // two drafts timed 4 ms faster than the plain line: counted as 0, not -4 ms
    t.observe(16, 18, 0.028);
    let want = (0.0 + w * DRAFT_PRIOR_SHARE_LARGE * share) / (4.0 + w);
    let p = t.price(16).unwrap();
    assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
    assert!(p.per_draft > 0.2 * DRAFT_PRIOR_SHARE_LARGE * share, "{p:?}");
    // counted at -4 ms the price would have been clamped to zero
    assert!((-0.004 * 2.0 + w * DRAFT_PRIOR_SHARE_LARGE * share) / (4.0 + w) <= 0.0);
    // batch 9 priced from batch 16's mean moved along a steep all-classes slope (batch-32 steps
    // at 0.5 s) would extrapolate below zero (and give the excess a negative cap): it is held
    // at its requests' part of the mean step, and a drafting step there prices as usual
    let mut u = TargetCost::default();
    u.observe(16, 16, 0.002);
    u.observe(16, 16, 0.002);
    for _ in 0..5 {
        u.observe(32, 32, 0.5);
    }
    assert!((u.plain_at(9).unwrap() - 0.002 * 9.0 / 16.0).abs() < 1e-15);
    u.observe(9, 11, 0.010);
    let p9 = u.price(9).unwrap();
    assert!(
        p9.share > 0.0 && p9.per_draft > 0.0 && p9.per_draft <= p9.share,
        "{p9:?}"
    );
    // then four drafts at 1.3 ms each: the price follows them
    let d = LinearCost::DECAY;
    t.observe(16, 20, 0.032 + 4.0 * 0.0013);
    let want = (4.0 * (4.0 * 0.0013) + w * DRAFT_PRIOR_SHARE_LARGE * share) / (4.0 * d + 16.0 + w);
    let p = t.price(16).unwrap();
    assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
}

/// A draft forward's fixed cost is shared by the requests drafting in it: an MTP-like
/// drafter (3 ms per forward whatever its batch) pays at batch 16 when all sixteen requests
/// draft, not when one drafts alone.
#[test]
fn draft_forward_cost_is_shared_by_the_drafting_requests() {
    let price = Some(StepPrice {
        share: 0.002,
        per_draft: 0.0008,
    });
    let mut mtp = LinearCost::default();
    for n in [1, 1, 1] {
        mtp.observe(n, 0.003);
    }
    assert_eq!(choose_k_rates(&[0.75], 1, 16, price, &mtp).0, 1);
    assert_eq!(choose_k_rates(&[0.75], 1, 1, price, &mtp).0, 0);
}

#[test]
fn ramp_and_explorer_schedule() {
    assert_eq!(ramp_cap(0), 1);
    assert_eq!(ramp_cap(1), 2);
    assert_eq!(ramp_cap(RAMP_OBS - 1), RAMP_OBS as usize);
    assert_eq!(ramp_cap(RAMP_OBS), usize::MAX);
    // the explorer waits period x batch idle steps
    assert!(!explore_due(15, EXPLORE_EVERY, 1));
    assert!(explore_due(16, EXPLORE_EVERY, 1));
    assert!(!explore_due(16, EXPLORE_EVERY, 4));
    assert!(explore_due(64, EXPLORE_EVERY, 4));
    // doubling while only the explorer drafts, back to the start when the policy drafts
    let mut p = EXPLORE_EVERY;
    for want in [32, 64, 128, 128] {
        p = next_explore_period(p, true);
        assert_eq!(p, want);
    }
    assert_eq!(next_explore_period(p, false), EXPLORE_EVERY);
}

/// The prior counts as four observations; later ones enter with weight 1 / 24.
#[test]
fn acceptance_learns_fast_then_averages() {
    let (mut a, mut n) = (0.7, 0);
    for _ in 0..4 {
        n += 1;
        learn_acceptance(&mut a, n, 0.2, ACCEPT_PRIOR_WEIGHT);
    }
    assert!(
        (a - 0.45).abs() < 1e-12,
        "mean of prior x4 and four 0.2s: {a}"
    );
    for _ in 0..300 {
        n += 1;
        learn_acceptance(&mut a, n, 0.2, ACCEPT_PRIOR_WEIGHT);
    }
    // past the memory every observation weighs as the ACCEPT_MEMORY-th did
    let (mut far, mut at_memory) = (a, a);
    learn_acceptance(&mut far, n + 1, 1.0, ACCEPT_PRIOR_WEIGHT);
    learn_acceptance(&mut at_memory, ACCEPT_MEMORY, 1.0, ACCEPT_PRIOR_WEIGHT);
    assert_eq!(far, at_memory);
    assert!((a - 0.2).abs() < 1e-3);
    learn_acceptance(&mut a, n + 1, 1.0, ACCEPT_PRIOR_WEIGHT);
    assert!((a - (0.2 + 0.8 / 24.0)).abs() < 1e-3);
}

/// The decision acceptance sits half a standard error above the estimate and closes in on
/// it as observations grow; it never reaches 1 and is exact at 0.
/// A recorded prior weighs three guesses: two early rejections move it far less.
#[test]
fn a_recorded_prior_survives_an_unlucky_start() {
    let after_two = |prior: AcceptPrior| {
        let mut a = prior.alpha;
        for n in 1..=2 {
            learn_acceptance(&mut a, n, 0.0, prior.weight);
        }
        a
    };
    let guess = after_two(AcceptPrior::GENERIC);
    let rec = after_two(AcceptPrior::recorded(0.78));
    assert!((guess - 0.7 * 4.0 / 6.0).abs() < 1e-12, "{guess}");
    assert!((rec - 0.78 * 12.0 / 14.0).abs() < 1e-12, "{rec}");
    // and its bound stays tighter at the same evidence
    let wide = optimistic_acceptance(0.6, 2, ACCEPT_PRIOR_WEIGHT) - 0.6;
    let tight = optimistic_acceptance(0.6, 2, RECORDED_PRIOR_WEIGHT) - 0.6;
    assert!(tight < wide && tight > 0.0);
    assert_eq!(AcceptPrior::recorded(1.5).alpha, 0.95);
    assert!(AcceptPrior::recorded(0.3).is_recorded() && !AcceptPrior::GENERIC.is_recorded());
}

#[test]
fn optimism_shrinks_with_evidence() {
    let after2 = optimistic_acceptance(0.47, 2, ACCEPT_PRIOR_WEIGHT);
    let want = 0.47 + ACCEPT_OPTIMISM * (0.47f64 * 0.53 / 6.0).sqrt();
    assert!((after2 - want).abs() < 1e-12, "{after2}");
    let mut last = after2;
    for obs in [10, 100, 1000, 100_000] {
        let u = optimistic_acceptance(0.47, obs, ACCEPT_PRIOR_WEIGHT);
        assert!(u < last && u > 0.47, "{obs}: {u}");
        last = u;
    }
    assert!(last - 0.47 < 2e-3);
    assert_eq!(optimistic_acceptance(0.0, 0, ACCEPT_PRIOR_WEIGHT), 0.0);
    assert!(optimistic_acceptance(0.999, 0, ACCEPT_PRIOR_WEIGHT) <= 0.999);
    // two rejections of a 68 % drafter (estimate 0.47) still draft at batch 4, where one
    // draft breaks even at ~0.44 with the class's prior price
    let share = 0.0025;
    let price = StepPrice {
        share,
        per_draft: (0.0025 + DRAFT_PRIOR_WEIGHT * DRAFT_PRIOR_SHARE * share)
            / (1.0 + DRAFT_PRIOR_WEIGHT),
    };
    let free = LinearCost::default();
    assert_eq!(choose_k_rates(&[after2], 1, 4, Some(price), &free).0, 1);
    // a 12 % drafter after 20 observations does not
    let low = optimistic_acceptance(0.12, 20, ACCEPT_PRIOR_WEIGHT);
    assert_eq!(choose_k_rates(&[low], 1, 4, Some(price), &free).0, 0);
}

#[test]
fn fit_recovers_a_line() {
    let (b, s) = model(0.01, 0.001).fit().unwrap();
    assert!((b - 0.01).abs() < 1e-9 && (s - 0.001).abs() < 1e-9);
}

#[test]
fn speculates_when_it_pays_and_not_otherwise() {
    let target = model(0.010, 0.0002); // memory-bound: big fixed cost
    let cheap_draft = model(0.001, 0.0001);
    assert!(choose_k(0.9, 8, 1, &target, &cheap_draft) >= 3);
    assert_eq!(
        choose_k(0.0, 8, 1, &target, &cheap_draft),
        0,
        "zero acceptance never pays"
    );
    let compute_bound = model(0.0001, 0.001);
    assert_eq!(
        choose_k(0.6, 8, 64, &compute_bound, &cheap_draft),
        0,
        "large batch, compute bound"
    );
    // an untimed (model-free) drafter is free, but low acceptance still does not pay
    let untimed = LinearCost::default();
    assert_eq!(choose_k(0.05, 8, 1, &compute_bound, &untimed), 0);
    assert!(choose_k(0.95, 8, 1, &target, &untimed) >= 3);
}

/// An MTP-like drafter: high acceptance at position 1, little after (chained on itself), and
/// a draft step a quarter of a target step: one draft pays, more do not — while one
/// per-token rate with the same mean acceptance would draft several.
#[test]
fn position_decay_limits_k() {
    let target = model(0.020, 0.0012);
    let mtp = model(0.0045, 0.0001);
    let c = [0.75, 0.28, 0.09, 0.03, 0.02, 0.0, 0.0, 0.0];
    assert_eq!(choose_k_at(&c, 8, 1, &target, &mtp), 1);
    assert!(
        choose_k(0.62, 8, 1, &target, &mtp) > 1,
        "the flat rate overdrafts"
    );
    // a flat profile is the geometric formula
    for k in 0..6 {
        assert!((expected_tokens_at(&[0.8], k) - expected_tokens(0.8, k)).abs() < 1e-12);
    }
}

#[test]
fn one_token_count_has_no_slope() {
    let mut c = LinearCost::default();
    assert!(!c.has_slope());
    c.observe(20, 0.045);
    c.observe(20, 0.047);
    assert!(!c.has_slope());
    assert_eq!(c.fit().unwrap().1, 0.0);
    c.observe(16, 0.033);
    assert!(c.has_slope());
    assert!(c.fit().unwrap().1 > 0.0);
}

#[test]
fn a_negative_intercept_refits_through_the_origin() {
    // many steps of 16 tokens at 45 ms and one of 17 at 90 ms: the free line has a large
    // negative base; constrained to base 0 it must still predict ~45 ms at 16 tokens
    let mut c = LinearCost::default();
    for _ in 0..10 {
        c.observe(16, 0.045);
    }
    c.observe(17, 0.090);
    let (b, s) = c.fit().unwrap();
    assert_eq!(b, 0.0);
    let p16 = s * 16.0;
    assert!((p16 - 0.048).abs() < 0.005, "predicts {p16} s at 16 tokens");
}

#[test]
fn catch_up_is_amortised() {
    let target = model(0.010, 0.0002);
    let draft = model(0.001, 0.0001);
    let price = StepPrice::of_line(&target, 1);
    let (k, saved) = choose_k_rates(&[0.9], 8, 1, price, &draft);
    let saved = saved.unwrap();
    assert!(k >= 3 && saved > 0.0);
    // a short context pays back quickly; a long one does not in 32 tokens, but does later
    let fresh = Lengths::default();
    assert!(catch_up_pays(50, 1e-4, saved, fresh.horizon(0, 200)));
    assert!(!catch_up_pays(
        1_000_000,
        1e-4,
        saved,
        fresh.horizon(0, 200)
    ));
    assert!(!catch_up_pays(20_000, 1e-4, saved, fresh.horizon(10, 200)));
    assert!(catch_up_pays(
        20_000,
        1e-4,
        saved,
        fresh.horizon(10_000, 200_000)
    ));
    // nothing saved (k = 0 is best): never worth a catch-up
    let (k0, s0) = choose_k_rates(&[0.0], 8, 1, price, &draft);
    assert_eq!((k0, s0), (0, Some(0.0)));
    assert!(!catch_up_pays(10, 1e-4, 0.0, 100));
}

/// A k > 0 predicted a few percent faster than plain decoding is not taken; one clear of
/// the hurdle is.
#[test]
fn drafting_must_clear_the_hurdle() {
    let price = Some(StepPrice {
        share: 1.0,
        per_draft: 0.5,
    });
    let free = LinearCost::default();
    // one draft at acceptance a: rate (1 + a) / 1.5 against 1 for plain
    let gain = |a: f64| (1.0 + a) / 1.5 - 1.0;
    let marginal = 0.53;
    assert!(gain(marginal) > 0.0 && gain(marginal) < PAY_HURDLE);
    assert_eq!(
        choose_k_rates(&[marginal], 1, 1, price, &free),
        (0, Some(0.0))
    );
    let clear = 0.59;
    assert!(gain(clear) > PAY_HURDLE);
    let (k, saved) = choose_k_rates(&[clear], 1, 1, price, &free);
    assert_eq!(k, 1);
    // saved = 1 / plain rate - 1 / drafting rate, seconds per committed token
    assert!((saved.unwrap() - (1.0 - 1.5 / 1.59)).abs() < 1e-12);
}

/// A catch-up must be repaid CATCH_UP_MARGIN times over the horizon.
#[test]
fn short_catch_ups_set_no_row_price() {
    // 4 positions behind, +5 ms over plain: the drafter's fixed cost, not a price per row
    assert_eq!(catch_up_row_price(4, 5e-3, 3e-3), None);
    assert!(!starts_from_far(4));
    // a prompt's catch-up: the larger of the step's excess and the drafter's time
    let p = catch_up_row_price(48, 12e-3, 15e-3).unwrap();
    assert!((p - 15e-3 / 48.0).abs() < 1e-15);
    assert_eq!(catch_up_row_price(16, 8e-3, 0.0), Some(0.5e-3));
    assert!(starts_from_far(16) && starts_from_far(200));
}

#[test]
fn catch_up_needs_its_margin() {
    // 100 positions at 0.1 ms: 10 ms; 0.1 ms saved per committed token
    let (lag, per_row, saved) = (100, 1e-4, 1e-4);
    let cost = lag as f64 * per_row;
    let repaid = |h: usize| saved * h as f64 / cost;
    assert!(repaid(120) > 1.0 && repaid(120) < CATCH_UP_MARGIN);
    assert!(!catch_up_pays(lag, per_row, saved, 120));
    assert!(repaid(160) > CATCH_UP_MARGIN);
    assert!(catch_up_pays(lag, per_row, saved, 160));
}

#[test]
fn horizon_follows_finished_lengths() {
    let mut l = Lengths::default();
    // no history: as many as generated so far (at least 32), capped by max_tokens
    assert_eq!(l.horizon(0, 256), 32);
    assert_eq!(l.horizon(100, 256), 100);
    assert_eq!(l.horizon(100, 40), 40);
    for n in [40, 50, 60, 70, 80, 90, 100, 110] {
        l.record(n);
    }
    // the median remaining length of those that got past it
    assert_eq!(l.horizon(0, 256), 80); // 40..110: remaining of the 5th of 8 sorted
                                       // 70..110 -> 5, 15, 25, 35, 45: median 25
    assert_eq!(l.horizon(65, 256), 25);
    // past all but three of eight finished requests: the tail guess
    assert_eq!(l.horizon(85, 256), Lengths::TAIL);
    assert_eq!(l.horizon(200, 256), Lengths::TAIL);
    // only the last 64 count
    for _ in 0..64 {
        l.record(1000);
    }
    assert_eq!(l.horizon(200, 2000), 800);
}

#[test]
fn expected_tokens_formula() {
    assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    assert!((expected_tokens(0.0, 5) - 1.0).abs() < 1e-12);
}

#[test]
fn group_pricing_keeps_together_a_batch_that_equal_shares_break_up() {
    // Batch 4, the MTP layer as traced on the widened target: a plain step 14.4 ms (3.6 ms a
    // request), a verified drafted token 1.6 ms, the MTP forward 2.6 ms whatever its tokens.
    // Three requests may draft (the fourth is catching up on its prompt), one of them with a
    // low acceptance of its own.
    let price = Some(StepPrice {
        share: 3.6e-3,
        per_draft: 1.6e-3,
    });
    let mut draft = LinearCost::default();
    draft.observe(1, 2.6e-3);
    draft.observe(4, 2.6e-3);
    let alphas = [0.38, 0.95, 0.76];
    let drafting = |sharing: usize| {
        alphas
            .iter()
            .filter(|&&a| choose_k_rates(&[a], 1, sharing, price, &draft).0 > 0)
            .count()
    };
    // equal shares: 0.38 refuses at a third of the forward, 0.76 at a half, 0.95 alone: nobody
    assert_eq!(drafting(3), 2);
    assert_eq!(drafting(2), 1);
    assert_eq!(drafting(1), 0);
    assert_eq!(sharing_fixed_point(3, drafting), 1);
    // with the forward taken as paid, 0.95 and 0.76 draft and together save more than it
    assert_eq!(drafting(SHARED_BY_GROUP), 2);
    let saving: f64 = alphas
        .iter()
        .filter(|&&a| choose_k_rates(&[a], 1, SHARED_BY_GROUP, price, &draft).0 > 0)
        .map(|&a| step_saving(&[a], 1, SHARED_BY_GROUP, price, &draft))
        .sum();
    // 3.6 x 1.95 - 5.2 = 1.82 ms and 3.6 x 1.76 - 5.2 = 1.14 ms against 2.6 ms (+ the hurdle)
    assert!((saving - 2.956e-3).abs() < 1e-6, "saving {saving}");
    assert!(group_pays(saving, 2.6e-3, 1));
    // two draft positions run the forward twice: 2 x 2.6 ms is more than they save
    assert!(!group_pays(saving, 2.6e-3, 2));
    // and a group that saves just the forward's cost does not clear the hurdle
    assert!(!group_pays(2.6e-3, 2.6e-3, 1));
    assert!(!group_pays(0.0, 0.0, 0));
}

#[test]
fn no_group_where_a_drafted_token_costs_nearly_a_request() {
    // Batch 16: a request's share of a plain step 1.8 ms, a verified drafted token 1.5 ms: at
    // 0.78 accepted nobody drafts even with the forward paid, so nothing is saved.
    let price = Some(StepPrice {
        share: 1.8e-3,
        per_draft: 1.5e-3,
    });
    let mut draft = LinearCost::default();
    draft.observe(16, 2.1e-3);
    assert_eq!(
        choose_k_rates(&[0.78], 4, SHARED_BY_GROUP, price, &draft).0,
        0
    );
    assert!(!group_pays(0.0, 2.1e-3, 0));
    // a request's saving is zero without drafts, and negative where drafting loses
    assert_eq!(step_saving(&[0.78], 0, SHARED_BY_GROUP, price, &draft), 0.0);
    assert!(step_saving(&[0.78], 1, SHARED_BY_GROUP, price, &draft) < 0.0);
    // before the target is priced nothing is predicted
    assert_eq!(step_saving(&[0.78], 1, 1, None, &draft), 0.0);
}

//! How many tokens to draft (k) per request per step.
//!
//! Fixed mode: k = k_max. Adaptive mode: maximise expected committed tokens per second,
//! E(k) / cost(k), with E(k) = 1 + sum_{i<=k} prod_{j<=i} c_j for the conditional acceptance c_j
//! of draft position j (the engine keeps one estimate per position: an MTP layer chained on its
//! own output accepts far less at position 2 than at 1, so one per-token rate would overdraft;
//! for a constant c this is (1 - c^(k+1)) / (1 - c)), and cost(k) = the request's share of a
//! plain step plus k drafted tokens' verification and draft forwards, from the target's cost
//! model ([`TargetCost`]: a plain step by batch, a drafted token's price by batch class) and a
//! linear model of one draft forward, all fitted online from measured step times. k = 0 when
//! speculation does not pay by a margin ([`PAY_HURDLE`]; large batches, where the fixed costs
//! are shared, or low acceptance). The acceptance estimates learn fast from a prior
//! ([`learn_acceptance`]); the engine ramps how many requests may draft on little evidence
//! ([`ramp_cap`]) and re-explores a drafter it stopped using ([`explore_due`]). A draft
//! forward's fixed cost (an MTP layer streams a whole MoE layer whether it drafts for one
//! request or sixteen) is priced over the requests that draft in it ([`sharing_fixed_point`]),
//! or taken as paid where those that would then draft save more than it together
//! ([`group_pays`]).
//!
//! Files: `cost.rs` (the target's and the drafter's fitted costs), `acceptance.rs` (acceptance
//! estimates and their priors), `explore.rs` (how many requests may draft on little evidence,
//! and when an idle drafter is re-measured), `catch_up.rs` (what starting a request whose
//! drafter lags costs, and the horizon that must pay it back); here: the choice of k, the
//! count of requests sharing a draft forward, and the group's test.

mod acceptance;
mod catch_up;
mod cost;
mod explore;

pub use acceptance::*;
pub use catch_up::*;
pub use cost::*;
pub use explore::*;

/// How much faster (committed tokens per second) than plain decoding the adaptive policy's
/// prediction for k > 0 must be before it drafts: 4 %. The prediction is biased upwards where
/// it is marginal — each draft position's acceptance is rated above its estimate
/// ([`ACCEPT_OPTIMISM`]), and a batch class's draft price starts from a prior that undercounts
/// small batches — so a predicted gain of a few percent was, traced on the widened target, a
/// loss: the n-gram drafter (15-25 % accepted overall, ~0 % on the last requests of a batch-16
/// run) drafted 1-3 tokens per step at batch 2-3 for a predicted 1-3 % gain, each drafted token
/// costing ~1 ms more than priced and none accepted (adaptive 0.95-0.96x of plain).
pub const PAY_HURDLE: f64 = 0.04;

/// Expected committed tokens for k drafts at per-token acceptance a.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    let a = a.clamp(0.0, 0.999_999);
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// Expected committed tokens for k drafts with conditional acceptance `c[j]` at position j + 1
/// (positions past `c` take its last value).
pub fn expected_tokens_at(c: &[f64], k: usize) -> f64 {
    let (mut e, mut p) = (1.0, 1.0);
    for j in 0..k {
        let cj = c
            .get(j)
            .or(c.last())
            .copied()
            .unwrap_or(0.0)
            .clamp(0.0, 0.999_999);
        p *= cj;
        e += p;
    }
    e
}

/// Choose k in 0..=k_max for one request with one per-token acceptance `a` (every position).
/// `batch`: requests in the step; `target`/`draft`: fitted costs (target: one line in tokens).
pub fn choose_k(
    a: f64,
    k_max: usize,
    batch: usize,
    target: &LinearCost,
    draft: &LinearCost,
) -> usize {
    choose_k_at(&[a], k_max, batch, target, draft)
}

/// [`choose_k`] with a conditional acceptance per draft position (see the module doc).
pub fn choose_k_at(
    c: &[f64],
    k_max: usize,
    batch: usize,
    target: &LinearCost,
    draft: &LinearCost,
) -> usize {
    choose_k_rates(c, k_max, batch, StepPrice::of_line(target, batch), draft).0
}

/// [`choose_k_at`] for a step priced by [`TargetCost::price`], and the predicted seconds per
/// committed token it saves against k = 0 (None before the target cost has a price). A k > 0
/// must beat k = 0's predicted rate by [`PAY_HURDLE`]. `sharing`: the requests whose drafts
/// share each draft forward's fixed cost (`engine::schedule` finds how many will draft): one
/// MTP forward streams a whole MoE layer's weights whether it drafts for one request or
/// sixteen, so at batch 16 with only one request caught up its draft costs that request the
/// whole forward, not a sixteenth — priced at a sixteenth, the MTP drafter drafted one token
/// for one request per step at batch 16 (~3 ms of MTP forward and ~1.3 ms of verification for
/// ~0.7 accepted tokens).
pub fn choose_k_rates(
    c: &[f64],
    k_max: usize,
    sharing: usize,
    price: Option<StepPrice>,
    draft: &LinearCost,
) -> (usize, Option<f64>) {
    let Some(StepPrice { share, per_draft }) = price else {
        return (k_max, None); // no measurements yet: explore
    };
    // A drafter without a model (n-gram) is never timed: it costs nothing.
    let (db, dt) = draft.fit().unwrap_or((0.0, 0.0));
    let b = sharing.max(1) as f64;
    // (k, rate): k = 0 holds the bar a k > 0 must beat (plain's rate plus the hurdle)
    let mut best = (0usize, 0.0f64);
    let mut plain = 0.0;
    for k in 0..=k_max {
        let cost = request_cost(share, per_draft, k, b, (db, dt));
        let rate = expected_tokens_at(c, k) / cost.max(1e-12);
        if k == 0 {
            plain = rate;
            best = (0, rate * (1.0 + PAY_HURDLE));
        } else if rate > best.1 * (1.0 + 1e-9) {
            best = (k, rate);
        }
    }
    let saved = if best.0 == 0 || plain <= 0.0 {
        0.0
    } else {
        1.0 / plain - 1.0 / best.1
    };
    (best.0, Some(saved))
}

/// The seconds one request's k drafts are predicted to save in a step against decoding its
/// committed tokens plainly (its share of a plain step per token): share x E(k) - cost(k),
/// with the draft forward's fixed cost shared by `sharing` (0 before the target is priced).
pub fn step_saving(
    c: &[f64],
    k: usize,
    sharing: usize,
    price: Option<StepPrice>,
    draft: &LinearCost,
) -> f64 {
    let Some(StepPrice { share, per_draft }) = price else {
        return 0.0;
    };
    let fit = draft.fit().unwrap_or((0.0, 0.0));
    let cost = request_cost(share, per_draft, k, sharing.max(1) as f64, fit);
    share * expected_tokens_at(c, k) - cost
}

/// What one request's step costs with k drafts: its share of a plain step, plus per drafted
/// token its verification (`per_draft`), its share of the draft forward's fixed cost (`db`
/// over `sharing` requests) and the forward's per-token cost (`dt`; `(db, dt)` is the drafter's
/// fitted line, zero for a drafter without a model).
fn request_cost(share: f64, per_draft: f64, k: usize, sharing: f64, (db, dt): (f64, f64)) -> f64 {
    if k == 0 {
        share
    } else {
        share + k as f64 * (per_draft + db / sharing + dt)
    }
}

/// The sharing count of a batch that drafts as a group ([`group_pays`]): each request is priced
/// with the draft forward's fixed cost already paid.
pub const SHARED_BY_GROUP: usize = usize::MAX;

/// Whether drafting as a group pays: the requests that would draft with the draft forward's
/// fixed cost taken as paid (priced at [`SHARED_BY_GROUP`]) save together, per step (`saving`,
/// the sum of their [`step_saving`]s), more than the `positions` forwards' fixed cost
/// (`fixed` seconds each) by [`PAY_HURDLE`]. Pricing each request at an equal share of that
/// cost instead lets the group fall apart one request at a time: one whose own acceptance is
/// low refuses at its share, which raises everyone's share (see `engine::schedule`).
pub fn group_pays(saving: f64, fixed: f64, positions: usize) -> bool {
    positions > 0 && saving > 0.0 && saving >= fixed * positions as f64 * (1.0 + PAY_HURDLE)
}

/// Over how many requests a draft forward's fixed cost is priced: the fixed point of
/// `drafting(sharing)`, the number of requests that choose to draft when each is priced as
/// sharing the forward with `sharing` requests. Starts from the whole decode batch (`n_decode`)
/// and lowers the count to the number that chose to draft until it holds; a lower count only
/// makes drafting dearer, so the count falls monotonically and this ends (at most `n_decode`
/// rounds). Never below 1.
pub fn sharing_fixed_point(n_decode: usize, mut drafting: impl FnMut(usize) -> usize) -> usize {
    let n = n_decode.max(1);
    let mut sharing = n;
    loop {
        let m = drafting(sharing).clamp(1, n);
        if m >= sharing {
            return sharing;
        }
        sharing = m;
    }
}

#[cfg(test)]
mod tests;

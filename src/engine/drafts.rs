//! How many tokens one decode request drafts this step (`Core::schedule` asks once per request
//! that may draft): k from the policy (fixed, or the adaptive rate maximum over the engine's
//! per-position acceptance scaled to this request, refused when a needed catch-up does not pay
//! back), clipped so the drafts never pass max_tokens, then split at the thinking budget into
//! model drafts and certain forced end-of-think tokens.
//!
//! Guarantee: the choice only decides how many tokens are verified, never what is committed.

use crate::spec::policy::{
    catch_up_pays, choose_k_rates, optimistic_acceptance, pos_prior_weight, AcceptPrior,
    LinearCost, TargetCost,
};
use crate::spec::SpecMode;

use super::request::ReqState;

/// Verifications after which a request's own acceptance estimate replaces the drafter's.
const OWN_ALPHA_AFTER: u32 = 4;

/// What every request's draft choice in one step reads: the mode, the fitted costs of a target
/// step and a draft forward, the step's decode batch and the engine's acceptance estimates.
pub(super) struct DraftContext<'a> {
    pub spec: SpecMode,
    pub target: &'a TargetCost,
    pub draft: &'a LinearCost,
    pub n_decode: usize,
    /// Requests that would share each draft forward's fixed cost (`policy::choose_k_rates`).
    pub sharing: usize,
    /// The drafter's overall acceptance estimate.
    pub drafter_alpha: f64,
    /// Its conditional acceptance per draft position.
    pub pos_alpha: &'a [f64],
    /// Observations behind each `pos_alpha`.
    pub pos_obs: &'a [u64],
    /// The first position's acceptance prior (`Core::first_prior`; later positions': the
    /// guess).
    pub first_prior: AcceptPrior,
    /// Adaptive mode: draft at least this many (the informed policy's explorer, 1; else 0).
    pub min_k: usize,
}

/// Choose k (model drafts) and the certain forced tokens for a decode request; returns
/// (k_model, certain, saved, saving) where saved = draft positions the budget clipped away and
/// saving = the predicted seconds this request's drafts save in the step against decoding
/// its tokens plainly (adaptive mode; 0 when it does not draft).
/// `catch_up`: (lag, seconds per position, horizon) when the request must first catch up.
pub(super) fn choose_drafts(
    ctx: &DraftContext<'_>,
    r: &ReqState,
    catch_up: Option<(usize, f64, usize)>,
) -> (usize, Vec<u32>, usize, f64) {
    let DraftContext {
        spec,
        target,
        draft,
        n_decode,
        sharing,
        drafter_alpha,
        pos_alpha,
        pos_obs,
        first_prior,
        min_k,
    } = *ctx;
    // the engine's per-position profile, scaled by how this request's acceptance compares
    // with the drafter's (once the request has its own estimate)
    let ratio = if r.alpha_obs >= OWN_ALPHA_AFTER {
        (r.alpha / drafter_alpha.max(1e-3)).clamp(0.0, 2.0)
    } else {
        1.0
    };
    // adaptive: each position rated at its upper confidence bound (`optimistic_acceptance`,
    // which also caps it below 1)
    let c: Vec<f64> = pos_alpha
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let obs = pos_obs.get(j).copied().unwrap_or(0);
            optimistic_acceptance(p * ratio, obs, pos_prior_weight(&first_prior, j))
        })
        .collect();
    let price = target.price(n_decode);
    let mut k = match spec {
        SpecMode::Fixed(k) => k,
        SpecMode::Adaptive { k_max } => {
            let (k, saved) = choose_k_rates(&c, k_max, sharing, price, draft);
            match (catch_up, saved) {
                _ if min_k > k => min_k.min(k_max),
                (Some((lag, per_row, horizon)), Some(saved))
                    if !catch_up_pays(lag, per_row, saved, horizon) =>
                {
                    0
                }
                _ => k,
            }
        }
    };
    // never draft past max_tokens: k drafts commit at most k + 1 tokens
    let left = r.params.max_tokens.saturating_sub(r.generated());
    k = k.min(left.saturating_sub(1));
    if k == 0 {
        return (0, Vec::new(), 0, 0.0);
    }
    let saving = match spec {
        SpecMode::Adaptive { .. } => crate::spec::policy::step_saving(&c, k, sharing, price, draft),
        SpecMode::Fixed(_) => 0.0,
    };
    match r.budget.remaining() {
        Some(rem) if rem < k => {
            let mut certain = if rem == 0 {
                r.budget.forced_sequence_after_spent()
            } else {
                r.budget.config().end.clone()
            };
            certain.truncate(k - rem);
            (rem, certain, k - rem, saving)
        }
        _ => (k, Vec::new(), 0, saving),
    }
}

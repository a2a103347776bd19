//! Acceptance estimates: their priors (a guess, or the acceptance recorded with the drafter's
//! weights), how observations move them, and the optimism the policy decides on.

/// Weight of the acceptance prior, in observations, and the observations an estimate remembers.
pub const ACCEPT_PRIOR_WEIGHT: f64 = 4.0;
pub const ACCEPT_MEMORY: u64 = 20;

/// Weight, in observations, of a first-position acceptance recorded with the drafter's weights
/// (`Proposer::recorded_acceptance`: measured on held-out traces of the task it was trained
/// for): three times a guess's. Traced on the widened target (MTP, batch 4): the layer's first
/// two drafts were rejected, which took the 0.7 guess at weight 4 to 0.47 and drafting stopped
/// for the rest of the run (adaptive 0.98-0.99x where fixed k = 1 gave 1.05-1.11x at 74 %
/// accepted); from the recorded 0.78 at weight 12 the same two rejections leave 0.67.
pub const RECORDED_PRIOR_WEIGHT: f64 = 12.0;

/// Where an acceptance estimate starts: a value and its weight in observations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptPrior {
    pub alpha: f64,
    pub weight: f64,
}

impl AcceptPrior {
    /// A drafter nothing is known of: 0.7 at [`ACCEPT_PRIOR_WEIGHT`].
    pub const GENERIC: AcceptPrior = AcceptPrior {
        alpha: 0.7,
        weight: ACCEPT_PRIOR_WEIGHT,
    };

    /// A recorded acceptance (clamped to [0.05, 0.95]) at [`RECORDED_PRIOR_WEIGHT`].
    pub fn recorded(alpha: f64) -> AcceptPrior {
        AcceptPrior {
            alpha: alpha.clamp(0.05, 0.95),
            weight: RECORDED_PRIOR_WEIGHT,
        }
    }

    /// Whether this prior is a recorded acceptance rather than the guess (the adaptive policy
    /// then skips exploring for acceptance in steps it cannot time, `engine::schedule`).
    pub fn is_recorded(&self) -> bool {
        self.weight > Self::GENERIC.weight
    }
}

/// The prior weight of draft position `j`'s acceptance estimate: the drafter's first-position
/// prior `first` for position 0, the guess's for the chained positions after it.
pub fn pos_prior_weight(first: &AcceptPrior, j: usize) -> f64 {
    if j == 0 {
        first.weight
    } else {
        AcceptPrior::GENERIC.weight
    }
}

/// The `seen`-th acceptance observation `x` (0 or 1 for one draft position, or a fraction; the
/// caller counts, from 1) into the estimate `est`: the mean of the prior (weight `prior_weight`,
/// [`ACCEPT_PRIOR_WEIGHT`] for a guess) and the observations while they are few, then an
/// exponential average over about [`ACCEPT_MEMORY`] of them (weight 1 / 24 per observation
/// after a guess). An EMA of
/// weight 0.05 from the 0.7 prior took ~10 verifications to learn that the n-gram drafter
/// accepts 20 % on the widened target's workload, while the ramp let up to 11 requests draft at
/// once; this estimate is at 0.45 after four. A drafter unlucky in its first verifications (the
/// MTP layer's first two drafts on that workload are rejected) is re-measured by the policy's
/// periodic explorer (`engine::schedule`).
pub fn learn_acceptance(est: &mut f64, seen: u64, x: f64, prior_weight: f64) {
    *est += (x - *est) / (prior_weight + seen.clamp(1, ACCEPT_MEMORY) as f64);
}

/// How far above its estimate the adaptive policy rates a draft position's acceptance, in
/// standard errors of an estimate from the prior and `obs` observations: half of one (one
/// standard error let the n-gram drafter, 12-15 % accepted, draft at a loss at batch 4:
/// adaptive 0.95-0.96x; none left the weak draft model at 1.06x there, fixed k = 1 1.2x).
pub const ACCEPT_OPTIMISM: f64 = 0.5;

/// The acceptance the policy decides on for an estimate `a` behind `obs` observations and a
/// prior of weight `prior_weight`:
/// `a + ACCEPT_OPTIMISM x sqrt(a (1 - a) / (prior_weight + obs))` (an upper confidence
/// bound; `obs` uncapped, so it shrinks towards `a` as evidence grows; exact at 0). Without it
/// a drafter whose first two verifications were rejected stopped for good: on the widened target at
/// batch 4 the weak draft model (68 % accepted) fell to 0.47 after two rejections, drafting
/// stopped paying at that estimate, and nothing re-measured it for the rest of the run (64 idle
/// steps before the explorer's turn): adaptive 1.05x where fixed k = 1 gave 1.2x.
pub fn optimistic_acceptance(a: f64, obs: u64, prior_weight: f64) -> f64 {
    let a = a.clamp(0.0, 0.999);
    let se = (a * (1.0 - a) / (prior_weight + obs as f64)).sqrt();
    (a + ACCEPT_OPTIMISM * se).min(0.999)
}

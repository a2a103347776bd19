//! Pacing on little evidence: how many requests may draft while the drafter has few
//! verifications (the ramp), and when an idle drafter is re-measured (the explorer).

/// Verifications of a drafter after which the informed adaptive policy lets every request draft
/// in one step; before that [`ramp_cap`] requests may (see `engine::schedule`).
pub const RAMP_OBS: u64 = 16;

/// Requests that may draft in one informed step while the drafter has `obs` verifications:
/// 1 + obs below [`RAMP_OBS`] (1, 2, 4, 8, 16 in consecutive steps where every allowed request
/// drafts), unbounded after.
pub fn ramp_cap(obs: u64) -> usize {
    if obs < RAMP_OBS {
        1 + obs as usize
    } else {
        usize::MAX
    }
}

/// The informed policy's periodic explorer: one request drafts one token once `idle_steps`
/// decode steps in a row had no drafts and `idle_steps >= period x n_decode`; `period` starts
/// at [`EXPLORE_EVERY`], doubles (up to [`EXPLORE_MAX`]) after each step in which only the
/// explorer drafted, and returns to [`EXPLORE_EVERY`] after a step in which the policy drafted
/// of its own accord.
pub const EXPLORE_EVERY: u64 = 16;
pub const EXPLORE_MAX: u64 = 128;

/// Whether the periodic explorer drafts this step (see [`EXPLORE_EVERY`]).
pub fn explore_due(idle_steps: u64, period: u64, n_decode: usize) -> bool {
    idle_steps >= period.saturating_mul(n_decode.max(1) as u64)
}

/// The explorer's period after a step with drafts: doubled when only the explorer drafted.
pub fn next_explore_period(period: u64, only_explorer: bool) -> u64 {
    if only_explorer {
        (period * 2).clamp(EXPLORE_EVERY, EXPLORE_MAX)
    } else {
        EXPLORE_EVERY
    }
}

//! Per-request and engine-wide speculation / budget counters (names follow the metrics users know:
//! drafts, draft tokens, accepted tokens, accepted per position).

use serde::Serialize;

/// Counters of one request (all counts are of COMMITTED target tokens unless named "drafted").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u64,
    pub reasoning_tokens: u64,
    pub answer_tokens: u64,
    /// Draft tokens proposed by the drafter (model or n-gram), excluding certain (forced) ones.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    pub recovered_tokens: u64,
    pub bonus_tokens: u64,
    /// 1 when the end of thinking was forced by the budget.
    pub forced_end_of_think: u64,
    /// Forced end-marker tokens committed.
    pub forced_tokens: u64,
    /// Verification rounds that carried at least one draft token.
    pub draft_steps: u64,
    /// Draft positions not spent because the thinking budget clipped the lookahead.
    pub draft_tokens_saved: u64,
    /// accepted_per_position[i]: drafts accepted at draft position i (0-based).
    pub accepted_per_position: Vec<u64>,
    /// drafted_per_position[i]: drafts proposed at position i.
    pub drafted_per_position: Vec<u64>,
    pub preemptions: u64,
}

impl Counters {
    /// 1 + accepted / draft steps.
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.draft_steps == 0 {
            1.0
        } else {
            1.0 + self.accepted_tokens as f64 / self.draft_steps as f64
        }
    }

    pub fn add(&mut self, o: &Counters) {
        self.prompt_tokens += o.prompt_tokens;
        self.cached_prompt_tokens += o.cached_prompt_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
        self.answer_tokens += o.answer_tokens;
        self.drafted_tokens += o.drafted_tokens;
        self.accepted_tokens += o.accepted_tokens;
        self.recovered_tokens += o.recovered_tokens;
        self.bonus_tokens += o.bonus_tokens;
        self.forced_end_of_think += o.forced_end_of_think;
        self.forced_tokens += o.forced_tokens;
        self.draft_steps += o.draft_steps;
        self.draft_tokens_saved += o.draft_tokens_saved;
        self.preemptions += o.preemptions;
        add_vec(&mut self.accepted_per_position, &o.accepted_per_position);
        add_vec(&mut self.drafted_per_position, &o.drafted_per_position);
    }

    pub(crate) fn bump_position(v: &mut Vec<u64>, i: usize) {
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        v[i] += 1;
    }
}

fn add_vec(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

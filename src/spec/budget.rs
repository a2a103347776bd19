//! Reasoning (thinking) budget — a pure state machine fed ONLY with committed target tokens.
//!
//! Phases: `Before` (no think-start seen yet), `Thinking`, `Answer`. The prompt decides the initial
//! phase (a prompt may end inside thinking). In `Thinking`, every committed token chosen by the model
//! counts as a reasoning token (a naturally emitted end marker included); once `reasoning == budget`
//! the next committed tokens are forced to the end-of-think sequence (continuing a partially emitted
//! marker), and forced tokens count as neither reasoning nor answer. After the marker completes the
//! phase is `Answer` and tokens count as answer tokens (tokens in `Before` count as answer too).
//! Invariant: `reasoning <= budget` always. Draft tokens never reach this module until committed.

/// Budget settings of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Maximum reasoning tokens; None = unlimited.
    pub budget: Option<usize>,
    /// Think-start marker (may be several tokens; empty = no marker known).
    pub start: Vec<u32>,
    /// Think-end marker (may be several tokens; empty = budget cannot be enforced).
    pub end: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Before,
    Thinking,
    Answer,
}

/// Budget state of one request.
#[derive(Clone, Debug)]
pub struct BudgetState {
    cfg: BudgetConfig,
    phase: Phase,
    /// Committed reasoning tokens.
    pub reasoning: usize,
    /// Committed answer tokens.
    pub answer: usize,
    /// Forced end-marker tokens committed.
    pub forced_tokens: usize,
    /// Whether the end of thinking was forced (0/1 per request).
    pub forced_end: bool,
    /// Recent committed tokens (prompt tail + output), enough to match the markers.
    tail: Vec<u32>,
}

fn ends_with(hay: &[u32], needle: &[u32]) -> bool {
    !needle.is_empty() && hay.len() >= needle.len() && &hay[hay.len() - needle.len()..] == needle
}

fn last_index_of(hay: &[u32], needle: &[u32]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| &hay[i..i + needle.len()] == needle)
}

impl BudgetState {
    /// Initial state from the prompt: thinking if the last think-start comes after the last think-end.
    pub fn new(cfg: BudgetConfig, prompt: &[u32]) -> Self {
        let s = last_index_of(prompt, &cfg.start);
        let e = last_index_of(prompt, &cfg.end);
        let phase = match (s, e) {
            (Some(s), Some(e)) if s > e => Phase::Thinking,
            (Some(_), None) => Phase::Thinking,
            (_, Some(_)) => Phase::Answer,
            (None, None) => Phase::Before,
        };
        let keep = cfg.start.len().max(cfg.end.len());
        let tail = prompt[prompt.len().saturating_sub(keep)..].to_vec();
        BudgetState {
            cfg,
            phase,
            reasoning: 0,
            answer: 0,
            forced_tokens: 0,
            forced_end: false,
            tail,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.cfg
    }

    /// Length of the longest proper prefix of the end marker that the committed tail ends with.
    fn end_partial(&self) -> usize {
        let end = &self.cfg.end;
        (1..end.len())
            .rev()
            .find(|&m| ends_with(&self.tail, &end[..m]))
            .unwrap_or(0)
    }

    /// The token the next commit must be, if the budget forces it.
    pub fn forced_next(&self) -> Option<u32> {
        match (self.phase, self.cfg.budget) {
            (Phase::Thinking, Some(b)) if self.reasoning >= b && !self.cfg.end.is_empty() => {
                Some(self.cfg.end[self.end_partial()])
            }
            _ => None,
        }
    }

    /// Thinking tokens the model may still choose before the end is forced (None = unlimited or
    /// not thinking).
    pub fn remaining(&self) -> Option<usize> {
        match (self.phase, self.cfg.budget) {
            (Phase::Thinking, Some(b)) if !self.cfg.end.is_empty() => {
                Some(b.saturating_sub(self.reasoning))
            }
            _ => None,
        }
    }

    /// The forced sequence that follows once the budget is spent: the rest of the end marker given
    /// the committed tail (used by the scheduler to append certain draft tokens).
    pub fn forced_sequence_after_spent(&self) -> Vec<u32> {
        self.cfg.end[self.end_partial()..].to_vec()
    }

    /// Record one committed token; `forced` = it was forced by the budget.
    pub fn commit(&mut self, tok: u32, forced: bool) {
        match self.phase {
            Phase::Thinking => {
                if forced {
                    self.forced_tokens += 1;
                    self.forced_end = true;
                } else {
                    self.reasoning += 1;
                }
            }
            Phase::Before | Phase::Answer => self.answer += 1,
        }
        self.tail.push(tok);
        let keep = self.cfg.start.len().max(self.cfg.end.len()).max(1);
        if self.tail.len() > 4 * keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        match self.phase {
            Phase::Thinking if ends_with(&self.tail, &self.cfg.end) => self.phase = Phase::Answer,
            Phase::Before if ends_with(&self.tail, &self.cfg.start) => self.phase = Phase::Thinking,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(b: Option<usize>, end: &[u32]) -> BudgetConfig {
        BudgetConfig {
            budget: b,
            start: vec![100],
            end: end.to_vec(),
        }
    }

    #[test]
    fn prompt_decides_phase() {
        assert_eq!(
            BudgetState::new(cfg(None, &[101]), &[1, 2]).phase(),
            Phase::Before
        );
        assert_eq!(
            BudgetState::new(cfg(None, &[101]), &[1, 100, 5]).phase(),
            Phase::Thinking
        );
        assert_eq!(
            BudgetState::new(cfg(None, &[101]), &[100, 5, 101]).phase(),
            Phase::Answer
        );
        assert_eq!(
            BudgetState::new(cfg(None, &[101]), &[100, 101, 100]).phase(),
            Phase::Thinking
        );
    }

    #[test]
    fn budget_forces_multi_token_end_and_never_exceeds() {
        let mut s = BudgetState::new(cfg(Some(3), &[101, 102]), &[100]);
        for t in [5, 6, 7] {
            assert_eq!(s.forced_next(), None);
            s.commit(t, false);
        }
        assert_eq!(s.reasoning, 3);
        assert_eq!(s.forced_next(), Some(101));
        s.commit(101, true);
        assert_eq!(s.forced_next(), Some(102));
        s.commit(102, true);
        assert_eq!(s.phase(), Phase::Answer);
        assert_eq!(s.forced_next(), None);
        s.commit(9, false);
        assert_eq!(
            (s.reasoning, s.answer, s.forced_tokens, s.forced_end),
            (3, 1, 2, true)
        );
    }

    #[test]
    fn forcing_continues_a_partial_natural_marker() {
        let mut s = BudgetState::new(cfg(Some(2), &[101, 102]), &[100]);
        s.commit(5, false);
        s.commit(101, false); // model starts the marker on its own, budget now spent
        assert_eq!(s.forced_next(), Some(102));
        assert_eq!(s.forced_sequence_after_spent(), vec![102]);
    }

    #[test]
    fn budget_zero_forces_immediately_and_natural_end_is_not_forced() {
        let s = BudgetState::new(cfg(Some(0), &[101]), &[100]);
        assert_eq!(s.forced_next(), Some(101));
        let mut s = BudgetState::new(cfg(Some(10), &[101]), &[100]);
        s.commit(101, false);
        assert_eq!(s.phase(), Phase::Answer);
        assert!(!s.forced_end);
        assert_eq!(s.reasoning, 1);
    }

    #[test]
    fn model_may_open_thinking_itself() {
        let mut s = BudgetState::new(cfg(Some(1), &[101]), &[1]);
        s.commit(100, false);
        assert_eq!(s.phase(), Phase::Thinking);
        assert_eq!(s.answer, 1);
        s.commit(4, false);
        assert_eq!(s.forced_next(), Some(101));
    }
}

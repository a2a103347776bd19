//! Speculative decoding, split by role: `proposer` (what to draft: a draft model, the target's MTP
//! layer or n-gram lookup),
//! `verifier` (rejection sampling / greedy match, per position), `policy` (how many to draft),
//! `budget` (the reasoning budget, fed only committed target tokens), `counters`.
//! The engine's step drives them: policy -> propose -> one batched target forward -> verify and
//! commit (budget + stops per committed token) -> truncate target and draft KV.

pub mod ab;
pub mod budget;
pub mod counters;
pub mod draft_model;
pub mod guard;
pub mod mtp;
pub mod ngram;
pub mod policy;
pub mod proposer;
pub mod verifier;

pub use ab::AbProposer;
pub use budget::{BudgetConfig, BudgetState, Phase};
pub use counters::Counters;
pub use draft_model::DraftModelProposer;
pub use guard::{SpecGuard, StepKind};
pub use mtp::MtpProposer;
pub use proposer::{NgramProposer, Proposal, ProposeRequest, Proposer};
pub use verifier::{verify_position, Verdict};

/// How many tokens to draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMode {
    /// Always k (clipped by budget / max_tokens).
    Fixed(usize),
    /// Choose 0..=k_max per request per step from measured acceptance and costs.
    Adaptive { k_max: usize },
}

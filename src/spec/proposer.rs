//! The proposer trait: anything that suggests draft tokens for the target to verify.
//! Implementations: `DraftModelProposer` (a smaller DeepSeek model with its own latent KV cache,
//! returns q distributions), `MtpProposer` (the target's own multi-token-prediction layer, fed
//! the target's hidden states), `NgramProposer` (prompt lookup, no weights, q = one-hot) and
//! `AbProposer` (two of them, traffic split: a live A/B).

use crate::error::Result;
use crate::kv::KvStats;
use crate::sampling::{
    argmax, is_greedy, log_softmax, processed_probs, sample_from, Rng, SamplingParams,
};

use super::ngram::ngram_propose;

/// One request's ask.
#[derive(Clone)]
pub struct ProposeRequest<'a> {
    pub id: u64,
    /// All committed tokens (prompt + output).
    pub context: &'a [u32],
    /// Original prompt length (decides the draft's attention path per position).
    pub prompt_len: usize,
    /// Number of tokens to propose.
    pub k: usize,
    pub params: &'a SamplingParams,
    /// The A/B arm the request asked for (`Request::draft_arm`; only `AbProposer` reads it).
    pub arm: Option<u8>,
    /// Confidence cut (`EngineConfig::draft_p_min`): a model drafter stops drafting for this
    /// request after a token it gave a probability below this ([`Proposal::drafted_prob`]);
    /// 0 = always k. Verification is unchanged, so outputs are too.
    pub p_min: f32,
}

/// Draft tokens and, for model drafters, their distributions q (processed with the request's params).
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// [tokens.len()][vocab] when the drafter has distributions.
    pub q: Option<Vec<Vec<f32>>>,
}

impl Proposal {
    /// An empty proposal of a model drafter (it will carry q distributions).
    pub fn with_q() -> Self {
        Proposal {
            tokens: Vec::new(),
            q: Some(Vec::new()),
        }
    }

    /// The drafter's probability of the token it drafted last from `logits` (that row):
    /// softmax(logits) at it for a greedy request (whose q is one-hot; by [`log_softmax`], which
    /// handles NaN and infinite logits), q at it for a sampled one. 1 when nothing was drafted.
    pub fn drafted_prob(&self, logits: &[f32], params: &SamplingParams) -> f32 {
        let Some(&tok) = self.tokens.last() else {
            return 1.0;
        };
        match self.q.as_ref().and_then(|q| q.last()) {
            Some(q) if !is_greedy(params) => q.get(tok as usize).copied().unwrap_or(0.0),
            _ => log_softmax(logits)
                .get(tok as usize)
                .map_or(0.0, |&lp| (lp as f64).exp() as f32),
        }
    }

    /// Whether drafting should go on after the last token: its probability
    /// ([`Self::drafted_prob`]) is at least `p_min` (always, with `p_min` <= 0).
    pub fn confident(&self, logits: &[f32], params: &SamplingParams, p_min: f32) -> bool {
        p_min <= 0.0 || self.drafted_prob(logits, params) >= p_min
    }

    /// Draft one token from a drafter's logits row: greedy requests take the argmax, sampled
    /// ones sample from the request-processed distribution q, which is kept for verification.
    pub fn push_drafted(&mut self, logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
        let q = processed_probs(logits, params);
        let tok = if is_greedy(params) {
            argmax(logits)
        } else {
            sample_from(&q, rng)
        };
        self.tokens.push(tok);
        if let Some(qs) = self.q.as_mut() {
            qs.push(q);
        }
        tok
    }
}

/// A source of draft tokens.
pub trait Proposer: Send {
    /// Propose for every request (one entry per request, same order). A proposer may return fewer
    /// tokens than asked (e.g. its cache is full); never more.
    fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>>;
    /// The request's committed context after verification; the proposer drops whatever it cached
    /// beyond the longest prefix it still shares with `context`.
    fn on_commit(&mut self, id: u64, context: &[u32]);
    /// Forget a request (finished, cancelled or preempted).
    fn release(&mut self, id: u64);
    /// Short name for logs and stats.
    fn name(&self) -> String;
    /// KV statistics of the proposer's own cache, if it has one.
    fn kv_stats(&self) -> Option<KvStats> {
        None
    }
    /// After a contained panic: drop the KV block references of sequences it lost track of (see
    /// `KvCache::reclaim_unheld`); returns how many.
    fn reclaim_unheld(&mut self) -> usize {
        0
    }
    /// Check the proposer's state for a request against its committed context (tests): whatever
    /// it cached must be a prefix of `context`.
    fn check(&self, _id: u64, _context: &[u32]) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Draft KV bytes per token (all layers), 0 without a cache.
    fn kv_bytes_per_token(&self) -> usize {
        0
    }
    /// Whether drafting costs a model forward (decides whether timing is attributed to the draft).
    fn has_model(&self) -> bool {
        false
    }
    /// Weight bytes this proposer's forwards have needed so far, cumulative (per forward: its
    /// dense weights once, the union of the experts its tokens select, the head when a row wants
    /// logits, one embedding row per token — the target's count, `ForwardOut::weight_bytes`).
    /// 0 for a proposer without a model.
    fn weight_bytes(&self) -> u64 {
        0
    }
    /// Whether the proposer needs the target's hidden states (the MTP drafter): then the engine
    /// asks the target forward for them and hands every request's rows to
    /// [`Proposer::on_target_hidden`]. A reused prefix has no hidden states, so such a proposer
    /// restores its own state of a cached prefix ([`Proposer::match_prefix`]).
    fn wants_hidden(&self) -> bool {
        false
    }
    /// Request `id` (which asked for A/B arm `asked`) is being admitted, before its prefix match:
    /// a proposer that routes requests (`AbProposer`) fixes the request's arm here, so that only
    /// that arm restores a cached prefix and takes the prefill's hidden states. Default: nothing.
    fn admit(&mut self, _id: u64, _asked: Option<u8>) {}
    /// Prefix-cache reuse, at a request's admission (prefix caching on, the target's KV of
    /// `prompt` not computed yet): restore from the proposer's own cache what it holds of the
    /// request's first `max` positions, and return how many of them the target may reuse. The
    /// engine reuses at most that many of the target's cached positions and calls
    /// [`Proposer::settle_prefix`] with what it reused. Default: `max` (a proposer that catches
    /// up from the tokens alone needs nothing restored); the MTP drafter also returns `max`
    /// and skips what it lacks (`spec::mtp`, partial context).
    fn match_prefix(&mut self, _id: u64, _prompt: &[u32], max: usize) -> usize {
        max
    }
    /// The target reuses `len` cached positions of request `id` (at most what
    /// [`Proposer::match_prefix`] returned): the proposer drops what it restored beyond them,
    /// and one that needs hidden states and restored less skips the rest. Returns the context
    /// positions it holds or skipped — where its catch-up starts (the engine's drafter lag).
    /// Default: `len` (a proposer without a model has nothing to catch up on).
    fn settle_prefix(&mut self, _id: u64, len: usize) -> usize {
        len
    }
    /// The first draft position's acceptance recorded with the drafter's weights, measured on
    /// held-out traces (the MTP layer's `mtp_stats.json`, written by its training): the
    /// adaptive policy starts from it (`policy::AcceptPrior::recorded`) instead of a guess.
    /// Default: None.
    fn recorded_acceptance(&self) -> Option<f64> {
        None
    }
    /// Whether the proposer, newly installed beside running requests, catches up on the whole
    /// context it has not seen (a draft model replays the tokens) rather than starting where
    /// it gets state (the MTP layer needs the target's hidden states, so it skips the context
    /// before its swap): the engine counts the drafter's lag of those requests from zero or
    /// from their current length accordingly. Default: true.
    fn replays_unseen_context(&self) -> bool {
        true
    }
    /// Whether the proposer can draft for request `id` at all. False while it has no state for
    /// the request — the MTP layer swapped in mid-request, until the target's next step hands
    /// it hidden states: it would draft nothing, so the engine asks it for no drafts (no empty
    /// rounds, no catch-up timed that caught up on nothing). Default: true.
    fn can_draft(&self, _id: u64) -> bool {
        true
    }
    /// The target just computed positions `start .. start + fed.len()` of request `id`, fed with
    /// `fed`; `hidden` holds their final-norm hidden states [fed.len(), hidden]. Some rows may
    /// belong to drafts that verification rejects: the proposer keeps only rows whose fed
    /// tokens the committed context confirms.
    fn on_target_hidden(&mut self, _id: u64, _start: usize, _fed: &[u32], _hidden: &[f32]) {}
    /// The A/B arm serving request `id` (which asked for `asked`), or the one it will get at its
    /// first proposal (`AbProposer`; None for every other proposer).
    fn arm_of(&self, _id: u64, _asked: Option<u8>) -> Option<u8> {
        None
    }
}

/// Prompt-lookup proposer.
pub struct NgramProposer {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        NgramProposer { min_n: 1, max_n: 4 }
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>> {
        Ok(reqs
            .iter()
            .map(|r| Proposal {
                tokens: ngram_propose(r.context, r.k, self.min_n, self.max_n),
                q: None,
            })
            .collect())
    }
    fn on_commit(&mut self, _id: u64, _context: &[u32]) {}
    fn release(&mut self, _id: u64) {}
    fn name(&self) -> String {
        format!("ngram({}..{})", self.min_n, self.max_n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy: the drafted token's softmax probability under the draft logits; sampled: its q.
    #[test]
    fn drafted_prob_is_the_drafters_probability_of_its_token() {
        let mut rng = Rng::new(7);
        let greedy = SamplingParams::default();
        assert!(is_greedy(&greedy));
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY]; // softmax: 1/4, 3/4, 0
        let mut p = Proposal::with_q();
        assert_eq!(p.drafted_prob(&logits, &greedy), 1.0, "nothing drafted yet");
        assert_eq!(p.push_drafted(&logits, &greedy, &mut rng), 1);
        assert!((p.drafted_prob(&logits, &greedy) - 0.75).abs() < 1e-6);
        assert!(p.confident(&logits, &greedy, 0.75));
        assert!(!p.confident(&logits, &greedy, 0.76));
        assert!(p.confident(&logits, &greedy, 0.0));
        let sampled = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let mut p = Proposal::with_q();
        let tok = p.push_drafted(&logits, &sampled, &mut rng) as usize;
        let q = p.q.as_ref().unwrap()[0][tok];
        assert!(q > 0.0);
        assert_eq!(p.drafted_prob(&logits, &sampled), q);
    }
}

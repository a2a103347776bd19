//! What a caller submits (`Request`), what a step returns (`Event`), and the engine's per-request
//! state (`ReqState`): committed tokens, KV block table, budget, counters, RNG, detokeniser.

use serde::Serialize;

use crate::kv::SeqKv;
use crate::sampling::{Rng, SamplingParams, StopMatcher};
use crate::spec::{BudgetState, Counters};
use crate::tokenizer::StreamDecoder;

/// The prompt of a request.
#[derive(Clone, Debug)]
pub enum Prompt {
    Tokens(Vec<u32>),
    /// UTF-8 text, encoded with the model's tokenizer (special tokens written as text are parsed).
    Text(String),
}

/// A generation request.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// Maximum committed reasoning tokens; None = unlimited.
    pub reasoning_budget: Option<usize>,
    /// Think-start marker override (default: the tokenizer's `<think>`).
    pub think_start: Option<Vec<u32>>,
    /// Think-end marker override (default: the tokenizer's `</think>`); may be several tokens.
    pub think_end: Option<Vec<u32>>,
    /// Allow speculation for this request (it rides in the same batch either way).
    pub speculate: bool,
    /// Return the target log-prob of each committed token.
    pub logprobs: bool,
    /// Workload label (at most `metrics::MAX_LABEL_BYTES` bytes, no control characters): every
    /// counter is also aggregated per label (`Engine::metrics_text`). None = "".
    pub label: Option<String>,
    /// Under an A/B drafter (`DraftSource::Ab`): the arm to serve this request (0 = A, 1 = B);
    /// None = chosen by the A/B ratio. Ignored by every other drafter.
    pub draft_arm: Option<u8>,
    /// Test hook for panic containment: make this request's steps panic. Not part of the API.
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

/// An injected fault: the request's step panics at `site` once it has generated `at_generated`
/// tokens, `times` times.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct Fault {
    pub at_generated: usize,
    pub times: u32,
    pub site: FaultSite,
}

/// Where an injected fault fires.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultSite {
    /// Inside verification, after the requests before it in the batch have committed.
    #[default]
    Verify,
    /// While being admitted — after its prefix-cache match and block reservation, while it sits
    /// in no queue (the unwinding drops it with its KV blocks).
    Admission,
    /// Inside the drafter's call for this step (as if the drafter panicked on this request).
    Draft,
}

impl Request {
    pub fn new(prompt: Prompt) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::default(),
            reasoning_budget: None,
            think_start: None,
            think_end: None,
            speculate: true,
            logprobs: false,
            label: None,
            draft_arm: None,
            fault: None,
        }
    }
}

/// Why a request finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence or stop token id was generated.
    Stop,
    /// A stop string matched.
    StopString,
    /// max_tokens reached.
    Length,
    /// Cancelled by the caller.
    Cancelled,
    /// The engine could not serve it (message says why).
    Error(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::StopString => "stop_string",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error(_) => "error",
        }
    }
}

/// What one step produced for one request.
#[derive(Clone, Debug, Default)]
pub struct Event {
    pub id: u64,
    /// Newly committed token ids.
    pub tokens: Vec<u32>,
    /// Log-probs of those tokens under the target (if requested). // [tokens.len()]
    pub logprobs: Vec<f32>,
    /// New text (empty when the model has no tokenizer).
    pub text: String,
    /// Set on the request's last event.
    pub finish: Option<FinishReason>,
}

/// Engine-internal state of a request.
pub(crate) struct ReqState {
    pub id: u64,
    pub params: SamplingParams,
    pub prompt_len: usize,
    /// Committed tokens: prompt + output. // [prompt_len + generated]
    pub tokens: Vec<u32>,
    /// Target KV of tokens[..kv.len()].
    pub kv: SeqKv,
    pub budget: BudgetState,
    pub counters: Counters,
    pub rng: Rng,
    pub detok: Option<StreamDecoder>,
    pub stop: StopMatcher,
    pub speculate: bool,
    pub want_logprobs: bool,
    /// Running acceptance estimate (per draft token) for the adaptive policy; starts at the
    /// generic prior (`policy::AcceptPrior::GENERIC`).
    pub alpha: f64,
    /// Verifications that updated `alpha` (until a few, the drafter's engine-wide estimate is
    /// used instead: a new request starts from what the drafter has shown, not a fixed prior).
    pub alpha_obs: u32,
    /// Context length at the request's last drafting round, or the prompt prefix reused at
    /// admission, which the drafter holds or skips (None: the current drafter has seen none of
    /// the context): the drafter's lag, which its next round catches up on (an MTP layer or
    /// draft model over the prompt or the plain steps' tokens); the adaptive policy times only
    /// rounds with small lags and prices starting from a long one (`engine::core`).
    pub drafted_at: Option<usize>,
    /// Prompt blocks already published to the prefix cache.
    pub prefix_registered: bool,
    /// Event being built this step.
    pub event: Event,
    pub finished: Option<FinishReason>,
    /// Step when first admitted (for preemption order: youngest first).
    pub admitted_seq: u64,
    /// In a batch whose step panicked: runs alone until it has completed a decode step
    /// (`engine::contain`).
    pub suspect: bool,
    pub fault: Option<Fault>,
    /// Workload label ("" when none).
    pub label: String,
    /// The A/B arm asked for (`Request::draft_arm`).
    pub draft_arm: Option<u8>,
    /// Counters already added to the metric buckets (`engine::metrics`).
    pub reported: Counters,
    /// When the first and the latest generated token were committed (time per output token).
    pub first_token_at: Option<std::time::Instant>,
    pub last_token_at: Option<std::time::Instant>,
    /// Generated tokens when last reported.
    pub reported_generated: usize,
}

impl ReqState {
    /// Positions the drafter has not seen since its last drafting round for this request.
    pub fn drafter_lag(&self) -> usize {
        self.tokens.len() - self.drafted_at.unwrap_or(0).min(self.tokens.len())
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
    /// Panics when an injected fault is due (test hook; see [`Fault`]).
    pub fn check_fault(&mut self) {
        self.check_fault_at(FaultSite::Verify)
    }
    /// The fault check of one site.
    pub fn check_fault_at(&mut self, site: FaultSite) {
        if let Some(f) = self.fault.as_mut() {
            if f.site == site
                && f.times > 0
                && self.tokens.len() - self.prompt_len >= f.at_generated
            {
                f.times -= 1;
                panic!("injected fault in request {}", self.id);
            }
        }
    }
    /// Tokens still to be fed to the target before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.kv.len()
    }
}

//! What the engine reports: a finished request's `Output`, the engine-wide `EngineStats`, and
//! the `CounterBook` that keeps per-request counters readable without the step lock (live
//! requests, and the most recent finished ones).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::kv::KvStats;
use crate::spec::Counters;

use super::DecodeSteps;

/// Final result of one request (for `generate`).
#[derive(Clone, Debug, Serialize)]
pub struct Output {
    pub id: u64,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub finish_reason: String,
    pub counters: Counters,
}

/// Engine-wide statistics.
#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    pub steps: u64,
    pub running: usize,
    pub waiting: usize,
    /// Counters summed over finished, running and waiting requests.
    pub totals: Counters,
    pub mean_acceptance_length: f64,
    pub time_target_forward_s: f64,
    pub time_draft_s: f64,
    /// Weight bytes the target's forwards needed (every dense matrix once per forward, the
    /// union of the experts its tokens selected, lm_head): the roofline's numerator.
    pub target_weight_bytes: u64,
    /// Weight bytes the drafter's forwards needed, counted the same way (a batched draft forward
    /// reads its dense weights once for all requests; 0 for n-gram and V4 MTP layers).
    pub draft_weight_bytes: u64,
    /// Decode-only steps (no prompt chunk): count, wall time, committed tokens, weight bytes.
    pub decode: DecodeSteps,
    #[serde(skip)]
    pub kv: KvStats,
    #[serde(skip)]
    pub draft_kv: Option<KvStats>,
    pub target_kv_bytes_per_token: usize,
    pub draft_kv_bytes_per_token: usize,
    pub draft_generation: u64,
    pub drafter: String,
    /// Panics inside a step that were contained (`engine::contain`); each failed at most the
    /// request that caused it.
    pub panics_contained: u64,
    /// KV block references given back after contained panics (requests the unwinding dropped
    /// with their block tables).
    pub kv_blocks_reclaimed: u64,
    /// Panics inside the drafter: each switched drafting off (plain decoding, outputs unchanged)
    /// instead of failing requests.
    pub drafter_panics: u64,
    /// Why drafting is off, until `set_draft_weights` installs a new drafter.
    pub drafter_disabled: Option<String>,
    /// Draft swaps refused so far (bad weights or directory, background or blocking load).
    pub swaps_failed: u64,
}

/// Counters readable without the step lock: live requests, and the most recent finished ones.
#[derive(Default)]
pub(super) struct CounterBook {
    pub(super) live: HashMap<u64, Counters>,
    pub(super) finished: HashMap<u64, Counters>,
    order: VecDeque<u64>,
}

impl CounterBook {
    /// Finished requests whose counters stay readable.
    const KEEP_FINISHED: usize = 65536;
    pub(super) fn finish(&mut self, id: u64, c: Counters) {
        self.finished.insert(id, c);
        self.order.push_back(id);
        while self.order.len() > Self::KEEP_FINISHED {
            if let Some(old) = self.order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }
}

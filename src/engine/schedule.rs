//! The schedule phase of an engine step (`Core::schedule`): which running requests take part and
//! with how many tokens — continuous batching in admission order, chunked prefill under the step's
//! token budget, admission from the waiting queue, preemption with recompute when the KV pool is
//! short — and how many draft positions each decoding request may use (the adaptive policy's
//! explorer and catch-up allowance, `super::drafts`). Sits between the engine's step entry
//! (`core.rs`) and the propose phase.
//!
//! Guarantees: target KV is reserved (plan-then-commit, `KvCache::plan_grow` / `commit_grow`)
//! for every token a `Planned` entry feeds, drafts included, before the step runs; a request that
//! cannot get KV for its own next token is preempted (its committed tokens kept, recomputed later
//! with the same attention paths, so its output is unchanged), never failed.

use crate::spec::policy::{
    explore_due, group_pays, ramp_cap, sharing_fixed_point, starts_from_far, CatchUpBudget, Start,
    ACCEPT_PRIOR_WEIGHT, SHARED_BY_GROUP,
};
use crate::spec::{SpecMode, StepKind};

use super::core::Core;
use super::drafts::{choose_drafts, DraftContext};
use super::request::{FaultSite, ReqState};

/// What the scheduler decided for one running request this step.
pub(super) struct Planned {
    /// Index into `running`.
    pub(super) idx: usize,
    /// Prefill / recompute: number of pending tokens fed this step (0 for decode).
    pub(super) chunk: usize,
    /// Decode: draft positions the model drafter should propose, and certain (forced) tokens after them.
    pub(super) k_model: usize,
    pub(super) certain: Vec<u32>,
    pub(super) decode: bool,
}

impl Core {
    /// Preempt running[idx]: free its KV (target and draft), keep its committed tokens, requeue at
    /// the front of the waiting queue; it is recomputed later with the same attention paths, so its
    /// output is unchanged.
    pub(super) fn preempt(&mut self, idx: usize) {
        let mut r = self.running.remove(idx);
        self.kv.free(&mut r.kv);
        if let Some(p) = self.proposer.as_mut() {
            p.release(r.id);
        }
        r.counters.preemptions += 1;
        r.prefix_registered = false;
        r.drafted_at = None;
        self.waiting.push_front(r);
    }

    pub(super) fn reserve(&mut self, idx: usize, new_len: usize) -> bool {
        let r = &mut self.running[idx];
        match self.kv.plan_grow(&r.kv, new_len) {
            Ok(plan) => {
                self.kv.commit_grow(&mut r.kv, plan);
                true
            }
            Err(_) => false,
        }
    }

    /// Reserve `need` tokens plus `extra` draft slots; falls back to no drafts.
    /// Some(true): all reserved; Some(false): without the drafts; None: not even `need`.
    pub(super) fn try_reserve(&mut self, idx: usize, need: usize, extra: usize) -> Option<bool> {
        if self.reserve(idx, need + extra) {
            Some(true)
        } else if extra > 0 && self.reserve(idx, need) {
            Some(false)
        } else {
            None
        }
    }

    /// Running requests that decode (one pending token) rather than prefill.
    pub(super) fn n_decode(&self) -> usize {
        self.running.iter().filter(|r| r.pending() == 1).count()
    }

    /// Whether the drafter runs a model (draft model, MTP layer): it is timed, and it catches up.
    pub(super) fn drafter_has_model(&self) -> bool {
        self.proposer.as_ref().is_some_and(|p| p.has_model())
    }

    /// Whether the adaptive policy has both cost fits (target step; draft step for a drafter
    /// with a model). Before that it explores with one request (see `schedule`).
    pub(super) fn policy_informed(&self) -> bool {
        self.target_cost.has_slope()
            && (self.draft_cost.fit().is_some() || !self.drafter_has_model())
    }

    /// Whether `r`'s drafter must first catch up on more than a steady round's lag — one
    /// verification's tokens (k + 1) and one plain step's — before it drafts (a drafter without
    /// a model never catches up).
    pub(super) fn catching_up(&self, r: &ReqState) -> bool {
        let k_max = match self.cfg.spec {
            SpecMode::Adaptive { k_max } | SpecMode::Fixed(k_max) => k_max,
        };
        self.drafter_has_model() && r.drafter_lag() > k_max + 2
    }

    /// Whether the drafter can draft for `r` at all ([`Proposer::can_draft`]).
    fn drafter_can_draft(&self, r: &ReqState) -> bool {
        self.proposer.as_ref().is_some_and(|p| p.can_draft(r.id))
    }

    /// The policy's explorer for this step: the first decode request that may draft and whose
    /// drafter is not catching up, else the one whose drafter lags least (its catch-up is the
    /// cheapest); None when no decode request may draft.
    fn explorer_index(&self) -> Option<usize> {
        let may = |r: &ReqState| r.pending() == 1 && r.speculate && self.drafter_can_draft(r);
        self.running
            .iter()
            .position(|r| may(r) && !self.catching_up(r))
            .or_else(|| {
                (0..self.running.len())
                    .filter(|&i| may(&self.running[i]))
                    .min_by_key(|&i| self.running[i].drafter_lag())
            })
    }

    /// Whether an exploration by `explorer` is worth its catch-up: none, or one predicted
    /// (priced per position) at most one predicted plain step of `n_decode` requests. Traced at
    /// the tail of a batch-16 run (2-4 requests left, every drafter ~100 positions behind): the
    /// MTP drafter's explorer caught up on a whole context to draft one token, 30-55 ms against
    /// a 13-18 ms plain step, twice in a run it did not otherwise draft in (1.3-2.4 % of it).
    fn exploration_affordable(&self, explorer: usize, n_decode: usize) -> bool {
        let r = &self.running[explorer];
        if !self.catching_up(r) {
            return true;
        }
        match (self.catch_up_s_per_row, self.target_cost.plain_at(n_decode)) {
            (Some(per_row), Some(plain)) => per_row * r.drafter_lag() as f64 <= plain,
            _ => true,
        }
    }

    /// The drafts of decode request `i` this step — (model drafts, certain forced tokens,
    /// positions the budget saved) — under the step's drafting state `st`, which it updates
    /// (the explorer used, the ramp's and the catch-up allowance's remainders).
    fn decide_drafts(&self, i: usize, st: &mut StepDrafts) -> (usize, Vec<u32>, usize) {
        let r = &self.running[i];
        let lag = r.drafter_lag();
        let catching_up = self.catching_up(r);
        let start = match self.catch_up_s_per_row {
            _ if !(st.adaptive && catching_up) => Start::Steady,
            None => Start::Blind,
            Some(per_row) => Start::Priced(lag as f64 * per_row),
        };
        let spec_on = self.proposer.is_some()
            && r.speculate
            && self.drafter_can_draft(r)
            && st.kind == StepKind::Free
            && st.explorers > 0
            && st.only.is_none_or(|j| j == i)
            && st.catch_ups.admits(start);
        if !spec_on {
            return (0, Vec::new(), 0);
        }
        let catch_up = match (self.catch_up_s_per_row, start) {
            (Some(per_row), Start::Priced(_)) => {
                let left = r.params.max_tokens.saturating_sub(r.generated());
                Some((lag, per_row, self.lengths.horizon(r.generated(), left)))
            }
            _ => None,
        };
        let ctx = DraftContext {
            spec: self.cfg.spec,
            target: &self.target_cost,
            draft: &self.draft_cost,
            // a start pays back over the steps after this one, so it is priced at the decode
            // batch those have: with the requests prefilling now (or admitted this step)
            // decoding too (`StepDrafts::n_ahead`)
            n_decode: if catching_up { st.n_ahead } else { st.n_decode },
            // a request that starts drafting after a long lag (a prompt, many plain steps) is
            // priced for its steady drafting to come, when it shares the forward with every
            // request that would then draft (`StepDrafts::sharing_far`; the catch-up is priced
            // apart); one a few positions behind is priced as a steady one. Traced on the
            // widened target (MTP, batch 16): a request two plain steps behind counted as
            // starting, so it drafted, alone, in every third step (+6 ms over a 31 ms plain
            // step for ~0.8 more tokens).
            sharing: if catching_up && starts_from_far(lag) {
                st.sharing_far
            } else {
                st.sharing
            },
            drafter_alpha: self.drafter_alpha,
            pos_alpha: &self.pos_alpha,
            pos_obs: &self.pos_obs,
            first_prior: self.first_prior,
            min_k: usize::from(st.explore && st.explorer == Some(i)),
        };
        let (k, certain, saved, saving) = choose_drafts(&ctx, r, catch_up);
        let d = (k, certain, saved);
        if st.explore && d.0 + d.1.len() > 0 {
            // one explorer per step; the step is an exploration only if the policy wanted no
            // drafts of its own
            st.explore = false;
            let own = DraftContext { min_k: 0, ..ctx };
            st.forced = choose_drafts(&own, r, catch_up).0 == 0;
        }
        if d.0 + d.1.len() > 0 {
            st.n_drafting += 1;
            st.saving += saving;
            st.positions = st.positions.max(d.0);
            if st.explorers != usize::MAX {
                st.explorers -= 1;
            }
            st.catch_ups.charge(start);
        }
        d
    }

    /// Whether the decode requests draft as a group this step: with the draft forward's fixed
    /// cost taken as paid, the requests that would then draft (nothing pacing the starts: no
    /// ramp, no explorer, no catch-up allowance) save together more than that cost
    /// ([`group_pays`]). A drafter with no model (n-gram) has no such cost and never groups;
    /// nor does a batch of one, whose forward is its own.
    fn drafts_as_group(&self, st: &StepDrafts) -> bool {
        let Some((fixed, _)) = self.draft_cost.fit() else {
            return false;
        };
        if st.n_decode < 2 || !self.drafter_has_model() {
            return false;
        }
        let mut dry = st.unpaced(SHARED_BY_GROUP);
        self.dry_run(&mut dry);
        group_pays(dry.saving, fixed, dry.positions)
    }

    /// How many decode requests would draft under the drafting state `dry` (decided in
    /// admission order, as the step itself does).
    fn dry_run(&self, dry: &mut StepDrafts) -> usize {
        for i in 0..self.running.len() {
            if self.running[i].pending() == 1 {
                self.decide_drafts(i, dry);
            }
        }
        dry.n_drafting
    }

    /// Plan the step: which requests run and with how many tokens, reserving target KV.
    /// `kind` Plain: nobody drafts this step (the adaptive guard's decision).
    pub(super) fn schedule(&mut self, kind: StepKind) -> Vec<Planned> {
        self.running.sort_by_key(|r| r.admitted_seq);
        let mut budget = self.cfg.max_batch_tokens.max(1);
        let mut plan: Vec<Planned> = Vec::new();
        let n_decode = self.n_decode().max(1);
        // After a contained panic: one suspect at a time, alone (`engine::contain`).
        let isolating = self.isolating();
        // An uninformed adaptive policy explores with one request only: exploring is k_max
        // drafts, and a drafter's first round for a request catches up on its whole context
        // (an MTP layer or draft model over the prompt), which at batch 16 cost ~9 plain steps
        // when every request explored at once.
        // Likewise, while the catch-up cost per position is unmeasured, one request per step
        // may start drafting from a long lag; after that the policy only starts one whose
        // catch-up its predicted saving pays back over the tokens it is still expected to
        // generate (`policy::catch_up_pays`, `policy::Lengths`), and a step starts catch-ups
        // worth at most one plain step (at least one request): the first informed step at
        // batch 16 let four requests start MTP drafting at once (123 ms against a 33 ms plain
        // step) on a saving the next steps did not confirm.
        let adaptive = matches!(self.cfg.spec, SpecMode::Adaptive { .. });
        // Informed means the target's cost has been seen at two token counts: after a first
        // exploring step it has one (a verification), and the fit then calls extra tokens
        // free, so the next step drafts nothing and gives the second (a plain step) — at batch
        // 16 on the widened MoE target a verified token costs as much as a decoded one, which
        // the optimistic one-point fit hid until two or three requests had drafted.
        // Informed, it still lets only 1 + (verifications of this drafter so far) requests
        // draft in a step until the drafter has `policy::RAMP_OBS` verifications: its
        // acceptance estimate starts at the 0.7 prior, so on the prior alone a batch of 13
        // drafted at once (the widened target's n-gram drafter, 20 % accepted: a 25 ms step for
        // 14 tokens where a plain one takes 17 ms for 13); ramped 1, 2, 4, 8, the same evidence
        // costs a few tokens, and a drafter that pays reaches the whole batch within four steps.
        // A step that also prefills (a request arriving, or a prompt chunk) is not timed for
        // the cost model, so uninformed exploring there only teaches acceptance: it stops once
        // the drafter's acceptance has as many verifications as the guess's weight, and does
        // not start for a drafter whose acceptance was recorded with its weights. Traced at
        // batch 16 with a request arriving every step: the MTP drafter explored in every other
        // arrival step (an MTP forward, ~3 ms, for ~0.6 accepted tokens each), +49 ms over the
        // 16 arrival steps, 2 % of the run.
        let prefills = self.running.iter().any(|r| r.pending() > 1)
            || (!self.waiting.is_empty() && self.running.len() < self.cfg.max_running);
        let explorers = if adaptive && !self.policy_informed() {
            // (known from the start when recorded with the drafter's weights,
            // `Core::first_prior`: traced on the widened target, MTP at batch 16, per step
            // against plain in the same interleaved run, those explorations — an MTP catch-up
            // over a whole prompt, ~16-21 ms, then 3-8 ms each — and the prefix recompute they
            // caused at the 14th arrival (before the MTP layer could skip a prefix it did not
            // hold) cost 21-45 ms per run in the arrival steps, -22-7 ms without them)
            let learned = prefills
                && (self.drafter_obs as f64 >= ACCEPT_PRIOR_WEIGHT
                    || self.first_prior.is_recorded());
            if learned || (self.drafted_last_step && !self.target_cost.has_slope()) {
                0
            } else {
                1
            }
        } else if adaptive {
            ramp_cap(self.drafter_obs)
        } else {
            usize::MAX
        };
        // Informed and free to draft, the policy may still have priced drafting out on a few
        // early measurements (on the widened target at batch 1 the MTP layer's first two
        // 2-token steps ran at 1.4x a plain step, then 1.2x later, but nothing drafted again to
        // show it): after `explore_period` x (decode requests) decode steps without drafts one
        // request drafts one token, which re-measures both the cost and the acceptance. The
        // period grows with the batch: an exploration costs about the same at any batch (its
        // token is verified, and its drafter catches up when no caught-up request can explore),
        // while what a wrongly idle drafter loses shrinks with it (on the widened target
        // drafting paid 1.2-1.7x at batch 1, at most 1.05-1.15x at batch 16, where exploring
        // every 16 steps cost the MTP drafter ~2 %).
        let mut explore = adaptive
            && kind == StepKind::Free
            && self.policy_informed()
            && explore_due(self.idle_draft_steps, self.explore_period, n_decode);
        // The explorer is a request whose drafter has caught up where there is one: it measures
        // the same acceptance and price without paying a catch-up (the MTP layer over a whole
        // context: 11-17 ms at 150-250 positions on the widened target, one to two plain steps
        // at batch 4). Else the one with the cheapest catch-up, and only if that costs at most
        // a plain step (`exploration_affordable`; the idle count goes on, so a request that
        // arrives later, or a larger batch, explores).
        let explorer = explore.then(|| self.explorer_index()).flatten();
        if explore && !explorer.is_some_and(|e| self.exploration_affordable(e, n_decode)) {
            explore = false;
        }
        let n_ahead = (self.running.len() + self.waiting.len())
            .min(self.cfg.max_running)
            .max(n_decode);
        // The uninformed policy's one exploring request is the one whose drafter catches up
        // least (`explorer_index`, as the periodic explorer's): it teaches the same costs and
        // acceptance. Traced at lockstep batch 16 on the widened target, the first request in
        // admission order caught the MTP layer up on its 47-token prompt (+28 ms over the
        // step, once per engine) where another request's prompt had 22 tokens.
        let only = (adaptive && !self.policy_informed() && explorers == 1)
            .then(|| self.explorer_index())
            .flatten();
        let mut st = StepDrafts {
            adaptive,
            kind,
            n_decode,
            n_ahead,
            only,
            sharing: n_decode,
            sharing_far: n_decode,
            explorers,
            explore,
            explorer,
            catch_ups: CatchUpBudget::new(self.target_cost.plain_at(n_decode).unwrap_or(0.0)),
            forced: false,
            n_drafting: 0,
            saving: 0.0,
            positions: 0,
        };
        // Each draft forward's fixed cost is shared by the requests that draft in it, so it is
        // priced over as many as will draft: decided over every decode request first, then
        // again over the number that chose to draft, until that number holds (it only falls,
        // so this ends; `policy::choose_k_rates`).
        // A starter (`policy::starts_from_far`) is priced for the steady drafting to come: over
        // the requests that would draft once nothing limits who may start — no ramp, no
        // explorer, no catch-up allowance, which only pace the starts — found the same way.
        // Priced over the whole batch instead, a lone starter among 15 idle requests (MTP,
        // batch 16, on the widened target: its MTP layer falls a position behind per plain
        // step and counts as starting at 16 behind) drafted alone every 16 steps, +7-9 ms over
        // a plain step each time, on a saving only a shared forward would have given.
        // First, though, the group: where the requests that would draft with the forward's
        // fixed cost already paid save more than it costs (`drafts_as_group`), each is priced
        // with the forward shared by all (`SHARED_BY_GROUP`) — its own drafts' verification and
        // per-token draft cost against its own saving. Priced by equal shares instead, the MTP
        // layer at batch 4 on the widened target never drafted as a group: a request whose own
        // acceptance read 0.38 refused at a quarter of the 2.6 ms forward, the count fell to
        // two, at which drafting barely paid, then to none — where four requests drafting
        // together save ~7 ms per step against that forward (traced; adaptive ~1.0x of plain
        // where fixed k = 1 ran 1.08x, with the group 1.07-1.09x).
        if adaptive && kind == StepKind::Free && self.proposer.is_some() {
            if self.drafts_as_group(&st) {
                st.sharing = SHARED_BY_GROUP;
                st.sharing_far = SHARED_BY_GROUP;
            } else {
                st.sharing_far =
                    sharing_fixed_point(n_decode, |sharing| self.dry_run(&mut st.unpaced(sharing)));
                st.sharing = sharing_fixed_point(n_decode, |sharing| {
                    self.dry_run(&mut StepDrafts {
                        sharing,
                        ..st.clone()
                    })
                });
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if budget == 0 || (isolating && !plan.is_empty()) {
                break;
            }
            if isolating && !self.running[i].suspect {
                i += 1;
                continue;
            }
            let pending = self.running[i].pending();
            let (chunk, decode, k_model, certain, saved) = if pending == 1 {
                let (k, c, s) = self.decide_drafts(i, &mut st);
                (1, true, k, c, s)
            } else {
                (pending.min(budget), false, 0, Vec::new(), 0)
            };
            let extra = k_model + certain.len();
            let base = self.running[i].kv.len();
            let mut got = self.try_reserve(i, base + chunk, extra);
            while got.is_none() && self.running.len() > i + 1 {
                // preempt the youngest request not planned yet
                let last = self.running.len() - 1;
                self.preempt(last);
                got = self.try_reserve(i, base + chunk, extra);
            }
            let Some(full) = got else {
                // Cannot run even with everything younger preempted: requeue it too.
                self.preempt(i);
                continue;
            };
            let (k_model, certain) = if full {
                (k_model, certain)
            } else {
                (0, Vec::new())
            };
            if full {
                self.running[i].counters.draft_tokens_saved += saved as u64;
            }
            budget = budget.saturating_sub(chunk + k_model + certain.len());
            plan.push(Planned {
                idx: i,
                chunk,
                k_model,
                certain,
                decode,
            });
            i += 1;
        }
        self.exploring = st.forced && st.n_drafting == 1;
        // Admit waiting requests while there is budget and room.
        while budget > 0 && self.running.len() < self.cfg.max_running {
            let next = if isolating {
                if !plan.is_empty() {
                    break;
                }
                self.waiting
                    .iter()
                    .position(|r| r.suspect)
                    .and_then(|pos| self.waiting.remove(pos))
            } else {
                self.waiting.pop_front()
            };
            let Some(mut r) = next else {
                break;
            };
            if r.kv.is_empty() && self.cfg.prefix_cache && r.tokens.len() > 1 {
                let prompt = &r.tokens[..r.prompt_len];
                let mut max = prompt.len().min(r.tokens.len() - 1);
                // A reused prefix has no target hidden states: a drafter that needs them (MTP)
                // restores its own state of the prefix and skips what it lacks of it.
                if let Some(p) = self.proposer.as_mut() {
                    p.admit(r.id, r.draft_arm);
                    max = p.match_prefix(r.id, prompt, max);
                }
                r.kv = self.kv.match_prefix(prompt, max);
                if let Some(p) = self.proposer.as_mut() {
                    // What the drafter holds (a draft model's restored prefix) or skips (the
                    // MTP layer): its catch-up starts after it.
                    let seen = p.settle_prefix(r.id, r.kv.len());
                    if seen > 0 {
                        r.drafted_at = Some(seen);
                    }
                }
                if r.counters.preemptions == 0 {
                    r.counters.cached_prompt_tokens = r.kv.len() as u64;
                }
            }
            let chunk = r.pending().min(budget);
            let base = r.kv.len();
            match self.kv.plan_grow(&r.kv, base + chunk) {
                Ok(p) => {
                    self.kv.commit_grow(&mut r.kv, p);
                }
                Err(_) => {
                    self.kv.free(&mut r.kv);
                    if let Some(p) = self.proposer.as_mut() {
                        p.release(r.id); // what it restored at the match above
                    }
                    self.waiting.push_front(r);
                    break;
                }
            }
            r.check_fault_at(FaultSite::Admission);
            self.admitted += 1;
            if r.admitted_seq == u64::MAX {
                r.admitted_seq = self.admitted;
            }
            budget -= chunk;
            self.running.push(r);
            let idx = self.running.len() - 1;
            let decode = self.running[idx].pending() == 1;
            plan.push(Planned {
                idx,
                chunk: if decode { 1 } else { chunk },
                k_model: 0,
                certain: Vec::new(),
                decode,
            });
        }
        plan
    }
}

/// One step's drafting state while [`Core::schedule`] decides each decode request's drafts.
#[derive(Clone)]
struct StepDrafts {
    adaptive: bool,
    kind: StepKind,
    n_decode: usize,
    /// The decode batch of the steps ahead: the decode requests, those prefilling and those
    /// waiting to be admitted (up to `max_running`). A request that starts drafting from a lag
    /// is priced at it: traced on the widened target (MTP, batch 4, requests arriving one a
    /// step), priced at the 3 decode requests of a step that admitted the fourth, a request
    /// caught up on 58 positions (+38 ms over the step) and drafted one token, and the next
    /// step, at batch 4, priced drafting out.
    n_ahead: usize,
    /// Requests over which a draft forward's fixed cost is priced.
    sharing: usize,
    /// The same for a request that starts drafting from far behind: the requests that would
    /// draft with no limit on starts.
    sharing_far: usize,
    /// Requests that may still draft this step (the informed policy's ramp; the uninformed
    /// one's single explorer).
    explorers: usize,
    /// The uninformed policy's exploring request, the only one that may draft (None: any).
    only: Option<usize>,
    /// Whether the periodic explorer is still to draft, and which request it is.
    explore: bool,
    explorer: Option<usize>,
    catch_ups: CatchUpBudget,
    /// Whether the explorer drafted where the policy would not have.
    forced: bool,
    n_drafting: usize,
    /// Predicted seconds the drafting requests save this step (`drafts::choose_drafts`), and
    /// the most draft positions any of them takes (draft forwards run).
    saving: f64,
    positions: usize,
}

impl StepDrafts {
    /// This state with nothing pacing the starts (no ramp cap, no explorer, no catch-up
    /// allowance) and the draft forward priced as shared by `sharing`: the steady drafting a
    /// start is for (starters' pricing, and the group test at [`SHARED_BY_GROUP`]).
    fn unpaced(&self, sharing: usize) -> StepDrafts {
        StepDrafts {
            sharing,
            sharing_far: sharing,
            explorers: usize::MAX,
            only: None,
            explore: false,
            catch_ups: CatchUpBudget::unlimited(),
            ..self.clone()
        }
    }
}

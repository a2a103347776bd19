//! One engine step: schedule (continuous batching, chunked prefill under a token budget,
//! preemption with recompute) -> propose drafts -> ONE batched target forward over every
//! request's new tokens -> verify and commit token by token (budget forcing, stops) -> truncate
//! target and draft KV to the committed length -> events.
//!
//! Invariants kept after every step, for every running request: target KV length = committed
//! tokens - 1 (the last committed token is fed next step) once its prompt is prefilled; the draft
//! proposer's KV is a prefix of the committed tokens; a request's tokens only change by commits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{ForwardOut, LogitsMode, Model, SeqChunk};
use crate::spec::policy::{
    catch_up_row_price, learn_acceptance, next_explore_period, pos_prior_weight, AcceptPrior,
    Lengths, LinearCost, TargetCost, EXPLORE_EVERY,
};
use crate::spec::{
    Counters, Proposal, ProposeRequest, Proposer, SpecGuard, SpecMode, StepKind, Verdict,
};
use crate::tokenizer::Tokenizer;

use super::commit::{commit, fail_non_finite, finite};
use super::request::{Event, FaultSite, FinishReason, ReqState};
use super::schedule::Planned;
use super::EngineConfig;

pub(crate) struct Core {
    /// The target's CUDA backend (`EngineConfig::device`); None: the CPU kernels.
    pub cuda: Option<Arc<crate::cuda::CudaBackend>>,
    pub model: Arc<Model>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub kv: KvCache,
    pub cfg: EngineConfig,
    pub waiting: VecDeque<ReqState>,
    pub running: Vec<ReqState>,
    pub proposer: Option<Box<dyn Proposer>>,
    pub draft_generation: u64,
    pub target_cost: TargetCost,
    pub draft_cost: LinearCost,
    /// Measured drafter catch-up seconds per position (rounds in which requests started
    /// drafting after a lag): what starting a request costs the adaptive policy.
    pub catch_up_s_per_row: Option<f64>,
    /// Whether the last step had drafts (the uninformed policy's explorer, see `schedule`).
    pub drafted_last_step: bool,
    /// The informed policy's re-exploration (`schedule`): decode-only steps in a row in which
    /// nobody drafted, and how many such steps end in one exploring request.
    pub idle_draft_steps: u64,
    pub explore_period: u64,
    /// Whether this step's drafts are only the explorer's.
    pub exploring: bool,
    /// This step's drafter catch-up, priced when the step ends: (positions caught up on,
    /// drafter seconds).
    pub catch_up_round: Option<(usize, f64)>,
    /// Generated lengths of recently finished requests: the horizon a catch-up must pay back in.
    pub lengths: Lengths,
    pub eos: Vec<u32>,
    pub steps: u64,
    pub time_target_s: f64,
    pub time_draft_s: f64,
    /// Weight bytes the target forwards needed (dense weights + union of selected experts).
    pub target_weight_bytes: u64,
    /// Weight bytes the drafter's forwards needed, counted the same way (0 for n-gram).
    pub draft_weight_bytes: u64,
    /// The decode-only steps (no prompt chunk in the step): their count, wall time, committed
    /// tokens and weight bytes — what speculation changes, without the prefill it does not.
    pub decode: DecodeSteps,
    /// Engine-wide acceptance estimate of the current drafter (adaptive policy prior).
    pub drafter_alpha: f64,
    /// The prior of `drafter_alpha` and of the first position's `pos_alpha`: the drafter's
    /// recorded acceptance if it has one (`Proposer::recorded_acceptance`), else the guess;
    /// later positions start from the guess.
    pub first_prior: AcceptPrior,
    /// Verifications of the current drafter's drafts (any request) since it was installed:
    /// how much of `drafter_alpha` is evidence rather than prior (`schedule`'s ramp).
    pub drafter_obs: u64,
    /// Engine-wide conditional acceptance of the current drafter per draft position (position
    /// j + 1 accepted given j were): what the adaptive policy's E(k) multiplies.
    pub pos_alpha: Vec<f64>,
    /// Observations behind each `pos_alpha` (`policy::learn_acceptance`; `drafter_alpha`'s are
    /// `drafter_obs`).
    pub pos_obs: Vec<u64>,
    /// Adaptive mode: measured drafting vs plain rates; drafting off while it loses.
    pub guard: SpecGuard,
    pub admitted: u64,
    /// Counters of requests that finished (summed).
    pub finished_totals: Counters,
    /// Counters per workload label and draft generation, latency histograms.
    pub metrics: super::metrics::Metrics,
    /// A guarded swap awaiting its verdict (`swap::Swaps::check_guard`).
    pub guarded: Option<super::swap::Guarded>,
    /// Final counters of requests retired since the engine last published them.
    pub retired: Vec<(u64, Counters)>,
    /// Requests present (running or waiting) when the current step began, and those it planned:
    /// what `contain_panic` needs to account for every request after a panic.
    pub present_ids: Vec<u64>,
    pub step_ids: Vec<u64>,
    /// Panics contained so far (`engine::contain`).
    pub panics_contained: u64,
    /// KV block references given back after contained panics (requests dropped mid-step).
    pub kv_blocks_reclaimed: u64,
    /// Panics inside the drafter (each switched drafting off instead of failing requests).
    pub drafter_panics: u64,
    /// Why drafting was switched off, until a new drafter is installed.
    pub drafter_disabled: Option<String>,
}

impl Core {
    /// A drafter was installed or restored: a new draft generation with no evidence yet
    /// (acceptance priors, draft cost fit and guard start afresh; drafting is on again).
    pub(crate) fn new_drafter_generation(&mut self) {
        self.draft_generation += 1;
        self.drafter_disabled = None;
        self.reset_acceptance();
        self.idle_draft_steps = 0;
        self.explore_period = EXPLORE_EVERY;
        self.draft_cost = Default::default();
        self.catch_up_s_per_row = None;
        self.guard = Default::default();
        // The new drafter has seen none of the running requests: a draft model's first round
        // catches up on their whole context; the MTP layer skips it and starts at the target's
        // next hidden states, so it owes nothing of it.
        let replays = self
            .proposer
            .as_ref()
            .is_none_or(|p| p.replays_unseen_context());
        for r in self.running.iter_mut() {
            r.drafted_at = if replays { None } else { Some(r.tokens.len()) };
        }
    }

    /// Acceptance estimates back to the current drafter's priors, with no observations.
    pub(crate) fn reset_acceptance(&mut self) {
        let recorded = self.proposer.as_ref().and_then(|p| p.recorded_acceptance());
        self.first_prior = recorded.map_or(AcceptPrior::GENERIC, AcceptPrior::recorded);
        self.drafter_alpha = self.first_prior.alpha;
        self.drafter_obs = 0;
        self.pos_alpha.fill(AcceptPrior::GENERIC.alpha);
        if let Some(a) = self.pos_alpha.first_mut() {
            *a = self.first_prior.alpha;
        }
        self.pos_obs.fill(0);
    }

    /// Run one step; returns the events of every request that committed tokens or finished.
    /// Phases: (adaptive: the guard's step kind) -> schedule -> propose -> forward -> (hidden
    /// states to the proposer) -> verify and commit -> roll back -> (adaptive: the guard measures).
    pub fn step(&mut self) -> Result<Vec<Event>> {
        self.steps += 1;
        let t_step = Instant::now();
        self.catch_up_round = None;
        let adaptive =
            matches!(self.cfg.spec, SpecMode::Adaptive { .. }) && self.proposer.is_some();
        let kind = if adaptive {
            // the guard judges each batch size on its own rates
            self.guard.next_step(self.n_decode())
        } else {
            StepKind::Free
        };
        // Until both cost models have a fit the policy explores; the guard judges its informed
        // choices only.
        let informed = self.policy_informed();
        self.present_ids.clear();
        let ids = self.running.iter().chain(self.waiting.iter()).map(|r| r.id);
        self.present_ids.extend(ids);
        self.step_ids.clear();
        let plan = self.schedule(kind);
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        let ids = plan.iter().map(|p| self.running[p.idx].id);
        self.step_ids.extend(ids);
        // Steady drafting: no request asking for drafts has its drafter catching up, so the
        // round costs what drafting costs (`spec::guard`).
        let steady = !plan
            .iter()
            .filter(|p| p.decode && p.k_model > 0)
            .any(|p| self.catching_up(&self.running[p.idx]));
        let draft_bytes0 = self.draft_weight_bytes;
        let mut proposals = self.propose(&plan, steady)?;
        for (p, prop) in plan.iter().zip(&proposals) {
            let r = &mut self.running[p.idx];
            if p.decode && !prop.tokens.is_empty() {
                r.drafted_at = Some(r.tokens.len());
            }
        }
        self.drafted_last_step = proposals.iter().any(|p| !p.tokens.is_empty());
        let inputs = self.forward_inputs(&plan, &mut proposals);
        let out = self.forward(&plan, &inputs)?;
        self.hand_hidden(&plan, &inputs, &out.hidden);
        let (verified, committed) = self.verify_and_commit(&plan, &proposals, &inputs, &out.logits);
        self.roll_back(&plan, &verified);
        let decode_only = plan.iter().all(|p| p.decode);
        for p in plan.iter().filter(|p| p.decode) {
            self.running[p.idx].suspect = false;
        }
        self.metrics
            .step_latency
            .observe(t_step.elapsed().as_secs_f64());
        if decode_only {
            let drafted = proposals.iter().any(|p| !p.tokens.is_empty());
            let secs = t_step.elapsed().as_secs_f64();
            self.decode.steps += 1;
            self.decode.seconds += secs;
            self.decode.committed_tokens += committed as u64;
            self.decode.weight_bytes += out.weight_bytes;
            self.decode.draft_weight_bytes += self.draft_weight_bytes - draft_bytes0;
            let tokens: usize = inputs.iter().map(Vec::len).sum();
            let by = &mut self.decode.steps_by_tokens;
            if by.len() <= tokens {
                by.resize(tokens + 1, 0);
            }
            by[tokens] += 1;
            if adaptive {
                self.guard
                    .observe(drafted, steady && informed, committed, secs);
                if !drafted {
                    self.idle_draft_steps += 1;
                } else {
                    self.idle_draft_steps = 0;
                    self.explore_period = next_explore_period(self.explore_period, self.exploring);
                }
            }
        }
        if let Some((rows, draft_secs)) = self.catch_up_round.take() {
            // What starting cost beyond a plain step of this batch: the drafter's catch-up, its
            // drafts and their verification (a decode-only step; else the drafter's time only).
            // The drafter's time alone leaves out the verification of the drafts, which at batch
            // 16 on the widened MoE target costs about what a decoded token does.
            let secs = t_step.elapsed().as_secs_f64();
            let plain = match self.target_cost.plain_at(plan.len()) {
                Some(p) if decode_only => p,
                _ => secs,
            };
            if let Some(x) = catch_up_row_price(rows, secs - plain, draft_secs) {
                self.catch_up_s_per_row = Some(match self.catch_up_s_per_row {
                    Some(v) => 0.7 * v + 0.3 * x,
                    None => x,
                });
            }
        }
        let events = self.collect_events();
        let gen = self.draft_generation;
        let pr = self.proposer.as_deref();
        for r in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            account(&mut self.metrics, gen, arm_name(pr, r), r);
        }
        Ok(events)
    }

    /// Propose: the drafter drafts for every decode request that asked for drafts (one call for
    /// all of them); timing feeds the adaptive policy's draft cost when the round is `steady`
    /// (no request catches up on a prompt or on plain steps: that is a cost of not drafting).
    fn propose(&mut self, plan: &[Planned], steady: bool) -> Result<Vec<Proposal>> {
        let mut proposals: Vec<Proposal> = plan.iter().map(|_| Proposal::default()).collect();
        let asks: Vec<usize> = (0..plan.len())
            .filter(|&j| plan[j].decode && plan[j].k_model > 0)
            .collect();
        if asks.is_empty() {
            return Ok(proposals);
        }
        // Test hook: an injected drafter fault (as if the drafter panicked on this request).
        let running = &mut self.running;
        let injected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for &j in &asks {
                running[plan[j].idx].check_fault_at(FaultSite::Draft);
            }
        }));
        if let Err(payload) = injected {
            self.disable_drafter(&super::contain::panic_message(&*payload));
            return Ok(proposals);
        }
        let t0 = Instant::now();
        let reqs: Vec<ProposeRequest> = asks
            .iter()
            .map(|&j| {
                let r = &self.running[plan[j].idx];
                ProposeRequest {
                    id: r.id,
                    context: &r.tokens,
                    prompt_len: r.prompt_len,
                    k: plan[j].k_model,
                    params: &r.params,
                    arm: r.draft_arm,
                    // certain forced tokens line up only behind every asked draft: no cut then
                    p_min: if plan[j].certain.is_empty() {
                        self.cfg.draft_p_min
                    } else {
                        0.0
                    },
                }
            })
            .collect();
        let proposer = self.proposer.as_mut().expect("proposer");
        let bytes0 = proposer.weight_bytes();
        // A panic inside the drafter must not fail the requests: drafting is switched off
        // (plain decoding, the same greedy output) and the step goes on without drafts.
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| proposer.propose(&reqs)));
        drop(reqs);
        let props = match caught {
            Ok(p) => p?,
            Err(payload) => {
                self.disable_drafter(&super::contain::panic_message(&*payload));
                return Ok(proposals);
            }
        };
        let proposer = self.proposer.as_mut().expect("proposer");
        self.draft_weight_bytes += proposer.weight_bytes().saturating_sub(bytes0);
        let secs = t0.elapsed().as_secs_f64();
        if proposer.has_model() {
            self.time_draft_s += secs;
            // draft forwards run: as many as the longest proposal (the confidence cut may end
            // every request's drafting before k)
            let kmax = props
                .iter()
                .map(|p| p.tokens.len())
                .max()
                .unwrap_or(1)
                .max(1);
            let toks: usize = props.iter().map(|p| p.tokens.len()).sum();
            if !steady {
                // a round with catch-up: priced per position caught up on once the step ends
                // (`step`), for the next requests that start drafting
                let rows: usize = asks
                    .iter()
                    .map(|&j| self.running[plan[j].idx].drafter_lag())
                    .sum();
                if rows > 0 {
                    self.catch_up_round = Some((rows, secs));
                }
            }
            if toks > 0 && steady {
                // a round that only caught up (bounded catch-up) says nothing of drafting cost
                self.draft_cost.observe(toks / kmax, secs / kmax as f64);
            }
        }
        for (j, p) in asks.iter().zip(props) {
            proposals[*j] = p;
        }
        Ok(proposals)
    }

    /// Each planned request's tokens for the target forward: a prefill chunk, or
    /// `[last committed, drafts.., certain forced tokens..]` for a decode request (draft
    /// counters are bumped here).
    fn forward_inputs(&mut self, plan: &[Planned], proposals: &mut [Proposal]) -> Vec<Vec<u32>> {
        let mut inputs: Vec<Vec<u32>> = Vec::with_capacity(plan.len());
        for (j, p) in plan.iter().enumerate() {
            let r = &mut self.running[p.idx];
            let base = r.kv.len();
            if !p.decode {
                inputs.push(r.tokens[base..base + p.chunk].to_vec());
                continue;
            }
            let prop = &mut proposals[j];
            // certain tokens only line up when the drafter returned every position
            if prop.tokens.len() == p.k_model && !p.certain.is_empty() {
                prop.tokens.extend_from_slice(&p.certain);
            }
            let n_model = p.k_model.min(prop.tokens.len());
            r.counters.drafted_tokens += n_model as u64;
            for pos in 0..n_model {
                Counters::bump_position(&mut r.counters.drafted_per_position, pos);
            }
            if !prop.tokens.is_empty() {
                r.counters.draft_steps += 1;
            }
            let mut inp = vec![r.tokens[base]];
            inp.extend_from_slice(&prop.tokens);
            inputs.push(inp);
        }
        inputs
    }

    /// Forward: ONE target forward over every planned request's inputs (hidden states too when
    /// the proposer wants them); its time and weight bytes are recorded.
    fn forward(&mut self, plan: &[Planned], inputs: &[Vec<u32>]) -> Result<ForwardOut> {
        let want_hidden = self.proposer.as_ref().is_some_and(|p| p.wants_hidden());
        let t0 = Instant::now();
        let out = {
            let chunks: Vec<SeqChunk> = plan
                .iter()
                .zip(inputs)
                .map(|(p, inp)| {
                    let r = &self.running[p.idx];
                    let last = r.kv.len() + inp.len() == r.tokens.len() || p.decode;
                    SeqChunk {
                        kv: &r.kv,
                        start: r.kv.len(),
                        tokens: inp,
                        mha_until: r.prompt_len,
                        logits: if p.decode {
                            LogitsMode::All
                        } else if last {
                            LogitsMode::Last
                        } else {
                            LogitsMode::None
                        },
                    }
                })
                .collect();
            match &self.cuda {
                Some(b) => self
                    .model
                    .forward_on(b.as_ref(), &mut self.kv, &chunks, want_hidden)?,
                None => self.model.forward_out(&mut self.kv, &chunks, want_hidden)?,
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        self.time_target_s += secs;
        self.target_weight_bytes += out.weight_bytes;
        // The policy's cost model is fitted on decode / verification steps only: a prefill
        // chunk's per-token cost says nothing about what a few more verified tokens cost.
        if plan.iter().all(|p| p.decode) {
            self.target_cost
                .observe(plan.len(), inputs.iter().map(Vec::len).sum(), secs);
        }
        Ok(out)
    }

    /// Hand each request's rows of the target's hidden states to the proposer (MTP).
    fn hand_hidden(&mut self, plan: &[Planned], inputs: &[Vec<u32>], hidden: &[f32]) {
        let Some(pr) = self.proposer.as_mut() else {
            return;
        };
        if hidden.is_empty() {
            return;
        }
        let h = self.model.hidden_state_width();
        let running = &self.running;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut row0 = 0;
            for (p, inp) in plan.iter().zip(inputs) {
                let r = &running[p.idx];
                let n = inp.len();
                pr.on_target_hidden(r.id, r.kv.len(), inp, &hidden[row0 * h..(row0 + n) * h]);
                row0 += n;
            }
        }));
        if let Err(payload) = caught {
            self.disable_drafter(&super::contain::panic_message(&*payload));
        }
    }

    /// The drafter panicked: drop it (its KV pool with it) and decode without drafts from now
    /// on — outputs are unchanged (greedy bitwise, sampled in distribution); a later
    /// `set_draft_weights` installs a new drafter as usual.
    fn disable_drafter(&mut self, msg: &str) {
        self.proposer = None;
        self.draft_generation += 1;
        self.drafter_panics += 1;
        self.drafter_disabled = Some(msg.to_string());
    }

    /// Verify and commit, per planned request and position: forced budget token, else greedy
    /// match / rejection sampling; every committed token updates budget, log-prob, text, stops.
    /// Returns per planned request (accepted drafts, drafts) (None for a prefill chunk), and the
    /// tokens the decode requests committed — accepted drafts plus the verified token, except
    /// where a request finished (end of sequence, stop, token cap) on an accepted draft: the
    /// drafts after it, and the token that would have followed, are not committed.
    fn verify_and_commit(
        &mut self,
        plan: &[Planned],
        proposals: &[Proposal],
        inputs: &[Vec<u32>],
        logits: &[f32],
    ) -> (Vec<Option<(usize, usize)>>, usize) {
        let vocab = self.model.config.vocab_size;
        let mut row0 = 0;
        let mut verified = Vec::with_capacity(plan.len());
        let mut committed = 0usize;
        for (j, p) in plan.iter().enumerate() {
            let r = &mut self.running[p.idx];
            r.check_fault();
            let base = r.kv.len();
            let inp = &inputs[j];
            if !p.decode {
                let done = base + inp.len() == r.tokens.len();
                self.kv.set_len(&mut r.kv, base + inp.len());
                publish_prefix(&mut self.kv, r, self.cfg.prefix_cache);
                if done {
                    let row = &logits[row0 * vocab..(row0 + 1) * vocab];
                    row0 += 1;
                    if !finite(row) {
                        fail_non_finite(r);
                        verified.push(None);
                        continue;
                    }
                    let forced = r.budget.forced_next();
                    let (tok, _) = match forced {
                        Some(f) => (f, Verdict::Bonus),
                        None => crate::spec::verify_position(row, None, &r.params, &mut r.rng),
                    };
                    commit(
                        r,
                        tok,
                        forced.is_some(),
                        row,
                        &self.eos,
                        self.tokenizer.as_deref(),
                    );
                }
                verified.push(None);
                continue;
            }
            let prop = &proposals[j];
            let n = prop.tokens.len();
            let n_model = p.k_model.min(n);
            let mut accepted = 0usize;
            let mut model_accepted = 0usize;
            for i in 0..=n {
                let row = &logits[(row0 + i) * vocab..(row0 + i + 1) * vocab];
                if !finite(row) {
                    fail_non_finite(r);
                    break;
                }
                let d = prop.tokens.get(i).copied();
                let forced = r.budget.forced_next();
                let (tok, verdict) = match forced {
                    Some(f) => (
                        f,
                        match d {
                            Some(d) if d == f => Verdict::Accepted,
                            Some(_) => Verdict::Recovered,
                            None => Verdict::Bonus,
                        },
                    ),
                    None => {
                        let q = if i < n_model {
                            prop.q.as_ref().and_then(|q| q.get(i)).map(|v| v.as_slice())
                        } else {
                            None
                        };
                        crate::spec::verify_position(row, d.map(|d| (d, q)), &r.params, &mut r.rng)
                    }
                };
                match verdict {
                    Verdict::Accepted if i < n_model => {
                        r.counters.accepted_tokens += 1;
                        Counters::bump_position(&mut r.counters.accepted_per_position, i);
                        model_accepted += 1;
                    }
                    Verdict::Recovered if i < n_model => r.counters.recovered_tokens += 1,
                    Verdict::Bonus if n > 0 => r.counters.bonus_tokens += 1,
                    _ => {}
                }
                let finished = commit(
                    r,
                    tok,
                    forced.is_some(),
                    row,
                    &self.eos,
                    self.tokenizer.as_deref(),
                );
                committed += 1;
                if verdict == Verdict::Accepted {
                    accepted += 1;
                }
                if finished || verdict != Verdict::Accepted {
                    break;
                }
            }
            row0 += n + 1;
            if n_model == 0 && p.decode && r.speculate && r.alpha_obs > 0 {
                // No evidence this step: the request's own estimate ages toward the drafter's,
                // so one that stopped drafting after a bad start drafts again later (without
                // drafts it would never be re-measured).
                r.alpha += 0.1 * (self.drafter_alpha - r.alpha);
            }
            if n_model > 0 {
                let rejected = usize::from(model_accepted < n_model);
                let obs = model_accepted as f64 / (model_accepted + rejected).max(1) as f64;
                r.alpha = if r.alpha_obs == 0 {
                    obs
                } else {
                    0.85 * r.alpha + 0.15 * obs
                };
                r.alpha_obs += 1;
                self.drafter_obs += 1;
                let w = self.first_prior.weight;
                learn_acceptance(&mut self.drafter_alpha, self.drafter_obs, obs, w);
                // positions 1..=accepted succeeded, the next one (if drafted) failed
                for j in 0..n_model.min(model_accepted + 1).min(self.pos_alpha.len()) {
                    let hit = if j < model_accepted { 1.0 } else { 0.0 };
                    self.pos_obs[j] += 1;
                    let w = pos_prior_weight(&self.first_prior, j);
                    learn_acceptance(&mut self.pos_alpha[j], self.pos_obs[j], hit, w);
                }
            }
            verified.push(Some((accepted, n)));
        }
        (verified, committed)
    }

    /// Roll back: each decode request's target KV is truncated to the fed last token plus its
    /// accepted drafts; the proposer drops what it cached beyond the committed context.
    fn roll_back(&mut self, plan: &[Planned], verified: &[Option<(usize, usize)>]) {
        for (p, v) in plan.iter().zip(verified) {
            let Some((accepted, n)) = *v else { continue };
            let r = &mut self.running[p.idx];
            let valid = r.kv.len() + 1 + accepted;
            self.kv.set_len(&mut r.kv, valid);
            self.kv.truncate(&mut r.kv, valid);
            publish_prefix(&mut self.kv, r, self.cfg.prefix_cache);
            if let Some(pr) = self.proposer.as_mut() {
                if n > 0 {
                    let tokens = &r.tokens;
                    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        pr.on_commit(r.id, tokens)
                    }));
                    if let Err(payload) = caught {
                        self.disable_drafter(&super::contain::panic_message(&*payload));
                    }
                }
            }
        }
    }

    /// Take this step's events; retire finished requests.
    pub fn collect_events(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            let ev = std::mem::take(&mut r.event);
            let done = r.finished.is_some();
            if !ev.tokens.is_empty() || ev.finish.is_some() {
                events.push(Event { id: r.id, ..ev });
            }
            if done {
                let mut r = self.running.remove(i);
                self.retire(&mut r);
            } else {
                i += 1;
            }
        }
        events
    }

    pub fn retire(&mut self, r: &mut ReqState) {
        self.kv.free(&mut r.kv);
        // (the arm is read before the proposer forgets the request)
        let arm = arm_name(self.proposer.as_deref(), r);
        if let Some(p) = self.proposer.as_mut() {
            p.release(r.id);
        }
        if let Some(p) = self.guarded.as_mut().and_then(|g| g.prev.as_mut()) {
            p.release(r.id);
        }
        if matches!(
            r.finished,
            Some(FinishReason::Stop | FinishReason::StopString | FinishReason::Length)
        ) {
            self.lengths.record(r.generated());
        }
        self.finished_totals.add(&r.counters);
        account(&mut self.metrics, self.draft_generation, arm, r);
        if let (Some(a), Some(b)) = (r.first_token_at, r.last_token_at) {
            let n = r.generated();
            if n >= 2 {
                let tpot = b.duration_since(a).as_secs_f64() / (n - 1) as f64;
                self.metrics.observe_tpot(&r.label, arm, tpot);
            }
        }
        self.retired.push((r.id, r.counters.clone()));
    }

    /// Cancel a request wherever it is; returns its final event, or an error if unknown.
    pub fn cancel(&mut self, id: u64) -> Result<Event> {
        let mut r = if let Some(pos) = self.running.iter().position(|r| r.id == id) {
            self.running.remove(pos)
        } else if let Some(pos) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(pos).expect("waiting request")
        } else {
            return Err(Error::UnknownRequest(id));
        };
        r.finished = Some(FinishReason::Cancelled);
        let ev = std::mem::take(&mut r.event);
        self.retire(&mut r);
        Ok(Event {
            id,
            finish: Some(FinishReason::Cancelled),
            ..ev
        })
    }
}

/// Totals over the engine's decode-only steps (see `Core::decode`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DecodeSteps {
    pub steps: u64,
    /// Wall seconds of those steps (drafting, verification, commit).
    pub seconds: f64,
    /// Tokens they committed (accepted drafts + one per verified request, none past the token
    /// on which a request finished).
    pub committed_tokens: u64,
    /// Target weight bytes their forwards needed.
    pub weight_bytes: u64,
    /// Weight bytes the drafter's forwards needed in them ([`Proposer::weight_bytes`]).
    pub draft_weight_bytes: u64,
    /// Steps by the number of tokens their target forward took (index: tokens; verified drafts
    /// included): what a step's products multiply, for a roofline that counts FLOPs as well as
    /// bytes (`Model::decode_work_per_token`).
    pub steps_by_tokens: Vec<u64>,
}

/// The metric name of a request's A/B arm ("" without an A/B drafter).
fn arm_name(p: Option<&dyn Proposer>, r: &ReqState) -> &'static str {
    p.and_then(|p| p.arm_of(r.id, r.draft_arm))
        .map_or("", |a| crate::spec::ab::ARM_NAMES[a as usize])
}

/// Add a request's counter growth since its last report to (its label, `generation`, `arm`), and
/// note when it committed generated tokens.
fn account(m: &mut super::metrics::Metrics, generation: u64, arm: &str, r: &mut ReqState) {
    if r.counters != r.reported {
        let d = super::metrics::delta(&r.counters, &r.reported);
        m.add(&r.label, generation, arm, &d);
        r.reported = r.counters.clone();
    }
    let n = r.generated();
    if n > r.reported_generated {
        let now = Instant::now();
        r.first_token_at.get_or_insert(now);
        r.last_token_at = Some(now);
        r.reported_generated = n;
    }
}

/// Publish a request's full prompt blocks to the prefix cache once its prompt KV is written.
/// Only prompt tokens are published: they always take the MHA path, so their KV is reproducible.
fn publish_prefix(kv: &mut KvCache, r: &mut ReqState, enabled: bool) {
    if enabled && !r.prefix_registered && r.kv.len() >= r.prompt_len {
        kv.register_prefix(&r.kv, &r.tokens[..r.prompt_len]);
        r.prefix_registered = true;
    }
}

//! The engine: `submit(request) -> id`, `step() -> events`, `cancel(id)`, draft swaps, counters.
//!
//! Thread safety: `Engine` is `Send + Sync`. `submit`, `cancel`, `set_draft_weights`,
//! `request_counters`, `swap_status` and `stats` never wait for a running step: submissions and
//! cancels travel over a crossbeam channel and take effect at the start of the next step; draft
//! weights load and validate on a background thread and are swapped in atomically between two
//! steps. `step` itself is serialised (one at a time).

mod commit;
mod config;
mod contain;
mod core;
mod drafts;
pub mod metrics;
pub mod request;
mod schedule;
pub mod score;
mod stats;
mod swap;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::error::{Error, Result};
use crate::kernels::{pin_thread, Isa, IsaLevel};
use crate::kv::{KvCache, KvConfig};
use crate::model::Model;
use crate::sampling::{Rng, StopMatcher};
use crate::spec::policy::AcceptPrior;
use crate::spec::{BudgetConfig, BudgetState, Counters, Proposer, SpecMode};
use crate::tokenizer::{StreamDecoder, Tokenizer};

use self::core::Core;
pub(crate) use config::check_draft_p_min;
pub use config::{EngineConfig, DEFAULT_DRAFT_P_MIN};
pub use core::DecodeSteps;
use request::ReqState;
pub use request::{Event, Fault, FaultSite, FinishReason, Prompt, Request};
use stats::CounterBook;
pub use stats::{EngineStats, Output};
pub use swap::{DraftSource, GuardThreshold, SwapGuard, SwapStatus};

/// A guard's threshold must be a rate (absolute: [0, 1]; relative: >= 0) and it must wait for
/// at least one draft.
fn check_guard(g: &SwapGuard) -> Result<()> {
    let ok = match g.threshold {
        GuardThreshold::Absolute(t) => (0.0..=1.0).contains(&t),
        GuardThreshold::Relative(f) => f.is_finite() && f >= 0.0,
    };
    if !ok || g.min_drafts == 0 {
        return Err(Error::InvalidArgument(format!(
            "swap guard: min_drafts must be >= 1 and the threshold a rate, got {g:?}"
        )));
    }
    Ok(())
}

/// A mutex guard even if a thread panicked while holding it: every engine lock guards data that
/// is consistent between statements (steps contain their own panics), so poisoning carries no
/// information here and must not take the engine down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Command {
    Submit(Box<ReqState>),
    Cancel(u64),
}

/// Immutable facts every thread may read without the step lock.
struct Shared {
    vocab_size: usize,
    target: Arc<Model>,
    tokenizer: Option<Arc<Tokenizer>>,
    think_start: Vec<u32>,
    think_end: Vec<u32>,
    block_size: usize,
    num_blocks: usize,
    k_max: usize,
    /// The target directory's recorded MTP acceptance (`SwapCtx::mtp_recorded_acceptance`).
    mtp_recorded_acceptance: Option<f64>,
}

/// A serving engine over one target model and an optional drafter.
pub struct Engine {
    shared: Arc<Shared>,
    core: Mutex<Core>,
    tx: Sender<Command>,
    rx: Receiver<Command>,
    next_id: AtomicU64,
    live: Mutex<HashSet<u64>>,
    counters: Mutex<CounterBook>,
    swaps: swap::Swaps,
    pool: rayon::ThreadPool,
    cfg: EngineConfig,
}

impl Engine {
    /// Load a target model directory; `draft` optionally names a drafter.
    /// Malformed files give typed errors; a panic inside a dependency while loading is caught
    /// and returned as `Error::Engine` (the caller's process keeps running).
    pub fn new(target_dir: &Path, draft: DraftSource, cfg: EngineConfig) -> Result<Engine> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Engine::load(target_dir, draft, cfg)
        }))
        .unwrap_or_else(|payload| {
            Err(Error::Engine(format!(
                "loading {} panicked: {}",
                target_dir.display(),
                contain::panic_message(payload.as_ref())
            )))
        })
    }

    fn load(target_dir: &Path, draft: DraftSource, cfg: EngineConfig) -> Result<Engine> {
        let pool = build_pool(cfg.threads, cfg.isa)?;
        let huge = cfg.loads_huge_pages();
        let model = Arc::new(pool.install(|| Model::load_dir_with(target_dir, huge))?);
        let tokenizer = Tokenizer::from_model_dir(target_dir)?.map(Arc::new);
        let mtp_recorded = crate::spec::mtp::recorded_acceptance(target_dir);
        let mut eng = Engine::from_parts(model, tokenizer, mtp_recorded, cfg, pool)?;
        if !matches!(draft, DraftSource::None) {
            if let DraftSource::Dir(d) = &draft {
                eng.swaps
                    .set_current_config(Some(crate::config::ModelConfig::from_file(
                        &d.join("config.json"),
                    )?));
            }
            let p = eng.build_proposer(draft)?;
            let core = eng.core.get_mut().expect("core lock");
            core.proposer = Some(p);
            core.reset_acceptance();
        }
        Ok(eng)
    }

    /// Build from an already loaded model (tests, embedding).
    pub fn from_model(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        let pool = build_pool(cfg.threads, cfg.isa)?;
        Engine::from_parts(model, tokenizer, None, cfg, pool)
    }

    fn from_parts(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        mtp_recorded_acceptance: Option<f64>,
        cfg: EngineConfig,
        pool: rayon::ThreadPool,
    ) -> Result<Engine> {
        if cfg.block_size == 0 || cfg.num_blocks == 0 {
            return Err(Error::InvalidArgument(
                "block_size and num_blocks must be > 0".into(),
            ));
        }
        check_draft_p_min(cfg.draft_p_min)?;
        let c = &model.config;
        let kc = KvConfig::for_model(c, cfg.block_size, cfg.num_blocks, cfg.kv_dtype)
            .with_index_dtype(cfg.index_kv_dtype.unwrap_or(cfg.kv_dtype));
        // One step of one request needs the window blocks of [len - r0, len + chunk).
        let bs = cfg.block_size;
        let chunk = cfg.max_batch_tokens.min(cfg.num_blocks.saturating_mul(bs));
        let need = kc.window.map_or(0, |r0| (r0 + chunk).div_ceil(bs) + 1);
        let window_blocks = match (cfg.kv_window_blocks, kc.window) {
            (Some(n), Some(r0)) if n < need => {
                return Err(Error::InvalidArgument(format!(
                    "kv_window_blocks {n} cannot hold one step of one request: the lookback \
                     ({r0} tokens) plus a chunk of {chunk} tokens need {need} blocks of {bs}"
                )));
            }
            (Some(n), _) => n,
            (None, Some(r0)) => {
                let per_seq = (r0 + 16).div_ceil(bs) + 2;
                let want = cfg.max_running.saturating_mul(per_seq) + chunk.div_ceil(bs) + 1;
                want.min(cfg.num_blocks).max(need)
            }
            (None, None) => 0,
        };
        let mut cfg = cfg;
        let cuda = match cfg.device {
            crate::backend::Device::Cpu => None,
            crate::backend::Device::Cuda(ordinal) => {
                if cfg.kv_offload.is_some() {
                    return Err(Error::InvalidArgument(
                        "kv_offload: the second KV tier is not available with a CUDA device \
                         (its records are copied from host storage)"
                            .into(),
                    ));
                }
                crate::cuda::CudaBackend::check_cache_dtype(cfg.kv_dtype)?;
                // Shared prefix blocks are copied on write by the host cache only.
                cfg.prefix_cache = false;
                Some(Arc::new(crate::cuda::CudaBackend::new(
                    &model, ordinal, None,
                )?))
            }
        };
        let mut kv = KvCache::new(kc.with_window_blocks(window_blocks))?;
        if let Some(t) = &cfg.kv_offload {
            kv.attach_tier(t, model.fingerprint())?;
        }
        let special = |name: &str| {
            tokenizer
                .as_ref()
                .and_then(|t| t.token_to_id(name))
                .map(|i| vec![i])
                .unwrap_or_default()
        };
        let mut eos = c.eos_token_ids.clone();
        if let Some(e) = tokenizer.as_ref().and_then(|t| t.token_to_id("<eos>")) {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let k_max = match cfg.spec {
            SpecMode::Fixed(k) => k,
            SpecMode::Adaptive { k_max } => k_max,
        };
        let shared = Arc::new(Shared {
            vocab_size: c.vocab_size,
            target: model.clone(),
            tokenizer: tokenizer.clone(),
            think_start: special("<think>"),
            think_end: special("</think>"),
            block_size: cfg.block_size,
            num_blocks: cfg.num_blocks,
            k_max,
            mtp_recorded_acceptance,
        });
        let core = Core {
            cuda,
            model,
            tokenizer,
            kv,
            cfg: cfg.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            proposer: None,
            draft_generation: 0,
            target_cost: Default::default(),
            draft_cost: Default::default(),
            catch_up_s_per_row: None,
            catch_up_round: None,
            drafted_last_step: false,
            idle_draft_steps: 0,
            explore_period: crate::spec::policy::EXPLORE_EVERY,
            exploring: false,
            lengths: Default::default(),
            eos,
            steps: 0,
            time_target_s: 0.0,
            time_draft_s: 0.0,
            target_weight_bytes: 0,
            draft_weight_bytes: 0,
            decode: Default::default(),
            drafter_alpha: AcceptPrior::GENERIC.alpha,
            first_prior: AcceptPrior::GENERIC,
            drafter_obs: 0,
            pos_alpha: vec![AcceptPrior::GENERIC.alpha; k_max.max(1)],
            pos_obs: vec![0; k_max.max(1)],
            guard: Default::default(),
            admitted: 0,
            finished_totals: Counters::default(),
            metrics: Default::default(),
            guarded: None,
            retired: Vec::new(),
            present_ids: Vec::new(),
            step_ids: Vec::new(),
            panics_contained: 0,
            kv_blocks_reclaimed: 0,
            drafter_panics: 0,
            drafter_disabled: None,
        };
        let (tx, rx) = unbounded();
        Ok(Engine {
            shared,
            core: Mutex::new(core),
            tx,
            rx,
            next_id: AtomicU64::new(1),
            live: Mutex::new(HashSet::new()),
            counters: Mutex::new(CounterBook::default()),
            swaps: swap::Swaps::default(),
            pool,
            cfg,
        })
    }

    /// The tokenizer, if the model directory had one.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.shared.tokenizer.as_ref()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Validate and queue a request; returns its id. Never waits for a running step.
    pub fn submit(&self, req: Request) -> Result<u64> {
        let sh = &self.shared;
        let tokens = match &req.prompt {
            Prompt::Tokens(t) => t.clone(),
            Prompt::Text(s) => {
                let t = sh.tokenizer.as_ref().ok_or_else(|| {
                    Error::NoTokenizer(
                        "the model directory has no tokenizer.json; submit token ids".into(),
                    )
                })?;
                t.encode(s, false)?
            }
        };
        if tokens.is_empty() {
            return Err(Error::InvalidRequest("empty prompt".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= sh.vocab_size) {
            return Err(Error::UnknownToken {
                id: bad,
                vocab_size: sh.vocab_size,
            });
        }
        req.sampling.validate()?;
        if let Some(l) = &req.label {
            if l.len() > metrics::MAX_LABEL_BYTES || l.chars().any(char::is_control) {
                return Err(Error::InvalidRequest(format!(
                    "label must be at most {} bytes without control characters",
                    metrics::MAX_LABEL_BYTES
                )));
            }
        }
        if req.sampling.max_tokens == 0 {
            return Err(Error::InvalidRequest("max_tokens must be >= 1".into()));
        }
        if let Some(a) = req.draft_arm.filter(|&a| a > 1) {
            return Err(Error::InvalidRequest(format!(
                "draft_arm must be 0 (A) or 1 (B), found {a}"
            )));
        }
        let start = req
            .think_start
            .clone()
            .unwrap_or_else(|| sh.think_start.clone());
        let end = req
            .think_end
            .clone()
            .unwrap_or_else(|| sh.think_end.clone());
        for m in [&start, &end] {
            if let Some(&bad) = m.iter().find(|&&t| t as usize >= sh.vocab_size) {
                return Err(Error::UnknownToken {
                    id: bad,
                    vocab_size: sh.vocab_size,
                });
            }
        }
        if req.reasoning_budget.is_some() && end.is_empty() {
            return Err(Error::InvalidRequest(
                "reasoning_budget needs a think-end marker (the tokenizer has no </think>; pass think_end)".into(),
            ));
        }
        let need = tokens.len() + req.sampling.max_tokens + sh.k_max + 1;
        let blocks = need.div_ceil(sh.block_size);
        if blocks > sh.num_blocks {
            return Err(Error::KvExhausted(format!(
                "request needs up to {need} tokens ({blocks} blocks of {}), the pool has {} blocks",
                sh.block_size, sh.num_blocks
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let budget = BudgetState::new(
            BudgetConfig {
                budget: req.reasoning_budget,
                start,
                end,
            },
            &tokens,
        );
        let state = ReqState {
            id,
            prompt_len: tokens.len(),
            counters: Counters {
                prompt_tokens: tokens.len() as u64,
                ..Default::default()
            },
            tokens,
            kv: Default::default(),
            budget,
            rng: Rng::new(req.sampling.seed),
            detok: sh.tokenizer.as_ref().map(|_| StreamDecoder::new(true)),
            stop: StopMatcher::new(&req.sampling.stop_strings),
            params: req.sampling,
            speculate: req.speculate,
            want_logprobs: req.logprobs,
            alpha: AcceptPrior::GENERIC.alpha,
            alpha_obs: 0,
            drafted_at: None,
            prefix_registered: false,
            event: Event::default(),
            finished: None,
            admitted_seq: u64::MAX,
            suspect: false,
            fault: req.fault,
            label: req.label.unwrap_or_default(),
            draft_arm: req.draft_arm,
            reported: Counters::default(),
            first_token_at: None,
            last_token_at: None,
            reported_generated: 0,
        };
        lock(&self.live).insert(id);
        self.tx
            .send(Command::Submit(Box::new(state)))
            .map_err(|_| Error::Engine("engine is shut down".into()))?;
        Ok(id)
    }

    /// Cancel a request; its final event (finish = Cancelled) comes from the next step.
    pub fn cancel(&self, id: u64) -> Result<()> {
        if !lock(&self.live).contains(&id) {
            return Err(Error::UnknownRequest(id));
        }
        self.tx
            .send(Command::Cancel(id))
            .map_err(|_| Error::Engine("engine is shut down".into()))
    }

    /// Whether any request is queued or running.
    pub fn has_work(&self) -> bool {
        !lock(&self.live).is_empty()
    }

    /// Run one step and return its events.
    pub fn step(&self) -> Result<Vec<Event>> {
        let mut core = lock(&self.core);
        let mut events = Vec::new();
        self.swaps.check_guard(&mut core);
        self.swaps.apply_ready(&mut core);
        for cmd in self.rx.try_iter() {
            match cmd {
                Command::Submit(r) => core.waiting.push_back(*r),
                Command::Cancel(id) => {
                    if let Ok(ev) = core.cancel(id) {
                        events.push(ev);
                    }
                }
            }
        }
        let core_ref: &mut Core = &mut core;
        // A panic inside the step (a bug, or a dependency's) is contained: the step's requests
        // are requeued and rerun one at a time, and the one that panics alone fails with an
        // error event (`contain`); the lock is not poisoned and the others keep their outputs.
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.pool.install(|| core_ref.step())
        }));
        let res = match res {
            Ok(r) => r,
            Err(payload) => {
                let msg = contain::panic_message(payload.as_ref());
                events.extend(core.contain_panic(&msg));
                Ok(Vec::new())
            }
        };
        match res {
            Ok(evs) => events.extend(evs),
            Err(e) => {
                // A failed forward loses nothing: fail the step's requests loudly rather than corrupt them.
                let ids: Vec<u64> = core.running.iter().map(|r| r.id).collect();
                for id in ids {
                    if let Ok(mut ev) = core.cancel(id) {
                        ev.finish = Some(FinishReason::Error(e.to_string()));
                        events.push(ev);
                    }
                }
            }
        }
        // publish counters, retire finished ids
        let mut snap = lock(&self.counters);
        for r in core.running.iter().chain(core.waiting.iter()) {
            snap.live.insert(r.id, r.counters.clone());
        }
        for (id, c) in core.retired.drain(..) {
            snap.live.remove(&id);
            snap.finish(id, c);
        }
        let mut live = lock(&self.live);
        for ev in &events {
            if ev.finish.is_some() {
                live.remove(&ev.id);
            }
        }
        Ok(events)
    }

    /// Counters of a request (running, waiting or finished).
    pub fn request_counters(&self, id: u64) -> Result<Counters> {
        let book = lock(&self.counters);
        book.live
            .get(&id)
            .or_else(|| book.finished.get(&id))
            .cloned()
            .ok_or(Error::UnknownRequest(id))
    }

    /// Engine-wide statistics (waits for a running step).
    pub fn stats(&self) -> EngineStats {
        let core = lock(&self.core);
        let mut totals = core.finished_totals.clone();
        // Waiting requests too: a preempted request's counters must not drop out of the totals.
        for r in core.running.iter().chain(core.waiting.iter()) {
            totals.add(&r.counters);
        }
        let kv = core.kv.stats();
        let draft_kv = core.proposer.as_ref().and_then(|p| p.kv_stats());
        EngineStats {
            steps: core.steps,
            running: core.running.len(),
            waiting: core.waiting.len(),
            mean_acceptance_length: totals.mean_acceptance_length(),
            totals,
            time_target_forward_s: core.time_target_s,
            time_draft_s: core.time_draft_s,
            target_weight_bytes: core.target_weight_bytes,
            draft_weight_bytes: core.draft_weight_bytes,
            decode: core.decode.clone(),
            target_kv_bytes_per_token: kv.bytes_per_token,
            draft_kv_bytes_per_token: core.proposer.as_ref().map_or(0, |p| p.kv_bytes_per_token()),
            kv,
            draft_kv,
            draft_generation: core.draft_generation,
            drafter: core.proposer.as_ref().map_or("none".into(), |p| p.name()),
            panics_contained: core.panics_contained,
            kv_blocks_reclaimed: core.kv_blocks_reclaimed,
            drafter_panics: core.drafter_panics,
            drafter_disabled: core.drafter_disabled.clone(),
            swaps_failed: self.swaps.failed(),
        }
    }

    /// The Prometheus text exposition of the engine's metrics (see `engine::metrics`): every
    /// counter per workload label and draft generation, step-latency and time-per-output-token
    /// histograms, KV blocks per pool, requests, swaps. Waits for a running step.
    pub fn metrics_text(&self) -> String {
        let core = lock(&self.core);
        let kv = core.kv.stats();
        let draft_kv = core.proposer.as_ref().and_then(|p| p.kv_stats());
        metrics::render(&metrics::Snapshot {
            metrics: &core.metrics,
            kv: &kv,
            draft_kv: draft_kv.as_ref(),
            running: core.running.len(),
            waiting: core.waiting.len(),
            draft_generation: core.draft_generation,
            swaps_applied: core.draft_generation,
            swaps_failed: self.swaps.failed(),
            panics_contained: core.panics_contained,
        })
    }

    /// Counters per (workload label, draft generation), as reported after the last step (A/B
    /// arms summed).
    pub fn label_counters(&self) -> Vec<(String, u64, Counters)> {
        let core = lock(&self.core);
        let mut m: BTreeMap<(String, u64), Counters> = BTreeMap::new();
        for ((l, g, _), c) in &core.metrics.buckets {
            m.entry((l.clone(), *g)).or_default().add(c);
        }
        m.into_iter().map(|((l, g), c)| (l, g, c)).collect()
    }

    /// Per A/B arm ("a", "b"): its requests' counters (every label and generation summed), and
    /// the mean time per output token of its finished requests (None before any finished with
    /// two or more tokens). Empty unless an A/B drafter has served.
    pub fn arm_stats(&self) -> Vec<(String, Counters, Option<f64>)> {
        let core = lock(&self.core);
        let mut m: BTreeMap<String, (Counters, f64, u64)> = BTreeMap::new();
        for ((_, _, a), c) in &core.metrics.buckets {
            if !a.is_empty() {
                m.entry(a.clone()).or_default().0.add(c);
            }
        }
        for ((_, a), h) in &core.metrics.tpot {
            if !a.is_empty() {
                let e = m.entry(a.clone()).or_default();
                e.1 += h.sum();
                e.2 += h.count();
            }
        }
        m.into_iter()
            .map(|(a, (c, s, n))| (a, c, (n > 0).then(|| s / n as f64)))
            .collect()
    }

    /// Submit every request, step until all finish, return their outputs in order.
    pub fn generate(&self, reqs: Vec<Request>) -> Result<Vec<Output>> {
        let mut ids = Vec::with_capacity(reqs.len());
        for r in reqs {
            ids.push(self.submit(r)?);
        }
        let mut outs: HashMap<u64, Output> = ids
            .iter()
            .map(|&id| {
                (
                    id,
                    Output {
                        id,
                        text: String::new(),
                        token_ids: Vec::new(),
                        logprobs: Vec::new(),
                        finish_reason: String::new(),
                        counters: Counters::default(),
                    },
                )
            })
            .collect();
        let mut open: HashSet<u64> = ids.iter().copied().collect();
        while !open.is_empty() {
            for ev in self.step()? {
                if let Some(o) = outs.get_mut(&ev.id) {
                    o.token_ids.extend_from_slice(&ev.tokens);
                    o.logprobs.extend_from_slice(&ev.logprobs);
                    o.text.push_str(&ev.text);
                    if let Some(f) = ev.finish {
                        if let FinishReason::Error(m) = &f {
                            return Err(Error::Engine(format!("request {} failed: {m}", ev.id)));
                        }
                        o.finish_reason = f.as_str().to_string();
                        open.remove(&ev.id);
                    }
                }
            }
        }
        for o in outs.values_mut() {
            o.counters = self.request_counters(o.id)?;
        }
        Ok(ids
            .into_iter()
            .map(|id| outs.remove(&id).expect("output"))
            .collect())
    }

    /// Build a proposer for `src` (used at creation and by swaps).
    fn build_proposer(&self, src: DraftSource) -> Result<Box<dyn Proposer>> {
        swap::build_proposer(src, &self.swap_ctx())
    }

    fn swap_ctx(&self) -> swap::SwapCtx {
        swap::SwapCtx {
            target_vocab: self.shared.vocab_size,
            target_tokenizer: self.shared.tokenizer.clone(),
            kv_dtype: self.cfg.draft_kv_dtype.unwrap_or(self.cfg.kv_dtype),
            num_blocks: self.cfg.draft_num_blocks,
            block_size: self.cfg.block_size,
            current_draft_config: self.swaps.current_config(),
            target: self.shared.target.clone(),
            device: self.cfg.device,
            kv_offload: self.cfg.kv_offload.clone(),
            huge_page_weights: self.cfg.loads_huge_pages(),
            mtp_recorded_acceptance: self.shared.mtp_recorded_acceptance,
        }
    }

    /// Replace the drafter while the engine serves. Loading and validation run on a background
    /// thread; the swap happens between two steps. Returns a ticket for `swap_status`.
    pub fn set_draft_weights(&self, src: DraftSource) -> u64 {
        self.swaps.start(src, self.swap_ctx())
    }

    /// Same, but load and validate on the calling thread; the swap still lands between steps.
    /// Returns the error of bad weights directly (the old drafter keeps serving).
    pub fn set_draft_weights_blocking(&self, src: DraftSource) -> Result<u64> {
        let (p, config) = self.swaps.build_blocking(src, &self.swap_ctx())?;
        Ok(self.swaps.enqueue_ready(p, config, None))
    }

    /// [`Engine::set_draft_weights`] under an acceptance guard: the previous drafter stays
    /// loaded until the new one has `guard.min_drafts` verified drafts; if its acceptance is
    /// then below the guard's threshold the previous drafter is swapped back and the ticket's
    /// status becomes [`SwapStatus::RolledBack`] with the measured acceptance.
    pub fn set_draft_weights_guarded(&self, src: DraftSource, guard: SwapGuard) -> Result<u64> {
        check_guard(&guard)?;
        Ok(self.swaps.start_guarded(src, self.swap_ctx(), Some(guard)))
    }

    /// [`Engine::set_draft_weights_guarded`], loading on the calling thread.
    pub fn set_draft_weights_blocking_guarded(
        &self,
        src: DraftSource,
        guard: SwapGuard,
    ) -> Result<u64> {
        check_guard(&guard)?;
        let (p, config) = self.swaps.build_blocking(src, &self.swap_ctx())?;
        Ok(self.swaps.enqueue_ready(p, config, Some(guard)))
    }

    /// Check the engine's internal invariants (tests and debugging): every prefilled running
    /// request's target KV holds exactly its committed tokens but the last; the KV pool's
    /// refcounts match the live block tables. Waits for a running step.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let core = self.core.lock().map_err(|_| "poisoned".to_string())?;
        for r in &core.running {
            let settled = r.counters.preemptions == 0 && r.kv.len() >= r.prompt_len;
            if r.kv.len() >= r.tokens.len() || (settled && r.kv.len() + 1 != r.tokens.len()) {
                return Err(format!(
                    "request {}: target KV len {} != committed {} - 1",
                    r.id,
                    r.kv.len(),
                    r.tokens.len()
                ));
            }
            if let Some(p) = core.proposer.as_ref() {
                p.check(r.id, &r.tokens)?;
            }
            if r.budget
                .config()
                .budget
                .is_some_and(|b| r.budget.reasoning > b)
            {
                return Err(format!(
                    "request {}: reasoning {} over budget",
                    r.id, r.budget.reasoning
                ));
            }
        }
        let live: Vec<&crate::kv::SeqKv> = core
            .running
            .iter()
            .map(|r| &r.kv)
            .chain(core.waiting.iter().map(|r| &r.kv))
            .collect();
        core.kv.check_invariants(&live)
    }

    /// Status of a swap ticket.
    pub fn swap_status(&self, ticket: u64) -> SwapStatus {
        self.swaps.status(ticket)
    }
}

/// The ISA the engine's kernels run on: `level` if the CPU has it, else an error; the best
/// available for None.
pub fn resolve_isa(level: Option<IsaLevel>) -> Result<Isa> {
    match level {
        None => Ok(Isa::detect()),
        Some(l) => Isa::new(l).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "isa `{}` is not supported by this CPU (best: {})",
                l.name(),
                Isa::detect()
            ))
        }),
    }
}

fn build_pool(threads: usize, isa: Option<IsaLevel>) -> Result<rayon::ThreadPool> {
    let isa = resolve_isa(isa)?;
    let mut b = rayon::ThreadPoolBuilder::new().start_handler(move |_| pin_thread(Some(isa)));
    if threads > 0 {
        b = b.num_threads(threads);
    }
    b.build()
        .map_err(|e| Error::Engine(format!("thread pool: {e}")))
}

/// `Engine` is shared across threads (submit/cancel while another thread steps).
#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<Engine>();
}

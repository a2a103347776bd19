//! Draft swaps at run time. A new drafter (new weights for the same architecture, a whole new
//! draft model with the same vocabulary, an n-gram proposer, or none) is built and validated on a
//! background thread, then handed to the step loop, which installs it between two steps and bumps
//! the draft generation. The new drafter owns a fresh draft KV pool, so no draft KV of the old
//! weights can ever be reused (not through its prefix cache either); the target's KV cache and
//! prefix cache are untouched. Bad weights fail validation and the old drafter keeps serving.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::KvDtype;
use crate::model::Model;
use crate::spec::{AbProposer, DraftModelProposer, MtpProposer, NgramProposer, Proposer};
use crate::tokenizer::Tokenizer;
use crate::weights::{WeightSource, WeightStore};

use super::core::Core;

/// Where new draft weights come from.
#[derive(Clone, Debug)]
pub enum DraftSource {
    /// Speculation off.
    None,
    /// Prompt-lookup proposer.
    Ngram { min_n: usize, max_n: usize },
    /// A model directory (config.json + safetensors [+ tokenizer.json]): any draft architecture.
    Dir(PathBuf),
    /// A safetensors file with new weights for the CURRENT draft architecture.
    File(PathBuf),
    /// Safetensors bytes in memory with new weights for the CURRENT draft architecture.
    Bytes(Vec<u8>),
    /// The target's own multi-token-prediction layer (DeepSeek-V3 or V4 MTP; the target checkpoint
    /// must hold `model.layers.{num_hidden_layers}.*` (V3) or `mtp.0.*` (V4)).
    Mtp,
    /// A live A/B of two drafters (any of the kinds above but another A/B; `None` is a
    /// no-speculation control arm), each with its own draft KV: a request goes to the arm it asks
    /// for (`Request::draft_arm`), else to B with probability `ratio_b` (a fixed hash of its id).
    Ab {
        a: Box<DraftSource>,
        b: Box<DraftSource>,
        ratio_b: f64,
    },
}

/// State of a swap request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapStatus {
    /// Loading / validating, or waiting for the next step.
    Pending,
    /// Installed; the drafter serves from this generation on.
    Applied { generation: u64 },
    /// Refused; the previous drafter keeps serving.
    Failed(String),
    /// Installed under an acceptance guard that then failed: the previous drafter serves again
    /// (from `generation`, a new generation number); `reason` says what was measured.
    RolledBack { generation: u64, reason: String },
    /// No such ticket.
    Unknown,
}

/// What the builder needs to know about the target and the current draft.
#[derive(Clone)]
pub(crate) struct SwapCtx {
    pub target_vocab: usize,
    pub target_tokenizer: Option<Arc<Tokenizer>>,
    pub kv_dtype: KvDtype,
    pub num_blocks: usize,
    pub block_size: usize,
    pub current_draft_config: Option<ModelConfig>,
    /// The target model (its MTP layer drafts for `DraftSource::Mtp`).
    pub target: Arc<Model>,
    /// The target's device: a draft model goes to the same GPU when it can run there (a V2 /
    /// V3 draft with a bf16 draft KV cache), else it runs on the CPU.
    pub device: crate::backend::Device,
    /// The target's second KV tier: the MTP drafter's cache gets one too (its own file), since
    /// the target reuses no more of a prefix than the MTP restores.
    pub kv_offload: Option<crate::kv::TierConfig>,
    /// Read a draft model's files into huge pages (`EngineConfig::huge_page_weights`).
    pub huge_page_weights: bool,
    /// The target's MTP layer's recorded held-out acceptance (`spec::mtp::recorded_acceptance`
    /// of the target directory; None for a model built in memory).
    pub mtp_recorded_acceptance: Option<f64>,
}

struct Ready {
    ticket: u64,
    proposer: Option<Box<dyn Proposer>>,
    config: Option<ModelConfig>,
    guard: Option<SwapGuard>,
}

/// An acceptance guard on a swap: once the new drafter has `min_drafts` verified draft tokens,
/// its acceptance (accepted / drafted, over every request since the swap) must reach the
/// threshold, else the previous drafter (kept loaded until then) is swapped back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwapGuard {
    pub min_drafts: u64,
    pub threshold: GuardThreshold,
}

/// What the new drafter's acceptance is compared with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GuardThreshold {
    /// An acceptance rate in [0, 1].
    Absolute(f64),
    /// A fraction of the previous generation's measured acceptance (no drafts measured for it:
    /// the guard passes).
    Relative(f64),
}

/// A guarded swap waiting for its verdict (held by `Core`).
pub(crate) struct Guarded {
    pub ticket: u64,
    pub guard: SwapGuard,
    /// The drafter before the swap (None: there was none), its config and generation.
    pub prev: Option<Box<dyn Proposer>>,
    pub prev_config: Option<ModelConfig>,
    pub prev_generation: u64,
}

/// Swap bookkeeping shared by callers (any thread) and the step loop.
#[derive(Default)]
pub(crate) struct Swaps {
    next: AtomicU64,
    /// Loads that failed validation (background and blocking).
    failed: Arc<AtomicU64>,
    status: Arc<Mutex<HashMap<u64, SwapStatus>>>,
    ready: Arc<Mutex<Vec<Ready>>>,
    current: Arc<Mutex<Option<ModelConfig>>>,
}

/// Build and validate a drafter (runs off the step path).
pub(crate) fn build_proposer(src: DraftSource, ctx: &SwapCtx) -> Result<Box<dyn Proposer>> {
    Ok(match build_contained(src, ctx)? {
        (Some(p), _) => p,
        (None, _) => return Err(Error::Draft("no drafter".into())),
    })
}

/// A built drafter: the proposer (None: no drafting) and its model's config (None for a
/// drafter without a model: n-gram, none).
pub(crate) type Built = (Option<Box<dyn Proposer>>, Option<ModelConfig>);

/// [`build`] with a panic (a dependency's, on malformed files) turned into `Error::Draft`.
pub(crate) fn build_contained(src: DraftSource, ctx: &SwapCtx) -> Result<Built> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(src, ctx))).unwrap_or_else(
        |payload| {
            Err(Error::Draft(format!(
                "loading the drafter panicked: {}",
                super::contain::panic_message(payload.as_ref())
            )))
        },
    )
}

pub(crate) fn build(src: DraftSource, ctx: &SwapCtx) -> Result<Built> {
    let (config, store, label) = match src {
        DraftSource::None => return Ok((None, None)),
        DraftSource::Ab { a, b, ratio_b } => {
            if !(0.0..=1.0).contains(&ratio_b) {
                return Err(Error::Draft(format!(
                    "A/B ratio must be in [0, 1], found {ratio_b}"
                )));
            }
            let arm = |s: DraftSource, name: &str| match s {
                DraftSource::Ab { .. } => Err(Error::Draft(format!(
                    "A/B arm {name} is itself an A/B drafter"
                ))),
                s => build(s, ctx).map_err(|e| Error::Draft(format!("A/B arm {name}: {e}"))),
            };
            let (pa, ca) = arm(*a, "a")?;
            let (pb, cb) = arm(*b, "b")?;
            let p = AbProposer::new(pa, pb, ratio_b);
            // a later weights-only swap (File / Bytes) builds one drafter of arm A's architecture
            return Ok((Some(Box::new(p)), ca.or(cb)));
        }
        DraftSource::Mtp => {
            let mut p = MtpProposer::new(
                ctx.target.clone(),
                ctx.kv_dtype,
                ctx.num_blocks,
                ctx.block_size,
            )?;
            if let Some(t) = &ctx.kv_offload {
                p = p.with_tier(t)?;
            }
            let p = p.with_recorded_acceptance(ctx.mtp_recorded_acceptance);
            return Ok((Some(Box::new(p)), None));
        }
        DraftSource::Ngram { min_n, max_n } => {
            if min_n == 0 || max_n < min_n {
                return Err(Error::Draft(format!("bad n-gram range {min_n}..{max_n}")));
            }
            return Ok((Some(Box::new(NgramProposer { min_n, max_n })), None));
        }
        DraftSource::Dir(dir) => {
            let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
            if let (Some(tt), Some(dt)) = (&ctx.target_tokenizer, Tokenizer::from_model_dir(&dir)?)
            {
                if tt.vocab_fingerprint() != dt.vocab_fingerprint() {
                    return Err(Error::Draft(format!(
                        "tokenizer mismatch: {} has a different vocabulary than the target",
                        dir.display()
                    )));
                }
            }
            let store =
                WeightStore::open_with(WeightSource::Dir(dir.clone()), ctx.huge_page_weights)?;
            (
                cfg,
                store,
                format!(
                    "draft:{}",
                    dir.file_name()
                        .map_or("?".into(), |n| n.to_string_lossy().into_owned())
                ),
            )
        }
        DraftSource::File(path) => {
            let cfg = ctx.current_draft_config.clone().ok_or_else(|| {
                Error::Draft(
                    "a weights file needs a current draft architecture; pass a model directory"
                        .into(),
                )
            })?;
            let label = format!("draft-weights:{}", path.display());
            let store = WeightStore::open_with(WeightSource::File(path), ctx.huge_page_weights)?;
            (cfg, store, label)
        }
        DraftSource::Bytes(bytes) => {
            let cfg = ctx.current_draft_config.clone().ok_or_else(|| {
                Error::Draft(
                    "weights bytes need a current draft architecture; pass a model directory"
                        .into(),
                )
            })?;
            (
                cfg,
                WeightStore::open(WeightSource::Bytes(bytes))?,
                "draft-weights:bytes".into(),
            )
        }
    };
    if config.vocab_size != ctx.target_vocab {
        return Err(Error::Draft(format!(
            "vocabulary mismatch: draft vocab_size {} != target vocab_size {}",
            config.vocab_size, ctx.target_vocab
        )));
    }
    let model = Arc::new(Model::load(config.clone(), &store)?);
    let mut p = DraftModelProposer::new(
        model.clone(),
        ctx.kv_dtype,
        ctx.num_blocks,
        ctx.block_size,
        ctx.target_vocab,
        label,
    )?;
    if let crate::backend::Device::Cuda(n) = ctx.device {
        use crate::cuda::CudaBackend;
        if CudaBackend::check_cache_dtype(ctx.kv_dtype).is_ok()
            && CudaBackend::check_model(&model).is_ok()
        {
            p = p.with_cuda(Arc::new(CudaBackend::new(&model, n, None)?));
        }
    }
    Ok((Some(Box::new(p)), Some(config)))
}

impl Swaps {
    pub fn current_config(&self) -> Option<ModelConfig> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record the architecture of the drafter installed at engine creation.
    pub fn set_current_config(&self, c: Option<ModelConfig>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = c;
    }

    /// A new ticket, recorded as pending. Finished tickets more than `KEEP_TICKETS` old are
    /// forgotten (their status reads `Unknown`), so a server that swaps forever stays bounded.
    fn new_ticket(&self) -> u64 {
        const KEEP_TICKETS: u64 = 4096;
        let ticket = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.len() as u64 >= 2 * KEEP_TICKETS {
            status.retain(|&t, s| t + KEEP_TICKETS > ticket || matches!(s, SwapStatus::Pending));
        }
        status.insert(ticket, SwapStatus::Pending);
        ticket
    }

    /// Loads that failed so far (background and blocking).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// A load on the caller's thread (`set_draft_weights_blocking*`): counted as failed when it
    /// is refused, like a background one; the error goes back to the caller.
    pub fn build_blocking(&self, src: DraftSource, ctx: &SwapCtx) -> Result<Built> {
        build_contained(src, ctx).inspect_err(|_| {
            self.failed.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Start a background load; returns the ticket.
    pub fn start(&self, src: DraftSource, ctx: SwapCtx) -> u64 {
        self.start_guarded(src, ctx, None)
    }

    /// [`Swaps::start`] with an optional acceptance guard.
    pub fn start_guarded(&self, src: DraftSource, ctx: SwapCtx, guard: Option<SwapGuard>) -> u64 {
        let ticket = self.new_ticket();
        let status = Arc::clone(&self.status);
        let ready = Arc::clone(&self.ready);
        let failed = Arc::clone(&self.failed);
        std::thread::spawn(move || match build_contained(src, &ctx) {
            Ok((proposer, config)) => ready.lock().unwrap_or_else(|e| e.into_inner()).push(Ready {
                ticket,
                proposer,
                config,
                guard,
            }),
            Err(e) => {
                failed.fetch_add(1, Ordering::Relaxed);
                status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(ticket, SwapStatus::Failed(e.to_string()));
            }
        });
        ticket
    }

    /// Queue an already built drafter (validated on the caller's thread).
    pub fn enqueue_ready(
        &self,
        proposer: Option<Box<dyn Proposer>>,
        config: Option<ModelConfig>,
        guard: Option<SwapGuard>,
    ) -> u64 {
        let ticket = self.new_ticket();
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Ready {
                ticket,
                proposer,
                config,
                guard,
            });
        ticket
    }

    pub fn status(&self, ticket: u64) -> SwapStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ticket)
            .cloned()
            .unwrap_or(SwapStatus::Unknown)
    }

    /// Judge a guarded swap once its drafter has enough verified drafts: keep it (the previous
    /// drafter is dropped) or swap the previous one back (a new generation; the swap's status
    /// becomes `RolledBack`). Called by the step loop between steps.
    pub fn check_guard(&self, core: &mut Core) {
        let Some(g) = core.guarded.as_ref() else {
            return;
        };
        let rate = |generation: u64| {
            let (mut d, mut a) = (0u64, 0u64);
            for ((_, gen, _), c) in &core.metrics.buckets {
                if *gen == generation {
                    d += c.drafted_tokens;
                    a += c.accepted_tokens;
                }
            }
            (d, a as f64 / d.max(1) as f64)
        };
        let (drafted, now) = rate(core.draft_generation);
        if drafted < g.guard.min_drafts {
            return;
        }
        let want = match g.guard.threshold {
            GuardThreshold::Absolute(t) => Some(t),
            GuardThreshold::Relative(f) => {
                let (d, prev) = rate(g.prev_generation);
                (d > 0).then_some(f * prev)
            }
        };
        let g = core.guarded.take().expect("checked");
        let Some(want) = want.filter(|&w| now < w) else {
            return; // passed: the previous drafter is dropped with `g`
        };
        let reason = format!(
            "acceptance {now:.3} over {drafted} drafted tokens is below the guard's {want:.3}"
        );
        core.proposer = g.prev;
        core.new_drafter_generation();
        // the restored drafter missed the tokens committed meanwhile: cut its per-request state
        // to what it still shares with each request
        if let Some(p) = core.proposer.as_mut() {
            for r in &core.running {
                p.on_commit(r.id, &r.tokens);
            }
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = g.prev_config;
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                g.ticket,
                SwapStatus::RolledBack {
                    generation: core.draft_generation,
                    reason,
                },
            );
    }

    /// Install every drafter that finished loading (called by the step loop between steps).
    pub fn apply_ready(&self, core: &mut Core) {
        let mut ready = std::mem::take(&mut *self.ready.lock().unwrap_or_else(|e| e.into_inner()));
        ready.sort_by_key(|r| r.ticket);
        for r in ready {
            // a new swap ends any pending guard (its previous drafter is dropped)
            core.guarded = r.guard.map(|guard| Guarded {
                ticket: r.ticket,
                guard,
                prev: core.proposer.take(),
                prev_config: self
                    .current
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
                prev_generation: core.draft_generation,
            });
            core.proposer = r.proposer;
            core.new_drafter_generation();
            if r.config.is_some() || core.proposer.is_none() {
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = r.config;
            }
            self.status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    r.ticket,
                    SwapStatus::Applied {
                        generation: core.draft_generation,
                    },
                );
        }
    }
}

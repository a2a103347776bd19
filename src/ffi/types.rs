//! Plain `repr(C)` data crossing the ABI (params, counters, stats, events) and their conversion
//! to and from engine types. Reading a params struct honours its `struct_size`: only the bytes
//! the caller declared are read, the rest keep their defaults, so old callers keep working when
//! fields are appended.

use std::ffi::c_char;

use super::{FfiError, FfiResult};
use crate::engine::EngineConfig;
use crate::kernels::IsaLevel;
use crate::kv::KvDtype;
use crate::spec::{Counters, SpecMode};

/// Most draft positions reported per request (and the largest `num_draft_tokens`).
pub const SPECMLA_MAX_DRAFT_POSITIONS: usize = 16;

/// KV cache dtypes for `kv_dtype` / `draft_kv_dtype` (AUTO: f32 for the target, the target's
/// dtype for the draft).
pub const SPECMLA_KV_AUTO: u32 = 0;
pub const SPECMLA_KV_F32: u32 = 1;
pub const SPECMLA_KV_BF16: u32 = 2;
pub const SPECMLA_KV_F16: u32 = 3;
pub const SPECMLA_KV_FP8_E4M3: u32 = 4;

/// Kernel instruction sets for `specmla_engine_params.isa`: AUTO = the fastest this CPU has
/// (AVX512BF16 where present; AMX excluded: opt-in); EXACT = the best of PORTABLE / AVX2 /
/// AVX512 this CPU has (results bitwise equal to PORTABLE: f32 products of the weights and f32
/// activations); asking for a level the CPU lacks fails engine creation
/// (SPECMLA_ERR_INVALID_ARGUMENT). PORTABLE, AVX2 and AVX512 give the same bits; AMX (bf16
/// matmuls on the tile unit) is batch-invariant on its own and within f32 rounding of them;
/// AVX512BF16 (bf16 and fp8 matmuls by vdpbf16ps with bf16-rounded activations, as llama.cpp) is
/// batch-invariant on its own and within ~2^-9 of sum |w x| of them per matmul output. Every
/// level is deterministic and speculation is bitwise lossless within it.
pub const SPECMLA_ISA_AUTO: u32 = 0;
pub const SPECMLA_ISA_PORTABLE: u32 = 1;
pub const SPECMLA_ISA_AVX2: u32 = 2;
pub const SPECMLA_ISA_AVX512: u32 = 3;
pub const SPECMLA_ISA_AMX: u32 = 4;
pub const SPECMLA_ISA_AVX512BF16: u32 = 5;
pub const SPECMLA_ISA_EXACT: u32 = 6;

/// Draft source kinds for `specmla_draft_source.kind`.
/// NONE: speculation off. NGRAM: prompt-lookup drafter. PATH: a model directory (any draft
/// architecture with the target's vocabulary) or a .safetensors file (new weights for the current
/// draft architecture). BYTES: safetensors bytes (new weights for the current draft architecture).
pub const SPECMLA_DRAFT_NONE: u32 = 0;
pub const SPECMLA_DRAFT_NGRAM: u32 = 1;
pub const SPECMLA_DRAFT_PATH: u32 = 2;
pub const SPECMLA_DRAFT_BYTES: u32 = 3;
pub const SPECMLA_DRAFT_MTP: u32 = 4;
/// A live A/B of two drafters: `ab_a` and `ab_b` (each any kind but AB), `ab_ratio_b` of the
/// requests without a `draft_arm` go to B.
pub const SPECMLA_DRAFT_AB: u32 = 5;

/// Engine creation parameters. Get defaults from `specmla_engine_default_params()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EngineParams {
    /// sizeof(specmla_engine_params) as the caller compiled it.
    pub struct_size: usize,
    /// Draft tokens per step (fixed mode) or the most per step (adaptive), 1..=16. Default 4.
    pub num_draft_tokens: u32,
    /// Choose 0..=num_draft_tokens per request per step from measured acceptance. Default false.
    pub adaptive: bool,
    /// With no draft directory: n-gram (prompt lookup) drafter when ngram_max_n > 0. Default 0.
    pub ngram_min_n: u32,
    pub ngram_max_n: u32,
    /// Target KV pool size in blocks. Default 2048.
    pub kv_num_blocks: u32,
    /// Draft KV pool size in blocks. Default 2048.
    pub draft_kv_num_blocks: u32,
    /// Tokens per KV block. Default 16.
    pub block_size: u32,
    /// SPECMLA_KV_*; default AUTO (f32).
    pub kv_dtype: u32,
    /// SPECMLA_KV_*; default AUTO (same as the target's).
    pub draft_kv_dtype: u32,
    /// Forward worker threads, 0 = all cores. Default 0.
    pub threads: u32,
    /// Per-step token budget. Default 512.
    pub max_batch_tokens: u32,
    /// Most requests running at once. Default 64.
    pub max_running: u32,
    /// Share full prompt blocks across requests. Default true.
    pub prefix_cache: bool,
    /// With no draft directory: draft with the target's MTP layer (takes precedence over the
    /// n-gram drafter). Default false.
    pub mtp: bool,
    /// SPECMLA_ISA_*: kernel instruction set. Default AUTO.
    pub isa: u32,
    /// SPECMLA_KV_*: dtype of a DeepSeek-V3.2 target's index-key cache (the lightning
    /// indexer's keys; ignored for V2 / V3). Default AUTO (the target's `kv_dtype`).
    pub index_kv_dtype: u32,
    /// Blocks of a DeepSeek-V4 target's sliding-window pool (its K=V rows and compressor
    /// inputs; each request holds only its lookback's blocks); 0 = the engine's sizing
    /// (`max_running` lookbacks + one chunk). Ignored for MLA models. Default 0.
    pub kv_window_blocks: u32,
    /// The target cache's second tier: evicted prefix blocks kept in `kv_offload_mem_bytes` of
    /// host memory and, with `kv_offload_dir` (a NUL-terminated directory path), in a file there
    /// that a later engine of the same model and cache layout restores from. Both unset
    /// (NULL, 0) = no tier (default).
    pub kv_offload_dir: *const c_char,
    pub kv_offload_mem_bytes: u64,
    /// NUL-terminated device of the target's forward: "cpu" (or NULL, the default), "cuda" or
    /// "cuda:N". A CUDA device needs a V2 / V3 target, a bf16 `kv_dtype` and bf16 routed
    /// experts; the prefix cache and the second KV tier are off there; a machine without a CUDA
    /// driver or device makes `specmla_engine_create` fail with a message saying so.
    pub device: *const c_char,
    /// Confidence cut of a draft model or MTP drafter, in [0, 1]: a request stops drafting for
    /// the step after a token the drafter gave a probability below it (outputs unchanged; only
    /// fewer drafts). 0 = off. Default 0.75 (llama.cpp's `--draft-p-min`).
    pub draft_p_min: f32,
    /// Read this engine's weight files (target, and draft models at creation and at every
    /// swap) into anonymous huge pages instead of mapping them: a memory-bound model decodes up
    /// to ~10 % faster for a load that copies every file and keeps every weight resident.
    /// Outputs are the same. Other engines of the process are not affected. Default false.
    pub huge_page_weights: bool,
}

/// Per-request parameters. Get defaults from `specmla_request_default_params()`. Pointers are
/// borrowed for the duration of `specmla_engine_submit` only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RequestParams {
    /// sizeof(specmla_request_params) as the caller compiled it.
    pub struct_size: usize,
    /// 0 = greedy. Default 0.
    pub temperature: f32,
    /// 0 = off. Default 0.
    pub top_k: u32,
    /// In (0, 1]; 1 = off. Default 1.
    pub top_p: f32,
    /// RNG seed of the request. Default 0.
    pub seed: u64,
    /// Most generated tokens, >= 1. Default 256.
    pub max_tokens: u32,
    /// Keep generating past end-of-sequence. Default false.
    pub ignore_eos: bool,
    /// Stop after committing any of these ids (may be NULL when n_stop_token_ids is 0).
    pub stop_token_ids: *const u32,
    pub n_stop_token_ids: usize,
    /// NUL-terminated UTF-8 stop strings (may be NULL when n_stop_strings is 0).
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    /// Most committed reasoning tokens; -1 = unlimited (default). Values < -1 are rejected.
    pub reasoning_budget: i64,
    /// Think-start marker ids; NULL = the tokenizer's `<think>`.
    pub think_start: *const u32,
    pub n_think_start: usize,
    /// Think-end marker ids (may be several tokens); NULL = the tokenizer's `</think>`.
    pub think_end: *const u32,
    pub n_think_end: usize,
    /// Allow speculation for this request. Default true.
    pub speculate: bool,
    /// Return target log-probs of committed tokens in events. Default false.
    pub logprobs: bool,
    /// NUL-terminated UTF-8 workload label (<= 64 bytes, no control characters): the request's
    /// counters are also aggregated under it in `specmla_engine_metrics`. NULL = none.
    pub label: *const c_char,
    /// Under an A/B drafter (SPECMLA_DRAFT_AB): 0 = arm A, 1 = arm B, -1 = by the ratio
    /// (default). Other values are rejected.
    pub draft_arm: i32,
}

/// Where new draft weights come from (see SPECMLA_DRAFT_*). Get defaults from
/// `specmla_draft_source_default()`. Pointers are borrowed for the call only (bytes are copied).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DraftSource {
    pub struct_size: usize,
    pub kind: u32,
    /// NUL-terminated UTF-8 path (kind PATH).
    pub path: *const c_char,
    /// Safetensors bytes (kind BYTES).
    pub bytes: *const u8,
    pub n_bytes: usize,
    /// N-gram range (kind NGRAM). Defaults 1 and 3.
    pub ngram_min_n: u32,
    pub ngram_max_n: u32,
    /// Acceptance guard: > 0 keeps the previous drafter loaded until the new one has this many
    /// verified draft tokens, then swaps it back when the new acceptance is below
    /// `guard_threshold` (a rate; with `guard_relative` a fraction of the previous drafter's
    /// measured acceptance); the ticket's status then becomes FAILED with a reason starting
    /// "rolled back". 0 = no guard (default).
    pub guard_min_drafts: u64,
    pub guard_threshold: f64,
    pub guard_relative: bool,
    /// Kind AB: the two arms (borrowed for the call; not AB themselves) and the share of requests
    /// without a `draft_arm` sent to B, in [0, 1]. Default NULL, NULL, 0.5.
    pub ab_a: *const DraftSource,
    pub ab_b: *const DraftSource,
    pub ab_ratio_b: f64,
}

/// Speculation and budget counters of one request (or summed over the engine).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CCounters {
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Committed tokens inside the think span.
    pub reasoning_tokens: u64,
    /// Committed tokens after it.
    pub answer_tokens: u64,
    /// Draft tokens proposed.
    pub drafted_tokens: u64,
    /// Draft tokens the target accepted.
    pub accepted_tokens: u64,
    /// Tokens sampled from the residual after a rejection.
    pub recovered_tokens: u64,
    /// Extra tokens sampled after a fully accepted draft.
    pub bonus_tokens: u64,
    /// 1 when the budget forced the end of thinking.
    pub forced_end_of_think: u64,
    /// Forced end-marker tokens committed.
    pub forced_tokens: u64,
    /// Verification rounds with at least one draft token.
    pub draft_steps: u64,
    /// Draft positions not spent because the budget clipped the lookahead.
    pub draft_tokens_saved: u64,
    pub preemptions: u64,
    /// 1 + accepted / draft_steps.
    pub mean_acceptance_length: f64,
    /// Valid entries in the two arrays below (<= SPECMLA_MAX_DRAFT_POSITIONS).
    pub n_positions: u32,
    /// accepted_per_position[i]: drafts accepted at draft position i.
    pub accepted_per_position: [u64; SPECMLA_MAX_DRAFT_POSITIONS],
    /// drafted_per_position[i]: drafts proposed at draft position i.
    pub drafted_per_position: [u64; SPECMLA_MAX_DRAFT_POSITIONS],
}

/// Engine-wide statistics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub steps: u64,
    pub running: u64,
    pub waiting: u64,
    /// Counters summed over finished, running and waiting requests.
    pub totals: CCounters,
    pub time_target_forward_s: f64,
    pub time_draft_s: f64,
    pub kv_num_blocks: u64,
    pub kv_free_blocks: u64,
    pub kv_used_blocks: u64,
    pub kv_cached_blocks: u64,
    pub kv_prefix_hit_tokens: u64,
    pub target_kv_bytes_per_token: u64,
    pub draft_kv_bytes_per_token: u64,
    /// Bumped by every applied draft swap.
    pub draft_generation: u64,
    /// Whether a drafter (model or n-gram) is installed.
    pub has_drafter: bool,
}

/// Failure-containment counters (`specmla_engine_health`). Versioned: the caller sets
/// `struct_size` to sizeof(specmla_health) as it compiled it; fields past it are not written.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Health {
    /// sizeof(specmla_health) as the caller compiled it (set it before the call).
    pub struct_size: usize,
    /// Panics inside a step that were contained; each failed at most the request causing it.
    pub panics_contained: u64,
    /// KV block references given back after contained panics (requests dropped mid-step).
    pub kv_blocks_reclaimed: u64,
    /// Panics inside the drafter; each switched drafting off (outputs unchanged).
    pub drafter_panics: u64,
    /// Drafting is off after a drafter panic, until a swap installs a new drafter.
    pub drafter_disabled: bool,
}

/// Why a request finished (NONE: it has not).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    SPECMLA_FINISH_NONE = 0,
    /// End-of-sequence or a stop token id.
    SPECMLA_FINISH_STOP = 1,
    /// A stop string matched.
    SPECMLA_FINISH_STOP_STRING = 2,
    /// max_tokens reached.
    SPECMLA_FINISH_LENGTH = 3,
    SPECMLA_FINISH_CANCELLED = 4,
    /// The engine could not serve it; `error` says why.
    SPECMLA_FINISH_ERROR = 5,
}

/// State of a draft swap ticket.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapState {
    /// Loading / validating, or waiting for the next step to install it.
    SPECMLA_SWAP_PENDING = 0,
    /// Installed (generation given).
    SPECMLA_SWAP_APPLIED = 1,
    /// Refused; the previous drafter keeps serving. The reason is the thread's last error.
    SPECMLA_SWAP_FAILED = 2,
    /// No such ticket.
    SPECMLA_SWAP_UNKNOWN = 3,
}

/// What one step produced for one request. All pointers point into the owning
/// `specmla_step_result` and are valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub request_id: u64,
    /// Newly committed token ids (NULL when n_tokens is 0).
    pub tokens: *const u32,
    pub n_tokens: usize,
    /// Target log-probs of those tokens (NULL unless the request asked for them).
    pub logprobs: *const f32,
    /// New UTF-8 text, NUL-terminated (never NULL; "" without a tokenizer).
    pub text: *const c_char,
    /// Bytes of text (without the NUL).
    pub text_len: usize,
    /// SPECMLA_FINISH_NONE unless this is the request's last event.
    pub finish_reason: FinishReason,
    /// NUL-terminated message when finish_reason is ERROR, else NULL.
    pub error: *const c_char,
}

/// Events of one step. Library-owned: free with `specmla_step_result_free`.
#[repr(C)]
#[derive(Debug)]
pub struct StepResult {
    pub events: *const Event,
    pub n_events: usize,
}

pub(crate) fn engine_defaults() -> EngineParams {
    EngineParams {
        struct_size: std::mem::size_of::<EngineParams>(),
        num_draft_tokens: 4,
        adaptive: false,
        ngram_min_n: 0,
        ngram_max_n: 0,
        kv_num_blocks: 2048,
        draft_kv_num_blocks: 2048,
        block_size: 16,
        kv_dtype: SPECMLA_KV_AUTO,
        draft_kv_dtype: SPECMLA_KV_AUTO,
        threads: 0,
        max_batch_tokens: 512,
        max_running: 64,
        prefix_cache: true,
        mtp: false,
        isa: SPECMLA_ISA_AUTO,
        index_kv_dtype: SPECMLA_KV_AUTO,
        kv_window_blocks: 0,
        kv_offload_dir: std::ptr::null(),
        kv_offload_mem_bytes: 0,
        device: std::ptr::null(),
        draft_p_min: crate::engine::DEFAULT_DRAFT_P_MIN,
        huge_page_weights: false,
    }
}

pub(crate) fn request_defaults() -> RequestParams {
    RequestParams {
        struct_size: std::mem::size_of::<RequestParams>(),
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        max_tokens: 256,
        ignore_eos: false,
        stop_token_ids: std::ptr::null(),
        n_stop_token_ids: 0,
        stop_strings: std::ptr::null(),
        n_stop_strings: 0,
        reasoning_budget: -1,
        think_start: std::ptr::null(),
        n_think_start: 0,
        think_end: std::ptr::null(),
        n_think_end: 0,
        speculate: true,
        logprobs: false,
        label: std::ptr::null(),
        draft_arm: -1,
    }
}

pub(crate) fn draft_source_defaults() -> DraftSource {
    DraftSource {
        struct_size: std::mem::size_of::<DraftSource>(),
        kind: SPECMLA_DRAFT_NONE,
        path: std::ptr::null(),
        bytes: std::ptr::null(),
        n_bytes: 0,
        ngram_min_n: 1,
        ngram_max_n: 3,
        guard_min_drafts: 0,
        guard_threshold: 0.0,
        guard_relative: false,
        ab_a: std::ptr::null(),
        ab_b: std::ptr::null(),
        ab_ratio_b: 0.5,
    }
}

/// Read a caller's params struct honouring its `struct_size` (first field, a `usize`).
///
/// # Safety
/// `p` must be NULL or point to at least `struct_size` readable bytes.
pub(crate) unsafe fn read_params<T: Copy>(p: *const T, defaults: T, what: &str) -> FfiResult<T> {
    if p.is_null() {
        return Ok(defaults);
    }
    // SAFETY: `p` is non-NULL and points to a struct whose first field is a usize.
    let declared = unsafe { std::ptr::read_unaligned(p as *const usize) };
    if declared < std::mem::size_of::<usize>() {
        return Err(FfiError::invalid(format!(
            "{what}.struct_size is {declared}: set it to sizeof({what}) (use the *_default* function)"
        )));
    }
    let n = declared.min(std::mem::size_of::<T>());
    let mut out = defaults;
    // SAFETY: both regions hold at least `n` bytes; `T: Copy` has no drop glue.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, &mut out as *mut T as *mut u8, n) };
    Ok(out)
}

fn kv_dtype(code: u32, auto: KvDtype, field: &str) -> FfiResult<KvDtype> {
    Ok(match code {
        SPECMLA_KV_AUTO => auto,
        SPECMLA_KV_F32 => KvDtype::F32,
        SPECMLA_KV_BF16 => KvDtype::Bf16,
        SPECMLA_KV_F16 => KvDtype::F16,
        SPECMLA_KV_FP8_E4M3 => KvDtype::Fp8E4M3,
        other => {
            return Err(FfiError::invalid(format!(
                "{field}: unknown KV dtype code {other}"
            )))
        }
    })
}

/// Validate engine params and turn them into an engine config.
pub(crate) fn engine_config(p: &EngineParams) -> FfiResult<EngineConfig> {
    let k = p.num_draft_tokens as usize;
    if k == 0 || k > SPECMLA_MAX_DRAFT_POSITIONS {
        return Err(FfiError::invalid(format!(
            "num_draft_tokens must be in 1..={SPECMLA_MAX_DRAFT_POSITIONS}, got {k}"
        )));
    }
    for (name, v) in [
        ("kv_num_blocks", p.kv_num_blocks),
        ("draft_kv_num_blocks", p.draft_kv_num_blocks),
        ("block_size", p.block_size),
        ("max_batch_tokens", p.max_batch_tokens),
        ("max_running", p.max_running),
    ] {
        if v == 0 {
            return Err(FfiError::invalid(format!("{name} must be > 0")));
        }
    }
    crate::engine::check_draft_p_min(p.draft_p_min)?;
    let kv = kv_dtype(p.kv_dtype, KvDtype::F32, "kv_dtype")?;
    let draft_kv = kv_dtype(p.draft_kv_dtype, kv, "draft_kv_dtype")?;
    let index_kv = kv_dtype(p.index_kv_dtype, kv, "index_kv_dtype")?;
    let isa = match p.isa {
        SPECMLA_ISA_AUTO => None,
        SPECMLA_ISA_PORTABLE => Some(IsaLevel::Portable),
        SPECMLA_ISA_AVX2 => Some(IsaLevel::Avx2),
        SPECMLA_ISA_AVX512 => Some(IsaLevel::Avx512),
        SPECMLA_ISA_AMX => Some(IsaLevel::Amx),
        SPECMLA_ISA_AVX512BF16 => Some(IsaLevel::Avx512Bf16),
        SPECMLA_ISA_EXACT => Some(IsaLevel::best_exact()),
        other => {
            return Err(FfiError::invalid(format!(
                "isa: unknown SPECMLA_ISA_* value {other}"
            )))
        }
    };
    Ok(EngineConfig {
        threads: p.threads as usize,
        kv_dtype: kv,
        draft_kv_dtype: Some(draft_kv),
        index_kv_dtype: Some(index_kv),
        block_size: p.block_size as usize,
        num_blocks: p.kv_num_blocks as usize,
        draft_num_blocks: p.draft_kv_num_blocks as usize,
        kv_window_blocks: (p.kv_window_blocks > 0).then_some(p.kv_window_blocks as usize),
        max_batch_tokens: p.max_batch_tokens as usize,
        max_running: p.max_running as usize,
        prefix_cache: p.prefix_cache,
        spec: if p.adaptive {
            SpecMode::Adaptive { k_max: k }
        } else {
            SpecMode::Fixed(k)
        },
        draft_p_min: p.draft_p_min,
        isa,
        kv_offload: if p.kv_offload_dir.is_null() && p.kv_offload_mem_bytes == 0 {
            None
        } else {
            Some(crate::kv::TierConfig {
                mem_bytes: usize::try_from(p.kv_offload_mem_bytes).unwrap_or(usize::MAX),
                dir: if p.kv_offload_dir.is_null() {
                    None
                } else {
                    // SAFETY: a non-NULL path is NUL-terminated per the contract.
                    Some(unsafe { super::text::cstr(p.kv_offload_dir, "kv_offload_dir") }?.into())
                },
                ..Default::default()
            })
        },
        device: if p.device.is_null() {
            crate::backend::Device::Cpu
        } else {
            // SAFETY: a non-NULL device is NUL-terminated per the contract.
            let d = unsafe { super::text::cstr(p.device, "device") }?;
            crate::backend::Device::parse(d).map_err(|e| FfiError::invalid(e.to_string()))?
        },
        huge_page_weights: p.huge_page_weights,
    })
}

impl From<&Counters> for CCounters {
    fn from(c: &Counters) -> Self {
        let mut out = CCounters {
            prompt_tokens: c.prompt_tokens,
            cached_prompt_tokens: c.cached_prompt_tokens,
            reasoning_tokens: c.reasoning_tokens,
            answer_tokens: c.answer_tokens,
            drafted_tokens: c.drafted_tokens,
            accepted_tokens: c.accepted_tokens,
            recovered_tokens: c.recovered_tokens,
            bonus_tokens: c.bonus_tokens,
            forced_end_of_think: c.forced_end_of_think,
            forced_tokens: c.forced_tokens,
            draft_steps: c.draft_steps,
            draft_tokens_saved: c.draft_tokens_saved,
            preemptions: c.preemptions,
            mean_acceptance_length: c.mean_acceptance_length(),
            ..Default::default()
        };
        // Creation caps num_draft_tokens at SPECMLA_MAX_DRAFT_POSITIONS, so nothing is dropped here.
        let n = c
            .accepted_per_position
            .len()
            .max(c.drafted_per_position.len())
            .min(SPECMLA_MAX_DRAFT_POSITIONS);
        out.n_positions = n as u32;
        for i in 0..n {
            out.accepted_per_position[i] = c.accepted_per_position.get(i).copied().unwrap_or(0);
            out.drafted_per_position[i] = c.drafted_per_position.get(i).copied().unwrap_or(0);
        }
        out
    }
}

impl From<&crate::engine::FinishReason> for FinishReason {
    fn from(f: &crate::engine::FinishReason) -> Self {
        use crate::engine::FinishReason as F;
        match f {
            F::Stop => FinishReason::SPECMLA_FINISH_STOP,
            F::StopString => FinishReason::SPECMLA_FINISH_STOP_STRING,
            F::Length => FinishReason::SPECMLA_FINISH_LENGTH,
            F::Cancelled => FinishReason::SPECMLA_FINISH_CANCELLED,
            F::Error(_) => FinishReason::SPECMLA_FINISH_ERROR,
        }
    }
}

//! Engine exports: create / free, submit, step (library-owned result), cancel, draft swaps,
//! counters and stats. Each function documents its thread-safety; the short version: every call
//! may run on any thread at any time; `step` calls are serialised, `stats` waits for a running
//! step, everything else never waits for one.

use std::ffi::{c_char, CString};
use std::path::PathBuf;

use super::handle::{self, EngineHandle, StepStorage};
use super::text::{cstr, out_ptr, slice};
use super::types::*;
use super::{call, guard, log, FfiError, Status, SPECMLA_LOG_INFO, SPECMLA_LOG_WARN};
use crate::engine::{DraftSource as RsDraft, Engine, Prompt, Request, SwapStatus};
use crate::sampling::SamplingParams;

/// Default engine params (struct_size filled in). Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_engine_default_params() -> EngineParams {
    guard(engine_defaults(), engine_defaults)
}

/// Default request params: greedy, 256 tokens, no budget, speculation on. Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_request_default_params() -> RequestParams {
    guard(request_defaults(), request_defaults)
}

/// Default draft source (kind NONE, n-gram range 1..3). Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_draft_source_default() -> DraftSource {
    guard(draft_source_defaults(), draft_source_defaults)
}

/// Load `target_dir` (config.json + safetensors [+ tokenizer.json]) and, when `draft_dir` is not
/// NULL, a draft model directory (else the target's MTP layer if `params->mtp`, else an n-gram
/// drafter if `params->ngram_max_n > 0`, else no speculation). `params` may be NULL (defaults).
/// On success `*out_engine` receives a handle the
/// caller owns and must release with `specmla_engine_free`. Thread-safe.
///
/// # Safety
/// Strings must be NUL-terminated; `params` NULL or a valid struct; `out_engine` writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_create(
    target_dir: *const c_char,
    draft_dir: *const c_char,
    params: *const EngineParams,
    out_engine: *mut *mut EngineHandle,
) -> Status {
    call(|| {
        let out = out_ptr(out_engine, "out_engine")?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { *out = std::ptr::null_mut() };
        let target = PathBuf::from(unsafe { cstr(target_dir, "target_dir") }?);
        // SAFETY: per the contract.
        let p = unsafe { read_params(params, engine_defaults(), "specmla_engine_params") }?;
        let cfg = engine_config(&p)?;
        let draft = if draft_dir.is_null() {
            if p.mtp {
                RsDraft::Mtp
            } else if p.ngram_max_n > 0 {
                RsDraft::Ngram {
                    min_n: p.ngram_min_n.max(1) as usize,
                    max_n: p.ngram_max_n as usize,
                }
            } else {
                RsDraft::None
            }
        } else {
            RsDraft::Dir(PathBuf::from(unsafe { cstr(draft_dir, "draft_dir") }?))
        };
        let desc = format!("{draft:?}");
        let engine = Engine::new(&target, draft, cfg)?;
        let h = handle::register(engine)?;
        log(
            SPECMLA_LOG_INFO,
            &format!(
                "engine {h:p} created: target {} drafter {desc}",
                target.display()
            ),
        );
        // SAFETY: checked above.
        unsafe { *out = h };
        Ok(())
    })
}

/// Release an engine. NULL is accepted (no-op, SPECMLA_OK); a freed or foreign handle returns
/// SPECMLA_ERR_INVALID_HANDLE. Unfinished requests are dropped. Safe to call while another thread
/// is inside a call on the same engine: the engine is destroyed when that call returns, and later
/// calls with the handle fail with SPECMLA_ERR_INVALID_HANDLE.
#[no_mangle]
pub extern "C" fn specmla_engine_free(engine: *mut EngineHandle) -> Status {
    call(|| {
        if engine.is_null() {
            return Ok(());
        }
        drop(handle::remove(engine)?);
        log(SPECMLA_LOG_INFO, &format!("engine {engine:p} freed"));
        Ok(())
    })
}

pub(super) fn request_from(p: &RequestParams, prompt: Prompt) -> Result<Request, FfiError> {
    if p.reasoning_budget < -1 {
        return Err(FfiError::invalid(format!(
            "reasoning_budget must be -1 (none) or >= 0, got {}",
            p.reasoning_budget
        )));
    }
    // SAFETY (all slices below): the caller guarantees pointer/count pairs are valid.
    let stop_ids =
        unsafe { slice(p.stop_token_ids, p.n_stop_token_ids, "stop_token_ids") }?.to_vec();
    let raw_stops = unsafe { slice(p.stop_strings, p.n_stop_strings, "stop_strings") }?;
    let mut stop_strings = Vec::with_capacity(raw_stops.len());
    for (i, &s) in raw_stops.iter().enumerate() {
        stop_strings.push(unsafe { cstr(s, &format!("stop_strings[{i}]")) }?.to_string());
    }
    let marker = |ptr: *const u32, n: usize, name: &str| -> Result<Option<Vec<u32>>, FfiError> {
        if ptr.is_null() && n == 0 {
            return Ok(None);
        }
        Ok(Some(unsafe { slice(ptr, n, name) }?.to_vec()))
    };
    Ok(Request {
        prompt,
        sampling: SamplingParams {
            temperature: p.temperature,
            top_k: p.top_k as usize,
            top_p: p.top_p,
            seed: p.seed,
            max_tokens: p.max_tokens as usize,
            stop_token_ids: stop_ids,
            stop_strings,
            ignore_eos: p.ignore_eos,
        },
        reasoning_budget: (p.reasoning_budget >= 0).then_some(p.reasoning_budget as usize),
        think_start: marker(p.think_start, p.n_think_start, "think_start")?,
        think_end: marker(p.think_end, p.n_think_end, "think_end")?,
        speculate: p.speculate,
        logprobs: p.logprobs,
        // SAFETY: the caller guarantees a NUL-terminated string when non-NULL.
        label: if p.label.is_null() {
            None
        } else {
            Some(unsafe { cstr(p.label, "label") }?.to_string())
        },
        draft_arm: match p.draft_arm {
            -1 => None,
            a @ (0 | 1) => Some(a as u8),
            a => {
                return Err(FfiError::invalid(format!(
                    "draft_arm must be -1, 0 or 1, got {a}"
                )))
            }
        },
        fault: None,
    })
}

/// Queue a request. The prompt is either token ids (`prompt_ids`, `n_prompt_ids` > 0, and
/// `prompt_text` NULL) or NUL-terminated UTF-8 text (`prompt_text`, `n_prompt_ids` 0; needs a
/// tokenizer). `params` may be NULL (defaults). `*out_id` receives the request id. Never waits
/// for a running step: safe to call while another thread is in `specmla_engine_step`.
///
/// # Safety
/// Pointer/count pairs must be valid; strings NUL-terminated; `out_id` writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_submit(
    engine: *mut EngineHandle,
    prompt_ids: *const u32,
    n_prompt_ids: usize,
    prompt_text: *const c_char,
    params: *const RequestParams,
    out_id: *mut u64,
) -> Status {
    call(|| {
        let h = handle::get(engine)?;
        let out = out_ptr(out_id, "out_id")?;
        let prompt = match (n_prompt_ids, prompt_text.is_null()) {
            (0, true) => {
                return Err(FfiError::invalid(
                    "no prompt: pass prompt_ids or prompt_text",
                ))
            }
            (_, false) if n_prompt_ids > 0 => {
                return Err(FfiError::invalid(
                    "pass prompt_ids or prompt_text, not both",
                ))
            }
            (0, false) => Prompt::Text(unsafe { cstr(prompt_text, "prompt_text") }?.to_string()),
            (n, _) => Prompt::Tokens(unsafe { slice(prompt_ids, n, "prompt_ids") }?.to_vec()),
        };
        let p = unsafe { read_params(params, request_defaults(), "specmla_request_params") }?;
        let req = request_from(&p, prompt)?;
        let id = h.engine.submit(req)?;
        // SAFETY: checked non-NULL.
        unsafe { *out = id };
        Ok(())
    })
}

/// Run one engine step (admit queued requests, one batched speculative round, commit) and hand
/// back its events in `*out_result` (library-owned; free it with `specmla_step_result_free`;
/// `n_events` may be 0). Steps on one engine are serialised: a second thread calling step waits.
///
/// # Safety
/// `out_result` must be writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_step(
    engine: *mut EngineHandle,
    out_result: *mut *mut StepResult,
) -> Status {
    call(|| {
        let out = out_ptr(out_result, "out_result")?;
        unsafe { *out = std::ptr::null_mut() };
        let h = handle::get(engine)?;
        let events = h.engine.step()?;
        let mut st = Box::new(StepStorage {
            public: StepResult {
                events: std::ptr::null(),
                n_events: 0,
            },
            events: Vec::with_capacity(events.len()),
            tokens: Vec::with_capacity(events.len()),
            logprobs: Vec::with_capacity(events.len()),
            texts: Vec::with_capacity(events.len()),
            errors: Vec::new(),
        });
        for ev in events {
            let text = CString::new(ev.text.replace('\0', "\u{FFFD}")).unwrap_or_default();
            let mut error = std::ptr::null();
            if let Some(crate::engine::FinishReason::Error(m)) = &ev.finish {
                log(SPECMLA_LOG_WARN, &format!("request {} failed: {m}", ev.id));
                st.errors
                    .push(CString::new(m.replace('\0', " ")).unwrap_or_default());
                error = st.errors.last().map_or(std::ptr::null(), |c| c.as_ptr());
            }
            let n_tokens = ev.tokens.len();
            let tokens = if n_tokens == 0 {
                std::ptr::null()
            } else {
                ev.tokens.as_ptr()
            };
            let logprobs = if ev.logprobs.is_empty() {
                std::ptr::null()
            } else {
                ev.logprobs.as_ptr()
            };
            st.events.push(Event {
                request_id: ev.id,
                tokens,
                n_tokens,
                logprobs,
                text: text.as_ptr(),
                text_len: text.as_bytes().len(),
                finish_reason: ev
                    .finish
                    .as_ref()
                    .map_or(FinishReason::SPECMLA_FINISH_NONE, Into::into),
                error,
            });
            // Moving a Vec / CString keeps its heap buffer, so the pointers above stay valid.
            st.tokens.push(ev.tokens);
            st.logprobs.push(ev.logprobs);
            st.texts.push(text);
        }
        st.public = StepResult {
            events: st.events.as_ptr(),
            n_events: st.events.len(),
        };
        let r = handle::publish_result(st)?;
        unsafe { *out = r };
        Ok(())
    })
}

/// Free a step result. NULL is accepted; a freed or foreign pointer returns
/// SPECMLA_ERR_INVALID_HANDLE. Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_step_result_free(result: *mut StepResult) -> Status {
    call(|| {
        if result.is_null() {
            return Ok(());
        }
        drop(handle::reclaim_result(result)?);
        Ok(())
    })
}

/// `*out_has_work` = whether any request is queued or running. Never waits for a step.
///
/// # Safety
/// `out_has_work` must be writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_has_work(
    engine: *mut EngineHandle,
    out_has_work: *mut bool,
) -> Status {
    call(|| {
        let out = out_ptr(out_has_work, "out_has_work")?;
        let h = handle::get(engine)?;
        unsafe { *out = h.engine.has_work() };
        Ok(())
    })
}

/// Cancel a queued or running request; its final event (finish CANCELLED) comes from the next
/// step. Unknown / finished ids return SPECMLA_ERR_UNKNOWN_REQUEST. Never waits for a step.
#[no_mangle]
pub extern "C" fn specmla_engine_cancel(engine: *mut EngineHandle, request_id: u64) -> Status {
    call(|| {
        let h = handle::get(engine)?;
        h.engine.cancel(request_id)?;
        Ok(())
    })
}

pub(super) fn draft_from(s: &DraftSource) -> Result<RsDraft, FfiError> {
    Ok(match s.kind {
        SPECMLA_DRAFT_NONE => RsDraft::None,
        SPECMLA_DRAFT_NGRAM => RsDraft::Ngram {
            min_n: s.ngram_min_n as usize,
            max_n: s.ngram_max_n as usize,
        },
        SPECMLA_DRAFT_PATH => {
            let p = PathBuf::from(unsafe { cstr(s.path, "path") }?);
            if p.is_dir() {
                RsDraft::Dir(p)
            } else {
                RsDraft::File(p)
            }
        }
        SPECMLA_DRAFT_BYTES => {
            if s.n_bytes == 0 {
                return Err(FfiError::invalid("bytes: n_bytes is 0"));
            }
            RsDraft::Bytes(unsafe { slice(s.bytes, s.n_bytes, "bytes") }?.to_vec())
        }
        SPECMLA_DRAFT_MTP => RsDraft::Mtp,
        SPECMLA_DRAFT_AB => {
            let arm = |p: *const DraftSource, name: &str| -> Result<RsDraft, FfiError> {
                if p.is_null() {
                    return Err(FfiError::null(name));
                }
                // SAFETY: a non-NULL arm points to a valid struct per the contract.
                let a = unsafe { read_params(p, draft_source_defaults(), name) }?;
                if a.kind == SPECMLA_DRAFT_AB {
                    return Err(FfiError::invalid(format!("{name} is itself an A/B source")));
                }
                draft_from(&a)
            };
            if !(0.0..=1.0).contains(&s.ab_ratio_b) {
                return Err(FfiError::invalid(format!(
                    "ab_ratio_b must be in [0, 1], got {}",
                    s.ab_ratio_b
                )));
            }
            RsDraft::Ab {
                a: Box::new(arm(s.ab_a, "ab_a")?),
                b: Box::new(arm(s.ab_b, "ab_b")?),
                ratio_b: s.ab_ratio_b,
            }
        }
        k => return Err(FfiError::invalid(format!("unknown draft source kind {k}"))),
    })
}

/// Replace the drafter while the engine serves; the swap lands between two steps (the running
/// requests continue, greedy output is unchanged). With `wait` true the weights are loaded and
/// validated on the calling thread and bad weights return an error here (SPECMLA_ERR_DRAFT /
/// _IO / _MODEL / _CONFIG; the old drafter keeps serving). With `wait` false this returns at once
/// and a background thread loads them; poll `specmla_engine_swap_status`. Either way
/// `*out_ticket` (may be NULL) receives the swap's ticket. Never waits for a running step.
///
/// # Safety
/// `source` must point to a valid struct; `out_ticket` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_set_draft_weights(
    engine: *mut EngineHandle,
    source: *const DraftSource,
    wait: bool,
    out_ticket: *mut u64,
) -> Status {
    call(|| {
        let h = handle::get(engine)?;
        if source.is_null() {
            return Err(FfiError::null("source"));
        }
        let s = unsafe { read_params(source, draft_source_defaults(), "specmla_draft_source") }?;
        let src = draft_from(&s)?;
        log(
            SPECMLA_LOG_INFO,
            &format!("engine {engine:p}: draft swap requested ({src:?}, wait={wait})"),
        );
        let guard = (s.guard_min_drafts > 0).then_some(crate::engine::SwapGuard {
            min_drafts: s.guard_min_drafts,
            threshold: if s.guard_relative {
                crate::engine::GuardThreshold::Relative(s.guard_threshold)
            } else {
                crate::engine::GuardThreshold::Absolute(s.guard_threshold)
            },
        });
        let ticket = if let Some(g) = guard {
            if wait && !matches!(src, RsDraft::None) {
                h.engine.set_draft_weights_blocking_guarded(src, g)?
            } else {
                h.engine.set_draft_weights_guarded(src, g)?
            }
        } else if wait && !matches!(src, RsDraft::None) {
            h.engine.set_draft_weights_blocking(src).inspect_err(|e| {
                log(
                    SPECMLA_LOG_WARN,
                    &format!("engine {engine:p}: draft swap refused: {e}"),
                );
            })?
        } else {
            h.engine.set_draft_weights(src)
        };
        if !out_ticket.is_null() {
            unsafe { *out_ticket = ticket };
        }
        Ok(())
    })
}

/// State of a swap ticket in `*out_state`; `*out_generation` (may be NULL) gets the draft
/// generation when APPLIED (else 0). When FAILED the call still returns SPECMLA_OK and the reason
/// is stored as this thread's last error. Never waits for a step.
///
/// # Safety
/// `out_state` writable; `out_generation` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_swap_status(
    engine: *mut EngineHandle,
    ticket: u64,
    out_state: *mut SwapState,
    out_generation: *mut u64,
) -> Status {
    call(|| {
        let out = out_ptr(out_state, "out_state")?;
        let h = handle::get(engine)?;
        let (state, gen) = match h.engine.swap_status(ticket) {
            SwapStatus::Pending => (SwapState::SPECMLA_SWAP_PENDING, 0),
            SwapStatus::Applied { generation } => (SwapState::SPECMLA_SWAP_APPLIED, generation),
            SwapStatus::Failed(m) => {
                super::set_last_error(&m);
                (SwapState::SPECMLA_SWAP_FAILED, 0)
            }
            SwapStatus::Unknown => (SwapState::SPECMLA_SWAP_UNKNOWN, 0),
            SwapStatus::RolledBack { generation, reason } => {
                // a failure whose reason (specmla_last_error) says it was rolled back; the
                // generation is the one the previous drafter serves from again
                super::set_last_error(&format!("rolled back by the acceptance guard: {reason}"));
                (SwapState::SPECMLA_SWAP_FAILED, generation)
            }
        };
        unsafe { *out = state };
        if !out_generation.is_null() {
            unsafe { *out_generation = gen };
        }
        Ok(())
    })
}

/// Copy a request's counters (queued, running or finished) into `*out`. Counters are published
/// at the end of each step. Unknown ids return SPECMLA_ERR_UNKNOWN_REQUEST. Never waits for a step.
///
/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_request_counters(
    engine: *mut EngineHandle,
    request_id: u64,
    out: *mut CCounters,
) -> Status {
    call(|| {
        let o = out_ptr(out, "out")?;
        let h = handle::get(engine)?;
        let c = h.engine.request_counters(request_id)?;
        unsafe { *o = CCounters::from(&c) };
        Ok(())
    })
}

/// Failure-containment counters into `*out` (`out->struct_size` must be set to
/// sizeof(specmla_health); only that many bytes are written, so older callers stay valid).
/// Waits for a running step to finish.
///
/// # Safety
/// `out` must point to at least `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_health(
    engine: *mut EngineHandle,
    out: *mut Health,
) -> Status {
    call(|| {
        let o = out_ptr(out, "out")?;
        // SAFETY: `o` is non-NULL; its first field is the caller's struct_size.
        let declared = unsafe { std::ptr::read_unaligned(o as *const usize) };
        if declared < std::mem::size_of::<usize>() {
            return Err(FfiError::invalid(format!(
                "out->struct_size {declared} is too small (set it to sizeof(specmla_health))"
            )));
        }
        let h = handle::get(engine)?;
        let s = h.engine.stats();
        let v = Health {
            struct_size: std::mem::size_of::<Health>().min(declared),
            panics_contained: s.panics_contained,
            kv_blocks_reclaimed: s.kv_blocks_reclaimed,
            drafter_panics: s.drafter_panics,
            drafter_disabled: s.drafter_disabled.is_some(),
        };
        let n = declared.min(std::mem::size_of::<Health>());
        // SAFETY: the caller guarantees `declared` writable bytes; we write at most that many.
        unsafe { std::ptr::copy_nonoverlapping(&v as *const Health as *const u8, o as *mut u8, n) };
        Ok(())
    })
}

/// The engine's metrics in the Prometheus text exposition format (counters per workload label
/// and draft generation, latency histograms, KV blocks, swaps; see README "Operating") as UTF-8
/// into `buf` (capacity `len` bytes, NUL-terminated). `*needed` always receives the bytes the
/// text takes including the NUL; when that exceeds `len` nothing is written and
/// SPECMLA_ERR_BUFFER_TOO_SMALL is returned (`buf` may be NULL when `len` is 0). Waits for a
/// running step to finish.
///
/// # Safety
/// `buf` writable for `len` bytes; `needed` writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_metrics(
    engine: *mut EngineHandle,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> Status {
    call(|| {
        let need_out = out_ptr(needed, "needed")?;
        let h = handle::get(engine)?;
        let text = h.engine.metrics_text();
        let need = text.len() + 1;
        // SAFETY: checked non-NULL above; the caller guarantees it is writable.
        unsafe { *need_out = need };
        if need > len {
            return Err(FfiError::new(
                Status::SPECMLA_ERR_BUFFER_TOO_SMALL,
                format!("metrics buffer holds {len}, {need} needed (the needed size was written to `needed`)"),
            ));
        }
        let b = out_ptr(buf, "buf")?;
        // SAFETY: `need <= len` writable bytes per the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), b as *mut u8, text.len());
            *b.add(text.len()) = 0;
        }
        Ok(())
    })
}

/// Engine-wide statistics into `*out`. Waits for a running step to finish.
///
/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_engine_stats(
    engine: *mut EngineHandle,
    out: *mut Stats,
) -> Status {
    call(|| {
        let o = out_ptr(out, "out")?;
        let h = handle::get(engine)?;
        let s = h.engine.stats();
        let st = Stats {
            steps: s.steps,
            running: s.running as u64,
            waiting: s.waiting as u64,
            totals: CCounters::from(&s.totals),
            time_target_forward_s: s.time_target_forward_s,
            time_draft_s: s.time_draft_s,
            kv_num_blocks: s.kv.num_blocks as u64,
            kv_free_blocks: s.kv.free_blocks as u64,
            kv_used_blocks: s.kv.used_blocks as u64,
            kv_cached_blocks: s.kv.cached_blocks as u64,
            kv_prefix_hit_tokens: s.kv.prefix_hit_tokens,
            target_kv_bytes_per_token: s.target_kv_bytes_per_token as u64,
            draft_kv_bytes_per_token: s.draft_kv_bytes_per_token as u64,
            draft_generation: s.draft_generation,
            has_drafter: s.drafter != "none",
        };
        unsafe { *o = st };
        Ok(())
    })
}

//! Handle registries: which engine handles and step results are live. A handle given to C is the
//! address of the `Arc`-owned [`EngineHandle`]; every call looks the address up in the registry
//! (never dereferencing what C passed) and works on a cloned `Arc`, so a NULL, freed or foreign
//! handle is an error rather than undefined behaviour, and `specmla_engine_free` racing with a
//! call on another thread only drops the engine once that call returns.
//!
//! Limit: after an engine is really dropped its address may be reused by a later engine, so a
//! stale handle can alias a newer engine; such misuse is detected only until the address is reused.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use super::{FfiError, FfiResult, Status, StepResult};
use crate::engine::Engine;

/// An engine as C sees it: an opaque pointer.
pub struct EngineHandle {
    pub(crate) engine: Engine,
}

static ENGINES: LazyLock<Mutex<HashMap<usize, Arc<EngineHandle>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static RESULTS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

fn poisoned() -> FfiError {
    FfiError::new(Status::SPECMLA_ERR_ENGINE, "handle registry lock poisoned")
}

/// Register a new engine; returns the pointer C will hold.
pub(crate) fn register(engine: Engine) -> FfiResult<*mut EngineHandle> {
    let h = Arc::new(EngineHandle { engine });
    let ptr = Arc::as_ptr(&h) as *mut EngineHandle;
    ENGINES
        .lock()
        .map_err(|_| poisoned())?
        .insert(ptr as usize, h);
    Ok(ptr)
}

/// Look up a live engine.
pub(crate) fn get(ptr: *const EngineHandle) -> FfiResult<Arc<EngineHandle>> {
    if ptr.is_null() {
        return Err(FfiError::new(
            Status::SPECMLA_ERR_INVALID_HANDLE,
            "engine handle is NULL",
        ));
    }
    ENGINES
        .lock()
        .map_err(|_| poisoned())?
        .get(&(ptr as usize))
        .cloned()
        .ok_or_else(|| {
            FfiError::new(
                Status::SPECMLA_ERR_INVALID_HANDLE,
                format!(
                    "engine handle {ptr:p} is not live (freed, or not from specmla_engine_create)"
                ),
            )
        })
}

/// Unregister an engine; it is dropped when the last in-flight call on it returns.
pub(crate) fn remove(ptr: *const EngineHandle) -> FfiResult<Arc<EngineHandle>> {
    ENGINES.lock().map_err(|_| poisoned())?.remove(&(ptr as usize)).ok_or_else(|| {
        FfiError::new(
            Status::SPECMLA_ERR_INVALID_HANDLE,
            format!("engine handle {ptr:p} is not live (double free, or not from specmla_engine_create)"),
        )
    })
}

/// Owner of a step result's memory; `public` must stay the first field (C holds its address).
#[repr(C)]
pub(crate) struct StepStorage {
    pub public: StepResult,
    pub events: Vec<super::Event>,
    pub tokens: Vec<Vec<u32>>,
    pub logprobs: Vec<Vec<f32>>,
    pub texts: Vec<std::ffi::CString>,
    pub errors: Vec<std::ffi::CString>,
}

/// Hand a step result to C.
pub(crate) fn publish_result(storage: Box<StepStorage>) -> FfiResult<*mut StepResult> {
    let ptr = Box::into_raw(storage);
    match RESULTS.lock() {
        Ok(mut set) => {
            set.insert(ptr as usize);
            Ok(ptr as *mut StepResult)
        }
        Err(_) => {
            // SAFETY: `ptr` came from Box::into_raw just above and was never shared.
            drop(unsafe { Box::from_raw(ptr) });
            Err(poisoned())
        }
    }
}

/// Take back a step result from C (fails if it is not live).
pub(crate) fn reclaim_result(ptr: *mut StepResult) -> FfiResult<Box<StepStorage>> {
    if !RESULTS
        .lock()
        .map_err(|_| poisoned())?
        .remove(&(ptr as usize))
    {
        return Err(FfiError::new(
            Status::SPECMLA_ERR_INVALID_HANDLE,
            format!(
                "step result {ptr:p} is not live (double free, or not from specmla_engine_step)"
            ),
        ));
    }
    // SAFETY: the registry only holds addresses produced by `publish_result` (Box::into_raw of a
    // StepStorage whose first field is the StepResult), each removed exactly once.
    Ok(unsafe { Box::from_raw(ptr as *mut StepStorage) })
}

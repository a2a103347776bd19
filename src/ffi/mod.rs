//! The C ABI (`libspecmla.so`, header `include/specmla.h`). It sits outside the data flow: it
//! turns C calls into calls on [`crate::engine::Engine`] and engine results into plain `repr(C)`
//! data. ALL `unsafe` code that talks to foreign callers lives in this folder; the engine knows
//! nothing of C, Go or Node.
//!
//! Guarantees (see docs/C_ABI.md for ownership and thread-safety per function):
//! - Every export runs inside [`guard`] (one `catch_unwind` wrapper): a panic never unwinds into
//!   C; it becomes `SPECMLA_ERR_PANIC` with a message.
//! - Fallible exports return a [`Status`]; on failure the calling thread's last error
//!   ([`specmla_last_error`]) says why.
//! - Engine handles are validated against a registry of live handles before use, so NULL, freed
//!   and foreign handles return `SPECMLA_ERR_INVALID_HANDLE` instead of touching memory.
//! - Caller buffers that are too small return `SPECMLA_ERR_BUFFER_TOO_SMALL` and the needed size;
//!   nothing is ever silently truncated.
//! - Params structs start with `struct_size`; older (smaller) structs are accepted, missing fields
//!   take their defaults.

mod engine;
mod handle;
#[cfg(test)]
mod tests;
mod text;
mod types;

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use crate::error::Error;

pub use engine::*;
pub use handle::EngineHandle;
pub use text::*;
pub use types::*;

/// ABI version: bumped on every incompatible change to a signature or a struct layout.
pub const SPECMLA_ABI_VERSION: u32 = 1;
/// Library version (matches the crate version).
pub const SPECMLA_VERSION_MAJOR: u32 = 0;
pub const SPECMLA_VERSION_MINOR: u32 = 1;
pub const SPECMLA_VERSION_PATCH: u32 = 0;

/// Log levels passed to the log callback.
pub const SPECMLA_LOG_ERROR: u32 = 1;
pub const SPECMLA_LOG_WARN: u32 = 2;
pub const SPECMLA_LOG_INFO: u32 = 3;
pub const SPECMLA_LOG_DEBUG: u32 = 4;

/// Result of every fallible call.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    SPECMLA_OK = 0,
    /// A value is out of range or inconsistent (message names it).
    SPECMLA_ERR_INVALID_ARGUMENT = 1,
    /// A required pointer was NULL.
    SPECMLA_ERR_NULL_POINTER = 2,
    /// The engine handle is NULL, freed or was never returned by `specmla_engine_create`
    /// (also: a step result that is not live).
    SPECMLA_ERR_INVALID_HANDLE = 3,
    /// A caller buffer is too small; the needed size was written to the size out-parameter.
    SPECMLA_ERR_BUFFER_TOO_SMALL = 4,
    /// A string argument is not valid UTF-8.
    SPECMLA_ERR_INVALID_UTF8 = 5,
    /// The request id is unknown (finished, cancelled or never submitted).
    SPECMLA_ERR_UNKNOWN_REQUEST = 6,
    /// The request is invalid (empty prompt, bad sampling value...).
    SPECMLA_ERR_INVALID_REQUEST = 7,
    /// A token id outside the vocabulary.
    SPECMLA_ERR_UNKNOWN_TOKEN = 8,
    /// A file could not be read.
    SPECMLA_ERR_IO = 9,
    /// config.json is malformed or unsupported.
    SPECMLA_ERR_CONFIG = 10,
    /// Weights are malformed (safetensors, missing or mis-shaped tensors).
    SPECMLA_ERR_MODEL = 11,
    /// tokenizer.json is malformed or encode/decode failed.
    SPECMLA_ERR_TOKENIZER = 12,
    /// The model has no tokenizer but a text feature was used.
    SPECMLA_ERR_NO_TOKENIZER = 13,
    /// The KV cache can never hold this request.
    SPECMLA_ERR_KV_EXHAUSTED = 14,
    /// Draft model problems (vocabulary mismatch, bad weights for a swap...).
    SPECMLA_ERR_DRAFT = 15,
    /// The engine is unusable (a previous step panicked, thread pool failure...).
    SPECMLA_ERR_ENGINE = 16,
    /// A panic was caught at the ABI boundary (a bug: please report it).
    SPECMLA_ERR_PANIC = 17,
}

/// A failure on its way to C: status + message.
#[derive(Debug)]
pub(crate) struct FfiError {
    pub status: Status,
    pub msg: String,
}

pub(crate) type FfiResult<T> = std::result::Result<T, FfiError>;

impl FfiError {
    pub fn new(status: Status, msg: impl Into<String>) -> Self {
        FfiError {
            status,
            msg: msg.into(),
        }
    }
    pub fn null(arg: &str) -> Self {
        FfiError::new(Status::SPECMLA_ERR_NULL_POINTER, format!("`{arg}` is NULL"))
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        FfiError::new(Status::SPECMLA_ERR_INVALID_ARGUMENT, msg)
    }
}

impl From<Error> for FfiError {
    fn from(e: Error) -> Self {
        use Status::*;
        #[allow(unreachable_patterns)]
        let status = match &e {
            Error::Io { .. } => SPECMLA_ERR_IO,
            Error::Config { .. } => SPECMLA_ERR_CONFIG,
            Error::Safetensors { .. } | Error::Tensor { .. } => SPECMLA_ERR_MODEL,
            Error::NoTokenizer(_) => SPECMLA_ERR_NO_TOKENIZER,
            Error::Tokenizer(_) => SPECMLA_ERR_TOKENIZER,
            Error::UnknownToken { .. } => SPECMLA_ERR_UNKNOWN_TOKEN,
            Error::InvalidRequest(_) => SPECMLA_ERR_INVALID_REQUEST,
            Error::UnknownRequest(_) => SPECMLA_ERR_UNKNOWN_REQUEST,
            Error::KvExhausted(_) => SPECMLA_ERR_KV_EXHAUSTED,
            Error::Draft(_) => SPECMLA_ERR_DRAFT,
            Error::InvalidArgument(_) => SPECMLA_ERR_INVALID_ARGUMENT,
            Error::Engine(_) => SPECMLA_ERR_ENGINE,
            _ => SPECMLA_ERR_ENGINE,
        };
        FfiError {
            status,
            msg: e.to_string(),
        }
    }
}

thread_local! {
    /// Message of the last failed call on this thread (NUL-terminated, owned by the library).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The one panic-catching wrapper every export runs in. `on_panic` is returned when `f` panics
/// (after recording the panic message as the thread's last error).
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg = format!("internal panic caught at the C ABI boundary: {what}");
            set_last_error(&msg);
            log(SPECMLA_LOG_ERROR, &msg);
            on_panic
        }
    }
}

/// Run a fallible export body: `Ok` -> `SPECMLA_OK`, `Err` -> its status + last error.
pub(crate) fn call(f: impl FnOnce() -> FfiResult<()>) -> Status {
    guard(Status::SPECMLA_ERR_PANIC, || match f() {
        Ok(()) => Status::SPECMLA_OK,
        Err(e) => {
            set_last_error(&e.msg);
            e.status
        }
    })
}

/// Register an engine built in Rust as a C handle (the fuzz harness builds its engine around
/// an in-memory tokenizer, then drives it through the exports like any C caller).
pub(crate) fn register_engine(engine: crate::engine::Engine) -> *mut EngineHandle {
    handle::register(engine).expect("handle registry lock")
}

/// Log sink: `level` is one of `SPECMLA_LOG_*`; `message` is valid only during the call.
pub type LogCallback =
    Option<unsafe extern "C" fn(level: u32, message: *const c_char, user_data: *mut c_void)>;

struct LogSink {
    cb: unsafe extern "C" fn(u32, *const c_char, *mut c_void),
    user: usize,
    max_level: u32,
}

static LOG: Mutex<Option<LogSink>> = Mutex::new(None);

/// Send a message to the installed log callback (if any and if `level` passes its filter).
pub(crate) fn log(level: u32, msg: &str) {
    let Ok(sink) = LOG.lock() else { return };
    if let Some(s) = sink.as_ref() {
        if level <= s.max_level {
            let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
            // SAFETY: the caller registered `cb` as a valid function; `c` outlives the call.
            unsafe { (s.cb)(level, c.as_ptr(), s.user as *mut c_void) };
        }
    }
}

/// Library version string, e.g. "0.1.0". Static storage; never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_version() -> *const c_char {
    guard(std::ptr::null(), || c"0.1.0".as_ptr())
}

/// ABI version of the loaded library; compare with `SPECMLA_ABI_VERSION`. Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_abi_version() -> u32 {
    guard(0, || SPECMLA_ABI_VERSION)
}

/// Message of the last failed call on the calling thread ("" if none). Owned by the library,
/// valid until the next failing call on this thread. Never NULL. Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn specmla_last_error() -> *const c_char {
    guard(c"".as_ptr(), || LAST_ERROR.with(|e| e.borrow().as_ptr()))
}

/// Static name of a status code (e.g. "SPECMLA_ERR_BUFFER_TOO_SMALL"; "unknown" for a value
/// that is no status). Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_status_name(status: i32) -> *const c_char {
    guard(c"unknown".as_ptr(), || status_name(status).as_ptr())
}

fn status_name(s: i32) -> &'static CStr {
    use Status::*;
    const ALL: [Status; 18] = [
        SPECMLA_OK,
        SPECMLA_ERR_INVALID_ARGUMENT,
        SPECMLA_ERR_NULL_POINTER,
        SPECMLA_ERR_INVALID_HANDLE,
        SPECMLA_ERR_BUFFER_TOO_SMALL,
        SPECMLA_ERR_INVALID_UTF8,
        SPECMLA_ERR_UNKNOWN_REQUEST,
        SPECMLA_ERR_INVALID_REQUEST,
        SPECMLA_ERR_UNKNOWN_TOKEN,
        SPECMLA_ERR_IO,
        SPECMLA_ERR_CONFIG,
        SPECMLA_ERR_MODEL,
        SPECMLA_ERR_TOKENIZER,
        SPECMLA_ERR_NO_TOKENIZER,
        SPECMLA_ERR_KV_EXHAUSTED,
        SPECMLA_ERR_DRAFT,
        SPECMLA_ERR_ENGINE,
        SPECMLA_ERR_PANIC,
    ];
    let Some(&st) = ALL.iter().find(|&&x| x as i32 == s) else {
        return c"unknown";
    };
    match st {
        SPECMLA_OK => c"SPECMLA_OK",
        SPECMLA_ERR_INVALID_ARGUMENT => c"SPECMLA_ERR_INVALID_ARGUMENT",
        SPECMLA_ERR_NULL_POINTER => c"SPECMLA_ERR_NULL_POINTER",
        SPECMLA_ERR_INVALID_HANDLE => c"SPECMLA_ERR_INVALID_HANDLE",
        SPECMLA_ERR_BUFFER_TOO_SMALL => c"SPECMLA_ERR_BUFFER_TOO_SMALL",
        SPECMLA_ERR_INVALID_UTF8 => c"SPECMLA_ERR_INVALID_UTF8",
        SPECMLA_ERR_UNKNOWN_REQUEST => c"SPECMLA_ERR_UNKNOWN_REQUEST",
        SPECMLA_ERR_INVALID_REQUEST => c"SPECMLA_ERR_INVALID_REQUEST",
        SPECMLA_ERR_UNKNOWN_TOKEN => c"SPECMLA_ERR_UNKNOWN_TOKEN",
        SPECMLA_ERR_IO => c"SPECMLA_ERR_IO",
        SPECMLA_ERR_CONFIG => c"SPECMLA_ERR_CONFIG",
        SPECMLA_ERR_MODEL => c"SPECMLA_ERR_MODEL",
        SPECMLA_ERR_TOKENIZER => c"SPECMLA_ERR_TOKENIZER",
        SPECMLA_ERR_NO_TOKENIZER => c"SPECMLA_ERR_NO_TOKENIZER",
        SPECMLA_ERR_KV_EXHAUSTED => c"SPECMLA_ERR_KV_EXHAUSTED",
        SPECMLA_ERR_DRAFT => c"SPECMLA_ERR_DRAFT",
        SPECMLA_ERR_ENGINE => c"SPECMLA_ERR_ENGINE",
        SPECMLA_ERR_PANIC => c"SPECMLA_ERR_PANIC",
    }
}

/// Install (or, with `callback` NULL, remove) the process-wide log callback. Messages with a
/// level above `max_level` are dropped. The callback may be invoked from any thread that calls
/// into the library (including background draft-loading threads' callers) and must not call
/// `specmla_set_log_callback` itself. Thread-safe.
#[no_mangle]
pub extern "C" fn specmla_set_log_callback(
    callback: LogCallback,
    user_data: *mut c_void,
    max_level: u32,
) -> Status {
    call(|| {
        let mut sink = LOG
            .lock()
            .map_err(|_| FfiError::new(Status::SPECMLA_ERR_ENGINE, "log lock poisoned"))?;
        *sink = callback.map(|cb| LogSink {
            cb,
            user: user_data as usize,
            max_level,
        });
        Ok(())
    })
}

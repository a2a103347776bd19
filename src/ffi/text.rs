//! Tokenizer exports (`specmla_tokenize`, `specmla_detokenize`) with caller-provided buffers, and
//! the checked readers every export uses for C strings, arrays and out-pointers (NULL ->
//! SPECMLA_ERR_NULL_POINTER, bad UTF-8 -> SPECMLA_ERR_INVALID_UTF8).

use std::ffi::{c_char, CStr};

use super::handle::{self, EngineHandle};
use super::{call, FfiError, FfiResult, Status};

/// Borrow a NUL-terminated UTF-8 string.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string that outlives the returned borrow.
pub(crate) unsafe fn cstr<'a>(p: *const c_char, name: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(FfiError::null(name));
    }
    // SAFETY: non-NULL and NUL-terminated per the contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|e| {
        FfiError::new(
            Status::SPECMLA_ERR_INVALID_UTF8,
            format!("`{name}` is not valid UTF-8: {e}"),
        )
    })
}

/// Borrow `n` elements at `p` (`p` may be NULL only when `n` is 0).
///
/// # Safety
/// `p` must point to `n` readable, initialised elements when `n > 0`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, name: &str) -> FfiResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(FfiError::new(
            Status::SPECMLA_ERR_NULL_POINTER,
            format!("`{name}` is NULL but its count is {n}"),
        ));
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Check an out-pointer.
pub(crate) fn out_ptr<T>(p: *mut T, name: &str) -> FfiResult<*mut T> {
    if p.is_null() {
        Err(FfiError::null(name))
    } else {
        Ok(p)
    }
}

fn too_small(what: &str, need: usize, cap: usize) -> FfiError {
    FfiError::new(
        Status::SPECMLA_ERR_BUFFER_TOO_SMALL,
        format!("{what} buffer holds {cap}, {need} needed (the needed size was written to the size out-parameter)"),
    )
}

/// Encode NUL-terminated UTF-8 `text` with the engine's tokenizer into `out_ids` (capacity
/// `capacity` ids). `*out_n` always receives the number of ids the text encodes to; when that
/// exceeds `capacity` nothing is written to `out_ids` and SPECMLA_ERR_BUFFER_TOO_SMALL is
/// returned (call again with a bigger buffer; `out_ids` may be NULL when `capacity` is 0).
/// Special tokens written in the text (e.g. `<think>`) become their ids. Never waits for a step.
///
/// # Safety
/// `text` NUL-terminated; `out_ids` writable for `capacity` ids; `out_n` writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_tokenize(
    engine: *mut EngineHandle,
    text: *const c_char,
    add_special_tokens: bool,
    out_ids: *mut u32,
    capacity: usize,
    out_n: *mut usize,
) -> Status {
    call(|| {
        let n_out = out_ptr(out_n, "out_n")?;
        let h = handle::get(engine)?;
        let s = unsafe { cstr(text, "text") }?;
        let tok = h
            .engine
            .tokenizer()
            .ok_or_else(|| crate::Error::NoTokenizer("the model has no tokenizer.json".into()))?;
        let ids = tok.encode(s, add_special_tokens)?;
        unsafe { *n_out = ids.len() };
        if ids.len() > capacity {
            return Err(too_small("ids", ids.len(), capacity));
        }
        if !ids.is_empty() {
            let dst = out_ptr(out_ids, "out_ids")?;
            // SAFETY: `dst` holds `capacity >= ids.len()` ids per the contract.
            unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), dst, ids.len()) };
        }
        Ok(())
    })
}

/// Decode `n_ids` token ids into NUL-terminated UTF-8 in `out_text` (capacity `capacity` bytes
/// including the NUL). `*out_len` always receives the text length in bytes WITHOUT the NUL; when
/// `capacity < *out_len + 1` nothing is written and SPECMLA_ERR_BUFFER_TOO_SMALL is returned.
/// Unknown ids return SPECMLA_ERR_UNKNOWN_TOKEN. Never waits for a step.
///
/// # Safety
/// `ids` readable for `n_ids`; `out_text` writable for `capacity` bytes; `out_len` writable.
#[no_mangle]
pub unsafe extern "C" fn specmla_detokenize(
    engine: *mut EngineHandle,
    ids: *const u32,
    n_ids: usize,
    skip_special_tokens: bool,
    out_text: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> Status {
    call(|| {
        let len_out = out_ptr(out_len, "out_len")?;
        let h = handle::get(engine)?;
        let ids = unsafe { slice(ids, n_ids, "ids") }?;
        let tok = h
            .engine
            .tokenizer()
            .ok_or_else(|| crate::Error::NoTokenizer("the model has no tokenizer.json".into()))?;
        let text = tok.decode(ids, skip_special_tokens)?;
        unsafe { *len_out = text.len() };
        if text.len() + 1 > capacity {
            return Err(too_small("text", text.len() + 1, capacity));
        }
        let dst = out_ptr(out_text, "out_text")?;
        // SAFETY: `dst` holds `capacity >= len + 1` bytes per the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), dst as *mut u8, text.len());
            *dst.add(text.len()) = 0;
        }
        Ok(())
    })
}

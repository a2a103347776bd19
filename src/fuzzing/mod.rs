//! Fuzz entry points: one function per kind of outside input the library reads, each taking raw
//! bytes and driving the real code path (`#[doc(hidden)]`: a test interface, not API).
//!
//! Where it sits: beside the data flow, at its edges. `config` feeds `config.json` text to
//! `config` and what is computed from it; `safetensors` / `sharded` feed checkpoint bytes to
//! `weights` and build a `model`; `tokenizer` feeds `tokenizer.json` to `tokenizer` and streams
//! through it; `request` feeds request parameters through the C ABI (`ffi`) to one shared
//! `engine`. Callers: the cargo-fuzz targets in `fuzz/fuzz_targets/` and `tests/fuzz_replay.rs`,
//! which replays the committed seeds `fuzz/corpus/TARGET/` and crash inputs
//! `fuzz/regressions/TARGET/`.
//!
//! Contract of every entry point: `Ok(())` when the library accepted the input, `Err(Error)` when
//! it refused it with a typed error. A panic, an abort, a hang or memory out of proportion to the
//! input is a bug. Entry points also assert the guarantees the modules document (an empty
//! checkpoint never passes the tensor check, an engine keeps serving after any request), so a
//! broken guarantee is a panic too.

mod config;
mod request;
mod tokenizer;
mod weights;

pub use config::config;
pub use request::request;
pub use tokenizer::tokenizer;
pub use weights::{
    safetensors, seed_checkpoint, seed_index, sharded, FIXED_CONFIGS, SHARD_SEPARATOR,
};

use crate::error::Result;

/// A fuzz entry point.
pub type Target = fn(&[u8]) -> Result<()>;

/// Every entry point by the name of its cargo-fuzz target and corpus folder.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("safetensors", safetensors),
    ("sharded", sharded),
    ("tokenizer", tokenizer),
    ("request", request),
];

/// Reads typed values off the front of fuzz bytes; past the end every read yields zeros, so
/// any input decodes to some value of each field.
pub(crate) struct ByteReader<'a> {
    data: &'a [u8],
}

impl<'a> ByteReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        ByteReader { data }
    }

    /// Up to `n` bytes (fewer at the end).
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let b = self.take(N);
        out[..b.len()].copy_from_slice(b);
        out
    }

    pub(crate) fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// One of `table` (chosen by a byte), or — for a byte past the table — the next raw value.
    pub(crate) fn pick<T: Copy>(&mut self, table: &[T], raw: impl FnOnce(&mut Self) -> T) -> T {
        let i = self.u8() as usize;
        match table.get(i) {
            Some(&v) => v,
            None if i >= 0x80 => raw(self),
            None => table[i % table.len()],
        }
    }
}

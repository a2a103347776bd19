//! The flattened ragged batch one forward call takes: several sequences, each with several new
//! tokens at its own positions (continuous batching and speculative verification both need this).

use crate::kv::SeqKv;

/// Which rows of a chunk produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsMode {
    /// No logits (a prefill chunk that is not the last).
    None,
    /// Logits of the last token only.
    Last,
    /// Logits of every token (verification, scoring).
    All,
}

/// New tokens of one sequence in a forward call.
///
/// The KV slots for positions `start .. start + tokens.len()` must already be reserved in `kv`
/// (plan/commit done by the caller); the forward writes them. Tokens at absolute positions
/// `< mha_until` use the decompressed-MHA attention path, the others the absorbed path. The caller
/// sets `mha_until` from the sequence alone (the engine: its original prompt length), so the
/// path — and therefore every bit of the result — never depends on the batch.
pub struct SeqChunk<'a> {
    /// Block table of the sequence in the cache the forward writes.
    pub kv: &'a SeqKv,
    /// Absolute position of `tokens[0]` (= number of tokens already in the cache).
    pub start: usize,
    /// New token ids. // [n_new]
    pub tokens: &'a [u32],
    /// Absolute positions below this use the MHA path.
    pub mha_until: usize,
    /// Which rows return logits.
    pub logits: LogitsMode,
}

impl SeqChunk<'_> {
    /// Number of logits rows this chunk produces.
    pub fn n_logits(&self) -> usize {
        match self.logits {
            LogitsMode::None => 0,
            LogitsMode::Last => usize::from(!self.tokens.is_empty()),
            LogitsMode::All => self.tokens.len(),
        }
    }
}

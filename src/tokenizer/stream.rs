//! Incremental detokenisation for streaming output. Sits after `sampling` / `spec`: every
//! committed token id of a request is pushed here and the new text (a delta) goes to the caller.
//!
//! Technique ("decode a prefix window, diff", as in HF text-generation-inference and vLLM): keep
//! two offsets into the id history, `prefix_offset <= read_offset`. On each push decode
//! `ids[prefix_offset..read_offset]` (text already emitted, with left context) and
//! `ids[prefix_offset..]`; the delta is the second minus the first. Because both decodes start at
//! the same token, decoders whose output for a token depends on its left neighbour (metaspace
//! space-stripping, byte-level merges) give a consistent diff.
//!
//! Guarantees:
//! - Nothing is emitted while the window's text ends in U+FFFD (an incomplete multi-byte UTF-8
//!   character split across byte-level tokens): such pushes return `""` and the bytes are held
//!   until a later token completes the character, or until [`StreamDecoder::finish`].
//! - A delta is emitted only if the new window text extends the old one (checked, not assumed),
//!   so emitted text is never retracted.
//! - [`StreamDecoder::finish`] decodes the whole history once and returns exactly the missing
//!   suffix, so the concatenation of all deltas equals `decode(all ids)` whenever the decoder is
//!   local (byte-level BPE, metaspace, WordLevel/WordPiece). A decoder that rewrites earlier text
//!   after the fact (byte-fallback turning a completed `é` back into U+FFFD when followed by a
//!   stray byte) cannot be streamed exactly by anyone; there the streamed text is kept and the
//!   window's tail is returned.
//! - Unknown ids are rejected with [`crate::Error::UnknownToken`] and leave the state untouched.

use super::Tokenizer;
use crate::error::Result;

/// Incremental detokeniser for one output stream (one request).
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    skip_special_tokens: bool,
    ids: Vec<u32>, // [n_pushed] every id pushed so far
    /// Start of the decode window: the left context for the next diff.
    prefix_offset: usize,
    /// End of the text already emitted (ids[prefix_offset..read_offset] decode to its tail).
    read_offset: usize,
    /// Everything emitted so far (used by `finish` to reconcile with a full decode).
    emitted: String,
}

impl StreamDecoder {
    /// A decoder for a new stream with nothing pushed.
    pub fn new(skip_special_tokens: bool) -> Self {
        StreamDecoder {
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            emitted: String::new(),
        }
    }

    /// Ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Text emitted so far (the concatenation of all returned deltas).
    pub fn emitted(&self) -> &str {
        &self.emitted
    }

    /// Push one id; returns the text it releases (possibly empty while a character is incomplete
    /// or the token decodes to nothing, e.g. a skipped special token).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        tok.check_ids(&[id])?;
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        if new_text.len() > prefix_text.len()
            && new_text.starts_with(&prefix_text)
            && !new_text.ends_with('\u{FFFD}')
        {
            let delta = new_text[prefix_text.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            self.emitted.push_str(&delta);
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// Flush everything held back (an incomplete trailing character decodes to U+FFFD). After
    /// `finish` the stream is complete: `emitted()` equals `decode(ids())` for local decoders.
    /// Further pushes start from the finished text as left context.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let skip = self.skip_special_tokens;
        let full = tok.decode(&self.ids, skip)?;
        let delta = if full.starts_with(&self.emitted) {
            full[self.emitted.len()..].to_string()
        } else {
            // Non-local decoder rewrote earlier text: keep what was streamed, release the tail.
            let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
            let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
            match new_text.strip_prefix(prefix_text.as_str()) {
                Some(rest) => rest.to_string(),
                None => String::new(),
            }
        };
        self.emitted.push_str(&delta);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }
}

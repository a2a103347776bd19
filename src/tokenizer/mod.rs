//! Text <-> token ids. Sits at both ends of the data flow: a request's prompt text is encoded here
//! before it reaches the `engine`, and committed token ids are turned back into text deltas by
//! [`StreamDecoder`] as `sampling` / `spec` commit them.
//!
//! Guarantees:
//! - A thin, typed wrapper over a HuggingFace `tokenizer.json` (no C dependencies). Every failure is
//!   an [`Error::Tokenizer`] carrying the cause; an id outside the vocabulary is
//!   [`Error::UnknownToken`], never silently dropped.
//! - A model directory without `tokenizer.json` is legal: [`Tokenizer::from_model_dir`] returns
//!   `Ok(None)` and the engine serves token ids only (text features then report
//!   [`Error::NoTokenizer`]).
//! - [`Tokenizer::vocab_fingerprint`] is a stable (process- and platform-independent) hash of the
//!   vocabulary, used to check that a draft model and the target share one vocabulary.
//! - Streaming detokenisation ([`StreamDecoder`]) emits deltas whose concatenation equals
//!   `decode(all ids)` for tokenizers whose decoder is local (byte-level BPE, metaspace, plain
//!   WordLevel); see `stream.rs`.

mod stream;

pub use stream::StreamDecoder;

use std::path::Path;

use crate::error::{Error, Result};

/// A loaded tokenizer (HuggingFace `tokenizer.json` format).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// One past the largest id in the vocabulary (model vocab and added tokens).
    vocab_size: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

/// The file name looked for inside a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

impl Tokenizer {
    /// Load a `tokenizer.json` file. I/O failures are [`Error::Io`]; a malformed file is
    /// [`Error::Tokenizer`] naming the path and the parser's cause.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            Error::Tokenizer(msg) => Error::Tokenizer(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parse a `tokenizer.json` document held in memory. A malformed document is
    /// [`Error::Tokenizer`], also where the `tokenizers` crate panics on it instead of returning
    /// an error (it does for some: see [`contain_panic`]).
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        // Syntax first: the crate turns a syntax error inside some sections (the decoder) into
        // a panic, so a document that is not JSON never reaches it.
        serde_json::from_slice::<serde::de::IgnoredAny>(json)
            .map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer.json: {e}")))?;
        let parsed = contain_panic("cannot parse tokenizer.json", || {
            tokenizers::Tokenizer::from_bytes(json).map(Self::from_inner)
        })?;
        let tok =
            parsed.map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer.json: {e}")))?;
        // The crate's parser skips checks its builders make: a `TemplateProcessing`
        // post-processor whose template names a special token it does not define loads, then
        // panics on every encode with special tokens. One probe encode refuses such a file here.
        contain_panic("tokenizer.json: post_processor", || {
            let _ = tok.inner.encode("a", true);
        })?;
        Ok(tok)
    }

    /// Load `<dir>/tokenizer.json`; `Ok(None)` when the directory has no such file.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(TOKENIZER_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    fn from_inner(mut inner: tokenizers::Tokenizer) -> Self {
        // A prompt is encoded as it is: the file's padding (a `Fixed(10^8)` length allocates
        // gigabytes; any padding changes the output) and truncation (silently cuts the prompt)
        // settings are training-time batching options, dropped here.
        inner.with_padding(None);
        let _ = inner.with_truncation(None);
        let max_id = inner.get_vocab(true).values().copied().max();
        let vocab_size = max_id
            .map_or(0, |m| m as usize + 1)
            .max(inner.get_vocab_size(true));
        Tokenizer { inner, vocab_size }
    }

    /// Encode text into token ids. `add_special_tokens` applies the tokenizer's post-processor
    /// (e.g. a BOS token); special tokens written in the text (e.g. `<think>`) are always
    /// recognised as single ids.
    /// A panic inside the `tokenizers` crate is [`Error::Tokenizer`] (see [`contain_panic`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = contain_panic("encode failed", || {
            self.inner.encode(text, add_special_tokens)
        })?
        .map_err(|e| Error::Tokenizer(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode token ids into text. An id outside the vocabulary is [`Error::UnknownToken`].
    /// A panic inside the `tokenizers` crate is [`Error::Tokenizer`] (see [`contain_panic`]).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        contain_panic("decode failed", || {
            self.inner.decode(ids, skip_special_tokens)
        })?
        .map_err(|e| Error::Tokenizer(format!("decode failed: {e}")))
    }

    /// Fail with [`Error::UnknownToken`] on the first id the vocabulary does not contain.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            Some(&id) => Err(Error::UnknownToken {
                id,
                vocab_size: self.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Size of the id space including added tokens: one past the largest id (equal to the token
    /// count when ids are contiguous, as in every published checkpoint).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Id of a token by its vocabulary string; special tokens by name (e.g. `"<think>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary string of an id (raw token form, e.g. byte-level `"Ġthe"`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// All added tokens flagged special, as `(content, id)` sorted by id.
    pub fn special_token_ids(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (t.content, id))
            .collect();
        out.sort_by_key(|&(_, id)| id);
        out
    }

    /// A stable 64-bit FNV-1a hash over the vocabulary: every `(id, token)` pair (model vocab and
    /// added tokens) in id order, then every added token's `(id, content, special)`. Two
    /// tokenizers with equal fingerprints map every id to the same token string.
    pub fn vocab_fingerprint(&self) -> u64 {
        let mut pairs: Vec<(u32, String)> = self
            .inner
            .get_vocab(true)
            .into_iter()
            .map(|(t, id)| (id, t))
            .collect();
        pairs.sort();
        let mut added: Vec<(u32, String, bool)> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.content, t.special))
            .collect();
        added.sort();
        let mut h = Fnv64::new();
        h.write(&(pairs.len() as u64).to_le_bytes());
        for (id, tok) in &pairs {
            h.write(&id.to_le_bytes());
            h.write(&(tok.len() as u64).to_le_bytes());
            h.write(tok.as_bytes());
        }
        h.write(&(added.len() as u64).to_le_bytes());
        for (id, content, special) in &added {
            h.write(&id.to_le_bytes());
            h.write(&(content.len() as u64).to_le_bytes());
            h.write(content.as_bytes());
            h.write(&[*special as u8]);
        }
        h.finish()
    }
}

/// Run `f`, turning a panic inside it into [`Error::Tokenizer`] (`what`: the failed operation).
///
/// The `tokenizers` crate (0.23) panics instead of returning an error on some malformed
/// documents: its `decoder` deserialiser does `.expect("Helper")` on a serde error while reading
/// that section (a syntax error in it; invalid UTF-8 in a key, which a syntax-only check lets
/// through; found by the fuzzer, `fuzz/regressions/tokenizer/`). A tokenizer.json is outside
/// input, so its parse runs here. The panic message is kept; the process's panic hook still
/// prints it once, and a host built with `panic = "abort"` cannot contain it (hence the syntax
/// check in `from_bytes`, which catches the common case before the crate sees it). Encoding can
/// panic too (a `TemplateProcessing` post-processor naming an undefined special token, also
/// fuzzer-found), so `encode` and `decode` run here as well.
fn contain_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Error::Tokenizer(format!("{what}: the tokenizers crate panicked: {msg}"))
    })
}

/// 64-bit FNV-1a; chosen over `std::hash` because its output is specified and never changes.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WordLevel tokenizer with a whitespace pre-tokenizer and two special tokens.
    const WORDLEVEL: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [
        {"id": 4, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 5, "content": "</think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "WhitespaceSplit"},
      "post_processor": null,
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}, "unk_token": "[UNK]"}
    }"#;

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<StreamDecoder>();
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        let mut h = Fnv64::new();
        h.write(b"");
        assert_eq!(h.finish(), 0xcbf29ce484222325);
        let mut h = Fnv64::new();
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63dc4c8601ec8c);
        let mut h = Fnv64::new();
        h.write(b"foobar");
        assert_eq!(h.finish(), 0x85944171f73967e8);
    }

    #[test]
    fn wordlevel_basics() {
        let tok = Tokenizer::from_bytes(WORDLEVEL.as_bytes()).unwrap();
        assert_eq!(tok.vocab_size(), 6);
        assert_eq!(
            tok.encode("hello <think> world", false).unwrap(),
            vec![1, 4, 2]
        );
        assert_eq!(tok.encode("hello zzz", false).unwrap(), vec![1, 0]);
        assert_eq!(tok.token_to_id("</think>"), Some(5));
        assert_eq!(tok.id_to_token(3).as_deref(), Some("again"));
        assert_eq!(tok.id_to_token(6), None);
        assert_eq!(
            tok.special_token_ids(),
            vec![("<think>".to_string(), 4), ("</think>".to_string(), 5)]
        );
        assert!(matches!(
            tok.decode(&[1, 6], false),
            Err(Error::UnknownToken {
                id: 6,
                vocab_size: 6
            })
        ));
    }

    #[test]
    fn fingerprint_detects_vocab_changes() {
        let a = Tokenizer::from_bytes(WORDLEVEL.as_bytes()).unwrap();
        let b = Tokenizer::from_bytes(WORDLEVEL.as_bytes()).unwrap();
        assert_eq!(a.vocab_fingerprint(), b.vocab_fingerprint());
        let swapped = WORDLEVEL.replace("\"world\": 2, \"again\": 3", "\"world\": 3, \"again\": 2");
        let c = Tokenizer::from_bytes(swapped.as_bytes()).unwrap();
        assert_ne!(a.vocab_fingerprint(), c.vocab_fingerprint());
        let not_special = WORDLEVEL.replacen("\"special\": true", "\"special\": false", 1);
        let d = Tokenizer::from_bytes(not_special.as_bytes()).unwrap();
        assert_ne!(a.vocab_fingerprint(), d.vocab_fingerprint());
    }

    #[test]
    fn padding_and_truncation_settings_are_ignored() {
        let doc = |extra: &str| {
            format!(
                "{{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\
                 \"pre_tokenizer\":{{\"type\":\"Whitespace\"}},\"post_processor\":null,\
                 \"decoder\":null,{extra}\"model\":{{\"type\":\"WordLevel\",\
                 \"vocab\":{{\"a\":0,\"b\":1,\"<pad>\":2}},\"unk_token\":\"a\"}}}}"
            )
        };
        let plain = Tokenizer::from_bytes(doc("").as_bytes()).unwrap();
        let want = plain.encode("a b a b a", false).unwrap();
        assert_eq!(want, vec![0, 1, 0, 1, 0]);
        let padded = doc(
            "\"padding\":{\"strategy\":{\"Fixed\":100000000},\"direction\":\"Right\",\
             \"pad_to_multiple_of\":null,\"pad_id\":2,\"pad_type_id\":0,\"pad_token\":\"<pad>\"},\
             \"truncation\":{\"direction\":\"Right\",\"max_length\":2,\"strategy\":\"LongestFirst\",\
             \"stride\":0},",
        );
        let t = Tokenizer::from_bytes(padded.as_bytes()).unwrap();
        assert_eq!(t.encode("a b a b a", false).unwrap(), want);
    }

    #[test]
    fn parser_panics_are_contained() {
        // Invalid UTF-8 in a decoder's key makes the `tokenizers` crate panic (not fail).
        let doc =
            b"{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,\
            \"post_processor\":null,\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"_\",\
            \"prepend_sch\xf0\xf0\":\"always\",\"split\":true},\
            \"model\":{\"type\":\"WordLevel\",\"vocab\":{\"x\":0},\"unk_token\":\"x\"}}";
        let err = Tokenizer::from_bytes(doc).unwrap_err();
        assert!(
            matches!(&err, Error::Tokenizer(m) if m.contains("panicked")),
            "{err}"
        );
    }

    #[test]
    fn template_naming_an_undefined_special_token_is_refused() {
        let processor = r#""post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<think>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<typo>": {"id": "<think>", "ids": [4], "tokens": ["<think>"]}}}"#;
        let doc = WORDLEVEL.replace("\"post_processor\": null", processor);
        let err = Tokenizer::from_bytes(doc.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, Error::Tokenizer(m) if m.contains("post_processor")),
            "{err}"
        );
    }

    #[test]
    fn bad_json_and_missing_file() {
        assert!(matches!(
            Tokenizer::from_bytes(b"{not json"),
            Err(Error::Tokenizer(_))
        ));
        let dir = std::env::temp_dir().join(format!("specmla-tok-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Tokenizer::from_model_dir(&dir).unwrap().is_none());
        std::fs::write(dir.join(TOKENIZER_FILE), b"[]").unwrap();
        let err = Tokenizer::from_model_dir(&dir).unwrap_err();
        assert!(
            matches!(&err, Error::Tokenizer(m) if m.contains(TOKENIZER_FILE)),
            "{err}"
        );
        std::fs::write(dir.join(TOKENIZER_FILE), WORDLEVEL).unwrap();
        assert_eq!(
            Tokenizer::from_model_dir(&dir)
                .unwrap()
                .unwrap()
                .vocab_size(),
            6
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

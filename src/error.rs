//! Typed library errors. Every failure the engine can report to a caller (and through the C ABI)
//! is a variant here; messages name the offending field, tensor, token or request.

use std::path::PathBuf;

/// The library error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// I/O failure on a file the engine was asked to read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// config.json is malformed or names something unsupported; `field` is the JSON key.
    #[error("config: field `{field}`: {msg}")]
    Config { field: String, msg: String },
    /// A safetensors file (or index) is malformed.
    #[error("safetensors {path}: {msg}")]
    Safetensors { path: String, msg: String },
    /// An expected tensor is missing or has the wrong shape / dtype.
    #[error("tensor `{name}`: {msg}")]
    Tensor { name: String, msg: String },
    /// The model directory has no tokenizer.json but a text feature was used.
    #[error("no tokenizer: {0}")]
    NoTokenizer(String),
    /// Tokenizer failure (bad tokenizer.json, encode/decode failure).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id outside the vocabulary.
    #[error("unknown token id {id} (vocab size {vocab_size})")]
    UnknownToken { id: u32, vocab_size: usize },
    /// A request or parameter is invalid (empty prompt, negative budget, bad sampling value...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A request id the engine does not know (finished, cancelled or never submitted).
    #[error("unknown request id {0}")]
    UnknownRequest(u64),
    /// The KV cache can never hold this request.
    #[error("KV cache exhausted: {0}")]
    KvExhausted(String),
    /// Draft model / drafter problems (vocab mismatch, bad weights for a swap...).
    #[error("draft: {0}")]
    Draft(String),
    /// Invalid argument at an API boundary (NULL pointer, bad UTF-8, too-small buffer...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The engine was shut down or is otherwise unusable.
    #[error("engine: {0}")]
    Engine(String),
}

/// Library result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn config(field: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            msg: msg.into(),
        }
    }
    pub(crate) fn tensor(name: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Tensor {
            name: name.into(),
            msg: msg.into(),
        }
    }
}

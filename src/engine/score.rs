//! Scoring: per-position log-probabilities of a token sequence under the model (the `score` CLI
//! command and reference checks). Runs the prompt path (decompressed MHA) in one chunk.

use crate::error::{Error, Result};
use crate::kv::{KvCache, KvConfig, KvDtype, SeqKv};
use crate::model::{LogitsMode, Model, SeqChunk};
use crate::sampling::log_softmax;

/// Log-softmax rows [len, vocab]: row i is the distribution of the token after position i.
pub fn score_tokens(model: &Model, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    if tokens.is_empty() {
        return Err(Error::InvalidRequest("empty token sequence".into()));
    }
    let c = &model.config;
    let block_size = 16;
    let mut kv = KvCache::new(KvConfig::for_model(
        c,
        block_size,
        tokens.len().div_ceil(block_size),
        KvDtype::F32,
    ))?;
    let mut seq = SeqKv::new();
    let plan = kv.plan_grow(&seq, tokens.len())?;
    kv.commit_grow(&mut seq, plan);
    let logits = model.forward(
        &mut kv,
        &[SeqChunk {
            kv: &seq,
            start: 0,
            tokens,
            mha_until: tokens.len(),
            logits: LogitsMode::All,
        }],
    )?;
    Ok(logits.chunks(c.vocab_size).map(log_softmax).collect())
}

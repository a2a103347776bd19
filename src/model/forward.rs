//! The forward pass over a flattened ragged batch, and one decoder layer of it (shared with the
//! MTP drafter, whose layer is a decoder layer over its own one-layer cache). The order of
//! operations lives here; every operator is a `backend::Backend` op (`forward_on`), the CPU's by
//! default (`forward_out`).

use crate::backend::{Backend, CpuBackend};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::{for_each_row, rms_norm};
use crate::kv::KvCache;

use super::batch::{LogitsMode, SeqChunk};
use super::rope::Rope;
use super::weights::{DecoderLayer, Model};

/// What a forward returns besides the KV it wrote.
pub struct ForwardOut {
    /// Logits of the rows the chunks ask for, in chunk order. // [n_rows, vocab]
    pub logits: Vec<f32>,
    /// With `want_hidden`: every token's hidden state as the MTP drafter reads it, in token
    /// order — V2 / V3 after the final norm (what the lm_head reads), V4 the residual streams
    /// before the hyper head. Else empty. // [n_tokens, Model::hidden_state_width()]
    pub hidden: Vec<f32>,
    /// Weight bytes this forward needed: every dense matrix once, the union of the experts its
    /// tokens selected, the lm_head when any row wants logits, one embedding row per token.
    pub weight_bytes: u64,
}

/// One decoder layer over the batch through backend `b`: x += attn(norm(x)); x += ffn(norm(x)).
/// `kv_layer` is the layer's index in `kv`. Adds the weight bytes it read to `bytes`.
/// x: [n, hidden] in the backend's memory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_layer_on<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    rope: &Rope,
    layer: &DecoderLayer,
    kv_layer: usize,
    x: &mut B::Act,
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
    bytes: &mut u64,
) -> Result<()> {
    let n = pos.len();
    let xn = b.rms_norm(x, n, &layer.input_norm, cfg.rms_norm_eps)?; // [n, hidden]
    let a = b.attention(cfg, rope, &layer.attn, kv_layer, &xn, pos, chunks, kv)?; // [n, hidden]
    b.add_assign(x, &a)?;
    let xn = b.rms_norm(x, n, &layer.post_norm, cfg.rms_norm_eps)?; // [n, hidden]
    let mha = chunks.iter().any(|c| c.start < c.mha_until);
    let absorbed = chunks
        .iter()
        .any(|c| c.start + c.tokens.len() > c.mha_until);
    *bytes += layer.attn_bytes(mha, absorbed) as u64;
    let (y, fb) = b.ffn(cfg, &layer.ffn, &xn, n)?; // [n, hidden]
    *bytes += fb as u64;
    b.add_assign(x, &y)
}

impl Model {
    /// Weight bytes `n` tokens read from the embedding matrix: one row each (the forwards'
    /// `weight_bytes` count).
    pub(crate) fn embedding_bytes(&self, n: usize) -> u64 {
        (n * self.embed.nbytes() / self.embed.rows.max(1)) as u64
    }

    /// Run the decoder over every chunk's new tokens, writing their KV slots (which the caller
    /// must have reserved) and returning logits [n_logits_rows, vocab] for the rows the chunks ask
    /// for, in chunk order. The caller sets each sequence's KV length afterwards.
    pub fn forward(&self, kv: &mut KvCache, chunks: &[SeqChunk]) -> Result<Vec<f32>> {
        Ok(self.forward_out(kv, chunks, false)?.logits)
    }

    /// [`Model::forward`] returning the final-norm hidden states of every token too (when
    /// `want_hidden`) and the weight bytes the forward needed. On the CPU backend (DeepSeek-V4
    /// models take their own forward, `model::v4`).
    pub fn forward_out(
        &self,
        kv: &mut KvCache,
        chunks: &[SeqChunk],
        want_hidden: bool,
    ) -> Result<ForwardOut> {
        if let Some(v4) = &self.v4 {
            self.check_kv(kv)?;
            return super::v4::v4_forward(self, v4, kv, chunks, want_hidden);
        }
        self.forward_on(&CpuBackend, kv, chunks, want_hidden)
    }

    fn check_kv(&self, kv: &KvCache) -> Result<()> {
        let cfg = &self.config;
        if !kv.config().matches(cfg, cfg.num_hidden_layers) {
            return Err(Error::InvalidArgument(
                "KV cache layout does not match the model".into(),
            ));
        }
        Ok(())
    }

    /// The V2 / V3 / V3.2 forward through backend `b` (the seam: every operator is one of
    /// `b`'s; the order of operations is this function's). Same contract as
    /// [`Model::forward_out`]; a V4 model is refused (its forward is CPU-only, `model::v4`).
    pub fn forward_on<B: Backend>(
        &self,
        b: &B,
        kv: &mut KvCache,
        chunks: &[SeqChunk],
        want_hidden: bool,
    ) -> Result<ForwardOut> {
        let cfg = &self.config;
        let vocab = cfg.vocab_size;
        self.check_kv(kv)?;
        if self.v4.is_some() {
            return Err(Error::InvalidArgument(format!(
                "DeepSeek-V4 models run on the CPU backend only, not on {}",
                b.name()
            )));
        }
        let (tokens, pos) = flatten(chunks, vocab)?; // [n], [n]
        let n = tokens.len();
        if n == 0 {
            return Ok(ForwardOut::empty());
        }
        let mut bytes = self.embedding_bytes(n);
        let mut x = b.embed(&self.embed, &tokens)?; // [n, hidden]
        for (li, layer) in self.layers.iter().enumerate() {
            decoder_layer_on(
                b, cfg, &self.rope, layer, li, &mut x, &pos, chunks, kv, &mut bytes,
            )?;
        }
        let rows = logit_rows(chunks);
        let (logits, hidden) = b.logits(
            &x,
            n,
            &self.norm,
            cfg.rms_norm_eps,
            self.lm_head(),
            &rows,
            want_hidden,
        )?; // [n_rows, vocab], [n, hidden] or empty
        if !rows.is_empty() {
            bytes += self.lm_head().nbytes() as u64;
        }
        Ok(ForwardOut {
            logits,
            hidden,
            weight_bytes: bytes,
        })
    }
}

impl ForwardOut {
    /// The result of a forward over no token.
    pub(crate) fn empty() -> Self {
        ForwardOut {
            logits: Vec::new(),
            hidden: Vec::new(),
            weight_bytes: 0,
        }
    }
}

/// Every chunk's tokens and absolute positions in batch order, token ids checked against the
/// vocabulary. -> ([n], [n])
pub(crate) fn flatten(chunks: &[SeqChunk], vocab: usize) -> Result<(Vec<u32>, Vec<usize>)> {
    let mut tokens = Vec::new(); // [n]
    let mut pos = Vec::new(); // [n]
    for ch in chunks {
        for (i, &t) in ch.tokens.iter().enumerate() {
            if t as usize >= vocab {
                return Err(Error::UnknownToken {
                    id: t,
                    vocab_size: vocab,
                });
            }
            tokens.push(t);
            pos.push(ch.start + i);
        }
    }
    Ok((tokens, pos))
}

/// Batch rows whose logits the chunks ask for, in chunk order.
pub(crate) fn logit_rows(chunks: &[SeqChunk]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut t0 = 0;
    for ch in chunks {
        let len = ch.tokens.len();
        match ch.logits {
            LogitsMode::None => {}
            LogitsMode::Last if len > 0 => rows.push(t0 + len - 1),
            LogitsMode::Last => {}
            LogitsMode::All => rows.extend(t0..t0 + len),
        }
        t0 += len;
    }
    rows
}

/// RMSNorm of every row. x, out: [n, hidden].
pub(crate) fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for_each_row(out, h, x.len(), |i, o| {
        rms_norm(&x[i * h..(i + 1) * h], w, eps, o)
    });
}

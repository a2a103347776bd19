//! The forward pass over a flattened ragged batch, and one decoder layer of it (shared with the
//! MTP drafter, whose layer is a decoder layer over its own one-layer cache).

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::{for_each_row, matmul, matrix_row_f32, rms_norm};
use crate::kv::KvCache;

use super::attention::mla_attention;
use super::batch::{LogitsMode, SeqChunk};
use super::moe::{mlp, moe};
use super::rope::Rope;
use super::weights::{DecoderLayer, Ffn, Model};

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

/// One decoder layer over the batch: x += attn(norm(x)); x += ffn(norm(x)). `kv_layer` is the
/// layer's index in `kv`; `xn` is scratch for the normed rows (reused across layers). Adds the
/// weight bytes it read to `bytes`. x, xn: [n, hidden].
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_layer(
    cfg: &ModelConfig,
    rope: &Rope,
    layer: &DecoderLayer,
    kv_layer: usize,
    x: &mut [f32],
    xn: &mut [f32],
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
    bytes: &mut u64,
) {
    let n = pos.len();
    norm_rows(x, &layer.input_norm, cfg.rms_norm_eps, xn);
    let a = mla_attention(cfg, rope, &layer.attn, kv_layer, xn, pos, chunks, kv);
    x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
    norm_rows(x, &layer.post_norm, cfg.rms_norm_eps, xn);
    let mha = chunks.iter().any(|c| c.start < c.mha_until);
    let absorbed = chunks
        .iter()
        .any(|c| c.start + c.tokens.len() > c.mha_until);
    *bytes += layer.attn_bytes(mha, absorbed) as u64;
    let y = match &layer.ffn {
        Ffn::Dense(e) => {
            *bytes += e.nbytes() as u64;
            mlp(e, &xn, n)
        }
        Ffn::Moe(m) => {
            let moe_cfg = cfg.moe.as_ref().expect("MoE layer without MoE config");
            let (y, b) = moe(m, moe_cfg, cfg.model_type, &xn, n);
            *bytes += b as u64;
            y
        }
    };
    x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
}

impl Model {
    /// Run the decoder over every chunk's new tokens, writing their KV slots (which the caller
    /// must have reserved) and returning logits [n_logits_rows, vocab] for the rows the chunks ask
    /// for, in chunk order. The caller sets each sequence's KV length afterwards.
    pub fn forward(&self, kv: &mut KvCache, chunks: &[SeqChunk]) -> Result<Vec<f32>> {
        Ok(self.forward_out(kv, chunks, false)?.logits)
    }

    /// [`Model::forward`] returning the final-norm hidden states of every token too (when
    /// `want_hidden`) and the weight bytes the forward needed.
    pub fn forward_out(
        &self,
        kv: &mut KvCache,
        chunks: &[SeqChunk],
        want_hidden: bool,
    ) -> Result<ForwardOut> {
        let cfg = &self.config;
        let h = cfg.hidden_size;
        let vocab = cfg.vocab_size;
        let kc = kv.config();
        if !kc.matches(cfg, cfg.num_hidden_layers) {
            return Err(Error::InvalidArgument(
                "KV cache layout does not match the model".into(),
            ));
        }
        if let Some(v4) = &self.v4 {
            return super::v4::v4_forward(self, v4, kv, chunks, want_hidden);
        }
        let (tokens, pos) = flatten(chunks, vocab)?; // [n], [n]
        let n = tokens.len();
        if n == 0 {
            return Ok(ForwardOut::empty());
        }
        let mut bytes = (n * self.embed.nbytes() / self.embed.rows.max(1)) as u64;
        let mut x = vec![0f32; n * h]; // [n, hidden]
        for_each_row(&mut x, h, n * h, |i, row| {
            matrix_row_f32(&self.embed, tokens[i] as usize, row)
        });
        let mut xn = vec![0f32; n * h]; // [n, hidden]
        for (li, layer) in self.layers.iter().enumerate() {
            decoder_layer(
                cfg, &self.rope, layer, li, &mut x, &mut xn, &pos, chunks, kv, &mut bytes,
            );
        }
        // Final norm: every row when the caller wants the hidden states (the logit rows are
        // taken from them), else only the logit rows.
        let rows = logit_rows(chunks);
        let hidden = if want_hidden {
            norm_rows(&x, &self.norm, cfg.rms_norm_eps, &mut xn);
            xn
        } else {
            Vec::new()
        };
        let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
        for (i, &r) in rows.iter().enumerate() {
            let o = &mut hs[i * h..(i + 1) * h];
            if want_hidden {
                o.copy_from_slice(&hidden[r * h..(r + 1) * h]);
            } else {
                rms_norm(&x[r * h..(r + 1) * h], &self.norm, cfg.rms_norm_eps, o);
            }
        }
        let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
        if !rows.is_empty() {
            matmul(self.lm_head(), &hs, rows.len(), &mut logits);
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

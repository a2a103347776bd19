//! The forward pass over a flattened ragged batch.

use crate::error::{Error, Result};
use crate::kernels::{for_each_row, matmul, matrix_row_f32, rms_norm};
use crate::kv::KvCache;

use super::attention::mla_attention;
use super::batch::{LogitsMode, SeqChunk};
use super::moe::{mlp, moe};
use super::weights::{Ffn, Model};

impl Model {
    /// Run the decoder over every chunk's new tokens, writing their KV slots (which the caller
    /// must have reserved) and returning logits [n_logits_rows, vocab] for the rows the chunks ask
    /// for, in chunk order. The caller sets each sequence's KV length afterwards.
    pub fn forward(&self, kv: &mut KvCache, chunks: &[SeqChunk]) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let h = cfg.hidden_size;
        let vocab = cfg.vocab_size;
        let kc = kv.config();
        if kc.num_layers != cfg.num_hidden_layers
            || kc.kv_lora_rank != cfg.kv_lora_rank
            || kc.rope_dim != cfg.qk_rope_head_dim
        {
            return Err(Error::InvalidArgument(
                "KV cache layout does not match the model".into(),
            ));
        }
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
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut x = vec![0f32; n * h]; // [n, hidden]
        for_each_row(&mut x, h, n * h, |i, row| {
            matrix_row_f32(&self.embed, tokens[i] as usize, row)
        });
        let mut xn = vec![0f32; n * h]; // [n, hidden]
        for (li, layer) in self.layers.iter().enumerate() {
            norm_rows(&x, &layer.input_norm, cfg.rms_norm_eps, &mut xn);
            let a = mla_attention(cfg, &self.rope, &layer.attn, li, &xn, &pos, chunks, kv);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            norm_rows(&x, &layer.post_norm, cfg.rms_norm_eps, &mut xn);
            let y = match &layer.ffn {
                Ffn::Dense(e) => mlp(e, &xn, n),
                Ffn::Moe(m) => moe(
                    m,
                    cfg.moe.as_ref().expect("MoE layer without MoE config"),
                    cfg.model_type,
                    &xn,
                    n,
                ),
            };
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
        }
        // Rows that want logits.
        let mut rows = Vec::new();
        let mut t0 = 0;
        for ch in chunks {
            let len = ch.tokens.len();
            match ch.logits {
                LogitsMode::None => {}
                LogitsMode::Last => {
                    if len > 0 {
                        rows.push(t0 + len - 1)
                    }
                }
                LogitsMode::All => rows.extend(t0..t0 + len),
            }
            t0 += len;
        }
        let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
        for (i, &r) in rows.iter().enumerate() {
            rms_norm(
                &x[r * h..(r + 1) * h],
                &self.norm,
                cfg.rms_norm_eps,
                &mut hs[i * h..(i + 1) * h],
            );
        }
        let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
        matmul(self.lm_head(), &hs, rows.len(), &mut logits);
        Ok(logits)
    }
}

/// RMSNorm of every row. x, out: [n, hidden].
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for_each_row(out, h, x.len(), |i, o| {
        rms_norm(&x[i * h..(i + 1) * h], w, eps, o)
    });
}

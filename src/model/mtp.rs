//! The MTP layer's forward (DeepSeek-V3 multi-token prediction), run by the MTP drafter.
//!
//! As vLLM (`model_executor/models/deepseek_mtp.py`) and SGLang (`models/deepseek_nextn.py`)
//! serve the official weights: x_j = eh_proj([enorm(embed(t_{j+1})) | hnorm(h_j)]) — embedding
//! first, the embedding zeroed at position 0 — then one decoder layer over the MTP layer's own
//! latent cache at position j, logits = shared_head.head(shared_head.norm(x')) predict t_{j+2}.
//! h_j is the target's hidden state at position j after its final norm; for chained drafts
//! (k > 1) it is the MTP layer's own previous output x' (before shared_head.norm), as vLLM
//! chains it.
//! A drafter that skipped positions it has no target hidden states for (`spec::mtp`) writes its
//! cache at positions shifted back by the skipped count; the embedding is zeroed at the absolute
//! position 0 only (the `shifts` of [`Model::mtp_forward_counted`]).

use crate::backend::CpuBackend;
use crate::error::{Error, Result};
use crate::kernels::{for_each_row, matmul, matrix_row_f32, rms_norm};
use crate::kv::KvCache;

use super::batch::SeqChunk;
use super::forward::{decoder_layer_on, flatten, logit_rows};
use super::weights::Model;

impl Model {
    /// MTP layers the checkpoint holds (V2 / V3 and V4 alike).
    pub fn num_mtp_layers(&self) -> usize {
        self.v4.as_ref().map_or(self.mtp.len(), |v| v.mtp.len())
    }

    /// Width of one token's hidden state as `forward_out` hands it to the MTP drafter: V2 / V3
    /// the final-norm hidden state (`hidden_size`), V4 the residual streams before the hyper
    /// head (`hc_mult * hidden_size`).
    pub fn hidden_state_width(&self) -> usize {
        let h = self.config.hidden_size;
        self.config.v4.as_ref().map_or(h, |v| v.hc_mult * h)
    }

    /// MTP layer `m` over a ragged batch (V4 models: `model::v4`'s MTP forward, same contract
    /// with hidden rows of `hidden_state_width`): `chunks[i].tokens` are the tokens t_{j+1} at positions
    /// j = start.., `prev` the matching hidden states h_j. Writes the MTP layer's KV (a one-layer
    /// cache the caller reserved) and returns (logits of the rows the chunks ask for
    /// [n_rows, vocab], every row's output x' [n, hidden] for chaining).
    pub fn mtp_forward(
        &self,
        m: usize,
        kv: &mut KvCache,
        chunks: &[SeqChunk],
        prev: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.mtp_forward_counted(m, kv, chunks, prev, &vec![0; chunks.len()])
            .map(|(logits, x, _)| (logits, x))
    }

    /// [`Model::mtp_forward`] also returning the weight bytes it needed, counted as the target's
    /// forward counts them (one embedding row per token, eh_proj, the layer's attention and
    /// feed-forward — the union of the experts its tokens select — and the head when a row
    /// wants logits). DeepSeek-V4 MTP layers: not counted (0). `shifts[i]`: how far chunk i's
    /// cache positions lie behind its absolute positions (positions its drafter skipped; 0 for
    /// a sequence cached from position 0) — only the zero embedding at absolute position 0
    /// reads it.
    pub fn mtp_forward_counted(
        &self,
        m: usize,
        kv: &mut KvCache,
        chunks: &[SeqChunk],
        prev: &[f32],
        shifts: &[usize],
    ) -> Result<(Vec<f32>, Vec<f32>, u64)> {
        let zero_embed = first_position_rows(chunks, shifts)?; // [n]
        if let Some(v4) = &self.v4 {
            return super::v4::v4_mtp_forward(self, v4, m, kv, chunks, prev, &zero_embed)
                .map(|(logits, x)| (logits, x, 0));
        }
        let cfg = &self.config;
        let (h, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let mtp = self
            .mtp
            .get(m)
            .ok_or_else(|| Error::InvalidArgument(format!("model has no MTP layer {m}")))?;
        let kc = kv.config();
        if !kc.matches(cfg, 1) {
            return Err(Error::InvalidArgument(
                "MTP KV cache layout does not match the model".into(),
            ));
        }
        let (tokens, pos) = flatten(chunks, vocab)?; // [n], [n]
        let n = tokens.len();
        if prev.len() != n * h {
            return Err(Error::InvalidArgument(format!(
                "MTP forward: {} hidden values for {n} tokens of width {h}",
                prev.len()
            )));
        }
        if n == 0 {
            return Ok((Vec::new(), Vec::new(), 0));
        }
        let eps = cfg.rms_norm_eps;
        let mut cat = vec![0f32; n * 2 * h]; // [n, 2 * hidden]: [enorm(e) | hnorm(h)]
        let mut e = vec![0f32; h]; // [hidden]
        for i in 0..n {
            if zero_embed[i] {
                e.fill(0.0);
            } else {
                matrix_row_f32(&self.embed, tokens[i] as usize, &mut e);
            }
            let row = &mut cat[i * 2 * h..(i + 1) * 2 * h];
            let (en, hn) = row.split_at_mut(h);
            rms_norm(&e, &mtp.enorm, eps, en);
            rms_norm(&prev[i * h..(i + 1) * h], &mtp.hnorm, eps, hn);
        }
        let mut x = vec![0f32; n * h]; // [n, hidden]
        matmul(&mtp.eh_proj, &cat, n, &mut x);
        // one embedding row per token, eh_proj; the layer adds its own
        let mut bytes = self.embedding_bytes(n) + mtp.eh_proj.nbytes() as u64;
        decoder_layer_on(
            &CpuBackend,
            cfg,
            &self.rope,
            &mtp.layer,
            0,
            &mut x,
            &pos,
            chunks,
            kv,
            &mut bytes,
        )?;
        let rows = logit_rows(chunks);
        let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
        for_each_row(&mut hs, h, rows.len() * h, |i, o| {
            rms_norm(&x[rows[i] * h..(rows[i] + 1) * h], &mtp.head_norm, eps, o)
        });
        let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
        if !rows.is_empty() {
            let head = mtp.head.as_ref().unwrap_or(self.lm_head());
            matmul(head, &hs, rows.len(), &mut logits);
            bytes += head.nbytes() as u64;
        }
        Ok((logits, x, bytes))
    }
}

/// Per batch row of `chunks`, whether it sits at the absolute position 0 (cache position 0 of a
/// chunk whose shift is 0): the MTP layer zeroes the embedding there.
fn first_position_rows(chunks: &[SeqChunk], shifts: &[usize]) -> Result<Vec<bool>> {
    if shifts.len() != chunks.len() {
        return Err(Error::InvalidArgument(format!(
            "MTP forward: {} position shifts for {} chunks",
            shifts.len(),
            chunks.len()
        )));
    }
    let mut rows = Vec::new(); // [n]
    for (ch, &shift) in chunks.iter().zip(shifts) {
        rows.extend((0..ch.tokens.len()).map(|i| shift == 0 && ch.start + i == 0));
    }
    Ok(rows)
}

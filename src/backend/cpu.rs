//! The CPU backend: today's batch-invariant kernels (`kernels`) behind the seam. Each op is the
//! code the forward called directly before the seam existed, so results are bitwise unchanged.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{for_each_row, matmul, matrix_row_f32, rms_norm, Matrix};
use crate::kv::KvCache;
use crate::model::attention::mla_attention;
use crate::model::forward::norm_rows;
use crate::model::moe::{mlp, moe};
use crate::model::rope::Rope;
use crate::model::{Attention, Ffn, SeqChunk};

use super::Backend;

/// The CPU kernels on the current rayon pool (the engine's, with its pinned ISA).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Act = Vec<f32>;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn embed(&self, embed: &Matrix, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = embed.cols;
        let n = tokens.len();
        let mut x = vec![0f32; n * h]; // [n, hidden]
        for_each_row(&mut x, h, n * h, |i, row| {
            matrix_row_f32(embed, tokens[i] as usize, row)
        });
        Ok(x)
    }

    fn rms_norm(&self, x: &Vec<f32>, n: usize, w: &[f32], eps: f32) -> Result<Vec<f32>> {
        let mut y = vec![0f32; n * w.len()]; // [n, width]
        norm_rows(x, w, eps, &mut y);
        Ok(y)
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
        Ok(())
    }

    fn attention(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        a: &Attention,
        kv_layer: usize,
        xn: &Vec<f32>,
        pos: &[usize],
        chunks: &[SeqChunk],
        kv: &mut KvCache,
    ) -> Result<Vec<f32>> {
        Ok(mla_attention(cfg, rope, a, kv_layer, xn, pos, chunks, kv))
    }

    fn ffn(
        &self,
        cfg: &ModelConfig,
        f: &Ffn,
        xn: &Vec<f32>,
        n: usize,
    ) -> Result<(Vec<f32>, usize)> {
        Ok(match f {
            Ffn::Dense(e) => (mlp(e, xn, n), e.nbytes()),
            Ffn::Moe(m) => {
                let moe_cfg = cfg.moe.as_ref().expect("MoE layer without MoE config");
                moe(m, moe_cfg, cfg.model_type, xn, n)
            }
        })
    }

    fn logits(
        &self,
        x: &Vec<f32>,
        n: usize,
        norm: &[f32],
        eps: f32,
        lm_head: &Matrix,
        rows: &[usize],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let h = norm.len();
        let vocab = lm_head.rows;
        // Every row when the caller wants the hidden states (the logit rows are taken from
        // them), else only the logit rows.
        let hidden = if want_hidden {
            self.rms_norm(x, n, norm, eps)?
        } else {
            Vec::new()
        };
        let mut hs = vec![0f32; rows.len() * h]; // [n_rows, hidden]
        for (i, &r) in rows.iter().enumerate() {
            let o = &mut hs[i * h..(i + 1) * h];
            if want_hidden {
                o.copy_from_slice(&hidden[r * h..(r + 1) * h]);
            } else {
                rms_norm(&x[r * h..(r + 1) * h], norm, eps, o);
            }
        }
        let mut logits = vec![0f32; rows.len() * vocab]; // [n_rows, vocab]
        if !rows.is_empty() {
            matmul(lm_head, &hs, rows.len(), &mut logits);
        }
        Ok((logits, hidden))
    }
}

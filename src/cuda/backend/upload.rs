//! Uploading a model's weights to the device once, when the backend is created, and finding a
//! host weight's device copy (keyed by the host weight's address). Part of [`super::CudaBackend`].

use super::*;

impl CudaBackend {
    pub(super) fn upload_matrix(&mut self, m: &Matrix) -> Result<()> {
        let s = self.gpu.stream().clone();
        let (rows, cols) = (m.rows, m.cols);
        let w = match &m.data {
            // row-major on the device (strips, the CPU avx2 level's layout, unpacked)
            MatrixData::Bf16(_) | MatrixData::Bf16Strips(_) if cols % 8 == 0 => {
                let v = m.bf16_row_major().expect("bf16"); // [rows, cols]
                DevW::Bf16(s.clone_htod(&v[..]).map_err(drv)?)
            }
            MatrixData::Fp8 {
                data,
                scale_inv,
                block_rows: 128,
                block_cols: 128,
            } if cols % 128 == 0 => DevW::Fp8(
                s.clone_htod(&data[..]).map_err(drv)?,
                s.clone_htod(&scale_inv[..]).map_err(drv)?,
            ),
            MatrixData::F32(v) => DevW::F32(s.clone_htod(&v[..]).map_err(drv)?),
            _ => {
                // f16, odd widths, other fp8 blocks: widened to f32 row by row (exact for
                // f16 / bf16; fp8 times its block scale as the CPU decodes it).
                let mut f = vec![0f32; rows * cols]; // [rows, cols]
                for r in 0..rows {
                    matrix_row_f32(m, r, &mut f[r * cols..(r + 1) * cols]);
                }
                DevW::F32(s.clone_htod(&f).map_err(drv)?)
            }
        };
        self.weight_bytes += m.nbytes();
        self.mats.insert(key(m), DevMat { rows, cols, w });
        Ok(())
    }

    pub(super) fn upload_vec(&mut self, v: &[f32]) -> Result<()> {
        let d = self.gpu.stream().clone_htod(v).map_err(drv)?;
        self.weight_bytes += v.len() * 4;
        self.vecs.insert(v.as_ptr() as usize, d);
        Ok(())
    }

    pub(super) fn upload_expert(&mut self, e: &Expert) -> Result<()> {
        for m in [&e.gate, &e.up, &e.down] {
            self.upload_matrix(m)?;
        }
        Ok(())
    }

    pub(super) fn upload_model(&mut self, model: &Model) -> Result<()> {
        let c = model.config.clone();
        let (nh, nope, v, kvl) = (
            c.num_attention_heads,
            c.qk_nope_head_dim,
            c.v_head_dim,
            c.kv_lora_rank,
        );
        self.upload_matrix(model.lm_head())?;
        self.upload_vec(&model.norm)?;
        for l in &model.layers {
            self.upload_vec(&l.input_norm)?;
            self.upload_vec(&l.post_norm)?;
            let a = &l.attn;
            if let Some((qa, qn, qb)) = &a.q_lora {
                self.upload_matrix(qa)?;
                self.upload_vec(qn)?;
                self.upload_matrix(qb)?;
            }
            if let Some(q) = &a.q_proj {
                self.upload_matrix(q)?;
            }
            self.upload_matrix(&a.kv_a_proj)?;
            self.upload_vec(&a.kv_a_norm)?;
            self.upload_matrix(&a.o_proj)?;
            let mut uk = vec![0f32; nh * kvl * nope]; // [H, kv_lora, nope]
            let mut uv = vec![0f32; nh * v * kvl]; // [H, v, kv_lora]
            for h in 0..nh {
                for r in 0..kvl {
                    let o = (h * kvl + r) * nope;
                    matrix_row_f32(&a.w_uk_t[h], r, &mut uk[o..o + nope]);
                }
                for r in 0..v {
                    let o = (h * v + r) * kvl;
                    matrix_row_f32(&a.w_uv[h], r, &mut uv[o..o + kvl]);
                }
            }
            let s = self.gpu.stream().clone();
            self.weight_bytes += (uk.len() + uv.len()) * 4;
            self.absorb.insert(
                key(a),
                DevAbsorb {
                    uk: s.clone_htod(&uk).map_err(drv)?,
                    uv: s.clone_htod(&uv).map_err(drv)?,
                },
            );
            match &l.ffn {
                Ffn::Dense(e) => self.upload_expert(e)?,
                Ffn::Moe(m) => {
                    let ne = m.experts.len();
                    let w = DevW::F32(self.gpu.stream().clone_htod(&m.gate).map_err(drv)?);
                    let (rows, cols) = (ne, m.gate.len() / ne.max(1));
                    self.weight_bytes += m.gate.len() * 4;
                    self.routers
                        .insert(m.gate.as_ptr() as usize, DevMat { rows, cols, w });
                    if let Some(sh) = &m.shared {
                        self.upload_expert(sh)?;
                    }
                    if stackable(m) {
                        self.upload_experts(m)?;
                    } else {
                        for e in &m.experts {
                            self.upload_expert(e)?;
                        }
                    }
                }
            }
        }
        self.gpu.synchronize()
    }

    pub(super) fn upload_experts(&mut self, m: &Moe) -> Result<()> {
        let bits = |w: &Matrix| -> Vec<u16> {
            match w.bf16_row_major() {
                Some(v) => v.into_owned(), // [rows, cols]
                None => unreachable!("stackable() admits bf16 experts only"),
            }
        };
        let inter = m.experts.first().map_or(0, |e| e.gate.rows);
        let (mut g, mut u, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for e in &m.experts {
            g.extend(bits(&e.gate));
            u.extend(bits(&e.up));
            d.extend(bits(&e.down));
            self.weight_bytes += e.nbytes();
        }
        let s = self.gpu.stream().clone();
        self.experts.insert(
            key(m),
            DevExperts {
                gate: s.clone_htod(&g).map_err(drv)?,
                up: s.clone_htod(&u).map_err(drv)?,
                down: s.clone_htod(&d).map_err(drv)?,
                inter,
            },
        );
        Ok(())
    }

    pub(super) fn mat(&self, m: &Matrix) -> Result<&DevMat> {
        self.mats.get(&key(m)).ok_or_else(|| {
            Error::Engine(format!(
                "CUDA backend: a [{}, {}] weight is not on the device (not this backend's model)",
                m.rows, m.cols
            ))
        })
    }

    pub(super) fn vec(&self, v: &[f32]) -> Result<&CudaSlice<f32>> {
        self.vecs
            .get(&(v.as_ptr() as usize))
            .ok_or_else(|| Error::Engine("CUDA backend: a norm weight is not on the device".into()))
    }
}

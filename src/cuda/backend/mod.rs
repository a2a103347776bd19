//! The CUDA backend: the forward pass's operators (`backend::Backend`) on one NVIDIA GPU, with
//! the kernels of `kernels/*.cu` over device-resident weights, activations and latent cache.
//!
//! Where it sits: `EngineConfig::device = Device::Cuda(n)` makes the engine run its TARGET's
//! forward through a [`CudaBackend`] (`Model::forward_on`), and a draft model's too when it can
//! run here (`engine::swap` gives it its own backend on the same device); the MTP layer, the
//! sampler, the scheduler and the budget stay on the host, unchanged. The model's weights are uploaded once, when the
//! backend is created (bf16 and fp8 with 128x128 block scales stay in their storage precision;
//! f16 is widened to f32 exactly; the absorbed per-head MLA matrices W_UK^T / W_UV are stacked as
//! f32; bf16 routed experts as [E, ...] stacks). Device copies are found from the weights the
//! forward hands an op (keyed by the host weight's address: the `Model` is immutable and shared
//! by `Arc` while the backend lives). The latent cache lives on the device, one buffer per layer
//! laid out like the host pool (`[num_blocks * block_size, kv_lora + rope]` bf16) and addressed
//! through the host cache's block tables, keyed by `KvCache::uid`.
//!
//! What each op does on the device: RMSNorm, residual add, small-n GEMMs (`gemm_*_smalln`, in
//! passes of 16 tokens), interleaved RoPE (cos / sin of this forward's positions computed on the
//! host by the CPU's `Rope`, so both backends rotate by the same values), the latent KV write,
//! absorbed MLA attention for EVERY token (`mla_decode_split` + `combine`; prompt tokens too —
//! the CPU takes decompressed MHA for them, the same function up to rounding), MoE routing logits
//! on the device with the selection on the host (`model::moe::route`, every routing method of the
//! CPU), grouped SwiGLU experts, the logits rows. Results agree with the CPU backend within
//! rounding (f32 FMA order differs), not bitwise; every kernel is batch invariant, so greedy
//! speculation on the GPU is exact against plain GPU decoding.
//!
//! STATUS: compiled and type-checked on every build, NEVER RUN ON A GPU (none was available when
//! it was written): `scripts/gpu-check.sh` runs the golden fixtures through it on a GPU machine.
//! Refused at creation with a clear error (never a panic): a missing driver or device, DeepSeek-V4,
//! V3.2's indexer, latent / rope widths above 512 / 64. Routed experts in bf16 run grouped (one
//! launch per stage for all assignments); others (the official fp8 checkpoints) expert by expert.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::{matrix_row_f32, Matrix, MatrixData};
use crate::kv::{KvCache, KvDtype};
use crate::model::moe::route;
use crate::model::rope::Rope;
use crate::model::{Attention, Expert, Ffn, Model, Moe, SeqChunk};

use super::device::{drv, Gpu};

mod moe;
mod tables;
mod upload;

pub(crate) use tables::{rope_tables, seq_tables};

/// Tokens per small-n GEMM launch (the kernels' register tile).
const GEMM_N: usize = 16;
/// q-LoRA / kv-LoRA norms use eps 1e-6 (as `model::attention`).
const LORA_NORM_EPS: f32 = 1e-6;

fn grid(g: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: g,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn g1(n: usize) -> (u32, u32, u32) {
    (n.max(1) as u32, 1, 1)
}

/// A weight matrix on the device, in the precision its GEMM kernel reads.
enum DevW {
    Bf16(CudaSlice<u16>),
    /// e4m3 bytes + [ceil(rows / 128), cols / 128] scales.
    Fp8(CudaSlice<u8>, CudaSlice<f32>),
    F32(CudaSlice<f32>),
}

struct DevMat {
    rows: usize,
    cols: usize,
    w: DevW,
}

/// Routed experts of one MoE layer as stacks: gate / up [E, inter, hidden], down [E, hidden, inter].
struct DevExperts {
    gate: CudaSlice<u16>,
    up: CudaSlice<u16>,
    down: CudaSlice<u16>,
    inter: usize,
}

/// One layer's absorbed MLA matrices: uk [H, kv_lora, nope] (W_UK^T per head), uv [H, v, kv_lora].
struct DevAbsorb {
    uk: CudaSlice<f32>,
    uv: CudaSlice<f32>,
}

/// The target's forward on one CUDA device (see the module doc).
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    ordinal: usize,
    mats: HashMap<usize, DevMat>,
    vecs: HashMap<usize, CudaSlice<f32>>,
    experts: HashMap<usize, DevExperts>,
    absorb: HashMap<usize, DevAbsorb>,
    /// MoE routers [E, hidden] f32, keyed by the router vector's address.
    routers: HashMap<usize, DevMat>,
    /// Latent cache per host cache (`KvCache::uid`): one [slots, kv_lora + rope] bf16 buffer per layer.
    kv: Mutex<HashMap<u64, Vec<CudaSlice<u16>>>>,
    /// Bytes uploaded at creation.
    pub weight_bytes: usize,
}

/// Routed experts that go to the grouped kernels as [E, ...] stacks: bf16, one width, rows of a
/// multiple of 8 values. Others (fp8 blocks, f16, ...) keep one device matrix per expert and run
/// expert by expert through the small-n GEMMs.
fn stackable(m: &Moe) -> bool {
    let inter = m.experts.first().map_or(0, |e| e.gate.rows);
    m.experts.iter().all(|e| {
        e.gate.rows == inter
            && [&e.gate, &e.up, &e.down].iter().all(|w| {
                matches!(w.data, MatrixData::Bf16(_) | MatrixData::Bf16Strips(_)) && w.cols % 8 == 0
            })
    })
}

fn key<T>(r: &T) -> usize {
    r as *const T as usize
}

impl CudaBackend {
    /// Open device `ordinal` (kernels from NVRTC, else cubins from `cubin_dir`) and upload
    /// `model`'s weights. Errors: no driver / device, or a model this backend does not run yet.
    pub fn new(model: &Model, ordinal: usize, cubin_dir: Option<&std::path::Path>) -> Result<Self> {
        Self::check_model(model)?;
        let gpu = Arc::new(Gpu::open(ordinal, cubin_dir)?);
        let mut b = CudaBackend {
            gpu,
            ordinal,
            mats: HashMap::new(),
            vecs: HashMap::new(),
            experts: HashMap::new(),
            absorb: HashMap::new(),
            routers: HashMap::new(),
            kv: Mutex::new(HashMap::new()),
            weight_bytes: 0,
        };
        b.upload_model(model)?;
        Ok(b)
    }

    /// What this backend runs (checked before any device is touched).
    pub fn check_model(model: &Model) -> Result<()> {
        let c = &model.config;
        let no = |why: String| Err(Error::InvalidArgument(format!("CUDA backend: {why}")));
        if model.v4.is_some() {
            return no("DeepSeek-V4 models run on the CPU backend only (for now)".into());
        }
        if c.indexer.is_some() {
            return no("V3.2's lightning indexer has no CUDA kernels yet".into());
        }
        if c.kv_lora_rank > 512 || c.qk_rope_head_dim > 64 || !c.qk_rope_head_dim.is_multiple_of(2)
        {
            return no(format!(
                "kv_lora_rank {} / qk_rope_head_dim {}: the MLA kernel takes at most 512 / 64 (even)",
                c.kv_lora_rank, c.qk_rope_head_dim
            ));
        }
        Ok(())
    }

    /// The latent-cache dtype this backend's attention reads (bf16 only: the MLA kernel).
    pub fn check_cache_dtype(dtype: KvDtype) -> Result<()> {
        if dtype != KvDtype::Bf16 {
            return Err(Error::InvalidArgument(format!(
                "CUDA backend: the latent cache must be bf16 (kv_dtype {dtype:?}), the MLA kernel \
                 reads bf16"
            )));
        }
        Ok(())
    }

    fn s(&self) -> &Arc<CudaStream> {
        self.gpu.stream()
    }

    fn zeros(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.s().alloc_zeros::<f32>(n.max(1)).map_err(drv)
    }

    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>> {
        self.s().clone_htod(v).map_err(drv)
    }

    /// y[n, rows] = x[n, cols] · Wᵀ, in passes of 16 tokens.
    fn gemm(&self, m: &Matrix, x: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<f32>> {
        self.gemm_dev(self.mat(m)?, x, n)
    }

    /// [`CudaBackend::gemm`] over a device matrix.
    fn gemm_dev(&self, dm: &DevMat, x: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<f32>> {
        let (rows, cols) = (dm.rows, dm.cols);
        let mut y = self.zeros(n * rows)?; // [n, rows]
        let s = self.s();
        for t0 in (0..n).step_by(GEMM_N) {
            let k = GEMM_N.min(n - t0);
            let xv = x.slice(t0 * cols..(t0 + k) * cols);
            let mut yv = y.slice_mut(t0 * rows..(t0 + k) * rows);
            let (r, c, kk) = (rows as i32, cols as i32, k as i32);
            let cfg = grid(g1(rows.div_ceil(8)), 256);
            match &dm.w {
                DevW::Bf16(w) => {
                    let mut b = s.launch_builder(self.gpu.func("gemm_bf16_smalln")?);
                    b.arg(w).arg(&xv).arg(&mut yv).arg(&r).arg(&c).arg(&kk);
                    // SAFETY: kernels/gemm_bf16.cu's signature; cols % 8 == 0 (upload_matrix).
                    unsafe { b.launch(cfg) }.map_err(drv)?;
                }
                DevW::Fp8(w, sc) => {
                    let mut b = s.launch_builder(self.gpu.func("gemm_fp8_block_smalln")?);
                    b.arg(w)
                        .arg(sc)
                        .arg(&xv)
                        .arg(&mut yv)
                        .arg(&r)
                        .arg(&c)
                        .arg(&kk);
                    // SAFETY: kernels/gemm_fp8.cu's signature; cols % 128 == 0 (upload_matrix).
                    unsafe { b.launch(cfg) }.map_err(drv)?;
                }
                DevW::F32(w) => {
                    let mut b = s.launch_builder(self.gpu.func("gemm_f32_smalln")?);
                    b.arg(w).arg(&xv).arg(&mut yv).arg(&r).arg(&c).arg(&kk);
                    // SAFETY: kernels/gemm_f32.cu's signature.
                    unsafe { b.launch(cfg) }.map_err(drv)?;
                }
            }
        }
        Ok(y)
    }

    /// dst[r, dst_off..+width] = src[r, src_off..+width] for `rows` rows.
    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        &self,
        src: &CudaSlice<f32>,
        src_stride: usize,
        src_off: usize,
        dst: &mut CudaSlice<f32>,
        dst_stride: usize,
        dst_off: usize,
        width: usize,
        rows: usize,
    ) -> Result<()> {
        let a = [src_stride, src_off, dst_stride, dst_off, width].map(|v| v as i32);
        let mut b = self.s().launch_builder(self.gpu.func("copy_cols_f32")?);
        b.arg(src)
            .arg(&a[0])
            .arg(&a[1])
            .arg(dst)
            .arg(&a[2])
            .arg(&a[3])
            .arg(&a[4]);
        // SAFETY: kernels/elementwise.cu's signature; the caller's strides cover the buffers.
        unsafe { b.launch(grid(g1(rows), 128)) }.map_err(drv)?;
        Ok(())
    }

    fn norm_rows(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        w: &CudaSlice<f32>,
        cols: usize,
        eps: f32,
    ) -> Result<CudaSlice<f32>> {
        let mut y = self.zeros(n * cols)?;
        let c = cols as i32;
        let mut b = self.s().launch_builder(self.gpu.func("rms_norm_f32")?);
        b.arg(x).arg(w).arg(&mut y).arg(&c).arg(&eps);
        // SAFETY: kernels/rmsnorm.cu's signature.
        unsafe { b.launch(grid(g1(n), 256)) }.map_err(drv)?;
        Ok(y)
    }

    /// Interleaved RoPE in place on dims [offset, offset + rope) of every head of x [n, heads, head_dim].
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        n: usize,
        tables: &(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<i32>),
        heads: usize,
        head_dim: usize,
        offset: usize,
        rope_dim: usize,
    ) -> Result<()> {
        let a = [heads, head_dim, offset, rope_dim, n].map(|v| v as i32);
        let mut b = self
            .s()
            .launch_builder(self.gpu.func("rope_interleaved_f32")?);
        b.arg(x).arg(&tables.2).arg(&tables.0).arg(&tables.1);
        b.arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]);
        // SAFETY: kernels/rope.cu's signature; the table has one row per token (index t).
        unsafe { b.launch(grid(g1(n), 128)) }.map_err(drv)?;
        Ok(())
    }

    /// The device latent cache of `kv` (created zeroed on first use).
    fn with_kv<R>(
        &self,
        kv: &KvCache,
        f: impl FnOnce(&mut Vec<CudaSlice<u16>>) -> Result<R>,
    ) -> Result<R> {
        let kc = kv.config();
        let g = &kc.groups[KvCache::LATENT];
        Self::check_cache_dtype(g.dtype)?;
        let width: usize = g.kind.parts().iter().sum();
        let mut map = self
            .kv
            .lock()
            .map_err(|_| Error::Engine("CUDA backend: KV map poisoned".into()))?;
        if let std::collections::hash_map::Entry::Vacant(e) = map.entry(kv.uid()) {
            let slots = kc.num_blocks * kc.block_size;
            let mut layers = Vec::with_capacity(g.num_layers);
            for _ in 0..g.num_layers {
                layers.push(self.s().alloc_zeros::<u16>(slots * width).map_err(drv)?);
            }
            e.insert(layers);
        }
        f(map.get_mut(&kv.uid()).expect("inserted above"))
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, len: usize) -> Result<()> {
        let l = len as i32;
        let mut b = self.s().launch_builder(self.gpu.func("add_inplace_f32")?);
        b.arg(x).arg(y).arg(&l);
        // SAFETY: kernels/elementwise.cu's signature; both hold len values.
        unsafe { b.launch(grid(g1(len.div_ceil(256)), 256)) }.map_err(drv)?;
        Ok(())
    }
}

/// Activations on the device: [n, width] f32.
pub struct DevAct {
    pub(crate) buf: CudaSlice<f32>,
    pub(crate) len: usize,
}

impl Backend for CudaBackend {
    type Act = DevAct;

    fn name(&self) -> String {
        format!(
            "cuda:{} ({}, {})",
            self.ordinal, self.gpu.name, self.gpu.arch
        )
    }

    fn embed(&self, embed: &Matrix, tokens: &[u32]) -> Result<DevAct> {
        let h = embed.cols;
        let mut x = vec![0f32; tokens.len() * h]; // [n, hidden], rows read from the host mapping
        for (i, &t) in tokens.iter().enumerate() {
            matrix_row_f32(embed, t as usize, &mut x[i * h..(i + 1) * h]);
        }
        Ok(DevAct {
            len: x.len(),
            buf: self.up(&x)?,
        })
    }

    fn rms_norm(&self, x: &DevAct, n: usize, w: &[f32], eps: f32) -> Result<DevAct> {
        let dw = self.vec(w)?;
        Ok(DevAct {
            buf: self.norm_rows(&x.buf, n, dw, w.len(), eps)?,
            len: n * w.len(),
        })
    }

    fn add_assign(&self, x: &mut DevAct, y: &DevAct) -> Result<()> {
        if x.len != y.len {
            return Err(Error::Engine(
                "CUDA backend: residual add of unequal shapes".into(),
            ));
        }
        self.add(&mut x.buf, &y.buf, x.len)
    }

    fn attention(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        a: &Attention,
        kv_layer: usize,
        xn: &DevAct,
        pos: &[usize],
        chunks: &[SeqChunk],
        kv: &mut KvCache,
    ) -> Result<DevAct> {
        let n = pos.len();
        let nh = cfg.num_attention_heads;
        let (nope, rdim, vdim, kvl) = (
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        );
        let (qk, kvd) = (nope + rdim, kvl + rdim);
        let x = &xn.buf;
        // projections: q [n, H, qk]; ckv [n, kv_lora + rope]
        let mut q = if let Some((qa, qa_norm, qb)) = &a.q_lora {
            let ql = self.gemm(qa, x, n)?; // [n, q_lora]
            let qn = self.norm_rows(&ql, n, self.vec(qa_norm)?, qa.rows, LORA_NORM_EPS)?;
            self.gemm(qb, &qn, n)?
        } else {
            let qp = a
                .q_proj
                .as_ref()
                .ok_or_else(|| Error::Engine("attention without q projection".into()))?;
            self.gemm(qp, x, n)?
        };
        let ckv = self.gemm(&a.kv_a_proj, x, n)?; // [n, kvd]
        let mut c = self.zeros(n * kvl)?; // [n, kv_lora]
        self.copy_cols(&ckv, kvd, 0, &mut c, kvl, 0, kvl, n)?;
        let c = self.norm_rows(&c, n, self.vec(&a.kv_a_norm)?, kvl, LORA_NORM_EPS)?;
        let mut kpe = self.zeros(n * rdim)?; // [n, rope]
        self.copy_cols(&ckv, kvd, kvl, &mut kpe, rdim, 0, rdim, n)?;
        // RoPE tables for this forward's positions, from the CPU's Rope (same values)
        let (cos, sin) = rope_tables(rope, pos, rdim); // [n, rope / 2] each
        let idx: Vec<i32> = (0..n as i32).collect();
        let tables = (self.up(&cos)?, self.up(&sin)?, self.up(&idx)?);
        let mut kpe = kpe;
        self.rope(&mut kpe, n, &tables, 1, rdim, 0, rdim)?;
        self.rope(&mut q, n, &tables, nh, qk, nope, rdim)?;
        // the new slots [c | k_pe], written into the device cache at the host table's slots
        let mut slot_rows = self.zeros(n * kvd)?; // [n, kvd]
        self.copy_cols(&c, kvl, 0, &mut slot_rows, kvd, 0, kvl, n)?;
        self.copy_cols(&kpe, rdim, 0, &mut slot_rows, kvd, kvl, rdim, n)?;
        let bs = kv.config().block_size;
        let (slots, q_seq, table, max_blocks) = seq_tables(chunks, bs)?;
        let q_pos: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let (dslots, dtable, dseq, dpos) = (
            self.up(&slots)?,
            self.up(&table)?,
            self.up(&q_seq)?,
            self.up(&q_pos)?,
        );
        // absorbed queries: q_lat [n*H, kv_lora] = W_UK^T[h] q_nope; q_pe [n*H, rope]
        let ab = self.absorb.get(&key(a)).ok_or_else(|| {
            Error::Engine("CUDA backend: attention weights not on the device".into())
        })?;
        let mut q_nope = self.zeros(n * nh * nope)?;
        self.copy_cols(&q, qk, 0, &mut q_nope, nope, 0, nope, n * nh)?;
        let mut q_pe = self.zeros(n * nh * rdim)?;
        self.copy_cols(&q, qk, nope, &mut q_pe, rdim, 0, rdim, n * nh)?;
        let heads_of: Vec<i32> = (0..n * nh).map(|i| (i % nh) as i32).collect();
        let dheads = self.up(&heads_of)?;
        let q_lat = self.gemm_grouped(&ab.uk, kvl, nope, &q_nope, &dheads, n * nh)?; // [n*H, kv_lora]
        let longest = pos.iter().copied().max().unwrap_or(0) + 1;
        let n_splits = longest.div_ceil(256);
        let mut ctx = self.zeros(n * nh * kvl)?; // [n, H, kv_lora]
        let scale = cfg.softmax_scale();
        // split-KV partials are [tokens, H, n_splits, kv_lora]: query tokens go in passes so
        // they stay within PARTIAL_BYTES (a long prompt chunk at a long context would not fit)
        const PARTIAL_BYTES: usize = 256 << 20;
        let per_token = nh * n_splits * (kvl + 2) * 4;
        let pass = (PARTIAL_BYTES / per_token.max(1)).clamp(1, n.max(1));
        self.with_kv(kv, |layers| {
            let cache = layers
                .get_mut(kv_layer)
                .ok_or_else(|| Error::Engine(format!("CUDA backend: no KV layer {kv_layer}")))?;
            let s = self.s();
            let w = kvd as i32;
            let mut b = s.launch_builder(self.gpu.func("kv_write_bf16")?);
            b.arg(&slot_rows).arg(&dslots).arg(&mut *cache).arg(&w);
            // SAFETY: kernels/kv_write.cu's signature; every slot < num_blocks * block_size.
            unsafe { b.launch(grid(g1(n), 128)) }.map_err(drv)?;
            let (mb, bsz, h, ns, lat, rp) = (
                max_blocks as i32,
                bs as i32,
                nh as i32,
                n_splits as i32,
                kvl as i32,
                rdim as i32,
            );
            let mut ml = self.zeros(pass * nh * n_splits * 2)?;
            let mut acc = self.zeros(pass * nh * n_splits * kvl)?;
            for t0 in (0..n).step_by(pass) {
                let m = pass.min(n - t0);
                let (sv, pv) = (dseq.slice(t0..t0 + m), dpos.slice(t0..t0 + m));
                let qlv = q_lat.slice(t0 * nh * kvl..(t0 + m) * nh * kvl);
                let qpv = q_pe.slice(t0 * nh * rdim..(t0 + m) * nh * rdim);
                let mut b = s.launch_builder(self.gpu.func("mla_decode_split")?);
                b.arg(&*cache)
                    .arg(&dtable)
                    .arg(&mb)
                    .arg(&bsz)
                    .arg(&sv)
                    .arg(&pv);
                b.arg(&qlv)
                    .arg(&qpv)
                    .arg(&scale)
                    .arg(&h)
                    .arg(&ns)
                    .arg(&lat)
                    .arg(&rp);
                b.arg(&mut ml).arg(&mut acc);
                // SAFETY: kernels/mla_decode.cu's signature; the tables index reserved blocks;
                // the partials hold `pass` >= m tokens.
                unsafe { b.launch(grid((m as u32, nh as u32, n_splits as u32), 128)) }
                    .map_err(drv)?;
                let mut cv = ctx.slice_mut(t0 * nh * kvl..(t0 + m) * nh * kvl);
                let mut b = s.launch_builder(self.gpu.func("mla_decode_combine")?);
                b.arg(&ml).arg(&acc).arg(&h).arg(&ns).arg(&lat).arg(&mut cv);
                // SAFETY: as above.
                unsafe { b.launch(grid((m as u32, nh as u32, 1), 128)) }.map_err(drv)?;
            }
            Ok(())
        })?;
        // o^h = W_UV^h ctx^h -> [n, H, v]; then o_proj
        let attn = self.gemm_grouped(&ab.uv, vdim, kvl, &ctx, &dheads, n * nh)?;
        let out = self.gemm(&a.o_proj, &attn, n)?; // [n, hidden]
        Ok(DevAct {
            buf: out,
            len: n * cfg.hidden_size,
        })
    }

    fn ffn(&self, cfg: &ModelConfig, f: &Ffn, xn: &DevAct, n: usize) -> Result<(DevAct, usize)> {
        let (buf, bytes) = match f {
            Ffn::Dense(e) => (self.mlp(e, &xn.buf, n)?, e.nbytes()),
            Ffn::Moe(m) => self.moe(cfg, m, &xn.buf, n)?,
        };
        Ok((
            DevAct {
                buf,
                len: n * cfg.hidden_size,
            },
            bytes,
        ))
    }

    fn logits(
        &self,
        x: &DevAct,
        n: usize,
        norm: &[f32],
        eps: f32,
        lm_head: &Matrix,
        rows: &[usize],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let h = norm.len();
        let xn = self.norm_rows(&x.buf, n, self.vec(norm)?, h, eps)?; // [n, hidden]
        let hidden = if want_hidden {
            self.s().clone_dtoh(&xn).map_err(drv)?
        } else {
            Vec::new()
        };
        if rows.is_empty() {
            return Ok((Vec::new(), hidden));
        }
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let didx = self.up(&idx)?;
        let mut hs = self.zeros(rows.len() * h)?; // [n_rows, hidden]
        let w = h as i32;
        let mut b = self.s().launch_builder(self.gpu.func("gather_rows_f32")?);
        b.arg(&xn).arg(&didx).arg(&mut hs).arg(&w);
        // SAFETY: kernels/elementwise.cu's signature; rows < n.
        unsafe { b.launch(grid(g1(rows.len()), 128)) }.map_err(drv)?;
        let lg = self.gemm(lm_head, &hs, rows.len())?; // [n_rows, vocab]
        let logits = self.s().clone_dtoh(&lg).map_err(drv)?;
        Ok((logits, hidden))
    }
}

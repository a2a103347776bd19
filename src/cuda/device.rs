//! A CUDA device with every kernel of `kernels/` loaded, and one host-side call per kernel
//! (upload, launch, download) — what `specmla gpu-check` compares against the CPU backend.
//!
//! Kernels are compiled by NVRTC for the device's own architecture when NVRTC loads, else read
//! as cubins from a directory (`specmla cuda-check --out DIR` writes them on any machine), so a
//! GPU machine needs only the driver. A machine without a driver, or without a device, gives an
//! error (`Gpu::open`), never a panic.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};

use super::kernels::kernel_sources;

pub(crate) fn drv(e: impl std::fmt::Debug) -> Error {
    Error::Engine(format!("CUDA: {e:?}"))
}

static DEFAULT_CUBIN_DIR: std::sync::Mutex<Option<std::path::PathBuf>> =
    std::sync::Mutex::new(None);

/// Whether the CUDA driver library (libcuda.so) loads on this machine (no device is opened).
pub fn driver_present() -> bool {
    // SAFETY: only probes whether the library loads.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Where [`Gpu::open`] reads cubins when it is given no directory and NVRTC does not load (a
/// GPU machine without the NVRTC wheel: `specmla gpu-check --cubin-dir` sets it for the engines
/// it creates). Process-wide.
pub fn set_default_cubin_dir(dir: Option<std::path::PathBuf>) {
    if let Ok(mut d) = DEFAULT_CUBIN_DIR.lock() {
        *d = dir;
    }
}

/// An open device with the kernels loaded.
pub struct Gpu {
    pub name: String,
    /// e.g. "sm_90"
    pub arch: String,
    stream: Arc<CudaStream>,
    funcs: HashMap<String, CudaFunction>,
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// Device `ordinal`; kernels from NVRTC, else from `cubin_dir/<file>.<arch>.cubin`.
    pub fn open(ordinal: usize, cubin_dir: Option<&Path>) -> Result<Gpu> {
        if !driver_present() {
            return Err(Error::Engine(
                "no CUDA driver (libcuda.so cannot be loaded): this machine has no NVIDIA GPU \
                 driver"
                    .into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        let (maj, min) = ctx.compute_capability().map_err(drv)?;
        let arch = format!("sm_{maj}{min}");
        let name = ctx.name().map_err(drv)?;
        let fallback = DEFAULT_CUBIN_DIR.lock().ok().and_then(|d| d.clone());
        let cubin_dir = cubin_dir.or(fallback.as_deref());
        let mut funcs = HashMap::new();
        let cache = cubin_cache_dir();
        for k in kernel_sources() {
            let cached = cache
                .as_ref()
                .map(|d| cache_path(d, k.file, &arch, &k.source));
            let bin = if let Some(b) = cached.as_ref().and_then(|p| std::fs::read(p).ok()) {
                b
            } else if super::nvrtc::available() {
                let b = super::nvrtc::compile(k.file, &k.source, &arch)?.cubin;
                if let Some(p) = &cached {
                    store(p, &b);
                }
                b
            } else {
                let dir = cubin_dir.ok_or_else(|| {
                    Error::Engine(
                        "no NVRTC on this machine: pass a directory of cubins (specmla cuda-check \
                         --out DIR)"
                            .into(),
                    )
                })?;
                let p = dir.join(format!("{}.{arch}.cubin", k.file));
                std::fs::read(&p).map_err(|e| Error::Io { path: p, source: e })?
            };
            let module = ctx.load_module(Ptx::from_binary(bin)).map_err(drv)?;
            for f in kernel_names(&k.source) {
                funcs.insert(f.clone(), module.load_function(&f).map_err(drv)?);
            }
        }
        Ok(Gpu {
            name,
            arch,
            stream: ctx.default_stream(),
            funcs,
        })
    }

    /// A loaded kernel by name.
    pub(crate) fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| Error::Engine(format!("kernel {name} not loaded")))
    }

    /// The stream every launch of this device goes to.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv)
    }

    /// `rms_norm_f32`. x: [rows, cols] -> [rows, cols]
    pub fn rms_norm(&self, x: &[f32], w: &[f32], rows: usize, eps: f32) -> Result<Vec<f32>> {
        let cols = w.len() as i32;
        let s = &self.stream;
        let dx = s.clone_htod(x).map_err(drv)?;
        let dw = s.clone_htod(w).map_err(drv)?;
        let mut dy = s.alloc_zeros::<f32>(x.len()).map_err(drv)?;
        let f = self.func("rms_norm_f32")?;
        let mut b = s.launch_builder(f);
        b.arg(&dx).arg(&dw).arg(&mut dy).arg(&cols).arg(&eps);
        // SAFETY: argument types and sizes match the kernel's signature (kernels/rmsnorm.cu).
        unsafe { b.launch(cfg((rows as u32, 1, 1), 256)) }.map_err(drv)?;
        s.clone_dtoh(&dy).map_err(drv)
    }

    /// `gemm_bf16_smalln`. w: [rows, cols] bf16 bits, x: [n, cols] -> [n, rows]
    pub fn gemm_bf16(&self, w: &[u16], rows: usize, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let cols = w.len() / rows;
        if !cols.is_multiple_of(8) || n == 0 || n > 16 {
            return Err(Error::InvalidArgument(format!(
                "gemm_bf16: cols {cols} must be a multiple of 8 and n {n} in 1..=16"
            )));
        }
        let s = &self.stream;
        let dw = s.clone_htod(w).map_err(drv)?;
        let dx = s.clone_htod(x).map_err(drv)?;
        let mut dy = s.alloc_zeros::<f32>(n * rows).map_err(drv)?;
        let (r, c, nn) = (rows as i32, cols as i32, n as i32);
        let mut b = s.launch_builder(self.func("gemm_bf16_smalln")?);
        b.arg(&dw).arg(&dx).arg(&mut dy).arg(&r).arg(&c).arg(&nn);
        // SAFETY: as the kernel's signature (kernels/gemm_bf16.cu); sizes checked above.
        unsafe { b.launch(cfg((rows.div_ceil(8) as u32, 1, 1), 256)) }.map_err(drv)?;
        s.clone_dtoh(&dy).map_err(drv)
    }

    /// `gemm_fp8_block_smalln`. w: [rows, cols] e4m3, scale: [ceil(rows/128), cols/128],
    /// x: [n, cols] -> [n, rows]
    pub fn gemm_fp8(
        &self,
        w: &[u8],
        scale: &[f32],
        rows: usize,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let cols = w.len() / rows;
        if !cols.is_multiple_of(128) || n == 0 || n > 16 {
            return Err(Error::InvalidArgument(format!(
                "gemm_fp8: cols {cols} must be a multiple of 128 and n {n} in 1..=16"
            )));
        }
        let s = &self.stream;
        let dw = s.clone_htod(w).map_err(drv)?;
        let ds = s.clone_htod(scale).map_err(drv)?;
        let dx = s.clone_htod(x).map_err(drv)?;
        let mut dy = s.alloc_zeros::<f32>(n * rows).map_err(drv)?;
        let (r, c, nn) = (rows as i32, cols as i32, n as i32);
        let mut b = s.launch_builder(self.func("gemm_fp8_block_smalln")?);
        b.arg(&dw)
            .arg(&ds)
            .arg(&dx)
            .arg(&mut dy)
            .arg(&r)
            .arg(&c)
            .arg(&nn);
        // SAFETY: as the kernel's signature (kernels/gemm_fp8.cu); sizes checked above.
        unsafe { b.launch(cfg((rows.div_ceil(8) as u32, 1, 1), 256)) }.map_err(drv)?;
        s.clone_dtoh(&dy).map_err(drv)
    }

    /// Seconds per `gemm_bf16_smalln` launch over device-resident buffers (`reps` launches after
    /// one warm-up, timed between two synchronisations).
    pub fn time_gemm_bf16(
        &self,
        w: &[u16],
        rows: usize,
        x: &[f32],
        n: usize,
        reps: usize,
    ) -> Result<f64> {
        let cols = w.len() / rows;
        let s = &self.stream;
        let dw = s.clone_htod(w).map_err(drv)?;
        let dx = s.clone_htod(x).map_err(drv)?;
        let mut dy = s.alloc_zeros::<f32>(n * rows).map_err(drv)?;
        let (r, c, nn) = (rows as i32, cols as i32, n as i32);
        let f = self.func("gemm_bf16_smalln")?;
        let mut t0 = std::time::Instant::now();
        for i in 0..=reps {
            if i == 1 {
                s.synchronize().map_err(drv)?;
                t0 = std::time::Instant::now();
            }
            let mut b = s.launch_builder(f);
            b.arg(&dw).arg(&dx).arg(&mut dy).arg(&r).arg(&c).arg(&nn);
            // SAFETY: as `gemm_bf16`.
            unsafe { b.launch(cfg((rows.div_ceil(8) as u32, 1, 1), 256)) }.map_err(drv)?;
        }
        s.synchronize().map_err(drv)?;
        Ok(t0.elapsed().as_secs_f64() / reps.max(1) as f64)
    }

    /// `log_softmax_f32`. x: [rows, vocab] -> [rows, vocab]
    pub fn log_softmax(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let vocab = (x.len() / rows) as i32;
        let s = &self.stream;
        let dx = s.clone_htod(x).map_err(drv)?;
        let mut dy = s.alloc_zeros::<f32>(x.len()).map_err(drv)?;
        let mut b = s.launch_builder(self.func("log_softmax_f32")?);
        b.arg(&dx).arg(&mut dy).arg(&vocab);
        // SAFETY: as the kernel's signature (kernels/log_softmax.cu).
        unsafe { b.launch(cfg((rows as u32, 1, 1), 512)) }.map_err(drv)?;
        s.clone_dtoh(&dy).map_err(drv)
    }

    /// `kv_write_bf16` into a zeroed cache of `num_slots` slots. src: [n, width] -> cache bits
    pub fn kv_write_bf16(
        &self,
        src: &[f32],
        width: usize,
        slots: &[i64],
        num_slots: usize,
    ) -> Result<Vec<u16>> {
        let s = &self.stream;
        let dsrc = s.clone_htod(src).map_err(drv)?;
        let dslots = s.clone_htod(slots).map_err(drv)?;
        let mut dc = s.alloc_zeros::<u16>(num_slots * width).map_err(drv)?;
        let w = width as i32;
        let mut b = s.launch_builder(self.func("kv_write_bf16")?);
        b.arg(&dsrc).arg(&dslots).arg(&mut dc).arg(&w);
        // SAFETY: as the kernel's signature (kernels/kv_write.cu); slots < num_slots (caller).
        unsafe { b.launch(cfg((slots.len() as u32, 1, 1), 128)) }.map_err(drv)?;
        s.clone_dtoh(&dc).map_err(drv)
    }

    /// `kv_write_fp8` (entry = [e4m3 x width | f32 scales]) into a zeroed cache.
    pub fn kv_write_fp8(
        &self,
        src: &[f32],
        lat: usize,
        rope: usize,
        entry_bytes: usize,
        slots: &[i64],
        num_slots: usize,
    ) -> Result<Vec<u8>> {
        let s = &self.stream;
        let dsrc = s.clone_htod(src).map_err(drv)?;
        let dslots = s.clone_htod(slots).map_err(drv)?;
        let mut dc = s.alloc_zeros::<u8>(num_slots * entry_bytes).map_err(drv)?;
        let (l, r, e) = (lat as i32, rope as i32, entry_bytes as i32);
        let mut b = s.launch_builder(self.func("kv_write_fp8")?);
        b.arg(&dsrc)
            .arg(&dslots)
            .arg(&mut dc)
            .arg(&l)
            .arg(&r)
            .arg(&e);
        // SAFETY: as the kernel's signature (kernels/kv_write.cu).
        unsafe { b.launch(cfg((slots.len() as u32, 1, 1), 128)) }.map_err(drv)?;
        s.clone_dtoh(&dc).map_err(drv)
    }

    /// The two MLA decode passes over a paged bf16 latent cache ([num_blocks * block_size, 576]
    /// bits). Returns the latent context [n_q, heads, 512].
    #[allow(clippy::too_many_arguments)]
    pub fn mla_decode(
        &self,
        cache: &[u16],
        block_table: &[i32],
        max_blocks: usize,
        block_size: usize,
        q_seq: &[i32],
        q_pos: &[i32],
        q_lat: &[f32],
        q_pe: &[f32],
        heads: usize,
        scale: f32,
    ) -> Result<Vec<f32>> {
        let n_q = q_seq.len();
        let longest = q_pos.iter().copied().max().unwrap_or(0) as usize + 1;
        let n_splits = longest.div_ceil(256);
        let s = &self.stream;
        let dcache = s.clone_htod(cache).map_err(drv)?;
        let dbt = s.clone_htod(block_table).map_err(drv)?;
        let dseq = s.clone_htod(q_seq).map_err(drv)?;
        let dpos = s.clone_htod(q_pos).map_err(drv)?;
        let dql = s.clone_htod(q_lat).map_err(drv)?;
        let dqp = s.clone_htod(q_pe).map_err(drv)?;
        let mut ml = s
            .alloc_zeros::<f32>(n_q * heads * n_splits * 2)
            .map_err(drv)?;
        let mut acc = s
            .alloc_zeros::<f32>(n_q * heads * n_splits * 512)
            .map_err(drv)?;
        let mut out = s.alloc_zeros::<f32>(n_q * heads * 512).map_err(drv)?;
        let (mb, bs, h, ns) = (
            max_blocks as i32,
            block_size as i32,
            heads as i32,
            n_splits as i32,
        );
        let mut b = s.launch_builder(self.func("mla_decode_split")?);
        b.arg(&dcache)
            .arg(&dbt)
            .arg(&mb)
            .arg(&bs)
            .arg(&dseq)
            .arg(&dpos)
            .arg(&dql)
            .arg(&dqp);
        let (lat, rope) = (512i32, 64i32);
        b.arg(&scale)
            .arg(&h)
            .arg(&ns)
            .arg(&lat)
            .arg(&rope)
            .arg(&mut ml)
            .arg(&mut acc);
        // SAFETY: as the kernel's signature (kernels/mla_decode.cu); the caller's tables index
        // inside the cache.
        unsafe { b.launch(cfg((n_q as u32, heads as u32, n_splits as u32), 128)) }.map_err(drv)?;
        let mut b = s.launch_builder(self.func("mla_decode_combine")?);
        b.arg(&ml)
            .arg(&acc)
            .arg(&h)
            .arg(&ns)
            .arg(&lat)
            .arg(&mut out);
        // SAFETY: as above.
        unsafe { b.launch(cfg((n_q as u32, heads as u32, 1), 128)) }.map_err(drv)?;
        s.clone_dtoh(&out).map_err(drv)
    }

    /// `mha_prefill_f32`. q: [n_q, H, dqk], k: [n_k, H, dqk], v: [n_k, H, dv] -> [n_q, H, dv]
    #[allow(clippy::too_many_arguments)]
    pub fn mha_prefill(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pos: &[i32],
        heads: usize,
        dqk: usize,
        dv: usize,
        scale: f32,
    ) -> Result<Vec<f32>> {
        if dqk > 256 || dv > 256 {
            return Err(Error::InvalidArgument(format!(
                "mha_prefill: head dims {dqk} / {dv} above 256"
            )));
        }
        let n_q = pos.len();
        let s = &self.stream;
        let (dq, dk, dvv, dp) = (
            s.clone_htod(q).map_err(drv)?,
            s.clone_htod(k).map_err(drv)?,
            s.clone_htod(v).map_err(drv)?,
            s.clone_htod(pos).map_err(drv)?,
        );
        let mut out = s.alloc_zeros::<f32>(n_q * heads * dv).map_err(drv)?;
        let (h, a, b) = (heads as i32, dqk as i32, dv as i32);
        let mut lb = s.launch_builder(self.func("mha_prefill_f32")?);
        lb.arg(&dq)
            .arg(&dk)
            .arg(&dvv)
            .arg(&dp)
            .arg(&mut out)
            .arg(&h)
            .arg(&a)
            .arg(&b)
            .arg(&scale);
        // SAFETY: as the kernel's signature (kernels/mha_prefill.cu); dims checked above.
        unsafe { lb.launch(cfg((n_q as u32, heads as u32, 1), 128)) }.map_err(drv)?;
        s.clone_dtoh(&out).map_err(drv)
    }

    /// The three routed-expert stages (`kernels/moe_experts.cu`): gate/up/down: [E, inter,
    /// hidden] / [E, inter, hidden] / [E, hidden, inter] bf16 bits; x: [n, hidden]; `ex`,
    /// `w`: [n, top_k] token-major. -> [n, hidden]
    #[allow(clippy::too_many_arguments)]
    pub fn moe_experts(
        &self,
        gate: &[u16],
        up: &[u16],
        down: &[u16],
        x: &[f32],
        ex: &[i32],
        w: &[f32],
        hidden: usize,
        inter: usize,
        top_k: usize,
    ) -> Result<Vec<f32>> {
        let n = x.len() / hidden;
        let na = ex.len();
        if na != n * top_k || !hidden.is_multiple_of(8) || !inter.is_multiple_of(8) {
            return Err(Error::InvalidArgument(
                "moe_experts: ex must hold top_k entries per token; dims multiples of 8".into(),
            ));
        }
        let tok: Vec<i32> = (0..na).map(|a| (a / top_k) as i32).collect();
        let s = &self.stream;
        let (dg, du, dd, dx) = (
            s.clone_htod(gate).map_err(drv)?,
            s.clone_htod(up).map_err(drv)?,
            s.clone_htod(down).map_err(drv)?,
            s.clone_htod(x).map_err(drv)?,
        );
        let (dt, de, dw) = (
            s.clone_htod(&tok).map_err(drv)?,
            s.clone_htod(ex).map_err(drv)?,
            s.clone_htod(w).map_err(drv)?,
        );
        let mut hid = s.alloc_zeros::<f32>(na * inter).map_err(drv)?;
        let mut y = s.alloc_zeros::<f32>(na * hidden).map_err(drv)?;
        let mut out = s.alloc_zeros::<f32>(n * hidden).map_err(drv)?;
        let (hh, ii, kk) = (hidden as i32, inter as i32, top_k as i32);
        let mut b = s.launch_builder(self.func("moe_gate_up_bf16")?);
        b.arg(&dg)
            .arg(&du)
            .arg(&dx)
            .arg(&dt)
            .arg(&de)
            .arg(&mut hid)
            .arg(&hh)
            .arg(&ii);
        // SAFETY: as the kernel's signature; expert ids index the weight stacks (caller).
        unsafe { b.launch(cfg((inter.div_ceil(8) as u32, na as u32, 1), 256)) }.map_err(drv)?;
        let mut b = s.launch_builder(self.func("moe_down_bf16")?);
        b.arg(&dd).arg(&hid).arg(&de).arg(&mut y).arg(&hh).arg(&ii);
        // SAFETY: as above.
        unsafe { b.launch(cfg((hidden.div_ceil(8) as u32, na as u32, 1), 256)) }.map_err(drv)?;
        let mut b = s.launch_builder(self.func("moe_combine")?);
        b.arg(&y).arg(&dw).arg(&mut out).arg(&hh).arg(&kk);
        // SAFETY: as above.
        unsafe { b.launch(cfg((n as u32, 1, 1), 256)) }.map_err(drv)?;
        s.clone_dtoh(&out).map_err(drv)
    }

    /// `moe_route_noaux_tc`. logits: [n, E] -> (experts [n, k], weights [n, k])
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &self,
        logits: &[f32],
        bias: &[f32],
        n: usize,
        n_group: usize,
        topk_group: usize,
        top_k: usize,
        scale: f32,
    ) -> Result<(Vec<i32>, Vec<f32>)> {
        let e = bias.len();
        let s = &self.stream;
        let dl = s.clone_htod(logits).map_err(drv)?;
        let db = s.clone_htod(bias).map_err(drv)?;
        let mut di = s.alloc_zeros::<i32>(n * top_k).map_err(drv)?;
        let mut dw = s.alloc_zeros::<f32>(n * top_k).map_err(drv)?;
        let (nn, ee, g, tg, k) = (
            n as i32,
            e as i32,
            n_group as i32,
            topk_group as i32,
            top_k as i32,
        );
        let mut b = s.launch_builder(self.func("moe_route_noaux_tc")?);
        b.arg(&dl)
            .arg(&db)
            .arg(&nn)
            .arg(&ee)
            .arg(&g)
            .arg(&tg)
            .arg(&k)
            .arg(&scale);
        b.arg(&mut di).arg(&mut dw);
        // SAFETY: as the kernel's signature (kernels/moe_route.cu).
        unsafe { b.launch(cfg((n.div_ceil(4) as u32, 1, 1), 128)) }.map_err(drv)?;
        Ok((
            s.clone_dtoh(&di).map_err(drv)?,
            s.clone_dtoh(&dw).map_err(drv)?,
        ))
    }

    /// `rope_interleaved_f32` in place. x: [n, heads, head_dim]; cos/sin: [max_pos, rope_dim/2]
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &[f32],
        pos: &[i32],
        cos_t: &[f32],
        sin_t: &[f32],
        heads: usize,
        head_dim: usize,
        offset: usize,
        rope_dim: usize,
    ) -> Result<Vec<f32>> {
        let max_pos = (cos_t.len() / (rope_dim / 2)) as i32;
        let s = &self.stream;
        let mut dx = s.clone_htod(x).map_err(drv)?;
        let dp = s.clone_htod(pos).map_err(drv)?;
        let dc = s.clone_htod(cos_t).map_err(drv)?;
        let ds = s.clone_htod(sin_t).map_err(drv)?;
        let (h, hd, o, rd) = (
            heads as i32,
            head_dim as i32,
            offset as i32,
            rope_dim as i32,
        );
        let mut b = s.launch_builder(self.func("rope_interleaved_f32")?);
        b.arg(&mut dx)
            .arg(&dp)
            .arg(&dc)
            .arg(&ds)
            .arg(&h)
            .arg(&hd)
            .arg(&o)
            .arg(&rd)
            .arg(&max_pos);
        // SAFETY: as the kernel's signature (kernels/rope.cu).
        unsafe { b.launch(cfg((pos.len() as u32, 1, 1), 128)) }.map_err(drv)?;
        s.clone_dtoh(&dx).map_err(drv)
    }
}

/// Where NVRTC's cubins are cached across processes: `$SPECMLA_CUBIN_CACHE`, else
/// `$XDG_CACHE_HOME/specmla/cubins`, else `$HOME/.cache/specmla/cubins` (None: no cache).
fn cubin_cache_dir() -> Option<std::path::PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    env("SPECMLA_CUBIN_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("specmla/cubins")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/specmla/cubins")))
}

/// A cubin's cache file: named by the kernel file, the architecture and an FNV-1a hash of the
/// source, so an edited kernel never reads a stale cubin.
fn cache_path(dir: &Path, file: &str, arch: &str, source: &str) -> std::path::PathBuf {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in file
        .bytes()
        .chain([0])
        .chain(arch.bytes())
        .chain([0])
        .chain(source.bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    dir.join(format!("{file}.{arch}.{h:016x}.cubin"))
}

/// Write a cubin to the cache (write then rename, so a reader never sees half a file); a cache
/// that cannot be written is skipped silently (it only saves compile time).
fn store(p: &Path, bin: &[u8]) {
    let Some(dir) = p.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bin).is_ok() && std::fs::rename(&tmp, p).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The `extern "C" __global__` function names of a kernel source.
pub fn kernel_names(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in src.split("extern \"C\" __global__").skip(1) {
        // `void __launch_bounds__(..) name(` or `void name(`
        let head = part.split('(').collect::<Vec<_>>();
        let pre = if part.trim_start().starts_with("void __launch_bounds__") {
            head.get(1).and_then(|s| s.split(')').nth(1))
        } else {
            head.first().copied()
        };
        if let Some(name) = pre.and_then(|p| p.split_whitespace().last()) {
            out.push(name.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_found() {
        let names: Vec<String> = kernel_sources()
            .iter()
            .flat_map(|k| kernel_names(&k.source))
            .collect();
        for want in [
            "rms_norm_f32",
            "rope_interleaved_f32",
            "gemm_bf16_smalln",
            "gemm_fp8_block_smalln",
            "mla_decode_split",
            "mla_decode_combine",
            "log_softmax_f32",
            "kv_write_bf16",
            "kv_write_fp8",
            "moe_route_noaux_tc",
            "mha_prefill_f32",
            "moe_gate_up_bf16",
            "moe_down_bf16",
            "moe_combine",
            "gemm_f32_smalln",
            "gemm_grouped_f32",
            "add_inplace_f32",
            "copy_cols_f32",
            "gather_rows_f32",
            "silu_mul_f32",
            "axpy_rows_f32",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert_eq!(names.len(), 21, "{names:?}");
    }

    #[test]
    fn cubin_cache_paths_follow_the_source_and_arch() {
        let d = std::env::temp_dir().join(format!("specmla-cubin-cache-{}", std::process::id()));
        let a = cache_path(&d, "gemm_bf16.cu", "sm_90", "src A");
        assert_ne!(
            a,
            cache_path(&d, "gemm_bf16.cu", "sm_90", "src B"),
            "an edited kernel"
        );
        assert_ne!(
            a,
            cache_path(&d, "gemm_bf16.cu", "sm_100", "src A"),
            "another arch"
        );
        assert_eq!(a, cache_path(&d, "gemm_bf16.cu", "sm_90", "src A"));
        store(&a, b"cubin bytes");
        assert_eq!(std::fs::read(&a).unwrap(), b"cubin bytes");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn opening_a_device_without_a_driver_is_an_error() {
        if driver_present() {
            return; // a GPU machine: gpu-check covers it
        }
        let err = Gpu::open(0, None).err().expect("no driver").to_string();
        assert!(err.contains("no CUDA driver"), "{err}");
    }
}

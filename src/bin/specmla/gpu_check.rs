//! `specmla gpu-check`: on a machine with an NVIDIA GPU, every CUDA kernel against the CPU
//! backend (tolerance per op), the batch-invariance checks and the bf16 GEMV's read bandwidth
//! (`specmla::cuda::check`). Kernels from NVRTC, else from `--cubin-dir` (written by
//! `specmla cuda-check --out DIR` on any machine). Exit status 1 when a check fails.

use std::path::PathBuf;

use clap::Args;

use specmla::{Error, Result};

#[derive(Args, Clone)]
pub struct GpuCheckArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Directory of precompiled cubins (`<file>.<arch>.cubin`), used when NVRTC is absent.
    #[arg(long)]
    pub cubin_dir: Option<PathBuf>,
}

pub fn run(a: GpuCheckArgs) -> Result<()> {
    let gpu = specmla::cuda::Gpu::open(a.device, a.cubin_dir.as_deref())?;
    println!("device {}: {} ({})", a.device, gpu.name, gpu.arch);
    let lines = specmla::cuda::check::gpu_check(&gpu)?;
    let mut failed = 0;
    for l in &lines {
        println!(
            "{:<5} {:<30} error {:.2e} (tolerance {:.0e})  {}",
            if l.pass { "ok" } else { "FAIL" },
            l.op,
            l.error,
            l.tolerance,
            l.note
        );
        failed += usize::from(!l.pass);
    }
    if failed > 0 {
        return Err(Error::Engine(format!("{failed} GPU checks failed")));
    }
    Ok(())
}

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
    /// Golden fixtures run through the CUDA backend (each subdirectory with a config.json).
    #[arg(long, default_value = "models/golden")]
    pub fixtures: PathBuf,
}

pub fn run(a: GpuCheckArgs) -> Result<()> {
    let gpu = specmla::cuda::Gpu::open(a.device, a.cubin_dir.as_deref())?;
    println!("device {}: {} ({})", a.device, gpu.name, gpu.arch);
    let mut lines = specmla::cuda::check::gpu_check(&gpu)?;
    drop(gpu);
    // the golden fixtures through the CUDA backend (engines of their own; same cubins)
    specmla::cuda::device::set_default_cubin_dir(a.cubin_dir.clone());
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&a.fixtures)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    fixtures.retain(|p| p.join("config.json").is_file());
    fixtures.sort();
    lines.extend(specmla::cuda::check::forward_checks(a.device, &fixtures)?);
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

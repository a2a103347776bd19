//! `specmla cuda-check`: compile every CUDA kernel (`kernels/*.cu`) with NVRTC for sm_80, sm_90,
//! sm_90a, sm_100 and sm_100a and print one line per (kernel, arch) with its registers, shared
//! memory, stack and spills; fails on a compile error, a spilling hot kernel or a missing NVRTC.

use clap::Args;
use serde_json::json;

use specmla::{Error, Result};

#[derive(Args, Clone)]
pub struct CudaCheckArgs {
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write every kernel's cubin as DIR/<file>.<arch>.cubin (for a GPU machine without
    /// NVRTC: `specmla gpu-check --cubin-dir DIR`).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

pub fn run(a: CudaCheckArgs) -> Result<()> {
    if !specmla::cuda::available() {
        return Err(Error::Engine(
            "NVRTC (libnvrtc.so) cannot be loaded: install nvidia-cuda-nvrtc-cu12 and put its lib \
             directory on LD_LIBRARY_PATH (scripts/cuda-compile-check.sh does both)"
                .into(),
        ));
    }
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io {
            path: dir.clone(),
            source: e,
        })?;
    }
    for r in specmla::cuda::check_all()? {
        if let Some(dir) = &a.out {
            let p = dir.join(format!("{}.{}.cubin", r.file, r.arch));
            std::fs::write(&p, &r.cubin).map_err(|e| Error::Io { path: p, source: e })?;
        }
        for f in &r.functions {
            if a.json {
                println!(
                    "{}",
                    json!({"kernel": f.name, "file": r.file, "arch": r.arch, "registers": f.registers,
                           "smem_bytes": f.smem_bytes, "stack_bytes": f.stack_bytes,
                           "spill_store_bytes": f.spill_store_bytes, "spill_load_bytes": f.spill_load_bytes})
                );
            } else {
                println!("{}", f.line(&r.arch));
            }
        }
    }
    Ok(())
}

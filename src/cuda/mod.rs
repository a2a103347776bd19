//! The CUDA backend's device code: the kernels in `kernels/*.cu` (CUDA C++, compiled at run time
//! by NVRTC for the device's architecture) and their compile check.
//!
//! Where it sits: issue 16's first layer. `kernels` embeds the sources (so the library needs no
//! file at run time and no CUDA header: `kernels/common.cuh` converts bf16 / fp8 itself);
//! `nvrtc` loads NVRTC dynamically through cudarc (the crate builds and every CPU test runs on a
//! machine with no CUDA), compiles a kernel for an architecture with `-Xptxas=-v` and parses the
//! resource report (registers, shared memory, stack, spills). This folder holds the only unsafe
//! calls into CUDA libraries. `backend` runs the V2 / V3 forward's operators (`backend::Backend`)
//! on the device — compiled on every build, not yet run on a GPU (see its module doc).
//!
//! Guarantees: a missing NVRTC is reported (`nvrtc::available`), never a panic; every kernel's
//! reductions have one fixed order (see `kernels/common.cuh`), the batch invariance the exact
//! speculation tests rely on.

pub mod backend;
pub mod check;
pub mod device;
pub mod kernels;
pub mod nvrtc;

pub use backend::CudaBackend;
pub use device::Gpu;
pub use kernels::{kernel_sources, KernelSource, HOT_KERNELS};
pub use nvrtc::{available, check_all, compile, CompileReport, FunctionReport, ARCHS};

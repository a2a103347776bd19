//! Batch-invariant CPU math: the only place the engine does floating-point reductions over
//! weights or activations. Model code (`model::*`) calls these; they call nothing above them.
//!
//! Guarantee (the property speculative decoding's bitwise tests rely on): every reduction has one
//! fixed per-element order, defined in `lanes.rs` and reproduced exactly by the AVX2 kernels in
//! `simd.rs`, so an output element never depends on the batch size, its position in the batch,
//! the other rows of the batch, the rayon pool size or how rows are split among threads. The
//! portable fallback is bitwise equal to the SIMD path.
//!
//! Files: `gemm.rs` (matmul over f32 / bf16 / fp8 weights), `vec_ops.rs` (dot, norms, softmax,
//! activations, row lookup), `bandwidth.rs` (roofline probes for benchmarks and the scheduler's
//! cost model), `lanes.rs` (the order, portable), `simd.rs` (the order, AVX2), `par.rs` (when a loop is
//! worth the rayon pool).
//! Parallel work runs in whatever rayon pool the caller installed.

mod bandwidth;
mod gemm;
mod lanes;
mod par;
pub mod matrix;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;
mod vec_ops;

pub use bandwidth::{measure_peak_flops, measure_read_bandwidth};
pub use gemm::{matmul, matmul_f32};
pub use matrix::{Matrix, MatrixData, WeightBuf};
pub use par::{for_each_row, map_indices, worth_parallel};
pub use vec_ops::{axpy, dot, dot_rows, log_softmax, matrix_row_f32, rms_norm, silu_mul, softmax_inplace};

/// Which instruction set the kernels use. Detection is cheap (the standard library caches the
/// CPUID result), so entry points detect per call; both choices give bitwise-equal results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa {
    simd: bool,
}

impl Isa {
    /// AVX2 + FMA + F16C kernels when the CPU has them, else the portable path.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let simd = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            Isa { simd }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa { simd: false }
    }
    /// The portable path (same results, slower).
    pub fn portable() -> Self {
        Isa { simd: false }
    }
    /// True when the AVX2 kernels are in use.
    pub fn simd(&self) -> bool {
        self.simd
    }
}

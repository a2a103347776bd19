//! Batch-invariant CPU math: the only place the engine does floating-point reductions over
//! weights or activations. Model code (`model::*`) calls these; they call nothing above them.
//!
//! Guarantee (the property speculative decoding's bitwise tests rely on): every reduction has one
//! fixed per-element order, defined in `lanes.rs` and reproduced exactly by the AVX2 kernels in
//! `simd.rs` (AVX2) and `simd512.rs` (AVX-512, two accumulators per register), so an output
//! element never depends on the batch size, its position in the batch, the other rows of the
//! batch, the rayon pool size, how rows are split among threads — or, among portable / avx2 /
//! avx512, the ISA (`isa.rs`: chosen at run time, pinned per thread). The portable fallback is
//! bitwise equal to those SIMD paths. The `amx` level's bf16 matmuls keep a fixed order of their
//! own (batch-invariant on that level; within a stated tolerance of the others). bf16 matrices
//! packed in strips of 16 rows (`MatrixData::Bf16Strips`: what models load as on a CPU whose
//! best level is `avx2`, `gemm/strips.rs`) are summed in one sequential chain per element
//! instead — the same on every level (portable included) and for every batch: the layout,
//! fixed when a model is loaded, fixes the order.
//!
//! Files: `gemm.rs` (matmul over f32 / bf16 / fp8 weights), `vec_ops.rs` (dot, norms, softmax,
//! activations, row lookup), `weighted_sum.rs` (attention's value pass over many rows), `rows.rs` (borrowed rows in
//! their storage precision: KV spans read in place),
//! `bandwidth.rs` (roofline probes for benchmarks and the scheduler's
//! cost model), `cache_info.rs` (the last-level cache size, from sysfs), `lanes.rs` (the order, portable), `simd.rs` (the order, AVX2), `simd512.rs` (the order,
//! AVX-512), `amx.rs` (AMX tile permission, configuration and instructions for the bf16 GEMM's
//! `amx` level), `isa.rs` (run-time choice), `aligned.rs` (cache-line aligned scratch), `par.rs` (when a loop is
//! worth the rayon pool), `prefetch.rs` (which cache level the weight prefetches target), `profile.rs` (opt-in wall time of
//! every matmul by shape).
//! Parallel work runs in whatever rayon pool the caller installed.

mod aligned;
#[cfg(target_arch = "x86_64")]
mod amx;
mod bandwidth;
mod cache_info;
mod exp;
mod gemm;
mod isa;
mod lanes;
pub mod matrix;
mod packed_pages;
mod par;
mod prefetch;
mod profile;
mod rows;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod simd512;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_strips;
mod vec_ops;
mod weighted_sum;

pub use bandwidth::{measure_peak_dot_flops, measure_peak_flops, measure_read_bandwidth};
pub use cache_info::{last_level_cache_bytes, stays_cached};
#[cfg(target_arch = "x86_64")]
pub use gemm::set_avx2_token_tiles;
pub use gemm::strips_by_default;
pub(crate) use gemm::STRIP as STRIP_ROWS;
pub use gemm::{matmul, matmul_f32, matmul_many, matmul_rows_serial};
pub use isa::{pin_thread, Isa, IsaLevel};
pub use matrix::{Matrix, MatrixData, WeightBuf};
pub use packed_pages::strips_in_huge_pages;
pub use par::{for_each_row, map_indices, with_thread_scratch, worth_parallel};
pub use prefetch::{
    prefetch_hint, set_prefetch_hint, set_tile_prefetch_hint, tile_prefetch_hint, PrefetchHint,
};
pub use profile::{
    matmul_profile, reset_matmul_profile, set_matmul_profiling, MatmulStat, ShapeKey,
};
pub use rows::Rows;
pub use vec_ops::{
    axpy, dot, dot_rows, log_softmax, matrix_row_f32, rms_norm, silu_mul, softmax_inplace,
};
pub use weighted_sum::{weighted_sum_rows, weighted_sum_rows_acc};

//! The kernel sources, embedded at build time from `kernels/` (repository root), with
//! `kernels/common.cuh` inlined where a source includes it (NVRTC is given one string).

/// One `.cu` file: its name and the source NVRTC compiles.
pub struct KernelSource {
    pub file: &'static str,
    pub source: String,
}

const COMMON: &str = include_str!("../../kernels/common.cuh");

const FILES: [(&str, &str); 12] = [
    ("rmsnorm.cu", include_str!("../../kernels/rmsnorm.cu")),
    ("rope.cu", include_str!("../../kernels/rope.cu")),
    ("gemm_bf16.cu", include_str!("../../kernels/gemm_bf16.cu")),
    ("gemm_fp8.cu", include_str!("../../kernels/gemm_fp8.cu")),
    ("mla_decode.cu", include_str!("../../kernels/mla_decode.cu")),
    (
        "log_softmax.cu",
        include_str!("../../kernels/log_softmax.cu"),
    ),
    ("kv_write.cu", include_str!("../../kernels/kv_write.cu")),
    ("moe_route.cu", include_str!("../../kernels/moe_route.cu")),
    (
        "mha_prefill.cu",
        include_str!("../../kernels/mha_prefill.cu"),
    ),
    (
        "moe_experts.cu",
        include_str!("../../kernels/moe_experts.cu"),
    ),
    ("gemm_f32.cu", include_str!("../../kernels/gemm_f32.cu")),
    (
        "elementwise.cu",
        include_str!("../../kernels/elementwise.cu"),
    ),
];

/// Kernels on the decode path of every token: a register spill there is a compile-check failure.
pub const HOT_KERNELS: [&str; 11] = [
    "rms_norm_f32",
    "gemm_bf16_smalln",
    "gemm_fp8_block_smalln",
    "mla_decode_split",
    "mla_decode_combine",
    "log_softmax_f32",
    "moe_gate_up_bf16",
    "moe_down_bf16",
    "mha_prefill_f32",
    "gemm_f32_smalln",
    "gemm_grouped_f32",
];

/// Every kernel file, ready for NVRTC.
pub fn kernel_sources() -> Vec<KernelSource> {
    FILES
        .iter()
        .map(|(file, src)| KernelSource {
            file,
            source: src.replace(
                "#include \"common.cuh\"",
                COMMON.trim_start_matches("#pragma once"),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_its_helpers_inlined_and_no_cuda_header() {
        for k in kernel_sources() {
            assert!(
                !k.source.contains("#include"),
                "{}: an include is left",
                k.file
            );
            assert!(k.source.contains("warp_sum"), "{}: helpers missing", k.file);
            assert!(k.source.contains("extern \"C\" __global__"), "{}", k.file);
        }
    }
}

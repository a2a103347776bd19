//! `specmla` — command-line front end over the library: `generate` (streaming or JSON, with a
//! draft model or n-gram speculation and a reasoning budget), `score` (per-position log-probs),
//! `info` (model summary), `bench` (throughput, roofline, speculation, draft swaps) and
//! `quantize` (fp8 block-scaled copy of a checkpoint), `make-bench-model` (widened copy),
//! `cuda-check` (NVRTC compile check of the CUDA kernels).

mod bench;
mod cuda_check;
mod generate;
mod gpu_check;
mod info;
mod make_bench_model;
mod quantize;
mod score;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "specmla",
    version,
    about = "DeepSeek MLA inference with lossless speculative decoding and a reasoning budget"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text (streams; --json prints one JSON object per prompt).
    Generate(generate::GenerateArgs),
    /// Per-position log-probabilities of a text or token ids, as JSON.
    Score(score::ScoreArgs),
    /// Model summary: config, parameter count, bytes, KV bytes per token.
    Info(info::InfoArgs),
    /// Benchmarks: prefill/decode tokens/s, roofline fraction, speculation speedup, swaps.
    Bench(bench::BenchArgs),
    /// Write an fp8 e4m3 copy of a checkpoint with 128x128 block scales (DeepSeek-V3 layout).
    Quantize(quantize::QuantizeArgs),
    /// Write a function-preserving widened copy of a checkpoint (memory-bound benchmark target).
    MakeBenchModel(make_bench_model::MakeBenchModelArgs),
    /// Compile every CUDA kernel with NVRTC for each target architecture (registers, spills).
    CudaCheck(cuda_check::CudaCheckArgs),
    /// On an NVIDIA GPU: every CUDA kernel against the CPU backend, batch invariance, bandwidth.
    GpuCheck(gpu_check::GpuCheckArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Generate(a) => generate::run(a),
        Cmd::Score(a) => score::run(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Quantize(a) => quantize::run(a),
        Cmd::MakeBenchModel(a) => make_bench_model::run(a),
        Cmd::CudaCheck(a) => cuda_check::run(a),
        Cmd::GpuCheck(a) => gpu_check::run(a),
    };
    if let Err(e) = res {
        eprintln!("specmla: error: {e}");
        std::process::exit(1);
    }
}

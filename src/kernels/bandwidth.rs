//! Roofline probes: streaming-read bandwidth, peak FMA throughput and the peak multiply-add rate
//! of the bf16 matmul kernels, with the current rayon pool.
//! Benchmarks report kernel speed as fractions of these; the scheduler may use them to price a
//! target step against a draft step. Results are measurements (noisy by nature), never inputs to
//! any numerical result.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use super::Isa;

/// f32s per rayon task of the read probe (512 KiB, like a 32-row block of a large bf16 GEMV).
const READ_CHUNK: usize = 1 << 17;

/// Memory-bandwidth probe: best-of-`reps` streaming read of a `bytes`-sized buffer (choose it
/// well above the last-level cache) using the current rayon pool; returns bytes/second.
pub fn measure_read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let isa = Isa::current();
    let n = (bytes / 4).max(READ_CHUNK); // [n] f32
    let buf: Vec<f32> = (0..n).map(|i| (i & 1023) as f32).collect();
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let s: f32 = buf.par_chunks(READ_CHUNK).map(|c| read_sum(isa, c)).sum();
        black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (n * 4) as f64 / best
}

fn read_sum(isa: Isa, c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.simd() {
        // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
        return unsafe { read_sum_simd(c) };
    }
    let _ = isa;
    super::lanes::sum_lanes(c)
}

/// Streams per task: the chunk is read as this many concurrent sequential streams (the way a
/// GEMV tile reads 8 weight rows), which keeps more cache-line requests in flight than one.
const STREAMS: usize = 8;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn read_sum_simd(c: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let q = c.len() / STREAMS / 8 * 8; // f32s per stream, whole vectors
    let mut a = [_mm256_setzero_ps(); STREAMS];
    let p = c.as_ptr();
    let mut i = 0;
    while i < q {
        for (j, aj) in a.iter_mut().enumerate() {
            *aj = _mm256_add_ps(*aj, _mm256_loadu_ps(p.add(j * q + i)));
        }
        i += 8;
    }
    let mut s = _mm256_setzero_ps();
    for aj in a {
        s = _mm256_add_ps(s, aj);
    }
    super::simd::hsum8(s) + c[STREAMS * q..].iter().sum::<f32>()
}

/// Independent FMA chains per thread (enough to cover FMA latency on two pipes).
const CHAINS: usize = 12;
const FLOP_ITERS: usize = 1 << 22;

/// Peak FMA throughput probe (f32 FLOP/s) with the current rayon pool: every pool thread runs
/// `CHAINS` independent FMA chains of the current ISA's width (8 lanes; 16 on AVX-512);
/// best of `reps`.
pub fn measure_peak_flops(reps: usize) -> f64 {
    let isa = Isa::current();
    let (threads, best) = best_broadcast_secs(reps, || fma_chains(isa, FLOP_ITERS));
    let lanes = if isa.avx512() { 16 } else { 8 };
    (threads * FLOP_ITERS * CHAINS * lanes * 2) as f64 / best
}

/// The pool's thread count and the best of `reps` wall times of `chains` run on every pool
/// thread at once (the peak probes' timing).
fn best_broadcast_secs(reps: usize, chains: impl Fn() -> f32 + Sync) -> (usize, f64) {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let r = rayon::broadcast(|_| chains());
        black_box(r);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (rayon::current_num_threads(), best)
}

/// Peak FLOP/s (two per multiply-add) of the multiply-adds the bf16 weight matmuls run on at the
/// current ISA level, with the current rayon pool, best of `reps`: `vdpbf16ps` chains where the
/// matmuls use it (`Isa::bf16_dot`; 32 multiply-adds per 512-bit instruction; also the AMX
/// level's one-token path, so a lower bound there), else the f32 FMA peak (the other levels
/// widen bf16 to f32). What a product of n tokens can reach when it is compute-bound: the
/// spec bench's roofline charges each product max(bytes / bandwidth, FLOPs / this).
pub fn measure_peak_dot_flops(reps: usize) -> f64 {
    let isa = Isa::current();
    #[cfg(target_arch = "x86_64")]
    if (isa.bf16_dot() || isa.amx()) && is_x86_feature_detected!("avx512bf16") {
        // SAFETY: AVX512-BF16 (and so AVX-512F) was detected just above.
        let (threads, best) =
            best_broadcast_secs(reps, || unsafe { dot_chains_avx512bf16(FLOP_ITERS) });
        return (threads * FLOP_ITERS * CHAINS * 32 * 2) as f64 / best;
    }
    let _ = isa;
    measure_peak_flops(reps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_chains_avx512bf16(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm512_set1_ps(1.0); CHAINS];
    // bf16 1.0 and 0.99609375: the accumulators grow slowly and stay finite
    let w = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(black_box(0x3f80)));
    let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(black_box(0x3f7f)));
    for _ in 0..iters {
        for ai in a.iter_mut() {
            *ai = _mm512_dpbf16_ps(*ai, w, x);
        }
    }
    let mut s = _mm512_setzero_ps();
    for ai in a {
        s = _mm512_add_ps(s, ai);
    }
    _mm512_reduce_add_ps(s)
}

fn fma_chains(isa: Isa, iters: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: Isa::avx512() is true only after the AVX-512 features were detected.
        return unsafe { fma_chains_avx512(iters) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.simd() {
        // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
        return unsafe { fma_chains_simd(iters) };
    }
    let _ = isa;
    let mut a = [[1.0f32; 8]; CHAINS];
    let (m, c) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..iters {
        for ai in a.iter_mut() {
            for v in ai.iter_mut() {
                *v = v.mul_add(m, c);
            }
        }
    }
    a.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma_chains_simd(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm256_set1_ps(1.0); CHAINS];
    let m = _mm256_set1_ps(black_box(0.999_999));
    let c = _mm256_set1_ps(black_box(1e-7));
    for _ in 0..iters {
        for ai in a.iter_mut() {
            *ai = _mm256_fmadd_ps(*ai, m, c);
        }
    }
    let mut s = _mm256_setzero_ps();
    for ai in a {
        s = _mm256_add_ps(s, ai);
    }
    super::simd::hsum8(s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fma_chains_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm512_set1_ps(1.0); CHAINS];
    let m = _mm512_set1_ps(black_box(0.999_999));
    let c = _mm512_set1_ps(black_box(1e-7));
    for _ in 0..iters {
        for ai in a.iter_mut() {
            *ai = _mm512_fmadd_ps(*ai, m, c);
        }
    }
    let mut s = _mm512_setzero_ps();
    for ai in a {
        s = _mm512_add_ps(s, ai);
    }
    _mm512_reduce_add_ps(s)
}

//! Kernel roofline benchmark: `cargo bench --bench kernels`.
//!
//! Prints the machine's streaming-read bandwidth and peak FMA rate (1 and 2 threads), then each
//! kernel's rate as a fraction of the matching roof: bf16 / fp8 GEMV (n = 1, memory-bound) against
//! read bandwidth, GEMM (n = 2 .. 512) against peak FLOP/s. Weights are larger than the L3
//! cache so GEMV numbers are DRAM numbers. Each fraction uses a probe taken right before that
//! kernel's measurement, so a machine whose load changes during the run still gets comparable
//! ratios (on a shared machine the absolute numbers are noisy).

use std::hint::black_box;
use std::time::Instant;

use specmla::kernels::{
    dot_rows, for_each_row, matmul, matmul_f32, measure_peak_flops, measure_read_bandwidth,
    pin_thread, set_prefetch_hint, set_tile_prefetch_hint, Isa, Matrix, PrefetchHint,
};

fn pool(threads: usize) -> rayon::ThreadPool {
    pool_isa(threads, Isa::detect())
}

fn pool_isa(threads: usize, isa: Isa) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| pin_thread(Some(isa)))
        .build()
        .expect("rayon pool")
}

/// `cargo bench --bench kernels -- isa`: the multi-token GEMM on every ISA level this CPU has,
/// one after the other (same matrices), as GFLOP/s and fraction of that level's FMA peak.
fn isa_gemm() {
    let (rows, cols) = (2048, 2048);
    let w = bf16_matrix(4, rows, cols);
    for n in [4, 16, 64, 512] {
        let x: Vec<f32> = activations(5, n * cols); // [n, cols]
        let mut y = vec![0.0f32; n * rows]; // [n, rows]
        let flops = 2.0 * (rows * cols * n) as f64;
        for isa in Isa::available() {
            for threads in [1, 2] {
                let p = pool_isa(threads, isa);
                let peak = p.install(|| measure_peak_flops(3));
                let t = p.install(|| best_of(5, || matmul(&w, black_box(&x), n, &mut y)));
                println!(
                    "bf16 GEMM {rows}x{cols} n={n:3} {isa:8} {threads} thr: {:7.1} GFLOP/s = {:5.1}% of its peak ({:.1} GFLOP/s)",
                    flops / t / 1e9,
                    100.0 * flops / t / peak,
                    peak / 1e9
                );
            }
        }
    }
}

/// `cargo bench --bench kernels -- prefill-shapes`: the widened target's dense and shared-expert
/// matrices (12288x1536, 6144x1536, 1536x12288, 1536x6144) and a routed expert's (768x1536) at
/// prefill-sized token counts on the default ISA, 1 and 2 threads: multiply-adds per second
/// (weights warm: the best of 5 runs).
fn prefill_shapes() {
    let isa = Isa::detect(); // the default level (amx is opt-in, never detected)
    for (rows, cols) in [
        (12288, 1536),
        (6144, 1536),
        (1536, 12288),
        (1536, 6144),
        (768, 1536),
    ] {
        let w = bf16_matrix(4, rows, cols);
        for n in [16, 32, 46, 64, 128, 512] {
            let x: Vec<f32> = activations(5, n * cols); // [n, cols]
            let mut y = vec![0.0f32; n * rows]; // [n, rows]
            let macs = (rows * cols * n) as f64;
            let line: Vec<String> = [1, 2]
                .into_iter()
                .map(|threads| {
                    let p = pool_isa(threads, isa);
                    let t = p.install(|| best_of(5, || matmul(&w, black_box(&x), n, &mut y)));
                    format!("{threads} thr {:6.1}", macs / t / 1e9)
                })
                .collect();
            println!(
                "{isa} {rows:5}x{cols:5} n={n:3}: GMAC/s {}",
                line.join(", ")
            );
        }
    }
}

/// Deterministic pseudo-random bits.
fn bits(seed: u64, n: usize) -> impl Iterator<Item = u64> {
    let mut s = seed | 1;
    (0..n).map(move |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}

fn bf16_matrix(seed: u64, rows: usize, cols: usize) -> Matrix {
    // Values in about [-1, 1): sign + exponent 0x3f0..0x3f7 + random mantissa.
    let d: Vec<u16> = bits(seed, rows * cols)
        .map(|b| ((b & 0x807f) as u16) | 0x3f00)
        .collect();
    Matrix::from_bf16(rows, cols, d)
}

fn f16_matrix(seed: u64, rows: usize, cols: usize) -> Matrix {
    // Values in about [-1, 1): sign + exponent 14 + random mantissa.
    let d: Vec<half::f16> = bits(seed, rows * cols)
        .map(|b| half::f16::from_bits(((b & 0x83ff) as u16) | 0x3800))
        .collect();
    Matrix::from_f16(rows, cols, d)
}

fn fp8_matrix(seed: u64, rows: usize, cols: usize) -> Matrix {
    let d: Vec<u8> = bits(seed, rows * cols).map(|b| (b as u8) & 0xbf).collect(); // no NaN encodings
    let ns = rows.div_ceil(128) * cols.div_ceil(128);
    Matrix::from_fp8(rows, cols, d, vec![0.01; ns], 128, 128)
}

/// `len` activations in about [-0.4, 0.45), from `bits(seed, ..)`.
fn activations(seed: u64, len: usize) -> Vec<f32> {
    bits(seed, len)
        .map(|b| (b >> 40) as f32 / 2e7 - 0.4)
        .collect()
}

/// The median of `v` (sorted in place; not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Best wall time of `reps` runs of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    if std::env::args().any(|a| a == "avx2-tiles") {
        return avx2_token_tiles();
    }
    if std::env::args().any(|a| a == "smalln") {
        return small_n(1536, 1536, 32);
    }
    if std::env::args().any(|a| a == "smalln-wide") {
        return small_n(1536, 6144, 8);
    }
    if std::env::args().any(|a| a == "smalln-experts") {
        // the widened target's routed experts: 768 x 1536 (gate / up) and their down projections
        small_n(768, 1536, 64);
        return small_n(1536, 768, 64);
    }
    if std::env::args().any(|a| a == "smalln-dense") {
        // a dense MLP's down projection over 12288 columns (the widened target's layer 0)
        return small_n(1536, 12288, 4);
    }
    if std::env::args().any(|a| a == "smalln-tall") {
        small_n(12288, 1536, 4);
        return small_n(6144, 1536, 8);
    }
    if std::env::args().any(|a| a == "f16") {
        return f16_walk();
    }
    if std::env::args().any(|a| a == "l2") {
        return l2_probe();
    }
    if std::env::args().any(|a| a == "l2-tiles") {
        return l2_tiles();
    }
    if std::env::args().any(|a| a == "indexer") {
        return indexer_scores();
    }
    if std::env::args().any(|a| a == "prefill-shapes") {
        return prefill_shapes();
    }
    if std::env::args().any(|a| a == "isa") {
        return isa_gemm();
    }
    if std::env::args().any(|a| a == "prefetch") {
        return prefetch_hints();
    }
    let p1 = pool(1);
    let p2 = pool(2);
    let bw1 = p1.install(|| measure_read_bandwidth(256 << 20, 5));
    let bw2 = p2.install(|| measure_read_bandwidth(256 << 20, 5));
    let fl1 = p1.install(|| measure_peak_flops(5));
    let fl2 = p2.install(|| measure_peak_flops(5));
    println!(
        "read bandwidth   1 thread {:7.2} GB/s   2 threads {:7.2} GB/s",
        bw1 / 1e9,
        bw2 / 1e9
    );
    println!(
        "peak f32 FMA     1 thread {:7.1} GFLOP/s 2 threads {:7.1} GFLOP/s",
        fl1 / 1e9,
        fl2 / 1e9
    );

    // bf16 GEMV on large matrices (2 threads).
    for (rows, cols) in [(4096, 8192), (8192, 7168)] {
        let w = bf16_matrix(1, rows, cols);
        let x = vec![0.5f32; cols]; // [1, cols]
        let mut y = vec![0.0f32; rows]; // [1, rows]
        let bw2 = p2.install(|| measure_read_bandwidth(128 << 20, 3));
        let t = p2.install(|| best_of(10, || matmul(&w, black_box(&x), 1, &mut y)));
        let gbs = w.nbytes() as f64 / t;
        println!(
            "bf16 GEMV {rows}x{cols} ({} MiB): {:7.2} GB/s = {:5.1}% of bandwidth ({:.0} us)",
            w.nbytes() >> 20,
            gbs / 1e9,
            100.0 * gbs / bw2,
            t * 1e6
        );
    }

    // Expert walk: many 2048x1408 bf16 / fp8 matrices, one GEMV each, in sequence (2 threads).
    for fp8 in [false, true] {
        let experts: Vec<Matrix> = (0..48)
            .map(|e| {
                if fp8 {
                    fp8_matrix(100 + e, 2048, 1408)
                } else {
                    bf16_matrix(100 + e, 2048, 1408)
                }
            })
            .collect();
        let bytes: usize = experts.iter().map(Matrix::nbytes).sum();
        let x = vec![0.5f32; 1408]; // [1, 1408]
        let mut y = vec![0.0f32; 2048]; // [1, 2048]
        let bw2 = p2.install(|| measure_read_bandwidth(128 << 20, 3));
        let t = p2.install(|| {
            best_of(5, || {
                for w in &experts {
                    matmul(w, black_box(&x), 1, &mut y);
                }
            })
        });
        let gbs = bytes as f64 / t;
        println!(
        "{} expert walk 48 x 2048x1408 ({} MiB): {:7.2} GB/s = {:5.1}% of bandwidth ({:.0} us/expert)",
        if fp8 { "fp8 " } else { "bf16" },
        bytes >> 20,
        gbs / 1e9,
        100.0 * gbs / bw2,
        t * 1e6 / 48.0
    );
        drop(experts);
    }

    // fp8 GEMV (block 128x128).
    let w = fp8_matrix(3, 8192, 7168);
    let x = vec![0.5f32; 7168]; // [1, cols]
    let mut y = vec![0.0f32; 8192]; // [1, rows]
    let bw2 = p2.install(|| measure_read_bandwidth(128 << 20, 3));
    let t = p2.install(|| best_of(10, || matmul(&w, black_box(&x), 1, &mut y)));
    let gbs = w.nbytes() as f64 / t;
    println!(
        "fp8 GEMV 8192x7168 ({} MiB): {:7.2} GB/s = {:5.1}% of bandwidth ({:.0} us)",
        w.nbytes() >> 20,
        gbs / 1e9,
        100.0 * gbs / bw2,
        t * 1e6
    );
    drop(w);

    // GEMM: bf16 2048x7168 at several batch sizes, 1 and 2 threads.
    let w = bf16_matrix(4, 2048, 7168);
    for n in [2, 4, 16, 64, 512] {
        let x: Vec<f32> = activations(5, n * 7168); // [n, cols]
        let mut y = vec![0.0f32; n * 2048]; // [n, rows]
        let flops = 2.0 * (2048 * 7168 * n) as f64;
        let reps = if n >= 512 { 2 } else { 5 };
        for (threads, p) in [(1, &p1), (2, &p2)] {
            let peak = p.install(|| measure_peak_flops(3));
            let t = p.install(|| best_of(reps, || matmul(&w, black_box(&x), n, &mut y)));
            println!(
                "bf16 GEMM 2048x7168 n={n:3} {threads} thr: {:7.1} GFLOP/s = {:5.1}% of peak, weights {:6.2} GB/s ({:.2} ms)",
                flops / t / 1e9,
                100.0 * flops / t / peak,
                w.nbytes() as f64 / t / 1e9,
                t * 1e3
            );
        }
    }
}

/// `cargo bench --bench kernels -- indexer`: V3.2's decode-time index scores (64 index heads x
/// 128 dims against T cached keys), the keys as the weight operand (T rows, 64 tokens) or the
/// queries as the weight operand (64 rows, T tokens), 2 threads.
fn indexer_scores() {
    let p2 = pool(2);
    let (nh, d) = (64usize, 128usize);
    for t in [2048usize, 8192] {
        let keys: Vec<f32> = (0..t * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        let q: Vec<f32> = (0..nh * d)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0)
            .collect();
        let mut s = vec![0f32; nh * t];
        let a = p2.install(|| best_of(5, || matmul_f32(&keys, t, d, black_box(&q), nh, &mut s)));
        let b = p2.install(|| best_of(5, || matmul_f32(&q, nh, d, black_box(&keys), t, &mut s)));
        let wt = vec![0.01f32; nh];
        let mut score = vec![0f32; t];
        let c = p2.install(|| {
            best_of(5, || {
                for_each_row(&mut score, 256, nh * d * t, |ci, o| {
                    let mut dots = vec![0f32; nh];
                    for (i, oi) in o.iter_mut().enumerate() {
                        let k = (ci * 256 + i) * d;
                        dot_rows(black_box(&q), d, &keys[k..k + d], &mut dots);
                        *oi = dots.iter().zip(&wt).map(|(x, w)| w * x.max(0.0)).sum();
                    }
                })
            })
        });
        let flop = 2.0 * (nh * d * t) as f64;
        println!(
            "index scores T={t}: keys as weights {:.2} ms ({:.1} GFLOP/s), queries as weights {:.2} ms ({:.1} GFLOP/s), fused dot_rows per key {:.2} ms ({:.1} GFLOP/s)",
            1e3 * a,
            flop / a / 1e9,
            1e3 * b,
            flop / b / 1e9,
            1e3 * c,
            flop / c / 1e9
        );
    }
}

/// `cargo bench --bench kernels -- l2`: one-thread GEMV over a cache-resident matrix, i.e. the
/// kernel's compute rate with memory out of the way (bf16 vs fp8 decode cost per byte).
fn l2_probe() {
    let p1 = pool(1);
    for fp8 in [false, true] {
        let w = if fp8 {
            fp8_matrix(7, 256, 1408)
        } else {
            bf16_matrix(7, 256, 1408)
        };
        let x = vec![0.5f32; 1408];
        let mut y = vec![0.0f32; 256];
        let t = p1.install(|| {
            best_of(5, || {
                for _ in 0..200 {
                    matmul(&w, black_box(&x), 1, &mut y)
                }
            })
        });
        println!(
            "L2-resident {} GEMV 256x1408: {:.2} GB/s 1 thread",
            if fp8 { "fp8" } else { "bf16" },
            200.0 * w.nbytes() as f64 / t / 1e9
        );
    }
}

/// `cargo bench --bench kernels -- l2-tiles`: the several-token direct tiles' compute rate with
/// memory out of the way — one thread, one L2-resident 240 x 1408 bf16 matrix (660 KiB), then
/// a 960 x 256 one (short rows: a tile's fixed costs weigh more), each row-major and in bf16
/// strips (`Matrix::into_strips`), at n = 1..16 tokens, on every SIMD level: GFLOP/s and the
/// fraction of the one-thread f32 FMA peak (`measure_peak_flops`), best of 7 (each 400 products).
fn l2_tiles() {
    for (rows, cols, strips) in [
        (240, 1408, false),
        (240, 1408, true),
        (960, 256, false),
        (960, 256, true),
    ] {
        let w = bf16_matrix(17, rows, cols);
        let (w, layout) = if strips {
            (w.into_strips(), "strips")
        } else {
            (w, "rows")
        };
        for isa in Isa::available().into_iter().filter(|i| i.simd()) {
            let p = pool_isa(1, isa);
            let peak = p.install(|| measure_peak_flops(5));
            let line: Vec<String> = [1usize, 2, 3, 4, 5, 8, 9, 16]
                .iter()
                .map(|&n| {
                    let x: Vec<f32> = activations(3, n * cols); // [n, cols]
                    let mut y = vec![0.0f32; n * rows]; // [n, rows]
                    let t = p.install(|| {
                        best_of(7, || {
                            for _ in 0..400 {
                                matmul(&w, black_box(&x), n, &mut y)
                            }
                        })
                    }) / 400.0;
                    let f = 2.0 * (rows * cols * n) as f64 / t;
                    format!("n={n} {:5.1} ({:.2})", f / 1e9, f / peak)
                })
                .collect();
            println!(
                "{isa:8} {rows}x{cols} bf16 {layout:6}, 1 thr, peak {:5.1} GFLOP/s: {}",
                peak / 1e9,
                line.join(", ")
            );
        }
    }
}

/// `cargo bench --bench kernels -- f16`: one-token GEMV of f16 vs bf16 weights of the same shapes,
/// alternated per round (15 rounds, median GB/s of weights, 2 threads, the default ISA): a walk
/// over the widened target's decode shapes (1536 x 12288, 12288 x 1536, 16 experts of 768 x 1536
/// and 1536 x 768; ~150 MB per dtype, DRAM-resident), then one thread over a 256 x 1536 matrix
/// (L2-resident: the kernel's compute rate with memory out of the way).
fn f16_walk() {
    let mk = |f16: bool, seed, r, c| {
        if f16 {
            f16_matrix(seed, r, c)
        } else {
            bf16_matrix(seed, r, c)
        }
    };
    let shapes: Vec<(usize, usize)> = [(1536, 12288), (12288, 1536)]
        .into_iter()
        .chain((0..16).flat_map(|_| [(768, 1536), (1536, 768)]))
        .collect();
    for (label, threads, shapes, inner) in [
        ("DRAM walk", 2, shapes, 1),
        ("L2 256x1536", 1, vec![(256, 1536)], 400),
    ] {
        let p = pool(threads);
        let ws: [Vec<Matrix>; 2] = [false, true].map(|f| {
            shapes
                .iter()
                .enumerate()
                .map(|(i, &(r, c))| mk(f, 500 + i as u64, r, c))
                .collect()
        });
        let bytes: usize = ws[0].iter().map(Matrix::nbytes).sum();
        // one [cols] input and one [rows] output per matrix (both dtypes share the shapes)
        let xs: Vec<Vec<f32>> = ws[0].iter().map(|w| vec![0.25f32; w.cols]).collect();
        let mut ys: Vec<Vec<f32>> = ws[0].iter().map(|w| vec![0.0f32; w.rows]).collect();
        let mut rates = [Vec::new(), Vec::new()];
        for round in 0..16 {
            for (k, set) in ws.iter().enumerate() {
                let t = Instant::now();
                p.install(|| {
                    for _ in 0..inner {
                        for ((w, x), y) in set.iter().zip(&xs).zip(ys.iter_mut()) {
                            matmul(w, black_box(x), 1, y);
                        }
                    }
                });
                black_box(&ys);
                if round > 0 {
                    rates[k].push((inner * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9);
                }
            }
        }
        let (b, f) = (median(&mut rates[0]), median(&mut rates[1]));
        println!(
            "{label} ({threads} thr, {:.1} MB per dtype): bf16 {b:6.1} GB/s, f16 {f:6.1} GB/s (medians of 15 alternated), f16/bf16 {:.2}x",
            bytes as f64 / 1e6,
            f / b
        );
    }
    // Several tokens: f16 products of the widened target's prefill shapes on every SIMD level
    // (the exact levels' 8-lane order, the avx512bf16 level's 64-lane one), 2 threads, best of 5.
    for (rows, cols, ns) in [
        (2048, 2048, &[2usize, 9, 64, 512][..]),
        (12288, 1536, &[512][..]),
        (1536, 12288, &[512][..]),
        (768, 1536, &[48][..]),
        (1536, 768, &[48][..]),
    ] {
        let w = f16_matrix(600, rows, cols);
        for &n in ns {
            let x: Vec<f32> = activations(7, n * cols); // [n, cols]
            let mut y = vec![0.0f32; n * rows]; // [n, rows]
            let reps = (512 / n).max(1);
            let line: Vec<String> = Isa::available()
                .into_iter()
                .filter(|i| i.simd())
                .map(|isa| {
                    let t = pool_isa(2, isa).install(|| {
                        best_of(5, || {
                            for _ in 0..reps {
                                matmul(&w, black_box(&x), n, &mut y)
                            }
                        })
                    }) / reps as f64;
                    format!("{isa} {:6.1}", 2.0 * (rows * cols * n) as f64 / t / 1e9)
                })
                .collect();
            println!(
                "f16 {rows}x{cols} n={n:3}, GFLOP/s (2 thr): {}",
                line.join(", ")
            );
        }
    }
}

/// `cargo bench --bench kernels -- smalln`: the verification regime — a walk over 32 distinct
/// 1536x1536 bf16 matrices (expert-sized, 144 MiB in all, so DRAM-resident) at n = 1..16 tokens,
/// per ISA level, 2 threads: time per walk relative to n = 1 (1.0 = the weights are read once
/// and the extra tokens are free). `smalln-wide`: 8 matrices of 1536x6144 (down projections of
/// a wide MLP; 144 MiB). `smalln-experts`: 64 routed-expert matrices of the widened target
/// (768x1536, then 1536x768; 144 MiB each walk). `smalln-dense`: 4 of its layer-0 down projection
/// (1536x12288; 144 MiB). `smalln-tall`: 4 of its layer-0 gate / up projections (12288x1536),
/// then 8 of its shared experts' (6144x1536). Each walk row-major, then in bf16 strips.
fn small_n(rows: usize, cols: usize, count: u64) {
    for strips in [false, true] {
        small_n_walk(rows, cols, count, strips);
    }
}

/// One layout of [`small_n`]: row-major bf16, or bf16 strips (`Matrix::into_strips`).
fn small_n_walk(rows: usize, cols: usize, count: u64, strips: bool) {
    let layout = if strips { "strips" } else { "rows" };
    let ws: Vec<Matrix> = (0..count)
        .map(|e| bf16_matrix(200 + e, rows, cols))
        .map(|w| if strips { w.into_strips() } else { w })
        .collect();
    let bytes: usize = ws.iter().map(Matrix::nbytes).sum();
    for isa in Isa::available() {
        let p = pool_isa(2, isa);
        let mut t1 = 0.0;
        for n in [1, 2, 3, 4, 5, 8, 9, 16] {
            let x: Vec<f32> = activations(5, n * cols); // [n, cols]
            let mut y = vec![0.0f32; n * rows]; // [n, rows]
            let t = p.install(|| {
                best_of(5, || {
                    for w in &ws {
                        matmul(w, black_box(&x), n, &mut y);
                    }
                })
            });
            if n == 1 {
                t1 = t;
            }
            println!(
                "{isa:8} {layout:6} {rows}x{cols} n={n:2}: {:6.2} ms/walk = {:5.2}x n=1, weights {:6.2} GB/s",
                t * 1e3,
                t / t1,
                bytes as f64 / t / 1e9
            );
        }
    }
}

/// `cargo bench --bench kernels -- prefetch`: the weight prefetch hint (`kernels::PrefetchHint`)
/// on a decode-step-like walk (a 102400 x 2048 lm_head plus 16 expert-sized 1408 x 2048
/// matrices, 476 MB of bf16; the fp8 walk the same shapes), 2 threads, the default ISA, at
/// n = 1 (the GEMV tile), 2 and 9 tokens (the direct tiles), L1 and L2 hints alternated for 7
/// rounds: median GB/s of weights streamed per hint and their ratio. Both hints are set alike
/// (the one-token hint and the several-token tiles' hint, `set_tile_prefetch_hint`), so n = 1
/// compares the first and n > 1 the second where the tiles are AVX512-BF16. Outputs are
/// compared bitwise.
fn prefetch_hints() {
    let p = pool(2);
    for fp8 in [false, true] {
        let mk = |seed, r, c| {
            if fp8 {
                fp8_matrix(seed, r, c)
            } else {
                bf16_matrix(seed, r, c)
            }
        };
        let mut ws = vec![mk(11, 102400, 2048)];
        ws.extend((0..16).map(|e| mk(300 + e, 1408, 2048)));
        let bytes: usize = ws.iter().map(Matrix::nbytes).sum();
        for n in [1usize, 2, 9] {
            let x: Vec<f32> = activations(9, n * 2048); // [n, 2048]
            let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0f32; n * w.rows]).collect();
            let mut rates = [Vec::new(), Vec::new()];
            let mut outs: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
            for round in 0..8 {
                for (h, hint) in [PrefetchHint::L1, PrefetchHint::L2].into_iter().enumerate() {
                    set_prefetch_hint(Some(hint));
                    set_tile_prefetch_hint(Some(hint));
                    let t = Instant::now();
                    p.install(|| {
                        for (w, y) in ws.iter().zip(ys.iter_mut()) {
                            matmul(w, black_box(&x), n, y);
                        }
                    });
                    let dt = t.elapsed().as_secs_f64();
                    if round > 0 {
                        rates[h].push(bytes as f64 / dt / 1e9);
                    }
                    outs[h] = ys.iter().flatten().map(|v| v.to_bits()).collect();
                }
            }
            assert_eq!(outs[0], outs[1], "prefetch hints changed results");
            let (l1, l2) = (median(&mut rates[0]), median(&mut rates[1]));
            println!(
                "{} n={n}: L1 hint {l1:5.1} GB/s, L2 hint {l2:5.1} GB/s (median of 7 alternated), L2/L1 {:.2}x",
                if fp8 { "fp8 " } else { "bf16" },
                l2 / l1
            );
        }
    }
    set_prefetch_hint(None);
    set_tile_prefetch_hint(None);
    println!(
        "default hints on this CPU: {:?} (one token), {:?} (several-token bf16-dot tiles)",
        PrefetchHint::detect(),
        PrefetchHint::detect_tiles()
    );
}

/// `cargo bench --bench kernels -- avx2-tiles`: the AVX2 direct path's token tiles, 4 rows x 3
/// tokens everywhere (`set_avx2_token_tiles(Some(false))`) against the default rule (3 rows x 4
/// tokens at n mod 4 = 0 or 3), alternated for 9 rounds on the widened target's shapes (about
/// 150 MB of bf16 per walk) at n = 4..9 and 16, 2 threads: median time relative to one token
/// and the rounds the rule won. Outputs compared bitwise. Skipped without AVX2.
#[cfg(target_arch = "x86_64")]
fn avx2_token_tiles() {
    use specmla::kernels::set_avx2_token_tiles;
    let Some(isa) = Isa::available()
        .into_iter()
        .find(|i| i.simd() && !i.avx512())
    else {
        println!("no avx2 level on this CPU");
        return;
    };
    let p = pool_isa(2, isa);
    let shapes = [
        (1536usize, 1536usize, 32u64),
        (768, 1536, 64),
        (1536, 768, 64),
        (12288, 1536, 4),
        (1536, 12288, 4),
        (6144, 1536, 8),
        (1536, 6144, 8),
    ];
    for (rows, cols, count) in shapes {
        let ws: Vec<Matrix> = (0..count)
            .map(|e| bf16_matrix(200 + e, rows, cols))
            .collect();
        let bytes: usize = ws.iter().map(Matrix::nbytes).sum();
        let x1: Vec<f32> = activations(5, cols); // [1, cols]
        let mut y1 = vec![0.0f32; rows]; // [1, rows]
        for n in [4usize, 5, 6, 7, 8, 9, 16] {
            let x: Vec<f32> = activations(5, n * cols); // [n, cols]
            let mut y = vec![0.0f32; n * rows]; // [n, rows]
            let walk = |fours: Option<bool>, y: &mut [f32]| {
                set_avx2_token_tiles(fours);
                p.install(|| {
                    best_of(2, || {
                        for w in &ws {
                            matmul(w, black_box(&x), n, y);
                        }
                    })
                })
            };
            let (mut threes, mut rule, mut one) = (Vec::new(), Vec::new(), Vec::new());
            let mut wins = 0;
            let mut y_threes = vec![0.0f32; n * rows];
            for _ in 0..9 {
                one.push(p.install(|| {
                    best_of(2, || {
                        for w in &ws {
                            matmul(w, black_box(&x1), 1, &mut y1);
                        }
                    })
                }));
                let ta = walk(Some(false), &mut y_threes);
                let tb = walk(None, &mut y);
                assert!(
                    y.iter()
                        .zip(&y_threes)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "token tiles changed bits at {rows}x{cols} n={n}"
                );
                wins += usize::from(tb < ta);
                threes.push(ta);
                rule.push(tb);
            }
            set_avx2_token_tiles(None);
            let med = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2]
            };
            let (ta, tb, t1) = (med(&mut threes), med(&mut rule), med(&mut one));
            println!(
                "{rows:5}x{cols:5} n={n:2}: 4x3 {:.2}x n=1 ({:5.1} GB/s), rule {:.2}x ({:5.1} GB/s), rule won {wins}/9",
                ta / t1,
                bytes as f64 / ta / 1e9,
                tb / t1,
                bytes as f64 / tb / 1e9
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_token_tiles() {
    println!("no avx2 level on this CPU");
}

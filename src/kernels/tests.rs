//! Kernel tests: accuracy against f64 references, the fp8 / bf16 decodes against exact tables,
//! bitwise batch invariance across batch sizes, positions, neighbours and pool sizes, and bitwise
//! equality of the AVX2 and portable paths.

use super::gemm::{matmul_in, matmul_with, Call, WRef};
use super::lanes;
use super::vec_ops::{dot_rows_with, dot_with};
use super::*;

/// xorshift64* — deterministic test data without extra crates.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub(super) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Exact e4m3fn value of a byte (None for NaN), computed from the format definition.
fn e4m3_exact(b: u8) -> Option<f64> {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f64;
    if e == 15 && m == 7.0 {
        return None;
    }
    let mag = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    Some(sign * mag)
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    F32,
    Bf16,
    F16,
    /// fp8 with (block_rows, block_cols)
    Fp8(usize, usize),
    /// bf16 in strips of 16 rows (`Matrix::into_strips`; row-major when rows are not a
    /// multiple of 16)
    Bf16Strips,
}

pub(super) fn random_matrix(rng: &mut Rng, kind: Kind, rows: usize, cols: usize) -> Matrix {
    match kind {
        Kind::F32 => Matrix::from_f32(rows, cols, rng.vec(rows * cols)),
        Kind::Bf16 => {
            let d: Vec<u16> = (0..rows * cols)
                .map(|_| (rng.f32().to_bits() >> 16) as u16)
                .collect();
            Matrix::from_bf16(rows, cols, d)
        }
        Kind::Bf16Strips => random_matrix(rng, Kind::Bf16, rows, cols).into_strips(),
        Kind::F16 => {
            let d: Vec<half::f16> = (0..rows * cols)
                .map(|_| half::f16::from_f32(rng.f32()))
                .collect();
            Matrix::from_f16(rows, cols, d)
        }
        Kind::Fp8(br, bc) => {
            let d: Vec<u8> = (0..rows * cols)
                .map(|_| loop {
                    let b = rng.next() as u8;
                    if b & 0x7f != 0x7f {
                        break b;
                    }
                })
                .collect();
            let ns = rows.div_ceil(br) * cols.div_ceil(bc);
            let s: Vec<f32> = (0..ns).map(|_| (rng.f32().abs() + 0.01) * 0.003).collect();
            Matrix::from_fp8(rows, cols, d, s, br, bc)
        }
    }
}

/// W[r, k] as f64, from the format definitions (not from the kernels' decoders).
pub(super) fn w_exact(w: &Matrix, r: usize, k: usize) -> f64 {
    let i = r * w.cols + k;
    match &w.data {
        MatrixData::F32(d) => d[i] as f64,
        MatrixData::Bf16(d) => f32::from_bits((d[i] as u32) << 16) as f64,
        MatrixData::Bf16Strips(d) => {
            f32::from_bits((super::gemm::strips_at(d, w.cols, r, k) as u32) << 16) as f64
        }
        MatrixData::F16(d) => d[i].to_f64(),
        MatrixData::Fp8 {
            data,
            scale_inv,
            block_rows,
            block_cols,
        } => {
            let s = scale_inv[r / block_rows * w.cols.div_ceil(*block_cols) + k / block_cols];
            e4m3_exact(data[i]).expect("finite") * s as f64
        }
    }
}

pub(super) fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool")
}

const KINDS: [Kind; 8] = [
    Kind::F32,
    Kind::Bf16,
    Kind::F16,
    Kind::Fp8(128, 128),
    Kind::Fp8(3, 16),
    Kind::Fp8(5, 12),
    Kind::Fp8(4, 24),
    // the avx512bf16 level's fp8 path (block columns a multiple of 64), odd block rows
    Kind::Fp8(5, 64),
];

#[test]
fn fp8_decode_matches_exact_table() {
    for b in 0..=255u8 {
        if let Some(v) = e4m3_exact(b) {
            assert_eq!(
                (lanes::fp8_unscaled(b) * lanes::FP8_UNSCALE) as f64,
                v,
                "byte {b:#x}"
            );
        } else {
            assert_eq!(
                lanes::fp8_unscaled(b).abs() * lanes::FP8_UNSCALE,
                480.0,
                "NaN byte {b:#x}"
            );
        }
    }
    // Dequantised rows are the correctly rounded f32(fp8 * scale_inv).
    let mut rng = Rng(7);
    let w = random_matrix(&mut rng, Kind::Fp8(2, 16), 5, 40);
    let mut row = vec![0.0f32; 40];
    for r in 0..5 {
        matrix_row_f32(&w, r, &mut row);
        for (k, v) in row.iter().enumerate() {
            assert_eq!(*v, w_exact(&w, r, k) as f32, "row {r} col {k}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn simd_decoders_match_portable() {
    use super::simd::WLoad;
    if !Isa::detect().simd() {
        return;
    }
    let bytes: Vec<u8> = (0..=255u8).collect();
    let halves: Vec<u16> = (0..256u32).map(|i| (i * 257) as u16).collect();
    for c in 0..32 {
        let mut out = [0.0f32; 8];
        // SAFETY: avx2/fma/f16c detected above; 8 elements are in bounds.
        unsafe {
            let v = <u8 as WLoad>::load8(bytes.as_ptr().add(c * 8));
            std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), v);
        }
        for l in 0..8 {
            assert_eq!(
                out[l].to_bits(),
                lanes::fp8_unscaled(bytes[c * 8 + l]).to_bits()
            );
        }
        unsafe {
            let v = <u16 as WLoad>::load8(halves.as_ptr().add(c * 8));
            std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), v);
        }
        for l in 0..8 {
            assert_eq!(
                out[l].to_bits(),
                lanes::bf16_to_f32(halves[c * 8 + l]).to_bits()
            );
        }
    }
}

#[test]
fn matmul_matches_f64_reference() {
    let mut rng = Rng(1);
    for kind in KINDS {
        for (rows, cols) in [
            (1, 1),
            (3, 7),
            (5, 8),
            (13, 37),
            (33, 130),
            (70, 300),
            (9, 1029),
        ] {
            let w = random_matrix(&mut rng, kind, rows, cols);
            for n in [1, 2, 3, 5, 8, 70] {
                assert_matmul_near_f64(&mut rng, &w, n, &format!("{kind:?}"));
            }
        }
    }
}

/// `matmul` of `w` over n random tokens: every element within 1e-5 of the summed magnitudes of
/// its exact f64 sum.
pub(super) fn assert_matmul_near_f64(rng: &mut Rng, w: &Matrix, n: usize, label: &str) {
    let (rows, cols) = (w.rows, w.cols);
    let x = rng.vec(n * cols); // [n, cols]
    let mut y = vec![0.0f32; n * rows]; // [n, rows]
    matmul(w, &x, n, &mut y);
    for t in 0..n {
        for r in 0..rows {
            let (mut s, mut mag) = (0.0f64, 0.0f64);
            for k in 0..cols {
                let p = w_exact(w, r, k) * x[t * cols + k] as f64;
                s += p;
                mag += p.abs();
            }
            let got = y[t * rows + r] as f64;
            assert!(
                (got - s).abs() <= 1e-5 * mag + 1e-30,
                "{label} {rows}x{cols} n={n} t={t} r={r}: {got} vs {s}"
            );
        }
    }
}

/// y[t] for a token placed at every position among random neighbours, for every n and pool
/// size, must be bit-identical to the single-token result.
pub(super) fn check_batch_invariance(
    isa: Isa,
    kind: Kind,
    rows: usize,
    cols: usize,
    ns: &[usize],
    pools: &[usize],
) {
    let mut rng = Rng(0x5eed ^ (rows * 1000 + cols) as u64);
    let w = random_matrix(&mut rng, kind, rows, cols);
    let wr = WRef::of(&w);
    let token = rng.vec(cols); // [cols]
    let mut y1 = vec![0.0f32; rows]; // [rows]
    matmul_with(isa, wr, rows, cols, &token, 1, &mut y1);
    for &threads in pools {
        pool(threads).install(|| {
            for &n in ns {
                // Every position for small batches; edges and middle for the large ones.
                let positions: Vec<usize> = if n <= 16 {
                    (0..n).collect()
                } else {
                    vec![0, 1, n / 2, n - 2, n - 1]
                };
                for p in positions {
                    let mut x = rng.vec(n * cols); // [n, cols]
                    x[p * cols..(p + 1) * cols].copy_from_slice(&token);
                    let mut y = vec![0.0f32; n * rows]; // [n, rows]
                    matmul_with(isa, wr, rows, cols, &x, n, &mut y);
                    for r in 0..rows {
                        assert_eq!(
                            y[p * rows + r].to_bits(),
                            y1[r].to_bits(),
                            "{kind:?} {rows}x{cols} n={n} pos={p} threads={threads} row {r}"
                        );
                    }
                }
            }
        });
    }
}

/// Every SIMD level this machine has (AVX2, AVX-512): each is batch-invariant on its own.
#[test]
fn batch_invariance_bitwise_simd() {
    let small: Vec<usize> = (1..=13).collect();
    for isa in Isa::available().into_iter().filter(|i| i.simd()) {
        eprintln!("batch invariance on {isa}");
        for kind in KINDS {
            check_batch_invariance(isa, kind, 37, 141, &small, &[1, 2, 3]);
            // Large enough for the rayon-parallel path; n past the direct/panel switch and past
            // one GEMM token block.
            check_batch_invariance(isa, kind, 260, 267, &small, &[1, 2, 3]);
            check_batch_invariance(isa, kind, 70, 267, &[64, 65, 66, 100], &[1, 2, 3]);
            // Columns a multiple of 32: the AMX level's tile path for bf16 (row tails of 5 and
            // 4 rows, token tiles past 16).
            check_batch_invariance(isa, kind, 37, 160, &small, &[1, 2, 3]);
            check_batch_invariance(isa, kind, 260, 256, &[2, 16, 17, 33], &[1, 2, 3]);
            check_batch_invariance(isa, kind, 70, 288, &[64, 65, 66, 100], &[1, 3]);
            // Columns a multiple of 64: the avx512bf16 level's fp8 path (one and several
            // scale blocks per row, row tails of 1, token tiles of 1..4).
            check_batch_invariance(isa, kind, 37, 192, &small, &[1, 2, 3]);
            check_batch_invariance(isa, kind, 261, 384, &[2, 5, 17, 49], &[1, 2, 3]);
            // 1024 columns: the avx512bf16 level's single-pass tiles at 7..=9 tokens (3 x 7,
            // 2 x 8, 2 x 9, a row tail of 1), the two-pass tiles around them.
            check_batch_invariance(isa, kind, 37, 1024, &small, &[1, 2]);
            // Rows past 2048 columns (4 x n and 4 x 6 tiles whose rows do not fit L1; several
            // token blocks).
            check_batch_invariance(isa, kind, 37, 2112, &small, &[1, 2]);
            check_batch_invariance(isa, kind, 37, 2112, &[49, 64, 101], &[1, 3]);
            check_batch_invariance(isa, kind, 9, 4160, &[7, 17, 49, 50], &[1, 3]);
            // The single-pass tiles over column spans (7..=9 tokens past 27 KB of activations:
            // uneven spans, several row blocks and sub-blocks, a row tail of 1 at 7 tokens),
            // taken only with the L1 tile prefetch hint; with the L2 hint the two passes.
            let hints = super::prefetch::HINT_TEST_LOCK
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for hint in [PrefetchHint::L1, PrefetchHint::L2] {
                set_tile_prefetch_hint(Some(hint));
                check_batch_invariance(isa, kind, 150, 3200, &[7, 8, 9], &[1, 3]);
            }
            set_tile_prefetch_hint(None);
            drop(hints);
        }
    }
}

/// The AVX2 direct path's token tiles (4 rows x 3 tokens, 3 rows x 4 tokens, and the rule that
/// picks between them per token block: `gemm/avx2.rs`) are the same bits: every n of 2..=17 and
/// 26..=30 (a full 24-token block then a tail) under each choice, against the same n through the
/// default rule, for every kind, row tails of 1 and 2 after the 3-row and 4-row tiles, on 1 and
/// 3 threads (that n tokens equal one token at a time is `batch_invariance_bitwise_simd`'s).
/// The choice is process-wide, and other tests running meanwhile see the same bits whichever is
/// in force.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_token_tiles_are_the_same_bits() {
    use super::set_avx2_token_tiles;
    let Some(isa) = Isa::available()
        .into_iter()
        .find(|i| i.simd() && !i.avx512())
    else {
        return; // no AVX2 level on this CPU
    };
    let ns: Vec<usize> = (2..=17).chain(26..=30).collect();
    for kind in KINDS {
        for (rows, cols) in [(37, 141), (74, 1030), (13, 2112)] {
            let mut rng = Rng(0x3a4 ^ (rows * 1000 + cols) as u64);
            let w = random_matrix(&mut rng, kind, rows, cols);
            let wr = WRef::of(&w);
            for threads in [1, 3] {
                pool(threads).install(|| {
                    for &n in &ns {
                        let x = rng.vec(n * cols); // [n, cols]
                        let mut want = vec![0.0f32; n * rows]; // [n, rows]
                        set_avx2_token_tiles(None);
                        matmul_with(isa, wr, rows, cols, &x, n, &mut want);
                        for fours in [Some(false), Some(true)] {
                            let mut y = vec![0.0f32; n * rows]; // [n, rows]
                            set_avx2_token_tiles(fours);
                            matmul_with(isa, wr, rows, cols, &x, n, &mut y);
                            set_avx2_token_tiles(None);
                            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{kind:?} {rows}x{cols} n={n} {fours:?} threads={threads} element {i}"
                                );
                            }
                        }
                    }
                });
            }
        }
    }
}

/// The 1..6-token products of a matrix marked cache-resident (`Matrix::cache_resident`: several
/// rows per register tile on avx512bf16) are the same bits as unmarked, on every ISA, through
/// `matmul` and `matmul_many` (one token), on 1..3 threads: row counts that leave tails of
/// 1..7 rows after the 8-row and 4-row tiles, rows short and long, several row blocks.
#[test]
fn cache_resident_tiles_are_the_same_bits() {
    let shapes = [
        (37, 192),
        (200, 768),
        (9, 64),
        (64, 1536),
        (261, 384),
        (15, 160),
    ];
    for isa in Isa::available() {
        for kind in KINDS {
            for &(rows, cols) in &shapes {
                let mut rng = Rng(0x7e5 ^ (rows * 1000 + cols) as u64);
                let w = random_matrix(&mut rng, kind, rows, cols);
                let hot = w.clone().with_cache_resident(true);
                assert!(hot.cache_resident() && !w.cache_resident());
                let xs = rng.vec(6 * cols); // [6, cols]
                let x = &xs[..cols]; // [cols]
                let cold = Call {
                    may_fork: true,
                    resident: false,
                };
                let warm = Call {
                    may_fork: true,
                    resident: true,
                };
                for threads in [1, 2, 3] {
                    pool(threads).install(|| {
                        for n in [1, 2, 3, 5, 6] {
                            let xn = &xs[..n * cols]; // [n, cols]
                            let mut cold_y = vec![0.0f32; n * rows]; // [n, rows]
                            let mut hot_y = vec![0.0f32; n * rows]; // [n, rows]
                            matmul_in(isa, WRef::of(&w), rows, cols, xn, n, &mut cold_y, cold);
                            matmul_in(isa, WRef::of(&hot), rows, cols, xn, n, &mut hot_y, warm);
                            let what = format!("{isa} {kind:?} {rows}x{cols} n={n} t={threads}");
                            for (i, (h, c)) in hot_y.iter().zip(&cold_y).enumerate() {
                                assert_eq!(h.to_bits(), c.to_bits(), "{what} element {i}");
                            }
                        }
                        let what = format!("{isa} {kind:?} {rows}x{cols} threads={threads}");
                        let mut cold_y = vec![0.0f32; rows]; // [rows]
                                                             // the engine's entry points: matmul and matmul_many on the pinned ISA
                        let mut y = vec![0.0f32; rows]; // [rows]
                        let mut y2 = vec![0.0f32; rows]; // [rows]
                        matmul(&w, x, 1, &mut cold_y);
                        matmul(&hot, x, 1, &mut y);
                        matmul_many(vec![(&hot, x, &mut y2[..])]);
                        for r in 0..rows {
                            assert_eq!(
                                y[r].to_bits(),
                                cold_y[r].to_bits(),
                                "{what} matmul row {r}"
                            );
                            assert_eq!(y2[r].to_bits(), cold_y[r].to_bits(), "{what} many row {r}");
                        }
                    });
                }
            }
        }
    }
}

/// `set_matmul_profiling`: while on, every `matmul` / `matmul_many` call is counted under its
/// shape with its weight bytes and a time; while off, nothing is (shapes no other test uses).
#[test]
fn matmul_profile_counts_calls_by_shape_only_while_on() {
    let mut rng = Rng(0x9f0f);
    let a = random_matrix(&mut rng, Kind::Bf16, 29, 96); // [29, 96]
    let b = random_matrix(&mut rng, Kind::F32, 31, 96); // [31, 96]
    let x = rng.vec(3 * 96); // [3, 96]
    let mut y = vec![0.0f32; 3 * 31]; // [3, 31]
    let key = |rows, tokens, many| ShapeKey {
        rows,
        cols: 96,
        tokens,
        many,
    };
    let find = |k: ShapeKey| matmul_profile().into_iter().find(|s| s.shape == k);
    matmul(&a, &x, 3, &mut y[..87]);
    assert!(find(key(29, 3, false)).is_none(), "counted while off");
    set_matmul_profiling(true);
    matmul(&a, &x, 3, &mut y[..87]);
    matmul(&a, &x, 3, &mut y[..87]);
    let (mut ya, mut yb) = (vec![0.0f32; 29], vec![0.0f32; 31]);
    matmul_many(vec![
        (&a, &x[..96], &mut ya[..]),
        (&b, &x[..96], &mut yb[..]),
    ]);
    set_matmul_profiling(false);
    matmul(&a, &x, 3, &mut y[..87]);
    let s = find(key(29, 3, false)).expect("matmul counted");
    assert_eq!((s.calls, s.weight_bytes), (2, 2 * 29 * 96 * 2));
    assert!(s.seconds > 0.0 && s.weight_gb_s() > 0.0);
    let m = find(key(60, 1, true)).expect("matmul_many counted");
    assert_eq!((m.calls, m.weight_bytes), (1, 29 * 96 * 2 + 31 * 96 * 4));
}

#[test]
fn batch_invariance_bitwise_portable() {
    for kind in KINDS {
        check_batch_invariance(Isa::portable(), kind, 19, 45, &[1, 2, 3, 4, 5], &[1, 3]);
    }
}

/// Every ISA this machine has gives the portable path's bits (the cross-ISA tolerance is zero),
/// except the `amx` level's bf16 tile path (bf16 weights, columns a multiple of 32): exact
/// products, another f32 summation order, so there each element is within
/// `AMX_REL_TOL * sum_k |w_rk * x_tk|` of the portable one (f32 rounding of a 16-bit-exact
/// product sum: a few ulps of the magnitude; 1e-6 leaves a margin of ~10x) — and the
/// `avx512bf16` level's `vdpbf16ps` path (same bf16 weights, and fp8 weights with 64-column
/// groups): the activations are rounded to bf16 (relative error <= 2^-9 each; the weights are
/// exact in bf16), so each element is within `BF16_DOT_REL_TOL * sum |w * x|`. That level's
/// f16 path (f16 weights, columns a multiple of 64: `gemm/f16x64.rs`) has exact products in
/// another f32 order, bounded like the AMX path.
#[test]
fn simd_and_portable_bitwise_equal() {
    const AMX_REL_TOL: f64 = 1e-6;
    const BF16_DOT_REL_TOL: f64 = 1.0 / 512.0 + 1e-6;
    let mut rng = Rng(3);
    for kind in KINDS {
        for (rows, cols) in [
            (1, 3),
            (11, 16),
            (37, 141),
            (300, 291),
            (70, 1030),
            (11, 32),
            (37, 160),
            (70, 1024),
            (9, 320),
        ] {
            let w = random_matrix(&mut rng, kind, rows, cols);
            for n in [1, 2, 4, 7, 9, 10, 13, 16, 17, 25, 67, 101] {
                let x = rng.vec(n * cols); // [n, cols]
                let mut yp = vec![0.0f32; n * rows]; // [n, rows]
                matmul_with(Isa::portable(), WRef::of(&w), rows, cols, &x, n, &mut yp);
                for isa in Isa::available() {
                    let mut ys = vec![0.0f32; n * rows]; // [n, rows]
                    matmul_with(isa, WRef::of(&w), rows, cols, &x, n, &mut ys);
                    let f16x64 = super::gemm::takes_f16x64(isa, WRef::of(&w), cols);
                    let tiles = (isa.amx() && matches!(kind, Kind::Bf16) && cols % 32 == 0)
                        || super::gemm::takes_bf16_dot(isa, WRef::of(&w), cols)
                        || f16x64;
                    let tol = if isa.bf16_dot() && !f16x64 {
                        BF16_DOT_REL_TOL
                    } else {
                        AMX_REL_TOL
                    };
                    for (i, (a, b)) in ys.iter().zip(&yp).enumerate() {
                        if tiles {
                            let (t, r) = (i / rows, i % rows);
                            let mag: f64 = (0..cols)
                                .map(|k| (w_exact(&w, r, k) * x[t * cols + k] as f64).abs())
                                .sum();
                            assert!(
                                ((a - b) as f64).abs() <= tol * mag,
                                "{isa} {kind:?} {rows}x{cols} n={n} at {i}: {a} vs {b} (mag {mag})"
                            );
                        } else {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{isa} {kind:?} {rows}x{cols} n={n} at {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn isa_levels_parse_and_pin() {
    assert_eq!(IsaLevel::parse("AVX512"), Some(Some(IsaLevel::Avx512)));
    assert_eq!(IsaLevel::parse("native"), Some(None));
    assert_eq!(IsaLevel::parse("sse9"), None);
    assert!(Isa::available().contains(&Isa::portable()));
    assert!(Isa::available().contains(&Isa::detect()));
    let default_best = Isa::available().into_iter().rfind(|i| !i.level().opt_in());
    assert_eq!(
        default_best,
        Some(Isa::detect()),
        "amx is opt-in, the rest best-first"
    );
    assert!(IsaLevel::best_exact().exact() && IsaLevel::best_exact().supported());
    assert_eq!(IsaLevel::parse("exact"), Some(Some(IsaLevel::best_exact())));
    if IsaLevel::Avx512Bf16.supported() {
        assert_eq!(Isa::detect().level(), IsaLevel::Avx512Bf16);
        assert_eq!(IsaLevel::best_exact(), IsaLevel::Avx512);
    }
    assert_eq!(IsaLevel::parse("amx"), Some(Some(IsaLevel::Amx)));
    assert_eq!(
        IsaLevel::parse("avx512bf16"),
        Some(Some(IsaLevel::Avx512Bf16))
    );
    std::thread::spawn(|| {
        assert_eq!(Isa::current(), Isa::detect());
        crate::kernels::pin_thread(Some(Isa::portable()));
        assert_eq!(Isa::current(), Isa::portable());
        crate::kernels::pin_thread(None);
        assert_eq!(Isa::current(), Isa::detect());
    })
    .join()
    .unwrap();
}

#[test]
fn dot_is_the_matmul_order_and_accurate() {
    let mut rng = Rng(11);
    for len in [0, 1, 7, 8, 9, 64, 100, 1000] {
        let a = rng.vec(len);
        let b = rng.vec(len);
        let d = dot(&a, &b);
        assert_eq!(
            d.to_bits(),
            dot_with(Isa::portable(), &a, &b).to_bits(),
            "len {len}"
        );
        let mut y = [0.0f32; 1];
        matmul_f32(&a, 1, len, &b, 1, &mut y);
        assert_eq!(d.to_bits(), y[0].to_bits(), "dot vs matmul, len {len}");
        let r: f64 = a.iter().zip(&b).map(|(p, q)| *p as f64 * *q as f64).sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (*p as f64 * *q as f64).abs())
            .sum();
        assert!(
            (d as f64 - r).abs() <= 1e-6 * mag + 1e-30,
            "len {len}: {d} vs {r}"
        );
    }
}

#[test]
fn dot_rows_equals_dot_bitwise() {
    let mut rng = Rng(12);
    for len in [0, 1, 7, 8, 9, 64, 128, 192, 576] {
        for (count, pad) in [(0, 0), (1, 0), (3, 5), (4, 0), (9, 64), (17, 3)] {
            let stride = len + pad;
            let rows = rng.vec(count * stride + 1);
            let x = rng.vec(len);
            for isa in [Isa::detect(), Isa::portable()] {
                let mut out = vec![0.0f32; count];
                dot_rows_with(isa, &rows, stride, &x, &mut out);
                for (r, o) in out.iter().enumerate() {
                    let want = dot(&rows[r * stride..r * stride + len], &x);
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "len {len} count {count} row {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn vector_ops_match_references() {
    let mut rng = Rng(5);
    for len in [1, 5, 8, 33, 1000] {
        let x: Vec<f32> = rng.vec(len).iter().map(|v| v * 6.0).collect();
        let w = rng.vec(len);
        // rms_norm
        let mut out = vec![0.0f32; len];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / len as f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for i in 0..len {
            let r = x[i] as f64 * inv * w[i] as f64;
            assert!(
                (out[i] as f64 - r).abs() <= 1e-5 * (r.abs() + 1e-3),
                "rms {len} {i}"
            );
        }
        // softmax / log_softmax
        let m = x.iter().fold(f64::NEG_INFINITY, |a, v| a.max(*v as f64));
        let z: f64 = x.iter().map(|v| (*v as f64 - m).exp()).sum();
        let mut sm = x.clone();
        softmax_inplace(&mut sm);
        let mut ls = vec![0.0f32; len];
        log_softmax(&x, &mut ls);
        let total: f64 = sm.iter().map(|v| *v as f64).sum();
        assert!((total - 1.0).abs() < 1e-5, "softmax sums to {total}");
        for i in 0..len {
            let p = (x[i] as f64 - m).exp() / z;
            assert!(
                (sm[i] as f64 - p).abs() <= 1e-6 + 1e-5 * p,
                "softmax {len} {i}"
            );
            assert!(
                (ls[i] as f64 - p.ln()).abs() <= 1e-5 * (1.0 + p.ln().abs()),
                "logsm {len} {i}"
            );
        }
        // silu_mul, axpy
        let up = rng.vec(len);
        silu_mul(&x, &up, &mut out);
        for i in 0..len {
            let g = x[i] as f64;
            let r = g / (1.0 + (-g).exp()) * up[i] as f64;
            assert!(
                (out[i] as f64 - r).abs() <= 1e-5 * (r.abs() + 1e-3),
                "silu {len} {i}"
            );
        }
        let mut y = w.clone();
        axpy(0.5, &x, &mut y);
        for i in 0..len {
            assert_eq!(y[i], w[i] + 0.5 * x[i]);
        }
    }
    // Softmax with a huge logit stays finite and peaked.
    let mut big = vec![0.0f32, 1000.0, -1000.0];
    softmax_inplace(&mut big);
    assert_eq!(big, vec![0.0, 1.0, 0.0]);
}

#[test]
fn matrix_rows_decode() {
    let mut rng = Rng(9);
    for kind in [Kind::F32, Kind::Bf16, Kind::F16] {
        let w = random_matrix(&mut rng, kind, 4, 13);
        let mut row = vec![0.0f32; 13];
        for r in 0..4 {
            matrix_row_f32(&w, r, &mut row);
            for (k, v) in row.iter().enumerate() {
                assert_eq!(*v as f64, w_exact(&w, r, k));
            }
        }
    }
}

#[test]
fn probes_report_positive_rates() {
    let bw = pool(1).install(|| measure_read_bandwidth(1 << 22, 2));
    assert!(bw.is_finite() && bw > 1e8, "bandwidth {bw}");
}

#[test]
fn weighted_sum_rows_is_the_axpy_loop_on_every_isa() {
    use super::weighted_sum::weighted_sum_rows_with;
    let mut rng = Rng(21);
    for (rows, width, keys) in [
        (1, 5, 3),
        (4, 16, 9),
        (7, 130, 40),
        (16, 512, 70),
        (9, 128, 1),
    ] {
        let ps = keys + 3;
        let p = rng.vec(rows * ps); // [rows, ps]
        let vs = width + 64;
        let vals = rng.vec(keys * vs); // [keys, vs]
        let lens: Vec<usize> = (0..rows)
            .map(|r| keys - (r * 7 % keys.max(1)).min(keys - 1))
            .collect();
        let mut want = vec![0.0f32; rows * width]; // [rows, width]
        for (r, o) in want.chunks_exact_mut(width).enumerate() {
            for t in 0..lens[r] {
                axpy(p[r * ps + t], &vals[t * vs..t * vs + width], o);
            }
        }
        for isa in Isa::available() {
            let mut got = vec![1.0f32; rows * width];
            weighted_sum_rows_with(isa, &p, ps, &lens, &vals, vs, width, &mut got, false);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{isa} rows {rows} width {width} keys {keys} at {i}"
                );
            }
            // Values stored as bf16 / f16: the bits of the same sum over their f32 widening.
            let bf: Vec<u16> = vals.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let hf: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            let wide_bf: Vec<f32> = bf
                .iter()
                .map(|&b| f32::from_bits((b as u32) << 16))
                .collect();
            let wide_hf: Vec<f32> = hf.iter().map(|h| h.to_f32()).collect();
            let mut w_bf = vec![0.0f32; rows * width];
            let mut w_hf = vec![0.0f32; rows * width];
            weighted_sum_rows_with(isa, &p, ps, &lens, &wide_bf, vs, width, &mut w_bf, false);
            weighted_sum_rows_with(isa, &p, ps, &lens, &wide_hf, vs, width, &mut w_hf, false);
            let mut g_bf = vec![0.0f32; rows * width];
            let mut g_hf = vec![0.0f32; rows * width];
            weighted_sum_rows_with(isa, &p, ps, &lens, &bf, vs, width, &mut g_bf, false);
            weighted_sum_rows_with(isa, &p, ps, &lens, &hf, vs, width, &mut g_hf, false);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&g_bf),
                bits(&w_bf),
                "{isa} bf16 rows {rows} width {width}"
            );
            assert_eq!(
                bits(&g_hf),
                bits(&w_hf),
                "{isa} f16 rows {rows} width {width}"
            );
            // Streamed: keys in consecutive ranges (accumulating), columns in two groups, each
            // range's values copied out as attention's span buffer holds them — same bits.
            for span in [1, 4, 7, 64] {
                let mut got = vec![0.0f32; rows * width];
                let c_split = (width / 2) & !15;
                for (c0, c1) in [(0, c_split), (c_split, width)] {
                    let cw = c1 - c0;
                    let mut part = vec![0.0f32; rows * cw]; // [rows, cw]
                    for k0 in (0..keys).step_by(span) {
                        let k1 = (k0 + span).min(keys);
                        let buf: Vec<f32> = (k0..k1)
                            .flat_map(|t| vals[t * vs + c0..t * vs + c1].iter().copied())
                            .collect(); // [k1 - k0, cw]
                        let local: Vec<usize> =
                            lens.iter().map(|&l| l.clamp(k0, k1) - k0).collect();
                        weighted_sum_rows_with(
                            isa,
                            &p[k0..],
                            ps,
                            &local,
                            &buf,
                            cw,
                            cw,
                            &mut part,
                            true,
                        );
                    }
                    for r in 0..rows {
                        got[r * width + c0..r * width + c1]
                            .copy_from_slice(&part[r * cw..(r + 1) * cw]);
                    }
                }
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{isa} streamed span {span} rows {rows} width {width} keys {keys} at {i}"
                    );
                }
            }
        }
    }
}

/// The `avx512bf16` level's f16 path computes every element in the order its module defines
/// (`f16x64::reference`, portable Rust), bitwise, at every token count and tile shape: one token,
/// one-row tiles of 2..=6 (activations in L1), the 4 x 6 quarter-pass tiles (activations past
/// L1: partial token tiles, several token blocks, two column blocks, row tails of 1), on 1 and 3
/// threads.
#[test]
fn f16x64_path_is_its_reference_order() {
    let Some(isa) = Isa::new(IsaLevel::Avx512Bf16) else {
        eprintln!("no avx512bf16 level on this CPU: f16x64 path not run");
        return;
    };
    let mut rng = Rng(21);
    for (rows, cols, ns) in [
        (37, 64, &[1usize, 2, 5, 6, 7, 13, 100][..]),
        (130, 1024, &[1, 3, 6, 7, 9, 64, 65, 70][..]),
        (5, 4096, &[1, 2, 17, 33][..]),
    ] {
        let w = random_matrix(&mut rng, Kind::F16, rows, cols);
        let MatrixData::F16(wd) = &w.data else {
            unreachable!()
        };
        assert!(super::gemm::takes_f16x64(isa, WRef::of(&w), cols));
        for &n in ns {
            let x = rng.vec(n * cols); // [n, cols]
            for threads in [1, 3] {
                let mut y = vec![0.0f32; n * rows]; // [n, rows]
                pool(threads).install(|| matmul_with(isa, WRef::of(&w), rows, cols, &x, n, &mut y));
                for t in 0..n {
                    for r in 0..rows {
                        let want = super::gemm::f16x64_reference(
                            &wd[r * cols..(r + 1) * cols],
                            &x[t * cols..(t + 1) * cols],
                        );
                        assert_eq!(
                            y[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{rows}x{cols} n={n} t={t} r={r} threads={threads}"
                        );
                    }
                }
            }
        }
    }
}

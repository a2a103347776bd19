//! Tests of bf16 strips (`gemm/strips.rs`, the `avx2` level's layout): packing round trips,
//! the sequential-chain order on every level bitwise, batch invariance, and accuracy.

use super::gemm::{matmul_with, WRef};
use super::tests::{
    assert_matmul_near_f64, check_batch_invariance, pool, random_matrix, w_exact, Kind, Rng,
};
use super::*;

/// Rows x columns covering: one strip, odd column counts (no 8-lane tail exists here, but the
/// row-major kernels have one), several strips with a remainder of the 4- and 2-strip groups,
/// row blocks past ROW_BLOCK_GEMV (128) and ROW_BLOCK_GEMM (64) with a partial last block, and
/// rows past 2048 columns.
const SHAPES: [(usize, usize); 8] = [
    (16, 1),
    (16, 7),
    (32, 141),
    (48, 267),
    (80, 64),
    (272, 267),
    (208, 1030),
    (48, 2112),
];

/// y[t][r] by the chain the strips order defines, written out here independently of the
/// kernels: acc = fma(w[r][c], x[t][c], acc) for c = 0.. from 0.
fn chain(w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let (rows, cols) = (w.rows, w.cols);
    let mut y = vec![0f32; n * rows]; // [n, rows]
    for t in 0..n {
        for r in 0..rows {
            let mut acc = 0f32;
            for c in 0..cols {
                acc = (w_exact(w, r, c) as f32).mul_add(x[t * cols + c], acc);
            }
            y[t * rows + r] = acc;
        }
    }
    y
}

#[test]
fn strips_pack_round_trips_and_reads_rows() {
    let mut rng = Rng(21);
    for (rows, cols) in SHAPES {
        let rm = random_matrix(&mut rng, Kind::Bf16, rows, cols);
        let st = rm.clone().into_strips();
        assert!(
            matches!(st.data, MatrixData::Bf16Strips(_)),
            "{rows}x{cols}"
        );
        assert_eq!((st.rows, st.cols, st.nbytes()), (rows, cols, rm.nbytes()));
        let back = st.bf16_row_major().expect("bf16");
        let MatrixData::Bf16(orig) = &rm.data else {
            unreachable!()
        };
        assert_eq!(&back[..], &orig[..], "{rows}x{cols} round trip");
        assert!(matches!(st.row_major().data, MatrixData::Bf16(_)));
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in [0, 1, 7, 8, 9, 15, rows - 1] {
            matrix_row_f32(&rm, r, &mut a);
            matrix_row_f32(&st, r, &mut b);
            assert_eq!(a, b, "{rows}x{cols} row {r}");
        }
        // a view on strip boundaries reads the same rows
        if rows >= 32 {
            let v = st.rows_view(16, 16);
            let mut x = rng.vec(cols);
            x[0] = 1.0;
            let (mut yv, mut yf) = (vec![0f32; 16], vec![0f32; rows]);
            matmul(&v, &x, 1, &mut yv);
            matmul(&st, &x, 1, &mut yf);
            assert_eq!(&yv[..], &yf[16..32], "{rows}x{cols} view");
        }
    }
    // a view off a strip boundary reads the same rows (from a row-major copy)
    // (from the first strip, inside a later one, and across the last two)
    let st = random_matrix(&mut rng, Kind::Bf16Strips, 48, 33);
    for (r0, n) in [(5, 20), (20, 10), (17, 31)] {
        let v = st.rows_view(r0, n);
        assert!(matches!(v.data, MatrixData::Bf16(_)));
        assert_eq!((v.rows, v.cols), (n, 33));
        let (mut a, mut b) = (vec![0f32; 33], vec![0f32; 33]);
        for r in 0..n {
            matrix_row_f32(&v, r, &mut a);
            matrix_row_f32(&st, r0 + r, &mut b);
            assert_eq!(a, b, "off-boundary view {r0}+{n} row {r}");
        }
    }
    // rows that are not a multiple of 16, and other dtypes, stay as they are
    let odd = random_matrix(&mut rng, Kind::Bf16, 37, 20).into_strips();
    assert!(matches!(odd.data, MatrixData::Bf16(_)));
    let f = random_matrix(&mut rng, Kind::F32, 32, 20).into_strips();
    assert!(matches!(f.data, MatrixData::F32(_)));
}

/// Every level this machine runs (portable included) computes a strips matrix as the chain —
/// bitwise, for every n through the GEMV groups, the 2..6-token tiles, several token tiles, and
/// token blocks past 48 — and `matmul_many` too.
#[test]
fn strips_are_the_sequential_chain_on_every_level() {
    let mut rng = Rng(22);
    for (rows, cols) in SHAPES {
        let w = random_matrix(&mut rng, Kind::Bf16Strips, rows, cols);
        for n in [1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 49, 70] {
            let x = rng.vec(n * cols); // [n, cols]
            let want = chain(&w, &x, n);
            for isa in Isa::available() {
                for threads in [1, 2] {
                    let mut y = vec![0f32; n * rows]; // [n, rows]
                    pool(threads)
                        .install(|| matmul_with(isa, WRef::of(&w), rows, cols, &x, n, &mut y));
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{isa} {rows}x{cols} n={n} threads={threads} at {i}"
                        );
                    }
                }
            }
        }
        let x = rng.vec(cols);
        let want = chain(&w, &x, 1);
        let mut y = vec![0f32; rows];
        matmul_many(vec![(&w, &x[..], &mut y[..])]);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "matmul_many {rows}x{cols}"
        );
    }
}

#[test]
fn strips_batch_invariance_bitwise() {
    let small: Vec<usize> = (1..=13).collect();
    for isa in Isa::available() {
        check_batch_invariance(isa, Kind::Bf16Strips, 48, 141, &small, &[1, 2, 3]);
        check_batch_invariance(isa, Kind::Bf16Strips, 272, 267, &small, &[1, 2, 3]);
        check_batch_invariance(
            isa,
            Kind::Bf16Strips,
            80,
            300,
            &[48, 49, 64, 65, 100],
            &[1, 3],
        );
        check_batch_invariance(isa, Kind::Bf16Strips, 32, 2112, &[7, 9, 17], &[1, 2]);
    }
}

#[test]
fn strips_match_f64_reference() {
    let mut rng = Rng(23);
    for (rows, cols) in SHAPES {
        let w = random_matrix(&mut rng, Kind::Bf16Strips, rows, cols);
        for n in [1, 5, 70] {
            assert_matmul_near_f64(&mut rng, &w, n, "strips");
        }
    }
}

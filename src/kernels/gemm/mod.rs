//! Batch-invariant matmul: y[n_tokens, rows] = x[n_tokens, cols] · Wᵀ for f32, bf16 and
//! block-scaled fp8 weights. Every linear layer of the model (and the MLA absorption / router
//! gate through [`matmul_f32`]) goes through here.
//!
//! Guarantee: each y[t][r] is computed by the fixed sequence of `lanes.rs`, whatever `n_tokens`,
//! the position of t, the other tokens, the rayon pool, or the row split. Work is cut into fixed
//! row blocks (rayon tasks when the product is large enough); inside a block:
//! - n <= `DIRECT_MAX_TOKENS` (decode, speculative verification, small prefill chunks): weights
//!   are decoded on the fly into register tiles — 8 rows x 1 token (bf16, f16, fp8: 4) for GEMV, 4 rows x
//!   3 tokens (fp8: 2 x 3) otherwise, or 3 rows x 4 tokens at some token counts (`avx2.rs`) —
//!   that keep their accumulators for the whole row;
//! - larger n (prefill): weights are decoded once per column block into an f32 panel, and
//!   `MR` x `NR` register tiles sweep it; each element's 8-lane accumulator lives in a scratch
//!   buffer between column blocks (a store and reload is exact, so the order is unchanged).
//!
//! The portable path computes each element alone through `lanes.rs` and is bitwise equal.
//! On the `amx` level, bf16 weights whose column count is a multiple of 32 take the AMX tile
//! path of `amx.rs` at every n instead (its own fixed order; see there); on the `avx512bf16`
//! level they take the `vdpbf16ps` path of `bf16dot.rs` (bf16-rounded activations; see there),
//! and so do fp8 weights whose columns and block columns are multiples of 64 where the CPU has
//! AVX512-VBMI (each e4m3 value is exact in bf16); f16 weights whose column count is a multiple
//! of 64 take the 64-lane path of `f16x64.rs` there (exact products, its own f32 order).

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub use avx2::set_avx2_token_tiles;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16dot;
#[cfg(target_arch = "x86_64")]
mod f16x64;
mod strips;

pub use strips::strips_by_default;
pub(crate) use strips::{at as strips_at, pack as pack_strips, unpack as unpack_strips, STRIP};

use super::aligned::AlignedBuf;
use super::lanes::{self, LANES};
use super::{Isa, Matrix, MatrixData, ShapeKey};

/// Rows per rayon task (and per scratch block) for one token / several tokens. One-token blocks
/// of 128 rows (512 KiB of a 2048-column bf16 matrix) cost fewer task hand-offs per byte than 32:
/// batch-1 decode 1.03-1.07x on peer-v2lite, AMD EPYC, three alternated pairs (BENCHMARKS.md).
const ROW_BLOCK_GEMV: usize = 128;
const ROW_BLOCK_GEMM: usize = 64;
/// 8-column chunks per column block of the GEMM panel (non-fp8 weights).
const KC_CHUNKS: usize = 16;
/// Up to this many tokens the weights are decoded on the fly (memory-bound regime); above it
/// they are decoded once per column block into an f32 panel.
const DIRECT_MAX_TOKENS: usize = 64;
/// Tokens per direct-path token block (its x rows stay in L2 while row tiles sweep them).
const DIRECT_TOKEN_BLOCK: usize = 24;
/// Tokens per GEMM token block (bounds the accumulator scratch; x slices stay in L2).
const TOKEN_BLOCK: usize = 48;
/// Tokens per matmul pass: longer inputs are split (bounded scratch; same bits).
const CALL_TOKEN_CHUNK: usize = 512;
/// Register tile of the GEMM: rows x tokens.
const MR: usize = 4;
const NR: usize = 3;

/// A borrowed weight matrix [rows, cols] in its storage precision.
#[derive(Clone, Copy)]
pub(crate) enum WRef<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    /// [rows / 16, cols, 16] (`strips.rs`)
    Bf16Strips(&'a [u16]),
    F16(&'a [half::f16]),
    Fp8 {
        data: &'a [u8],
        scale_inv: &'a [f32],
        block_rows: usize,
        block_cols: usize,
    },
}

impl<'a> WRef<'a> {
    pub(crate) fn of(w: &'a Matrix) -> Self {
        match &w.data {
            MatrixData::F32(v) => WRef::F32(v),
            MatrixData::Bf16(v) => WRef::Bf16(v),
            MatrixData::Bf16Strips(v) => WRef::Bf16Strips(v),
            MatrixData::F16(v) => WRef::F16(v),
            MatrixData::Fp8 {
                data,
                scale_inv,
                block_rows,
                block_cols,
            } => WRef::Fp8 {
                data,
                scale_inv,
                block_rows: *block_rows,
                block_cols: *block_cols,
            },
        }
    }
}

/// y[n, w.rows] = x[n, w.cols] · wᵀ.  x: [n_tokens, cols] row-major; y: [n_tokens, rows].
pub fn matmul(w: &Matrix, x: &[f32], n_tokens: usize, y: &mut [f32]) {
    let how = Call {
        may_fork: true,
        resident: w.cache_resident(),
    };
    let key = ShapeKey {
        rows: w.rows,
        cols: w.cols,
        tokens: n_tokens,
        many: false,
    };
    super::profile::timed(key, w.nbytes(), || {
        matmul_in(
            Isa::current(),
            WRef::of(w),
            w.rows,
            w.cols,
            x,
            n_tokens,
            y,
            how,
        )
    });
}

/// Same for a borrowed f32 matrix [rows, cols] (attention absorption, router gate).
pub fn matmul_f32(w: &[f32], rows: usize, cols: usize, x: &[f32], n_tokens: usize, y: &mut [f32]) {
    assert_eq!(w.len(), rows * cols, "matmul_f32: w is not [rows, cols]");
    matmul_with(Isa::current(), WRef::F32(w), rows, cols, x, n_tokens, y);
}

/// `y[n, rows] = x[n, cols] · wᵀ` for borrowed rows `w: [rows, cols]` in their storage
/// precision, on the calling thread only (for callers that already split their work across the
/// pool: attention's key spans): the bits of [`matmul_f32`] over the f32 copy of `w` (so never
/// the AMX tile path: a span read in place and one read through an f32 copy must agree).
pub fn matmul_rows_serial(
    w: super::Rows<'_>,
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    assert_eq!(w.len(), rows * cols, "matmul_rows: w is not [rows, cols]");
    let wr = match w {
        super::Rows::F32(v) => WRef::F32(v),
        super::Rows::Bf16(v) => WRef::Bf16(v),
        super::Rows::F16(v) => WRef::F16(v),
    };
    matmul_in(
        Isa::current().without_tiles(),
        wr,
        rows,
        cols,
        x,
        n_tokens,
        y,
        Call {
            may_fork: false,
            resident: false,
        },
    );
}

/// Several independent one-token products `ys[i][..w_i.rows] = w_i · xs[i]` in ONE parallel
/// pass over all their row blocks (decode: an MoE layer's experts, q and kv_a projections):
/// one fork-join instead of one per matrix, and the memory streams of the next matrix start
/// while the last blocks of the previous one finish. Each element is computed exactly as by
/// [`matmul`] with n = 1.
pub fn matmul_many(items: Vec<(&Matrix, &[f32], &mut [f32])>) {
    if !super::profile::on() {
        return matmul_many_in(items);
    }
    let cols = items.first().map_or(0, |(w, _, _)| w.cols);
    let key = ShapeKey {
        rows: items.iter().map(|(w, _, _)| w.rows).sum(),
        cols: if items.iter().all(|(w, _, _)| w.cols == cols) {
            cols
        } else {
            0
        },
        tokens: 1,
        many: true,
    };
    let bytes = items.iter().map(|(w, _, _)| w.nbytes()).sum();
    super::profile::timed(key, bytes, || matmul_many_in(items))
}

/// [`matmul_many`] itself.
fn matmul_many_in(items: Vec<(&Matrix, &[f32], &mut [f32])>) {
    let isa = Isa::current();
    // Shapes first; then the bf16 operands of the AMX / bf16-dot paths, one buffer per item
    // that takes one (with its packed length).
    let packs: Vec<(AlignedBuf, usize)> = items
        .iter()
        .map(|(w, x, y)| {
            assert_eq!(x.len(), w.cols, "matmul_many: x is not [cols]");
            assert_eq!(y.len(), w.rows, "matmul_many: y is not [rows]");
            let mut b = AlignedBuf::default();
            let len = pack_bf16_operand(isa, WRef::of(w), w.cols, x, 1, &mut b);
            (b, len)
        })
        .collect();
    let mut jobs = Vec::with_capacity(items.len());
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new(); // (item, first row, out rows)
    let mut work = 0;
    for (i, (w, x, y)) in items.into_iter().enumerate() {
        let wr = WRef::of(w);
        check_fp8_shape(wr, w.rows, w.cols);
        work += w.rows * w.cols;
        jobs.push(Job {
            isa,
            w: wr,
            cols: w.cols,
            x,
            n: 1,
            rb: ROW_BLOCK_GEMV,
            xpack: &[],
            rows_total: w.rows,
            bpack: &packs[i].0.as_u16()[..packs[i].1],
            resident: w.cache_resident(),
        });
        for (bi, o) in y.chunks_mut(ROW_BLOCK_GEMV).enumerate() {
            tasks.push((i, bi * ROW_BLOCK_GEMV, o));
        }
    }
    if tasks.len() > 1 && super::worth_parallel(work) {
        tasks
            .into_par_iter()
            .for_each_init(Scratch::default, |s, (i, r0, o)| {
                jobs[i].row_block(r0, o, s)
            });
    } else {
        let mut s = Scratch::default();
        for (i, r0, o) in tasks {
            jobs[i].row_block(r0, o, &mut s);
        }
    }
}

/// fp8 weights: positive block sizes, [rows, cols] bytes and the matching scale grid
/// (internal invariant: `Matrix::from_fp8` and the loader already guarantee it).
fn check_fp8_shape(w: WRef<'_>, rows: usize, cols: usize) {
    if let WRef::Fp8 {
        data,
        scale_inv,
        block_rows,
        block_cols,
    } = w
    {
        assert!(block_rows > 0 && block_cols > 0, "matmul: fp8 block size 0");
        assert_eq!(
            data.len(),
            rows * cols,
            "matmul: fp8 data is not [rows, cols]"
        );
        let want = rows.div_ceil(block_rows) * cols.div_ceil(block_cols);
        assert_eq!(scale_inv.len(), want, "matmul: fp8 scale_inv shape");
    }
}

/// Whether matmuls of `w` run on the 64-lane f16 path (`f16x64.rs`) at `isa`: the
/// `avx512bf16` level's f16 weights with columns a multiple of 64.
pub(crate) fn takes_f16x64(isa: Isa, w: WRef<'_>, cols: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        f16x64::applies(isa, w, cols)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, w, cols);
        false
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use f16x64::reference as f16x64_reference;

/// Whether matmuls of `w` run on the `vdpbf16ps` path (bf16-rounded activations) at `isa`: the
/// `avx512bf16` level's bf16 weights with columns a multiple of 32, fp8 with columns and block
/// columns a multiple of 64 (and AVX512-VBMI). Tests use it to pick their bound.
#[cfg(test)]
pub(crate) fn takes_bf16_dot(isa: Isa, w: WRef<'_>, cols: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bf16dot::applies(isa, w, cols) || bf16dot::applies_fp8(isa, w, cols)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, w, cols);
        false
    }
}

/// [`matmul`] with an explicit instruction set (tests compare the SIMD and portable paths).
pub(crate) fn matmul_with(
    isa: Isa,
    w: WRef<'_>,
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let how = Call {
        may_fork: true,
        resident: false,
    };
    matmul_in(isa, w, rows, cols, x, n, y, how)
}

/// How one matmul call may run; neither field changes a result.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    /// False keeps every row block on the calling thread.
    pub(crate) may_fork: bool,
    /// The weights are expected in the CPU caches ([`Matrix::cache_resident`]).
    pub(crate) resident: bool,
}

/// `matmul_with` as `how` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_in(
    isa: Isa,
    w: WRef<'_>,
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    how: Call,
) {
    assert_eq!(x.len(), n * cols, "matmul: x is not [n_tokens, cols]");
    assert_eq!(y.len(), n * rows, "matmul: y is not [n_tokens, rows]");
    check_fp8_shape(w, rows, cols);
    if n == 0 || rows == 0 {
        return;
    }
    if n > CALL_TOKEN_CHUNK {
        // Long prompts: bounded scratch (packed activations, transposed output); every element
        // is computed exactly as in one call.
        for t0 in (0..n).step_by(CALL_TOKEN_CHUNK) {
            let m = CALL_TOKEN_CHUNK.min(n - t0);
            matmul_in(
                isa,
                w,
                rows,
                cols,
                &x[t0 * cols..(t0 + m) * cols],
                m,
                &mut y[t0 * rows..(t0 + m) * rows],
                how,
            );
        }
        return;
    }
    let rb = if n == 1 {
        ROW_BLOCK_GEMV
    } else {
        ROW_BLOCK_GEMM
    };
    let parallel = how.may_fork && rows > rb && super::worth_parallel(rows * cols * n);
    // (a call nested on this thread, run while an outer call waits for its row blocks, gets
    // buffers of its own)
    super::with_thread_scratch(&CALL_BUFS, |bufs| {
        matmul_call(
            isa,
            w,
            rows,
            cols,
            x,
            n,
            y,
            (rb, parallel, how.resident),
            bufs,
        )
    });
}

/// Per-thread buffers of one matmul call (packed activations), kept for the next call on the
/// thread: a multi-token matmul otherwise allocates and frees them every call, and large ones
/// come back from the OS as fresh zeroed pages each time (page faults were ~4 % of a
/// speculative-decode profile). Contents never carry over: each call packs what it reads.
#[derive(Default)]
struct CallBufs {
    x: AlignedBuf,
    b: AlignedBuf,
    /// x copied to a 64-byte-aligned start, for the paths that read it in place.
    a: AlignedBuf,
}

thread_local! {
    static CALL_BUFS: std::cell::RefCell<CallBufs> = std::cell::RefCell::new(CallBufs::default());
}

/// One call of at most `CALL_TOKEN_CHUNK` tokens with its buffers (see [`matmul_in`]).
#[allow(clippy::too_many_arguments)]
fn matmul_call(
    isa: Isa,
    w: WRef<'_>,
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    (rb, parallel, resident): (usize, bool, bool),
    bufs: &mut CallBufs,
) {
    // Once per call: the AMX / bf16-dot paths read bf16 operands, the other AVX-512
    // multi-token kernels the activations packed in token pairs.
    let packed_b = pack_bf16_operand(isa, w, cols, x, n, &mut bufs.b);
    let f16 = takes_f16x64(isa, w, cols);
    let packed_x = packed_b == 0 && isa.avx512() && n > 1 && !f16;
    if packed_x {
        super::simd512::pack_pairs(x, cols, n, cols / LANES, &mut bufs.x); // [pairs, pair_stride]
    }
    #[cfg(target_arch = "x86_64")]
    let packed_q = f16 && f16x64::packs_x(n, cols);
    #[cfg(not(target_arch = "x86_64"))]
    let packed_q = false;
    #[cfg(target_arch = "x86_64")]
    if packed_q {
        f16x64::pack_quarters(x, n, cols, bufs.x.reuse(n * cols)); // [4, n, cols / 64, 16]
    }
    let xpack = if packed_q {
        &bufs.x.as_slice()[..n * cols]
    } else if packed_x {
        bufs.x.as_slice()
    } else {
        &[]
    };
    // The paths that read x in place load it in 8- or 16-lane chunks at every multiple of 8
    // floats: from a start that is not 64-byte aligned (a 16-byte-aligned heap block, a token
    // slice), half or all of those loads split a cache line; the AVX2 3 x 4 tile over
    // cache-resident operands ran 14 % faster with x aligned (docs/BENCHMARKS.md "Aligned
    // activations and a one-op bf16 decode"). Such an x of at most `DIRECT_MAX_TOKENS` tokens
    // (the direct tiles; at most 3 MiB kept per thread) is copied once per call into the
    // thread's aligned buffer; the values are the same. The strips tiles load x one float at a
    // time (broadcasts), which never split a line: they read it in place.
    let misaligned = !(x.as_ptr() as usize).is_multiple_of(64);
    let loads_lanes = !matches!(w, WRef::Bf16Strips(_));
    let x =
        if xpack.is_empty() && packed_b == 0 && misaligned && loads_lanes && n <= DIRECT_MAX_TOKENS
        {
            let xa = bufs.a.reuse(n * cols); // [n, cols]
            xa.copy_from_slice(x);
            &bufs.a.as_slice()[..n * cols]
        } else {
            x
        };
    let bpack = &bufs.b.as_u16()[..packed_b];
    let job = Job {
        isa,
        w,
        cols,
        x,
        n,
        rb,
        xpack,
        rows_total: rows,
        bpack,
        resident,
    };
    if n == 1 {
        job.run(y, parallel);
    } else {
        job.run_token_major(y, parallel);
    }
}

/// The bf16 operand of the AMX or bf16-dot path for x: [n, cols] into `buf` when one of them
/// takes these weights at this ISA — AMX: the exact three-way split per 16-token tile
/// ([tiles, 3, cols / 2, tile n, 2]); bf16-dot: x rounded to bf16 ([n, cols]) — and its length
/// in words; 0 (nothing written) otherwise.
fn pack_bf16_operand(
    isa: Isa,
    w: WRef<'_>,
    cols: usize,
    x: &[f32],
    n: usize,
    buf: &mut AlignedBuf,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if amx::applies(isa, w, cols) {
        amx::pack_splits(x, cols, n, buf.reuse_u16(3 * cols * n));
        return 3 * cols * n;
    } else if bf16dot::applies(isa, w, cols) {
        // SAFETY: bf16dot::applies only on the avx512bf16 level (AVX512-BF16 present).
        unsafe { bf16dot::pack_bf16(x, buf.reuse_u16(cols * n)) };
        return cols * n;
    }
    let _ = (isa, w, cols, x, n, buf); // used only by the x86_64 paths above
    0
}

/// Per-task scratch buffers (reused across the blocks one rayon split processes).
#[derive(Default)]
struct Scratch {
    panel: AlignedBuf, // [block rows, column-block width] decoded weights
    acc: AlignedBuf,   // [block rows, tokens, 8] lane accumulators
    row: Vec<f32>,     // [cols] one decoded row (portable path)
    s256: Vec<f32>,    // [row blocks touched, col blocks] fp8 scales * 2^8
    deq: Vec<f32>,     // [block rows, cols] dequantised fp8 (block_cols not a multiple of 8)
}

/// The output y: [n, rows] of a multi-token call, shared by its row-block tasks; each task
/// writes only its own columns [r0, r0 + block rows) of every token row.
struct TokenMajor {
    ptr: *mut f32,
    rows: usize,
    n: usize,
}

// SAFETY: the tasks that share a TokenMajor write disjoint column ranges (their row blocks) and
// nothing reads y until the parallel region has ended (`Job::run_token_major`).
unsafe impl Send for TokenMajor {}
unsafe impl Sync for TokenMajor {}

impl TokenMajor {
    /// Columns [r0, r0 + nr) of every token row from `blk`: [nr, n] (a row block's output).
    ///
    /// # Safety
    /// `r0 + nr <= rows`, `blk.len() == nr * n`, and no other thread touches these columns.
    unsafe fn write_block(&self, r0: usize, nr: usize, blk: &[f32]) {
        debug_assert!(r0 + nr <= self.rows && blk.len() == nr * self.n);
        // 16 x 16 squares: 16 lines of blk read and 16 lines of y written per square, so the
        // power-of-two strides of both (n and rows floats) cannot evict the lines mid-square.
        const SQ: usize = 16;
        let n = self.n;
        for i0 in (0..nr).step_by(SQ) {
            let i1 = (i0 + SQ).min(nr);
            for t0 in (0..n).step_by(SQ) {
                for t in t0..(t0 + SQ).min(n) {
                    // SAFETY: in bounds by the caller's contract; columns owned by this block.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            self.ptr.add(t * self.rows + r0 + i0),
                            i1 - i0,
                        )
                    };
                    for (k, d) in dst.iter_mut().enumerate() {
                        *d = blk[(i0 + k) * n + t];
                    }
                }
            }
        }
    }
}

thread_local! {
    /// One row block's output of a multi-token call ([block rows, n]), reused by the next block
    /// this thread runs: grown, never cleared (every element is written before it is read).
    static BLOCK_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One matmul call, shared by all its row blocks.
#[derive(Clone, Copy)]
struct Job<'a> {
    isa: Isa,
    w: WRef<'a>,
    cols: usize,
    x: &'a [f32], // [n, cols]
    n: usize,
    rb: usize,
    /// AVX-512 with n > 1: x packed in token pairs [ceil(n / 2), pair_stride]; the f16x64 path's
    /// quarter-pass tiles: x packed by quarters [4, n, cols / 64, 16]; else empty.
    xpack: &'a [f32],
    /// Rows of the whole weight matrix (the AMX path prefetches only inside it).
    rows_total: usize,
    /// AMX path (bf16 weights): x split in three bf16 parts per 16-token tile,
    /// [tiles, 3, cols / 2, tile tokens, 2] (`amx::pack_splits`); bf16-dot path: x rounded to
    /// bf16, [n, cols] (`bf16dot::pack_bf16`); else empty.
    bpack: &'a [u16],
    /// The weights are expected in the CPU caches ([`Matrix::cache_resident`]): the bf16-dot
    /// path takes several rows per register tile at 1..6 tokens.
    resident: bool,
}

impl Job<'_> {
    /// All row blocks of `out` ([rows, n]), on the current rayon pool or on this thread.
    fn run(&self, out: &mut [f32], parallel: bool) {
        let rb = self.rb;
        if parallel {
            out.par_chunks_mut(rb * self.n)
                .enumerate()
                .for_each_init(Scratch::default, |s, (bi, o)| self.row_block(bi * rb, o, s));
        } else {
            let mut s = Scratch::default();
            for (bi, o) in out.chunks_mut(rb * self.n).enumerate() {
                self.row_block(bi * rb, o, &mut s);
            }
        }
    }

    /// All row blocks into the token-major `y`: [n, rows] (n > 1): each block is computed into
    /// the task's scratch ([block rows, n], the order the tiles produce) and written into its
    /// columns of y by the task itself while it is still in cache — no serial transposition of
    /// the whole product after the parallel region (it was ~6 % of a 2048-token prefill).
    fn run_token_major(&self, y: &mut [f32], parallel: bool) {
        let (rb, n, rows) = (self.rb, self.n, self.rows_total);
        assert_eq!(y.len(), n * rows, "matmul: y is not [n_tokens, rows]");
        let out = TokenMajor {
            ptr: y.as_mut_ptr(),
            rows,
            n,
        };
        // The bf16-dot path writes y itself (a token stride in its tiles): no copy at all.
        #[cfg(target_arch = "x86_64")]
        let direct = !self.bpack.is_empty() && self.isa.bf16_dot();
        #[cfg(target_arch = "x86_64")]
        let f16_direct = f16x64::applies(self.isa, self.w, self.cols);
        let block = |bi: usize, s: &mut Scratch| {
            let r0 = bi * rb;
            let nr = rb.min(rows - r0);
            #[cfg(target_arch = "x86_64")]
            if direct {
                // SAFETY: bpack is filled on the avx512bf16 level only when bf16dot::applies
                // (bf16 weights, AVX-512 + AVX512-BF16 present); the block writes elements
                // (r0 + i, t) at y[t * rows + r0 + i], i < nr, t < n: inside y ([n, rows]) and
                // in columns no other block writes; y is not read before every block is done.
                unsafe { self.row_block_bf16dot_at(r0, nr, out.ptr.add(r0), (1, rows)) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if f16_direct {
                // SAFETY: f16x64::applies only on the avx512bf16 level (AVX-512 + F16C present)
                // for f16 weights; elements written as by the bf16-dot path above.
                unsafe { self.row_block_f16x64_at(r0, nr, out.ptr.add(r0), (1, rows)) };
                return;
            }
            let run = |blk: &mut Vec<f32>| {
                if blk.len() < nr * n {
                    blk.resize(nr * n, 0.0);
                }
                // blk: [nr, n]
                self.row_block(r0, &mut blk[..nr * n], s);
                // SAFETY: r0 + nr <= rows; block bi alone owns columns [r0, r0 + nr); y is not
                // read before every block is done.
                unsafe { out.write_block(r0, nr, &blk[..nr * n]) };
            };
            super::with_thread_scratch(&BLOCK_OUT, run);
        };
        let blocks = rows.div_ceil(rb);
        if parallel {
            (0..blocks)
                .into_par_iter()
                .for_each_init(Scratch::default, |s, bi| block(bi, s));
        } else {
            let mut s = Scratch::default();
            for bi in 0..blocks {
                block(bi, &mut s);
            }
        }
    }

    /// Rows [r0, r0 + out.len() / n) for all tokens into out: [block rows, n].
    fn row_block(&self, r0: usize, out: &mut [f32], s: &mut Scratch) {
        let (n, cols) = (self.n, self.cols);
        let nrows = out.len() / n;
        if let WRef::Bf16Strips(w) = self.w {
            // One order on every level (strips.rs). Row blocks start at multiples of
            // ROW_BLOCK_GEMV / ROW_BLOCK_GEMM (multiples of 16).
            strips::row_block(self.isa, w, cols, self.x, n, r0, out);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if bf16dot::applies_fp8(self.isa, self.w, cols) {
            // SAFETY: applies_fp8 holds only on the avx512bf16 level (AVX-512 + AVX512-BF16)
            // on a CPU with AVX512-VBMI, for fp8 weights with 64-column groups.
            unsafe { self.row_block_bf16dot_fp8(r0, out, s) };
            return;
        }
        if let WRef::Fp8 {
            data,
            scale_inv,
            block_rows,
            block_cols,
        } = self.w
        {
            let ncb = cols.div_ceil(block_cols);
            if block_cols % LANES != 0 {
                // Odd fp8 blocks: the fixed order is the f32 one over the dequantised row.
                s.deq.resize(nrows * cols, 0.0);
                for i in 0..nrows {
                    let r = r0 + i;
                    let srow = &scale_inv[r / block_rows * ncb..][..ncb];
                    for (k, d) in s.deq[i * cols..(i + 1) * cols].iter_mut().enumerate() {
                        let scale = srow[k / block_cols] * lanes::FP8_UNSCALE;
                        *d = lanes::fp8_unscaled(data[r * cols + k]) * scale;
                    }
                }
                let deq = std::mem::take(&mut s.deq);
                let sub = Job {
                    w: WRef::F32(&deq),
                    ..*self
                };
                sub.row_block_at(0, r0, out, s);
                s.deq = deq;
                return;
            }
            s.s256.clear(); // [nrows, ncb]
            for r in r0..r0 + nrows {
                let srow = &scale_inv[r / block_rows * ncb..][..ncb];
                s.s256.extend(srow.iter().map(|v| v * lanes::FP8_UNSCALE));
            }
        }
        self.row_block_at(r0, r0, out, s);
    }

    /// As `row_block`, reading weight rows from `wr0` on (differs from r0 only for `deq`).
    fn row_block_at(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        #[cfg(target_arch = "x86_64")]
        if f16x64::applies(self.isa, self.w, self.cols) {
            // SAFETY: applies holds only on the avx512bf16 level (AVX-512 F/BW/DQ/VL + F16C
            // detected) for f16 weights with 64-column chunks.
            unsafe { self.row_block_f16x64(wr0, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !self.bpack.is_empty() {
            if self.isa.bf16_dot() {
                // SAFETY: bpack is filled on this level only when bf16dot::applies, i.e. the
                // CPU has AVX-512 + AVX512-BF16 (IsaLevel::supported), with bf16 weights.
                unsafe { self.row_block_bf16dot(wr0, out) };
            } else {
                // SAFETY: bpack is filled only when amx::applies, i.e. after Isa::amx() (the
                // CPU has AMX-BF16 and the OS granted the tile state), with bf16 weights.
                unsafe { self.row_block_amx(wr0, out) };
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.isa.avx512() && self.n > 1 {
            // SAFETY: Isa::avx512() is true only after the AVX-512 and AVX2 features were detected.
            unsafe { self.row_block_avx512(wr0, r0, out, s) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.isa.simd() {
            // SAFETY: Isa::simd() is true only after avx2, fma and f16c were detected.
            unsafe { self.row_block_simd(wr0, r0, out, s) };
            return;
        }
        self.row_block_portable(wr0, r0, out, s);
    }

    /// Row r's fp8 block scales (times 2^8), from the `s256` scratch of the block starting at r0.
    fn fp8_scales<'s>(&self, s256: &'s [f32], r0: usize, r: usize) -> &'s [f32] {
        match self.w {
            WRef::Fp8 { block_cols, .. } => {
                let ncb = self.cols.div_ceil(block_cols);
                &s256[(r - r0) * ncb..][..ncb]
            }
            _ => &[],
        }
    }

    /// Portable fallback: one element at a time through `lanes`.
    fn row_block_portable(&self, wr0: usize, r0: usize, out: &mut [f32], s: &mut Scratch) {
        let (n, cols) = (self.n, self.cols);
        s.row.resize(cols, 0.0);
        for (i, orow) in out.chunks_exact_mut(n).enumerate() {
            let wr = wr0 + i;
            let row = &mut s.row;
            match self.w {
                WRef::F32(d) => row.copy_from_slice(&d[wr * cols..(wr + 1) * cols]),
                WRef::Bf16(d) => {
                    for (o, b) in row.iter_mut().zip(&d[wr * cols..(wr + 1) * cols]) {
                        *o = lanes::bf16_to_f32(*b);
                    }
                }
                WRef::F16(d) => {
                    for (o, b) in row.iter_mut().zip(&d[wr * cols..(wr + 1) * cols]) {
                        *o = b.to_f32();
                    }
                }
                WRef::Fp8 { data, .. } => {
                    for (o, b) in row.iter_mut().zip(&data[wr * cols..(wr + 1) * cols]) {
                        *o = lanes::fp8_unscaled(*b);
                    }
                }
                WRef::Bf16Strips(_) => unreachable!("strips matrices take strips.rs"),
            }
            for (t, o) in orow.iter_mut().enumerate() {
                let xt = &self.x[t * cols..(t + 1) * cols];
                *o = match self.w {
                    WRef::Fp8 { block_cols, .. } => {
                        let sc = self.fp8_scales(&s.s256, r0, r0 + i);
                        lanes::fp8_row_dot(&s.row, sc, block_cols, xt)
                    }
                    _ => lanes::dot_lanes(&s.row, xt),
                };
            }
        }
    }

    /// Finish one element from its lane-summed value: the scalar tail over cols % 8 columns.
    fn tail(&self, wr: usize, sc256: &[f32], t: usize, mut acc: f32) -> f32 {
        let cols = self.cols;
        let full = cols / LANES * LANES;
        let xt = &self.x[t * cols..(t + 1) * cols];
        for k in full..cols {
            let wv = match self.w {
                WRef::F32(d) => d[wr * cols + k],
                WRef::Bf16(d) => lanes::bf16_to_f32(d[wr * cols + k]),
                WRef::F16(d) => d[wr * cols + k].to_f32(),
                WRef::Fp8 {
                    data, block_cols, ..
                } => lanes::fp8_unscaled(data[wr * cols + k]) * sc256[k / block_cols],
                WRef::Bf16Strips(_) => unreachable!("strips matrices have no lane tails"),
            };
            acc = wv.mul_add(xt[k], acc);
        }
        acc
    }

    /// Direct paths' epilogue: every element of `out` ([rows, n], lane sums) gets its scalar
    /// tail over cols % 8 columns.
    fn finish_tails(&self, wr0: usize, r0: usize, out: &mut [f32], s: &Scratch) {
        if !self.cols.is_multiple_of(LANES) {
            for (i, orow) in out.chunks_exact_mut(self.n).enumerate() {
                let sc = self.fp8_scales(&s.s256, r0, r0 + i);
                for (t, v) in orow.iter_mut().enumerate() {
                    *v = self.tail(wr0 + i, sc, t, *v);
                }
            }
        }
    }

    /// Panel GEMMs' epilogue for tokens [tb0, tb0 + nb): element (i, t) is the lane sum of
    /// `acc[(i * ne + t - tb0) * 8..]` ([rows, ne, 8]) plus its scalar tail.
    #[allow(clippy::too_many_arguments)]
    fn finish_block(
        &self,
        acc: &[f32],
        ne: usize,
        wr0: usize,
        r0: usize,
        tb0: usize,
        nb: usize,
        out: &mut [f32],
        s256: &[f32],
    ) {
        let has_tail = !self.cols.is_multiple_of(LANES);
        for (i, orow) in out.chunks_exact_mut(self.n).enumerate() {
            let sc = self.fp8_scales(s256, r0, r0 + i);
            let acc_i = &acc[i * ne * LANES..(i + 1) * ne * LANES]; // [ne, 8]
            for (a, (t, o)) in acc_i
                .chunks_exact(LANES)
                .zip(orow.iter_mut().enumerate().skip(tb0).take(nb))
            {
                let a: &[f32; LANES] = a.try_into().expect("8 lanes");
                let v = lanes::hsum8(a);
                *o = if has_tail {
                    self.tail(wr0 + i, sc, t, v)
                } else {
                    v
                };
            }
        }
    }
}

//! When to use the rayon pool. A rayon dispatch costs microseconds (waking workers, stealing);
//! small loops — a decode step of a small model, one row's embedding, one head's matmul — run
//! faster on the calling thread. Every parallel loop of the engine asks `worth_parallel` with an
//! estimate of its work, so small models and batch-1 decode do not wake the pool for nothing.
//! Per-thread scratch buffers that survive across calls go through `with_thread_scratch`.
//!
//! Guarantee: the choice only changes which thread computes an element, never the order of any
//! reduction inside it, so outputs are bitwise the same either way.

use rayon::prelude::*;

/// Below this much work (multiply-adds or element operations) a loop runs on the calling thread.
/// Measured on the bundled pair (2-core EPYC, `specmla bench --spec --batches 1,16`, 4-5 alternated
/// runs per setting): 2^15 gave batch-1 plain decode median ~2400 tok/s against ~1700 with 2^18
/// (the GEMM's old threshold) and ~2000 before this module; 2^13 was no better; batch 16 unchanged.
pub const PAR_MIN_WORK: usize = 1 << 15;

/// True when `work` is large enough to split and the current pool has more than one thread.
pub fn worth_parallel(work: usize) -> bool {
    work >= PAR_MIN_WORK && rayon::current_num_threads() > 1
}

/// `f(i, row)` for every `row_len`-long row of `out`, in parallel when `work` is worth it.
pub fn for_each_row<F>(out: &mut [f32], row_len: usize, work: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if worth_parallel(work) {
        out.par_chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    } else {
        out.chunks_mut(row_len)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// `[f(0), .., f(n - 1)]`, in parallel when `work` is worth it.
pub fn map_indices<T, F>(n: usize, work: usize, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(usize) -> T + Sync + Send,
{
    if worth_parallel(work) {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// Run `f` on this thread's buffer in `key`, kept for the thread's next call (large scratch
/// otherwise comes back from the OS as fresh zeroed pages every call). A call nested on the same
/// thread — a rayon task it runs while an outer call waits for its own tasks — finds the buffer
/// borrowed and gets a fresh `T::default()` of its own instead.
pub fn with_thread_scratch<T: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut t) => f(&mut t),
        Err(_) => f(&mut T::default()),
    })
}

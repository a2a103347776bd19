//! Opt-in wall time of every weight matmul by shape: `set_matmul_profiling(true)`, run, then
//! `matmul_profile()` (CLI `specmla generate --profile-matmuls`).
//!
//! Sits at the kernels' public entry points (`matmul`, `matmul_many`). Why it exists: on a host
//! whose speed swings by 10-30 % within minutes (docs/BENCHMARKS.md), whole-run timings cannot
//! resolve a kernel change worth a few percent of a step, while per-call sums over the same run
//! can (the 9-token verification's products were measured this way). Off by default: then the
//! cost is one relaxed atomic load per call.
//!
//! Guarantee: never changes a result; the counters are process-wide (every engine and thread
//! of the process adds to them), kept until `reset_matmul_profile`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
/// Per shape: calls, nanoseconds, weight bytes.
type Sums = HashMap<ShapeKey, (u64, u64, u64)>;
static STATS: Mutex<Option<Sums>> = Mutex::new(None);

/// One profiled shape: a matrix [rows, cols] times `tokens` tokens; `matmul_many` passes (one
/// token through several matrices in one parallel pass) count as one call with their rows
/// summed and `many` set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    pub rows: usize,
    pub cols: usize,
    pub tokens: usize,
    pub many: bool,
}

/// What the calls of one shape took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulStat {
    pub shape: ShapeKey,
    pub calls: u64,
    /// Summed wall time of the calls, seconds.
    pub seconds: f64,
    /// Summed weight bytes of the calls (each call reads its matrices once).
    pub weight_bytes: u64,
}

impl MatmulStat {
    /// Weight bytes per second over the calls (0 when no time was measured).
    pub fn weight_gb_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.weight_bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Turn the per-shape timing on or off (process-wide).
pub fn set_matmul_profiling(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Every shape timed since the last reset, the longest total first.
pub fn matmul_profile() -> Vec<MatmulStat> {
    let g = STATS.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<MatmulStat> = g
        .iter()
        .flatten()
        .map(|(&shape, &(calls, ns, bytes))| MatmulStat {
            shape,
            calls,
            seconds: ns as f64 * 1e-9,
            weight_bytes: bytes,
        })
        .collect();
    v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    v
}

/// Forget every counted call.
pub fn reset_matmul_profile() {
    *STATS.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Whether profiling is on (callers skip building a key otherwise).
#[inline]
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Run `f` (one matmul call of `key` over `bytes` of weights), timed when profiling is on.
#[inline]
pub(crate) fn timed<R>(key: ShapeKey, bytes: usize, f: impl FnOnce() -> R) -> R {
    if !on() {
        return f();
    }
    let t = Instant::now();
    let r = f();
    let ns = t.elapsed().as_nanos() as u64;
    let mut g = STATS.lock().unwrap_or_else(|e| e.into_inner());
    let e = g
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert((0, 0, 0));
    e.0 += 1;
    e.1 += ns;
    e.2 += bytes as u64;
    r
}

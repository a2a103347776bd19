//! Where the streaming kernels' software prefetches put the weight rows the next register tile
//! will read: the L1 (`_MM_HINT_T0`) or only the L2 (`_MM_HINT_T1`).
//!
//! Sits under the direct (few-token) GEMV / GEMM tiles of `simd.rs` and `simd512.rs`: each tile
//! reads the hint once ([`prefetch_to_l2`]) and issues its prefetches through [`prefetch_line`].
//! The right hint is a property of the core's memory pipeline, not of the ISA level, so it is
//! chosen once per process from the CPU vendor: AMD (Zen) prefetches into the L2, which measured
//! 1.3x the streaming rate of L1 prefetches there (docs/BENCHMARKS.md, "Weight prefetch hint");
//! everything else keeps the L1 hint that measured best on Intel Xeon. [`set_prefetch_hint`]
//! overrides it (benchmarks compare both in one process).
//!
//! The AVX512-BF16 tiles of several tokens (`gemm/bf16dot.rs`: prefill, batched decode,
//! verification) have a hint of their own ([`tile_prefetch_hint`]), because there the best level
//! differs between AMD generations: Zen 5 (family 0x1A) streamed 1-38 % more with L1
//! prefetches in 32 of 37 cache-flushed walks of the widened target's shapes; Zen 4 (family
//! 0x19, whose `vdpbf16ps` runs at half Zen 5's rate, so a 9-token tile spends twice as long on
//! each weight line) streamed its 7..9-token products 1.6-1.8x faster with L2 prefetches
//! (docs/BENCHMARKS.md "Zen 4: several-token tiles prefetch into the L2"). So: L2 on AMD
//! families up to 0x19, L1 on Zen 5 and on everything else; [`set_tile_prefetch_hint`]
//! overrides it.
//!
//! Guarantee: a prefetch never changes a result, only when bytes arrive; both hints give the same
//! bits on every ISA level.

use std::sync::atomic::{AtomicU8, Ordering};

/// The cache level a weight prefetch targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchHint {
    /// `prefetcht0`: into the L1 (and every level below).
    L1,
    /// `prefetcht1`: into the L2 only.
    L2,
}

impl PrefetchHint {
    pub fn name(self) -> &'static str {
        match self {
            PrefetchHint::L1 => "l1",
            PrefetchHint::L2 => "l2",
        }
    }

    /// `l1` / `l2` / `auto` (the vendor's default: `None`).
    pub fn parse(s: &str) -> Option<Option<PrefetchHint>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "l1" | "t0" => Some(Some(PrefetchHint::L1)),
            "l2" | "t1" => Some(Some(PrefetchHint::L2)),
            "auto" => Some(None),
            _ => None,
        }
    }

    /// The default for this CPU: L2 on AMD, L1 elsewhere.
    pub fn detect() -> PrefetchHint {
        if cpu_vendor_is_amd() {
            PrefetchHint::L2
        } else {
            PrefetchHint::L1
        }
    }

    /// The default of the several-token AVX512-BF16 tiles on this CPU: L2 on AMD up to family
    /// 0x19 (Zen 4: its half-rate `vdpbf16ps` keeps a tile on each line long enough that L1
    /// prefetches arrive too late), L1 on Zen 5 and elsewhere (module docs).
    pub fn detect_tiles() -> PrefetchHint {
        if cpu_vendor_is_amd() && cpu_family() <= 0x19 {
            PrefetchHint::L2
        } else {
            PrefetchHint::L1
        }
    }
}

/// A process-wide hint: 0 not chosen yet, 1 L1, 2 L2 (chosen by its `detect` on first use).
struct HintCell(AtomicU8);

impl HintCell {
    const fn new() -> Self {
        HintCell(AtomicU8::new(0))
    }

    fn get(&self, detect: fn() -> PrefetchHint) -> PrefetchHint {
        match self.0.load(Ordering::Relaxed) {
            1 => PrefetchHint::L1,
            2 => PrefetchHint::L2,
            _ => {
                let h = detect();
                self.set(h);
                h
            }
        }
    }

    fn set(&self, h: PrefetchHint) {
        let v = match h {
            PrefetchHint::L1 => 1,
            PrefetchHint::L2 => 2,
        };
        self.0.store(v, Ordering::Relaxed);
    }
}

/// The one-token kernels' hint.
static HINT: HintCell = HintCell::new();
/// The several-token AVX512-BF16 tiles' hint.
static TILE_HINT: HintCell = HintCell::new();

/// Held by a test while it sets the process-wide hints to reach a path (tests run on parallel
/// threads; a hint set by one test would otherwise change the path another one means to cover —
/// never a result).
#[cfg(test)]
pub(crate) static HINT_TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The hint in force (detected on first use unless [`set_prefetch_hint`] chose one).
pub fn prefetch_hint() -> PrefetchHint {
    HINT.get(PrefetchHint::detect)
}

/// Choose the hint for the whole process (`None`: back to the vendor default). Results are the
/// same either way; only speed changes.
pub fn set_prefetch_hint(h: Option<PrefetchHint>) {
    HINT.set(h.unwrap_or_else(PrefetchHint::detect));
}

/// True when the kernels prefetch into the L2 only (read once per tile call).
#[inline]
pub(crate) fn prefetch_to_l2() -> bool {
    prefetch_hint() == PrefetchHint::L2
}

/// The hint of the several-token AVX512-BF16 tiles in force (detected on first use unless
/// [`set_tile_prefetch_hint`] chose one).
pub fn tile_prefetch_hint() -> PrefetchHint {
    TILE_HINT.get(PrefetchHint::detect_tiles)
}

/// Choose the several-token tiles' hint for the whole process (`None`: back to this CPU's
/// default). Results are the same either way; only speed changes.
pub fn set_tile_prefetch_hint(h: Option<PrefetchHint>) {
    TILE_HINT.set(h.unwrap_or_else(PrefetchHint::detect_tiles));
}

/// True when the several-token tiles prefetch into the L2 only (read once per tile call).
#[inline]
pub(crate) fn tile_prefetch_to_l2() -> bool {
    tile_prefetch_hint() == PrefetchHint::L2
}

/// Prefetch the cache line at `p` with the hint chosen by `l2` (`p` need not be valid memory:
/// a prefetch never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_line(p: *const i8, l2: bool) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    if l2 {
        _mm_prefetch::<_MM_HINT_T1>(p);
    } else {
        _mm_prefetch::<_MM_HINT_T0>(p);
    }
}

/// The CPU's family (CPUID leaf 1: base family, plus the extended family where the base is
/// 0xF — AMD Zen 4 is 0x19, Zen 5 0x1A); 0 off x86_64.
fn cpu_family() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 1 exists on every x86_64 CPU.
        let a = std::arch::x86_64::__cpuid(1).eax;
        let base = (a >> 8) & 0xF;
        if base == 0xF {
            base + ((a >> 20) & 0xFF)
        } else {
            base
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

fn cpu_vendor_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0 (the vendor string) exists on every x86_64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"AuthenticAMD" || &v == b"HygonGenuine"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_parse_and_the_vendor_default_is_one_of_them() {
        assert_eq!(PrefetchHint::parse("l2"), Some(Some(PrefetchHint::L2)));
        assert_eq!(PrefetchHint::parse("T0"), Some(Some(PrefetchHint::L1)));
        assert_eq!(PrefetchHint::parse("auto"), Some(None));
        assert_eq!(PrefetchHint::parse("l3"), None);
        let d = PrefetchHint::detect();
        assert_eq!(d == PrefetchHint::L2, cpu_vendor_is_amd());
        let t = PrefetchHint::detect_tiles();
        assert_eq!(
            t == PrefetchHint::L2,
            cpu_vendor_is_amd() && cpu_family() <= 0x19
        );
        // the leaf-1 decoding: every x86_64 AMD CPU reports family 0xF (K8) or later, and
        // AMD's AVX-512 began with Zen 4 (0x19), so a dropped extended family (Zen 4 read as
        // 0xF) fails here on any AVX-512 AMD machine
        #[cfg(target_arch = "x86_64")]
        if cpu_vendor_is_amd() {
            let f = cpu_family();
            assert!(f >= 0xF, "family {f:#x}");
            if std::arch::is_x86_feature_detected!("avx512f") {
                assert!(f >= 0x19, "AVX-512 AMD CPU of family {f:#x}");
            }
        }
    }

    /// Both hints give bitwise the same matmul outputs on every ISA level, for every weight
    /// storage the streaming tiles read (GEMV n = 1, direct tiles n = 2..9).
    #[test]
    fn hints_never_change_results() {
        use crate::kernels::{matmul, pin_thread, Isa, Matrix};
        let (rows, cols) = (72, 520);
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let words: Vec<u16> = (0..rows * cols)
            .map(|_| (next() as u16 & 0x807f) | 0x3f00)
            .collect();
        let bytes: Vec<u8> = (0..rows * cols).map(|_| next() as u8 & 0xbf).collect();
        let mats = [
            Matrix::from_bf16(rows, cols, words.clone()),
            Matrix::from_f16(
                rows,
                cols,
                words
                    .iter()
                    .map(|w| half::f16::from_f32(f32::from_bits((*w as u32) << 16)))
                    .collect::<Vec<_>>(),
            ),
            Matrix::from_fp8(rows, cols, bytes, vec![0.01; 5], 128, 128),
        ];
        let _hints = HINT_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (before, before_tiles) = (prefetch_hint(), tile_prefetch_hint());
        for isa in Isa::available() {
            pin_thread(Some(isa));
            for w in &mats {
                for n in [1, 2, 3, 9] {
                    let x: Vec<f32> = (0..n * cols)
                        .map(|_| (next() >> 40) as f32 / 1e7 - 0.8)
                        .collect();
                    // (one-token hint, tiles' hint): every pair
                    let pairs = [
                        (PrefetchHint::L1, PrefetchHint::L1),
                        (PrefetchHint::L2, PrefetchHint::L1),
                        (PrefetchHint::L1, PrefetchHint::L2),
                        (PrefetchHint::L2, PrefetchHint::L2),
                    ];
                    let mut out = vec![vec![0.0f32; n * rows]; pairs.len()];
                    for ((h, t), o) in pairs.iter().zip(&mut out) {
                        set_prefetch_hint(Some(*h));
                        set_tile_prefetch_hint(Some(*t));
                        matmul(w, &x, n, o);
                    }
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for (p, o) in pairs.iter().zip(&out).skip(1) {
                        assert_eq!(
                            bits(&out[0]),
                            bits(o),
                            "{isa} {} n={n} hints {p:?}",
                            w.dtype_name()
                        );
                    }
                }
            }
        }
        pin_thread(None);
        set_prefetch_hint(Some(before));
        set_tile_prefetch_hint(Some(before_tiles));
    }
}

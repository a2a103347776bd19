//! AMX-BF16 tile primitives: the permission the Linux kernel must grant before a process may
//! use the tile registers, the tile configuration, and the few tile instructions the bf16 GEMM
//! (`gemm/amx.rs`) issues. Sits between `isa.rs` (which asks [`os_grants_tiles`] once) and the
//! GEMM; nothing else touches tiles.
//!
//! Stable Rust has no AMX intrinsics, so the instructions are inline `asm!`. The compiler never
//! allocates the tile registers `tmm0`-`tmm7` itself, so their contents survive between the
//! asm blocks of one kernel call on one thread; every kernel call loads its own configuration
//! ([`TileCfg::load`]) and ends with [`release`], so no tile state outlives a call (and the OS
//! need not save 8 KiB of tile data when it switches a worker thread out between calls).
//!
//! All functions except [`os_grants_tiles`] are `unsafe` and must only run after
//! `IsaLevel::Amx.supported()`.

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::sync::OnceLock;

/// Whether this process may use the AMX tile registers: the CPU reports AMX-TILE and
/// AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and the Linux kernel granted the XTILEDATA state
/// component (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once per process).
pub(crate) fn os_grants_tiles() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(request_tiles)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tiles() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 is read only where leaf 0 reports it exists.
    let max_leaf = __cpuid_count(0, 0).eax;
    let edx7 = if max_leaf >= 7 {
        __cpuid_count(7, 0).edx
    } else {
        0
    };
    let amx_tile = edx7 & (1 << 24) != 0;
    let amx_bf16 = edx7 & (1 << 22) != 0;
    if max_leaf < 7 || !amx_tile || !amx_bf16 {
        return false;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    const XFEATURE_XTILEDATA: u64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM) only changes which extended state components
    // this process may use; it reads no memory. The syscall clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tiles() -> bool {
    false
}

/// A tile configuration (palette 1): per tile register its rows and bytes per row.
#[repr(C, align(64))]
pub(crate) struct TileCfg {
    bytes: [u8; 64],
}

impl TileCfg {
    /// Every tile unused.
    pub(crate) fn new() -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1: 8 tiles of up to 16 rows x 64 bytes
        TileCfg { bytes }
    }
    /// Tile `t` (0..8) holds `rows` (1..=16) rows of `colsb` (4..=64, a multiple of 4) bytes.
    pub(crate) fn set(&mut self, t: usize, rows: usize, colsb: usize) {
        assert!(
            t < 8
                && (1..=16).contains(&rows)
                && colsb <= 64
                && colsb.is_multiple_of(4)
                && colsb > 0
        );
        let c = (colsb as u16).to_le_bytes();
        self.bytes[16 + 2 * t] = c[0];
        self.bytes[16 + 2 * t + 1] = c[1];
        self.bytes[48 + t] = rows as u8;
    }
    /// Make this the calling thread's tile configuration (zeroes every tile).
    ///
    /// # Safety
    /// Only after `IsaLevel::Amx.supported()`.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self.bytes.as_ptr(), options(nostack, readonly));
    }
}

/// Return the tiles to their initial state (the configuration is dropped).
///
/// # Safety
/// Only after `IsaLevel::Amx.supported()`.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// `tmm{T} = 0`.
///
/// # Safety
/// Tile T configured on this thread.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn zero<const T: u8>() {
    match T {
        5 => asm!("tilezero tmm5", options(nostack, nomem)),
        6 => asm!("tilezero tmm6", options(nostack, nomem)),
        _ => unreachable!("accumulator tiles are tmm5 and tmm6"),
    }
}

/// Load tile T's configured rows from `p`, `p + stride`, … (bytes).
///
/// # Safety
/// Tile T configured on this thread; every row `[p + r * stride, + colsb)` readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    macro_rules! ld {
        ($t:literal) => {
            asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly))
        };
    }
    match T {
        0 => ld!("0"),
        1 => ld!("1"),
        2 => ld!("2"),
        3 => ld!("3"),
        4 => ld!("4"),
        _ => unreachable!("operand tiles are tmm0-tmm4"),
    }
}

/// Store accumulator tile T's configured rows to `p`, `p + stride`, … (bytes).
///
/// # Safety
/// Tile T configured on this thread; every row `[p + r * stride, + colsb)` writable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
    match T {
        5 => asm!("tilestored [{p} + {s}*1], tmm5", p = in(reg) p, s = in(reg) stride,
            options(nostack)),
        6 => asm!("tilestored [{p} + {s}*1], tmm6", p = in(reg) p, s = in(reg) stride,
            options(nostack)),
        _ => unreachable!("accumulator tiles are tmm5 and tmm6"),
    }
}

/// `tmm{C} += tmm{A} · tmm{B}` in bf16 pairs (`tdpbf16ps`): for each row m of A and column n of
/// C, over the K pairs of the A row: `c[m][n] += a[m][2k] * b[k][2n] + a[m][2k+1] * b[k][2n+1]`
/// in f32 (bf16 products are exact in f32).
///
/// # Safety
/// Tiles A (rows M, 4K bytes), B (rows K, 4N bytes) and C (rows M, 4N bytes) configured.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn dp<const C: u8, const A: u8, const B: u8>() {
    macro_rules! dp {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem)
            )
        };
    }
    match (C, A, B) {
        (5, 0, 2) => dp!("5", "0", "2"),
        (5, 0, 3) => dp!("5", "0", "3"),
        (5, 0, 4) => dp!("5", "0", "4"),
        (6, 1, 2) => dp!("6", "1", "2"),
        (6, 1, 3) => dp!("6", "1", "3"),
        (6, 1, 4) => dp!("6", "1", "4"),
        _ => unreachable!("tile product {C} += {A} . {B}"),
    }
}

//! Which instruction set the kernels run on, chosen once per thread.
//!
//! Sits under every kernel entry point (`matmul`, `dot`, `dot_rows`, the probes): each asks
//! [`Isa::current`]. The engine picks the ISA when it builds its worker pool (its
//! `EngineConfig::isa`, CLI `--isa`) and pins it on every worker thread with [`pin_thread`];
//! threads that never pinned one use the best the CPU has ([`Isa::detect`]).
//!
//! Guarantee: every ISA computes each output element with one fixed sequence of operations,
//! whatever the batch, so each level is batch-invariant on its own. `portable`, `avx2` and
//! `avx512` share the sequence defined in `lanes.rs` (the AVX-512 kernels pack two 8-lane
//! accumulators into one 512-bit register; they never change an element's order), so their
//! results are bitwise equal. `amx` runs bf16-weight matmuls on the AMX tile unit
//! (`gemm/amx.rs`: exact products, a different f32 accumulation order), so its bf16 matmuls
//! differ from the other levels by f32 rounding (within the tolerance the kernel tests state);
//! everything else on `amx` is the `avx512` code. `avx512bf16` runs bf16 matmuls (and fp8
//! ones with 64-column blocks where the CPU has AVX512-VBMI: e4m3 is exact in bf16) on
//! `vdpbf16ps` with the activations rounded to bf16 (`gemm/bf16dot.rs`: llama.cpp's contract,
//! an error up to 2^-9 of sum |w x| per output, also stated by the tests), and f16 matmuls with
//! 64-column multiples in a 64-lane f32 order (`gemm/f16x64.rs`: exact products, one weight
//! stream per thread in decode; within the AMX path's 1e-6 bound of the exact levels); everything
//! else on it is the `avx512` code.
//!
//! `auto` picks the fastest level the CPU has, `avx512bf16` included: bf16 weights times
//! bf16-rounded activations is the contract of a bf16 checkpoint everywhere else (transformers in
//! bf16, llama.cpp, oneDNN), and it doubles the multiply-adds per instruction of every
//! compute-bound product. `exact` picks the best level that keeps the f32 order shared with
//! `portable` (for results that must match an f32 reference to rounding). `amx` stays opt-in
//! (`IsaLevel::opt_in`): measured slower than `avx512` in the engine's one-token decode.

use std::cell::Cell;
use std::fmt;

/// An instruction-set level of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaLevel {
    /// Plain Rust (`lanes.rs`): any CPU.
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/DQ/BW/VL on top of AVX2 + FMA + F16C (512-bit tiles for multi-token matmuls).
    Avx512,
    /// AVX-512 plus AVX512-BF16: bf16 matmuls by `vdpbf16ps` with the activations rounded to
    /// bf16 (opt-in: a looser accuracy contract, see `gemm/bf16dot.rs`).
    Avx512Bf16,
    /// AVX-512 plus AMX-TILE/AMX-BF16 (granted by the OS): bf16 matmuls on the tile unit.
    Amx,
}

/// The kernels' instruction set (a checked [`IsaLevel`]: only levels the CPU has can be built).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    level: IsaLevel,
}

thread_local! {
    static PINNED: Cell<Option<Isa>> = const { Cell::new(None) };
}

impl IsaLevel {
    pub const ALL: [IsaLevel; 5] = [
        IsaLevel::Portable,
        IsaLevel::Avx2,
        IsaLevel::Avx512,
        IsaLevel::Avx512Bf16,
        IsaLevel::Amx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Portable => "portable",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512 => "avx512",
            IsaLevel::Avx512Bf16 => "avx512bf16",
            IsaLevel::Amx => "amx",
        }
    }

    /// Parse `portable` / `avx2` / `avx512` / `avx512bf16` / `amx` (also `native`/`auto`: the
    /// best available, None; `exact`: the best exact level of this CPU).
    pub fn parse(s: &str) -> Option<Option<IsaLevel>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" => Some(Some(IsaLevel::Portable)),
            "avx2" => Some(Some(IsaLevel::Avx2)),
            "avx512" | "avx-512" => Some(Some(IsaLevel::Avx512)),
            "avx512bf16" | "avx512-bf16" | "bf16" => Some(Some(IsaLevel::Avx512Bf16)),
            "amx" | "amx-bf16" => Some(Some(IsaLevel::Amx)),
            "auto" | "native" | "best" => Some(None),
            "exact" => Some(Some(IsaLevel::best_exact())),
            _ => None,
        }
    }

    /// Levels `auto` never picks: `amx` (measured slower than `avx512` in one-token decode,
    /// docs/BENCHMARKS.md "AMX-BF16 tiles").
    pub fn opt_in(self) -> bool {
        matches!(self, IsaLevel::Amx)
    }

    /// Levels whose every product keeps the exact-f32 reduction order of `portable` (bitwise
    /// equal to it); `avx512bf16` (bf16-rounded activations) and `amx` (another f32 order) do not.
    pub fn exact(self) -> bool {
        !matches!(self, IsaLevel::Avx512Bf16 | IsaLevel::Amx)
    }

    /// The best exact level this CPU has (what `exact` / `SPECMLA_ISA_EXACT` select).
    pub fn best_exact() -> IsaLevel {
        IsaLevel::ALL
            .into_iter()
            .rev()
            .filter(|l| l.exact())
            .find(|l| l.supported())
            .unwrap_or(IsaLevel::Portable)
    }

    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            IsaLevel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512 => {
                IsaLevel::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Avx512Bf16 => {
                IsaLevel::Avx512.supported() && is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(target_arch = "x86_64")]
            IsaLevel::Amx => IsaLevel::Avx512.supported() && super::amx::os_grants_tiles(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

impl Isa {
    /// The best level this CPU has that is picked by default (cheap: the standard library
    /// caches CPUID): `avx512bf16` where the CPU has AVX512-BF16. `amx` is opt-in (`--isa amx`):
    /// measured on an AMX Xeon it speeds up prefill but slows the engine's one-token decode
    /// (docs/BENCHMARKS.md, "AMX-BF16 tiles").
    pub fn detect() -> Self {
        let level = IsaLevel::ALL
            .into_iter()
            .rev()
            .filter(|l| !l.opt_in())
            .find(|l| l.supported())
            .unwrap_or(IsaLevel::Portable);
        Isa { level }
    }
    /// The portable path (same results, slower).
    pub fn portable() -> Self {
        Isa {
            level: IsaLevel::Portable,
        }
    }
    /// `level` if this CPU has it.
    pub fn new(level: IsaLevel) -> Option<Self> {
        level.supported().then_some(Isa { level })
    }
    /// Every level this CPU can run, lowest first (tests run each).
    pub fn available() -> Vec<Isa> {
        IsaLevel::ALL.into_iter().filter_map(Isa::new).collect()
    }
    /// The ISA pinned on this thread, else [`Isa::detect`].
    pub fn current() -> Self {
        PINNED.with(|p| p.get()).unwrap_or_else(Isa::detect)
    }
    pub fn level(&self) -> IsaLevel {
        self.level
    }
    /// True when the AVX2 (or wider) kernels are in use.
    pub fn simd(&self) -> bool {
        self.level >= IsaLevel::Avx2
    }
    /// True when the AVX-512 kernels are in use.
    pub fn avx512(&self) -> bool {
        self.level >= IsaLevel::Avx512
    }
    /// This ISA with the AMX tile and bf16-dot paths off (`amx` and `avx512bf16` become
    /// `avx512`): for products whose bf16 operands must give the bits of their f32 copies (KV
    /// spans read in place).
    pub fn without_tiles(self) -> Self {
        Isa {
            level: self.level.min(IsaLevel::Avx512),
        }
    }
    /// True when bf16 matmuls run on the AMX tile unit.
    pub fn amx(&self) -> bool {
        self.level >= IsaLevel::Amx
    }
    /// True when bf16 matmuls run on `vdpbf16ps` with bf16-rounded activations (and f16 ones
    /// in the 64-lane order of `gemm/f16x64.rs`).
    pub fn bf16_dot(&self) -> bool {
        self.level == IsaLevel::Avx512Bf16
    }
    /// AVX-512 level on a CPU that also has AVX512-VBMI (byte permutes): the fp8 GEMV decodes
    /// two rows per register with one `vpermb` (same bits as without).
    pub fn vbmi(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.avx512() && is_x86_feature_detected!("avx512vbmi")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
    /// What `specmla info` prints: the level and the kernels it selects.
    pub fn describe(&self) -> String {
        match self.level {
            IsaLevel::Portable => "portable (scalar lanes.rs kernels)".into(),
            IsaLevel::Avx2 if super::strips_by_default() => "avx2 (AVX2+FMA+F16C: bf16 weights in strips of 16 rows, 16-row x 1-6-token outer-product tiles, one sequential chain per element; other weights 8-lane GEMV/GEMM register tiles)".into(),
            IsaLevel::Avx2 => "avx2 (AVX2+FMA+F16C: 8-lane GEMV/GEMM register tiles)".into(),
            IsaLevel::Avx512Bf16 => format!(
                "avx512bf16 (AVX512-BF16 vdpbf16ps for bf16 matmuls at every token count, activations rounded to bf16, 1 row x 1 token (fp8: 8 rows), 1 row x 2-6 tokens where their activations fit L1, 3 rows x 7 or 2 rows x 8-9 tokens (rows of 1024 columns or more; past 27 KB of activations span by span with the L1 tile prefetch hint, else 4 x 6 + 4 x 3) or 4 rows x 6 tokens per register tile{}; f16 matmuls in a 64-lane f32 order, 1 row x 1-6 tokens or 4 rows x 6 tokens in quarter passes; everything else as {})",
                if self.vbmi() { "; fp8 e4m3 with 64-column blocks too, decoded to bf16 by VBMI byte lookups" } else { "" },
                Isa { level: IsaLevel::Avx512 }.describe()
            ),
            IsaLevel::Amx => format!(
                "amx (AMX-BF16 tiles for bf16 matmuls at every token count, 16 rows x 16 tokens per tile, activations split exactly into three bf16 parts; everything else as {})",
                Isa { level: IsaLevel::Avx512 }.describe()
            ),
            IsaLevel::Avx512 => {
                if self.vbmi() {
                    "avx512 (AVX-512F/DQ/BW/VL: 16-lane two-token GEMM and small-batch tiles; AVX2 GEMV for one token, fp8 GEMV two rows per register with AVX512-VBMI)".into()
                } else {
                    "avx512 (AVX-512F/DQ/BW/VL: 16-lane two-token GEMM and small-batch tiles; AVX2 GEMV for one token)".into()
                }
            }
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.level.name())
    }
}

/// Pin `isa` for kernels called on the current thread (None: back to [`Isa::detect`]). The
/// engine calls this on each worker of its pool (rayon `start_handler`).
pub fn pin_thread(isa: Option<Isa>) {
    PINNED.with(|p| p.set(isa));
}

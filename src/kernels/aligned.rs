//! A growable f32 buffer whose start is 64-byte aligned: the kernels' packed activations,
//! decoded weight panels and accumulator scratch live in these, so their 256- and 512-bit loads
//! and stores never split a cache line. Alignment changes no value.

/// One cache line of f32s (the unit of [`AlignedBuf`]).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// See the module doc.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    lines: Vec<Line>,
}

impl AlignedBuf {
    /// The first `len` floats, zeroed.
    pub(crate) fn zeroed(&mut self, len: usize) -> &mut [f32] {
        self.lines.clear();
        self.lines.resize(len.div_ceil(16), Line([0.0; 16]));
        self.as_mut(len)
    }
    /// The first `len` floats, contents unspecified (grown with zeros when needed).
    pub(crate) fn reuse(&mut self, len: usize) -> &mut [f32] {
        if self.lines.len() < len.div_ceil(16) {
            self.lines.resize(len.div_ceil(16), Line([0.0; 16]));
        }
        self.as_mut(len)
    }
    fn as_mut(&mut self, len: usize) -> &mut [f32] {
        // SAFETY: `Line` is 16 f32s with no padding (size 64 = 16 * 4), so the lines are a
        // contiguous run of at least `len` initialised f32s.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, len) }
    }
    /// The first `len` 16-bit words, contents unspecified (the AMX GEMM's bf16 operands).
    pub(crate) fn reuse_u16(&mut self, len: usize) -> &mut [u16] {
        let lines = len.div_ceil(32);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([0.0; 16]));
        }
        // SAFETY: a `Line` is 64 initialised bytes with no padding, so the lines are a
        // contiguous run of at least `len` initialised u16s (any bit pattern is a valid u16).
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u16, len) }
    }
    /// Every 16-bit word the buffer holds (empty when it was never grown).
    pub(crate) fn as_u16(&self) -> &[u16] {
        // SAFETY: as in `reuse_u16`.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const u16, self.lines.len() * 32)
        }
    }
    /// Every float the buffer holds (a whole number of lines).
    pub(crate) fn as_slice(&self) -> &[f32] {
        // SAFETY: as in `as_mut`.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.lines.len() * 16)
        }
    }
}

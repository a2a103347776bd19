//! Weight matrices as the kernels see them: row-major [rows = out_features, cols = in_features],
//! stored in the checkpoint's precision (f32, bf16, f16, or fp8 e4m3 with 2-D block scales).
//! Model structs hold these; `kernels::matmul` reads them.
//!
//! Storage is a [`WeightBuf`]: a read-only slice that either borrows from a memory-mapped
//! checkpoint (zero-copy; the mapping is kept alive by a shared owner handle) or owns a `Vec`
//! (weights derived at load, tests, random models). Both look like `&[T]` to the kernels.

use std::any::Any;

use super::gemm::STRIP;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A read-only slice of weights with a shared owner: an mmapped checkpoint, or an owned `Vec`.
/// Cloning is cheap (the owner is reference-counted); sub-views share the owner.
pub struct WeightBuf<T: Copy + 'static> {
    /// Keeps the memory behind `ptr` alive (an `Arc<Vec<T>>`, or the checkpoint's mapping).
    _owner: Arc<dyn Any + Send + Sync>,
    ptr: *const T,
    len: usize,
}

// SAFETY: the buffer is immutable for its whole life and its owner is Send + Sync; `T` is a
// plain Copy number type.
unsafe impl<T: Copy + Send + Sync + 'static> Send for WeightBuf<T> {}
unsafe impl<T: Copy + Send + Sync + 'static> Sync for WeightBuf<T> {}

impl<T: Copy + Send + Sync + 'static> WeightBuf<T> {
    /// Own `v`.
    pub fn owned(v: Vec<T>) -> Self {
        let owner = Arc::new(v);
        let (ptr, len) = (owner.as_ptr(), owner.len());
        WeightBuf {
            _owner: owner,
            ptr,
            len,
        }
    }

    /// Borrow `len` elements at `ptr`, kept alive by `owner`.
    ///
    /// # Safety
    /// `ptr` must be aligned for `T` and point to `len` initialised elements inside memory that
    /// `owner` keeps alive and that nothing mutates while any clone of the buffer exists.
    pub unsafe fn borrowed(owner: Arc<dyn Any + Send + Sync>, ptr: *const T, len: usize) -> Self {
        debug_assert!(
            (ptr as usize).is_multiple_of(std::mem::align_of::<T>()),
            "WeightBuf: misaligned"
        );
        WeightBuf {
            _owner: owner,
            ptr,
            len,
        }
    }

    /// Elements [start, start + len) as a buffer sharing this one's owner.
    pub fn slice(&self, start: usize, len: usize) -> Self {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "WeightBuf::slice out of range"
        );
        // SAFETY: in range of a live, immutable buffer (checked above).
        WeightBuf {
            _owner: Arc::clone(&self._owner),
            ptr: unsafe { self.ptr.add(start) },
            len,
        }
    }
}

impl<T: Copy + 'static> Deref for WeightBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is initialised, aligned and kept alive by `_owner` (constructors).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Copy + 'static> Clone for WeightBuf<T> {
    fn clone(&self) -> Self {
        WeightBuf {
            _owner: Arc::clone(&self._owner),
            ptr: self.ptr,
            len: self.len,
        }
    }
}

impl<T: Copy + 'static> fmt::Debug for WeightBuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WeightBuf<{}>[{}]", std::any::type_name::<T>(), self.len)
    }
}

impl<T: Copy + Send + Sync + 'static> From<Vec<T>> for WeightBuf<T> {
    fn from(v: Vec<T>) -> Self {
        WeightBuf::owned(v)
    }
}

/// Storage of a weight matrix. All variants but `Bf16Strips` are row-major [rows, cols].
#[derive(Clone, Debug)]
pub enum MatrixData {
    /// f32 weights.
    F32(WeightBuf<f32>),
    /// bf16 weights as raw bit patterns.
    Bf16(WeightBuf<u16>),
    /// bf16 weights in strips of 16 rows interleaved by column, [rows / 16, cols, 16] (see
    /// `gemm/strips.rs`): the `avx2` level's layout ([`Matrix::into_strips`]). Its matmuls sum
    /// each element in one sequential chain over the columns, not in the 8 lanes of the
    /// row-major variants: the layout fixes the order, on every level.
    Bf16Strips(WeightBuf<u16>),
    /// f16 weights (kept as f16; widened in the kernels, exactly).
    F16(WeightBuf<half::f16>),
    /// fp8 e4m3fn bytes with block scales: W[i, j] = fp8[i, j] * scale_inv[i / block_rows, j / block_cols];
    /// scale_inv is row-major [ceil(rows / block_rows), ceil(cols / block_cols)].
    Fp8 {
        data: WeightBuf<u8>,
        scale_inv: WeightBuf<f32>,
        block_rows: usize,
        block_cols: usize,
    },
}

/// A weight matrix [rows, cols] (out_features x in_features, as in `nn.Linear.weight`).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: MatrixData,
    /// The weights are expected to stay in the CPU caches between uses (a model far smaller
    /// than the last-level cache, such as a draft model): the one-token bf16 kernel then takes
    /// several rows per register tile, hiding each row's dot-chain latency, instead of the one
    /// sequential stream per thread that suits weights read from DRAM. Never changes a result.
    resident: bool,
}

impl Matrix {
    pub fn from_f32(rows: usize, cols: usize, data: impl Into<WeightBuf<f32>>) -> Self {
        let data = data.into();
        assert_eq!(data.len(), rows * cols, "Matrix::from_f32 size");
        Matrix {
            rows,
            cols,
            data: MatrixData::F32(data),
            resident: false,
        }
    }
    pub fn from_bf16(rows: usize, cols: usize, data: impl Into<WeightBuf<u16>>) -> Self {
        let data = data.into();
        assert_eq!(data.len(), rows * cols, "Matrix::from_bf16 size");
        Matrix {
            rows,
            cols,
            data: MatrixData::Bf16(data),
            resident: false,
        }
    }
    pub fn from_f16(rows: usize, cols: usize, data: impl Into<WeightBuf<half::f16>>) -> Self {
        let data = data.into();
        assert_eq!(data.len(), rows * cols, "Matrix::from_f16 size");
        Matrix {
            rows,
            cols,
            data: MatrixData::F16(data),
            resident: false,
        }
    }
    pub fn from_fp8(
        rows: usize,
        cols: usize,
        data: impl Into<WeightBuf<u8>>,
        scale_inv: impl Into<WeightBuf<f32>>,
        block_rows: usize,
        block_cols: usize,
    ) -> Self {
        let (data, scale_inv) = (data.into(), scale_inv.into());
        assert_eq!(data.len(), rows * cols, "Matrix::from_fp8 size");
        assert_eq!(
            scale_inv.len(),
            rows.div_ceil(block_rows) * cols.div_ceil(block_cols),
            "Matrix::from_fp8 scale size"
        );
        Matrix {
            rows,
            cols,
            data: MatrixData::Fp8 {
                data,
                scale_inv,
                block_rows,
                block_cols,
            },
            resident: false,
        }
    }

    /// This bf16 matrix in strips of 16 rows ([`MatrixData::Bf16Strips`], a packed copy) when
    /// its rows are a multiple of 16; any other matrix unchanged. Changes the matmuls' summation
    /// order (see the variant), so a model converts all its matrices or none, before first use.
    pub fn into_strips(self) -> Matrix {
        match &self.data {
            MatrixData::Bf16(v) if self.rows.is_multiple_of(STRIP) && self.rows > 0 => {
                let packed = super::packed_pages::packed_u16(v.len(), |out| {
                    super::gemm::pack_strips(v, self.rows, self.cols, out)
                });
                Matrix {
                    data: MatrixData::Bf16Strips(packed),
                    ..self
                }
            }
            _ => self,
        }
    }

    /// The bf16 weights row-major [rows, cols] (a copy for strips; `None` for other dtypes):
    /// for readers that need rows (weight absorption, device uploads).
    pub fn bf16_row_major(&self) -> Option<std::borrow::Cow<'_, [u16]>> {
        match &self.data {
            MatrixData::Bf16(v) => Some(std::borrow::Cow::Borrowed(&v[..])),
            MatrixData::Bf16Strips(v) => {
                let (rows, cols) = (self.rows, self.cols);
                let mut out = vec![0u16; rows * cols]; // [rows, cols]
                super::gemm::unpack_strips(v, rows, cols, &mut out);
                Some(std::borrow::Cow::Owned(out))
            }
            _ => None,
        }
    }

    /// This matrix row-major: bf16 strips unpacked into a copy, any other storage shared.
    pub fn row_major(&self) -> Matrix {
        match &self.data {
            MatrixData::Bf16Strips(_) => {
                let v = self.bf16_row_major().expect("bf16").into_owned(); // [rows, cols]
                Matrix {
                    data: MatrixData::Bf16(v.into()),
                    ..self.clone()
                }
            }
            _ => self.clone(),
        }
    }

    /// Rows [r0, r0 + n) as a matrix sharing this one's storage (no copy). fp8 views must start
    /// on a scale-block boundary; a bf16 strips view off a strip boundary is a row-major copy.
    pub fn rows_view(&self, r0: usize, n: usize) -> Matrix {
        assert!(r0 + n <= self.rows, "Matrix::rows_view out of range");
        let c = self.cols;
        let data = match &self.data {
            MatrixData::F32(v) => MatrixData::F32(v.slice(r0 * c, n * c)),
            MatrixData::Bf16(v) => MatrixData::Bf16(v.slice(r0 * c, n * c)),
            MatrixData::Bf16Strips(v) if r0.is_multiple_of(STRIP) && n.is_multiple_of(STRIP) => {
                MatrixData::Bf16Strips(v.slice(r0 * c, n * c))
            }
            // off a strip boundary: a row-major copy of the rows (their own, lanes.rs order),
            // unpacked from the strips that hold them only (V4 takes a matrix's row groups one
            // view each)
            MatrixData::Bf16Strips(v) => {
                let (s0, s1) = (r0 / STRIP, (r0 + n).div_ceil(STRIP));
                let held = (s1 - s0) * STRIP; // rows of those strips
                let mut out = vec![0u16; held * c]; // [held, cols]
                super::gemm::unpack_strips(&v[s0 * STRIP * c..s1 * STRIP * c], held, c, &mut out);
                let skip = r0 - s0 * STRIP;
                MatrixData::Bf16(out[skip * c..(skip + n) * c].to_vec().into())
            }
            MatrixData::F16(v) => MatrixData::F16(v.slice(r0 * c, n * c)),
            MatrixData::Fp8 {
                data,
                scale_inv,
                block_rows,
                block_cols,
            } => {
                assert!(
                    r0.is_multiple_of(*block_rows),
                    "Matrix::rows_view: fp8 view off a block boundary"
                );
                let ncb = c.div_ceil(*block_cols);
                let b0 = r0 / block_rows;
                let nb = (r0 + n).div_ceil(*block_rows) - b0;
                MatrixData::Fp8 {
                    data: data.slice(r0 * c, n * c),
                    scale_inv: scale_inv.slice(b0 * ncb, nb * ncb),
                    block_rows: *block_rows,
                    block_cols: *block_cols,
                }
            }
        };
        Matrix {
            rows: n,
            cols: c,
            data,
            resident: self.resident,
        }
    }

    /// Whether the weights are expected to stay cached between uses (see the field).
    pub fn cache_resident(&self) -> bool {
        self.resident
    }

    /// This matrix with the cache-residency hint set to `on` (kernel choice only: same bits).
    pub fn with_cache_resident(mut self, on: bool) -> Self {
        self.resident = on;
        self
    }

    /// Bytes the weights occupy in memory (what one full pass over the matrix reads).
    pub fn nbytes(&self) -> usize {
        match &self.data {
            MatrixData::F32(v) => v.len() * 4,
            MatrixData::Bf16(v) | MatrixData::Bf16Strips(v) => v.len() * 2,
            MatrixData::F16(v) => v.len() * 2,
            MatrixData::Fp8 {
                data, scale_inv, ..
            } => data.len() + scale_inv.len() * 4,
        }
    }
    /// Bytes per stored weight (4, 2 or 1).
    pub fn bytes_per_weight(&self) -> usize {
        match &self.data {
            MatrixData::F32(_) => 4,
            MatrixData::Bf16(_) | MatrixData::Bf16Strips(_) | MatrixData::F16(_) => 2,
            MatrixData::Fp8 { .. } => 1,
        }
    }
    /// The storage precision's name.
    pub fn dtype_name(&self) -> &'static str {
        match &self.data {
            MatrixData::F32(_) => "f32",
            MatrixData::Bf16(_) | MatrixData::Bf16Strips(_) => "bf16",
            MatrixData::F16(_) => "f16",
            MatrixData::Fp8 { .. } => "fp8_e4m3",
        }
    }
    /// Number of weights.
    pub fn numel(&self) -> usize {
        self.rows * self.cols
    }
}

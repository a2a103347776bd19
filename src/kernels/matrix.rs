//! Weight matrices as the kernels see them: row-major [rows = out_features, cols = in_features],
//! stored in the checkpoint's precision (f32, bf16, or fp8 e4m3 with 2-D block scales).
//! Model structs hold these; `kernels::matmul` reads them.

/// Storage of a weight matrix. All variants are row-major [rows, cols].
#[derive(Clone, Debug)]
pub enum MatrixData {
    /// f32 weights (also used for f16 checkpoints, converted at load).
    F32(Vec<f32>),
    /// bf16 weights as raw bit patterns.
    Bf16(Vec<u16>),
    /// fp8 e4m3fn bytes with block scales: W[i, j] = fp8[i, j] * scale_inv[i / block_rows, j / block_cols];
    /// scale_inv is row-major [ceil(rows / block_rows), ceil(cols / block_cols)].
    Fp8 { data: Vec<u8>, scale_inv: Vec<f32>, block_rows: usize, block_cols: usize },
}

/// A weight matrix [rows, cols] (out_features x in_features, as in `nn.Linear.weight`).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: MatrixData,
}

impl Matrix {
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "Matrix::from_f32 size");
        Matrix { rows, cols, data: MatrixData::F32(data) }
    }
    pub fn from_bf16(rows: usize, cols: usize, data: Vec<u16>) -> Self {
        assert_eq!(data.len(), rows * cols, "Matrix::from_bf16 size");
        Matrix { rows, cols, data: MatrixData::Bf16(data) }
    }
    pub fn from_fp8(
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        scale_inv: Vec<f32>,
        block_rows: usize,
        block_cols: usize,
    ) -> Self {
        assert_eq!(data.len(), rows * cols, "Matrix::from_fp8 size");
        assert_eq!(
            scale_inv.len(),
            rows.div_ceil(block_rows) * cols.div_ceil(block_cols),
            "Matrix::from_fp8 scale size"
        );
        Matrix { rows, cols, data: MatrixData::Fp8 { data, scale_inv, block_rows, block_cols } }
    }
    /// Bytes the weights occupy in memory (what one full pass over the matrix reads).
    pub fn nbytes(&self) -> usize {
        match &self.data {
            MatrixData::F32(v) => v.len() * 4,
            MatrixData::Bf16(v) => v.len() * 2,
            MatrixData::Fp8 { data, scale_inv, .. } => data.len() + scale_inv.len() * 4,
        }
    }
    /// Number of weights.
    pub fn numel(&self) -> usize {
        self.rows * self.cols
    }
}

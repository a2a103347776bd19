//! Checked, typed access to the tensors a model expects.
//!
//! Data flow: `WeightStore` (raw mapped bytes) -> [`Loader`] -> `kernels::Matrix` / `Vec<f32>` held
//! by the `model` structs. Guarantees: every tensor handed out exists, has exactly the shape the
//! caller asked for and a supported float dtype; fp8 weights come with a correctly shaped f32
//! block-scale sibling. Otherwise `Error::Tensor { name, msg }` with a message such as `missing`,
//! `expected shape [64, 128], found [64, 127]` or `expected dtype one of f32/bf16/f16/f8_e4m3,
//! found i64`. Precision: f32 and bf16 are kept as stored, f16 is widened to f32 (exact), fp8 is
//! kept as bytes + scales.

use super::dtype::{copy_u16, decode_to_f32, DType};
use super::safetensors_store::{TensorView, WeightStore};
use crate::config::Fp8Quant;
use crate::error::{Error, Result};
use crate::kernels::Matrix;

/// Loads tensors from a store, checking them against the shapes the model expects.
#[derive(Clone, Copy, Debug)]
pub struct Loader<'a> {
    pub store: &'a WeightStore,
    /// Set when the checkpoint is block-fp8 quantised (`ModelConfig::quantization`).
    pub quant: Option<Fp8Quant>,
}

/// Name of the block-scale sibling of an fp8 weight: `x.weight` -> `x.weight_scale_inv`.
pub fn scale_inv_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

const FLOAT_DTYPES: &str = "f32/bf16/f16/f8_e4m3";

impl<'a> Loader<'a> {
    pub fn new(store: &'a WeightStore, quant: Option<Fp8Quant>) -> Self {
        Loader { store, quant }
    }

    pub fn has(&self, name: &str) -> bool {
        self.store.get(name).is_some()
    }

    fn view(&self, name: &str, shape: &[usize]) -> Result<TensorView<'a>> {
        let v = self.store.get(name).ok_or_else(|| Error::tensor(name, "missing"))?;
        if v.shape != shape {
            return Err(Error::tensor(name, format!("expected shape {shape:?}, found {:?}", v.shape)));
        }
        if let DType::Other(d) = &v.dtype {
            return Err(Error::tensor(name, format!("expected dtype one of {FLOAT_DTYPES}, found {d}")));
        }
        Ok(v)
    }

    /// The f32 block scales of fp8 weight `name` ([rows, cols]): row-major
    /// [ceil(rows / block_rows), ceil(cols / block_cols)].
    fn scales(&self, name: &str, rows: usize, cols: usize) -> Result<(Vec<f32>, Fp8Quant)> {
        let q = self.quant.ok_or_else(|| {
            Error::tensor(name, "stored as f8_e4m3 but config.json has no fp8 quantization_config")
        })?;
        let sname = scale_inv_name(name);
        let shape = [rows.div_ceil(q.block_rows), cols.div_ceil(q.block_cols)];
        let s = self.view(&sname, &shape)?;
        if s.dtype != DType::F32 {
            return Err(Error::tensor(sname, format!("expected dtype f32, found {}", s.dtype)));
        }
        let v = decode_to_f32(&s.dtype, s.data).expect("f32 decodes"); // [ceil(rows/br), ceil(cols/bc)]
        Ok((v, q))
    }

    /// Weight matrix `name` of shape [rows, cols] (out_features x in_features).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let v = self.view(name, &[rows, cols])?;
        Ok(match v.dtype {
            DType::F32 | DType::F16 => {
                Matrix::from_f32(rows, cols, decode_to_f32(&v.dtype, v.data).expect("float")) // [rows, cols]
            }
            DType::BF16 => Matrix::from_bf16(rows, cols, copy_u16(v.data)), // [rows, cols]
            DType::F8E4M3 => {
                let (scale_inv, q) = self.scales(name, rows, cols)?;
                Matrix::from_fp8(rows, cols, v.data.to_vec(), scale_inv, q.block_rows, q.block_cols)
            }
            DType::Other(_) => unreachable!("view() refuses Other"),
        })
    }

    /// 1-D tensor of length `len` as f32 (norm weights, router bias). fp8 is refused: vectors
    /// are never block-quantised.
    pub fn vector_f32(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.view(name, &[len])?;
        if v.dtype == DType::F8E4M3 {
            return Err(Error::tensor(name, "expected dtype one of f32/bf16/f16, found f8_e4m3"));
        }
        Ok(decode_to_f32(&v.dtype, v.data).expect("float")) // [len]
    }

    /// Whole 2-D tensor converted to f32, row-major [rows, cols] (fp8 is dequantised with its
    /// block scales).
    pub fn matrix_f32(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
        let v = self.view(name, &[rows, cols])?;
        let mut out = decode_to_f32(&v.dtype, v.data).expect("float"); // [rows, cols]
        if v.dtype == DType::F8E4M3 {
            let (scale_inv, q) = self.scales(name, rows, cols)?;
            let sc = cols.div_ceil(q.block_cols);
            for (i, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
                for (j, x) in row.iter_mut().enumerate() {
                    *x *= scale_inv[(i / q.block_rows) * sc + j / q.block_cols];
                }
            }
        }
        Ok(out)
    }
}

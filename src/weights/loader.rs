//! Checked, typed access to the tensors a model expects.
//!
//! Data flow: `WeightStore` (raw mapped bytes) -> [`Loader`] -> `kernels::Matrix` / `Vec<f32>` held
//! by the `model` structs. Guarantees: every tensor handed out exists, has exactly the shape the
//! caller asked for and a supported float dtype; fp8 weights come with a correctly shaped f32
//! block-scale sibling. Otherwise `Error::Tensor { name, msg }` with a message such as `missing`,
//! `expected shape [64, 128], found [64, 127]` or `expected dtype one of f32/bf16/f16/f8_e4m3,
//! found i64`. Precision: every matrix is kept as stored (f32, bf16, f16, fp8 bytes + f32 scales).
//! Zero-copy: a matrix whose bytes are aligned for its element type borrows them from the mapped
//! checkpoint (the mapping stays alive while any matrix uses it); only a misaligned tensor (or a
//! big-endian host) is copied.

use super::dtype::{copy_u16, decode_to_f32, DType};
use super::safetensors_store::{TensorView, WeightStore};
use crate::config::Fp8Quant;
use crate::error::{Error, Result};
use crate::kernels::{Matrix, WeightBuf};

/// The tensor's bytes as a buffer of `T` borrowed from the mapping when aligned (little-endian
/// hosts), else `None` (the caller copies).
fn borrow_as<T: Copy + Send + Sync + 'static>(v: &TensorView<'_>) -> Option<WeightBuf<T>> {
    let size = std::mem::size_of::<T>();
    let p = v.data.as_ptr();
    if cfg!(target_endian = "little")
        && (p as usize).is_multiple_of(std::mem::align_of::<T>())
        && v.data.len().is_multiple_of(size)
    {
        // SAFETY: aligned, in bounds of the shard (validated at open), immutable, and kept alive
        // by `owner`; T is a plain number type for which every bit pattern is valid.
        Some(unsafe { WeightBuf::borrowed(v.owner.clone(), p as *const T, v.data.len() / size) })
    } else {
        None
    }
}

/// Loads tensors from a store, checking them against the shapes the model expects.
#[derive(Clone, Copy, Debug)]
pub struct Loader<'a> {
    pub store: &'a WeightStore,
    /// Set when the checkpoint is block-fp8 quantised (`ModelConfig::quantization`).
    pub quant: Option<Fp8Quant>,
    /// Marks every matrix it loads as cache-resident (`Matrix::cache_resident`): set for a
    /// model small enough to stay in the last-level cache between forwards.
    pub resident: bool,
}

/// Name of the block-scale sibling of an fp8 weight: `x.weight` -> `x.weight_scale_inv`.
pub fn scale_inv_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

const FLOAT_DTYPES: &str = "f32/bf16/f16/f8_e4m3";

impl<'a> Loader<'a> {
    pub fn new(store: &'a WeightStore, quant: Option<Fp8Quant>) -> Self {
        Loader {
            store,
            quant,
            resident: false,
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.store.get(name).is_some()
    }

    fn view(&self, name: &str, shape: &[usize]) -> Result<TensorView<'a>> {
        let v = self
            .store
            .get(name)
            .ok_or_else(|| Error::tensor(name, "missing"))?;
        if v.shape != shape {
            return Err(Error::tensor(
                name,
                format!("expected shape {shape:?}, found {:?}", v.shape),
            ));
        }
        if let DType::Other(d) = &v.dtype {
            return Err(Error::tensor(
                name,
                format!("expected dtype one of {FLOAT_DTYPES}, found {d}"),
            ));
        }
        Ok(v)
    }

    /// The f32 block scales of fp8 weight `name` ([rows, cols]): row-major
    /// [ceil(rows / block_rows), ceil(cols / block_cols)].
    fn scales(&self, name: &str, rows: usize, cols: usize) -> Result<(WeightBuf<f32>, Fp8Quant)> {
        let q = self.quant.ok_or_else(|| {
            Error::tensor(
                name,
                "stored as f8_e4m3 but config.json has no fp8 quantization_config",
            )
        })?;
        let sname = scale_inv_name(name);
        let shape = [rows.div_ceil(q.block_rows), cols.div_ceil(q.block_cols)];
        let s = self.view(&sname, &shape)?;
        if s.dtype != DType::F32 {
            return Err(Error::tensor(
                sname,
                format!("expected dtype f32, found {}", s.dtype),
            ));
        }
        // [ceil(rows/br), ceil(cols/bc)]
        let v = borrow_as::<f32>(&s)
            .unwrap_or_else(|| decode_to_f32(&s.dtype, s.data).expect("f32 decodes").into());
        Ok((v, q))
    }

    /// Weight matrix `name` of shape [rows, cols] (out_features x in_features), in the layout the
    /// matmuls of this process take: bf16 in strips of 16 rows where
    /// [`crate::kernels::strips_by_default`] (the `avx2` level), the mapped bytes released.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let v = self.view(name, &[rows, cols])?;
        let m = self.matrix_of(&v, rows, cols)?;
        if !crate::kernels::strips_by_default() {
            return Ok(m);
        }
        let m = m.into_strips();
        if matches!(m.data, crate::kernels::MatrixData::Bf16Strips(_)) {
            // the packed copy replaces the mapped bytes
            WeightStore::release_pages(&v);
        }
        Ok(m)
    }

    /// Matrix `name` of shape [rows, cols] row-major in its stored precision, borrowed from the
    /// mapping when aligned: tables read by rows (the embedding), and what [`Self::matrix`]
    /// starts from.
    pub fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_of(&self.view(name, &[rows, cols])?, rows, cols)
    }

    /// The row-major matrix of the checked view `v` ([rows, cols]).
    fn matrix_of(&self, v: &TensorView<'_>, rows: usize, cols: usize) -> Result<Matrix> {
        let name = v.name;
        // Every arm: [rows, cols], borrowed from the mapping when aligned.
        let m = match v.dtype {
            DType::F32 => Matrix::from_f32(
                rows,
                cols,
                borrow_as::<f32>(v)
                    .unwrap_or_else(|| decode_to_f32(&v.dtype, v.data).expect("float").into()),
            ),
            DType::F16 => Matrix::from_f16(
                rows,
                cols,
                borrow_as::<half::f16>(v).unwrap_or_else(|| {
                    copy_u16(v.data)
                        .into_iter()
                        .map(half::f16::from_bits)
                        .collect::<Vec<_>>()
                        .into()
                }),
            ),
            DType::BF16 => Matrix::from_bf16(
                rows,
                cols,
                borrow_as::<u16>(v).unwrap_or_else(|| copy_u16(v.data).into()),
            ),
            DType::F8E4M3 => {
                let (scale_inv, q) = self.scales(name, rows, cols)?;
                let data = borrow_as::<u8>(v).expect("bytes are always aligned");
                Matrix::from_fp8(rows, cols, data, scale_inv, q.block_rows, q.block_cols)
            }
            DType::Other(_) => unreachable!("view() refuses Other"),
        }
        .with_cache_resident(self.resident);
        Ok(m)
    }

    /// 1-D tensor of length `len` as f32 (norm weights, router bias). fp8 is refused: vectors
    /// are never block-quantised.
    pub fn vector_f32(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.view(name, &[len])?;
        if v.dtype == DType::F8E4M3 {
            return Err(Error::tensor(
                name,
                "expected dtype one of f32/bf16/f16, found f8_e4m3",
            ));
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
            let scale_inv = &*scale_inv;
            for (i, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
                for (j, x) in row.iter_mut().enumerate() {
                    *x *= scale_inv[(i / q.block_rows) * sc + j / q.block_cols];
                }
            }
        }
        Ok(out)
    }
}

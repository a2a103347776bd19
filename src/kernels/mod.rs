//! Batch-invariant CPU kernels. (placeholder; filled in by its owner)
pub mod matrix;
pub use matrix::{Matrix, MatrixData};

//! Checkpoint weights: safetensors files -> validated, typed tensors for the model.
//!
//! Second half of the first step of the data flow (`config` + `weights` -> `model`):
//! `safetensors_store` maps the files and validates their headers, `dtype` decodes element types,
//! `loader` hands out shape- and dtype-checked `kernels::Matrix` / f32 vectors, `expected`
//! checks a whole checkpoint against what its `config.json` implies, `pages` reports how the
//! mapped weights sit in memory (2 MB pages or not), `quantize` writes an fp8 block-scaled copy
//! of a checkpoint and `widen` a function-preserving wider copy (the memory-bound benchmark
//! target). Nothing here panics on a bad
//! file; every failure is `Error::Safetensors`, `Error::Tensor` or `Error::Io`.

mod dtype;
mod expected;
mod files;
mod loader;
mod pages;
mod quantize;
mod safetensors_store;
mod widen;

pub use dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, fp8_e4m3_to_f32, DType};
pub use expected::{check_tensor_set, expected_tensor_names, expected_tensor_shapes};
pub use loader::{scale_inv_name, Loader};
pub use pages::{drop_from_page_cache, mapped_pages_under, MappedPages};
pub use quantize::{is_quantizable, quantize_blocks, quantize_dir, QuantizeReport};
pub use safetensors_store::{
    huge_page_weights, set_huge_page_weights, TensorView, WeightSource, WeightStore,
};
pub use widen::{widen_dir, WidenFactors, WidenReport};

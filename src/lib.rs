//! specmla — an embeddable inference engine for DeepSeek-family models with multi-head latent
//! attention (MLA), a latent paged KV cache, and a lossless speculative-decoding scheduler with a
//! reasoning (thinking) budget.
//!
//! Data flow (each step is a folder):
//! `config` + `weights` -> `model` (weights only) ; `tokenizer` ;
//! request -> `engine` (scheduler, continuous batching) -> `spec` (propose -> verify -> budget)
//! -> `model::forward` over a flattened ragged batch, reading and writing the `kv` latent cache
//! -> `sampling` -> events. The forward's operators go through `backend` (the seam): `kernels`
//! holds the batch-invariant CPU math; `cuda` the GPU backend, its kernels (`kernels/*.cu`) and
//! their NVRTC compile check; `ffi` is the C ABI.
//! See docs/ARCHITECTURE.md.

pub mod backend;
pub mod config;
pub mod cuda;
pub mod engine;
pub mod error;
pub mod ffi;
#[doc(hidden)]
pub mod fuzzing;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod sampling;
pub mod spec;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};

//! Model configuration: `config.json` of a DeepSeek-V2 / V3 / V3.2 checkpoint -> [`ModelConfig`].
//!
//! First step of the data flow (`config` + `weights` -> `model`). Everything downstream reads the
//! resolved struct, never the JSON. Guarantees: both spellings of RoPE parameters are accepted,
//! defaults follow transformers' config classes, and anything unsupported is refused with an error
//! naming the JSON field (see `model_config.rs`).

mod indexer;
mod json;
mod model_config;
mod moe;
mod rope_scaling;
mod v4;

pub use indexer::IndexerConfig;
pub use model_config::{Fp8Quant, ModelConfig, ModelType};
pub use moe::{MoeConfig, ScoringFunc, TopkMethod};
pub use rope_scaling::{yarn_get_mscale, YarnScaling};
pub use v4::{V4Attn, V4Config, V4Scoring};

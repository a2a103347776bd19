//! The model: DeepSeek V2/V3 decoder weights (`Model`, weights only — no sequence state) and the
//! forward pass over a flattened ragged batch that reads and writes the latent KV cache.
//!
//! Flow inside one forward: embed -> per layer [RMSNorm -> MLA attention (q/kv projections, RoPE,
//! cache write, then decompressed-MHA or absorbed attention per token) -> o_proj -> residual ->
//! RMSNorm -> dense MLP or MoE -> residual] -> final norm -> lm_head for the rows that want logits.
//!
//! Guarantee (batch invariance): a token's logits are bitwise identical whatever else shares the
//! call, however the sequence was chunked, and whatever the thread count. Every kernel has a fixed
//! per-element reduction order, and the attention path of a token depends only on its own sequence
//! (`SeqChunk::mha_until`), never on the batch.

mod absorbed_by_head;
pub(crate) mod attention;
pub mod batch;
pub(crate) mod forward;
mod indexer;
mod load;
pub(crate) mod moe;
mod mtp;
pub mod rope;
mod v4;
mod weights;

pub use batch::{LogitsMode, SeqChunk};
pub use forward::ForwardOut;
pub use v4::{v4_tensor_shapes, V4Model};
pub use weights::{Attention, DecoderLayer, Expert, Ffn, Model, Moe, MtpLayer, TokenWork, Work};

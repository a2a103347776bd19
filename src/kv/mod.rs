//! The paged KV cache: KV cache groups (the MLA latent `[c_kv | k_pe]` per token per layer,
//! nothing decompressed; V3.2's index keys), one block pool and block table per sequence for all
//! of them, with block-level prefix caching.
//!
//! Where it sits: request -> scheduler (`plan_grow` / `commit_grow` per sequence) ->
//! `model::forward` (`write_slot` for new tokens, `read_range` for attention) -> spec-decode
//! verification (`set_len` for accepted tokens, `truncate` for rejected drafts) -> finish (`free`;
//! prompt blocks published with `register_prefix` stay reusable by `match_prefix` until evicted).
//!
//! Files: `spec` (groups and their byte accounting; the V4 design), `dtype` (element types,
//! quantisation), `pool` (per-group, per-layer storage), `block_allocator`
//! (refcounts, free list, LRU of evictable cached blocks), `prefix_cache` (verified chained-hash
//! index), `seq` (block table + plan), `cache` (the `KvCache` API tying them together), `tier/`
//! (the second tier: evicted prefix blocks in host memory and a file, restored on a hit).
//! Each cache is a value: a target and a draft model each own one, with their own dtype.

mod block_allocator;
mod cache;
pub mod dtype;
mod pool;
mod prefix_cache;
mod seq;
mod spec;
#[cfg(test)]
mod tests;
pub mod tier;
mod window;

pub use cache::{KvCache, KvGroupStats, KvStats};
pub use dtype::KvDtype;
pub use seq::{KvPlan, SeqKv};
pub use spec::{KvConfig, KvGroupSpec, KvKind};
pub use tier::{TierConfig, TierStats};

//! Per-sequence KV state (a block table and the committed length) and the grow plan.
//!
//! Where it sits: request state owns a `SeqKv` per model (target, draft); `KvCache` mutates it via
//! plan-then-commit (`plan_grow` / `commit_grow`), `set_len` after the forward wrote the slots, and
//! `truncate` to roll back rejected drafts.
//!
//! Guarantees: `SeqKv` is not `Clone` (a copy would hold block references the cache does not
//! count). Positions `[0, len)` are committed; `[len, blocks.len() * block_size)` is reserved
//! capacity the forward may write. Blocks at index >= `len / block_size` are private to the
//! sequence (never shared, never prefix-cached), so writes there can never affect another sequence.

/// A sequence's latent KV: its block table and committed length.
#[derive(Debug, Default)]
pub struct SeqKv {
    /// Physical block ids, in position order: position p lives in `blocks[p / block_size]`.
    pub(crate) blocks: Vec<u32>,
    /// Committed tokens.
    pub(crate) len: usize,
    /// Window-class block table (caches with `KvConfig::window`): block index `i >=
    /// win_first` is `win[i - win_first]`; the indices below were released (see `kv::window`).
    pub(crate) win: Vec<u32>,
    /// First window block index still held.
    pub(crate) win_first: usize,
}

impl SeqKv {
    /// An empty sequence (no blocks).
    pub fn new() -> Self {
        SeqKv::default()
    }
    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no token is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The block table (physical block ids in position order).
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }
    /// The window-class table: (first block index still held, the held blocks).
    pub fn window_table(&self) -> (usize, &[u32]) {
        (self.win_first, &self.win)
    }
}

/// What `KvCache::commit_grow` will do: plain data computed by `KvCache::plan_grow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPlan {
    /// Blocks the sequence held when planned (the plan is only valid for that table size).
    pub(crate) base_blocks: usize,
    /// Blocks to allocate.
    pub(crate) new_blocks: usize,
    /// Token capacity requested.
    pub(crate) target_len: usize,
    /// Window class: end of the window table when planned, blocks the commit drops from its
    /// front, blocks it appends.
    pub(crate) win_base: usize,
    pub(crate) win_drop: usize,
    pub(crate) win_new: usize,
}

impl KvPlan {
    /// Blocks the commit will allocate (0 when the reserved capacity already suffices).
    pub fn new_blocks(&self) -> usize {
        self.new_blocks
    }
    /// Token count the sequence will be able to hold after the commit.
    pub fn target_len(&self) -> usize {
        self.target_len
    }
}

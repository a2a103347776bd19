//! `KvCache`: the paged KV cache of one model (target or draft), with prefix caching.
//!
//! Where it sits: the scheduler plans and commits block growth per sequence (plan-then-commit),
//! `model::forward` writes one entry per new token per layer in every group (the MLA latent
//! `[c_kv | k_pe]`; V3.2's index key) and reads runs of entries for attention and the indexer, the spec-decode driver truncates rejected drafts, and finished
//! sequences are freed (their registered prompt blocks stay cached, evictable in LRU order).
//!
//! Guarantees:
//! - `plan_grow` is pure; `commit_grow` of a plan made against the current state cannot fail.
//! - Every block is exactly one of free / in use (refcount = number of block tables holding it) /
//!   evictable (refcount 0, still in the prefix cache). Nothing leaks: after every sequence is
//!   freed, free + evictable = num_blocks.
//! - A sequence's blocks at index >= `len / block_size` are private (refcount 1, not cached);
//!   shared blocks are full and below every sharer's `len`, so no API user can write them
//!   (`write_slot` asserts it). Truncating into a shared block copies it first (copy-on-write).
//! - Several caches can coexist (no globals); each group of each cache has its own dtype.
//! - Groups share blocks: position p of a sequence lives in block `blocks[p / block_size]` in
//!   every group, so growth, truncation (with copy-on-write), prefix hits and freeing move all
//!   groups together, and a prefix hit restores every group's entries.
//! - Deterministic: the same operations produce the same block ids and stored bytes.

use super::block_allocator::BlockAllocator;
use super::dtype::KvDtype;
use super::pool::KvPool;
use super::prefix_cache::{Parent, PrefixCache};
use super::seq::{KvPlan, SeqKv};
use super::spec::{KvConfig, KvGroupSpec, KvKind};
use super::tier::{KvTier, TierConfig, TierKey, TierStats};
use super::window::WinClass;
use crate::error::{Error, Result};
use crate::kernels::Rows;

mod prefix;
mod read;

/// Occupancy and prefix-cache counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStats {
    pub num_blocks: usize,
    pub free_blocks: usize,
    /// Evictable prefix-cached blocks (refcount 0).
    pub cached_blocks: usize,
    /// Blocks held by at least one sequence.
    pub used_blocks: usize,
    /// Tokens served from the prefix cache by `match_prefix`.
    pub prefix_hit_tokens: u64,
    /// Tokens offered to `match_prefix` (the full `tokens` slices).
    pub prefix_query_tokens: u64,
    /// Cached blocks evicted to satisfy allocations.
    pub evictions: u64,
    /// The MLA latent's bytes per token per layer.
    pub bytes_per_token_per_layer: usize,
    /// Bytes per token over every group and layer.
    pub bytes_per_token: usize,
    /// Storage of the whole pool: bytes_per_token * num_blocks * block_size.
    pub total_bytes: usize,
    /// Byte accounting per group, in group order.
    pub groups: Vec<KvGroupStats>,
    /// Window class (V4): its pool's blocks, free blocks and evictable (cached) blocks; all 0
    /// without one.
    pub window_blocks: usize,
    pub window_free_blocks: usize,
    pub window_cached_blocks: usize,
    /// The second KV tier's counters (None without one).
    pub tier: Option<TierStats>,
}

/// One group's share of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroupStats {
    /// `mla_latent`, `index_key`.
    pub kind: &'static str,
    pub dtype: KvDtype,
    pub num_layers: usize,
    /// Values per entry (one token, one layer).
    pub width: usize,
    /// Stored bytes per entry (scales included).
    pub bytes_per_token_per_layer: usize,
    /// bytes_per_token_per_layer * num_layers.
    pub bytes_per_token: usize,
    /// This group's storage in the pool: bytes_per_token * num_blocks * block_size.
    pub total_bytes: usize,
}

/// The paged KV cache: one storage pool per group, one block allocator and prefix cache.
#[derive(Debug)]
pub struct KvCache {
    cfg: KvConfig,
    /// One pool per group (`cfg.groups` order).
    pools: Vec<KvPool>,
    alloc: BlockAllocator,
    pub(super) prefix: PrefixCache,
    /// The sliding-window table class (`KvConfig::window`).
    win: Option<WinClass>,
    total_bytes: usize,
    prefix_hit_tokens: u64,
    prefix_query_tokens: u64,
    /// The second tier (`attach_tier`).
    tier: Option<KvTier>,
    /// `[num_blocks]` second chain hash of each prefix-registered block (the tier's key half).
    key2: Vec<u64>,
    /// Process-unique id of this cache (a device backend keys its copy of the storage by it).
    uid: u64,
}

static NEXT_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn nonzero(field: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::config(field, "must be > 0"));
    }
    Ok(())
}

fn check_group(i: usize, g: &KvGroupSpec) -> Result<()> {
    nonzero("num_layers", g.num_layers)?;
    match (i, g.kind) {
        (0, KvKind::MlaLatent { kv_lora_rank, .. }) => nonzero("kv_lora_rank", kv_lora_rank),
        (0, KvKind::SwaKv { head_dim }) => nonzero("head_dim", head_dim),
        (0, _) => Err(Error::config(
            "groups",
            "group 0 must be the MLA latent (or V4's K=V row)",
        )),
        (_, KvKind::SwaKv { .. }) => Err(Error::config("groups", "only group 0 is a K=V row")),
        (_, KvKind::CsaInput { head_dim, .. } | KvKind::HcaInput { head_dim }) => {
            nonzero("head_dim", head_dim)
        }
        (_, KvKind::CsaEntry { head_dim, .. } | KvKind::HcaEntry { head_dim, .. }) => {
            nonzero("head_dim", head_dim)
        }
        (_, KvKind::MlaLatent { .. }) => Err(Error::config(
            "groups",
            "only one MLA latent group per cache",
        )),
        (_, KvKind::IndexKey { head_dim }) => nonzero("index_head_dim", head_dim),
    }
}

impl KvCache {
    /// The MLA latent group (always group 0).
    pub const LATENT: usize = 0;

    /// Allocate the pools (zero-filled, committed lazily by the OS). Errors on zero sizes, a
    /// group list that does not start with the MLA latent, more than u32::MAX blocks, or a pool
    /// whose byte size overflows.
    pub fn new(cfg: KvConfig) -> Result<Self> {
        if cfg.groups.is_empty() {
            return Err(Error::config(
                "groups",
                "a cache needs the MLA latent group",
            ));
        }
        for (i, g) in cfg.groups.iter().enumerate() {
            check_group(i, g)?;
        }
        nonzero("block_size", cfg.block_size)?;
        nonzero("num_blocks", cfg.num_blocks)?;
        if cfg.num_blocks > u32::MAX as usize {
            return Err(Error::config(
                "num_blocks",
                format!("{} exceeds {}", cfg.num_blocks, u32::MAX),
            ));
        }
        for g in &cfg.groups {
            let r = g.kind.rate();
            if r == 0 || (!cfg.block_size.is_multiple_of(r) && r % cfg.block_size != 0) {
                return Err(Error::config(
                    "block_size",
                    format!(
                        "{} (rate {r}) needs a block size that divides the rate or is a multiple \
                         of it, found {}",
                        g.kind.name(),
                        cfg.block_size
                    ),
                ));
            }
        }
        if cfg.window.is_some() {
            nonzero("window_blocks", cfg.window_blocks)?;
            if cfg.window_blocks > u32::MAX as usize {
                return Err(Error::config("window_blocks", "exceeds u32::MAX"));
            }
        }
        let windowed = |g: &KvGroupSpec| cfg.window.is_some() && g.kind.is_windowed();
        let total = cfg.groups.iter().try_fold(0usize, |acc, g| {
            let blocks = if windowed(g) {
                cfg.window_blocks
            } else {
                cfg.num_blocks
            };
            g.entry_bytes()
                .checked_mul(g.num_layers)
                .and_then(|b| b.checked_mul(g.kind.slots_per_block(cfg.block_size)))
                .and_then(|b| b.checked_mul(blocks))
                .and_then(|b| acc.checked_add(b))
        });
        let total = total.filter(|&n| n <= isize::MAX as usize).ok_or_else(|| {
            Error::config(
                "num_blocks",
                format!(
                    "KV pool of {} blocks x {} tokens is too large",
                    cfg.num_blocks, cfg.block_size
                ),
            )
        })?;
        // Bookkeeping per block (allocator, prefix cache) is allocated eagerly, the slots lazily;
        // a pool the machine cannot hold is refused here instead of aborting on allocation.
        let bookkeeping = cfg.num_blocks.saturating_mul(64);
        if let Some(mem) = physical_memory() {
            if total.saturating_add(bookkeeping) as u64 > mem {
                return Err(Error::config(
                    "num_blocks",
                    format!(
                        "KV pool of {} blocks x {} tokens needs {:.1} GiB, more than this machine's \
                         {:.1} GiB of memory",
                        cfg.num_blocks,
                        cfg.block_size,
                        total as f64 / (1u64 << 30) as f64,
                        mem as f64 / (1u64 << 30) as f64
                    ),
                ));
            }
        }
        Ok(KvCache {
            pools: cfg
                .groups
                .iter()
                .map(|g| {
                    let blocks = if windowed(g) {
                        cfg.window_blocks
                    } else {
                        cfg.num_blocks
                    };
                    KvPool::new(g, blocks * g.kind.slots_per_block(cfg.block_size))
                })
                .collect(),
            win: cfg
                .window
                .map(|r0| WinClass::new(r0, cfg.window_blocks, cfg.block_size)),
            alloc: BlockAllocator::new(cfg.num_blocks),
            prefix: PrefixCache::new(cfg.num_blocks, cfg.block_size),
            total_bytes: total,
            prefix_hit_tokens: 0,
            prefix_query_tokens: 0,
            tier: None,
            key2: vec![0; cfg.num_blocks],
            uid: NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cfg,
        })
    }

    /// Process-unique id of this cache (never reused while the process runs).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    /// The latent's `(kv_lora_rank + rope_dim) * dtype bytes`, plus for fp8 one f32 scale per
    /// group of up to 128 values, c_kv and k_pe grouped separately (DeepSeek-V3: 512 + 64 + 4 * 5
    /// = 596).
    pub fn bytes_per_token_per_layer(&self) -> usize {
        self.cfg.latent().entry_bytes()
    }

    /// Bytes one token occupies over every group and layer (V3.2: latent + index keys).
    pub fn bytes_per_token(&self) -> usize {
        self.cfg.bytes_per_token()
    }

    /// The group holding `kind` (`"mla_latent"`, `"index_key"`), if this cache has one.
    pub fn group_of(&self, kind: &str) -> Option<usize> {
        self.cfg.group_of(kind)
    }

    /// Blocks a sequence of `tokens` tokens needs.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.block_size)
    }

    /// Whether a sequence of `tokens` tokens can ever fit (the whole pool to itself).
    pub fn can_ever_fit(&self, tokens: usize) -> bool {
        self.blocks_for(tokens) <= self.cfg.num_blocks
    }

    /// Reserved token capacity of `seq` (blocks held x block_size).
    pub fn capacity(&self, seq: &SeqKv) -> usize {
        seq.blocks.len() * self.cfg.block_size
    }

    /// Plan growing `seq` to hold `new_len` tokens. Pure. `Err(KvExhausted)` if the sequence can
    /// never fit, or if free + evictable blocks cannot provide the missing blocks now.
    pub fn plan_grow(&self, seq: &SeqKv, new_len: usize) -> Result<KvPlan> {
        let total = self.blocks_for(new_len);
        if total > self.cfg.num_blocks {
            return Err(Error::KvExhausted(format!(
                "{new_len} tokens need {total} blocks of {}; the pool has {}",
                self.cfg.block_size, self.cfg.num_blocks
            )));
        }
        let need = total.saturating_sub(seq.blocks.len());
        let avail = self.alloc.available();
        if need > avail {
            return Err(Error::KvExhausted(format!(
                "growing to {new_len} tokens needs {need} more blocks; {avail} free or evictable"
            )));
        }
        let (mut win_base, mut win_drop, mut win_new) = (0, 0, 0);
        if let Some(w) = &self.win {
            let bs = self.cfg.block_size;
            let (drop, freed) = w.droppable(seq, bs);
            win_base = seq.win_first + seq.win.len();
            win_drop = drop;
            win_new = total.saturating_sub(win_base);
            let avail = w.alloc.available() + freed;
            if win_new > avail {
                return Err(Error::KvExhausted(format!(
                    "growing to {new_len} tokens needs {win_new} more sliding-window blocks; \
                     {avail} free or evictable"
                )));
            }
        }
        Ok(KvPlan {
            base_blocks: seq.blocks.len(),
            new_blocks: need,
            target_len: new_len,
            win_base,
            win_drop,
            win_new,
        })
    }

    /// Apply a plan made against the current state: allocates its blocks (free first, then
    /// evicting LRU cached prefix blocks). Panics if the plan is for a different table size or the
    /// pool changed so that the blocks are no longer available (a scheduler bug).
    pub fn commit_grow(&mut self, seq: &mut SeqKv, plan: KvPlan) {
        assert_eq!(
            seq.blocks.len(),
            plan.base_blocks,
            "kv: commit_grow with a plan for another block table"
        );
        assert!(
            plan.new_blocks <= self.alloc.available(),
            "kv: commit_grow with a stale plan"
        );
        for _ in 0..plan.new_blocks {
            let b = self.take_block().expect("checked above");
            seq.blocks.push(b);
        }
        if let Some(w) = &mut self.win {
            assert_eq!(
                seq.win_first + seq.win.len(),
                plan.win_base,
                "kv: commit_grow with a plan for another window table"
            );
            w.drop_front(seq, plan.win_drop);
            for _ in 0..plan.win_new {
                let b = w.take().expect("kv: commit_grow with a stale window plan");
                seq.win.push(b);
            }
        }
    }

    /// Set the committed length after the forward wrote the slots. `len` <= reserved capacity.
    /// A smaller `len` than the current one is a `truncate`.
    pub fn set_len(&mut self, seq: &mut SeqKv, len: usize) {
        assert!(
            len <= self.capacity(seq),
            "kv: set_len {len} beyond capacity {}",
            self.capacity(seq)
        );
        if len < seq.len {
            self.truncate(seq, len);
        } else {
            seq.len = len;
        }
    }

    /// Roll back to `new_len` tokens: len = min(len, new_len); releases the blocks past
    /// ceil(new_len / block_size) (a shared block only loses this sequence's reference). If the
    /// new last block is partially kept and shared / prefix-cached, it is made private first
    /// (copy-on-write, or un-registering when only this sequence holds it); if no block is
    /// available for the copy, the partial block is dropped too and len rounds down to the block
    /// boundary (check `seq.len()`).
    pub fn truncate(&mut self, seq: &mut SeqKv, new_len: usize) {
        let bs = self.cfg.block_size;
        if let Some(w) = &self.win {
            assert!(
                new_len >= seq.len || seq.win.is_empty() || seq.win_first <= w.floor(new_len, bs),
                "kv: truncate to {new_len} below the sliding window (blocks below {} released)",
                seq.win_first
            );
        }
        let keep = self.blocks_for(new_len).min(seq.blocks.len());
        self.release_tail(seq, keep);
        if let Some(w) = &mut self.win {
            w.release_tail(seq, keep);
        }
        seq.len = seq.len.min(new_len);
        let (idx, in_block) = (seq.len / bs, seq.len % bs);
        if in_block == 0 || idx >= seq.blocks.len() {
            return;
        }
        if !self.make_private(seq, idx, in_block) {
            self.release_tail(seq, idx);
            if let Some(w) = &mut self.win {
                w.release_tail(seq, idx);
            }
            seq.len = idx * bs;
        }
    }

    /// Make block index `idx` (its first `in_block` rows kept) private to `seq` in every table
    /// class: copy-on-write when shared, un-publish when only prefix-cached. False when no block
    /// is left for a copy.
    fn make_private(&mut self, seq: &mut SeqKv, idx: usize, in_block: usize) -> bool {
        let bs = self.cfg.block_size;
        let windowed = |g: &KvGroupSpec, win: bool| win && g.kind.is_windowed();
        let has_win = self.win.is_some();
        let b = seq.blocks[idx];
        if self.alloc.refcount(b) > 1 {
            let Some(nb) = self.take_block() else {
                return false;
            };
            for (pool, g) in self.pools.iter_mut().zip(&self.cfg.groups) {
                if windowed(g, has_win) {
                    continue;
                }
                if g.kind.rate() == 1 {
                    pool.copy_slots(b as usize * bs, nb as usize * bs, in_block);
                } else {
                    let spb = g.kind.slots_per_block(bs);
                    pool.copy_slots(b as usize * spb, nb as usize * spb, spb);
                }
            }
            self.release(b);
            seq.blocks[idx] = nb;
        } else if self.prefix.is_cached(b) {
            self.prefix.remove(b);
        }
        let Some(w) = &mut self.win else {
            return true;
        };
        if idx < seq.win_first || idx >= seq.win_first + seq.win.len() {
            return true;
        }
        let j = idx - seq.win_first;
        let wb = seq.win[j];
        if w.alloc.refcount(wb) > 1 {
            let Some(nb) = w.take() else {
                return false;
            };
            for (pool, g) in self.pools.iter_mut().zip(&self.cfg.groups) {
                if windowed(g, true) {
                    pool.copy_slots(wb as usize * bs, nb as usize * bs, in_block);
                }
            }
            w.release(wb);
            seq.win[j] = nb;
        } else if w.prefix.is_cached(wb) {
            w.prefix.remove(wb);
        }
        true
    }

    /// Release all blocks of a sequence (tail first, so the tail is evicted before the prefix).
    /// The sequence becomes empty; freeing it again is a no-op.
    pub fn free(&mut self, seq: &mut SeqKv) {
        self.release_tail(seq, 0);
        if let Some(w) = &mut self.win {
            w.release_tail(seq, 0);
        }
        seq.win_first = 0;
        seq.len = 0;
    }

    /// Quantise and write one latent slot. `c_kv: [kv_lora_rank]`, `k_pe: [rope_dim]`,
    /// `pos` < reserved capacity, and the slot's block must be private to `seq`.
    pub fn write_slot(
        &mut self,
        layer: usize,
        seq: &SeqKv,
        pos: usize,
        c_kv: &[f32],
        k_pe: &[f32],
    ) {
        self.write_entry(Self::LATENT, layer, seq, pos, &[c_kv, k_pe]);
    }

    /// Quantise and write one entry of `group` given as its parts (`parts[i]: [width of part
    /// i]`, see `KvKind::parts`); same rules as [`KvCache::write_slot`].
    pub fn write_entry(
        &mut self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        pos: usize,
        parts: &[&[f32]],
    ) {
        let bs = self.cfg.block_size;
        let g = &self.cfg.groups[group];
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert!(
            pos < self.capacity(seq),
            "kv: write at {pos} beyond capacity {}",
            self.capacity(seq)
        );
        let widths = g.kind.parts();
        assert!(
            parts.len() == widths.len() && parts.iter().zip(&widths).all(|(p, &w)| p.len() == w),
            "kv: entry parts do not match the {} layout",
            g.kind.name()
        );
        let (b, in_win) = self.block_at(group, seq, pos);
        let private = match (&self.win, in_win) {
            (Some(w), true) => w.alloc.refcount(b) == 1 && !w.prefix.is_cached(b),
            _ => self.alloc.refcount(b) == 1 && !self.prefix.is_cached(b),
        };
        assert!(
            private,
            "kv: write to shared or prefix-cached block {b} (pos {pos}, len {})",
            seq.len
        );
        self.pools[group].write_entry(layer, b as usize * bs + pos % bs, parts);
    }

    /// Physical block holding position `pos` of `group` for `seq`, and whether it is a
    /// window-class block.
    fn block_at(&self, group: usize, seq: &SeqKv, pos: usize) -> (u32, bool) {
        let bi = pos / self.cfg.block_size;
        if self.win.is_some() && self.cfg.groups[group].kind.is_windowed() {
            assert!(
                bi >= seq.win_first && bi < seq.win_first + seq.win.len(),
                "kv: position {pos} of {} is outside the held sliding window (blocks {}..{})",
                self.cfg.groups[group].kind.name(),
                seq.win_first,
                seq.win_first + seq.win.len()
            );
            (seq.win[bi - seq.win_first], true)
        } else {
            (seq.blocks[bi], false)
        }
    }

    /// Slot of compressed entry `entry` of `group` for `seq`: in the block of the token that
    /// closes it (position `(entry + 1) * rate - 1`, which must be < reserved capacity).
    fn entry_slot(&self, group: usize, seq: &SeqKv, entry: usize) -> (u32, usize) {
        let bs = self.cfg.block_size;
        let kind = self.cfg.groups[group].kind;
        let rate = kind.rate();
        assert!(rate > 1, "kv: {} is not a compressed group", kind.name());
        let p = (entry + 1) * rate - 1;
        assert!(
            p < self.capacity(seq),
            "kv: entry {entry} closes at {p}, beyond capacity {}",
            self.capacity(seq)
        );
        let b = seq.blocks[p / bs];
        let spb = kind.slots_per_block(bs);
        (b, b as usize * spb + (p % bs) / rate.min(bs))
    }

    /// Quantise and write compressed entry `entry` of `group` (parts as in `write_entry`). The
    /// closing token's block must be private to `seq`.
    pub fn write_compressed(
        &mut self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        entry: usize,
        parts: &[&[f32]],
    ) {
        let g = &self.cfg.groups[group];
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        let widths = g.kind.parts();
        assert!(
            parts.len() == widths.len() && parts.iter().zip(&widths).all(|(p, &w)| p.len() == w),
            "kv: entry parts do not match the {} layout",
            g.kind.name()
        );
        let (b, slot) = self.entry_slot(group, seq, entry);
        assert!(
            self.alloc.refcount(b) == 1 && !self.prefix.is_cached(b),
            "kv: write to shared or prefix-cached block {b} (entry {entry})"
        );
        self.pools[group].write_entry(layer, slot, parts);
    }

    pub fn stats(&self) -> KvStats {
        let free = self.alloc.num_free();
        let cached = self.alloc.num_evictable();
        KvStats {
            num_blocks: self.cfg.num_blocks,
            free_blocks: free,
            cached_blocks: cached,
            used_blocks: self.cfg.num_blocks - free - cached,
            prefix_hit_tokens: self.prefix_hit_tokens,
            prefix_query_tokens: self.prefix_query_tokens,
            evictions: self.alloc.evictions,
            bytes_per_token_per_layer: self.bytes_per_token_per_layer(),
            bytes_per_token: self.bytes_per_token(),
            total_bytes: self.total_bytes,
            groups: self
                .cfg
                .groups
                .iter()
                .map(|g| KvGroupStats {
                    kind: g.kind.name(),
                    dtype: g.dtype,
                    num_layers: g.num_layers,
                    width: g.kind.width(),
                    bytes_per_token_per_layer: g.entry_bytes(),
                    bytes_per_token: g.bytes_per_block(self.cfg.block_size) / self.cfg.block_size,
                    total_bytes: g.bytes_per_block(self.cfg.block_size)
                        * if self.win.is_some() && g.kind.is_windowed() {
                            self.cfg.window_blocks
                        } else {
                            self.cfg.num_blocks
                        },
                })
                .collect(),
            window_blocks: self.win.as_ref().map_or(0, |w| w.alloc.num_blocks()),
            window_free_blocks: self.win.as_ref().map_or(0, |w| w.alloc.num_free()),
            window_cached_blocks: self.win.as_ref().map_or(0, |w| w.alloc.num_evictable()),
            tier: self.tier.as_ref().map(KvTier::stats),
        }
    }

    /// Drop every block reference that no table in `live` accounts for — the references of
    /// sequences that were lost without `free` (a request dropped by a contained panic). `live`
    /// must be every sequence of this cache that still exists. Blocks whose count falls to 0
    /// become free (or evictable while prefix-cached). Returns the references dropped.
    /// O(num_blocks + table sizes).
    pub fn reclaim_unheld(&mut self, live: &[&SeqKv]) -> usize {
        let holders = holders(self.cfg.num_blocks, live, |s| &s.blocks);
        let mut dropped = self.alloc.drop_unheld(&self.prefix, &holders);
        if let Some(w) = &mut self.win {
            dropped += w.reclaim(live);
        }
        dropped
    }

    /// Reference count of a physical block (diagnostics and tests).
    pub fn block_refcount(&self, block: u32) -> u32 {
        self.alloc.refcount(block)
    }

    /// Whether a physical block is registered in the prefix cache (diagnostics and tests).
    pub fn block_is_cached(&self, block: u32) -> bool {
        self.prefix.is_cached(block)
    }

    /// Evictable blocks, least recently released first (diagnostics and tests).
    pub fn evictable_blocks(&self) -> Vec<u32> {
        self.alloc.evictable_lru().collect()
    }

    /// Full consistency check against the complete set of live sequences of this cache
    /// (O(num_blocks + table sizes); for tests and debugging). Returns the first violation.
    pub fn check_invariants(&self, live: &[&SeqKv]) -> std::result::Result<(), String> {
        let n = self.cfg.num_blocks;
        let bs = self.cfg.block_size;
        for (si, s) in live.iter().enumerate() {
            if s.len > s.blocks.len() * bs {
                return Err(format!(
                    "seq {si}: len {} beyond capacity {}",
                    s.len,
                    s.blocks.len() * bs
                ));
            }
            for (i, &b) in s.blocks.iter().enumerate() {
                if b as usize >= n {
                    return Err(format!("seq {si}: block id {b} out of range"));
                }
                if i >= s.len / bs && (self.alloc.refcount(b) != 1 || self.prefix.is_cached(b)) {
                    return Err(format!(
                        "seq {si}: tail block {b} (index {i}) is shared or cached"
                    ));
                }
            }
        }
        let holders = holders(n, live, |s| &s.blocks);
        self.alloc
            .check_states(&holders, |b| self.prefix.is_cached(b), "block")?;
        if let Some(w) = &self.win {
            w.check(live, bs)?;
        }
        self.prefix.check()
    }

    // -- internals ------------------------------------------------------------------------------

    /// One block with refcount 1, dropping the prefix identity of an evicted block (which goes
    /// to the second tier first, when there is one).
    fn take_block(&mut self) -> Option<u32> {
        if self.tier.is_some() && self.alloc.free_list().is_empty() {
            if let Some(b) = self.alloc.evictable_lru().next() {
                if let Some((key, toks)) = self.tier_entry(b) {
                    let data = self.block_data(b, self.window_of(b));
                    if let Some(tier) = self.tier.as_mut() {
                        tier.offload(key, &toks, data);
                    }
                }
            }
        }
        self.alloc.take_from(&mut self.prefix)
    }

    fn release(&mut self, b: u32) {
        self.alloc.release_to(&self.prefix, b);
    }

    /// Release `seq.blocks[keep..]`, last block first.
    fn release_tail(&mut self, seq: &mut SeqKv, keep: usize) {
        while seq.blocks.len() > keep {
            let b = seq.blocks.pop().expect("len > keep");
            self.release(b);
        }
    }
}

/// How many of the `live` sequences' tables (`table` picks one class's) hold each block id below
/// `n` (ids out of range are not counted; `check_invariants` reports them).
pub(super) fn holders(n: usize, live: &[&SeqKv], table: fn(&SeqKv) -> &[u32]) -> Vec<u32> {
    let mut h = vec![0u32; n];
    for s in live {
        for &b in table(s) {
            if let Some(c) = h.get_mut(b as usize) {
                *c += 1;
            }
        }
    }
    h
}

/// RAM + swap in bytes (Linux `/proc/meminfo`); `None` where it cannot be read.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}

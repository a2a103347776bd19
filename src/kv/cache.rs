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

    /// Give this cache a second tier (see `kv::tier`): evicted prefix blocks are kept there and
    /// restored on a later prefix match; with a directory, published blocks persist across
    /// engines. `identity` fingerprints the model (a file written for another one is ignored).
    /// With a sliding-window class (V4) a block's record also carries its window-class rows
    /// when they were still held (the lookback of a prefix hit needs them).
    pub fn attach_tier(&mut self, cfg: &TierConfig, identity: u64) -> Result<()> {
        let bytes = self.block_bytes();
        self.tier = Some(KvTier::new(
            cfg,
            identity,
            self.layout_fingerprint(),
            self.cfg.block_size,
            bytes,
        )?);
        Ok(())
    }

    /// Bytes of one block as the tier stores it: every main-class group's slots of the block;
    /// with a window class then the window-class groups' slots of the block's window block and
    /// one flag byte (1 when they are present).
    fn block_bytes(&self) -> usize {
        let main = self.class_bytes(false);
        if self.win.is_some() {
            main + self.class_bytes(true) + 1
        } else {
            main
        }
    }

    /// A fingerprint of the layout a tier file must match: block size, lookback, every group's
    /// kind, layers and dtype.
    fn layout_fingerprint(&self) -> u64 {
        let text = format!(
            "{}|{:?}|{:?}",
            self.cfg.block_size,
            self.cfg.window,
            self.cfg
                .groups
                .iter()
                .map(|g| (g.kind, g.num_layers, g.dtype))
                .collect::<Vec<_>>()
        );
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// (group index, slots per block) of the main class (`win` false) or the window class.
    fn class_groups(&self, win: bool) -> Vec<(usize, usize)> {
        let bs = self.cfg.block_size;
        (0..self.cfg.groups.len())
            .filter(|&g| (self.win.is_some() && self.cfg.groups[g].kind.is_windowed()) == win)
            .map(|g| (g, self.cfg.groups[g].kind.slots_per_block(bs)))
            .collect()
    }

    fn class_bytes(&self, win: bool) -> usize {
        self.class_groups(win)
            .into_iter()
            .map(|(g, n)| self.pools[g].copy_len(n))
            .sum()
    }

    /// Append block `b`'s bytes of one class to `out`.
    fn class_data(&self, win: bool, b: u32, out: &mut Vec<u8>) {
        for (g, n) in self.class_groups(win) {
            self.pools[g].copy_out(b as usize * n, n, out);
        }
    }

    /// Store one class's bytes of block `b` from `data`; returns the bytes consumed.
    fn class_store(&mut self, win: bool, b: u32, data: &[u8]) -> usize {
        let mut off = 0;
        for (g, n) in self.class_groups(win) {
            off += self.pools[g].copy_in(b as usize * n, n, &data[off..]);
        }
        off
    }

    /// Main block `b`'s record: its main-class bytes, then (with a window class) window block
    /// `wb`'s bytes and a flag (zeros and 0 without one).
    fn block_data(&self, b: u32, wb: Option<u32>) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.block_bytes());
        self.class_data(false, b, &mut out);
        if self.win.is_some() {
            match wb {
                Some(w) => {
                    self.class_data(true, w, &mut out);
                    out.push(1);
                }
                None => out.resize(self.block_bytes(), 0),
            }
        }
        out
    }

    /// The window block still holding main block `b`'s lookback rows, if any.
    fn window_of(&self, b: u32) -> Option<u32> {
        let w = self.win.as_ref()?;
        let (h, toks) = self.prefix.identity(b)?;
        w.prefix
            .lookup(h, Some((b, self.prefix.generation(b))), toks)
    }

    /// The tier key and tokens of registered block `b`.
    fn tier_entry(&self, b: u32) -> Option<(TierKey, Vec<u32>)> {
        let (h, toks) = self.prefix.identity(b)?;
        Some(((h, self.key2[b as usize]), toks.to_vec()))
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

    /// Read compressed entries `[start, end)` of `group` for `seq`, dequantised into
    /// `out: [end - start, width]`.
    pub fn read_compressed(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        start: usize,
        end: usize,
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert_eq!(
            out.len(),
            (end - start) * w,
            "kv: read_compressed out length"
        );
        for (i, e) in (start..end).enumerate() {
            let (_, slot) = self.entry_slot(group, seq, e);
            self.pools[group].read_slots(layer, slot, 1, &mut out[i * w..(i + 1) * w]);
        }
    }

    /// Read latent slots `[start, end)` of `seq` (end <= reserved capacity), dequantised into
    /// `out: [end - start, kv_lora_rank + rope_dim]`. One contiguous copy/convert per block.
    pub fn read_range(&self, layer: usize, seq: &SeqKv, start: usize, end: usize, out: &mut [f32]) {
        self.read_group_range(Self::LATENT, layer, seq, start, end, out);
    }

    /// Read entries `[start, end)` of `group` for `seq`, dequantised into `out: [end - start,
    /// width]`. One contiguous copy/convert per block.
    pub fn read_group_range(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        start: usize,
        end: usize,
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        assert_eq!(out.len(), (end - start) * w, "kv: read_range out length");
        let pool = &self.pools[group];
        self.for_each_run(group, seq, (start, end), |i, slot, n| {
            pool.read_slots(layer, slot, n, &mut out[i * w..(i + n) * w]); // [n, width]
        });
    }

    /// `f(i, slot, n)` for each run of the entries `[start, end)` of `seq` in `group` that lie
    /// in one block: `i` the run's offset from `start`, `slot` its first slot, `n` its length;
    /// in position order.
    fn for_each_run(
        &self,
        group: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let bs = self.cfg.block_size;
        let mut pos = start;
        while pos < end {
            let off = pos % bs;
            let n = (bs - off).min(end - pos);
            f(
                pos - start,
                self.block_at(group, seq, pos).0 as usize * bs + off,
                n,
            );
            pos += n;
        }
    }

    /// The MLA latent entries `[start, end)` of `seq` in place, `[end - start, width]` as
    /// stored, when they sit in consecutive blocks of the pool and the dtype widens exactly
    /// (f32 / bf16 / f16): attention then scores and sums them without a copy. None otherwise
    /// (read them with [`KvCache::read_range`]).
    pub fn latent_span(
        &self,
        layer: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
    ) -> Option<Rows<'_>> {
        let bs = self.cfg.block_size;
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        if start == end {
            return None;
        }
        let first = self.block_at(Self::LATENT, seq, start).0 as usize;
        let last_bi = (end - 1) / bs;
        for (i, bi) in (start / bs..=last_bi).enumerate() {
            if self.block_at(Self::LATENT, seq, bi * bs).0 as usize != first + i {
                return None;
            }
        }
        let slot = first * bs + start % bs;
        self.pools[Self::LATENT].rows(layer, slot, end - start)
    }

    /// Columns `[c0, c1)` of the MLA latent entries `[start, end)` of `seq`, dequantised into
    /// `out: [end - start, c1 - c0]` — each value the same bits as through
    /// [`KvCache::read_range`] (attention's value pass reads only the columns its thread sums).
    pub fn read_range_cols(
        &self,
        layer: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
        (c0, c1): (usize, usize),
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[Self::LATENT];
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert!(
            c0 <= c1 && c1 <= g.kind.width(),
            "kv: columns [{c0}, {c1}) beyond the entry"
        );
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        let cw = c1 - c0;
        assert_eq!(
            out.len(),
            (end - start) * cw,
            "kv: read_range_cols out length"
        );
        let pool = &self.pools[Self::LATENT];
        self.for_each_run(Self::LATENT, seq, (start, end), |i, slot, n| {
            pool.read_slots_cols(layer, slot, n, (c0, c1), &mut out[i * cw..(i + n) * cw]);
            // [n, cw]
        });
    }

    /// Gather the entries of `group` at `positions` (each < reserved capacity) of `seq`,
    /// dequantised into `out: [positions.len(), width]` in the given order; runs of consecutive
    /// positions inside one block are read with one copy/convert. Each entry decodes to the same
    /// bits as through [`KvCache::read_group_range`].
    pub fn read_rows(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        positions: &[u32],
        out: &mut [f32],
    ) {
        let bs = self.cfg.block_size;
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert_eq!(out.len(), positions.len() * w, "kv: read_rows out length");
        let cap = self.capacity(seq);
        let pool = &self.pools[group];
        let mut i = 0;
        while i < positions.len() {
            let p = positions[i] as usize;
            assert!(p < cap, "kv: read at {p} beyond capacity {cap}");
            let off = p % bs;
            // extend the run while positions stay consecutive inside the block
            let mut n = 1;
            while i + n < positions.len() && positions[i + n] as usize == p + n && off + n < bs {
                n += 1;
            }
            let slot = self.block_at(group, seq, p).0 as usize * bs + off;
            pool.read_slots(layer, slot, n, &mut out[i * w..(i + n) * w]); // [n, width]
            i += n;
        }
    }

    /// Longest run of full cached blocks matching `tokens` (at most `max_tokens` tokens). Returns a
    /// sequence sharing those blocks (refcount + 1) with len = matched tokens; counts
    /// `tokens.len()` query tokens and the matched tokens as hits.
    pub fn match_prefix(&mut self, tokens: &[u32], max_tokens: usize) -> SeqKv {
        let bs = self.cfg.block_size;
        self.prefix_query_tokens += tokens.len() as u64;
        let n_full = tokens.len().min(max_tokens) / bs;
        let mut seq = SeqKv::new();
        let (mut prev, mut parent): (Option<u64>, Parent) = (None, None);
        let (mut hashes, mut mains) = (Vec::new(), Vec::new());
        let mut prev2 = None;
        for toks in tokens.chunks_exact(bs).take(n_full) {
            let h = self.prefix.hash(prev, toks);
            let Some(b) = self.prefix.lookup(h, parent, toks) else {
                break;
            };
            seq.blocks.push(b);
            prev = Some(h);
            prev2 = self.tier.is_some().then(|| self.prefix.hash2(prev2, toks));
            parent = Some((b, self.prefix.generation(b)));
            hashes.push(h);
            mains.push(parent);
        }
        if self.tier.is_some() {
            return self.match_with_tier(tokens, n_full, seq, hashes, mains, prev2);
        }
        if let Some(w) = &self.win {
            // the longest hit whose lookback rows are all cached in the window class
            let mut m = seq.blocks.len();
            let run = loop {
                if m == 0 {
                    break Vec::new();
                }
                if let Some(run) = w.lookup_run(m, bs, &hashes, tokens, &mains) {
                    break run;
                }
                m -= 1;
            };
            seq.blocks.truncate(m);
            seq.win_first = m - run.len();
            seq.win = run;
        }
        for &b in &seq.blocks {
            self.alloc.incref(b);
        }
        if let Some(w) = &mut self.win {
            for &b in &seq.win {
                w.alloc.incref(b);
            }
        }
        seq.len = seq.blocks.len() * bs;
        self.prefix_hit_tokens += seq.len as u64;
        seq
    }

    /// `match_prefix` with a second tier: the blocks matched in the pool are held, the chain
    /// continues from the tier (each restored block takes a pool block and its prefix identity);
    /// with a window class the hit is then cut to the longest length whose lookback rows are in
    /// the window class or in the restored records, and the missing window blocks are restored.
    fn match_with_tier(
        &mut self,
        tokens: &[u32],
        n_full: usize,
        mut seq: SeqKv,
        mut hashes: Vec<u64>,
        mut mains: Vec<Parent>,
        mut prev2: Option<u64>,
    ) -> SeqKv {
        let bs = self.cfg.block_size;
        for &b in &seq.blocks {
            self.alloc.incref(b);
        }
        let held = seq.blocks.len();
        let mut prev = hashes.last().copied();
        let mut parent = mains.last().copied().flatten();
        let wbytes = if self.win.is_some() {
            self.class_bytes(true)
        } else {
            0
        };
        // window rows of each chain block found in a tier record (restored blocks only)
        let mut tier_win: Vec<Option<Vec<u8>>> = vec![None; held];
        for toks in tokens.chunks_exact(bs).take(n_full).skip(held) {
            let h = self.prefix.hash(prev, toks);
            let h2 = self.prefix.hash2(prev2, toks);
            // an unreachable entry under h gives its key to the restored block
            self.alloc.settle_orphan(&mut self.prefix, h, None, None);
            if self.prefix.contains_hash(h) {
                break;
            }
            let tier = self.tier.as_mut().expect("tier");
            let Some(data) = tier.restore((h, h2), toks) else {
                break;
            };
            let Some(b) = self.take_block() else {
                break; // pool exhausted: the rest is recomputed
            };
            let off = self.class_store(false, b, &data);
            self.prefix.insert(b, h, parent, toks);
            self.key2[b as usize] = h2;
            seq.blocks.push(b);
            prev = Some(h);
            prev2 = Some(h2);
            parent = Some((b, self.prefix.generation(b)));
            hashes.push(h);
            mains.push(parent);
            tier_win.push(
                (self.win.is_some() && data.get(off + wbytes) == Some(&1))
                    .then(|| data[off..off + wbytes].to_vec()),
            );
        }
        if let Some(w) = &self.win {
            let in_pool = |i: usize| {
                w.prefix
                    .lookup(hashes[i], mains[i], &tokens[i * bs..(i + 1) * bs])
            };
            // the longest hit whose lookback blocks are all in the window class or restored
            let mut m = seq.blocks.len();
            while m > 0
                && !(w.floor(m * bs, bs)..m).all(|i| in_pool(i).is_some() || tier_win[i].is_some())
            {
                m -= 1;
            }
            let lo = w.floor(m * bs, bs);
            let pool_run: Vec<Option<u32>> = (lo..m).map(in_pool).collect();
            for b in seq.blocks.drain(m..).collect::<Vec<_>>() {
                self.release(b);
            }
            let held_pool: Vec<u32> = pool_run.iter().flatten().copied().collect();
            let w = self.win.as_mut().expect("window class");
            for &wb in &held_pool {
                w.alloc.incref(wb);
            }
            let (mut run, mut taken) = (Vec::with_capacity(m - lo), Vec::new());
            let mut failed = false;
            for (j, got) in pool_run.into_iter().enumerate() {
                let i = lo + j;
                if let Some(wb) = got {
                    run.push(wb);
                    continue;
                }
                let w = self.win.as_mut().expect("window class");
                if w.prefix.contains_hash(hashes[i]) {
                    failed = true; // a stale window identity under this key: recompute instead
                    break;
                }
                let Some(wb) = w.take() else {
                    failed = true; // window pool exhausted
                    break;
                };
                taken.push(wb);
                let data = tier_win[i].take().expect("checked above");
                self.class_store(true, wb, &data);
                let toks = &tokens[i * bs..(i + 1) * bs];
                let w = self.win.as_mut().expect("window class");
                w.prefix.insert(wb, hashes[i], mains[i], toks);
                run.push(wb);
            }
            if failed {
                // give the hit up: every block held or taken goes back (cached ones stay cached)
                let w = self.win.as_mut().expect("window class");
                for wb in held_pool.into_iter().chain(taken) {
                    w.release(wb);
                }
                for b in std::mem::take(&mut seq.blocks) {
                    self.release(b);
                }
                return SeqKv::new();
            }
            seq.win_first = m - run.len();
            seq.win = run;
        }
        seq.len = seq.blocks.len() * bs;
        self.prefix_hit_tokens += seq.len as u64;
        seq
    }

    /// Publish the full blocks of `seq` covering `tokens` (only min(tokens.len(), seq.len())
    /// tokens count; pass tokens whose KV is final and reproducible, i.e. prompt tokens). Blocks
    /// whose content is already cached in another block stay private duplicates. Stops at a hash
    /// collision with different content.
    pub fn register_prefix(&mut self, seq: &SeqKv, tokens: &[u32]) {
        let bs = self.cfg.block_size;
        let n_full = (tokens.len().min(seq.len) / bs).min(seq.blocks.len());
        let (mut prev, mut parent): (Option<u64>, Parent) = (None, None);
        let mut prev2 = None;
        for (i, toks) in tokens.chunks_exact(bs).take(n_full).enumerate() {
            let h = self.prefix.hash(prev, toks);
            let h2 = self.prefix.hash2(prev2, toks);
            let canonical = if let Some(c) = self.prefix.lookup(h, parent, toks) {
                c
            } else if self.alloc.settle_orphan(
                &mut self.prefix,
                h,
                Some((seq.blocks[i], parent, toks)),
                None,
            ) {
                seq.blocks[i]
            } else {
                let b = seq.blocks[i];
                if self.prefix.contains_hash(h) || self.prefix.is_cached(b) {
                    break; // hash collision, or the block already has another identity
                }
                self.prefix.insert(b, h, parent, toks);
                self.key2[b as usize] = h2;
                if self.tier.is_some() {
                    let wb = (i >= seq.win_first && i < seq.win_first + seq.win.len())
                        .then(|| seq.win[i - seq.win_first]);
                    let data = self.block_data(b, wb);
                    if let Some(tier) = self.tier.as_mut() {
                        tier.persist((h, h2), toks, &data);
                    }
                }
                b
            };
            prev = Some(h);
            prev2 = Some(h2);
            parent = Some((canonical, self.prefix.generation(canonical)));
            if let Some(w) = &mut self.win {
                if i >= seq.win_first && i < seq.win_first + seq.win.len() {
                    w.publish(seq.win[i - seq.win_first], h, parent, toks, &self.prefix);
                }
            }
        }
    }

    /// Change the salt mixed into every prefix hash and drop every cached entry: evictable blocks
    /// become free, in-use ones are simply no longer matchable.
    pub fn reset_prefix_cache(&mut self, salt: u64) {
        for b in self.prefix.reset(salt) {
            self.alloc.uncache(b);
        }
        if let Some(w) = &mut self.win {
            for b in w.prefix.reset(salt) {
                w.alloc.uncache(b);
            }
        }
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

//! The sliding-window table class of a KV cache: groups whose rows are only read within a
//! bounded lookback (V4's K=V rows and compressor inputs) live in blocks of their own pool, and a
//! sequence releases its window blocks as they fall out of the lookback.
//!
//! Where it sits: inside `KvCache` (`KvConfig::window` = lookback `r0`, `window_blocks` = pool
//! size). A sequence's window table is `SeqKv::{win_first, win}`: block index `i >= win_first`
//! of the window class is `win[i - win_first]`; indices below were released. `KvCache` drives it
//! from the same operations as the main table: plan/commit growth (which first drops the blocks
//! wholly below `len - r0`), truncate, free, prefix match / register, invariants.
//!
//! Guarantees: after a commit at committed length `L`, every row at a position `>= L - r0` is
//! still held, and no later operation of the engine reads below that (a rollback never goes below
//! the length committed when its step was planned). Released blocks that were published to the
//! prefix cache stay evictable (LRU) in the window pool, so a later prefix hit of `m` blocks finds
//! the window rows it needs (`[m * bs - r0, m * bs)`) unless they were evicted — then the hit is
//! shortened to a length whose rows are all cached (or to none). Refcounts, free and evictable
//! sets obey the same rules as the main class.

use super::block_allocator::BlockAllocator;
use super::prefix_cache::{Parent, PrefixCache};
use super::seq::SeqKv;

/// The window class: lookback, allocator, prefix identities of its blocks.
#[derive(Debug)]
pub(super) struct WinClass {
    /// Rows at positions `>= len - r0` stay held.
    pub(super) r0: usize,
    pub(super) alloc: BlockAllocator,
    /// Window blocks published with the same chain hash as the main block of the same index;
    /// the lookup key's parent is that main block's identity.
    pub(super) prefix: PrefixCache,
}

impl WinClass {
    pub(super) fn new(r0: usize, num_blocks: usize, block_size: usize) -> Self {
        WinClass {
            r0,
            alloc: BlockAllocator::new(num_blocks),
            prefix: PrefixCache::new(num_blocks, block_size),
        }
    }

    /// First block index that must stay held at committed length `len`.
    pub(super) fn floor(&self, len: usize, bs: usize) -> usize {
        len.saturating_sub(self.r0) / bs
    }

    /// (blocks the next commit drops, how many of those become available).
    pub(super) fn droppable(&self, seq: &SeqKv, bs: usize) -> (usize, usize) {
        let drop = self
            .floor(seq.len, bs)
            .saturating_sub(seq.win_first)
            .min(seq.win.len());
        let freed = seq.win[..drop]
            .iter()
            .filter(|&&b| self.alloc.refcount(b) == 1)
            .count();
        (drop, freed)
    }

    pub(super) fn take(&mut self) -> Option<u32> {
        self.alloc.take_from(&mut self.prefix)
    }

    pub(super) fn release(&mut self, b: u32) {
        self.alloc.release_to(&self.prefix, b);
    }

    /// Drop the first `n` blocks of the sequence's window table.
    pub(super) fn drop_front(&mut self, seq: &mut SeqKv, n: usize) {
        for b in seq.win.drain(..n).collect::<Vec<_>>() {
            self.release(b);
        }
        seq.win_first += n;
    }

    /// Release window blocks at index >= `keep`, last first.
    pub(super) fn release_tail(&mut self, seq: &mut SeqKv, keep: usize) {
        while seq.win_first + seq.win.len() > keep && !seq.win.is_empty() {
            let b = seq.win.pop().expect("non-empty");
            self.release(b);
        }
        if seq.win.is_empty() {
            seq.win_first = seq.win_first.min(keep);
        }
    }

    /// Window blocks for a prefix hit of `m` main blocks whose chain hashes are `hashes[..m]`,
    /// toks the matched tokens and `mains[i]` the (block, generation) of main block i: the
    /// blocks `[floor(m * bs), m)`, or None when one of them is not cached.
    pub(super) fn lookup_run(
        &self,
        m: usize,
        bs: usize,
        hashes: &[u64],
        toks: &[u32],
        mains: &[Parent],
    ) -> Option<Vec<u32>> {
        let lo = self.floor(m * bs, bs);
        (lo..m)
            .map(|i| {
                self.prefix
                    .lookup(hashes[i], mains[i], &toks[i * bs..(i + 1) * bs])
            })
            .collect()
    }

    /// Publish window block `b` (block index with chain hash `h`, main identity `main` in
    /// `main_table`).
    pub(super) fn publish(
        &mut self,
        b: u32,
        h: u64,
        main: Parent,
        toks: &[u32],
        main_table: &PrefixCache,
    ) {
        if self.prefix.lookup(h, main, toks).is_some()
            // an entry whose main-table block lost its identity since: relinked or dropped
            || self.alloc.settle_orphan(&mut self.prefix, h, Some((b, main, toks)), Some(main_table))
        {
            return;
        }
        if self.prefix.contains_hash(h) || self.prefix.is_cached(b) {
            return;
        }
        self.prefix.insert(b, h, main, toks);
    }

    /// Invariants of the window class against every live sequence.
    pub(super) fn check(&self, live: &[&SeqKv], bs: usize) -> Result<(), String> {
        let n = self.alloc.num_blocks();
        for (si, s) in live.iter().enumerate() {
            let end = s.win_first + s.win.len();
            if !s.win.is_empty() && end != s.blocks.len() {
                return Err(format!(
                    "seq {si}: window table ends at block {end}, main table at {}",
                    s.blocks.len()
                ));
            }
            if s.len > 0 && !s.win.is_empty() && s.win_first > self.floor(s.len, bs) {
                return Err(format!(
                    "seq {si}: window rows released above the lookback (first {}, len {})",
                    s.win_first, s.len
                ));
            }
            for (j, &b) in s.win.iter().enumerate() {
                if b as usize >= n {
                    return Err(format!("seq {si}: window block id {b} out of range"));
                }
                let i = s.win_first + j;
                if i >= s.len / bs && (self.alloc.refcount(b) != 1 || self.prefix.is_cached(b)) {
                    return Err(format!("seq {si}: window tail block {b} shared or cached"));
                }
            }
        }
        let holders = super::cache::holders(n, live, |s| &s.win);
        self.alloc
            .check_states(&holders, |b| self.prefix.is_cached(b), "window block")?;
        self.prefix.check()
    }

    /// Drop references no live table accounts for (see `KvCache::reclaim_unheld`).
    pub(super) fn reclaim(&mut self, live: &[&SeqKv]) -> usize {
        let holders = super::cache::holders(self.alloc.num_blocks(), live, |s| &s.win);
        self.alloc.drop_unheld(&self.prefix, &holders)
    }
}

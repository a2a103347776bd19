//! Block bookkeeping of the KV pool: reference counts, the free list and the LRU set of
//! evictable prefix-cached blocks.
//!
//! Where it sits: `KvCache` asks it for blocks when committing a grow plan and returns blocks on
//! truncate / free; the prefix cache decides which released blocks stay cached (evictable).
//!
//! Guarantees: every block is in exactly one state —
//! free (refcount 0, on the free list), in use (refcount >= 1, on neither list) or evictable
//! (refcount 0, in the LRU set, still registered in the prefix cache). Allocation takes a free
//! block first (lowest id first on a fresh pool) and only then evicts the least recently released
//! cached block. All orders are deterministic (no hashing of ids).

use super::prefix_cache::{Parent, PrefixCache};
use std::collections::BTreeSet;

#[derive(Debug)]
pub(crate) struct BlockAllocator {
    /// `[num_blocks]` number of block tables holding each block.
    refcount: Vec<u32>,
    /// Free blocks, used as a stack (top = next to hand out).
    free: Vec<u32>,
    /// Evictable cached blocks ordered by (release tick, id): first = least recently used.
    evictable: BTreeSet<(u64, u32)>,
    /// `[num_blocks]` tick under which a block sits in `evictable` (meaningless otherwise).
    lru_tick: Vec<u64>,
    /// Monotonic counter stamping releases.
    tick: u64,
    /// Cached blocks evicted to satisfy allocations.
    pub(crate) evictions: u64,
}

/// What `take` handed out.
pub(crate) struct Taken {
    pub(crate) block: u32,
    /// The block was an evictable cached block: the caller must drop its prefix-cache entry.
    pub(crate) evicted: bool,
}

impl BlockAllocator {
    pub(crate) fn new(num_blocks: usize) -> Self {
        BlockAllocator {
            refcount: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeSet::new(),
            lru_tick: vec![0; num_blocks],
            tick: 0,
            evictions: 0,
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.refcount.len()
    }
    pub(crate) fn num_free(&self) -> usize {
        self.free.len()
    }
    pub(crate) fn num_evictable(&self) -> usize {
        self.evictable.len()
    }
    /// Blocks an allocation can obtain right now (free + evictable).
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }
    pub(crate) fn refcount(&self, b: u32) -> u32 {
        self.refcount[b as usize]
    }

    /// Hand out one block with refcount 1: a free one, else the LRU evictable one.
    pub(crate) fn take(&mut self) -> Option<Taken> {
        let (block, evicted) = if let Some(b) = self.free.pop() {
            (b, false)
        } else {
            let (_, b) = self.evictable.pop_first()?;
            self.evictions += 1;
            (b, true)
        };
        debug_assert_eq!(self.refcount[block as usize], 0);
        self.refcount[block as usize] = 1;
        Some(Taken { block, evicted })
    }

    /// Add a reference (sharing a cached block). A block at refcount 0 must be evictable.
    pub(crate) fn incref(&mut self, b: u32) {
        let rc = &mut self.refcount[b as usize];
        if *rc == 0 {
            let removed = self.evictable.remove(&(self.lru_tick[b as usize], b));
            assert!(
                removed,
                "kv: incref of block {b} that is neither in use nor evictable"
            );
        }
        *rc += 1;
    }

    /// Drop a reference; at 0 the block becomes evictable (if `cached`) or free.
    pub(crate) fn decref(&mut self, b: u32, cached: bool) {
        let rc = &mut self.refcount[b as usize];
        assert!(*rc > 0, "kv: double release of block {b}");
        *rc -= 1;
        if *rc == 0 {
            if cached {
                self.tick += 1;
                self.lru_tick[b as usize] = self.tick;
                self.evictable.insert((self.tick, b));
            } else {
                self.free.push(b);
            }
        }
    }

    /// Move an evictable block to the free list (its prefix-cache entry is being dropped).
    pub(crate) fn uncache(&mut self, b: u32) {
        if self.refcount[b as usize] == 0 && self.evictable.remove(&(self.lru_tick[b as usize], b))
        {
            self.free.push(b);
        }
    }

    /// Evictable blocks, least recently used first.
    pub(crate) fn evictable_lru(&self) -> impl Iterator<Item = u32> + '_ {
        self.evictable.iter().map(|&(_, b)| b)
    }

    /// Free blocks (any order).
    pub(crate) fn free_list(&self) -> &[u32] {
        &self.free
    }

    /// One block with refcount 1 (see [`BlockAllocator::take`]), dropping the prefix identity
    /// of an evicted block from `prefix`.
    pub(crate) fn take_from(&mut self, prefix: &mut PrefixCache) -> Option<u32> {
        let t = self.take()?;
        if t.evicted {
            prefix.remove(t.block);
        }
        Some(t.block)
    }

    /// Settle the orphan registered in `prefix` under key `h`, if any (its parent's identity —
    /// in `parents`, else in `prefix` itself — was dropped since, so no lookup can reach it):
    /// relinked under `keep`'s parent when it is `keep`'s block with `keep`'s tokens (true: its
    /// children stay reachable), else its identity dropped and its block freed once nobody holds
    /// it, so another block can take the key (false). No orphan: false.
    pub(crate) fn settle_orphan(
        &mut self,
        prefix: &mut PrefixCache,
        h: u64,
        keep: Option<(u32, Parent, &[u32])>,
        parents: Option<&PrefixCache>,
    ) -> bool {
        let orphan = match parents {
            Some(t) => prefix.orphan(h, |p| t.generation(p)),
            None => prefix.orphan(h, |p| prefix.generation(p)),
        };
        let Some(o) = orphan else {
            return false;
        };
        if let Some((b, parent, toks)) = keep {
            if o == b && prefix.identity(b).is_some_and(|(_, t)| t == toks) {
                prefix.reparent(b, parent);
                return true;
            }
        }
        prefix.remove(o);
        self.uncache(o);
        false
    }

    /// Drop one reference of `b`; at 0 it stays evictable while `prefix` knows it.
    pub(crate) fn release_to(&mut self, prefix: &PrefixCache, b: u32) {
        self.decref(b, prefix.is_cached(b));
    }

    /// Drop every reference beyond `holders[b]` (the tables that still hold each block);
    /// returns how many were dropped.
    pub(crate) fn drop_unheld(&mut self, prefix: &PrefixCache, holders: &[u32]) -> usize {
        let mut dropped = 0;
        for b in 0..self.num_blocks() as u32 {
            while self.refcount(b) > holders[b as usize] {
                self.release_to(prefix, b);
                dropped += 1;
            }
        }
        dropped
    }

    /// Every block is exactly one of in use (refcount = `holders[b]`, the tables holding it),
    /// free (uncached, once on the free list) or evictable (cached); the evictable set holds
    /// nothing else. `what` names the blocks in the message of the first violation.
    pub(crate) fn check_states(
        &self,
        holders: &[u32],
        is_cached: impl Fn(u32) -> bool,
        what: &str,
    ) -> Result<(), String> {
        let n = self.num_blocks();
        let mut on_free = vec![false; n];
        for &b in self.free_list() {
            if std::mem::replace(&mut on_free[b as usize], true) {
                return Err(format!("{what} {b} twice on the free list"));
            }
        }
        let mut evictable = 0;
        for b in 0..n as u32 {
            let (rc, cached, free, ev) = (
                self.refcount(b),
                is_cached(b),
                on_free[b as usize],
                self.is_evictable(b),
            );
            if rc != holders[b as usize] {
                return Err(format!(
                    "{what} {b}: refcount {rc} but {} tables hold it",
                    holders[b as usize]
                ));
            }
            let ok = match (rc > 0, free, ev) {
                (true, false, false) => true,
                (false, true, false) => !cached,
                (false, false, true) => cached,
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "{what} {b}: refcount {rc}, free {free}, evictable {ev}, cached {cached}"
                ));
            }
            evictable += ev as usize;
        }
        if evictable != self.num_evictable() {
            return Err(format!("the evictable set holds unknown {what}s"));
        }
        Ok(())
    }

    /// Whether `b` sits in the evictable set under its recorded tick.
    pub(crate) fn is_evictable(&self, b: u32) -> bool {
        self.evictable.contains(&(self.lru_tick[b as usize], b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_prefers_free_then_lru() {
        let mut a = BlockAllocator::new(3);
        let t: Vec<u32> = (0..3).map(|_| a.take().unwrap().block).collect();
        assert_eq!(t, vec![0, 1, 2]);
        assert!(a.take().is_none());
        a.decref(2, true); // evictable, released first
        a.decref(0, true);
        a.decref(1, false); // free
        assert_eq!((a.num_free(), a.num_evictable()), (1, 2));
        let x = a.take().unwrap();
        assert_eq!((x.block, x.evicted), (1, false));
        let x = a.take().unwrap();
        assert_eq!(
            (x.block, x.evicted),
            (2, true),
            "least recently released first"
        );
        a.incref(0); // reuse a cached block: leaves the LRU set
        assert_eq!(a.refcount(0), 1);
        assert_eq!(a.num_evictable(), 0);
        assert_eq!(a.evictions, 1);
    }

    #[test]
    #[should_panic(expected = "double release")]
    fn double_release_is_caught() {
        let mut a = BlockAllocator::new(1);
        let b = a.take().unwrap().block;
        a.decref(b, false);
        a.decref(b, false);
    }
}

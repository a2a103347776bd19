//! Prefix cache index: chained hash of full token blocks -> physical block.
//!
//! Where it sits: `KvCache::register_prefix` publishes a sequence's full prompt blocks here and
//! `KvCache::match_prefix` walks it to share them with a new sequence; the block allocator keeps
//! released cached blocks evictable until an allocation needs them.
//!
//! Guarantees:
//! - The key of block i is `H(salt, key(i - 1), tokens of block i)`, so it depends on every token
//!   up to and including the block. A lookup is only a hit when the stored entry's tokens equal the
//!   queried block's tokens AND its recorded parent is exactly the block matched one step earlier
//!   (same id and same generation). By induction the whole prefix is verified, so a 64-bit hash
//!   collision can cause a miss but never a wrong match.
//! - A block's generation changes whenever its cache identity is dropped (eviction, un-registering,
//!   reset), so children recorded under an old parent can never be chained onto a reused block.
//! - Changing the salt (`reset`) drops every entry: nothing registered before can match again.
//! - An entry whose parent's identity was dropped since (an *orphan*: no lookup can reach it) is
//!   relinked (same block) or dropped by `BlockAllocator::settle_orphan` when the same prefix is
//!   registered or restored again, so an un-registered ancestor does not make its key unusable.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: u64,
    /// (block, generation) matched one step earlier; None for the first block of a prompt.
    parent: Option<(u32, u64)>,
}

#[derive(Debug)]
pub(crate) struct PrefixCache {
    salt: u64,
    block_size: usize,
    map: HashMap<u64, u32>,
    /// `[num_blocks]` cache identity of each block (None = not registered).
    entry: Vec<Option<Entry>>,
    /// `[num_blocks, block_size]` tokens of each registered block (for verification).
    tokens: Vec<u32>,
    /// `[num_blocks]` generation counter, bumped whenever a block's identity is dropped.
    gen: Vec<u64>,
}

/// Link to the block matched one step earlier.
pub(crate) type Parent = Option<(u32, u64)>;

#[inline]
fn mix(mut z: u64) -> u64 {
    // splitmix64 finaliser
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl PrefixCache {
    pub(crate) fn new(num_blocks: usize, block_size: usize) -> Self {
        PrefixCache {
            salt: 0,
            block_size,
            map: HashMap::new(),
            entry: vec![None; num_blocks],
            tokens: vec![0; num_blocks * block_size],
            gen: vec![0; num_blocks],
        }
    }

    /// Key of a block given the key of the previous block (`None` for the first block).
    pub(crate) fn hash(&self, prev: Option<u64>, toks: &[u32]) -> u64 {
        let mut h = mix(self.salt ^ 0x5eed_0f4b_10c4);
        h = mix(h ^ prev.map_or(0x9e37_79b9_7f4a_7c15, mix));
        for &t in toks {
            h = mix(h.wrapping_add(t as u64).wrapping_mul(0x100_0000_01b3));
        }
        h
    }

    /// Key and tokens of registered block `b`.
    pub(crate) fn identity(&self, b: u32) -> Option<(u64, &[u32])> {
        let e = self.entry[b as usize]?;
        let bs = self.block_size;
        Some((e.hash, &self.tokens[b as usize * bs..(b as usize + 1) * bs]))
    }

    /// The second, independent chain hash (the KV tier keys blocks by both).
    pub(crate) fn hash2(&self, prev: Option<u64>, toks: &[u32]) -> u64 {
        let mut h = mix(self.salt ^ 0x7a3c_91d2_e4b5_0f68);
        h = mix(h ^ prev.map_or(0x2545_f491_4f6c_dd1d, |p| mix(p ^ 0x51ed)));
        for &t in toks {
            h = mix(h.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 0x3c6e_f372));
        }
        h
    }

    pub(crate) fn is_cached(&self, b: u32) -> bool {
        self.entry[b as usize].is_some()
    }
    pub(crate) fn generation(&self, b: u32) -> u64 {
        self.gen[b as usize]
    }
    pub(crate) fn contains_hash(&self, h: u64) -> bool {
        self.map.contains_key(&h)
    }

    /// The cached block with key `h`, if its tokens equal `toks` and its parent is `parent`.
    pub(crate) fn lookup(&self, h: u64, parent: Parent, toks: &[u32]) -> Option<u32> {
        let &b = self.map.get(&h)?;
        let e = self.entry[b as usize]?;
        let bs = self.block_size;
        let stored = &self.tokens[b as usize * bs..(b as usize + 1) * bs];
        (e.hash == h && e.parent == parent && stored == toks).then_some(b)
    }

    /// The block registered under `h` if it is an orphan: its recorded parent's generation (read
    /// through `parent_gen`, the table the parent lives in) changed since, so no lookup along any
    /// chain can reach it again.
    pub(crate) fn orphan(&self, h: u64, parent_gen: impl Fn(u32) -> u64) -> Option<u32> {
        let &b = self.map.get(&h)?;
        let (pb, pg) = self.entry[b as usize]?.parent?;
        (parent_gen(pb) != pg).then_some(b)
    }

    /// Relink registered block `b` under `parent` (its key, tokens and generation stay, so the
    /// children recorded under it stay reachable).
    pub(crate) fn reparent(&mut self, b: u32, parent: Parent) {
        if let Some(e) = &mut self.entry[b as usize] {
            e.parent = parent;
        }
    }

    /// Register `b` under key `h`. The caller checked that neither `h` nor `b` is registered.
    pub(crate) fn insert(&mut self, b: u32, h: u64, parent: Parent, toks: &[u32]) {
        debug_assert!(!self.map.contains_key(&h) && self.entry[b as usize].is_none());
        let bs = self.block_size;
        self.tokens[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(toks);
        self.entry[b as usize] = Some(Entry { hash: h, parent });
        self.map.insert(h, b);
    }

    /// Drop `b`'s identity (no-op if not registered) and bump its generation.
    pub(crate) fn remove(&mut self, b: u32) {
        if let Some(e) = self.entry[b as usize].take() {
            if self.map.get(&e.hash) == Some(&b) {
                self.map.remove(&e.hash);
            }
            self.gen[b as usize] += 1;
        }
    }

    /// Set a new salt and drop every entry; returns the blocks that were registered (ascending).
    pub(crate) fn reset(&mut self, salt: u64) -> Vec<u32> {
        self.salt = salt;
        let dropped: Vec<u32> = (0..self.entry.len() as u32)
            .filter(|&b| self.is_cached(b))
            .collect();
        for &b in &dropped {
            self.remove(b);
        }
        debug_assert!(self.map.is_empty());
        dropped
    }

    /// Consistency of map and entries (diagnostics).
    pub(crate) fn check(&self) -> Result<(), String> {
        for (&h, &b) in &self.map {
            match self.entry.get(b as usize).copied().flatten() {
                Some(e) if e.hash == h => {}
                _ => {
                    return Err(format!(
                        "prefix map key {h:#x} -> block {b} without a matching entry"
                    ))
                }
            }
        }
        let n = self.entry.iter().filter(|e| e.is_some()).count();
        if n != self.map.len() {
            return Err(format!(
                "{n} registered blocks but {} map entries",
                self.map.len()
            ));
        }
        Ok(())
    }
}

//! Prefix caching of `KvCache` and its second tier: matching a prompt against the cached full
//! blocks (and, past them, against the tier's records, restored into fresh blocks), registering
//! a sequence's full prompt blocks, resetting the cache, and the block records the tier keeps
//! (every group's bytes of a block, plus its sliding-window rows where they are still held).
//! Guarantees as in the parent module: a prefix hit restores every group's entries; what is
//! matched is shared (refcount + 1), never copied.

use super::*;

impl KvCache {
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
    pub(super) fn block_data(&self, b: u32, wb: Option<u32>) -> Vec<u8> {
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
    pub(super) fn window_of(&self, b: u32) -> Option<u32> {
        let w = self.win.as_ref()?;
        let (h, toks) = self.prefix.identity(b)?;
        w.prefix
            .lookup(h, Some((b, self.prefix.generation(b))), toks)
    }

    /// The tier key and tokens of registered block `b`.
    pub(super) fn tier_entry(&self, b: u32) -> Option<(TierKey, Vec<u32>)> {
        let (h, toks) = self.prefix.identity(b)?;
        Some(((h, self.key2[b as usize]), toks.to_vec()))
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

    /// Give back a prefix hit `seq` that the caller could use only up to `len` tokens, and keep
    /// the longest hit within `len` (matched again; a truncation could cut below a sliding
    /// window): the query is not counted twice and the hit counts as the shorter one.
    pub fn shorten_prefix_hit(&mut self, seq: &mut SeqKv, tokens: &[u32], len: usize) {
        let counted = seq.len as u64;
        self.free(seq);
        self.prefix_hit_tokens = self.prefix_hit_tokens.saturating_sub(counted);
        if len > 0 {
            *seq = self.match_prefix(tokens, len);
            self.prefix_query_tokens = self.prefix_query_tokens.saturating_sub(tokens.len() as u64);
        }
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
}

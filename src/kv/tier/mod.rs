//! The second KV tier: prefix-cache blocks evicted from the pool are kept in host memory (up to
//! a byte budget, least recently offloaded dropped first) and, when a directory is given, in a
//! file there; a later prefix match restores them into the pool instead of recomputing them.
//! With a directory, every published prompt block is also written through to the file, so the
//! prefix cache survives an engine restart.
//!
//! Where it sits: owned by a `KvCache` (`KvCache::attach_tier`); the cache calls `offload` when
//! it evicts a cached block, `persist` when it publishes one, `restore` when a prefix match runs
//! past the blocks still in the pool. `disk.rs` is the file format.
//!
//! With a sliding-window class (V4) a record also carries the block's window-class rows (K=V
//! rows, compressor inputs) when they were still held, so a restored hit gets its lookback; a
//! hit whose lookback rows are neither in the window pool nor in a record is cut shorter.
//!
//! Guarantees: a block is keyed by two independent 64-bit chain hashes of its whole prefix and
//! verified against its own tokens before it is used, so a restored block holds exactly the KV
//! a recompute would write (the bytes as stored, every group and layer): outputs are bitwise the
//! same with and without the tier. The file is validated against the model's identity and the
//! cache layout (groups, dtypes, block size); a foreign, stale or corrupt file — or record — is
//! ignored with a log line (stderr) and counted, never trusted.

mod disk;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::error::Result;

use disk::DiskTier;

/// What the tier may hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    /// Host-memory budget in bytes (0: no memory tier; evicted blocks go straight to the file).
    pub mem_bytes: usize,
    /// Directory of the file tier (None: memory only; nothing survives the engine).
    pub dir: Option<PathBuf>,
    /// Largest the file may grow (bytes); blocks beyond it are dropped.
    pub disk_max_bytes: u64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            mem_bytes: 256 << 20,
            dir: None,
            disk_max_bytes: 8 << 30,
        }
    }
}

/// Counters of the tier (cumulative, except the two gauges).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks handed to the tier by pool evictions.
    pub offloaded_blocks: u64,
    pub offloaded_bytes: u64,
    /// Blocks copied back into the pool on a prefix hit.
    pub restored_blocks: u64,
    pub restored_bytes: u64,
    /// Blocks the tier could not keep (memory full and no room in the file, or no file).
    pub dropped_blocks: u64,
    /// Published blocks written through to the file.
    pub persisted_blocks: u64,
    /// Gauges: blocks held in memory / in the file now.
    pub mem_blocks: u64,
    pub disk_blocks: u64,
    /// Files ignored (foreign model, other layout, bad header) and records rejected (truncated,
    /// checksum, key or token mismatch).
    pub ignored_files: u64,
    pub rejected_records: u64,
}

/// A block's key: two independent chain hashes of every token up to and including it.
pub(crate) type TierKey = (u64, u64);

struct MemEntry {
    tokens: Vec<u32>,
    data: Vec<u8>,
    tick: u64,
}

/// The tier of one cache.
pub(crate) struct KvTier {
    block_bytes: usize,
    mem_cap: usize,
    mem: HashMap<TierKey, MemEntry>,
    /// tick -> key, oldest first.
    lru: BTreeMap<u64, TierKey>,
    tick: u64,
    disk: Option<DiskTier>,
    stats: TierStats,
}

impl std::fmt::Debug for KvTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTier")
            .field("block_bytes", &self.block_bytes)
            .field("stats", &self.stats)
            .finish()
    }
}

/// A line about the tier on stderr (files and records it will not trust).
pub(crate) fn note(msg: &str) {
    eprintln!("specmla: kv tier: {msg}");
}

impl KvTier {
    /// `identity`: the model's fingerprint; `layout`: the cache layout's. Blocks of
    /// `block_bytes` bytes holding `block_size` tokens.
    pub(crate) fn new(
        cfg: &TierConfig,
        identity: u64,
        layout: u64,
        block_size: usize,
        block_bytes: usize,
    ) -> Result<Self> {
        let mut stats = TierStats::default();
        let disk = match &cfg.dir {
            Some(d) => Some(DiskTier::open(
                d,
                identity,
                layout,
                block_size,
                block_bytes,
                cfg.disk_max_bytes,
                &mut stats,
            )?),
            None => None,
        };
        stats.disk_blocks = disk.as_ref().map_or(0, |d| d.len() as u64);
        Ok(KvTier {
            block_bytes,
            mem_cap: cfg.mem_bytes,
            mem: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            disk,
            stats,
        })
    }

    pub(crate) fn stats(&self) -> TierStats {
        self.stats.clone()
    }

    fn on_disk(&self, key: &TierKey) -> bool {
        self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    fn write_disk(&mut self, key: TierKey, tokens: &[u32], data: &[u8]) -> bool {
        let Some(d) = self.disk.as_mut() else {
            return false;
        };
        let ok = d.append(key, tokens, data);
        self.stats.disk_blocks = d.len() as u64;
        ok
    }

    /// A cached block the pool is evicting (`data`: its bytes, every group and layer).
    pub(crate) fn offload(&mut self, key: TierKey, tokens: &[u32], data: Vec<u8>) {
        debug_assert_eq!(data.len(), self.block_bytes);
        if self.mem.contains_key(&key) || self.on_disk(&key) {
            return; // already held (written through when it was published)
        }
        self.stats.offloaded_blocks += 1;
        self.stats.offloaded_bytes += data.len() as u64;
        if self.block_bytes > self.mem_cap {
            if !self.write_disk(key, tokens, &data) {
                self.stats.dropped_blocks += 1;
            }
            return;
        }
        while (self.mem.len() + 1) * self.block_bytes > self.mem_cap {
            let (_, old) = self
                .lru
                .pop_first()
                .expect("a full memory tier holds blocks");
            let e = self.mem.remove(&old).expect("lru entry");
            if !self.on_disk(&old) && !self.write_disk(old, &e.tokens, &e.data) {
                self.stats.dropped_blocks += 1;
            }
        }
        self.tick += 1;
        self.lru.insert(self.tick, key);
        self.mem.insert(
            key,
            MemEntry {
                tokens: tokens.to_vec(),
                data,
                tick: self.tick,
            },
        );
        self.stats.mem_blocks = self.mem.len() as u64;
    }

    /// A block just published to the prefix cache: written through to the file (no-op without
    /// one, or when the file already holds it).
    pub(crate) fn persist(&mut self, key: TierKey, tokens: &[u32], data: &[u8]) {
        if self.disk.is_some() && !self.on_disk(&key) && self.write_disk(key, tokens, data) {
            self.stats.persisted_blocks += 1;
        }
    }

    /// The bytes of the block with `key` whose tokens are `tokens`, if the tier holds it (from
    /// memory, else from the file, verified).
    pub(crate) fn restore(&mut self, key: TierKey, tokens: &[u32]) -> Option<Vec<u8>> {
        let data = match self.mem.get(&key) {
            Some(e) if e.tokens == tokens => {
                let e = self.mem.remove(&key).expect("present");
                self.lru.remove(&e.tick);
                self.stats.mem_blocks = self.mem.len() as u64;
                Some(e.data)
            }
            _ => self
                .disk
                .as_mut()
                .and_then(|d| d.read(key, tokens, &mut self.stats)),
        }?;
        self.stats.restored_blocks += 1;
        self.stats.restored_bytes += data.len() as u64;
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seed: u8, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
            .collect()
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("specmla-tier-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn memory_budget_spills_to_the_file_and_restores_verify_tokens() {
        let d = dir("spill");
        let cfg = TierConfig {
            mem_bytes: 2 * 64,
            dir: Some(d.clone()),
            disk_max_bytes: 1 << 20,
        };
        let mut t = KvTier::new(&cfg, 7, 9, 4, 64).unwrap();
        for i in 0..5u8 {
            t.offload((i as u64, 100 + i as u64), &[i as u32; 4], block(i, 64));
        }
        let s = t.stats();
        assert_eq!((s.offloaded_blocks, s.mem_blocks, s.disk_blocks), (5, 2, 3));
        for i in 0..5u8 {
            let key = (i as u64, 100 + i as u64);
            assert_eq!(t.restore(key, &[i as u32 + 1; 4]), None, "tokens differ");
            assert_eq!(
                t.restore(key, &[i as u32; 4]),
                Some(block(i, 64)),
                "block {i}"
            );
        }
        assert_eq!(t.stats().restored_blocks, 5);
        // a second tier on the same directory (a restart) sees the file's blocks
        drop(t);
        let mut t = KvTier::new(&cfg, 7, 9, 4, 64).unwrap();
        assert_eq!(t.stats().disk_blocks, 3);
        assert_eq!(t.restore((0, 100), &[0; 4]), Some(block(0, 64)));
        // another model writes its own file; another layout of this model: the file is ignored
        // (and started afresh), as is one whose header is garbage
        let t = KvTier::new(&cfg, 8, 9, 4, 64).unwrap();
        assert_eq!((t.stats().disk_blocks, t.stats().ignored_files), (0, 0));
        let t = KvTier::new(&cfg, 7, 10, 4, 64).unwrap();
        assert_eq!((t.stats().disk_blocks, t.stats().ignored_files), (0, 1));
        drop(t);
        std::fs::write(
            d.join(format!("specmla-kv-{:016x}.bin", 7)),
            b"not a tier file",
        )
        .unwrap();
        let t = KvTier::new(&cfg, 7, 9, 4, 64).unwrap();
        assert_eq!((t.stats().disk_blocks, t.stats().ignored_files), (0, 1));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn truncated_and_corrupt_records_are_cut_off() {
        let d = dir("cut");
        let cfg = TierConfig {
            mem_bytes: 0,
            dir: Some(d.clone()),
            disk_max_bytes: 1 << 20,
        };
        let mut t = KvTier::new(&cfg, 3, 4, 2, 32).unwrap();
        for i in 0..4u8 {
            t.persist((i as u64, 0), &[i as u32, 1], &block(i, 32));
        }
        assert_eq!(t.stats().persisted_blocks, 4);
        drop(t);
        let f = d.join(format!("specmla-kv-{:016x}.bin", 3));
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let mut t = KvTier::new(&cfg, 3, 4, 2, 32).unwrap();
        let s = t.stats();
        assert_eq!((s.disk_blocks, s.rejected_records), (3, 1));
        assert_eq!(t.restore((2, 0), &[2, 1]), Some(block(2, 32)));
        assert_eq!(t.restore((3, 0), &[3, 1]), None, "the truncated record");
        drop(t);
        // flip a byte inside the second record's payload
        let mut bytes = std::fs::read(&f).unwrap();
        let rec = 16 + 4 * 2 + 32 + 8;
        let at = bytes.len() - 2 * rec + 20;
        bytes[at] ^= 0x40;
        std::fs::write(&f, &bytes).unwrap();
        let t = KvTier::new(&cfg, 3, 4, 2, 32).unwrap();
        let s = t.stats();
        assert_eq!((s.disk_blocks, s.rejected_records), (1, 1));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn without_a_file_a_full_memory_tier_drops_its_oldest() {
        let cfg = TierConfig {
            mem_bytes: 100,
            dir: None,
            disk_max_bytes: 0,
        };
        let mut t = KvTier::new(&cfg, 1, 1, 2, 40).unwrap();
        for i in 0..4u64 {
            t.offload((i, i), &[1, 2], block(i as u8, 40));
        }
        let s = t.stats();
        assert_eq!((s.mem_blocks, s.dropped_blocks), (2, 2));
        assert!(t.restore((0, 0), &[1, 2]).is_none());
        assert!(t.restore((3, 3), &[1, 2]).is_some());
    }
}

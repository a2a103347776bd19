//! The file of the second KV tier: `DIR/specmla-kv-<identity>.bin`, a header naming the model
//! identity and cache layout, then fixed-size records appended one per block:
//! `[key.0 u64 | key.1 u64 | tokens u32 x block_size | block bytes | checksum u64]` (little
//! endian; the checksum covers everything before it).
//!
//! Guarantees: at open the file is memory-mapped and scanned; a header written for another model,
//! layout, block size or format version makes the whole file ignored (and started afresh), a
//! truncated or corrupt record ends the scan there (the tail is cut off). Every read checks the
//! record's checksum, key and tokens again, so nothing is trusted that does not verify.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{note, TierKey, TierStats};
use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"SPMLAKV\x01";
const VERSION: u32 = 1;
/// magic | version u32 | block_size u32 | block_bytes u64 | identity u64 | layout u64 | checksum u64
const HEADER: usize = 8 + 4 + 4 + 8 + 8 + 8 + 8;

/// A 64-bit checksum (splitmix64 over 8-byte words, length mixed in).
fn checksum(b: &[u8]) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut h = mix(b.len() as u64 ^ 0x6b76_7469_6572);
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        h = mix(h ^ u64::from_le_bytes(w.try_into().unwrap()));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix(h ^ u64::from_le_bytes(tail))
}

fn header(block_size: usize, block_bytes: usize, identity: u64, layout: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(block_size as u32).to_le_bytes());
    h.extend_from_slice(&(block_bytes as u64).to_le_bytes());
    h.extend_from_slice(&identity.to_le_bytes());
    h.extend_from_slice(&layout.to_le_bytes());
    let c = checksum(&h);
    h.extend_from_slice(&c.to_le_bytes());
    h
}

pub(super) struct DiskTier {
    path: PathBuf,
    file: File,
    /// key -> record offset
    index: HashMap<TierKey, u64>,
    end: u64,
    block_size: usize,
    block_bytes: usize,
    max_bytes: u64,
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl DiskTier {
    fn record_len(&self) -> usize {
        16 + 4 * self.block_size + self.block_bytes + 8
    }

    pub(super) fn open(
        dir: &Path,
        identity: u64,
        layout: u64,
        block_size: usize,
        block_bytes: usize,
        max_bytes: u64,
        stats: &mut TierStats,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(format!("specmla-kv-{identity:016x}.bin"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let mut t = DiskTier {
            path,
            file,
            index: HashMap::new(),
            end: HEADER as u64,
            block_size,
            block_bytes,
            max_bytes,
        };
        let want = header(block_size, block_bytes, identity, layout);
        let len = t.file.metadata().map_err(|e| io(&t.path, e))?.len();
        if len == 0 {
            t.start_afresh(&want)?;
            return Ok(t);
        }
        // SAFETY: the map is read-only and dropped before this function returns; the file is
        // ours (a concurrent writer could only make the scan reject records, which it checks).
        let map = unsafe { memmap2::Mmap::map(&t.file) }.map_err(|e| io(&t.path, e))?;
        if map.len() < HEADER || map[..HEADER] != want[..] {
            note(&format!(
                "ignoring {}: written for another model, cache layout or format",
                t.path.display()
            ));
            stats.ignored_files += 1;
            drop(map);
            t.start_afresh(&want)?;
            return Ok(t);
        }
        let rec = t.record_len();
        let mut off = HEADER;
        while off < map.len() {
            let r = match map.get(off..off + rec) {
                Some(r) => r,
                None => {
                    note(&format!(
                        "{}: truncated record at byte {off}, dropping the tail",
                        t.path.display()
                    ));
                    stats.rejected_records += 1;
                    break;
                }
            };
            let (body, sum) = r.split_at(rec - 8);
            if checksum(body) != u64::from_le_bytes(sum.try_into().unwrap()) {
                note(&format!(
                    "{}: corrupt record at byte {off}, dropping it and the rest",
                    t.path.display()
                ));
                stats.rejected_records += 1;
                break;
            }
            let k0 = u64::from_le_bytes(body[..8].try_into().unwrap());
            let k1 = u64::from_le_bytes(body[8..16].try_into().unwrap());
            t.index.insert((k0, k1), off as u64);
            off += rec;
        }
        drop(map);
        t.end = off as u64;
        if t.end < len {
            t.file.set_len(t.end).map_err(|e| io(&t.path, e))?;
        }
        Ok(t)
    }

    fn start_afresh(&mut self, want: &[u8]) -> Result<()> {
        self.file.set_len(0).map_err(|e| io(&self.path, e))?;
        self.file
            .write_all_at(want, 0)
            .map_err(|e| io(&self.path, e))?;
        self.index.clear();
        self.end = HEADER as u64;
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn contains(&self, key: &TierKey) -> bool {
        self.index.contains_key(key)
    }

    /// Append a block; false when the file is full or the write failed (the block is not kept).
    pub(super) fn append(&mut self, key: TierKey, tokens: &[u32], data: &[u8]) -> bool {
        if self.index.contains_key(&key) {
            return true;
        }
        let rec = self.record_len();
        if tokens.len() != self.block_size
            || data.len() != self.block_bytes
            || self.end + rec as u64 > self.max_bytes
        {
            return false;
        }
        let mut r = Vec::with_capacity(rec);
        r.extend_from_slice(&key.0.to_le_bytes());
        r.extend_from_slice(&key.1.to_le_bytes());
        for t in tokens {
            r.extend_from_slice(&t.to_le_bytes());
        }
        r.extend_from_slice(data);
        let c = checksum(&r);
        r.extend_from_slice(&c.to_le_bytes());
        if let Err(e) = self.file.write_all_at(&r, self.end) {
            note(&format!(
                "{}: write failed ({e}); block not kept",
                self.path.display()
            ));
            return false;
        }
        self.index.insert(key, self.end);
        self.end += rec as u64;
        true
    }

    /// The block with `key` and `tokens`, verified; a record that does not verify is forgotten.
    pub(super) fn read(
        &mut self,
        key: TierKey,
        tokens: &[u32],
        stats: &mut TierStats,
    ) -> Option<Vec<u8>> {
        let &off = self.index.get(&key)?;
        let rec = self.record_len();
        let mut r = vec![0u8; rec];
        let ok = self.file.read_exact_at(&mut r, off).is_ok() && {
            let (body, sum) = r.split_at(rec - 8);
            checksum(body) == u64::from_le_bytes(sum.try_into().unwrap())
                && body[..8] == key.0.to_le_bytes()
                && body[8..16] == key.1.to_le_bytes()
        };
        let toks_ok = ok
            && r[16..16 + 4 * self.block_size]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .eq(tokens.iter().copied());
        if !toks_ok {
            if !ok {
                note(&format!(
                    "{}: record at byte {off} no longer verifies; not used",
                    self.path.display()
                ));
                stats.rejected_records += 1;
                self.index.remove(&key);
            }
            return None;
        }
        let start = 16 + 4 * self.block_size;
        r.truncate(start + self.block_bytes);
        Some(r.split_off(start))
    }
}

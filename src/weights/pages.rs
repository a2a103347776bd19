//! How the mapped weights sit in memory: resident bytes of a checkpoint's file mappings and how
//! many of them the kernel maps with 2 MB pages (PMD mappings of 2 MB page-cache folios).
//!
//! Sits beside `safetensors_store` (which maps the files, advised `MADV_HUGEPAGE`) and is read by
//! the benchmarks: a memory-bound decode streams its weights faster through 2 MB pages (fewer
//! TLB misses, docs/BENCHMARKS.md "Weights in huge pages"), and whether a mapping gets them
//! depends on the page cache, not on the engine: folios created by readahead of a mapping are
//! 2 MB where the filesystem supports large folios, while pages cached earlier in small folios
//! (a file just written, or read by a tool that made small ones) stay small until evicted. Two
//! engines compared on the same machine can thus read the same bytes through different page
//! sizes; the bench prints this report so a comparison states it.
//!
//! Guarantee: read-only (parses `/proc/self/smaps`); `None` where that file does not exist.
//! [`drop_from_page_cache`] (for the tools that write checkpoints) changes no byte of a file.

use std::path::Path;

/// Resident bytes of the mappings of files under one directory, and how many of them are mapped
/// with 2 MB pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedPages {
    /// Mappings of files under the directory.
    pub mappings: usize,
    /// Their resident bytes (`Rss`).
    pub resident_bytes: u64,
    /// Of those, bytes mapped by 2 MB pages (`FilePmdMapped` + `AnonHugePages`).
    pub huge_bytes: u64,
}

impl MappedPages {
    /// Share of the resident bytes in 2 MB pages (0 when nothing is resident).
    pub fn huge_fraction(&self) -> f64 {
        if self.resident_bytes == 0 {
            0.0
        } else {
            self.huge_bytes as f64 / self.resident_bytes as f64
        }
    }
}

/// The report for this process's mappings of files under `dir` (`None` without
/// `/proc/self/smaps`, i.e. off Linux).
pub fn mapped_pages_under(dir: &Path) -> Option<MappedPages> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Some(parse_smaps(&smaps, &dir.display().to_string()))
}

/// Write `path` back to disk and drop its pages from the page cache (`fsync`, then
/// `posix_fadvise(POSIX_FADV_DONTNEED)`; elsewhere than Linux only the `fsync`), so that the next
/// process to map it reads it afresh — with the loader's `MADV_HUGEPAGE` advice, into 2 MB
/// folios where the filesystem supports them. For files this process just wrote (the widened
/// and quantised checkpoints): a write leaves them cached in the folios the write made, which
/// stay until evicted. Measured (AMD EPYC Zen 4 guest, 6.18 kernel, ext4; docs/BENCHMARKS.md
/// "A written checkpoint dropped from the page cache"): a widened target mapped right after
/// `make-bench-model` 32.7 % in 2 MB pages, the same files dropped and mapped 93.4 %. Only clean
/// pages can be dropped, hence the `fsync` first; a page another process has mapped stays.
pub fn drop_from_page_cache(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    f.sync_all()?;
    #[cfg(target_os = "linux")]
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// Sum the mappings of `smaps` whose file path starts with `prefix` followed by `/`.
fn parse_smaps(smaps: &str, prefix: &str) -> MappedPages {
    let prefix = format!("{}/", prefix.trim_end_matches('/'));
    let mut r = MappedPages::default();
    let mut inside = false;
    for line in smaps.lines() {
        if is_mapping_header(line) {
            // address perms offset dev inode [path]: the fields before the path hold no '/'.
            inside = line
                .find('/')
                .is_some_and(|i| line[i..].starts_with(&prefix));
            r.mappings += inside as usize;
            continue;
        }
        if !inside {
            continue;
        }
        let kb = |name: &str| -> Option<u64> {
            let rest = line.strip_prefix(name)?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        };
        if let Some(v) = kb("Rss:") {
            r.resident_bytes += v * 1024;
        } else if let Some(v) = kb("FilePmdMapped:").or_else(|| kb("AnonHugePages:")) {
            r.huge_bytes += v * 1024;
        }
    }
    r
}

/// `7f43b4800000-7f43b4c17000 r--s 00000000 fd:00 1234 /path`: a range of hex digits first.
fn is_mapping_header(line: &str) -> bool {
    let first = line.split_whitespace().next().unwrap_or("");
    match first.split_once('-') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_hexdigit())
                && b.bytes().all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f43b4800000-7f43b4c17000 r--s 00000000 fd:00 11 /m/dir/model-1.safetensors
Size:               4188 kB
Rss:                4096 kB
FilePmdMapped:      2048 kB
AnonHugePages:         0 kB
7f43b5000000-7f43b5400000 r--s 00000000 fd:00 12 /m/dir2/other.safetensors
Rss:                4096 kB
FilePmdMapped:      4096 kB
7f43b6000000-7f43b6400000 r--s 00000000 fd:00 13 /m/dir/model-2.safetensors
Rss:                1024 kB
FilePmdMapped:         0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
Rss:                  12 kB
";

    /// Only the mappings under the directory count (not a sibling whose name extends it), and
    /// the sums are in bytes.
    #[test]
    fn sums_the_mappings_under_the_directory() {
        let r = parse_smaps(SMAPS, "/m/dir");
        assert_eq!(r.mappings, 2);
        assert_eq!(r.resident_bytes, 5120 * 1024);
        assert_eq!(r.huge_bytes, 2048 * 1024);
        assert!((r.huge_fraction() - 0.4).abs() < 1e-12);
        assert_eq!(parse_smaps(SMAPS, "/m/dir/").mappings, 2);
        assert_eq!(parse_smaps(SMAPS, "/nowhere"), MappedPages::default());
        assert_eq!(MappedPages::default().huge_fraction(), 0.0);
    }

    /// Dropping a written file from the page cache changes none of its bytes (read back through
    /// a new mapping and through `read`), twice in a row; a missing file is an error.
    #[test]
    fn dropping_a_file_from_the_cache_keeps_its_bytes() {
        let dir = std::env::temp_dir().join(format!("specmla-drop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("w.bin");
        let bytes: Vec<u8> = (0..(3u32 << 20) + 123)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&p, &bytes).unwrap();
        for _ in 0..2 {
            drop_from_page_cache(&p).unwrap();
            let f = std::fs::File::open(&p).unwrap();
            // SAFETY: a private read-only map of a file this test owns and does not change.
            let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            assert!(m[..] == bytes[..]);
            assert_eq!(std::fs::read(&p).unwrap(), bytes);
        }
        assert!(drop_from_page_cache(&dir.join("missing.bin")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// This process's own mapping of a file is found (Linux), with its resident bytes.
    #[test]
    fn finds_a_mapping_of_this_process() {
        if !Path::new("/proc/self/smaps").exists() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("specmla-pages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("w.bin");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: a private read-only map of a file this test owns and does not change.
        let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let touched: u64 = m.iter().step_by(4096).map(|&b| b as u64).sum();
        assert_eq!(touched, 7 * 256);
        let r = mapped_pages_under(&dir).unwrap();
        assert_eq!(r.mappings, 1);
        assert_eq!(r.resident_bytes, 1 << 20);
        assert!(r.huge_bytes <= r.resident_bytes);
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The CPU's cache sizes, read once from Linux sysfs (`/sys/devices/system/cpu/cpu0/cache`).
//!
//! Sits beside the kernels as a fact they may be told about: model loading asks for the
//! last-level cache to decide whether a model's weights will stay cached between forwards
//! (`Matrix::cache_resident`), which picks among kernels that compute the same bits.
//!
//! Guarantee: never fails; `None` where the sizes cannot be read (other OSes, containers that
//! hide sysfs), in which case callers keep their DRAM-streaming defaults.

use std::sync::OnceLock;

/// Bytes of the largest-level data or unified cache cpu0 sees (the L3 of a CCX / socket on
/// x86), or None when sysfs does not say.
pub fn last_level_cache_bytes() -> Option<usize> {
    static LLC: OnceLock<Option<usize>> = OnceLock::new();
    *LLC.get_or_init(read_llc)
}

fn read_llc() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Some(bytes)) = (level.trim().parse::<u32>(), parse_size(size.trim()))
        else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, b)| b)
}

/// Whether weights of `bytes` stay in the last-level cache between uses: at most a quarter of
/// it (the rest is left to the other model of a speculative pair, the KV cache and the
/// activations). The bundled draft (4.3 MB) does on a 32 MB L3; a target streaming its weights
/// from DRAM every step does not. Model loading marks such a model's matrices
/// `Matrix::cache_resident` and reads its files into huge pages; neither changes a result.
pub fn stays_cached(bytes: u64) -> bool {
    fits_cache(bytes, last_level_cache_bytes())
}

/// [`stays_cached`] for a last-level cache of `llc` bytes (None: unknown, so no).
fn fits_cache(bytes: u64, llc: Option<usize>) -> bool {
    llc.is_some_and(|llc| bytes.saturating_mul(4) <= llc as u64)
}

/// sysfs cache sizes: "32768K", "1M", or plain bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

#[cfg(test)]
mod tests {
    use super::{fits_cache, parse_size};

    #[test]
    fn only_weights_well_inside_the_last_level_cache_count_as_cached() {
        let l3 = 32 << 20;
        assert!(
            fits_cache(4_279_984, Some(l3)),
            "the bundled draft on a 32 MB L3"
        );
        assert!(fits_cache(8 << 20, Some(l3)), "a quarter of it");
        assert!(!fits_cache((8 << 20) + 1, Some(l3)));
        assert!(!fits_cache(88_916_552, Some(l3)), "the bundled target");
        assert!(
            !fits_cache(4_279_984, None),
            "unknown cache: stream from DRAM"
        );
        assert!(
            !fits_cache(u64::MAX / 2, Some(usize::MAX / 2)),
            "no overflow"
        );
    }

    #[test]
    fn sysfs_sizes_parse() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("12x"), None);
    }
}

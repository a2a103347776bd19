//! Where packed weight copies live: the bf16 strips of [`super::Matrix::into_strips`] are
//! written into anonymous mappings advised `MADV_HUGEPAGE`, so a memory-bound decode streams
//! them through 2 MB pages (fewer TLB misses) as it streams mapped checkpoints advised the same
//! way (`weights::safetensors_store`), instead of through the 4 KB pages of the heap.
//!
//! Sits under `kernels::matrix` (its only caller). A process-wide bump allocator hands out
//! 64-byte-aligned regions of 64 MB chunks (a region larger than a quarter chunk gets a mapping
//! of its own), never handing out a byte twice; a chunk lives while any region in it does (each
//! region's [`WeightBuf`] holds it), and the allocator keeps only a weak handle to the chunk it
//! fills, so dropping a model frees its chunks. Memory: pages are committed when first written,
//! so a chunk's unused tail costs at most one 2 MB page; a region dropped while its chunk lives
//! on (a swapped-out draft model beside the target's matrices) returns its whole pages to the
//! system (`MADV_DONTNEED`: never read again, as its bytes are never handed out again).
//!
//! Guarantee: a region holds exactly the words its `fill` wrote, like the heap copy it replaces
//! (the page size changes no value); where the mapping or the advice is refused the region is
//! in ordinary pages or, failing the mapping, on the heap. `SPECMLA_PACKED_PAGES=4k` keeps
//! every packed copy on the heap (4 KB pages: for A/B measurements), read once per process.

use std::sync::{Arc, Mutex, Weak};

use super::aligned::AlignedBuf;
use super::matrix::WeightBuf;

const HUGE: usize = 2 << 20;
const CHUNK: usize = 64 << 20;
/// Regions start on cache lines (the kernels' 256- and 512-bit loads never split one).
const ALIGN: usize = 64;

/// One anonymous mapping; `base` is its first 2 MB boundary, `cap` bytes from there usable.
struct Chunk {
    _map: memmap2::MmapMut,
    base: *mut u8,
    cap: usize,
}

// SAFETY: the chunk's bytes are written only through disjoint regions, each by the one caller
// that allocated it, before the region is shared; afterwards they are read-only. The pointer is
// into `_map`, which the chunk owns and never moves.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A mapping with `cap` usable bytes from a 2 MB boundary, advised huge pages.
    fn new(cap: usize) -> Option<Arc<Chunk>> {
        let mut map = memmap2::MmapMut::map_anon(cap + HUGE).ok()?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage); // refused: ordinary pages, same bytes
        let off = (HUGE - map.as_ptr() as usize % HUGE) % HUGE;
        // SAFETY: off < HUGE, so base .. base + cap lies inside the cap + HUGE bytes mapped.
        let base = unsafe { map.as_mut_ptr().add(off) };
        Some(Arc::new(Chunk {
            _map: map,
            base,
            cap,
        }))
    }
}

/// One handed-out region: `bytes` bytes at `start` from the start of `chunk`'s mapping.
struct Region {
    chunk: Arc<Chunk>,
    start: usize,
    bytes: usize,
}

impl Drop for Region {
    fn drop(&mut self) {
        const PAGE: usize = 4096;
        let (a, b) = (
            self.start.next_multiple_of(PAGE),
            (self.start + self.bytes) / PAGE * PAGE,
        );
        if a < b {
            // SAFETY: [a, b) lies inside this region (page-aligned inward), which no other
            // region shares and nothing reads after its last WeightBuf (the owner of this
            // Region) dropped; MADV_DONTNEED on private anonymous memory only frees the pages.
            #[cfg(unix)]
            let _ = unsafe {
                self.chunk
                    ._map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
            };
        }
    }
}

/// The chunk being filled and its first free byte.
struct Arena {
    chunk: Weak<Chunk>,
    used: usize,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    chunk: Weak::new(),
    used: 0,
});

/// `bytes` bytes (a multiple of [`ALIGN`]) at a line boundary, never handed out before, and
/// their start. `None` where no mapping could be made.
fn region(bytes: usize) -> Option<(Region, *mut u8)> {
    let at = |chunk: Arc<Chunk>, used: usize| {
        // SAFETY: used + bytes <= cap (checked by the callers), inside the mapping.
        let p = unsafe { chunk.base.add(used) };
        let start = p as usize - chunk._map.as_ptr() as usize;
        (
            Region {
                chunk,
                start,
                bytes,
            },
            p,
        )
    };
    if bytes > CHUNK / 4 {
        return Some(at(Chunk::new(bytes.next_multiple_of(HUGE))?, 0));
    }
    let mut a = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    let chunk = match a.chunk.upgrade() {
        Some(c) if a.used + bytes <= c.cap => c,
        _ => {
            let c = Chunk::new(CHUNK)?;
            a.chunk = Arc::downgrade(&c);
            a.used = 0;
            c
        }
    };
    // used + bytes <= cap: checked, or a fresh chunk with bytes <= CHUNK / 4 <= cap
    let r = at(chunk, a.used);
    a.used += bytes;
    Some(r)
}

/// Whether the bf16 matrices models load in this process are packed into strips
/// ([`super::strips_by_default`]) whose copies go to huge-page mappings ([`in_huge_pages`]).
pub fn strips_in_huge_pages() -> bool {
    super::strips_by_default() && in_huge_pages()
}

/// Whether packed copies go to huge-page mappings (not `SPECMLA_PACKED_PAGES=4k`).
fn in_huge_pages() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SPECMLA_PACKED_PAGES").as_deref() != Ok("4k"))
}

/// `len` u16 words written by `fill` (handed the zeroed region), in 2 MB pages where the
/// kernel offers them ([`in_huge_pages`]); on the heap otherwise or where no mapping could be
/// made.
pub(crate) fn packed_u16(len: usize, fill: impl FnOnce(&mut [u16])) -> WeightBuf<u16> {
    let bytes = (len * 2).next_multiple_of(ALIGN).max(ALIGN);
    let region = if in_huge_pages() { region(bytes) } else { None };
    let Some((region, p)) = region else {
        let mut buf = AlignedBuf::default();
        fill(buf.reuse_u16(len));
        let owner = Arc::new(buf);
        let ptr = owner.as_u16().as_ptr();
        // SAFETY: `ptr` starts `len` initialised words of the buffer `owner` keeps alive, which
        // nothing mutates after this point.
        return unsafe { WeightBuf::borrowed(owner, ptr, len) };
    };
    let w = p as *mut u16;
    // SAFETY: the region is `bytes >= 2 * len` bytes inside the chunk, handed out once (so no
    // other reference to it exists), line-aligned (so u16-aligned), and zero-initialised by the
    // anonymous mapping.
    fill(unsafe { std::slice::from_raw_parts_mut(w, len) });
    // SAFETY: `w` starts `len` initialised words that the region (holding its chunk) keeps
    // alive; after `fill` nothing writes them again.
    unsafe { WeightBuf::borrowed(Arc::new(region), w as *const u16, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions hold what was written, do not overlap, and survive the others' drops.
    #[test]
    fn regions_hold_their_words_apart() {
        let sizes = [
            1usize,
            31,
            32,
            33,
            1000,
            5 << 20,
            (CHUNK / 4) / 2 + 1,
            9 << 20,
        ];
        let mut bufs: Vec<WeightBuf<u16>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                packed_u16(n, |out| {
                    assert!(out.iter().all(|&v| v == 0), "a fresh region is zeroed");
                    for (j, v) in out.iter_mut().enumerate() {
                        *v = (i * 7919 + j) as u16;
                    }
                })
            })
            .collect();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(b.len(), sizes[i]);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert!(b
                .iter()
                .enumerate()
                .all(|(j, &v)| v == (i * 7919 + j) as u16));
        }
        // drop every other one; the rest keep their words
        let kept: Vec<_> = bufs
            .drain(..)
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .collect();
        for (i, b) in &kept {
            assert!(b
                .iter()
                .enumerate()
                .all(|(j, &v)| v == (i * 7919 + j) as u16));
        }
    }
}

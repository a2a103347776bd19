//! Memory-mapped safetensors checkpoints: one file, a sharded directory, or in-memory bytes (one
//! file, or an index with its shards: [`WeightStore::open_index_bytes`]).
//!
//! Data flow: model directory -> [`WeightStore`] (mmaps + a name index) -> `weights::loader`
//! (checked, typed zero-copy views; the mapping outlives the store while a model uses it) -> `model`. Guarantees: every header is fully validated when the store
//! is opened (length, UTF-8, JSON, dtypes, offsets contiguous and inside the file, byte sizes equal
//! to `numel * dtype size`), so [`WeightStore::get`] never reads out of bounds; a malformed file is
//! an `Error::Safetensors { path, msg }`, never a panic. Files are mapped (advised `MADV_HUGEPAGE`:
//! 2 MB pages where the page cache can give them), not read into memory —
//! unless [`set_huge_page_weights`] asked for weights in huge pages: then each file is read once
//! into an anonymous mapping advised `MADV_HUGEPAGE` (2 MB-aligned; the same bytes, so the same
//! tensors and alignments), trading a slower load for fewer TLB misses while the kernels stream
//! the weights (docs/BENCHMARKS.md "Weights in huge pages"). Where the loader packs bf16
//! matrices into strips (the `avx2` level) a file that is mostly such matrices stays mapped
//! whatever was asked: the packed copies live in huge pages (`kernels::packed_pages`), and a
//! copy of the file would keep a second copy of those bytes resident.

use std::any::Any;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::SafeTensorError;
use safetensors::SafeTensors;

use super::dtype::DType;
use crate::error::{Error, Result};

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum WeightSource {
    /// A model directory: `model.safetensors.index.json` (sharded) if present, else
    /// `model.safetensors`, else every `*.safetensors` in name order.
    Dir(PathBuf),
    /// A single `.safetensors` file.
    File(PathBuf),
    /// The bytes of one safetensors file (tests, embedding hosts).
    Bytes(Vec<u8>),
}

/// A borrowed view of one stored tensor (raw little-endian bytes, row-major, no alignment).
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    /// `numel * dtype size` bytes.
    pub data: &'a [u8],
    /// Keeps `data`'s memory (the shard's mapping or buffer) alive beyond the store's borrow:
    /// the loader hands it to zero-copy weight buffers.
    pub(crate) owner: Arc<dyn Any + Send + Sync>,
}

enum Backing {
    Mmap(Mmap),
    Bytes(Vec<u8>),
    /// A file's bytes copied into an anonymous (huge-page advised) mapping at `off`.
    HugePages {
        map: Mmap,
        off: usize,
        len: usize,
    },
}

/// Whether files opened from now on are copied into huge pages (see the module doc).
static HUGE_PAGE_WEIGHTS: AtomicBool = AtomicBool::new(false);

/// Process-wide default: load the weights of stores opened after this call into huge pages (`true`:
/// read each file into an anonymous mapping advised `MADV_HUGEPAGE`; Linux only, elsewhere
/// and where the kernel refuses the advice the copy still works, in ordinary pages) or map
/// the files (`false`, the default: zero-copy, no load-time copy). Results never change. An
/// engine asks for huge pages for its own weights with `EngineConfig::huge_page_weights`
/// (C ABI `huge_page_weights`) whatever this says ([`WeightStore::open_with`]).
pub fn set_huge_page_weights(on: bool) {
    HUGE_PAGE_WEIGHTS.store(on, Ordering::Relaxed);
}

/// The setting of [`set_huge_page_weights`].
pub fn huge_page_weights() -> bool {
    HUGE_PAGE_WEIGHTS.load(Ordering::Relaxed)
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
            Backing::HugePages { map, off, len } => &map[*off..*off + *len],
        }
    }
}

struct Shard {
    /// For error messages.
    path: String,
    /// Shared with every zero-copy weight buffer that borrows from this shard.
    backing: Arc<Backing>,
}

impl Shard {
    fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }
}

struct Entry {
    shard: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte range in the shard (validated against its length at open).
    start: usize,
    end: usize,
}

/// All tensors of a checkpoint, by name. Owns the mappings; views borrow from it.
pub struct WeightStore {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Entry>,
    total_bytes: usize,
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore")
            .field(
                "shards",
                &self
                    .shards
                    .iter()
                    .map(|s| s.path.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .field("total_bytes", &self.total_bytes)
            .finish()
    }
}

fn st_err(path: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::Safetensors {
        path: path.into(),
        msg: msg.into(),
    }
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl WeightStore {
    /// Open `source` with the process-wide page choice ([`set_huge_page_weights`]).
    pub fn open(source: WeightSource) -> Result<Self> {
        Self::open_with(source, huge_page_weights())
    }

    /// Open `source`, reading its files into huge pages when `huge_pages` (see the module
    /// doc) and mapping them otherwise, whatever the process-wide setting: how an engine
    /// created with `EngineConfig::huge_page_weights` loads its target and drafters without
    /// changing how other engines of the process load theirs. In-memory bytes stay where they
    /// are either way.
    pub fn open_with(source: WeightSource, huge_pages: bool) -> Result<Self> {
        match source {
            WeightSource::Dir(d) => Self::open_dir_with(&d, huge_pages),
            WeightSource::File(p) => {
                let mut s = Self::empty();
                let copy = huge_pages || stays_cached(std::slice::from_ref(&p))?;
                s.add_shard(map_file(&p, copy)?)?;
                Ok(s)
            }
            WeightSource::Bytes(b) => {
                let mut s = Self::empty();
                s.add_shard(Shard {
                    path: "<bytes>".into(),
                    backing: Arc::new(Backing::Bytes(b)),
                })?;
                Ok(s)
            }
        }
    }

    /// Open a model directory (see [`WeightSource::Dir`]) with the process-wide page choice.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        Self::open_dir_with(dir, huge_page_weights())
    }

    fn open_dir_with(dir: &Path, huge_pages: bool) -> Result<Self> {
        let entries = std::fs::read_dir(dir).map_err(|e| io_err(dir, e))?;
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            return Self::open_index(dir, &index, huge_pages);
        }
        let single = dir.join("model.safetensors");
        let mut files = if single.is_file() {
            vec![single]
        } else {
            let mut v = Vec::new();
            for e in entries {
                let p = e.map_err(|e| io_err(dir, e))?.path();
                if p.is_file() && p.extension().is_some_and(|x| x == "safetensors") {
                    v.push(p);
                }
            }
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(st_err(
                dir.display().to_string(),
                "no model.safetensors.index.json, model.safetensors or *.safetensors file",
            ));
        }
        let copy = huge_pages || stays_cached(&files)?;
        let mut s = Self::empty();
        for f in files.drain(..) {
            s.add_shard(map_file(&f, copy)?)?;
        }
        Ok(s)
    }

    fn open_index(dir: &Path, index: &Path, huge_pages: bool) -> Result<Self> {
        let text = std::fs::read(index).map_err(|e| io_err(index, e))?;
        let ipath = index.display().to_string();
        let by_shard = parse_index(&ipath, &text)?;
        // the shards the index names that exist (a missing one is refused below, by name)
        let files: Vec<PathBuf> = by_shard
            .keys()
            .map(|f| dir.join(f))
            .filter(|p| p.is_file())
            .collect();
        let copy = huge_pages || stays_cached(&files)?;
        Self::from_index(&ipath, &by_shard, |file| {
            let p = dir.join(file);
            if p.is_file() {
                map_file(&p, copy).map(Some)
            } else {
                Ok(None)
            }
        })
    }

    /// Open a sharded checkpoint held in memory: the text of `model.safetensors.index.json`
    /// and the shard files by name (tests, fuzzing, embedding hosts). Validated exactly like
    /// [`WeightSource::Dir`] with an index.
    pub fn open_index_bytes(index: &[u8], shards: Vec<(String, Vec<u8>)>) -> Result<Self> {
        let mut shards: BTreeMap<String, Vec<u8>> = shards.into_iter().collect();
        let ipath = "<index bytes>";
        Self::from_index(ipath, &parse_index(ipath, index)?, |file| {
            Ok(shards.remove(file).map(|b| Shard {
                path: format!("<bytes {file}>"),
                backing: Arc::new(Backing::Bytes(b)),
            }))
        })
    }

    /// The shared body of both index paths: open each shard of the parsed index
    /// ([`parse_index`]; `ipath` names it in errors) once through `open_shard` (`Ok(None)`: no
    /// such file) and check that every tensor the index places in a shard is stored there.
    fn from_index(
        ipath: &str,
        by_shard: &BTreeMap<String, Vec<String>>,
        mut open_shard: impl FnMut(&str) -> Result<Option<Shard>>,
    ) -> Result<Self> {
        let mut s = Self::empty();
        for (file, names) in by_shard {
            let Some(shard) = open_shard(file)? else {
                return Err(st_err(
                    ipath,
                    format!("shard {file:?} named in weight_map does not exist"),
                ));
            };
            let shard_idx = s.shards.len();
            let shard_path = shard.path.clone();
            s.add_shard(shard)?;
            for n in names {
                if s.tensors.get(n.as_str()).map(|e| e.shard) != Some(shard_idx) {
                    return Err(st_err(
                        &shard_path,
                        format!("tensor `{n}` listed in the index is not in this shard"),
                    ));
                }
            }
        }
        Ok(s)
    }

    fn empty() -> Self {
        WeightStore {
            shards: Vec::new(),
            tensors: BTreeMap::new(),
            total_bytes: 0,
        }
    }

    /// Validate a shard's header and index its tensors.
    fn add_shard(&mut self, shard: Shard) -> Result<()> {
        let idx = self.shards.len();
        let bytes = shard.bytes();
        let path = shard.path.as_str();
        let len = bytes.len();
        if len < 8 {
            return Err(st_err(
                path,
                format!("truncated: {len} bytes, shorter than the 8-byte header length"),
            ));
        }
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        if n > (len - 8) as u64 {
            return Err(st_err(
                path,
                format!("header length {n} runs past the end of the file ({len} bytes)"),
            ));
        }
        let (n, meta) = SafeTensors::read_metadata(bytes).map_err(|e| st_err(path, describe(e)))?;
        let base = 8 + n;
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            let (start, end) = match (base.checked_add(s), base.checked_add(e)) {
                (Some(a), Some(b)) if a <= b && b <= len => (a, b),
                _ => {
                    return Err(st_err(
                        path,
                        format!("tensor `{name}`: data offsets out of range"),
                    ))
                }
            };
            if self.tensors.contains_key(&name) {
                return Err(st_err(
                    path,
                    format!("tensor `{name}` also appears in another shard"),
                ));
            }
            self.total_bytes += end - start;
            let entry = Entry {
                shard: idx,
                dtype: DType::from_safetensors(info.dtype),
                shape: info.shape.clone(),
                start,
                end,
            };
            self.tensors.insert(name, entry);
        }
        self.shards.push(shard);
        Ok(())
    }

    /// The tensor called `name`, if stored.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let (k, e) = self.tensors.get_key_value(name)?;
        let shard = &self.shards[e.shard];
        let data = &shard.bytes()[e.start..e.end];
        let owner: Arc<dyn Any + Send + Sync> = shard.backing.clone();
        Some(TensorView {
            name: k.as_str(),
            dtype: e.dtype.clone(),
            shape: &e.shape,
            data,
            owner,
        })
    }

    /// Drop this process's mapping of the pages inside `view` (a tensor copied elsewhere at load,
    /// such as a bf16 matrix packed into strips): without it, the pages the copy read stay in
    /// the resident set beside the copy. Only for mapped files — a later read faults the same
    /// bytes back in from the file; copied backings are left alone. Never changes a value.
    pub fn release_pages(view: &TensorView<'_>) {
        const PAGE: usize = 4096;
        #[cfg(unix)]
        if let Some(Backing::Mmap(m)) = view.owner.downcast_ref::<Backing>() {
            let base = m.as_ptr() as usize;
            let (a, b) = (
                view.data.as_ptr() as usize,
                view.data.as_ptr() as usize + view.data.len(),
            );
            let (a, b) = (a.next_multiple_of(PAGE), b / PAGE * PAGE);
            if a < b && a >= base && b <= base + m.len() {
                // SAFETY: a read-only private mapping of a file the engine treats as immutable:
                // MADV_DONTNEED only unmaps its pages, and the next read of them faults the same
                // file bytes back in; the range lies inside the mapping (checked above).
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a - base, b - a)
                };
            }
        }
        let _ = (PAGE, view);
    }

    /// Every stored tensor name, in sorted order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|k| k.as_str())
    }

    /// Number of stored tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Sum of all tensors' data bytes (headers excluded).
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }
}

/// A `model.safetensors.index.json` (`ipath` names it in errors): shard file name -> the tensors
/// its `weight_map` places in it; every file name plain (no directory part), the map not empty.
fn parse_index(ipath: &str, text: &[u8]) -> Result<BTreeMap<String, Vec<String>>> {
    let text =
        std::str::from_utf8(text).map_err(|e| st_err(ipath, format!("index is not UTF-8: {e}")))?;
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| st_err(ipath, format!("invalid JSON: {e}")))?;
    let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(st_err(ipath, "missing `weight_map` object"));
    };
    let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, file) in map {
        let Some(file) = file.as_str() else {
            return Err(st_err(
                ipath,
                format!("weight_map[`{name}`] is not a file name"),
            ));
        };
        let plain = Path::new(file).components().count() == 1
            && !matches!(file, "." | "..")
            && !Path::new(file).is_absolute();
        if !plain {
            return Err(st_err(
                ipath,
                format!("weight_map[`{name}`] = {file:?} is not a plain file name"),
            ));
        }
        by_shard
            .entry(file.to_string())
            .or_default()
            .push(name.clone());
    }
    if by_shard.is_empty() {
        return Err(st_err(ipath, "`weight_map` is empty"));
    }
    Ok(by_shard)
}

/// Whether a model of these files stays in the last-level cache (`kernels::stays_cached` over
/// their summed sizes): decided per model, not per file, so the small shards of a large model
/// (the bundled target's MTP shard, the last shard of a sharded checkpoint) are mapped like the
/// rest of it (`Model::load` marks matrices cache-resident by the same total).
fn stays_cached(files: &[impl AsRef<Path>]) -> Result<bool> {
    let mut total = 0u64;
    for p in files {
        let p = p.as_ref();
        total += std::fs::metadata(p).map_err(|e| io_err(p, e))?.len();
    }
    Ok(crate::kernels::stays_cached(total))
}

/// One shard: copied into huge pages when `copy` (the `huge_pages` choice, or a model small
/// enough to stay cached, [`stays_cached`]) unless most of its bytes are packed into strips
/// anyway ([`mostly_packed`]: those copies are in huge pages already), else mapped.
fn map_file(p: &Path, copy: bool) -> Result<Shard> {
    let f = File::open(p).map_err(|e| io_err(p, e))?;
    let len = f.metadata().map_err(|e| io_err(p, e))?.len();
    let path = p.display().to_string();
    let backing = if len == 0 {
        Backing::Bytes(Vec::new())
    } else {
        // SAFETY: the map is read-only and private to this store. Checkpoint files are treated as
        // immutable while the engine runs; truncating one underneath a running engine is outside
        // the supported contract (the same one every mmap-based checkpoint loader makes).
        let m = unsafe { Mmap::map(&f) }.map_err(|e| io_err(p, e))?;
        if copy && !mostly_packed(&m) {
            // A model that small (a draft model) is read ~8 times per speculative step right
            // after the target streamed hundreds of MB, which evicted the TLB entries and
            // page-table lines of its 4 KB pages; in 2 MB pages it needs 3 entries instead of
            // ~1000, for a copy of a few MB once.
            drop(m);
            read_into_huge_pages(f, len, p)?
        } else {
            // Ask for 2 MB pages before anything is read: where the file is not cached yet,
            // the kernel's readahead of a mapping so advised fills the page cache with 2 MB
            // folios (on filesystems with large folios) and maps them whole, so the kernels
            // stream the weights with fewer TLB misses — zero-copy. Pages already cached in
            // small folios stay small (`weights::mapped_pages_under` reports which). Refused:
            // ordinary pages, same bytes.
            #[cfg(target_os = "linux")]
            let _ = m.advise(memmap2::Advice::HugePage);
            // Start reading the file into the page cache in the background: the weights are
            // used in place (zero-copy), so the first forward would otherwise fault them in one
            // by one.
            #[cfg(unix)]
            let _ = m.advise(memmap2::Advice::WillNeed);
            Backing::Mmap(m)
        }
    };
    Ok(Shard {
        path,
        backing: Arc::new(backing),
    })
}

/// Whether most of the tensor bytes of the file mapped at `m` are matrices the loader packs
/// into bf16 strips ([`crate::kernels::strips_by_default`]: 2-D bf16, rows a multiple of 16),
/// whose packed copies are in huge pages already (`kernels::packed_pages`): a huge-page copy
/// of such a file would only keep a second copy of those bytes resident. False for a file
/// whose header does not parse (opening it reports why).
fn mostly_packed(m: &[u8]) -> bool {
    if !crate::kernels::strips_in_huge_pages() {
        return false;
    }
    let Ok((_, meta)) = SafeTensors::read_metadata(m) else {
        return false;
    };
    let (mut packed, mut total) = (0usize, 0usize);
    for (_, info) in meta.tensors() {
        let bytes = info.data_offsets.1.saturating_sub(info.data_offsets.0);
        total += bytes;
        if info.dtype == safetensors::Dtype::BF16
            && info.shape.len() == 2
            && info.shape[0] > 0
            && info.shape[0] % crate::kernels::STRIP_ROWS == 0
        {
            packed += bytes;
        }
    }
    packed * 2 > total
}

/// The `len` bytes of `f` in an anonymous mapping advised `MADV_HUGEPAGE` before it is written
/// (so the kernel backs it with 2 MB pages where transparent huge pages are `madvise` or
/// `always`), starting at a 2 MB boundary, then made read-only.
fn read_into_huge_pages(mut f: File, len: u64, p: &Path) -> Result<Backing> {
    use std::io::Read;
    const HUGE: usize = 2 << 20;
    let n = usize::try_from(len).map_err(|_| Error::Safetensors {
        path: p.display().to_string(),
        msg: format!("{len} bytes do not fit this machine's address space"),
    })?;
    let mut map = memmap2::MmapMut::map_anon(n + HUGE).map_err(|e| io_err(p, e))?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage); // refused: ordinary pages, same bytes
    let off = (HUGE - map.as_ptr() as usize % HUGE) % HUGE;
    f.read_exact(&mut map[off..off + n])
        .map_err(|e| io_err(p, e))?;
    let map = map.make_read_only().map_err(|e| io_err(p, e))?;
    Ok(Backing::HugePages { map, off, len: n })
}

fn describe(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => {
            "truncated: shorter than the 8-byte header length".into()
        }
        SafeTensorError::InvalidHeaderLength => {
            "header length runs past the end of the file".into()
        }
        SafeTensorError::HeaderTooLarge => "header length over 100 MB".into(),
        SafeTensorError::InvalidHeader(u) => format!("header is not UTF-8: {u}"),
        SafeTensorError::InvalidHeaderDeserialization(j) => {
            format!("header is not valid safetensors JSON: {j}")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "data section size does not match the header's offsets (truncated or trailing bytes)"
                .into()
        }
        SafeTensorError::InvalidOffset(n) => {
            format!("tensor `{n}`: offsets overlap or leave a gap")
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's byte size does not match its shape and dtype".into()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file at `p` holding one U8 tensor `name` of `len` bytes, left sparse (a
    /// file of any size costs no disk).
    fn sparse_file(p: &Path, name: &str, len: u64) {
        use std::io::Write;
        let header =
            format!(r#"{{"{name}":{{"dtype":"U8","shape":[{len}],"data_offsets":[0,{len}]}}}}"#);
        let mut f = File::create(p).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        f.set_len(8 + header.len() as u64 + len).unwrap();
    }

    fn copied(s: &WeightStore) -> Vec<bool> {
        s.shards
            .iter()
            .map(|sh| matches!(*sh.backing, Backing::HugePages { .. }))
            .collect()
    }

    /// Whether a model's files are copied into huge pages is decided for the model, from all
    /// its files' bytes: a small shard of a large sharded model is mapped like the rest of it,
    /// while a small model alone is copied (where the last-level cache is known and holds four
    /// of it).
    #[test]
    fn a_large_models_small_shard_is_mapped_like_the_rest() {
        let dir = std::env::temp_dir().join(format!("specmla-st-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // a shard just above a quarter of this machine's last-level cache (the smallest power
        // of two that is: sparse, but mapped and read ahead, so no larger than it needs)
        let mut big = 1u64 << 20;
        while crate::kernels::stays_cached(big) && big < 1 << 34 {
            big *= 2;
        }
        sparse_file(&dir.join("a.safetensors"), "big", big);
        sparse_file(&dir.join("b.safetensors"), "small", 4096);
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map":{"big":"a.safetensors","small":"b.safetensors"}}"#,
        )
        .unwrap();
        let s = WeightStore::open_with(WeightSource::Dir(dir.clone()), false).unwrap();
        assert_eq!(copied(&s), [false, false], "sharded large model");
        assert_eq!(s.get("small").unwrap().data.len(), 4096);
        drop(s);
        // the small file alone: copied where it stays cached
        let alone = dir.join("b.safetensors");
        let s = WeightStore::open_with(WeightSource::File(alone.clone()), false).unwrap();
        let len = std::fs::metadata(&alone).unwrap().len();
        assert_eq!(
            copied(&s),
            [crate::kernels::stays_cached(len)],
            "small model"
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file of header-declared tensors (`name`, dtype, shape), zero data.
    fn zero_file(p: &Path, tensors: &[(&str, &str, &[usize], usize)]) {
        use std::io::Write;
        let mut off = 0;
        let mut items = Vec::new();
        for (name, dtype, shape, elem) in tensors {
            let n = shape.iter().product::<usize>() * elem;
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            items.push(format!(
                r#""{name}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{off},{}]}}"#,
                dims.join(","),
                off + n
            ));
            off += n;
        }
        let header = format!("{{{}}}", items.join(","));
        let mut f = File::create(p).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        f.write_all(&vec![0u8; off]).unwrap();
    }

    /// Asked for huge pages, a file mostly of bf16 matrices the loader packs into strips stays
    /// mapped where strips are on (the packed copies are in huge pages; a copy of the file
    /// would be a second one), and is copied where they are off; a file of f32 matrices, or of
    /// bf16 ones whose rows do not fill strips, is copied either way.
    #[test]
    fn a_file_packed_into_strips_is_not_copied_again() {
        let dir = std::env::temp_dir().join(format!("specmla-st-packed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |name: &str, tensors: &[(&str, &str, &[usize], usize)]| {
            let p = dir.join(name);
            zero_file(&p, tensors);
            copied(&WeightStore::open_with(WeightSource::File(p), true).unwrap())
        };
        let strips = crate::kernels::strips_in_huge_pages();
        let bf16 = open(
            "bf16.safetensors",
            &[("w", "BF16", &[64, 96], 2), ("norm", "F32", &[96], 4)],
        );
        assert_eq!(bf16, [!strips], "bf16 matrices, strips {strips}");
        let f32 = open("f32.safetensors", &[("w", "F32", &[64, 96], 4)]);
        assert_eq!(f32, [true], "f32 matrices");
        let odd = open("odd.safetensors", &[("w", "BF16", &[40, 96], 2)]);
        assert_eq!(odd, [true], "bf16 rows not a multiple of 16");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

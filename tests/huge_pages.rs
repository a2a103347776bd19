//! Weights read into huge pages — per engine (`EngineConfig::huge_page_weights`, C ABI
//! `huge_page_weights`) and process-wide (`weights::set_huge_page_weights`, CLI `--huge-pages`):
//! the engine decodes exactly what it decodes from the mapped files (tokens and log-probs,
//! bitwise), the weights sit in anonymous huge pages where the kernel offers them, an engine's
//! choice leaves the next engine's loads mapped (where bf16 matrices are packed into strips,
//! the packed copies are in huge pages for every engine), and a malformed file is still a
//! clear error.
//! Its own test binary, one test: the process-wide setting and the process's huge-page count
//! are shared state.

mod common;

use common::{budget_requests, repo, run_checked, spec_test_cfg};
use specmla::engine::{DraftSource, Engine};
use specmla::spec::SpecMode;
use specmla::weights::{set_huge_page_weights, WeightSource, WeightStore};

/// AnonHugePages of this process, in kB (None where the kernel does not report it).
fn anon_huge_kb() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    t.lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[test]
fn huge_page_weights_decode_the_same_and_bad_files_still_fail() {
    let target = repo().join("models/target");
    let reqs = budget_requests(6, 0x4855_4745, 20, 10, &[11, 12]);
    let cfg = spec_test_cfg(SpecMode::Fixed(3));
    let draft = || DraftSource::Dir(repo().join("models/draft"));
    let mapped = run_checked(
        &Engine::new(&target, draft(), cfg.clone()).unwrap(),
        reqs.clone(),
        &[],
    );
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let thp = thp.contains("[always]") || thp.contains("[madvise]");
    // at least `pages` more huge pages than `before` (where the kernel reports them and
    // offers them to advised mappings)
    let grew = |before: Option<u64>, pages: u64, what: &str| {
        if let (Some(before), Some(after), true) = (before, anon_huge_kb(), thp) {
            assert!(
                after >= before + pages * 2048,
                "{what}: AnonHugePages {before} kB -> {after} kB"
            );
        }
    };

    // one engine asks (the process-wide setting stays off): the target's 89 MB of files span
    // 40+ huge pages; ask for 8 (a fragmented machine may back some with 4 KB pages) ...
    let before = anon_huge_kb();
    let mut own = cfg.clone();
    own.huge_page_weights = true;
    let e = Engine::new(&target, DraftSource::None, own).unwrap();
    grew(before, 8, "engine with huge_page_weights");
    // ... its drafters load into huge pages too (the draft's 4.3 MB file: 2 whole pages) ...
    let before = anon_huge_kb();
    e.set_draft_weights_blocking(draft()).unwrap();
    grew(before, 1, "a draft swap of that engine");
    let got = run_checked(&e, reqs.clone(), &[]);
    common::assert_same_outputs("engine huge-page weights", &mapped, &got, &reqs);
    // ... while the next engine without the field maps its target's files; its draft, small
    // enough to stay in the last-level cache (a file of at most a quarter of it), is read into
    // huge pages all the same (the 4.3 MB file spans at most 3). Where bf16 matrices are
    // packed into strips (the avx2 level) the packed copies are in huge pages whatever the
    // engine asked: its 66 MB of bf16 matrices then take 8 or more.
    let before = anon_huge_kb();
    let plain = Engine::new(&target, draft(), cfg.clone()).unwrap();
    let draft_bytes = std::fs::metadata(repo().join("models/draft/model.safetensors"))
        .unwrap()
        .len();
    let small = specmla::kernels::stays_cached(draft_bytes);
    if specmla::kernels::strips_in_huge_pages() {
        grew(before, 8, "a mapped engine's strips");
    } else {
        if let (Some(before), Some(after)) = (before, anon_huge_kb()) {
            assert!(
                after < before + 4 * 2048,
                "a mapped engine: AnonHugePages {before} kB -> {after} kB"
            );
        }
        if small {
            grew(before, 1, "a mapped engine's cache-sized draft");
        }
    }
    drop((e, plain));

    // process-wide
    set_huge_page_weights(true);
    let before = anon_huge_kb();
    let e = Engine::new(&target, draft(), cfg).unwrap();
    grew(before, 8, "process-wide huge-page weights");
    let got = run_checked(&e, reqs.clone(), &[]);
    common::assert_same_outputs("huge-page weights", &mapped, &got, &reqs);
    // a file that is not a checkpoint is an error, read or mapped
    let bad = std::env::temp_dir().join(format!(
        "specmla-huge-bad-{}.safetensors",
        std::process::id()
    ));
    std::fs::write(&bad, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    let err = match WeightStore::open(WeightSource::File(bad.clone())) {
        Ok(_) => panic!("a malformed file must not open"),
        Err(e) => e,
    };
    assert!(err.to_string().contains("specmla-huge-bad"), "{err}");
    let _ = std::fs::remove_file(&bad);
    set_huge_page_weights(false);
}

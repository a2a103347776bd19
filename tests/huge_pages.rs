//! Weights read into huge pages (`weights::set_huge_page_weights`, CLI `--huge-pages`): the
//! engine decodes exactly what it decodes from the mapped files (tokens and log-probs, bitwise),
//! the weights sit in anonymous huge pages where the kernel offers them, and a malformed file is
//! still a clear error. Its own test binary: the setting is process-wide.

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
    set_huge_page_weights(true);
    let before = anon_huge_kb();
    let e = Engine::new(&target, draft(), cfg).unwrap();
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if let (Some(before), Some(after)) = (before, anon_huge_kb()) {
        if thp.contains("[always]") || thp.contains("[madvise]") {
            // the target's 66 MB shard alone spans 30+ huge pages; ask for two (a fragmented
            // machine may back some of them with 4 KB pages)
            assert!(
                after >= before + 2 * 2048,
                "AnonHugePages {before} kB -> {after} kB"
            );
        }
    }
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

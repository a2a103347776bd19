//! `specmla bench --spec --interleaved R` on the bundled pair: every row carries R interleaved
//! (plain, speculative) runs whose outputs were checked against plain decoding, with their
//! speedups, decode-only speedups and step counts; the drafters' rows show their drafting.
//! (Speed itself is never asserted: only that the runs happened and agree.)

use std::process::Command;

use serde_json::Value;

fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn interleaved_runs_are_reported_per_row_and_outputs_agree() {
    let out = Command::new(env!("CARGO_BIN_EXE_specmla"))
        .args(["bench", "--spec", "--no-wide", "--json", "--threads", "2"])
        .args(["--drafters", "ngram,draft", "--ks", "1", "--batches", "2"])
        .args(["--prompts", "2", "--interleaved", "2"])
        .current_dir(repo())
        .output()
        .expect("run specmla bench");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let spec = &v["speculation"];
    assert_eq!(spec["greedy_identical"], Value::Bool(true));
    let runs = spec["runs"].as_array().expect("runs");
    // 2 drafters x (k = 1, adaptive) x budgets (none, 50 %)
    assert_eq!(runs.len(), 8, "{runs:#?}");
    for r in runs {
        let what = format!("{} k={} budget {}", r["drafter"], r["k"], r["budget"]);
        assert_eq!(r["identical"], Value::Bool(true), "{what}");
        let sp = r["interleaved_speedups"].as_array().expect("speedups");
        let dec = r["interleaved_decode_speedups"].as_array().expect("decode");
        let each = r["interleaved_runs"].as_array().expect("runs");
        assert_eq!((sp.len(), dec.len(), each.len()), (2, 2, 2), "{what}");
        for x in sp.iter().chain(dec) {
            let x = x.as_f64().expect("a number");
            assert!(x.is_finite() && x > 0.0, "{what}: {x}");
        }
        let m = r["interleaved_speedup_median"].as_f64().expect("median");
        let (lo, hi) = sp
            .iter()
            .map(|x| x.as_f64().unwrap())
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        assert!(lo <= m && m <= hi, "{what}: median {m} outside {lo}..{hi}");
        for e in each {
            assert!(e["plain_steps"].as_u64().unwrap() > 0, "{what}");
            assert!(e["spec_s"].as_f64().unwrap() > 0.0, "{what}");
            if r["drafter"] == "draft" && r["k"] == "1" {
                // the bundled draft agrees with the target on every token: fixed k = 1
                // drafts and has them accepted, and so needs fewer steps than plain
                let (d, a) = (e["drafted_tokens"].as_u64(), e["accepted_tokens"].as_u64());
                assert!(d.unwrap() > 0 && a.unwrap() > 0, "{what}: {e}");
                assert!(
                    e["spec_steps"].as_u64() < e["plain_steps"].as_u64(),
                    "{what}: {e}"
                );
            }
        }
    }
}

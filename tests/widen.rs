//! `specmla make-bench-model` / `weights::widen_dir`: the widened copy of a checkpoint computes
//! the same function — log-probs within 1e-4 of the original (f32 sums over repeated entries
//! round differently; seen: 2e-5) and the same greedy choice at every position — has the
//! widened dims, and bad inputs (fp8 checkpoints, factors that are not powers of two) are
//! refused with a clear error.

mod common;

use common::*;
use specmla::engine::score::score_tokens;
use specmla::model::Model;
use specmla::weights::{widen_dir, WidenFactors};

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("specmla-widen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, x)| if *x > v[b] { i } else { b })
}

/// Widen `src` by `f`, check dims, and compare per-position log-probs over `tokens`.
fn check(src: &std::path::Path, tag: &str, f: WidenFactors, tokens: &[u32]) {
    let dst = tmp(tag);
    let r = widen_dir(src, &dst, f).unwrap();
    assert!(r.bytes_out > r.bytes_in, "{r:?}");
    let a = Model::load_dir(src).unwrap();
    let b = Model::load_dir(&dst).unwrap();
    assert_eq!(b.config.hidden_size, a.config.hidden_size * f.hidden);
    assert_eq!(
        b.config.num_attention_heads,
        a.config.num_attention_heads * f.heads
    );
    let la = score_tokens(&a, tokens).unwrap();
    let lb = score_tokens(&b, tokens).unwrap();
    for (pos, (x, y)) in la.iter().zip(&lb).enumerate() {
        let d = max_abs_diff(x, y);
        assert!(d < 1e-4, "{tag}: position {pos}: log-probs differ by {d}");
        assert_eq!(
            argmax(x),
            argmax(y),
            "{tag}: greedy choice differs at position {pos}"
        );
    }
    std::fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn widened_bundled_target_computes_the_same_function() {
    exact(widened_bundled_target_computes_the_same_function_on_exact_level)
}

fn widened_bundled_target_computes_the_same_function_on_exact_level() {
    // q-LoRA, noaux_tc routing over 48 experts, YaRN: the benchmark target's source.
    let toks: Vec<u32> = vec![
        1, 54, 31, 5, 151, 5, 93, 34, 21, 19, 5, 152, 5, 108, 5, 117, 5, 153, 5, 114, 5, 22, 21, 5,
        148, 3,
    ];
    check(
        &repo().join("models/target"),
        "target",
        WidenFactors::uniform(4, 2, 2),
        &toks,
    );
    // dense MLPs and shared experts widened more than the routed experts (n_shared_experts x4)
    check(
        &repo().join("models/target"),
        "target-shared",
        WidenFactors {
            hidden: 2,
            intermediate: 1,
            heads: 2,
            shared: 4,
        },
        &toks,
    );
}

#[test]
fn widened_golden_fixtures_compute_the_same_function() {
    exact(widened_golden_fixtures_compute_the_same_function_on_exact_level)
}

fn widened_golden_fixtures_compute_the_same_function_on_exact_level() {
    let toks: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 50).collect();
    for name in ["v2_lite", "v3_bf16"] {
        let f = WidenFactors::uniform(2, 2, 4);
        check(&repo().join("models/golden").join(name), name, f, &toks);
    }
}

#[test]
fn bad_inputs_are_refused() {
    let fp8 = widen_dir(
        &repo().join("models/golden/v3_fp8"),
        &tmp("fp8"),
        WidenFactors::default(),
    );
    let e = fp8.unwrap_err().to_string();
    assert!(e.contains("quantised") || e.contains("fp8"), "{e}");
    let odd = widen_dir(
        &repo().join("models/target"),
        &tmp("odd"),
        WidenFactors::uniform(3, 1, 1),
    );
    assert!(odd.unwrap_err().to_string().contains("power of two"));
    let shared_below = widen_dir(
        &repo().join("models/target"),
        &tmp("shared-below"),
        WidenFactors {
            hidden: 1,
            intermediate: 4,
            heads: 1,
            shared: 2,
        },
    );
    assert!(shared_below
        .unwrap_err()
        .to_string()
        .contains(">= the expert factor"));
    let missing = widen_dir(&tmp("absent"), &tmp("absent-out"), WidenFactors::default());
    assert!(missing.is_err());
}

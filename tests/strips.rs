//! Models loaded with bf16 strips (`kernels/gemm/strips.rs`: the layout of a CPU whose best level
//! is avx2) on ANY machine: this test process forces them on (`SPECMLA_BF16_STRIPS=1`, read once
//! per process, set before the first load), so the strips order is checked through the model and
//! the engine also where CI runs on an AVX-512 CPU (where models load row-major by default):
//! - the golden fixtures' logits against transformers' fp32 reference, one-chunk prefill and token
//!   by token, the same tolerance as tests/golden.rs (1e-4 x max(1, max |logit|));
//! - batch invariance: chunked prefill bitwise equal to one chunk;
//! - lossless speculation on the bundled target (its MTP layer, the bundled draft model) with
//!   budgets: tokens and log-probs bitwise equal to plain decoding of the same strips model.

mod common;

use common::*;
use specmla::engine::{DraftSource, Engine};
use specmla::kernels::MatrixData;
use specmla::kv::KvDtype;
use specmla::model::{Ffn, Model};
use specmla::spec::SpecMode;

fn strips_on() {
    // SAFETY (of the environment write): every test of this process sets the same value before
    // it loads anything, so no reader ever sees another.
    unsafe { std::env::set_var("SPECMLA_BF16_STRIPS", "1") };
    assert!(specmla::kernels::strips_by_default());
}

fn tol(reference: &[f32]) -> f32 {
    1e-4 * reference.iter().fold(1.0f32, |m, x| m.max(x.abs()))
}

#[test]
fn golden_logits_hold_with_strips() {
    strips_on();
    let mut packed = 0;
    for dir in golden_dirs() {
        let model = Model::load_dir(&dir).unwrap();
        for l in &model.layers {
            if let Ffn::Dense(m) = &l.ffn {
                packed += usize::from(matches!(m.gate.data, MatrixData::Bf16Strips(_)));
            }
            if let Ffn::Moe(m) = &l.ffn {
                packed += m
                    .experts
                    .iter()
                    .filter(|e| matches!(e.down.data, MatrixData::Bf16Strips(_)))
                    .count();
            }
        }
        for (ids, reference) in golden_reference(&dir) {
            for (chunk, mha_until, label) in [
                (ids.len(), ids.len(), "one chunk (MHA)"),
                (1, 0, "token by token (absorbed)"),
            ] {
                let mut kv = kv_for(&model, KvDtype::F32, 64);
                let got = exact(|| run_chunked(&model, &mut kv, &ids, chunk, mha_until));
                let d = max_abs_diff(&got, &reference);
                assert!(
                    d <= tol(&reference),
                    "{} {label}: max diff {d}",
                    dir.display()
                );
            }
            let mut kv = kv_for(&model, KvDtype::F32, 64);
            let one = exact(|| run_chunked(&model, &mut kv, &ids, ids.len(), ids.len()));
            let mut kv = kv_for(&model, KvDtype::F32, 64);
            let chunked = exact(|| run_chunked(&model, &mut kv, &ids, 3, ids.len()));
            let same = one.len() == chunked.len()
                && one
                    .iter()
                    .zip(&chunked)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{}: chunked prefill not bitwise one chunk",
                dir.display()
            );
        }
    }
    assert!(packed > 0, "no golden fixture has a bf16 matrix in strips");
}

#[test]
fn speculation_with_strips_is_bitwise_lossless() {
    strips_on();
    let target = repo().join("models/target");
    let m = Model::load_dir(&target).unwrap();
    assert!(
        matches!(m.layers[0].attn.o_proj.data, MatrixData::Bf16Strips(_)),
        "the bundled target's projections are not in strips"
    );
    let reqs = budget_requests(12, 0x5171, 20, 10, &[11, 12]);
    let base = plain_outputs(&target, &reqs);
    for (label, draft, k) in [
        ("mtp k=2", DraftSource::Mtp, 2),
        (
            "draft k=4",
            DraftSource::Dir(repo().join("models/draft")),
            4,
        ),
    ] {
        let e = Engine::new(&target, draft, spec_test_cfg(SpecMode::Fixed(k))).unwrap();
        let got = run_checked(&e, reqs.clone(), &[]);
        assert!(
            got.iter().map(|o| o.counters.accepted_tokens).sum::<u64>() > 0,
            "{label}: nothing accepted"
        );
        assert_same_outputs(label, &base, &got, &reqs);
    }
}

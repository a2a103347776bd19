//! `specmla quantize` / `weights::quantize_dir`: a bf16 fixture quantised to fp8 e4m3 with block
//! scales loads through the normal path as an fp8 model (DeepSeek-V3 layout), every weight is
//! the nearest e4m3 value of its block-scaled original, and the logits stay close to the
//! original model's (but are not identical: the weights really changed).

mod common;

use common::*;
use specmla::kernels::{matrix_row_f32, MatrixData};
use specmla::kv::KvDtype;
use specmla::model::Model;
use specmla::weights::quantize_dir;

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("specmla-quantize-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn quantized_fixture_loads_as_fp8_and_tracks_the_original() {
    exact(quantized_fixture_loads_as_fp8_and_tracks_the_original_on_exact_level)
}

fn quantized_fixture_loads_as_fp8_and_tracks_the_original_on_exact_level() {
    let src = repo().join("models/golden/v3_bf16");
    let dst = tmp("v3");
    let r = quantize_dir(&src, &dst, 16).unwrap();
    assert!(
        r.quantized > 0 && r.kept > 0 && r.bytes_out < r.bytes_in,
        "{r:?}"
    );
    let orig = Model::load_dir(&src).unwrap();
    let q = Model::load_dir(&dst).unwrap();
    let quant = q.config.quantization.expect("quantization_config written");
    assert_eq!((quant.block_rows, quant.block_cols), (16, 16));
    // Embeddings and lm_head stay bf16; every projection is fp8 with [ceil(r/16), ceil(c/16)] scales.
    assert!(matches!(q.embed.data, MatrixData::Bf16(_)));
    // (bf16 in either layout: strips where the CPU's best level is avx2)
    assert!(matches!(
        q.lm_head().data,
        MatrixData::Bf16(_) | MatrixData::Bf16Strips(_)
    ));
    for (lo, lq) in orig.layers.iter().zip(&q.layers) {
        let (a, b) = (&lo.attn.kv_b_proj, &lq.attn.kv_b_proj);
        let MatrixData::Fp8 { scale_inv, .. } = &b.data else {
            panic!("kv_b_proj not fp8")
        };
        assert_eq!(scale_inv.len(), b.rows.div_ceil(16) * b.cols.div_ceil(16));
        assert_eq!(lq.attn.o_proj.dtype_name(), "fp8_e4m3");
        // each weight within half an e4m3 step of the original (relative 2^-4, or the subnormal
        // step 2^-9 of the block scale)
        let (mut ra, mut rb) = (vec![0f32; a.cols], vec![0f32; a.cols]);
        for r in 0..a.rows {
            matrix_row_f32(a, r, &mut ra);
            matrix_row_f32(b, r, &mut rb);
            for (c, (x, y)) in ra.iter().zip(&rb).enumerate() {
                let s = scale_inv[(r / 16) * a.cols.div_ceil(16) + c / 16];
                assert!(
                    (x - y).abs() <= x.abs() / 16.0 + s / 512.0 * 1.0001,
                    "row {r} col {c}: {x} -> {y}"
                );
            }
        }
    }
    // Logits: the fp8 model computes what the same weights dequantised to f32 compute (only the
    // summation order differs), and differs from the bf16 original (the weights really changed;
    // this tiny random model is too sensitive for an accuracy bound against it).
    let deq = tmp("deq");
    write_dequantized(&dst, &deq);
    let fdeq = Model::load_dir(&deq).unwrap();
    assert_eq!(fdeq.layers[0].attn.o_proj.dtype_name(), "f32");
    for (ids, _) in golden_reference(&src) {
        let logits = |m: &Model| {
            let mut kv = kv_for(m, KvDtype::F32, 64);
            run_chunked(m, &mut kv, &ids, ids.len(), ids.len())
        };
        let (a, b, c) = (logits(&orig), logits(&q), logits(&fdeq));
        let scale = c.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        let d = max_abs_diff(&b, &c);
        assert!(
            d <= 1e-4 * scale,
            "fp8 vs dequantised f32: {d} (scale {scale})"
        );
        assert!(
            max_abs_diff(&a, &b) > 1e-3 * scale,
            "quantisation changed nothing?"
        );
    }
    // A quantised checkpoint is refused as input; bad block sizes too.
    let again = tmp("again");
    assert!(quantize_dir(&dst, &again, 16)
        .unwrap_err()
        .to_string()
        .contains("already quantised"));
    assert!(quantize_dir(&src, &again, 12).is_err());
    let _ = std::fs::remove_dir_all(&dst);
    let _ = std::fs::remove_dir_all(&again);
    let _ = std::fs::remove_dir_all(&deq);
}

/// `src` (fp8) rewritten with every fp8 weight dequantised to f32 (no scales, no
/// quantization_config).
fn write_dequantized(src: &std::path::Path, dst: &std::path::Path) {
    use specmla::weights::{DType, Loader, WeightSource, WeightStore};
    std::fs::create_dir_all(dst).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let quant = Model::load_dir(src).unwrap().config.quantization;
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    let store = WeightStore::open(WeightSource::Dir(src.to_path_buf())).unwrap();
    let ld = Loader::new(&store, quant);
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in store.names() {
        let v = store.get(name).unwrap();
        if name.ends_with("_scale_inv") {
            continue;
        }
        if v.dtype == DType::F8E4M3 {
            let w = ld.matrix_f32(name, v.shape[0], v.shape[1]).unwrap();
            tensors.push((
                name.into(),
                safetensors::Dtype::F32,
                v.shape.to_vec(),
                w.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ));
        } else {
            let d = match v.dtype {
                DType::F32 => safetensors::Dtype::F32,
                DType::BF16 => safetensors::Dtype::BF16,
                _ => safetensors::Dtype::F16,
            };
            tensors.push((name.into(), d, v.shape.to_vec(), v.data.to_vec()));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

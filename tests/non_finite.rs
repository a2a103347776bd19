//! A model whose logits are not finite (NaN weights, an overflowing scale) fails its requests with
//! an error event instead of emitting meaningless tokens; config fields that would overflow the
//! attention scales are refused up front.

mod common;

use common::repo;
use specmla::config::ModelConfig;
use specmla::engine::{DraftSource, Engine, EngineConfig, FinishReason, Prompt, Request};

/// Copy of the v3_yarn fixture with `model.norm.weight` overwritten by NaN (f32 storage).
fn nan_model(dir: &std::path::Path) {
    let src = repo().join("models/golden/v3_yarn");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header["model.norm.weight"];
    assert_eq!(t["dtype"], "F32");
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for c in bytes[8 + n + a..8 + n + b].chunks_mut(4) {
        c.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

#[test]
fn nan_logits_fail_the_request() {
    let dir = std::env::temp_dir().join(format!("specmla-nan-{}", std::process::id()));
    nan_model(&dir);
    let e = Engine::new(&dir, DraftSource::None, EngineConfig::default()).unwrap();
    let mut r = Request::new(Prompt::Tokens(vec![5, 17, 42]));
    r.sampling.max_tokens = 4;
    let out = e.generate(vec![r]);
    let _ = std::fs::remove_dir_all(&dir);
    let err = out
        .expect_err("a request with NaN logits must fail")
        .to_string();
    assert!(err.contains("non-finite logits"), "{err}");
    // The engine is still usable: the next request fails the same way, cleanly.
    let mut events = Vec::new();
    let mut r = Request::new(Prompt::Tokens(vec![7]));
    r.sampling.max_tokens = 2;
    let id = e.submit(r).unwrap();
    while e.has_work() {
        events.extend(e.step().unwrap());
    }
    let last = events.iter().rev().find(|ev| ev.id == id).unwrap();
    assert!(matches!(last.finish, Some(FinishReason::Error(_))));
    assert!(last.tokens.is_empty());
}

#[test]
fn overflowing_rope_fields_are_refused() {
    let base: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("models/golden/v3_yarn/config.json")).unwrap(),
    )
    .unwrap();
    for (key, v) in [
        ("mscale", 1e30),
        ("mscale_all_dim", 1e30),
        ("factor", 1e300),
        ("rope_theta", 1e300),
    ] {
        let mut c = base.clone();
        c["rope_parameters"][key] = serde_json::json!(v);
        let err = ModelConfig::from_json_str(&c.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
    assert!(ModelConfig::from_json_str(&base.to_string()).is_ok());
}

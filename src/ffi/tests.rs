//! Unit tests of the ABI plumbing that need no model: the panic wrapper, last error, status
//! mapping, struct_size handling, handle validation and buffer rules.

use std::ffi::CStr;

use super::*;

fn last() -> String {
    // SAFETY: specmla_last_error never returns NULL and the string lives until the next failure.
    unsafe { CStr::from_ptr(specmla_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn panics_become_a_status_and_a_message() {
    let st = call(|| panic!("boom"));
    assert_eq!(st, Status::SPECMLA_ERR_PANIC);
    assert!(last().contains("boom"), "{}", last());
    assert_eq!(call(|| Ok(())), Status::SPECMLA_OK);
}

#[test]
fn errors_map_to_statuses() {
    let cases = [
        (
            Error::UnknownRequest(3),
            Status::SPECMLA_ERR_UNKNOWN_REQUEST,
        ),
        (Error::Draft("x".into()), Status::SPECMLA_ERR_DRAFT),
        (
            Error::Tensor {
                name: "w".into(),
                msg: "m".into(),
            },
            Status::SPECMLA_ERR_MODEL,
        ),
        (
            Error::UnknownToken {
                id: 9,
                vocab_size: 4,
            },
            Status::SPECMLA_ERR_UNKNOWN_TOKEN,
        ),
        (
            Error::KvExhausted("k".into()),
            Status::SPECMLA_ERR_KV_EXHAUSTED,
        ),
    ];
    for (e, want) in cases {
        let msg = e.to_string();
        let f = FfiError::from(e);
        assert_eq!(f.status, want);
        assert_eq!(f.msg, msg);
    }
}

#[test]
fn short_params_keep_defaults_for_missing_fields() {
    let mut p = specmla_engine_default_params();
    p.num_draft_tokens = 7;
    p.threads = 99;
    p.struct_size = std::mem::offset_of!(EngineParams, adaptive);
    // SAFETY: `p` is a valid struct of at least struct_size bytes.
    let got = unsafe { read_params(&p, engine_defaults(), "p") }.expect("valid");
    assert_eq!(got.num_draft_tokens, 7);
    assert_eq!(got.threads, engine_defaults().threads);
    p.struct_size = 3;
    // SAFETY: as above.
    let err = unsafe { read_params(&p, engine_defaults(), "p") }.unwrap_err();
    assert_eq!(err.status, Status::SPECMLA_ERR_INVALID_ARGUMENT);
}

#[test]
fn engine_params_are_validated() {
    let mut p = engine_defaults();
    assert!(engine_config(&p).is_ok());
    p.num_draft_tokens = SPECMLA_MAX_DRAFT_POSITIONS as u32 + 1;
    assert!(engine_config(&p).is_err());
    p = engine_defaults();
    p.draft_kv_dtype = 42;
    assert!(engine_config(&p).is_err());
    p = engine_defaults();
    p.kv_dtype = SPECMLA_KV_FP8_E4M3;
    let c = engine_config(&p).expect("fp8");
    assert_eq!(c.draft_kv_dtype, Some(crate::kv::KvDtype::Fp8E4M3));
    // the index-key cache follows the target's dtype unless set
    assert_eq!(c.index_kv_dtype, Some(crate::kv::KvDtype::Fp8E4M3));
    p.index_kv_dtype = SPECMLA_KV_BF16;
    assert_eq!(
        engine_config(&p).expect("bf16 index keys").index_kv_dtype,
        Some(crate::kv::KvDtype::Bf16)
    );
    p.index_kv_dtype = 42;
    assert!(engine_config(&p).is_err());
    // a V4 target's sliding-window pool: 0 = the engine's sizing, else the given block count
    p = engine_defaults();
    assert_eq!(engine_config(&p).expect("default").kv_window_blocks, None);
    p.kv_window_blocks = 96;
    assert_eq!(engine_config(&p).expect("set").kv_window_blocks, Some(96));
    p = engine_defaults();
    p.isa = SPECMLA_ISA_PORTABLE;
    assert_eq!(
        engine_config(&p).expect("portable").isa,
        Some(crate::kernels::IsaLevel::Portable)
    );
    p.isa = SPECMLA_ISA_EXACT;
    let exact = engine_config(&p).expect("exact").isa.expect("a level");
    assert!(exact.exact() && exact.supported());
    p.isa = 99;
    assert!(engine_config(&p).is_err());
    // the second KV tier: off by default; a directory and / or a memory budget turn it on
    p = engine_defaults();
    assert_eq!(engine_config(&p).expect("default").kv_offload, None);
    let dir = c"/tmp/specmla-tier";
    p.kv_offload_dir = dir.as_ptr();
    p.kv_offload_mem_bytes = 1 << 20;
    let t = engine_config(&p).expect("tier").kv_offload.expect("on");
    assert_eq!(
        t.dir.as_deref(),
        Some(std::path::Path::new("/tmp/specmla-tier"))
    );
    assert_eq!(t.mem_bytes, 1 << 20);
    // the target's device: NULL = cpu; "cuda" / "cuda:N"; anything else refused, named
    p = engine_defaults();
    use crate::backend::Device;
    assert_eq!(engine_config(&p).expect("default").device, Device::Cpu);
    for (s, want) in [
        (c"cpu", Device::Cpu),
        (c"cuda", Device::Cuda(0)),
        (c"cuda:2", Device::Cuda(2)),
    ] {
        p.device = s.as_ptr();
        assert_eq!(engine_config(&p).expect("device").device, want);
    }
    p.device = c"tpu:0".as_ptr();
    let e = engine_config(&p).expect_err("refused");
    assert!(
        format!("{e:?}").contains("expected cpu, cuda or cuda:N"),
        "{e:?}"
    );
    // the drafters' confidence cut: the engine's default, a probability, else refused by name
    p = engine_defaults();
    assert_eq!(
        engine_config(&p).expect("default").draft_p_min,
        crate::engine::DEFAULT_DRAFT_P_MIN
    );
    p.draft_p_min = 0.5;
    assert_eq!(engine_config(&p).expect("cut").draft_p_min, 0.5);
    for bad in [-0.5f32, 1.01, f32::NAN, f32::INFINITY] {
        p.draft_p_min = bad;
        let e = engine_config(&p).expect_err("refused");
        assert!(format!("{e:?}").contains("draft_p_min"), "{e:?}");
    }
    // a caller compiled before the field keeps the default
    p.struct_size = std::mem::offset_of!(EngineParams, draft_p_min);
    // SAFETY: `p` is a valid struct of at least struct_size bytes.
    let got = unsafe { read_params(&p, engine_defaults(), "p") }.expect("valid");
    assert_eq!(got.draft_p_min, crate::engine::DEFAULT_DRAFT_P_MIN);
    // huge-page weights: off by default, on when asked, off for a caller compiled before it
    p = engine_defaults();
    assert!(!engine_config(&p).expect("default").huge_page_weights);
    p.huge_page_weights = true;
    assert!(engine_config(&p).expect("on").huge_page_weights);
    p.struct_size = std::mem::offset_of!(EngineParams, huge_page_weights);
    // SAFETY: `p` is a valid struct of at least struct_size bytes.
    let got = unsafe { read_params(&p, engine_defaults(), "p") }.expect("valid");
    assert!(!got.huge_page_weights);
}

#[test]
fn foreign_and_null_handles_are_rejected() {
    let mut word = 0u64;
    let foreign = &mut word as *mut u64 as *mut EngineHandle;
    assert_eq!(
        specmla_engine_free(std::ptr::null_mut()),
        Status::SPECMLA_OK
    );
    assert_eq!(
        specmla_engine_free(foreign),
        Status::SPECMLA_ERR_INVALID_HANDLE
    );
    assert_eq!(
        specmla_engine_cancel(foreign, 1),
        Status::SPECMLA_ERR_INVALID_HANDLE
    );
    let mut r: *mut StepResult = std::ptr::null_mut();
    // SAFETY: out-pointer is valid.
    assert_eq!(
        unsafe { specmla_engine_step(std::ptr::null_mut(), &mut r) },
        Status::SPECMLA_ERR_INVALID_HANDLE
    );
    assert!(r.is_null());
    assert_eq!(
        specmla_step_result_free(foreign as *mut StepResult),
        Status::SPECMLA_ERR_INVALID_HANDLE
    );
    assert_eq!(word, 0, "a foreign handle is never written through");
}

#[test]
fn status_names_cover_every_code() {
    for code in 0..=17 {
        // SAFETY: static string.
        let name = unsafe { CStr::from_ptr(specmla_status_name(code)) }
            .to_str()
            .expect("ascii");
        assert!(name.starts_with("SPECMLA_"), "{code} -> {name}");
    }
    // SAFETY: static string.
    assert_eq!(
        unsafe { CStr::from_ptr(specmla_status_name(-1)) }.to_str(),
        Ok("unknown")
    );
}

#[test]
fn ab_sources_and_draft_arms_are_validated() {
    use crate::engine::{DraftSource as Rs, Prompt};
    let mut a = specmla_draft_source_default();
    a.kind = SPECMLA_DRAFT_MTP;
    let mut b = specmla_draft_source_default();
    b.kind = SPECMLA_DRAFT_NGRAM;
    let mut s = specmla_draft_source_default();
    s.kind = SPECMLA_DRAFT_AB;
    s.ab_a = &a;
    s.ab_b = &b;
    s.ab_ratio_b = 0.25;
    match draft_from(&s).expect("valid A/B") {
        Rs::Ab { a, b, ratio_b } => {
            assert!(matches!(*a, Rs::Mtp));
            assert!(matches!(*b, Rs::Ngram { min_n: 1, max_n: 3 }));
            assert_eq!(ratio_b, 0.25);
        }
        other => panic!("{other:?}"),
    }
    let bad_ratio = DraftSource {
        ab_ratio_b: -0.1,
        ..s
    };
    assert!(draft_from(&bad_ratio)
        .unwrap_err()
        .msg
        .contains("ab_ratio_b"));
    let null_arm = DraftSource {
        ab_b: std::ptr::null(),
        ..s
    };
    assert_eq!(
        draft_from(&null_arm).unwrap_err().status,
        Status::SPECMLA_ERR_NULL_POINTER
    );
    let nested = DraftSource { ab_a: &s, ..s };
    assert!(draft_from(&nested)
        .unwrap_err()
        .msg
        .contains("itself an A/B"));
    let mut p = specmla_request_default_params();
    assert_eq!(p.draft_arm, -1);
    let r = request_from(&p, Prompt::Tokens(vec![1])).expect("default");
    assert_eq!(r.draft_arm, None);
    p.draft_arm = 1;
    let r = request_from(&p, Prompt::Tokens(vec![1])).expect("arm b");
    assert_eq!(r.draft_arm, Some(1));
    p.draft_arm = 2;
    assert!(request_from(&p, Prompt::Tokens(vec![1]))
        .unwrap_err()
        .msg
        .contains("draft_arm"));
}

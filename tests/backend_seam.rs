//! The backend seam (`specmla::backend`): the forward runs every operator through the backend it
//! is given, the CPU backend is the old forward bit for bit, a failing op is an error (not a
//! panic), and choosing a CUDA device fails cleanly where it cannot run.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;

use common::*;
use specmla::backend::{Backend, CpuBackend, Device};
use specmla::config::ModelConfig;
use specmla::engine::{Engine, EngineConfig, Prompt, Request};
use specmla::kernels::Matrix;
use specmla::kv::{KvCache, KvDtype, SeqKv};
use specmla::model::rope::Rope;
use specmla::model::{Attention, Ffn, LogitsMode, Model, SeqChunk};
use specmla::{Error, Result};

/// The CPU backend with every op counted; `fail_ffn_at` makes the n-th ffn call fail.
#[derive(Default)]
struct Recording {
    calls: RefCell<BTreeMap<&'static str, usize>>,
    fail_ffn_at: Option<usize>,
}

impl Recording {
    fn count(&self, op: &'static str) -> usize {
        let mut c = self.calls.borrow_mut();
        let e = c.entry(op).or_default();
        *e += 1;
        *e
    }
}

impl Backend for Recording {
    type Act = Vec<f32>;
    fn name(&self) -> String {
        "recording".into()
    }
    fn embed(&self, embed: &Matrix, tokens: &[u32]) -> Result<Vec<f32>> {
        self.count("embed");
        CpuBackend.embed(embed, tokens)
    }
    fn rms_norm(&self, x: &Vec<f32>, n: usize, w: &[f32], eps: f32) -> Result<Vec<f32>> {
        self.count("rms_norm");
        CpuBackend.rms_norm(x, n, w, eps)
    }
    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        self.count("add");
        CpuBackend.add_assign(x, y)
    }
    fn attention(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        a: &Attention,
        kv_layer: usize,
        xn: &Vec<f32>,
        pos: &[usize],
        chunks: &[SeqChunk],
        kv: &mut KvCache,
    ) -> Result<Vec<f32>> {
        self.count("attention");
        CpuBackend.attention(cfg, rope, a, kv_layer, xn, pos, chunks, kv)
    }
    fn ffn(
        &self,
        cfg: &ModelConfig,
        f: &Ffn,
        xn: &Vec<f32>,
        n: usize,
    ) -> Result<(Vec<f32>, usize)> {
        let i = self.count("ffn");
        if self.fail_ffn_at == Some(i) {
            return Err(Error::Engine("injected device failure".into()));
        }
        CpuBackend.ffn(cfg, f, xn, n)
    }
    fn logits(
        &self,
        x: &Vec<f32>,
        n: usize,
        norm: &[f32],
        eps: f32,
        lm_head: &Matrix,
        rows: &[usize],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.count("logits");
        CpuBackend.logits(x, n, norm, eps, lm_head, rows, want_hidden)
    }
}

/// A prompt forward then one decode token of the same sequence through `b`. -> (logits of
/// every prompt row + the decode row, hidden states of the prompt)
fn prompt_and_decode<B: Backend>(
    b: &B,
    model: &Model,
    ids: &[u32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut kv = kv_for(model, KvDtype::Bf16, 8);
    let mut seq = SeqKv::new();
    let n = ids.len() - 1;
    let plan = kv.plan_grow(&seq, ids.len())?;
    kv.commit_grow(&mut seq, plan);
    let chunk = SeqChunk {
        kv: &seq,
        start: 0,
        tokens: &ids[..n],
        mha_until: n,
        logits: LogitsMode::All,
    };
    let first = model.forward_on(b, &mut kv, &[chunk], true)?;
    let chunk = SeqChunk {
        kv: &seq,
        start: n,
        tokens: &ids[n..],
        mha_until: n,
        logits: LogitsMode::All,
    };
    let second = model.forward_on(b, &mut kv, &[chunk], false)?;
    let mut logits = first.logits;
    logits.extend(second.logits);
    Ok((logits, first.hidden))
}

#[test]
fn the_forward_runs_every_op_through_the_backend_and_the_cpu_backend_is_the_old_forward() {
    let dir = repo().join("models/target");
    let model = Model::load_dir(&dir).unwrap();
    let ids: Vec<u32> = (0..13).map(|i| 3 + (i * 7) % 150).collect();
    let rec = Recording::default();
    let (got, hidden) = prompt_and_decode(&rec, &model, &ids).unwrap();
    // the same sequence through the default entry point (the CPU forward the engine runs)
    let mut kv = kv_for(&model, KvDtype::Bf16, 8);
    let mut seq = SeqKv::new();
    let n = ids.len() - 1;
    let plan = kv.plan_grow(&seq, ids.len()).unwrap();
    kv.commit_grow(&mut seq, plan);
    let a = model
        .forward_out(
            &mut kv,
            &[SeqChunk {
                kv: &seq,
                start: 0,
                tokens: &ids[..n],
                mha_until: n,
                logits: LogitsMode::All,
            }],
            true,
        )
        .unwrap();
    let b = model
        .forward(
            &mut kv,
            &[SeqChunk {
                kv: &seq,
                start: n,
                tokens: &ids[n..],
                mha_until: n,
                logits: LogitsMode::All,
            }],
        )
        .unwrap();
    let want: Vec<f32> = a.logits.iter().chain(&b).copied().collect();
    assert_eq!(got.len(), ids.len() * model.config.vocab_size);
    assert!(
        got.iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "the seam changed the CPU logits"
    );
    assert!(hidden
        .iter()
        .zip(&a.hidden)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    // every op of both forwards went through the backend: per forward 1 embed, per layer
    // 2 norms + attention + ffn + 2 adds, one logits tail
    let layers = model.layers.len();
    let calls = rec.calls.borrow();
    assert_eq!(calls["embed"], 2);
    assert_eq!(calls["attention"], 2 * layers);
    assert_eq!(calls["ffn"], 2 * layers);
    assert_eq!(calls["rms_norm"], 2 * 2 * layers, "{calls:?}"); // the final norm is the tail's
    assert_eq!(calls["add"], 2 * 2 * layers);
    assert_eq!(calls["logits"], 2);
}

#[test]
fn a_failing_op_is_an_error_and_the_model_keeps_working() {
    let model = Model::load_dir(&repo().join("models/target")).unwrap();
    let ids: Vec<u32> = (0..9).map(|i| 5 + i * 3).collect();
    let bad = Recording {
        fail_ffn_at: Some(3),
        ..Default::default()
    };
    let e = prompt_and_decode(&bad, &model, &ids)
        .unwrap_err()
        .to_string();
    assert!(e.contains("injected device failure"), "{e}");
    // the model is untouched: a clean backend gives the CPU result
    let (a, _) = prompt_and_decode(&CpuBackend, &model, &ids).unwrap();
    let (b, _) = prompt_and_decode(&Recording::default(), &model, &ids).unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn a_cuda_device_is_refused_cleanly_where_it_cannot_run() {
    let dir = repo().join("models/target");
    let model = std::sync::Arc::new(Model::load_dir(&dir).unwrap());
    let refusal = |cfg: EngineConfig, what: &str| {
        Engine::from_model(model.clone(), None, cfg)
            .err()
            .expect(what)
            .to_string()
    };
    // checked before any device is touched: the KV dtype and the tier
    let cfg = EngineConfig {
        device: Device::Cuda(0),
        kv_dtype: KvDtype::F32,
        ..EngineConfig::default()
    };
    let e = refusal(cfg, "f32 KV refused");
    assert!(e.contains("bf16"), "{e}");
    let cfg = EngineConfig {
        device: Device::Cuda(0),
        kv_dtype: KvDtype::Bf16,
        kv_offload: Some(specmla::kv::TierConfig::default()),
        ..EngineConfig::default()
    };
    let e = refusal(cfg, "tier refused");
    assert!(e.contains("second KV tier"), "{e}");
    // what the CUDA backend runs: the bundled target and V2 / V3 fixtures (fp8 experts too) yes;
    // V4 and V3.2 no (named)
    specmla::cuda::CudaBackend::check_model(&model).unwrap();
    for fixture in ["v3_fp8", "v2_lite", "v3_tied"] {
        let m = Model::load_dir(&repo().join("models/golden").join(fixture)).unwrap();
        specmla::cuda::CudaBackend::check_model(&m).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    }
    for (fixture, want) in [("v4_mixed", "DeepSeek-V4"), ("v32_odd", "indexer")] {
        let m = Model::load_dir(&repo().join("models/golden").join(fixture)).unwrap();
        let e = specmla::cuda::CudaBackend::check_model(&m)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{fixture}: {e}");
    }
    // (a machine with a driver runs the real backend in scripts/gpu-check.sh instead)
    if !specmla::cuda::device::driver_present() {
        let cfg = EngineConfig {
            device: Device::Cuda(0),
            kv_dtype: KvDtype::Bf16,
            ..EngineConfig::default()
        };
        let e = refusal(cfg, "no driver");
        assert!(e.contains("CUDA") || e.contains("NVRTC"), "{e}");
    }
    // and the process keeps serving on the CPU
    let engine = Engine::from_model(
        model,
        None,
        EngineConfig {
            kv_dtype: KvDtype::Bf16,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut r = Request::new(Prompt::Tokens(vec![5, 6, 7, 8]));
    r.sampling.max_tokens = 4;
    r.sampling.ignore_eos = true;
    assert_eq!(engine.generate(vec![r]).unwrap()[0].token_ids.len(), 4);
}

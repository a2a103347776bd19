//! Fuzz entry point `config`: bytes as the text of a `config.json` (non-UTF-8 bytes are replaced,
//! as a lossy reader would) -> `ModelConfig::from_json_str`, then everything computed from an
//! accepted config before any weights are read: the summary, the softmax scale, the expected
//! tensor list, the tensor-set check against an empty checkpoint (must refuse), the RoPE tables
//! and a one-block KV cache.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv::{KvCache, KvConfig, KvDtype};
use crate::model::rope::Rope;
use crate::weights::{check_tensor_set, expected_tensor_shapes, WeightSource, WeightStore};

/// Most expected tensors for which the tensor list and the tensor-set check are computed, and
/// largest one-block KV cache the harness creates.
///
/// `ModelConfig` bounds every dimension and the expected tensor count (2^20; fuzz finding F1,
/// `fuzz/regressions/config/layers_x_experts.json`). The harness skips configs over 2^16 expected
/// tensors anyway, so the fuzzer spends its time on new paths rather than on building long lists.
/// The KV
/// bound is the harness's own: a one-block cache of the largest accepted config is 4 GB, which
/// only a checkpoint of that size could make the engine allocate.
const MAX_TENSORS: usize = 1 << 16;
const MAX_KV_BLOCK_BYTES: usize = 1 << 26;

/// Whether computing the derived values of `cfg` costs work bounded by the limits above.
fn derived_work_is_bounded(cfg: &ModelConfig) -> bool {
    let experts = match &cfg.v4 {
        Some(v) => v.n_routed_experts,
        None => cfg.moe.as_ref().map_or(0, |m| m.n_routed_experts),
    };
    // every layer: at most 12 attention / norm / dense tensors, 2 router tensors, 3 per expert;
    // each doubled by fp8 scales
    let tensors = (experts.checked_mul(3))
        .and_then(|e| e.checked_add(14))
        .and_then(|t| t.checked_mul(2))
        .and_then(|t| t.checked_mul(cfg.num_hidden_layers));
    let kv_block = (cfg.kv_lora_rank.checked_add(cfg.qk_rope_head_dim))
        .and_then(|d| d.checked_mul(4))
        .and_then(|d| d.checked_mul(cfg.num_hidden_layers));
    tensors.is_some_and(|t| t <= MAX_TENSORS) && kv_block.is_some_and(|b| b <= MAX_KV_BLOCK_BYTES)
}

/// See the module doc.
pub fn config(data: &[u8]) -> Result<()> {
    let text = String::from_utf8_lossy(data);
    let cfg = ModelConfig::from_json_str(&text)?;
    if !derived_work_is_bounded(&cfg) {
        return Ok(());
    }
    let _ = (cfg.qk_head_dim(), cfg.kv_cache_dim(), cfg.num_moe_layers());
    let scale = cfg.softmax_scale();
    assert!(
        !scale.is_nan(),
        "softmax_scale is NaN for an accepted config"
    );
    let summary = cfg.to_summary_json().to_string();
    assert!(summary.starts_with('{'));

    let shapes = if cfg.v4.is_some() {
        crate::model::v4_tensor_shapes(&cfg)
    } else {
        expected_tensor_shapes(&cfg)
    };
    assert!(!shapes.is_empty());
    // The smallest valid checkpoint: a header `{}` and no tensors. It must never pass.
    let empty = WeightStore::open(WeightSource::Bytes(b"\x02\0\0\0\0\0\0\0{}".to_vec()))?;
    match check_tensor_set(&cfg, &empty) {
        Err(Error::Tensor { .. }) => {}
        other => panic!("an empty checkpoint passed the tensor-set check: {other:?}"),
    }

    let rope = Rope::new(&cfg);
    let mut x = vec![0.5f32; cfg.qk_rope_head_dim]; // [qk_rope_head_dim]
    for pos in [0, 1, cfg.max_position_embeddings, usize::MAX] {
        rope.apply(&mut x, pos);
    }

    let kv = KvCache::new(KvConfig::for_model(&cfg, 1, 1, KvDtype::Fp8E4M3));
    if let Err(e) = kv {
        // A config the model accepts must describe a cache the engine can create.
        panic!("accepted config but a one-block KV cache is refused: {e}");
    }
    Ok(())
}

//! DeepSeek-V3.2 (`model_type deepseek_v32`) fields: the lightning indexer of DeepSeek Sparse
//! Attention, and the per-layer type lists transformers' `DeepseekV32Config` writes.
//!
//! Where it sits: read by `model_config.rs` while parsing a V3.2 config; the result sizes the
//! indexer weights (`weights::expected`, `model::load`), the index-key cache group (`kv`) and the
//! top-k selection (`model::indexer`).
//! Guarantees: defaults are transformers 5.24's (`index_topk` 2048, `index_head_dim` 128,
//! `index_n_heads` 64); an `index_topk` of 0, index heads narrower than the rotary part they carry,
//! a `layer_types` entry other than `indexed_attention` or an `mlp_layer_types` list that is not
//! dense-then-sparse are refused with the field named.

use serde_json::Value;

use super::json::Obj;
use crate::error::Result;

/// The lightning indexer's geometry (the same in every layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerConfig {
    /// Index heads H_I (`index_n_heads`): each scores every earlier token.
    pub n_heads: usize,
    /// Index head width D (`index_head_dim`); the first `qk_rope_head_dim` dims carry RoPE.
    pub head_dim: usize,
    /// Tokens each query attends to (`index_topk`); all earlier tokens when the context is shorter.
    pub topk: usize,
}

/// Bound on `index_n_heads` / `index_head_dim` (V3.2: 64 x 128).
const MAX_INDEX_DIM: usize = 1 << 12;

/// Read the indexer fields of a V3.2 config (`rope_dim` = `qk_rope_head_dim`, already checked).
pub(crate) fn parse_indexer(o: &Obj<'_>, rope_dim: usize) -> Result<IndexerConfig> {
    let n_heads = o.usize_or("index_n_heads", 64)?;
    let head_dim = o.usize_or("index_head_dim", 128)?;
    let topk = o.usize_or("index_topk", 2048)?;
    for (key, v) in [("index_n_heads", n_heads), ("index_head_dim", head_dim)] {
        if v == 0 {
            return Err(o.err(key, "must be > 0"));
        }
        if v > MAX_INDEX_DIM {
            return Err(o.err(
                key,
                format!("{v} exceeds the supported maximum {MAX_INDEX_DIM}"),
            ));
        }
    }
    if topk == 0 {
        return Err(o.err(
            "index_topk",
            "must be > 0 (every query attends to at least one token)",
        ));
    }
    if head_dim < rope_dim {
        return Err(o.err(
            "index_head_dim",
            format!(
                "{head_dim} is narrower than qk_rope_head_dim = {rope_dim}, the rotary dims each \
                 index head carries"
            ),
        ));
    }
    Ok(IndexerConfig {
        n_heads,
        head_dim,
        topk,
    })
}

/// A per-decoder-layer list field: `None` when absent, else exactly `layers` entries.
fn per_layer_list<'a>(o: &Obj<'a>, key: &str, layers: usize) -> Result<Option<&'a Vec<Value>>> {
    let Some(v) = o.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        return Err(o.err(key, format!("expected a list, found {v}")));
    };
    if items.len() != layers {
        return Err(o.err(
            key,
            format!("{} entries for num_hidden_layers = {layers}", items.len()),
        ));
    }
    Ok(Some(items))
}

/// `layer_types` (transformers: `indexed_attention` per decoder layer): absent, or exactly
/// `num_hidden_layers` entries, all `indexed_attention`.
pub(crate) fn check_layer_types(o: &Obj<'_>, layers: usize) -> Result<()> {
    let Some(items) = per_layer_list(o, "layer_types", layers)? else {
        return Ok(());
    };
    if let Some(bad) = items
        .iter()
        .find(|t| t.as_str() != Some("indexed_attention"))
    {
        return Err(o.err(
            "layer_types",
            format!("{bad} is not supported (deepseek_v32 layers are indexed_attention)"),
        ));
    }
    Ok(())
}

/// `mlp_layer_types` (`dense` / `sparse` per decoder layer) as the number of leading dense
/// layers: `None` when absent; refused unless it is `dense`* then `sparse`* of the right length.
pub(crate) fn leading_dense_layers(o: &Obj<'_>, layers: usize) -> Result<Option<usize>> {
    let Some(items) = per_layer_list(o, "mlp_layer_types", layers)? else {
        return Ok(None);
    };
    let dense = items
        .iter()
        .take_while(|t| t.as_str() == Some("dense"))
        .count();
    if let Some(bad) = items[dense..].iter().find(|t| t.as_str() != Some("sparse")) {
        return Err(o.err(
            "mlp_layer_types",
            format!(
                "{bad} after the leading dense layers: only dense layers followed by sparse \
                 (MoE) layers are supported"
            ),
        ));
    }
    Ok(Some(dense))
}

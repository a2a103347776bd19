//! Checkpoint directory helpers shared by the writers (`quantize`, `widen`): which shard files
//! a directory holds, and writing a list of tensors as one safetensors file.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dtype::DType;
use crate::error::{Error, Result};

/// One tensor to write: (name, dtype, shape, little-endian bytes).
pub(crate) type OutTensor = (String, DType, Vec<usize>, Vec<u8>);

pub(crate) fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

/// The checkpoint's shard files (index order, or the single / every `*.safetensors`).
pub(crate) fn shard_files(src: &Path) -> Result<Vec<PathBuf>> {
    let index = src.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| io(&index, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Error::Safetensors {
            path: index.display().to_string(),
            msg: format!("invalid JSON: {e}"),
        })?;
        let mut files: Vec<String> = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| {
                m.values()
                    .filter_map(|f| f.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files.dedup();
        if files.iter().any(|f| Path::new(f).components().count() != 1) {
            return Err(Error::Safetensors {
                path: index.display().to_string(),
                msg: "weight_map names a path, not a file".into(),
            });
        }
        return Ok(files.into_iter().map(|f| src.join(f)).collect());
    }
    let single = src.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(src)
        .map_err(|e| io(src, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(Error::Safetensors {
            path: src.display().to_string(),
            msg: "no safetensors files".into(),
        });
    }
    Ok(v)
}

/// Write `tensors` as one safetensors file at `path`, written back and out of the page cache
/// ([`super::pages::drop_from_page_cache`]).
pub(crate) fn write_safetensors(path: &Path, tensors: &[OutTensor]) -> Result<()> {
    let st = |e: safetensors::SafeTensorError| Error::Safetensors {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dt, shape, data) in tensors {
        let d = match dt {
            DType::F32 => safetensors::Dtype::F32,
            DType::BF16 => safetensors::Dtype::BF16,
            DType::F16 => safetensors::Dtype::F16,
            DType::F8E4M3 => safetensors::Dtype::F8_E4M3,
            DType::Other(o) => {
                return Err(Error::Safetensors {
                    path: path.display().to_string(),
                    msg: format!("tensor `{name}`: cannot re-write dtype {o}"),
                })
            }
        };
        views.push((
            name.clone(),
            safetensors::tensor::TensorView::new(d, shape.clone(), data).map_err(st)?,
        ));
    }
    safetensors::serialize_to_file(views, None, path).map_err(st)?;
    // Out of the page cache, so the engine that loads the new checkpoint maps it in 2 MB pages
    // (a just-written file stays cached in the write's small folios; `pages`).
    super::pages::drop_from_page_cache(path).map_err(|e| io(path, e))
}

/// `dir/config.json` as JSON.
pub(crate) fn read_config_json(dir: &Path) -> Result<Value> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        field: "config.json".into(),
        msg: format!("{}: invalid JSON: {e}", p.display()),
    })
}

/// Copy every file of `src` except the weights and config.json (tokenizer, generation config,
/// model card) into `dst`.
pub(crate) fn copy_non_weight_files(src: &Path, dst: &Path) -> Result<()> {
    for e in std::fs::read_dir(src).map_err(|e| io(src, e))? {
        let path = e.map_err(|e| io(src, e))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let skip = name == "config.json"
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json";
        if path.is_file() && !skip {
            std::fs::copy(&path, dst.join(&name)).map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

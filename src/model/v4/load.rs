//! Building the V4 part of a `Model` from a `WeightStore`, under either naming: what
//! transformers' `save_pretrained` writes (`model.layers.N.attn.*`, `model.embed_tokens`,
//! `model.norm`, `model.hc_head.hc_*`, `head.weight`, `attn.norm`) or the official checkpoint's
//! (`layers.N.attn.*`, `embed`, `norm`, `hc_head_*`, `attn.kv_norm`, int32 `tid2eid`). Every
//! tensor is checked by name and shape; a tensor neither naming expects (other than the MTP
//! layer's `mtp.*`) is refused, so a checkpoint of another shape never loads silently.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::config::{ModelConfig, V4Attn, V4Config};
use crate::error::{Error, Result};
use crate::kernels::{matrix_row_f32, Matrix, MatrixData};
use crate::model::rope::Rope;
use crate::model::weights::Expert;
use crate::weights::{DType, Loader, WeightStore};

use super::{
    Compressor, HcHead, HyperConn, V4Attention, V4Ffn, V4Indexer, V4Layer, V4Model, V4Mtp,
};

/// Which naming the checkpoint uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    Transformers,
    Official,
}

struct Names<'a> {
    ld: Loader<'a>,
    naming: Naming,
    used: Mutex<HashSet<String>>,
}

/// Where a decoder block's tensors live: decoder layer `i`, or MTP layer `m` (`mtp.{m}.*`,
/// the official naming under either checkpoint naming: transformers does not save them).
#[derive(Clone, Copy)]
enum Site {
    Layer(usize),
    Mtp(usize),
}

impl<'a> Names<'a> {
    /// Full name of a block tensor (`rest` in DeepSeek's naming, e.g. `attn.wq_a.weight`).
    fn layer(&self, site: Site, rest: &str) -> String {
        match (site, self.naming) {
            (Site::Layer(i), Naming::Transformers) => format!("model.layers.{i}.{rest}"),
            (Site::Layer(i), Naming::Official) => format!("layers.{i}.{rest}"),
            (Site::Mtp(m), _) => format!("mtp.{m}.{rest}"),
        }
    }

    /// The first of `names` the store has (else an error naming the first).
    fn pick(&self, names: &[String]) -> Result<String> {
        let n = names
            .iter()
            .find(|n| self.ld.has(n))
            .ok_or_else(|| Error::tensor(&names[0], "missing from the checkpoint"))?;
        self.used.lock().unwrap().insert(n.clone());
        Ok(n.clone())
    }

    fn matrix(&self, names: &[String], rows: usize, cols: usize) -> Result<Matrix> {
        let n = self.pick(names)?;
        let t = self.ld.store.get(&n).expect("picked");
        match &t.dtype {
            DType::F8E4M3 => self.fp8(&n, rows, cols),
            DType::Other(d) if d == "i8" || d == "u8" => self.fp4(&n, rows, cols),
            _ => self.ld.matrix(&n, rows, cols),
        }
    }

    /// The block scales of quantised weight `n` (transformers: `<n>_scale_inv`; official:
    /// `<module>.scale`) as f32 with their grid [rows, cols]: f32, bf16, or ue8m0 / u8
    /// exponents (2^(e - 127)).
    fn scales(&self, n: &str) -> Result<(Vec<f32>, usize, usize)> {
        let cands = [
            format!("{n}_scale_inv"),
            format!("{}.scale", n.strip_suffix(".weight").unwrap_or(n)),
        ];
        let sn = self.pick(&cands).map_err(|_| {
            Error::tensor(
                n,
                format!(
                    "quantised, but neither {} nor {} is in the checkpoint",
                    cands[0], cands[1]
                ),
            )
        })?;
        let t = self.ld.store.get(&sn).expect("picked");
        let [r, c] = t.shape[..] else {
            return Err(Error::tensor(
                &sn,
                format!("shape {:?}, expected a 2-D grid", t.shape),
            ));
        };
        let v: Vec<f32> = match &t.dtype {
            DType::F32 => t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            DType::BF16 => t
                .data
                .chunks_exact(2)
                .map(|b| crate::weights::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            DType::Other(d) if d == "f8_e8m0" || d == "u8" => t
                .data
                .iter()
                .map(|&e| {
                    if e == 255 {
                        f32::NAN
                    } else {
                        (e as f32 - 127.0).exp2()
                    }
                })
                .collect(),
            d => {
                return Err(Error::tensor(
                    &sn,
                    format!("scale dtype {d} (f32, bf16 or f8_e8m0)"),
                ))
            }
        };
        if v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(Error::tensor(
                &sn,
                "a scale is not a finite positive number",
            ));
        }
        Ok((v, r, c))
    }

    /// fp8 e4m3 block-quantised weight [rows, cols] (block sizes from the scale grid).
    fn fp8(&self, n: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.ld.store.get(n).expect("picked");
        if t.shape != [rows, cols] {
            return Err(Error::tensor(
                n,
                format!("shape {:?}, expected [{rows}, {cols}]", t.shape),
            ));
        }
        let (sc, sr, scc) = self.scales(n)?;
        let (br, bc) = (rows.div_ceil(sr.max(1)), cols.div_ceil(scc.max(1)));
        if sr == 0 || scc == 0 || rows.div_ceil(br) != sr || cols.div_ceil(bc) != scc {
            return Err(Error::tensor(
                n,
                format!("scale grid [{sr}, {scc}] does not tile [{rows}, {cols}]"),
            ));
        }
        Ok(Matrix::from_fp8(rows, cols, t.data.to_vec(), sc, br, bc))
    }

    /// fp4 e2m1 weight (the official checkpoint's experts): [rows, cols / 2] bytes, low nibble
    /// first, one ue8m0 scale per row and per `cols / grid_cols` columns; decoded to bf16, which
    /// holds every e2m1 value times a power of two exactly.
    fn fp4(&self, n: &str, rows: usize, cols: usize) -> Result<Matrix> {
        const LUT: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        let t = self.ld.store.get(n).expect("picked");
        if !cols.is_multiple_of(2) || t.shape != [rows, cols / 2] {
            return Err(Error::tensor(
                n,
                format!(
                    "fp4 shape {:?}, expected [{rows}, {}] (two values per byte)",
                    t.shape,
                    cols / 2
                ),
            ));
        }
        let (sc, sr, scc) = self.scales(n)?;
        if sr != rows || scc == 0 || !cols.is_multiple_of(scc) {
            return Err(Error::tensor(
                n,
                format!("fp4 scale grid [{sr}, {scc}] does not tile [{rows}, {cols}]"),
            ));
        }
        let bn = cols / scc;
        let mut out = vec![0u16; rows * cols]; // [rows, cols] bf16 bits
        for r in 0..rows {
            for (j, &b) in t.data[r * cols / 2..(r + 1) * cols / 2].iter().enumerate() {
                for (k, nib) in [b & 0xF, b >> 4].into_iter().enumerate() {
                    let c = 2 * j + k;
                    let v = LUT[nib as usize] * sc[r * scc + c / bn];
                    out[r * cols + c] = crate::weights::f32_to_bf16(v);
                }
            }
        }
        Ok(Matrix::from_bf16(rows, cols, out))
    }

    fn vector(&self, names: &[String], len: usize) -> Result<Vec<f32>> {
        let n = self.pick(names)?;
        self.ld.vector_f32(&n, len)
    }

    fn matrix_f32(&self, names: &[String], rows: usize, cols: usize) -> Result<Vec<f32>> {
        let n = self.pick(names)?;
        self.ld.matrix_f32(&n, rows, cols)
    }

    /// tid2eid [vocab, k] as i64 (transformers) or i32 (official); every id < n_experts.
    fn tid2eid(&self, name: &str, vocab: usize, k: usize, n_experts: usize) -> Result<Vec<u32>> {
        let n = self.pick(&[name.to_string()])?;
        let t = self.ld.store.get(&n).expect("picked");
        if t.shape != [vocab, k] {
            return Err(Error::tensor(
                &n,
                format!("shape {:?}, expected [{vocab}, {k}]", t.shape),
            ));
        }
        let ids: Vec<i64> = match &t.dtype {
            DType::Other(d) if d == "i64" => t
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            DType::Other(d) if d == "i32" => t
                .data
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64)
                .collect(),
            d => return Err(Error::tensor(&n, format!("dtype {d}, expected i64 or i32"))),
        };
        ids.iter()
            .map(|&e| {
                u32::try_from(e)
                    .ok()
                    .filter(|&e| (e as usize) < n_experts)
                    .ok_or_else(|| {
                        Error::tensor(&n, format!("expert id {e} outside 0..{n_experts}"))
                    })
            })
            .collect()
    }
}

/// What `load_v4` returns: (embed, lm_head (None when tied), final norm, the V4 layers).
pub(crate) type V4Parts = (Matrix, Option<Matrix>, Vec<f32>, V4Model);

fn s(x: &str) -> String {
    x.to_string()
}

/// Load every V4 tensor of `store` for `cfg`.
pub(crate) fn load_v4(cfg: &ModelConfig, store: &WeightStore) -> Result<V4Parts> {
    let v = cfg.v4.as_ref().expect("a V4 config");
    let ld = Loader::new(store, cfg.quantization);
    let naming = if ld.has("model.embed_tokens.weight") {
        Naming::Transformers
    } else if ld.has("embed.weight") {
        Naming::Official
    } else {
        return Err(Error::tensor(
            "model.embed_tokens.weight",
            "missing from the checkpoint (nor the official `embed.weight`)",
        ));
    };
    let nm = Names {
        ld,
        naming,
        used: Mutex::new(HashSet::new()),
    };
    let (h, vocab) = (cfg.hidden_size, cfg.vocab_size);
    let embed = nm.matrix(
        &[s("model.embed_tokens.weight"), s("embed.weight")],
        vocab,
        h,
    )?;
    let head_names = [s("head.weight"), s("lm_head.weight")];
    let lm_head = if cfg.tie_word_embeddings && !head_names.iter().any(|n| nm.ld.has(n)) {
        None
    } else {
        Some(nm.matrix(&head_names, vocab, h)?)
    };
    let norm = nm.vector(&[s("model.norm.weight"), s("norm.weight")], h)?;
    let n = v.hc_mult;
    let hc_head = HcHead {
        fn_w: nm.matrix_f32(&[s("model.hc_head.hc_fn"), s("hc_head_fn")], n, n * h)?,
        base: nm.vector(&[s("model.hc_head.hc_base"), s("hc_head_base")], n)?,
        scale: nm.vector(&[s("model.hc_head.hc_scale"), s("hc_head_scale")], 1)?[0],
    };
    let layers = (0..cfg.num_hidden_layers)
        .map(|i| {
            load_layer(
                &nm,
                cfg,
                v,
                Site::Layer(i),
                v.layer_types[i],
                v.hash_layers[i],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // MTP layers: loaded when the checkpoint holds them (their `e_proj`); then every `mtp.*`
    // tensor must be one of theirs, else `mtp.*` is left alone as before.
    let mtp = (0..cfg.num_nextn_predict_layers)
        .take_while(|m| nm.ld.has(&format!("mtp.{m}.e_proj.weight")))
        .map(|m| load_mtp(&nm, cfg, v, m))
        .collect::<Result<Vec<_>>>()?;
    let used = nm.used.into_inner().unwrap();
    let mut extra: Vec<&str> = store
        .names()
        .filter(|n| !used.contains(*n) && (!mtp.is_empty() || !n.starts_with("mtp.")))
        .collect();
    extra.sort_unstable();
    if let Some(first) = extra.first() {
        return Err(Error::tensor(
            *first,
            format!(
                "not expected for this deepseek_v4 config ({} unexpected tensors)",
                extra.len()
            ),
        ));
    }
    let rope_main = Rope::from_parts(v.rope_dim, v.main_theta, None);
    let rope_compress = Rope::from_parts(v.rope_dim, v.compress_theta, v.compress_yarn.as_ref());
    Ok((
        embed,
        lm_head,
        norm,
        V4Model {
            layers,
            hc_head,
            mtp,
            rope_main,
            rope_compress,
        },
    ))
}

/// An f32 copy of `m` (each row dequantised as the matmul does).
fn to_f32(m: &Matrix) -> Matrix {
    let mut out = vec![0f32; m.rows * m.cols]; // [rows, cols]
    for (r, row) in out.chunks_exact_mut(m.cols).enumerate() {
        matrix_row_f32(m, r, row);
    }
    Matrix::from_f32(m.rows, m.cols, out)
}

fn hyper(nm: &Names, i: Site, which: &str, n: usize, h: usize) -> Result<HyperConn> {
    let m = (2 + n) * n;
    let sc = nm.vector(&[nm.layer(i, &format!("hc_{which}_scale"))], 3)?;
    Ok(HyperConn {
        fn_w: nm.matrix_f32(&[nm.layer(i, &format!("hc_{which}_fn"))], m, n * h)?,
        base: nm.vector(&[nm.layer(i, &format!("hc_{which}_base"))], m)?,
        scale: [sc[0], sc[1], sc[2]],
    })
}

fn compressor(
    nm: &Names,
    i: Site,
    pre: &str,
    h: usize,
    dim: usize,
    rate: usize,
    overlap: bool,
) -> Result<Compressor> {
    let k = if overlap { 2 } else { 1 };
    let t = |x: &str| nm.layer(i, &format!("{pre}.{x}"));
    Ok(Compressor {
        wkv: nm.matrix(&[t("wkv.weight")], k * dim, h)?,
        wgate: nm.matrix(&[t("wgate.weight")], k * dim, h)?,
        ape: nm.matrix_f32(&[t("ape")], rate, k * dim)?,
        norm: nm.vector(&[t("norm.weight"), t("kv_norm.weight")], dim)?,
        dim,
        overlap,
    })
}

fn expert(nm: &Names, i: Site, pre: &str, h: usize, inter: usize) -> Result<Expert> {
    let t = |x: &str| nm.layer(i, &format!("{pre}.{x}.weight"));
    Ok(Expert {
        gate: nm.matrix(&[t("w1")], inter, h)?,
        up: nm.matrix(&[t("w3")], inter, h)?,
        down: nm.matrix(&[t("w2")], h, inter)?,
    })
}

/// MTP layer `m` (`mtp.{m}.*`): its projections, norms, hyper head and decoder block.
fn load_mtp(nm: &Names, cfg: &ModelConfig, v: &V4Config, m: usize) -> Result<V4Mtp> {
    let site = Site::Mtp(m);
    let t = |x: &str| nm.layer(site, x);
    let (h, n) = (cfg.hidden_size, v.hc_mult);
    let head = if nm.ld.has(&t("head.weight")) {
        Some(nm.matrix(&[t("head.weight")], cfg.vocab_size, h)?)
    } else {
        None
    };
    Ok(V4Mtp {
        enorm: nm.vector(&[t("enorm.weight")], h)?,
        hnorm: nm.vector(&[t("hnorm.weight")], h)?,
        e_proj: nm.matrix(&[t("e_proj.weight")], h, h)?,
        h_proj: nm.matrix(&[t("h_proj.weight")], h, h)?,
        block: load_layer(nm, cfg, v, site, v.mtp_layer_types[m], false)?,
        hc_head: HcHead {
            fn_w: nm.matrix_f32(&[t("hc_head_fn")], n, n * h)?,
            base: nm.vector(&[t("hc_head_base")], n)?,
            scale: nm.vector(&[t("hc_head_scale")], 1)?[0],
        },
        norm: nm.vector(&[t("norm.weight")], h)?,
        head,
    })
}

fn load_layer(
    nm: &Names,
    cfg: &ModelConfig,
    v: &V4Config,
    i: Site,
    kind: V4Attn,
    hash: bool,
) -> Result<V4Layer> {
    let h = cfg.hidden_size;
    let (heads, d) = (cfg.num_attention_heads, v.head_dim);
    let a = |x: &str| nm.layer(i, &format!("attn.{x}"));
    let (compressor, indexer) = match kind {
        V4Attn::Sliding => (None, None),
        V4Attn::Hca => (
            Some(compressor(
                nm,
                i,
                "attn.compressor",
                h,
                d,
                v.hca_rate,
                false,
            )?),
            None,
        ),
        V4Attn::Csa => (
            Some(compressor(
                nm,
                i,
                "attn.compressor",
                h,
                d,
                v.csa_rate,
                true,
            )?),
            Some(V4Indexer {
                wq_b: nm.matrix(
                    &[a("indexer.wq_b.weight")],
                    v.index_n_heads * v.index_head_dim,
                    v.q_lora_rank,
                )?,
                weights_proj: nm.matrix(&[a("indexer.weights_proj.weight")], v.index_n_heads, h)?,
                comp: compressor(
                    nm,
                    i,
                    "attn.indexer.compressor",
                    h,
                    v.index_head_dim,
                    v.csa_rate,
                    true,
                )?,
            }),
        ),
    };
    let (g, r) = (v.o_groups, v.o_lora_rank);
    let mut wo_a_full = nm.matrix(&[a("wo_a.weight")], g * r, heads * d / g)?;
    if let MatrixData::Fp8 { block_rows, .. } = &wo_a_full.data {
        if r % block_rows != 0 {
            // the group views would split fp8 blocks: keep wo_a dequantised (f32, exact)
            wo_a_full = to_f32(&wo_a_full);
        }
    }
    let attn = V4Attention {
        wq_a: nm.matrix(&[a("wq_a.weight")], v.q_lora_rank, h)?,
        q_norm: nm.vector(&[a("q_norm.weight")], v.q_lora_rank)?,
        wq_b: nm.matrix(&[a("wq_b.weight")], heads * d, v.q_lora_rank)?,
        wkv: nm.matrix(&[a("wkv.weight")], d, h)?,
        kv_norm: nm.vector(&[a("norm.weight"), a("kv_norm.weight")], d)?,
        wo_a: (0..g).map(|j| wo_a_full.rows_view(j * r, r)).collect(),
        wo_a_full,
        wo_b: nm.matrix(&[a("wo_b.weight")], h, g * r)?,
        sinks: nm.vector(&[a("attn_sink")], heads)?,
        compressor,
        indexer,
    };
    let e = v.n_routed_experts;
    let f = |x: &str| nm.layer(i, &format!("ffn.{x}"));
    let ffn = V4Ffn {
        gate: nm.matrix_f32(&[f("gate.weight")], e, h)?,
        bias: if hash {
            None
        } else {
            Some(nm.vector(&[f("gate.bias")], e)?)
        },
        tid2eid: if hash {
            Some(nm.tid2eid(&f("gate.tid2eid"), cfg.vocab_size, v.num_experts_per_tok, e)?)
        } else {
            None
        },
        experts: (0..e)
            .map(|j| {
                expert(
                    nm,
                    i,
                    &format!("ffn.experts.{j}"),
                    h,
                    v.moe_intermediate_size,
                )
            })
            .collect::<Result<_>>()?,
        shared: expert(nm, i, "ffn.shared_experts", h, v.moe_intermediate_size)?,
    };
    Ok(V4Layer {
        attn_norm: nm.vector(&[nm.layer(i, "attn_norm.weight")], h)?,
        ffn_norm: nm.vector(&[nm.layer(i, "ffn_norm.weight")], h)?,
        attn_hc: hyper(nm, i, "attn", v.hc_mult, h)?,
        ffn_hc: hyper(nm, i, "ffn", v.hc_mult, h)?,
        attn,
        ffn,
    })
}

/// Every tensor a V4 checkpoint of `cfg` holds, in transformers' `save_pretrained` naming, with
/// its shape (`tid2eid` is an integer table; everything else floats). For writers of synthetic
/// checkpoints (`specmla bench --v4`).
pub fn v4_tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let v = cfg.v4.as_ref().expect("a V4 config");
    let (h, vocab, heads, d) = (
        cfg.hidden_size,
        cfg.vocab_size,
        cfg.num_attention_heads,
        v.head_dim,
    );
    let n = v.hc_mult;
    let mut out = vec![
        (s("model.embed_tokens.weight"), vec![vocab, h]),
        (s("model.norm.weight"), vec![h]),
        (s("model.hc_head.hc_fn"), vec![n, n * h]),
        (s("model.hc_head.hc_base"), vec![n]),
        (s("model.hc_head.hc_scale"), vec![1]),
    ];
    if !cfg.tie_word_embeddings {
        out.push((s("head.weight"), vec![vocab, h]));
    }
    let m = (2 + n) * n;
    for i in 0..cfg.num_hidden_layers {
        let p = |x: &str| format!("model.layers.{i}.{x}");
        for which in ["attn", "ffn"] {
            out.push((p(&format!("hc_{which}_fn")), vec![m, n * h]));
            out.push((p(&format!("hc_{which}_base")), vec![m]));
            out.push((p(&format!("hc_{which}_scale")), vec![3]));
        }
        out.push((p("attn_norm.weight"), vec![h]));
        out.push((p("ffn_norm.weight"), vec![h]));
        let (g, r) = (v.o_groups, v.o_lora_rank);
        for (name, shape) in [
            ("attn.wq_a.weight", vec![v.q_lora_rank, h]),
            ("attn.q_norm.weight", vec![v.q_lora_rank]),
            ("attn.wq_b.weight", vec![heads * d, v.q_lora_rank]),
            ("attn.wkv.weight", vec![d, h]),
            ("attn.norm.weight", vec![d]),
            ("attn.wo_a.weight", vec![g * r, heads * d / g]),
            ("attn.wo_b.weight", vec![h, g * r]),
            ("attn.attn_sink", vec![heads]),
        ] {
            out.push((p(name), shape));
        }
        let mut comp = |pre: &str, dim: usize, rate: usize, k: usize| {
            out.push((p(&format!("{pre}.wkv.weight")), vec![k * dim, h]));
            out.push((p(&format!("{pre}.wgate.weight")), vec![k * dim, h]));
            out.push((p(&format!("{pre}.ape")), vec![rate, k * dim]));
            out.push((p(&format!("{pre}.norm.weight")), vec![dim]));
        };
        match v.layer_types[i] {
            V4Attn::Sliding => {}
            V4Attn::Hca => comp("attn.compressor", d, v.hca_rate, 1),
            V4Attn::Csa => {
                comp("attn.compressor", d, v.csa_rate, 2);
                comp("attn.indexer.compressor", v.index_head_dim, v.csa_rate, 2);
                out.push((
                    p("attn.indexer.wq_b.weight"),
                    vec![v.index_n_heads * v.index_head_dim, v.q_lora_rank],
                ));
                out.push((
                    p("attn.indexer.weights_proj.weight"),
                    vec![v.index_n_heads, h],
                ));
            }
        }
        let e = v.n_routed_experts;
        out.push((p("ffn.gate.weight"), vec![e, h]));
        if v.hash_layers[i] {
            out.push((p("ffn.gate.tid2eid"), vec![vocab, v.num_experts_per_tok]));
        } else {
            out.push((p("ffn.gate.bias"), vec![e]));
        }
        let inter = v.moe_intermediate_size;
        for ex in (0..e)
            .map(|j| format!("ffn.experts.{j}"))
            .chain([s("ffn.shared_experts")])
        {
            out.push((p(&format!("{ex}.w1.weight")), vec![inter, h]));
            out.push((p(&format!("{ex}.w2.weight")), vec![h, inter]));
            out.push((p(&format!("{ex}.w3.weight")), vec![inter, h]));
        }
    }
    out
}

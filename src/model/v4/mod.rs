//! DeepSeek-V4: weights (this file), loading under both namings (`load.rs`), the forward over a
//! ragged batch (`forward.rs`: hyper-connections, MoE with hash / top-k routing), and attention
//! (`attention.rs`: the shared K=V head over a sliding window, plus the compressed branches of
//! `compressor.rs`: CSA's overlapping compression + lightning indexer, HCA's dense compression).
//!
//! Where it sits: `Model::forward_out` hands a V4 model here; the KV cache groups are
//! `kv::KvKind::{SwaKv, CsaInput, CsaEntry, HcaInput, HcaEntry}` (see `kv/spec.rs`).
//!
//! Guarantees: the reference is transformers 5.24 `models/deepseek_v4` (tested against its fp32
//! logits: models/golden/v4_*); every token takes ONE attention path whatever the chunking or
//! batch (its window rows and compressed entries are read back from the cache, entries are formed
//! from cached compressor inputs only when their window closes), so logits are bitwise the same
//! for full prompts, token-by-token decode, any chunk split and any batch. A compressed entry is
//! a function of the tokens up to its closing position, so truncation, preemption and prefix
//! caching need no extra state.

mod attention;
mod compressor;
mod forward;
mod load;

pub(crate) use forward::{v4_forward, v4_mtp_forward};
pub(crate) use load::load_v4;
pub use load::v4_tensor_shapes;

use crate::kernels::Matrix;

use super::rope::Rope;
use super::weights::{Expert, TokenWork};

/// Manifold-constrained hyper-connection of one block (N = hc_mult streams).
pub struct HyperConn {
    /// fn [(2 + N) * N, N * hidden] f32: [pre (N) | post (N) | comb (N * N)] mixes.
    pub fn_w: Vec<f32>,
    /// base [(2 + N) * N]
    pub base: Vec<f32>,
    /// scale [3]: pre, post, comb.
    pub scale: [f32; 3],
}

/// The final stream collapse before the model norm.
pub struct HcHead {
    /// hc_fn [N, N * hidden] f32
    pub fn_w: Vec<f32>,
    /// hc_base [N]
    pub base: Vec<f32>,
    pub scale: f32,
}

/// A compressor (one branch: the attention's, or the indexer's at index width).
pub struct Compressor {
    /// wkv [k * D, hidden] (k = 2 with overlapping windows (CSA), else 1).
    pub wkv: Matrix,
    /// wgate [k * D, hidden]
    pub wgate: Matrix,
    /// ape (position bias) [rate, k * D] f32
    pub ape: Vec<f32>,
    /// norm [D] (RMSNorm of the pooled entry)
    pub norm: Vec<f32>,
    /// Entry width D.
    pub dim: usize,
    pub overlap: bool,
}

/// CSA's lightning indexer.
pub struct V4Indexer {
    /// wq_b [H_I * D_I, q_lora]
    pub wq_b: Matrix,
    /// weights_proj [H_I, hidden]
    pub weights_proj: Matrix,
    /// Its own overlapping compressor at D_I.
    pub comp: Compressor,
}

/// Attention weights of one V4 layer.
pub struct V4Attention {
    /// wq_a [q_lora, hidden]
    pub wq_a: Matrix,
    /// q_norm [q_lora]
    pub q_norm: Vec<f32>,
    /// wq_b [H * D, q_lora]
    pub wq_b: Matrix,
    /// wkv [D, hidden]
    pub wkv: Matrix,
    /// kv_norm [D]
    pub kv_norm: Vec<f32>,
    /// wo_a per group: o_groups row views [o_lora, H * D / o_groups].
    pub wo_a: Vec<Matrix>,
    /// The whole wo_a [o_groups * o_lora, H * D / o_groups] (byte accounting).
    pub wo_a_full: Matrix,
    /// wo_b [hidden, o_groups * o_lora]
    pub wo_b: Matrix,
    /// attn_sink [H]
    pub sinks: Vec<f32>,
    pub compressor: Option<Compressor>,
    pub indexer: Option<V4Indexer>,
}

/// MoE of one V4 layer (every layer is MoE).
pub struct V4Ffn {
    /// gate.weight [E, hidden] f32
    pub gate: Vec<f32>,
    /// gate.bias (e_score_correction_bias) [E]; top-k layers only.
    pub bias: Option<Vec<f32>>,
    /// tid2eid [vocab, k]; hash layers only.
    pub tid2eid: Option<Vec<u32>>,
    pub experts: Vec<Expert>,
    pub shared: Expert,
}

/// One V4 decoder layer.
pub struct V4Layer {
    /// attn_norm [hidden]
    pub attn_norm: Vec<f32>,
    /// ffn_norm [hidden]
    pub ffn_norm: Vec<f32>,
    pub attn_hc: HyperConn,
    pub ffn_hc: HyperConn,
    pub attn: V4Attention,
    pub ffn: V4Ffn,
}

/// One V4 multi-token-prediction layer (`mtp.{m}.*`; the official checkpoint's naming, which
/// transformers does not load). As DeepSeek's `MTPBlock` and vLLM's `deepseek_v4_mtp.py`:
/// streams x = e_proj(enorm(embed(t_{j+1}))) (broadcast over the streams) + h_proj(hnorm(h_j))
/// per stream, where h_j are the target's residual streams at position j before its hyper head;
/// one V4 decoder block; logits = head(norm(hc_head(x'))).
pub struct V4Mtp {
    /// enorm [hidden]
    pub enorm: Vec<f32>,
    /// hnorm [hidden] (applied to each stream)
    pub hnorm: Vec<f32>,
    /// e_proj [hidden, hidden]
    pub e_proj: Matrix,
    /// h_proj [hidden, hidden]
    pub h_proj: Matrix,
    /// The decoder block (attention kind: the config's MTP entry; top-k MoE).
    pub block: V4Layer,
    /// The MTP layer's own stream collapse before its norm.
    pub hc_head: HcHead,
    /// norm [hidden]
    pub norm: Vec<f32>,
    /// head [vocab, hidden]; None: the target's lm_head (the official release shares it).
    pub head: Option<Matrix>,
}

/// The V4-specific part of a `Model` (embedding, final norm and lm_head live in `Model`).
pub struct V4Model {
    pub layers: Vec<V4Layer>,
    pub hc_head: HcHead,
    /// The MTP layers the checkpoint holds (empty when it has none).
    pub mtp: Vec<V4Mtp>,
    /// RoPE of sliding layers (`main`).
    pub rope_main: Rope,
    /// RoPE of CSA / HCA layers, their compressors and the indexer (`compress`).
    pub rope_compress: Rope,
}

impl V4Model {
    /// Every weight matrix (for stats / `specmla info`).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut v = Vec::new();
        for m in &self.mtp {
            v.extend([&m.e_proj, &m.h_proj]);
            v.extend(m.head.as_ref());
        }
        for l in self.layers.iter().chain(self.mtp.iter().map(|m| &m.block)) {
            let a = &l.attn;
            v.extend([&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a_full, &a.wo_b]);
            if let Some(c) = &a.compressor {
                v.extend([&c.wkv, &c.wgate]);
            }
            if let Some(ix) = &a.indexer {
                v.extend([&ix.wq_b, &ix.weights_proj, &ix.comp.wkv, &ix.comp.wgate]);
            }
            for e in l.ffn.experts.iter().chain([&l.ffn.shared]) {
                v.extend([&e.gate, &e.up, &e.down]);
            }
        }
        v
    }

    /// Parameters as stored (matrices + vectors).
    pub fn num_params(&self) -> usize {
        let mut n: usize = self.matrices().iter().map(|m| m.numel()).sum();
        n += self.hc_head.fn_w.len() + self.hc_head.base.len() + 1;
        for m in &self.mtp {
            n += m.enorm.len() + m.hnorm.len() + m.norm.len();
            n += m.hc_head.fn_w.len() + m.hc_head.base.len() + 1;
        }
        for l in self.layers.iter().chain(self.mtp.iter().map(|m| &m.block)) {
            n += l.attn_norm.len() + l.ffn_norm.len();
            for hc in [&l.attn_hc, &l.ffn_hc] {
                n += hc.fn_w.len() + hc.base.len() + 3;
            }
            let a = &l.attn;
            n += a.q_norm.len() + a.kv_norm.len() + a.sinks.len();
            for c in a
                .compressor
                .iter()
                .chain(a.indexer.as_ref().map(|i| &i.comp))
            {
                n += c.ape.len() + c.norm.len();
            }
            n += l.ffn.gate.len() + l.ffn.bias.as_ref().map_or(0, Vec::len);
            n += l.ffn.tid2eid.as_ref().map_or(0, Vec::len);
        }
        n
    }

    /// Weight bytes a batch-1 decode step reads (top-k experts counted, not all).
    pub fn decode_bytes_per_token(&self, k: usize) -> usize {
        self.decode_work_per_token(k).bytes()
    }

    /// [`Self::decode_bytes_per_token`] split into every-token and routed work
    /// ([`TokenWork`]).
    pub fn decode_work_per_token(&self, k: usize) -> TokenWork {
        let mut w = TokenWork::default();
        let e = &mut w.every_token;
        for l in &self.layers {
            let a = &l.attn;
            [&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a_full, &a.wo_b]
                .into_iter()
                .for_each(|m| e.matrix(m));
            if let Some(c) = &a.compressor {
                e.matrix(&c.wkv);
                e.matrix(&c.wgate);
            }
            if let Some(ix) = &a.indexer {
                [&ix.wq_b, &ix.weights_proj, &ix.comp.wkv, &ix.comp.wgate]
                    .into_iter()
                    .for_each(|m| e.matrix(m));
            }
            e.floats(l.ffn.gate.len());
            e.expert(&l.ffn.shared);
            e.floats(l.attn_hc.fn_w.len() + l.ffn_hc.fn_w.len());
        }
        e.floats(self.hc_head.fn_w.len());
        for l in &self.layers {
            if let Some(x) = l.ffn.experts.first() {
                (0..k).for_each(|_| w.routed.expert(x));
            }
        }
        w
    }
}

//! What a KV cache holds: one [`KvGroupSpec`] per kind of per-token state, all paged through the
//! same block pool and block tables.
//!
//! Where it sits: `KvConfig::for_model` derives the groups from a `ModelConfig` (the MLA latent
//! for every model; V3.2 adds its indexer keys); `KvCache` allocates one storage pool per group
//! and addresses every group's entry of a token through the token's block (so plan-then-commit,
//! truncation, copy-on-write, prefix caching and preemption act on all groups at once); `specmla
//! info` and the engine's stats print the byte accounting per kind.
//!
//! Guarantees: byte accounting is exact — [`KvGroupSpec::entry_bytes`] is what the pool stores per
//! entry (values plus fp8 scales), and a pool of `B` blocks of `b` tokens stores exactly
//! `B * b * sum_g(entry_bytes_g * layers_g)` bytes. Each group has its own dtype.
//!
//! DeepSeek V4's kinds: its K=V rows and compressor inputs are *windowed* (read only within a
//! lookback `r0`, see [`KvConfig::window`]): they live in a window table class with its own pool
//! and block table per sequence (`kv::window`), blocks wholly older than `len - r0` released at
//! the next commit. Its compressed entries (one per `rate` tokens, formed when the closing token
//! is written) live in the main table: entry `w` sits in the block of position `(w + 1) * rate -
//! 1`, `block_size / rate` entries per block (one when the rate is larger), so truncation,
//! copy-on-write, prefix caching and preemption treat them like any per-token group.

use super::dtype::{fp8_groups, KvDtype};
use crate::config::{ModelConfig, V4Attn, V4Config};

/// What one group stores per token per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvKind {
    /// MLA's latent `[c_kv (kv_lora_rank, normalised) | k_pe (rope_dim, roped)]`.
    MlaLatent {
        kv_lora_rank: usize,
        rope_dim: usize,
    },
    /// V3.2's lightning-indexer key `[index_head_dim]` (LayerNorm'd, roped; Hadamard-rotated
    /// when stored below f32, see `model::indexer`).
    IndexKey { head_dim: usize },
    /// V4: the one shared K=V row of a token `[head_dim]` (normed, roped), every layer.
    SwaKv { head_dim: usize },
    /// V4 CSA layers: a token's compressor inputs `[kv 2D | gate 2D | index kv 2Di | index
    /// gate 2Di]` (the two overlapping series), kept so an open window can be closed, or
    /// re-closed after a rollback, from the cache alone.
    CsaInput {
        head_dim: usize,
        index_head_dim: usize,
    },
    /// V4 CSA layers: one compressed entry per `rate` tokens `[kv D | index key Di]`.
    CsaEntry {
        head_dim: usize,
        index_head_dim: usize,
        rate: usize,
    },
    /// V4 HCA layers: a token's compressor inputs `[kv D | gate D]`.
    HcaInput { head_dim: usize },
    /// V4 HCA layers: one compressed entry per `rate` tokens `[kv D]`.
    HcaEntry { head_dim: usize, rate: usize },
}

impl KvKind {
    /// Stable name (stats, `specmla info`).
    pub fn name(&self) -> &'static str {
        match self {
            KvKind::MlaLatent { .. } => "mla_latent",
            KvKind::IndexKey { .. } => "index_key",
            KvKind::SwaKv { .. } => "swa_kv",
            KvKind::CsaInput { .. } => "csa_input",
            KvKind::CsaEntry { .. } => "csa_entry",
            KvKind::HcaInput { .. } => "hca_input",
            KvKind::HcaEntry { .. } => "hca_entry",
        }
    }

    /// Tokens per entry: 1, or a compressed kind's rate. Entry `w` of a compressed kind is
    /// formed by the token at position `(w + 1) * rate - 1` and lives in that token's block.
    pub fn rate(&self) -> usize {
        match *self {
            KvKind::CsaEntry { rate, .. } | KvKind::HcaEntry { rate, .. } => rate,
            _ => 1,
        }
    }

    /// Whether rows of this kind are only read within a bounded lookback (V4's K=V rows and
    /// compressor inputs): such groups live in the cache's window class when it has one.
    pub fn is_windowed(&self) -> bool {
        matches!(
            self,
            KvKind::SwaKv { .. } | KvKind::CsaInput { .. } | KvKind::HcaInput { .. }
        )
    }

    /// Entry slots one block of `block_size` tokens holds: `block_size / rate`, at least 1 (a
    /// rate above the block size leaves most blocks without an entry; their slot stays unused).
    pub fn slots_per_block(&self, block_size: usize) -> usize {
        (block_size / self.rate()).max(1)
    }

    /// Widths of the entry's parts, in storage order; fp8 scales are grouped per part.
    pub fn parts(&self) -> Vec<usize> {
        match *self {
            KvKind::MlaLatent {
                kv_lora_rank,
                rope_dim,
            } => vec![kv_lora_rank, rope_dim],
            KvKind::IndexKey { head_dim } | KvKind::SwaKv { head_dim } => vec![head_dim],
            KvKind::CsaInput {
                head_dim,
                index_head_dim,
            } => vec![
                2 * head_dim,
                2 * head_dim,
                2 * index_head_dim,
                2 * index_head_dim,
            ],
            KvKind::CsaEntry {
                head_dim,
                index_head_dim,
                ..
            } => vec![head_dim, index_head_dim],
            KvKind::HcaInput { head_dim } => vec![head_dim, head_dim],
            KvKind::HcaEntry { head_dim, .. } => vec![head_dim],
        }
    }

    /// Values per entry (sum of the parts).
    pub fn width(&self) -> usize {
        self.parts().iter().sum()
    }
}

/// One cache group: a kind, the layers that have it, and its stored dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGroupSpec {
    pub kind: KvKind,
    /// Layers holding this kind (layer indices `0..num_layers` of the group).
    pub num_layers: usize,
    pub dtype: KvDtype,
}

impl KvGroupSpec {
    /// Stored bytes of one entry (one token, one layer): values in the dtype, plus for fp8 one
    /// f32 scale per group of up to 128 values of each part.
    pub fn entry_bytes(&self) -> usize {
        let parts = self.kind.parts();
        let vals: usize = parts.iter().sum::<usize>() * self.dtype.elem_bytes();
        match self.dtype {
            KvDtype::Fp8E4M3 => vals + 4 * parts.iter().map(|&p| fp8_groups(p)).sum::<usize>(),
            _ => vals,
        }
    }

    /// Stored bytes per block of `block_size` tokens over all of the group's layers.
    pub fn bytes_per_block(&self, block_size: usize) -> usize {
        self.entry_bytes() * self.num_layers * self.kind.slots_per_block(block_size)
    }

    /// Bytes per token over all of the group's layers for a per-token kind; for a compressed
    /// kind the amortised `entry * layers / rate`. (Pool storage: [`Self::bytes_per_block`].)
    pub fn bytes_per_token(&self) -> usize {
        self.entry_bytes() * self.num_layers / self.kind.rate()
    }
}

/// Geometry of one cache: block pool size and the groups every block holds a page of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvConfig {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Group 0 is always the MLA latent ([`KvCache::LATENT`](super::KvCache::LATENT)).
    pub groups: Vec<KvGroupSpec>,
    /// Lookback of the windowed groups ([`KvKind::is_windowed`]): with `Some(r0)` they live in
    /// a window class of their own (`kv::window`) and a sequence keeps only the blocks holding
    /// positions `>= len - r0`; `None`: every group keeps every token.
    pub window: Option<usize>,
    /// Blocks of the window class's pool (used only with `window`).
    pub window_blocks: usize,
}

impl KvConfig {
    /// The cache a model needs: the MLA latent of every layer in `dtype`, and for V3.2 the
    /// indexer keys of every layer (in `dtype` too; see [`KvConfig::with_index_dtype`]).
    pub fn for_model(
        model: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        if let Some(v) = &model.v4 {
            return Self::for_v4(v, block_size, num_blocks, dtype);
        }
        let mut groups = vec![KvGroupSpec {
            kind: KvKind::MlaLatent {
                kv_lora_rank: model.kv_lora_rank,
                rope_dim: model.qk_rope_head_dim,
            },
            num_layers: model.num_hidden_layers,
            dtype,
        }];
        if let Some(ix) = model.indexer {
            groups.push(KvGroupSpec {
                kind: KvKind::IndexKey {
                    head_dim: ix.head_dim,
                },
                num_layers: model.num_hidden_layers,
                dtype,
            });
        }
        KvConfig {
            block_size,
            num_blocks,
            groups,
            window: None,
            window_blocks: 0,
        }
    }

    /// The one-layer cache of the MTP drafter: V2 / V3 (/ V3.2) the target's groups with one
    /// layer; V4 the groups of MTP layer 0's own attention kind
    /// ([`ModelConfig::mtp_view`]).
    pub fn for_mtp(
        model: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        if model.v4.is_some() {
            return Self::for_model(&model.mtp_view(0), block_size, num_blocks, dtype);
        }
        Self::for_model(model, block_size, num_blocks, dtype).with_layers(1)
    }

    /// V4's groups: the K=V row of every layer; per CSA layer the compressor inputs and the
    /// compressed entries (+ index keys); per HCA layer the same without the indexer. Kinds with
    /// no layer are left out.
    fn for_v4(v: &V4Config, block_size: usize, num_blocks: usize, dtype: KvDtype) -> Self {
        let (d, di) = (v.head_dim, v.index_head_dim);
        let (csa, hca) = (v.layers_of(V4Attn::Csa), v.layers_of(V4Attn::Hca));
        let mut groups = vec![KvGroupSpec {
            kind: KvKind::SwaKv { head_dim: d },
            num_layers: v.layer_types.len(),
            dtype,
        }];
        let g = |kind, num_layers| KvGroupSpec {
            kind,
            num_layers,
            dtype,
        };
        if csa > 0 {
            groups.push(g(
                KvKind::CsaInput {
                    head_dim: d,
                    index_head_dim: di,
                },
                csa,
            ));
            groups.push(g(
                KvKind::CsaEntry {
                    head_dim: d,
                    index_head_dim: di,
                    rate: v.csa_rate,
                },
                csa,
            ));
        }
        if hca > 0 {
            groups.push(g(KvKind::HcaInput { head_dim: d }, hca));
            groups.push(g(
                KvKind::HcaEntry {
                    head_dim: d,
                    rate: v.hca_rate,
                },
                hca,
            ));
        }
        // Rows read after committing L tokens: the window [q + 1 - W, q] of queries q >= L, CSA
        // windows closing at p >= L read inputs from p + 1 - 2m, HCA ones from p + 1 - m.
        let mut r0 = v.sliding_window.saturating_sub(1);
        if csa > 0 {
            r0 = r0.max(2 * v.csa_rate - 1);
        }
        if hca > 0 {
            r0 = r0.max(v.hca_rate - 1);
        }
        KvConfig {
            block_size,
            num_blocks,
            groups,
            window: Some(r0),
            window_blocks: num_blocks,
        }
    }

    /// The same cache with `n` blocks in its window class (no effect without one).
    pub fn with_window_blocks(mut self, n: usize) -> Self {
        self.window_blocks = n;
        self
    }

    /// The same cache with every group keeping every token (no window class).
    pub fn without_window(mut self) -> Self {
        self.window = None;
        self.window_blocks = 0;
        self
    }

    /// Bytes one sequence of `context` tokens holds resident: every token's block of the main
    /// groups, and of the windowed groups only the blocks covering the lookback (+ the block
    /// being written).
    pub fn resident_bytes(&self, context: usize) -> usize {
        let bs = self.block_size;
        let blocks = context.div_ceil(bs);
        let win_blocks = match self.window {
            Some(r0) => blocks.min(r0.div_ceil(bs) + 1),
            None => blocks,
        };
        self.groups
            .iter()
            .map(|g| {
                let n = if self.window.is_some() && g.kind.is_windowed() {
                    win_blocks
                } else {
                    blocks
                };
                g.bytes_per_block(bs) * n
            })
            .sum()
    }

    /// A cache holding only an MLA latent of `num_layers` layers (V2 / V3 models).
    pub fn latent_only(
        num_layers: usize,
        kv_lora_rank: usize,
        rope_dim: usize,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        KvConfig {
            block_size,
            num_blocks,
            groups: vec![KvGroupSpec {
                kind: KvKind::MlaLatent {
                    kv_lora_rank,
                    rope_dim,
                },
                num_layers,
                dtype,
            }],
            window: None,
            window_blocks: 0,
        }
    }

    /// The same cache with the index-key group (if any) stored in `dtype`.
    pub fn with_index_dtype(mut self, dtype: KvDtype) -> Self {
        for g in &mut self.groups {
            if matches!(g.kind, KvKind::IndexKey { .. }) {
                g.dtype = dtype;
            }
        }
        self
    }

    /// The same cache with `n` layers in every group (the MTP drafter's one-layer cache).
    pub fn with_layers(mut self, n: usize) -> Self {
        for g in &mut self.groups {
            g.num_layers = n;
        }
        self
    }

    /// The MLA latent group (V4: the K=V row group, also group 0).
    pub fn latent(&self) -> &KvGroupSpec {
        &self.groups[0]
    }

    /// Layers of the latent group (every attention layer).
    pub fn num_layers(&self) -> usize {
        self.latent().num_layers
    }

    /// The latent group's dtype.
    pub fn dtype(&self) -> KvDtype {
        self.latent().dtype
    }

    /// Index of the first group of `kind`'s variant (e.g. any `IndexKey`).
    pub fn group_of(&self, kind: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.kind.name() == kind)
    }

    /// Stored bytes per token over every group and layer (pool bytes / pool tokens).
    pub fn bytes_per_token(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.bytes_per_block(self.block_size))
            .sum::<usize>()
            / self.block_size
    }

    /// Whether this cache has exactly the groups `model` needs (dtypes aside).
    pub fn matches(&self, model: &ModelConfig, layers: usize) -> bool {
        let mut want = KvConfig::for_model(model, self.block_size, self.num_blocks, self.dtype());
        if layers != model.num_hidden_layers {
            want = want.with_layers(layers);
        }
        want.groups.len() == self.groups.len()
            && want
                .groups
                .iter()
                .zip(&self.groups)
                .all(|(a, b)| a.kind == b.kind && a.num_layers == b.num_layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_bytes_per_kind_and_dtype() {
        let latent = |dtype| KvGroupSpec {
            kind: KvKind::MlaLatent {
                kv_lora_rank: 512,
                rope_dim: 64,
            },
            num_layers: 61,
            dtype,
        };
        let index = |dtype| KvGroupSpec {
            kind: KvKind::IndexKey { head_dim: 128 },
            num_layers: 61,
            dtype,
        };
        assert_eq!(latent(KvDtype::F32).entry_bytes(), 576 * 4);
        assert_eq!(latent(KvDtype::Bf16).entry_bytes(), 576 * 2);
        assert_eq!(latent(KvDtype::Fp8E4M3).entry_bytes(), 576 + 4 * 5);
        assert_eq!(index(KvDtype::F32).entry_bytes(), 512);
        assert_eq!(index(KvDtype::Bf16).entry_bytes(), 256);
        // DeepSeek-V3.2's fp8 index key: 128 bytes + one f32 scale.
        assert_eq!(index(KvDtype::Fp8E4M3).entry_bytes(), 132);
        assert_eq!(index(KvDtype::Fp8E4M3).bytes_per_token(), 132 * 61);
    }
}

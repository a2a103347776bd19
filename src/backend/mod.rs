//! The backend seam: the operators of the V2 / V3 (and V3.2) forward pass behind one interface,
//! so the same forward (`Model::forward_on`) runs on the CPU kernels or on a GPU.
//!
//! Where it sits: between `model::forward` (which owns the order of operations: embed, per layer
//! norm → MLA attention → residual → norm → MLP / MoE → residual, then the final norm and the
//! logits rows) and the math (`kernels` on the CPU, `kernels/*.cu` through `cuda::backend` on a
//! GPU). Model structs keep holding weights only: a backend that keeps its own copies (device
//! buffers) builds them from the `Model` when it is created and finds them again from the
//! weights the forward hands it. The engine, speculation, budget and swap logic never see which
//! backend runs (`EngineConfig::device` picks it).
//!
//! Guarantees: [`CpuBackend`] runs exactly today's CPU code, so every result is bitwise what it
//! was before the seam (the golden, batch-invariance and speculation tests run through it);
//! every op returns a typed error instead of panicking on a device failure; activations stay in
//! the backend's memory (`Backend::Act`) from the embedding to the logits rows.

mod cpu;
mod device;

pub use cpu::CpuBackend;
pub use device::Device;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kv::KvCache;
use crate::model::rope::Rope;
use crate::model::{Attention, Ffn, SeqChunk};

/// The operators the forward pass calls, in the granularity a device wants them (one op per
/// fused sequence of kernels: attention is projections + RoPE + KV write + attention + o_proj).
pub trait Backend {
    /// Activations [n, width] in the backend's memory.
    type Act;

    /// Short name for logs and `specmla info` ("cpu", "cuda:0 (NVIDIA H200, sm_90)").
    fn name(&self) -> String;

    /// Embedding rows of `tokens` (ids already checked against the vocabulary). -> [n, hidden]
    fn embed(&self, embed: &Matrix, tokens: &[u32]) -> Result<Self::Act>;

    /// RMSNorm of every row of x: [n, w.len()] -> [n, w.len()].
    fn rms_norm(&self, x: &Self::Act, n: usize, w: &[f32], eps: f32) -> Result<Self::Act>;

    /// x += y (the residual), both [n, hidden].
    fn add_assign(&self, x: &mut Self::Act, y: &Self::Act) -> Result<()>;

    /// One layer's MLA attention over the paged latent cache: projections, RoPE, the new
    /// tokens' cache slots written (`kv_layer` is the layer's index in `kv`), attention per
    /// token, o_proj. xn: [n, hidden] normalised input; pos: [n]. -> [n, hidden]
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cfg: &ModelConfig,
        rope: &Rope,
        a: &Attention,
        kv_layer: usize,
        xn: &Self::Act,
        pos: &[usize],
        chunks: &[SeqChunk],
        kv: &mut KvCache,
    ) -> Result<Self::Act>;

    /// The layer's feed-forward (dense MLP, or MoE routing + routed and shared experts).
    /// xn: [n, hidden]. -> ([n, hidden], weight bytes it read: the union of selected experts)
    fn ffn(
        &self,
        cfg: &ModelConfig,
        f: &Ffn,
        xn: &Self::Act,
        n: usize,
    ) -> Result<(Self::Act, usize)>;

    /// The forward's tail: final RMSNorm, the logits of `rows` through `lm_head`, and (with
    /// `want_hidden`) every row's normalised hidden state. x: [n, hidden].
    /// -> (logits [rows.len(), vocab], hidden [n, hidden] or empty), both in host memory.
    #[allow(clippy::too_many_arguments)]
    fn logits(
        &self,
        x: &Self::Act,
        n: usize,
        norm: &[f32],
        eps: f32,
        lm_head: &Matrix,
        rows: &[usize],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)>;
}

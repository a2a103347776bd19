//! Model weight structs. They hold weights and config only: no KV, positions or request state
//! (those live in `kv` and the engine and are passed into `forward`).

use crate::config::ModelConfig;
use crate::kernels::Matrix;

use super::rope::Rope;

/// Multi-head latent attention weights of one layer.
pub struct Attention {
    /// q_lora_rank set: (q_a_proj [q_lora, hidden], q_a_layernorm [q_lora], q_b_proj [H*(nope+rope), q_lora]).
    pub q_lora: Option<(Matrix, Vec<f32>, Matrix)>,
    /// q_lora_rank null: q_proj [H*(nope+rope), hidden].
    pub q_proj: Option<Matrix>,
    /// kv_a_proj_with_mqa [kv_lora + rope, hidden]; output order [c_kv | k_pe].
    pub kv_a_proj: Matrix,
    /// kv_a_layernorm [kv_lora].
    pub kv_a_norm: Vec<f32>,
    /// kv_b_proj [H*(nope+v), kv_lora]; per head: nope rows then v rows (decompressed MHA path).
    pub kv_b_proj: Matrix,
    /// Absorbed W_UK^T per head: H matrices [kv_lora, nope] (q_lat^h = W_UK^h^T q_nope^h).
    pub w_uk_t: Vec<Matrix>,
    /// Absorbed W_UV per head: H matrices [v, kv_lora] (o^h = W_UV^h ctx^h).
    pub w_uv: Vec<Matrix>,
    /// o_proj [hidden, H*v].
    pub o_proj: Matrix,
    /// V3.2's lightning indexer (DeepSeek Sparse Attention); `None` for V2 / V3.
    pub indexer: Option<Indexer>,
}

/// The lightning indexer of one V3.2 layer (H_I index heads of width D, one shared key head).
pub struct Indexer {
    /// wq_b [H_I * D, q_lora]: index queries from the normalised q latent; row j*D + d.
    pub wq_b: Matrix,
    /// wk [D, hidden]: the shared index key from the attention input.
    pub wk: Matrix,
    /// k_norm (LayerNorm, eps 1e-6) weight [D].
    pub k_norm_w: Vec<f32>,
    /// k_norm bias [D].
    pub k_norm_b: Vec<f32>,
    /// weights_proj [H_I, hidden] (kept f32, as transformers keeps it): per-head weights.
    pub weights_proj: Matrix,
}

/// One SwiGLU expert / dense MLP: down(silu(gate(x)) * up(x)).
pub struct Expert {
    /// [inter, hidden]
    pub gate: Matrix,
    /// [inter, hidden]
    pub up: Matrix,
    /// [hidden, inter]
    pub down: Matrix,
}

/// Mixture-of-experts block.
pub struct Moe {
    /// Router weight [n_routed, hidden], f32.
    pub gate: Vec<f32>,
    /// e_score_correction_bias [n_routed] (noaux_tc only; used for selection only).
    pub bias: Option<Vec<f32>>,
    pub experts: Vec<Expert>,
    /// n_shared_experts fused into one MLP of width moe_intermediate * n_shared.
    pub shared: Option<Expert>,
}

/// Feed-forward of a layer.
pub enum Ffn {
    Dense(Expert),
    Moe(Moe),
}

/// One decoder layer.
pub struct DecoderLayer {
    /// input_layernorm [hidden]
    pub input_norm: Vec<f32>,
    pub attn: Attention,
    /// post_attention_layernorm [hidden]
    pub post_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// A DeepSeek-V3 multi-token-prediction layer (`model.layers.{num_hidden_layers + i}`): from the
/// embedding of token t_{j+1} and a hidden state for position j it predicts t_{j+2}.
pub struct MtpLayer {
    /// enorm [hidden] (embedding side).
    pub enorm: Vec<f32>,
    /// hnorm [hidden] (hidden-state side).
    pub hnorm: Vec<f32>,
    /// eh_proj [hidden, 2 * hidden]: input [enorm(e) | hnorm(h)].
    pub eh_proj: Matrix,
    /// A full decoder layer (attention over the MTP layer's own latent cache + MoE).
    pub layer: DecoderLayer,
    /// shared_head.norm [hidden].
    pub head_norm: Vec<f32>,
    /// shared_head.head [vocab, hidden]; None: the target's lm_head.
    pub head: Option<Matrix>,
}

/// A loaded DeepSeek V2/V3 model.
pub struct Model {
    pub config: ModelConfig,
    /// embed_tokens [vocab, hidden]
    pub embed: Matrix,
    pub layers: Vec<DecoderLayer>,
    /// model.norm [hidden]
    pub norm: Vec<f32>,
    /// lm_head [vocab, hidden]; None when tied to `embed`.
    pub lm_head: Option<Matrix>,
    /// Precomputed YaRN frequencies (derived from config; no sequence state).
    pub rope: Rope,
    /// Names of MTP tensors found in the checkpoint.
    pub mtp_tensors: Vec<String>,
    /// The MTP layers the checkpoint holds (empty when it has none).
    pub mtp: Vec<MtpLayer>,
    /// DeepSeek-V4's layers (then `layers` is empty): see `model::v4`.
    pub v4: Option<Box<super::v4::V4Model>>,
}

impl Model {
    /// The lm_head matrix (embed when tied).
    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Total parameters (as stored in the checkpoint, absorbed copies not counted).
    pub fn num_params(&self) -> usize {
        let mut n =
            self.embed.numel() + self.norm.len() + self.lm_head.as_ref().map_or(0, |m| m.numel());
        n += self.v4.as_ref().map_or(0, |v| v.num_params());
        for l in &self.layers {
            n += l.input_norm.len() + l.post_norm.len();
            let a = &l.attn;
            if let Some((qa, qn, qb)) = &a.q_lora {
                n += qa.numel() + qn.len() + qb.numel();
            }
            n += a.q_proj.as_ref().map_or(0, |m| m.numel());
            n += a.kv_a_proj.numel() + a.kv_a_norm.len() + a.kv_b_proj.numel() + a.o_proj.numel();
            if let Some(ix) = &a.indexer {
                n += ix.wq_b.numel()
                    + ix.wk.numel()
                    + ix.weights_proj.numel()
                    + ix.k_norm_w.len()
                    + ix.k_norm_b.len();
            }
            n += match &l.ffn {
                Ffn::Dense(e) => expert_params(e),
                Ffn::Moe(m) => {
                    m.gate.len()
                        + m.bias.as_ref().map_or(0, |b| b.len())
                        + m.experts.iter().map(expert_params).sum::<usize>()
                        + m.shared.as_ref().map_or(0, expert_params)
                }
            };
        }
        n
    }

    /// Every weight matrix the model holds (absorbed W_UK^T copies included; W_UV views, which
    /// share kv_b_proj's storage, not counted twice).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut v = vec![&self.embed];
        v.extend(self.lm_head.as_ref());
        if let Some(v4) = &self.v4 {
            v.extend(v4.matrices());
        }
        for l in &self.layers {
            l.extend_matrices(&mut v);
        }
        v
    }

    /// A fingerprint of the model's identity (configuration, every matrix's shape and storage,
    /// and the values of its first, middle and last rows): what a persisted KV file must have
    /// been written for. Cheap: a few rows per matrix. V4's MTP block is covered (it is among
    /// [`Model::matrices`]), V3's MTP layers are not: see [`Model::mtp_fingerprint`].
    pub fn fingerprint(&self) -> u64 {
        let mut f = Fingerprint(0xcbf2_9ce4_8422_2325);
        format!("{:?}", self.config)
            .bytes()
            .for_each(|b| f.eat(b as u64));
        f.floats(&self.norm);
        for m in self.matrices() {
            f.matrix(m);
        }
        f.0
    }

    /// [`Model::fingerprint`] extended over the V3 MTP layers (norms, eh_proj, the decoder
    /// layer, the shared head): what a persisted MTP KV file must have been written for.
    pub fn mtp_fingerprint(&self) -> u64 {
        let mut f = Fingerprint(self.fingerprint());
        for l in &self.mtp {
            f.floats(&l.enorm);
            f.floats(&l.hnorm);
            f.floats(&l.head_norm);
            let mut v = vec![&l.eh_proj];
            l.layer.extend_matrices(&mut v);
            v.extend(l.head.as_ref());
            v.into_iter().for_each(|m| f.matrix(m));
        }
        f.0
    }

    /// Weight bytes read by a batch-1 decode step: everything except non-selected experts
    /// (top-k routed experts counted) and the embedding table (one row).
    pub fn decode_bytes_per_token(&self) -> usize {
        self.decode_work_per_token().bytes()
    }

    /// What one decode token's forward reads and multiplies, split by how a step of several
    /// tokens takes it ([`TokenWork`]); the bytes sum to [`Model::decode_bytes_per_token`].
    pub fn decode_work_per_token(&self) -> TokenWork {
        let mut w = TokenWork::default();
        w.every_token.matrix(self.lm_head());
        w.every_token.floats(self.norm.len());
        if let (Some(v4), Some(c)) = (&self.v4, &self.config.v4) {
            let v = v4.decode_work_per_token(c.num_experts_per_tok);
            w.every_token.add(v.every_token);
            w.routed.add(v.routed);
        }
        for l in &self.layers {
            w.every_token.add(l.attn_work(false, true));
            match &l.ffn {
                Ffn::Dense(e) => w.every_token.expert(e),
                Ffn::Moe(m) => {
                    let k = self
                        .config
                        .moe
                        .as_ref()
                        .map_or(0, |c| c.num_experts_per_tok);
                    w.every_token.floats(m.gate.len());
                    if let Some(e) = &m.shared {
                        w.every_token.expert(e);
                    }
                    if let Some(e) = m.experts.first() {
                        (0..k).for_each(|_| w.routed.expert(e));
                    }
                }
            }
        }
        w
    }
}

/// Weight bytes and multiply-adds of part of one token's forward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Weight bytes read.
    pub bytes: usize,
    /// Multiply-adds per token (one per weight element a token is multiplied by).
    pub macs: usize,
}

impl Work {
    /// A matrix product: all its bytes, one multiply-add per element.
    pub fn matrix(&mut self, m: &Matrix) {
        self.bytes += m.nbytes();
        self.macs += m.numel();
    }
    /// An expert's three products.
    pub fn expert(&mut self, e: &Expert) {
        [&e.gate, &e.up, &e.down]
            .into_iter()
            .for_each(|m| self.matrix(m));
    }
    /// `len` f32 weights used once each (a router row set, a norm): 4 bytes, one multiply-add.
    pub fn floats(&mut self, len: usize) {
        self.bytes += len * 4;
        self.macs += len;
    }
    /// Another part's work added to this one.
    pub fn add(&mut self, o: Work) {
        self.bytes += o.bytes;
        self.macs += o.macs;
    }
}

/// One decode token's weight work, split by how a forward of n tokens takes it: `every_token`
/// products (attention projections, dense MLPs, shared experts, routers, norms, the lm_head) are
/// read once per forward and multiplied n times, so past some n they are bound by the multiply-
/// adds, not the bytes; `routed` experts (top-k per MoE layer) are read once per distinct
/// expert the tokens select (the forward counts that union) and multiplied once per token that
/// selected them, a few tokens each: bound by the bytes. The spec bench's roofline charges each
/// part max(bytes / bandwidth, FLOPs / peak).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenWork {
    pub every_token: Work,
    pub routed: Work,
}

impl TokenWork {
    /// Bytes of one token's forward (both parts).
    pub fn bytes(&self) -> usize {
        self.every_token.bytes + self.routed.bytes
    }
}

fn expert_params(e: &Expert) -> usize {
    e.gate.numel() + e.up.numel() + e.down.numel()
}

impl Expert {
    /// Bytes of its three matrices.
    pub fn nbytes(&self) -> usize {
        self.gate.nbytes() + self.up.nbytes() + self.down.nbytes()
    }
}

impl Indexer {
    /// Its three matrices' bytes and multiply-adds per token (an upper bound of what a step
    /// reads: the index queries and weights are only formed once a context exceeds
    /// `index_topk`).
    pub fn work(&self) -> Work {
        let mut w = Work::default();
        [&self.wq_b, &self.wk, &self.weights_proj]
            .into_iter()
            .for_each(|m| w.matrix(m));
        w
    }
}

impl DecoderLayer {
    /// Bytes of the attention weights one forward reads: q / kv_a projections and o_proj, plus
    /// kv_b_proj when some token takes the decompressed-MHA path (`mha`) and the absorbed
    /// W_UK^T / W_UV when some token takes the absorbed path (`absorbed`).
    pub fn attn_bytes(&self, mha: bool, absorbed: bool) -> usize {
        self.attn_work(mha, absorbed).bytes
    }

    /// [`Self::attn_bytes`] with the projections' multiply-adds per token.
    pub fn attn_work(&self, mha: bool, absorbed: bool) -> Work {
        let a = &self.attn;
        let mut w = Work::default();
        w.matrix(&a.kv_a_proj);
        w.matrix(&a.o_proj);
        if let Some((qa, _, qb)) = &a.q_lora {
            w.matrix(qa);
            w.matrix(qb);
        }
        if let Some(m) = &a.q_proj {
            w.matrix(m);
        }
        if let Some(ix) = &a.indexer {
            w.add(ix.work());
        }
        if mha {
            w.matrix(&a.kv_b_proj);
        }
        if absorbed {
            a.w_uk_t.iter().chain(&a.w_uv).for_each(|m| w.matrix(m));
        }
        w
    }
}

/// The running hash of [`Model::fingerprint`] (FNV-style, with a shift folded in per value).
struct Fingerprint(u64);

impl Fingerprint {
    fn eat(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x100_0000_01b3);
        self.0 ^= self.0 >> 29;
    }

    fn floats(&mut self, v: &[f32]) {
        v.iter().for_each(|x| self.eat(x.to_bits() as u64));
    }

    /// A matrix's shape and storage size and the values of its first, middle and last rows.
    fn matrix(&mut self, m: &Matrix) {
        self.eat(m.rows as u64);
        self.eat(m.cols as u64);
        self.eat(m.nbytes() as u64);
        let mut row = vec![0f32; m.cols]; // [cols]
        for r in [0, m.rows / 2, m.rows.saturating_sub(1)] {
            if r < m.rows {
                crate::kernels::matrix_row_f32(m, r, &mut row);
                self.floats(&row);
            }
        }
    }
}

impl DecoderLayer {
    /// Push this layer's weight matrices onto `v` (absorbed W_UK^T copies included; W_UV
    /// views not counted twice), in [`Model::matrices`]' order.
    fn extend_matrices<'a>(&'a self, v: &mut Vec<&'a Matrix>) {
        let a = &self.attn;
        if let Some((qa, _, qb)) = &a.q_lora {
            v.extend([qa, qb]);
        }
        v.extend(a.q_proj.as_ref());
        v.extend([&a.kv_a_proj, &a.kv_b_proj, &a.o_proj]);
        v.extend(a.w_uk_t.iter());
        if let Some(ix) = &a.indexer {
            v.extend([&ix.wq_b, &ix.wk, &ix.weights_proj]);
        }
        let experts: Vec<&Expert> = match &self.ffn {
            Ffn::Dense(e) => vec![e],
            Ffn::Moe(m) => m.experts.iter().chain(m.shared.as_ref()).collect(),
        };
        for e in experts {
            v.extend([&e.gate, &e.up, &e.down]);
        }
    }
}

//! Engine settings (`EngineConfig`) and the checks of the ones a caller can get wrong by value.
//! Read by `Engine::new` (and, through `check_draft_p_min`, by the C ABI's params reader);
//! nothing here runs per step.

use crate::error::{Error, Result};
use crate::kernels::IsaLevel;
use crate::kv::KvDtype;
use crate::spec::SpecMode;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Worker threads for the forward pass (0 = all cores).
    pub threads: usize,
    /// Target KV cache dtype.
    pub kv_dtype: KvDtype,
    /// Draft KV cache dtype (None = same as the target's).
    pub draft_kv_dtype: Option<KvDtype>,
    /// Dtype of a V3.2 target's index-key cache group (None = same as `kv_dtype`); fp8 and
    /// bf16 keys are Hadamard-rotated before they are rounded.
    pub index_kv_dtype: Option<KvDtype>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Target KV pool size in blocks.
    pub num_blocks: usize,
    /// Draft KV pool size in blocks.
    pub draft_num_blocks: usize,
    /// Blocks of the target's sliding-window pool (V4's K=V rows and compressor inputs; each
    /// sequence holds only the blocks of its lookback). None = enough for `max_running`
    /// sequences' lookback plus one prefill chunk, at most `num_blocks`. Ignored by MLA models.
    pub kv_window_blocks: Option<usize>,
    /// Per-step token budget (prefill is chunked to fit).
    pub max_batch_tokens: usize,
    /// Maximum requests running at once.
    pub max_running: usize,
    /// Share full prompt blocks across requests.
    pub prefix_cache: bool,
    /// Draft length policy (used when a drafter is set).
    pub spec: SpecMode,
    /// Confidence cut of the model drafters (draft model, MTP layer): a request stops drafting
    /// for the step after a token its drafter gave a probability below this (softmax of the
    /// draft logits for greedy requests, q for sampled ones), so a weak drafter's unlikely
    /// tokens are neither drafted further nor verified — llama.cpp's `--draft-p-min`. Outputs
    /// are unchanged (verification is the same); only k per request per step shrinks. 0 = off;
    /// default [`DEFAULT_DRAFT_P_MIN`]; must be in [0, 1]. The n-gram drafter has no
    /// probabilities and ignores it.
    pub draft_p_min: f32,
    /// Kernel instruction set (None = the best this CPU has). Pinned on every worker of the
    /// engine's pool; asking for one the CPU lacks is an error. All levels give the same bits.
    pub isa: Option<IsaLevel>,
    /// The target cache's second tier (`kv::tier`): evicted prefix blocks kept in host memory
    /// and, with a directory, in a file that outlives the engine. None = off.
    pub kv_offload: Option<crate::kv::TierConfig>,
    /// Where the TARGET's forward runs: the CPU kernels (default) or a CUDA device
    /// (`cuda::CudaBackend`; a V2 / V3 draft model with a bf16 draft KV cache runs there too;
    /// the MTP layer, sampling and scheduling stay on the host). A CUDA device
    /// needs a V2 / V3 target with a bf16 latent cache and bf16 routed experts; the prefix cache
    /// and the second KV tier are off there (their block copies are host-side). A machine
    /// without a driver or device gives an error at creation.
    pub device: crate::backend::Device,
    /// Read this engine's weights (the target's files, and a draft model's or draft weights
    /// file's, at creation and at every swap) into anonymous huge pages instead of mapping the
    /// files (`weights::WeightStore::open_with`): fewer TLB misses while the kernels stream the
    /// weights — batch-1 decode of a memory-bound model measured up to ~10 % faster — for a
    /// load that copies every file (seconds for GBs) and keeps every weight resident (a
    /// mapping holds only the experts a run touches). Same bytes, so the same outputs. False
    /// (default): the process-wide setting (`weights::set_huge_page_weights`, off unless set).
    pub huge_page_weights: bool,
}

impl EngineConfig {
    /// Whether this engine reads its weight files into huge pages: its own
    /// `huge_page_weights`, or the process-wide default (`weights::set_huge_page_weights`).
    pub(crate) fn loads_huge_pages(&self) -> bool {
        self.huge_page_weights || crate::weights::huge_page_weights()
    }
}

/// Default confidence cut of the model drafters (`EngineConfig::draft_p_min`), llama.cpp's
/// `--draft-p-min` default. On the widened target at batch 1 (docs/BENCHMARKS.md, "Drafters'
/// confidence cut") it kept fixed-k speculation from collapsing with a weak drafter (the MTP
/// layer at k = 8: 0.55x -> 0.97x of plain; draft-weak k = 8: 1.41x -> 1.84x, pairs) and left
/// the strong draft model's rows where they were.
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.75;

/// `EngineConfig::draft_p_min` must be a probability in [0, 1] (NaN refused): the engine's check,
/// also run by the C ABI when it reads `specmla_engine_params`.
pub(crate) fn check_draft_p_min(p: f32) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "draft_p_min {p} is not a probability in [0, 1]"
        )))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: 0,
            kv_dtype: KvDtype::F32,
            draft_kv_dtype: None,
            index_kv_dtype: None,
            block_size: 16,
            num_blocks: 2048,
            draft_num_blocks: 2048,
            kv_window_blocks: None,
            max_batch_tokens: 512,
            max_running: 64,
            prefix_cache: true,
            spec: SpecMode::Fixed(4),
            draft_p_min: DEFAULT_DRAFT_P_MIN,
            isa: None,
            kv_offload: None,
            device: crate::backend::Device::Cpu,
            huge_page_weights: false,
        }
    }
}

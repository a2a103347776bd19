//! Draft-model proposer: a smaller DeepSeek-architecture model with the target's vocabulary and
//! its own latent KV cache (its own dtype). Per request it keeps the draft KV of the longest prefix
//! of the committed context it has seen; each round it catches up on the committed tokens it has
//! not seen (after a swap: the whole context, lazily), then drafts k tokens autoregressively, all
//! requests batched into one draft forward per draft position. After verification the draft KV is
//! truncated to the prefix still shared with the committed context — stale draft KV is never used.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kv::{KvCache, KvConfig, KvDtype, KvStats, SeqKv};
use crate::model::{LogitsMode, Model, SeqChunk};
use crate::sampling::{argmax, is_greedy, processed_probs, sample_from, Rng};

use super::proposer::{Proposal, ProposeRequest, Proposer};

struct DraftSeq {
    kv: SeqKv,
    /// Tokens whose draft KV is written (a prefix of the committed context + fed drafts).
    fed: Vec<u32>,
    rng: Rng,
}

/// A draft model with its own cache.
pub struct DraftModelProposer {
    model: Arc<Model>,
    kv: KvCache,
    seqs: HashMap<u64, DraftSeq>,
    label: String,
}

impl DraftModelProposer {
    /// `target_vocab`: the target's vocabulary size (a mismatch is refused).
    pub fn new(model: Arc<Model>, kv_dtype: KvDtype, num_blocks: usize, block_size: usize, target_vocab: usize, label: String) -> Result<Self> {
        if model.config.vocab_size != target_vocab {
            return Err(Error::Draft(format!(
                "vocabulary mismatch: draft vocab_size {} != target vocab_size {}",
                model.config.vocab_size, target_vocab
            )));
        }
        let c = &model.config;
        let kv = KvCache::new(KvConfig {
            num_layers: c.num_hidden_layers,
            kv_lora_rank: c.kv_lora_rank,
            rope_dim: c.qk_rope_head_dim,
            block_size,
            num_blocks,
            dtype: kv_dtype,
        })?;
        Ok(DraftModelProposer { model, kv, seqs: HashMap::new(), label })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn drop_seq(&mut self, id: u64) {
        if let Some(mut s) = self.seqs.remove(&id) {
            self.kv.free(&mut s.kv);
        }
    }
}

impl Proposer for DraftModelProposer {
    fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>> {
        let mut out: Vec<Proposal> = reqs.iter().map(|_| Proposal { tokens: Vec::new(), q: Some(Vec::new()) }).collect();
        // Reserve KV: context + (k - 1) fed drafts. Requests that do not fit draft nothing.
        let mut active: Vec<usize> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if r.k == 0 || r.context.is_empty() {
                continue;
            }
            let seed = r.params.seed ^ 0x9e37_79b9_7f4a_7c15;
            let s = self.seqs.entry(r.id).or_insert_with(|| DraftSeq { kv: SeqKv::new(), fed: Vec::new(), rng: Rng::new(seed) });
            // keep only the prefix still shared with the context, and never the last token (we need its logits)
            let mut keep = s.fed.iter().zip(r.context).take_while(|(a, b)| a == b).count();
            keep = keep.min(r.context.len() - 1);
            if keep < s.fed.len() {
                self.kv.truncate(&mut s.kv, keep);
                s.fed.truncate(keep);
            }
            let need = r.context.len() + r.k - 1;
            match self.kv.plan_grow(&s.kv, need) {
                Ok(plan) => {
                    self.kv.commit_grow(&mut s.kv, plan);
                    active.push(i);
                }
                Err(_) => {
                    // Draft cache full: give up this request's draft KV (rebuilt later).
                    self.kv.free(&mut s.kv);
                    s.fed.clear();
                }
            }
        }
        let vocab = self.model.config.vocab_size;
        let kmax = active.iter().map(|&i| reqs[i].k).max().unwrap_or(0);
        for step in 0..kmax {
            let live: Vec<usize> = active.iter().copied().filter(|&i| reqs[i].k > step).collect();
            if live.is_empty() {
                break;
            }
            let mut inputs: Vec<Vec<u32>> = Vec::with_capacity(live.len());
            for &i in &live {
                let r = &reqs[i];
                let s = &self.seqs[&r.id];
                let inp = if step == 0 {
                    r.context[s.fed.len()..].to_vec()
                } else {
                    vec![*out[i].tokens.last().expect("previous draft")]
                };
                inputs.push(inp);
            }
            let logits = {
                let chunks: Vec<SeqChunk> = live
                    .iter()
                    .zip(&inputs)
                    .map(|(&i, inp)| {
                        let s = &self.seqs[&reqs[i].id];
                        SeqChunk { kv: &s.kv, start: s.fed.len(), tokens: inp, mha_until: reqs[i].prompt_len, logits: LogitsMode::Last }
                    })
                    .collect();
                self.model.forward(&mut self.kv, &chunks)?
            };
            for (j, (&i, inp)) in live.iter().zip(&inputs).enumerate() {
                let r = &reqs[i];
                let s = self.seqs.get_mut(&r.id).expect("draft seq");
                s.fed.extend_from_slice(inp);
                let new_len = s.fed.len();
                self.kv.set_len(&mut s.kv, new_len);
                let row = &logits[j * vocab..(j + 1) * vocab]; // [vocab]
                let q = processed_probs(row, r.params);
                let tok = if is_greedy(r.params) { argmax(row) } else { sample_from(&q, &mut s.rng) };
                out[i].tokens.push(tok);
                if let Some(qs) = out[i].q.as_mut() {
                    qs.push(q);
                }
            }
        }
        // Reserved-but-unfed slots (k - 1 drafts fed at most) are released by on_commit's truncate.
        Ok(out)
    }

    fn on_commit(&mut self, id: u64, context: &[u32]) {
        if let Some(s) = self.seqs.get_mut(&id) {
            let keep = s.fed.iter().zip(context).take_while(|(a, b)| a == b).count();
            s.fed.truncate(keep);
            self.kv.truncate(&mut s.kv, keep);
        }
    }

    fn release(&mut self, id: u64) {
        self.drop_seq(id);
    }

    fn name(&self) -> String {
        self.label.clone()
    }

    fn kv_stats(&self) -> Option<KvStats> {
        Some(self.kv.stats())
    }

    fn check(&self, id: u64, context: &[u32]) -> std::result::Result<(), String> {
        let Some(s) = self.seqs.get(&id) else { return Ok(()) };
        if s.kv.len() != s.fed.len() {
            return Err(format!("draft KV len {} != fed tokens {}", s.kv.len(), s.fed.len()));
        }
        if s.fed.len() > context.len() || s.fed[..] != context[..s.fed.len()] {
            return Err(format!("request {id}: draft KV is not a prefix of the committed context"));
        }
        Ok(())
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes_per_token_per_layer() * self.model.config.num_hidden_layers
    }

    fn has_model(&self) -> bool {
        true
    }
}

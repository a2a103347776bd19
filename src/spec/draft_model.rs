//! Draft-model proposer: a smaller DeepSeek-architecture model with the target's vocabulary and
//! its own latent KV cache (its own dtype). Per request it keeps the draft KV of the longest prefix
//! of the committed context it has seen; each round it catches up on the committed tokens it has
//! not seen (after a swap: the whole context, lazily), then drafts k tokens autoregressively, all
//! requests batched into one draft forward per draft position. After verification the draft KV is
//! truncated to the prefix still shared with the committed context — stale draft KV is never used.
//!
//! Prefix caching: at admission the draft restores its KV of the request's cached prompt prefix
//! from its own cache (`match_prefix`; a draft's prompt KV depends on the tokens alone) and
//! publishes its prompt blocks once written, so a shared system prompt is not re-fed to the
//! draft by every request.
//!
//! Catch-up is bounded per round so a swap (every request must re-feed its whole context) or a
//! burst of new prompts does not stall a step: catch-ups of at most [`CATCHUP_INLINE`] tokens (the
//! normal case, the tokens committed since the last round) always run; longer ones run whole while
//! they fit a shared budget of [`CATCHUP_PER_ROUND`] tokens (in request order), and the rest feed
//! parts of what remains of it and draft nothing that round (the target decodes them plainly).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kv::{KvCache, KvConfig, KvDtype, KvStats, SeqKv};
use crate::model::{LogitsMode, Model, SeqChunk};
use crate::sampling::Rng;

use super::proposer::{Proposal, ProposeRequest, Proposer};

/// Catch-ups up to this many tokens always run inline, whatever else the round holds.
pub const CATCHUP_INLINE: usize = 16;
/// Longer catch-ups share this many draft tokens per round, requests served in order.
pub const CATCHUP_PER_ROUND: usize = 128;

/// What one request does in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Catch up on the whole unseen context, then draft k tokens.
    Draft,
    /// Feed this many unseen context tokens (not the last one); no drafts this round.
    CatchUp(usize),
}

/// The round's role of each request from its catch-up (`unseen[j]` >= 1 positions, the last of
/// which yields draft 1) — the module doc's bound, shared with the MTP drafter: short catch-ups
/// always draft; long ones draft when they fit the shared budget whole (first come, first
/// served); the rest feed parts of what remains of it (never their last position); None: the
/// budget is spent.
pub(super) fn catch_up_roles(unseen: &[usize]) -> Vec<Option<Role>> {
    let mut roles: Vec<Option<Role>> = vec![None; unseen.len()];
    let mut shared_left = CATCHUP_PER_ROUND;
    for (role, &n) in roles.iter_mut().zip(unseen) {
        if n <= CATCHUP_INLINE {
            *role = Some(Role::Draft);
        } else if n <= shared_left {
            shared_left -= n;
            *role = Some(Role::Draft);
        }
    }
    for (role, &n) in roles.iter_mut().zip(unseen) {
        if role.is_none() && shared_left > 0 {
            let part = (n - 1).min(shared_left);
            shared_left -= part;
            *role = Some(Role::CatchUp(part));
        }
    }
    roles
}

struct DraftSeq {
    kv: SeqKv,
    /// Tokens whose draft KV is written (a prefix of the committed context + fed drafts).
    fed: Vec<u32>,
    rng: Rng,
    /// Whether `rng` was seeded from the request's params (at the request's first `propose`;
    /// a prefix match at admission makes the entry before it).
    seeded: bool,
    /// Admitted through prefix matching: publish its prompt blocks once written.
    publish: bool,
}

/// An entry not seeded yet (`propose` seeds it from the request's params).
fn new_seq() -> DraftSeq {
    DraftSeq {
        kv: SeqKv::new(),
        fed: Vec::new(),
        rng: Rng::new(0),
        seeded: false,
        publish: false,
    }
}

/// A draft model with its own cache.
pub struct DraftModelProposer {
    model: Arc<Model>,
    kv: KvCache,
    seqs: HashMap<u64, DraftSeq>,
    label: String,
    /// The draft's forward on a GPU (`EngineConfig::device`); None: the CPU kernels.
    cuda: Option<Arc<crate::cuda::CudaBackend>>,
    /// Weight bytes its forwards needed so far ([`Proposer::weight_bytes`]).
    weight_bytes: u64,
}

impl DraftModelProposer {
    /// `target_vocab`: the target's vocabulary size (a mismatch is refused).
    pub fn new(
        model: Arc<Model>,
        kv_dtype: KvDtype,
        num_blocks: usize,
        block_size: usize,
        target_vocab: usize,
        label: String,
    ) -> Result<Self> {
        if model.config.vocab_size != target_vocab {
            return Err(Error::Draft(format!(
                "vocabulary mismatch: draft vocab_size {} != target vocab_size {}",
                model.config.vocab_size, target_vocab
            )));
        }
        let c = &model.config;
        let kv = KvCache::new(KvConfig::for_model(c, block_size, num_blocks, kv_dtype))?;
        Ok(DraftModelProposer {
            model,
            kv,
            seqs: HashMap::new(),
            label,
            cuda: None,
            weight_bytes: 0,
        })
    }

    /// Run the draft's forward through `b` (its weights uploaded by `CudaBackend::new`).
    pub fn with_cuda(mut self, b: Arc<crate::cuda::CudaBackend>) -> Self {
        self.cuda = Some(b);
        self
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
        let mut out: Vec<Proposal> = reqs.iter().map(|_| Proposal::with_q()).collect();
        // Plan each request's role and reserve its KV: a drafting request needs context + (k - 1)
        // fed drafts; a request catching up needs what it feeds. Requests that do not fit draft
        // nothing.
        let mut unseen: Vec<(usize, usize)> = Vec::new(); // (request index, unseen context tokens)
        for (i, r) in reqs.iter().enumerate() {
            if r.k == 0 || r.context.is_empty() {
                continue;
            }
            let seed = r.params.seed ^ 0x9e37_79b9_7f4a_7c15;
            let s = self.seqs.entry(r.id).or_insert_with(new_seq);
            if !s.seeded {
                s.rng = Rng::new(seed);
                s.seeded = true;
            }
            // keep only the prefix still shared with the context, and never the last token (we need its logits)
            let mut keep = s
                .fed
                .iter()
                .zip(r.context)
                .take_while(|(a, b)| a == b)
                .count();
            keep = keep.min(r.context.len() - 1);
            if keep < s.fed.len() {
                self.kv.truncate(&mut s.kv, keep);
                s.fed.truncate(keep);
            }
            unseen.push((i, r.context.len() - keep)); // >= 1
        }
        let lags: Vec<usize> = unseen.iter().map(|&(_, n)| n).collect();
        let roles = catch_up_roles(&lags);
        let mut active: Vec<(usize, Role)> = Vec::new();
        for (&(i, _), role) in unseen.iter().zip(roles) {
            let Some(role) = role else { continue }; // the round's catch-up budget is spent
            let r = &reqs[i];
            let s = self.seqs.get_mut(&r.id).expect("draft seq");
            let need = match role {
                Role::Draft => r.context.len() + r.k - 1,
                Role::CatchUp(part) => s.fed.len() + part,
            };
            match self.kv.plan_grow(&s.kv, need) {
                Ok(plan) => {
                    self.kv.commit_grow(&mut s.kv, plan);
                    active.push((i, role));
                }
                Err(_) => {
                    // Draft cache full: give up this request's draft KV (rebuilt later).
                    self.kv.free(&mut s.kv);
                    s.fed.clear();
                }
            }
        }
        let vocab = self.model.config.vocab_size;
        let kmax = active
            .iter()
            .filter(|(_, role)| *role == Role::Draft)
            .map(|&(i, _)| reqs[i].k)
            .max()
            .unwrap_or(0);
        // one forward per draft position; at least one (step 0) when only catch-ups are active
        let steps = if active.is_empty() { 0 } else { kmax.max(1) };
        // requests whose last draft fell below their confidence cut (`ProposeRequest::p_min`)
        let mut stopped = vec![false; reqs.len()];
        for step in 0..steps {
            // step 0: every active request (drafting or catching up); later: drafting ones only
            let live: Vec<(usize, Role)> = active
                .iter()
                .copied()
                .filter(|&(i, role)| {
                    step == 0 || (role == Role::Draft && reqs[i].k > step && !stopped[i])
                })
                .collect();
            if live.is_empty() {
                break;
            }
            let mut inputs: Vec<Vec<u32>> = Vec::with_capacity(live.len());
            for &(i, role) in &live {
                let r = &reqs[i];
                let s = &self.seqs[&r.id];
                let inp = match role {
                    Role::CatchUp(part) => r.context[s.fed.len()..s.fed.len() + part].to_vec(),
                    Role::Draft if step == 0 => r.context[s.fed.len()..].to_vec(),
                    Role::Draft => vec![*out[i].tokens.last().expect("previous draft")],
                };
                inputs.push(inp);
            }
            let logits = {
                let chunks: Vec<SeqChunk> = live
                    .iter()
                    .zip(&inputs)
                    .map(|(&(i, role), inp)| {
                        let s = &self.seqs[&reqs[i].id];
                        let logits = if role == Role::Draft {
                            LogitsMode::Last
                        } else {
                            LogitsMode::None
                        };
                        SeqChunk {
                            kv: &s.kv,
                            start: s.fed.len(),
                            tokens: inp,
                            mha_until: reqs[i].prompt_len,
                            logits,
                        }
                    })
                    .collect();
                let out = match &self.cuda {
                    Some(b) => self
                        .model
                        .forward_on(b.as_ref(), &mut self.kv, &chunks, false)?,
                    None => self.model.forward_out(&mut self.kv, &chunks, false)?,
                };
                self.weight_bytes += out.weight_bytes;
                out.logits
            };
            let mut row_at = 0;
            for (&(i, role), inp) in live.iter().zip(&inputs) {
                let r = &reqs[i];
                let s = self.seqs.get_mut(&r.id).expect("draft seq");
                s.fed.extend_from_slice(inp);
                let new_len = s.fed.len();
                self.kv.set_len(&mut s.kv, new_len);
                if role != Role::Draft {
                    continue;
                }
                let row = &logits[row_at * vocab..(row_at + 1) * vocab]; // [vocab]
                row_at += 1;
                out[i].push_drafted(row, r.params, &mut s.rng);
                stopped[i] = !out[i].confident(row, r.params, r.p_min);
            }
        }
        // Publish the prompt blocks of requests admitted through prefix matching.
        for r in reqs {
            if let Some(s) = self.seqs.get_mut(&r.id) {
                if s.publish && s.fed.len() >= r.prompt_len {
                    self.kv.register_prefix(&s.kv, &r.context[..r.prompt_len]);
                    s.publish = false;
                }
            }
        }
        // Reserved-but-unfed slots (k - 1 drafts fed at most) are released by on_commit's truncate.
        Ok(out)
    }

    fn match_prefix(&mut self, id: u64, prompt: &[u32], max: usize) -> usize {
        // The draft KV of a prompt depends on its tokens alone (prompt positions take the
        // reproducible MHA path): restore what the draft's own cache holds, and let the target
        // reuse whatever it has (the draft catches up on the rest from the tokens).
        self.drop_seq(id);
        let mut s = new_seq();
        s.kv = self.kv.match_prefix(prompt, max);
        s.fed = prompt[..s.kv.len()].to_vec();
        s.publish = true;
        self.seqs.insert(id, s);
        max
    }

    fn settle_prefix(&mut self, id: u64, _len: usize) -> usize {
        // It keeps all it restored (the same tokens' KV, whatever the target reused) and
        // catches up from there.
        self.seqs.get(&id).map_or(0, |s| s.fed.len())
    }

    fn on_commit(&mut self, id: u64, context: &[u32]) {
        if let Some(s) = self.seqs.get_mut(&id) {
            let keep = s
                .fed
                .iter()
                .zip(context)
                .take_while(|(a, b)| a == b)
                .count();
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

    fn reclaim_unheld(&mut self) -> usize {
        let live: Vec<&SeqKv> = self.seqs.values().map(|s| &s.kv).collect();
        self.kv.reclaim_unheld(&live)
    }

    fn check(&self, id: u64, context: &[u32]) -> std::result::Result<(), String> {
        let Some(s) = self.seqs.get(&id) else {
            return Ok(());
        };
        if s.kv.len() != s.fed.len() {
            return Err(format!(
                "draft KV len {} != fed tokens {}",
                s.kv.len(),
                s.fed.len()
            ));
        }
        if s.fed.len() > context.len() || s.fed[..] != context[..s.fed.len()] {
            return Err(format!(
                "request {id}: draft KV is not a prefix of the committed context"
            ));
        }
        Ok(())
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.kv.bytes_per_token()
    }

    fn has_model(&self) -> bool {
        true
    }

    fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sampling::{argmax, SamplingParams};

    fn draft_model() -> Arc<Model> {
        Arc::new(
            Model::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/draft"))
                .expect("bundled draft"),
        )
    }

    /// Greedy drafts of the model alone: the whole context in one forward, then k - 1 more.
    fn reference_drafts(model: &Model, ctx: &[u32], prompt_len: usize, k: usize) -> Vec<u32> {
        let mut kv =
            KvCache::new(KvConfig::for_model(&model.config, 16, 256, KvDtype::F32)).unwrap();
        let mut seq = SeqKv::new();
        let plan = kv.plan_grow(&seq, ctx.len() + k).unwrap();
        kv.commit_grow(&mut seq, plan);
        let (mut fed, mut input, mut out) = (0, ctx.to_vec(), Vec::new());
        for _ in 0..k {
            let chunk = SeqChunk {
                kv: &seq,
                start: fed,
                tokens: &input,
                mha_until: prompt_len,
                logits: LogitsMode::Last,
            };
            let logits = model.forward(&mut kv, &[chunk]).unwrap();
            fed += input.len();
            kv.set_len(&mut seq, fed);
            out.push(argmax(&logits));
            input = vec![*out.last().unwrap()];
        }
        out
    }

    #[test]
    fn long_catch_ups_are_bounded_per_round_and_draft_the_same_tokens() {
        let model = draft_model();
        let vocab = model.config.vocab_size;
        let mut p =
            DraftModelProposer::new(model.clone(), KvDtype::F32, 256, 16, vocab, "draft".into())
                .unwrap();
        let params = SamplingParams::default();
        let ctx = |len: usize, salt: u32| -> Vec<u32> {
            (0..len as u32)
                .map(|i| 5 + (i * 7 + salt * 13) % (vocab as u32 - 5))
                .collect()
        };
        let contexts = [ctx(200, 1), ctx(150, 2), ctx(10, 3), ctx(40, 4)];
        let prompt_lens = [180, 150, 8, 40];
        let k = 4;
        let reqs: Vec<ProposeRequest> = contexts
            .iter()
            .zip(prompt_lens)
            .enumerate()
            .map(|(i, (c, pl))| ProposeRequest {
                id: i as u64,
                context: c,
                prompt_len: pl,
                k,
                params: &params,
                arm: None,
                p_min: 0.0,
            })
            .collect();
        let mut drafted_in_round = [usize::MAX; 4];
        let mut final_drafts: Vec<Vec<u32>> = vec![Vec::new(); 4];
        for round in 0..10 {
            let before: Vec<usize> = (0..4)
                .map(|i| p.seqs.get(&(i as u64)).map_or(0, |s| s.fed.len()))
                .collect();
            let props = p.propose(&reqs).unwrap();
            let mut caught_up = 0;
            for (i, prop) in props.iter().enumerate() {
                let after = p.seqs[&(i as u64)].fed.len();
                if prop.tokens.is_empty() {
                    caught_up += after - before[i];
                    assert!(
                        after < contexts[i].len(),
                        "a request catching up never feeds its last token"
                    );
                    p.check(i as u64, &contexts[i]).unwrap();
                } else {
                    assert_eq!(prop.tokens.len(), k);
                    drafted_in_round[i] = drafted_in_round[i].min(round);
                    final_drafts[i] = prop.tokens.clone();
                }
            }
            assert!(
                caught_up <= CATCHUP_PER_ROUND,
                "round {round}: {caught_up} catch-up tokens"
            );
            if drafted_in_round.iter().all(|&r| r != usize::MAX) {
                break;
            }
        }
        // The short prompts draft at once, the long ones only after their catch-up rounds.
        assert_eq!(drafted_in_round[2], 0);
        assert_eq!(
            drafted_in_round[3], 0,
            "40 unseen tokens fit the shared budget"
        );
        assert!(
            drafted_in_round[0] >= 1 && drafted_in_round[0] != usize::MAX,
            "{drafted_in_round:?}"
        );
        assert!(
            drafted_in_round[1] >= 1 && drafted_in_round[1] != usize::MAX,
            "{drafted_in_round:?}"
        );
        for i in 0..4 {
            assert_eq!(
                final_drafts[i],
                reference_drafts(&model, &contexts[i], prompt_lens[i], k),
                "request {i}"
            );
        }
    }
}

//! MTP proposer: DeepSeek's multi-token-prediction layer as a drafter (V3's `eh_proj` layer, or
//! V4's `mtp.*` block: `model::v4::V4Mtp`). It shares the target's embedding and weights (the
//! layer lives in the target checkpoint), keeps its own one-layer KV cache (its own dtype; for V4
//! laid out for the MTP block's attention kind, `KvConfig::for_mtp`) and is fed the target's
//! hidden states (V3: after the final norm; V4: the residual streams before the hyper head, rows
//! of `Model::hidden_state_width`).
//!
//! Per request it holds the MTP KV of positions [0, m) and the target hidden states of the
//! positions it has not consumed yet. Position j of the MTP layer needs (t_{j+1}, h_j), so with
//! L committed tokens it can fill positions up to L - 2: each round it first catches up on
//! [m, L - 1) — normally the one to k + 1 positions the last verification committed, whose
//! hidden states that verification's target forward produced — and the last of those rows
//! already yields draft 1 (t_{L}); drafts 2..k chain the layer on its own output (vLLM's
//! scheme), all requests batched into one MTP forward per draft position. The chained positions'
//! KV is dropped right after drafting (it was computed from drafted tokens and the MTP's own
//! hidden states, never from the target's), so the MTP KV only ever holds positions whose
//! inputs are committed tokens and target hidden states.
//!
//! Partial context: where the target's hidden states of some positions never come — a prompt
//! prefix the target reused beyond what this proposer holds, the positions before it was
//! swapped in mid-request — the MTP layer skips them: its cache goes on at the first position
//! it has hidden states for, written at cache positions shifted back by the skipped count
//! (`MtpSeq::shift`), so it attends to what it holds before the gap and everything after it.
//! Its drafts there may be worse than with the whole context; outputs are unchanged (every
//! draft is verified), and the target never recomputes a position for the drafter's sake.
//!
//! Prefix caching: a request admitted onto cached prompt blocks has no target hidden states for
//! them, so the MTP KV of the prompt is cached too, in this proposer's own cache, keyed one token
//! on (position j is computed from t_{j+1}; `prefix_keys`). At admission the proposer restores
//! what it holds of the prompt (`match_prefix`); the target reuses all it holds and the
//! proposer skips the rest (`settle_prefix`). A request admitted without a skip publishes its
//! MTP prompt blocks once they are written. Restored or recomputed, the MTP KV of a prompt is
//! the same (prompt positions take the reproducible MHA path), and so are the drafts, wherever
//! the proposer held as much of the prompt as the target (the one-token-on keys make it hold a
//! block less where the prompts part at a block boundary).
//!
//! Catch-up is bounded per round by the draft model's rule (`draft_model::catch_up_roles`), so
//! a burst of new prompts does not stall a step: catch-ups of at most 16 positions (the normal
//! case) always run; longer ones (a new request's prompt) run whole while they fit a shared
//! budget of 128 positions per round, in request order, and the rest feed parts of what remains
//! of it and draft nothing that round.
//!
//! Reading: vLLM `model_executor/models/deepseek_mtp.py` and `v1/spec_decode/eagle.py`, SGLang
//! `models/deepseek_nextn.py` (how the official weights are fed; no code taken).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kv::{KvCache, KvConfig, KvDtype, KvStats, SeqKv, TierConfig};
use crate::model::{LogitsMode, Model, SeqChunk};
use crate::sampling::Rng;

use super::draft_model::{catch_up_roles, Role};
use super::proposer::{Proposal, ProposeRequest, Proposer};

struct MtpSeq {
    /// MTP KV: absolute positions [0, kv.len() + shift), less the `shift` positions skipped.
    kv: SeqKv,
    /// Positions skipped (no target hidden states for them; module doc): the cache position of
    /// every position computed since the last skip is its absolute position minus `shift`.
    shift: usize,
    /// First position of `hidden` / `fed`.
    hid_start: usize,
    /// Target hidden states not consumed yet. // [fed.len(), hidden]
    hidden: Vec<f32>,
    /// The tokens the target was fed at those positions (checked against the committed context).
    fed: Vec<u32>,
    rng: Rng,
    /// Whether `rng` was seeded from the request's params (the first `propose`; hidden rows
    /// can arrive before it).
    seeded: bool,
    /// Admitted through prefix matching: publish its prompt positions once computed.
    publish: bool,
    /// The prompt's prefix keys, from `match_prefix` until `settle_prefix`.
    keys: Vec<u32>,
}

/// The target's MTP layer as a drafter.
pub struct MtpProposer {
    model: Arc<Model>,
    kv: KvCache,
    seqs: HashMap<u64, MtpSeq>,
    /// Weight bytes its forwards needed so far ([`Proposer::weight_bytes`]).
    weight_bytes: u64,
    /// The layer's held-out acceptance, if its checkpoint records one ([`recorded_acceptance`]).
    recorded: Option<f64>,
}

/// Held-out positions below which a recorded acceptance is not used (too few to trust).
const MIN_RECORDED_POSITIONS: u64 = 500;

/// The MTP layer's first-position acceptance as its training recorded it next to the
/// checkpoint: `heldout_acceptance_k1` of `dir/mtp_stats.json` (tools/train/train_mtp.py), when
/// it is a fraction measured on at least [`MIN_RECORDED_POSITIONS`] held-out positions. A
/// missing or unreadable file gives None (the policy's generic prior): it is advice for the
/// adaptive policy, never a reason to refuse a checkpoint.
pub fn recorded_acceptance(dir: &std::path::Path) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join("mtp_stats.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let a = v.get("heldout_acceptance_k1")?.as_f64()?;
    let n = v.get("heldout_positions")?.as_u64()?;
    (a > 0.0 && a < 1.0 && n >= MIN_RECORDED_POSITIONS).then_some(a)
}

impl MtpProposer {
    /// `model`: the target (it must hold an MTP layer).
    pub fn new(
        model: Arc<Model>,
        kv_dtype: KvDtype,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        if model.num_mtp_layers() == 0 {
            let tensor = if model.v4.is_some() {
                "mtp.0.e_proj.weight".to_string()
            } else {
                format!(
                    "model.layers.{}.eh_proj.weight",
                    model.config.num_hidden_layers
                )
            };
            return Err(Error::Draft(format!(
                "the target has no MTP layer (num_nextn_predict_layers = {}, no {tensor})",
                model.config.num_nextn_predict_layers
            )));
        }
        let kc = KvConfig::for_mtp(&model.config, block_size, num_blocks, kv_dtype);
        let kv = KvCache::new(kc)?;
        Ok(MtpProposer {
            model,
            kv,
            seqs: HashMap::new(),
            weight_bytes: 0,
            recorded: None,
        })
    }

    /// The layer's recorded held-out acceptance ([`recorded_acceptance`]), for the policy.
    pub fn with_recorded_acceptance(mut self, a: Option<f64>) -> Self {
        self.recorded = a;
        self
    }

    /// Give the MTP cache a second KV tier (`EngineConfig::kv_offload`): its evicted and
    /// published prompt blocks are kept like the target's, in a file of its own (the model's
    /// fingerprint over its MTP layers too, salted), so a prefix the target restores from its
    /// tier is matched by the MTP's too.
    pub fn with_tier(mut self, cfg: &TierConfig) -> Result<Self> {
        const MTP_TIER_SALT: u64 = 0x6d74_705f_7469_6572; // "mtp_tier"
        self.kv
            .attach_tier(cfg, self.model.mtp_fingerprint() ^ MTP_TIER_SALT)?;
        Ok(self)
    }
}

fn new_seq(seed: u64) -> MtpSeq {
    MtpSeq {
        kv: SeqKv::new(),
        shift: 0,
        hid_start: 0,
        hidden: Vec::new(),
        fed: Vec::new(),
        rng: Rng::new(seed ^ 0x6d74_705f_6472_6166),
        seeded: false,
        publish: false,
        keys: Vec::new(),
    }
}

/// The prefix-cache keys of the MTP positions of a prompt (one per position, `prompt.len() - 1`
/// of them): position j is computed from t_{j+1} and the target's hidden state at j, i.e. from
/// tokens t_0..=t_{j+1} (prompt positions take the reproducible MHA path), so it is keyed by
/// t_{j+1}, and position 0 by (t_0, t_1) folded into one value with the top bit set (outside
/// any vocabulary) so that prompts differing only in their first token do not share. Two
/// first-token pairs folding alike (odds ~2^-31) would only cost acceptance, never outputs:
/// drafts are verified.
fn prefix_keys(prompt: &[u32]) -> Vec<u32> {
    let mut keys: Vec<u32> = prompt.iter().skip(1).copied().collect();
    if let Some(k0) = keys.first_mut() {
        let mix = (u64::from(prompt[0]) << 32 | u64::from(*k0)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        *k0 = 0x8000_0000 | (mix >> 33) as u32;
    }
    keys
}

impl MtpSeq {
    /// The absolute position after the last one the MTP KV holds.
    fn end(&self) -> usize {
        self.kv.len() + self.shift
    }
}

impl Proposer for MtpProposer {
    fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>> {
        let h = self.model.hidden_state_width();
        let vocab = self.model.config.vocab_size;
        let mut out: Vec<Proposal> = reqs.iter().map(|_| Proposal::with_q()).collect();
        // Plan: positions [m, L - 1) to catch up on, from the stored hidden rows.
        struct Live {
            i: usize,
            tokens: Vec<u32>, // [catch-up rows] t_{j+1}
            prev: Vec<f32>,   // [catch-up rows, hidden]
            start: usize,     // first (absolute) position
            drafts: bool,     // false: a bounded part of a long catch-up, no drafts this round
            stopped: bool,    // its last draft fell below the request's confidence cut
        }
        // Each request's catch-up [m, L - 1) (the last row yields draft 1), then the round's
        // roles by the draft model's bound (module doc).
        let mut lagging: Vec<(usize, usize, usize)> = Vec::new(); // (request, m, L - 1)
        for (i, r) in reqs.iter().enumerate() {
            let l = r.context.len();
            if r.k == 0 || l < 2 {
                continue;
            }
            let s = self
                .seqs
                .entry(r.id)
                .or_insert_with(|| new_seq(r.params.seed));
            if !s.seeded {
                s.rng = Rng::new(r.params.seed ^ 0x6d74_705f_6472_6166);
                s.seeded = true;
            }
            // Keep the longest prefix of hidden rows whose fed tokens are committed.
            let ok = s
                .fed
                .iter()
                .enumerate()
                .take_while(|&(o, &t)| r.context.get(s.hid_start + o) == Some(&t))
                .count();
            s.fed.truncate(ok);
            s.hidden.truncate(ok * h);
            if s.hid_start > s.end() && !s.fed.is_empty() {
                // No hidden states will come for [end, hid_start): skip them (module doc).
                s.shift += s.hid_start - s.end();
                s.publish = false;
            }
            let m = s.end();
            let need_end = l - 1; // positions [m, l - 1)
            let have = s.hid_start <= m && s.hid_start + s.fed.len() >= need_end;
            if have && m < need_end {
                lagging.push((i, m, need_end));
            }
        }
        let lags: Vec<usize> = lagging.iter().map(|&(_, m, e)| e - m).collect();
        let mut live: Vec<Live> = Vec::new();
        for (&(i, m, need_end), role) in lagging.iter().zip(catch_up_roles(&lags)) {
            let (end, drafts) = match role {
                Some(Role::Draft) => (need_end, true),
                Some(Role::CatchUp(part)) => (m + part, false),
                None => continue, // the round's catch-up budget is spent
            };
            let r = &reqs[i];
            let s = self.seqs.get_mut(&r.id).expect("mtp seq");
            let rows = (m - s.hid_start)..(end - s.hid_start);
            let prev = s.hidden[rows.start * h..rows.end * h].to_vec();
            let tokens = r.context[m + 1..end + 1].to_vec();
            // Reserve the catch-up rows and, when drafting, the k - 1 chained positions.
            let need_abs = if drafts { end + r.k - 1 } else { end };
            let need = need_abs - s.shift;
            match self.kv.plan_grow(&s.kv, need) {
                Ok(plan) => self.kv.commit_grow(&mut s.kv, plan),
                Err(_) => continue, // MTP cache full: no drafts this round
            }
            live.push(Live {
                i,
                tokens,
                prev,
                start: m,
                drafts,
                stopped: false,
            });
        }
        let kmax = live
            .iter()
            .filter(|l| l.drafts)
            .map(|l| reqs[l.i].k)
            .max()
            .unwrap_or(0);
        // at least one forward (step 0) when only bounded catch-ups are live
        let steps = if live.is_empty() { 0 } else { kmax.max(1) };
        for step in 0..steps {
            let act: Vec<usize> = (0..live.len())
                .filter(|&a| {
                    step == 0 || (live[a].drafts && !live[a].stopped && reqs[live[a].i].k > step)
                })
                .collect();
            if act.is_empty() {
                break;
            }
            let mut prev = Vec::new(); // [rows, hidden]
            for &a in &act {
                prev.extend_from_slice(&live[a].prev);
            }
            let (logits, xo) = {
                let (chunks, shifts): (Vec<SeqChunk>, Vec<usize>) = act
                    .iter()
                    .map(|&a| {
                        let lv = &live[a];
                        let s = &self.seqs[&reqs[lv.i].id];
                        let chunk = SeqChunk {
                            kv: &s.kv,
                            start: lv.start - s.shift,
                            tokens: &lv.tokens,
                            mha_until: reqs[lv.i].prompt_len.saturating_sub(s.shift),
                            logits: LogitsMode::Last,
                        };
                        (chunk, s.shift)
                    })
                    .unzip();
                let (logits, xo, bytes) =
                    self.model
                        .mtp_forward_counted(0, &mut self.kv, &chunks, &prev, &shifts)?;
                self.weight_bytes += bytes;
                (logits, xo)
            };
            let mut row0 = 0;
            for (row, &a) in act.iter().enumerate() {
                let lv = &mut live[a];
                let r = &reqs[lv.i];
                let n = lv.tokens.len();
                let s = self.seqs.get_mut(&r.id).expect("mtp seq");
                self.kv.set_len(&mut s.kv, lv.start + n - s.shift);
                if !lv.drafts {
                    row0 += n;
                    continue;
                }
                let lrow = &logits[row * vocab..(row + 1) * vocab]; // [vocab]
                let tok = out[lv.i].push_drafted(lrow, r.params, &mut s.rng);
                lv.stopped = !out[lv.i].confident(lrow, r.params, r.p_min);
                // Next: the drafted token with this row's output, one position on.
                lv.prev = xo[(row0 + n - 1) * h..(row0 + n) * h].to_vec();
                lv.start += n;
                lv.tokens = vec![tok];
                row0 += n;
            }
        }
        // Drop the chained positions' KV: keep only positions fed by committed tokens and target
        // hidden states ([0, L - 1)); consume the hidden rows used.
        for r in reqs {
            if let Some(s) = self.seqs.get_mut(&r.id) {
                // (the positions after a skip are past the prompt's reused prefix: at most
                // the chained ones are dropped, never below the skip)
                let keep = s.end().min(r.context.len().saturating_sub(1));
                self.kv.truncate(&mut s.kv, keep.saturating_sub(s.shift));
                if s.publish && keep + 1 >= r.prompt_len {
                    self.kv
                        .register_prefix(&s.kv, &prefix_keys(&r.context[..r.prompt_len]));
                    s.publish = false;
                }
                let drop = keep.saturating_sub(s.hid_start).min(s.fed.len());
                s.fed.drain(..drop);
                s.hidden.drain(..drop * h);
                s.hid_start += drop;
            }
        }
        Ok(out)
    }

    fn match_prefix(&mut self, id: u64, prompt: &[u32], max: usize) -> usize {
        self.release(id);
        let mut s = new_seq(0);
        // MTP position j needs t_{j+1}: at most prompt.len() - 1 positions can be cached.
        s.keys = prefix_keys(prompt);
        s.kv = self.kv.match_prefix(&s.keys, max);
        s.hid_start = s.kv.len(); // the target's hidden rows start where the restored KV ends
        s.publish = true;
        self.seqs.insert(id, s);
        // The target reuses all it holds; what this proposer lacks of it, it skips.
        max
    }

    fn settle_prefix(&mut self, id: u64, len: usize) -> usize {
        // Whatever it restored, it goes on at `len`: shortened to it, or skipping to it.
        if let Some(s) = self.seqs.get_mut(&id) {
            let keys = std::mem::take(&mut s.keys);
            if s.kv.len() > len {
                // Match again, shorter (a truncation may not cut below a sliding window; the
                // blocks just released are still cached). Should it find fewer, the target's
                // hidden rows start past the MTP KV, and `propose` skips to them (module doc).
                self.kv.shorten_prefix_hit(&mut s.kv, &keys, len);
                s.hid_start = len;
            } else if s.kv.len() < len {
                // The target reused more than the MTP holds: no hidden states will come for
                // [kv.len(), len); the MTP skips them (module doc) and publishes nothing.
                s.shift = len - s.kv.len();
                s.hid_start = len;
                s.publish = false;
            }
        }
        len
    }

    fn on_target_hidden(&mut self, id: u64, start: usize, fed: &[u32], hidden: &[f32]) {
        let h = self.model.hidden_state_width();
        if hidden.len() != fed.len() * h || fed.is_empty() {
            return;
        }
        let s = self.seqs.entry(id).or_insert_with(|| new_seq(0));
        let end = s.hid_start + s.fed.len();
        if s.fed.is_empty() || start < s.hid_start || start > end {
            // First rows, or a gap / recompute: restart the stored rows here.
            s.hid_start = start;
            s.fed.clear();
            s.hidden.clear();
        } else {
            // Replace whatever was stored from `start` on (rows of rejected drafts).
            let keep = start - s.hid_start;
            s.fed.truncate(keep);
            s.hidden.truncate(keep * h);
        }
        s.fed.extend_from_slice(fed);
        s.hidden.extend_from_slice(hidden);
    }

    fn recorded_acceptance(&self) -> Option<f64> {
        self.recorded
    }

    fn replays_unseen_context(&self) -> bool {
        false // no hidden states for what the target computed before the swap: skipped
    }

    fn can_draft(&self, id: u64) -> bool {
        // The engine asks for decode requests only, whose prefill handed this proposer hidden
        // rows (or whose prefix it restored); swapped in after that, it has state from the
        // next target step on. Hidden rows past the KV's end are joined by a skip.
        self.seqs.contains_key(&id)
    }

    fn on_commit(&mut self, _id: u64, _context: &[u32]) {
        // Rows of rejected drafts are dropped lazily at the next `propose` (fed-token check);
        // the MTP KV never holds positions beyond the committed context (see `propose`).
    }

    fn release(&mut self, id: u64) {
        if let Some(mut s) = self.seqs.remove(&id) {
            self.kv.free(&mut s.kv);
        }
    }

    fn name(&self) -> String {
        "mtp".into()
    }

    fn kv_stats(&self) -> Option<KvStats> {
        Some(self.kv.stats())
    }

    fn reclaim_unheld(&mut self) -> usize {
        let live: Vec<&SeqKv> = self.seqs.values().map(|s| &s.kv).collect();
        self.kv.reclaim_unheld(&live)
    }

    fn check(&self, id: u64, context: &[u32]) -> std::result::Result<(), String> {
        match self.seqs.get(&id) {
            Some(s) if s.end() + 1 > context.len().max(1) => Err(format!(
                "request {id}: MTP KV holds positions up to {} for a context of {}",
                s.end(),
                context.len()
            )),
            _ => Ok(()),
        }
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

    fn wants_hidden(&self) -> bool {
        true
    }
}

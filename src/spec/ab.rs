//! Live A/B of two drafters: one `Proposer` that holds two arms (any kinds: draft model, MTP,
//! n-gram, or none — plain decoding as a control arm), each with its own draft KV, and sends
//! every request to one of them for its whole life.
//!
//! Where it sits: the engine holds it like any proposer (`DraftSource::Ab`, swappable at run
//! time); it asks `arm_of` to put every counter of a request in its arm's metric buckets (from
//! its first token on: `arm_of` answers with the arm the request will get before it has one).
//!
//! Guarantees: a request's arm is the one it asked for (`Request::draft_arm`), else a fixed
//! hash of its id against the ratio — deterministic for a given submission order; once chosen
//! it never changes, so each arm sees only its own requests' contexts and each stays lossless
//! on its own. The arm is fixed when the request is admitted with prefix caching on
//! (`Proposer::admit`: only that arm restores a cached prefix), else at its first proposal;
//! hidden states that arrive before the choice (the MTP arm needs the prefill's) go to both arms,
//! and the arm not chosen forgets the request when it is made.

use std::collections::HashMap;

use crate::error::Result;
use crate::kv::KvStats;

use super::proposer::{Proposal, ProposeRequest, Proposer};

/// Arm names in metrics and stats.
pub const ARM_NAMES: [&str; 2] = ["a", "b"];

/// Two drafters, traffic split between them.
pub struct AbProposer {
    /// Arm A, arm B (None: that arm decodes without drafts).
    arms: [Option<Box<dyn Proposer>>; 2],
    /// Fraction of requests (without an explicit arm) sent to arm B, in [0, 1].
    ratio_b: f64,
    assigned: HashMap<u64, u8>,
}

/// splitmix64 of the id mapped to [0, 1).
fn unit_hash(id: u64) -> f64 {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl AbProposer {
    pub fn new(a: Option<Box<dyn Proposer>>, b: Option<Box<dyn Proposer>>, ratio_b: f64) -> Self {
        AbProposer {
            arms: [a, b],
            ratio_b,
            assigned: HashMap::new(),
        }
    }

    /// The arm request `id` has, or will get at its first proposal (`asked`, else the ratio).
    fn arm(&self, id: u64, asked: Option<u8>) -> u8 {
        match (self.assigned.get(&id), asked) {
            (Some(&a), _) => a,
            (None, Some(a)) => a.min(1),
            (None, None) => u8::from(unit_hash(id) < self.ratio_b),
        }
    }

    /// The arm of request `id`, choosing it now if it has none.
    fn choose(&mut self, id: u64, asked: Option<u8>) -> usize {
        if let Some(&a) = self.assigned.get(&id) {
            return a as usize;
        }
        let a = self.arm(id, asked);
        self.assigned.insert(id, a);
        if let Some(other) = self.arms[1 - a as usize].as_mut() {
            other.release(id); // it may hold rows handed before the choice
        }
        a as usize
    }

    /// The arms a call about `id` goes to: its arm, or both before the choice.
    fn targets(&self, id: u64) -> Vec<usize> {
        match self.assigned.get(&id) {
            Some(&a) => vec![a as usize],
            None => vec![0, 1],
        }
    }
}

impl Proposer for AbProposer {
    fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>> {
        let mut out: Vec<Proposal> = reqs.iter().map(|_| Proposal::default()).collect();
        let arms: Vec<usize> = reqs.iter().map(|r| self.choose(r.id, r.arm)).collect();
        for arm in 0..2 {
            let idx: Vec<usize> = (0..reqs.len()).filter(|&i| arms[i] == arm).collect();
            let Some(p) = self.arms[arm].as_mut() else {
                continue;
            };
            if idx.is_empty() {
                continue;
            }
            let sub: Vec<ProposeRequest> = idx.iter().map(|&i| reqs[i].clone()).collect();
            for (i, prop) in idx.into_iter().zip(p.propose(&sub)?) {
                out[i] = prop;
            }
        }
        Ok(out)
    }

    fn on_commit(&mut self, id: u64, context: &[u32]) {
        for a in self.targets(id) {
            if let Some(p) = self.arms[a].as_mut() {
                p.on_commit(id, context);
            }
        }
    }

    fn release(&mut self, id: u64) {
        self.assigned.remove(&id);
        for p in self.arms.iter_mut().flatten() {
            p.release(id);
        }
    }

    fn name(&self) -> String {
        let n = |p: &Option<Box<dyn Proposer>>| p.as_ref().map_or("none".into(), |p| p.name());
        format!(
            "ab(a={}, b={}, b_share={})",
            n(&self.arms[0]),
            n(&self.arms[1]),
            self.ratio_b
        )
    }

    fn weight_bytes(&self) -> u64 {
        self.arms.iter().flatten().map(|p| p.weight_bytes()).sum()
    }

    fn kv_stats(&self) -> Option<KvStats> {
        // Both arms' pools as one: block counts summed, byte geometry of the first pool.
        let mut acc: Option<KvStats> = None;
        for s in self.arms.iter().flatten().filter_map(|p| p.kv_stats()) {
            match acc.as_mut() {
                None => acc = Some(s),
                Some(t) => {
                    t.num_blocks += s.num_blocks;
                    t.free_blocks += s.free_blocks;
                    t.cached_blocks += s.cached_blocks;
                    t.used_blocks += s.used_blocks;
                    t.prefix_hit_tokens += s.prefix_hit_tokens;
                    t.prefix_query_tokens += s.prefix_query_tokens;
                    t.evictions += s.evictions;
                    t.total_bytes += s.total_bytes;
                    t.window_blocks += s.window_blocks;
                    t.window_free_blocks += s.window_free_blocks;
                    t.window_cached_blocks += s.window_cached_blocks;
                }
            }
        }
        acc
    }

    fn reclaim_unheld(&mut self) -> usize {
        self.arms
            .iter_mut()
            .flatten()
            .map(|p| p.reclaim_unheld())
            .sum()
    }

    fn check(&self, id: u64, context: &[u32]) -> std::result::Result<(), String> {
        for a in self.targets(id) {
            if let Some(p) = self.arms[a].as_ref() {
                p.check(id, context)?;
            }
        }
        Ok(())
    }

    fn kv_bytes_per_token(&self) -> usize {
        // what one request costs: the larger of the two arms' caches
        self.arms
            .iter()
            .flatten()
            .map(|p| p.kv_bytes_per_token())
            .max()
            .unwrap_or(0)
    }

    fn has_model(&self) -> bool {
        self.arms.iter().flatten().any(|p| p.has_model())
    }

    fn wants_hidden(&self) -> bool {
        self.arms.iter().flatten().any(|p| p.wants_hidden())
    }

    fn on_target_hidden(&mut self, id: u64, start: usize, fed: &[u32], hidden: &[f32]) {
        for a in self.targets(id) {
            if let Some(p) = self.arms[a].as_mut().filter(|p| p.wants_hidden()) {
                p.on_target_hidden(id, start, fed, hidden);
            }
        }
    }

    fn replays_unseen_context(&self) -> bool {
        self.arms
            .iter()
            .flatten()
            .any(|p| p.replays_unseen_context())
    }

    fn can_draft(&self, id: u64) -> bool {
        // an unassigned request may still go to either arm; its arm decides once assigned
        self.targets(id)
            .iter()
            .any(|&a| self.arms[a].as_ref().is_some_and(|p| p.can_draft(id)))
    }

    fn admit(&mut self, id: u64, asked: Option<u8>) {
        self.choose(id, asked);
    }

    fn match_prefix(&mut self, id: u64, prompt: &[u32], max: usize) -> usize {
        // Normally the arm was fixed at admission (`admit`); without that both arms restore
        // and the target keeps what both can use.
        let mut keep = max;
        for a in self.targets(id) {
            if let Some(p) = self.arms[a].as_mut() {
                keep = keep.min(p.match_prefix(id, prompt, max));
            }
        }
        keep
    }

    fn settle_prefix(&mut self, id: u64, len: usize) -> usize {
        // the arm that holds least (an unassigned request may go to either)
        let mut seen = len;
        for a in self.targets(id) {
            if let Some(p) = self.arms[a].as_mut() {
                seen = seen.min(p.settle_prefix(id, len));
            }
        }
        seen
    }

    fn arm_of(&self, id: u64, asked: Option<u8>) -> Option<u8> {
        Some(self.arm(id, asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use crate::spec::NgramProposer;

    #[test]
    fn arms_follow_the_ratio_and_explicit_choices() {
        let mk = || -> Option<Box<dyn Proposer>> { Some(Box::new(NgramProposer::default())) };
        let mut ab = AbProposer::new(mk(), None, 0.25);
        let params = SamplingParams::default();
        let ctx = [1u32, 2, 3, 1, 2];
        let reqs: Vec<ProposeRequest> = (0..4000u64)
            .map(|id| ProposeRequest {
                id,
                context: &ctx,
                prompt_len: 3,
                k: 2,
                params: &params,
                arm: if id < 10 { Some(1) } else { None },
                p_min: 0.0,
            })
            .collect();
        let props = ab.propose(&reqs).unwrap();
        let b: Vec<u64> = (0..4000u64)
            .filter(|&i| ab.arm_of(i, None) == Some(1))
            .collect();
        assert!(
            (0..10).all(|i| ab.arm_of(i, None) == Some(1)),
            "explicit arm kept"
        );
        let share = (b.len() - 10) as f64 / 3990.0;
        assert!((share - 0.25).abs() < 0.03, "share of arm b: {share}");
        // arm b has no drafter: its requests get no drafts; arm a's get the n-gram's
        for (id, p) in props.iter().enumerate() {
            let in_b = ab.arm_of(id as u64, None) == Some(1);
            assert_eq!(p.tokens.is_empty(), in_b, "request {id}");
        }
        // the choice sticks, even when a later call asks otherwise; release forgets it
        let again = [ProposeRequest {
            arm: Some(0),
            ..reqs[3].clone()
        }];
        ab.propose(&again).unwrap();
        assert_eq!(ab.arm_of(3, Some(0)), Some(1));
        // before its first proposal a request's arm is the one it will get
        ab.release(3);
        assert_eq!(ab.arm_of(3, Some(0)), Some(0));
        assert_eq!(ab.arm_of(5000, None), ab.arm_of(5000, None));
    }

    /// Records which requests it was asked to restore, and holds them until released.
    #[derive(Default)]
    struct Restorer {
        held: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl Proposer for Restorer {
        fn propose(&mut self, reqs: &[ProposeRequest]) -> Result<Vec<Proposal>> {
            Ok(reqs.iter().map(|_| Proposal::default()).collect())
        }
        fn on_commit(&mut self, _id: u64, _context: &[u32]) {}
        fn release(&mut self, id: u64) {
            self.held.lock().unwrap().retain(|&h| h != id);
        }
        fn name(&self) -> String {
            "restorer".into()
        }
        fn match_prefix(&mut self, id: u64, _prompt: &[u32], max: usize) -> usize {
            self.held.lock().unwrap().push(id);
            max / 2
        }
    }

    #[test]
    fn only_the_admitted_arm_restores_a_prefix() {
        let (a, b) = (Restorer::default(), Restorer::default());
        let (ha, hb) = (a.held.clone(), b.held.clone());
        let mut ab = AbProposer::new(Some(Box::new(a)), Some(Box::new(b)), 0.5);
        let prompt = [5u32; 40];
        // admitted with an arm: only that arm restores, and the target keeps what it restored
        ab.admit(1, Some(1));
        assert_eq!(ab.match_prefix(1, &prompt, 40), 20);
        assert_eq!(
            (ha.lock().unwrap().clone(), hb.lock().unwrap().clone()),
            (vec![], vec![1])
        );
        // the ratio's choice likewise
        ab.admit(2, None);
        ab.match_prefix(2, &prompt, 40);
        let arm = ab.arm_of(2, None).unwrap();
        let holders = [
            ha.lock().unwrap().contains(&2),
            hb.lock().unwrap().contains(&2),
        ];
        assert_eq!(holders, [arm == 0, arm == 1]);
        // without an admission (a caller that never calls it) both arms restore
        ab.match_prefix(3, &prompt, 40);
        assert!(ha.lock().unwrap().contains(&3) && hb.lock().unwrap().contains(&3));
        ab.release(1);
        ab.release(2);
        ab.release(3);
        assert!(ha.lock().unwrap().is_empty() && hb.lock().unwrap().is_empty());
    }
}

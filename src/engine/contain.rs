//! Panic containment: a panic inside one step (an engine bug, or a dependency's) fails only the
//! request that causes it.
//!
//! Where it sits: `Engine::step` runs `Core::step` under `catch_unwind`; on a panic it calls
//! [`Core::contain_panic`], and `Core::schedule` consults [`Core::isolating`] while suspects remain.
//!
//! Guarantees:
//! - No request is lost or finished twice: every request present when the step began is, after
//!   containment, either requeued or given exactly one final event (`FinishReason::Error`).
//! - Outputs do not change: requeued requests keep their committed tokens (commits are per token
//!   and complete before the next one starts) and are recomputed like preempted requests, through
//!   the same attention paths, so their logits are the same bits.
//! - Progress: when the panicking step batched several requests, each becomes a *suspect* and
//!   runs alone (nothing else is planned beside it) until it completes a decode step; a panic in a
//!   step that planned a single request fails that request. So a request that panics whenever it
//!   runs is failed after at most two contained panics, and one that panicked once (a transient
//!   fault) finishes normally.
//! - The engine's locks are never poisoned by a step (the panic is caught inside the guard).
//! - No KV block leaks: a request dropped by the unwinding loses its block table, so after
//!   containment every block reference no live table accounts for is given back (target and
//!   drafter caches; `EngineStats::kv_blocks_reclaimed` counts them).
//! - A panic inside the drafter (propose, hidden-state hand-over, commit notification) is caught
//!   where it happens (`Core::disable_drafter`): drafting is switched off for every request —
//!   plain decoding, the same greedy bits — instead of failing them; a swap re-enables it.

use std::any::Any;
use std::collections::HashSet;

use super::core::Core;
use super::request::{Event, FinishReason, ReqState};

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

impl Core {
    /// Whether a suspect is waiting or running: the scheduler then plans one suspect alone.
    pub(crate) fn isolating(&self) -> bool {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .any(|r| r.suspect)
    }

    /// Recover from a panic that unwound out of `step`: fail the culprit when the step planned
    /// one request, else mark the planned requests suspect; requeue every running request with
    /// its committed tokens (KV and drafter state freed, recomputed later); give a final error
    /// event to any request the unwinding dropped. Returns the final events.
    pub(crate) fn contain_panic(&mut self, msg: &str) -> Vec<Event> {
        self.panics_contained += 1;
        let planned = std::mem::take(&mut self.step_ids);
        let present = std::mem::take(&mut self.present_ids);
        let mut events = Vec::new();
        if let [culprit] = planned[..] {
            if let Some(pos) = self.running.iter().position(|r| r.id == culprit) {
                let mut r = self.running.remove(pos);
                let finish = FinishReason::Error(format!(
                    "internal error while stepping this request (contained panic: {msg})"
                ));
                r.finished = Some(finish.clone());
                let ev = std::mem::take(&mut r.event);
                self.retire(&mut r);
                events.push(Event {
                    id: culprit,
                    finish: Some(finish),
                    ..ev
                });
            }
        }
        while let Some(mut r) = self.running.pop() {
            if let Some(finish) = r.finished.clone() {
                // It committed its last token before the panic: deliver it as it is.
                let ev = std::mem::take(&mut r.event);
                self.retire(&mut r);
                events.push(Event {
                    id: r.id,
                    finish: Some(finish),
                    ..ev
                });
                continue;
            }
            let suspect = planned.len() > 1 && planned.contains(&r.id);
            self.requeue(r, suspect);
        }
        let kept: HashSet<u64> = self
            .waiting
            .iter()
            .map(|r| r.id)
            .chain(events.iter().map(|e| e.id))
            .collect();
        for id in present.into_iter().filter(|id| !kept.contains(id)) {
            if let Some(p) = self.proposer.as_mut() {
                p.release(id);
            }
            let finish = FinishReason::Error(format!(
                "internal error: the request was dropped by a contained panic ({msg})"
            ));
            self.retired.push((id, Default::default()));
            events.push(Event {
                id,
                finish: Some(finish),
                ..Default::default()
            });
        }
        // A request the unwinding dropped took its block table with it: give those references
        // back, in the target's cache and the drafter's.
        let live: Vec<&crate::kv::SeqKv> = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .map(|r| &r.kv)
            .collect();
        let mut reclaimed = self.kv.reclaim_unheld(&live);
        if let Some(p) = self.proposer.as_mut() {
            reclaimed += p.reclaim_unheld();
        }
        self.kv_blocks_reclaimed += reclaimed as u64;
        events
    }

    /// Put a running request back at the front of the waiting queue with its committed tokens
    /// (like a preemption, without counting one).
    fn requeue(&mut self, mut r: ReqState, suspect: bool) {
        self.kv.free(&mut r.kv);
        if let Some(p) = self.proposer.as_mut() {
            p.release(r.id);
        }
        r.prefix_registered = false;
        r.suspect |= suspect;
        self.waiting.push_front(r);
    }
}

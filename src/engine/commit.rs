//! Committing one token to a request (`Core::verify_and_commit` calls it per accepted, recovered
//! or bonus token): the thinking budget's accounting, the counters, the log-prob, incremental
//! detokenisation with stop strings, and the finish checks (EOS / stop ids, max_tokens); and the
//! refusal of a logit row that is not finite.
//!
//! Guarantee: counters, log-probs and event text follow the committed tokens exactly; the finish
//! reason is set at the token that finished the request (the caller commits nothing after it).

use crate::sampling::log_softmax;
use crate::tokenizer::Tokenizer;

use super::request::{FinishReason, ReqState};

/// Whether a logit row holds only finite values (a corrupted or overflowing model gives NaN/inf,
/// which no sampler can turn into a meaningful token).
pub(super) fn finite(row: &[f32]) -> bool {
    row.iter().all(|x| x.is_finite())
}

/// End a request whose logits are not finite, with an error saying so.
pub(super) fn fail_non_finite(r: &mut ReqState) {
    let f = FinishReason::Error(
        "the model produced non-finite logits (NaN or inf): its weights or config are broken"
            .into(),
    );
    r.finished = Some(f.clone());
    r.event.finish = Some(f);
}

/// Commit one token to a request: budget accounting, log-prob, detokenisation, stop checks.
/// Returns true when the request finished.
pub(super) fn commit(
    r: &mut ReqState,
    tok: u32,
    forced: bool,
    logits: &[f32],
    eos: &[u32],
    tok_: Option<&Tokenizer>,
) -> bool {
    r.tokens.push(tok);
    r.budget.commit(tok, forced);
    r.counters.reasoning_tokens = r.budget.reasoning as u64;
    r.counters.answer_tokens = r.budget.answer as u64;
    r.counters.forced_tokens = r.budget.forced_tokens as u64;
    r.counters.forced_end_of_think = u64::from(r.budget.forced_end);
    r.event.tokens.push(tok);
    if r.want_logprobs {
        r.event.logprobs.push(log_softmax(logits)[tok as usize]);
    }
    let mut finish = None;
    if let (Some(t), Some(d)) = (tok_, r.detok.as_mut()) {
        if let Ok(delta) = d.push(t, tok) {
            let res = r.stop.push(&delta);
            r.event.text.push_str(&res.emit);
            if res.stopped {
                finish = Some(FinishReason::StopString);
            }
        }
    }
    if finish.is_none()
        && ((!r.params.ignore_eos && eos.contains(&tok)) || r.params.stop_token_ids.contains(&tok))
    {
        finish = Some(FinishReason::Stop);
    }
    if finish.is_none() && r.generated() >= r.params.max_tokens {
        finish = Some(FinishReason::Length);
    }
    if let Some(f) = finish {
        if f != FinishReason::StopString {
            if let (Some(t), Some(d)) = (tok_, r.detok.as_mut()) {
                if let Ok(rest) = d.finish(t) {
                    let res = r.stop.push(&rest);
                    r.event.text.push_str(&res.emit);
                }
                r.event.text.push_str(&r.stop.finish());
            }
        }
        r.event.finish = Some(f.clone());
        r.finished = Some(f);
        return true;
    }
    false
}

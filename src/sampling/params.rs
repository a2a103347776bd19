//! Per-request sampling parameters. Built by the caller (API / C ABI), validated once when the
//! request is submitted, then read by `sampling` (non-speculative steps) and by the speculative
//! verifier (which applies the same processing to target p and draft q).
//!
//! Guarantees: [`SamplingParams::validate`] rejects every value the samplers cannot honour with an
//! [`Error::InvalidRequest`] whose message starts with the offending field name; after validation
//! no sampling function can fail or panic on these parameters.

use crate::error::{Error, Result};

/// How to pick the next token of one request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest most-likely set with mass >= top_p; 1.0 = off. Must be in (0, 1].
    pub top_p: f32,
    /// Seed of the request's own RNG (see [`crate::sampling::Rng`]).
    pub seed: u64,
    /// Maximum number of generated (answer) tokens; at least 1.
    pub max_tokens: usize,
    /// Generation stops after committing any of these ids (the id itself is committed).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops when the output text contains any of these; the match is not emitted.
    pub stop_strings: Vec<String>,
    /// Keep generating past the model's end-of-sequence token.
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    /// Greedy, 256 tokens, seed 0, no stops.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 256,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            ignore_eos: false,
        }
    }
}

impl SamplingParams {
    /// Check every field; the error message names the first bad field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, msg: String| Err(Error::InvalidRequest(format!("{field}: {msg}")));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                "temperature",
                format!("must be finite and >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if self.max_tokens == 0 {
            return bad("max_tokens", "must be at least 1".to_string());
        }
        if let Some(i) = self.stop_strings.iter().position(|s| s.is_empty()) {
            return bad("stop_strings", format!("entry {i} is empty"));
        }
        Ok(())
    }
}

/// True when sampling is deterministic argmax: temperature 0, or top_k == 1 (which keeps exactly
/// the argmax, lowest id on ties, so it is the same function). Greedy steps draw no random numbers.
pub fn is_greedy(p: &SamplingParams) -> bool {
    p.temperature == 0.0 || p.top_k == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(p: &SamplingParams) -> String {
        match p.validate() {
            Err(Error::InvalidRequest(m)) => m.split(':').next().unwrap().to_string(),
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn default_is_valid_greedy() {
        let p = SamplingParams::default();
        p.validate().unwrap();
        assert!(is_greedy(&p));
        assert_eq!((p.max_tokens, p.seed), (256, 0));
    }

    #[test]
    fn validate_names_the_field() {
        let base = SamplingParams {
            temperature: 0.7,
            ..Default::default()
        };
        base.validate().unwrap();
        for t in [f32::NAN, -0.1, f32::INFINITY] {
            assert_eq!(
                field_of(&SamplingParams {
                    temperature: t,
                    ..base.clone()
                }),
                "temperature"
            );
        }
        for tp in [0.0, -0.5, 1.0001, f32::NAN] {
            assert_eq!(
                field_of(&SamplingParams {
                    top_p: tp,
                    ..base.clone()
                }),
                "top_p"
            );
        }
        SamplingParams {
            top_p: 1.0,
            ..base.clone()
        }
        .validate()
        .unwrap();
        SamplingParams {
            top_p: 1e-6,
            ..base.clone()
        }
        .validate()
        .unwrap();
        assert_eq!(
            field_of(&SamplingParams {
                max_tokens: 0,
                ..base.clone()
            }),
            "max_tokens"
        );
        let stops = vec!["ok".to_string(), String::new()];
        assert_eq!(
            field_of(&SamplingParams {
                stop_strings: stops,
                ..base
            }),
            "stop_strings"
        );
    }

    #[test]
    fn greedy_detection() {
        let p = SamplingParams {
            temperature: 0.8,
            ..Default::default()
        };
        assert!(!is_greedy(&p));
        assert!(is_greedy(&SamplingParams {
            top_k: 1,
            ..p.clone()
        }));
        assert!(!is_greedy(&SamplingParams { top_k: 2, ..p }));
    }
}

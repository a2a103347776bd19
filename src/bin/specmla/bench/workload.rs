//! The bench workload: the bundled task prompts (`models/workload/prompts.jsonl`, written by
//! tools/train) with their answers and natural thinking lengths, or random prompts where the
//! file is missing; and the check of a generated answer. Read by the speculation and swap
//! benches.
//!
//! Guarantee: a malformed line is an error naming the file and line, never a panic.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use specmla::engine::{Prompt, Request};
use specmla::tokenizer::Tokenizer;
use specmla::{Error, Result};

use super::random_tokens;

/// One workload line (tools/train writes these; unknown fields are ignored).
#[derive(Clone, Debug, Deserialize)]
pub struct WorkItem {
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub answer: Option<Value>,
    #[serde(default)]
    pub natural_thinking_tokens: Option<usize>,
}

impl WorkItem {
    /// A greedy request for this prompt (token ids when the line has them).
    pub fn request(&self, max_tokens: usize) -> Request {
        let p = match (&self.prompt_token_ids, &self.prompt) {
            (Some(ids), _) => Prompt::Tokens(ids.clone()),
            (None, Some(t)) => Prompt::Text(t.clone()),
            (None, None) => Prompt::Tokens(vec![0]),
        };
        let mut r = Request::new(p);
        r.sampling.max_tokens = max_tokens;
        r
    }
}

/// Load up to `n` workload items; a missing file gives `n` random 16-token prompts (ids >= 3).
pub fn load_workload(
    path: &Path,
    n: usize,
    vocab: usize,
    seed: u64,
) -> Result<(Vec<WorkItem>, String)> {
    if !path.is_file() {
        let items = (0..n)
            .map(|i| WorkItem {
                prompt: None,
                prompt_token_ids: Some(random_tokens(
                    16,
                    vocab,
                    3.min(vocab as u32 - 1),
                    seed + i as u64,
                )),
                answer: None,
                natural_thinking_tokens: None,
            })
            .collect();
        return Ok((
            items,
            format!("{n} random 16-token prompts ({} not found)", path.display()),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut items = Vec::new();
    for (i, line) in text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .enumerate()
    {
        let it: WorkItem = serde_json::from_str(line).map_err(|e| {
            Error::InvalidArgument(format!("{} line {}: {e}", path.display(), i + 1))
        })?;
        if it.prompt.is_none() && it.prompt_token_ids.is_none() {
            return Err(Error::InvalidArgument(format!(
                "{} line {}: no prompt",
                path.display(),
                i + 1
            )));
        }
        items.push(it);
    }
    let label = format!("{} prompts of {}", items.len(), path.display());
    Ok((items, label))
}

/// The number in "The answer is N." of `text`, if present.
pub fn parse_answer(text: &str) -> Option<String> {
    let rest = &text[text.find("The answer is ")? + "The answer is ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    (!digits.is_empty() && rest[digits.len()..].starts_with('.')).then_some(digits)
}

/// Whether `tokens` answer `item` correctly: decode what follows the first `</think>`.
pub(super) fn is_correct(
    tok: &Tokenizer,
    think_end: u32,
    tokens: &[u32],
    item: &WorkItem,
) -> Option<bool> {
    let want = match item.answer.as_ref()? {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let Some(pos) = tokens.iter().position(|&t| t == think_end) else {
        return Some(false);
    };
    let text = tok.decode(&tokens[pos + 1..], true).ok()?;
    Some(parse_answer(&text).as_deref() == Some(want.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_answer_sentence() {
        assert_eq!(parse_answer("The answer is 7."), Some("7".into()));
        assert_eq!(parse_answer("xx The answer is 12.<eos>"), Some("12".into()));
        assert_eq!(parse_answer("The answer is 7"), None);
        assert_eq!(parse_answer("The answer is ."), None);
        assert_eq!(parse_answer("no answer"), None);
    }

    #[test]
    fn missing_workload_gives_random_prompts() {
        let (items, label) =
            load_workload(Path::new("/nonexistent/prompts.jsonl"), 5, 100, 1).unwrap();
        assert_eq!(items.len(), 5);
        assert!(items.iter().all(|it| it
            .prompt_token_ids
            .as_ref()
            .unwrap()
            .iter()
            .all(|&t| t < 100)));
        assert!(label.contains("random"));
    }
}

//! `specmla score`: per-position log-probs as JSON (top-k per position, or the full vocabulary).

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use specmla::engine::score::score_tokens;
use specmla::model::Model;
use specmla::tokenizer::Tokenizer;
use specmla::{Error, Result};

#[derive(Args)]
pub struct ScoreArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, conflicts_with = "token_ids")]
    pub text: Option<String>,
    /// Comma-separated token ids.
    #[arg(long)]
    pub token_ids: Option<String>,
    /// Entries per position.
    #[arg(long, default_value_t = 5, conflicts_with = "full")]
    pub top_k: usize,
    /// Every vocabulary entry per position.
    #[arg(long)]
    pub full: bool,
    /// Output JSON (the only format).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ScoreArgs) -> Result<()> {
    let model = Model::load_dir(&a.model)?;
    let tok = Tokenizer::from_model_dir(&a.model)?;
    let ids: Vec<u32> = match (&a.text, &a.token_ids) {
        (Some(t), _) => tok
            .as_ref()
            .ok_or_else(|| {
                Error::NoTokenizer("--text needs tokenizer.json; use --token-ids".into())
            })?
            .encode(t, false)?,
        (None, Some(s)) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u32>()
                    .map_err(|_| Error::InvalidArgument(format!("bad token id `{x}`")))
            })
            .collect::<Result<_>>()?,
        _ => return Err(Error::InvalidArgument("give --text or --token-ids".into())),
    };
    let rows = score_tokens(&model, &ids)?;
    let name = |id: usize| tok.as_ref().and_then(|t| t.id_to_token(id as u32));
    let positions: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, lp)| {
            let next = ids.get(i + 1).copied();
            let mut v = json!({"position": i, "token": ids[i], "next_token": next,
                "next_logprob": next.map(|n| lp[n as usize])});
            if a.full {
                v["logprobs"] = json!(lp);
            } else {
                let mut idx: Vec<usize> = (0..lp.len()).collect();
                idx.sort_by(|&x, &y| {
                    lp[y]
                        .partial_cmp(&lp[x])
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(x.cmp(&y))
                });
                v["top"] = json!(idx
                    .iter()
                    .take(a.top_k)
                    .map(|&j| json!({"id": j, "token": name(j), "logprob": lp[j]}))
                    .collect::<Vec<_>>());
            }
            v
        })
        .collect();
    println!("{}", json!({"token_ids": ids, "positions": positions}));
    Ok(())
}

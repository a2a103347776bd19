//! The bundled reasoning workload (models/target + models/draft, trained by tools/train):
//! - 200 held-out prompts, continuous batch, greedy: output with speculation (draft model k=4 and
//!   k=8, n-gram k=3, adaptive) is token-for-token and log-prob-for-log-prob the output without it,
//!   across reasoning budgets none / 0 / 1 / 3 (< k) / 50% / natural / natural + 10 / large, a
//!   multi-token end marker ("</think>" followed by "The"), stop strings, and max_tokens inside
//!   thinking; the reasoning count never exceeds the budget.
//! - the engine's greedy continuations equal transformers' (tools/train reference, fp32 compute).
//! - the thinking budget changes answers: full thinking >= 90 % right on 160 held-out problems,
//!   half the natural thinking >= 30 points worse, and a forced end still answers.
//!
//! The bundled models are committed; these tests fail if they are missing. (While models/target
//! is absent the pair models/draft -> models/draft-weak stands in, except for the budget test.)

mod common;

use common::repo;
use serde_json::Value;
use specmla::engine::{DraftSource, Engine, EngineConfig, Output, Prompt, Request};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;

/// Workload prompts: models/workload/prompts.jsonl when present (held-out problems with their
/// natural thinking length), else problems of the same task generated here (same template as
/// tools/train/task.py; natural thinking ~ 10 tokens per operation).
fn workload(n: usize, tok: &specmla::tokenizer::Tokenizer) -> Vec<Value> {
    if let Ok(text) = std::fs::read_to_string(repo().join("models/workload/prompts.jsonl")) {
        return text
            .lines()
            .take(n)
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    }
    let mut x: u64 = 0x9e37_79b9;
    let mut next = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    (0..n)
        .map(|_| {
            let ops = 4 + next(7) as usize;
            let first = next(26 - ops as u64) as u8;
            let mut names: Vec<char> = (0..26u8).map(|c| (b'a' + c) as char).filter(|&c| c != 'x').collect();
            names.drain(..first as usize);
            let prog: Vec<String> =
                (0..ops).map(|i| format!("{}{}{}", names[i], if next(2) == 0 { '+' } else { '-' }, 1 + next(3))).collect();
            let text = format!("<bos>Q: Let x={}. Evaluate mod 10: {}<think>", next(10), prog.join(","));
            let ids = tok.encode(&text, false).unwrap();
            serde_json::json!({"prompt": text, "prompt_token_ids": ids, "natural_thinking_tokens": ops * 10})
        })
        .collect()
}

fn model_pair() -> (std::path::PathBuf, std::path::PathBuf) {
    let m = repo().join("models");
    if m.join("target/config.json").is_file() {
        (m.join("target"), m.join("draft"))
    } else {
        (m.join("draft"), m.join("draft-weak"))
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn cfg(spec: SpecMode) -> EngineConfig {
    EngineConfig {
        kv_dtype: KvDtype::F32,
        spec,
        threads: 2,
        num_blocks: 4096,
        draft_num_blocks: 4096,
        max_running: 64,
        ..EngineConfig::default()
    }
}

fn engine(draft: DraftSource, spec: SpecMode) -> Engine {
    Engine::new(&model_pair().0, draft, cfg(spec)).unwrap()
}

fn requests(engine: &Engine, n: usize) -> Vec<Request> {
    let tok = engine.tokenizer().expect("bundled tokenizer").clone();
    let end_multi = {
        let mut e = tok.encode("</think>", false).unwrap();
        e.extend(tok.encode("The", false).unwrap());
        e
    };
    workload(n, &tok)
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let natural = w["natural_thinking_tokens"].as_u64().unwrap() as usize;
            let mut r = Request::new(Prompt::Tokens(ids(&w["prompt_token_ids"])));
            r.sampling.max_tokens = 160;
            r.logprobs = true;
            r.reasoning_budget = match i % 9 {
                0 => None,
                1 => Some(0),
                2 => Some(1),
                3 => Some(3),
                4 => Some(natural / 2),
                5 => Some(natural),
                6 => Some(natural + 10),
                7 => Some(10_000),
                _ => Some(natural / 4),
            };
            if i % 17 == 3 {
                r.think_end = Some(end_multi.clone()); // several tokens
            }
            if i % 13 == 6 {
                r.sampling.stop_strings = vec!["answer is".into()];
            }
            if i % 19 == 7 {
                r.sampling.max_tokens = 5; // ends inside thinking
            }
            r
        })
        .collect()
}

fn compare(label: &str, base: &[Output], got: &[Output], reqs: &[Request]) {
    for (i, ((b, g), r)) in base.iter().zip(got).zip(reqs).enumerate() {
        assert_eq!(
            b.token_ids, g.token_ids,
            "{label}: prompt {i} tokens differ"
        );
        assert_eq!(b.text, g.text, "{label}: prompt {i} text differs");
        let bb: Vec<u32> = b.logprobs.iter().map(|x| x.to_bits()).collect();
        let gb: Vec<u32> = g.logprobs.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bb, gb, "{label}: prompt {i} log-probs differ");
        if let Some(bud) = r.reasoning_budget {
            assert!(
                g.counters.reasoning_tokens <= bud as u64,
                "{label}: prompt {i} over budget"
            );
        }
    }
}

#[test]
fn speculation_is_lossless_on_200_workload_prompts() {
    let base_e = engine(DraftSource::None, SpecMode::Fixed(0));
    let reqs = requests(&base_e, 200);
    let base = base_e.generate(reqs.clone()).unwrap();
    assert!(
        base.iter().any(|o| o.counters.forced_end_of_think == 1),
        "budgets forced some ends"
    );
    assert!(base.iter().any(|o| o.finish_reason == "stop_string"));
    assert!(base.iter().any(|o| o.finish_reason == "length"));
    let draft = model_pair().1;
    for (label, src, spec) in [
        (
            "draft k=4",
            DraftSource::Dir(draft.clone()),
            SpecMode::Fixed(4),
        ),
        (
            "draft k=8",
            DraftSource::Dir(draft.clone()),
            SpecMode::Fixed(8),
        ),
        (
            "ngram k=3",
            DraftSource::Ngram { min_n: 1, max_n: 3 },
            SpecMode::Fixed(3),
        ),
        (
            "adaptive",
            DraftSource::Dir(draft.clone()),
            SpecMode::Adaptive { k_max: 6 },
        ),
    ] {
        let e = engine(src, spec);
        let got = e.generate(reqs.clone()).unwrap();
        compare(label, &base, &got, &reqs);
        let t = e.stats().totals;
        eprintln!(
            "{label}: drafted {} accepted {} ({:.3}) saved by budget {} mean acceptance length {:.2}",
            t.drafted_tokens,
            t.accepted_tokens,
            t.accepted_tokens as f64 / t.drafted_tokens.max(1) as f64,
            t.draft_tokens_saved,
            t.mean_acceptance_length()
        );
        if label.starts_with("draft") {
            assert!(
                t.accepted_tokens * 10 >= t.drafted_tokens,
                "{label}: trained draft accepted too little (random is ~0.5%)"
            );
            assert!(
                t.draft_tokens_saved > 0,
                "{label}: budget clipping never saved a draft position"
            );
        }
    }
}

#[test]
fn greedy_matches_the_transformers_reference() {
    let path = repo().join("models/workload/reference_greedy.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        panic!(
            "{} missing: tools/train writes it with the bundled models",
            path.display()
        );
    };
    let refs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let e = engine(DraftSource::Dir(model_pair().1), SpecMode::Fixed(4));
    let reqs: Vec<Request> = refs
        .iter()
        .map(|v| {
            let want = ids(&v["output_token_ids"]);
            let mut r = Request::new(Prompt::Tokens(ids(&v["prompt_token_ids"])));
            r.sampling.max_tokens = want.len().max(1);
            r.sampling.ignore_eos = false;
            r
        })
        .collect();
    let outs = e.generate(reqs).unwrap();
    let mut same = 0;
    for (o, v) in outs.iter().zip(&refs) {
        let want = ids(&v["output_token_ids"]);
        if o.token_ids == want {
            same += 1;
        } else {
            eprintln!(
                "mismatch: engine {:?}\n     reference {:?}",
                o.token_ids, want
            );
        }
    }
    assert_eq!(
        same,
        refs.len(),
        "{same}/{} greedy continuations equal transformers'",
        refs.len()
    );
}

/// The answer after the last `The answer is D.` in a generated text.
fn parsed_answer(text: &str) -> Option<&str> {
    let at = text.rfind("The answer is ")? + "The answer is ".len();
    let rest = &text[at..];
    let digit = rest.get(..1).filter(|d| d.as_bytes()[0].is_ascii_digit())?;
    rest[1..].starts_with('.').then_some(digit)
}

#[test]
fn the_thinking_budget_changes_answers() {
    // The budget must matter on the bundled task: with the full natural thinking the target
    // (speculating with the bundled draft, k=4) answers held-out problems correctly; forced to end
    // thinking at half its natural length it can only guess (chance is 10%), yet still answers.
    let (target, draft) = model_pair();
    assert!(
        target.ends_with("target"),
        "models/target missing: this test needs the trained pair"
    );
    let e = engine(DraftSource::Dir(draft), SpecMode::Fixed(4));
    let items = workload(160, e.tokenizer().expect("bundled tokenizer"));
    assert!(
        items.iter().all(|w| w["answer"].is_string()),
        "models/workload/prompts.jsonl (with answers) missing"
    );
    let run = |half: bool| -> Vec<Output> {
        let reqs = items
            .iter()
            .map(|w| {
                let mut r = Request::new(Prompt::Tokens(ids(&w["prompt_token_ids"])));
                r.sampling.max_tokens = 160;
                if half {
                    r.reasoning_budget =
                        Some(w["natural_thinking_tokens"].as_u64().unwrap() as usize / 2);
                }
                r
            })
            .collect();
        e.generate(reqs).unwrap()
    };
    let score = |outs: &[Output]| {
        let ok = outs
            .iter()
            .zip(&items)
            .filter(|(o, w)| parsed_answer(&o.text) == w["answer"].as_str())
            .count();
        100.0 * ok as f64 / items.len() as f64
    };
    let full = run(false);
    let half = run(true);
    let (acc_full, acc_half) = (score(&full), score(&half));
    eprintln!(
        "answer accuracy over {} problems: full thinking {acc_full:.1}%, half {acc_half:.1}%",
        items.len()
    );
    assert!(
        full.iter().all(|o| o.counters.forced_end_of_think == 0),
        "no budget, nothing forced"
    );
    for (o, w) in half.iter().zip(&items) {
        assert_eq!(
            o.counters.forced_end_of_think, 1,
            "half budget forces the end: {}",
            o.text
        );
        let budget = w["natural_thinking_tokens"].as_u64().unwrap() / 2;
        assert!(
            o.counters.reasoning_tokens <= budget,
            "{} reasoning tokens over budget {budget}",
            o.counters.reasoning_tokens
        );
        assert!(
            parsed_answer(&o.text).is_some(),
            "a forced end still produces an answer: {:?}",
            o.text
        );
    }
    assert!(
        acc_full >= 90.0,
        "full thinking answers {acc_full:.1}% (< 90%)"
    );
    assert!(
        acc_full - acc_half >= 30.0,
        "half budget {acc_half:.1}% vs full {acc_full:.1}%: the budget must matter"
    );
}

#[test]
fn parsed_answer_reads_the_last_answer() {
    assert_eq!(
        parsed_answer("k+1:3+1=4;</think>The answer is 4.<eos>"),
        Some("4")
    );
    assert_eq!(parsed_answer("The answer is 4.The answer is 7."), Some("7"));
    assert_eq!(parsed_answer("The answer is x."), None);
    assert_eq!(parsed_answer("The answer is 4"), None);
    assert_eq!(parsed_answer("no answer"), None);
}

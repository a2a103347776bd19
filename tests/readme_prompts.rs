//! Every concrete prompt of README.md is one the bundled model was trained on: run as the README
//! runs it (the bundled target and draft, its reasoning budget, greedy), the answer it prints is
//! the one the task's own rule gives (start value, then each step `<letter><+|-><digit>` added
//! mod 10).

mod common;

use common::repo;
use specmla::engine::{DraftSource, Engine, EngineConfig, Prompt, Request};

/// The task's evaluator: `x=<n>` then every `<a-z><+|-><0-9>` after "mod 10", mod 10.
fn evaluate(prompt: &str) -> Option<i64> {
    let start = prompt.find("x=")? + 2;
    let digits: String = prompt[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let mut x: i64 = digits.parse().ok()?;
    let steps = &prompt[prompt.find("mod 10")? + 6..];
    let b = steps.as_bytes();
    let mut n = 0;
    for i in 0..b.len().saturating_sub(2) {
        if b[i].is_ascii_lowercase()
            && (b[i + 1] == b'+' || b[i + 1] == b'-')
            && b[i + 2].is_ascii_digit()
        {
            let d = (b[i + 2] - b'0') as i64;
            x += if b[i + 1] == b'+' { d } else { -d };
            n += 1;
        }
    }
    (n > 0).then_some(x.rem_euclid(10))
}

/// `The answer is N.` — the last one the text states.
fn answer(text: &str) -> Option<i64> {
    let i = text.rfind("The answer is ")? + "The answer is ".len();
    text[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

/// (prompt, reasoning budget) of every concrete `<bos>Q: ..<think>` prompt in README.md; the
/// budget is the one given on the prompt's line or the line after it.
fn readme_prompts() -> Vec<(String, Option<usize>)> {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(a) = line.find("<bos>Q:") else {
            continue;
        };
        let Some(len) = line[a..].find("<think>") else {
            continue;
        };
        let prompt = &line[a..a + len + "<think>".len()];
        if prompt.contains("...") {
            continue; // a placeholder, not a prompt
        }
        let near = format!(
            "{} {} {}",
            lines[i.saturating_sub(1)],
            line,
            lines.get(i + 1).unwrap_or(&"")
        );
        let budget = ["--reasoning-budget ", "reasoning_budget = Some("]
            .iter()
            .find_map(|k| {
                let j = near.find(k)? + k.len();
                near[j..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect::<String>()
                    .parse()
                    .ok()
            });
        out.push((prompt.to_string(), budget));
    }
    out
}

#[test]
fn the_evaluator_and_answer_parser_work() {
    assert_eq!(
        evaluate("<bos>Q: Begin with x=8. Run the program mod 10: n+1,o+3,p+1,q-2<think>"),
        Some(1)
    );
    assert_eq!(
        evaluate("<bos>Q: Take x=0. What is the result mod 10 of j-1 k-3<think>"),
        Some(6)
    );
    assert_eq!(evaluate("no steps"), None);
    assert_eq!(answer("a;b The answer is 7. The answer is 3."), Some(3));
}

#[test]
fn every_readme_prompt_gets_the_right_answer() {
    let prompts = readme_prompts();
    assert!(prompts.len() >= 2, "README prompts found: {prompts:?}");
    let e = Engine::new(
        &repo().join("models/target"),
        DraftSource::Dir(repo().join("models/draft")),
        EngineConfig {
            threads: 2,
            num_blocks: 256,
            draft_num_blocks: 256,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    for (prompt, budget) in prompts {
        let mut r = Request::new(Prompt::Text(prompt.clone()));
        r.reasoning_budget = budget;
        r.sampling.max_tokens = 96;
        let out = e.generate(vec![r]).unwrap().remove(0);
        let want = evaluate(&prompt).unwrap_or_else(|| panic!("{prompt}: not a task prompt"));
        assert_eq!(
            answer(&out.text),
            Some(want),
            "{prompt} (budget {budget:?}) printed {:?}",
            out.text
        );
    }
}

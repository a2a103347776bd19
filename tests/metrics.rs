//! Operator metrics: per-label and per-draft-generation counters add up to the engine totals,
//! and the Prometheus text exposition parses with a real text-format parser (prometheus-parse)
//! and carries every family, with values equal to the engine's own counters.

mod common;

use std::collections::HashMap;

use common::{budget_requests, repo, spec_test_cfg};
use prometheus_parse::{Scrape, Value};
use specmla::engine::{DraftSource, Engine};
use specmla::spec::{Counters, SpecMode};

fn golden(name: &str) -> std::path::PathBuf {
    repo().join("models/golden").join(name)
}

fn sum(samples: &[&prometheus_parse::Sample]) -> f64 {
    samples
        .iter()
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[test]
fn label_and_generation_counters_add_up_and_the_text_parses() {
    let target = golden("v4_mixed");
    let e = Engine::new(
        &target,
        DraftSource::Dir(golden("v4_sliding")),
        spec_test_cfg(SpecMode::Fixed(3)),
    )
    .unwrap();
    let labels = ["chat", "reasoning", "", "a \"quoted\" \\ label"];
    let mut reqs = budget_requests(16, 0x5eed, 30, 10, &[11, 12]);
    for (i, r) in reqs.iter_mut().enumerate() {
        let l = labels[i % labels.len()];
        r.label = (!l.is_empty()).then(|| l.to_string());
    }
    // first half under the first drafter generation, the rest after a swap
    let (first, second) = reqs.split_at(8);
    let a = common::run_checked(&e, first.to_vec(), &[]);
    e.set_draft_weights_blocking(DraftSource::Ngram { min_n: 1, max_n: 3 })
        .unwrap();
    let b = common::run_checked(&e, second.to_vec(), &[]);
    let outs: Vec<_> = a.into_iter().chain(b).collect();

    // per label: the sum of its requests' counters; overall: the engine totals
    let buckets = e.label_counters();
    let mut by_label: HashMap<String, Counters> = HashMap::new();
    for (l, _, c) in &buckets {
        by_label.entry(l.clone()).or_default().add(c);
    }
    for l in labels {
        let mut want = Counters::default();
        for (o, r) in outs.iter().zip(&reqs) {
            if r.label.as_deref().unwrap_or("") == l {
                want.add(&o.counters);
            }
        }
        assert_eq!(by_label[l], want, "label {l:?}");
    }
    let mut total = Counters::default();
    buckets.iter().for_each(|(_, _, c)| total.add(c));
    let st = e.stats();
    assert_eq!(total, st.totals);
    let gens: std::collections::BTreeSet<u64> = buckets.iter().map(|(_, g, _)| *g).collect();
    assert_eq!(gens.len(), 2, "both drafter generations report: {gens:?}");
    assert!(st.totals.drafted_tokens > 0);

    let text = e.metrics_text();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
    let fam = |name: &str| -> Vec<&prometheus_parse::Sample> {
        scrape.samples.iter().filter(|s| s.metric == name).collect()
    };
    for name in [
        "specmla_spec_decode_num_drafts_total",
        "specmla_spec_decode_num_draft_tokens_total",
        "specmla_spec_decode_num_accepted_tokens_total",
        "specmla_spec_decode_num_accepted_tokens_per_pos_total",
        "specmla_spec_decode_num_draft_tokens_per_pos_total",
        "specmla_reasoning_tokens_total",
        "specmla_answer_tokens_total",
        "specmla_forced_end_of_think_total",
        "specmla_spec_decode_draft_tokens_saved_total",
        "specmla_preemptions_total",
        "specmla_step_latency_seconds",
        "specmla_time_per_output_token_seconds",
        "specmla_kv_blocks",
        "specmla_draft_swaps_total",
        "specmla_requests_running",
    ] {
        assert!(!fam(name).is_empty(), "family {name} missing:\n{text}");
    }
    let t = &st.totals;
    for (name, want) in [
        ("specmla_spec_decode_num_drafts_total", t.draft_steps),
        (
            "specmla_spec_decode_num_draft_tokens_total",
            t.drafted_tokens,
        ),
        (
            "specmla_spec_decode_num_accepted_tokens_total",
            t.accepted_tokens,
        ),
        ("specmla_reasoning_tokens_total", t.reasoning_tokens),
        ("specmla_answer_tokens_total", t.answer_tokens),
        ("specmla_forced_end_of_think_total", t.forced_end_of_think),
        ("specmla_prompt_tokens_total", t.prompt_tokens),
    ] {
        assert_eq!(sum(&fam(name)), want as f64, "{name}");
    }
    assert_eq!(
        sum(&fam(
            "specmla_spec_decode_num_accepted_tokens_per_pos_total"
        )),
        t.accepted_tokens as f64
    );
    // labels survive escaping: the parser splits on the unescaped quotes and hands back the
    // escaped value (prometheus-parse does not unescape), which unescapes to the original
    let unescape = |v: &str| {
        let (mut out, mut it) = (String::new(), v.chars());
        while let Some(c) = it.next() {
            match (c, c == '\\') {
                (_, true) => match it.next() {
                    Some('n') => out.push('\n'),
                    Some(o) => out.push(o),
                    None => {}
                },
                (c, false) => out.push(c),
            }
        }
        out
    };
    let quoted = fam("specmla_answer_tokens_total")
        .iter()
        .any(|s| s.labels.get("label").map(unescape).as_deref() == Some(labels[3]));
    let seen: Vec<_> = fam("specmla_answer_tokens_total")
        .iter()
        .map(|s| s.labels.get("label").map(str::to_string))
        .collect();
    assert!(quoted, "escaped label lost: {seen:?}");
    // swaps: one applied (the n-gram drafter), none failed
    let applied = fam("specmla_draft_swaps_total")
        .iter()
        .find(|s| s.labels.get("outcome") == Some("applied"))
        .map(|s| sum(&[s]))
        .unwrap();
    assert_eq!(applied, 1.0);
    // histograms: one step-latency observation per step that ran a forward; one TPOT per
    // finished request with >= 2 generated tokens
    let hist_count = |name: &str| -> f64 {
        fam(name)
            .iter()
            .map(|s| match &s.value {
                Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
                _ => 0.0,
            })
            .sum()
    };
    assert!(hist_count("specmla_step_latency_seconds") > 0.0);
    let multi = outs.iter().filter(|o| o.token_ids.len() >= 2).count();
    assert_eq!(
        hist_count("specmla_time_per_output_token_seconds"),
        multi as f64
    );
}

#[test]
fn refused_blocking_swaps_count_as_failed() {
    let e = Engine::new(
        &golden("v4_mixed"),
        DraftSource::Dir(golden("v4_sliding")),
        spec_test_cfg(SpecMode::Fixed(2)),
    )
    .unwrap();
    let failed = |e: &Engine| {
        let text = e.metrics_text();
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses");
        let s: Vec<&prometheus_parse::Sample> = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "specmla_draft_swaps_total" && s.labels.get("outcome") == Some("failed")
            })
            .collect();
        sum(&s)
    };
    assert_eq!(failed(&e), 0.0);
    let missing = repo().join("models/golden/no-such-draft");
    assert!(e
        .set_draft_weights_blocking(DraftSource::Dir(missing.clone()))
        .is_err());
    assert_eq!(failed(&e), 1.0);
    assert!(e
        .set_draft_weights_blocking(DraftSource::Bytes(b"not safetensors".to_vec()))
        .is_err());
    assert_eq!(failed(&e), 2.0);
    assert_eq!(e.stats().swaps_failed, 2);
    // the engine still serves with its drafter
    let outs = common::run_checked(&e, budget_requests(2, 7, 12, 6, &[11, 12]), &[]);
    assert!(outs.iter().all(|o| !o.token_ids.is_empty()));
}

#[test]
fn bad_labels_are_refused() {
    let e = Engine::new(
        &golden("v4_sliding"),
        DraftSource::None,
        spec_test_cfg(SpecMode::Fixed(0)),
    )
    .unwrap();
    for bad in ["x".repeat(65), "tab\there".to_string()] {
        let mut r = budget_requests(1, 1, 5, 10, &[11, 12]).remove(0);
        r.label = Some(bad);
        assert!(e.submit(r).is_err());
    }
    let mut r = budget_requests(1, 1, 5, 10, &[11, 12]).remove(0);
    r.label = Some("x".repeat(64));
    assert!(e.submit(r).is_ok());
}

/// A request that finishes on an accepted draft (here a stop token) commits nothing after it:
/// `EngineStats::decode` counts the tokens kept, not accepted drafts + 1 (which counted one
/// token per such request that was never committed, and the spec bench's decode tok/s with it).
#[test]
fn decode_tokens_end_at_a_stop_on_an_accepted_draft() {
    let run = |draft: DraftSource, k: usize, stop: Option<u32>| {
        let mut cfg = spec_test_cfg(SpecMode::Fixed(k));
        cfg.draft_p_min = 0.0; // draft k tokens every step
        let e = Engine::new(&golden("v3_yarn"), draft, cfg).unwrap();
        let mut r =
            specmla::engine::Request::new(specmla::engine::Prompt::Tokens(vec![20, 21, 22]));
        r.sampling.max_tokens = 24;
        r.sampling.ignore_eos = true;
        r.sampling.stop_token_ids = stop.into_iter().collect();
        e.submit(r).unwrap();
        let mut tokens = Vec::new();
        while e.has_work() {
            for ev in e.step().unwrap() {
                tokens.extend(ev.tokens);
            }
        }
        (tokens, e.stats())
    };
    let (plain, _) = run(DraftSource::None, 0, None);
    // the target as its own draft: every draft accepted, so a stop token that is not the first
    // token of a verification's bonus position ends the request on an accepted draft
    let mut ended_on_a_draft = 0;
    for i in 1..plain.len() {
        let t = plain[i];
        if plain[..i].contains(&t) {
            continue; // the stop would end the request at its first occurrence
        }
        let (tokens, st) = run(DraftSource::Dir(golden("v3_yarn")), 4, Some(t));
        assert_eq!(tokens, plain[..=i], "stop at {i}");
        assert_eq!(st.decode.committed_tokens, i as u64, "stop at {i}");
        ended_on_a_draft += usize::from(i % 5 != 0);
    }
    assert!(ended_on_a_draft > 0, "no stop fell on an accepted draft");
}

/// `EngineStats::decode` counts exactly the decode-only steps: one request alone commits its
/// first token in the prefill step and every later token in a decode step (plain decoding: one
/// per step; with a draft: the accepted drafts too), and those steps' time and bytes are part of
/// the totals; `steps_by_tokens` counts each by the tokens its forward took.
#[test]
fn decode_only_step_totals_add_up() {
    for (draft, k) in [
        (DraftSource::None, 0),
        (DraftSource::Dir(golden("v3_bf16")), 4),
    ] {
        let e = Engine::new(&golden("v3_yarn"), draft, spec_test_cfg(SpecMode::Fixed(k))).unwrap();
        let mut r =
            specmla::engine::Request::new(specmla::engine::Prompt::Tokens(vec![20, 21, 22]));
        r.sampling.max_tokens = 24;
        r.sampling.ignore_eos = true;
        e.submit(r).unwrap();
        let t0 = std::time::Instant::now();
        let mut generated = 0u64;
        while e.has_work() {
            generated += e
                .step()
                .unwrap()
                .iter()
                .map(|ev| ev.tokens.len() as u64)
                .sum::<u64>();
        }
        let wall = t0.elapsed().as_secs_f64();
        let st = e.stats();
        assert_eq!(generated, 24);
        assert_eq!(st.decode.committed_tokens, generated - 1, "k={k}");
        assert_eq!(
            st.decode.steps,
            st.steps - 1,
            "k={k}: all but the prefill step"
        );
        if k == 0 {
            assert_eq!(st.decode.steps, generated - 1);
        } else {
            assert!(st.decode.steps < generated - 1, "drafts were accepted");
        }
        assert!(st.decode.seconds > 0.0 && st.decode.seconds <= wall);
        assert!(st.decode.weight_bytes > 0 && st.decode.weight_bytes < st.target_weight_bytes);
        // steps by forward tokens: every decode step once; a plain step forwards one token, a
        // verification 1 + its drafts (at most k; the confidence cut stops some earlier), and
        // a step commits at most what it forwarded
        let by = &st.decode.steps_by_tokens;
        assert_eq!(by.iter().sum::<u64>(), st.decode.steps, "k={k}");
        let forwarded: u64 = by.iter().enumerate().map(|(n, &s)| n as u64 * s).sum();
        assert!(forwarded >= st.decode.committed_tokens, "k={k}: {by:?}");
        assert!(by.len() <= k + 2 && by[0] == 0, "k={k}: {by:?}");
        if k == 0 {
            assert_eq!(by[1], st.decode.steps);
        } else {
            assert!(by[1] < st.decode.steps, "drafts verified: {by:?}");
        }
    }
}

/// The drafter's weight bytes (`EngineStats::draft_weight_bytes`, the spec bench's roofline
/// denominator): counted per draft forward like the target's, so two requests drafting in the
/// same steps (one batched forward per draft position) need fewer bytes than the same two
/// requests one after the other; a drafter without a model counts none, and the decode-only
/// share is part of the total.
#[test]
fn draft_weight_bytes_count_a_batched_forward_once() {
    let distinct = [vec![20u32, 21, 22], vec![30u32, 31, 32, 33]];
    // repeated n-grams, so the n-gram drafter finds matches and drafts
    let repetitive = [
        vec![20u32, 21, 22, 20, 21, 22, 20, 21],
        vec![30u32, 31, 30, 31, 30],
    ];
    let request = |p: &Vec<u32>| {
        let mut r = specmla::engine::Request::new(specmla::engine::Prompt::Tokens(p.clone()));
        r.sampling.max_tokens = 16;
        r.sampling.ignore_eos = true;
        r
    };
    let run = |draft: DraftSource, together: bool, prompts: &[Vec<u32>; 2]| {
        let e = Engine::new(&golden("v3_yarn"), draft, spec_test_cfg(SpecMode::Fixed(2))).unwrap();
        if together {
            for p in prompts {
                e.submit(request(p)).unwrap();
            }
            while e.has_work() {
                e.step().unwrap();
            }
        } else {
            for p in prompts {
                e.submit(request(p)).unwrap();
                while e.has_work() {
                    e.step().unwrap();
                }
            }
        }
        e.stats()
    };
    let together = run(DraftSource::Dir(golden("v3_bf16")), true, &distinct);
    let apart = run(DraftSource::Dir(golden("v3_bf16")), false, &distinct);
    assert!(together.totals.drafted_tokens > 0 && apart.totals.drafted_tokens > 0);
    assert!(together.draft_weight_bytes > 0);
    assert!(
        together.draft_weight_bytes < apart.draft_weight_bytes,
        "batched draft forwards: {} bytes, one request at a time: {}",
        together.draft_weight_bytes,
        apart.draft_weight_bytes
    );
    for st in [&together, &apart] {
        assert!(st.decode.draft_weight_bytes > 0);
        assert!(st.decode.draft_weight_bytes <= st.draft_weight_bytes);
    }
    let ngram = run(DraftSource::Ngram { min_n: 1, max_n: 3 }, true, &repetitive);
    assert!(ngram.totals.drafted_tokens > 0, "n-gram drafted");
    assert_eq!(ngram.draft_weight_bytes, 0);
}

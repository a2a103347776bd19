//! Integration tests for `tokenizer` (encode/decode, streaming detokenisation) and `sampling`
//! (determinism, statistical agreement with `processed_probs`, top-k/top-p edge cases, stop
//! strings over a real token stream). Tokenizers are built in code as tokenizer.json documents.

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::json;
use specmla::sampling::{
    argmax, is_greedy, processed_probs, sample_from, sample_token, Rng, SamplingParams, StopMatcher,
};
use specmla::tokenizer::{StreamDecoder, Tokenizer};
use specmla::Error;

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// GPT-2 byte -> printable char table used by byte-level BPE.
fn byte_to_char() -> Vec<char> {
    let mut table = vec!['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        };
    }
    table
}

fn bl(bytes: &[u8]) -> String {
    let t = byte_to_char();
    bytes.iter().map(|&b| t[b as usize]).collect()
}

fn added(id: u32, content: &str, special: bool) -> serde_json::Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": special})
}

/// Byte-level BPE: 256 byte tokens, merges that make "é" one token and split "🌍" (4 UTF-8 bytes)
/// into two 2-byte tokens, plus specials `<think>`, `</think>`, `<|eos|>`.
fn byte_level_json() -> String {
    let mut vocab: HashMap<String, u32> = HashMap::new();
    for b in 0..=255u8 {
        vocab.insert(bl(&[b]), b as u32);
    }
    let globe = "🌍".as_bytes();
    let merge_pairs: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"h".to_vec(), b"e".to_vec()),
        (b"l".to_vec(), b"l".to_vec()),
        (b"ll".to_vec(), b"o".to_vec()),
        (b" ".to_vec(), b"w".to_vec()),
        ("é".as_bytes()[..1].to_vec(), "é".as_bytes()[1..].to_vec()),
        (globe[..1].to_vec(), globe[1..2].to_vec()),
        (globe[2..3].to_vec(), globe[3..].to_vec()),
    ];
    let mut merges = Vec::new();
    for (a, b) in &merge_pairs {
        let joined: Vec<u8> = a.iter().chain(b).copied().collect();
        let id = vocab.len() as u32;
        vocab.insert(bl(&joined), id);
        merges.push(format!("{} {}", bl(a), bl(b)));
    }
    let n = vocab.len() as u32;
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(n, "<think>", true), added(n + 1, "</think>", true),
                         added(n + 2, "<|eos|>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                  "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
    .to_string()
}

/// Metaspace decoder (SentencePiece style): decoding a token depends on whether it is first.
fn metaspace_json() -> String {
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(6, "<s>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                          "split": true},
        "post_processor": null,
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                    "split": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                  "byte_fallback": false, "ignore_merges": false,
                  "vocab": {"▁This": 0, "▁is": 1, "a": 2, "▁": 3, "▁é": 4, "t": 5},
                  "merges": []}
    })
    .to_string()
}

/// Llama-style byte fallback: `<0xC3>` `<0xA9>` decode to "é" only together.
fn byte_fallback_json() -> String {
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                  "byte_fallback": true, "ignore_merges": false,
                  "vocab": {"<0xC3>": 0, "<0xA9>": 1, "▁caf": 2, "x": 3}, "merges": []}
    })
    .to_string()
}

fn byte_level() -> Tokenizer {
    Tokenizer::from_bytes(byte_level_json().as_bytes()).expect("byte-level fixture parses")
}

/// Push ids one by one; returns (each delta, finish output).
fn stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<String>, String) {
    let mut sd = StreamDecoder::new(skip);
    let deltas = ids.iter().map(|&id| sd.push(tok, id).unwrap()).collect();
    let tail = sd.finish(tok).unwrap();
    (deltas, tail)
}

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

#[test]
fn byte_level_roundtrip_and_specials() {
    let tok = byte_level();
    assert_eq!(tok.vocab_size(), 256 + 7 + 3);
    let text = "héllo 🌍<think>hello world</think>";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let think = tok.token_to_id("<think>").unwrap();
    let end = tok.token_to_id("</think>").unwrap();
    assert!(ids.contains(&think) && ids.contains(&end));
    assert_eq!(tok.decode(&ids, true).unwrap(), "héllo 🌍hello world");
    let specials: Vec<String> = tok
        .special_token_ids()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(specials, vec!["<think>", "</think>", "<|eos|>"]);
    // "é" is a single merged token and the globe is two half-character tokens.
    assert_eq!(tok.encode("é", false).unwrap().len(), 1);
    assert_eq!(tok.encode("🌍", false).unwrap().len(), 2);
    let unknown = tok.vocab_size() as u32;
    assert!(matches!(
        tok.decode(&[unknown], false),
        Err(Error::UnknownToken { .. })
    ));
}

#[test]
fn stream_holds_back_split_characters() {
    let tok = byte_level();
    let ids = tok.encode("héllo 🌍!", false).unwrap();
    let (deltas, tail) = stream(&tok, &ids, false);
    // Every delta is valid text without replacement characters; the globe's first half emits "".
    assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
    let globe = tok.encode("🌍", false).unwrap();
    let pos = ids.iter().position(|&i| i == globe[0]).unwrap();
    assert_eq!(deltas[pos], "");
    assert_eq!(deltas[pos + 1], "🌍");
    assert_eq!(deltas.concat() + &tail, "héllo 🌍!");
    assert_eq!(tail, "");
    // Raw single bytes of "é" (not the merged token) also stream correctly.
    let (deltas, tail) = stream(&tok, &[b'a' as u32, 0xC3, 0xA9, b'b' as u32], false);
    assert_eq!(deltas, vec!["a", "", "é", "b"]);
    assert_eq!(tail, "");
}

#[test]
fn stream_finish_flushes_incomplete_character() {
    let tok = byte_level();
    let globe = tok.encode("🌍", false).unwrap();
    let (deltas, tail) = stream(&tok, &[b'x' as u32, globe[0]], false);
    assert_eq!(deltas, vec!["x", ""]);
    assert_eq!(tail, "\u{FFFD}");
    assert_eq!(
        tok.decode(&[b'x' as u32, globe[0]], false).unwrap(),
        "x\u{FFFD}"
    );
}

#[test]
fn stream_skips_special_tokens_when_asked() {
    let tok = byte_level();
    let ids = tok.encode("a<think>b</think>c", false).unwrap();
    let (deltas, tail) = stream(&tok, &ids, true);
    assert_eq!(deltas.concat() + &tail, "abc");
    let (deltas, tail) = stream(&tok, &ids, false);
    assert_eq!(deltas.concat() + &tail, "a<think>b</think>c");
}

#[test]
fn stream_rejects_unknown_ids_without_corrupting_state() {
    let tok = byte_level();
    let mut sd = StreamDecoder::new(false);
    assert_eq!(sd.push(&tok, b'a' as u32).unwrap(), "a");
    assert!(matches!(
        sd.push(&tok, 9999),
        Err(Error::UnknownToken { id: 9999, .. })
    ));
    assert_eq!(sd.push(&tok, b'b' as u32).unwrap(), "b");
    assert_eq!(sd.ids(), &[b'a' as u32, b'b' as u32]);
}

#[test]
fn metaspace_stream_keeps_word_spaces() {
    let tok = Tokenizer::from_bytes(metaspace_json().as_bytes()).unwrap();
    // The first token's leading space is stripped, later ones keep it.
    assert_eq!(tok.decode(&[0, 0], false).unwrap(), "This This");
    let ids = [0, 1, 3, 2, 5, 4, 0];
    let (deltas, tail) = stream(&tok, &ids, false);
    assert_eq!(deltas[..2], ["This".to_string(), " is".to_string()]);
    assert_eq!(deltas.concat() + &tail, tok.decode(&ids, false).unwrap());
}

#[test]
fn byte_fallback_stream_waits_for_complete_character() {
    let tok = Tokenizer::from_bytes(byte_fallback_json().as_bytes()).unwrap();
    let ids = [2, 0, 1, 3];
    assert_eq!(tok.decode(&ids, false).unwrap(), " caféx");
    let (deltas, tail) = stream(&tok, &ids, false);
    assert_eq!(deltas, vec![" caf", "", "é", "x"]);
    assert_eq!(tail, "");
}

#[test]
fn from_file_and_model_dir() {
    let dir = std::env::temp_dir().join(format!("specmla-toksamp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(Tokenizer::from_model_dir(&dir).unwrap().is_none());
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, byte_level_json()).unwrap();
    let a = Tokenizer::from_file(&path).unwrap();
    let b = Tokenizer::from_model_dir(&dir).unwrap().unwrap();
    assert_eq!(a.vocab_fingerprint(), b.vocab_fingerprint());
    assert_eq!(a.vocab_fingerprint(), byte_level().vocab_fingerprint());
    let other = Tokenizer::from_bytes(metaspace_json().as_bytes()).unwrap();
    assert_ne!(a.vocab_fingerprint(), other.vocab_fingerprint());
    assert!(matches!(
        Tokenizer::from_file(&dir.join("absent.json")),
        Err(Error::Io { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random id sequences (specials included, so arbitrary byte splits and invalid UTF-8):
    /// the streamed deltas concatenate to exactly decode(all ids), and no delta before finish
    /// ends in a replacement character.
    #[test]
    fn byte_level_stream_concat_equals_decode(ids in prop::collection::vec(0u32..266, 0..40),
                                              skip in any::<bool>()) {
        let tok = byte_level();
        let (deltas, tail) = stream(&tok, &ids, skip);
        prop_assert_eq!(deltas.concat() + &tail, tok.decode(&ids, skip).unwrap());
        for d in &deltas {
            prop_assert!(!d.ends_with('\u{FFFD}'), "delta {:?} ends in U+FFFD", d);
        }
    }

    #[test]
    fn metaspace_stream_concat_equals_decode(ids in prop::collection::vec(0u32..7, 0..30),
                                             skip in any::<bool>()) {
        let tok = Tokenizer::from_bytes(metaspace_json().as_bytes()).unwrap();
        let (deltas, tail) = stream(&tok, &ids, skip);
        prop_assert_eq!(deltas.concat() + &tail, tok.decode(&ids, skip).unwrap());
    }

    /// Valid UTF-8 text (any chars) encodes, decodes and streams back to itself.
    #[test]
    fn byte_level_text_roundtrip(text in "\\PC{0,24}") {
        let tok = byte_level();
        let ids = tok.encode(&text, false).unwrap();
        prop_assert_eq!(&tok.decode(&ids, false).unwrap(), &text);
        let (deltas, tail) = stream(&tok, &ids, false);
        prop_assert_eq!(deltas.concat() + &tail, text);
    }
}

// ---------------------------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------------------------

fn stochastic(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
        ..Default::default()
    }
}

/// Deterministic pseudo-random logits row.
fn logits_row(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_f64() * 8.0 - 4.0) as f32).collect()
}

#[test]
fn seeded_sampling_is_deterministic() {
    let rows: Vec<Vec<f32>> = (0..64).map(|i| logits_row(100, i)).collect();
    let run = |seed: u64| -> Vec<u32> {
        let p = stochastic(0.9, 40, 0.95, seed);
        let mut rng = Rng::new(p.seed);
        rows.iter()
            .map(|row| sample_token(row, &p, &mut rng))
            .collect()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
    // processed_probs is bit-identical across calls.
    let p = stochastic(0.7, 0, 0.8, 0);
    let a = processed_probs(&rows[3], &p);
    assert_eq!(a, processed_probs(&rows[3], &p));
}

/// Upper critical values of the chi-square distribution at significance 0.001, df = 1..=10.
const CHI2_CRIT_001: [f64; 10] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588,
];

/// Draw `n` samples with `sample_token` and run a chi-square goodness-of-fit test against
/// `processed_probs` at significance 0.001 (fixed seed, so the outcome is reproducible).
/// Returns (statistic, degrees of freedom).
fn chi_square(logits: &[f32], p: &SamplingParams, n: usize) -> (f64, usize) {
    let probs = processed_probs(logits, p);
    let mut counts = vec![0usize; logits.len()];
    let mut rng = Rng::new(p.seed);
    for _ in 0..n {
        counts[sample_token(logits, p, &mut rng) as usize] += 1;
    }
    let mut stat = 0.0;
    let mut support = 0;
    for (i, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
        if q == 0.0 {
            assert_eq!(c, 0, "id {i} has zero probability but was sampled");
            continue;
        }
        support += 1;
        let e = q as f64 * n as f64;
        assert!(e >= 5.0, "expected count too small for the test");
        stat += (c as f64 - e).powi(2) / e;
    }
    (stat, support - 1)
}

#[test]
fn sampling_frequencies_match_processed_probs() {
    let logits = [1.0f32, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.4];
    let cases = [
        (stochastic(1.0, 0, 1.0, 11), 7),  // plain softmax: all 8 ids kept
        (stochastic(0.8, 5, 1.0, 12), 4),  // top-k = 5: 5 ids kept
        (stochastic(1.3, 0, 0.7, 13), 3),  // top-p: 4 ids reach 0.7 mass
        (stochastic(1.0, 6, 0.85, 14), 3), // both: 4 ids kept
    ];
    for (p, df) in cases {
        let (stat, got_df) = chi_square(&logits, &p, 200_000);
        assert_eq!(got_df, df, "{p:?}");
        assert!(
            stat < CHI2_CRIT_001[df - 1],
            "chi2 {stat} df {df} for {p:?}"
        );
    }
}

#[test]
fn top_k_one_and_tiny_top_p_equal_greedy() {
    for seed in 0..200 {
        let row = logits_row(50, 1000 + seed);
        let want = argmax(&row);
        let mut rng = Rng::new(seed);
        assert_eq!(
            sample_token(&row, &stochastic(1.5, 1, 1.0, seed), &mut rng),
            want
        );
        assert_eq!(
            sample_token(&row, &stochastic(1.5, 0, 1e-7, seed), &mut rng),
            want
        );
        assert_eq!(
            sample_token(&row, &SamplingParams::default(), &mut rng),
            want
        );
    }
    assert!(is_greedy(&stochastic(1.5, 1, 1.0, 0)));
}

#[test]
fn ties_are_broken_toward_lower_ids() {
    let row = [0.0f32, 3.0, 1.0, 3.0, 3.0];
    assert_eq!(argmax(&row), 1);
    // top_k = 2 over three tied maxima keeps ids 1 and 3, equally likely.
    let probs = processed_probs(&row, &stochastic(1.0, 2, 1.0, 0));
    assert_eq!(probs, vec![0.0, 0.5, 0.0, 0.5, 0.0]);
    // top_k = 3 keeps the three tied maxima (1/3 each); top_p = 0.5 then needs the lower two.
    let probs = processed_probs(&row, &stochastic(1.0, 3, 0.5, 0));
    assert_eq!(probs, vec![0.0, 0.5, 0.0, 0.5, 0.0]);
}

#[test]
fn sample_from_is_inverse_cdf_in_id_order() {
    // With probs [0.25, 0.25, 0.5], the draw u picks id 0 for u < .25, 1 for u < .5, else 2.
    let probs = [0.25f32, 0.25, 0.5];
    for seed in 0..500 {
        let u = Rng::new(seed).next_f64();
        let want = if u < 0.25 {
            0
        } else if u < 0.5 {
            1
        } else {
            2
        };
        assert_eq!(sample_from(&probs, &mut Rng::new(seed)), want, "u = {u}");
    }
}

#[test]
fn validate_rejects_bad_requests() {
    let bad = [
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 1.5,
            ..Default::default()
        },
        SamplingParams {
            max_tokens: 0,
            ..Default::default()
        },
        SamplingParams {
            stop_strings: vec![String::new()],
            ..Default::default()
        },
    ];
    let fields = [
        "temperature",
        "temperature",
        "top_p",
        "top_p",
        "max_tokens",
        "stop_strings",
    ];
    for (p, field) in bad.iter().zip(fields) {
        match p.validate() {
            Err(Error::InvalidRequest(msg)) => assert!(msg.starts_with(field), "{msg}"),
            other => panic!("{p:?}: expected InvalidRequest, got {other:?}"),
        }
    }
    SamplingParams::default().validate().unwrap();
    stochastic(0.7, 50, 0.9, 3).validate().unwrap();
}

/// Detokenise a token stream and cut it at a stop string that straddles token boundaries.
#[test]
fn stop_string_over_streamed_tokens() {
    let tok = byte_level();
    let ids = tok.encode("héllo 🌍 world STOP after", false).unwrap();
    let mut sd = StreamDecoder::new(false);
    let mut sm = StopMatcher::new(&["🌍 w".to_string(), "STOP".to_string()]);
    let mut out = String::new();
    let mut stopped_at = None;
    for (i, &id) in ids.iter().enumerate() {
        let r = sm.push(&sd.push(&tok, id).unwrap());
        out.push_str(&r.emit);
        if r.stopped {
            stopped_at = Some(i);
            break;
        }
    }
    assert_eq!(out, "héllo ");
    assert_eq!(sm.matched_stop(), Some("🌍 w"));
    // It stopped on the token that completed " w", not earlier.
    let upto = stopped_at.unwrap();
    assert!(tok.decode(&ids[..=upto], false).unwrap().ends_with("🌍 w"));
}

// ---------------------------------------------------------------------------------------------
// The trained tokenizer of the bundled models
// ---------------------------------------------------------------------------------------------

/// The tokenizer trained for the bundled mod-10 reasoning models (see tools/train): round-trips
/// task text, streams it exactly, and has `<think>` / `</think>` as special tokens. Every bundled
/// model directory that has a tokenizer.json is checked, and all must share one vocabulary
/// (a draft and its target must). Reports and skips when no bundled model is present yet.
#[test]
fn bundled_trained_tokenizer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let text =
        "<bos>Q: Let x=3. Evaluate mod 10: a+4, b-7 c+0<think>a+4:3+4=7;b-7:7-7=0;c+0:0+0=0;\
                </think>The answer is 0.<eos>";
    let mut fingerprints = Vec::new();
    for name in ["target", "draft-weak", "draft"] {
        let Some(tok) = Tokenizer::from_model_dir(&root.join(name)).unwrap() else {
            continue;
        };
        let think = tok.token_to_id("<think>").expect("<think> in vocab");
        let end = tok.token_to_id("</think>").expect("</think> in vocab");
        let specials: Vec<u32> = tok
            .special_token_ids()
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert!(
            specials.contains(&think) && specials.contains(&end),
            "{name}: {specials:?}"
        );
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.contains(&think) && ids.contains(&end), "{name}");
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{name}");
        let (deltas, tail) = stream(&tok, &ids, false);
        assert_eq!(deltas.concat() + &tail, text, "{name}");
        let (deltas, tail) = stream(&tok, &ids, true);
        assert_eq!(
            deltas.concat() + &tail,
            tok.decode(&ids, true).unwrap(),
            "{name}"
        );
        fingerprints.push((name, tok.vocab_fingerprint()));
    }
    if fingerprints.is_empty() {
        eprintln!("bundled_trained_tokenizer: no models/*/tokenizer.json present; nothing checked");
    }
    assert!(
        fingerprints.windows(2).all(|w| w[0].1 == w[1].1),
        "{fingerprints:?}"
    );
}

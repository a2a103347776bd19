//! Replays the committed fuzz inputs through the library's fuzz entry points
//! (`specmla::fuzzing`): every file of `fuzz/corpus/TARGET/` (seeds) and `fuzz/regressions/TARGET/`
//! (inputs that once crashed a target). An entry point may accept or refuse an input with a typed
//! error; a panic fails the test and names the file. Also checks that the seeds reach deep paths
//! (the generated checkpoints build a model; the bundled tokenizer and request seeds are
//! accepted), and holds the generator of the seed corpus (`regenerate_seed_corpus`, ignored).

use std::panic::{catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};

use specmla::fuzzing::{self, Target, TARGETS};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    v.sort();
    v
}

fn target(name: &str) -> Target {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .expect("a fuzz target of that name")
}

/// Replay every committed input of `name`; returns how many were accepted.
fn replay(name: &str) -> usize {
    let f = target(name);
    let mut accepted = 0;
    let mut n = 0;
    for kind in ["corpus", "regressions"] {
        for path in files(&repo().join("fuzz").join(kind).join(name)) {
            let data = std::fs::read(&path).expect("readable fuzz input");
            match catch_unwind(|| f(&data)) {
                Ok(r) => accepted += usize::from(r.is_ok()),
                Err(p) => {
                    eprintln!("fuzz target `{name}` panicked on {}", path.display());
                    resume_unwind(p)
                }
            }
            n += 1;
        }
    }
    assert!(n > 0, "no committed inputs for fuzz target `{name}`");
    accepted
}

#[test]
fn replay_config() {
    assert!(replay("config") >= 5, "the golden configs are accepted");
}

#[test]
fn replay_safetensors() {
    assert!(
        replay("safetensors") >= 2,
        "the seed checkpoints build a model"
    );
}

#[test]
fn replay_sharded() {
    assert!(replay("sharded") >= 4, "the seed indexes build a model");
}

#[test]
fn replay_tokenizer() {
    assert!(replay("tokenizer") >= 3, "the seed tokenizers load");
}

#[test]
fn replay_request() {
    assert!(replay("request") >= 2, "some seed requests are served");
}

#[test]
fn generated_seeds_build_a_model() {
    for sel in 0..fuzzing::FIXED_CONFIGS {
        let mut st = vec![sel];
        st.extend(fuzzing::seed_checkpoint(sel));
        fuzzing::safetensors(&st).unwrap_or_else(|e| panic!("seed checkpoint {sel}: {e}"));
        // the same checkpoint through the edit-script mode, no edits
        fuzzing::safetensors(&[0x80 | sel]).unwrap_or_else(|e| panic!("seed edit {sel}: {e}"));
        for shards in [1, 2, 3] {
            fuzzing::sharded(&fuzzing::seed_index(sel, shards))
                .unwrap_or_else(|e| panic!("seed index {sel}/{shards}: {e}"));
        }
    }
}

/// Seed requests (byte layout: see `src/fuzzing/request.rs`): header [requests - 1, steps - 1,
/// cancel step, buffer capacity, drafter swap], then per request flags, flags2, temperature, top_k, top_p,
/// seed (8 bytes), max_tokens, stop ids, stop strings, budget, two markers, prompt.
fn seed_requests() -> Vec<(&'static str, Vec<u8>)> {
    let seed = [7u8, 0, 0, 0, 0, 0, 0, 0];
    let greedy_ids = [
        &[0u8, 2, 5, 4, 0][..], // 1 request, 3 steps, no cancel, capacity 4, same drafter
        &[0, 0],                // flags: token-id prompt, full struct; flags2
        &[0, 0, 0],             // temperature 0, top_k off, top_p 1
        &seed,
        &[3],                       // max_tokens 8
        &[0],                       // no stop ids
        &[0],                       // no stop strings
        &[0],                       // no budget
        &[0, 0],                    // default markers
        &[12, 0, 3, 5, 17, 42, 99], // 12 ids from the pattern [5, 17, 42, 99]
    ]
    .concat();
    let sampled_text = [
        &[1u8, 3, 1, 6, 0xF7][..], // 2 requests, 4 steps, cancel at step 1, capacity 6, MTP
        &[1 | 16, 0],              // text prompt, logprobs
        &[1, 3, 1],                // temperature 0.7, top_k 5, top_p 0.9
        &seed,
        &[4],                // max_tokens 16
        &[1, 2],             // stop id 2
        &[2, 2, b'+', b'1'], // one stop string "+1"
        &[4],                // budget 3
        &[0, 0],             // default markers
        &[20],
        b"<think>1+2=3</think>",
        // the second request is all zeros: no prompt
    ]
    .concat();
    let bad_values = [
        &[2u8, 1, 0, 2, 0xF1, 3, 1][..], // 3 requests, 2 steps, cancel at 0, n-gram 3..1
        &[2 | 64, 1],                    // both prompts, short struct; NULL stop ids with a count
        &[2],                            // struct_size = offset of reasoning_budget
        &[4, 7, 6],                      // temperature NaN, top_k u32::MAX, top_p NaN
        &seed,
        &[8],                         // max_tokens u32::MAX
        &[0],                         // no stop ids
        &[3, 1, 0xff, 2, b'a', b'b'], // two stop strings, one not UTF-8
        &[6],                         // budget i64::MIN
        &[2, 3],                      // think start: NULL with a count
        &[1, 2, 250, 5],              // think end: [vocab (unknown), 5]
        &[9],                         // the stop ids' count
        &[8, 0, 1, 251, 7],           // 8 ids from [vocab - 1, 7]
        &[3, 0xff, 0xfe, b'x'],       // text, not UTF-8
    ]
    .concat();
    vec![
        ("greedy_ids", greedy_ids),
        ("sampled_text", sampled_text),
        ("bad_values", bad_values),
    ]
}

/// Rewrites the generated seeds of `fuzz/corpus/*`: copies of the bundled models' config.json and
/// tokenizer.json, the checkpoints and indexes of `specmla::fuzzing`, the request byte strings
/// above. (The hand-written tokenizer seeds are plain files; inputs the fuzzer finds stay in its
/// scratch corpus.) Run after changing a seed generator:
/// `cargo test --release --test fuzz_replay -- --ignored regenerate_seed_corpus`.
#[test]
#[ignore]
fn regenerate_seed_corpus() {
    let corpus = repo().join("fuzz/corpus");
    let write = |target: &str, name: &str, data: &[u8]| {
        let d = corpus.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), data).unwrap();
    };
    let models = repo().join("models");
    for dir in [
        "golden/v2_lite",
        "golden/v2_group_limited",
        "golden/v3_bf16",
        "golden/v3_fp8",
        "golden/v3_yarn",
        "golden/v3_tied",
        "golden/v3_dense3",
        "golden/v32_odd",
        "golden/v32_topk_small",
        "golden/v4_mixed",
        "golden/v4_tied",
        "golden/v4_legacy",
        "golden/v4_official_fp8",
        "draft",
        "target",
    ] {
        let text = std::fs::read(models.join(dir).join("config.json")).unwrap();
        write("config", &format!("{}.json", dir.replace('/', "_")), &text);
    }
    for sel in 0..fuzzing::FIXED_CONFIGS {
        let mut st = vec![sel];
        st.extend(fuzzing::seed_checkpoint(sel));
        write("safetensors", &format!("seed_{sel}.bin"), &st);
        write(
            "safetensors",
            &format!("edit_{sel}.bin"),
            &[0x80 | sel, 7, 0, 1, 0],
        );
        write(
            "sharded",
            &format!("seed_{sel}_{}shards.bin", sel + 2),
            &fuzzing::seed_index(sel, sel as usize + 2),
        );
    }
    let draft_tok = std::fs::read(models.join("draft/tokenizer.json")).unwrap();
    write("tokenizer", "draft.json", &draft_tok);
    for (name, data) in seed_requests() {
        write("request", &format!("{name}.bin"), &data);
    }
}

//! Fuzz entry point `request`: request parameters decoded from the bytes, submitted through the
//! C ABI (`specmla_engine_submit`, `specmla_tokenize`, `specmla_detokenize`,
//! `specmla_engine_set_draft_weights`) to ONE engine that lives for the whole process, stepped a
//! few times, partly cancelled, then drained. The engine (created on first use) serves the
//! golden `models/golden/v3_yarn` model (MoE, YaRN, an MTP layer; cheap enough for hundreds of
//! inputs a second) with a 128-token tokenizer built here (specials, ASCII, a few multi-byte
//! characters and merges) and starts with the n-gram drafter; inputs may swap it for none,
//! another n-gram range or the MTP layer.
//!
//! Decoded per request: prompt as token ids (in range, unknown, huge; up to 320 of them, past
//! the model's 64 positions), as text (any bytes, invalid UTF-8 included), both or neither;
//! `struct_size` (full, an older prefix, too small, larger), or NULL params; temperature, top_p
//! (NaN, infinities, negative, subnormal), top_k, seed, max_tokens (0 .. u32::MAX), stop ids,
//! up to 64 stop strings (invalid UTF-8 included), reasoning budget (i64::MIN ..), think markers
//! (NULL with a count, unknown ids), speculate / logprobs / ignore_eos.
//!
//! Checked after every input: each call returned `SPECMLA_OK` or a clean refusal (never
//! `SPECMLA_ERR_PANIC` / `_ENGINE`); every event is well formed (known request, NUL-terminated
//! UTF-8 text of the stated length, ids in the vocabulary, no `FINISH_ERROR`); the engine drains
//! to no work and no used KV block; and a fixed greedy canary request still gives the tokens it
//! gave on the fresh engine, whatever drafter is installed (greedy speculation is lossless), so
//! no input leaves the engine broken or changed.

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use super::ByteReader;
use crate::config::ModelConfig;
use crate::engine::{DraftSource, Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::ffi::*;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{WeightSource, WeightStore};

const MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/golden/v3_yarn");
const CANARY_PROMPT: [u32; 5] = [0, 10, 20, 30, 40];
const CANARY_TOKENS: u32 = 3;

/// A tokenizer.json for a 128-token vocabulary: `<bos>` `<eos>` (the config's ids 0 and 1),
/// `<think>` `</think>`, printable ASCII, six multi-byte characters and 23 merges (BPE, no
/// pre-tokenizer, `Fuse` decoder; characters outside the vocabulary are dropped).
fn fixture_tokenizer_json() -> String {
    let specials = ["<bos>", "<eos>", "<think>", "</think>"];
    let merges = [
        ("t", "h"),
        ("h", "e"),
        ("i", "n"),
        ("e", "r"),
        ("a", "n"),
        ("r", "e"),
        ("o", "n"),
        ("th", "e"),
        ("in", "g"),
        ("an", "d"),
        ("a", "t"),
        ("e", "n"),
        ("e", "s"),
        ("o", "r"),
        ("t", "e"),
        ("e", "d"),
        ("t", "i"),
        ("i", "s"),
        ("i", "t"),
        ("a", "l"),
        ("a", "r"),
        ("s", "t"),
        ("t", "o"),
    ];
    let mut vocab = serde_json::Map::new();
    let mut add = |t: String| {
        let id = vocab.len();
        vocab.insert(t, id.into());
    };
    specials.iter().for_each(|t| add(t.to_string()));
    (b' '..=b'~').for_each(|c| add((c as char).to_string()));
    [
        "\u{e9}",
        "\u{fc}",
        "\u{df}",
        "\u{4e16}",
        "\u{754c}",
        "\u{1f980}",
    ]
    .iter()
    .for_each(|t| add(t.to_string()));
    merges.iter().for_each(|(a, b)| add(format!("{a}{b}")));
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(id, t)| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let merges: Vec<String> = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
    .to_string()
}

/// The shared engine and what a fresh engine answered to the canary.
struct Fixture {
    /// The `*mut EngineHandle`, as an address so the fixture is `Sync`.
    engine: usize,
    vocab_size: u32,
    canary: Vec<u32>,
}

impl Fixture {
    fn handle(&self) -> *mut EngineHandle {
        self.engine as *mut EngineHandle
    }
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let dir = Path::new(MODEL_DIR);
    let config = ModelConfig::from_file(&dir.join("config.json")).expect("v3_yarn config");
    let vocab_size = config.vocab_size as u32;
    let store = WeightStore::open(WeightSource::File(dir.join("model.safetensors")))
        .expect("v3_yarn weights");
    let model = Model::load(config, &store).expect("v3_yarn model");
    let tok = Tokenizer::from_bytes(fixture_tokenizer_json().as_bytes()).expect("tokenizer");
    assert_eq!(tok.vocab_size(), vocab_size as usize);
    let cfg = EngineConfig {
        threads: 1,
        num_blocks: 64, // 1024 tokens: a few long requests preempt each other
        draft_num_blocks: 64,
        max_batch_tokens: 64,
        max_running: 4,
        ..Default::default()
    };
    let engine = Engine::from_model(Arc::new(model), Some(Arc::new(tok)), cfg).expect("engine");
    engine
        .set_draft_weights_blocking(DraftSource::Ngram { min_n: 1, max_n: 3 })
        .expect("n-gram drafter");
    let mut f = Fixture {
        engine: register_engine(engine) as usize,
        vocab_size,
        canary: Vec::new(),
    };
    f.canary = run_canary(&f);
    f
});

/// One input at a time: the checks below need the engine to themselves.
static LOCK: Mutex<()> = Mutex::new(());

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(specmla_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn refused(call: &str, st: Status) -> Error {
    Error::InvalidArgument(format!("{call}: {st:?}: {}", last_error()))
}

/// Panic unless `st` is OK or one of `clean` (the refusals this call may give for bad input).
fn expect_status(call: &str, st: Status, clean: &[Status]) -> Result<()> {
    if st == Status::SPECMLA_OK {
        return Ok(());
    }
    assert!(
        clean.contains(&st),
        "{call} returned {st:?}: {}",
        last_error()
    );
    Err(refused(call, st))
}

/// A NUL-terminated copy of `b` cut at its first NUL (what a C caller's string would be).
fn c_bytes(b: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = b.iter().copied().take_while(|&c| c != 0).collect();
    v.push(0);
    v
}

/// Token ids: mostly in the vocabulary, byte values >= 250 pick out-of-range ones.
fn token_id(b: u8, vocab: u32) -> u32 {
    const FAR: [u32; 6] = [u32::MAX, u32::MAX - 1, 1 << 31, 1 << 16, 0, 0];
    if b >= 250 {
        match b - 250 {
            0 => vocab,
            1 => vocab - 1,
            i => FAR[i as usize - 2],
        }
    } else {
        b as u32 % vocab
    }
}

/// Owned storage behind the pointers of one decoded request.
struct Decoded {
    params: RequestParams,
    params_null: bool,
    prompt_ids: Vec<u32>,
    prompt_ids_null: bool,
    prompt_text: Option<Vec<u8>>,
    // Kept alive for the raw pointers in `params`.
    _stop_ids: Vec<u32>,
    _stop_strings: Vec<Vec<u8>>,
    _stop_ptrs: Vec<*const c_char>,
    _markers: [Vec<u32>; 2],
}

fn decode_request(r: &mut ByteReader<'_>, vocab: u32) -> Decoded {
    // flags: bits 0-1 prompt kind (ids, text, both, neither), 2 ignore_eos, 3 no speculation,
    // 4 logprobs, 5-6 struct_size mode, 7 NULL params; flags2: bit 0 NULL stop ids with a
    // count, bit 1 NULL prompt ids with a count
    let (flags, flags2) = (r.u8(), r.u8());
    let mut p = specmla_request_default_params();
    p.ignore_eos = flags & 4 != 0;
    p.speculate = flags & 8 == 0;
    p.logprobs = flags & 16 != 0;
    p.struct_size = match (flags >> 5) & 3 {
        0 | 1 => std::mem::size_of::<RequestParams>(),
        2 => r.pick(
            &[
                std::mem::offset_of!(RequestParams, max_tokens),
                std::mem::offset_of!(RequestParams, stop_strings),
                std::mem::offset_of!(RequestParams, reasoning_budget),
                std::mem::offset_of!(RequestParams, speculate),
                std::mem::size_of::<RequestParams>() + 64,
            ],
            |r| r.u8() as usize,
        ),
        _ => r.u8() as usize % 8,
    };
    let params_null = flags & 0x80 != 0;
    let f32_raw = |r: &mut ByteReader<'_>| f32::from_bits(r.u32());
    p.temperature = r.pick(
        &[
            0.0,
            0.7,
            1.0,
            1.5,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1.0,
            -0.0,
            1e-30,
            1e30,
            f32::MIN_POSITIVE,
            1e-45,
        ],
        f32_raw,
    );
    p.top_k = r.pick(&[0, 1, 2, 5, vocab - 1, vocab, vocab + 1, u32::MAX], |r| {
        r.u32()
    });
    p.top_p = r.pick(
        &[
            1.0,
            0.9,
            0.5,
            1e-7,
            0.0,
            -0.0,
            f32::NAN,
            1.0001,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ],
        f32_raw,
    );
    p.seed = r.u64();
    p.max_tokens = r.pick(&[1, 2, 3, 8, 16, 0, 600, 1 << 16, u32::MAX], |r| {
        r.u8() as u32
    });
    let stop_ids: Vec<u32> = (0..r.u8() % 5).map(|_| token_id(r.u8(), vocab)).collect();
    let n_strings = r.pick(&[0, 0, 1, 2, 3, 64], |r| r.u8() as usize % 8);
    let stop_strings: Vec<Vec<u8>> = (0..n_strings)
        .map(|_| {
            let n = r.u8() as usize % 16;
            c_bytes(r.take(n))
        })
        .collect();
    let stop_ptrs: Vec<*const c_char> = stop_strings.iter().map(|s| s.as_ptr().cast()).collect();
    p.reasoning_budget = r.pick(&[-1, -1, 0, 1, 3, -2, i64::MIN, i64::MAX], |r| {
        r.u64() as i64
    });
    let mut markers = [Vec::new(), Vec::new()];
    let mut marker_ptrs = [(std::ptr::null(), 0usize); 2];
    for (m, ptr) in markers.iter_mut().zip(marker_ptrs.iter_mut()) {
        match r.u8() % 4 {
            0 => {}
            1 => {
                *m = (0..1 + r.u8() % 3)
                    .map(|_| token_id(r.u8(), vocab))
                    .collect();
                *ptr = (m.as_ptr(), m.len());
            }
            2 => *ptr = (std::ptr::null(), 1 + r.u8() as usize), // NULL with a count
            _ => *ptr = (m.as_ptr(), 0),                         // empty, not NULL
        }
    }
    (p.think_start, p.n_think_start) = marker_ptrs[0];
    (p.think_end, p.n_think_end) = marker_ptrs[1];
    p.stop_token_ids = stop_ids.as_ptr();
    p.n_stop_token_ids = stop_ids.len();
    p.stop_strings = stop_ptrs.as_ptr();
    p.n_stop_strings = stop_ptrs.len();
    if flags2 & 1 != 0 {
        p.stop_token_ids = std::ptr::null();
        p.n_stop_token_ids = r.u8() as usize; // NULL with a count (when non-zero)
    }

    let kind = flags & 3;
    let (mut prompt_ids, mut prompt_text) = (Vec::new(), None);
    if kind == 0 || kind == 2 {
        let len = r.u16() as usize % 321;
        let n = 1 + r.u8() as usize % 16;
        let pattern = r.take(n).to_vec();
        if !pattern.is_empty() {
            prompt_ids = (0..len)
                .map(|i| token_id(pattern[i % pattern.len()], vocab))
                .collect();
        }
    }
    if kind == 1 || kind == 2 {
        let n = r.u8() as usize;
        prompt_text = Some(c_bytes(r.take(n)));
    }
    Decoded {
        params: p,
        params_null,
        prompt_ids_null: flags2 & 2 != 0,
        prompt_ids,
        prompt_text,
        _stop_ids: stop_ids,
        _stop_strings: stop_strings,
        _stop_ptrs: stop_ptrs,
        _markers: markers,
    }
}

/// Header byte >= 0xF0: replace the drafter (none, n-gram with a fuzzed range, MTP), waiting for
/// the load or not. Any other value keeps the current one.
fn swap_drafter(f: &Fixture, r: &mut ByteReader<'_>) {
    let b = r.u8();
    if b < 0xF0 {
        return;
    }
    let mut src = specmla_draft_source_default();
    src.kind = match b & 3 {
        0 => SPECMLA_DRAFT_NONE,
        1 | 2 => SPECMLA_DRAFT_NGRAM,
        _ => SPECMLA_DRAFT_MTP,
    };
    if src.kind == SPECMLA_DRAFT_NGRAM {
        src.ngram_min_n = r.u8() as u32 % 6;
        src.ngram_max_n = r.u8() as u32 % 6;
    }
    let wait = b & 4 != 0;
    let mut ticket = 0;
    // SAFETY: `src` is a valid struct; `ticket` writable.
    let st = unsafe { specmla_engine_set_draft_weights(f.handle(), &src, wait, &mut ticket) };
    let clean = [
        Status::SPECMLA_ERR_INVALID_ARGUMENT,
        Status::SPECMLA_ERR_DRAFT,
    ];
    let _ = expect_status("specmla_engine_set_draft_weights", st, &clean);
}

/// Refusals `specmla_engine_submit` may give for bad parameters.
const SUBMIT_REFUSALS: &[Status] = &[
    Status::SPECMLA_ERR_INVALID_ARGUMENT,
    Status::SPECMLA_ERR_NULL_POINTER,
    Status::SPECMLA_ERR_INVALID_UTF8,
    Status::SPECMLA_ERR_INVALID_REQUEST,
    Status::SPECMLA_ERR_UNKNOWN_TOKEN,
    Status::SPECMLA_ERR_KV_EXHAUSTED,
];

fn submit(f: &Fixture, d: &Decoded) -> Result<u64> {
    let text = d
        .prompt_text
        .as_ref()
        .map_or(std::ptr::null(), |t| t.as_ptr().cast());
    let (ids, n_ids) = match (d.prompt_ids_null, d.prompt_ids.len()) {
        (true, _) => (std::ptr::null(), 3), // NULL with a count
        (false, 0) => (std::ptr::null(), 0),
        (false, n) => (d.prompt_ids.as_ptr(), n),
    };
    let params: *const RequestParams = if d.params_null {
        std::ptr::null()
    } else {
        &d.params
    };
    let mut id = 0u64;
    // SAFETY: every pointer is NULL or points to live storage of the stated length (`Decoded`);
    // strings are NUL-terminated.
    let st = unsafe { specmla_engine_submit(f.handle(), ids, n_ids, text, params, &mut id) };
    expect_status("specmla_engine_submit", st, SUBMIT_REFUSALS)?;
    Ok(id)
}

/// Tokenize the text and detokenize the ids of `d` into buffers of fuzzed capacity.
fn text_calls(f: &Fixture, d: &Decoded, cap: usize) {
    let mut buf = vec![0u32; cap];
    let mut n = 0usize;
    if let Some(t) = &d.prompt_text {
        // SAFETY: NUL-terminated text; `buf` holds `cap` ids; `n` writable.
        let st = unsafe {
            specmla_tokenize(
                f.handle(),
                t.as_ptr().cast(),
                true,
                buf.as_mut_ptr(),
                cap,
                &mut n,
            )
        };
        let clean = [
            Status::SPECMLA_ERR_BUFFER_TOO_SMALL,
            Status::SPECMLA_ERR_INVALID_UTF8,
        ];
        if expect_status("specmla_tokenize", st, &clean).is_ok() {
            assert!(n <= cap && buf[..n].iter().all(|&t| t < f.vocab_size));
        }
    }
    let mut text = vec![0u8; cap * 4];
    let mut len = 0usize;
    for skip in [false, true] {
        // SAFETY: ids readable for their length; `text` writable for its length.
        let st = unsafe {
            specmla_detokenize(
                f.handle(),
                d.prompt_ids.as_ptr(),
                d.prompt_ids.len(),
                skip,
                text.as_mut_ptr().cast(),
                text.len(),
                &mut len,
            )
        };
        let clean = [
            Status::SPECMLA_ERR_BUFFER_TOO_SMALL,
            Status::SPECMLA_ERR_UNKNOWN_TOKEN,
        ];
        if expect_status("specmla_detokenize", st, &clean).is_ok() {
            assert!(len < text.len() && text[len] == 0);
            assert!(std::str::from_utf8(&text[..len]).is_ok());
        }
    }
}

/// One step; checks its events and returns (request id, tokens, finished) per event.
fn step(
    f: &Fixture,
    open: &HashSet<u64>,
    want_logprobs: &HashSet<u64>,
) -> Vec<(u64, Vec<u32>, bool)> {
    let mut res = std::ptr::null_mut();
    // SAFETY: `res` is writable.
    let st = unsafe { specmla_engine_step(f.handle(), &mut res) };
    assert_eq!(st, Status::SPECMLA_OK, "step: {}", last_error());
    // SAFETY: a successful step hands back a live result whose pointers stay valid until freed.
    let r = unsafe { &*res };
    let events = if r.n_events == 0 {
        &[][..]
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(r.events, r.n_events) }
    };
    let mut out = Vec::new();
    for ev in events {
        assert!(
            open.contains(&ev.request_id),
            "event for unknown request {}",
            ev.request_id
        );
        assert!(!ev.text.is_null());
        // SAFETY: text is NUL-terminated and lives with the result.
        let text = unsafe { CStr::from_ptr(ev.text) };
        assert_eq!(text.to_bytes().len(), ev.text_len);
        assert!(text.to_str().is_ok(), "event text is not UTF-8");
        let tokens = if ev.n_tokens == 0 {
            Vec::new()
        } else {
            // SAFETY: `tokens` holds `n_tokens` ids.
            unsafe { std::slice::from_raw_parts(ev.tokens, ev.n_tokens) }.to_vec()
        };
        assert!(
            tokens.iter().all(|&t| t < f.vocab_size),
            "token outside the vocabulary"
        );
        if !want_logprobs.contains(&ev.request_id) {
            assert!(ev.logprobs.is_null());
        }
        if ev.finish_reason == FinishReason::SPECMLA_FINISH_ERROR {
            // SAFETY: error is NUL-terminated when finish is ERROR.
            let msg = unsafe { CStr::from_ptr(ev.error) }
                .to_string_lossy()
                .into_owned();
            panic!("request {} failed inside the engine: {msg}", ev.request_id);
        }
        out.push((
            ev.request_id,
            tokens,
            ev.finish_reason != FinishReason::SPECMLA_FINISH_NONE,
        ));
    }
    assert_eq!(specmla_step_result_free(res), Status::SPECMLA_OK);
    out
}

/// Greedy canary request, stepped to its end; its tokens.
fn run_canary(f: &Fixture) -> Vec<u32> {
    let mut p = specmla_request_default_params();
    p.max_tokens = CANARY_TOKENS;
    p.ignore_eos = true;
    let mut id = 0;
    // SAFETY: valid prompt, params and out-pointer.
    let st = unsafe {
        specmla_engine_submit(
            f.handle(),
            CANARY_PROMPT.as_ptr(),
            CANARY_PROMPT.len(),
            std::ptr::null(),
            &p,
            &mut id,
        )
    };
    assert_eq!(st, Status::SPECMLA_OK, "canary submit: {}", last_error());
    let open = HashSet::from([id]);
    let mut tokens = Vec::new();
    for _ in 0..16 {
        for (_, t, done) in step(f, &open, &HashSet::new()) {
            tokens.extend(t);
            if done {
                return tokens;
            }
        }
    }
    panic!("canary request did not finish in 16 steps");
}

/// See the module doc.
pub fn request(data: &[u8]) -> Result<()> {
    let f = &*FIXTURE;
    let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = ByteReader::new(data);
    let n_requests = 1 + r.u8() % 3;
    let n_steps = 1 + r.u8() % 4;
    let cancel_at = r.u8() % 6;
    let cap = r.u8() as usize % 8;
    swap_drafter(f, &mut r);
    let decoded: Vec<Decoded> = (0..n_requests)
        .map(|_| decode_request(&mut r, f.vocab_size))
        .collect();

    let mut first_err = None;
    let (mut open, mut want_logprobs) = (HashSet::new(), HashSet::new());
    for d in &decoded {
        text_calls(f, d, cap);
        match submit(f, d) {
            Ok(id) => {
                open.insert(id);
                let p = if d.params_null {
                    specmla_request_default_params()
                } else {
                    d.params
                };
                if p.logprobs && p.struct_size > std::mem::offset_of!(RequestParams, logprobs) {
                    want_logprobs.insert(id);
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let all: HashSet<u64> = open.clone();
    for s in 0..n_steps {
        if s == cancel_at {
            if let Some(&id) = open.iter().min() {
                assert_eq!(specmla_engine_cancel(f.handle(), id), Status::SPECMLA_OK);
            }
        }
        for (id, _, done) in step(f, &all, &want_logprobs) {
            if done {
                open.remove(&id);
            }
        }
    }
    for &id in &open {
        let mut c = CCounters::default();
        // SAFETY: `c` is writable.
        let st = unsafe { specmla_engine_request_counters(f.handle(), id, &mut c) };
        assert_eq!(st, Status::SPECMLA_OK, "counters of a live request");
        let st = specmla_engine_cancel(f.handle(), id);
        assert_eq!(
            st,
            Status::SPECMLA_OK,
            "cancel of a live request: {}",
            last_error()
        );
    }
    drain(f, &all, &want_logprobs);
    assert_eq!(
        run_canary(f),
        f.canary,
        "the engine's greedy output changed"
    );
    drain(f, &all, &want_logprobs);
    match first_err {
        Some(e) if all.is_empty() => Err(e),
        _ => Ok(()),
    }
}

/// Step until the engine has no work (at most a few steps), then check that no KV block is held.
fn drain(f: &Fixture, all: &HashSet<u64>, want_logprobs: &HashSet<u64>) {
    for _ in 0..4 {
        let mut has = true;
        // SAFETY: `has` is writable.
        let st = unsafe { specmla_engine_has_work(f.handle(), &mut has) };
        assert_eq!(st, Status::SPECMLA_OK);
        if !has {
            let mut s = std::mem::MaybeUninit::<Stats>::zeroed();
            // SAFETY: `s` is writable; Stats is plain data (all-zero is a valid value).
            let st = unsafe { specmla_engine_stats(f.handle(), s.as_mut_ptr()) };
            assert_eq!(st, Status::SPECMLA_OK);
            // SAFETY: initialised by the call above (and zeroed before).
            let s = unsafe { s.assume_init() };
            assert_eq!(
                (s.running, s.waiting, s.kv_used_blocks),
                (0, 0, 0),
                "engine not idle"
            );
            return;
        }
        step(f, all, want_logprobs);
    }
    panic!("the engine still has work after cancelling every request");
}

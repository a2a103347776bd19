//! The engine from several threads: submissions and cancels arrive from other threads while one
//! thread steps; nothing is lost (every submitted request finishes exactly once, with a finish
//! reason), cancelled requests end as cancelled, and the survivors' greedy outputs equal a
//! single-threaded run.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::repo;
use specmla::engine::{DraftSource, Engine, EngineConfig, FinishReason, Prompt, Request};
use specmla::kv::KvDtype;
use specmla::spec::SpecMode;

fn request(i: u32) -> Request {
    let mut r = Request::new(Prompt::Tokens(vec![3 + i % 90, 17, 29 + i % 50, 41]));
    r.sampling.max_tokens = 6 + (i as usize % 9);
    r.sampling.ignore_eos = true;
    r
}

#[test]
fn submit_and_cancel_from_other_threads_while_stepping() {
    let g = repo().join("models/golden");
    let cfg = EngineConfig {
        kv_dtype: KvDtype::F32,
        spec: SpecMode::Fixed(3),
        threads: 2,
        ..EngineConfig::default()
    };
    let e = Arc::new(
        Engine::new(
            &g.join("v3_yarn"),
            DraftSource::Dir(g.join("v3_bf16")),
            cfg.clone(),
        )
        .unwrap(),
    );
    let submitted: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let cancelled: Arc<Mutex<Vec<u64>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for t in 0..3u32 {
        let (e, submitted, cancelled) = (
            Arc::clone(&e),
            Arc::clone(&submitted),
            Arc::clone(&cancelled),
        );
        workers.push(std::thread::spawn(move || {
            for j in 0..20u32 {
                let i = t * 100 + j;
                let id = e.submit(request(i)).unwrap();
                submitted.lock().unwrap().insert(id, i);
                if j % 5 == 4 && e.cancel(id).is_ok() {
                    cancelled.lock().unwrap().push(id);
                }
                std::thread::yield_now();
            }
        }));
    }
    let stepper = {
        let (e, done) = (Arc::clone(&e), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut finished: HashMap<u64, (Vec<u32>, FinishReason)> = HashMap::new();
            let mut toks: HashMap<u64, Vec<u32>> = HashMap::new();
            let mut idle = 0;
            while idle < 50 {
                let evs = e.step().unwrap();
                if evs.is_empty() && done.load(Ordering::SeqCst) && !e.has_work() {
                    idle += 1;
                }
                for ev in evs {
                    toks.entry(ev.id).or_default().extend(&ev.tokens);
                    if let Some(f) = ev.finish {
                        assert!(
                            finished
                                .insert(ev.id, (toks.remove(&ev.id).unwrap_or_default(), f))
                                .is_none(),
                            "finished twice"
                        );
                    }
                }
            }
            finished
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let finished = stepper.join().unwrap();
    let submitted = submitted.lock().unwrap().clone();
    assert_eq!(
        finished.len(),
        submitted.len(),
        "every request finished exactly once"
    );
    let cancelled = cancelled.lock().unwrap().clone();
    // reference: the same prompts alone
    let solo = Engine::new(&g.join("v3_yarn"), DraftSource::None, cfg).unwrap();
    for (id, (toks, fin)) in &finished {
        if cancelled.contains(id) {
            assert!(
                matches!(fin, FinishReason::Cancelled | FinishReason::Length),
                "{fin:?}"
            );
            continue;
        }
        assert_eq!(*fin, FinishReason::Length);
        let want = solo
            .generate(vec![request(submitted[id])])
            .unwrap()
            .remove(0)
            .token_ids;
        assert_eq!(toks, &want, "request {id} output differs from a solo run");
    }
    assert!(cancelled
        .iter()
        .any(|id| finished[id].1 == FinishReason::Cancelled));
    e.check_invariants().unwrap();
    assert_eq!(e.stats().kv.used_blocks, 0);
}

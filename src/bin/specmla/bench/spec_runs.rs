//! The speculation bench's runs: one engine over the workload (`run_once`), or a plain and a
//! speculative engine stepped in turn so both see the same host phases (`run_interleaved`,
//! kept level in committed tokens), and what a run reports (`Run`).
//!
//! Guarantee: measures only; every run serves the same requests in the same arrival order.

use std::path::Path;
use std::time::Instant;

use specmla::engine::{DraftSource, Engine, EngineConfig, EngineStats, Request};
use specmla::spec::SpecMode;
use specmla::Result;

use super::workload::WorkItem;

/// One engine run of the workload.
pub(super) struct Run {
    pub(super) tokens: Vec<Vec<u32>>,
    pub(super) wall_s: f64,
    pub(super) stats: EngineStats,
    /// The target's mapped weights after the run, while its engine still held them: how much
    /// of them sat in 2 MB pages (a 9-token verification streams its weights markedly faster
    /// from 2 MB pages than from 4 KB ones, so the spec rows' roofline fractions move with the
    /// page cache's state; docs/BENCHMARKS.md). Separate plain runs only (`run_once`).
    pub(super) pages: Option<specmla::weights::MappedPages>,
    /// The process's anonymous memory in 2 MB pages at the same moment (the weights packed into
    /// bf16 strips, where the loader packs them: then most of the target is there, not in the
    /// mapped files). Separate plain runs only.
    pub(super) anon_huge: Option<u64>,
}

impl Run {
    pub(super) fn generated(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }
    pub(super) fn tps(&self) -> f64 {
        self.generated() as f64 / self.wall_s
    }
    pub(super) fn acceptance(&self) -> f64 {
        let t = &self.stats.totals;
        if t.drafted_tokens == 0 {
            0.0
        } else {
            t.accepted_tokens as f64 / t.drafted_tokens as f64
        }
    }
    pub(super) fn per_position(&self) -> Vec<f64> {
        let t = &self.stats.totals;
        t.drafted_per_position
            .iter()
            .zip(t.accepted_per_position.iter().chain(std::iter::repeat(&0)))
            .map(|(&d, &a)| if d == 0 { 0.0 } else { a as f64 / d as f64 })
            .collect()
    }
    /// Wall seconds per engine step.
    pub(super) fn step_cost(&self) -> f64 {
        self.wall_s / self.stats.steps.max(1) as f64
    }
    /// Committed tokens per second of the decode-only steps (prefill steps left out: they are
    /// the same work with and without speculation).
    pub(super) fn decode_tps(&self) -> f64 {
        let d = &self.stats.decode;
        d.committed_tokens as f64 / d.seconds.max(1e-12)
    }
    /// Generated tokens per engine step.
    pub(super) fn tokens_per_step(&self) -> f64 {
        self.generated() as f64 / self.stats.steps.max(1) as f64
    }
    /// Committed tokens per decode-only step.
    pub(super) fn decode_tokens_per_step(&self) -> f64 {
        let d = &self.stats.decode;
        d.committed_tokens as f64 / d.steps.max(1) as f64
    }
    /// Target weight bytes per decode-only step.
    pub(super) fn decode_step_bytes(&self) -> f64 {
        let d = &self.stats.decode;
        d.weight_bytes as f64 / d.steps.max(1) as f64
    }
    /// What a speculative run of this (plain) run's workload would take if its decode-only steps
    /// met the roofline (`dec_roof`, the speedup of those steps when each costs what it reads)
    /// and everything else — the steps with a prompt chunk, the submission around the steps —
    /// cost what it cost here: the end-to-end roofline with prefill as plain measured it. A
    /// prompt chunk is the same work in both runs and is not bound by its weight bytes the way
    /// a decode step is (a 42-token chunk of the widened target reads ~1.1 GB for ~7 GMAC),
    /// so the bytes-only end-to-end roofline charges it at the decode steps' bandwidth, which it
    /// does not reach. At batch > 1 a step that mixes a prompt chunk with decodes counts as
    /// prefill here.
    pub(super) fn ideal_spec_s(&self, dec_roof: f64) -> f64 {
        ideal_spec_s(self.wall_s, self.stats.decode.seconds, dec_roof)
    }
}

/// [`Run::ideal_spec_s`] from a plain run's wall and decode-only seconds.
pub(super) fn ideal_spec_s(plain_wall_s: f64, plain_decode_s: f64, dec_roof: f64) -> f64 {
    (plain_wall_s - plain_decode_s).max(0.0) + plain_decode_s / dec_roof.max(1e-9)
}

/// What one run serves: the workload items with their thinking budgets, and the token cap.
#[derive(Clone, Copy)]
pub(super) struct Workload<'a> {
    pub(super) items: &'a [WorkItem],
    pub(super) budgets: &'a [Option<usize>],
    pub(super) max_tokens: usize,
    /// Engine steps between two arrivals (0: all at once; `--stagger`).
    pub(super) stagger: usize,
}

impl Workload<'_> {
    /// The run's requests, each with its item's budget.
    pub(super) fn requests(&self) -> Vec<Request> {
        self.items
            .iter()
            .zip(self.budgets)
            .map(|(it, b)| {
                let mut r = it.request(self.max_tokens);
                r.reasoning_budget = *b;
                r
            })
            .collect()
    }
}

pub(super) fn run_once(
    target: &Path,
    draft: DraftSource,
    base: &EngineConfig,
    spec: SpecMode,
    batch: usize,
    work: Workload<'_>,
) -> Result<Run> {
    let plain = matches!(draft, DraftSource::None);
    let engine = bench_engine(target, draft, base, spec, batch)?;
    let t = Instant::now();
    let res = super::run_staggered(&engine, work.requests(), work.stagger)?;
    let wall_s = t.elapsed().as_secs_f64();
    Ok(Run {
        tokens: res.tokens,
        wall_s,
        stats: engine.stats(),
        // read for plain runs only: the spec rows report their plain run's
        pages: plain
            .then(|| specmla::weights::mapped_pages_under(target))
            .flatten(),
        anon_huge: plain.then(super::anon_huge_bytes).flatten(),
    })
}

/// The workload on a plain engine (no drafter, k = 0): the baselines, the paired plain runs
/// and the warm-up.
pub(super) fn run_plain(
    target: &Path,
    base: &EngineConfig,
    batch: usize,
    work: Workload<'_>,
) -> Result<Run> {
    run_once(
        target,
        DraftSource::None,
        base,
        SpecMode::Fixed(0),
        batch,
        work,
    )
}

fn bench_engine(
    target: &Path,
    draft: DraftSource,
    base: &EngineConfig,
    spec: SpecMode,
    batch: usize,
) -> Result<Engine> {
    let cfg = EngineConfig {
        spec,
        max_running: batch,
        ..base.clone()
    };
    Engine::new(target, draft, cfg)
}

/// The workload on a plain engine and a speculative one at once (`--interleaved`): the engine
/// that has committed fewer tokens steps next (on a tie, the plain one and the speculative one
/// by turns), each engine's wall time is the sum of its own steps. Both commit the same tokens (speculation is lossless), so they
/// pass through the workload together and any host phase falls on the same stretch of it for
/// both. Alternating steps instead, a batch-1 run at k = 8 (~8 tokens a step) finished its
/// speculative steps in the first ~30 % of the window while the plain engine's steps covered
/// all of it, so a host that changed speed within the window biased the ratio. Ties go by turns
/// so that neither engine always runs second: with the plain engine always first on a tie,
/// plain-against-plain runs at batch 16 with every request arriving at once (a tie at every
/// step that drafts nothing, the 16-prompt prefill first) read 0.955-0.974 in four of six runs
/// (0.997, 1.022 in the other two). Returns (plain, spec).
pub(super) fn run_interleaved(
    target: &Path,
    draft: DraftSource,
    base: &EngineConfig,
    spec: SpecMode,
    batch: usize,
    work: Workload<'_>,
) -> Result<(Run, Run)> {
    let engines = [
        bench_engine(target, DraftSource::None, base, SpecMode::Fixed(0), batch)?,
        bench_engine(target, draft, base, spec, batch)?,
    ];
    let mut runs = [
        super::Submitted::staggered(&engines[0], work.requests(), work.stagger)?,
        super::Submitted::staggered(&engines[1], work.requests(), work.stagger)?,
    ];
    let mut wall = [0.0f64; 2];
    let mut tie_first = 0;
    while let Some(j) = next_to_step(&runs, &mut tie_first) {
        let (e, run) = (&engines[j], &mut runs[j]);
        let t = Instant::now();
        let events = e.step()?;
        wall[j] += t.elapsed().as_secs_f64();
        run.absorb(events)?;
        run.arrive(e)?;
    }
    let [tp, ts] = runs.map(|r| r.tokens);
    let [ep, es] = engines;
    Ok((
        Run {
            tokens: tp,
            wall_s: wall[0],
            stats: ep.stats(),
            pages: None,
            anon_huge: None,
        },
        Run {
            tokens: ts,
            wall_s: wall[1],
            stats: es.stats(),
            pages: None,
            anon_huge: None,
        },
    ))
}

/// Which of two interleaved runs steps next: the unfinished one with fewer committed tokens,
/// on a tie `tie_first` (which then passes to the other run); None when both are done.
fn next_to_step(runs: &[super::Submitted; 2], tie_first: &mut usize) -> Option<usize> {
    next_of(
        runs.each_ref().map(|r| (r.done(), r.committed())),
        tie_first,
    )
}

/// [`next_to_step`] on (done, committed tokens) of each run.
fn next_of(runs: [(bool, usize); 2], tie_first: &mut usize) -> Option<usize> {
    match runs {
        [(true, _), (true, _)] => None,
        [(false, _), (true, _)] => Some(0),
        [(true, _), (false, _)] => Some(1),
        [(false, a), (false, b)] if a == b => {
            let j = *tie_first;
            *tie_first = 1 - j;
            Some(j)
        }
        [(false, a), (false, b)] => Some(usize::from(b < a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_as_plain_roofline_speeds_up_only_the_decode_steps() {
        // 10 s plain, 8 of them decode-only steps, a decode roofline of 4x: the prefill's 2 s
        // stay, the decode's 8 s become 2 s
        assert!((ideal_spec_s(10.0, 8.0, 4.0) - 4.0).abs() < 1e-12);
        // no prefill: the decode roofline itself
        assert!((ideal_spec_s(8.0, 8.0, 4.0) - 2.0).abs() < 1e-12);
        // a decode time above the wall (clock skew) leaves no negative prefill
        assert!((ideal_spec_s(8.0, 9.0, 3.0) - 3.0).abs() < 1e-12);
    }

    /// The run behind in committed tokens steps next (on a tie, the two by turns): a speculative
    /// engine that commits 8 tokens a step waits for ~8 plain steps; a finished run never steps.
    #[test]
    fn interleaving_keeps_the_runs_level_in_committed_tokens() {
        let mut t = 0;
        assert_eq!(next_of([(false, 0), (false, 0)], &mut t), Some(0));
        assert_eq!(t, 1, "the next tie goes to the other run");
        assert_eq!(next_of([(false, 3), (false, 8)], &mut t), Some(0));
        assert_eq!(next_of([(false, 9), (false, 8)], &mut t), Some(1));
        assert_eq!(next_of([(true, 40), (false, 40)], &mut t), Some(1));
        assert_eq!(next_of([(false, 0), (true, 40)], &mut t), Some(0));
        assert_eq!(next_of([(true, 40), (true, 40)], &mut t), None);
        assert_eq!(t, 1, "only a tie passes the turn");
        assert_eq!(next_of([(false, 8), (false, 8)], &mut t), Some(1));
        assert_eq!(next_of([(false, 8), (false, 8)], &mut t), Some(0));
        // lockstep (both commit one token a step): each run is first at every other tie
        assert_eq!(step_order(1, 4), "pSSppSSp");
        // a plain run against one committing 8 tokens a step: 8 plain steps per speculative one
        let order = step_order(8, 24);
        assert_eq!(order, "pSpppppppSpppppppppSppppppp");
    }

    /// The order `next_of` steps a plain run ('p', one token a step) and a speculative one ('S',
    /// `spec_tokens` a step) through `total` tokens each.
    fn step_order(spec_tokens: usize, total: usize) -> String {
        let (mut p, mut s, mut order, mut t) = (0usize, 0usize, String::new(), 0);
        while let Some(j) = next_of([(p >= total, p), (s >= total, s)], &mut t) {
            if j == 0 {
                p += 1;
                order.push('p');
            } else {
                s += spec_tokens;
                order.push('S');
            }
        }
        order
    }
}

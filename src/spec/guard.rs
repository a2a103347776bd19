//! Speculation guard of the adaptive policy: the policy's cost model predicts, the guard
//! measures. It keeps the committed tokens per second of decode-only engine steps that drafted
//! and of those that did not (exponential averages), switches drafting off while drafting
//! measures slower than not drafting (by more than 3 %), and keeps both rates fresh with probe
//! steps of the other kind (a drafting probe is two steps, see below). The plain rate is first
//! learned on three plain steps, one in four (one is enough when drafting already measures
//! decisively faster); the first probe comes 16 steps after that learning, each later one 16
//! steps after the last; while the verdict stays clear (drafting at least 10 % beyond the
//! threshold either way, and the probe's own sample agreeing) the period doubles up to 128
//! steps, so a drafter that clearly wins loses few steps to plain probes and one that clearly
//! loses few to drafting probes; a probe sample on the other side of the threshold, or a
//! verdict near it, brings the period back to 16. A new drafter (swap) starts a fresh guard.
//!
//! Only steady drafting steps are timed: in a drafting step where some request lags its drafter
//! by more than one verification and one plain step (its first drafting round, or the first
//! after a plain period), the drafter also catches up on every position it skipped (an MTP
//! layer or draft model runs over the prompt, or over the plain steps' tokens) — a cost of
//! having decoded plainly, not of drafting, and timing it made drafting look dearer than it is,
//! so that once off it stayed off. Such a step is not timed (the engine decides, `steady`), and
//! a probe while drafting is off is two drafting steps, the second one timed.
//!
//! Rates are kept per batch-size class (decode requests in the step: 1, 2, 3-4, 5-8, 9-16,
//! 17+), each with its own learning, verdict and probes: a step's tokens per second grow with
//! its batch, so a drafting rate measured at batch 4 compared with a plain rate measured after
//! requests finished (batch 2, 1) judged batch composition, not drafting — traced at batch 4 on
//! the widened target, where drafting that lost was switched back on as the batch drained.
//!
//! Where it sits: the engine's step asks it, once per step in adaptive mode, whether this step
//! may draft (`StepKind`), and feeds it the step's outcome. It never touches verification, so
//! outputs are unchanged whatever it decides.

/// What the next step may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// The policy chooses k per request.
    Free,
    /// No drafts this step (plain decoding).
    Plain,
}

#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    value: f64,
    samples: u32,
}

impl Rate {
    fn observe(&mut self, x: f64) {
        self.value = if self.samples == 0 {
            x
        } else {
            0.8 * self.value + 0.2 * x
        };
        self.samples += 1;
    }
}

/// Measured drafting vs plain rates per batch-size class (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct SpecGuard {
    classes: [Class; CLASSES],
    /// The class of the step last asked for (`next_step`), which `observe` reports on.
    cur: usize,
}

/// Batch-size classes: 1, 2, 3-4, 5-8, 9-16, 17+ decode requests (also the target cost
/// model's, `policy::TargetCost`).
pub(crate) const CLASSES: usize = 6;

pub(crate) fn class_of(n_decode: usize) -> usize {
    (usize::BITS - n_decode.max(1).saturating_sub(1).leading_zeros()).min(CLASSES as u32 - 1)
        as usize
}

impl SpecGuard {
    /// Decide the next step's kind for a step with `n_decode` decode requests.
    pub fn next_step(&mut self, n_decode: usize) -> StepKind {
        self.cur = class_of(n_decode);
        self.classes[self.cur].next_step()
    }

    /// Whether drafting currently measures slower than plain decoding at this batch size.
    pub fn drafting_loses(&self, n_decode: usize) -> bool {
        self.classes[class_of(n_decode)].drafting_loses()
    }

    /// Steps (of this batch size) until its next probe starts (tests and traces).
    pub fn steps_to_probe(&self, n_decode: usize) -> u64 {
        self.classes[class_of(n_decode)].steps_to_probe()
    }

    /// The step last decided committed `tokens` in `secs` (see [`Class::observe`]).
    pub fn observe(&mut self, drafted: bool, steady: bool, tokens: usize, secs: f64) {
        self.classes[self.cur].observe(drafted, steady, tokens, secs)
    }
}

/// One batch-size class's rates, verdict and probes.
#[derive(Clone, Debug, Default)]
struct Class {
    drafting: Rate,
    plain: Rate,
    steps: u64,
    /// Steps between probes (0 before the first: `PROBE_EVERY`).
    period: u64,
    /// The step at which the next probe starts.
    next_probe: u64,
    /// Steps of the current probe still to come (a drafting probe is two).
    probe_left: u8,
    /// The current probe's kind: drafting steps (drafting was off) or a plain step.
    probing_drafting: bool,
    /// The plain rate is trusted on fewer than [`MIN_SAMPLES`] samples: drafting measured
    /// decisively faster (see [`Class::decisive`]) while the plain rate was being learned.
    plain_early: bool,
}

/// Shortest and longest probe period (steps), and the samples each rate needs before it is
/// trusted.
const PROBE_EVERY: u64 = 16;
const PROBE_MAX: u64 = 128;
const MIN_SAMPLES: u32 = 3;
/// Drafting is kept while it measures at least this fraction of the plain rate.
const KEEP_RATIO: f64 = 0.97;
/// The verdict is clear (probes may thin out) when drafting is this factor beyond the
/// threshold: above KEEP_RATIO x CLEAR or below KEEP_RATIO / CLEAR of the plain rate.
const CLEAR: f64 = 1.1;

impl Class {
    /// Decide the next step's kind.
    fn next_step(&mut self) -> StepKind {
        self.steps += 1;
        if !self.plain_early && self.plain.samples < MIN_SAMPLES && self.decisive() {
            self.plain_early = true;
        }
        if !self.plain_trusted() {
            // learn the plain rate early: every 4th step plain
            return if self.steps.is_multiple_of(4) {
                StepKind::Plain
            } else {
                StepKind::Free
            };
        }
        if self.drafting.samples < MIN_SAMPLES {
            return StepKind::Free;
        }
        if self.period == 0 && self.next_probe == 0 {
            // both rates just learned: the first probe comes a period later, not at once (it
            // would re-measure the plain rate the learning steps have just measured)
            self.period = PROBE_EVERY;
            self.next_probe = self.steps + PROBE_EVERY;
        }
        let loses = self.drafting_loses();
        if self.probe_left == 0 && self.steps >= self.next_probe {
            // a probe starts; the period doubles while the verdict is clear, else restarts
            self.period = if self.period > 0 && self.verdict_clear() {
                (self.period * 2).min(PROBE_MAX)
            } else {
                PROBE_EVERY
            };
            self.next_probe = self.steps + self.period;
            // two drafting steps in a row: the first catches up, the second is timed
            self.probe_left = if loses { 2 } else { 1 };
            self.probing_drafting = loses;
        }
        if self.probe_left > 0 {
            self.probe_left -= 1;
            return if self.probing_drafting {
                StepKind::Free
            } else {
                StepKind::Plain
            };
        }
        if loses {
            StepKind::Plain
        } else {
            StepKind::Free
        }
    }

    /// Drafting's measured rate is far from the keep threshold (either way).
    fn verdict_clear(&self) -> bool {
        let ratio = self.drafting.value / self.plain.value.max(f64::MIN_POSITIVE);
        !(KEEP_RATIO / CLEAR..=KEEP_RATIO * CLEAR).contains(&ratio)
    }

    /// Steps until the next probe starts (tests and traces).
    fn steps_to_probe(&self) -> u64 {
        self.next_probe.saturating_sub(self.steps)
    }

    /// Drafting, with its [`MIN_SAMPLES`], measures beyond [`KEEP_RATIO`] x [`CLEAR`]^2 of the
    /// plain rate's first sample: what a plain step's noise (+-10 % at batch 16 on the widened
    /// target) cannot turn into a loss, so the plain rate's remaining learning steps are skipped.
    /// Each costs a drafting step's gain: at batch 1 on the widened target with the bundled
    /// draft (3-4x plain) the learning's three plain steps and the probe that followed at once
    /// were four of the ~59 decode steps of the bench's 8-prompt run, each ~10 ms of a ~12.5 ms
    /// plain step lost against drafting's ~2.7 ms per token: ~3 % of its decode time.
    fn decisive(&self) -> bool {
        self.plain.samples >= 1
            && self.drafting.samples >= MIN_SAMPLES
            && self.drafting.value > KEEP_RATIO * CLEAR * CLEAR * self.plain.value
    }

    /// Whether the plain rate has been learned (its samples, or decisively beaten early).
    fn plain_trusted(&self) -> bool {
        self.plain.samples >= MIN_SAMPLES || (self.plain_early && self.plain.samples >= 1)
    }

    /// Whether drafting currently measures slower than plain decoding.
    fn drafting_loses(&self) -> bool {
        self.plain_trusted()
            && self.drafting.samples >= MIN_SAMPLES
            && self.drafting.value < KEEP_RATIO * self.plain.value
    }

    /// A decode-only step committed `tokens` in `secs`; `drafted` whether any request drafted,
    /// `steady` whether no request that drafted had its drafter catching up on a lag longer
    /// than a verification and a plain step (only steady drafting steps are timed: see the
    /// module doc).
    fn observe(&mut self, drafted: bool, steady: bool, tokens: usize, secs: f64) {
        if secs <= 0.0 || tokens == 0 || (drafted && !steady) {
            return;
        }
        let r = tokens as f64 / secs;
        // a probe's sample on the other side of the threshold than the verdict it probes:
        // conditions changed, so probe often again
        let probe_sample = self.period > 0 && drafted == self.probing_drafting && {
            let (d, p) = if drafted {
                (r, self.plain.value)
            } else {
                (self.drafting.value, r)
            };
            (d < KEEP_RATIO * p) != self.drafting_loses()
        };
        if drafted {
            self.drafting.observe(r);
        } else {
            self.plain.observe(r);
        }
        if probe_sample && self.period > PROBE_EVERY {
            self.period = PROBE_EVERY;
            self.next_probe = self.next_probe.min(self.steps + PROBE_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(g: &mut SpecGuard, steps: usize, spec_rate: f64, plain_rate: f64) -> usize {
        run_with_catch_up(g, steps, spec_rate, plain_rate, 1.0)
    }

    /// A drafting step after a plain one takes `catch_up` times as long (the drafter catches up
    /// on the skipped positions); its `steady` flag says so.
    fn run_with_catch_up(
        g: &mut SpecGuard,
        steps: usize,
        spec_rate: f64,
        plain_rate: f64,
        catch_up: f64,
    ) -> usize {
        let mut drafted_steps = 0;
        let mut last = true;
        for _ in 0..steps {
            let d = g.next_step(1) == StepKind::Free;
            drafted_steps += usize::from(d);
            let secs = if d {
                (if last { 1.0 } else { catch_up }) / spec_rate
            } else {
                1.0 / plain_rate
            };
            g.observe(d, last, 1, secs);
            last = d;
        }
        drafted_steps
    }

    #[test]
    fn drafting_that_loses_is_switched_off_but_probed() {
        let mut g = SpecGuard::default();
        let d = run(&mut g, 400, 50.0, 100.0);
        assert!(g.drafting_loses(1));
        assert!(d < 60, "drafted in {d} of 400 steps");
        assert!(d > 10, "still probes: {d}");
        // a clear loser is probed less and less: at most 2 drafting steps per 128 in the long run
        let d = run(&mut g, 2048, 50.0, 100.0);
        assert!(g.drafting_loses(1));
        assert!((16..=40).contains(&d), "drafted in {d} of 2048 steps");
        assert!(g.steps_to_probe(1) <= PROBE_MAX);
    }

    /// A clear winner is probed with plain steps less and less (each costs a drafting step's
    /// gain); a close call keeps the 16-step period.
    #[test]
    fn probes_thin_out_only_while_the_verdict_is_clear() {
        let mut g = SpecGuard::default();
        run(&mut g, 400, 250.0, 100.0);
        let d = run(&mut g, 2048, 250.0, 100.0);
        assert!(2048 - d <= 20, "{} plain steps of 2048", 2048 - d);
        let mut g = SpecGuard::default();
        run(&mut g, 400, 101.0, 100.0);
        let d = run(&mut g, 2048, 101.0, 100.0);
        assert!(
            (2048 - d) >= 2048 / 16 - 4,
            "{} plain steps of 2048",
            2048 - d
        );
    }

    /// A decisive winner ends the plain rate's learning after one sample, and no probe follows
    /// the learning at once; a close call still learns on MIN_SAMPLES plain steps.
    #[test]
    fn a_decisive_winner_learns_the_plain_rate_in_fewer_steps() {
        let mut g = SpecGuard::default();
        let d = run(&mut g, 40, 300.0, 100.0);
        assert!(40 - d <= 2, "{} plain steps of the first 40", 40 - d);
        assert!(!g.drafting_loses(1));
        let mut g = SpecGuard::default();
        let d = run(&mut g, 40, 101.0, 100.0);
        assert!(40 - d >= MIN_SAMPLES as usize, "{} plain steps", 40 - d);
        // learned early, the guard still switches a drafter off that turns slow
        let mut g = SpecGuard::default();
        run(&mut g, 40, 300.0, 100.0);
        run(&mut g, 300, 50.0, 100.0);
        assert!(g.drafting_loses(1));
    }

    #[test]
    fn drafting_that_wins_keeps_running_and_recovers() {
        let mut g = SpecGuard::default();
        let d = run(&mut g, 400, 150.0, 100.0);
        assert!(!g.drafting_loses(1));
        assert!(d > 300, "drafted in {d} of 400 steps");
        // the drafter gets slower than plain, then faster again: the guard follows both ways
        run(&mut g, 200, 50.0, 100.0);
        assert!(g.drafting_loses(1));
        run(&mut g, 400, 150.0, 100.0);
        assert!(!g.drafting_loses(1));
    }

    /// Each batch size is judged on its own rates: drafting that loses at batch 4 (where plain
    /// steps commit 4 tokens in 1.0 time units and drafting ones 4 in 1.6) stays off when the
    /// batch drains to 1 and 2, whose plain steps are slower per token than batch 4's drafting
    /// ones (one rate for all sizes switched drafting back on there); drafting that wins at
    /// batch 1 is on there meanwhile.
    #[test]
    fn batch_sizes_are_judged_apart() {
        let mut g = SpecGuard::default();
        let step = |g: &mut SpecGuard, n: usize, plain_secs: f64, spec_secs: f64| {
            let d = g.next_step(n) == StepKind::Free;
            g.observe(d, true, n, if d { spec_secs } else { plain_secs });
            d
        };
        for _ in 0..200 {
            step(&mut g, 4, 1.0, 1.6);
        }
        assert!(g.drafting_loses(4));
        let mut drafted = 0;
        for _ in 0..200 {
            drafted += usize::from(step(&mut g, 2, 0.9, 1.5));
        }
        for _ in 0..200 {
            drafted += usize::from(step(&mut g, 1, 0.8, 0.6));
        }
        assert!(g.drafting_loses(4) && g.drafting_loses(2) && !g.drafting_loses(1));
        // batch 2 learns and then probes only; batch 1 drafts most steps
        assert!((150..300).contains(&drafted), "drafted {drafted} of 400");
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(2), 1);
        assert_eq!((class_of(3), class_of(4)), (2, 2));
        assert_eq!((class_of(5), class_of(8), class_of(9)), (3, 3, 4));
        assert_eq!((class_of(16), class_of(17), class_of(500)), (4, 5, 5));
    }

    /// Catch-up after plain steps is not charged to drafting: a drafter 10 % faster than plain
    /// whose first step after a plain one costs 4x is kept on, and one switched off (it lost
    /// for a while) is switched on again by the two-step probes once it wins.
    #[test]
    fn catch_up_is_not_charged_to_drafting() {
        let mut g = SpecGuard::default();
        let d = run_with_catch_up(&mut g, 400, 110.0, 100.0, 4.0);
        assert!(!g.drafting_loses(1));
        assert!(d > 300, "drafted in {d} of 400 steps");
        run_with_catch_up(&mut g, 200, 50.0, 100.0, 4.0);
        assert!(g.drafting_loses(1));
        run_with_catch_up(&mut g, 400, 110.0, 100.0, 4.0);
        assert!(!g.drafting_loses(1), "the probes saw drafting win again");
    }
}

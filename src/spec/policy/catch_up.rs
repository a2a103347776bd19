//! Starting a request whose drafter lags (its prompt, or plain steps): the catch-up's price
//! per position, whether it is paid back over the request's expected remaining output
//! ([`Lengths`]), and how many catch-ups one step may start.

/// Positions a drafting round must catch up on before its time is taken as a catch-up price per
/// position (`engine::Core::catch_up_s_per_row`). A shorter catch-up's time beyond a plain step is
/// mostly the drafter forward's fixed cost and the drafts' verification: traced on the widened
/// target (MTP, batch 4), a request drafting again 4 positions behind took +5 ms over a plain step
/// and set the price to 1.3 ms per position, where a prompt's catch-up costs 0.07-0.2 ms; at that
/// price no other request's catch-up ever paid, and the adaptive run drafted for one request in
/// every third step (0.99-1.03x where fixed k = 1 gave 1.05-1.08x).
pub const MIN_TIMED_CATCH_UP_ROWS: usize = 16;

/// The per-position price of a drafting round that caught up on `rows` positions in all: its
/// time beyond a plain step of its batch (`extra`), or the drafter's own time (`draft`) where
/// that is more; None below [`MIN_TIMED_CATCH_UP_ROWS`].
pub fn catch_up_row_price(rows: usize, extra: f64, draft: f64) -> Option<f64> {
    (rows >= MIN_TIMED_CATCH_UP_ROWS).then(|| extra.max(draft) / rows as f64)
}

/// Whether a request whose drafter lags `lag` positions starts drafting from far behind (a
/// prompt, many plain steps) rather than resuming a few positions behind: the adaptive policy
/// prices a starter for the steady drafting to come, shared with the requests that would then
/// draft ([`sharing_fixed_point`](super::sharing_fixed_point) with nothing pacing the starts),
/// and a resuming one like a steady one (`engine::schedule`).
pub fn starts_from_far(lag: usize) -> bool {
    lag >= MIN_TIMED_CATCH_UP_ROWS
}

/// Whether a request whose drafter must first catch up on `lag` positions (its whole context
/// when it never drafted) should start drafting: the catch-up, `secs_per_row` each, must be
/// paid back by the predicted saving per committed token (`saved`, from
/// [`choose_k_rates`](super::choose_k_rates)) over the tokens it is still expected to generate
/// (`horizon`, from [`Lengths::horizon`]).
pub fn catch_up_pays(lag: usize, secs_per_row: f64, saved: f64, horizon: usize) -> bool {
    saved * horizon as f64 >= CATCH_UP_MARGIN * secs_per_row * lag as f64
}

/// How many times over the predicted saving must repay a catch-up (see [`catch_up_pays`]): the
/// catch-up's cost is measured and certain, the saving is a prediction over a guessed horizon.
/// It was 2 after a trace on the widened target at batch 4, when a starter's saving was priced
/// at an equal share of the draft forward: the MTP layer's catch-ups on ~70 positions (10-12 ms
/// each, four requests in four steps) were predicted to be repaid ~2x over the horizon, ~35
/// tokens were left, and the run ended at 0.97x of plain. With a batch priced as a group
/// (`group_pays`) the savings are the group's real ones, and 2 kept the MTP layer from starting
/// at batch 4 with the 50 % thinking budget (~36-token outputs: a ~14 ms prompt catch-up
/// against ~0.68 ms saved per token): adaptive 0.978-1.013x where fixed k = 1 ran 1.05x; at 1.5,
/// 1.027-1.053x (two alternated pairs, `docs/BENCHMARKS.md`), batch 16 unchanged.
pub const CATCH_UP_MARGIN: f64 = 1.5;

/// How a request that may draft this step would start: drafting steadily (its drafter is at
/// most a round behind), or first catching up on a long lag — blind while the catch-up cost per
/// position is unmeasured, else priced at its predicted seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Start {
    Steady,
    Blind,
    Priced(f64),
}

/// The catch-ups one adaptive step may start. Blind starts: one per step (the first measures
/// the cost per position). Priced starts: at least one per step, then only while their summed
/// predicted cost stays within the step's allowance (one predicted plain step): at batch 16 on
/// the widened target the first informed step let four requests start MTP catch-ups at once
/// (123 ms against a 33 ms plain step). Steady drafting is never limited here.
#[derive(Clone, Debug)]
pub struct CatchUpBudget {
    /// Seconds of priced catch-up this step may still start.
    left: f64,
    /// Priced catch-ups started this step.
    priced: usize,
    /// Blind catch-ups this step may still start.
    blind_left: usize,
}

impl CatchUpBudget {
    /// A step's allowance: `plain_step_secs` of priced catch-up (the predicted plain step of
    /// this batch; 0 when unknown, which still admits one) and one blind start.
    pub fn new(plain_step_secs: f64) -> Self {
        CatchUpBudget {
            left: plain_step_secs.max(0.0),
            priced: 0,
            blind_left: 1,
        }
    }

    /// No limit: every start admitted (what would draft if starts were not paced).
    pub fn unlimited() -> Self {
        CatchUpBudget {
            left: f64::INFINITY,
            priced: 0,
            blind_left: usize::MAX,
        }
    }

    /// Whether a request starting as `start` may be offered drafts this step.
    pub fn admits(&self, start: Start) -> bool {
        match start {
            Start::Steady => true,
            Start::Blind => self.blind_left > 0,
            Start::Priced(cost) => self.priced == 0 || cost <= self.left,
        }
    }

    /// A request starting as `start` drafts this step: take its share of the allowance.
    pub fn charge(&mut self, start: Start) {
        match start {
            Start::Steady => {}
            Start::Blind => self.blind_left = self.blind_left.saturating_sub(1),
            Start::Priced(cost) => {
                self.left -= cost;
                self.priced += 1;
            }
        }
    }
}

/// Generated lengths of the engine's recently finished requests: how many more tokens a
/// running request can be expected to generate, the horizon over which a drafter's catch-up
/// must pay back. Without that record the guess was "as many as it has generated so far",
/// which at the tail of a batch (every other request finished, the last ones near their end)
/// started catch-ups over 75 positions for requests that had 8 tokens left — traced on the
/// widened target at batch 16 with the MTP drafter, where those catch-ups cost 3x a step each.
#[derive(Clone, Debug, Default)]
pub struct Lengths {
    recent: std::collections::VecDeque<usize>,
}

impl Lengths {
    /// Finished requests remembered (the oldest is forgotten first).
    const KEEP: usize = 64;
    /// Finished requests that must have outlived `generated` for their median to be used.
    const SURVIVORS: usize = 4;
    /// With at least this many finished and fewer than [`Self::SURVIVORS`] longer than the
    /// request, it is in a tail the engine has rarely seen: expect [`Self::TAIL`] more tokens.
    const SEEN: usize = 8;
    pub(crate) const TAIL: usize = 8;

    /// A request finished naturally after generating `n` tokens.
    pub fn record(&mut self, n: usize) {
        if self.recent.len() == Self::KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back(n);
    }

    /// Tokens a request that has generated `generated` (and may generate `left` more) is still
    /// expected to generate: the median remaining length of the recently finished requests
    /// that got past `generated` (at least 4 of them); [`Self::TAIL`] when at least 8 finished
    /// and fewer than 4 got past it; with less history, as many as it has generated so far
    /// (at least 32). Never more than `left`. (A guess of a quarter of `left` was tried: on the
    /// widened target the MTP layer's first catch-ups at batch 4 then started, but drafting
    /// did not hold in every run and interleaved runs did not gain; `docs/BENCHMARKS.md`.)
    pub fn horizon(&self, generated: usize, left: usize) -> usize {
        let mut more: Vec<usize> = self
            .recent
            .iter()
            .filter(|&&n| n > generated)
            .map(|&n| n - generated)
            .collect();
        let h = if more.len() >= Self::SURVIVORS {
            more.sort_unstable();
            more[more.len() / 2]
        } else if self.recent.len() >= Self::SEEN {
            Self::TAIL
        } else {
            generated.max(32)
        };
        h.min(left)
    }
}

//! How many tokens to draft (k) per request per step.
//!
//! Fixed mode: k = k_max. Adaptive mode: maximise expected committed tokens per second,
//! E(k) / cost(k), with E(k) = 1 + sum_{i<=k} prod_{j<=i} c_j for the conditional acceptance c_j
//! of draft position j (the engine keeps one estimate per position: an MTP layer chained on its
//! own output accepts far less at position 2 than at 1, so one per-token rate would overdraft;
//! for a constant c this is (1 - c^(k+1)) / (1 - c)), and cost(k) = the request's share of a
//! plain step plus k drafted tokens' verification and draft forwards, from the target's cost
//! model ([`TargetCost`]: a plain step by batch, a drafted token's price by batch class) and a
//! linear model of one draft forward, all fitted online from measured step times. k = 0 when
//! speculation does not pay by a margin ([`PAY_HURDLE`]; large batches, where the fixed costs
//! are shared, or low acceptance). The acceptance estimates learn fast from a prior
//! ([`learn_acceptance`]); the engine ramps how many requests may draft on little evidence
//! ([`ramp_cap`]) and re-explores a drafter it stopped using ([`explore_due`]).

/// Online linear model t = base + per_token * n fitted with exponential forgetting.
#[derive(Clone, Debug)]
pub struct LinearCost {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl Default for LinearCost {
    fn default() -> Self {
        LinearCost {
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        }
    }
}

impl LinearCost {
    pub(crate) const DECAY: f64 = 0.98;
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        let x = tokens as f64;
        self.n = self.n * Self::DECAY + 1.0;
        self.sx = self.sx * Self::DECAY + x;
        self.sy = self.sy * Self::DECAY + seconds;
        self.sxx = self.sxx * Self::DECAY + x * x;
        self.sxy = self.sxy * Self::DECAY + x * seconds;
    }
    /// (base, per_token), or None before any observation.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.n < 1.0 {
            return None;
        }
        let mx = self.sx / self.n;
        let my = self.sy / self.n;
        let var = self.x_variance();
        if var <= 1e-9 {
            // one x value seen: attribute the time to the fixed part
            return Some((my.max(0.0), 0.0));
        }
        let slope = ((self.sxy / self.n - mx * my) / var).max(0.0);
        let base = my - slope * mx;
        if base < 0.0 {
            // the least-squares line through the origin (base >= 0 is the model's constraint)
            return Some((0.0, (self.sxy / self.sxx).max(0.0)));
        }
        Some((base, slope))
    }
    /// Whether observations at two or more token counts have been seen (until then [`Self::fit`]
    /// puts all the time in the fixed part: tokens look free).
    pub fn has_slope(&self) -> bool {
        self.n >= 1.0 && self.x_variance() > 1e-9
    }
    /// Variance of the observed token counts (weighted like the fit; needs n >= 1).
    fn x_variance(&self) -> f64 {
        let mx = self.sx / self.n;
        self.sxx / self.n - mx * mx
    }
    pub fn predict(&self, tokens: usize) -> Option<f64> {
        self.fit().map(|(b, s)| b + s * tokens as f64)
    }
    /// The weighted mean point (tokens, seconds) of the observations, or None before any.
    pub fn mean_point(&self) -> Option<(f64, f64)> {
        (self.n >= 1.0).then(|| (self.sx / self.n, self.sy / self.n))
    }
}

/// The target step's cost model, fitted on decode / verification steps: t = plain(b) + d x
/// per_draft for a step of b decode requests verifying d drafted tokens, with plain(b) a line
/// over the steps without drafts (x = requests) and per_draft the through-origin slope of the
/// drafting steps' time beyond plain(b) — both per decode-batch class (the guard's: 1, 2, 3-4,
/// 5-8, 9-16, 17+ requests). A class's plain line borrows the all-classes slope until it has
/// its own; its draft price starts from a prior of [`DRAFT_PRIOR_SHARE`] x the request's share
/// of a plain step at that batch ([`DRAFT_PRIOR_WEIGHT`] drafted tokens' weight), never from
/// another class's drafts: a drafted token is cheap at batch 16 (the step's experts are loaded
/// anyway) and dear at batch 2-4, so the all-classes price that a class borrowed before it
/// drafted itself let the n-gram drafter (15-25 % accepted) draft at a loss in the last steps of
/// a batch-16 run, when finished requests leave 2-4 running (traced on the widened target: 2-3
/// drafts made a batch-3 step 12-18 ms instead of ~10).
///
/// Why not one line in tokens: a drafted token does not cost what a request does, and neither
/// costs the same at every batch. On the widened MoE target a request added to a batch of 9-16
/// costs ~0.57 ms, a drafted token there ~1.0-1.2 ms (traced steps of the n-gram drafter at
/// batch 9: +7 drafts = +7.2-8 ms), and at batch 1 a drafted token ~2 ms (the second token of
/// a sequence selects new experts); one line over all steps priced drafts at 0.5-0.7 ms and
/// let the n-gram drafter (20 % accepted) draft at a loss at batch 2-13.
#[derive(Clone, Debug, Default)]
pub struct TargetCost {
    /// Every decode step, x = tokens (whether the policy is informed: two token counts seen).
    tokens: LinearCost,
    plain_all: LinearCost,
    plain: [LinearCost; super::guard::CLASSES],
    draft: [DraftPrice; super::guard::CLASSES],
}

/// Through-origin fit of a drafting step's time beyond the plain line: (sum x y, sum x x) with
/// the same forgetting as [`LinearCost`].
#[derive(Clone, Copy, Debug, Default)]
struct DraftPrice {
    sxy: f64,
    sxx: f64,
}

impl DraftPrice {
    fn observe(&mut self, drafts: usize, extra_secs: f64) {
        let x = drafts as f64;
        self.sxy = self.sxy * LinearCost::DECAY + x * extra_secs;
        self.sxx = self.sxx * LinearCost::DECAY + x * x;
    }
    /// The through-origin slope with `prior` seconds per draft counted as
    /// [`DRAFT_PRIOR_WEIGHT`] steps of one drafted token each.
    fn per_draft(&self, prior: f64) -> f64 {
        let w = DRAFT_PRIOR_WEIGHT;
        ((self.sxy + w * prior) / (self.sxx + w)).max(0.0)
    }
}

/// A batch class's drafted-token price before its own drafting steps: this share of the
/// request's share of a plain step (plain(b) / b) — at batch 1 a quarter of a step, what the
/// widened target's drafted token measured there. Half a share was tried: it kept the model
/// drafters from drafting often enough at batch 4 to learn their real price (draft-weak adaptive
/// 1.01-1.04x where fixed k = 1 gave 1.21-1.28x; a quarter: 1.05-1.07x).
pub const DRAFT_PRIOR_SHARE: f64 = 0.25;
/// Weight of that prior in drafted tokens (four steps of one draft each): a plain step at batch
/// 4 varies by +-1.5 ms from one step to the next on the widened target, more than a drafted
/// token costs, so one step's excess must not set the price alone.
pub const DRAFT_PRIOR_WEIGHT: f64 = 4.0;

/// The most one drafted token's time beyond the plain line may count for, in request shares
/// (plain(b) / b) of its step: one. A drafted token is one more token of a request already in
/// the step — its multiply-adds and any experts it alone selects, its attention over a KV
/// cache the request's own token reads anyway — so it costs less than the request's share
/// (measured on the widened target: ~0.2 of a share at batch 1, 0.5-0.65 at batch 16). What a
/// step measures beyond a share is noise, and at batch 16 noise is most of a small drafting
/// step: its plain steps vary by +-3 ms around ~33 ms while a drafted token costs ~1.3 ms, so
/// two early steps of 1 and 3 drafts, timed 5 and ~10 ms beyond the plain line, priced a
/// drafted token at 2.6 ms against a 2 ms share: the draft model (~100 % accepted) stopped
/// drafting for the rest of the run (adaptive 0.95x where fixed k = 1 gave 1.18x), as the
/// explorer at batch 16 comes after 256 idle steps.
pub const DRAFT_MAX_SHARE: f64 = 1.0;

/// What one request's drafts cost in a step of a given batch (see [`TargetCost::price`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepPrice {
    /// The request's share of a plain step: plain(b) / b.
    pub share: f64,
    /// Seconds per drafted token verified.
    pub per_draft: f64,
}

impl StepPrice {
    /// The price one line t = base + per_token x tokens gives a step of `batch` requests: the
    /// request's share of base plus its own token, and the line's slope per drafted token.
    pub fn of_line(line: &LinearCost, batch: usize) -> Option<StepPrice> {
        line.fit().map(|(tb, tt)| StepPrice {
            share: tb / batch.max(1) as f64 + tt,
            per_draft: tt,
        })
    }
}

impl TargetCost {
    /// A decode-only step of `requests` decode requests fed `tokens` tokens in `seconds`
    /// (`tokens - requests` of them drafted).
    pub fn observe(&mut self, requests: usize, tokens: usize, seconds: f64) {
        self.tokens.observe(tokens, seconds);
        let c = super::guard::class_of(requests);
        let drafts = tokens.saturating_sub(requests);
        if drafts == 0 {
            self.plain_all.observe(requests, seconds);
            self.plain[c].observe(requests, seconds);
        } else if let Some(p) = self.plain_at(requests) {
            // At most a request's share per drafted token (see [`DRAFT_MAX_SHARE`]).
            let cap = DRAFT_MAX_SHARE * drafts as f64 * p / requests.max(1) as f64;
            self.draft[c].observe(drafts, (seconds - p).min(cap));
        }
    }

    /// Predicted seconds of a plain step of `requests` decode requests: the class's line, or,
    /// while its plain steps had one batch size (always so for batches 1 and 2), their mean
    /// moved along the all-classes slope.
    pub fn plain_at(&self, requests: usize) -> Option<f64> {
        let c = &self.plain[super::guard::class_of(requests)];
        if c.has_slope() {
            return c.predict(requests);
        }
        let Some((mx, my)) = c.mean_point() else {
            return self.plain_all.predict(requests);
        };
        let slope = self.plain_all.fit().map_or(0.0, |f| f.1);
        Some(my + slope * (requests as f64 - mx))
    }

    /// The price of drafting in a step of `requests` decode requests: its plain share, and per
    /// drafted token the class's measured price, drawn towards [`DRAFT_PRIOR_SHARE`] x share
    /// while its drafting steps are few. None before any plain step was timed.
    pub fn price(&self, requests: usize) -> Option<StepPrice> {
        let b = requests.max(1);
        let share = self.plain_at(b)? / b as f64;
        let prior = DRAFT_PRIOR_SHARE * share;
        Some(StepPrice {
            share,
            per_draft: self.draft[super::guard::class_of(b)].per_draft(prior),
        })
    }

    /// Whether decode steps of two token counts have been timed (the policy is informed).
    pub fn has_slope(&self) -> bool {
        self.tokens.has_slope()
    }
}

/// Verifications of a drafter after which the informed adaptive policy lets every request draft
/// in one step; before that [`ramp_cap`] requests may (see `engine::schedule`).
pub const RAMP_OBS: u64 = 16;

/// Requests that may draft in one informed step while the drafter has `obs` verifications:
/// 1 + obs below [`RAMP_OBS`] (1, 2, 4, 8, 16 in consecutive steps where every allowed request
/// drafts), unbounded after.
pub fn ramp_cap(obs: u64) -> usize {
    if obs < RAMP_OBS {
        1 + obs as usize
    } else {
        usize::MAX
    }
}

/// The informed policy's periodic explorer: one request drafts one token once `idle_steps`
/// decode steps in a row had no drafts and `idle_steps >= period x n_decode`; `period` starts
/// at [`EXPLORE_EVERY`], doubles (up to [`EXPLORE_MAX`]) after each step in which only the
/// explorer drafted, and returns to [`EXPLORE_EVERY`] after a step in which the policy drafted
/// of its own accord.
pub const EXPLORE_EVERY: u64 = 16;
pub const EXPLORE_MAX: u64 = 128;

/// Whether the periodic explorer drafts this step (see [`EXPLORE_EVERY`]).
pub fn explore_due(idle_steps: u64, period: u64, n_decode: usize) -> bool {
    idle_steps >= period.saturating_mul(n_decode.max(1) as u64)
}

/// The explorer's period after a step with drafts: doubled when only the explorer drafted.
pub fn next_explore_period(period: u64, only_explorer: bool) -> u64 {
    if only_explorer {
        (period * 2).clamp(EXPLORE_EVERY, EXPLORE_MAX)
    } else {
        EXPLORE_EVERY
    }
}

/// Weight of the acceptance prior, in observations, and the observations an estimate remembers.
pub const ACCEPT_PRIOR_WEIGHT: f64 = 4.0;
pub const ACCEPT_MEMORY: u64 = 20;

/// Weight, in observations, of a first-position acceptance recorded with the drafter's weights
/// (`Proposer::recorded_acceptance`: measured on held-out traces of the task it was trained
/// for): three times a guess's. Traced on the widened target (MTP, batch 4): the layer's first
/// two drafts were rejected, which took the 0.7 guess at weight 4 to 0.47 and drafting stopped
/// for the rest of the run (adaptive 0.98-0.99x where fixed k = 1 gave 1.05-1.11x at 74 %
/// accepted); from the recorded 0.78 at weight 12 the same two rejections leave 0.67.
pub const RECORDED_PRIOR_WEIGHT: f64 = 12.0;

/// Where an acceptance estimate starts: a value and its weight in observations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcceptPrior {
    pub alpha: f64,
    pub weight: f64,
}

impl AcceptPrior {
    /// A drafter nothing is known of: 0.7 at [`ACCEPT_PRIOR_WEIGHT`].
    pub const GENERIC: AcceptPrior = AcceptPrior {
        alpha: 0.7,
        weight: ACCEPT_PRIOR_WEIGHT,
    };

    /// A recorded acceptance (clamped to [0.05, 0.95]) at [`RECORDED_PRIOR_WEIGHT`].
    pub fn recorded(alpha: f64) -> AcceptPrior {
        AcceptPrior {
            alpha: alpha.clamp(0.05, 0.95),
            weight: RECORDED_PRIOR_WEIGHT,
        }
    }

    /// Whether this prior is a recorded acceptance rather than the guess (the adaptive policy
    /// then skips exploring for acceptance in steps it cannot time, `engine::schedule`).
    pub fn is_recorded(&self) -> bool {
        self.weight > Self::GENERIC.weight
    }
}

/// The prior weight of draft position `j`'s acceptance estimate: the drafter's first-position
/// prior `first` for position 0, the guess's for the chained positions after it.
pub fn pos_prior_weight(first: &AcceptPrior, j: usize) -> f64 {
    if j == 0 {
        first.weight
    } else {
        AcceptPrior::GENERIC.weight
    }
}

/// The `seen`-th acceptance observation `x` (0 or 1 for one draft position, or a fraction; the
/// caller counts, from 1) into the estimate `est`: the mean of the prior (weight `prior_weight`,
/// [`ACCEPT_PRIOR_WEIGHT`] for a guess) and the observations while they are few, then an
/// exponential average over about [`ACCEPT_MEMORY`] of them (weight 1 / 24 per observation
/// after a guess). An EMA of
/// weight 0.05 from the 0.7 prior took ~10 verifications to learn that the n-gram drafter
/// accepts 20 % on the widened target's workload, while the ramp let up to 11 requests draft at
/// once; this estimate is at 0.45 after four. A drafter unlucky in its first verifications (the
/// MTP layer's first two drafts on that workload are rejected) is re-measured by the policy's
/// periodic explorer (`engine::schedule`).
pub fn learn_acceptance(est: &mut f64, seen: u64, x: f64, prior_weight: f64) {
    *est += (x - *est) / (prior_weight + seen.clamp(1, ACCEPT_MEMORY) as f64);
}

/// How far above its estimate the adaptive policy rates a draft position's acceptance, in
/// standard errors of an estimate from the prior and `obs` observations: half of one (one
/// standard error let the n-gram drafter, 12-15 % accepted, draft at a loss at batch 4:
/// adaptive 0.95-0.96x; none left the weak draft model at 1.06x there, fixed k = 1 1.2x).
pub const ACCEPT_OPTIMISM: f64 = 0.5;

/// The acceptance the policy decides on for an estimate `a` behind `obs` observations and a
/// prior of weight `prior_weight`:
/// `a + ACCEPT_OPTIMISM x sqrt(a (1 - a) / (prior_weight + obs))` (an upper confidence
/// bound; `obs` uncapped, so it shrinks towards `a` as evidence grows; exact at 0). Without it
/// a drafter whose first two verifications were rejected stopped for good: on the widened target at
/// batch 4 the weak draft model (68 % accepted) fell to 0.47 after two rejections, drafting
/// stopped paying at that estimate, and nothing re-measured it for the rest of the run (64 idle
/// steps before the explorer's turn): adaptive 1.05x where fixed k = 1 gave 1.2x.
pub fn optimistic_acceptance(a: f64, obs: u64, prior_weight: f64) -> f64 {
    let a = a.clamp(0.0, 0.999);
    let se = (a * (1.0 - a) / (prior_weight + obs as f64)).sqrt();
    (a + ACCEPT_OPTIMISM * se).min(0.999)
}

/// How much faster (committed tokens per second) than plain decoding the adaptive policy's
/// prediction for k > 0 must be before it drafts: 4 %. The prediction is biased upwards where
/// it is marginal — each draft position's acceptance is rated above its estimate
/// ([`ACCEPT_OPTIMISM`]), and a batch class's draft price starts from a prior that undercounts
/// small batches — so a predicted gain of a few percent was, traced on the widened target, a
/// loss: the n-gram drafter (15-25 % accepted overall, ~0 % on the last requests of a batch-16
/// run) drafted 1-3 tokens per step at batch 2-3 for a predicted 1-3 % gain, each drafted token
/// costing ~1 ms more than priced and none accepted (adaptive 0.95-0.96x of plain).
pub const PAY_HURDLE: f64 = 0.04;

/// Expected committed tokens for k drafts at per-token acceptance a.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    let a = a.clamp(0.0, 0.999_999);
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// Expected committed tokens for k drafts with conditional acceptance `c[j]` at position j + 1
/// (positions past `c` take its last value).
pub fn expected_tokens_at(c: &[f64], k: usize) -> f64 {
    let (mut e, mut p) = (1.0, 1.0);
    for j in 0..k {
        let cj = c
            .get(j)
            .or(c.last())
            .copied()
            .unwrap_or(0.0)
            .clamp(0.0, 0.999_999);
        p *= cj;
        e += p;
    }
    e
}

/// Choose k in 0..=k_max for one request with one per-token acceptance `a` (every position).
/// `batch`: requests in the step; `target`/`draft`: fitted costs (target: one line in tokens).
pub fn choose_k(
    a: f64,
    k_max: usize,
    batch: usize,
    target: &LinearCost,
    draft: &LinearCost,
) -> usize {
    choose_k_at(&[a], k_max, batch, target, draft)
}

/// [`choose_k`] with a conditional acceptance per draft position (see the module doc).
pub fn choose_k_at(
    c: &[f64],
    k_max: usize,
    batch: usize,
    target: &LinearCost,
    draft: &LinearCost,
) -> usize {
    choose_k_rates(c, k_max, batch, StepPrice::of_line(target, batch), draft).0
}

/// [`choose_k_at`] for a step priced by [`TargetCost::price`], and the predicted seconds per
/// committed token it saves against k = 0 (None before the target cost has a price). A k > 0
/// must beat k = 0's predicted rate by [`PAY_HURDLE`]. `sharing`: the requests whose drafts
/// share each draft forward's fixed cost (`engine::schedule` finds how many will draft): one
/// MTP forward streams a whole MoE layer's weights whether it drafts for one request or
/// sixteen, so at batch 16 with only one request caught up its draft costs that request the
/// whole forward, not a sixteenth — priced at a sixteenth, the MTP drafter drafted one token
/// for one request per step at batch 16 (~3 ms of MTP forward and ~1.3 ms of verification for
/// ~0.7 accepted tokens).
pub fn choose_k_rates(
    c: &[f64],
    k_max: usize,
    sharing: usize,
    price: Option<StepPrice>,
    draft: &LinearCost,
) -> (usize, Option<f64>) {
    let Some(StepPrice { share, per_draft }) = price else {
        return (k_max, None); // no measurements yet: explore
    };
    // A drafter without a model (n-gram) is never timed: it costs nothing.
    let (db, dt) = draft.fit().unwrap_or((0.0, 0.0));
    let b = sharing.max(1) as f64;
    // (k, rate): k = 0 holds the bar a k > 0 must beat (plain's rate plus the hurdle)
    let mut best = (0usize, 0.0f64);
    let mut plain = 0.0;
    for k in 0..=k_max {
        let cost = share
            + if k > 0 {
                k as f64 * (per_draft + db / b + dt)
            } else {
                0.0
            };
        let rate = expected_tokens_at(c, k) / cost.max(1e-12);
        if k == 0 {
            plain = rate;
            best = (0, rate * (1.0 + PAY_HURDLE));
        } else if rate > best.1 * (1.0 + 1e-9) {
            best = (k, rate);
        }
    }
    let saved = if best.0 == 0 || plain <= 0.0 {
        0.0
    } else {
        1.0 / plain - 1.0 / best.1
    };
    (best.0, Some(saved))
}

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
/// draft ([`sharing_fixed_point`] with nothing pacing the starts), and a resuming one like a
/// steady one (`engine::schedule`).
pub fn starts_from_far(lag: usize) -> bool {
    lag >= MIN_TIMED_CATCH_UP_ROWS
}

/// Over how many requests a draft forward's fixed cost is priced: the fixed point of
/// `drafting(sharing)`, the number of requests that choose to draft when each is priced as
/// sharing the forward with `sharing` requests. Starts from the whole decode batch (`n_decode`)
/// and lowers the count to the number that chose to draft until it holds; a lower count only
/// makes drafting dearer, so the count falls monotonically and this ends (at most `n_decode`
/// rounds). Never below 1.
pub fn sharing_fixed_point(n_decode: usize, mut drafting: impl FnMut(usize) -> usize) -> usize {
    let n = n_decode.max(1);
    let mut sharing = n;
    loop {
        let m = drafting(sharing).clamp(1, n);
        if m >= sharing {
            return sharing;
        }
        sharing = m;
    }
}

/// Whether a request whose drafter must first catch up on `lag` positions (its whole context
/// when it never drafted) should start drafting: the catch-up, `secs_per_row` each, must be
/// paid back by the predicted saving per committed token (`saved`, from [`choose_k_rates`])
/// over the tokens it is still expected to generate (`horizon`, from [`Lengths::horizon`]).
pub fn catch_up_pays(lag: usize, secs_per_row: f64, saved: f64, horizon: usize) -> bool {
    saved * horizon as f64 >= CATCH_UP_MARGIN * secs_per_row * lag as f64
}

/// How many times over the predicted saving must repay a catch-up (see [`catch_up_pays`]): the
/// catch-up's cost is measured and certain, the saving is a prediction over a guessed horizon.
/// Traced on the widened target at batch 4: the MTP layer's catch-ups on ~70 positions (10-12
/// ms each, four requests in four steps) were predicted to be repaid ~2x over the horizon (as many
/// tokens as each had generated, no finished requests yet), and ~35 tokens were left: the
/// drafting after them saved ~18 % per token, yet the run ended at 0.97x of plain.
pub const CATCH_UP_MARGIN: f64 = 2.0;

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
    const TAIL: usize = 8;
    /// With less history the guess is at least this part of what the request may still
    /// generate (what its `max_tokens` leaves), and at least [`Self::GUESS_MIN`].
    const GUESS_PART_OF_LEFT: usize = 4;
    const GUESS_MIN: usize = 32;

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
    /// and fewer than 4 got past it; with less history, as many as it has generated so far, at
    /// least a quarter of `left` and at least 32. Never more than `left`.
    ///
    /// The quarter of `left` (the guess was 32 at first): traced on the widened target, MTP at
    /// batch 4 (16 workload requests of ~63 generated tokens, `max_tokens` 256), the first
    /// four requests' prompt catch-ups (~45 positions, ~16 ms each) were judged against a
    /// saving of ~0.8 ms per token over 32 tokens, so none started, and a request that starts
    /// later must pay the catch-up of everything it decoded plainly: the run never drafted
    /// (adaptive ~1.0x of plain where fixed k = 1 ran 1.07-1.11x). Over 64 they start.
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
            generated
                .max(left / Self::GUESS_PART_OF_LEFT)
                .max(Self::GUESS_MIN)
        };
        h.min(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One blind start per step; the first priced start whatever its cost, later ones only
    /// within what is left of one plain step; steady drafting is never limited.
    #[test]
    fn catch_up_budget_bounds_each_step() {
        // (binary fractions of a second, so the sums are exact)
        let mut b = CatchUpBudget::new(0.5);
        assert!(b.admits(Start::Steady));
        // the first priced start is admitted even above the allowance
        assert!(b.admits(Start::Priced(2.0)));
        b.charge(Start::Priced(0.25));
        assert!(b.admits(Start::Priced(0.25)), "0.25 s of 0.25 s left");
        assert!(!b.admits(Start::Priced(0.375)), "0.375 s of 0.25 s left");
        b.charge(Start::Priced(0.25));
        assert!(!b.admits(Start::Priced(0.125)), "nothing left");
        // blind starts are counted apart from priced ones
        assert!(b.admits(Start::Blind));
        b.charge(Start::Blind);
        assert!(!b.admits(Start::Blind), "one blind start per step");
        b.charge(Start::Steady);
        assert!(b.admits(Start::Steady));
        // a fresh step starts over; an unknown plain step still admits one priced start
        let mut b = CatchUpBudget::new(0.0);
        assert!(b.admits(Start::Priced(0.050)));
        b.charge(Start::Priced(0.050));
        assert!(!b.admits(Start::Priced(0.0001)));
        // unpaced (the starters' dry run): every start admitted, however many
        let mut b = CatchUpBudget::unlimited();
        for _ in 0..64 {
            assert!(b.admits(Start::Blind) && b.admits(Start::Priced(1.0)));
            b.charge(Start::Blind);
            b.charge(Start::Priced(1.0));
        }
    }

    /// The shared count falls to the requests that draft when priced over it: one starter
    /// among 15 requests that never draft, drafting only if the forward is shared by at least
    /// two, settles at 1 (it then prices itself out); ten requests that draft when shared by
    /// at least five settle at 10; nobody drafting gives 1.
    #[test]
    fn sharing_settles_on_the_requests_that_would_draft() {
        let lone = |s: usize| usize::from(s >= 2);
        assert_eq!(sharing_fixed_point(16, lone), 1);
        let ten = |s: usize| if s >= 5 { 10 } else { 0 };
        assert_eq!(sharing_fixed_point(16, ten), 10);
        assert_eq!(sharing_fixed_point(16, |_| 0), 1);
        assert_eq!(sharing_fixed_point(0, |_| 3), 1);
        // a chain: 16 -> 12 -> 9 -> 9
        let chain = |s: usize| match s {
            16 => 12,
            12 | 9 => 9,
            _ => 0,
        };
        assert_eq!(sharing_fixed_point(16, chain), 9);
    }

    fn model(base: f64, per: f64) -> LinearCost {
        let mut c = LinearCost::default();
        for n in [1, 2, 4, 8, 16, 32] {
            c.observe(n, base + per * n as f64);
        }
        c
    }

    /// Plain steps price a request's share per batch class; drafting steps price a drafted
    /// token beyond the plain line, per class: a small batch whose drafts are dear is not
    /// priced by a large one's cheap requests.
    #[test]
    fn target_cost_prices_requests_and_drafts_per_class() {
        let mut t = TargetCost::default();
        assert_eq!(t.price(16), None);
        // batches 9-16: 10 ms + 0.5 ms per request without drafts, + 1 ms per drafted token
        for b in [16, 13, 10, 9, 16, 12] {
            t.observe(b, b, 0.010 + 0.0005 * b as f64);
        }
        t.observe(9, 9 + 7, 0.010 + 0.0005 * 9.0 + 0.007);
        let p = t.price(16).unwrap();
        let share16 = 0.010 / 16.0 + 0.0005;
        assert!((p.share - share16).abs() < 1e-9, "{p:?}");
        // seven drafts of 1 ms against the prior (DRAFT_PRIOR_WEIGHT drafts at its price)
        let w = DRAFT_PRIOR_WEIGHT;
        let want = (0.007 * 7.0 + w * DRAFT_PRIOR_SHARE * share16) / (49.0 + w);
        assert!((p.per_draft - want).abs() < 1e-12, "{p:?}");
        assert!((p.per_draft - 0.001).abs() < 1e-4, "{p:?}");
        assert!(t.has_slope());
        // batch 1: its own plain steps; its drafts priced by its prior (a quarter of its step),
        // not by batch 16's cheap ones, until it drafts itself
        t.observe(1, 1, 0.0065);
        t.observe(1, 1, 0.0065);
        let p1 = t.price(1).unwrap();
        assert!((p1.share - 0.0065).abs() < 1e-9, "{p1:?}");
        assert!(
            (p1.per_draft - DRAFT_PRIOR_SHARE * 0.0065).abs() < 1e-9,
            "{p1:?}"
        );
        // three 2-token verifications at batch 1 cost 2 ms more each: drawn from the prior
        // towards its own price
        for _ in 0..3 {
            t.observe(1, 2, 0.0085);
        }
        let p1 = t.price(1).unwrap();
        assert!((p1.per_draft - 0.002).abs() < 0.0004, "{p1:?}");
        // so one draft at 25 % acceptance pays at neither batch (break-even ~28 % at batch 1),
        // at 95 % at both, at 40 % at batch 1 only (break-even ~84 % at batch 16)
        let free = LinearCost::default();
        let p16 = t.price(16);
        for (a, at1, at16) in [(0.25, 0, 0), (0.4, 1, 0), (0.95, 1, 1)] {
            assert_eq!(
                choose_k_rates(&[a], 1, 1, Some(p1), &free).0,
                at1,
                "{a} at 1"
            );
            assert_eq!(choose_k_rates(&[a], 1, 16, p16, &free).0, at16, "{a} at 16");
        }
    }

    /// A drafting step's time beyond the plain line counts for at most a request's share per
    /// drafted token: one noisy small drafting step at batch 16 cannot price drafting out.
    #[test]
    fn draft_price_counts_at_most_a_share_per_draft() {
        let mut t = TargetCost::default();
        // batch 16: 32 ms plain steps (a 2 ms share)
        for _ in 0..3 {
            t.observe(16, 16, 0.032);
        }
        // three drafts timed 30 ms beyond the plain line: counted as 3 x 2 ms
        t.observe(16, 19, 0.062);
        let share = 0.002;
        let w = DRAFT_PRIOR_WEIGHT;
        let want =
            (3.0 * DRAFT_MAX_SHARE * 3.0 * share + w * DRAFT_PRIOR_SHARE * share) / (9.0 + w);
        let p = t.price(16).unwrap();
        assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
        assert!(p.per_draft <= share, "{p:?}");
        // below the cap a step counts as measured
        t.observe(16, 32, 0.032 + 16.0 * 0.0012);
        let p = t.price(16).unwrap();
        let d = LinearCost::DECAY;
        let sxy = (3.0 * 0.006) * d + 16.0 * 16.0 * 0.0012;
        let sxx = 9.0 * d + 256.0;
        let want = (sxy + w * DRAFT_PRIOR_SHARE * share) / (sxx + w);
        assert!((p.per_draft - want).abs() < 1e-12, "{p:?} want {want}");
    }

    /// A draft forward's fixed cost is shared by the requests drafting in it: an MTP-like
    /// drafter (3 ms per forward whatever its batch) pays at batch 16 when all sixteen requests
    /// draft, not when one drafts alone.
    #[test]
    fn draft_forward_cost_is_shared_by_the_drafting_requests() {
        let price = Some(StepPrice {
            share: 0.002,
            per_draft: 0.0008,
        });
        let mut mtp = LinearCost::default();
        for n in [1, 1, 1] {
            mtp.observe(n, 0.003);
        }
        assert_eq!(choose_k_rates(&[0.75], 1, 16, price, &mtp).0, 1);
        assert_eq!(choose_k_rates(&[0.75], 1, 1, price, &mtp).0, 0);
    }

    #[test]
    fn ramp_and_explorer_schedule() {
        assert_eq!(ramp_cap(0), 1);
        assert_eq!(ramp_cap(1), 2);
        assert_eq!(ramp_cap(RAMP_OBS - 1), RAMP_OBS as usize);
        assert_eq!(ramp_cap(RAMP_OBS), usize::MAX);
        // the explorer waits period x batch idle steps
        assert!(!explore_due(15, EXPLORE_EVERY, 1));
        assert!(explore_due(16, EXPLORE_EVERY, 1));
        assert!(!explore_due(16, EXPLORE_EVERY, 4));
        assert!(explore_due(64, EXPLORE_EVERY, 4));
        // doubling while only the explorer drafts, back to the start when the policy drafts
        let mut p = EXPLORE_EVERY;
        for want in [32, 64, 128, 128] {
            p = next_explore_period(p, true);
            assert_eq!(p, want);
        }
        assert_eq!(next_explore_period(p, false), EXPLORE_EVERY);
    }

    /// The prior counts as four observations; later ones enter with weight 1 / 24.
    #[test]
    fn acceptance_learns_fast_then_averages() {
        let (mut a, mut n) = (0.7, 0);
        for _ in 0..4 {
            n += 1;
            learn_acceptance(&mut a, n, 0.2, ACCEPT_PRIOR_WEIGHT);
        }
        assert!(
            (a - 0.45).abs() < 1e-12,
            "mean of prior x4 and four 0.2s: {a}"
        );
        for _ in 0..300 {
            n += 1;
            learn_acceptance(&mut a, n, 0.2, ACCEPT_PRIOR_WEIGHT);
        }
        // past the memory every observation weighs as the ACCEPT_MEMORY-th did
        let (mut far, mut at_memory) = (a, a);
        learn_acceptance(&mut far, n + 1, 1.0, ACCEPT_PRIOR_WEIGHT);
        learn_acceptance(&mut at_memory, ACCEPT_MEMORY, 1.0, ACCEPT_PRIOR_WEIGHT);
        assert_eq!(far, at_memory);
        assert!((a - 0.2).abs() < 1e-3);
        learn_acceptance(&mut a, n + 1, 1.0, ACCEPT_PRIOR_WEIGHT);
        assert!((a - (0.2 + 0.8 / 24.0)).abs() < 1e-3);
    }

    /// The decision acceptance sits half a standard error above the estimate and closes in on
    /// it as observations grow; it never reaches 1 and is exact at 0.
    /// A recorded prior weighs three guesses: two early rejections move it far less.
    #[test]
    fn a_recorded_prior_survives_an_unlucky_start() {
        let after_two = |prior: AcceptPrior| {
            let mut a = prior.alpha;
            for n in 1..=2 {
                learn_acceptance(&mut a, n, 0.0, prior.weight);
            }
            a
        };
        let guess = after_two(AcceptPrior::GENERIC);
        let rec = after_two(AcceptPrior::recorded(0.78));
        assert!((guess - 0.7 * 4.0 / 6.0).abs() < 1e-12, "{guess}");
        assert!((rec - 0.78 * 12.0 / 14.0).abs() < 1e-12, "{rec}");
        // and its bound stays tighter at the same evidence
        let wide = optimistic_acceptance(0.6, 2, ACCEPT_PRIOR_WEIGHT) - 0.6;
        let tight = optimistic_acceptance(0.6, 2, RECORDED_PRIOR_WEIGHT) - 0.6;
        assert!(tight < wide && tight > 0.0);
        assert_eq!(AcceptPrior::recorded(1.5).alpha, 0.95);
        assert!(AcceptPrior::recorded(0.3).is_recorded() && !AcceptPrior::GENERIC.is_recorded());
    }

    #[test]
    fn optimism_shrinks_with_evidence() {
        let after2 = optimistic_acceptance(0.47, 2, ACCEPT_PRIOR_WEIGHT);
        let want = 0.47 + ACCEPT_OPTIMISM * (0.47f64 * 0.53 / 6.0).sqrt();
        assert!((after2 - want).abs() < 1e-12, "{after2}");
        let mut last = after2;
        for obs in [10, 100, 1000, 100_000] {
            let u = optimistic_acceptance(0.47, obs, ACCEPT_PRIOR_WEIGHT);
            assert!(u < last && u > 0.47, "{obs}: {u}");
            last = u;
        }
        assert!(last - 0.47 < 2e-3);
        assert_eq!(optimistic_acceptance(0.0, 0, ACCEPT_PRIOR_WEIGHT), 0.0);
        assert!(optimistic_acceptance(0.999, 0, ACCEPT_PRIOR_WEIGHT) <= 0.999);
        // two rejections of a 68 % drafter (estimate 0.47) still draft at batch 4, where one
        // draft breaks even at ~0.44 with the class's prior price
        let share = 0.0025;
        let price = StepPrice {
            share,
            per_draft: (0.0025 + DRAFT_PRIOR_WEIGHT * DRAFT_PRIOR_SHARE * share)
                / (1.0 + DRAFT_PRIOR_WEIGHT),
        };
        let free = LinearCost::default();
        assert_eq!(choose_k_rates(&[after2], 1, 4, Some(price), &free).0, 1);
        // a 12 % drafter after 20 observations does not
        let low = optimistic_acceptance(0.12, 20, ACCEPT_PRIOR_WEIGHT);
        assert_eq!(choose_k_rates(&[low], 1, 4, Some(price), &free).0, 0);
    }

    #[test]
    fn fit_recovers_a_line() {
        let (b, s) = model(0.01, 0.001).fit().unwrap();
        assert!((b - 0.01).abs() < 1e-9 && (s - 0.001).abs() < 1e-9);
    }

    #[test]
    fn speculates_when_it_pays_and_not_otherwise() {
        let target = model(0.010, 0.0002); // memory-bound: big fixed cost
        let cheap_draft = model(0.001, 0.0001);
        assert!(choose_k(0.9, 8, 1, &target, &cheap_draft) >= 3);
        assert_eq!(
            choose_k(0.0, 8, 1, &target, &cheap_draft),
            0,
            "zero acceptance never pays"
        );
        let compute_bound = model(0.0001, 0.001);
        assert_eq!(
            choose_k(0.6, 8, 64, &compute_bound, &cheap_draft),
            0,
            "large batch, compute bound"
        );
        // an untimed (model-free) drafter is free, but low acceptance still does not pay
        let untimed = LinearCost::default();
        assert_eq!(choose_k(0.05, 8, 1, &compute_bound, &untimed), 0);
        assert!(choose_k(0.95, 8, 1, &target, &untimed) >= 3);
    }

    /// An MTP-like drafter: high acceptance at position 1, little after (chained on itself), and
    /// a draft step a quarter of a target step: one draft pays, more do not — while one
    /// per-token rate with the same mean acceptance would draft several.
    #[test]
    fn position_decay_limits_k() {
        let target = model(0.020, 0.0012);
        let mtp = model(0.0045, 0.0001);
        let c = [0.75, 0.28, 0.09, 0.03, 0.02, 0.0, 0.0, 0.0];
        assert_eq!(choose_k_at(&c, 8, 1, &target, &mtp), 1);
        assert!(
            choose_k(0.62, 8, 1, &target, &mtp) > 1,
            "the flat rate overdrafts"
        );
        // a flat profile is the geometric formula
        for k in 0..6 {
            assert!((expected_tokens_at(&[0.8], k) - expected_tokens(0.8, k)).abs() < 1e-12);
        }
    }

    #[test]
    fn one_token_count_has_no_slope() {
        let mut c = LinearCost::default();
        assert!(!c.has_slope());
        c.observe(20, 0.045);
        c.observe(20, 0.047);
        assert!(!c.has_slope());
        assert_eq!(c.fit().unwrap().1, 0.0);
        c.observe(16, 0.033);
        assert!(c.has_slope());
        assert!(c.fit().unwrap().1 > 0.0);
    }

    #[test]
    fn a_negative_intercept_refits_through_the_origin() {
        // many steps of 16 tokens at 45 ms and one of 17 at 90 ms: the free line has a large
        // negative base; constrained to base 0 it must still predict ~45 ms at 16 tokens
        let mut c = LinearCost::default();
        for _ in 0..10 {
            c.observe(16, 0.045);
        }
        c.observe(17, 0.090);
        let (b, s) = c.fit().unwrap();
        assert_eq!(b, 0.0);
        let p16 = s * 16.0;
        assert!((p16 - 0.048).abs() < 0.005, "predicts {p16} s at 16 tokens");
    }

    #[test]
    fn catch_up_is_amortised() {
        let target = model(0.010, 0.0002);
        let draft = model(0.001, 0.0001);
        let price = StepPrice::of_line(&target, 1);
        let (k, saved) = choose_k_rates(&[0.9], 8, 1, price, &draft);
        let saved = saved.unwrap();
        assert!(k >= 3 && saved > 0.0);
        // a short context pays back quickly; a long one does not in 50 tokens (a quarter of
        // the 200 left), but does later
        let fresh = Lengths::default();
        assert!(catch_up_pays(50, 1e-4, saved, fresh.horizon(0, 200)));
        assert!(!catch_up_pays(
            1_000_000,
            1e-4,
            saved,
            fresh.horizon(0, 200)
        ));
        assert!(!catch_up_pays(20_000, 1e-4, saved, fresh.horizon(10, 200)));
        assert!(catch_up_pays(
            20_000,
            1e-4,
            saved,
            fresh.horizon(10_000, 200_000)
        ));
        // nothing saved (k = 0 is best): never worth a catch-up
        let (k0, s0) = choose_k_rates(&[0.0], 8, 1, price, &draft);
        assert_eq!((k0, s0), (0, Some(0.0)));
        assert!(!catch_up_pays(10, 1e-4, 0.0, 100));
    }

    /// A k > 0 predicted a few percent faster than plain decoding is not taken; one clear of
    /// the hurdle is.
    #[test]
    fn drafting_must_clear_the_hurdle() {
        let price = Some(StepPrice {
            share: 1.0,
            per_draft: 0.5,
        });
        let free = LinearCost::default();
        // one draft at acceptance a: rate (1 + a) / 1.5 against 1 for plain
        let gain = |a: f64| (1.0 + a) / 1.5 - 1.0;
        let marginal = 0.53;
        assert!(gain(marginal) > 0.0 && gain(marginal) < PAY_HURDLE);
        assert_eq!(
            choose_k_rates(&[marginal], 1, 1, price, &free),
            (0, Some(0.0))
        );
        let clear = 0.59;
        assert!(gain(clear) > PAY_HURDLE);
        let (k, saved) = choose_k_rates(&[clear], 1, 1, price, &free);
        assert_eq!(k, 1);
        // saved = 1 / plain rate - 1 / drafting rate, seconds per committed token
        assert!((saved.unwrap() - (1.0 - 1.5 / 1.59)).abs() < 1e-12);
    }

    /// A catch-up must be repaid CATCH_UP_MARGIN times over the horizon.
    #[test]
    fn short_catch_ups_set_no_row_price() {
        // 4 positions behind, +5 ms over plain: the drafter's fixed cost, not a price per row
        assert_eq!(catch_up_row_price(4, 5e-3, 3e-3), None);
        assert!(!starts_from_far(4));
        // a prompt's catch-up: the larger of the step's excess and the drafter's time
        let p = catch_up_row_price(48, 12e-3, 15e-3).unwrap();
        assert!((p - 15e-3 / 48.0).abs() < 1e-15);
        assert_eq!(catch_up_row_price(16, 8e-3, 0.0), Some(0.5e-3));
        assert!(starts_from_far(16) && starts_from_far(200));
    }

    #[test]
    fn catch_up_needs_its_margin() {
        // 100 positions at 0.1 ms: 10 ms; 0.1 ms saved per committed token
        let (lag, per_row, saved) = (100, 1e-4, 1e-4);
        let cost = lag as f64 * per_row;
        let repaid = |h: usize| saved * h as f64 / cost;
        assert!(repaid(150) > 1.0 && repaid(150) < CATCH_UP_MARGIN);
        assert!(!catch_up_pays(lag, per_row, saved, 150));
        assert!(repaid(210) > CATCH_UP_MARGIN);
        assert!(catch_up_pays(lag, per_row, saved, 210));
    }

    #[test]
    fn horizon_follows_finished_lengths() {
        let mut l = Lengths::default();
        // no history: as many as generated so far, at least a quarter of what may still come
        // and at least 32, capped by max_tokens
        assert_eq!(l.horizon(0, 256), 64);
        assert_eq!(l.horizon(0, 100), 32);
        assert_eq!(l.horizon(0, 4000), 1000);
        assert_eq!(l.horizon(100, 256), 100);
        assert_eq!(l.horizon(100, 40), 40);
        for n in [40, 50, 60, 70, 80, 90, 100, 110] {
            l.record(n);
        }
        // the median remaining length of those that got past it
        assert_eq!(l.horizon(0, 256), 80); // 40..110: remaining of the 5th of 8 sorted
        assert_eq!(l.horizon(65, 256), 25); // 70..110 -> 5, 15, 25, 35, 45: median 25
                                            // past all but three of eight finished requests: the tail guess
        assert_eq!(l.horizon(85, 256), Lengths::TAIL);
        assert_eq!(l.horizon(200, 256), Lengths::TAIL);
        // only the last 64 count
        for _ in 0..64 {
            l.record(1000);
        }
        assert_eq!(l.horizon(200, 2000), 800);
    }

    #[test]
    fn expected_tokens_formula() {
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
        assert!((expected_tokens(0.0, 5) - 1.0).abs() < 1e-12);
    }
}

//! The adaptive policy's cost model: a fitted line for the drafter's forward and the target's
//! step cost by batch class (what a plain step costs, what a drafted token adds).

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
/// its own; its draft price starts from a prior of [`draft_prior_share`] x the request's share
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
    plain: [LinearCost; crate::spec::guard::CLASSES],
    draft: [DraftPrice; crate::spec::guard::CLASSES],
}

/// Through-origin fit of a drafting step's time beyond the plain line: (sum x y, sum x x) with
/// the same forgetting as [`LinearCost`].
#[derive(Clone, Copy, Debug, Default)]
struct DraftPrice {
    sxy: f64,
    sxx: f64,
}

impl DraftPrice {
    /// One drafting step whose `drafts` drafted tokens took `extra_secs` beyond the plain line,
    /// which the caller bounds to [0, a request's share per drafted token]. Below zero is noise
    /// by construction — drafted tokens are more work in the same step, they never make it
    /// faster — and at batch 16 noise is most of a small drafting step (plain steps vary by +-3
    /// ms, a drafted token costs ~1.3 ms on AMD EPYC Zen 4): one MTP step timed below the plain
    /// line pulled the class's price to 0.0-0.36 ms, its group test then passed, and the MTP
    /// layer drafted at a loss (0.965x of plain, traced in docs/BENCHMARKS.md "A roofline with
    /// FLOPs"). Counted as zero it still weighs its drafted tokens towards a low price, but not
    /// below nothing.
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
/// widened target's drafted token measured there. Half a share was tried at every batch: it kept
/// the model drafters from drafting often enough at batch 4 to learn their real price
/// (draft-weak adaptive 1.01-1.04x where fixed k = 1 gave 1.21-1.28x; a quarter: 1.05-1.07x).
/// Batches of 9 or more start from [`DRAFT_PRIOR_SHARE_LARGE`] instead.
pub const DRAFT_PRIOR_SHARE: f64 = 0.25;
/// The prior share of batch classes 9-16 and 17+: half a share. There a drafted token is one
/// more token through products that every token's multiply-adds already keep busy, so it costs
/// about what a request's own token does, less the weights it shares: measured 0.5-0.65 of a
/// share at batch 16 on AMD EPYC Zen 4 (traced steps), ~0.55 on Zen 3 (the fixed k = 1 rows'
/// step costs, docs/BENCHMARKS.md "An AVX2-only CPU"). A quarter of a share there let a class
/// price drafting at half its cost until measured otherwise — the MTP layer's group test passed
/// on such a price and drafted at a loss at batch 16.
pub const DRAFT_PRIOR_SHARE_LARGE: f64 = 0.5;

/// The prior share ([`DRAFT_PRIOR_SHARE`] or [`DRAFT_PRIOR_SHARE_LARGE`]) of a step of `requests`
/// decode requests: by batch class, as the price it seeds is kept (classes 9-16 and 17+ large).
pub fn draft_prior_share(requests: usize) -> f64 {
    use crate::spec::guard::class_of;
    if class_of(requests) >= class_of(9) {
        DRAFT_PRIOR_SHARE_LARGE
    } else {
        DRAFT_PRIOR_SHARE
    }
}
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
        let c = crate::spec::guard::class_of(requests);
        let drafts = tokens.saturating_sub(requests);
        if drafts == 0 {
            self.plain_all.observe(requests, seconds);
            self.plain[c].observe(requests, seconds);
        } else if let Some(p) = self.plain_at(requests) {
            // At most a request's share per drafted token (see [`DRAFT_MAX_SHARE`]), and never
            // less than nothing (see [`DraftPrice::observe`]).
            let cap = DRAFT_MAX_SHARE * drafts as f64 * p / requests.max(1) as f64;
            // (min then max, not clamp: a plain line extrapolated below zero gives a negative
            // cap, which must count as zero, not panic)
            self.draft[c].observe(drafts, (seconds - p).min(cap).max(0.0));
        }
    }

    /// Predicted seconds of a plain step of `requests` decode requests: the class's line, or,
    /// while its plain steps had one batch size (always so for batches 1 and 2), their mean
    /// moved along the all-classes slope — for fewer requests than that mean, never below their
    /// proportional part of it.
    pub fn plain_at(&self, requests: usize) -> Option<f64> {
        let c = &self.plain[crate::spec::guard::class_of(requests)];
        if c.has_slope() {
            return c.predict(requests);
        }
        let Some((mx, my)) = c.mean_point() else {
            return self.plain_all.predict(requests);
        };
        let slope = self.plain_all.fit().map_or(0.0, |f| f.1);
        let moved = my + slope * (requests as f64 - mx);
        // A smaller batch costs at least its requests' part of the mean step (the fixed part
        // of a step does not shrink with the batch): a steep all-classes slope moved below that
        // — below zero even, where batch-32 steps priced a batch 9 from batch 16's mean — is
        // not this class's cost.
        let x = requests as f64;
        Some(if x < mx {
            moved.max(my * x / mx)
        } else {
            moved
        })
    }

    /// The price of drafting in a step of `requests` decode requests: its plain share, and per
    /// drafted token the class's measured price, drawn towards [`draft_prior_share`] x share
    /// while its drafting steps are few. None before any plain step was timed.
    pub fn price(&self, requests: usize) -> Option<StepPrice> {
        let b = requests.max(1);
        let share = self.plain_at(b)? / b as f64;
        let prior = draft_prior_share(b) * share;
        Some(StepPrice {
            share,
            per_draft: self.draft[crate::spec::guard::class_of(b)].per_draft(prior),
        })
    }

    /// Whether decode steps of two token counts have been timed (the policy is informed).
    pub fn has_slope(&self) -> bool {
        self.tokens.has_slope()
    }
}

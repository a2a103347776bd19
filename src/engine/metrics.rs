//! Operator metrics: every request counter aggregated per workload label, per draft
//! generation and (under an A/B drafter) per arm (`arm="a"` / `"b"`), step-latency and time-per-output-token histograms, and the Prometheus text
//! exposition (`Engine::metrics_text`, C `specmla_engine_metrics`).
//!
//! Where it sits: `Core` owns one `Metrics`. After every step (and when a request retires) each
//! live request's counter growth since its last report is added to the bucket of (its label,
//! the draft generation serving now) — so a swap mid-request splits its counters between the
//! generations that produced them, and the buckets always sum to the engine totals of the
//! requests reported so far.
//!
//! Guarantees: metric families are stable names in the vLLM spelling users know
//! (`specmla_spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
//! `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`) plus
//! token, budget, KV, preemption and swap families; label values are escaped as the text format
//! requires; the output is deterministic (buckets in sorted order).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::kv::KvStats;
use crate::spec::Counters;

/// Longest workload label a request may carry (bytes).
pub const MAX_LABEL_BYTES: usize = 64;

/// A cumulative histogram with fixed upper bounds (seconds).
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// counts[i]: observations <= bounds[i] (not cumulative; rendered cumulatively).
    counts: Vec<u64>,
    /// Observations above the last bound.
    over: u64,
    sum: f64,
}

const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            over: 0,
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        match self.bounds.iter().position(|&b| v <= b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
        self.sum += v;
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut acc = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count()
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count());
    }
}

/// Counter growth of `now` over `before` (every field of `now` >= `before`'s).
pub fn delta(now: &Counters, before: &Counters) -> Counters {
    let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
        a.iter()
            .enumerate()
            .map(|(i, x)| x - b.get(i).copied().unwrap_or(0))
            .collect()
    };
    Counters {
        prompt_tokens: now.prompt_tokens - before.prompt_tokens,
        cached_prompt_tokens: now.cached_prompt_tokens - before.cached_prompt_tokens,
        reasoning_tokens: now.reasoning_tokens - before.reasoning_tokens,
        answer_tokens: now.answer_tokens - before.answer_tokens,
        drafted_tokens: now.drafted_tokens - before.drafted_tokens,
        accepted_tokens: now.accepted_tokens - before.accepted_tokens,
        recovered_tokens: now.recovered_tokens - before.recovered_tokens,
        bonus_tokens: now.bonus_tokens - before.bonus_tokens,
        forced_end_of_think: now.forced_end_of_think - before.forced_end_of_think,
        forced_tokens: now.forced_tokens - before.forced_tokens,
        draft_steps: now.draft_steps - before.draft_steps,
        draft_tokens_saved: now.draft_tokens_saved - before.draft_tokens_saved,
        accepted_per_position: sub(&now.accepted_per_position, &before.accepted_per_position),
        drafted_per_position: sub(&now.drafted_per_position, &before.drafted_per_position),
        preemptions: now.preemptions - before.preemptions,
    }
}

/// A bucket's key: (workload label, draft generation, A/B arm — "" without an A/B drafter).
pub type BucketKey = (String, u64, String);

/// The engine's metric state.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// (label, draft generation, arm) -> counters reported so far.
    pub buckets: BTreeMap<BucketKey, Counters>,
    pub step_latency: Histogram,
    /// Per (label, arm): seconds per output token of finished requests.
    pub tpot: BTreeMap<(String, String), Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            buckets: BTreeMap::new(),
            step_latency: Histogram::new(LATENCY_BOUNDS),
            tpot: BTreeMap::new(),
        }
    }
}

impl Metrics {
    /// Add a request's counter growth to (label, generation, arm).
    pub fn add(&mut self, label: &str, generation: u64, arm: &str, d: &Counters) {
        self.buckets
            .entry((label.to_string(), generation, arm.to_string()))
            .or_default()
            .add(d);
    }

    pub fn observe_tpot(&mut self, label: &str, arm: &str, seconds: f64) {
        self.tpot
            .entry((label.to_string(), arm.to_string()))
            .or_insert_with(|| Histogram::new(LATENCY_BOUNDS))
            .observe(seconds);
    }

    /// Every bucket summed (equals the engine totals of the reported requests).
    pub fn total(&self) -> Counters {
        let mut t = Counters::default();
        for c in self.buckets.values() {
            t.add(c);
        }
        t
    }
}

/// Escape a label value for the text format (`\`, `"`, newline).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `,arm="..."` for an A/B arm's series; nothing for "" (no A/B drafter).
fn arm_label(a: &str) -> String {
    if a.is_empty() {
        String::new()
    } else {
        format!(",arm=\"{}\"", escape(a))
    }
}

/// What the exposition needs beyond `Metrics`.
pub struct Snapshot<'a> {
    pub metrics: &'a Metrics,
    pub kv: &'a KvStats,
    pub draft_kv: Option<&'a KvStats>,
    pub running: usize,
    pub waiting: usize,
    pub draft_generation: u64,
    pub swaps_applied: u64,
    pub swaps_failed: u64,
    pub panics_contained: u64,
}

type Field = fn(&Counters) -> u64;

/// Render the Prometheus text exposition (format 0.0.4).
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let counters: [(&str, &str, Field); 14] = [
        (
            "spec_decode_num_drafts_total",
            "Verification rounds that carried at least one draft token.",
            |c| c.draft_steps,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            "Draft tokens proposed (forced end-of-think tokens excluded).",
            |c| c.drafted_tokens,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "Draft tokens the target accepted.",
            |c| c.accepted_tokens,
        ),
        (
            "spec_decode_num_recovered_tokens_total",
            "Tokens the target chose where it rejected a draft.",
            |c| c.recovered_tokens,
        ),
        (
            "spec_decode_num_bonus_tokens_total",
            "Tokens after a fully accepted draft.",
            |c| c.bonus_tokens,
        ),
        (
            "spec_decode_draft_tokens_saved_total",
            "Draft positions not spent because the thinking budget clipped the lookahead.",
            |c| c.draft_tokens_saved,
        ),
        (
            "prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            |c| c.prompt_tokens,
        ),
        (
            "prompt_tokens_cached_total",
            "Prompt tokens served from the prefix cache.",
            |c| c.cached_prompt_tokens,
        ),
        (
            "reasoning_tokens_total",
            "Committed reasoning (thinking) tokens.",
            |c| c.reasoning_tokens,
        ),
        ("answer_tokens_total", "Committed answer tokens.", |c| {
            c.answer_tokens
        }),
        (
            "forced_tokens_total",
            "End-of-think tokens forced by the reasoning budget.",
            |c| c.forced_tokens,
        ),
        (
            "forced_end_of_think_total",
            "Requests whose end of thinking the budget forced.",
            |c| c.forced_end_of_think,
        ),
        (
            "preemptions_total",
            "Times a request's KV was freed for recompute.",
            |c| c.preemptions,
        ),
        (
            "generation_tokens_total",
            "Committed generated tokens (reasoning + answer + forced).",
            |c| c.reasoning_tokens + c.answer_tokens + c.forced_tokens,
        ),
    ];
    let key = |(l, g, a): &BucketKey| {
        format!(
            "label=\"{}\",draft_generation=\"{g}\"{}",
            escape(l),
            arm_label(a)
        )
    };
    for (name, help, f) in counters {
        let _ = writeln!(out, "# HELP specmla_{name} {help}");
        let _ = writeln!(out, "# TYPE specmla_{name} counter");
        for (k, c) in &s.metrics.buckets {
            let _ = writeln!(out, "specmla_{name}{{{}}} {}", key(k), f(c));
        }
    }
    for (name, help, pick) in [
        (
            "spec_decode_num_accepted_tokens_per_pos_total",
            "Draft tokens accepted at each draft position (0-based).",
            true,
        ),
        (
            "spec_decode_num_draft_tokens_per_pos_total",
            "Draft tokens proposed at each draft position (0-based).",
            false,
        ),
    ] {
        let _ = writeln!(out, "# HELP specmla_{name} {help}");
        let _ = writeln!(out, "# TYPE specmla_{name} counter");
        for (k, c) in &s.metrics.buckets {
            let v = if pick {
                &c.accepted_per_position
            } else {
                &c.drafted_per_position
            };
            for (p, n) in v.iter().enumerate() {
                let _ = writeln!(out, "specmla_{name}{{{},position=\"{p}\"}} {n}", key(k));
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP specmla_step_latency_seconds Wall time of engine steps that ran a forward."
    );
    let _ = writeln!(out, "# TYPE specmla_step_latency_seconds histogram");
    s.metrics
        .step_latency
        .render(&mut out, "specmla_step_latency_seconds", "");
    let _ = writeln!(out, "# HELP specmla_time_per_output_token_seconds Per finished request: (last token - first token) / (generated - 1).");
    let _ = writeln!(
        out,
        "# TYPE specmla_time_per_output_token_seconds histogram"
    );
    for ((l, a), h) in &s.metrics.tpot {
        h.render(
            &mut out,
            "specmla_time_per_output_token_seconds",
            &format!("label=\"{}\"{}", escape(l), arm_label(a)),
        );
    }
    let _ = writeln!(
        out,
        "# HELP specmla_kv_blocks KV cache blocks per pool and state."
    );
    let _ = writeln!(out, "# TYPE specmla_kv_blocks gauge");
    let mut pools: Vec<(&str, &KvStats)> = vec![("target", s.kv)];
    pools.extend(s.draft_kv.map(|d| ("draft", d)));
    for (pool, st) in pools {
        for (state, n) in [
            ("used", st.used_blocks),
            ("free", st.free_blocks),
            ("cached", st.cached_blocks),
        ] {
            let _ = writeln!(
                out,
                "specmla_kv_blocks{{pool=\"{pool}\",state=\"{state}\"}} {n}"
            );
        }
        if st.window_blocks > 0 {
            let used = st.window_blocks - st.window_free_blocks - st.window_cached_blocks;
            for (state, n) in [
                ("used", used),
                ("free", st.window_free_blocks),
                ("cached", st.window_cached_blocks),
            ] {
                let _ = writeln!(
                    out,
                    "specmla_kv_blocks{{pool=\"{pool}_window\",state=\"{state}\"}} {n}"
                );
            }
        }
    }
    if let Some(t) = &s.kv.tier {
        let fams: [Family<'_>; 4] = [
            (
                "kv_tier_blocks_total",
                "counter",
                "Second KV tier: blocks offloaded (pool evictions), restored (prefix hits), dropped (no room), persisted (written through to the file).",
                "event",
                vec![
                    ("offloaded", t.offloaded_blocks),
                    ("restored", t.restored_blocks),
                    ("dropped", t.dropped_blocks),
                    ("persisted", t.persisted_blocks),
                ],
            ),
            (
                "kv_tier_bytes_total",
                "counter",
                "Second KV tier: bytes offloaded and restored.",
                "event",
                vec![("offloaded", t.offloaded_bytes), ("restored", t.restored_bytes)],
            ),
            (
                "kv_tier_resident_blocks",
                "gauge",
                "Second KV tier: blocks held in host memory and in the file.",
                "tier",
                vec![("memory", t.mem_blocks), ("disk", t.disk_blocks)],
            ),
            (
                "kv_tier_rejected_total",
                "counter",
                "Second KV tier: files ignored (another model or layout, bad header) and records rejected (truncated, corrupt).",
                "what",
                vec![("file", t.ignored_files), ("record", t.rejected_records)],
            ),
        ];
        for (name, kind, help, label, vals) in fams {
            let _ = writeln!(out, "# HELP specmla_{name} {help}");
            let _ = writeln!(out, "# TYPE specmla_{name} {kind}");
            for (k, v) in vals {
                let _ = writeln!(out, "specmla_{name}{{{label}=\"{k}\"}} {v}");
            }
        }
    }
    for (name, help, v) in [
        ("requests_running", "Requests running.", s.running as u64),
        (
            "requests_waiting",
            "Requests waiting (new or preempted).",
            s.waiting as u64,
        ),
        (
            "draft_generation",
            "Generation of the drafter serving now (each installed swap adds one).",
            s.draft_generation,
        ),
    ] {
        let _ = writeln!(out, "# HELP specmla_{name} {help}");
        let _ = writeln!(out, "# TYPE specmla_{name} gauge");
        let _ = writeln!(out, "specmla_{name} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP specmla_draft_swaps_total Draft swaps by outcome."
    );
    let _ = writeln!(out, "# TYPE specmla_draft_swaps_total counter");
    let _ = writeln!(
        out,
        "specmla_draft_swaps_total{{outcome=\"applied\"}} {}",
        s.swaps_applied
    );
    let _ = writeln!(
        out,
        "specmla_draft_swaps_total{{outcome=\"failed\"}} {}",
        s.swaps_failed
    );
    let _ = writeln!(
        out,
        "# HELP specmla_panics_contained_total Panics inside a step that were contained."
    );
    let _ = writeln!(out, "# TYPE specmla_panics_contained_total counter");
    let _ = writeln!(out, "specmla_panics_contained_total {}", s.panics_contained);
    out
}

/// One metric family of the exposition: name, type, help, label name, (label value, sample) pairs.
type Family<'a> = (&'a str, &'a str, &'a str, &'a str, Vec<(&'a str, u64)>);

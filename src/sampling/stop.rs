//! Stop strings over streamed text. Sits after `tokenizer::StreamDecoder`: each text delta of a
//! request passes through a [`StopMatcher`] before it reaches the caller.
//!
//! Guarantees:
//! - Text that could still be the start of a stop string is held back, so no part of a stop string
//!   is ever emitted; everything else is released at once.
//! - When a stop string appears the output is cut just before it and `stopped` is set; later
//!   pushes emit nothing.
//! - The result does not depend on how the text is split into deltas: among all occurrences the
//!   one that ends first in the text wins (then the one that starts first, i.e. the longest), which
//!   is also the first a character-by-character stream would see.
//! - All cuts are on UTF-8 character boundaries (the held suffix is a prefix of a stop string).

/// What a push releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopResult {
    /// Text that may be shown to the caller now.
    pub emit: String,
    /// A stop string matched; the stream is over (the match itself is not in `emit`).
    pub stopped: bool,
}

/// Incremental stop-string matcher for one output stream.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>, // non-empty stop strings
    held: String,       // text not yet released: a suffix that is a proper prefix of some stop
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored; `SamplingParams::validate`
    /// rejects them).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// True once a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that matched, if any.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feed the next text delta.
    pub fn push(&mut self, delta: &str) -> StopResult {
        if self.matched.is_some() {
            return StopResult {
                emit: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(delta);
        // Earliest end, then earliest start. Only the held suffix plus the new delta is searched:
        // a match wholly inside earlier text would have been found by an earlier push.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, stop index)
        for (k, s) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(s.as_str()) {
                let cand = (start + s.len(), start, k);
                if best.is_none_or(|b| (cand.0, cand.1) < (b.0, b.1)) {
                    best = Some(cand);
                }
            }
        }
        if let Some((_, start, k)) = best {
            self.matched = Some(k);
            let emit = self.held[..start].to_string();
            self.held.clear();
            return StopResult {
                emit,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopResult {
            emit,
            stopped: false,
        }
    }

    /// End of stream: release whatever was held back (empty after a stop).
    pub fn finish(&mut self) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of some stop.
    fn partial_suffix_len(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for (idx, _) in s.char_indices().skip(1) {
                // s[..idx] is a proper, non-empty prefix ending on a char boundary.
                if idx > best && self.held.ends_with(&s[..idx]) {
                    best = idx;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Feed deltas; return (all emitted text, stopped).
    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut sm = m(stops);
        let mut out = String::new();
        for d in deltas {
            let r = sm.push(d);
            out.push_str(&r.emit);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&sm.finish());
        (out, false)
    }

    #[test]
    fn holds_back_partial_and_releases_on_mismatch() {
        let mut sm = m(&["STOP"]);
        assert_eq!(
            sm.push("hello ST"),
            StopResult {
                emit: "hello ".into(),
                stopped: false
            }
        );
        assert_eq!(
            sm.push("A"),
            StopResult {
                emit: "STA".into(),
                stopped: false
            }
        );
        assert_eq!(
            sm.push("rt S"),
            StopResult {
                emit: "rt ".into(),
                stopped: false
            }
        );
        assert_eq!(sm.finish(), "S");
    }

    #[test]
    fn match_across_deltas_cuts_before_stop() {
        assert_eq!(
            run(&["</s>"], &["abc<", "/", "s", ">tail"]),
            ("abc".into(), true)
        );
        assert_eq!(run(&["</s>"], &["abc</s>tail"]), ("abc".into(), true));
        let mut sm = m(&["x"]);
        assert!(sm.push("ax").stopped);
        assert_eq!(sm.matched_stop(), Some("x"));
        assert_eq!(
            sm.push("more"),
            StopResult {
                emit: String::new(),
                stopped: true
            }
        );
        assert_eq!(sm.finish(), "");
    }

    #[test]
    fn overlapping_stops_earliest_end_wins_regardless_of_split() {
        // "bc" ends (at 3) before "abcd" (at 4) would: cut at 1.
        assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".into(), true));
        assert_eq!(
            run(&["abcd", "bc"], &["a", "b", "c", "d"]),
            ("a".into(), true)
        );
        // Same end: the earlier start (longer stop) wins.
        assert_eq!(run(&["cd", "bcd"], &["abcde"]), ("a".into(), true));
        // Self-overlapping stop: "aab" inside "aaab".
        assert_eq!(run(&["aab"], &["a", "a", "a", "b"]), ("a".into(), true));
    }

    #[test]
    fn multibyte_chars() {
        assert_eq!(
            run(&["🌍!"], &["héllo ", "🌍", "!", "x"]),
            ("héllo ".into(), true)
        );
        let mut sm = m(&["éé"]);
        assert_eq!(sm.push("aé").emit, "a");
        assert_eq!(sm.push("b").emit, "éb");
        assert_eq!(run(&["日本"], &["日日", "本語"]), ("日".into(), true));
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut sm = m(&[""]);
        assert_eq!(sm.push("abc").emit, "abc");
        assert_eq!(sm.finish(), "");
    }

    #[test]
    fn split_independence_exhaustive() {
        // Every 2-way and 3-way split of a text gives the same result as one delta.
        let stops = ["aba", "bab", "ca", "🌍x"];
        let text = "cbxab🌍🌍xaba";
        let whole = run(&stops, &[text]);
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            for &j in bounds.iter().filter(|&&j| j >= i) {
                let got = run(&stops, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
        assert_eq!(whole, ("cbxab🌍".to_string(), true));
    }
}

//! Prompt-lookup / n-gram proposer (no weights): finds the most recent earlier occurrence of the
//! context's last n tokens (n from `max_n` down to `min_n`) and proposes the tokens that followed.
//! Good for agent loops and edits that repeat text. Its q is one-hot (no distribution).

/// Propose up to `k` tokens continuing `context`.
pub fn ngram_propose(context: &[u32], k: usize, min_n: usize, max_n: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let len = context.len();
    for n in (min_n.max(1)..=max_n).rev() {
        if len <= n {
            continue;
        }
        let suffix = &context[len - n..];
        // most recent earlier match that has at least one following token
        for start in (0..len - n).rev() {
            if &context[start..start + n] == suffix {
                let from = start + n;
                let to = (from + k).min(len);
                if to > from {
                    return context[from..to].to_vec();
                }
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_most_recent_longest_match() {
        let ctx = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3];
        // suffix [1,2,3] occurs at 0 -> proposes 4, 9, 2
        assert_eq!(ngram_propose(&ctx, 3, 1, 3), vec![4, 9, 2]);
        // with max_n = 2, suffix [2,3] most recent earlier occurrence at 5 -> 5, 6
        assert_eq!(ngram_propose(&ctx, 2, 1, 2), vec![5, 6]);
        assert!(ngram_propose(&[1, 2, 3], 4, 1, 3).is_empty());
        assert!(ngram_propose(&ctx, 0, 1, 3).is_empty());
    }
}

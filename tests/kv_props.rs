//! Property tests of the paged KV cache with several cache groups (the MLA latent and an index-key
//! group with its own layer count and dtype): random operation sequences over several sequences
//! (grow + write + set_len, speculative rollback, truncate, free, match_prefix, register_prefix,
//! reset_prefix_cache) keep the block-accounting invariants and the data every sequence reads in
//! every group.
//!
//! Model: a sequence's slot content is a pure function of (layer, its token prefix), as real KV
//! is, so a block shared through the prefix cache must read back exactly what the sharer itself
//! would have written. Values are small integers, exact in f32, bf16 and f16.

use proptest::prelude::*;
use specmla::kv::{KvCache, KvConfig, KvDtype, KvGroupSpec, KvKind, SeqKv};
use specmla::Error;

const LAYERS: usize = 2;
const R: usize = 6; // kv_lora_rank
const P: usize = 2; // rope_dim
const W: usize = R + P;
const IX_LAYERS: usize = 3; // index-key group: another layer count
const D: usize = 5; // index_head_dim
const BS: usize = 4;
const NB: usize = 12;
const SLOTS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// Start a sequence in an empty slot: prompt = base[b] + suffix, matched against the cache.
    New {
        slot: usize,
        base: usize,
        suffix: Vec<u32>,
        max_tokens: usize,
    },
    /// Grow by `n` tokens (write, set_len), then keep only `accept` of them (rejected drafts).
    Step {
        slot: usize,
        n: usize,
        accept: usize,
        tok: u32,
    },
    Truncate {
        slot: usize,
        back: usize,
    },
    Free {
        slot: usize,
    },
    Register {
        slot: usize,
        upto: usize,
    },
    Reset {
        salt: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SLOTS, 0..3usize, prop::collection::vec(0..3u32, 0..6), 0..30usize)
            .prop_map(|(slot, base, suffix, max_tokens)| Op::New { slot, base, suffix, max_tokens }),
        4 => (0..SLOTS, 1..9usize, 0..9usize, 0..3u32).prop_map(|(slot, n, a, tok)| Op::Step { slot, n, accept: a.min(n), tok }),
        2 => (0..SLOTS, 0..10usize).prop_map(|(slot, back)| Op::Truncate { slot, back }),
        1 => (0..SLOTS).prop_map(|slot| Op::Free { slot }),
        3 => (0..SLOTS, 0..40usize).prop_map(|(slot, upto)| Op::Register { slot, upto }),
        1 => any::<u64>().prop_map(|salt| Op::Reset { salt }),
    ]
}

fn base_prompt(b: usize) -> Vec<u32> {
    // Three prompts sharing a first block, two sharing two blocks.
    match b {
        0 => vec![1, 2, 0, 1, 2, 2, 0, 0, 1, 1],
        1 => vec![1, 2, 0, 1, 2, 2, 0, 0, 2, 0, 1, 2, 1],
        _ => vec![1, 2, 0, 1, 0, 0, 0],
    }
}

/// Slot content of `layer` for the last token of `prefix`: `[c_kv | k_pe]`, integers in 0..256.
fn content(layer: usize, prefix: &[u32]) -> [f32; W] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ layer as u64;
    for &t in prefix {
        h = (h ^ (t as u64 + 1)).wrapping_mul(0x100_0000_01b3);
    }
    let mut out = [0f32; W];
    for (i, o) in out.iter_mut().enumerate() {
        *o = ((h >> (i * 7)) & 0xff) as f32;
    }
    out
}

/// Index-key content of `layer` for the last token of `prefix` (another hash than `content`).
fn index_content(layer: usize, prefix: &[u32]) -> [f32; D] {
    let c = content(layer + 100, prefix);
    let mut out = [0f32; D];
    out.copy_from_slice(&c[..D]);
    out
}

struct Live {
    seq: SeqKv,
    /// Tokens of the sequence; `[0, seq.len())` are committed, the rest is the intended future.
    toks: Vec<u32>,
}

fn write_range(c: &mut KvCache, l: &Live, start: usize, end: usize) {
    for pos in start..end {
        for layer in 0..LAYERS {
            let v = content(layer, &l.toks[..=pos]);
            c.write_slot(layer, &l.seq, pos, &v[..R], &v[R..]);
        }
        for layer in 0..IX_LAYERS {
            let v = index_content(layer, &l.toks[..=pos]);
            c.write_entry(1, layer, &l.seq, pos, &[&v]);
        }
    }
}

/// Both groups of `a` and `b` over positions [0, n), equal.
fn same_data(c: &KvCache, a: &SeqKv, b: &SeqKv, n: usize) -> Result<(), TestCaseError> {
    for layer in 0..LAYERS {
        let mut x = vec![0f32; n * W];
        let mut y = vec![0f32; n * W];
        c.read_range(layer, a, 0, n, &mut x);
        c.read_range(layer, b, 0, n, &mut y);
        prop_assert_eq!(x, y);
    }
    for layer in 0..IX_LAYERS {
        let mut x = vec![0f32; n * D];
        let mut y = vec![0f32; n * D];
        c.read_group_range(1, layer, a, 0, n, &mut x);
        c.read_group_range(1, layer, b, 0, n, &mut y);
        prop_assert_eq!(x, y);
    }
    Ok(())
}

fn check_data(c: &KvCache, live: &[Option<Live>]) -> Result<(), TestCaseError> {
    for l in live.iter().flatten() {
        let n = l.seq.len();
        for layer in 0..LAYERS {
            let mut out = vec![0f32; n * W]; // [len, kv_lora_rank + rope_dim]
            c.read_range(layer, &l.seq, 0, n, &mut out);
            for pos in 0..n {
                let want = content(layer, &l.toks[..=pos]);
                prop_assert_eq!(
                    &out[pos * W..(pos + 1) * W],
                    &want[..],
                    "layer {} pos {} of {:?}",
                    layer,
                    pos,
                    l.seq
                );
            }
        }
        for layer in 0..IX_LAYERS {
            let mut out = vec![0f32; n * D]; // [len, index_head_dim]
            c.read_group_range(1, layer, &l.seq, 0, n, &mut out);
            for pos in 0..n {
                let want = index_content(layer, &l.toks[..=pos]);
                prop_assert_eq!(
                    &out[pos * D..(pos + 1) * D],
                    &want[..],
                    "index layer {} pos {}",
                    layer,
                    pos
                );
            }
            // gathered rows (the sparse attention path) read the same values
            let picks: Vec<u32> = (0..n as u32)
                .rev()
                .step_by(2)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let mut g = vec![0f32; picks.len() * D];
            c.read_rows(1, layer, &l.seq, &picks, &mut g);
            for (i, &p) in picks.iter().enumerate() {
                prop_assert_eq!(
                    &g[i * D..(i + 1) * D],
                    &out[p as usize * D..(p as usize + 1) * D]
                );
            }
        }
    }
    Ok(())
}

fn check_all(c: &KvCache, live: &[Option<Live>]) -> Result<(), TestCaseError> {
    let seqs: Vec<&SeqKv> = live.iter().flatten().map(|l| &l.seq).collect();
    if let Err(e) = c.check_invariants(&seqs) {
        return Err(TestCaseError::fail(e));
    }
    let st = c.stats();
    prop_assert_eq!(st.free_blocks + st.cached_blocks + st.used_blocks, NB);
    let distinct: std::collections::BTreeSet<u32> = seqs
        .iter()
        .flat_map(|s| s.blocks().iter().copied())
        .collect();
    prop_assert_eq!(st.used_blocks, distinct.len());
    for &b in &distinct {
        let holders = seqs
            .iter()
            .map(|s| s.blocks().iter().filter(|&&x| x == b).count())
            .sum::<usize>();
        prop_assert_eq!(c.block_refcount(b) as usize, holders);
    }
    check_data(c, live)
}

fn run(dtype: KvDtype, index_dtype: KvDtype, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let cfg = KvConfig {
        block_size: BS,
        num_blocks: NB,
        groups: vec![
            KvGroupSpec {
                kind: KvKind::MlaLatent {
                    kv_lora_rank: R,
                    rope_dim: P,
                },
                num_layers: LAYERS,
                dtype,
            },
            KvGroupSpec {
                kind: KvKind::IndexKey { head_dim: D },
                num_layers: IX_LAYERS,
                dtype: index_dtype,
            },
        ],
        window: None,
        window_blocks: 0,
    };
    let mut c = KvCache::new(cfg).unwrap();
    let st = c.stats();
    prop_assert_eq!(st.groups.len(), 2);
    prop_assert_eq!(
        st.total_bytes,
        NB * BS * (LAYERS * W * dtype.elem_bytes() + IX_LAYERS * D * index_dtype.elem_bytes())
    );
    prop_assert_eq!(
        st.groups[0].total_bytes + st.groups[1].total_bytes,
        st.total_bytes
    );
    let mut live: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    for op in ops {
        match op {
            Op::New {
                slot,
                base,
                suffix,
                max_tokens,
            } => {
                if live[slot].is_some() {
                    continue;
                }
                let mut toks = base_prompt(base);
                toks.extend(suffix);
                let before = c.stats();
                let seq = c.match_prefix(&toks, max_tokens);
                prop_assert_eq!(seq.len() % BS, 0);
                prop_assert!(seq.len() <= max_tokens.min(toks.len()));
                prop_assert_eq!(seq.blocks().len() * BS, seq.len());
                let st = c.stats();
                prop_assert_eq!(
                    st.prefix_hit_tokens - before.prefix_hit_tokens,
                    seq.len() as u64
                );
                prop_assert_eq!(
                    st.prefix_query_tokens - before.prefix_query_tokens,
                    toks.len() as u64
                );
                live[slot] = Some(Live { seq, toks });
            }
            Op::Step {
                slot,
                n,
                accept,
                tok,
            } => {
                let Some(l) = live[slot].as_mut() else {
                    continue;
                };
                let len = l.seq.len();
                let new_len = len + n;
                let before = c.stats();
                match c.plan_grow(&l.seq, new_len) {
                    Err(Error::KvExhausted(_)) => {
                        prop_assert_eq!(&c.stats(), &before, "failed plan must not mutate");
                        let need = c.blocks_for(new_len).saturating_sub(l.seq.blocks().len());
                        prop_assert!(
                            need > before.free_blocks + before.cached_blocks
                                || !c.can_ever_fit(new_len)
                        );
                        continue;
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
                    Ok(plan) => {
                        prop_assert_eq!(&c.stats(), &before, "plan must not mutate");
                        c.commit_grow(&mut l.seq, plan);
                    }
                }
                prop_assert_eq!(
                    l.seq.blocks().len(),
                    c.blocks_for(new_len).max(c.blocks_for(len))
                );
                l.toks.truncate(len.max(l.toks.len().min(new_len)));
                while l.toks.len() < new_len {
                    let t = (tok + l.toks.len() as u32) % 3;
                    l.toks.push(t);
                }
                write_range(&mut c, l, len, new_len);
                c.set_len(&mut l.seq, new_len);
                check_all(&c, &live)?;
                let l = live[slot].as_mut().unwrap();
                c.truncate(&mut l.seq, len + accept);
                l.toks.truncate(l.seq.len());
            }
            Op::Truncate { slot, back } => {
                let Some(l) = live[slot].as_mut() else {
                    continue;
                };
                let target = l.seq.len().saturating_sub(back);
                let old_blocks = l.seq.blocks().len();
                c.truncate(&mut l.seq, target);
                let kept = c.blocks_for(l.seq.len());
                if l.seq.len() == target {
                    prop_assert_eq!(l.seq.blocks().len(), old_blocks.min(c.blocks_for(target)));
                } else {
                    // copy-on-write of a shared partial block found no block: rounded down
                    prop_assert_eq!(l.seq.len() % BS, 0);
                    prop_assert_eq!(l.seq.blocks().len(), kept);
                }
                l.toks.truncate(l.seq.len());
            }
            Op::Free { slot } => {
                if let Some(mut l) = live[slot].take() {
                    c.free(&mut l.seq);
                    prop_assert!(l.seq.blocks().is_empty());
                    c.free(&mut l.seq); // second free is a no-op
                }
            }
            Op::Register { slot, upto } => {
                let Some(l) = live[slot].as_ref() else {
                    continue;
                };
                let upto = upto.min(l.seq.len());
                c.register_prefix(&l.seq, &l.toks[..upto]);
                // the registered prefix now matches (at least the full blocks of this sequence,
                // unless a pre-existing equal prefix lives in other blocks: same data either way)
                let mut probe = c.match_prefix(&l.toks[..upto], usize::MAX);
                prop_assert_eq!(probe.len(), upto / BS * BS);
                same_data(&c, &probe, &l.seq, probe.len())?;
                c.free(&mut probe);
            }
            Op::Reset { salt } => {
                c.reset_prefix_cache(salt);
                prop_assert_eq!(c.stats().cached_blocks, 0);
            }
        }
        check_all(&c, &live)?;
    }
    for l in live.iter_mut().flatten() {
        c.free(&mut l.seq);
    }
    if let Err(e) = c.check_invariants(&[]) {
        return Err(TestCaseError::fail(e));
    }
    let st = c.stats();
    prop_assert_eq!(st.free_blocks + st.cached_blocks, NB, "no leak");
    prop_assert_eq!(st.used_blocks, 0);
    c.reset_prefix_cache(7);
    prop_assert_eq!(c.stats().free_blocks, NB);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_keep_invariants_f32(ops in prop::collection::vec(op(), 1..60)) {
        run(KvDtype::F32, KvDtype::F32, ops)?;
    }

    #[test]
    fn random_ops_keep_invariants_bf16_f16(ops in prop::collection::vec(op(), 1..40), half in any::<bool>()) {
        let (latent, index) = if half { (KvDtype::F16, KvDtype::F32) } else { (KvDtype::Bf16, KvDtype::F16) };
        run(latent, index, ops)?;
    }
}

//! Unit tests of the `KvCache` API (dtype and allocator details are tested beside their code).

use super::*;
use crate::error::Error;

fn cfg(dtype: KvDtype, num_blocks: usize) -> KvConfig {
    KvConfig::latent_only(2, 8, 4, 4, num_blocks, dtype)
}

/// Deterministic slot content for (layer, tag, pos): `c_kv: [8]`, `k_pe: [4]`.
fn slot(layer: usize, tag: u32, pos: usize) -> (Vec<f32>, Vec<f32>) {
    let base = (layer * 1000 + tag as usize * 100 + pos) as f32;
    (
        (0..8).map(|i| base + i as f32 * 0.5).collect(),
        (0..4).map(|i| -base - i as f32).collect(),
    )
}

fn grow(c: &mut KvCache, s: &mut SeqKv, n: usize) {
    let p = c.plan_grow(s, n).unwrap();
    c.commit_grow(s, p);
}

/// Grow `s` to `n` tokens, write slots [s.len(), n) for every layer, commit the length.
fn fill(c: &mut KvCache, s: &mut SeqKv, n: usize, tag: u32) {
    grow(c, s, n);
    for pos in s.len()..n {
        for l in 0..2 {
            let (a, b) = slot(l, tag, pos);
            c.write_slot(l, s, pos, &a, &b);
        }
    }
    c.set_len(s, n);
}

fn read(c: &KvCache, s: &SeqKv, layer: usize, start: usize, end: usize) -> Vec<f32> {
    let mut out = vec![0f32; (end - start) * 12]; // [end - start, kv_lora_rank + rope_dim]
    c.read_range(layer, s, start, end, &mut out);
    out
}

#[test]
fn new_rejects_bad_config() {
    let mut c = cfg(KvDtype::F32, 4);
    c.block_size = 0;
    assert!(
        matches!(KvCache::new(c).unwrap_err(), Error::Config { field, .. } if field == "block_size")
    );
    let mut c = cfg(KvDtype::F32, 4);
    c.num_blocks = usize::MAX / 2;
    assert!(matches!(KvCache::new(c).unwrap_err(), Error::Config { .. }));
}

#[test]
fn bytes_per_token_per_layer_each_dtype() {
    for (d, want) in [
        (KvDtype::F32, 12 * 4),
        (KvDtype::Bf16, 24),
        (KvDtype::F16, 24),
        (KvDtype::Fp8E4M3, 12 + 8),
    ] {
        let c = KvCache::new(cfg(d, 4)).unwrap();
        assert_eq!(c.bytes_per_token_per_layer(), want, "{d:?}");
        assert_eq!(c.stats().total_bytes, want * 2 * 4 * 4);
    }
    let v3 = KvConfig::latent_only(61, 512, 64, 64, 1, KvDtype::Fp8E4M3);
    assert_eq!(
        KvCache::new(v3).unwrap().bytes_per_token_per_layer(),
        512 + 64 + 4 * 5
    );
}

#[test]
fn plan_is_pure_and_exhaustion_is_clean() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 3)).unwrap();
    let mut s = SeqKv::new();
    let before = c.stats();
    let p = c.plan_grow(&s, 9).unwrap();
    assert_eq!((p.new_blocks(), p.target_len()), (3, 9));
    assert_eq!(c.stats(), before, "plan does not mutate");
    assert!(s.blocks().is_empty());
    assert!(
        matches!(c.plan_grow(&s, 13), Err(Error::KvExhausted(_))),
        "can never fit"
    );
    assert!(!c.can_ever_fit(13) && c.can_ever_fit(12));
    c.commit_grow(&mut s, p);
    assert_eq!(s.blocks(), &[0, 1, 2]);
    let mut t = SeqKv::new();
    let e = c.plan_grow(&t, 1).unwrap_err();
    assert!(
        matches!(&e, Error::KvExhausted(m) if m.contains("0 free")),
        "{e}"
    );
    assert_eq!(
        c.plan_grow(&s, 12).unwrap().new_blocks(),
        0,
        "capacity already suffices"
    );
    c.free(&mut s);
    grow(&mut c, &mut t, 1);
    assert_eq!(c.stats().used_blocks, 1);
    c.free(&mut t);
    c.free(&mut t); // no-op, not a double free
    assert_eq!(c.stats().free_blocks, 3);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn write_read_across_blocks_each_dtype() {
    for d in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
        let mut c = KvCache::new(cfg(d, 8)).unwrap();
        let mut s = SeqKv::new();
        fill(&mut c, &mut s, 10, 1);
        for l in 0..2 {
            let got = read(&c, &s, l, 3, 10);
            for (k, pos) in (3..10).enumerate() {
                let (a, b) = slot(l, 1, pos);
                let want: Vec<f32> = a.into_iter().chain(b).collect();
                for (x, y) in want.iter().zip(&got[k * 12..(k + 1) * 12]) {
                    let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let tol = match d {
                        KvDtype::F32 => 0.0,
                        KvDtype::Bf16 => x.abs() / 256.0,
                        KvDtype::F16 => x.abs() / 2048.0,
                        KvDtype::Fp8E4M3 => amax / 16.0,
                    };
                    assert!(
                        (x - y).abs() <= tol,
                        "{d:?} layer {l} pos {pos}: {x} vs {y}"
                    );
                }
            }
        }
    }
}

#[test]
fn truncate_frees_blocks_past_new_len() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 8)).unwrap();
    let mut s = SeqKv::new();
    fill(&mut c, &mut s, 14, 1); // 4 blocks
    let before = read(&c, &s, 0, 0, 5);
    c.truncate(&mut s, 5);
    assert_eq!((s.len(), s.blocks().len()), (5, 2));
    assert_eq!(c.stats().free_blocks, 6);
    assert_eq!(read(&c, &s, 0, 0, 5), before, "kept data intact");
    c.truncate(&mut s, 7); // larger than len: len unchanged, capacity ceil(7/4) = 2 kept
    assert_eq!((s.len(), s.blocks().len()), (5, 2));
    c.check_invariants(&[&s]).unwrap();
}

#[test]
fn prefix_match_shares_blocks_and_counts_hits() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 8)).unwrap();
    let prompt: Vec<u32> = (100..110).collect(); // 10 tokens: 2 full blocks
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 10, 1);
    c.register_prefix(&a, &prompt);
    let mut b = c.match_prefix(&prompt, usize::MAX);
    assert_eq!(b.len(), 8);
    assert_eq!(b.blocks(), &a.blocks()[..2]);
    assert_eq!(c.block_refcount(a.blocks()[0]), 2);
    assert_eq!(read(&c, &b, 1, 0, 8), read(&c, &a, 1, 0, 8));
    let st = c.stats();
    assert_eq!((st.prefix_hit_tokens, st.prefix_query_tokens), (8, 10));
    // max_tokens caps the match; a different first token misses entirely
    let mut m = c.match_prefix(&prompt, 7);
    assert_eq!(m.len(), 4);
    let mut other = prompt.clone();
    other[0] = 1;
    let mut z = c.match_prefix(&other, usize::MAX);
    assert_eq!(z.len(), 0);
    // a different block 1 only matches block 0
    let mut other = prompt.clone();
    other[5] = 1;
    let mut y = c.match_prefix(&other, usize::MAX);
    assert_eq!(y.len(), 4);
    c.check_invariants(&[&a, &b, &m, &z, &y]).unwrap();
    for s in [&mut a, &mut b, &mut m, &mut z, &mut y] {
        c.free(s);
    }
    let st = c.stats();
    assert_eq!(
        (st.cached_blocks, st.free_blocks),
        (2, 6),
        "registered blocks stay cached"
    );
    let mut again = c.match_prefix(&prompt, usize::MAX);
    assert_eq!(again.len(), 8, "cached blocks match after release");
    let (x, _) = slot(0, 1, 4);
    assert_eq!(&read(&c, &again, 0, 4, 5)[..8], &x[..]);
    c.free(&mut again);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn a_shortened_prefix_hit_is_counted_once() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 8)).unwrap();
    let prompt: Vec<u32> = (100..110).collect(); // 10 tokens: 2 full blocks of 4
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 10, 1);
    c.register_prefix(&a, &prompt);
    let mut b = c.match_prefix(&prompt, usize::MAX);
    assert_eq!(b.len(), 8);
    // the caller could use only 6 tokens: the hit shrinks to one block, counted as such
    c.shorten_prefix_hit(&mut b, &prompt, 6);
    assert_eq!(b.len(), 4);
    assert_eq!(b.blocks(), &a.blocks()[..1]);
    assert_eq!(
        c.block_refcount(a.blocks()[1]),
        1,
        "the second block went back"
    );
    let st = c.stats();
    assert_eq!((st.prefix_hit_tokens, st.prefix_query_tokens), (4, 10));
    // none usable: no hit left, the query still counted once
    c.shorten_prefix_hit(&mut b, &prompt, 0);
    assert_eq!(b.len(), 0);
    let st = c.stats();
    assert_eq!((st.prefix_hit_tokens, st.prefix_query_tokens), (0, 10));
    c.check_invariants(&[&a, &b]).unwrap();
    c.free(&mut a);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn prefix_match_verifies_tokens_and_parent() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 8)).unwrap();
    let p1: Vec<u32> = (0..8).collect();
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 8, 1);
    c.register_prefix(&a, &p1);
    // Forge a collision: register block X under the key a different prompt's second block would
    // have, but with wrong tokens; the match must verify and refuse it.
    let p2: Vec<u32> = vec![0, 1, 2, 3, 9, 9, 9, 9];
    let h0 = c.prefix.hash(None, &p2[..4]);
    let h1 = c.prefix.hash(Some(h0), &p2[4..]);
    let mut x = SeqKv::new();
    fill(&mut c, &mut x, 4, 2);
    let xb = x.blocks()[0];
    let parent = Some((a.blocks()[0], c.prefix.generation(a.blocks()[0])));
    c.prefix.insert(xb, h1, parent, &[7, 7, 7, 7]); // stored tokens differ from p2's block
    let mut m = c.match_prefix(&p2, usize::MAX);
    assert_eq!(m.len(), 4, "token mismatch rejected");
    c.free(&mut m);
    // Right tokens but a wrong parent (block x itself) are rejected too.
    c.prefix.remove(xb);
    c.prefix
        .insert(xb, h1, Some((xb, c.prefix.generation(xb))), &p2[4..]);
    let mut m = c.match_prefix(&p2, usize::MAX);
    assert_eq!(m.len(), 4, "parent mismatch rejected");
    c.free(&mut m);
    c.prefix.remove(xb);
    c.free(&mut x);
    c.free(&mut a);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn lru_eviction_order() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 4)).unwrap();
    let mut seqs = Vec::new();
    for t in 0..4u32 {
        let toks: Vec<u32> = (0..4).map(|i| t * 10 + i).collect();
        let mut s = SeqKv::new();
        fill(&mut c, &mut s, 4, t);
        c.register_prefix(&s, &toks);
        seqs.push((s, toks));
    }
    // release in order 2, 0, 3, 1 -> LRU order of their blocks
    for &i in &[2usize, 0, 3, 1] {
        c.free(&mut seqs[i].0);
    }
    assert_eq!(c.evictable_blocks(), vec![2, 0, 3, 1]);
    // re-use of prompt 0 makes it most recently used once released again
    let mut r = c.match_prefix(&seqs[0].1, usize::MAX);
    assert_eq!(r.blocks(), &[0]);
    c.free(&mut r);
    assert_eq!(c.evictable_blocks(), vec![2, 3, 1, 0]);
    let mut n = SeqKv::new();
    grow(&mut c, &mut n, 8); // evicts 2 then 3
    assert_eq!(n.blocks(), &[2, 3]);
    assert_eq!(c.stats().evictions, 2);
    assert_eq!(
        c.match_prefix(&seqs[2].1, usize::MAX).len(),
        0,
        "evicted prefix no longer matches"
    );
    let mut hit = c.match_prefix(&seqs[1].1, usize::MAX);
    assert_eq!(hit.len(), 4);
    c.free(&mut hit);
    c.free(&mut n);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn unregistered_parent_orphans_children() {
    // Block 0 loses its identity (sole holder truncates into it) and is registered again with the
    // same tokens: the old child entry (block 1) recorded the old generation, so it never chains on.
    let mut c = KvCache::new(cfg(KvDtype::F32, 4)).unwrap();
    let p: Vec<u32> = (0..8).collect();
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 8, 1);
    c.register_prefix(&a, &p);
    let (b0, b1) = (a.blocks()[0], a.blocks()[1]);
    c.truncate(&mut a, 2);
    assert!(c.block_is_cached(b1) && !c.block_is_cached(b0));
    fill(&mut c, &mut a, 4, 1);
    c.register_prefix(&a, &p[..4]);
    assert!(c.block_is_cached(b0));
    let mut m = c.match_prefix(&p, usize::MAX);
    assert_eq!(
        m.blocks(),
        &[b0],
        "stale child not chained onto the re-registered parent"
    );
    c.free(&mut m);
    c.free(&mut a);
    c.check_invariants(&[]).unwrap();
}

#[test]
fn re_registering_relinks_an_orphaned_prefix() {
    // a registers block 0; b (same tokens, its own blocks) registers 8 tokens: its block 1 is
    // chained under a's block 0. a truncates into its block 0 (un-registered: b's child is now an
    // orphan). b registering its 8 tokens again must make all 8 matchable: its block 0 takes the
    // first key and its orphaned block 1 is relinked under it (found by a property test).
    let mut c = KvCache::new(cfg(KvDtype::F32, 8)).unwrap();
    let p: Vec<u32> = (0..8).collect();
    let (mut a, mut b) = (SeqKv::new(), SeqKv::new());
    fill(&mut c, &mut a, 5, 1);
    c.register_prefix(&a, &p[..4]);
    fill(&mut c, &mut b, 8, 1);
    c.register_prefix(&b, &p);
    c.truncate(&mut a, 3);
    let mut m = c.match_prefix(&p, usize::MAX);
    assert_eq!(m.len(), 0, "a's block 0 lost its identity: nothing matches");
    c.free(&mut m);
    c.register_prefix(&b, &p);
    let mut m = c.match_prefix(&p, usize::MAX);
    assert_eq!(m.blocks(), b.blocks(), "both of b's blocks match again");
    assert_eq!(read(&c, &m, 1, 0, 8), read(&c, &b, 1, 0, 8));
    c.free(&mut m);
    c.check_invariants(&[&a, &b]).unwrap();
    // an orphan held by nobody is dropped (its block freed) when another block takes its key
    c.free(&mut b);
    c.free(&mut a);
    c.reset_prefix_cache(7);
    fill(&mut c, &mut a, 5, 1);
    c.register_prefix(&a, &p[..4]);
    fill(&mut c, &mut b, 8, 1);
    c.register_prefix(&b, &p);
    let orphan = b.blocks()[1];
    c.free(&mut b);
    c.truncate(&mut a, 3);
    assert!(c.block_is_cached(orphan), "evictable, unreachable");
    let mut d = SeqKv::new();
    fill(&mut c, &mut d, 8, 1);
    c.register_prefix(&d, &p);
    assert!(
        !c.block_is_cached(orphan),
        "the orphan gave its key to d's block"
    );
    let mut m = c.match_prefix(&p, usize::MAX);
    assert_eq!(m.blocks(), d.blocks());
    c.free(&mut m);
    c.free(&mut d);
    c.free(&mut a);
    assert_eq!(
        c.stats().cached_blocks,
        2,
        "d's two blocks, nothing stranded"
    );
    c.check_invariants(&[]).unwrap();
}

#[test]
fn reset_prefix_cache_drops_everything() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 4)).unwrap();
    let p: Vec<u32> = (0..8).collect();
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 8, 1);
    c.register_prefix(&a, &p);
    let mut b = SeqKv::new();
    fill(&mut c, &mut b, 4, 2);
    c.register_prefix(&b, &[50, 51, 52, 53]);
    c.free(&mut b); // b's block evictable
    assert_eq!(c.stats().cached_blocks, 1);
    c.reset_prefix_cache(42);
    let st = c.stats();
    assert_eq!(
        (st.cached_blocks, st.free_blocks, st.used_blocks),
        (0, 2, 2)
    );
    assert!(
        !c.block_is_cached(a.blocks()[0]),
        "in-use blocks are un-registered too"
    );
    assert_eq!(c.match_prefix(&p, usize::MAX).len(), 0);
    // re-registering under the new salt works and matches
    c.register_prefix(&a, &p);
    let mut m = c.match_prefix(&p, usize::MAX);
    assert_eq!(m.len(), 8);
    c.free(&mut m);
    c.free(&mut a);
    c.check_invariants(&[]).unwrap();
    assert_eq!(c.stats().free_blocks + c.stats().cached_blocks, 4);
}

#[test]
fn truncate_into_shared_block_copies_on_write() {
    let mut c = KvCache::new(cfg(KvDtype::F32, 4)).unwrap();
    let p: Vec<u32> = (0..8).collect();
    let mut a = SeqKv::new();
    fill(&mut c, &mut a, 8, 1);
    c.register_prefix(&a, &p);
    let mut b = c.match_prefix(&p, usize::MAX);
    let shared = b.blocks()[1];
    c.truncate(&mut b, 6);
    assert_ne!(
        b.blocks()[1],
        shared,
        "partial shared block replaced by a private copy"
    );
    assert_eq!(c.block_refcount(shared), 1);
    assert_eq!(read(&c, &b, 0, 0, 6), read(&c, &a, 0, 0, 6));
    grow(&mut c, &mut b, 8);
    let (x, y) = slot(0, 9, 6);
    c.write_slot(0, &b, 6, &x, &y); // allowed: private now
    assert_eq!(read(&c, &a, 0, 6, 7), {
        let (x, y) = slot(0, 1, 6);
        x.into_iter().chain(y).collect::<Vec<_>>()
    });
    // sole holder truncating into its registered block: un-registers instead of copying
    let blk = a.blocks()[1];
    c.truncate(&mut a, 5);
    assert_eq!(a.blocks()[1], blk);
    assert!(!c.block_is_cached(blk));
    c.check_invariants(&[&a, &b]).unwrap();
    assert_eq!(c.match_prefix(&p, usize::MAX).len(), 4);
}

/// Throughput of the attention read path at DeepSeek-V3 shapes (512 + 64, block 64). Best of
/// several repetitions (the machine may be shared). Run:
/// `cargo test --lib kv::tests::read_range_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "timing; prints numbers"]
fn read_range_throughput() {
    use std::hint::black_box;
    use std::time::Instant;
    fn best(reps: usize, mut f: impl FnMut()) -> f64 {
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    }
    let tokens = 4096;
    for d in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
        let cfg = KvConfig::latent_only(1, 512, 64, 64, 64, d);
        let mut c = KvCache::new(cfg).unwrap();
        let mut s = SeqKv::new();
        grow(&mut c, &mut s, tokens);
        let a: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect(); // [kv_lora_rank]
        let b: Vec<f32> = (0..64).map(|i| (i as f32 * 0.11).cos()).collect(); // [rope_dim]
        let w = best(5, || {
            for pos in 0..tokens {
                c.write_slot(0, &s, pos, black_box(&a), &b);
            }
        });
        c.set_len(&mut s, tokens);
        let mut out = vec![0f32; tokens * 576]; // [tokens, kv_lora_rank + rope_dim]
        let r = best(30, || c.read_range(0, &s, 0, tokens, black_box(&mut out)));
        // memcpy baseline: the same f32 output volume copied from a warm f32 buffer
        let src = out.clone();
        let mut dst = vec![0f32; out.len()];
        let m = best(30, || dst.copy_from_slice(black_box(&src)));
        black_box(&dst);
        let stored = (tokens * c.bytes_per_token_per_layer()) as f64;
        println!(
            "{:>9}: read {tokens} slots {:.3} ms ({:.1} GB/s stored in, {:.1} GB/s f32 out, {:.2}x the time of a memcpy of the output); write {:.0} ns/slot",
            d.name(),
            r * 1e3,
            stored / r / 1e9,
            (tokens * 576 * 4) as f64 / r / 1e9,
            r / m,
            w / tokens as f64 * 1e9
        );
    }
}

#[test]
fn a_pool_larger_than_the_machine_is_refused_not_aborted() {
    // 2^32 - 1 blocks of 16 tokens x 576 f32 x 61 layers: ~9 PB.
    let huge = KvConfig::latent_only(61, 512, 64, 16, u32::MAX as usize, KvDtype::F32);
    let err = KvCache::new(huge).expect_err("refused");
    assert!(err.to_string().contains("num_blocks"), "{err}");
}

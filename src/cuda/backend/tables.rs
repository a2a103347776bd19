//! Host-side tables the device kernels read: RoPE cos / sin of a forward's positions (computed by
//! the CPU's `Rope`, so both backends rotate by the same values) and the attention's addressing
//! from the host block tables.

use crate::error::{Error, Result};
use crate::model::rope::Rope;
use crate::model::SeqChunk;

/// cos / sin of every rotary pair at each position, times the cos/sin factor, exactly as
/// `Rope::apply` uses them (read back from rotating the unit pair (1, 0)). -> ([n, rope / 2] x 2)
pub(crate) fn rope_tables(rope: &Rope, pos: &[usize], rdim: usize) -> (Vec<f32>, Vec<f32>) {
    let half = rdim / 2;
    let (mut cos, mut sin) = (vec![0f32; pos.len() * half], vec![0f32; pos.len() * half]);
    let mut e = vec![0f32; rdim]; // [rope]
    for (t, &p) in pos.iter().enumerate() {
        for i in 0..half {
            e.fill(0.0);
            e[2 * i] = 1.0;
            rope.apply(&mut e, p);
            cos[t * half + i] = e[2 * i];
            sin[t * half + i] = e[2 * i + 1];
        }
    }
    (cos, sin)
}

/// (slots [n], q_seq [n], table [n_seqs, max_blocks], max_blocks): see [`seq_tables`].
type SeqTables = (Vec<i64>, Vec<i32>, Vec<i32>, usize);

/// The device attention's addressing from the host block tables: every new token's cache slot
/// (block * block_size + offset), its sequence (chunk) index, and the padded block table.
/// -> (slots [n], q_seq [n], table [n_seqs, max_blocks], max_blocks)
pub(crate) fn seq_tables(chunks: &[SeqChunk], bs: usize) -> Result<SeqTables> {
    let max_blocks = chunks
        .iter()
        .map(|c| c.kv.blocks().len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut table = vec![0i32; chunks.len() * max_blocks]; // [n_seqs, max_blocks]
    let (mut slots, mut q_seq) = (Vec::new(), Vec::new());
    for (si, ch) in chunks.iter().enumerate() {
        let blocks = ch.kv.blocks();
        for (j, &b) in blocks.iter().enumerate() {
            table[si * max_blocks + j] = b as i32;
        }
        for i in 0..ch.tokens.len() {
            let p = ch.start + i;
            let b = *blocks.get(p / bs).ok_or_else(|| {
                Error::Engine(format!(
                    "CUDA backend: position {p} has no reserved KV block"
                ))
            })?;
            slots.push((b as usize * bs + p % bs) as i64);
            q_seq.push(si as i32);
        }
    }
    Ok((slots, q_seq, table, max_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::kv::{KvCache, KvConfig, KvDtype, SeqKv};
    use crate::model::LogitsMode;

    fn target_config() -> ModelConfig {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/models/target/config.json");
        ModelConfig::from_json_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    /// The kernel's rotation (kernels/rope.cu) with the host tables is the CPU's `Rope::apply`.
    #[test]
    fn rope_tables_reproduce_the_cpu_rotation() {
        let cfg = target_config();
        let rope = Rope::new(&cfg);
        let rdim = cfg.qk_rope_head_dim;
        let pos = [0usize, 1, 7, 63, 200];
        let (cos, sin) = rope_tables(&rope, &pos, rdim);
        for (t, &p) in pos.iter().enumerate() {
            let x: Vec<f32> = (0..rdim)
                .map(|i| ((i * 37 + t * 11) % 19) as f32 / 7.0 - 1.3)
                .collect();
            let mut want = x.clone();
            rope.apply(&mut want, p);
            let half = rdim / 2;
            for i in 0..half {
                let (c, s) = (cos[t * half + i], sin[t * half + i]);
                let (a, b) = (x[2 * i], x[2 * i + 1]);
                let (g0, g1) = (a * c - b * s, a * s + b * c); // the kernel's expressions
                assert!(
                    (g0 - want[2 * i]).abs() <= 1e-6 && (g1 - want[2 * i + 1]).abs() <= 1e-6,
                    "pos {p} pair {i}"
                );
            }
        }
    }

    /// Slots follow the host table (block * block_size + offset) for every new token of every
    /// chunk; each token knows its sequence; the table is padded per sequence.
    #[test]
    fn seq_tables_address_the_host_blocks() {
        let cfg = target_config();
        let bs = 4;
        let mut kv = KvCache::new(KvConfig::for_model(&cfg, bs, 16, KvDtype::Bf16)).unwrap();
        let (mut a, mut b) = (SeqKv::new(), SeqKv::new());
        let p = kv.plan_grow(&a, 3).unwrap();
        kv.commit_grow(&mut a, p);
        let p = kv.plan_grow(&b, 9).unwrap();
        kv.commit_grow(&mut b, p);
        let p = kv.plan_grow(&a, 10).unwrap(); // a's blocks interleave with b's
        kv.commit_grow(&mut a, p);
        let (ta, tb) = ([5u32; 7], [6u32; 2]);
        let chunks = [
            SeqChunk {
                kv: &a,
                start: 3,
                tokens: &ta,
                mha_until: 0,
                logits: LogitsMode::None,
            },
            SeqChunk {
                kv: &b,
                start: 7,
                tokens: &tb,
                mha_until: 0,
                logits: LogitsMode::None,
            },
        ];
        let (slots, q_seq, table, mb) = seq_tables(&chunks, bs).unwrap();
        assert_eq!(mb, a.blocks().len().max(b.blocks().len()));
        assert_eq!(q_seq, vec![0, 0, 0, 0, 0, 0, 0, 1, 1]);
        for (i, p) in (3..10).enumerate() {
            assert_eq!(slots[i], (a.blocks()[p / bs] as usize * bs + p % bs) as i64);
        }
        for (i, p) in (7..9).enumerate() {
            assert_eq!(
                slots[7 + i],
                (b.blocks()[p / bs] as usize * bs + p % bs) as i64
            );
        }
        assert_eq!(
            &table[..a.blocks().len()],
            &a.blocks().iter().map(|&x| x as i32).collect::<Vec<_>>()[..]
        );
        assert_eq!(
            &table[mb..mb + b.blocks().len()],
            &b.blocks().iter().map(|&x| x as i32).collect::<Vec<_>>()[..]
        );
        // distinct tokens never share a slot
        let mut u = slots.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), slots.len());
        // a position past the reserved blocks is an error, not an out-of-bounds write
        let far = [1u32];
        let bad = [SeqChunk {
            kv: &b,
            start: 40,
            tokens: &far,
            mha_until: 0,
            logits: LogitsMode::None,
        }];
        assert!(seq_tables(&bad, bs).is_err());
    }
}

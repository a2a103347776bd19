//! Reads of `KvCache` for attention and the indexer: runs of entries dequantised into f32
//! (`read_range`, `read_group_range`, `read_rows`, `read_compressed`), or borrowed as stored
//! where the dtype allows (`latent_span`). One contiguous copy or conversion per block run;
//! reads never change the cache.

use super::*;

impl KvCache {
    /// Read compressed entries `[start, end)` of `group` for `seq`, dequantised into
    /// `out: [end - start, width]`.
    pub fn read_compressed(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        start: usize,
        end: usize,
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert_eq!(
            out.len(),
            (end - start) * w,
            "kv: read_compressed out length"
        );
        for (i, e) in (start..end).enumerate() {
            let (_, slot) = self.entry_slot(group, seq, e);
            self.pools[group].read_slots(layer, slot, 1, &mut out[i * w..(i + 1) * w]);
        }
    }

    /// Read latent slots `[start, end)` of `seq` (end <= reserved capacity), dequantised into
    /// `out: [end - start, kv_lora_rank + rope_dim]`. One contiguous copy/convert per block.
    pub fn read_range(&self, layer: usize, seq: &SeqKv, start: usize, end: usize, out: &mut [f32]) {
        self.read_group_range(Self::LATENT, layer, seq, start, end, out);
    }

    /// Read entries `[start, end)` of `group` for `seq`, dequantised into `out: [end - start,
    /// width]`. One contiguous copy/convert per block.
    pub fn read_group_range(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        start: usize,
        end: usize,
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        assert_eq!(out.len(), (end - start) * w, "kv: read_range out length");
        let pool = &self.pools[group];
        self.for_each_run(group, seq, (start, end), |i, slot, n| {
            pool.read_slots(layer, slot, n, &mut out[i * w..(i + n) * w]); // [n, width]
        });
    }

    /// `f(i, slot, n)` for each run of the entries `[start, end)` of `seq` in `group` that lie
    /// in one block: `i` the run's offset from `start`, `slot` its first slot, `n` its length;
    /// in position order.
    fn for_each_run(
        &self,
        group: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let bs = self.cfg.block_size;
        let mut pos = start;
        while pos < end {
            let off = pos % bs;
            let n = (bs - off).min(end - pos);
            f(
                pos - start,
                self.block_at(group, seq, pos).0 as usize * bs + off,
                n,
            );
            pos += n;
        }
    }

    /// The MLA latent entries `[start, end)` of `seq` in place, `[end - start, width]` as
    /// stored, when they sit in consecutive blocks of the pool and the dtype widens exactly
    /// (f32 / bf16 / f16): attention then scores and sums them without a copy. None otherwise
    /// (read them with [`KvCache::read_range`]).
    pub fn latent_span(
        &self,
        layer: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
    ) -> Option<Rows<'_>> {
        let bs = self.cfg.block_size;
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        if start == end {
            return None;
        }
        let first = self.block_at(Self::LATENT, seq, start).0 as usize;
        let last_bi = (end - 1) / bs;
        for (i, bi) in (start / bs..=last_bi).enumerate() {
            if self.block_at(Self::LATENT, seq, bi * bs).0 as usize != first + i {
                return None;
            }
        }
        let slot = first * bs + start % bs;
        self.pools[Self::LATENT].rows(layer, slot, end - start)
    }

    /// Columns `[c0, c1)` of the MLA latent entries `[start, end)` of `seq`, dequantised into
    /// `out: [end - start, c1 - c0]` — each value the same bits as through
    /// [`KvCache::read_range`] (attention's value pass reads only the columns its thread sums).
    pub fn read_range_cols(
        &self,
        layer: usize,
        seq: &SeqKv,
        (start, end): (usize, usize),
        (c0, c1): (usize, usize),
        out: &mut [f32],
    ) {
        let g = &self.cfg.groups[Self::LATENT];
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert!(
            c0 <= c1 && c1 <= g.kind.width(),
            "kv: columns [{c0}, {c1}) beyond the entry"
        );
        assert!(
            start <= end && end <= self.capacity(seq),
            "kv: read [{start}, {end}) beyond capacity"
        );
        let cw = c1 - c0;
        assert_eq!(
            out.len(),
            (end - start) * cw,
            "kv: read_range_cols out length"
        );
        let pool = &self.pools[Self::LATENT];
        self.for_each_run(Self::LATENT, seq, (start, end), |i, slot, n| {
            pool.read_slots_cols(layer, slot, n, (c0, c1), &mut out[i * cw..(i + n) * cw]);
            // [n, cw]
        });
    }

    /// Gather the entries of `group` at `positions` (each < reserved capacity) of `seq`,
    /// dequantised into `out: [positions.len(), width]` in the given order; runs of consecutive
    /// positions inside one block are read with one copy/convert. Each entry decodes to the same
    /// bits as through [`KvCache::read_group_range`].
    pub fn read_rows(
        &self,
        group: usize,
        layer: usize,
        seq: &SeqKv,
        positions: &[u32],
        out: &mut [f32],
    ) {
        let bs = self.cfg.block_size;
        let g = &self.cfg.groups[group];
        let w = g.kind.width();
        assert!(layer < g.num_layers, "kv: layer {layer} out of range");
        assert_eq!(out.len(), positions.len() * w, "kv: read_rows out length");
        let cap = self.capacity(seq);
        let pool = &self.pools[group];
        let mut i = 0;
        while i < positions.len() {
            let p = positions[i] as usize;
            assert!(p < cap, "kv: read at {p} beyond capacity {cap}");
            let off = p % bs;
            // extend the run while positions stay consecutive inside the block
            let mut n = 1;
            while i + n < positions.len() && positions[i + n] as usize == p + n && off + n < bs {
                n += 1;
            }
            let slot = self.block_at(group, seq, p).0 as usize * bs + off;
            pool.read_slots(layer, slot, n, &mut out[i * w..(i + n) * w]); // [n, width]
            i += n;
        }
    }
}

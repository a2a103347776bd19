//! Block storage of one KV cache group: one contiguous buffer per layer, laid out
//! `[num_blocks, block_size, entry]`, where an entry is the group's parts (MLA latent:
//! `[c_kv | k_pe]`; V3.2 index key: `[key]`) in the group's dtype (plus the fp8 scales, see
//! `dtype`).
//!
//! Where it sits: below `KvCache`, which maps (sequence, position) to a global slot index
//! `block * block_size + offset` shared by every group; this file only knows slot indices.
//! `write_entry` quantises one entry; `read_slots` dequantises a run of consecutive slots (always
//! inside one block) into f32.
//!
//! Guarantees: storage is typed per dtype (f32 / u16 bits / bytes) so the hot read path is a plain
//! copy (f32), a shift (bf16), `half`'s bulk conversion (f16) or a table lookup times a scale
//! (fp8); no `unsafe`. Fresh storage is zero-filled (reads of never-written slots give 0.0).

use half::slice::HalfBitsSliceExt;

use super::dtype::{self, fp8_groups, KvDtype};
use super::spec::KvGroupSpec;
use crate::kernels::Rows;

/// One layer's buffer, `[num_blocks * block_size, entry]` in the group's dtype.
#[derive(Debug)]
enum LayerBuf {
    /// `[n_slots, width]` f32 values.
    F32(Vec<f32>),
    /// `[n_slots, width]` bf16 bits.
    Bf16(Vec<u16>),
    /// `[n_slots, width]` f16 bits.
    F16(Vec<u16>),
    /// `[n_slots, entry_bytes]` fp8 bytes: `[part 0 e4m3 | part 1 e4m3 | .. | scales f32 LE]`.
    Fp8(Vec<u8>),
}

/// All layers' storage of one cache group.
#[derive(Debug)]
pub(crate) struct KvPool {
    layers: Vec<LayerBuf>,
    /// Part widths in storage order (fp8 scales are grouped per part).
    parts: Vec<usize>,
    /// Values per entry.
    width: usize,
    /// Stored units per slot: values for f32/bf16/f16, bytes for fp8.
    slot_units: usize,
}

impl KvPool {
    /// Zero-filled storage for `n_slots` entries in each of the group's layers. The caller has
    /// checked that the sizes do not overflow.
    pub(crate) fn new(group: &KvGroupSpec, n_slots: usize) -> Self {
        let parts = group.kind.parts();
        let width = group.kind.width();
        let slot_units = match group.dtype {
            KvDtype::Fp8E4M3 => group.entry_bytes(),
            _ => width,
        };
        let n = n_slots * slot_units;
        let layers = (0..group.num_layers)
            .map(|_| match group.dtype {
                // vec![0; n] uses a zeroed allocation: pages are committed lazily on first write.
                KvDtype::F32 => LayerBuf::F32(vec![0.0; n]),
                KvDtype::Bf16 => LayerBuf::Bf16(vec![0; n]),
                KvDtype::F16 => LayerBuf::F16(vec![0; n]),
                KvDtype::Fp8E4M3 => LayerBuf::Fp8(vec![0; n]),
            })
            .collect();
        KvPool {
            layers,
            parts,
            width,
            slot_units,
        }
    }

    /// Quantise and store one entry, given as its parts (`parts[i]: [part width i]`).
    pub(crate) fn write_entry(&mut self, layer: usize, slot: usize, parts: &[&[f32]]) {
        debug_assert_eq!(parts.len(), self.parts.len());
        let u = self.slot_units;
        let base = slot * u;
        match &mut self.layers[layer] {
            LayerBuf::F32(b) => {
                let mut o = base;
                for p in parts {
                    b[o..o + p.len()].copy_from_slice(p);
                    o += p.len();
                }
            }
            LayerBuf::Bf16(b) => {
                let mut o = base;
                for p in parts {
                    dtype::encode_bf16(p, &mut b[o..o + p.len()]);
                    o += p.len();
                }
            }
            LayerBuf::F16(b) => {
                let mut o = base;
                for p in parts {
                    dtype::encode_f16(p, &mut b[o..o + p.len()]);
                    o += p.len();
                }
            }
            LayerBuf::Fp8(b) => {
                let s = &mut b[base..base + u]; // [entry_bytes]
                let (vals, sc_bytes) = s.split_at_mut(self.width);
                let (mut o, mut g) = (0, 0);
                let mut stack = [0f32; 16];
                let mut heap = Vec::new();
                for p in parts {
                    let ng = fp8_groups(p.len());
                    let scales = scratch(&mut stack, &mut heap, ng); // [n_groups of this part]
                    dtype::encode_fp8(p, &mut vals[o..o + p.len()], scales);
                    for (d, v) in sc_bytes[4 * g..4 * (g + ng)]
                        .chunks_exact_mut(4)
                        .zip(scales.iter())
                    {
                        d.copy_from_slice(&v.to_le_bytes());
                    }
                    o += p.len();
                    g += ng;
                }
            }
        }
    }

    /// Append the stored bytes (little endian) of `n` slots from `slot`, every layer in order,
    /// to `out` (the second KV tier's copy of a block).
    pub(crate) fn copy_out(&self, slot: usize, n: usize, out: &mut Vec<u8>) {
        let u = self.slot_units;
        for l in &self.layers {
            let r = slot * u..(slot + n) * u;
            match l {
                LayerBuf::F32(b) => b[r].iter().for_each(|v| out.extend(v.to_le_bytes())),
                LayerBuf::Bf16(b) | LayerBuf::F16(b) => {
                    b[r].iter().for_each(|v| out.extend(v.to_le_bytes()))
                }
                LayerBuf::Fp8(b) => out.extend_from_slice(&b[r]),
            }
        }
    }

    /// Bytes `copy_out` writes for `n` slots.
    pub(crate) fn copy_len(&self, n: usize) -> usize {
        let unit = match self.layers.first() {
            Some(LayerBuf::F32(_)) => 4,
            Some(LayerBuf::Bf16(_) | LayerBuf::F16(_)) => 2,
            _ => 1,
        };
        self.layers.len() * n * self.slot_units * unit
    }

    /// Store `n` slots from `slot` back from bytes `copy_out` wrote; returns the bytes consumed.
    pub(crate) fn copy_in(&mut self, slot: usize, n: usize, data: &[u8]) -> usize {
        let u = self.slot_units;
        let mut off = 0;
        for l in &mut self.layers {
            let r = slot * u..(slot + n) * u;
            match l {
                LayerBuf::F32(b) => {
                    for (v, c) in b[r].iter_mut().zip(data[off..].chunks_exact(4)) {
                        *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        off += 4;
                    }
                }
                LayerBuf::Bf16(b) | LayerBuf::F16(b) => {
                    for (v, c) in b[r].iter_mut().zip(data[off..].chunks_exact(2)) {
                        *v = u16::from_le_bytes([c[0], c[1]]);
                        off += 2;
                    }
                }
                LayerBuf::Fp8(b) => {
                    let len = r.len();
                    b[r].copy_from_slice(&data[off..off + len]);
                    off += len;
                }
            }
        }
        off
    }

    /// Dequantise `n` consecutive slots starting at `slot` into `out: [n, width]`.
    #[inline]
    pub(crate) fn read_slots(&self, layer: usize, slot: usize, n: usize, out: &mut [f32]) {
        let (w, u) = (self.width, self.slot_units);
        debug_assert_eq!(out.len(), n * w);
        match &self.layers[layer] {
            LayerBuf::F32(b) => out.copy_from_slice(&b[slot * u..(slot + n) * u]),
            LayerBuf::Bf16(b) => dtype::decode_bf16(&b[slot * u..(slot + n) * u], out),
            LayerBuf::F16(b) => dtype::decode_f16(&b[slot * u..(slot + n) * u], out),
            LayerBuf::Fp8(b) => {
                let ng: usize = self.parts.iter().map(|&p| fp8_groups(p)).sum();
                let mut stack = [0f32; 16];
                let mut heap = Vec::new();
                let scales = scratch(&mut stack, &mut heap, ng); // [n_groups]
                let src = &b[slot * u..(slot + n) * u]; // [n, entry_bytes]
                for (s, o) in src.chunks_exact(u).zip(out.chunks_exact_mut(w)) {
                    for (v, c) in scales.iter_mut().zip(s[w..].chunks_exact(4)) {
                        *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                    let (mut off, mut g) = (0, 0);
                    for &p in &self.parts {
                        let ng = fp8_groups(p);
                        dtype::decode_fp8(
                            &s[off..off + p],
                            &scales[g..g + ng],
                            &mut o[off..off + p],
                        );
                        off += p;
                        g += ng;
                    }
                }
            }
        }
    }

    /// `n` consecutive slots from `slot` as stored, `[n, width]`, for the precisions the
    /// kernels widen exactly (f32 / bf16 / f16); None for fp8 (its per-group scales are not a
    /// plain row).
    pub(crate) fn rows(&self, layer: usize, slot: usize, n: usize) -> Option<Rows<'_>> {
        let u = self.slot_units;
        match &self.layers[layer] {
            LayerBuf::F32(b) => Some(Rows::F32(&b[slot * u..(slot + n) * u])),
            LayerBuf::Bf16(b) => Some(Rows::Bf16(&b[slot * u..(slot + n) * u])),
            LayerBuf::F16(b) => Some(Rows::F16(b[slot * u..(slot + n) * u].reinterpret_cast())),
            LayerBuf::Fp8(_) => None,
        }
    }

    /// Columns `[c0, c1)` of `n` consecutive slots starting at `slot` into `out: [n, c1 - c0]`,
    /// each value decoded exactly as by [`KvPool::read_slots`] (fp8: the whole entry is decoded,
    /// its scales being per group, then the columns copied).
    pub(crate) fn read_slots_cols(
        &self,
        layer: usize,
        slot: usize,
        n: usize,
        (c0, c1): (usize, usize),
        out: &mut [f32],
    ) {
        let (w, u) = (self.width, self.slot_units);
        let cw = c1 - c0;
        debug_assert!(c0 <= c1 && c1 <= w);
        debug_assert_eq!(out.len(), n * cw);
        if cw == 0 {
            return;
        }
        match &self.layers[layer] {
            LayerBuf::F32(b) => {
                for (i, o) in out.chunks_exact_mut(cw).enumerate() {
                    let s = (slot + i) * u;
                    o.copy_from_slice(&b[s + c0..s + c1]);
                }
            }
            LayerBuf::Bf16(b) => {
                for (i, o) in out.chunks_exact_mut(cw).enumerate() {
                    let s = (slot + i) * u;
                    dtype::decode_bf16(&b[s + c0..s + c1], o);
                }
            }
            LayerBuf::F16(b) => {
                for (i, o) in out.chunks_exact_mut(cw).enumerate() {
                    let s = (slot + i) * u;
                    dtype::decode_f16(&b[s + c0..s + c1], o);
                }
            }
            LayerBuf::Fp8(_) => {
                let mut row = vec![0f32; w]; // [width]
                for (i, o) in out.chunks_exact_mut(cw).enumerate() {
                    self.read_slots(layer, slot + i, 1, &mut row);
                    o.copy_from_slice(&row[c0..c1]);
                }
            }
        }
    }

    /// Copy `n` slots from `src` to `dst` (slot indices) in every layer (copy-on-write of a block).
    pub(crate) fn copy_slots(&mut self, src: usize, dst: usize, n: usize) {
        let u = self.slot_units;
        for l in &mut self.layers {
            match l {
                LayerBuf::F32(b) => b.copy_within(src * u..(src + n) * u, dst * u),
                LayerBuf::Bf16(b) | LayerBuf::F16(b) => {
                    b.copy_within(src * u..(src + n) * u, dst * u)
                }
                LayerBuf::Fp8(b) => b.copy_within(src * u..(src + n) * u, dst * u),
            }
        }
    }
}

/// A scratch slice of `n` f32: on the stack when small (every real config: <= 16 scale groups).
fn scratch<'a>(stack: &'a mut [f32; 16], heap: &'a mut Vec<f32>, n: usize) -> &'a mut [f32] {
    if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap.resize(n, 0.0);
        heap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_each_dtype() {
        for d in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
            let (r, p) = (200, 24); // two c_kv groups for fp8
            let g = KvGroupSpec {
                kind: crate::kv::KvKind::MlaLatent {
                    kv_lora_rank: r,
                    rope_dim: p,
                },
                num_layers: 2,
                dtype: d,
            };
            let mut pool = KvPool::new(&g, 8);
            let c: Vec<f32> = (0..r).map(|i| (i as f32 - 100.0) / 64.0).collect(); // [kv_lora_rank]
            let k: Vec<f32> = (0..p).map(|i| i as f32 * 0.25).collect(); // [rope_dim]
            pool.write_entry(1, 5, &[&c, &k]);
            let mut out = vec![0f32; 2 * (r + p)]; // [2, kv_lora_rank + rope_dim]
            pool.read_slots(1, 4, 2, &mut out);
            assert!(
                out[..r + p].iter().all(|&v| v == 0.0),
                "{d:?}: neighbour slot untouched"
            );
            assert!(!out[r + p..].iter().all(|&v| v == 0.0));
            let tol = match d {
                KvDtype::F32 => 0.0,
                KvDtype::Bf16 => 1.0 / 128.0,
                KvDtype::F16 => 1.0 / 1024.0,
                KvDtype::Fp8E4M3 => 1.6 / 16.0,
            };
            for (a, b) in c.iter().chain(&k).zip(&out[r + p..]) {
                assert!((a - b).abs() <= tol * a.abs().max(1.0), "{d:?}: {a} vs {b}");
            }
            // layer 0 untouched
            pool.read_slots(0, 5, 1, &mut out[..r + p]);
            assert!(out[..r + p].iter().all(|&v| v == 0.0));
            // copy_slots moves the data in every layer
            pool.copy_slots(5, 7, 1);
            let mut a = vec![0f32; r + p];
            let mut b = vec![0f32; r + p];
            pool.read_slots(1, 5, 1, &mut a);
            pool.read_slots(1, 7, 1, &mut b);
            assert_eq!(a, b);
            // a column range of a run of slots decodes to the same bits as the whole entries
            let mut whole = vec![0f32; 3 * (r + p)]; // [3, width]
            pool.read_slots(1, 5, 3, &mut whole);
            for (c0, c1) in [(0, r), (16, 40), (r - 3, r + p), (7, 7)] {
                let mut cols = vec![0f32; 3 * (c1 - c0)]; // [3, c1 - c0]
                pool.read_slots_cols(1, 5, 3, (c0, c1), &mut cols);
                for i in 0..3 {
                    let want = &whole[i * (r + p) + c0..i * (r + p) + c1];
                    let got = &cols[i * (c1 - c0)..(i + 1) * (c1 - c0)];
                    assert_eq!(
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{d:?} columns {c0}..{c1} of slot {}",
                        5 + i
                    );
                }
            }
        }
    }
}

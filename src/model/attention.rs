//! Multi-head latent attention over the latent paged cache.
//!
//! Projections: q = q_b(rms(q_a(x))) (or q_proj(x)) -> [n, H, nope + rope]; kv_a(x) -> [n, kv_lora + rope]
//! = [c | k_pe]; c = rms(c); RoPE on q_pe and k_pe; the slot [c | k_pe] is written to the cache, and
//! attention then reads every key (the new ones included) back from the cache, so both paths see
//! exactly the cached (possibly quantised) values.
//!
//! Two paths over the same cache, chosen per token from `SeqChunk::mha_until` (sequence-only):
//! - decompressed MHA (prompt tokens): k_nope, v = kv_b_proj(c) for every key; per head
//!   softmax(scale (q_nope.k_nope + q_pe.k_pe)) v.
//! - absorbed (generated tokens): q_lat^h = W_UK^h^T q_nope^h; per head softmax(scale (q_lat.c + q_pe.k_pe));
//!   o^h = W_UV^h (sum_t p_t c_t).
//!
//! V3.2 (DeepSeek Sparse Attention): `indexer::select` gives each token the keys it attends to.
//! A token whose selection is every earlier key takes the dense code above unchanged (so a V3.2
//! model whose `index_topk` covers the context is V3 MLA bit for bit); a sparse MHA row gives the
//! unselected keys probability exactly 0 (the row keeps its order from key 0); a sparse absorbed
//! query gathers only its selected latent rows (`absorbed_sparse`: decode cost ~ index_topk, not
//! the context).
//!
//! Keys are visited in position order 0..=pos for every query, with fixed-order kernels, so a
//! query's output depends only on its own sequence's cache — never on the batch or the chunking.
//! Blocking (not changing any element's order): MHA scores come from one matmul per head and
//! block of 32 queries; absorbed scores of all heads of all queries from one matmul over the
//! latent rows (each row read once per step); the value sums of many rows at once from
//! `kernels::weighted_sum_rows` (each value row read once per block of rows).

use crate::config::ModelConfig;
use crate::kernels::{
    for_each_row, map_indices, matmul, matmul_f32, matmul_many, matmul_rows_serial, rms_norm,
    softmax_inplace, weighted_sum_rows, weighted_sum_rows_acc, worth_parallel, Rows,
};
use crate::kv::{KvCache, SeqKv};

use super::absorbed_by_head::{absorbed_by_head, BY_HEAD_MAX_KEYS};
use super::batch::SeqChunk;
use super::indexer::{self, Selection};
use super::rope::Rope;
use super::weights::Attention;

/// q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says (reference
/// implementations construct them with the default eps).
const LORA_NORM_EPS: f32 = 1e-6;

/// Attention for all tokens of a layer. `xn`: [n, hidden] (normalised input); `pos`: [n] absolute
/// positions; chunks cover the n tokens in order. Returns o_proj output [n, hidden].
#[allow(clippy::too_many_arguments)]
pub(crate) fn mla_attention(
    cfg: &ModelConfig,
    rope: &Rope,
    a: &Attention,
    layer: usize,
    xn: &[f32],
    pos: &[usize],
    chunks: &[SeqChunk],
    kv: &mut KvCache,
) -> Vec<f32> {
    let n = pos.len();
    let nh = cfg.num_attention_heads;
    let (nope, rdim, vdim, kvl) = (
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let qk = nope + rdim;
    let kvd = kvl + rdim;

    // q: [n, H, nope + rope]; ckv: [n, kv_lora + rope] -> slots [c (normalised) | k_pe (roped)].
    // For one token the projections that read xn run as one batched GEMV pass (same bits).
    let mut q = vec![0f32; n * nh * qk];
    let mut ckv = vec![0f32; n * kvd];
    let mut qn = Vec::new(); // [n, q_lora] with q-LoRA (the V3.2 indexer reads it too)
    if let Some((qa, qa_norm, qb)) = &a.q_lora {
        let r = qa.rows;
        let mut qlat = vec![0f32; n * r]; // [n, q_lora]
        if n == 1 {
            matmul_many(vec![
                (qa, xn, &mut qlat[..]),
                (&a.kv_a_proj, xn, &mut ckv[..]),
            ]);
        } else {
            matmul(qa, xn, n, &mut qlat);
            matmul(&a.kv_a_proj, xn, n, &mut ckv);
        }
        qn = vec![0f32; n * r]; // [n, q_lora]
        for t in 0..n {
            rms_norm(
                &qlat[t * r..(t + 1) * r],
                qa_norm,
                LORA_NORM_EPS,
                &mut qn[t * r..(t + 1) * r],
            );
        }
        matmul(qb, &qn, n, &mut q);
    } else if let Some(qp) = &a.q_proj {
        if n == 1 {
            matmul_many(vec![(qp, xn, &mut q[..]), (&a.kv_a_proj, xn, &mut ckv[..])]);
        } else {
            matmul(qp, xn, n, &mut q);
            matmul(&a.kv_a_proj, xn, n, &mut ckv);
        }
    }
    let mut c_norm = vec![0f32; kvl]; // [kv_lora]
    for t in 0..n {
        let row = &mut ckv[t * kvd..(t + 1) * kvd];
        rms_norm(&row[..kvl], &a.kv_a_norm, LORA_NORM_EPS, &mut c_norm);
        row[..kvl].copy_from_slice(&c_norm);
        rope.apply(&mut row[kvl..], pos[t]);
        for h in 0..nh {
            let qh = &mut q[(t * nh + h) * qk..(t * nh + h + 1) * qk];
            rope.apply(&mut qh[nope..], pos[t]);
        }
    }
    // Write the new slots, then read everything back from the cache.
    let mut t0 = 0;
    for ch in chunks {
        for i in 0..ch.tokens.len() {
            let row = &ckv[(t0 + i) * kvd..(t0 + i + 1) * kvd];
            kv.write_slot(layer, ch.kv, ch.start + i, &row[..kvl], &row[kvl..]);
        }
        t0 += ch.tokens.len();
    }
    // V3.2: the keys each token attends to (None: all earlier ones); one selection per token,
    // applied by whichever path the token takes.
    let sels: Vec<Selection> = match (&a.indexer, &cfg.indexer) {
        (Some(w), Some(ix)) => indexer::select(ix, rope, w, layer, xn, &qn, pos, chunks, kv),
        _ => vec![None; n],
    };
    let kv = &*kv;
    let scale = cfg.softmax_scale();

    let mut attn = vec![0f32; n * nh * vdim]; // [n, H, v]
    let mut t0 = 0;
    for ch in chunks {
        let len = ch.tokens.len();
        if len == 0 {
            continue;
        }
        let sel_ch = &sels[t0..t0 + len];
        // Token order in a chunk: MHA (prompt) tokens, then absorbed ones attending to every
        // key, then absorbed ones with a sparse selection (their positions are the largest).
        let n_mha = ch.mha_until.saturating_sub(ch.start).min(len);
        let n_dense = sel_ch[n_mha..].iter().take_while(|s| s.is_none()).count();
        let n_full = n_mha + n_dense; // tokens that read the cache rows 0..start + n_full
        let q_ch = &q[t0 * nh * qk..(t0 + len) * nh * qk]; // [len, H, qk]
        let out_ch = &mut attn[t0 * nh * vdim..(t0 + len) * nh * vdim]; // [len, H, v]
        if n_mha > 0 {
            let keys = ch.start + n_mha; // keys [0, keys) needed by the MHA tokens
            let mut scratch = LatentScratch::take(keys * kvd);
            let cache = scratch.buf(); // [keys, kv_lora + rope]
            kv.read_range(layer, ch.kv, 0, keys, cache);
            mha(
                cfg,
                a,
                scale,
                cache,
                ch.start,
                &q_ch[..n_mha * nh * qk],
                &sel_ch[..n_mha],
                &mut out_ch[..n_mha * nh * vdim],
            );
        }
        if n_dense > 0 {
            absorbed(
                cfg,
                a,
                scale,
                (kv, layer, ch.kv),
                ch.start + n_mha,
                &q_ch[n_mha * nh * qk..n_full * nh * qk],
                &mut out_ch[n_mha * nh * vdim..n_full * nh * vdim],
            );
        }
        if n_full < len {
            let picks: Vec<&[u32]> = sel_ch[n_full..]
                .iter()
                .map(|s| {
                    s.as_deref()
                        .expect("after the dense prefix every token is sparse")
                })
                .collect();
            absorbed_sparse(
                cfg,
                a,
                scale,
                kv,
                layer,
                ch.kv,
                &picks,
                &q_ch[n_full * nh * qk..],
                &mut out_ch[n_full * nh * vdim..],
            );
        }
        t0 += len;
    }
    let mut out = vec![0f32; n * cfg.hidden_size]; // [n, hidden]
    matmul(&a.o_proj, &attn, n, &mut out);
    out
}

thread_local! {
    /// This thread's buffer for the latent rows of the sequence being attended (reused from
    /// layer to layer and step to step: a fresh multi-megabyte allocation per layer costs page
    /// faults that grow with the context).
    static LATENT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A latent-row buffer taken from this thread's [`LATENT`] (or fresh when it is in use) and
/// given back on drop.
pub(super) struct LatentScratch {
    v: Vec<f32>,
    len: usize,
}

impl LatentScratch {
    pub(super) fn take(len: usize) -> Self {
        let mut v = LATENT.with(|c| c.take());
        if v.len() < len {
            v.resize(len, 0.0);
        }
        LatentScratch { v, len }
    }
    /// The first `len` floats (contents unspecified: the caller overwrites them).
    pub(super) fn buf(&mut self) -> &mut [f32] {
        &mut self.v[..self.len]
    }
}

impl Drop for LatentScratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        LATENT.with(|c| c.set(v));
    }
}

/// Queries per MHA task: their scores against the keys come from one matmul (each key row is
/// read once per block instead of once per query).
const MHA_QUERY_BLOCK: usize = 32;

/// Decompressed MHA. `cache`: [keys, kv_lora + rope]; queries q: [m, H, qk] at positions
/// start.. start + m, `sels`: [m] their indexer selections (None: every key); out: [m, H, v]. Per head and block of queries: scores = K_nope Q_nope^T and
/// K_pe Q_pe^T by matmul (each element the fixed-order dot), (s + s_pe) * scale, softmax over
/// keys 0..=p, then the values in key order.
#[allow(clippy::too_many_arguments)]
fn mha(
    cfg: &ModelConfig,
    a: &Attention,
    scale: f32,
    cache: &[f32],
    start: usize,
    q: &[f32],
    sels: &[Selection],
    out: &mut [f32],
) {
    let nh = cfg.num_attention_heads;
    let (nope, rdim, vdim, kvl) = (
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let (qk, kvd) = (nope + rdim, kvl + rdim);
    let keys = cache.len() / kvd;
    let m = q.len() / (nh * qk);
    let mut c = vec![0f32; keys * kvl]; // [keys, kv_lora]
    let mut pe = vec![0f32; keys * rdim]; // [keys, rope]
    for t in 0..keys {
        c[t * kvl..(t + 1) * kvl].copy_from_slice(&cache[t * kvd..t * kvd + kvl]);
        pe[t * rdim..(t + 1) * rdim].copy_from_slice(&cache[t * kvd + kvl..(t + 1) * kvd]);
    }
    let hd = nope + vdim;
    let mut kvb = vec![0f32; keys * nh * hd]; // [keys, H, nope + v]
    matmul(&a.kv_b_proj, &c, keys, &mut kvb);
    drop(c);
    // Per head, contiguous: k_nope [H, keys, nope], v [H, keys, v].
    let mut kn = vec![0f32; nh * keys * nope];
    let mut vv = vec![0f32; nh * keys * vdim];
    for t in 0..keys {
        for h in 0..nh {
            let src = &kvb[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            kn[(h * keys + t) * nope..(h * keys + t + 1) * nope].copy_from_slice(&src[..nope]);
            vv[(h * keys + t) * vdim..(h * keys + t + 1) * vdim].copy_from_slice(&src[nope..]);
        }
    }
    drop(kvb);
    let nqb = m.div_ceil(MHA_QUERY_BLOCK);
    let work = m * nh * keys * (qk + vdim);
    let blocks: Vec<Vec<f32>> = map_indices(nh * nqb, work, |task| {
        let (h, b) = (task / nqb, task % nqb);
        let i0 = b * MHA_QUERY_BLOCK;
        let mb = MHA_QUERY_BLOCK.min(m - i0);
        let kb = start + i0 + mb; // keys 0..kb cover every query of the block
        let mut qn = vec![0f32; mb * nope]; // [mb, nope]
        let mut qp = vec![0f32; mb * rdim]; // [mb, rope]
        for i in 0..mb {
            let qh = &q[((i0 + i) * nh + h) * qk..((i0 + i) * nh + h + 1) * qk];
            qn[i * nope..(i + 1) * nope].copy_from_slice(&qh[..nope]);
            qp[i * rdim..(i + 1) * rdim].copy_from_slice(&qh[nope..]);
        }
        let mut sn = vec![0f32; mb * kb]; // [mb, kb]
        let mut sp = vec![0f32; mb * kb]; // [mb, kb]
        matmul_f32(
            &kn[h * keys * nope..(h * keys + kb) * nope],
            kb,
            nope,
            &qn,
            mb,
            &mut sn,
        );
        matmul_f32(&pe[..kb * rdim], kb, rdim, &qp, mb, &mut sp);
        let lens: Vec<usize> = (0..mb).map(|i| start + i0 + i + 1).collect(); // keys 0..=p
        for (i, &len) in lens.iter().enumerate() {
            let row = &mut sn[i * kb..i * kb + len];
            for (st, spv) in row.iter_mut().zip(&sp[i * kb..i * kb + len]) {
                *st = (*st + *spv) * scale;
            }
            if let Some(sel) = &sels[i0 + i] {
                // Sparse row: keys outside the selection (ascending positions) get probability
                // exactly 0; the row still starts at key 0, so its softmax and value sum keep
                // one order.
                let mut next = sel.iter().copied().peekable();
                for (s, x) in row.iter_mut().enumerate() {
                    if next.peek() == Some(&(s as u32)) {
                        next.next();
                    } else {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            softmax_inplace(row);
        }
        let mut o = vec![0f32; mb * vdim]; // [mb, v]
        weighted_sum_rows(&sn, kb, &lens, &vv[h * keys * vdim..], vdim, vdim, &mut o);
        o
    });
    for (task, o) in blocks.iter().enumerate() {
        let (h, b) = (task / nqb, task % nqb);
        let i0 = b * MHA_QUERY_BLOCK;
        for (i, oi) in o.chunks_exact(vdim).enumerate() {
            out[((i0 + i) * nh + h) * vdim..((i0 + i) * nh + h + 1) * vdim].copy_from_slice(oi);
        }
    }
}

/// q_abs: [m, H, kv_lora + rope] = [W_UK^T q_nope | q_pe] for q: [m, H, qk]. Heads in parallel
/// (each head's matmul alone is too small to split); one token: one batched GEMV pass over all
/// heads.
fn absorb_queries(cfg: &ModelConfig, a: &Attention, q: &[f32]) -> Vec<f32> {
    let nh = cfg.num_attention_heads;
    let (nope, rdim, kvl) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank);
    let (qk, kvd) = (nope + rdim, kvl + rdim);
    let m = q.len() / (nh * qk);
    let mut q_abs = vec![0f32; m * nh * kvd];
    let q_lat: Vec<Vec<f32>> = if m == 1 {
        let mut ql: Vec<Vec<f32>> = (0..nh).map(|_| vec![0f32; kvl]).collect(); // [kv_lora] per head
        let items = ql
            .iter_mut()
            .enumerate()
            .map(|(h, o)| (&a.w_uk_t[h], &q[h * qk..h * qk + nope], &mut o[..]))
            .collect();
        matmul_many(items);
        ql
    } else {
        map_indices(nh, nh * m * nope * kvl, |h| head_q_lat(cfg, a, q, h))
    };
    for (h, ql) in q_lat.iter().enumerate() {
        put_head_q_abs(cfg, q, h, ql, &mut q_abs[h * kvd..], nh * kvd);
    }
    q_abs
}

/// o^h = W_UV^h ctx^h for ctx: [m, H, kv_lora] into out: [m, H, v].
fn values_out(cfg: &ModelConfig, a: &Attention, ctx: &[f32], out: &mut [f32]) {
    let nh = cfg.num_attention_heads;
    let (vdim, kvl) = (cfg.v_head_dim, cfg.kv_lora_rank);
    let m = ctx.len() / (nh * kvl);
    if m == 1 {
        let items = out
            .chunks_exact_mut(vdim)
            .enumerate()
            .map(|(h, o)| (&a.w_uv[h], &ctx[h * kvl..(h + 1) * kvl], o))
            .collect();
        matmul_many(items);
        return;
    }
    let o_heads: Vec<Vec<f32>> = map_indices(nh, nh * m * kvl * vdim, |h| {
        let mut ch = vec![0f32; m * kvl]; // [m, kv_lora]
        for i in 0..m {
            ch[i * kvl..(i + 1) * kvl]
                .copy_from_slice(&ctx[(i * nh + h) * kvl..(i * nh + h + 1) * kvl]);
        }
        let mut oh = vec![0f32; m * vdim]; // [m, v]
        matmul(&a.w_uv[h], &ch, m, &mut oh);
        oh
    });
    scatter_heads(&o_heads, vdim, out);
}

/// Keys per span of the streamed absorbed path: a span's latent rows, widened to f32, stay in
/// L2 while every head of every query scores against them (and while the value pass sums them).
pub(super) const SPAN: usize = 256;

/// Absorbed MQA streamed over the paged latent cache of one sequence (`src`: cache, layer,
/// sequence). q: [m, H, qk] at positions start..start + m; out: [m, H, v]. Two passes over the
/// cache in spans of `SPAN` keys, each span read (and widened) where it is used, never the whole
/// cache at once:
/// 1. scores: all heads of all queries against a span's rows in ONE matmul (each latent row read
///    once per step), spans in parallel; then softmax per row over keys 0..=p;
/// 2. values: `sum_t p_t c_t` per row, the latent columns split among the workers (each column
///    of each row read once per step), spans in increasing key order.
///
/// Every score is the fixed-order dot of `matmul` and every context element the `t`-increasing
/// sum of `weighted_sum_rows`, whatever the span and column split: the bits are those of one
/// matmul and one weighted sum over the whole cache. Several queries over a cache of at most
/// `BY_HEAD_MAX_KEYS` keys go head by head instead (`absorbed_by_head`: one parallel task per
/// head, the same bits).
fn absorbed(
    cfg: &ModelConfig,
    a: &Attention,
    scale: f32,
    src: (&KvCache, usize, &SeqKv),
    start: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let nh = cfg.num_attention_heads;
    let m = q.len() / (nh * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim));
    if m > 1 && start + m <= BY_HEAD_MAX_KEYS {
        return absorbed_by_head(cfg, a, scale, src, start, q, out);
    }
    let q_abs = absorb_queries(cfg, a, q); // [m, H, kv_lora + rope]
    let ctx = latent_attention(src, cfg.kv_lora_rank, nh, scale, start, &q_abs); // [m, H, kv_lora]
    values_out(cfg, a, &ctx, out);
}

/// The cache side of [`absorbed`]: `q_abs: [m, H, kv_lora + rope]` (queries at positions
/// start..start + m) -> ctx: [m, H, kv_lora] = sum_t softmax_t(scale q_abs . latent_t) c_t over
/// keys 0..=p, streamed span by span as described there.
fn latent_attention(
    (kv, layer, seq): (&KvCache, usize, &SeqKv),
    kvl: usize,
    nh: usize,
    scale: f32,
    start: usize,
    q_abs: &[f32],
) -> Vec<f32> {
    let kvd = kv_width(kv);
    let rows = q_abs.len() / kvd;
    let m = rows / nh;
    let keys = start + m;
    let spans = keys.div_ceil(SPAN);
    let span = |b: usize| (b * SPAN, ((b + 1) * SPAN).min(keys));
    // views[b]: span b's stored rows [k1 - k0, kv_lora + rope] when it can be read in place
    let views: Vec<Option<Rows<'_>>> = (0..spans)
        .map(|b| kv.latent_span(layer, seq, span(b)))
        .collect();
    // Pass 1. blocks[b]: [rows, span b's keys]
    let blocks: Vec<Vec<f32>> = map_indices(spans, rows * keys * kvd, |b| {
        let (k0, k1) = span(b);
        let mut scratch = None;
        let lat = rows_or_copy(views[b], (kv, layer, seq), (k0, k1), &mut scratch);
        let mut sb = vec![0f32; rows * (k1 - k0)]; // [rows, k1 - k0]
        matmul_rows_serial(lat, k1 - k0, kvd, q_abs, rows, &mut sb);
        sb
    });
    // scores: [m * H, keys], row (i, h) valid for keys 0..=start + i
    let mut s = vec![0f32; rows * keys];
    for (b, sb) in blocks.iter().enumerate() {
        let (k0, k1) = span(b);
        let w = k1 - k0;
        for (r, src) in sb.chunks_exact(w).enumerate() {
            s[r * keys + k0..r * keys + k1].copy_from_slice(src);
        }
    }
    drop(blocks);
    let lens: Vec<usize> = (0..rows).map(|r| start + r / nh + 1).collect();
    for (r, &len) in lens.iter().enumerate() {
        let row = &mut s[r * keys..r * keys + len];
        row.iter_mut().for_each(|st| *st *= scale);
        softmax_inplace(row);
    }
    // Pass 2. ctx: [m, H, kv_lora] = sum_t p_t c_t, the columns split in groups (multiples of
    // 16, the value kernel's vector width), one per worker.
    let work = rows * keys * kvl;
    let groups = if worth_parallel(work) {
        rayon::current_num_threads().min(kvl / 16).max(1)
    } else {
        1
    };
    let bound = |g: usize| {
        if g == groups {
            kvl
        } else {
            (g * kvl / groups) & !15
        }
    };
    let parts: Vec<Vec<f32>> = map_indices(groups, work, |g| {
        let (c0, c1) = (bound(g), bound(g + 1));
        let cw = c1 - c0;
        let mut part = vec![0f32; rows * cw]; // [rows, c1 - c0]
        let mut scratch = LatentScratch::take(SPAN.min(keys) * cw);
        let mut local = vec![0usize; rows]; // [rows] each row's keys inside the span
        for (b, view) in views.iter().enumerate() {
            let (k0, k1) = span(b);
            for (l, &len) in local.iter_mut().zip(&lens) {
                *l = len.clamp(k0, k1) - k0;
            }
            // the span's columns c0..c1: in place (rows of kv_lora + rope values), else copied
            let (vals, vs) = match view {
                Some(lat) => (lat.skip(c0), kvd),
                None => {
                    let buf = &mut scratch.buf()[..(k1 - k0) * cw]; // [k1 - k0, c1 - c0]
                    kv.read_range_cols(layer, seq, (k0, k1), (c0, c1), buf);
                    (Rows::F32(buf), cw)
                }
            };
            weighted_sum_rows_acc(&s[k0..], keys, &local, vals, vs, cw, &mut part);
        }
        part
    });
    let mut ctx = vec![0f32; rows * kvl];
    for (g, part) in parts.iter().enumerate() {
        let (c0, c1) = (bound(g), bound(g + 1));
        if c1 == c0 {
            continue;
        }
        for (r, src) in part.chunks_exact(c1 - c0).enumerate() {
            ctx[r * kvl + c0..r * kvl + c1].copy_from_slice(src);
        }
    }
    ctx
}

/// The latent rows [k0, k1) of `seq` in `layer` ([k1 - k0, kv_lora + rope]): `view` (the rows
/// read in place, when the cache can give them) or else a copy read into a [`LatentScratch`]
/// kept in `scratch` for as long as the rows are used.
pub(super) fn rows_or_copy<'a>(
    view: Option<Rows<'a>>,
    (kv, layer, seq): (&KvCache, usize, &SeqKv),
    (k0, k1): (usize, usize),
    scratch: &'a mut Option<LatentScratch>,
) -> Rows<'a> {
    match view {
        Some(lat) => lat,
        None => {
            let buf = scratch
                .insert(LatentScratch::take((k1 - k0) * kv_width(kv)))
                .buf(); // [k1 - k0, kv_lora + rope]
            kv.read_range(layer, seq, k0, k1, buf);
            Rows::F32(buf)
        }
    }
}

/// Head `h`'s absorbed no-RoPE queries q_lat = W_UK^h^T q_nope for q: [m, H, nope + rope]
/// -> [m, kv_lora] (one `matmul` over the head's m rows).
pub(super) fn head_q_lat(cfg: &ModelConfig, a: &Attention, q: &[f32], h: usize) -> Vec<f32> {
    let nh = cfg.num_attention_heads;
    let (nope, kvl) = (cfg.qk_nope_head_dim, cfg.kv_lora_rank);
    let qk = nope + cfg.qk_rope_head_dim;
    let m = q.len() / (nh * qk);
    let mut qn = vec![0f32; m * nope]; // [m, nope]
    for i in 0..m {
        qn[i * nope..(i + 1) * nope]
            .copy_from_slice(&q[(i * nh + h) * qk..(i * nh + h) * qk + nope]);
    }
    let mut ql = vec![0f32; m * kvl]; // [m, kv_lora]
    matmul(&a.w_uk_t[h], &qn, m, &mut ql);
    ql
}

/// Head `h`'s absorbed queries [q_lat | q_pe] (kv_lora + rope values per query) from its
/// `ql`: [m, kv_lora] and q: [m, H, nope + rope], query i's at `dst[i * stride..]`.
pub(super) fn put_head_q_abs(
    cfg: &ModelConfig,
    q: &[f32],
    h: usize,
    ql: &[f32],
    dst: &mut [f32],
    stride: usize,
) {
    let nh = cfg.num_attention_heads;
    let (nope, kvl) = (cfg.qk_nope_head_dim, cfg.kv_lora_rank);
    let qk = nope + cfg.qk_rope_head_dim;
    let kvd = kvl + cfg.qk_rope_head_dim;
    for (i, ql_i) in ql.chunks_exact(kvl).enumerate() {
        let d = &mut dst[i * stride..i * stride + kvd];
        d[..kvl].copy_from_slice(ql_i);
        d[kvl..].copy_from_slice(&q[(i * nh + h) * qk + nope..(i * nh + h + 1) * qk]);
    }
}

/// Every head's rows `o_heads[h]`: [m, width] into out: [m, H, width].
pub(super) fn scatter_heads(o_heads: &[Vec<f32>], width: usize, out: &mut [f32]) {
    let nh = o_heads.len();
    for (h, oh) in o_heads.iter().enumerate() {
        for (i, row) in oh.chunks_exact(width).enumerate() {
            out[(i * nh + h) * width..(i * nh + h + 1) * width].copy_from_slice(row);
        }
    }
}

/// Values per MLA latent entry (kv_lora + rope) of the cache.
pub(super) fn kv_width(kv: &KvCache) -> usize {
    kv.config().groups[KvCache::LATENT].kind.width()
}

/// `ctx[r] = sum_t p[r, t] * latent[t][..kv_lora]` for every row r (t < lens[r]); rows are split
/// into one group per worker, each group streaming the latent rows once. p: [rows, stride];
/// latent: rows of width `kvd` whose first `ctx.len() / rows` values are summed; ctx: [rows,
/// kv_lora]. Each row's sum is the same bits however the rows are grouped.
fn latent_sums(
    p: &[f32],
    stride: usize,
    lens: &[usize],
    latent: &[f32],
    kvd: usize,
    ctx: &mut [f32],
) {
    let rows = lens.len();
    let kvl = ctx.len() / rows.max(1);
    let work = rows * stride * kvl;
    let groups = if worth_parallel(work) {
        rayon::current_num_threads().min(rows).max(1)
    } else {
        1
    };
    let per = rows.div_ceil(groups);
    for_each_row(ctx, per * kvl, work, |g, o| {
        let r0 = g * per;
        let nr = o.len() / kvl;
        weighted_sum_rows(
            &p[r0 * stride..],
            stride,
            &lens[r0..r0 + nr],
            latent,
            kvd,
            kvl,
            o,
        );
    });
}

/// Sparse absorbed MQA (V3.2): query i attends only to the latent rows at `sels[i]` (ascending
/// positions), gathered from the cache — the decode cost is the selection's, not the context's.
/// q: [m, H, qk]; out: [m, H, v]. Per query: scores of all heads against the gathered rows by one
/// matmul, softmax per head over the selection in position order, values in the same order.
#[allow(clippy::too_many_arguments)]
fn absorbed_sparse(
    cfg: &ModelConfig,
    a: &Attention,
    scale: f32,
    kv: &KvCache,
    layer: usize,
    seq: &SeqKv,
    sels: &[&[u32]],
    q: &[f32],
    out: &mut [f32],
) {
    let nh = cfg.num_attention_heads;
    let (rdim, kvl) = (cfg.qk_rope_head_dim, cfg.kv_lora_rank);
    let kvd = kvl + rdim;
    let q_abs = absorb_queries(cfg, a, q); // [m, H, kv_lora + rope]
    let m = sels.len();
    let mut ctx = vec![0f32; m * nh * kvl]; // [m, H, kv_lora]
    for (i, &sel) in sels.iter().enumerate() {
        let k = sel.len();
        let mut g = vec![0f32; k * kvd]; // [k, kv_lora + rope]
        kv.read_rows(KvCache::LATENT, layer, seq, sel, &mut g);
        let mut s = vec![0f32; nh * k]; // [H, k]
        matmul_f32(
            &g,
            k,
            kvd,
            &q_abs[i * nh * kvd..(i + 1) * nh * kvd],
            nh,
            &mut s,
        );
        for row in s.chunks_exact_mut(k) {
            row.iter_mut().for_each(|st| *st *= scale);
            softmax_inplace(row);
        }
        // ctx_i: [H, kv_lora] over the gathered rows, as in the dense path
        let ctx_i = &mut ctx[i * nh * kvl..(i + 1) * nh * kvl];
        latent_sums(&s, k, &vec![k; nh], &g, kvd, ctx_i);
    }
    values_out(cfg, a, &ctx, out);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kv::{KvConfig, KvDtype};

    /// The whole-cache computation the streamed path replaces: read every latent row, one
    /// matmul for the scores, softmax, one weighted sum.
    pub(crate) fn whole_cache(
        (kv, layer, seq): (&KvCache, usize, &SeqKv),
        kvl: usize,
        nh: usize,
        scale: f32,
        start: usize,
        q_abs: &[f32],
    ) -> Vec<f32> {
        let kvd = kv_width(kv);
        let rows = q_abs.len() / kvd;
        let keys = start + rows / nh;
        let mut cache = vec![0f32; keys * kvd]; // [keys, kv_lora + rope]
        kv.read_range(layer, seq, 0, keys, &mut cache);
        let mut s = vec![0f32; rows * keys]; // [rows, keys]
        matmul_f32(&cache, keys, kvd, q_abs, rows, &mut s);
        let lens: Vec<usize> = (0..rows).map(|r| start + r / nh + 1).collect();
        for (r, &len) in lens.iter().enumerate() {
            let row = &mut s[r * keys..r * keys + len];
            row.iter_mut().for_each(|st| *st *= scale);
            softmax_inplace(row);
        }
        let mut ctx = vec![0f32; rows * kvl]; // [rows, kv_lora]
        weighted_sum_rows(&s, keys, &lens, &cache, kvd, kvl, &mut ctx);
        ctx
    }

    /// A sequence of `len` random latent rows in a `dtype` cache (layer 1; the first half grown
    /// block by block interleaved with another sequence — spans in scattered blocks, read through
    /// a copy — the rest at once: consecutive blocks, read in place) and random absorbed queries
    /// q_abs: [m, H, kv_lora + rope] for its last m positions.
    pub(crate) fn filled_cache(
        dtype: KvDtype,
        kvl: usize,
        rope: usize,
        nh: usize,
        len: usize,
        m: usize,
    ) -> (KvCache, SeqKv, Vec<f32>) {
        let mut seed = 7u64 ^ (len * 1000 + kvl) as u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let bs = 16;
        let cfg = KvConfig::latent_only(2, kvl, rope, bs, len.div_ceil(bs) + 1, dtype);
        let cfg = KvConfig {
            num_blocks: 2 * len.div_ceil(bs) + 2,
            ..cfg
        };
        let mut kv = KvCache::new(cfg).unwrap();
        let mut seq = SeqKv::new();
        let mut other = SeqKv::new();
        let half = (len / 2).div_ceil(bs) * bs;
        for n in (bs..=half.min(len)).step_by(bs) {
            let plan = kv.plan_grow(&seq, n).unwrap();
            kv.commit_grow(&mut seq, plan);
            let plan = kv.plan_grow(&other, n).unwrap();
            kv.commit_grow(&mut other, plan);
        }
        let plan = kv.plan_grow(&seq, len).unwrap();
        kv.commit_grow(&mut seq, plan);
        assert_eq!(
            kv.latent_span(1, &seq, (0, len.min(2 * bs))).is_some(),
            len <= bs && dtype != KvDtype::Fp8E4M3,
            "{dtype:?}: first blocks scattered"
        );
        if len > half + bs && dtype != KvDtype::Fp8E4M3 {
            assert!(kv.latent_span(1, &seq, (half, len)).is_some());
        }
        for pos in 0..len {
            let c: Vec<f32> = (0..kvl).map(|_| rnd()).collect(); // [kv_lora]
            let k: Vec<f32> = (0..rope).map(|_| rnd()).collect(); // [rope]
            kv.write_slot(1, &seq, pos, &c, &k);
        }
        kv.set_len(&mut seq, len);
        let q_abs: Vec<f32> = (0..m * nh * (kvl + rope)).map(|_| 4.0 * rnd()).collect(); // [m, H, kvd]
        (kv, seq, q_abs)
    }

    #[test]
    fn streamed_latent_attention_is_the_whole_cache_computation() {
        for dtype in [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Fp8E4M3] {
            for (kvl, rope, nh, len, m) in [
                (48usize, 16usize, 4usize, 700usize, 3usize),
                (40, 8, 3, 257, 1),
                (8, 4, 2, 5, 2),
            ] {
                let (kv, seq, q_abs) = filled_cache(dtype, kvl, rope, nh, len, m);
                let start = len - m;
                let want = whole_cache((&kv, 1, &seq), kvl, nh, 0.3, start, &q_abs);
                for threads in [1, 2, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let got = pool
                        .install(|| latent_attention((&kv, 1, &seq), kvl, nh, 0.3, start, &q_abs));
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{dtype:?} kv_lora {kvl} heads {nh} keys {len} queries {m} threads {threads}"
                    );
                }
            }
        }
    }
}

//! The GPU validation `specmla gpu-check` runs (needs a device; see `scripts/gpu-check.sh`):
//! every kernel against the CPU backend on deterministic random inputs, with a stated tolerance
//! per op, the batch-invariance checks (a row's result bitwise the same alone and in a batch),
//! and the bf16 GEMV's fraction of the device's memory bandwidth.

use crate::error::Result;
use crate::kernels::{matmul, pin_thread, rms_norm, Isa, IsaLevel, Matrix};
use crate::kv::dtype::{encode_fp8, f32_to_bf16, f32_to_fp8};
use crate::sampling::log_softmax;

use super::device::Gpu;

/// One checked op.
#[derive(Clone, Debug)]
pub struct CheckLine {
    pub op: String,
    /// max |gpu - cpu| (relative to max(1, max |cpu|) where `relative`)
    pub error: f64,
    pub tolerance: f64,
    pub pass: bool,
    pub note: String,
}

struct Rand(u64);

impl Rand {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()))
        / scale
}

fn line(op: &str, error: f64, tolerance: f64, note: String) -> CheckLine {
    CheckLine {
        op: op.into(),
        error,
        tolerance,
        pass: error <= tolerance,
        note,
    }
}

/// Run every check; the lines say what passed.
pub fn gpu_check(gpu: &Gpu) -> Result<Vec<CheckLine>> {
    // The CPU reference keeps the exact f32 order: `auto` may pick `avx512bf16`, whose products
    // round the activations to bf16 (an error of ~2^-9 relative, far above these tolerances).
    pin_thread(Isa::new(IsaLevel::best_exact()));
    let out = kernel_checks(gpu);
    pin_thread(None);
    out
}

fn kernel_checks(gpu: &Gpu) -> Result<Vec<CheckLine>> {
    let mut r = Rand(0x5eed_c0da);
    let mut out = Vec::new();
    // RMSNorm
    let (rows, cols) = (7, 2048);
    let x = r.vec(rows * cols, 3.0);
    let w = r.vec(cols, 1.0);
    let mut want = vec![0f32; rows * cols];
    for i in 0..rows {
        rms_norm(
            &x[i * cols..(i + 1) * cols],
            &w,
            1e-6,
            &mut want[i * cols..(i + 1) * cols],
        );
    }
    let got = gpu.rms_norm(&x, &w, rows, 1e-6)?;
    out.push(line(
        "rms_norm_f32",
        max_rel(&got, &want),
        1e-5,
        format!("{rows}x{cols}"),
    ));
    // bf16 GEMM, n = 1..16, against the CPU matmul; batch invariance n=1 vs n=16
    let (rows, cols) = (1536, 2048);
    let wf = r.vec(rows * cols, 0.05);
    let wb: Vec<u16> = wf.iter().map(|&v| f32_to_bf16(v)).collect();
    let m = Matrix::from_bf16(rows, cols, wb.clone());
    let x = r.vec(16 * cols, 1.0);
    let mut worst = 0f64;
    for n in [1, 2, 5, 9, 16] {
        let mut want = vec![0f32; n * rows];
        matmul(&m, &x[..n * cols], n, &mut want);
        let got = gpu.gemm_bf16(&wb, rows, &x[..n * cols], n)?;
        worst = worst.max(max_rel(&got, &want));
    }
    out.push(line(
        "gemm_bf16_smalln",
        worst,
        1e-5,
        format!("{rows}x{cols}, n 1..16 vs CPU"),
    ));
    let all = gpu.gemm_bf16(&wb, rows, &x, 16)?;
    let mut same = true;
    for t in 0..16 {
        let one = gpu.gemm_bf16(&wb, rows, &x[t * cols..(t + 1) * cols], 1)?;
        same &= one == all[t * rows..(t + 1) * rows];
    }
    out.push(line(
        "gemm_bf16 batch invariance",
        if same { 0.0 } else { 1.0 },
        0.0,
        "each column alone == in a batch of 16, bitwise".into(),
    ));
    // fp8 block GEMM
    let mut q = vec![0u8; rows * cols];
    let (sr, sc) = (rows.div_ceil(128), cols / 128);
    let mut scales = vec![0f32; sr * sc];
    for bi in 0..sr {
        for bj in 0..sc {
            let mut amax = 0f32;
            for i in bi * 128..((bi + 1) * 128).min(rows) {
                for j in bj * 128..(bj + 1) * 128 {
                    amax = amax.max(wf[i * cols + j].abs());
                }
            }
            let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
            scales[bi * sc + bj] = s;
            for i in bi * 128..((bi + 1) * 128).min(rows) {
                for j in bj * 128..(bj + 1) * 128 {
                    q[i * cols + j] = f32_to_fp8(wf[i * cols + j] / s);
                }
            }
        }
    }
    let m8 = Matrix::from_fp8(rows, cols, q.clone(), scales.clone(), 128, 128);
    let mut worst = 0f64;
    for n in [1, 4, 16] {
        let mut want = vec![0f32; n * rows];
        matmul(&m8, &x[..n * cols], n, &mut want);
        let got = gpu.gemm_fp8(&q, &scales, rows, &x[..n * cols], n)?;
        worst = worst.max(max_rel(&got, &want));
    }
    out.push(line(
        "gemm_fp8_block_smalln",
        worst,
        1e-5,
        format!("{rows}x{cols}, n 1/4/16 vs CPU"),
    ));
    // log-softmax
    let (rows, vocab) = (3, 129_280);
    let x = r.vec(rows * vocab, 8.0);
    let want: Vec<f32> = x.chunks(vocab).flat_map(log_softmax).collect();
    let got = gpu.log_softmax(&x, rows)?;
    out.push(line(
        "log_softmax_f32",
        max_rel(&got, &want),
        1e-5,
        format!("{rows}x{vocab}"),
    ));
    // KV writes: bf16 bitwise; fp8 bitwise (codes and scales)
    let (lat, rope) = (512, 64);
    let width = lat + rope;
    let src = r.vec(5 * width, 4.0);
    let slots = [9i64, 0, 31, 7, 16];
    let got = gpu.kv_write_bf16(&src, width, &slots, 32)?;
    let mut bad = 0usize;
    for (i, &s) in slots.iter().enumerate() {
        for c in 0..width {
            bad += usize::from(got[s as usize * width + c] != f32_to_bf16(src[i * width + c]));
        }
    }
    out.push(line(
        "kv_write_bf16",
        bad as f64,
        0.0,
        "values differing from the CPU cache".into(),
    ));
    let groups = lat.div_ceil(128) + rope.div_ceil(128);
    let entry = width + 4 * groups;
    let got = gpu.kv_write_fp8(&src, lat, rope, entry, &slots, 32)?;
    let mut bad = 0usize;
    for (i, &s) in slots.iter().enumerate() {
        let e = &got[s as usize * entry..(s as usize + 1) * entry];
        let row = &src[i * width..(i + 1) * width];
        let (mut codes, mut sc) = (vec![0u8; width], vec![0f32; groups]);
        let gl = lat.div_ceil(128);
        encode_fp8(&row[..lat], &mut codes[..lat], &mut sc[..gl]);
        encode_fp8(&row[lat..], &mut codes[lat..], &mut sc[gl..]);
        bad += codes
            .iter()
            .zip(&e[..width])
            .filter(|(a, b)| a != b)
            .count();
        for (g, s) in sc.iter().enumerate() {
            let b = f32::from_le_bytes(e[width + 4 * g..width + 4 * g + 4].try_into().unwrap());
            bad += usize::from(b != *s);
        }
    }
    out.push(line(
        "kv_write_fp8",
        bad as f64,
        0.0,
        "codes / scales differing from the CPU cache".into(),
    ));
    out.extend(mla_checks(gpu, &mut r)?);
    out.push(mha_check(gpu, &mut r)?);
    out.push(experts_check(gpu, &mut r)?);
    out.push(route_check(gpu, &mut r)?);
    out.push(bandwidth(gpu, &mut r)?);
    Ok(out)
}

/// MLA decode over a paged cache: two sequences (700 and 37 keys; 3 verification queries on the
/// first), against an f64 reference; one query alone vs in the batch, bitwise.
fn mla_checks(gpu: &Gpu, r: &mut Rand) -> Result<Vec<CheckLine>> {
    let (heads, bs) = (16, 64);
    let lens = [700usize, 37];
    let max_blocks = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap();
    let mut table = vec![0i32; lens.len() * max_blocks];
    let mut next = 3i32; // blocks handed out in a scattered order
    for (s, &l) in lens.iter().enumerate() {
        for b in 0..l.div_ceil(bs) {
            table[s * max_blocks + b] = next;
            next += 2;
        }
    }
    let num_blocks = next as usize + 1;
    let cache_f = r.vec(num_blocks * bs * 576, 1.0);
    let cache: Vec<u16> = cache_f.iter().map(|&v| f32_to_bf16(v)).collect();
    let q_seq = [0i32, 0, 0, 1];
    let q_pos = [697i32, 698, 699, 36];
    let n_q = q_seq.len();
    let q_lat = r.vec(n_q * heads * 512, 0.3);
    let q_pe = r.vec(n_q * heads * 64, 0.3);
    let scale = 1.0 / (192f32).sqrt();
    let got = gpu.mla_decode(
        &cache, &table, max_blocks, bs, &q_seq, &q_pos, &q_lat, &q_pe, heads, scale,
    )?;
    let key = |s: usize, j: usize, d: usize| -> f64 {
        let b = table[s * max_blocks + j / bs] as usize;
        crate::kv::dtype::bf16_to_f32(cache[(b * bs + j % bs) * 576 + d]) as f64
    };
    let mut want = vec![0f32; n_q * heads * 512];
    for t in 0..n_q {
        let s = q_seq[t] as usize;
        for h in 0..heads {
            let ql = &q_lat[(t * heads + h) * 512..(t * heads + h + 1) * 512];
            let qp = &q_pe[(t * heads + h) * 64..(t * heads + h + 1) * 64];
            let n = q_pos[t] as usize + 1;
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    let mut d = 0f64;
                    for (i, &v) in ql.iter().enumerate() {
                        d += v as f64 * key(s, j, i);
                    }
                    for (i, &v) in qp.iter().enumerate() {
                        d += v as f64 * key(s, j, 512 + i);
                    }
                    d * scale as f64
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = p.iter().sum();
            for d in 0..512 {
                let v: f64 = (0..n).map(|j| p[j] * key(s, j, d)).sum();
                want[(t * heads + h) * 512 + d] = (v / z) as f32;
            }
        }
    }
    let mut lines = vec![line(
        "mla_decode split + combine",
        max_rel(&got, &want),
        2e-5,
        "2 sequences (700 / 37 keys, 3 splits), 4 queries x 16 heads vs f64".into(),
    )];
    let alone = gpu.mla_decode(
        &cache,
        &table,
        max_blocks,
        bs,
        &q_seq[3..],
        &q_pos[3..],
        &q_lat[3 * heads * 512..],
        &q_pe[3 * heads * 64..],
        heads,
        scale,
    )?;
    lines.push(line(
        "mla_decode batch invariance",
        if alone == got[3 * heads * 512..] {
            0.0
        } else {
            1.0
        },
        0.0,
        "a query alone == in the batch, bitwise".into(),
    ));
    Ok(lines)
}

/// Decompressed-MHA prefill: 37 prompt tokens at positions 100..137 of a 137-key sequence (the
/// first 100 keys cached), 16 heads, q/k 192 and v 128 wide, against f64.
fn mha_check(gpu: &Gpu, r: &mut Rand) -> Result<CheckLine> {
    let (heads, dqk, dv, n_k, n_q) = (16usize, 192usize, 128usize, 137usize, 37usize);
    let q = r.vec(n_q * heads * dqk, 0.4);
    let k = r.vec(n_k * heads * dqk, 0.4);
    let v = r.vec(n_k * heads * dv, 1.0);
    let pos: Vec<i32> = (0..n_q as i32).map(|i| 100 + i).collect();
    let scale = 1.0 / (dqk as f32).sqrt();
    let got = gpu.mha_prefill(&q, &k, &v, &pos, heads, dqk, dv, scale)?;
    let mut want = vec![0f32; n_q * heads * dv];
    for t in 0..n_q {
        for h in 0..heads {
            let n = pos[t] as usize + 1;
            let qr = &q[(t * heads + h) * dqk..(t * heads + h + 1) * dqk];
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    let kr = &k[(j * heads + h) * dqk..(j * heads + h + 1) * dqk];
                    qr.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = p.iter().sum();
            for d in 0..dv {
                let o: f64 = (0..n)
                    .map(|j| p[j] * v[(j * heads + h) * dv + d] as f64)
                    .sum();
                want[(t * heads + h) * dv + d] = (o / z) as f32;
            }
        }
    }
    Ok(line(
        "mha_prefill_f32",
        max_rel(&got, &want),
        2e-5,
        format!("{n_q} queries x {heads} heads over {n_k} keys vs f64"),
    ))
}

/// Routed experts (8 experts, hidden 256, inter 128, 5 tokens x top 3) against the CPU matmul +
/// SwiGLU + weighted sum.
fn experts_check(gpu: &Gpu, r: &mut Rand) -> Result<CheckLine> {
    let (e, hidden, inter, n, k) = (8usize, 256usize, 128usize, 5usize, 3usize);
    let bits = |v: Vec<f32>| -> Vec<u16> { v.iter().map(|&x| f32_to_bf16(x)).collect() };
    let gate = bits(r.vec(e * inter * hidden, 0.08));
    let up = bits(r.vec(e * inter * hidden, 0.08));
    let down = bits(r.vec(e * hidden * inter, 0.08));
    let x = r.vec(n * hidden, 1.0);
    let ex: Vec<i32> = (0..n * k).map(|a| ((a * 5 + a / k) % e) as i32).collect();
    let w = r.vec(n * k, 0.5);
    let got = gpu.moe_experts(&gate, &up, &down, &x, &ex, &w, hidden, inter, k)?;
    let mut want = vec![0f32; n * hidden];
    for t in 0..n {
        let xt = &x[t * hidden..(t + 1) * hidden];
        for s in 0..k {
            let id = ex[t * k + s] as usize;
            let mat = |b: &[u16], rows: usize, cols: usize| {
                Matrix::from_bf16(
                    rows,
                    cols,
                    b[id * rows * cols..(id + 1) * rows * cols].to_vec(),
                )
            };
            let (mut g, mut u) = (vec![0f32; inter], vec![0f32; inter]);
            matmul(&mat(&gate, inter, hidden), xt, 1, &mut g);
            matmul(&mat(&up, inter, hidden), xt, 1, &mut u);
            let hid: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                .collect();
            let mut y = vec![0f32; hidden];
            matmul(&mat(&down, hidden, inter), &hid, 1, &mut y);
            for (o, v) in want[t * hidden..(t + 1) * hidden].iter_mut().zip(&y) {
                *o += w[t * k + s] * v;
            }
        }
    }
    Ok(line(
        "moe experts (gate/up, down, combine)",
        max_rel(&got, &want),
        1e-5,
        format!("{e} experts, hidden {hidden}, inter {inter}, {n} tokens x top {k} vs CPU"),
    ))
}

/// Group-limited noaux_tc routing (256 experts, 8 groups, 4 kept, top 8) against a CPU loop.
fn route_check(gpu: &Gpu, r: &mut Rand) -> Result<CheckLine> {
    let (n, e, g, tg, k, scale) = (33usize, 256usize, 8usize, 4usize, 8usize, 2.5f32);
    let logits = r.vec(n * e, 4.0);
    let bias = r.vec(e, 0.5);
    let (gi, gw) = gpu.moe_route(&logits, &bias, n, g, tg, k, scale)?;
    let mut bad = 0usize;
    let mut werr = 0f64;
    for t in 0..n {
        let score: Vec<f32> = logits[t * e..(t + 1) * e]
            .iter()
            .map(|&l| 1.0 / (1.0 + (-l).exp()))
            .collect();
        let mut choice: Vec<f32> = score.iter().zip(&bias).map(|(s, b)| s + b).collect();
        let per = e / g;
        let gs: Vec<f32> = (0..g)
            .map(|gr| {
                let mut v: Vec<f32> = choice[gr * per..(gr + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                v[0] + v[1]
            })
            .collect();
        let mut keep = vec![false; g];
        for _ in 0..tg {
            let best = (0..g)
                .filter(|&i| !keep[i])
                .fold(None, |b: Option<usize>, i| match b {
                    Some(j) if gs[j] >= gs[i] => Some(j),
                    _ => Some(i),
                });
            keep[best.unwrap()] = true;
        }
        let mut idx = Vec::new();
        for _ in 0..k {
            let best = (0..e)
                .filter(|&i| keep[i / per] && choice[i] > f32::NEG_INFINITY)
                .fold(None, |b: Option<usize>, i| match b {
                    Some(j) if choice[j] >= choice[i] => Some(j),
                    _ => Some(i),
                });
            let i = best.unwrap();
            choice[i] = f32::NEG_INFINITY;
            idx.push(i);
        }
        let sum: f32 = idx.iter().map(|&i| score[i]).sum::<f32>() + 1e-20;
        for (j, &i) in idx.iter().enumerate() {
            bad += usize::from(gi[t * k + j] as usize != i);
            werr = werr.max((gw[t * k + j] - score[i] / sum * scale).abs() as f64);
        }
    }
    Ok(line(
        "moe_route_noaux_tc",
        bad as f64 + if werr > 1e-5 { 1.0 } else { 0.0 },
        0.0,
        format!("{n} tokens, E {e}, {g} groups keep {tg}, top {k}: expert mismatches; weight error {werr:.1e}"),
    ))
}

/// bf16 GEMV (n = 1) over a 128 MiB device-resident weight: read GB/s over 50 launches.
fn bandwidth(gpu: &Gpu, r: &mut Rand) -> Result<CheckLine> {
    let (rows, cols) = (8192usize, 8192usize);
    let w: Vec<u16> = (0..rows * cols)
        .map(|_| f32_to_bf16(r.f() * 0.02))
        .collect();
    let x = r.vec(cols, 1.0);
    let dt = gpu.time_gemm_bf16(&w, rows, &x, 1, 50)?;
    let gbs = (rows * cols * 2) as f64 / dt / 1e9;
    Ok(line(
        "gemm_bf16 read bandwidth",
        0.0,
        0.0,
        format!(
            "{gbs:.0} GB/s ({:.1} us per 128 MiB GEMV; compare the device's peak)",
            dt * 1e6
        ),
    ))
}

/// The golden fixtures through the CUDA backend (`EngineConfig::device`), for every fixture the
/// backend runs (V2 / V3 with bf16 routed experts): greedy generation on the GPU against the CPU
/// engine (same bf16 KV; log-probs of the positions before the first differing token within
/// 2e-3, and at least the first token equal), then greedy n-gram speculation and speculation with
/// the fixture as its own draft model (on the GPU too) against plain GPU decoding, bitwise
/// (tokens and log-probs: every kernel is batch invariant).
pub fn forward_checks(ordinal: usize, fixtures: &[std::path::PathBuf]) -> Result<Vec<CheckLine>> {
    use crate::backend::Device;
    use crate::engine::{DraftSource, Engine, EngineConfig, Prompt, Request};
    use crate::kv::KvDtype;
    use crate::spec::SpecMode;
    let mut out = Vec::new();
    for dir in fixtures {
        let name = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let model = match crate::model::Model::load_dir(dir) {
            Ok(m) => m,
            Err(e) => {
                out.push(line(
                    &format!("forward {name}"),
                    f64::INFINITY,
                    0.0,
                    format!("load: {e}"),
                ));
                continue;
            }
        };
        if let Err(e) = super::CudaBackend::check_model(&model) {
            println!("skip  forward {name}: {e}");
            continue;
        }
        let vocab = model.config.vocab_size as u32;
        let reqs = || -> Vec<Request> {
            (0..3u32)
                .map(|i| {
                    let ids: Vec<u32> = (0..12 + 5 * i)
                        .map(|j| 3 + (j * 7 + i * 13) % (vocab - 3))
                        .collect();
                    let mut r = Request::new(Prompt::Tokens(ids));
                    r.sampling.max_tokens = 12;
                    r.sampling.ignore_eos = true;
                    r.logprobs = true;
                    r
                })
                .collect()
        };
        let cfg = |device, spec| EngineConfig {
            // exact f32 products on the CPU side (see `gpu_check`)
            isa: Some(IsaLevel::best_exact()),
            kv_dtype: KvDtype::Bf16,
            prefix_cache: false,
            num_blocks: 64,
            draft_num_blocks: 64,
            spec,
            device,
            ..EngineConfig::default()
        };
        let run = |device, draft, spec| -> Result<Vec<crate::engine::Output>> {
            Engine::new(dir, draft, cfg(device, spec))?.generate(reqs())
        };
        let cpu = run(Device::Cpu, DraftSource::None, SpecMode::Fixed(0))?;
        let gpu = match run(Device::Cuda(ordinal), DraftSource::None, SpecMode::Fixed(0)) {
            Ok(g) => g,
            Err(e) => {
                out.push(line(
                    &format!("forward {name}"),
                    f64::INFINITY,
                    0.0,
                    format!("{e}"),
                ));
                continue;
            }
        };
        let (mut err, mut same, mut total, mut first_ok) = (0f64, 0usize, 0usize, true);
        for (c, g) in cpu.iter().zip(&gpu) {
            let agree = c
                .token_ids
                .iter()
                .zip(&g.token_ids)
                .take_while(|(a, b)| a == b)
                .count();
            first_ok &= agree > 0;
            same += agree;
            total += c.token_ids.len();
            for i in 0..agree {
                err = err.max((c.logprobs[i] as f64 - g.logprobs[i] as f64).abs());
            }
        }
        out.push(line(
            &format!("forward {name}"),
            if first_ok { err } else { f64::INFINITY },
            2e-3,
            format!("greedy GPU vs CPU: {same}/{total} tokens agree before the first difference; max |d logprob| there"),
        ));
        let same = |a: &[crate::engine::Output], b: &[crate::engine::Output]| {
            a.iter().zip(b).all(|(a, b)| {
                a.token_ids == b.token_ids
                    && a.logprobs
                        .iter()
                        .zip(&b.logprobs)
                        .all(|(x, y)| x.to_bits() == y.to_bits())
            })
        };
        let spec = run(
            Device::Cuda(ordinal),
            DraftSource::Ngram { min_n: 1, max_n: 3 },
            SpecMode::Fixed(3),
        )?;
        // the fixture as its own draft model: the draft runs on the GPU too
        let self_draft = run(
            Device::Cuda(ordinal),
            DraftSource::Dir(dir.clone()),
            SpecMode::Fixed(3),
        )?;
        out.push(line(
            &format!("spec exact {name} (GPU draft)"),
            if same(&gpu, &self_draft) { 0.0 } else { 1.0 },
            0.0,
            "greedy speculation with the fixture as its own draft model on the GPU (k = 3) vs plain GPU decoding, bitwise".into(),
        ));
        out.push(line(
            &format!("spec exact {name}"),
            if same(&gpu, &spec) { 0.0 } else { 1.0 },
            0.0,
            "greedy n-gram speculation (k = 3) on the GPU vs plain GPU decoding, tokens + log-probs bitwise".into(),
        ));
    }
    Ok(out)
}
